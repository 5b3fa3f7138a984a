# gbm boosting on synthetic data (binary outcome), folds by subsetting.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(gbm))
d <- make_data(round(30000 * scale), 20)
d$y <- as.integer(d$y == "a")
acc <- 0
for (fold in 1:3) {
  idx <- seq(fold, nrow(d), by = 3)
  train <- perturb(d[-idx, ], "V5", 10)
  fit <- gbm(y ~ ., data = train, distribution = "bernoulli", n.trees = 60, interaction.depth = 3, n.cores = 1)
  p <- predict(fit, d[idx, ], n.trees = 60, type = "response")
  acc <- acc + sum((p > 0.5) == d$y[idx])
}
digest(acc)
