# class::knn on synthetic data for several k, on scaled and modified copies.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(class))
d <- make_data(round(16000 * scale), 20)
x <- as.matrix(d[, 1:20])
acc <- 0
for (k in c(1, 5, 15)) {
  idx <- seq(k %% 3 + 1, nrow(d), by = 3)
  xt <- scale(x[-idx, ])
  xt[1, ] <- xt[1, ] * 1.001
  xs <- scale(x[idx, ], center = attr(xt, "scaled:center"), scale = attr(xt, "scaled:scale"))
  acc <- acc + sum(knn(xt, xs, d$y[-idx], k = k) == d$y[idx])
}
digest(acc)
