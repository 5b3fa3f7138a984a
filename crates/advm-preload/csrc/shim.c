/*
 * advm-preload: an LD_PRELOAD shim that gives unmodified programs virtual copies.
 *
 * Large allocations (>= ADVM_THRESHOLD_PAGES pages, default 2, as in the mmapcopy
 * paper) are served from a page-aligned arena; large memcpy/memmove between arena
 * blocks whose addresses have equal page offsets become copy-on-write mappings of the
 * same memfd pages (partial first/last pages are copied); realloc of arena blocks moves
 * page tables (mremap) instead of bytes. Everything else goes to glibc untouched.
 *
 * Why its own arena and not the Rust one in crates/advm: this code runs inside malloc,
 * free and memcpy of any process, before main() and after exit handlers. It must never
 * allocate (the allocator is what it replaces), never recurse into itself, never unwind
 * and never depend on a runtime being initialised. So it keeps all metadata in fixed
 * mmap'd tables, calls glibc's own entry points (__libc_malloc, dlsym'd memcpy) for the
 * plain path, and is written in C with no library besides libc.
 *
 * Modes (ADVM_MODE): cow = virtual copies (a block is anonymous until it is first
 * copied, then private mappings of memfd pages); alloc = anonymous arena only (the
 * paper's orig+alloc); ksm = alloc + MADV_MERGEABLE on arena blocks.
 *
 * Layout (see DESIGN.md): a 64 GiB reservation at a high fixed hint; vmeta[v] says
 * what arena page v maps (memfd generation, memfd page, private or shared, block
 * head and length); fref[f] counts the arena pages mapping memfd page f of the current
 * generation (a page is hole-punched when it drops to 0). fork() freezes every shared
 * mapping to private and starts a new memfd generation in parent and child, so neither
 * ever writes or punches a memfd page the other may map.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h> /* memset only: the shim does not replace it */
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define EXPORT __attribute__((visibility("default")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern char **environ;

/* ---- arena geometry and tables ------------------------------------------------ */

#define ARENA_PAGES (1ull << 24) /* 64 GiB of 4 KiB pages */
#define MAX_GENS 64
#define MAX_EXTENTS (1u << 16)

/* vmeta bits */
#define VM_FPAGE_MASK ((1ull << 28) - 1)
#define VM_GEN_SHIFT 28
#define VM_GEN_MASK (63ull << VM_GEN_SHIFT)
#define VM_PRIV (1ull << 34)
#define VM_ANON (1ull << 35)
#define VM_MAPPED (1ull << 36)
#define VM_NPAGES_SHIFT 37
#define MAX_BLOCK_PAGES (1ull << 26) /* blocks are shorter: their length fits VM_NPAGES */
#define VM_NPAGES_MASK ((MAX_BLOCK_PAGES - 1) << VM_NPAGES_SHIFT)
#define VM_HEAD (1ull << 63)

enum mode { MODE_COW, MODE_ALLOC, MODE_KSM };

struct extent {
    uint32_t start, len;
};

struct extents {
    struct extent *v; /* sorted, non-overlapping, coalesced free extents */
    uint32_t n;
};

static struct {
    enum mode mode;
    size_t ps;
    unsigned pshift;
    uintptr_t base;
    size_t threshold; /* bytes: allocations and copies at least this big are ours */
    uint64_t *vmeta;
    uint32_t *fref;
    uint64_t *segbits; /* upper bound on VMAs: a bit where a mapping may begin */
    uint64_t segs, seg_budget;
    struct extents va, fd;
    uint64_t va_high; /* pages below this may be in use (bounds fork scans) */
    int gen;          /* current memfd generation, -1 when none is free */
    int gen_fd[MAX_GENS];
    uint64_t gen_refs[MAX_GENS];
    int pagemap_fd;
    pid_t pid;
    const char *stats_dir;
} A;

/* Freed single-owner blocks keep their mapping, in one table sorted by address: a freed
 * block merges with free neighbours, and a request takes the best fit and leaves the
 * rest, as glibc's heap does. The next allocation then costs no mmap and no VMA split,
 * and the newest keep their pages (see dirty_cap and decay), so that a program that
 * frees and allocates in a loop (R between collections) does not fault and zero every
 * page again. Per-size bins (the first design) left the freed pages of one size unused
 * while another size was faulted fresh: on ml_lssvm.R, 85,000 faulted pages against
 * 23,000 with this table (replayed allocation trace). */
#define FREE_SLOTS 4096
struct freeblk {
    uint32_t start, len;
    uint32_t time; /* when it was last freed, ms (for the decay) */
    uint8_t dirty; /* keeps its pages */
    /* its mapping asks for transparent huge pages: while it holds no pages, never carved
     * for a small block (whose first touch would fault a whole 2 MiB page) */
    uint8_t huge;
    uint8_t mixed; /* has shared memfd runs: never merged (run bookkeeping stays simple) */
};
static struct freeblk fb[FREE_SLOTS];
static int fb_n;
#define SALVAGE_MIN_PAGES 16 /* below this, moving pages costs more than faulting them again */
static uint64_t dirty_pages, dirty_floor_pages, dirty_live_pct;
static uint64_t populate_max;
/* cow: a new block is anonymous until it is first copied (default), or a shared memfd
 * mapping from the start (ADVM_COW_FRESH=memfd: copies cost no byte, but every
 * allocation pays shmem faults and hole punching) */
static int cow_fresh_memfd;
/* Anonymous blocks of at least this size (ADVM_THP_MIN_KIB, default 2 MiB; 0 = never)
 * ask for transparent huge pages: one fault per 2 MiB instead of 512. Not in ksm mode,
 * where KSM must split huge pages before it can merge them. Measured: system time of
 * b25_matrix.R 0.77 s -> 0.55 s, b25_vector.R 0.50 s -> 0.33 s, memory not higher. */
static uint64_t thp_min; /* bytes: anonymous blocks at least this big ask for THP */

/* Whether an anonymous block of n pages asks for transparent huge pages. */
static int thp_wanted(uint64_t n) { return A.mode != MODE_KSM && thp_min && (n << A.pshift) >= thp_min; }

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Set while this thread holds the lock or is taking it. memcpy is async-signal-safe: a
 * signal handler that copies while its thread is inside the shim must not wait for the
 * lock that thread holds (a deadlock), so such a copy is a plain one. Set before the
 * lock is taken and cleared after it is released, so a handler never sees it clear
 * while the lock is this thread's. Initial-exec TLS: no allocation on first use. */
static __thread volatile int lock_mine __attribute__((tls_model("initial-exec")));

static void lock_take(void) {
    lock_mine = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_lock(&lock);
}
static void lock_drop(void) {
    pthread_mutex_unlock(&lock);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    lock_mine = 0;
}
static int state; /* 0 none, 1 initialising, 2 ready, 3 disabled */
static uintptr_t arena_lo, arena_len; /* 0 until ready: in_arena() is false */
static size_t copy_min = SIZE_MAX;    /* copies at least this big are looked at */

/* ---- statistics ------------------------------------------------------------------ */

enum counter {
    S_BLOCKS, S_BLOCK_BYTES, S_LIVE_BYTES, S_PEAK_BYTES, S_ALLOC_FALLBACK,
    S_COPIES_SEEN, S_COPIES_VIRTUAL, S_PAGES_SHARED, S_BYTES_PARTIAL, S_PAGES_MOVED,
    S_FB_NOT_ARENA, S_FB_OFFSET, S_FB_OVERLAP, S_FB_SHORT, S_FB_BUDGET,
    S_FB_ERROR, S_FB_BYTES, S_REALLOC_INPLACE, S_REALLOC_MREMAP, S_REALLOC_SHRINK,
    S_FB_REENTRANT, S_FORKS, S_GENS_EXHAUSTED, S_CACHE_HITS, S_DIRTY_HITS, S_PAGES_SALVAGED, S_PAGES_FRESH, S_PAGES_RETURNED, S_NSTATS
};
static const char *const stat_names[S_NSTATS] = {
    "blocks_allocated", "block_bytes_allocated", "live_bytes", "peak_live_bytes",
    "alloc_fallbacks_to_glibc",
    "large_copies_seen", "copies_virtual", "pages_shared", "bytes_copied_partial_pages",
    "dirty_pages_moved_to_memfd",
    "fallback_not_both_in_arena", "fallback_page_offsets_differ", "fallback_overlap",
    "fallback_no_whole_page", "fallback_vma_budget",
    "fallback_syscall_error", "fallback_bytes_copied", "realloc_in_place", "realloc_mremap",
    "realloc_shrink", "fallback_copy_inside_shim", "forks", "generations_exhausted", "blocks_reused_from_free_cache",
    "blocks_reused_with_pages", "pages_kept_from_copied_over", "pages_mapped_fresh",
    "kept_pages_returned"};
static uint64_t stats[S_NSTATS];

/* Freed memory kept with its pages: up to dirty_live_pct of the peak live arena bytes,
 * at least the floor. glibc keeps all freed memory below its heap top; a fixed cap made
 * programs that free and reallocate more than it between collections (R) fault and
 * zero every page again (ml_lssvm.R: 3.7x glibc's page faults at 4 MiB). The peak, not
 * the current live size: a collection frees most of the heap at once, right before the
 * program allocates it again. What stays unused is returned by the decay. */
static uint64_t dirty_cap(void) {
    uint64_t peak = __atomic_load_n(&stats[S_PEAK_BYTES], __ATOMIC_RELAXED) >> A.pshift;
    uint64_t c = peak / 100 * dirty_live_pct;
    return c > dirty_floor_pages ? c : dirty_floor_pages;
}

static inline void st_add(enum counter s, uint64_t v) { __atomic_fetch_add(&stats[s], v, __ATOMIC_RELAXED); }

/* ---- the plain path: glibc's functions ------------------------------------------ */

typedef void *(*copy_fn)(void *, const void *, size_t);
typedef void *(*chk_fn)(void *, const void *, size_t, size_t);
static void *boot_memcpy(void *d, const void *s, size_t n);
static void *boot_memmove(void *d, const void *s, size_t n);
static copy_fn real_memcpy = boot_memcpy, real_memmove = boot_memmove;
static chk_fn real_memcpy_chk, real_memmove_chk;
static int (*real_posix_memalign)(void **, size_t, size_t);
static size_t (*real_usable)(void *);

/* Byte loops for calls made before glibc's versions are known (volatile so that the
 * compiler cannot turn them back into calls to memcpy, which is us). */
static void *byte_move(void *d, const void *s, size_t n) {
    volatile unsigned char *dd = d;
    const volatile unsigned char *ss = s;
    if (dd < ss)
        for (size_t i = 0; i < n; i++) dd[i] = ss[i];
    else
        for (size_t i = n; i > 0; i--) dd[i - 1] = ss[i - 1];
    return d;
}

static int resolving;
static void resolve(void) {
    if (real_memcpy != boot_memcpy || environ == NULL || __atomic_exchange_n(&resolving, 1, __ATOMIC_ACQ_REL))
        return;
    void *m = dlsym(RTLD_NEXT, "memcpy"), *mv = dlsym(RTLD_NEXT, "memmove");
    real_memcpy_chk = (chk_fn)dlsym(RTLD_NEXT, "__memcpy_chk");
    real_memmove_chk = (chk_fn)dlsym(RTLD_NEXT, "__memmove_chk");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    if (mv) real_memmove = (copy_fn)mv;
    if (m) real_memcpy = (copy_fn)m;
}

static void *boot_memcpy(void *d, const void *s, size_t n) {
    resolve();
    if (real_memcpy != boot_memcpy) return real_memcpy(d, s, n);
    return byte_move(d, s, n);
}
static void *boot_memmove(void *d, const void *s, size_t n) {
    resolve();
    if (real_memmove != boot_memmove) return real_memmove(d, s, n);
    return byte_move(d, s, n);
}

/* ---- small helpers (no libc string functions: they may be us) ------------------- */

static int str_eq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static const char *env(const char *name) {
    if (!environ) return NULL;
    for (char **e = environ; *e; e++) {
        const char *p = *e, *q = name;
        while (*q && *p == *q) p++, q++;
        if (!*q && *p == '=') return p + 1;
    }
    return NULL;
}

static uint64_t parse_u64(const char *s, uint64_t dflt) {
    if (!s || !*s) return dflt;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (uint64_t)(*s - '0');
    return v;
}

static void say(const char *msg) {
    size_t n = 0;
    while (msg[n]) n++;
    ssize_t r = write(2, msg, n);
    (void)r;
}

/* Milliseconds of a coarse monotonic clock (vDSO: no syscall, no allocation). */
static uint32_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint32_t)((uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000);
}

static void *page_addr(uint64_t v) { return (void *)(A.base + (v << A.pshift)); }
static uint64_t page_of(const void *p) { return ((uintptr_t)p - A.base) >> A.pshift; }
static inline int in_arena(const void *p) { return (uintptr_t)p - arena_lo < arena_len; }

static void *map_table(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- extent allocator over a page index space (free list in a fixed table) ------ */

static void ext_shift(struct extents *e, uint32_t at, int by) {
    if (by > 0)
        for (uint32_t i = e->n; i > at; i--) e->v[i] = e->v[i - 1];
    else
        for (uint32_t i = at; i + 1 < e->n; i++) e->v[i] = e->v[i + 1];
    e->n = (uint32_t)((int)e->n + by);
}

static int64_t ext_alloc(struct extents *e, uint32_t len) {
    for (uint32_t i = 0; i < e->n; i++) {
        if (e->v[i].len < len) continue;
        uint32_t s = e->v[i].start;
        e->v[i].start += len;
        e->v[i].len -= len;
        if (e->v[i].len == 0) ext_shift(e, i, -1);
        return s;
    }
    return -1;
}

/* Claims [start, start+len) if it is free (realloc growing in place). */
static int ext_claim(struct extents *e, uint32_t start, uint32_t len) {
    for (uint32_t i = 0; i < e->n; i++) {
        struct extent *x = &e->v[i];
        if (x->start > start) return 0;
        if (x->start + x->len < start + len) continue;
        if (x->start == start) {
            x->start += len;
            x->len -= len;
            if (x->len == 0) ext_shift(e, i, -1);
            return 1;
        }
        if (x->start + x->len == start + len) {
            x->len -= len;
            return 1;
        }
        if (e->n == MAX_EXTENTS) return 0;
        ext_shift(e, i + 1, 1);
        e->v[i + 1].start = start + len;
        e->v[i + 1].len = x->start + x->len - (start + len);
        x->len = start - x->start;
        return 1;
    }
    return 0;
}

static void ext_free(struct extents *e, uint32_t start, uint32_t len) {
    uint32_t lo = 0, hi = e->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (e->v[mid].start < start) lo = mid + 1; else hi = mid;
    }
    int prev = lo > 0 && e->v[lo - 1].start + e->v[lo - 1].len == start;
    int next = lo < e->n && start + len == e->v[lo].start;
    if (prev && next) {
        e->v[lo - 1].len += len + e->v[lo].len;
        ext_shift(e, lo, -1);
    } else if (prev) {
        e->v[lo - 1].len += len;
    } else if (next) {
        e->v[lo].start = start;
        e->v[lo].len += len;
    } else if (e->n < MAX_EXTENTS) {
        ext_shift(e, lo, 1);
        e->v[lo].start = start;
        e->v[lo].len = len;
    } /* else: the table is full and the range is leaked (address space only) */
}

static int ext_init(struct extents *e) {
    e->v = map_table(sizeof(struct extent) * (MAX_EXTENTS + 1));
    if (!e->v) return -1;
    e->n = 1;
    e->v[0].start = 0;
    e->v[0].len = (uint32_t)ARENA_PAGES;
    return 0;
}

/* ---- VMA budget: a bit marks a page where a mapping may begin ------------------ */

static void seg_set(uint64_t v) {
    if (v >= ARENA_PAGES) return;
    uint64_t m = 1ull << (v & 63);
    if (!(A.segbits[v >> 6] & m)) A.segbits[v >> 6] |= m, A.segs++;
}
static void seg_clear(uint64_t v) {
    uint64_t m = 1ull << (v & 63);
    if (A.segbits[v >> 6] & m) A.segbits[v >> 6] &= ~m, A.segs--;
}
/* One mmap/mremap over [v, v+n): one mapping there, maybe split neighbours. */
static void seg_mapped(uint64_t v, uint64_t n) {
    seg_set(v);
    for (uint64_t i = v + 1; i < v + n; i++) seg_clear(i);
    seg_set(v + n);
}
static int budget_ok(void) { return A.segs + 8 < A.seg_budget; }

/* ---- memfd generations ----------------------------------------------------------- */

static int cur_fd(void) {
    if (A.gen < 0) return -1;
    if (A.gen_fd[A.gen] < 0) {
        int fd = memfd_create("advm-arena", MFD_CLOEXEC);
        if (fd < 0) return -1;
        if (ftruncate(fd, (off_t)(ARENA_PAGES << A.pshift)) != 0) {
            close(fd);
            return -1;
        }
        A.gen_fd[A.gen] = fd;
    }
    return A.gen_fd[A.gen];
}

static void gen_unref(int g, uint64_t n) {
    A.gen_refs[g] -= n;
    if (A.gen_refs[g] == 0 && g != A.gen && A.gen_fd[g] >= 0) {
        close(A.gen_fd[g]);
        A.gen_fd[g] = -1;
    }
}

/* Drops the references of [v, v+n) (already unmapped or remapped) and punches memfd
 * pages of the current generation nobody maps any more. */
static void unref_pages(uint64_t v, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint64_t m = A.vmeta[v + i];
        if (!(m & VM_MAPPED) || (m & VM_ANON)) {
            i++;
            continue;
        }
        int g = (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT);
        uint64_t f = m & VM_FPAGE_MASK;
        if (g != A.gen) {
            gen_unref(g, 1);
            i++;
            continue;
        }
        /* a run of consecutive memfd pages that all drop to zero is punched at once */
        uint64_t k = 0;
        while (i + k < n) {
            uint64_t mk = A.vmeta[v + i + k];
            if (!(mk & VM_MAPPED) || (mk & VM_ANON) || (int)((mk & VM_GEN_MASK) >> VM_GEN_SHIFT) != g ||
                (mk & VM_FPAGE_MASK) != f + k || A.fref[f + k] != 1)
                break;
            k++;
        }
        if (k == 0) { /* still mapped elsewhere */
            A.fref[f]--;
            A.gen_refs[g]--;
            i++;
            continue;
        }
        for (uint64_t j = 0; j < k; j++) A.fref[f + j] = 0;
        A.gen_refs[g] -= k;
        fallocate(A.gen_fd[g], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(f << A.pshift),
                  (off_t)(k << A.pshift));
        ext_free(&A.fd, (uint32_t)f, (uint32_t)k);
        i += k;
    }
}

