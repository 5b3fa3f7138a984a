# randomForest on synthetic data: cross-validation folds (subsetting copies) and
# perturbed copies of the training frame.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(randomForest))
d <- make_data(round(6000 * scale), 20)
acc <- 0
for (fold in 1:3) {
  idx <- seq(fold, nrow(d), by = 3)
  train <- perturb(d[-idx, ], "V1", 10)
  fit <- randomForest(y ~ ., data = train, ntree = 100)
  acc <- acc + sum(predict(fit, d[idx, ]) == d$y[idx])
}
digest(acc)
