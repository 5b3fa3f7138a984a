/* Large copies between arena blocks: contents, page sharing (PFNs when visible),
 * isolation both ways, copies of modified copies, partial pages, fallbacks. */
#include "t.h"

#define N (64 * PS)

extern void *__memcpy_chk(void *, const void *, size_t, size_t);
extern void *__memmove_chk(void *, const void *, size_t, size_t);

int main(void) {
    int check_pfn = vcopy_mode() && pfns_visible();
    unsigned char *a = malloc(N), *b = malloc(N), *c = malloc(N);
    fill(a, N, 1);
    memcpy(b, a, N);
    CHECK(same(b, N, 1));
    if (check_pfn) CHECK(pfn(a + 10 * PS) == pfn(b + 10 * PS));
    /* write the copy: the source keeps its bytes, the page is no longer shared */
    b[10 * PS + 5] ^= 0xff;
    CHECK(same(a, N, 1));
    if (check_pfn) {
        CHECK(pfn(a + 10 * PS) != pfn(b + 10 * PS));
        CHECK(pfn(a + 11 * PS) == pfn(b + 11 * PS));
    }
    b[10 * PS + 5] ^= 0xff;
    CHECK(same(b, N, 1));
    /* write the source: the copy keeps its bytes */
    a[20 * PS] ^= 0x55;
    CHECK(same(b, N, 1));
    a[20 * PS] ^= 0x55;
    /* copy of a modified copy: its written page is shared with the new copy too */
    b[3 * PS + 1] = 9;
    memcpy(c, b, N);
    CHECK(c[3 * PS + 1] == 9);
    c[3 * PS + 1] = (unsigned char)(3 * PS + 1) * 31 + 1 + 3;
    b[3 * PS + 1] = c[3 * PS + 1];
    CHECK(same(c, N, 1) && same(b, N, 1));
    if (check_pfn) CHECK(pfn(b + 30 * PS) == pfn(c + 30 * PS));
    /* equal page offsets, partial first and last pages (an R vector: 48-byte header) */
    unsigned char *x = malloc(N + PS), *y = malloc(N + PS);
    fill(x, N + PS, 2);
    memset(y, 0xee, N + PS);
    memcpy(y + 48, x + 48, N - 100);
    CHECK(y[47] == 0xee && y[48 + N - 100] == 0xee);
    for (size_t i = 48; i < 48 + N - 100; i++) CHECK(y[i] == x[i]);
    if (check_pfn) CHECK(pfn(x + 5 * PS) == pfn(y + 5 * PS));
    /* different page offsets: plain copy */
    memset(y, 0, N + PS);
    memcpy(y + 100, x + 48, N - 200);
    for (size_t i = 0; i < N - 200; i++) CHECK(y[100 + i] == x[48 + i]);
    /* memmove within one block, overlapping: plain memmove semantics */
    fill(x, N + PS, 3);
    memmove(x + PS, x, N - PS);
    for (size_t i = 0; i < N - PS; i++) CHECK(x[PS + i] == (unsigned char)(i * 31 + 3 + i / PS));
    /* memmove between blocks, not overlapping: virtual */
    fill(x, N, 4);
    memmove(y, x, N);
    CHECK(same(y, N, 4));
    /* fortified copies (what Debian's -D_FORTIFY_SOURCE builds call) */
    fill(a, N, 5);
    __memcpy_chk(b, a, N, N);
    CHECK(same(b, N, 5));
    __memmove_chk(c, b, N, N);
    CHECK(same(c, N, 5));
    /* copying into a block from a stack buffer and small copies still work */
    char small[64];
    memcpy(small, a, sizeof small);
    CHECK(memcmp(small, a, sizeof small) == 0);
    /* free either side first: the other keeps its contents */
    free(a);
    CHECK(same(b, N, 5) && same(c, N, 5));
    free(c);
    CHECK(same(b, N, 5));
    free(b);
    free(x);
    free(y);
    printf("copy: ok (pfn checks %s)\n", check_pfn ? "on" : "off: PFNs hidden or not vcopy mode");
    return 0;
}
