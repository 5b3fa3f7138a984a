# rpart trees on bootstrap-like subsets of synthetic data.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(rpart))
d <- make_data(round(25000 * scale), 20)
acc <- 0
for (b in 1:6) {
  idx <- sample.int(nrow(d), nrow(d) / 2)
  train <- perturb(d[idx, ], "V3", 20)
  fit <- rpart(y ~ ., data = train, method = "class", cp = 0.001)
  acc <- acc + sum(predict(fit, d, type = "class") == d$y)
}
digest(acc)
