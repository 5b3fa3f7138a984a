/* fork.c: the atfork handlers. Shared mappings are frozen private before fork, and both
 * processes start a new memfd generation after it. */
#include "shim.h"

/* Set in a thread that forks from a signal handler which interrupted it inside the shim
 * (lock_mine: in a large memcpy, say; fork is async-signal-safe, and under glibc such a
 * fork works). The lock is then this thread's already and the arena may be half way
 * through a change: taking the lock again waited for ever (the program hung), and
 * nothing of the arena can be touched. So the handlers do nothing around this fork: the
 * child gets the arena as it was, locked until the interrupted call finishes, and its
 * shared runs and memfd generation are the parent's (docs/run.md, "Limits"). Thread-
 * local, so the child (a copy of this thread) sees it too. */
static __thread int fork_in_shim __attribute__((tls_model("initial-exec")));

/* Before fork: no page may stay a writable shared mapping, or parent and child would
 * see each other's writes. Every shared run becomes a private mapping of the same
 * memfd pages (contents unchanged: they are the memfd's). */
void fork_prepare(void) {
    if (lock_mine) {
        fork_in_shim = 1;
        return;
    }
    lock_take();
    if (state != 2) return;
    int saved = errno;
    cache_flush(); /* cached blocks are shared mappings of the generation being frozen */
    uint64_t v = 0;
    while (v < A.va_high) {
        uint64_t m = A.vmeta[v];
        if (!(m & VM_MAPPED)) {
            v++;
            continue;
        }
        uint64_t r = run_len(v, A.va_high - v);
        if (!(m & (VM_ANON | VM_PRIV))) {
            int fd = gen_fd((int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT));
            if (fd < 0) {
                unshare_lost(v, r); /* the program closed its memfd */
            } else if (mmap(page_addr(v), r << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
                            off_of(m)) != MAP_FAILED) {
                for (uint64_t i = 0; i < r; i++) A.vmeta[v + i] |= VM_PRIV;
                seg_mapped(v, r);
            }
        }
        v += r;
    }
    errno = saved;
}

/* After fork, in both processes: the generation in use is frozen (never written or
 * punched again: the other process may map its pages) and a new one starts. */
void new_generation(void) {
    int old = A.gen;
    A.gen = -1;
    A.retire = 0;
    for (int g = 0; g < MAX_GENS; g++)
        if (A.gen_fd[g] < 0 && A.gen_refs[g] == 0 && A.gen_det[g] == 0 && !((A.gen_lost >> g) & 1) && g != old) {
            A.gen = g;
            break;
        }
    if (old >= 0 && A.gen_refs[old] == 0) {
        int fd = gen_fd(old);
        if (fd >= 0) close(fd);
        A.gen_fd[old] = -1;
        A.gen_lost &= ~(1ull << old);
    }
    /* the new generation starts with no references and the whole memfd free (a retired
     * arena never uses it: its tables stay cut down) */
    if (A.retired) return;
    mmap(A.fref, sizeof(uint32_t) * ARENA_PAGES, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    mmap(A.fview, sizeof(uint32_t) * ARENA_PAGES, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    mmap(A.fdet, sizeof(uint32_t) * ARENA_PAGES, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    A.fd.n = 1;
    A.fd.v[0].start = 0;
    A.fd.v[0].len = (uint32_t)ARENA_PAGES;
}

void fork_parent(void) {
    if (fork_in_shim) {
        fork_in_shim = 0;
        return;
    }
    if (state == 2) {
        new_generation();
        st_add(S_FORKS, 1);
    }
    lock_drop();
}

void fork_child(void) {
    if (fork_in_shim) {
        fork_in_shim = 0;
        return;
    }
    if (state == 2) {
        new_generation();
        /* it reads the parent's pagemap (closed only while it is still the shim's) */
        if (A.pagemap_fd >= 0 && fd_is(A.pagemap_fd, A.pm_dev, A.pm_ino)) close(A.pagemap_fd);
        A.pagemap_fd = -1;
        for (int i = 0; i < S_NSTATS; i++)
            if (i != S_LIVE_BYTES) stats[i] = 0;
        A.pid = getpid();
    }
    lock_drop();
}
