# e1071 SVM on synthetic data over a small cost grid, each fit on a modified copy.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(e1071))
d <- make_data(round(5000 * scale), 20)
acc <- 0
for (cost in c(0.5, 1, 2)) {
  train <- perturb(d, "V2", 5)
  fit <- svm(y ~ ., data = train, cost = cost, kernel = "radial")
  acc <- acc + sum(predict(fit, d) == d$y)
}
digest(acc)
