/* Memfd pages that no view reads any more are given back (run by tests/c_programs.rs).
 *
 * Virtual copies written on both sides, partially (one byte per page), on one side
 * only, under a read-only mprotect, with a third view left unwritten; then malloc_trim
 * (which trims at once). Every byte of every block is checked against the program's
 * own record after each step, and after MADV_DONTNEED of a trimmed and an untrimmed
 * page (zeros or the bytes of the copy, never the other side's), across a fork (the
 * child checks and writes; the parent sees none of it) and while a child lives (no
 * trim then); and, first, that a dropped page of a trimmed copy never shows another
 * block's bytes after the memfd generations turned over (slot_reuse). With
 * TRIM_EXPECT=1 (vcopy mode) it also checks what the shim's memfds hold (st_blocks):
 * down by exactly the pages both of whose views were written. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "checks.h"

#define PAGES 256
static size_t ps;
static int expect;

/* Pages the shim's memfds hold (every generation's). Reads /proc/self/fd with
 * getdents64 into the stack: opendir's buffer would be an arena block of its own. */
static long memfd_pages(void) {
    long bytes = 0;
    char buf[4096];
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(dir >= 0, "open /proc/self/fd");
    long n;
    while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long at = 0; at < n;) {
            struct dirent64 *e = (struct dirent64 *)(buf + at);
            at += e->d_reclen;
            char path[64], link[256];
            snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
            ssize_t k = readlink(path, link, sizeof link - 1);
            if (k <= 0) continue;
            link[k] = 0;
            struct stat st;
            if (strstr(link, "memfd:advm-arena") && fstat(atoi(e->d_name), &st) == 0) bytes += (long)st.st_blocks * 512;
        }
    }
    close(dir);
    return bytes / (long)ps;
}

/* A block (page aligned, for mprotect, also without the shim). */
static unsigned char *block(void) {
    unsigned char *p = aligned_alloc(ps, PAGES * ps);
    CHECK(p, "aligned_alloc");
    return p;
}

