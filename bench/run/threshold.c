/* Threshold probe for the shim: the cost of one "copy a block, then change a byte of
 * the copy" cycle (malloc source, fill it, malloc copy, memcpy, write one byte, free
 * both) for blocks of 1..64 pages. Run it with and without the shim: the smallest size
 * where the shim's cycle is not slower than glibc's is where the arena starts to pay.
 * Prints "pages ns_per_cycle" lines. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    static const int sizes[] = {1, 2, 4, 8, 16, 32, 64};
    unsigned long sink = 0;
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = (size_t)sizes[i] * 4096 - 64; /* an R-like block: header + data */
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now();
            for (int k = 0; k < iters; k++) {
                unsigned char *a = malloc(n), *b = malloc(n);
                memset(a, k, n);
                memcpy(b + 48, a + 48, n - 48);
                b[n / 2] ^= 1;
                sink += b[n / 3] + b[n / 2];
                free(a);
                free(b);
            }
            double dt = (now() - t0) / iters * 1e9;
            if (dt < best) best = dt;
        }
        printf("%d %.0f\n", sizes[i], best);
    }
    return sink == 42 ? 1 : 0;
}
