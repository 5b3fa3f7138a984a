/* docs/gc.md's example: a list in advm-gc's moving heap.
 * cc -Iinclude examples/c/gc.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    advm_gc *gc = advm_gc_new(256 << 20);       /* objects may take 256 MiB; NULL + errno */
    if (!gc) return perror("advm_gc_new"), 1;
    void *list = NULL;
    advm_gc_root(gc, &list);                    /* rewritten when its object moves */
    for (uint64_t i = 0; i < 1000; i++) {
        void **cell = advm_gc_alloc(gc, 1, 8);  /* 1 pointer slot, 8 raw bytes */
        if (!cell) return perror("advm_gc_alloc"), 1; /* ENOMEM: a full GC could not make room */
        memcpy(cell + 1, &i, 8);                /* raw bytes start after the pointer slots */
        advm_gc_store(gc, cell, 0, list);       /* through the write barrier */
        list = cell;                            /* the root: objects may move at the next alloc */
    }
    advm_gc_collect(gc, 1);                     /* a full collection */
    uint64_t n = 0, sum = 0;
    for (void **c = list; c; c = c[0], n++) {
        uint64_t v;
        memcpy(&v, c + 1, 8);
        sum += v;
    }
    struct advm_gc_stats s;
    advm_gc_stats(gc, &s);
    printf("%llu cells, sum %llu, %llu collections, last pause %llu ns\n", (unsigned long long)n,
           (unsigned long long)sum, (unsigned long long)s.collections, (unsigned long long)s.last_pause_ns);
    if (advm_gc_set_engine(gc, "memmove") != 0) return 1; /* -EINVAL for an unknown name */
    advm_gc_unroot(gc, &list);
    advm_gc_destroy(gc);
    return n == 1000 && sum == 999 * 1000 / 2 ? 0 : 1;
}
