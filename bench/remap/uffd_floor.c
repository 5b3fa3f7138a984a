/*
 * The kernel floor under `advm bench remap`'s batch section: raw UFFDIO_MOVE and
 * MADV_DONTNEED costs with no library in between, and the bench's two batch patterns
 * replayed with bare system calls. Evidence for docs/remap.md ("Why batches stay
 * under 3x"); not part of the build.
 *
 *   cc -O2 -o /tmp/uffd_floor bench/remap/uffd_floor.c && /tmp/uffd_floor [n] [reps]
 *
 * Linux 6.8+ (UFFDIO_MOVE), root or vm.unprivileged_userfaultfd=1. Times are medians
 * of `reps` runs in microseconds. "cold" = a 64 MiB buffer was read just before, so
 * the moved pages' metadata is out of the cache, as in the bench.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Debian 12's headers predate UFFDIO_MOVE (Linux 6.8). */
struct move_arg { uint64_t dst, src, len, mode; int64_t move; };
#define MOVE_IOCTL _IOWR(UFFDIO, 0x05, struct move_arg)
#define FEATURE_MOVE (1ULL << 16)
#define MODE_HOLES (1ULL << 1) /* UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES */
#define PS 4096UL
#define EVICT (64UL << 20)

static int uffd, pidfd, n, scatter;
static char *R, *EV;
static size_t RL;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static void evict(void) {
	volatile char s = 0;
	for (size_t i = 0; i < EVICT; i += 64) s += EV[i];
}
static int cmpd(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}
static double median(double *v, int k) {
	qsort(v, k, sizeof *v, cmpd);
	return v[k / 2];
}
static void die(const char *what, int i) {
	fprintf(stderr, "%s failed (object %d): %s\n", what, i, strerror(errno));
	exit(1);
}
/* UFFDIO_MOVE; returns bytes moved, *err = errno or 0. */
static long umove(char *d, char *s, size_t len, uint64_t mode, int *err) {
	struct move_arg m = {.dst = (uint64_t)d, .src = (uint64_t)s, .len = len, .mode = mode};
	*err = ioctl(uffd, MOVE_IOCTL, &m) ? errno : 0;
	return m.move > 0 ? m.move : 0;
}
static void zapv(struct iovec *iov, int k) {
	if (k && syscall(SYS_process_madvise, pidfd, iov, k, MADV_DONTNEED, 0) < 0) die("process_madvise", -1);
}

/* ---- 1. raw UFFDIO_MOVE: one call of N contiguous pages, empty destination ---- */
static void raw_calls(int reps) {
	char *A = R, *B = R + RL / 2;
	size_t sizes[] = {1, 10, 100, 1000};
	for (int cold = 0; cold < 2; cold++) {
		printf("one UFFDIO_MOVE, empty destination, %s:\n", cold ? "cold" : "hot");
		for (int si = 0; si < 4; si++) {
			size_t np = sizes[si];
			double t[64];
			for (int k = 0; k < reps; k++) {
				memset(A, k + 1, np * PS);
				madvise(B, np * PS, MADV_DONTNEED);
				if (cold) evict();
				int err;
				double t0 = now();
				umove(B, A, np * PS, 0, &err);
				t[k] = now() - t0;
				if (err) die("UFFDIO_MOVE", -1);
			}
			double m = median(t, reps);
			printf("  %4zu pages: %8.2f us per call, %6.3f us per page\n", np, m, m / np);
		}
		/* 100 separate 10-page calls vs the same 1000 pages in one call */
		double t1[64], t2[64];
		for (int k = 0; k < reps; k++) {
			madvise(B, RL / 2, MADV_DONTNEED);
			memset(A, 3, 1000 * PS);
			if (cold) evict();
			int err;
			double t0 = now();
			for (int i = 0; i < 100; i++) {
				umove(B + i * 11 * PS, A + i * 10 * PS, 10 * PS, 0, &err);
				if (err) die("UFFDIO_MOVE", i);
			}
			t1[k] = (now() - t0) / 100;
			madvise(B, RL / 2, MADV_DONTNEED);
			memset(A, 4, 1000 * PS);
			if (cold) evict();
			t0 = now();
			umove(B, A, 1000 * PS, 0, &err);
			t2[k] = (now() - t0) / 100;
		}
		double a = median(t1, reps), b = median(t2, reps);
		printf("  100 calls of 10 pages: %.2f us per object; 1 call of 1000 pages: %.2f us per 10 pages;"
		       " per-call cost %.2f us\n", a, b, a - b);
	}
}

