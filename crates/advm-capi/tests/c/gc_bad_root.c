/* A slot holding something that is not an object of the heap (the caller's bug)
 * makes a collection fail with EIO, and every later collection of that heap with
 * ENOTRECOVERABLE; it must never hang (the world stayed stopped after the panic, and
 * a parallel mark waited for the job that panicked). A root holding one is found
 * before anything moves: EIO while it does, and the heap works once it is fixed. */
#include <advm_gc.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "check.h"

static void one(int junk_in_root, size_t live_objects) {
    advm_gc *gc = advm_gc_new(64 << 20);
    CHECK(gc != NULL);
    void *list = NULL;
    CHECK(advm_gc_root(gc, &list) == 0);
    for (size_t i = 0; i < live_objects; i++) {
        void **o = advm_gc_alloc(gc, 2, 64);
        CHECK(o != NULL);
        o[0] = list;
        list = o;
    }
    static char not_an_object[64];
    void *bad = NULL;
    if (junk_in_root) {
        CHECK(advm_gc_root(gc, &bad) == 0);
        bad = not_an_object + 16;
    } else {
        ((void **)list)[1] = (void *)0x1234; /* a direct write of junk into a slot */
    }
    CHECK(advm_gc_collect(gc, 1) == -EIO && errno == EIO);
    if (junk_in_root) {
        CHECK(advm_gc_collect(gc, 1) == -EIO && bad == not_an_object + 16);
        bad = NULL;
        CHECK(advm_gc_collect(gc, 1) == 0);
        size_t n = 0;
        for (void **o = list; o != NULL; o = o[0]) n++;
        CHECK(n == live_objects);
        advm_gc_destroy(gc);
        return;
    }
    CHECK(advm_gc_collect(gc, 1) == -ENOTRECOVERABLE && errno == ENOTRECOVERABLE);
    /* Allocation goes on until it needs a collection, which is refused: no hang. */
    int n = 0;
    while (advm_gc_alloc(gc, 0, 1 << 20) != NULL) CHECK(++n < 100);
    CHECK(errno == ENOTRECOVERABLE);
    advm_gc_destroy(gc);
}

int main(void) {
    alarm(20); /* a hang ends the program with SIGALRM */
    one(1, 1000);
    one(0, 1000);
    one(0, 200000); /* enough live data for a parallel mark */
    printf("gc_bad_root: junk in a slot: EIO, then ENOTRECOVERABLE, no hang; in a root: EIO until fixed\n");
    return 0;
}
