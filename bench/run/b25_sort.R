# R-benchmark-25, II.1 and II.3: sorting many random values, and the vector copies
# of rank/order and replacement.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
n <- round(3e6 * scale)
acc <- 0
x <- runif(n)
for (i in 1:8) {
  y <- x
  y[i] <- -1          # copy of x, one page written
  s <- sort(y, method = "quick")
  o <- order(y[1:(n / 10)])
  acc <- acc + s[1] + s[n] + o[1]
  x <- y
}
digest(acc)
