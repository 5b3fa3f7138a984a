/* A Lisp-like interpreter's heap through the C API, as a runtime author writes it:
 * a million-cell list (marking must not recurse), cycles, raw bytes that look like
 * pointers (never traced), roots on the C stack registered and unregistered, odd
 * sizes (0, SIZE_MAX, above the heap), a heap filled with live data (ENOMEM, then
 * usable again once roots are dropped), engine switches with the statistics checked
 * after each collection, and bad input that must be an error, never a crash:
 * a nursery policy under one allocation buffer (every allocation was a collection:
 * 98,304 collections for 98,304 cells), stores of non-objects (a zeroed word above
 * the heap's top was taken for an object; an address in the drifting old
 * generation's PROT_NONE reservation was a segmentation fault), roots holding
 * non-objects (one above the top was silently nulled, one in the reservation a
 * segmentation fault; a young slot pointing at the nursery's unused part was
 * forwarded to another object), 200,000 roots registered one by one and statistics
 * read after each of 20,000 collections (both quadratic). */
#include <advm_gc.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

struct cons {
    void *car, *cdr; /* two pointer slots */
    uint64_t tag;    /* raw */
};

static advm_gc *gc;

static struct cons *cons(void *car, void *cdr, uint64_t tag) {
    /* car and cdr may move during the allocation: the caller keeps them in roots */
    struct cons *c = advm_gc_alloc(gc, 2, sizeof(uint64_t));
    CHECK(c != NULL);
    c->car = car;
    c->cdr = cdr;
    c->tag = tag;
    return c;
}

/* A root on the C stack, as an interpreter's frame registers its locals. */
static void frame(void) {
    void *local = NULL;
    CHECK(advm_gc_root(gc, &local) == 0);
    CHECK(advm_gc_root(gc, &local) == -EINVAL); /* twice */
    local = advm_gc_alloc(gc, 0, 64);
    CHECK(local != NULL);
    memset(local, 0x3c, 64);
    CHECK(advm_gc_collect(gc, 1) == 0);
    CHECK(all(local, 64, 0x3c));
    CHECK(advm_gc_unroot(gc, &local) == 0);
}

static void deep_list_cycles_and_fake_pointers(void) {
    gc = advm_gc_new((size_t)256 << 20);
    CHECK(gc != NULL);
    void *list = NULL, *decoy = NULL, *holder = NULL;
    CHECK(advm_gc_root(gc, &list) == 0);
    long n = 1000000;
    for (long i = 0; i < n; i++) list = cons(NULL, list, (uint64_t)i);
    /* raw bytes holding an object's address: not a reference */
    CHECK(advm_gc_root(gc, &decoy) == 0 && advm_gc_root(gc, &holder) == 0);
    decoy = advm_gc_alloc(gc, 0, 32);
    holder = advm_gc_alloc(gc, 0, 16);
    CHECK(decoy != NULL && holder != NULL);
    void *was = decoy;
    memcpy(holder, &was, sizeof was);
    CHECK(advm_gc_unroot(gc, &decoy) == 0);
    /* a cycle, reachable from the list's head */
    struct cons *a = cons(NULL, NULL, 1);
    ((struct cons *)list)->car = a;
    a = ((struct cons *)list)->car;
    struct cons *b = cons(a, NULL, 2);
    a = ((struct cons *)list)->car;
    a->cdr = b;
    for (int k = 0; k < 2; k++) {
        CHECK(advm_gc_set_engine(gc, k ? "memmove" : "remap") == 0);
        CHECK(advm_gc_collect(gc, 1) == 0);
    }
    void *now;
    memcpy(&now, holder, sizeof now);
    CHECK(now == was); /* raw bytes untouched */
    a = ((struct cons *)list)->car;
    b = a->cdr;
    CHECK(a->tag == 1 && b->tag == 2 && b->car == a);
    long k = n - 1;
    for (struct cons *c = list; c != NULL; c = c->cdr, k--) CHECK(c->tag == (uint64_t)k);
    CHECK(k == -1);
    frame();
    frame();
    CHECK(advm_gc_unroot(gc, &decoy) == -EINVAL); /* unknown slot */
    CHECK(advm_gc_unroot(gc, &list) == 0 && advm_gc_unroot(gc, &holder) == 0);
    advm_gc_destroy(gc);
}