/* ---- 2. MADV_DONTNEED cost (freeing populated pages) ---- */
static void zap_costs(int reps) {
	char *B = R + RL / 2;
	printf("emptying 100 destinations (MADV_DONTNEED), hot, us per destination:\n");
	int pages[] = {0, 1, 2, 10};
	for (int pi = 0; pi < 4; pi++) {
		int np = pages[pi], len = np ? np : 10;
		double t1[64], t2[64];
		for (int k = 0; k < reps; k++) {
			struct iovec iov[100];
			for (int v = 0; v < 2; v++) {
				madvise(B, RL / 2, MADV_DONTNEED);
				for (int i = 0; i < 100; i++) {
					if (np) memset(B + i * 11 * PS, 1, np * PS);
					iov[i].iov_base = B + i * 11 * PS;
					iov[i].iov_len = len * PS;
				}
				double t0 = now();
				if (v == 0)
					for (int i = 0; i < 100; i++) madvise(iov[i].iov_base, iov[i].iov_len, MADV_DONTNEED);
				else
					zapv(iov, 100);
				(v ? t2 : t1)[k] = (now() - t0) / 100;
			}
		}
		printf("  %2d populated pages of %d: one madvise each %5.2f, one process_madvise for all %5.2f\n", np,
		       len, median(t1, reps), median(t2, reps));
	}
}

/* ---- 3. the bench's batch patterns with bare system calls ---- */
static size_t src_of(int i) { return scatter ? (size_t)i * 12 * PS : (size_t)(2 + i * 12) * PS; }
static size_t dst_of(int i) { return scatter ? (size_t)(n * 12 + i * 11) * PS : (size_t)i * 10 * PS; }
static void setup(void) {
	memset(R, 1, RL);
	for (int i = 0; i < n; i++) memset(R + src_of(i), i % 250 + 2, 10 * PS);
	evict();
}
static void check(void) {
	for (int i = 0; i < n; i++)
		if (R[dst_of(i)] != (char)(i % 250 + 2) || R[dst_of(i) + 10 * PS - 1] != (char)(i % 250 + 2)) {
			fprintf(stderr, "object %d did not arrive\n", i);
			exit(1);
		}
}
/* The populated pages of object i's destination that no earlier move vacated. */
static int dead_pages(int i, struct iovec *iov) {
	size_t d = dst_of(i) / PS;
	if (scatter) {
		iov[0].iov_base = R + d * PS;
		iov[0].iov_len = 10 * PS;
		return 1;
	}
	int k = 0;
	for (size_t p = d; p < d + 10; p++)
		if (p % 12 < 2) {
			size_t q = p;
			while (q < d + 10 && q % 12 < 2) q++;
			iov[k].iov_base = R + p * PS;
			iov[k++].iov_len = (q - p) * PS;
			p = q - 1;
		}
	return k;
}
enum { TRY_FIRST, ZAP_FIRST, MINCORE_FIRST, BATCH, ZAP_ONLY, N_WAYS };
static const char *way_name[] = {
    "one call each: move, on EEXIST empty the rest, move again (advm's single call)",
    "one call each: empty the dead pages (known in advance), then one move",
    "one call each: mincore, empty the resident pages, then one move",
    "batch of 100: one process_madvise, then one move per object (advm's Batch)",
    "  of which the process_madvise alone",
};
static double run(int way) {
	setup();
	size_t obj = 10 * PS;
	int err;
	double t0 = now();
	if (way == TRY_FIRST || way == ZAP_FIRST || way == MINCORE_FIRST) {
		for (int i = 0; i < n; i++) {
			char *d = R + dst_of(i), *s = R + src_of(i);
			if (way == MINCORE_FIRST) {
				/* resident runs of the destination, not the object's own pages */
				unsigned char vec[10];
				if (mincore(d, obj, vec)) die("mincore", i);
				for (int p = 0; p < 10;) {
					char *a = d + p * PS;
					if (!(vec[p] & 1) || (a >= s && a < s + obj)) {
						p++;
						continue;
					}
					int q = p;
					while (q < 10 && (vec[q] & 1) && !(d + q * PS >= s && d + q * PS < s + obj)) q++;
					madvise(a, (q - p) * PS, MADV_DONTNEED);
					p = q;
				}
				umove(d, s, obj, MODE_HOLES, &err);
				if (err) die("UFFDIO_MOVE", i);
				continue;
			}
			if (way == ZAP_FIRST) {
				struct iovec iov[4];
				int k = dead_pages(i, iov);
				for (int j = 0; j < k; j++) madvise(iov[j].iov_base, iov[j].iov_len, MADV_DONTNEED);
				umove(d, s, obj, MODE_HOLES, &err);
				if (err) die("UFFDIO_MOVE", i);
				continue;
			}
			long m = umove(d, s, obj, 0, &err);
			for (int tries = 0; err == EAGAIN && tries < 16; tries++) m += umove(d + m, s + m, obj - m, 0, &err);
			if (err == EEXIST) {
				/* empty the rest of the destination, not the object's own pages (a slide) */
				char *end = d + obj;
				if (s > d && s < d + obj) end = s;
				if (end > d + m) madvise(d + m, end - (d + m), MADV_DONTNEED);
				umove(d + m, s + m, obj - m, MODE_HOLES, &err);
			}
			if (err) die("UFFDIO_MOVE", i);
		}
	} else {
		for (int b0 = 0; b0 < n; b0 += 100) {
			struct iovec iov[400];
			int k = 0;
			for (int i = b0; i < b0 + 100 && i < n; i++) k += dead_pages(i, iov + k);
			zapv(iov, k);
			if (way == ZAP_ONLY) continue;
			for (int i = b0; i < b0 + 100 && i < n; i++) {
				umove(R + dst_of(i), R + src_of(i), obj, MODE_HOLES, &err);
				if (err) die("UFFDIO_MOVE", i);
			}
		}
	}
	double t = (now() - t0) / n;
	if (way != ZAP_ONLY) check();
	return t;
}
/* 10n pages in n/100 calls of 1000 contiguous pages: what the moves would cost if one
 * call could take 100 objects (it cannot). */
