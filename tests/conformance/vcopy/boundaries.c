/* Zero lengths and boundaries both APIs define: copies of 0 bytes (also at a block's
 * end), lengths around 1, 2, 16 and 512 pages (minus and plus one byte), copies at
 * offsets 0, 1, page-1, page, page+1 on both sides (congruent and not), copies ending
 * exactly at a block's end, dups of ranges starting inside a block, frees of either
 * side of a copy first, and vc_free(NULL). */
#include "vc.h"

static uint64_t seed = 1;

struct blk {
    unsigned char *p, *sh;
    size_t len;
};

static struct blk mk(size_t len) {
    struct blk b = {vc_alloc(len), vc_shadow(len), len};
    VC_CHECK(b.p != NULL);
    vc_write(b.p, b.sh, len, seed++);
    return b;
}
static void rm(struct blk *b) {
    vc_free(b->p);
    vc_unshadow(b->sh, b->len);
}
static void chk(const struct blk *b, const char *what) { vc_check(b->p, b->sh, b->len, what); }

static void copy(struct blk *d, size_t dof, const struct blk *s, size_t so, size_t len, const char *what) {
    VC_CHECK(vc_copy(d->p + dof, s->p + so, len) == 0);
    vc_sh_copy(d->sh + dof, s->sh + so, len);
    chk(d, what);
    chk(s, what);
}

int main(void) {
    const size_t P = VC_PS;
    const size_t sizes[] = {P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, 16 * P - 1, 16 * P, 16 * P + 1,
                            17 * P, 512 * P - 1, 512 * P, 512 * P + 1};
    const size_t n_sizes = sizeof sizes / sizeof sizes[0];
    unsigned long cases = 0;

    /* whole-block copies and dups of every size, then writes to the last byte */
    for (size_t i = 0; i < n_sizes; i++) {
        struct blk a = mk(sizes[i]), c = mk(sizes[i]);
        copy(&c, 0, &a, 0, a.len, "whole-block copy");
        struct blk d = {vc_dup(a.p, a.len), vc_shadow(a.len), a.len};
        VC_CHECK(d.p != NULL);
        vc_sh_copy(d.sh, a.sh, a.len);
        chk(&d, "whole-block dup");
        vc_write(a.p + a.len - 1, a.sh + a.len - 1, 1, 99); /* the last byte, after both copies */
        vc_write(d.p, d.sh, 1, 98);
        chk(&a, "source after writing its last byte");
        chk(&c, "copy after the source's last byte changed");
        chk(&d, "dup after writing its first byte");
        /* zero-length copies change nothing, at the start and one past the end */
        VC_CHECK(vc_copy(c.p, a.p, 0) == 0);
        VC_CHECK(vc_copy(c.p + c.len, a.p + a.len, 0) == 0);
        chk(&c, "after zero-length copies");
        /* free either side first */
        if (i % 2) {
            rm(&a);
            chk(&c, "copy after its source was freed");
            chk(&d, "dup after its source was freed");
        } else {
            rm(&d);
            rm(&c);
            chk(&a, "source after its copies were freed");
        }
        if (i % 2) {
            rm(&c);
            rm(&d);
        } else {
            rm(&a);
        }
        cases++;
    }

    /* offsets and lengths around page boundaries, congruent and not */
    const size_t offs[] = {0, 1, P - 1, P, P + 1, 3 * P};
    const size_t lens[] = {1, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, 5 * P + 3};
    struct blk s = mk(24 * P + 9), d = mk(24 * P + 9);
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        for (size_t j = 0; j < sizeof offs / sizeof offs[0]; j++)
            for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
                copy(&d, offs[j], &s, offs[i], lens[k], "copy at boundary offsets");
                vc_write(s.p + offs[i], s.sh + offs[i], 1, seed++); /* the source's first copied byte */
                chk(&d, "destination after its source's first byte changed");
                cases++;
            }
    /* copies ending exactly at the end of both blocks, and starting at their starts */
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        copy(&d, d.len - lens[k], &s, s.len - lens[k], lens[k], "copy ending at the blocks' end");
        copy(&d, 0, &s, 0, lens[k], "copy at the blocks' start");
        copy(&d, d.len - lens[k], &s, 0, lens[k], "copy from a start to an end");
        cases += 3;
    }
    /* dups of ranges starting inside a block (page aligned or not) up to its end */
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        size_t len = s.len - offs[i];
        unsigned char *p = vc_dup(s.p + offs[i], len);
        VC_CHECK(p != NULL);
        vc_check(p, s.sh + offs[i], len, "dup of a range inside a block");
        p[len - 1] ^= 0xff;
        chk(&s, "source after its range dup was written");
        vc_free(p);
        cases++;
    }
    rm(&s);
    rm(&d);
    vc_free(NULL);
    char detail[100];
    snprintf(detail, sizeof detail, "%lu boundary cases", cases);
    return vc_done("boundaries", detail);
}
