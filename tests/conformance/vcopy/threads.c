/* Threads: three workers copy from shared sources into blocks of their own (whole,
 * partial, congruent or not, dups), write to them and check them; now and then a
 * worker writes to a source (exclusively: a writer lock). Two readers scan the
 * sources all the time, also while workers copy from them: a source being copied must
 * always read as its own bytes. Sources are replaced by new blocks now and then, so
 * that copies also take a source's freshly written (anonymous) pages. */
#include <pthread.h>
#include "vc.h"

#define NSRC 3
#define NW 3
#define NR 2
#define OWN 4
#define ITER 150

static struct {
    unsigned char *p, *sh;
    size_t len;
    pthread_rwlock_t lock; /* readers and copiers share it; a write to the source excludes */
} src[NSRC];
static int done;
static unsigned long reads, src_writes, src_fresh;

static size_t rnd(uint64_t *s, size_t n) { return (size_t)(vc_rand(s) % n); }

static void *worker(void *arg) {
    uint64_t rs = 1000 + (uint64_t)(uintptr_t)arg;
    unsigned char *p[OWN], *sh[OWN];
    size_t len[OWN];
    for (int i = 0; i < OWN; i++) {
        len[i] = (8 + rnd(&rs, 300)) * VC_PS + rnd(&rs, 2) * rnd(&rs, VC_PS);
        p[i] = vc_alloc(len[i]);
        VC_CHECK(p[i] != NULL);
        sh[i] = vc_shadow(len[i]);
        vc_write(p[i], sh[i], len[i], rs);
    }
    for (int it = 0; it < ITER; it++) {
        int s = (int)rnd(&rs, NSRC), d = (int)rnd(&rs, OWN);
        if (rnd(&rs, 3) == 0) {
            VC_CHECK(pthread_rwlock_wrlock(&src[s].lock) == 0);
            if (rnd(&rs, 3) != 0) {
                /* a new block in place of the source: its first copy takes its freshly
                 * written pages, the case where a backend moves them */
                vc_free(src[s].p);
                src[s].p = vc_alloc(src[s].len);
                VC_CHECK(src[s].p != NULL);
                vc_write(src[s].p, src[s].sh, src[s].len, vc_rand(&rs));
                __atomic_fetch_add(&src_fresh, 1, __ATOMIC_RELAXED);
            }
            for (int k = 0; k < 4; k++) {
                size_t off = rnd(&rs, src[s].len), n = 1 + rnd(&rs, 2 * VC_PS);
                if (n > src[s].len - off) n = src[s].len - off;
                vc_write(src[s].p + off, src[s].sh + off, n, vc_rand(&rs));
            }
            __atomic_fetch_add(&src_writes, 1, __ATOMIC_RELAXED);
            VC_CHECK(pthread_rwlock_unlock(&src[s].lock) == 0);
        }
        VC_CHECK(pthread_rwlock_rdlock(&src[s].lock) == 0);
        if (rnd(&rs, 4) == 0) { /* a dup of the source replaces an own block */
            vc_free(p[d]);
            vc_unshadow(sh[d], len[d]);
            len[d] = src[s].len;
            p[d] = vc_dup(src[s].p, len[d]);
            VC_CHECK(p[d] != NULL);
            sh[d] = vc_shadow(len[d]);
            vc_sh_copy(sh[d], src[s].sh, len[d]);
        } else {
            size_t max = src[s].len < len[d] ? src[s].len : len[d];
            size_t so = rnd(&rs, 3) ? 0 : rnd(&rs, max), dof = rnd(&rs, 3) ? so : rnd(&rs, max);
            size_t room = max - (so > dof ? so : dof);
            size_t n = room - rnd(&rs, room / 3 + 1);
            VC_CHECK(vc_copy(p[d] + dof, src[s].p + so, n) == 0);
            vc_sh_copy(sh[d] + dof, src[s].sh + so, n);
        }
        VC_CHECK(pthread_rwlock_unlock(&src[s].lock) == 0);
        size_t off = rnd(&rs, len[d]), n = 1 + rnd(&rs, 3 * VC_PS);
        if (n > len[d] - off) n = len[d] - off;
        vc_write(p[d] + off, sh[d] + off, n, vc_rand(&rs));
        for (int i = 0; i < OWN; i++) vc_check(p[i], sh[i], len[i], "a worker's own block");
    }
    for (int i = 0; i < OWN; i++) {
        vc_free(p[i]);
        vc_unshadow(sh[i], len[i]);
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        for (int s = 0; s < NSRC; s++) {
            VC_CHECK(pthread_rwlock_rdlock(&src[s].lock) == 0);
            vc_check(src[s].p, src[s].sh, src[s].len, "a source read while others copy from it");
            VC_CHECK(pthread_rwlock_unlock(&src[s].lock) == 0);
            __atomic_fetch_add(&reads, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

int main(void) {
    size_t sizes[NSRC] = {48 * VC_PS + 77, 300 * VC_PS, 20 * VC_PS};
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* glibc prefers readers by default: the two scanning readers would starve writers */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    for (int s = 0; s < NSRC; s++) {
        src[s].len = sizes[s];
        src[s].p = vc_alloc(sizes[s]);
        VC_CHECK(src[s].p != NULL);
        src[s].sh = vc_shadow(sizes[s]);
        vc_write(src[s].p, src[s].sh, sizes[s], (uint64_t)s + 5);
        VC_CHECK(pthread_rwlock_init(&src[s].lock, &attr) == 0);
    }
    pthread_t w[NW], r[NR];
    for (int i = 0; i < NR; i++) VC_CHECK(pthread_create(&r[i], NULL, reader, NULL) == 0);
    for (int i = 0; i < NW; i++) VC_CHECK(pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)i) == 0);
    for (int i = 0; i < NW; i++) VC_CHECK(pthread_join(w[i], NULL) == 0);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < NR; i++) VC_CHECK(pthread_join(r[i], NULL) == 0);
    for (int s = 0; s < NSRC; s++) {
        vc_check(src[s].p, src[s].sh, src[s].len, "a source at the end");
        vc_free(src[s].p);
    }
    char detail[200];
    snprintf(detail, sizeof detail, "%d workers x %d copies/dups, %lu source writes (%lu new sources), %lu source scans by %d readers",
             NW, ITER, src_writes, src_fresh, reads, NR);
    return vc_done("threads", detail);
}
