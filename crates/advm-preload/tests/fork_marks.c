/* A program's MADV_WIPEONFORK and MADV_DONTFORK on its blocks act as on glibc's memory
 * after fork, and MADV_KEEPONFORK and MADV_DOFORK undo them (run by tests/c_programs.rs
 * under every variant, and without the shim).
 *
 * On glibc's large blocks (private anonymous memory) a forked child reads zeros in a
 * range marked MADV_WIPEONFORK and does not have a range marked MADV_DONTFORK. A virtual
 * copy's pages are views of a memfd: the kernel refused MADV_WIPEONFORK there (EINVAL),
 * and a mark it took was lost when the shim mapped over the pages (a copy into or out of
 * the block, a copy's last view adopting its pages): the child read the parent's bytes,
 * or had the range. Checked on a copy's destination, its source, a block that adopted its
 * pages, a block copied into and out of after the mark, the undo advices, and blocks
 * allocated after marked ones were freed (no mark left). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "pattern.h"

#define N (1u << 20)

/* Whether [p, p + n) is mapped in this process (mincore fails with ENOMEM on a hole). */
static int mapped(const void *p, size_t n) {
    unsigned char vec[256];
    return mincore((void *)p, n, vec) == 0;
}

/* What a forked child sees of block p (seed: its bytes) with [lo, hi) marked by advice:
 * zeros there (MADV_WIPEONFORK), no mapping there (MADV_DONTFORK), or the parent's bytes
 * (none: 0). Returns 0 when it is so; the parent's block stays as it was. */
static void child_sees(const unsigned char *p, unsigned seed, size_t lo, size_t hi, int advice, const char *what) {
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        if (advice == MADV_DONTFORK) {
            if (mapped(p + lo, hi - lo)) _exit(2);
            for (size_t i = 0; i < N; i++)
                if ((i < lo || i >= hi) && p[i] != (unsigned char)(i * 7 + seed + i / PS + 1)) _exit(3);
            _exit(0);
        }
        int wipe = advice == MADV_WIPEONFORK;
        _exit(differs(p, N, seed, wipe ? lo : 0, wipe ? hi : 0) < 0 ? 0 : 4);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st), "%s: child died (%d)", what, st);
    CHECK(WEXITSTATUS(st) == 0, "%s: child saw the wrong thing (%s)", what,
          WEXITSTATUS(st) == 2 ? "the range is mapped" : WEXITSTATUS(st) == 3 ? "bytes outside the range" : "bytes");
    long at = differs(p, N, seed, 0, 0);
    CHECK(at < 0, "%s: parent's byte %ld changed", what, at);
}

int main(void) {
    const int advices[2] = {MADV_WIPEONFORK, MADV_DONTFORK};
    const char *names[2] = {"MADV_WIPEONFORK", "MADV_DONTFORK"};
    for (int k = 0; k < 2; k++) {
        int adv = advices[k];
        char what[96];
        /* a copy's destination and its source */
        unsigned char *a = malloc(N), *b = malloc(N);
        fill(a, N, 1);
        memcpy(b, a, N);
        size_t lo = first_page(b) + 4 * PS, hi = lo + 8 * PS;
        CHECK(madvise(b + lo, hi - lo, adv) == 0, "%s on a copy: %s", names[k], strerror(errno));
        snprintf(what, sizeof what, "%s on a copy", names[k]);
        child_sees(b, 1, lo, hi, adv, what);
        size_t slo = first_page(a) + 16 * PS, shi = slo + 8 * PS;
        CHECK(madvise(a + slo, shi - slo, adv) == 0, "%s on a source: %s", names[k], strerror(errno));
        snprintf(what, sizeof what, "%s on a source", names[k]);
        child_sees(a, 1, slo, shi, adv, what);

        /* the marked blocks copied out of and into: the marks stay */
        unsigned char *c = malloc(N);
        memcpy(c, b, N);
        memcpy(a, c, N);
        snprintf(what, sizeof what, "%s on a source copied from and into", names[k]);
        child_sees(a, 1, slo, shi, adv, what);
        snprintf(what, sizeof what, "%s on a copy copied from", names[k]);
        child_sees(b, 1, lo, hi, adv, what);
        CHECK(differs(c, N, 1, 0, 0) < 0, "%s: the copy of a marked block", names[k]);

        /* a block marked before it is copied into (anonymous, never copied) */
        unsigned char *d = malloc(N);
        fill(d, N, 5);
        size_t dlo = first_page(d) + 32 * PS, dhi = dlo + 64 * PS;
        CHECK(madvise(d + dlo, dhi - dlo, adv) == 0, "%s on a block: %s", names[k], strerror(errno));
        memcpy(d, c, N);
        snprintf(what, sizeof what, "%s on a block then copied into", names[k]);
        child_sees(d, 1, dlo, dhi, adv, what);

        /* a copy whose source is freed (under the shim it maps its pages shared) */
        unsigned char *e = malloc(N);
        memcpy(e, c, N);
        free(c);
        size_t elo = first_page(e) + 2 * PS, ehi = elo + 100 * PS;
        CHECK(madvise(e + elo, ehi - elo, adv) == 0, "%s on a lone copy: %s", names[k], strerror(errno));
        snprintf(what, sizeof what, "%s on a lone copy", names[k]);
        child_sees(e, 1, elo, ehi, adv, what);

        /* undone: the child sees the parent's bytes again */
        CHECK(madvise(e + elo, ehi - elo, adv == MADV_WIPEONFORK ? MADV_KEEPONFORK : MADV_DOFORK) == 0, "undo %s: %s",
              names[k], strerror(errno));
        snprintf(what, sizeof what, "%s undone", names[k]);
        child_sees(e, 1, 0, 0, 0, what);

        /* undone and freed (glibc keeps a mark on heap memory it reuses), allocated again:
         * no mark left on the new blocks */
        int undo = adv == MADV_WIPEONFORK ? MADV_KEEPONFORK : MADV_DOFORK;
        CHECK(madvise(a + slo, shi - slo, undo) == 0 && madvise(b + lo, hi - lo, undo) == 0 &&
                  madvise(d + dlo, dhi - dlo, undo) == 0,
              "undo %s: %s", names[k], strerror(errno));
        free(a);
        free(b);
        free(d);
        free(e);
        for (int r = 0; r < 4; r++) {
            unsigned char *x = malloc(N), *y = malloc(N);
            fill(x, N, 20 + r);
            memcpy(y, x, N);
            snprintf(what, sizeof what, "after %s, block %d allocated again", names[k], r);
            child_sees(x, 20 + r, 0, 0, 0, what);
            child_sees(y, 20 + r, 0, 0, 0, what);
            free(x);
            free(y);
        }
    }
    printf("fork_marks: ok\n");
    return 0;
}
