# Copies, modification, sorting and subsetting in forked workers (parallel::mclapply):
# the parent's vectors must look the same in every child and after the children ran.
source(file.path(Sys.getenv("ADVM_BENCH_DIR", "."), "common.R"))
suppressMessages(library(parallel))
x <- runif(round(1e6 * scale))
y <- x
y[5] <- 0
res <- mclapply(1:4, function(i) {
  z <- x          # copy in the child
  z[i * 10] <- i  # write it: the parent and the other children must not see this
  x[1] <<- -1     # also write the child's view of the parent's vector
  c(sum(z), sum(sort(z)[1:10]), sum(x[-1]), sum(y[1:100]))
}, mc.cores = 2)
digest(unlist(res), x[1:5], y[1:10])
w <- x
w[1] <- 7
digest(sum(w), sum(x), sum(sort(x)[1:3]), sum(x[x > 0.5]))
