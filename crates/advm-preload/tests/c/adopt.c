/* A copy whose source is freed before the copy is written (R's `y <- x; x <- NULL;
 * y[i] <- v`) keeps one home per page: the copy becomes the home of the memfd pages it
 * was left alone on, so writing every page of it afterwards allocates no second copy
 * (arena memfds' allocated bytes stay at one copy, and the block has no anonymous page
 * in pagemap). A copy of it is then isolated both ways. */
#include "t.h"

#define NP 2000
#define N ((size_t)NP * PS)

/* Pages of [p, p+np pages) that are the process's own anonymous pages (not the file's). */
static long anon_pages(const void *p, size_t np) {
    int fd = open("/proc/self/pagemap", O_RDONLY);
    CHECK(fd >= 0);
    long anon = 0;
    uint64_t e[512];
    for (size_t done = 0; done < np;) {
        size_t k = np - done < 512 ? np - done : 512;
        off_t off = (off_t)(((uintptr_t)p / PS + done) * 8);
        CHECK(pread(fd, e, k * 8, off) == (ssize_t)(k * 8));
        for (size_t j = 0; j < k; j++)
            if ((e[j] >> 63 & 1) && !(e[j] >> 61 & 1)) anon++;
        done += k;
    }
    close(fd);
    return anon;
}

/* Adds one to byte `at` of every page. */
static void bump(unsigned char *p, unsigned at) {
    for (size_t i = 0; i < NP; i++) p[i * PS + at]++;
}
/* Whether p holds fill(seed) with byte 5 of every page raised by b5 and byte 9 by b9. */
static int holds(const unsigned char *p, unsigned seed, unsigned b5, unsigned b9) {
    for (size_t i = 0; i < N; i++) {
        unsigned char want = (unsigned char)(i * 31 + seed + i / PS);
        if (i % PS == 5) want = (unsigned char)(want + b5);
        if (i % PS == 9) want = (unsigned char)(want + b9);
        if (p[i] != want) return 0;
    }
    return 1;
}

int main(void) {
    int measure = memfd_holds_only_copies();
    long base = memfd_pages();

    unsigned char *x = malloc(N), *y = malloc(N);
    fill(x, N, 7);
    memcpy(y, x, N);
    if (measure) CHECK(memfd_pages() - base == NP);
    free(x);
    if (measure) CHECK(memfd_pages() - base == NP); /* y reads every page from the memfd */
    CHECK(same(y, N, 7));
    bump(y, 5);
    if (measure) CHECK(memfd_pages() - base == NP); /* written in place: no page added */
    if (vcopy_mode()) CHECK(anon_pages(y, NP) == 0); /* and no private copy beside it */
    CHECK(holds(y, 7, 1, 0));

    /* the survivor copied again: each side's writes stay its own */
    unsigned char *z = malloc(N);
    memcpy(z, y, N);
    CHECK(holds(z, 7, 1, 0));
    bump(y, 9);
    CHECK(holds(z, 7, 1, 0));
    bump(z, 5);
    CHECK(holds(y, 7, 1, 1));
    CHECK(holds(z, 7, 2, 0));
    if (measure) CHECK(memfd_pages() - base == NP); /* both wrote privately: one shared copy */

    /* z freed: y, which wrote every page, keeps its own and the memfd pages go */
    free(z);
    if (measure) CHECK(memfd_pages() - base == 0);
    free(y);
    if (measure) CHECK(memfd_pages() - base == 0);
    printf("adopt: ok (accounting %s)\n", measure ? "checked" : "not checked in this mode");
    return 0;
}
