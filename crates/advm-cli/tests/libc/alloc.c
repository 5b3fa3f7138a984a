/* The malloc family: sizes at the shim's threshold and far above it, overflow, realloc in
 * every direction (NULL, 0, grow, shrink, across the threshold), the memalign family with
 * good and bad alignments, malloc_usable_size, free(NULL). Prints every result that glibc
 * defines (NULL or not, errno, return codes, contents). */
#include "sweep.h"
#include <malloc.h>

static void show(const char *what, void *p, int err) { printf("%s: %s errno=%d\n", what, p ? "ptr" : "NULL", p ? 0 : err); }

int main(void) {
    size_t sizes[] = {1, 4095, 4096, 8191, 8192, 8193, 65536, 1 << 20, (1 << 20) + 3, 8 << 20};
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        char *p = malloc(n);
        CHECK(p);
        CHECK(malloc_usable_size(p) >= n);
        fill(p, n, i);
        char *c = calloc(n, 1);
        CHECK(c);
        for (size_t j = 0; j < n; j++) CHECK(c[j] == 0);
        CHECK(holds(p, n, i, 0));
        printf("size %zu: sum %016llx\n", n, (unsigned long long)sum(p, n));
        free(c);
        free(p);
        /* calloc after a free of the same size must still be zero (a reused block) */
        c = calloc(1, n);
        CHECK(c);
        for (size_t j = 0; j < n; j++) CHECK(c[j] == 0);
        free(c);
    }
    free(NULL);

    errno = 0;
    show("calloc overflow", calloc(SIZE_MAX / 2, 3), errno);
    errno = 0;
    show("calloc (1<<33)*(1<<33)", calloc((size_t)1 << 33, (size_t)1 << 33), errno);
    errno = 0;
    show("malloc SIZE_MAX", malloc(SIZE_MAX), errno);
    errno = 0;
    show("malloc SIZE_MAX-4095", malloc(SIZE_MAX - 4095), errno);
    errno = 0;
    show("malloc 1<<62", malloc((size_t)1 << 62), errno);
    errno = 0;
    show("reallocarray overflow", reallocarray(NULL, SIZE_MAX / 2, 3), errno);

    /* realloc: NULL pointer, grow, shrink, size 0, across the threshold both ways */
    char *r = realloc(NULL, 100000);
    CHECK(r);
    fill(r, 100000, 1);
    size_t steps[] = {200000, 50000, 3000, 16, 5000, 9000, 1 << 20, 40000, 3 << 20, 12288, 123457};
    size_t have = 100000;
    for (unsigned i = 0; i < sizeof steps / sizeof *steps; i++) {
        size_t n = steps[i];
        r = realloc(r, n);
        CHECK(r);
        size_t keep = have < n ? have : n;
        CHECK(holds(r, keep, 1, 0));
        if (n > keep) fill(r + keep, n - keep, 0), fill(r, n, 1); /* refill: the pattern is by offset */
        have = n;
        printf("realloc %zu: sum %016llx\n", n, (unsigned long long)sum(r, n));
    }
    errno = 0;
    char *big = realloc(r, SIZE_MAX);
    show("realloc SIZE_MAX", big, errno);
    CHECK(holds(r, have, 1, 0)); /* a failed realloc leaves the block as it was */
    errno = 0;
    big = realloc(r, (size_t)1 << 60);
    show("realloc 1<<60", big, errno);
    CHECK(holds(r, have, 1, 0));
    r = reallocarray(r, 1000, 1000);
    CHECK(r);
    CHECK(holds(r, have, 1, 0));
    r = reallocarray(r, 3, 4096);
    CHECK(r && holds(r, 3 * 4096, 1, 0));
    /* realloc(p, 0) frees p (glibc returns NULL) */
    r = realloc(r, 0);
    printf("realloc(p, 0): %s\n", r ? "ptr" : "NULL");
    free(r);
    r = realloc(NULL, 0);
    printf("realloc(NULL, 0): %s\n", r ? "ptr" : "NULL");
    free(r);
    /* a glibc block grown into the arena's size range and back */
    char *g = malloc(100);
    fill(g, 100, 9);
    g = realloc(g, 5 << 20);
    CHECK(g && holds(g, 100, 9, 0));
    fill(g, 5 << 20, 9);
    g = realloc(g, 200);
    CHECK(g && holds(g, 200, 9, 0));
    free(g);

    /* the memalign family */
    size_t aligns[] = {0, 1, 2, 3, 8, 12, 16, 24, 48, 64, 100, 4096, 4097, 8192, 12288, 65536, 1 << 21, (size_t)1 << 40};
    size_t ns[] = {0, 1, 100, 8192, 100000};
    for (unsigned a = 0; a < sizeof aligns / sizeof *aligns; a++) {
        for (unsigned k = 0; k < sizeof ns / sizeof *ns; k++) {
            size_t al = aligns[a], n = ns[k];
            void *p = (void *)1;
            int rc = posix_memalign(&p, al, n);
            printf("posix_memalign(%zu, %zu) = %d%s\n", al, n, rc, rc ? (p == (void *)1 ? " untouched" : " changed") : "");
            if (!rc) {
                CHECK(al == 0 || (uintptr_t)p % al == 0);
                if (n) memset(p, 1, n);
                free(p);
            }
            errno = 0;
            p = aligned_alloc(al, n);
            int e = errno;
            printf("aligned_alloc(%zu, %zu): %s errno=%d", al, n, p ? "ptr" : "NULL", p ? 0 : e);
            if (p) {
                size_t pa = al & (al - 1) ? al : al; /* glibc rounds a bad alignment up */
                size_t up = 1;
                while (up < pa) up <<= 1;
                printf(" aligned=%d", (uintptr_t)p % up == 0);
                if (n) memset(p, 2, n);
                free(p);
            }
            printf("\n");
            errno = 0;
            p = memalign(al, n);
            e = errno;
            printf("memalign(%zu, %zu): %s errno=%d", al, n, p ? "ptr" : "NULL", p ? 0 : e);
            if (p) {
                size_t up = 1;
                while (up < al) up <<= 1;
                printf(" aligned=%d", (uintptr_t)p % up == 0);
                if (n) memset(p, 3, n);
                free(p);
            }
            printf("\n");
        }
    }
    size_t vs[] = {0, 1, 4096, 4097, 100000, SIZE_MAX - 100, SIZE_MAX};
    for (unsigned k = 0; k < sizeof vs / sizeof *vs; k++) {
        errno = 0;
        void *p = valloc(vs[k]);
        int e = errno;
        printf("valloc(%zu): %s errno=%d aligned=%d\n", vs[k], p ? "ptr" : "NULL", p ? 0 : e, p ? (uintptr_t)p % 4096 == 0 : 0);
        if (p && vs[k]) memset(p, 4, vs[k]);
        free(p);
        errno = 0;
        p = pvalloc(vs[k]);
        e = errno;
        printf("pvalloc(%zu): %s errno=%d aligned=%d\n", vs[k], p ? "ptr" : "NULL", p ? 0 : e, p ? (uintptr_t)p % 4096 == 0 : 0);
        if (p) {
            CHECK(malloc_usable_size(p) >= ((vs[k] + 4095) & ~(size_t)4095));
            memset(p, 5, (vs[k] + 4095) & ~(size_t)4095); /* pvalloc rounds up to whole pages */
        }
        free(p);
    }
    printf("malloc_usable_size(NULL) = %zu\n", malloc_usable_size(NULL));
    printf("done\n");
    return 0;
}
