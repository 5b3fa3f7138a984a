/* A generational GC heap through the C API: a young object reachable only from an old
 * one (stored with advm_gc_store, the write barrier) survives a minor collection and a
 * major one, under both policies and copy-back on and off; bad policies and stores are
 * errors. */
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

static void *old = NULL;

static void run(const struct advm_gc_policy *p) {
    advm_gc *gc = advm_gc_new_with(16 << 20, p);
    CHECK(gc != NULL);
    CHECK(advm_gc_root(gc, &old) == 0);
    old = advm_gc_alloc(gc, 1, 8);
    CHECK(old != NULL);
    CHECK(advm_gc_collect(gc, 0) == 0); /* promotes it */
    void *young = advm_gc_alloc(gc, 0, 64);
    CHECK(young != NULL);
    memset(young, 0x5a, 64);
    CHECK(advm_gc_store(gc, old, 0, young) == 0);
    CHECK(advm_gc_store(gc, old, 1, young) == -EINVAL); /* no slot 1 */
    young = NULL;
    CHECK(advm_gc_collect(gc, 0) == 0);
    unsigned char *y = ((void **)old)[0];
    CHECK(y != NULL && all(y, 64, 0x5a));
    for (int i = 0; i < 20000; i++) /* garbage: automatic minor collections */
        CHECK(advm_gc_alloc(gc, 1, 100) != NULL);
    CHECK(advm_gc_collect(gc, 1) == 0);
    y = ((void **)old)[0];
    CHECK(y != NULL && all(y, 64, 0x5a));
    struct advm_gc_stats s;
    CHECK(advm_gc_stats(gc, &s) == 0);
    CHECK(s.collections >= 3);
    CHECK(advm_gc_unroot(gc, &old) == 0);
    advm_gc_destroy(gc);
    old = NULL;
}

int main(void) {
    struct advm_gc_policy original = {.kind = ADVM_GC_ORIGINAL, .ratio = 5, .mem_limit = 4 << 20};
    struct advm_gc_policy modified = {
        .kind = ADVM_GC_MODIFIED, .mem_lim = 2 << 20, .min_new_size = 256 << 10, .min_old_incr = 512 << 10};
    for (int copy_back = 0; copy_back < 2; copy_back++) {
        original.copy_back = modified.copy_back = copy_back;
        run(&original);
        run(&modified);
    }
    struct advm_gc_policy bad = {.kind = 7};
    errno = 0;
    CHECK(advm_gc_new_with(16 << 20, &bad) == NULL && errno == EINVAL);
    bad.kind = ADVM_GC_ORIGINAL;
    bad.ratio = 0.5;
    CHECK(advm_gc_new_with(16 << 20, &bad) == NULL && errno == EINVAL);
    printf("generational heaps: ok\n");
    return 0;
}
