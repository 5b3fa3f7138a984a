/* A generational GC heap in a pager's regions through the C API: a list of live
 * objects four times the pager's budget survives eviction and read-back through
 * minor and major collections; the garbage is dropped, never written; the heap keeps
 * the pager alive after advm_pager_destroy; a NULL pager is an error. */
#define _GNU_SOURCE
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

static void *list = NULL;

int main(void) {
    struct advm_gc_policy pol = {ADVM_GC_MODIFIED, 0, 0, 1 << 20, 256 << 10, 512 << 10, 0};
    advm_pager *p = advm_pager_new(1 << 20, NULL);
    if (!p && errno == ENOSYS) {
        printf("skipped: the pager needs userfaultfd with UFFDIO_MOVE\n");
        return 0;
    }
    CHECK(p != NULL);
    CHECK(advm_gc_new_paged(16 << 20, &pol, NULL, 1) == NULL && errno == EINVAL);
    advm_gc *gc = advm_gc_new_paged(16 << 20, &pol, p, 1);
    CHECK(gc != NULL);
    CHECK(advm_gc_root(gc, &list) == 0);
    /* 4 MiB live: 4096 nodes of 1 KiB, each with garbage allocated in between */
    for (uint64_t i = 0; i < 4096; i++) {
        for (int g = 0; g < 4; g++) CHECK(advm_gc_alloc(gc, 0, 1000) != NULL);
        uint64_t *n = advm_gc_alloc(gc, 1, 1016);
        CHECK(n != NULL);
        n[1] = i;
        n[126] = ~i;
        CHECK(advm_gc_store(gc, n, 0, list) == 0);
        list = n;
    }
    CHECK(advm_gc_collect(gc, 1) == 0);
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0);
    CHECK(st.discarded_pages > 0 && st.written_pages > 0 && st.read_pages > 0);
    printf("gc_paged: %llu pages discarded, %llu written, %llu read back\n", (unsigned long long)st.discarded_pages,
           (unsigned long long)st.written_pages, (unsigned long long)st.read_pages);
    advm_pager_destroy(p); /* the heap still holds it */
    uint64_t want = 4096;
    for (uint64_t *n = list; n; n = ((void **)n)[0]) {
        want--;
        CHECK(n[1] == want && n[126] == ~want);
    }
    CHECK(want == 0);
    CHECK(advm_gc_unroot(gc, &list) == 0);
    advm_gc_destroy(gc);
    printf("gc_paged: 4 MiB live through a 1 MiB pager budget, intact\n");
    return 0;
}
