/* Random operations on up to 24 blocks, every block checked against its shadow after
 * each one: allocations of many sizes (under a page, non page multiples, 2-4 MiB),
 * whole and partial copies at page-congruent and non-congruent offsets (also within
 * one block), writes to sources and destinations after copies, frees, and dups of
 * (ranges of) dups, building chains. Argument: seed (default 1). */
#include "vc.h"

#define MAXB 24
#define OPS 1500

struct blk {
    unsigned char *p, *sh;
    size_t len;
    int depth; /* dup chain length */
};
static struct blk b[MAXB];
static int nb, large;
static uint64_t rs;
static unsigned long nops[8];
static size_t rnd(size_t n) { return n ? (size_t)(vc_rand(&rs) % n) : 0; }

static size_t pick_len(void) {
    switch (rnd(10)) {
    case 0: case 1: case 2: case 3: return 1 + rnd(8 * VC_PS);                 /* small, any length */
    case 4: case 5: case 6: return (2 + rnd(63)) * VC_PS;                      /* page multiples */
    case 7: case 8: return (16 + rnd(112)) * VC_PS + rnd(VC_PS);               /* medium */
    default: return large < 3 ? (512 + rnd(513)) * VC_PS + rnd(2) * rnd(VC_PS) : 3 * VC_PS; /* large */
    }
}

static void add(unsigned char *p, unsigned char *sh, size_t len, int depth) {
    VC_CHECK(p != NULL);
    if (len >= 512 * VC_PS) large++;
    b[nb++] = (struct blk){p, sh, len, depth};
}

static void drop(int i) {
    if (b[i].len >= 512 * VC_PS) large--;
    vc_free(b[i].p);
    vc_unshadow(b[i].sh, b[i].len);
    b[i] = b[--nb];
}

static void check_all(void) {
    char what[64];
    for (int i = 0; i < nb; i++) {
        snprintf(what, sizeof what, "block %d (dup depth %d)", i, b[i].depth);
        vc_check(b[i].p, b[i].sh, b[i].len, what);
    }
}

/* A copy from block s to block d (may be the same block: then disjoint halves). */
static void copy(int s, int d) {
    size_t so, dof, len;
    int mode = (int)rnd(3);
    if (s == d) {
        size_t half = b[s].len / 2;
        if (half == 0) return;
        len = 1 + rnd(half);
        so = rnd(half - len + 1);
        dof = half + rnd(b[s].len - half - len + 1);
    } else if (mode == 0) { /* whole */
        so = dof = 0;
        len = b[s].len < b[d].len ? b[s].len : b[d].len;
    } else {
        so = rnd(b[s].len);
        if (mode == 1) { /* page-congruent: same offset within the page */
            size_t pages = b[d].len / VC_PS + 1;
            dof = rnd(pages) * VC_PS + so % VC_PS;
            if (dof >= b[d].len) dof = so % VC_PS < b[d].len ? so % VC_PS : 0;
        } else {
            dof = rnd(b[d].len);
        }
        size_t max = b[s].len - so < b[d].len - dof ? b[s].len - so : b[d].len - dof;
        len = rnd(4) ? max - rnd(max / 2 + 1) : rnd(max + 1); /* mostly long, some short */
    }
    VC_CHECK(vc_copy(b[d].p + dof, b[s].p + so, len) == 0);
    vc_sh_copy(b[d].sh + dof, b[s].sh + so, len);
    nops[(dof - so) % VC_PS == 0 ? 1 : 2]++;
}

static void scribble(int i) {
    int k = 1 + (int)rnd(8);
    for (int j = 0; j < k; j++) {
        size_t off = rnd(b[i].len), n = 1 + rnd(2 * VC_PS);
        if (n > b[i].len - off) n = b[i].len - off;
        vc_write(b[i].p + off, b[i].sh + off, n, vc_rand(&rs));
    }
    nops[3]++;
}

int main(int argc, char **argv) {
    rs = 0x1234567ull + (argc > 1 ? strtoull(argv[1], NULL, 0) : 1);
    for (int op = 0; op < OPS; op++) {
        int r = (int)rnd(100);
        if (nb < 2 || (r < 18 && nb < MAXB)) {
            size_t len = pick_len();
            unsigned char *p = vc_alloc(len), *sh = vc_shadow(len);
            VC_CHECK(p != NULL);
            vc_write(p, sh, len, vc_rand(&rs));
            add(p, sh, len, 0);
            nops[0]++;
        } else if (r < 50) {
            int s = (int)rnd((size_t)nb), d = rnd(8) ? (int)rnd((size_t)nb) : s;
            copy(s, d);
            if (rnd(2)) scribble(rnd(2) ? s : d); /* write to a side of the fresh copy */
        } else if (r < 65) {
            scribble((int)rnd((size_t)nb));
        } else if (r < 80 && nb > 2) {
            drop((int)rnd((size_t)nb));
            nops[4]++;
        } else if (nb < MAXB) {
            /* dup of the newest block half the time: chains of dups of dups */
            int s = rnd(2) ? nb - 1 : (int)rnd((size_t)nb);
            size_t off = rnd(3) ? 0 : (rnd(2) ? rnd(b[s].len / VC_PS) * VC_PS : rnd(b[s].len));
            size_t len = b[s].len - off;
            if (rnd(3) == 0) len = 1 + rnd(len);
            unsigned char *p = vc_dup(b[s].p + off, len), *sh = vc_shadow(len);
            VC_CHECK(p != NULL);
            vc_sh_copy(sh, b[s].sh + off, len);
            add(p, sh, len, b[s].depth + 1);
            nops[5]++;
            if (rnd(2)) scribble(rnd(2) ? s : nb - 1);
        }
        check_all();
    }
    /* an explicit chain: dup of dup of dup..., each written after its dup, freed from
     * the middle out while the rest is checked */
    while (nb > MAXB - 10) drop(nb - 1);
    for (int k = 0; k < 8; k++) {
        int s = nb - 1;
        unsigned char *p = vc_dup(b[s].p, b[s].len), *sh = vc_shadow(b[s].len);
        VC_CHECK(p != NULL);
        vc_sh_copy(sh, b[s].sh, b[s].len);
        add(p, sh, b[s].len, b[s].depth + 1);
        scribble(k % 2 ? s : nb - 1);
        check_all();
        nops[5]++;
    }
    int deepest = 0;
    for (int i = 0; i < nb; i++) deepest = b[i].depth > deepest ? b[i].depth : deepest;
    for (int k = 0; k < 4; k++) {
        drop(nb - 5);
        check_all();
    }
    while (nb) drop(nb - 1);
    char detail[200];
    snprintf(detail, sizeof detail,
             "%d ops: %lu allocs, %lu congruent and %lu non-congruent copies, %lu write bursts, %lu frees, "
             "%lu dups (deepest live chain %d)",
             OPS, nops[0], nops[1], nops[2], nops[3], nops[4], nops[5], deepest);
    return vc_done("random_ops", detail);
}
