/*
 * The kernel floor under advm-gc's large-object compaction: per-object cost of moving
 * k-page objects by one UFFDIO_MOVE each in a batch against memmove, in the two
 * compaction patterns a collection meets, with bare system calls (no library in
 * between). Evidence for docs/gc.md ("Page moves of 50-64 KiB objects"); not part of
 * the build.
 *
 *   cc -O2 -o /tmp/batch_floor bench/gc/batch_floor.c && /tmp/batch_floor [objects] [reps]
 *
 * Patterns (n live objects of k pages each):
 *  - slide: the live objects are contiguous above one dead object and slide down by k
 *    pages; every destination but the first was vacated by the move before it.
 *  - half-dead: live and dead objects alternate; compaction packs the live ones, so
 *    about half the destination pages hold dead objects (populated) and half were
 *    vacated by earlier moves.
 * Ways: memmove each object; batch = one process_madvise(MADV_DONTNEED) over every
 * populated destination page, then one UFFDIO_MOVE per object (advm's Batch);
 * moves only = the UFFDIO_MOVE calls of the batch, the populated pages freed before
 * the clock starts. "cold": a 64 MiB buffer is read before each run; "warm": the
 * objects were written just before. Medians of `reps` runs, microseconds per object.
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

struct move_arg { uint64_t dst, src, len, mode; int64_t move; };
#define MOVE_IOCTL _IOWR(UFFDIO, 0x05, struct move_arg)
#define FEATURE_MOVE (1ULL << 16)
#define PS 4096UL
#define EVICT (64UL << 20)

static int uffd, pidfd, n, k, half;
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
static double median(double *v, int m) {
	qsort(v, m, sizeof *v, cmpd);
	return v[m / 2];
}
static void die(const char *what) {
	fprintf(stderr, "%s failed: %s\n", what, strerror(errno));
	exit(1);
}
/* Object i's source and destination, in pages. */
static size_t src_of(int i) { return half ? (size_t)(2 * i + 1) * k : (size_t)(i + 1) * k; }
static size_t dst_of(int i) { return (size_t)i * k; }
static void setup(int cold) {
	madvise(R, RL, MADV_DONTNEED);
	memset(R, 1, (src_of(n - 1) + k) * PS); /* dead objects: populated */
	for (int i = 0; i < n; i++) memset(R + src_of(i) * PS, i % 250 + 2, k * PS);
	if (cold) evict();
}
static void check(void) {
	for (int i = 0; i < n; i++) {
		char *d = R + dst_of(i) * PS;
		if (d[0] != (char)(i % 250 + 2) || d[k * PS - 1] != (char)(i % 250 + 2)) {
			fprintf(stderr, "object %d did not arrive\n", i);
			exit(1);
		}
	}
}
/* Destination pages no earlier move vacated: the dead objects' pages below the new top. */
static int populated(struct iovec *iov) {
	int m = 0;
	size_t top = (size_t)n * k;
	if (!half) {
		iov[m].iov_base = R;
		iov[m++].iov_len = k * PS;
		return m;
	}
	for (size_t p = 0; p < top; p += 2 * k) {
		iov[m].iov_base = R + p * PS;
		iov[m++].iov_len = (p + k <= top ? k : top - p) * PS;
	}
	return m;
}
enum { MEMMOVE, BATCH, MOVES_ONLY, N_WAYS };
static double run(int way, int cold) {
	static struct iovec iov[1 << 16];
	setup(cold);
	int m = populated(iov);
	if (way == MOVES_ONLY) {
		for (int j = 0; j < m; j += 1024)
			if (syscall(SYS_process_madvise, pidfd, iov + j, m - j < 1024 ? m - j : 1024, MADV_DONTNEED, 0) < 0)
				die("process_madvise");
		if (cold) evict();
	}
	double t0 = now();
	if (way == MEMMOVE) {
		for (int i = 0; i < n; i++) memmove(R + dst_of(i) * PS, R + src_of(i) * PS, k * PS);
	} else {
		if (way == BATCH)
			for (int j = 0; j < m; j += 1024)
				if (syscall(SYS_process_madvise, pidfd, iov + j, m - j < 1024 ? m - j : 1024, MADV_DONTNEED, 0) < 0)
					die("process_madvise");
		for (int i = 0; i < n; i++) {
			struct move_arg a = {.dst = (uint64_t)(R + dst_of(i) * PS), .src = (uint64_t)(R + src_of(i) * PS),
			                     .len = k * PS, .mode = 0};
			if (ioctl(uffd, MOVE_IOCTL, &a)) die("UFFDIO_MOVE");
		}
	}
	double t = (now() - t0) / n;
	check();
	return t;
}

int main(int argc, char **argv) {
	n = argc > 1 ? atoi(argv[1]) : 200;
	int reps = argc > 2 ? atoi(argv[2]) : 7;
	if (n < 2 || reps < 1 || reps > 64) return 2;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = {.api = UFFD_API, .features = FEATURE_MOVE | UFFD_FEATURE_PAGEFAULT_FLAG_WP};
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) die("userfaultfd with UFFD_FEATURE_MOVE");
	pidfd = syscall(SYS_pidfd_open, getpid(), 0);
	int sizes[] = {4, 8, 12, 13, 16, 24, 32, 64, 128, 256, 511};
	RL = (size_t)(2 * n + 2) * 512 * PS;
	R = mmap(0, RL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (R == MAP_FAILED) die("mmap");
	madvise(R, RL, MADV_NOHUGEPAGE);
	struct uffdio_register reg = {.range = {(uint64_t)R, RL}, .mode = UFFDIO_REGISTER_MODE_WP};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER");
	EV = malloc(EVICT);
	memset(EV, 1, EVICT);
	printf("%d objects, medians of %d runs, us per object (memmove / batch / moves only; batch vs memmove)\n", n, reps);
	for (half = 0; half < 2; half++)
		for (int cold = 1; cold >= 0; cold--) {
			printf("%s, %s:\n", half ? "half-dead" : "slide", cold ? "cold" : "warm");
			for (unsigned si = 0; si < sizeof sizes / sizeof *sizes; si++) {
				k = sizes[si];
				double t[N_WAYS][64], med[N_WAYS];
				/* ways interleaved run by run, so load changes hit all three alike */
				for (int r = 0; r < reps; r++)
					for (int w = 0; w < N_WAYS; w++) t[w][r] = run(w, cold);
				for (int w = 0; w < N_WAYS; w++) med[w] = median(t[w], reps);
				printf("  %3d pages (%4lu KiB): %7.2f %7.2f %7.2f  %.2fx\n", k, k * PS / 1024, med[0], med[1], med[2],
				       med[0] / med[1]);
			}
		}
	return 0;
}
