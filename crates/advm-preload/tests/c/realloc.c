/* realloc of arena blocks: growth in place and by moving pages, shrinking, crossing the
 * threshold both ways, and realloc of a block that is a virtual copy. */
#include "t.h"

int main(void) {
    unsigned char *p = malloc(4 * PS);
    fill(p, 4 * PS, 7);
    p = realloc(p, 8 * PS); /* in place when the next pages are free */
    CHECK(p && in_arena(p, 8 * PS) && same(p, 4 * PS, 7));
    unsigned char *blocker = malloc(2 * PS); /* the block after p: p must move */
    fill(p, 8 * PS, 8);
    unsigned char *q = realloc(p, 300 * PS);
    CHECK(q && in_arena(q, 300 * PS) && same(q, 8 * PS, 8));
    fill(q, 300 * PS, 9);
    q = realloc(q, 3 * PS); /* shrink in place */
    CHECK(q && in_arena(q, 3 * PS) && same(q, 3 * PS, 9));
    q = realloc(q, 100); /* below the threshold: back to glibc */
    CHECK(q && !in_arena(q, 100) && same(q, 100, 9));
    q = realloc(q, 50 * PS); /* glibc block growing large stays glibc's (untouched) */
    CHECK(q && same(q, 100, 9));
    free(q);
    /* a virtual copy is several mappings: moving it must keep every page */
    unsigned char *a = malloc(64 * PS), *b = malloc(64 * PS);
    fill(a, 64 * PS, 10);
    memcpy(b, a, 64 * PS);
    b[7 * PS] ^= 1;
    b[40 * PS] ^= 1;
    unsigned char *g = malloc(2 * PS);
    b = realloc(b, 200 * PS);
    CHECK(b);
    b[7 * PS] ^= 1;
    b[40 * PS] ^= 1;
    CHECK(same(b, 64 * PS, 10) && same(a, 64 * PS, 10));
    for (size_t i = 64 * PS; i < 200 * PS; i++) CHECK(b[i] == 0 || !vcopy_mode());
    unsigned char *r = realloc(NULL, 3 * PS);
    CHECK(r && in_arena(r, 3 * PS));
    CHECK(realloc(r, 0) == NULL);
    CHECK(reallocarray(NULL, (size_t)1 << 40, (size_t)1 << 40) == NULL && errno == ENOMEM);
    free(a);
    free(b);
    free(g);
    free(blocker);
    printf("realloc: ok\n");
    return 0;
}
