#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
int main(int c, char **v) {
    long iters = atol(v[1]); size_t sz = 256 << 10;
    char *src = malloc(sz); memset(src, 3, sz);
    char *keep[64] = {0};
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    long sum = 0;
    for (long i = 0; i < iters; i++) {
        int k = i % 64;
        free(keep[k]);
        keep[k] = malloc(sz);
        memcpy(keep[k], src, sz);
        keep[k][i % sz] = 1;
        sum += keep[k][(i * 4096) % sz];
        if (i % 16 == 0) { void *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); munmap(p, 4096); }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f s %ld\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, sum);
    return 0;
}