/* ---- blocks ----------------------------------------------------------------------- */

/* Maps fresh zeroed memory at [v, v+n) (a new block or a grown tail). */
static int map_fresh(uint64_t v, uint64_t n) {
    void *a = page_addr(v);
    size_t len = n << A.pshift;
    int fd = A.mode == MODE_COW && cow_fresh_memfd ? cur_fd() : -1;
    if (fd >= 0) {
        int64_t f = ext_alloc(&A.fd, (uint32_t)n);
        if (f < 0) fd = -1;
        else if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)((uint64_t)f << A.pshift)) ==
                 MAP_FAILED) {
            ext_free(&A.fd, (uint32_t)f, (uint32_t)n);
            return -1;
        } else {
            for (uint64_t i = 0; i < n; i++) {
                A.vmeta[v + i] = VM_MAPPED | ((uint64_t)A.gen << VM_GEN_SHIFT) | ((uint64_t)f + i);
                A.fref[f + i] = 1;
            }
            A.gen_refs[A.gen] += n;
        }
    }
    if (fd < 0) {
        if (A.mode == MODE_COW && cow_fresh_memfd) st_add(S_GENS_EXHAUSTED, 1);
        if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            return -1;
        if (A.mode == MODE_KSM) madvise(a, len, MADV_MERGEABLE);
        else if (thp_wanted(n)) madvise(a, len, MADV_HUGEPAGE);
        for (uint64_t i = 0; i < n; i++) A.vmeta[v + i] = VM_MAPPED | VM_ANON;
    }
    seg_mapped(v, n);
    if (v + n > A.va_high) A.va_high = v + n;
    return 0;
}

