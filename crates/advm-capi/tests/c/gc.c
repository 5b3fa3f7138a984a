/* The GC heap through its C API: a list with garbage between its cells and a large
 * array survive collections with their bytes; roots are rewritten; both engines move;
 * exhaustion is NULL/ENOMEM and the heap stays usable; bad arguments are errors. */
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

struct cell {
    void *next; /* the one pointer slot */
    uint64_t value;
};

static void *list = NULL, *array = NULL;

static void build(advm_gc *gc, int n) {
    for (int i = 0; i < n; i++) {
        CHECK(advm_gc_alloc(gc, 0, 100) != NULL); /* garbage */
        struct cell *c = advm_gc_alloc(gc, 1, sizeof(uint64_t));
        CHECK(c != NULL);
        c->value = (uint64_t)i * 3 + 1;
        c->next = list;
        list = c;
    }
}

static void check_list(int n) {
    struct cell *c = list;
    for (int i = n - 1; i >= 0; i--) {
        CHECK(c != NULL && c->value == (uint64_t)i * 3 + 1);
        c = c->next;
    }
    CHECK(c == NULL);
}

int main(void) {
    advm_gc *gc = advm_gc_new(64 << 20);
    CHECK(gc != NULL);
    CHECK(advm_gc_root(gc, &list) == 0);
    CHECK(advm_gc_root(gc, &array) == 0);
    CHECK(advm_gc_root(gc, &list) == -EINVAL);
    CHECK(advm_gc_set_engine(gc, "swap") == -EINVAL);

    struct advm_gc_stats s;
    CHECK(advm_gc_stats(gc, &s) == 0);
    /* 3 MiB: large, and on a 2 MiB boundary, so compaction moves it by page tables. */
    size_t big = (size_t)3 << 20;
    CHECK(big >= s.large_object_bytes);
    CHECK(advm_gc_alloc(gc, 0, big) != NULL); /* dead large object below the live one */
    array = advm_gc_alloc(gc, 0, big);
    CHECK(array != NULL && ((uintptr_t)array - 16) % (2 << 20) == 0);
    memset(array, 0xab, big);
    void *old_array = array;
    build(gc, 1000);
    void *old_list = list;

    CHECK(advm_gc_collect(gc, 1) == 0);
    CHECK(array != old_array && list != old_list); /* roots rewritten */
    CHECK(all(array, big, 0xab));
    check_list(1000);
    CHECK(advm_gc_stats(gc, &s) == 0);
    CHECK(s.collections == 1 && s.bytes_moved_memmove > 0 && s.last_pause_ns > 0);
    printf("remap engine: %llu bytes moved as pages, %llu copied\n", (unsigned long long)s.bytes_moved_remap,
           (unsigned long long)s.bytes_moved_memmove);
    CHECK(s.bytes_moved_remap >= big);
    uint64_t remapped = s.bytes_moved_remap;

    /* memmove engine: the large object moves down over a dead one, by copying. */
    CHECK(advm_gc_set_engine(gc, "memmove") == 0);
    array = NULL;
    CHECK(advm_gc_alloc(gc, 0, big) != NULL);
    array = advm_gc_alloc(gc, 0, big);
    memset(array, 0xcd, big);
    old_array = array;
    CHECK(advm_gc_collect(gc, 0) == 0);
    CHECK(array != old_array && all(array, big, 0xcd));
    CHECK(advm_gc_stats(gc, &s) == 0);
    CHECK(s.bytes_moved_remap == remapped && s.collections == 2);
    check_list(1000);

    /* Exhaustion: NULL with ENOMEM, and the heap still works. */
    errno = 0;
    CHECK(advm_gc_alloc(gc, 0, (size_t)128 << 20) == NULL && errno == ENOMEM);
    check_list(1000);
    CHECK(advm_gc_alloc(gc, 1, 8) != NULL);
    CHECK(advm_gc_unroot(gc, &list) == 0 && advm_gc_unroot(gc, &list) == -EINVAL);
    advm_gc_destroy(gc);

    errno = 0;
    CHECK(advm_gc_new(0) == NULL && errno == EINVAL);
    printf("gc: ok\n");
    return 0;
}
