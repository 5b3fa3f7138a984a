/* The cost a single-threaded program pays for a virtual copy that re-homes written
 * pages (docs/run.md, "Copies and threads"): run under the shim (ADVM_MODE=vcopy) by
 * bench/run/rehome_ab.sh, which alternates two builds of it.
 *   rehome_cost [thread]   prints, per case, the median microseconds of one memcpy
 * (thread: beside an idle second thread, so that re-homing copies fence writers):
 *   written-1/64K   one page of a 16-page block written, then the block copied;
 *   written-1/64M   one page of a 64 MiB block written, then the block copied;
 *   first/1M        a fresh 1 MiB block, every page written, copied once (all re-homed);
 *   unwritten/64M   a 64 MiB block copied again with nothing written (no re-home). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp);
    return t[n / 2];
}

/* copies src to dst `rounds` times, writing `write` words one page apart first */
static double copies(size_t n, int rounds, int write) {
    char *s = malloc(n), *d = malloc(n);
    double *t = malloc(sizeof(double) * (size_t)rounds);
    if (!s || !d || !t) exit(2);
    memset(s, 1, n);
    memset(d, 2, n);
    memcpy(d, s, n); /* the first copy: s is shared from now on */
    for (int r = 0; r < rounds; r++) {
        for (int w = 0; w < write; w++) s[((size_t)(r * 7 + w) * 4096) % n] = (char)r;
        double t0 = now_us();
        memcpy(d, s, n);
        t[r] = now_us() - t0;
    }
    double m = median(t, rounds);
    free(s), free(d), free(t);
    return m;
}

static double first_copies(size_t n, int rounds) {
    double *t = malloc(sizeof(double) * (size_t)rounds);
    char *d = malloc(n);
    if (!t || !d) exit(2);
    memset(d, 2, n);
    for (int r = 0; r < rounds; r++) {
        char *s = malloc(n);
        if (!s) exit(2);
        memset(s, r, n);
        double t0 = now_us();
        memcpy(d, s, n);
        t[r] = now_us() - t0;
        free(s);
    }
    double m = median(t, rounds);
    free(d), free(t);
    return m;
}

static void *idle(void *arg) {
    (void)arg;
    pause();
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc > 1 && pthread_create(&t, NULL, idle, NULL) != 0) return 2;
    printf("written-1/64K %.2f\n", copies(64 << 10, 4000, 1));
    printf("written-1/64M %.2f\n", copies(64 << 20, 400, 1));
    printf("first/1M %.2f\n", first_copies(1 << 20, 400));
    printf("unwritten/64M %.2f\n", copies(64 << 20, 400, 0));
    return 0;
}
