/* A program's own MADV_DONTNEED and MADV_FREE on its blocks act as on glibc's memory
 * (run by tests/c_programs.rs under every variant, and without the shim).
 *
 * glibc's large blocks are private anonymous memory: a page dropped with MADV_DONTNEED
 * reads as zeros, and MADV_FREE succeeds. A virtual copy's pages are views of a memfd:
 * there MADV_DONTNEED read the copy's bytes back instead of zeros, and MADV_FREE
 * failed with EINVAL. Checked on a copy's destination and its source, a block that
 * adopted its pages (its source freed), a child's copy after fork (the parent's stays),
 * a copy of a partly dropped block, MADV_DONTNEED_LOCKED, and MADV_REMOVE (EINVAL, as on
 * glibc's memory); every byte of every block is compared with what the program wrote. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "pattern.h"

#define N (1u << 20)

int main(void) {
    long at;
    /* a copy's destination: dropped pages read zeros, the rest and the source keep
     * their bytes; MADV_FREE succeeds, and what is written after it stays */
    unsigned char *a = malloc(N), *b = malloc(N);
    fill(a, N, 1);
    memcpy(b, a, N);
    size_t lo = first_page(b) + 4 * PS, hi = lo + 8 * PS;
    CHECK(madvise(b + lo, hi - lo, MADV_DONTNEED) == 0, "MADV_DONTNEED: %s", strerror(errno));
    CHECK((at = differs(b, N, 1, lo, hi)) < 0, "copy after MADV_DONTNEED: byte %ld is %d", at, b[at]);
    CHECK((at = differs(a, N, 1, 0, 0)) < 0, "source after its copy's MADV_DONTNEED: byte %ld", at);
    size_t flo = first_page(b) + 32 * PS, fhi = flo + 16 * PS;
    CHECK(madvise(b + flo, fhi - flo, MADV_FREE) == 0, "MADV_FREE: %s", strerror(errno));
    memset(b + flo, 0, fhi - flo); /* after MADV_FREE a page holds its old bytes or zeros: written again */
    for (size_t i = 0; i < N; i++) {
        int zero = (i >= lo && i < hi) || (i >= flo && i < fhi);
        CHECK(b[i] == (zero ? 0 : (unsigned char)(i * 7 + 1 + i / PS + 1)), "copy byte %zu is %d", i, b[i]);
    }
    CHECK((at = differs(a, N, 1, 0, 0)) < 0, "source after its copy's MADV_FREE: byte %ld", at);

    /* MADV_DONTNEED_LOCKED (Linux 5.18) drops as MADV_DONTNEED does */
    unsigned char *l = malloc(N);
    memcpy(l, b, N);
    size_t llo = first_page(l) + 200 * PS;
    if (madvise(l + llo, 8 * PS, 24 /* MADV_DONTNEED_LOCKED */) == 0) {
        for (size_t i = llo; i < llo + 8 * PS; i++) CHECK(l[i] == 0, "MADV_DONTNEED_LOCKED: byte %zu is %d", i, l[i]);
    } else {
        CHECK(errno == EINVAL, "MADV_DONTNEED_LOCKED: %s", strerror(errno));
    }
    free(l);

    /* the source dropped: the copy keeps its bytes; a copy of the partly dropped source
     * copies its zeros */
    unsigned char *c = malloc(N);
    memcpy(c, a, N);
    size_t slo = first_page(a) + 64 * PS, shi = slo + 40 * PS;
    CHECK(madvise(a + slo, shi - slo, MADV_DONTNEED) == 0, "MADV_DONTNEED of a source: %s", strerror(errno));
    CHECK((at = differs(a, N, 1, slo, shi)) < 0, "source after MADV_DONTNEED: byte %ld is %d", at, a[at]);
    CHECK((at = differs(c, N, 1, 0, 0)) < 0, "copy after its source's MADV_DONTNEED: byte %ld", at);
    unsigned char *d = malloc(N);
    memcpy(d, a, N);
    CHECK((at = differs(d, N, 1, slo, shi)) < 0, "copy of a dropped source: byte %ld is %d", at, d[at]);

    /* a copy whose source is freed (under the shim it maps its pages shared, as their
     * home): dropped pages read zeros, written ones keep what is written */
    free(c);
    free(a);
    CHECK((at = differs(d, N, 1, slo, shi)) < 0, "copy after its source was freed: byte %ld", at);
    size_t dlo = first_page(d) + 100 * PS, dhi = dlo + 50 * PS;
    CHECK(madvise(d + dlo, dhi - dlo, MADV_DONTNEED) == 0, "MADV_DONTNEED of a lone copy: %s", strerror(errno));
    for (size_t i = 0; i < N; i++) {
        int zero = (i >= slo && i < shi) || (i >= dlo && i < dhi);
        CHECK(d[i] == (zero ? 0 : (unsigned char)(i * 7 + 1 + i / PS + 1)), "lone copy byte %zu is %d", i, d[i]);
    }
    fill(d, N, 3);

    /* MADV_REMOVE is refused on private anonymous memory, and the block keeps its bytes */
    CHECK(madvise(d + first_page(d), 8 * PS, MADV_REMOVE) == -1 && errno == EINVAL, "MADV_REMOVE: not EINVAL");
    CHECK((at = differs(d, N, 3, 0, 0)) < 0, "after MADV_REMOVE: byte %ld", at);

    /* after fork: the child drops pages of its copy, the parent's copy and source keep
     * their bytes */
    unsigned char *e = malloc(N);
    memcpy(e, d, N);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        size_t k = first_page(e) + 10 * PS;
        if (madvise(e + k, 20 * PS, MADV_DONTNEED) != 0 || differs(e, N, 3, k, k + 20 * PS) >= 0) _exit(1);
        unsigned char *f = malloc(N);
        memcpy(f, e, N);
        _exit(differs(f, N, 3, k, k + 20 * PS) < 0 && differs(d, N, 3, 0, 0) < 0 ? 0 : 2);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: %d", st);
    CHECK((at = differs(e, N, 3, 0, 0)) < 0, "parent's copy after the child's MADV_DONTNEED: byte %ld", at);
    CHECK((at = differs(d, N, 3, 0, 0)) < 0, "parent's source after the child's MADV_DONTNEED: byte %ld", at);

    /* the blocks are freed and allocated again, copied into and dropped: nothing stale */
    free(b);
    free(d);
    free(e);
    malloc_trim(0);
    for (unsigned r = 0; r < 8; r++) {
        unsigned char *x = malloc(N), *y = malloc(N);
        fill(x, N, 20 + r);
        memcpy(y, x, N);
        size_t k = first_page(y) + r * 16 * PS;
        CHECK(madvise(y + k, 16 * PS, r % 2 ? MADV_FREE : MADV_DONTNEED) == 0, "round %u: %s", r, strerror(errno));
        if (r % 2) memset(y + k, 0, 16 * PS);
        CHECK((at = differs(y, N, 20 + r, k, k + 16 * PS)) < 0, "round %u: copy byte %ld is %d", r, at, y[at]);
        CHECK((at = differs(x, N, 20 + r, 0, 0)) < 0, "round %u: source byte %ld", r, at);
        free(x);
        free(y);
    }
    printf("madvise: ok\n");
    return 0;
}
