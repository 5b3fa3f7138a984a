/* Pages of freed blocks that ask for huge pages (run by tests/c_programs.rs): with
 * 64 MiB live, two 16 MiB blocks are written and freed, then one 16 MiB block is
 * allocated and written. Prints how many KiB of resident memory that allocation gave
 * back to the system (the block it did not reuse). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rss.h"

int main(void) {
    size_t blk = (size_t)16 << 20;
    unsigned char *keep = malloc(64 << 20), *a = malloc(blk), *b = malloc(blk);
    if (!keep || !a || !b) return 3;
    memset(keep, 1, 64 << 20);
    memset(a, 2, blk);
    memset(b, 3, blk);
    free(a);
    free(b);
    long before = rss_kib();
    unsigned char *c = malloc(blk);
    if (!c) return 3;
    memset(c, 4, blk);
    long after = rss_kib();
    if (keep[12345] != 1 || c[blk - 1] != 4) return 4;
    printf("%ld\n", before - after);
    free(c);
    return 0;
}
