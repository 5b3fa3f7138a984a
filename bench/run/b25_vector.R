# R-benchmark-25, I.3-I.5 style vector arithmetic: powers, cumulative sums, Fibonacci
# numbers by vector calculation, with copies of large vectors modified in a few places.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
n <- round(4e6 * scale)
v <- abs(rnorm(n)) / 2
acc <- 0
for (i in 1:10) {
  w <- v
  w[seq(1, n, by = 100000)] <- 0   # a few pages written
  p <- w^1000
  phi <- 1.6180339887498949
  a <- floor(runif(n / 4) * 1000)
  f <- (phi^a - (-phi)^(-a)) / sqrt(5)
  acc <- acc + sum(p[1:100]) + sum(cumsum(w[1:1000])) + sum(f[1:10])
}
digest(acc)
