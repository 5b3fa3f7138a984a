/* Memfd pages under a virtual copy are released as soon as no view needs them: when
 * both views are freed, and when one view is freed while the other has written its own
 * copy of a page (R's `y <- x; y[i] <- v; x <- NULL`): the survivor ends with one home
 * per page. Measured as the arena memfds' allocated bytes (fstat st_blocks). */
#include "t.h"

#define NP 256
#define N (NP * PS)

/* Writes one byte in each of the pages [from, to) of p (the copy's own pages now). */
static void touch(unsigned char *p, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) p[i * PS] ^= 0x5a;
}
static int touched(const unsigned char *p, size_t np, size_t from, size_t to, unsigned seed) {
    for (size_t i = 0; i < np * PS; i++) {
        unsigned char want = (unsigned char)(i * 31 + seed + i / PS);
        if (i % PS == 0 && i / PS >= from && i / PS < to) want ^= 0x5a;
        if (p[i] != want) return 0;
    }
    return 1;
}

int main(void) {
    int measure = memfd_holds_only_copies();
    long base = memfd_pages();

    /* copy, write the whole copy, free the source: nothing is left in the memfd */
    unsigned char *a = malloc(N), *b = malloc(N);
    fill(a, N, 1);
    memcpy(b, a, N);
    if (measure) CHECK(memfd_pages() - base == NP);
    touch(b, 0, NP);
    if (measure) CHECK(memfd_pages() - base == NP); /* the source still reads them */
    free(a);
    if (measure) CHECK(memfd_pages() - base == 0);
    CHECK(touched(b, NP, 0, NP, 1));

    /* copy, write half of it, free the source: one home per page (the written half in
     * the copy's own pages, the rest in the memfd) */
    unsigned char *c = malloc(N), *d = malloc(N);
    fill(c, N, 2);
    memcpy(d, c, N);
    touch(d, 0, NP / 2);
    free(c);
    if (measure) CHECK(memfd_pages() - base == NP / 2);
    CHECK(touched(d, NP, 0, NP / 2, 2));

    /* a copy of a block with released pages: those are written into the memfd again */
    unsigned char *e = malloc(N);
    memcpy(e, d, N);
    if (measure) CHECK(memfd_pages() - base == NP);
    touch(d, 0, NP);
    CHECK(touched(e, NP, 0, NP / 2, 2));
    free(d);
    if (measure) CHECK(memfd_pages() - base == NP); /* e reads every page from the memfd */
    CHECK(touched(e, NP, 0, NP / 2, 2));
    touch(e, NP / 2, NP); /* into the memfd pages: e, their last view, maps them shared */
    CHECK(touched(e, NP, 0, NP, 2));
    if (measure) CHECK(memfd_pages() - base == NP);
    /* freed, e would be kept for reuse with its memfd pages, as any freed block with its
     * pages: malloc_trim gives them back */
    free(e);
    free(b);
    malloc_trim(0);
    if (measure) CHECK(memfd_pages() - base == 0);

    /* both views freed, untouched: every page is released (the second is kept for reuse
     * until malloc_trim) */
    unsigned char *f = malloc(N), *g = malloc(N);
    fill(f, N, 3);
    memcpy(g, f, N);
    CHECK(same(g, N, 3));
    free(f);
    if (measure) CHECK(memfd_pages() - base == NP); /* g still reads them */
    free(g);
    malloc_trim(0);
    if (measure) CHECK(memfd_pages() - base == 0);
    /* a first copy bigger than one remap step (8 MiB), with holes across step boundaries:
     * the source is written into the memfd and remapped step by step */
    size_t big = 5000 * PS;
    unsigned char *h = malloc(big), *k = malloc(big);
    for (size_t i = 0; i < big / PS; i++)
        if (i % 7 != 3) h[i * PS + i % PS] = (unsigned char)(i | 1);
    memcpy(k, h, big);
    for (size_t i = 0; i < big / PS; i++) {
        unsigned char want = i % 7 != 3 ? (unsigned char)(i | 1) : 0;
        CHECK(h[i * PS + i % PS] == want && k[i * PS + i % PS] == want);
    }
    /* the holes stay holes, unless a transparent huge page filled them */
    long held = memfd_pages() - base;
    if (measure) CHECK(held >= (long)(big / PS) * 6 / 7 && held <= (long)(big / PS));
    free(h);
    free(k);
    malloc_trim(0);
    if (measure) CHECK(memfd_pages() - base == 0);
    printf("release: ok (memfd accounting %s)\n", measure ? "checked" : "not checked in this mode");
    return 0;
}
