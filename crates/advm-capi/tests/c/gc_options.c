/* advm_gc_new_opts: every heap setting in one size-versioned struct. Zero means the
 * default; a bad setting is EINVAL; a struct from a newer header works when its extra
 * fields are zero and is refused with ENOSYS when one is set; the settings take effect
 * (engine, large-object size, GC threads, verifier, a pager). */
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

static struct advm_gc_options opts(size_t heap_bytes) {
    struct advm_gc_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.heap_bytes = heap_bytes;
    return o;
}

static void refused(const struct advm_gc_options *o, int want) {
    errno = 0;
    advm_gc *gc = advm_gc_new_opts(o);
    if (gc != NULL || errno != want) {
        fprintf(stderr, "advm_gc_new_opts: %p, errno %d (%s); want NULL and %d\n", (void *)gc, errno, strerror(errno),
                want);
        exit(1);
    }
}

/* Live large objects above garbage: a collection moves them down. */
static void churn(advm_gc *gc, size_t large) {
    void *keep = NULL;
    CHECK(advm_gc_root(gc, &keep) == 0);
    for (int i = 0; i < 8; i++) {
        void **o = advm_gc_alloc(gc, 1, large);
        CHECK(o != NULL);
        memset(o + 1, i + 1, large);
        if (i % 2) {
            o[0] = keep;
            keep = o;
        }
    }
    CHECK(advm_gc_collect(gc, 1) == 0);
    int i = 7;
    for (void **o = keep; o != NULL; o = o[0], i -= 2) CHECK(all((unsigned char *)(o + 1), large, (unsigned char)(i + 1)));
    CHECK(i == -1);
    CHECK(advm_gc_unroot(gc, &keep) == 0);
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    errno = 0;
    CHECK(advm_gc_new_opts(NULL) == NULL && errno == EINVAL);
    struct advm_gc_options o = opts(16 << 20);
    o.size = 0;
    refused(&o, EINVAL);
    o.size = sizeof o - 1;
    refused(&o, EINVAL);
    o.size = 4097;
    refused(&o, EINVAL);
    o = opts(0);
    refused(&o, EINVAL);
    o = opts(SIZE_MAX);
    refused(&o, ENOMEM);
    o = opts(16 << 20);
    o.engine = "fast";
    refused(&o, EINVAL);
    o = opts(16 << 20);
    o.flush_after_major = 1; /* without a pager */
    refused(&o, EINVAL);
    o = opts(16 << 20);
    o.gc_threads = 1000;
    refused(&o, EINVAL);
    o = opts(16 << 20);
    o.large_object_bytes = 8;
    refused(&o, EINVAL);
    struct advm_gc_policy bad;
    memset(&bad, 0, sizeof bad);
    o = opts(16 << 20);
    o.policy = &bad;
    refused(&o, EINVAL);

    /* A newer header's struct: extra zero fields are fine, a set one is ENOSYS. */
    struct {
        struct advm_gc_options o;
        uint64_t newer[4];
    } big;
    memset(&big, 0, sizeof big);
    big.o.size = sizeof big;
    big.o.heap_bytes = 1 << 20;
    advm_gc *gc = advm_gc_new_opts(&big.o);
    CHECK(gc != NULL);
    advm_gc_destroy(gc);
    big.newer[3] = 1;
    refused(&big.o, ENOSYS);

    /* The settings take effect. */
    o = opts(16 << 20);
    o.engine = "memmove";
    o.large_object_bytes = 2 * ps;
    o.gc_threads = 1;
    o.verify = 1;
    gc = advm_gc_new_opts(&o);
    CHECK(gc != NULL);
    struct advm_gc_stats s;
    CHECK(advm_gc_stats(gc, &s) == 0 && s.large_object_bytes == 2 * ps && s.heap_bytes == 16 << 20);
    churn(gc, 3 * ps);
    CHECK(advm_gc_stats(gc, &s) == 0 && s.bytes_moved_remap == 0 && s.bytes_moved_memmove > 0);
    advm_gc_destroy(gc);

    /* Generational, lazily freed, default engine. */
    struct advm_gc_policy gen;
    memset(&gen, 0, sizeof gen);
    gen.kind = ADVM_GC_MODIFIED;
    gen.mem_lim = 8 << 20;
    gen.min_new_size = 64 << 10;
    gen.min_old_incr = 256 << 10;
    o = opts(16 << 20);
    o.policy = &gen;
    o.free_lazily = 1;
    gc = advm_gc_new_opts(&o);
    CHECK(gc != NULL);
    churn(gc, 3 * ps);
    advm_gc_destroy(gc);

    /* In a pager; free_lazily is for plain memory only. */
    skip_without_pager();
    advm_pager *p = advm_pager_new(1 << 20, NULL);
    CHECK(p != NULL);
    o = opts(4 << 20);
    o.pager = p;
    o.free_lazily = 1;
    refused(&o, EINVAL);
    o.free_lazily = 0;
    o.flush_after_major = 1;
    gc = advm_gc_new_opts(&o);
    CHECK(gc != NULL);
    advm_pager_destroy(p); /* the heap keeps it alive */
    churn(gc, 64 << 10);
    advm_gc_destroy(gc);
    puts("gc_options: bad settings EINVAL, newer fields ENOSYS, settings obeyed");
    return 0;
}
