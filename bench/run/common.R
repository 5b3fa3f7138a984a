# Shared by the advm bench R workloads: scale from the environment, a deterministic
# seed, and a digest printed at the end (outputs must be byte-identical in every mode).
scale <- as.numeric(Sys.getenv("ADVM_BENCH_SCALE", "1"))
set.seed(42)
digest <- function(...) {
  xs <- list(...)
  cat(vapply(xs, function(x) formatC(sum(as.numeric(unlist(x)), na.rm = TRUE), digits = 10, format = "g"), ""), "\n")
}
# Synthetic classification data (the paper's ML scripts use synthetic data sets too).
make_data <- function(n, p) {
  x <- matrix(rnorm(n * p), n, p)
  beta <- seq(-1, 1, length.out = p)
  y <- factor(ifelse(x %*% beta + rnorm(n, sd = 0.5) > 0, "a", "b"))
  d <- as.data.frame(x)
  d$y <- y
  d
}
# R copies a data frame's column when it is modified after assignment; this is the
# pattern the paper's R workloads exercise between model fits.
perturb <- function(d, col, k) {
  d[[col]][seq_len(k)] <- d[[col]][seq_len(k)] + 0.001
  d
}
