# Realistic R that knows nothing of advm, for `advm run` sweeps:
# `Rscript --vanilla r_workloads.R NAME`, NAME one of vectors, frames, parallel, matrix,
# csv, all. Prints only what is the same in every run (sums, digests of serialized
# values), so stdout under `advm run --mode M` must be byte-identical to the plain run.
# SWEEP_SCALE (default 1) multiplies the sizes.
scale <- as.numeric(Sys.getenv("SWEEP_SCALE", "1"))
n <- function(x) max(1L, as.integer(x * scale))
set.seed(42)
dig <- function(x) {
  # a cheap digest of the value's bytes (no package needed)
  r <- serialize(x, NULL, xdr = FALSE)
  v <- as.integer(r[seq(1, length(r), by = max(1L, length(r) %/% 4096L))])
  sprintf("%d/%d/%.6f", length(r), sum(v * seq_along(v)) %% 1000003L, sum(as.numeric(r[r > 0])) / length(r))
}
out <- function(...) cat(..., "\n")

vectors <- function() {
  x <- runif(n(1e7))
  y <- x            # no copy yet (shared)
  y[1] <- -1        # R duplicates: the mmapcopy paper's case
  z <- y
  z[length(z)] <- 2
  w <- x * 2
  w[seq(1, length(w), by = 1000)] <- 0
  out("vectors", format(sum(x), digits = 15), format(sum(y), digits = 15), format(sum(z), digits = 15),
      format(sum(w), digits = 15), identical(x[-1], y[-1]))
  v <- list(); for (i in 1:5) { v[[i]] <- x; v[[i]][i] <- i }
  out("copies", sapply(v, function(e) format(sum(e), digits = 12)))
  rm(v, y, z, w); invisible(gc())
  s <- sort(x[1:n(2e6)])
  out("sorted", format(s[c(1, length(s))], digits = 12), dig(s))
}

frames <- function() {
  rows <- n(1e6)
  df <- data.frame(k = sample.int(1000, rows, TRUE), g = sample(letters[1:7], rows, TRUE), x = rnorm(rows))
  df2 <- df
  df2$x[df2$g == "c"] <- 0
  df2$y <- df2$x * 2
  a <- aggregate(x ~ g, data = df, FUN = sum)
  out("aggregate", paste(a$g, format(a$x, digits = 10), collapse = " "))
  m <- merge(df[1:n(1e5), ], data.frame(k = 1:1000, w = (1:1000) / 2), by = "k")
  out("merge", nrow(m), format(sum(m$x * m$w), digits = 10))
  l <- lapply(split(df$x, df$g), function(v) c(length(v), sum(v > 0)))
  out("lapply", unlist(l))
  out("frames", format(sum(df2$y), digits = 10), dig(df2[order(df2$k, df2$g), c("k", "g")][1:1000, ]))
  invisible(gc())
}

parallel_ <- function() {
  library(parallel)
  x <- runif(n(4e6))
  r <- mclapply(1:4, function(i) { y <- x; y[i] <- -i; c(i, sum(y), sum(y < 0)) }, mc.cores = 2)
  out("mclapply", sapply(r, function(v) format(v[2], digits = 12)))
  r2 <- mclapply(1:3, function(i) { m <- matrix(x[1:n(1e6)], ncol = 100); m[i, ] <- 0; sum(m) }, mc.cores = 2)
  out("mclapply2", format(unlist(r2), digits = 12), format(sum(x), digits = 12))
}

matrix_ <- function() {
  m <- matrix(rnorm(n(4e6)), ncol = 1000)
  t1 <- t(m)
  m2 <- m; m2[1, 1] <- 0
  cp <- crossprod(m[, 1:200])
  s <- solve(cp + diag(200))
  out("matrix", format(sum(t1), digits = 10), format(sum(m2), digits = 10), format(sum(diag(s)), digits = 10))
  d <- dim(m); dim(m) <- c(d[2], d[1])
  out("reshape", format(sum(m[1, ]), digits = 10), dig(m[1:10, 1:10]))
  invisible(gc())
}

csv <- function() {
  rows <- n(2e5)
  df <- data.frame(id = seq_len(rows), v = round(rnorm(rows), 6), s = sample(c("a", "b,c", "d\"e"), rows, TRUE))
  f <- tempfile(pattern = "advm-sweep-", fileext = ".csv")
  write.csv(df, f, row.names = FALSE)
  back <- read.csv(f)
  unlink(f)
  out("csv", identical(back$id, df$id), isTRUE(all.equal(back$v, df$v)), identical(back$s, df$s),
      format(sum(back$v), digits = 10))
}

what <- commandArgs(trailingOnly = TRUE)[1]
fns <- list(vectors = vectors, frames = frames, parallel = parallel_, matrix = matrix_, csv = csv)
if (what == "all") for (f in fns) f() else fns[[what]]()
