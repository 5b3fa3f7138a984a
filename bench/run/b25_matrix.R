# R-benchmark-25, I.1: creation, transposition and deformation of a large matrix,
# plus the copies R makes when the result is modified after assignment.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
n <- round(1500 * sqrt(scale))
acc <- 0
for (i in 1:12) {
  a <- matrix(rnorm(n * n) / 10, ncol = n, nrow = n)
  b <- t(a)
  dim(b) <- c(n / 2, n * 2)
  a <- t(b)
  keep <- a          # a copy-on-assignment in R semantics
  keep[1, 1] <- i    # ... made real by one write
  acc <- acc + sum(keep[1:10, 1:10]) + sum(a[1:10, 1])
}
digest(acc, dim(a))
