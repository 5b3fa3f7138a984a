/* A browser's decoded-image cache in purgeable memory, used by several threads at once
 * under a budget far below the cache: each entry is unlocked while not in use and
 * locked before use. Every lock is checked: 1 means every byte is the entry's own
 * (a checksum of the whole entry), 0 means each page is either intact or zeros and at
 * least one is zeros (then the entry is decoded again). Also: two pagers in one
 * process (a range of the other's is -EINVAL), ranges straddling two regions or
 * running out of one, a budget smaller than one entry, and the statistics adding up
 * (pages that became resident minus pages evicted equals the pages resident), and an
 * entry in a forked child. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static size_t ps;

/* -D to scale it up (a run in a memory cgroup: ENTRIES=1024 PAGES=64 BUDGET=4096) */
#ifndef ENTRIES
#define ENTRIES 48
#endif
#ifndef PAGES
#define PAGES 6
#endif
#ifndef BUDGET
#define BUDGET 64
#endif
enum { THREADS = 4, OPS = 300 };

struct entry {
    pthread_mutex_t mu;
    unsigned char *mem;
    unsigned gen; /* which decode the entry holds */
};

static advm_pager *pager;
static struct entry cache[ENTRIES];
static unsigned long relocks_kept, relocks_lost;
static pthread_mutex_t counts = PTHREAD_MUTEX_INITIALIZER;

/* Byte i of page pg of entry e, decode g: differs between entries, pages and decodes. */
static unsigned char pattern(int e, unsigned g, size_t pg, size_t i) {
    return (unsigned char)(1 + ((e * 131 + g * 17 + pg * 7 + i) % 251));
}

static void decode(int e) {
    struct entry *en = &cache[e];
    en->gen++;
    for (size_t pg = 0; pg < PAGES; pg++)
        for (size_t i = 0; i < ps; i++) en->mem[pg * ps + i] = pattern(e, en->gen, pg, i);
}

static int page_intact(int e, size_t pg) {
    const unsigned char *m = cache[e].mem + pg * ps;
    for (size_t i = 0; i < ps; i++)
        if (m[i] != pattern(e, cache[e].gen, pg, i)) return 0;
    return 1;
}

/* Lock entry e and check what lock says against its bytes; decode again when lost. */
static void use(int e) {
    struct entry *en = &cache[e];
    int l = advm_pager_lock(pager, en->mem, PAGES * ps);
    CHECK(l == 0 || l == 1);
    if (l == 1) {
        for (size_t pg = 0; pg < PAGES; pg++) CHECK(page_intact(e, pg));
    } else {
        int zeros = 0;
        for (size_t pg = 0; pg < PAGES; pg++) {
            int z = all(en->mem + pg * ps, ps, 0);
            CHECK(z || page_intact(e, pg)); /* a page is dropped whole or not at all */
            zeros += z;
        }
        CHECK(zeros > 0);
        decode(e);
    }
    pthread_mutex_lock(&counts);
    if (l == 1) relocks_kept++;
    else relocks_lost++;
    pthread_mutex_unlock(&counts);
    CHECK(advm_pager_unlock(pager, en->mem, PAGES * ps) == 0);
}

static void *browse(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int op = 0; op < OPS; op++) {
        /* a few hot entries per thread, the rest scrolled past now and then */
        int e = (op % 3) ? (int)(seed % 4) * 12 + op % 4 : (int)(rand_r(&seed) % ENTRIES);
        pthread_mutex_lock(&cache[e].mu);
        use(e);
        pthread_mutex_unlock(&cache[e].mu);
    }
    return NULL;
}

/* Pages that became resident minus pages evicted: the pages resident (no region
 * unmapped, no write failed, no eviction running). */
static void stats_add_up(advm_pager *p) {
    struct advm_pager_stats s;
    CHECK(advm_pager_stats(p, &s) == 0);
    uint64_t in = s.zero_fills + s.read_pages + s.read_ahead_pages + s.zero_ahead_pages;
    uint64_t out = s.discarded_pages + s.written_pages + s.clean_dropped_pages;
    printf("  stats: in %llu (zero %llu, read %llu, read ahead %llu, zero ahead %llu), out %llu (discarded %llu, "
           "written %llu, clean %llu), resident %llu\n",
           (unsigned long long)in, (unsigned long long)s.zero_fills, (unsigned long long)s.read_pages,
           (unsigned long long)s.read_ahead_pages, (unsigned long long)s.zero_ahead_pages, (unsigned long long)out,
           (unsigned long long)s.discarded_pages, (unsigned long long)s.written_pages,
           (unsigned long long)s.clean_dropped_pages, (unsigned long long)s.resident_pages);
    CHECK(in - out == s.resident_pages);
    CHECK(s.bytes_written == s.written_pages * ps);
    CHECK(s.bytes_read == (s.read_pages + s.read_ahead_pages) * ps);
}

