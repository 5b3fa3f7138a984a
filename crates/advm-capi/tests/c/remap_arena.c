/* advm_move / advm_swap / batches over virtual-copy blocks (advm_alloc/advm_dup): the
 * arena's pages are copied, never remapped behind its back, so later frees and dups
 * still see the right bytes. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { MOVE, SWAP, BATCH_MOVE, BATCH_SWAP };
static const char *names[] = {"move", "swap", "batch move", "batch swap"};

/* The sequence of the report: two copies, an operation between them, both originals
 * freed; the survivor must keep the bytes it was given. */
static int run(int how, size_t len) {
    unsigned char *a = advm_alloc(len), *e = advm_alloc(len);
    CHECK(a && e);
    memset(a, 0xa1, len);
    memset(e, 0xe5, len);
    unsigned char *b = advm_dup(a, len), *c = advm_dup(e, len);
    CHECK(b && c);
    struct advm_remap_stats st;
    memset(&st, 0, sizeof st);
    struct advm_batch *bt = advm_batch_new();
    CHECK(bt != NULL);
    switch (how) {
    case MOVE: CHECK(advm_move_stats(c, b, len, &st) == 0); break;
    case SWAP: CHECK(advm_swap(c, b, len) == 0); break;
    case BATCH_MOVE:
        CHECK(advm_batch_move(bt, c, b, len) == 0);
        CHECK(advm_batch_run(bt, &st) == 0);
        break;
    case BATCH_SWAP:
        CHECK(advm_batch_swap(bt, c, b, len) == 0);
        CHECK(advm_batch_run(bt, &st) == 0);
        break;
    }
    advm_batch_free(bt);
    CHECK(st.mremap_bytes == 0 && st.uffd_move_bytes == 0);
    /* Block to block: a virtual copy, the pages stay shared. */
    if (how == MOVE) CHECK(st.arena_vcopy_bytes == len && st.completed_ops == 1);
    CHECK(all(c, len, 0xa1));
    if (how == SWAP || how == BATCH_SWAP) CHECK(all(b, len, 0xe5));
    advm_free(a);
    if (how == SWAP || how == BATCH_SWAP) CHECK(all(b, len, 0xe5));
    advm_free(b);
    advm_free(e);
    CHECK(all(c, len, 0xa1));
    unsigned char *d = advm_dup(c, len);
    CHECK(d != NULL);
    CHECK(all(d, len, 0xa1));
    CHECK(all(c, len, 0xa1));
    advm_free(d);
    advm_free(c);
    printf("remap over arena blocks (%s, %zu pages): ok\n", names[how], len / (size_t)sysconf(_SC_PAGESIZE));
    return 0;
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    /* Page engines for any size: without the arena rule the views would be remapped. */
    advm_remap_set_break_even_pages(1);
    for (int how = MOVE; how <= BATCH_SWAP; how++) {
        if (run(how, 64 * ps)) return 1;
        if (run(how, 4u << 20)) return 1; /* 2 MiB-aligned sizes (mremap's whole-PMD path) */
    }
    /* Between an arena block and plain memory: copied as well. */
    unsigned char *blk = advm_alloc(16 * ps), *cp;
    CHECK(blk != NULL);
    memset(blk, 0x3c, 16 * ps);
    cp = advm_dup(blk, 16 * ps);
    CHECK(cp != NULL);
    static unsigned char plain[64 * 4096] __attribute__((aligned(65536)));
    unsigned char *p = plain + ((ps - (size_t)plain % ps) % ps);
    memset(p, 0x77, 16 * ps);
    CHECK(advm_move(p, cp, 16 * ps) == 0);
    CHECK(all(p, 16 * ps, 0x3c));
    memset(p, 0x55, 16 * ps);
    CHECK(advm_move(cp, p, 16 * ps) == 0);
    advm_free(blk);
    CHECK(all(cp, 16 * ps, 0x55));
    unsigned char *d = advm_dup(cp, 16 * ps);
    CHECK(d && all(d, 16 * ps, 0x55));
    advm_free(d);
    advm_free(cp);
    advm_remap_set_break_even_pages(0);
    return 0;
}
