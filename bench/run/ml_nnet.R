# nnet single-hidden-layer networks on synthetic data, refitted on modified copies.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(nnet))
d <- make_data(round(20000 * scale), 20)
acc <- 0
for (k in 1:4) {
  train <- perturb(d, "V4", 10)
  fit <- nnet(y ~ ., data = train, size = 5, maxit = 60, trace = FALSE)
  acc <- acc + sum(predict(fit, d, type = "class") == d$y)
}
digest(acc)
