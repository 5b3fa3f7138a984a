/* Large memcpy/memmove (the shim's virtual-copy path): whole blocks, into the middle of
 * a block, unaligned with equal and unequal page offsets, overlapping memmove, chains of
 * copies written on every side afterwards (each copy must stay independent both ways),
 * sources that are read-only, file-backed or the program's own mmap, and copies across
 * fork. Every result is checked against a shadow kept in plain mmap'd memory. */
#include "sweep.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define MB (1u << 20)

static char *shadow(size_t n) {
    char *s = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(s != MAP_FAILED);
    return s;
}

/* Copies with a byte loop (the oracle: never the shim's memcpy). */
static void slow_move(char *d, const char *s, size_t n) {
    volatile char *dd = d;
    const volatile char *ss = s;
    if (d < s)
        for (size_t i = 0; i < n; i++) dd[i] = ss[i];
    else
        for (size_t i = n; i > 0; i--) dd[i - 1] = ss[i - 1];
}

static int same(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* Writes one byte in a few pages of p (and of its shadow). */
static void poke(char *p, char *sh, size_t n, unsigned seed) {
    for (size_t off = (seed * 4099) % 4096; off < n; off += 37 * 4096 + seed) p[off] ^= (char)(seed | 1), sh[off] ^= (char)(seed | 1);
}


static void write_first(void *p) { *(volatile char *)p = 1; }
static char *ro_dst, *ro_src;
static void copy_into_ro(void *p) { memcpy(ro_dst, p, MB); }

int main(void) {
    size_t n = 2 * MB;
    char *a = malloc(n), *b = malloc(n), *c = malloc(n);
    char *sa = shadow(n), *sb = shadow(n), *sc = shadow(n);
    CHECK(a && b && c);
    fill(a, n, 1), fill(sa, n, 1);
    fill(b, n, 2), fill(sb, n, 2);
    fill(c, n, 3), fill(sc, n, 3);

    /* whole block, then the copy of the copy; written on every side */
    memcpy(b, a, n), slow_move(sb, sa, n);
    memcpy(c, b, n), slow_move(sc, sb, n);
    poke(a, sa, n, 1), poke(b, sb, n, 2), poke(c, sc, n, 3);
    CHECK(same(a, sa, n) && same(b, sb, n) && same(c, sc, n));
    printf("chain: %016llx %016llx %016llx\n", (unsigned long long)sum(a, n), (unsigned long long)sum(b, n),
           (unsigned long long)sum(c, n));
    /* back the other way, over blocks that are copies already */
    memcpy(a, c, n), slow_move(sa, sc, n);
    poke(c, sc, n, 4);
    memmove(b, a, n), slow_move(sb, sa, n);
    poke(a, sa, n, 5), poke(b, sb, n, 6);
    CHECK(same(a, sa, n) && same(b, sb, n) && same(c, sc, n));

    /* into the middle of a block, equal and unequal page offsets, partial pages */
    size_t offs[][3] = {{8192, 0, MB}, {4096 * 5 + 123, 123, MB + 77}, {100, 0, MB}, {0, 4095, MB + 1},
                        {4096 * 3 + 4095, 4095, MB + 5}, {1, 1, n - 1}, {0, 0, n}, {4096, 4096, n - 8192}};
    for (unsigned i = 0; i < sizeof offs / sizeof *offs; i++) {
        size_t d = offs[i][0], s = offs[i][1], len = offs[i][2];
        memcpy(b + d, a + s, len), slow_move(sb + d, sa + s, len);
        poke(b, sb, n, 7 + i), poke(a, sa, n, 17 + i);
        CHECK(same(a, sa, n) && same(b, sb, n));
        printf("middle %u: %016llx\n", i, (unsigned long long)sum(b, n));
    }

    /* overlapping memmove inside one block, both directions, page and odd distances */
    size_t dist[] = {4096, 8192, 1, 4095, 65536, MB, MB + 4096};
    for (unsigned i = 0; i < sizeof dist / sizeof *dist; i++) {
        size_t k = dist[i], len = n - k;
        memmove(a + k, a, len), slow_move(sa + k, sa, len);
        CHECK(same(a, sa, n));
        memmove(a, a + k, len), slow_move(sa, sa + k, len);
        CHECK(same(a, sa, n));
        poke(a, sa, n, 30 + i);
        printf("overlap %zu: %016llx\n", k, (unsigned long long)sum(a, n));
    }

    /* the source's pages written after the copy while a third copy maps them */
    memcpy(c, a, n), slow_move(sc, sa, n);
    for (size_t off = 0; off < n; off += 4096) a[off] = 'x', sa[off] = 'x';
    memcpy(b, a, n), slow_move(sb, sa, n);
    for (size_t off = 2048; off < n; off += 4096) c[off] = 'y', sc[off] = 'y';
    CHECK(same(a, sa, n) && same(b, sb, n) && same(c, sc, n));

    /* sources the program mapped itself: anonymous, file-backed private and shared */
    char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    fill(m, n, 40);
    memcpy(b, m, n);
    CHECK(holds(b, n, 40, 0));
    memcpy(m, a, n);
    CHECK(same(m, sa, n));
    char path[] = "/tmp/advm-sweep-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK(ftruncate(fd, n) == 0);
    char *fs = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(fs != MAP_FAILED);
    memcpy(fs, c, n); /* into a file */
    char *fp = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(fp != MAP_FAILED);
    memcpy(b, fp, n); /* from a read-only file mapping */
    CHECK(same(b, sc, n));
    char *back = malloc(n);
    CHECK(back && pread(fd, back, n, 0) == (ssize_t)n && same(back, sc, n));
    free(back);
    munmap(fp, n), munmap(fs, n), munmap(m, n), close(fd);

    /* a block made read-only: still a source; writing it or copying into it faults */
    char *ro = valloc(MB);
    CHECK(ro);
    fill(ro, MB, 50);
    CHECK(mprotect(ro, MB, PROT_READ) == 0);
    memcpy(b, ro, MB);
    CHECK(holds(b, MB, 50, 0));
    b[5] = 0;
    CHECK(holds(ro, MB, 50, 0));
    in_child("write to a read-only source after the copy", write_first, ro);
    ro_dst = ro;
    in_child("copy into a read-only block", copy_into_ro, a);
    CHECK(holds(ro, MB, 50, 0));
    ro_src = ro;
    CHECK(mprotect(ro, MB, PROT_READ | PROT_WRITE) == 0);
    free(ro);

    /* across fork: the child writes both sides of a copy, the parent must not see it */
    memcpy(b, a, n), slow_move(sb, sa, n);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        CHECK(same(a, sa, n) && same(b, sb, n));
        memset(a, 'c', n / 2);
        memset(b + n / 2, 'c', n / 2);
        memcpy(c, b, n);
        CHECK(c[0] == sa[0] && c[n - 1] == 'c');
        char *d = malloc(n);
        memcpy(d, a, n);
        CHECK(d[0] == 'c');
        free(d), free(a), free(b);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(same(a, sa, n) && same(b, sb, n));
    poke(a, sa, n, 60), poke(b, sb, n, 61);
    CHECK(same(a, sa, n) && same(b, sb, n));
    printf("after fork: %016llx %016llx\n", (unsigned long long)sum(a, n), (unsigned long long)sum(b, n));
    free(a), free(b), free(c);
    printf("done\n");
    return 0;
}
