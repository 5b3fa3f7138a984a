# glmnet lasso paths on synthetic data, refitted on copies with a few values changed.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(glmnet))
d <- make_data(round(30000 * scale), 40)
x <- as.matrix(d[, 1:40])
acc <- 0
for (k in 1:5) {
  xk <- x
  xk[k, ] <- xk[k, ] + 0.01
  fit <- glmnet(xk, d$y, family = "binomial", nlambda = 20)
  acc <- acc + sum(coef(fit, s = 0.01) != 0)
}
digest(acc)