static void threaded_cache(void) {
    pager = advm_pager_new(BUDGET * ps, NULL); /* 64 pages for a cache of 288 */
    CHECK(pager != NULL);
    /* two regions of half the entries each, as two allocations would be */
    unsigned char *half[2];
    for (int h = 0; h < 2; h++) {
        half[h] = advm_pager_map(pager, ENTRIES / 2 * PAGES * ps);
        CHECK(half[h] != NULL);
    }
    for (int e = 0; e < ENTRIES; e++) {
        pthread_mutex_init(&cache[e].mu, NULL);
        cache[e].mem = half[e / (ENTRIES / 2)] + (size_t)(e % (ENTRIES / 2)) * PAGES * ps;
        CHECK(advm_pager_lock(pager, cache[e].mem, PAGES * ps) == 1); /* never used: nothing lost */
        decode(e);
        CHECK(advm_pager_unlock(pager, cache[e].mem, PAGES * ps) == 0);
    }
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, browse, (void *)(i + 1)) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    printf("  %d threads: %lu locks kept the entry, %lu found it purged\n", THREADS, relocks_kept, relocks_lost);
    CHECK(relocks_lost > 0 && relocks_kept > 0); /* the budget did purge, and did not purge all */

    /* locked entries are needed: a flush of everything writes them, drops the rest */
    for (int e = 0; e < 8; e++) {
        CHECK(advm_pager_lock(pager, cache[e].mem, PAGES * ps) >= 0);
        decode(e);
    }
    CHECK(advm_pager_flush(pager, half[0], ENTRIES / 2 * PAGES * ps) >= 0);
    for (int e = 0; e < 8; e++)
        for (size_t pg = 0; pg < PAGES; pg++) CHECK(page_intact(e, pg));
    struct advm_pager_stats s;
    CHECK(advm_pager_stats(pager, &s) == 0 && s.resident_pages <= BUDGET && s.written_pages > 0);
    stats_add_up(pager);

    /* ranges that are not pages of one region */
    size_t hl = ENTRIES / 2 * PAGES * ps;
    unsigned char *lo = half[0] < half[1] ? half[0] : half[1], *hi = lo == half[0] ? half[1] : half[0];
    CHECK(advm_pager_lock(pager, lo + hl - ps, 2 * ps) == -EINVAL);   /* runs past the region */
    CHECK(advm_pager_unlock(pager, lo + hl - ps, 2 * ps) == -EINVAL);
    CHECK(advm_pager_lock(pager, lo - ps, 2 * ps) == -EINVAL);        /* starts before it */
    CHECK(advm_pager_lock(pager, lo, (size_t)(hi - lo) + ps) == -EINVAL); /* two regions */
    CHECK(advm_pager_unlock(pager, lo, (size_t)(hi - lo) + ps) == -EINVAL);
    CHECK(advm_pager_lock(pager, lo + 1, ps) == -EINVAL && advm_pager_unlock(pager, lo, ps - 1) == -EINVAL);
    CHECK(advm_pager_unlock(pager, lo, 0) == -EINVAL);
    CHECK(advm_pager_lock(pager, lo, ps) >= 0); /* a range that is fine still is */
    advm_pager_destroy(pager);
}

