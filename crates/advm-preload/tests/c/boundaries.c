/* Small requests stay with glibc; requests of at least 2 pages come from the arena,
 * page aligned and zeroed by calloc even when the pages are reused. */
#include "t.h"

static long resident_pages(void) {
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f && fscanf(f, "%ld %ld", &size, &res) == 2);
    fclose(f);
    return res;
}

int main(void) {
    /* freed memory goes back to the system at once (punched or MADV_DONTNEED), also
     * when the block's mapping is kept for reuse */
    long before = resident_pages();
    unsigned char *m = malloc(4096 * PS);
    memset(m, 7, 4096 * PS);
    CHECK(resident_pages() - before >= 4000);
    free(m);
    CHECK(resident_pages() - before < 200);
    m = malloc(4096 * PS); /* the same mapping again: zero, and memory only once touched */
    CHECK(m[0] == 0 && m[4096 * PS - 1] == 0 && resident_pages() - before < 250);
    free(m);

    void *small = malloc(2 * PS - 1);
    CHECK(small && !in_arena(small, 2 * PS - 1));
    void *big = malloc(2 * PS);
    CHECK(big && in_arena(big, 2 * PS));
    void *odd = malloc(5 * PS + 17);
    CHECK(odd && in_arena(odd, 5 * PS + 17));
    memset(odd, 0xff, 5 * PS + 17);
    free(odd);
    unsigned char *z = calloc(1, 5 * PS + 17); /* likely the pages just freed */
    CHECK(z && in_arena(z, 5 * PS + 17));
    for (size_t i = 0; i < 5 * PS + 17; i++) CHECK(z[i] == 0);
    unsigned char *c = calloc(3, PS);
    CHECK(c && in_arena(c, 3 * PS));
    CHECK(calloc((size_t)1 << 40, (size_t)1 << 40) == NULL && errno == ENOMEM);
    void *huge = malloc((size_t)1 << 50); /* beyond the arena and memory: NULL, no crash */
    CHECK(huge == NULL);
    free(small);
    free(big);
    free(z);
    free(c);
    free(NULL);
    /* many blocks: address reuse after free keeps contents separate */
    void *v[200];
    for (int i = 0; i < 200; i++) {
        v[i] = malloc((size_t)(2 + i % 7) * PS);
        fill(v[i], (size_t)(2 + i % 7) * PS, (unsigned)i);
    }
    for (int i = 0; i < 200; i += 2) free(v[i]);
    for (int i = 0; i < 200; i += 2) {
        v[i] = malloc((size_t)(2 + i % 7) * PS);
        fill(v[i], (size_t)(2 + i % 7) * PS, (unsigned)i);
    }
    for (int i = 0; i < 200; i++) CHECK(same(v[i], (size_t)(2 + i % 7) * PS, (unsigned)i));
    for (int i = 0; i < 200; i++) free(v[i]);
    printf("boundaries: ok\n");
    return 0;
}
