/* vc.h: one virtual-copy API over both advm backends, and the oracle the programs use.
 *
 * Backend capi (-DVC_BACKEND_CAPI): the Rust arena through include/advm.h, -ladvm.
 * Backend shim (-DVC_BACKEND_SHIM): plain malloc/free/memcpy, run under LD_PRELOAD of
 * the advm shim in cow mode (compiled with -fno-builtin so every call is real).
 *
 * The common API, with the semantics both backends promise:
 *   vc_alloc(len)        a block of len > 0 bytes (contents unspecified: write first)
 *   vc_free(p)           frees a block (NULL: no-op)
 *   vc_copy(d, s, len)   memcpy between disjoint ranges inside blocks; 0 or -errno
 *   vc_dup(p, len)       a new block holding a copy of [p, p+len), len > 0
 *
 * The oracle: every block has a shadow, a private anonymous mapping made with mmap
 * (never malloc: the shim must not see it), changed by plain byte loops alongside
 * the block; vc_check compares them and exits 1 naming the first differing byte. */
#ifndef VC_H
#define VC_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(VC_BACKEND_CAPI)
#include <advm.h>
#define VC_BACKEND "capi"
static inline void *vc_alloc(size_t len) { return advm_alloc(len); }
static inline void vc_free(void *p) { advm_free(p); }
static inline int vc_copy(void *d, const void *s, size_t len) { return advm_vcopy(d, s, len); }
static inline void *vc_dup(const void *p, size_t len) { return advm_dup(p, len); }
/* Pages shared by copies so far (-1: the runner reads them from the shim's stats). */
static inline long long vc_pages_shared(void) {
    struct advm_vcopy_stats st;
    return advm_vcopy_get_stats(&st) == 0 ? (long long)st.pages_shared : -1;
}
#elif defined(VC_BACKEND_SHIM)
#define VC_BACKEND "shim"
static inline void *vc_alloc(size_t len) { return malloc(len); }
static inline void vc_free(void *p) { free(p); }
static inline int vc_copy(void *d, const void *s, size_t len) {
    memcpy(d, s, len);
    return 0;
}
static inline void *vc_dup(const void *p, size_t len) {
    void *q = malloc(len);
    if (q) memcpy(q, p, len);
    return q;
}
static inline long long vc_pages_shared(void) { return -1; }
#else
#error "define VC_BACKEND_CAPI or VC_BACKEND_SHIM"
#endif

#define VC_PS ((size_t)4096)

static unsigned long vc_checks; /* comparisons made (atomic: threads add to it) */

#define VC_CHECK(c)                                                                              \
    do {                                                                                         \
        if (!(c)) {                                                                              \
            fprintf(stderr, "[%s] %s:%d: check failed: %s (errno %d)\n", VC_BACKEND, __FILE__, \
                    __LINE__, #c, errno);                                                        \
            exit(1);                                                                             \
        }                                                                                        \
        __atomic_fetch_add(&vc_checks, 1, __ATOMIC_RELAXED);                                     \
    } while (0)

/* A shadow buffer of len bytes (zeroed). */
static inline unsigned char *vc_shadow(size_t len) {
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("vc_shadow: mmap");
        exit(2);
    }
    return p;
}
static inline void vc_unshadow(unsigned char *p, size_t len) { munmap(p, len ? len : 1); }

/* Byte loops (built with -fno-tree-loop-distribute-patterns: never turned into a
 * memcpy call, which under the shim would be the code under test). */
static inline void vc_sh_copy(unsigned char *d, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = s[i];
}

static inline uint64_t vc_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Writes n pseudo-random bytes (from seed) to blk and its shadow at once. */
static inline void vc_write(unsigned char *blk, unsigned char *sh, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) vc_rand(&s);
        unsigned char b = (unsigned char)(s >> (8 * (i % 8)));
        blk[i] = b;
        sh[i] = b;
    }
}

/* Compares blk with its shadow; on a difference prints where and exits 1. */
static inline void vc_check(const unsigned char *blk, const unsigned char *sh, size_t n, const char *what) {
    __atomic_fetch_add(&vc_checks, 1, __ATOMIC_RELAXED);
    if (memcmp(blk, sh, n) == 0) return;
    size_t first = 0, diff = 0;
    for (size_t i = n; i > 0; i--)
        if (blk[i - 1] != sh[i - 1]) {
            first = i - 1;
            diff++;
        }
    fprintf(stderr, "[%s] oracle: %s (%zu bytes at %p): byte %zu (page %zu) is %#x, expected %#x; %zu bytes differ\n",
            VC_BACKEND, what, n, (const void *)blk, first, first / VC_PS, blk[first], sh[first], diff);
    exit(1);
}

/* The last line of every program: what it checked. */
static inline int vc_done(const char *name, const char *detail) {
    printf("%s [%s]: ok: %lu checks passed; %s; pages_shared %lld\n", name, VC_BACKEND, vc_checks, detail,
           vc_pages_shared());
    return 0;
}

#endif