static double contiguous(void) {
	size_t half = RL / 2;
	memset(R, 1, half);
	madvise(R + half, half, MADV_DONTNEED);
	evict();
	int err;
	double t0 = now();
	for (int b0 = 0; b0 < n; b0 += 100) umove(R + half + (size_t)b0 * 10 * PS, R + (size_t)b0 * 10 * PS, 1000 * PS, 0, &err);
	return (now() - t0) / n;
}
static void patterns(int reps) {
	for (scatter = 1; scatter >= 0; scatter--) {
		printf("%s, %d ten-page objects, cold, us per object:\n", scatter ? "scatter" : "compaction", n);
		double med[N_WAYS], t[64];
		for (int w = 0; w < N_WAYS; w++) {
			for (int k = 0; k < reps; k++) t[k] = run(w);
			med[w] = median(t, reps);
			printf("  %-82s %6.2f [%.2f..%.2f]\n", way_name[w], med[w], t[0], t[reps - 1]);
		}
		for (int k = 0; k < reps; k++) t[k] = contiguous();
		double c = median(t, reps);
		printf("  %-82s %6.2f\n", "the same pages as 1000-page moves (no vectored UFFDIO_MOVE exists)", c);
		printf("  advm's single / batch: %.2fx; if one call took 100 objects: %.2fx\n", med[TRY_FIRST] / med[BATCH],
		       med[TRY_FIRST] / (med[ZAP_ONLY] + c));
	}
}

int main(int argc, char **argv) {
	n = argc > 1 ? atoi(argv[1]) : 1000;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	if (n < 100 || n % 100 || reps < 1 || reps > 64) {
		fprintf(stderr, "usage: %s [objects, a multiple of 100] [reps, 1..64]\n", argv[0]);
		return 2;
	}
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = {.api = UFFD_API, .features = FEATURE_MOVE | UFFD_FEATURE_PAGEFAULT_FLAG_WP};
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) die("userfaultfd with UFFD_FEATURE_MOVE", -1);
	pidfd = syscall(SYS_pidfd_open, getpid(), 0);
	RL = (size_t)(n * 23 + 16) * PS;
	if (RL < 4000 * PS) RL = 4000 * PS;
	R = mmap(0, RL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (R == MAP_FAILED) die("mmap", -1);
	madvise(R, RL, MADV_NOHUGEPAGE);
	/* Write-protect mode only, as advm registers: UFFDIO_MOVE may target the range and
	 * no fault is ever reported. */
	struct uffdio_register reg = {.range = {(uint64_t)R, RL}, .mode = UFFDIO_REGISTER_MODE_WP};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER", -1);
	EV = malloc(EVICT);
	memset(EV, 1, EVICT);
	raw_calls(reps > 9 ? reps : 9);
	zap_costs(reps);
	patterns(reps);
	return 0;
}
