/* The byte pattern the madvise tests write into blocks and check after a copy, a
 * drop or a fork; with CHECK. */
#include <stddef.h>
#include <stdint.h>

#include "checks.h"

#define PS 4096u

static inline void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + seed + i / PS + 1);
}

/* The first byte of p[0, n) that is not what fill(seed) wrote, with [zlo, zhi) zeros
 * instead; -1 when all are. */
static inline long differs(const unsigned char *p, size_t n, unsigned seed, size_t zlo, size_t zhi) {
    for (size_t i = 0; i < n; i++) {
        unsigned char want = i >= zlo && i < zhi ? 0 : (unsigned char)(i * 7 + seed + i / PS + 1);
        if (p[i] != want) return (long)i;
    }
    return -1;
}

/* The first whole page of block p, and its offset in p. */
static inline size_t first_page(const unsigned char *p) { return (PS - (uintptr_t)p % PS) % PS; }
