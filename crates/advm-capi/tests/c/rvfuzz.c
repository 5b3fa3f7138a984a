/* Randomized sequences through the C API, mirrored on malloc'd oracles and compared
 * byte for byte after every step: advm_alloc/advm_dup/advm_vcopy/advm_free blocks
 * written through their pointers, advm_move/advm_swap/batches on a plain mmap heap
 * (slides, adjacent ranges, 2 MiB-aligned and straddling ranges) and between heap and
 * blocks; three threads at once, then a fork in the middle (the child checks and
 * rewrites its own view, the parent's is unchanged); open fds and mappings do not
 * grow. ADVM_RVFUZZ_CASES=N runs N rounds (default 2). */
#define _GNU_SOURCE
#include <advm.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MIB ((size_t)1 << 20)
#define HEAP (8 * MIB)
#define MAXB 10

static size_t ps;

struct rng { uint64_t s; };
static uint64_t next(struct rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
static size_t below(struct rng *r, size_t n) { return (size_t)(next(r) % n); }
static void fill(struct rng *r, unsigned char *a, unsigned char *b, size_t n) {
    uint64_t x = next(r);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = (unsigned char)((x + i) * 0x9E3779B9u >> 13);
}

struct block { unsigned char *p, *want; size_t len; };
struct fuzz {
    struct rng r;
    unsigned long seed, step;
    struct block b[MAXB];
    int n;
    unsigned char *heap, *hwant;
};

#define FAIL(f, ...)                                                                 \
    do {                                                                             \
        fprintf(stderr, "seed %lu step %lu: ", (f)->seed, (f)->step);               \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
        exit(1);                                                                     \
    } while (0)

static void check(struct fuzz *f) {
    for (int i = 0; i < f->n; i++)
        if (memcmp(f->b[i].p, f->b[i].want, f->b[i].len))
            for (size_t k = 0; k < f->b[i].len; k++)
                if (f->b[i].p[k] != f->b[i].want[k])
                    FAIL(f, "block %d (%zu bytes) offset %#zx: %d, want %d", i, f->b[i].len, k,
                         f->b[i].p[k], f->b[i].want[k]);
    if (memcmp(f->heap, f->hwant, HEAP))
        for (size_t k = 0; k < HEAP; k++)
            if (f->heap[k] != f->hwant[k])
                FAIL(f, "heap offset %#zx: %d, want %d", k, f->heap[k], f->hwant[k]);
}

static size_t block_len(struct fuzz *f) {
    size_t pages = below(&f->r, 10) == 0 ? 2 * MIB / ps + below(&f->r, 32) : 1 + below(&f->r, 40);
    return pages * ps;
}

static void add(struct fuzz *f, unsigned char *p, size_t len) {
    CHECK(p != NULL);
    unsigned char *w = calloc(1, len);
    CHECK(w != NULL);
    f->b[f->n++] = (struct block){p, w, len};
}

static void drop(struct fuzz *f, int i) {
    advm_free(f->b[i].p);
    free(f->b[i].want);
    f->b[i] = f->b[--f->n];
}

/* Where a move left its source unspecified (src minus dst), write fresh bytes. */
static void refill_vacated(struct fuzz *f, unsigned char *dst, unsigned char *src, size_t len,
                           unsigned char *wsrc) {
    for (size_t k = 0; k < len; k++)
        if (!(src + k >= dst && src + k < dst + len)) {
            size_t j = k;
            while (j < len && !(src + j >= dst && src + j < dst + len)) j++;
            fill(&f->r, src + k, wsrc + k, j - k);
            k = j;
        }
}

static size_t heap_len(struct fuzz *f) {
    switch (below(&f->r, 6)) {
    case 0: return 2 * MIB;
    case 1: return 2 * MIB + ps * below(&f->r, 3);
    case 2: return ps * (1 + below(&f->r, 512));
    default: return ps * (1 + below(&f->r, 40));
    }
}

static size_t heap_start(struct fuzz *f, size_t len) {
    size_t max = HEAP - len;
    if (below(&f->r, 4) == 0) {
        size_t s = below(&f->r, max / (2 * MIB) + 1) * 2 * MIB;
        return s > max ? max / ps * ps : s;
    }
    if (below(&f->r, 3) == 0) { /* straddling a 2 MiB boundary */
        size_t b = 2 * MIB * (1 + below(&f->r, HEAP / (2 * MIB) - 1));
        size_t back = ps * (1 + below(&f->r, len / ps));
        size_t s = b > back ? b - back : 0;
        return (s > max ? max : s) / ps * ps;
    }
    return below(&f->r, max / ps + 1) * ps;
}

static void heap_move(struct fuzz *f, struct advm_batch *bt) {
    size_t len = heap_len(f), src = heap_start(f, len), dst;
    size_t d = ps * (1 + below(&f->r, len / ps + 1));
    switch (below(&f->r, 3)) {
    case 0: dst = src + len + d <= HEAP ? src + d : (src >= d ? src - d : 0); break; /* slide */
    case 1: dst = src + 2 * len <= HEAP ? src + len : heap_start(f, len); break;   /* adjacent */
    default: dst = heap_start(f, len);
    }
    int rc = bt ? advm_batch_move(bt, f->heap + dst, f->heap + src, len)
                : advm_move(f->heap + dst, f->heap + src, len);
    if (rc) FAIL(f, "move %#zx <- %#zx +%#zx: %s", dst, src, len, strerror(-rc));
    if (bt) {
        struct advm_remap_stats st;
        rc = advm_batch_run(bt, &st);
        if (rc) FAIL(f, "batch move %#zx <- %#zx +%#zx: %s", dst, src, len, strerror(-rc));
    }
    memmove(f->hwant + dst, f->hwant + src, len);
    refill_vacated(f, f->heap + dst, f->heap + src, len, f->hwant + src);
}

/* The oracle of a swap: [a, a+len) and [b, b+len) of `want` trade places. */
static void swap_want(unsigned char *want, size_t a, size_t b, size_t len) {
    unsigned char *t = malloc(len);
    CHECK(t != NULL);
    memcpy(t, want + a, len);
    memcpy(want + a, want + b, len);
    memcpy(want + b, t, len);
    free(t);
}

static void heap_swap(struct fuzz *f, int batch) {
    size_t len = heap_len(f);
    if (2 * len > HEAP) return;
    size_t a = heap_start(f, len), b = heap_start(f, len);
    if (a < b + len && b < a + len) {
        /* Overlapping: refused with EINVAL, memory unchanged. */
        if (a == b) return;
        CHECK(advm_swap(f->heap + a, f->heap + b, len) == -EINVAL);
        return;
    }
    int rc;
    if (batch) {
        struct advm_batch *bt = advm_batch_new();
        CHECK(bt != NULL);
        CHECK(advm_batch_swap(bt, f->heap + a, f->heap + b, len) == 0);
        /* and a move after it in the same batch, continuing in order */
        size_t l2 = ps * (1 + below(&f->r, 8)), s2 = heap_start(f, l2), d2 = heap_start(f, l2);
        CHECK(advm_batch_move(bt, f->heap + d2, f->heap + s2, l2) == 0);
        struct advm_remap_stats st;
        rc = advm_batch_run(bt, &st);
        advm_batch_free(bt);
        if (rc) FAIL(f, "batch swap+move: %s", strerror(-rc));
        swap_want(f->hwant, a, b, len);
        memmove(f->hwant + d2, f->hwant + s2, l2);
        refill_vacated(f, f->heap + d2, f->heap + s2, l2, f->hwant + s2);
        return;
    }
    rc = advm_swap(f->heap + a, f->heap + b, len);
    if (rc) FAIL(f, "swap %#zx <-> %#zx +%#zx: %s", a, b, len, strerror(-rc));
    swap_want(f->hwant, a, b, len);
}

static void step(struct fuzz *f) {
    f->step++;
    if (f->n < 2) {
        size_t len = block_len(f);
        add(f, advm_alloc(len), len);
        return;
    }
    int i = (int)below(&f->r, (size_t)f->n), j = (int)below(&f->r, (size_t)f->n);
    struct block *s = &f->b[i], *d = &f->b[j];
    size_t op = below(&f->r, 100);
    if (op < 8 && f->n < MAXB) {
        size_t len = block_len(f);
        add(f, advm_alloc(len), len);
    } else if (op < 25) { /* a store through the pointer, as a program makes */
        size_t len = 1 + below(&f->r, 3 * ps);
        if (len > s->len) len = s->len;
        size_t off = below(&f->r, s->len - len + 1);
        fill(&f->r, s->p + off, s->want + off, len);
    } else if (op < 35 && f->n < MAXB) {
        size_t len = 1 + below(&f->r, s->len), off = below(&f->r, s->len - len + 1);
        unsigned char *p = advm_dup(s->p + off, len);
        if (!p) FAIL(f, "advm_dup: %s", strerror(errno));
        size_t rounded = (len + ps - 1) / ps * ps;
        add(f, p, rounded);
        memcpy(f->b[f->n - 1].want, f->b[i].want + off, len);
    } else if (op < 55) {
        size_t len = 1 + below(&f->r, s->len < d->len ? s->len : d->len);
        size_t soff = below(&f->r, s->len - len + 1), doff = below(&f->r, d->len - len + 1);
        if (below(&f->r, 3)) doff = doff / ps * ps + soff % ps; /* congruent: pages shared */
        if (doff + len > d->len) return;
        unsigned char *sp = s->p + soff, *dp = d->p + doff;
        int rc = advm_vcopy(dp, sp, len);
        if (i == j && sp < dp + len && dp < sp + len) {
            if (rc != -EINVAL) FAIL(f, "overlapping advm_vcopy returned %d, not -EINVAL", rc);
            return;
        }
        if (rc) FAIL(f, "advm_vcopy: %s", strerror(-rc));
        memcpy(d->want + doff, s->want + soff, len);
    } else if (op < 63) { /* advm_move between blocks: done by advm_vcopy */
        size_t len = ps * (1 + below(&f->r, (s->len < d->len ? s->len : d->len) / ps));
        size_t soff = below(&f->r, (s->len - len) / ps + 1) * ps, doff = below(&f->r, (d->len - len) / ps + 1) * ps;
        if (i == j && soff < doff + len && doff < soff + len) return;
        int rc = advm_move(d->p + doff, s->p + soff, len);
        if (rc) FAIL(f, "advm_move between blocks: %s", strerror(-rc));
        memcpy(d->want + doff, s->want + soff, len);
        refill_vacated(f, d->p + doff, s->p + soff, len, s->want + soff);
    } else if (op < 68) { /* between a block and the heap, either way */
        size_t len = ps * (1 + below(&f->r, s->len / ps)), soff = below(&f->r, (s->len - len) / ps + 1) * ps;
        size_t h = heap_start(f, len);
        int rc;
        size_t how = below(&f->r, 4);
        if (how == 0) {
            rc = advm_move(f->heap + h, s->p + soff, len);
            memcpy(f->hwant + h, s->want + soff, len);
            if (!rc) refill_vacated(f, f->heap + h, s->p + soff, len, s->want + soff);
        } else if (how == 1) {
            rc = advm_move(s->p + soff, f->heap + h, len);
            memcpy(s->want + soff, f->hwant + h, len);
            if (!rc) refill_vacated(f, s->p + soff, f->heap + h, len, f->hwant + h);
        } else if (how == 2) { /* one batch: heap to block, then block to block, then a heap slide */
            size_t l2 = ps * (1 + below(&f->r, (s->len < d->len ? s->len : d->len) / ps));
            size_t s2 = below(&f->r, (s->len - l2) / ps + 1) * ps, d2 = below(&f->r, (d->len - l2) / ps + 1) * ps;
            if (i == j && s2 < d2 + l2 && d2 < s2 + l2) return;
            size_t h3 = heap_start(f, ps);
            size_t d3 = h3 + ps <= HEAP - ps ? h3 + ps : h3 - ps;
            /* The first move leaves its heap source unspecified: the slide stays clear. */
            size_t lo = h3 < d3 ? h3 : d3;
            if (lo < h + len && h < lo + 2 * ps) return;
            struct advm_batch *bt = advm_batch_new();
            CHECK(bt != NULL);
            CHECK(advm_batch_move(bt, s->p + soff, f->heap + h, len) == 0);
            CHECK(advm_batch_move(bt, d->p + d2, s->p + s2, l2) == 0);
            CHECK(advm_batch_move(bt, f->heap + d3, f->heap + h3, ps) == 0);
            struct advm_remap_stats st;
            rc = advm_batch_run(bt, &st);
            advm_batch_free(bt);
            if (rc) FAIL(f, "mixed batch: %s", strerror(-rc));
            memcpy(s->want + soff, f->hwant + h, len);
            refill_vacated(f, s->p + soff, f->heap + h, len, f->hwant + h);
            memcpy(d->want + d2, s->want + s2, l2);
            refill_vacated(f, d->p + d2, s->p + s2, l2, s->want + s2);
            memcpy(f->hwant + d3, f->hwant + h3, ps);
            refill_vacated(f, f->heap + d3, f->heap + h3, ps, f->hwant + h3);
        } else {
            rc = advm_swap(f->heap + h, s->p + soff, len);
            unsigned char *t = malloc(len);
            CHECK(t != NULL);
            memcpy(t, f->hwant + h, len);
            memcpy(f->hwant + h, s->want + soff, len);
            memcpy(s->want + soff, t, len);
            free(t);
        }
        if (rc) FAIL(f, "block/heap operation: %s", strerror(-rc));
    } else if (op < 75) {
        drop(f, i);
    } else if (op < 83) {
        heap_move(f, NULL);
    } else if (op < 88) {
        struct advm_batch *bt = advm_batch_new();
        CHECK(bt != NULL);
        heap_move(f, bt);
        advm_batch_free(bt);
    } else if (op < 95) {
        heap_swap(f, 0);
    } else {
        heap_swap(f, 1);
    }
}

static void init(struct fuzz *f, unsigned long seed) {
    memset(f, 0, sizeof *f);
    f->seed = seed;
    f->r.s = seed * 0x9E3779B97F4A7C15ULL | 1;
    f->heap = mmap(NULL, HEAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(f->heap != MAP_FAILED);
    f->hwant = malloc(HEAP);
    CHECK(f->hwant != NULL);
    fill(&f->r, f->heap, f->hwant, HEAP);
}

static void finish(struct fuzz *f) {
    while (f->n) drop(f, 0);
    munmap(f->heap, HEAP);
    free(f->hwant);
}

static void run(struct fuzz *f, int steps) {
    for (int k = 0; k < steps; k++) {
        step(f);
        check(f);
    }
}

static void *thread_main(void *arg) {
    struct fuzz f;
    init(&f, (unsigned long)(uintptr_t)arg);
    run(&f, 40);
    finish(&f);
    return NULL;
}

static int count(const char *what) {
    int n = 0;
    if (what[0] == 'f') {
        DIR *d = opendir("/proc/self/fd");
        CHECK(d != NULL);
        while (readdir(d)) n++;
        closedir(d);
    } else {
        FILE *m = fopen("/proc/self/maps", "r");
        CHECK(m != NULL);
        for (int c; (c = fgetc(m)) != EOF;) n += c == '\n';
        fclose(m);
    }
    return n;
}

int main(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    const char *env = getenv("ADVM_RVFUZZ_CASES");
    unsigned long rounds = env ? strtoul(env, NULL, 10) : 2;
    int fd0 = -1, maps0 = -1;
    for (unsigned long round = 1; round <= rounds; round++) {
        struct fuzz f;
        init(&f, round);
        run(&f, 60);

        pthread_t t[3];
        for (uintptr_t k = 0; k < 3; k++)
            CHECK(pthread_create(&t[k], NULL, thread_main, (void *)(round * 16 + k + 1)) == 0);
        run(&f, 20);
        pid_t child = fork(); /* while the threads run their own sequences */
        CHECK(child >= 0);
        if (child == 0) {
            check(&f);
            f.seed += 1000000;
            run(&f, 30);
            for (int i = 0; i < f.n; i++) memset(f.b[i].p, 0xee, f.b[i].len);
            memset(f.heap, 0xee, HEAP);
            _exit(0);
        }
        int status;
        CHECK(waitpid(child, &status, 0) == child);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) FAIL(&f, "child failed: status %#x", status);
        check(&f);
        run(&f, 20);
        for (int k = 0; k < 3; k++) CHECK(pthread_join(t[k], NULL) == 0);
        finish(&f);
        if (round == 1) fd0 = count("fd"), maps0 = count("maps");
    }
    int fd1 = count("fd"), maps1 = count("maps");
    /* glibc's per-thread malloc arenas and cached thread stacks come and go: a few
     * mappings either way, whatever the number of rounds; a leak grows with it. */
    if (rounds > 1 && (fd1 > fd0 || maps1 > maps0 + 16)) {
        fprintf(stderr, "grew over %lu rounds: fds %d -> %d, mappings %d -> %d\n", rounds, fd0, fd1, maps0, maps1);
        return 1;
    }
    printf("rvfuzz: %lu rounds (4 sequences and a fork each), fds %d -> %d, mappings %d -> %d\n", rounds, fd0,
           fd1, maps0, maps1);
    return 0;
}