/* Gives [v, v+n) back to the reservation (PROT_NONE) and drops its pages. */
static void unmap_pages(uint64_t v, uint64_t n) {
    mmap(page_addr(v), n << A.pshift, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    unref_pages(v, n);
    for (uint64_t i = 0; i < n; i++) A.vmeta[v + i] = 0;
    seg_mapped(v, n);
}

static off_t off_of(uint64_t m) { return (off_t)((m & VM_FPAGE_MASK) << A.pshift); }

static void set_head(uint64_t v, uint64_t n) {
    A.vmeta[v] = (A.vmeta[v] & ~VM_NPAGES_MASK) | VM_HEAD | (n << VM_NPAGES_SHIFT);
}
static uint64_t head_pages(uint64_t v) { return (A.vmeta[v] & VM_NPAGES_MASK) >> VM_NPAGES_SHIFT; }

static void live_add(int64_t bytes) {
    uint64_t now = __atomic_add_fetch(&stats[S_LIVE_BYTES], (uint64_t)bytes, __ATOMIC_RELAXED);
    if (bytes > 0 && now > stats[S_PEAK_BYTES]) stats[S_PEAK_BYTES] = now;
}

/* Length of the run of pages starting at v (at most max) that one mmap could map:
 * the same kind, generation and sharing, consecutive memfd pages. */
static uint64_t run_len(uint64_t v, uint64_t max) {
    uint64_t m = A.vmeta[v] & ~(VM_HEAD | VM_NPAGES_MASK);
    uint64_t k = 1;
    while (k < max) {
        uint64_t mk = A.vmeta[v + k] & ~(VM_HEAD | VM_NPAGES_MASK);
        uint64_t want = (m & VM_ANON) ? m : m + k;
        if (mk != want) break;
        k++;
    }
    return k;
}


/* Pages needed for size bytes; at least MAX_BLOCK_PAGES (which every caller refuses)
 * when rounding up would overflow: realloc(p, SIZE_MAX) once wrapped to 0 pages and was
 * taken for a shrink. */
static uint64_t pages_for(size_t size) {
    if (size > SIZE_MAX - (A.ps - 1)) return MAX_BLOCK_PAGES;
    return (size + A.ps - 1) >> A.pshift;
}

static void decay(void);
static int fb_take(uint64_t n, int *dirty, uint64_t *v);

/* Makes [v, v+n) a live block and counts it (reused: it came from the free table). */
static void *hand_out(uint64_t v, uint64_t n, int reused, int dirty) {
    set_head(v, n);
    st_add(S_BLOCKS, 1);
    if (reused) st_add(S_CACHE_HITS, 1);
    if (dirty) st_add(S_DIRTY_HITS, 1);
    st_add(S_BLOCK_BYTES, n << A.pshift);
    live_add((int64_t)(n << A.pshift));
    return page_addr(v);
}

/* Returns a block of at least size bytes; *dirty says whether it may hold old bytes. */
static void *block_alloc(size_t size, int *dirty) {
    decay();
    uint64_t n = pages_for(size);
    *dirty = 0;
    if (n == 0 || n >= MAX_BLOCK_PAGES) return NULL;
    uint64_t v;
    if (fb_take(n, dirty, &v) == 0) return hand_out(v, n, 1, *dirty);
    if (!budget_ok()) return NULL;
    int64_t nv = ext_alloc(&A.va, (uint32_t)n);
    if (nv < 0) return NULL;
    if (map_fresh((uint64_t)nv, n) != 0) {
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    st_add(S_PAGES_FRESH, n);
    return hand_out((uint64_t)nv, n, 0, 0);
}

/* The block whose head is p, or -1 (a pointer into the arena that is not a block). */
static int64_t block_of(const void *p) {
    if (((uintptr_t)p & (A.ps - 1)) != 0) return -1;
    uint64_t v = page_of(p);
    return (A.vmeta[v] & VM_HEAD) ? (int64_t)v : -1;
}

static void bad_pointer(const char *what) {
    say("advm-preload: ");
    say(what);
    say(": pointer inside the arena is not the start of a live block\n");
    abort();
}

static void release_block(uint64_t v, uint64_t n) {
    unmap_pages(v, n);
    ext_free(&A.va, (uint32_t)v, (uint32_t)n);
}

static void cache_flush(void) {
    for (int i = 0; i < fb_n; i++) release_block(fb[i].start, fb[i].len);
    fb_n = 0;
    dirty_pages = 0;
}

/* Returns the memory of a single-owner block whose mapping stays (run by run: a freed
 * copy is shared memfd pages between anonymous partial first and last pages). */
static int give_back(uint64_t v, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint64_t m = A.vmeta[v + i], r = run_len(v + i, n - i);
        int rc = (m & VM_ANON) ? madvise(page_addr(v + i), r << A.pshift, MADV_DONTNEED)
                               : fallocate(A.gen_fd[(m & VM_GEN_MASK) >> VM_GEN_SHIFT],
                                           FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_of(m),
                                           (off_t)(r << A.pshift));
        if (rc != 0) return rc;
        i += r;
    }
    st_add(S_PAGES_RETURNED, n);
    return 0;
}

/* Whether [v, v+n) has one owner: every page anonymous or a shared mapping (a shared
 * memfd page is only ever mapped by the block that owns it). */
static int single_owner(uint64_t v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t m = A.vmeta[v + i];
        if (!(m & VM_MAPPED) || ((m & VM_PRIV) && !(m & VM_ANON))) return 0;
    }
    return 1;
}

