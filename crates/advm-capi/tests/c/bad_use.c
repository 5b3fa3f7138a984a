/* Bad use of the C API from a program that only read the headers: every call fails
 * with -1/NULL-style results (a negative errno, or NULL) and the errno the headers
 * name, never crashes, and leaves its handle usable; a call that succeeds leaves errno
 * as the caller set it. Covers NULL handles and out-pointers, zero and huge sizes
 * (SIZE_MAX, nptrs * 8 overflowing, heaps past the address space), ranges that are
 * unaligned or not in a region of this pager, unknown engine names, rooting twice and
 * unrooting what was never rooted, exhaustion (then collect and allocate again), a
 * collection of an empty heap, destroy with live roots, and fresh statistics. */
#define _GNU_SOURCE
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"

#define UNTOUCHED 4242 /* errno before a call that must succeed */

/* r is -want and errno is want. */
#define FAILS(call, want)                                                                    \
    do {                                                                                     \
        errno = 0;                                                                           \
        long r_ = (long)(call);                                                              \
        int e_ = errno;                                                                      \
        if (r_ != -(long)(want) || e_ != (want)) {                                           \
            fprintf(stderr, "%s:%d: %s: %ld, errno %d (%s); want -%d\n", __FILE__, __LINE__, \
                    #call, r_, e_, strerror(e_), (int)(want));                               \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* The pointer is NULL and errno is want. */
#define NULL_WITH(call, want)                                                                     \
    do {                                                                                          \
        errno = 0;                                                                                \
        void *p_ = (void *)(call);                                                                \
        int e_ = errno;                                                                           \
        if (p_ != NULL || e_ != (want)) {                                                         \
            fprintf(stderr, "%s:%d: %s: %p, errno %d (%s); want NULL and errno %d\n", __FILE__, \
                    __LINE__, #call, p_, e_, strerror(e_), (int)(want));                          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* The call returns 0 (or a non-NULL pointer) and leaves errno alone. */
#define WORKS(call)                                                                                      \
    do {                                                                                                 \
        errno = UNTOUCHED;                                                                               \
        long r_ = (long)(call);                                                                          \
        if (r_ < 0 || errno != UNTOUCHED) {                                                              \
            fprintf(stderr, "%s:%d: %s: %ld, errno %d\n", __FILE__, __LINE__, #call, r_, errno);       \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

static void gc_handles(void) {
    NULL_WITH(advm_gc_new(0), EINVAL);
    NULL_WITH(advm_gc_new(1), EINVAL);
    NULL_WITH(advm_gc_new(SIZE_MAX), ENOMEM);               /* larger than the address space */
    NULL_WITH(advm_gc_new(((size_t)1 << 40) + 4096), ENOMEM); /* past the 1 TiB limit */
    struct advm_gc_policy bad;
    memset(&bad, 0, sizeof bad);
    NULL_WITH(advm_gc_new_with(1 << 20, &bad), EINVAL); /* kind 0 */
    NULL_WITH(advm_gc_new_paged(1 << 20, NULL, NULL, 0), EINVAL);
    NULL_WITH(advm_gc_alloc(NULL, 0, 8), EINVAL);
    void *slot = NULL;
    FAILS(advm_gc_root(NULL, &slot), EINVAL);
    FAILS(advm_gc_unroot(NULL, &slot), EINVAL);
    FAILS(advm_gc_weak(NULL, &slot), EINVAL);
    FAILS(advm_gc_unweak(NULL, &slot), EINVAL);
    FAILS(advm_gc_collect(NULL, 1), EINVAL);
    FAILS(advm_gc_set_engine(NULL, "remap"), EINVAL);
    struct advm_gc_stats s;
    FAILS(advm_gc_stats(NULL, &s), EINVAL);
    FAILS(advm_gc_store(NULL, NULL, 0, NULL), EINVAL);
    NULL_WITH(advm_gc_pin(NULL, NULL), EINVAL);
    FAILS(advm_gc_unpin(NULL, NULL), EINVAL);
    errno = UNTOUCHED;
    advm_gc_destroy(NULL);
    CHECK(errno == UNTOUCHED);
}

/* A list of n cells (one pointer slot, then its index) held by *root. */
static void *grow(advm_gc *gc, void **root, size_t nbytes, size_t *n) {
    for (;;) {
        void **o = advm_gc_alloc(gc, 1, nbytes);
        if (o == NULL) return NULL;
        o[0] = *root;
        memcpy(o + 1, n, sizeof *n);
        *root = o;
        (*n)++;
    }
}

static void check_list(void *list, size_t n) {
    for (void **o = list; o != NULL; o = o[0]) {
        size_t i;
        memcpy(&i, o + 1, sizeof i);
        CHECK(i == --n);
    }
    CHECK(n == 0);
}

static void gc_misuse(const char *engine, const struct advm_gc_policy *policy) {
    advm_gc *gc = advm_gc_new_with(1 << 20, policy);
    CHECK(gc != NULL);
    WORKS(advm_gc_set_engine(gc, engine));
    struct advm_gc_stats s;
    memset(&s, 0xff, sizeof s);
    WORKS(advm_gc_stats(gc, &s));
    CHECK(s.collections == 0 && s.last_pause_ns == 0 && s.max_pause_ns == 0 && s.bytes_moved_memmove == 0 &&
          s.bytes_moved_remap == 0 && s.used_bytes == 0 && s.heap_bytes == 1 << 20);
    FAILS(advm_gc_stats(gc, NULL), EINVAL);
    /* Collections of an empty heap. */
    WORKS(advm_gc_collect(gc, 1));
    WORKS(advm_gc_collect(gc, 0));
    WORKS(advm_gc_stats(gc, &s));
    CHECK(s.collections >= 2 && s.used_bytes == 0);

    FAILS(advm_gc_set_engine(gc, NULL), EINVAL);
    FAILS(advm_gc_set_engine(gc, ""), EINVAL);
    FAILS(advm_gc_set_engine(gc, "REMAP"), EINVAL);
    FAILS(advm_gc_set_engine(gc, "remap "), EINVAL);
    FAILS(advm_gc_set_engine(gc, "swap"), EINVAL);

    /* Sizes that cannot fit: ENOMEM, at once. */
    NULL_WITH(advm_gc_alloc(gc, 0, SIZE_MAX), ENOMEM);
    NULL_WITH(advm_gc_alloc(gc, SIZE_MAX, 0), ENOMEM);
    NULL_WITH(advm_gc_alloc(gc, SIZE_MAX, SIZE_MAX), ENOMEM);
    NULL_WITH(advm_gc_alloc(gc, SIZE_MAX / 8 + 1, 0), ENOMEM); /* nptrs * 8 overflows */
    NULL_WITH(advm_gc_alloc(gc, SIZE_MAX / 8, 64), ENOMEM);    /* nptrs * 8 + nbytes overflows */
    NULL_WITH(advm_gc_alloc(gc, 1, SIZE_MAX - 4), ENOMEM);
    NULL_WITH(advm_gc_alloc(gc, 0, 1 << 20), ENOMEM); /* the whole heap, plus a header */
    NULL_WITH(advm_gc_alloc(gc, (1 << 20) / 8, 0), ENOMEM);
    WORKS(advm_gc_stats(gc, &s));
    CHECK(s.used_bytes == 0);
    void **zero = advm_gc_alloc(gc, 0, 0); /* an object of no bytes is an object */
    CHECK(zero != NULL);

    /* Slots. */
    void *list = NULL, *other = NULL;
    void *pair[2] = {NULL, NULL};
    FAILS(advm_gc_root(gc, NULL), EINVAL);
    FAILS(advm_gc_unroot(gc, NULL), EINVAL);
    FAILS(advm_gc_root(gc, (void **)((char *)pair + 1)), EINVAL); /* misaligned */
    FAILS(advm_gc_unroot(gc, &list), EINVAL);                     /* never rooted */
    WORKS(advm_gc_root(gc, &list));
    FAILS(advm_gc_root(gc, &list), EINVAL); /* twice */
    FAILS(advm_gc_weak(gc, &list), EINVAL); /* a root already */
    FAILS(advm_gc_root(gc, zero), EINVAL);  /* inside the heap */
    WORKS(advm_gc_unroot(gc, &list));
    FAILS(advm_gc_unroot(gc, &list), EINVAL); /* twice */
    FAILS(advm_gc_unweak(gc, &other), EINVAL);
    WORKS(advm_gc_root(gc, &list));
    WORKS(advm_gc_root(gc, &other));

    /* Exhaustion with the list live: NULL + ENOMEM, the list intact. */
    size_t n = 0;
    errno = 0;
    CHECK(grow(gc, &list, 200, &n) == NULL && errno == ENOMEM && n > 100);
    check_list(list, n);
    /* Exhausted again at once: still ENOMEM, nothing lost. */
    NULL_WITH(advm_gc_alloc(gc, 1, 200), ENOMEM);
    check_list(list, n);
    /* Half of it dropped: allocation works again, without an explicit collect. */
    void **o = list;
    for (size_t i = 0; i < n / 2; i++) o = o[0];
    list = o;
    size_t m = n - n / 2;
    CHECK(advm_gc_alloc(gc, 1, 200) != NULL);
    check_list(list, m);
    /* Dropped altogether: collect and allocate a large object. */
    list = NULL;
    WORKS(advm_gc_collect(gc, 1));
    WORKS(advm_gc_stats(gc, &s));
    CHECK(s.used_bytes < 4096);
    other = advm_gc_alloc(gc, 0, 600 << 10);
    CHECK(other != NULL);
    memset(other, 7, 600 << 10);
    NULL_WITH(advm_gc_alloc(gc, 0, 600 << 10), ENOMEM); /* two do not fit */
    CHECK(all(other, 600 << 10, 7));
    /* Exhaustion by large objects, one kept at a time: each replaces the last. */
    for (int i = 0; i < 20; i++) {
        other = NULL;
        other = advm_gc_alloc(gc, 0, 600 << 10);
        CHECK(other != NULL);
        memset(other, i, 600 << 10);
    }
    /* Destroy with live roots registered: no unroot needed. */
    list = advm_gc_alloc(gc, 1, 16);
    CHECK(list != NULL);
    errno = UNTOUCHED;
    advm_gc_destroy(gc);
    CHECK(errno == UNTOUCHED);
    /* The same slots may root another heap's objects. */
    gc = advm_gc_new(1 << 20);
    CHECK(gc != NULL);
    list = NULL;
    WORKS(advm_gc_root(gc, &list));
    list = advm_gc_alloc(gc, 1, 16);
    WORKS(advm_gc_collect(gc, 1));
    CHECK(list != NULL);
    advm_gc_destroy(gc);
}

static void pager_misuse(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    NULL_WITH(advm_pager_new(0, NULL), EINVAL);
    NULL_WITH(advm_pager_new(ps - 1, NULL), EINVAL);
    NULL_WITH(advm_pager_new_with(NULL), EINVAL);
    NULL_WITH(advm_pager_map(NULL, ps), EINVAL);
    FAILS(advm_pager_discardable(NULL, NULL, ps), EINVAL);
    FAILS(advm_pager_needed(NULL, NULL, ps), EINVAL);
    FAILS(advm_pager_flush(NULL, NULL, ps), EINVAL);
    FAILS(advm_pager_lock(NULL, NULL, ps), EINVAL);
    FAILS(advm_pager_unlock(NULL, NULL, ps), EINVAL);
    FAILS(advm_pager_unmap(NULL, NULL, ps), EINVAL);
    struct advm_pager_stats st;
    FAILS(advm_pager_stats(NULL, &st), EINVAL);
    FAILS(advm_pager_fault_mode(NULL), EINVAL);
    errno = UNTOUCHED;
    advm_pager_destroy(NULL);
    CHECK(errno == UNTOUCHED);

    skip_without_pager();
    advm_pager *p = advm_pager_new(16 * ps, NULL), *q = advm_pager_new(16 * ps, NULL);
    CHECK(p != NULL && q != NULL);
    /* A fresh pager's statistics: all zero. */
    memset(&st, 0xff, sizeof st);
    WORKS(advm_pager_stats(p, &st));
    CHECK(st.discarded_pages == 0 && st.written_pages == 0 && st.read_pages == 0 && st.zero_fills == 0 &&
          st.resident_pages == 0 && st.bytes_written == 0 && st.bytes_read == 0);
    FAILS(advm_pager_stats(p, NULL), EINVAL);
    /* Ranges before any region exists. */
    static unsigned char foreign[4 * 4096] __attribute__((aligned(4096)));
    FAILS(advm_pager_discardable(p, foreign, ps), EINVAL);

    NULL_WITH(advm_pager_map(p, 0), EINVAL);
    NULL_WITH(advm_pager_map(p, SIZE_MAX), ENOMEM);
    NULL_WITH(advm_pager_map(p, SIZE_MAX - ps + 1), ENOMEM);
    NULL_WITH(advm_pager_map(p, (size_t)1 << 50), ENOMEM);
    unsigned char *a = advm_pager_map(p, 8 * ps), *b = advm_pager_map(p, 8 * ps);
    unsigned char *c = advm_pager_map(q, 8 * ps);
    CHECK(a != NULL && b != NULL && c != NULL);
    memset(a, 1, 8 * ps);
    int (*const range_calls[])(advm_pager *, void *, size_t) = {advm_pager_discardable, advm_pager_needed,
                                                                advm_pager_flush, advm_pager_lock,
                                                                advm_pager_unlock};
    for (size_t i = 0; i < sizeof range_calls / sizeof range_calls[0]; i++) {
        int (*f)(advm_pager *, void *, size_t) = range_calls[i];
        FAILS(f(p, a, 0), EINVAL);                    /* empty */
        FAILS(f(p, a + 1, ps), EINVAL);               /* unaligned start */
        FAILS(f(p, a, ps + 1), EINVAL);               /* unaligned length */
        FAILS(f(p, a, 9 * ps), EINVAL);               /* past the end */
        FAILS(f(p, a - ps, 2 * ps), EINVAL);          /* before the start */
        FAILS(f(p, a, SIZE_MAX), EINVAL);             /* wraps */
        FAILS(f(p, a, SIZE_MAX - ps + 1), EINVAL);    /* wraps, aligned */
        FAILS(f(p, NULL, ps), EINVAL);                /* address 0 */
        FAILS(f(p, (void *)(uintptr_t)-ps, ps), EINVAL); /* the top page */
        FAILS(f(p, foreign, ps), EINVAL);             /* not the pager's */
        FAILS(f(p, c, ps), EINVAL);                   /* another pager's region */
        /* across two regions (adjacent or not) */
        unsigned char *lo = a < b ? a : b, *hi = a < b ? b : a;
        FAILS(f(p, lo, (size_t)(hi - lo) + ps), EINVAL);
    }
    CHECK(all(a, 8 * ps, 1)); /* nothing was dropped by the refused calls */
    WORKS(advm_pager_discardable(p, a, 8 * ps));
    WORKS(advm_pager_needed(p, a, 8 * ps));
    errno = UNTOUCHED;
    CHECK(advm_pager_flush(p, a, 8 * ps) == 8 && errno == UNTOUCHED);
    CHECK(all(a, 8 * ps, 1)); /* needed: written out and read back */
    WORKS(advm_pager_stats(p, &st));
    CHECK(st.written_pages == 8 && st.read_pages + st.read_ahead_pages == 8);
    /* unmap: whole regions of this pager only, by their start */
    FAILS(advm_pager_unmap(p, a, 0), EINVAL);          /* no length */
    FAILS(advm_pager_unmap(p, a, ps), EINVAL);         /* a part */
    FAILS(advm_pager_unmap(p, a, 7 * ps), EINVAL);     /* all but its last page */
    FAILS(advm_pager_unmap(p, a, 9 * ps), EINVAL);     /* past the end */
    FAILS(advm_pager_unmap(p, a, SIZE_MAX), EINVAL);
    FAILS(advm_pager_unmap(p, a + ps, 7 * ps), EINVAL); /* not a region's start */
    FAILS(advm_pager_unmap(p, a + 1, 8 * ps), EINVAL);
    FAILS(advm_pager_unmap(p, NULL, 8 * ps), EINVAL);
    FAILS(advm_pager_unmap(p, foreign, ps), EINVAL);   /* not the pager's */
    FAILS(advm_pager_unmap(p, c, 8 * ps), EINVAL);     /* another pager's region */
    CHECK(all(a, 8 * ps, 1));
    WORKS(advm_pager_unmap(p, b, 8 * ps - 5)); /* the length mapped, rounded up to pages */
    FAILS(advm_pager_unmap(p, b, 8 * ps), EINVAL); /* unmapped already */
    FAILS(advm_pager_discardable(p, b, ps), EINVAL);
    CHECK(all(a, 8 * ps, 1));
    WORKS(advm_pager_unmap(p, a, 8 * ps));
    WORKS(advm_pager_unmap(q, c, 8 * ps));
    errno = UNTOUCHED;
    advm_pager_destroy(q);
    advm_pager_destroy(p);
    CHECK(errno == UNTOUCHED);
}

static void other_misuse(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    setenv("ADVM_SOCKET", "/nonexistent/advmd.sock", 1);
    struct advm_merge_stats ms;
    FAILS(advm_merge(NULL, ps, &ms), EINVAL);
    FAILS(advm_merge((void *)ps, SIZE_MAX, &ms), EINVAL);
    unsigned char *m = mmap(NULL, 4 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 3, 4 * ps);
    WORKS(advm_merge(m, 4 * ps, &ms)); /* a failed connect to advmd leaves no errno behind */
    WORKS(advm_merge(m, 4 * ps, NULL));
    WORKS(advm_merge(m, 0, &ms));
    struct advm_trim_stats ts;
    WORKS(advm_merge_trim(&ts));
    CHECK(ts.kept >= 1); /* the four equal pages map one store page */
    CHECK(munmap(m, 4 * ps) == 0);
    WORKS(advm_merge_trim(&ts));
    CHECK(ts.released >= 1);
    WORKS(advm_merge_trim(NULL));
    NULL_WITH(advm_alloc(SIZE_MAX), ENOMEM);
    NULL_WITH(advm_dup(NULL, ps), EINVAL);
    FAILS(advm_vcopy(NULL, NULL, ps), EINVAL);
    FAILS(advm_vcopy_get_stats(NULL), EINVAL);
    FAILS(advm_move(NULL, NULL, ps), EINVAL);
    FAILS(advm_swap(NULL, NULL, ps), EINVAL);
    FAILS(advm_batch_move(NULL, NULL, NULL, ps), EINVAL);
    FAILS(advm_batch_swap(NULL, NULL, NULL, ps), EINVAL);
    FAILS(advm_batch_run(NULL, NULL), EINVAL);
    advm_batch_free(NULL);
    {
        /* An unaligned or wrapping operation is refused when queued (it was queued,
         * and advm_batch_run refused the whole batch); the batch keeps the others. */
        unsigned char *m = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        memset(m + 4 * ps, 7, ps);
        struct advm_batch *q = advm_batch_new();
        CHECK(q != NULL);
        WORKS(advm_batch_move(q, m, m + 4 * ps, ps));
        FAILS(advm_batch_move(q, m + 1, m + 4 * ps, ps), EINVAL);
        FAILS(advm_batch_move(q, m, m + 4 * ps, ps + 1), EINVAL);
        FAILS(advm_batch_swap(q, m, m + 4 * ps + 8, ps), EINVAL);
        FAILS(advm_batch_swap(q, m, (void *)(SIZE_MAX & ~(ps - 1)), 2 * ps), EINVAL);
        struct advm_remap_stats st;
        WORKS(advm_batch_run(q, &st));
        CHECK(st.completed_ops == 1 && m[0] == 7 && m[ps - 1] == 7);
        advm_batch_free(q);
        CHECK(munmap(m, 8 * ps) == 0);
    }

    /* Calls that work leave errno alone (the first break-even or store lookup makes
     * system calls that fail on the way: a cache file, advmd's socket). */
    errno = UNTOUCHED;
    CHECK(advm_version() != NULL && advm_remap_break_even_pages() > 0 && advm_merge_via() != NULL);
    struct advm_batch *b = advm_batch_new();
    CHECK(b != NULL);
    void *blk = advm_alloc(4 * ps);
    CHECK(blk != NULL && errno == UNTOUCHED);
    void *copy = advm_dup(blk, 4 * ps);
    CHECK(copy != NULL && errno == UNTOUCHED);
    WORKS(advm_vcopy(copy, blk, 4 * ps));
    struct advm_vcopy_stats vs;
    WORKS(advm_vcopy_get_stats(&vs));
    advm_free(copy);
    advm_free(blk);
    advm_batch_free(b);
    CHECK(errno == UNTOUCHED);
}

int main(void) {
    gc_handles();
    struct advm_gc_policy gen;
    memset(&gen, 0, sizeof gen);
    gen.kind = ADVM_GC_MODIFIED;
    gen.mem_lim = 1 << 20;
    gen.min_new_size = 64 << 10;
    gen.min_old_incr = 64 << 10;
    gc_misuse("remap", NULL);
    gc_misuse("memmove", NULL);
    gc_misuse("remap", &gen);
    other_misuse();
    pager_misuse(); /* last: ends the program where there is no pager */
    puts("bad_use: every misuse refused with its errno; handles usable afterwards");
    return 0;
}