/* Two pagers side by side: each knows only its own regions, and their budgets are apart. */
static void two_pagers(void) {
    advm_pager *a = advm_pager_new(4 * ps, NULL), *b = advm_pager_new(8 * ps, NULL);
    CHECK(a != NULL && b != NULL);
    unsigned char *ma = advm_pager_map(a, 16 * ps), *mb = advm_pager_map(b, 16 * ps);
    CHECK(ma != NULL && mb != NULL);
    CHECK(advm_pager_lock(a, mb, ps) == -EINVAL && advm_pager_unlock(b, ma, ps) == -EINVAL);
    CHECK(advm_pager_flush(a, mb, ps) == -EINVAL);
    memset(ma, 1, 16 * ps);
    memset(mb, 2, 16 * ps);
    CHECK(advm_pager_unlock(a, ma, 16 * ps) == 0 && advm_pager_unlock(b, mb, 16 * ps) == 0);
    CHECK(advm_pager_flush(a, ma, 16 * ps) >= 0); /* pressure on a only */
    CHECK(advm_pager_lock(b, mb, 16 * ps) == 1 && all(mb, 16 * ps, 2));
    CHECK(advm_pager_lock(a, ma, 16 * ps) == 0);
    struct advm_pager_stats sa, sb;
    CHECK(advm_pager_stats(a, &sa) == 0 && advm_pager_stats(b, &sb) == 0);
    CHECK(sa.resident_pages <= 4 && sb.resident_pages <= 8 && sb.discarded_pages == 0);
    stats_add_up(a);
    stats_add_up(b);
    advm_pager_destroy(a);
    CHECK(all(mb, 16 * ps, 2)); /* b unaffected by a's end */
    advm_pager_destroy(b);
}

/* An entry of 8 pages under a budget of 2: locked, it is needed and pages through
 * the swap file intact; unlocked and left alone, it is kept or lost, never wrong. */
static void budget_below_one_entry(void) {
    advm_pager *p = advm_pager_new(2 * ps, NULL);
    CHECK(p != NULL);
    unsigned char *m = advm_pager_map(p, 16 * ps);
    CHECK(m != NULL);
    CHECK(advm_pager_lock(p, m, 8 * ps) == 1);
    for (size_t pg = 0; pg < 8; pg++) memset(m + pg * ps, (int)(pg + 1), ps);
    for (size_t pg = 0; pg < 8; pg++) CHECK(all(m + pg * ps, ps, (unsigned char)(pg + 1)));
    CHECK(advm_pager_unlock(p, m, 8 * ps) == 0);
    CHECK(advm_pager_lock(p, m, 8 * ps) == 1); /* nothing touched it: no page dropped */
    for (size_t pg = 0; pg < 8; pg++) CHECK(all(m + pg * ps, ps, (unsigned char)(pg + 1)));
    CHECK(advm_pager_unlock(p, m, 8 * ps) == 0);
    memset(m + 8 * ps, 9, 8 * ps); /* another entry's decode pushes the first out */
    CHECK(advm_pager_lock(p, m, 8 * ps) == 0);
    for (size_t pg = 0; pg < 8; pg++) CHECK(all(m + pg * ps, ps, 0) || all(m + pg * ps, ps, (unsigned char)(pg + 1)));
    struct advm_pager_stats s;
    CHECK(advm_pager_stats(p, &s) == 0 && s.resident_pages <= 2);
    stats_add_up(p);
    advm_pager_destroy(p);
}

/* A forked child has no pager: lock and unlock there fail at once with
 * -ENOTRECOVERABLE, and touching an entry is a segmentation fault (the regions are
 * MADV_DONTFORK), as advm.h says; the parent's entry stays whole. */
static void entry_after_fork(void) {
    advm_pager *p = advm_pager_new(8 * ps, NULL);
    CHECK(p != NULL);
    unsigned char *m = advm_pager_map(p, 4 * ps);
    CHECK(m != NULL);
    memset(m, 3, 4 * ps);
    CHECK(advm_pager_unlock(p, m, 4 * ps) == 0);
    for (int touch = 0; touch < 2; touch++) {
        fflush(stdout);
        pid_t c = fork();
        CHECK(c >= 0);
        if (c == 0) {
            alarm(10); /* a hang ends the child with SIGALRM */
            if (advm_pager_lock(p, m, 4 * ps) != -ENOTRECOVERABLE) _exit(2);
            if (advm_pager_unlock(p, m, 4 * ps) != -ENOTRECOVERABLE) _exit(3);
            if (touch) _exit(m[0] == 3 ? 4 : 5);
            _exit(0);
        }
        int st;
        CHECK(waitpid(c, &st, 0) == c);
        if (touch) CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
        else CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    CHECK(advm_pager_lock(p, m, 4 * ps) == 1 && all(m, 4 * ps, 3));
    advm_pager_destroy(p);
}

int main(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    skip_without_pager();
    threaded_cache();
    two_pagers();
    budget_below_one_entry();
    entry_after_fork();
    printf("pager_purgeable_threads: ok\n");
    return 0;
}