static int fb_mergeable(const struct freeblk *a, const struct freeblk *b) {
    return a->start + a->len == b->start && a->dirty == b->dirty && a->huge == b->huge && !a->mixed && !b->mixed &&
           (uint64_t)a->len + b->len < MAX_BLOCK_PAGES;
}

static void fb_remove(int i) {
    if (fb[i].dirty) dirty_pages -= fb[i].len;
    for (int j = i; j + 1 < fb_n; j++) fb[j] = fb[j + 1];
    fb_n--;
}

/* Merges entry i with its neighbours where they fit together; returns its new index. */
static int fb_merge(int i) {
    if (i + 1 < fb_n && fb_mergeable(&fb[i], &fb[i + 1])) {
        fb[i].len += fb[i + 1].len;
        if (fb[i + 1].time > fb[i].time) fb[i].time = fb[i + 1].time;
        fb[i + 1].dirty = 0; /* its pages stay counted, in fb[i] now */
        fb_remove(i + 1);
    }
    if (i > 0 && fb_mergeable(&fb[i - 1], &fb[i])) {
        fb[i - 1].len += fb[i].len;
        if (fb[i].time > fb[i - 1].time) fb[i - 1].time = fb[i].time;
        fb[i].dirty = 0; /* its pages stay counted, in fb[i - 1] now */
        fb_remove(i);
        i--;
    }
    return i;
}

/* The table entry for the free single-owner range [v, v+n), now (its head bits may be
 * set or not: run_len ignores them). */
static struct freeblk fb_entry(uint64_t v, uint64_t n, int dirty) {
    int plain = run_len(v, n) == n && (A.vmeta[v] & VM_ANON);
    struct freeblk e = {(uint32_t)v, (uint32_t)n, now_ms(), (uint8_t)dirty, (uint8_t)(plain && thp_wanted(n)),
                        (uint8_t)!plain};
    return e;
}

/* Caches the free single-owner range e (its pages counted as kept when e.dirty);
 * -1 when the table is full. */
static int fb_insert(struct freeblk e) {
    int lo = 0, hi = fb_n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (fb[mid].start < e.start) lo = mid + 1;
        else hi = mid;
    }
    if (fb_n == FREE_SLOTS) return -1;
    for (int j = fb_n; j > lo; j--) fb[j] = fb[j - 1];
    fb[lo] = e;
    fb_n++;
    if (e.dirty) dirty_pages += e.len;
    fb_merge(lo);
    return 0;
}

/* Takes n pages from the table: the best fit among the entries holding pages (no fault,
 * no zeroing: what glibc's heap gets), else among those without, of the same THP
 * kind. A bigger entry is carved: its first n pages are taken, the rest stays. */
static int fb_take(uint64_t n, int *dirty, uint64_t *v) {
    uint8_t huge = (uint8_t)thp_wanted(n);
    int best = -1;
    for (int i = 0; i < fb_n; i++) {
        if (fb[i].len < n || (!fb[i].dirty && fb[i].huge != huge)) continue;
        if (best < 0 || fb[i].dirty > fb[best].dirty || (fb[i].dirty == fb[best].dirty && fb[i].len < fb[best].len))
            best = i;
    }
    if (best < 0) return -1;
    *v = fb[best].start;
    *dirty = fb[best].dirty;
    if (fb[best].len == n) {
        fb_remove(best);
    } else {
        fb[best].start += (uint32_t)n;
        fb[best].len -= (uint32_t)n;
        if (*dirty) dirty_pages -= n;
    }
    return 0;
}

/* Returns the memory of entry i (its mapping stays cached); its new index, or -1 when
 * the memory could not be returned. */
static int fb_give_back(int i) {
    if (!fb[i].dirty || give_back(fb[i].start, fb[i].len) != 0) return -1;
    fb[i].dirty = 0;
    dirty_pages -= fb[i].len;
    return fb_merge(i);
}

/* Returns the oldest kept memory; 0 when there was some. */
static int fb_give_back_oldest(void) {
    int old = -1;
    for (int i = 0; i < fb_n; i++)
        if (fb[i].dirty && (old < 0 || fb[i].time < fb[old].time)) old = i;
    return old >= 0 && fb_give_back(old) >= 0 ? 0 : -1;
}