static void sizes_and_exhaustion(void) {
    gc = advm_gc_new(8 << 20);
    CHECK(gc != NULL);
    CHECK(advm_gc_alloc(gc, 0, 0) != NULL); /* a bare header */
    size_t bad[][2] = {{SIZE_MAX, 0}, {0, SIZE_MAX}, {SIZE_MAX / 8 + 1, 0}, {SIZE_MAX / 16, SIZE_MAX / 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        CHECK(advm_gc_alloc(gc, bad[i][0], bad[i][1]) == NULL && errno == ENOMEM); /* cannot fit */
    }
    errno = 0;
    CHECK(advm_gc_alloc(gc, 0, (size_t)9 << 20) == NULL && errno == ENOMEM); /* above the heap */
    void *list = NULL;
    CHECK(advm_gc_root(gc, &list) == 0);
    long cells = 0;
    for (;;) {
        void **c = advm_gc_alloc(gc, 1, 1000);
        if (c == NULL) break;
        c[0] = list;
        list = c;
        cells++;
    }
    CHECK(errno == ENOMEM && cells > 7000);
    list = NULL; /* the runtime drops its data: allocation works again */
    for (long i = 0; i < cells; i++) CHECK(advm_gc_alloc(gc, 1, 1000) != NULL);
    advm_gc_destroy(gc);

    /* after each collection: remap + memmove bytes only grow, the engine is obeyed */
    gc = advm_gc_new(64 << 20);
    CHECK(gc != NULL);
    struct advm_gc_stats s0, s1;
    CHECK(advm_gc_stats(gc, &s0) == 0 && s0.large_object_bytes <= (4 << 20));
    void *big = NULL;
    CHECK(advm_gc_root(gc, &big) == 0);
    for (int round = 0; round < 4; round++) {
        int memmove_engine = round % 2;
        CHECK(advm_gc_set_engine(gc, memmove_engine ? "memmove" : "remap") == 0);
        CHECK(advm_gc_alloc(gc, 0, 2 * s0.large_object_bytes) != NULL); /* dead, below */
        big = advm_gc_alloc(gc, 0, 2 * s0.large_object_bytes);
        CHECK(big != NULL);
        memset(big, round + 1, 2 * s0.large_object_bytes);
        CHECK(advm_gc_collect(gc, 1) == 0);
        CHECK(advm_gc_stats(gc, &s1) == 0);
        CHECK(s1.collections == s0.collections + 1 && s1.used_bytes <= s1.heap_bytes);
        CHECK(s1.bytes_moved_memmove >= s0.bytes_moved_memmove && s1.bytes_moved_remap >= s0.bytes_moved_remap);
        if (memmove_engine) CHECK(s1.bytes_moved_remap == s0.bytes_moved_remap);
        CHECK(s1.bytes_moved_memmove + s1.bytes_moved_remap - s0.bytes_moved_memmove - s0.bytes_moved_remap >=
              2 * s0.large_object_bytes); /* the live large object moved down */
        CHECK(all(big, 2 * s0.large_object_bytes, (unsigned char)(round + 1)));
        s0 = s1;
    }
    CHECK(advm_gc_set_engine(gc, "Remap") == -EINVAL && advm_gc_set_engine(gc, NULL) == -EINVAL);
    advm_gc_destroy(gc);
}

/* A generational heap without copy-back: its old generation drifts through a
 * reservation mostly PROT_NONE. */
static advm_gc *drifting(void) {
    struct advm_gc_policy p = {
        .kind = ADVM_GC_MODIFIED, .mem_lim = 1 << 20, .min_new_size = 256 << 10, .min_old_incr = 512 << 10};
    advm_gc *g = advm_gc_new_with(4 << 20, &p);
    CHECK(g != NULL);
    return g;
}

static void bad_input(void) {
    /* a nursery smaller than one allocation buffer */
    struct advm_gc_policy tiny = {.kind = ADVM_GC_MODIFIED, .mem_lim = 1 << 20};
    errno = 0;
    CHECK(advm_gc_new_with(1 << 20, &tiny) == NULL && errno == EINVAL);
    tiny.min_new_size = 1000;
    CHECK(advm_gc_new_with(1 << 20, &tiny) == NULL && errno == EINVAL);
    /* and one larger than the heap (accepted, and capped at the heap) */
    tiny.min_new_size = (1 << 20) + 4096;
    errno = 0;
    CHECK(advm_gc_new_with(1 << 20, &tiny) == NULL && errno == EINVAL);
    tiny.min_new_size = SIZE_MAX;
    CHECK(advm_gc_new_with(1 << 20, &tiny) == NULL && errno == EINVAL);
    tiny.min_new_size = 1 << 20; /* the whole heap: fine */
    advm_gc *whole = advm_gc_new_with(1 << 20, &tiny);
    CHECK(whole != NULL);
    advm_gc_destroy(whole);

    /* stores naming something that is not an object */
    gc = drifting();
    void *old = NULL;
    CHECK(advm_gc_root(gc, &old) == 0);
    old = advm_gc_alloc(gc, 1, 8);
    CHECK(old != NULL && advm_gc_collect(gc, 1) == 0); /* old now */
    char *o = old;
    char *junk[] = {o + (1 << 20), o + (12 << 20), o + 8, o - 4096};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        CHECK(advm_gc_store(gc, junk[i], 0, NULL) == -EINVAL);
        CHECK(advm_gc_store(gc, old, 0, junk[i]) == -EINVAL);
    }
    CHECK(advm_gc_collect(gc, 1) == 0 && advm_gc_collect(gc, 0) == 0); /* nothing stored */
    advm_gc_destroy(gc);

    /* roots holding something that is not an object: EIO, never a fault or a NULL */
    for (int which = 0; which < 3; which++) {
        gc = which == 2 ? advm_gc_new(4 << 20) : drifting();
        void *r = NULL;
        CHECK(advm_gc_root(gc, &r) == 0);
        r = advm_gc_alloc(gc, 1, 8);
        CHECK(r != NULL && advm_gc_collect(gc, 1) == 0);
        void *bad = (char *)r + (which == 0 ? (12 << 20) : (1 << 20));
        r = bad;
        errno = 0;
        CHECK(advm_gc_collect(gc, 1) == -EIO && errno == EIO);
        CHECK(r == bad);
        advm_gc_destroy(gc);
    }

    /* a young object's slot written directly with the nursery's unused part: a minor
     * collection "copied" a zero-size object there and pointed the slot at whatever
     * it copied next; now it fails, then every collection says the heap is broken */
    gc = drifting();
    void *young = NULL;
    CHECK(advm_gc_root(gc, &young) == 0);
    young = advm_gc_alloc(gc, 1, 8);
    CHECK(young != NULL);
    ((void **)young)[0] = (char *)young + (128 << 10);
    CHECK(advm_gc_collect(gc, 0) == -EIO);
    CHECK(advm_gc_collect(gc, 0) == -ENOTRECOVERABLE);
    advm_gc_destroy(gc);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* An interpreter that roots every handle it gives out: 200,000 slots registered, a
 * collection through them, forgotten in another order. Each registration and each
 * unroot searched every slot: 50,000 took 11 s, 200,000 minutes. */
static void many_roots(void) {
    gc = advm_gc_new(64 << 20);
    CHECK(gc != NULL);
    size_t n = 200000;
    void **slots = calloc(n, sizeof *slots);
    CHECK(slots != NULL);
    double t0 = seconds();
    for (size_t i = 0; i < n; i++) CHECK(advm_gc_root(gc, &slots[i]) == 0);
    CHECK(advm_gc_root(gc, &slots[n / 2]) == -EINVAL);
    for (size_t i = 0; i < n; i += 1000) {
        slots[i] = advm_gc_alloc(gc, 0, 8);
        CHECK(slots[i] != NULL);
        *(size_t *)slots[i] = i;
    }
    CHECK(advm_gc_alloc(gc, 0, 4000) != NULL); /* garbage */
    CHECK(advm_gc_collect(gc, 1) == 0);
    for (size_t i = 0; i < n; i += 1000) CHECK(*(size_t *)slots[i] == i);
    /* a slot inside an object moves with it: never a root */
    CHECK(advm_gc_root(gc, (void **)slots[0]) == -EINVAL);
    for (size_t k = 0; k < n; k++) CHECK(advm_gc_unroot(gc, &slots[(k * 7919) % n]) == 0); /* 7919 is prime */
    CHECK(advm_gc_unroot(gc, &slots[0]) == -EINVAL);
    double took = seconds() - t0;
    printf("%zu roots registered, collected through and forgotten in %.2f s\n", n, took);
    CHECK(took < 20);
    free(slots);
    advm_gc_destroy(gc);
}

/* A runtime that reads the statistics after each collection (to size itself, to
 * log pauses): each read copied the record of every collection so far, and every
 * record was kept (20,000 collections with a read after each took 18 s). */
static void stats_after_every_collection(void) {
    gc = advm_gc_new(1 << 20);
    CHECK(gc != NULL);
    struct advm_gc_stats s;
    double t0 = seconds();
    for (int i = 1; i <= 20000; i++) {
        CHECK(advm_gc_collect(gc, 1) == 0);
        CHECK(advm_gc_stats(gc, &s) == 0 && s.collections == (uint64_t)i && s.last_pause_ns <= s.max_pause_ns);
    }
    double took = seconds() - t0;
    printf("20,000 collections, statistics read after each: %.2f s\n", took);
    CHECK(took < 10);
    advm_gc_destroy(gc);
}

int main(void) {
    alarm(60); /* a collection per allocation, or quadratic roots, end it with SIGALRM */
    deep_list_cycles_and_fake_pointers();
    sizes_and_exhaustion();
    bad_input();
    many_roots();
    stats_after_every_collection();
    printf("gc_runtime: a Lisp-like heap's uses and misuses: ok\n");
    return 0;
}
