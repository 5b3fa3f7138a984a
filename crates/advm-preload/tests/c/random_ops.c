/* Property test: a random sequence of allocations, copies (equal and unequal page
 * offsets, partial pages), writes, reallocs and frees, checked after every step against
 * shadow copies kept in glibc memory (the oracle: plain bytes, no arena). */
#include "t.h"

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);

#define SLOTS 24
static unsigned char *blk[SLOTS], *shadow[SLOTS];
static size_t len[SLOTS];
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void check(int i, int step) {
    if (blk[i] && memcmp(blk[i], shadow[i], len[i]) != 0) {
        fprintf(stderr, "step %d: slot %d (%zu bytes) differs from its oracle\n", step, i, len[i]);
        exit(1);
    }
}

int main(void) {
    const char *seed = getenv("ADVM_TEST_SEED");
    if (seed) rng ^= strtoull(seed, NULL, 10) * 0x2545f4914f6cdd1dull;
    for (int step = 0; step < 3000; step++) {
        int i = (int)(next() % SLOTS), j = (int)(next() % SLOTS);
        switch (next() % 6) {
        case 0: /* allocate (or replace) */
            if (blk[i]) free(blk[i]), __libc_free(shadow[i]);
            len[i] = (size_t)(next() % (40 * PS)) + 1;
            blk[i] = malloc(len[i]);
            shadow[i] = __libc_malloc(len[i]);
            CHECK(blk[i] && shadow[i]);
            for (size_t k = 0; k < len[i]; k++) blk[i][k] = shadow[i][k] = (unsigned char)next();
            break;
        case 1: /* copy a range between two blocks, same page offset most of the time */
            if (blk[i] && blk[j] && i != j) {
                size_t so = (size_t)(next() % 3) * 48, maxn = len[i] < len[j] ? len[i] : len[j];
                if (maxn <= so + 1) break;
                size_t dof = next() % 4 ? so : so + 16;
                if (dof >= maxn) break;
                size_t n = (size_t)(next() % (maxn - (so > dof ? so : dof)));
                memcpy(blk[j] + dof, blk[i] + so, n);
                memcpy(shadow[j] + dof, shadow[i] + so, n);
            }
            break;
        case 2: /* scattered writes */
            if (blk[i])
                for (int w = 0; w < 8; w++) {
                    size_t at = (size_t)(next() % len[i]);
                    blk[i][at] = shadow[i][at] = (unsigned char)next();
                }
            break;
        case 3: /* realloc */
            if (blk[i]) {
                size_t n = (size_t)(next() % (60 * PS)) + 1;
                blk[i] = realloc(blk[i], n);
                shadow[i] = __libc_realloc(shadow[i], n);
                CHECK(blk[i] && shadow[i]);
                for (size_t k = len[i]; k < n; k++) blk[i][k] = shadow[i][k] = (unsigned char)k;
                len[i] = n;
            }
            break;
        case 4: /* free */
            if (blk[i]) free(blk[i]), __libc_free(shadow[i]), blk[i] = NULL;
            break;
        case 5: /* memmove inside one block */
            if (blk[i] && len[i] > 2) {
                size_t a = (size_t)(next() % len[i]), b = (size_t)(next() % len[i]);
                size_t n = (size_t)(next() % (len[i] - (a > b ? a : b)));
                memmove(blk[i] + a, blk[i] + b, n);
                memmove(shadow[i] + a, shadow[i] + b, n);
            }
            break;
        }
        check(i, step);
        check(j, step);
        if (step % 100 == 0)
            for (int k = 0; k < SLOTS; k++) check(k, step);
    }
    for (int k = 0; k < SLOTS; k++) {
        check(k, -1);
        if (blk[k]) free(blk[k]), __libc_free(shadow[k]);
    }
    printf("random_ops: ok\n");
    return 0;
}
