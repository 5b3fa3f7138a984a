/* docs/gc.md's weak-slot and pinning example: a cache entry held weakly, and a buffer
 * pinned while the kernel writes into it.
 * cc -Iinclude examples/c/gc_weak_pin.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm_gc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    advm_gc *gc = advm_gc_new(64 << 20);
    void *entry = NULL, *cached = NULL;
    if (!gc || advm_gc_root(gc, &entry) || advm_gc_weak(gc, &cached)) return 1;

    /* Weak: the cache does not keep the entry alive. */
    entry = advm_gc_alloc(gc, 0, 32);
    strcpy(entry, "parsed once");
    cached = entry;
    advm_gc_collect(gc, 1);                  /* entry is rooted: cached follows it */
    printf("cached: %s\n", cached == entry ? (char *)cached : "?");
    entry = NULL;
    advm_gc_collect(gc, 1);                  /* no root left: cached becomes NULL */
    printf("after the last root went: %s\n", cached ? "still there" : "NULL");

    /* Pinned: read(2) writes into the buffer while other calls may move objects. */
    int fd[2];
    if (pipe(fd)) return 1;
    char *buf = advm_gc_pin(gc, advm_gc_alloc(gc, 0, 64));
    if (!buf) return 1;
    for (int i = 0; i < 10000; i++) advm_gc_alloc(gc, 0, 100); /* collections run */
    if (write(fd[1], "from the kernel", 16) != 16 || read(fd[0], buf, 64) != 16) return 1;
    advm_gc_collect(gc, 1);
    printf("pinned buffer, same address after collections: %s\n", buf);
    int ok = cached == NULL && strcmp(buf, "from the kernel") == 0;
    advm_gc_unpin(gc, buf);                  /* no root and not pinned: garbage now */
    close(fd[0]);
    close(fd[1]);
    advm_gc_destroy(gc);
    return ok ? 0 : 1;
}
