/* Stress for the shim (run by tests/c_programs.rs in every mode for a few seconds, and
 * by `advm bench shim-stress` for longer). Several threads at once copy between large
 * malloc'd blocks (whole blocks and ranges at equal and unequal page offsets), read
 * blocks other threads are copying from, write their destinations, realloc, calloc,
 * free, and fork (the child copies and checks too, then exits). Every block has a
 * shadow: a plain private mapping with the bytes it must hold, and every read is
 * checked against it. With more than one thread, thread 0 only reads shared blocks.
 *
 * Usage: stress [seconds] [threads] (default 3 s, 4 threads; also ADVM_STRESS_SECONDS).
 * Prints "ops N checks N failures N forks N" and exits 1 when a check failed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PS 4096u
#define MAXSZ (4u << 20) /* largest block; shadows are this big */
#define SHARED 6         /* blocks any thread copies from and reads */
#define OWN 3            /* blocks each thread copies into and writes */
#define MAXT 16

struct blk {
    unsigned char *p;   /* the block (malloc'd: the shim's) */
    unsigned char *sh;  /* its shadow (mmap'd: never the shim's) */
    size_t n;
};

static struct blk shared[SHARED];
static pthread_rwlock_t shared_lock[SHARED];
static atomic_ulong ops, checks, failures, forks;
static double deadline;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static unsigned char *shadow(void) {
    void *p = mmap(NULL, MAXSZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    return p;
}

/* Between 16 KiB and MAXSZ, mostly whole pages, sometimes not. */
static size_t rsize(uint64_t *s) {
    size_t n = (size_t)(4 + rnd(s) % (MAXSZ / PS - 4)) * PS;
    if (rnd(s) % 4 == 0) n -= rnd(s) % PS;
    if (rnd(s) % 3 == 0) n /= 8;
    return n < 4 * PS ? 4 * PS : n;
}

static void fail(const char *what, size_t at) {
    if (atomic_fetch_add(&failures, 1) < 5) fprintf(stderr, "stress: %s: wrong byte at %zu\n", what, at);
}

/* Checks [off, off+len) of b against its shadow. */
static void check(const struct blk *b, size_t off, size_t len, const char *what) {
    atomic_fetch_add(&checks, 1);
    if (memcmp(b->p + off, b->sh + off, len) == 0) return;
    for (size_t i = off; i < off + len; i++)
        if (b->p[i] != b->sh[i]) {
            fail(what, i);
            return;
        }
}

/* Writes a few bytes in every page of [off, off+len), block and shadow alike. */
static void scribble(struct blk *b, size_t off, size_t len, uint64_t *s) {
    unsigned char v = (unsigned char)rnd(s);
    for (size_t i = off; i < off + len; i += PS / 2 + rnd(s) % PS) b->p[i] = b->sh[i] = v++;
}

/* Fills a whole new block (a new pattern, so copies must move freshly written pages). */
static void fill_all(struct blk *b, uint64_t *s) {
    unsigned seed = (unsigned)rnd(s);
    for (size_t i = 0; i < b->n; i++) b->sh[i] = (unsigned char)(i * 31 + seed + i / PS);
    memcpy(b->p, b->sh, b->n);
}

static void new_block(struct blk *b, size_t n, uint64_t *s) {
    b->n = n;
    b->p = rnd(s) % 2 ? malloc(n) : calloc(1, n);
    if (!b->p) abort();
    fill_all(b, s);
}

/* Copies a range of src into dst at the same or another offset: memcpy or memmove,
 * whole pages (virtual under cow) or not. */
static void copy_into(struct blk *d, const struct blk *src, uint64_t *s, const char *what) {
    size_t n = d->n < src->n ? d->n : src->n, so = 0, doff = 0;
    switch (rnd(s) % 4) {
    case 0: break; /* from the start: equal page offsets */
    case 1: so = doff = (rnd(s) % (n / 2)) & ~(size_t)63; n -= so; break; /* same offset inside pages */
    case 2: so = rnd(s) % (n / 4); n -= so; break; /* different page offsets: a plain copy */
    default: doff = (rnd(s) % (n / 4 / PS)) * PS; so = doff + PS; n = n - so > PS ? n - so - rnd(s) % PS : n - so; break;
    }
    if (rnd(s) % 2) memcpy(d->p + doff, src->p + so, n);
    else memmove(d->p + doff, src->p + so, n);
    memcpy(d->sh + doff, src->sh + so, n);
    check(d, doff, n, what);
}

/* Takes the shared blocks' read locks (fork: no writer inside a block in the child). */
static void lock_all_shared(void) {
    for (int i = 0; i < SHARED; i++) pthread_rwlock_rdlock(&shared_lock[i]);
}
static void unlock_all_shared(void) {
    for (int i = 0; i < SHARED; i++) pthread_rwlock_unlock(&shared_lock[i]);
}

/* In the child of a fork: every block as at the fork; copies, writes and frees work. */
static int child(struct blk *own, uint64_t s) {
    for (int i = 0; i < SHARED; i++) check(&shared[i], 0, shared[i].n, "child: shared block");
    for (int i = 0; i < OWN; i++) check(&own[i], 0, own[i].n, "child: own block");
    for (int r = 0; r < 6; r++) {
        struct blk c;
        c.sh = shadow();
        const struct blk *src = &shared[rnd(&s) % SHARED];
        new_block(&c, src->n, &s);
        copy_into(&c, src, &s, "child: copy");
        scribble(&c, 0, c.n, &s);
        check(&c, 0, c.n, "child: written copy");
        check(src, 0, src->n, "child: source after copy");
        copy_into(&own[r % OWN], &c, &s, "child: copy into own");
        free(c.p);
        munmap(c.sh, MAXSZ);
    }
    return atomic_load(&failures) ? 1 : 0;
}

static void do_fork(struct blk *own, uint64_t *s) {
    lock_all_shared();
    pid_t pid = fork();
    if (pid == 0) _exit(child(own, rnd(s)));
    unlock_all_shared();
    if (pid < 0) return;
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("fork child", 0);
    atomic_fetch_add(&forks, 1);
    for (int i = 0; i < OWN; i++) check(&own[i], 0, own[i].n, "parent's block after fork");
}

/* Thread 0 only reads the shared blocks while the others copy from them: one byte a page
 * round and round (where a copy remaps the block, a short window), then every byte. */
static void *reader(void *arg) {
    uint64_t s = 0x2545f4914f6cdd1dull + (uintptr_t)arg;
    while (now() < deadline) {
        int k = (int)(rnd(&s) % SHARED);
        const struct blk *b = &shared[k];
        pthread_rwlock_rdlock(&shared_lock[k]);
        for (int sweep = 0; sweep < 50; sweep++) {
            atomic_fetch_add(&checks, 1);
            for (size_t i = (size_t)sweep * 64 % PS; i < b->n; i += PS)
                if (((const volatile unsigned char *)b->p)[i] != b->sh[i]) fail("reader: shared block", i);
        }
        check(b, 0, b->n, "reader: shared block");
        pthread_rwlock_unlock(&shared_lock[k]);
        atomic_fetch_add(&ops, 1);
    }
    return NULL;
}

static void *worker(void *arg) {
    uint64_t s = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
    int id = (int)(uintptr_t)arg;
    struct blk own[OWN];
    for (int i = 0; i < OWN; i++) {
        own[i].sh = shadow();
        new_block(&own[i], rsize(&s), &s);
    }
    double next_fork = now() + 0.05 + 0.02 * id;
    while (now() < deadline) {
        struct blk *o = &own[rnd(&s) % OWN];
        int k = (int)(rnd(&s) % SHARED);
        struct blk *sb = &shared[k];
        unsigned op = (unsigned)(rnd(&s) % 100);
        if (op < 30) { /* copy from a shared block (others may be reading it) */
            pthread_rwlock_rdlock(&shared_lock[k]);
            copy_into(o, sb, &s, "copy from a shared block");
            check(sb, 0, sb->n, "shared block after a copy from it");
            pthread_rwlock_unlock(&shared_lock[k]);
        } else if (op < 55) { /* read a shared block (others may be copying from it) */
            pthread_rwlock_rdlock(&shared_lock[k]);
            check(sb, 0, sb->n, "read of a shared block");
            pthread_rwlock_unlock(&shared_lock[k]);
        } else if (op < 68) { /* write a destination */
            scribble(o, 0, o->n, &s);
            check(o, 0, o->n, "written block");
        } else if (op < 76) { /* copy between own blocks, then write both */
            struct blk *o2 = &own[(o - own + 1) % OWN];
            copy_into(o2, o, &s, "copy between own blocks");
            scribble(o, 0, o->n, &s);
            check(o2, 0, o2->n, "copy after its source was written");
        } else if (op < 84) { /* realloc an own block */
            size_t n = rsize(&s), keep = n < o->n ? n : o->n;
            unsigned char *q = realloc(o->p, n);
            if (!q) abort();
            o->p = q;
            o->n = n;
            check(o, 0, keep, "realloc'd block");
            if (n > keep) {
                memset(o->sh + keep, 0x5a, n - keep);
                memset(o->p + keep, 0x5a, n - keep);
            }
        } else if (op < 90) { /* free and allocate an own block */
            free(o->p);
            new_block(o, rsize(&s), &s);
        } else if (op < 97 || (op < 99 && op % 2)) { /* rewrite or realloc a shared block */
            pthread_rwlock_wrlock(&shared_lock[k]);
            if (op % 2) {
                free(sb->p);
                new_block(sb, rsize(&s), &s);
            } else {
                size_t n = rsize(&s), keep = n < sb->n ? n : sb->n;
                unsigned char *q = realloc(sb->p, n);
                if (!q) abort();
                sb->p = q;
                sb->n = n;
                check(sb, 0, keep, "realloc'd shared block");
                fill_all(sb, &s);
            }
            pthread_rwlock_unlock(&shared_lock[k]);
        } else if (now() >= next_fork) {
            do_fork(own, &s);
            next_fork = now() + 0.2;
        }
        atomic_fetch_add(&ops, 1);
    }
    for (int i = 0; i < OWN; i++) {
        check(&own[i], 0, own[i].n, "own block at the end");
        free(own[i].p);
        munmap(own[i].sh, MAXSZ);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *e = getenv("ADVM_STRESS_SECONDS");
    double secs = argc > 1 ? atof(argv[1]) : e ? atof(e) : 3.0;
    int nt = argc > 2 ? atoi(argv[2]) : 4;
    if (nt < 1 || nt > MAXT) nt = 4;
    uint64_t s = 42;
    for (int i = 0; i < SHARED; i++) {
        pthread_rwlock_init(&shared_lock[i], NULL);
        shared[i].sh = shadow();
        new_block(&shared[i], rsize(&s), &s);
    }
    deadline = now() + secs;
    pthread_t t[MAXT];
    for (int i = 0; i < nt; i++)
        if (pthread_create(&t[i], NULL, i == 0 && nt > 1 ? reader : worker, (void *)(uintptr_t)i) != 0) return 2;
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < SHARED; i++) check(&shared[i], 0, shared[i].n, "shared block at the end");
    printf("ops %lu checks %lu failures %lu forks %lu\n", atomic_load(&ops), atomic_load(&checks),
           atomic_load(&failures), atomic_load(&forks));
    return atomic_load(&failures) ? 1 : 0;
}