/* Freed memory not reused within ADVM_DIRTY_DECAY_MS (default 1000; 0 = kept until the
 * cap pushes it out) is given back: a program that stops allocating does not sit on
 * garbage, while one that frees and allocates in a loop keeps reusing warm pages.
 * Checked on arena calls only (no thread of our own), at most every decay/4. */
static uint32_t decay_ms = 1000, last_sweep;

static void decay(void) {
    if (!decay_ms || !dirty_pages) return;
    uint32_t now = now_ms();
    if (now - last_sweep < decay_ms / 4 + 1) return;
    last_sweep = now;
    for (int i = 0; i < fb_n; i++)
        if (fb[i].dirty && now - fb[i].time >= decay_ms) {
            int j = fb_give_back(i);
            if (j >= 0) i = j; /* merged: go on after it */
        }
}

static void block_free(void *p) {
    decay();
    int64_t sv = block_of(p);
    if (sv < 0) bad_pointer("free");
    uint64_t v = (uint64_t)sv, n = head_pages(v);
    live_add(-(int64_t)(n << A.pshift));
    /* one owner: keep the mapping (and within the cap, the pages) for reuse */
    if (fb_n < FREE_SLOTS && single_owner(v, n)) {
        uint64_t cap = dirty_cap();
        while (dirty_pages + n > cap && fb_give_back_oldest() == 0) {
        }
        int dirty = dirty_pages + n <= cap;
        if (dirty || give_back(v, n) == 0) {
            A.vmeta[v] &= ~(VM_HEAD | VM_NPAGES_MASK);
            if (fb_insert(fb_entry(v, n, dirty)) == 0) return;
        }
    }
    release_block(v, n);
}

