/* The VMA budget. Phase 1: 6000 copies of 1-6 page ranges (page-congruent, some not
 * page aligned) from three sources to random places in four of eight 2 MiB blocks, with
 * scattered writes to both sides, so that the blocks become thousands of mappings.
 * Phase 2: the program itself takes all but about 1500 of the process's VMAs
 * (vm.max_map_count), then makes 3000 more copies into all eight blocks (the four
 * untouched ones would need about 2000 more mappings): a backend near the limit must fall
 * back to copying bytes, never fail a copy or corrupt a block. After each copy the
 * ranges it touched are checked; every block is checked every 250 copies and at the
 * end of each phase (all of it, after each operation, would take minutes here). */
#include <fcntl.h>
#include "vc.h"

#define NS 3
#define ND 8 /* phase 1 fragments the first four, phase 2 all eight */
#define SRC_PAGES 64
#define DST_PAGES 512

static struct {
    unsigned char *p, *sh;
    size_t len;
} b[NS + ND];
static uint64_t rs = 4242;
static size_t rnd(size_t n) { return (size_t)(vc_rand(&rs) % n); }

static long vmas(void) {
    int fd = open("/proc/self/maps", O_RDONLY);
    VC_CHECK(fd >= 0);
    char buf[65536];
    long lines = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++) lines += buf[i] == '\n';
    close(fd);
    return lines;
}

static void check_all(const char *when) {
    for (int i = 0; i < NS + ND; i++) vc_check(b[i].p, b[i].sh, b[i].len, when);
}

static void copies(int n, int ndst, const char *phase) {
    for (int k = 0; k < n; k++) {
        int s = (int)rnd(NS), d = NS + (int)rnd((size_t)ndst);
        size_t pages = 1 + rnd(6), sub = rnd(4) ? 0 : rnd(VC_PS);
        size_t so = rnd(SRC_PAGES - pages) * VC_PS + sub, dof = rnd(DST_PAGES - pages) * VC_PS + sub;
        size_t len = pages * VC_PS - sub;
        int r = vc_copy(b[d].p + dof, b[s].p + so, len);
        if (r != 0) {
            fprintf(stderr, "[%s] vma_budget: %s copy %d failed: %d (%ld VMAs)\n", VC_BACKEND, phase, k, r, vmas());
            exit(1);
        }
        vc_sh_copy(b[d].sh + dof, b[s].sh + so, len);
        vc_check(b[d].p + dof, b[d].sh + dof, len, phase);
        if (k % 3 == 0) { /* a scattered write to a source or a destination */
            int i = rnd(2) ? s : d;
            size_t off = rnd(b[i].len - 64);
            vc_write(b[i].p + off, b[i].sh + off, 1 + rnd(64), vc_rand(&rs));
        }
        if (k % 250 == 249) check_all(phase);
    }
    check_all(phase);
}

int main(void) {
    for (int i = 0; i < NS + ND; i++) {
        b[i].len = (i < NS ? SRC_PAGES : DST_PAGES) * VC_PS;
        b[i].p = vc_alloc(b[i].len);
        VC_CHECK(b[i].p != NULL);
        b[i].sh = vc_shadow(b[i].len);
        vc_write(b[i].p, b[i].sh, b[i].len, (uint64_t)i + 1);
    }
    long before = vmas();
    copies(6000, ND / 2, "phase 1 (many copies)");
    long after1 = vmas();

    /* phase 2: the program's own mappings take the VMAs the arena may have counted on */
    long max = 65530;
    int fd = open("/proc/sys/vm/max_map_count", O_RDONLY);
    if (fd >= 0) {
        char t[32] = {0};
        if (read(fd, t, sizeof t - 1) > 0) max = strtol(t, NULL, 10);
        close(fd);
    }
    long pairs = (max - after1 - 1500) / 2;
    unsigned char *eat = NULL;
    size_t eat_len = 0;
    if (pairs > 0) {
        eat_len = (size_t)pairs * 2 * VC_PS;
        eat = mmap(NULL, eat_len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        VC_CHECK(eat != MAP_FAILED);
        for (long i = 0; i < pairs; i++) VC_CHECK(mprotect(eat + (size_t)i * 2 * VC_PS, VC_PS, PROT_NONE) == 0);
    }
    long eaten = vmas();
    copies(3000, ND, "phase 2 (near vm.max_map_count)");
    long after2 = vmas();
    if (eat) munmap(eat, eat_len);
    check_all("after the program released its mappings");
    for (int i = 0; i < NS + ND; i++) {
        vc_free(b[i].p);
        vc_unshadow(b[i].sh, b[i].len);
    }
    char detail[200];
    snprintf(detail, sizeof detail,
             "9000 copies; process VMAs %ld at start, %ld after phase 1, %ld of max %ld with the program's own, "
             "%ld after phase 2",
             before, after1, eaten, max, after2);
    return vc_done("vma_budget", detail);
}
