/* Reuse of freed and copied-over pages by the shim (run by tests/c_programs.rs).
 * 1. Sixteen adjacent 4-page blocks are written and freed; one 64-page block must take
 *    their pages (the free table merges neighbours): resident memory must not grow.
 * 2. A 64-page block is copied into another (a virtual copy); the destination's pages
 *    the copy maps over are kept, so a third block of that size written whole must not grow resident
 *    memory either, and writing it, or either side of the copy, must leave the others
 *    as they were. Prints the two growths in pages; exits non-zero on a wrong byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long resident_pages(void) {
    long size = 0, rss = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = -1;
    fclose(f);
    return rss;
}

static int check(const unsigned char *p, size_t from, size_t to, unsigned char seed) {
    for (size_t i = from; i < to; i++)
        if (p[i] != (unsigned char)(i * 13 + seed)) return 0;
    return 1;
}

static void fill(unsigned char *p, size_t from, size_t to, unsigned char seed) {
    for (size_t i = from; i < to; i++) p[i] = (unsigned char)(i * 13 + seed);
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE), big = 64 * ps;
    (void)resident_pages(); /* stdio's first use allocates: not part of any growth */
    unsigned char *small[16];
    for (int i = 0; i < 16; i++) {
        small[i] = malloc(4 * ps);
        if (!small[i]) return 3;
        memset(small[i], i + 1, 4 * ps);
    }
    for (int i = 0; i < 16; i++) free(small[i]);
    long before = resident_pages();
    unsigned char *merged = malloc(big);
    if (!merged) return 3;
    memset(merged, 7, big);
    long merge_growth = resident_pages() - before;

    /* a copy at R's layout: a header, then the data, copied from the same offset */
    size_t hdr = 48;
    if (big < 4 * hdr) return 2;
    unsigned char *a = malloc(big), *b = malloc(big);
    if (!a || !b) return 3;
    fill(a, 0, big, 1);
    memcpy(b + hdr, a + hdr, big - 2 * hdr);
    if (!check(b, hdr, big - hdr, 1)) return 4;
    before = resident_pages();
    unsigned char *c = malloc(big);
    if (!c) return 3;
    fill(c, 0, big, 2);
    long copy_growth = resident_pages() - before;
    if (!check(a, 0, big, 1) || !check(b, hdr, big - hdr, 1) || !check(c, 0, big, 2)) return 5;
    fill(b, hdr, big - hdr, 3);
    if (!check(a, 0, big, 1) || !check(c, 0, big, 2)) return 6;
    fill(a, 0, big, 4);
    if (!check(b, hdr, big - hdr, 3) || !check(c, 0, big, 2)) return 7;
    free(merged);
    free(a);
    free(b);
    free(c);
    printf("%ld %ld\n", merge_growth, copy_growth);
    return 0;
}