/* Moves the pages of block [v, v+old) to [nv, nv+old), run by run, with mremap. */
static int move_pages(uint64_t v, uint64_t nv, uint64_t old) {
    uint64_t i = 0;
    while (i < old) {
        uint64_t k = run_len(v + i, old - i);
        if (!budget_ok() || mremap(page_addr(v + i), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED,
                                   page_addr(nv + i)) == MAP_FAILED) {
            /* put back what moved; the caller copies instead */
            uint64_t j = 0;
            while (j < i) {
                uint64_t kj = run_len(v + j, i - j);
                mremap(page_addr(nv + j), kj << A.pshift, kj << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED,
                       page_addr(v + j));
                j += kj;
            }
            if (i) mmap(page_addr(nv), i << A.pshift, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            return -1;
        }
        seg_mapped(nv + i, k);
        i += k;
    }
    /* the old range is a hole now: reserve it again at once */
    mmap(page_addr(v), old << A.pshift, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    for (uint64_t j = 0; j < old; j++) {
        A.vmeta[nv + j] = A.vmeta[v + j] & ~(VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + j] = 0;
    }
    seg_mapped(v, old);
    if (nv + old > A.va_high) A.va_high = nv + old;
    return 0;
}

/* realloc of an arena block; NULL when the caller must allocate and copy. */
static void *block_realloc(void *p, size_t size) {
    int64_t sv = block_of(p);
    if (sv < 0) bad_pointer("realloc");
    uint64_t v = (uint64_t)sv, old = head_pages(v), n = pages_for(size);
    if (n == old) return p;
    if (n < old) {
        unmap_pages(v + n, old - n);
        ext_free(&A.va, (uint32_t)(v + n), (uint32_t)(old - n));
        set_head(v, n);
        st_add(S_REALLOC_SHRINK, 1);
        live_add(-(int64_t)((old - n) << A.pshift));
        return p;
    }
    if (n >= MAX_BLOCK_PAGES || !budget_ok()) return NULL;
    if (ext_claim(&A.va, (uint32_t)(v + old), (uint32_t)(n - old))) {
        if (map_fresh(v + old, n - old) != 0) {
            ext_free(&A.va, (uint32_t)(v + old), (uint32_t)(n - old));
            return NULL;
        }
        st_add(S_PAGES_FRESH, n - old);
        set_head(v, n);
        st_add(S_REALLOC_INPLACE, 1);
        live_add((int64_t)((n - old) << A.pshift));
        return p;
    }
    int64_t nv = ext_alloc(&A.va, (uint32_t)n);
    if (nv < 0) return NULL;
    if (map_fresh((uint64_t)nv + old, n - old) != 0) {
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    if (move_pages(v, (uint64_t)nv, old) != 0) {
        unmap_pages((uint64_t)nv + old, n - old);
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    st_add(S_PAGES_FRESH, n - old);
    ext_free(&A.va, (uint32_t)v, (uint32_t)old);
    set_head((uint64_t)nv, n);
    st_add(S_REALLOC_MREMAP, 1);
    live_add((int64_t)((n - old) << A.pshift));
    return page_addr((uint64_t)nv);
}

/* ---- virtual copy ---------------------------------------------------------------- */

static int pagemap_fd(void) {
    if (A.pagemap_fd < 0) A.pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    return A.pagemap_fd;
}

static int write_all(int fd, const void *buf, size_t len, off_t off) {
    const char *b = buf;
    while (len) {
        ssize_t w = pwrite(fd, b, len, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w, len -= (size_t)w, off += w;
    }
    return 0;
}

/* Keeping the pages a copy maps over. A virtual copy maps memfd pages over its
 * destination, and the pages the program had last written there were thrown away, so
 * the next allocations faulted and zeroed as many again (b25_matrix.R: twice glibc's
 * page allocations). Instead they are moved (mremap: page tables only) into a new range
 * the size of the block they belong to, so that the next allocation of that size (a
 * program copying a vector allocates the same size again) takes them, and that range
 * is cached as a freed block with its pages.
 *
 * Only the destination's: its whole pages are being overwritten by the copy, and the
 * move leaves them mapped (MREMAP_DONTUNMAP: empty until the memfd mapping replaces
 * them), so no access there ever faults. The source must keep its bytes readable
 * throughout (another thread may read it: legal C), so it is never moved: the memfd
 * mapping replaces it in one mmap, and a reader sees the old page or the new one, with
 * the same bytes. */
struct salvage {
    int64_t base; /* the new range, -1 when nothing was kept */
    uint64_t len, off; /* its pages; where the moved pages start in it */
};

/* Moves the pages of [v, v+k) away; [v, v+k) stays mapped, empty, for the caller to map
 * over. */
static struct salvage salvage_begin(uint64_t v, uint64_t k) {
    struct salvage sv = {-1, k, 0};
    /* the block around [v, v+k): a copy skips only its partial first and last pages */
    for (uint64_t h = v; h + 4 > v && h < A.va_high; h--) {
        if ((A.vmeta[h] & VM_HEAD) && h + head_pages(h) >= v + k && h + head_pages(h) <= v + k + 4) {
            sv.len = head_pages(h);
            sv.off = v - h;
            break;
        }
        if (h == 0) break;
    }
    uint64_t n = sv.len;
    if (k < SALVAGE_MIN_PAGES || fb_n == FREE_SLOTS || dirty_pages + k > dirty_cap() || !single_owner(v, k) ||
        !budget_ok())
        return sv;
    int64_t r = ext_alloc(&A.va, (uint32_t)n);
    if (r < 0) return sv;
    if (n > k && map_fresh((uint64_t)r, n) != 0) {
        ext_free(&A.va, (uint32_t)r, (uint32_t)n);
        return sv;
    }
    uint64_t to = (uint64_t)r + sv.off;
    if (mremap(page_addr(v), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               page_addr(to)) == MAP_FAILED) {
        if (n > k) unmap_pages((uint64_t)r, n);
        ext_free(&A.va, (uint32_t)r, (uint32_t)n);
        return sv;
    }
    for (uint64_t j = 0; j < k; j++) {
        A.vmeta[to + j] = A.vmeta[v + j] & ~(VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + j] &= VM_HEAD | VM_NPAGES_MASK;
    }
    seg_mapped(to, k);
    if ((uint64_t)r + n > A.va_high) A.va_high = (uint64_t)r + n;
    st_add(S_PAGES_FRESH, n - k); /* the partial first and last pages around the kept ones */
    sv.base = r;
    return sv;
}

/* After the mapping over [v, v+k): caches the kept range, or on failure (ok == 0)
 * moves the pages back. */
static void salvage_end(uint64_t v, uint64_t k, struct salvage sv, int ok) {
    if (sv.base < 0) return;
    uint64_t r = (uint64_t)sv.base, n = sv.len, from = r + sv.off;
    if (!ok) {
        mremap(page_addr(from), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED, page_addr(v));
        for (uint64_t j = 0; j < k; j++) {
            A.vmeta[v + j] = (A.vmeta[v + j] & (VM_HEAD | VM_NPAGES_MASK)) | A.vmeta[from + j];
            A.vmeta[from + j] = VM_MAPPED | VM_ANON; /* a hole now; released below */
        }
        release_block(r, n);
        return;
    }
    /* huge when its size asks for it: the moved mapping kept its THP advice */
    if (fb_insert(fb_entry(r, n, 1)) != 0) release_block(r, n);
    else st_add(S_PAGES_SALVAGED, k);
}

/* Remaps [v, v+k) privately onto memfd page (gen g, page f..): takes the new references
 * first, then drops the old ones, so a page mapped on both sides is never punched.
 * keep: [v, v+k) is a copy's destination, whose pages may be kept (see salvage). */
static int remap_private(uint64_t v, uint64_t k, int g, uint64_t f, int keep) {
    if (!budget_ok()) return -1;
    /* a source's shared run is remapped onto its own pages: nothing to keep */
    int same = 0;
    for (uint64_t i = 0; i < k && !same; i++) {
        uint64_t m = A.vmeta[v + i];
        same = !(m & VM_ANON) && (m & VM_MAPPED) && (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT) == g &&
               (m & VM_FPAGE_MASK) == f + i;
    }
    struct salvage kept = {-1, 0, 0};
    if (keep && !same) kept = salvage_begin(v, k);
    if (mmap(page_addr(v), k << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, A.gen_fd[g],
             (off_t)(f << A.pshift)) == MAP_FAILED) {
        salvage_end(v, k, kept, 0);
        return -1;
    }
    salvage_end(v, k, kept, 1);
    if (g == A.gen)
        for (uint64_t i = 0; i < k; i++) A.fref[f + i]++;
    A.gen_refs[g] += k;
    unref_pages(v, k);
    for (uint64_t i = 0; i < k; i++) {
        uint64_t keep = A.vmeta[v + i] & (VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + i] = keep | VM_MAPPED | VM_PRIV | ((uint64_t)g << VM_GEN_SHIFT) | (f + i);
    }
    seg_mapped(v, k);
    return 0;
}

/* Makes [v, v+k) of the source shareable: every page becomes a private mapping of a
 * memfd page holding its current contents. Shared runs are only remapped private;
 * pages already copied-on-write (anonymous, seen in pagemap) are written once into
 * fresh memfd pages so that the copy shares them too. Returns how many pages are ready. */
static uint64_t prepare_source(uint64_t v, uint64_t k) {
    uint64_t i = 0;
    uint64_t pm[512];
    while (i < k) {
        uint64_t m = A.vmeta[v + i];
        uint64_t r = run_len(v + i, k - i);
        if (m & VM_ANON) {
            /* nobody shares this block yet: its present pages are written once into fresh
             * memfd pages (the others stay holes, which read as zero), then the run is
             * mapped private onto them */
            int fd = cur_fd();
            int64_t f = fd < 0 ? -1 : ext_alloc(&A.fd, (uint32_t)r);
            if (f < 0) return i;
            uint64_t done = 0, moved = 0;
            int ok = 1;
            while (ok && done < r) {
                uint64_t chunk = r - done < 512 ? r - done : 512;
                int pfd = pagemap_fd();
                off_t off = (off_t)(((uintptr_t)page_addr(v + i + done) >> A.pshift) * 8);
                if (pfd < 0 || pread(pfd, pm, chunk * 8, off) != (ssize_t)(chunk * 8)) {
                    ok = 0;
                    break;
                }
                uint64_t j = 0;
                while (ok && j < chunk) {
                    if (!((pm[j] >> 63 | pm[j] >> 62) & 1)) {
                        j++;
                        continue;
                    }
                    uint64_t a = j;
                    while (j < chunk && ((pm[j] >> 63 | pm[j] >> 62) & 1)) j++;
                    uint64_t at = done + a, cnt = j - a;
                    ok = write_all(fd, page_addr(v + i + at), cnt << A.pshift,
                                   (off_t)(((uint64_t)f + at) << A.pshift)) == 0;
                    moved += cnt;
                }
                done += chunk;
            }
            if (!ok || remap_private(v + i, r, A.gen, (uint64_t)f, 0) != 0) {
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((uint64_t)f << A.pshift),
                          (off_t)(r << A.pshift));
                ext_free(&A.fd, (uint32_t)f, (uint32_t)r);
                return i;
            }
            st_add(S_PAGES_MOVED, moved);
            i += r;
            continue;
        }
        if (!(m & VM_PRIV)) {
            if (remap_private(v + i, r, (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT), m & VM_FPAGE_MASK, 0) != 0)
                return i;
            i += r;
            continue;
        }
        /* private: look for pages that were written since they were shared */
        uint64_t done = 0;
        while (done < r) {
            uint64_t chunk = r - done < 512 ? r - done : 512;
            int pfd = pagemap_fd();
            off_t off = (off_t)(((uintptr_t)page_addr(v + i + done) >> A.pshift) * 8);
            if (pfd < 0 || pread(pfd, pm, chunk * 8, off) != (ssize_t)(chunk * 8)) return i + done;
            uint64_t j = 0;
            while (j < chunk) {
                int anon = (pm[j] >> 63 | pm[j] >> 62) & 1 && !((pm[j] >> 61) & 1);
                if (!anon) {
                    j++;
                    continue;
                }
                uint64_t a = j;
                while (j < chunk && ((pm[j] >> 63 | pm[j] >> 62) & 1) && !((pm[j] >> 61) & 1)) j++;
                uint64_t pv = v + i + done + a, cnt = j - a;
                int fd = cur_fd();
                int64_t f = fd < 0 ? -1 : ext_alloc(&A.fd, (uint32_t)cnt);
                if (f < 0) return i + done + a;
                if (write_all(fd, page_addr(pv), cnt << A.pshift, (off_t)((uint64_t)f << A.pshift)) != 0 ||
                    remap_private(pv, cnt, A.gen, (uint64_t)f, 0) != 0) {
                    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((uint64_t)f << A.pshift),
                              (off_t)(cnt << A.pshift));
                    ext_free(&A.fd, (uint32_t)f, (uint32_t)cnt);
                    return i + done + a;
                }
                /* remap_private took the source's reference to the fresh pages */
                st_add(S_PAGES_MOVED, cnt);
            }
            done += chunk;
        }
        i += r;
    }
    return k;
}

/* A large copy between arena addresses. Returns d; falls back to glibc where it must. */
static void *big_copy(void *d, const void *s, size_t n, copy_fn plain) {
    st_add(S_COPIES_SEEN, 1);
    uintptr_t du = (uintptr_t)d, su = (uintptr_t)s;
    enum counter why;
    if (!in_arena(d) || !in_arena(s) || !in_arena((const char *)d + n - 1) || !in_arena((const char *)s + n - 1))
        why = S_FB_NOT_ARENA;
    else if (((du - su) & (A.ps - 1)) != 0)
        why = S_FB_OFFSET;
    else if ((du < su ? su - du : du - su) < n)
        why = S_FB_OVERLAP;
    else if (A.mode != MODE_COW)
        return plain(d, s, n);
    else
        why = S_NSTATS;
    size_t head = (A.ps - (du & (A.ps - 1))) & (A.ps - 1);
    if (why == S_NSTATS && (head >= n || ((n - head) >> A.pshift) == 0)) why = S_FB_SHORT;
    if (why != S_NSTATS) {
        st_add(why, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    if (lock_mine) { /* a signal handler interrupted this thread inside the shim */
        st_add(S_FB_REENTRANT, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    uint64_t k = (n - head) >> A.pshift;
    size_t tail = n - head - (k << A.pshift);
    uint64_t dv = page_of((char *)d + head), sv = page_of((const char *)s + head);
    int saved = errno;
    lock_take();
    uint64_t shared = 0;
    why = S_NSTATS;
    for (uint64_t i = 0; i < k && why == S_NSTATS; i++)
        if (!(A.vmeta[sv + i] & VM_MAPPED) || !(A.vmeta[dv + i] & VM_MAPPED)) why = S_FB_NOT_ARENA;
    if (why == S_NSTATS) {
        if (!budget_ok()) why = S_FB_BUDGET;
        else {
            uint64_t ready = prepare_source(sv, k);
            uint64_t i = 0;
            while (i < ready) {
                uint64_t m = A.vmeta[sv + i];
                uint64_t r = run_len(sv + i, ready - i);
                if (remap_private(dv + i, r, (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT), m & VM_FPAGE_MASK, 1) != 0)
                    break;
                i += r;
            }
            shared = i;
            if (shared < k) why = budget_ok() ? S_FB_ERROR : S_FB_BUDGET;
        }
    }
    lock_drop();
    errno = saved;
    if (shared == 0 && why != S_NSTATS) {
        st_add(why, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    if (head) real_memcpy(d, s, head);
    size_t rest = (k - shared) << A.pshift;
    if (rest + tail)
        real_memcpy((char *)d + head + (shared << A.pshift), (const char *)s + head + (shared << A.pshift), rest + tail);
    st_add(S_COPIES_VIRTUAL, 1);
    st_add(S_PAGES_SHARED, shared);
    st_add(S_BYTES_PARTIAL, head + tail);
    if (shared < k) {
        st_add(why, 1);
        st_add(S_FB_BYTES, rest);
    }
    return d;
}

/* ---- fork ------------------------------------------------------------------------ */

/* Before fork: no page may stay a writable shared mapping, or parent and child would
 * see each other's writes. Every shared run becomes a private mapping of the same
 * memfd pages (contents unchanged: they are the memfd's). */
static void fork_prepare(void) {
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
            int g = (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT);
            if (mmap(page_addr(v), r << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, A.gen_fd[g],
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
static void new_generation(void) {
    int old = A.gen;
    A.gen = -1;
    for (int g = 0; g < MAX_GENS; g++)
        if (A.gen_fd[g] < 0 && A.gen_refs[g] == 0 && g != old) {
            A.gen = g;
            break;
        }
    if (old >= 0 && A.gen_refs[old] == 0 && A.gen_fd[old] >= 0) {
        close(A.gen_fd[old]);
        A.gen_fd[old] = -1;
    }
    /* the new generation starts with no references and the whole memfd free */
    mmap(A.fref, sizeof(uint32_t) * ARENA_PAGES, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    A.fd.n = 1;
    A.fd.v[0].start = 0;
    A.fd.v[0].len = (uint32_t)ARENA_PAGES;
}

static void fork_parent(void) {
    if (state == 2) {
        new_generation();
        st_add(S_FORKS, 1);
    }
    lock_drop();
}

static void fork_child(void) {
    if (state == 2) {
        new_generation();
        if (A.pagemap_fd >= 0) close(A.pagemap_fd); /* it reads the parent's pagemap */
        A.pagemap_fd = -1;
        for (int i = 0; i < S_NSTATS; i++)
            if (i != S_LIVE_BYTES) stats[i] = 0;
        A.pid = getpid();
    }
    lock_drop();
}

/* ---- initialisation and exit ----------------------------------------------------- */

static uint64_t read_number(const char *path, uint64_t dflt) {
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dflt;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return dflt;
    buf[n] = 0;
    return parse_u64(buf, dflt);
}

static void init_locked(void) {
    const char *m = env("ADVM_MODE");
    A.mode = !m || str_eq(m, "cow") ? MODE_COW : str_eq(m, "ksm") ? MODE_KSM : MODE_ALLOC;
    if (m && str_eq(m, "off")) return; /* stays disabled: everything goes to glibc */
    A.ps = (size_t)sysconf(_SC_PAGESIZE);
    A.pshift = (unsigned)__builtin_ctzl(A.ps);
    uint64_t tp = parse_u64(env("ADVM_THRESHOLD_PAGES"), 2);
    A.threshold = (tp ? tp : 1) << A.pshift;
    A.stats_dir = env("ADVM_STATS_DIR");
    thp_min = parse_u64(env("ADVM_THP_MIN_KIB"), 2048) << 10;
    const char *fresh = env("ADVM_COW_FRESH");
    cow_fresh_memfd = fresh && str_eq(fresh, "memfd");
    populate_max = parse_u64(env("ADVM_POPULATE_KIB"), 256) << 10;
    dirty_floor_pages = (parse_u64(env("ADVM_DIRTY_CACHE_KIB"), 4096) << 10) >> A.pshift;
    dirty_live_pct = parse_u64(env("ADVM_DIRTY_CACHE_PCT"), 100);
    decay_ms = (uint32_t)parse_u64(env("ADVM_DIRTY_DECAY_MS"), 1000);
    A.pagemap_fd = -1;
    A.pid = getpid();
    for (int g = 0; g < MAX_GENS; g++) A.gen_fd[g] = -1;
    A.gen = 0;
    /* Half of the process's VMA limit for the arena; the program keeps the rest. */
    A.seg_budget = read_number("/proc/sys/vm/max_map_count", 65530) / 2;
    size_t len = ARENA_PAGES << A.pshift;
    /* A high fixed hint: the kernel's top-down search for mmap(NULL) never reaches it
     * in practice, so the short hole left by mremap is never taken by someone else. */
    void *base = MAP_FAILED;
    for (uintptr_t hint = 0x100000000000ull; hint <= 0x500000000000ull && base == MAP_FAILED;
         hint += 0x100000000000ull)
        base = mmap((void *)hint, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                    -1, 0);
    if (base == MAP_FAILED) base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return;
    A.base = (uintptr_t)base;
    A.vmeta = map_table(sizeof(uint64_t) * ARENA_PAGES);
    A.fref = map_table(sizeof(uint32_t) * ARENA_PAGES);
    A.segbits = map_table(ARENA_PAGES / 8);
    if (!A.vmeta || !A.fref || !A.segbits || ext_init(&A.va) || ext_init(&A.fd)) return;
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) return;
    arena_lo = A.base;
    arena_len = len;
    /* copies may use a higher threshold than allocations (ADVM_COPY_MIN_PAGES) */
    uint64_t cp = parse_u64(env("ADVM_COPY_MIN_PAGES"), 16) << A.pshift;
    if (A.mode == MODE_COW) copy_min = cp > A.threshold ? cp : A.threshold;
    __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
}

/* Returns 1 when the arena is ready. Calls made while another thread (or this one,
 * from inside dlsym) initialises are served by glibc. */
static int ready(void) {
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 2) return 1;
    if (s != 0 || environ == NULL) return 0; /* environ is NULL before libc's own init */
    int zero = 0;
    if (!__atomic_compare_exchange_n(&state, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return 0;
    int saved = errno;
    resolve();
    lock_take();
    init_locked();
    if (state != 2) __atomic_store_n(&state, 3, __ATOMIC_RELEASE);
    lock_drop();
    errno = saved;
    return state == 2;
}

__attribute__((constructor)) static void advm_preload_init(void) { ready(); }

static char *put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n) *p++ = tmp[--n];
    return p;
}
static char *put_str(char *p, const char *s) {
    while (*s) *p++ = *s++;
    return p;
}

/* At exit each process writes its counters to ADVM_STATS_DIR/<pid>.stats, where
 * `advm run --stats` sums them. Writing a file keeps the program's stdout clean. */
__attribute__((destructor)) static void advm_preload_fini(void) {
    if (state != 2 || !A.stats_dir) return;
    char path[512], buf[2048];
    char *p = path, *end = path + sizeof path - 32;
    for (const char *s = A.stats_dir; *s && p < end; s++) *p++ = *s;
    p = put_str(p, "/");
    p = put_u64(p, (uint64_t)getpid());
    p = put_str(p, ".stats");
    *p = 0;
    p = buf;
    p = put_str(p, "mode ");
    p = put_str(p, A.mode == MODE_COW ? "cow" : A.mode == MODE_KSM ? "ksm" : "alloc");
    p = put_str(p, "\nthreshold_bytes ");
    p = put_u64(p, A.threshold);
    p = put_str(p, "\ncopy_min_bytes ");
    p = put_u64(p, copy_min == SIZE_MAX ? 0 : copy_min);
    p = put_str(p, "\nvma_segments ");
    p = put_u64(p, A.segs);
    p = put_str(p, "\n");
    for (int i = 0; i < S_NSTATS; i++) {
        p = put_str(p, stat_names[i]);
        p = put_str(p, " ");
        p = put_u64(p, __atomic_load_n(&stats[i], __ATOMIC_RELAXED));
        p = put_str(p, "\n");
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, buf, (size_t)(p - buf));
    (void)w;
    close(fd);
}

/* ---- the hooks ------------------------------------------------------------------- */

static void *arena_alloc_dirty(size_t n, int *dirty) {
    int saved = errno;
    lock_take();
    void *p = block_alloc(n, dirty);
    lock_drop();
    errno = saved;
    if (!p) st_add(S_ALLOC_FALLBACK, 1);
    return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* For malloc (not calloc: its pages may stay untouched and cost nothing) a small block
 * is about to be written whole; one MADV_POPULATE_WRITE is much cheaper than a page
 * fault per page. */
static void *arena_alloc(size_t n) {
    int dirty;
    void *p = arena_alloc_dirty(n, &dirty);
    if (p && !dirty && n <= populate_max) {
        int saved = errno;
        madvise(p, n, MADV_POPULATE_WRITE);
        errno = saved;
    }
    return p;
}

EXPORT void *malloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_malloc(n);
}

EXPORT void *calloc(size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (n >= A.threshold && A.threshold && ready()) {
        int dirty;
        void *p = arena_alloc_dirty(n, &dirty); /* fresh or returned pages are zero */
        if (p && dirty) memset(p, 0, n);
        if (p) return p;
    }
    return __libc_calloc(nmemb, size);
}

EXPORT void free(void *p) {
    if (UNLIKELY(in_arena(p))) {
        int saved = errno;
        lock_take();
        block_free(p);
        lock_drop();
        errno = saved;
        return;
    }
    __libc_free(p);
}

EXPORT void *realloc(void *p, size_t n) {
    if (!in_arena(p)) {
        if (p == NULL) return malloc(n);
        return __libc_realloc(p, n);
    }
    if (n == 0) {
        free(p);
        return NULL;
    }
    int saved = errno;
    lock_take();
    int64_t v = block_of(p);
    if (v < 0) bad_pointer("realloc");
    size_t old = head_pages((uint64_t)v) << A.pshift;
    void *q = n >= A.threshold ? block_realloc(p, n) : NULL;
    lock_drop();
    errno = saved;
    if (q) return q;
    /* below the threshold, or the arena could not grow it: allocate and copy */
    q = n >= A.threshold ? arena_alloc(n) : NULL;
    if (!q) q = __libc_malloc(n);
    if (!q) return NULL;
    real_memcpy(q, p, old < n ? old : n);
    free(p);
    return q;
}

EXPORT void *reallocarray(void *p, size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n);
}

static int pow2(size_t a) { return a && !(a & (a - 1)); }

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    if (pow2(align) && align % sizeof(void *) == 0 && n >= A.threshold && A.threshold && ready() && align <= A.ps) {
        void *p = arena_alloc(n);
        if (p) {
            *out = p;
            return 0;
        }
    }
    resolve();
    if (real_posix_memalign) return real_posix_memalign(out, align, n);
    if (!pow2(align) || align % sizeof(void *)) return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *memalign(size_t align, size_t n) {
    if (align <= 4096 && n >= A.threshold && A.threshold && ready() && align <= A.ps) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_memalign(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
    if (!pow2(align)) { /* as glibc 2.38+: the alignment must be a power of two */
        errno = EINVAL;
        return NULL;
    }
    return memalign(align, n);
}

EXPORT void *valloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_valloc(n);
}

EXPORT void *pvalloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_pvalloc(n);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (in_arena(p)) {
        lock_take();
        int64_t v = block_of(p);
        size_t n = v < 0 ? 0 : head_pages((uint64_t)v) << A.pshift;
        lock_drop();
        return n;
    }
    resolve();
    return real_usable ? real_usable(p) : 0;
}

EXPORT void *memcpy(void *restrict d, const void *restrict s, size_t n) {
    if (UNLIKELY(n >= copy_min) && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memcpy);
    return real_memcpy(d, s, n);
}

EXPORT void *memmove(void *d, const void *s, size_t n) {
    if (UNLIKELY(n >= copy_min) && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memmove);
    return real_memmove(d, s, n);
}

EXPORT void *__memcpy_chk(void *d, const void *s, size_t n, size_t dlen) {
    if (UNLIKELY(n >= copy_min) && n <= dlen && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memcpy);
    if (!real_memcpy_chk) resolve();
    if (real_memcpy_chk) return real_memcpy_chk(d, s, n, dlen);
    if (n > dlen) abort();
    return real_memcpy(d, s, n);
}

EXPORT void *__memmove_chk(void *d, const void *s, size_t n, size_t dlen) {
    if (UNLIKELY(n >= copy_min) && n <= dlen && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memmove);
    if (!real_memmove_chk) resolve();
    if (real_memmove_chk) return real_memmove_chk(d, s, n, dlen);
    if (n > dlen) abort();
    return real_memmove(d, s, n);
}