/* The program's record of a block: outside the arena, so never a copy's view. */
static unsigned char *record(void) {
    void *p = mmap(NULL, PAGES * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    return p;
}

static void fill(unsigned char *p, unsigned char *shadow, unsigned seed) {
    for (size_t i = 0; i < PAGES * ps; i++) p[i] = shadow[i] = (unsigned char)(i * 7 + seed + i / ps);
}

/* One byte written in each page of [from, to): a partial write. */
static void poke(unsigned char *p, unsigned char *shadow, size_t from, size_t to, unsigned char v) {
    for (size_t k = from; k < to; k++) p[k * ps + k % ps] = shadow[k * ps + k % ps] = v;
}

static void same(const char *what, const unsigned char *p, const unsigned char *shadow) {
    for (size_t i = 0; i < PAGES * ps; i++)
        CHECK(p[i] == shadow[i], "%s: byte %zu (page %zu) is %d, expected %d", what, i, i / ps, p[i], shadow[i]);
}

static void trimmed(const char *what, long before, long pages) {
    malloc_trim(0);
    long after = memfd_pages();
    printf("%s: memfd %ld -> %ld pages\n", what, before, after);
    if (expect) CHECK(after == before - pages, "%s: memfd held %ld pages, then %ld: expected %ld fewer", what, before, after, pages);
}

/* A generation whose only views left are detached ones, then two forks: its slot must
 * not serve the newest generation, or freeing those views released offsets the newest
 * one's detached views keep, and a copy reused them under a dropped page. First in the
 * program: the newest generation takes the lowest free slot. */
static void slot_reuse(void) {
    size_t len = PAGES * ps;
    int st;
    pid_t pid;
    unsigned char *u = block(), *w = block(), *su = record();
    fill(u, su, 5);
    memcpy(w, u, len);
    memset(u, 1, len), memset(w, 2, len), memset(su, 1, len);
    malloc_trim(0);
    for (int k = 0; k < 2; k++) {
        pid = fork();
        if (pid == 0) _exit(0);
        CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    }
    unsigned char *m = block(), *c = block(), *sm = record();
    fill(m, sm, 6);
    memcpy(c, m, len);
    memset(m, 3, len), memset(c, 4, len), memset(sm, 3, len);
    malloc_trim(0);
    free(u), free(w);
    CHECK(madvise(m, len, MADV_DONTNEED) == 0, "madvise");
    for (int k = 0; k < 4; k++) { /* fresh memfd pages: a copy writes its source there */
        unsigned char *e = block(), *e2 = block();
        memset(e, 0x77, len);
        memcpy(e2, e, len);
        free(e), free(e2);
    }
    for (size_t i = 0; i < len; i++)
        CHECK(m[i] == 0 || m[i] == (unsigned char)(i * 7 + 6 + i / ps), "dropped page of m: byte %zu is %d", i, m[i]);
    free(m), free(c);
    malloc_trim(0); /* the free table's pages, so that main counts only its own */
}

int main(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    expect = getenv("TRIM_EXPECT") && atoi(getenv("TRIM_EXPECT"));
    slot_reuse();
    size_t len = PAGES * ps;
    unsigned char *sa = record(), *sb = record(), *sx = record(), *sy = record(), *sz = record();
    unsigned char *a = block(), *b = block(), *x = block(), *y = block(), *z = block();
    fill(a, sa, 1);
    fill(x, sx, 2);
    memcpy(b, a, len);
    memcpy(sb, sa, len);
    memcpy(y, x, len);
    memcpy(z, x, len); /* three views of x's pages */
    memcpy(sy, sx, len);
    memcpy(sz, sx, len);
    long m0 = memfd_pages();
    printf("after the copies: memfd %ld pages\n", m0);
    /* a, b: pages 0-63 written on both sides, 64-127 only in a, 128-191 only in b */
    poke(a, sa, 0, 128, 11);
    poke(b, sb, 0, 64, 12);
    poke(b, sb, 128, 192, 13);
    /* x and y written whole, z not yet: every page still read by z */
    poke(x, sx, 0, PAGES, 21);
    poke(y, sy, 0, PAGES, 22);
    /* pages 32-47 of b read-only across the trim */
    CHECK(mprotect(b + 32 * ps, 16 * ps, PROT_READ) == 0, "mprotect");
    trimmed("a and b both written on 64 pages", m0, 64);
    same("a", a, sa), same("b", b, sb), same("x", x, sx), same("y", y, sy), same("z", z, sz);
    CHECK(mprotect(b + 32 * ps, 16 * ps, PROT_READ | PROT_WRITE) == 0, "mprotect back");
    poke(b, sb, 32, 48, 14);
    /* z written on half its pages: those of x, y, z all written now */
    long m1 = memfd_pages();
    poke(z, sz, 0, 128, 23);
    trimmed("z written on 128 pages", m1, 128);
    same("a", a, sa), same("b", b, sb), same("x", x, sx), same("y", y, sy), same("z", z, sz);

    /* MADV_DONTNEED: a trimmed page reads zeros (as dropped anonymous memory), an
     * untrimmed one the copy's bytes; never the other side's, also after its offset
     * could have been handed out again */
    CHECK(madvise(a + 10 * ps, ps, MADV_DONTNEED) == 0, "madvise");
    CHECK(madvise(a + 200 * ps, ps, MADV_DONTNEED) == 0, "madvise");
    for (size_t i = 0; i < ps; i++) {
        unsigned char t = a[10 * ps + i], u = a[200 * ps + i];
        CHECK(t == 0 || t == sa[10 * ps + i], "trimmed page after MADV_DONTNEED: byte %zu is %d (b has %d)", i, t,
              sb[10 * ps + i]);
        CHECK(u == 0 || u == sa[200 * ps + i], "untrimmed page after MADV_DONTNEED: byte %zu is %d", i, u);
        sa[10 * ps + i] = t, sa[200 * ps + i] = u;
    }
    free(b);
    for (int r = 0; r < 4; r++) { /* new memfd pages, written through shared and private views */
        unsigned char *p = block(), *q = block();
        memset(p, 0x5a + r, len);
        memcpy(q, p, len);
        memset(q, 0xa5, len);
        memset(p, 0x33, len);
        malloc_trim(0);
        same("a after reuse", a, sa);
        free(p), free(q);
    }
    same("a", a, sa), same("x", x, sx), same("y", y, sy), same("z", z, sz);

    /* fork: the child sees the parent's bytes and its writes stay its own */
    pid_t pid = fork();
    if (pid == 0) {
        same("a in the child", a, sa), same("x in the child", x, sx), same("z in the child", z, sz);
        poke(a, sa, 0, PAGES, 31);
        poke(z, sz, 0, PAGES, 32);
        malloc_trim(0);
        same("a in the child", a, sa), same("x in the child", x, sx), same("z in the child", z, sz);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
    same("a after the child", a, sa), same("x after the child", x, sx), same("z after the child", z, sz);

    /* a copy made after the fork (a new memfd): not trimmed while a child lives, then
     * trimmed */
    unsigned char *sp = record(), *sq = record(), *p = block(), *q = block();
    fill(p, sp, 3);
    memcpy(q, p, len);
    memcpy(sq, sp, len);
    poke(p, sp, 0, PAGES, 41);
    poke(q, sq, 0, PAGES, 42);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid = fork();
    if (pid == 0) {
        char c;
        close(fds[1]);
        ssize_t n = read(fds[0], &c, 1);
        same("p in the second child", p, sp);
        _exit(n == 0 ? 0 : 1);
    }
    close(fds[0]);
    long m2 = memfd_pages();
    trimmed("p and q written, a child alive", m2, 0);
    close(fds[1]);
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "second child failed");
    /* the fork froze p and q's memfd: copies after it are trimmed */
    unsigned char *sr = record(), *ss = record(), *r = block(), *s = block();
    fill(r, sr, 4);
    memcpy(s, r, len);
    memcpy(ss, sr, len);
    poke(r, sr, 0, PAGES, 51);
    poke(s, ss, 100, PAGES, 52);
    long m3 = memfd_pages();
    trimmed("r and s both written on 156 pages, no child", m3, PAGES - 100);
    same("a", a, sa), same("p", p, sp), same("q", q, sq), same("r", r, sr), same("s", s, ss);
    free(a), free(x), free(y), free(z), free(p), free(q), free(r), free(s);

    printf("ok\n");
    return 0;
}
