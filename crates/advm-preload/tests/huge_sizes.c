/* Every allocation entry point fails as glibc does for sizes that overflow: NULL with
 * errno ENOMEM (posix_memalign returns ENOMEM; EINVAL for a bad alignment), and a
 * failed realloc leaves its block as it was (run by tests/c_programs.rs in every mode,
 * also without the shim). Exits 0 when every check passed. */
#include "c/t.h"

static const size_t huge[] = {
    SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - PS + 2, SIZE_MAX - PS, SIZE_MAX - 2 * PS, SIZE_MAX / 2 + 1, SIZE_MAX / 2,
    (size_t)1 << 62, (size_t)PTRDIFF_MAX,
};
#define NHUGE (sizeof huge / sizeof huge[0])

#define FAILS(expr)                                                                          \
    do {                                                                                     \
        errno = 0;                                                                           \
        void *r_ = (expr);                                                                   \
        if (r_ != NULL || errno != ENOMEM) {                                                 \
            fprintf(stderr, "%s:%d: %s with size %zu gave %p, errno %d (want NULL, ENOMEM)\n", \
                    __FILE__, __LINE__, #expr, n, r_, errno);                                \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

int main(void) {
    size_t blk = 64 * PS;
    unsigned char *big = malloc(blk), *small = malloc(100);
    CHECK(big && small);
    fill(big, blk, 5);
    fill(small, 100, 6);
    for (size_t h = 0; h < NHUGE; h++) {
        size_t n = huge[h];
        FAILS(malloc(n));
        FAILS(calloc(n, 1));
        FAILS(calloc(1, n));
        FAILS(calloc(n, 2));
        FAILS(realloc(NULL, n));
        FAILS(realloc(big, n));
        FAILS(realloc(small, n));
        FAILS(reallocarray(big, n, 1));
        FAILS(reallocarray(big, 1, n));
        FAILS(reallocarray(small, n, 3));
        FAILS(memalign(PS, n));
        FAILS(memalign(64, n));
        FAILS(memalign(2 * PS, n));
        FAILS(aligned_alloc(PS, n));
        FAILS(aligned_alloc(16, n));
        FAILS(valloc(n));
        FAILS(pvalloc(n));
        void *out = (void *)1;
        CHECK(posix_memalign(&out, PS, n) == ENOMEM && out == (void *)1);
        CHECK(posix_memalign(&out, 16, n) == ENOMEM && out == (void *)1);
        CHECK(posix_memalign(&out, 3, n) == EINVAL && out == (void *)1);
        CHECK(same(big, blk, 5) && malloc_usable_size(big) >= blk);
        CHECK(same(small, 100, 6));
    }
    /* the blocks still work after every failed call */
    fill(big, blk, 7);
    big = realloc(big, 2 * blk);
    CHECK(big && same(big, blk, 7));
    free(big);
    free(small);
    printf("huge_sizes: ok\n");
    return 0;
}
