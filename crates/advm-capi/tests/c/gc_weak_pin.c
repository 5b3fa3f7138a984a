/* Weak slots and pinned objects through the C API: a weak slot follows a live object
 * and is NULL once it died (full and minor collections, both engines, a generational
 * heap with copy_back on and off); a pinned small or large object keeps its address
 * and bytes while the objects around it move, is a root while pinned, and moves again
 * once unpinned; a young object is promoted when pinned; bad arguments are errors. */
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

static void *root = NULL, *weak_live = NULL, *weak_dead = NULL;

/* A heap with garbage below everything, so that every collection moves the rest. */
static void weak_slots(advm_gc *gc) {
    CHECK(advm_gc_root(gc, &root) == 0);
    CHECK(advm_gc_weak(gc, &weak_live) == 0);
    CHECK(advm_gc_weak(gc, &weak_dead) == 0);
    CHECK(advm_gc_weak(gc, &root) == -EINVAL);      /* a root already */
    CHECK(advm_gc_weak(gc, &weak_live) == -EINVAL); /* a weak slot already */
    CHECK(advm_gc_alloc(gc, 0, 5000) != NULL);      /* garbage */
    root = advm_gc_alloc(gc, 0, 64);
    memset(root, 0x11, 64);
    weak_live = root;
    weak_dead = advm_gc_alloc(gc, 0, 64);
    void *old = root;
    CHECK(advm_gc_collect(gc, 1) == 0);
    CHECK(root != old && weak_live == root && all(weak_live, 64, 0x11));
    CHECK(weak_dead == NULL);
    /* Young and not kept: a minor collection clears it too. */
    weak_dead = advm_gc_alloc(gc, 0, 64);
    CHECK(advm_gc_collect(gc, 0) == 0);
    CHECK(weak_dead == NULL && weak_live == root);
    root = NULL;
    CHECK(advm_gc_collect(gc, 1) == 0);
    CHECK(weak_live == NULL);
    CHECK(advm_gc_unweak(gc, &weak_live) == 0 && advm_gc_unweak(gc, &weak_dead) == 0);
    CHECK(advm_gc_unweak(gc, &weak_live) == -EINVAL);
    CHECK(advm_gc_unroot(gc, &root) == 0);
}

/* generational: the old generation may drift up once nothing is pinned. */
static void pins(advm_gc *gc, size_t n, int generational) {
    CHECK(advm_gc_root(gc, &root) == 0);
    CHECK(advm_gc_alloc(gc, 0, n) != NULL); /* garbage below */
    void *p = advm_gc_alloc(gc, 1, n);
    CHECK(p != NULL);
    p = advm_gc_pin(gc, p);
    CHECK(p != NULL);
    memset((void **)p + 1, 0x22, n);
    CHECK(advm_gc_alloc(gc, 0, n) != NULL); /* garbage above */
    root = advm_gc_alloc(gc, 0, n);
    memset(root, 0x33, n);
    CHECK(advm_gc_store(gc, p, 0, root) == 0); /* the pinned object's slot follows */
    void *above = root;
    for (int full = 1; full >= 0; full--) {
        CHECK(advm_gc_collect(gc, full) == 0);
        CHECK(all((unsigned char *)((void **)p + 1), n, 0x22)); /* same address, same bytes */
        CHECK(*(void **)p == root && all(root, n, 0x33));
    }
    CHECK(root != above && (uintptr_t)root > (uintptr_t)p); /* slid down to p */
    CHECK(advm_gc_unpin(gc, p) == 0);
    CHECK(advm_gc_unpin(gc, p) == -EINVAL);
    CHECK(advm_gc_collect(gc, 1) == 0); /* p is garbage now; root slides below where p was */
    CHECK(((uintptr_t)root < (uintptr_t)p || generational) && all(root, n, 0x33));
    root = NULL;
    CHECK(advm_gc_unroot(gc, &root) == 0);
}

int main(void) {
    int x = 0;
    for (int engine = 0; engine < 2; engine++) {
        advm_gc *gc = advm_gc_new(64 << 20);
        CHECK(gc != NULL);
        CHECK(advm_gc_set_engine(gc, engine ? "memmove" : "remap") == 0);
        struct advm_gc_stats s;
        CHECK(advm_gc_stats(gc, &s) == 0);
        weak_slots(gc);
        pins(gc, 200, 0);
        pins(gc, s.large_object_bytes + 3 * 4096, 0);
        CHECK(advm_gc_pin(gc, &x) == NULL && errno == EINVAL);
        CHECK(advm_gc_unpin(gc, &x) == -EINVAL);
        advm_gc_destroy(gc);
    }
    for (int copy_back = 0; copy_back < 2; copy_back++) {
        struct advm_gc_policy policy = {
            .kind = ADVM_GC_MODIFIED,
            .mem_lim = 4 << 20,
            .min_new_size = 256 << 10,
            .min_old_incr = 1 << 20,
            .copy_back = copy_back,
        };
        advm_gc *gc = advm_gc_new_with(64 << 20, &policy);
        CHECK(gc != NULL);
        weak_slots(gc);
        pins(gc, 200, 1);
        /* A young object: pinning promotes it (a minor collection), then it stays. */
        CHECK(advm_gc_root(gc, &root) == 0);
        CHECK(advm_gc_weak(gc, &weak_live) == 0);
        root = advm_gc_alloc(gc, 0, 100);
        memset(root, 0x44, 100);
        void *young = root;
        void *p = advm_gc_pin(gc, root);
        CHECK(p != NULL && p != young && p == root);
        weak_live = p;
        root = NULL; /* pinned: still a root */
        for (int i = 0; i < 20000; i++) CHECK(advm_gc_alloc(gc, 1, 100) != NULL);
        CHECK(advm_gc_collect(gc, 1) == 0);
        CHECK(weak_live == p && all(p, 100, 0x44));
        CHECK(advm_gc_unpin(gc, p) == 0);
        CHECK(advm_gc_collect(gc, 1) == 0);
        CHECK(weak_live == NULL); /* unpinned and unreferenced: dead */
        CHECK(advm_gc_unweak(gc, &weak_live) == 0 && advm_gc_unroot(gc, &root) == 0);
        advm_gc_destroy(gc);
    }
    printf("weak slots and pins: ok\n");
    return 0;
}
