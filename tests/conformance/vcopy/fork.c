/* fork with virtual copies on both sides. Copies, dups and writes made before each
 * fork; then parent and child take turns (synchronised by pipes): each changes its own
 * blocks (writes, copies, dups, frees) and the other checks that it still sees exactly
 * its own contents, never the other's writes. Five forks in a row, the child of the
 * first forks again, and the parent keeps copying between forks. */
#include <sys/wait.h>
#include "vc.h"

#define NB 8
static struct {
    unsigned char *p, *sh;
    size_t len;
} b[NB];
static uint64_t rs = 77;
static size_t rnd(size_t n) { return (size_t)(vc_rand(&rs) % n); }

static void check_all(const char *who) {
    char what[64];
    for (int i = 0; i < NB; i++) {
        snprintf(what, sizeof what, "%s: block %d", who, i);
        vc_check(b[i].p, b[i].sh, b[i].len, what);
    }
}

static void put(int i, unsigned char *p, size_t len) {
    VC_CHECK(p != NULL);
    b[i].p = p;
    b[i].len = len;
    b[i].sh = vc_shadow(len);
}

static void release(int i) {
    vc_free(b[i].p);
    vc_unshadow(b[i].sh, b[i].len);
}

/* A few changes: copies (congruent, whole or partial, sometimes not congruent), a dup
 * replacing a block, scattered writes to sources and destinations. */
static void mutate(int rounds) {
    for (int k = 0; k < rounds; k++) {
        int s = (int)rnd(NB), d = (int)rnd(NB);
        if (s == d) d = (d + 1) % NB;
        size_t max = b[s].len < b[d].len ? b[s].len : b[d].len;
        size_t off = rnd(4) ? rnd(max / VC_PS) * VC_PS : rnd(max), dskew = rnd(5) ? 0 : 1 + rnd(VC_PS - 1);
        if (off + dskew >= max) dskew = 0;
        size_t len = 1 + rnd(max - off - dskew);
        VC_CHECK(vc_copy(b[d].p + off + dskew, b[s].p + off, len) == 0);
        vc_sh_copy(b[d].sh + off + dskew, b[s].sh + off, len);
        if (rnd(3) == 0) { /* a dup replaces a block */
            int r = (int)rnd(NB);
            if (r != s) {
                release(r);
                put(r, vc_dup(b[s].p, b[s].len), b[s].len);
                vc_sh_copy(b[r].sh, b[s].sh, b[s].len);
            }
        }
        for (int w = 0; w < 3; w++) {
            int i = w == 0 ? s : w == 1 ? d : (int)rnd(NB);
            size_t o = rnd(b[i].len), n = 1 + rnd(VC_PS + 100);
            if (n > b[i].len - o) n = b[i].len - o;
            vc_write(b[i].p + o, b[i].sh + o, n, vc_rand(&rs));
        }
    }
}

static void xfer(int fd, int out) {
    char c = 'x';
    VC_CHECK(out ? write(fd, &c, 1) == 1 : read(fd, &c, 1) == 1);
}

/* One fork: the child and the parent take `turns` turns each; returns in the parent
 * after the child exited 0. */
static void fork_and_alternate(int turns, int nest) {
    int p2c[2], c2p[2];
    VC_CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
    pid_t pid = fork();
    VC_CHECK(pid >= 0);
    if (pid == 0) {
        rs ^= 0xc0ffee; /* the child's changes differ from the parent's */
        check_all("child after fork");
        for (int t = 0; t < turns; t++) {
            xfer(p2c[0], 0); /* the parent has changed its blocks */
            check_all("child after a parent turn");
            mutate(6);
            check_all("child after its own turn");
            xfer(c2p[1], 1);
        }
        if (nest) fork_and_alternate(2, 0); /* a grandchild */
        check_all("child at exit");
        fflush(stdout);
        _exit(0);
    }
    for (int t = 0; t < turns; t++) {
        mutate(6);
        check_all("parent after its own turn");
        xfer(p2c[1], 1);
        xfer(c2p[0], 0); /* the child has changed its blocks */
        check_all("parent after a child turn");
    }
    int st = 0;
    VC_CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "[%s] fork: child failed (status %#x)\n", VC_BACKEND, st);
        exit(1);
    }
    close(p2c[0]);
    close(p2c[1]);
    close(c2p[0]);
    close(c2p[1]);
    check_all("parent after the child exited");
}

int main(void) {
    size_t sizes[NB] = {40 * VC_PS + 123, 40 * VC_PS + 123, 64 * VC_PS, 3 * VC_PS - 1,
                        600 * VC_PS, 600 * VC_PS, 17 * VC_PS, 2 * VC_PS};
    for (int i = 0; i < NB; i++) {
        put(i, vc_alloc(sizes[i]), sizes[i]);
        vc_write(b[i].p, b[i].sh, sizes[i], (uint64_t)i + 1);
    }
    /* before the first fork: a dup chain, a partial congruent copy, a big copy, writes
     * after the copies (block 7 stays a single owner) */
    release(1);
    put(1, vc_dup(b[0].p, b[0].len), b[0].len);
    vc_sh_copy(b[1].sh, b[0].sh, b[0].len);
    VC_CHECK(vc_copy(b[2].p + 100, b[0].p + 100, 30 * VC_PS) == 0);
    vc_sh_copy(b[2].sh + 100, b[0].sh + 100, 30 * VC_PS);
    VC_CHECK(vc_copy(b[5].p, b[4].p, 600 * VC_PS) == 0);
    vc_sh_copy(b[5].sh, b[4].sh, 600 * VC_PS);
    vc_write(b[1].p + 5 * VC_PS, b[1].sh + 5 * VC_PS, 10, 9);
    vc_write(b[4].p + 300 * VC_PS, b[4].sh + 300 * VC_PS, VC_PS, 10);
    check_all("parent before fork");
    for (int f = 0; f < 5; f++) {
        fork_and_alternate(3, f == 0);
        mutate(4); /* the parent keeps copying between forks */
        check_all("parent between forks");
    }
    for (int i = 0; i < NB; i++) release(i);
    return vc_done("fork", "5 forks (one nested), 3 alternating turns of copies/dups/writes each side, "
                           "every block checked by both after every turn");
}
