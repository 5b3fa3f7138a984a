# kernlab least-squares SVM on synthetic data, with copies of the training data.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(kernlab))
d <- make_data(round(1800 * scale), 10)
x <- as.matrix(d[, 1:10])
acc <- 0
for (fold in 1:3) {
  idx <- seq(fold, nrow(d), by = 3)
  xt <- x[-idx, ]
  xt[1, 1] <- xt[1, 1] + 0.001
  fit <- lssvm(xt, d$y[-idx], kernel = "rbfdot", kpar = list(sigma = 0.1))
  acc <- acc + sum(predict(fit, x[idx, ]) == d$y[idx])
}
digest(acc)
