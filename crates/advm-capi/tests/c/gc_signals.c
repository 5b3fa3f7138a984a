/* A heap's GC threads block the signals a program or another process sends, as the
 * pager's thread does (pager_signals.c): such a signal is handled on one of the
 * program's threads, never on a GC thread parked between collections or working in
 * one. (They took them: a program's handler could run there, in the middle of a
 * collection its own thread was waiting for.) */
#define _GNU_SOURCE
#include <advm_gc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

/* The heap's GC threads: gc<pool>w<index>. */
static int gc_thread(const char *comm) {
    unsigned pool, index;
    return sscanf(comm, "gc%uw%u", &pool, &index) == 2;
}

int main(void) {
    struct advm_gc_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.heap_bytes = 256 << 20;
    o.gc_threads = 2;
    o.large_object_bytes = 1 << 20;
    advm_gc *gc = advm_gc_new_opts(&o);
    CHECK(gc != NULL);
    void *list = NULL;
    CHECK(advm_gc_root(gc, &list) == 0);
    /* more than 64 MiB of small objects live: collections run in parallel */
    for (int i = 0; i < 36000; i++) {
        void **n = advm_gc_alloc(gc, 1, 2000);
        CHECK(n != NULL);
        n[0] = list;
        list = n;
    }
    CHECK(advm_gc_collect(gc, 1) == 0);

    int threads = 0;
    const int sent[] = {SIGALRM, SIGINT, SIGTERM, SIGCHLD, SIGUSR1};
    int open = unblocked_in_threads(gc_thread, sent, 5, &threads);
    printf("gc_signals: %d GC threads, %d sent signals not blocked there\n", threads, open);
    CHECK(threads >= 1 && open == 0);
    advm_gc_destroy(gc);
    return 0;
}
