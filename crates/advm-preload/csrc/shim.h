/*
 * shim.h: what the C files of the advm preload shim share (internal: not installed).
 * Which file owns what: DESIGN.md, "Source files".
 *
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
 * generation (a page is hole-punched when it drops to 0, or at 1 when the one view left
 * has its own anonymous copy of it; a view left alone that has not written it maps it
 * shared from then on). fork() freezes every shared
 * mapping to private and starts a new memfd generation in parent and child, so neither
 * ever writes or punches a memfd page the other may map.
 */

#ifndef ADVM_SHIM_H
#define ADVM_SHIM_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h> /* memset only: the shim does not replace it */
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define UNLIKELY(x) __builtin_expect(!!(x), 0)

extern char **environ;

/* ---- arena geometry and tables ------------------------------------------------ */

#define ARENA_PAGES (1ull << 24) /* 64 GiB of 4 KiB pages */
#define MAX_GENS 64
#define MAX_EXTENTS (1u << 16)

/* vmeta bits */
#define VM_FPAGE_MASK ((1ull << 27) - 1) /* memfd pages are below ARENA_PAGES */
/* A private view the program has written: the kernel holds an anonymous copy of the page,
 * and the memfd page under it was released when no other view needed it (see
 * release_dead). It holds no reference; the memfd offset is only where its mapping
 * points. */
#define VM_DETACHED (1ull << 27)
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

struct arena {
    enum mode mode;
    size_t ps;
    unsigned pshift;
    uintptr_t base;
    size_t threshold; /* bytes: allocations and copies at least this big are ours */
    uint64_t *vmeta;
    uint32_t *fref;
    /* XOR of the arena pages mapping memfd page f (current generation): when fref[f] is
     * 1, the one view left, found without a reverse map */
    uint32_t *fview;
    /* Views detached from memfd page f (current generation; see VM_DETACHED): f was
     * punched, but those views still map its offset, and a program's MADV_DONTNEED there
     * reads it again. So f is not handed out again (it would show another block's bytes
     * there) until the last of them is unmapped; then it is punched once more (a read of
     * the hole may have filled it) and freed. Nonzero only where fref[f] is 0, except
     * during trim_views, which counts written views in it. */
    uint32_t *fdet;
    uint64_t *segbits; /* upper bound on VMAs: a bit where a mapping may begin */
    /* a bit per arena page whose protection the program changed from read-write
     * (mprotect): never remapped, shared, copied virtually or kept at free, so that its
     * protection (and the faults it gives) stay the program's */
    uint64_t *protbits;
    /* a bit per arena page the program marked MADV_WIPEONFORK or MADV_DONTFORK: anonymous
     * memory from then on, and, like protbits, never remapped, shared, copied virtually or
     * kept at free (a new mapping there would lose the mark); cleared when unmapped */
    uint64_t *forkbits;
    uint64_t segs, seg_budget;
    struct extents va, fd;
    uint64_t va_high; /* pages below this may be in use (bounds fork scans) */
    int gen;          /* current memfd generation, -1 when none is free */
    int gen_fd[MAX_GENS];
    uint64_t gen_refs[MAX_GENS];
    /* detached views of each generation still mapped: its slot is not reused for a new
     * generation until they are gone, or they would be taken for views of it (undetach) */
    uint64_t gen_det[MAX_GENS];
    /* device and inode of each generation's memfd and of the pagemap file, checked before
     * every use (fd_is): the program may have closed the number and reused it */
    dev_t gen_dev[MAX_GENS];
    ino_t gen_ino[MAX_GENS];
    uint64_t gen_lost; /* generations whose memfd the program closed (one bit each) */
    int retire;        /* the current generation is lost: lock_take starts a new one */
    int pagemap_fd;
    dev_t pm_dev;
    ino_t pm_ino;
    pid_t pid;
    const char *stats_dir;
    /* The program set a finite RLIMIT_AS or RLIMIT_DATA: the arena takes no new block and
     * makes no copy, and holds only its live blocks (see retire_arena). */
    int retired;
};
extern struct arena A;

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
extern int fb_n;              /* entries in the free table (freecache.c) */
extern uint64_t dirty_pages; /* pages the free table keeps */

/* Configuration, set once by init_locked from the ADVM_* variables (see init.c). */
extern uint64_t dirty_floor_pages, dirty_live_pct; /* the kept-pages cap (dirty_cap) */
extern uint32_t decay_ms;                          /* kept pages unused this long are returned */
/* how long a freed block that asks for huge pages keeps them, at most (0, the default: given
 * back at free) */
extern uint32_t huge_decay_ms;
extern uint64_t populate_max;                      /* malloc pre-faults blocks up to this size */
/* cow: a new block is anonymous until it is first copied (default), or a shared memfd
 * mapping from the start (ADVM_COW_FRESH=memfd: copies cost no byte, but every
 * allocation pays shmem faults and hole punching) */
extern int cow_fresh_memfd;
/* Anonymous blocks of at least this size (ADVM_THP_MIN_KIB, default 2 MiB; 0 = never)
 * ask for transparent huge pages: one fault per 2 MiB instead of 512. Not in ksm mode,
 * where KSM must split huge pages before it can merge them. Measured: system time of
 * b25_matrix.R 0.77 s -> 0.55 s, b25_vector.R 0.50 s -> 0.33 s, memory not higher. */
extern uint64_t thp_min; /* bytes: anonymous blocks at least this big ask for THP */

/* Whether an anonymous block of n pages asks for transparent huge pages. */
static inline int thp_wanted(uint64_t n) { return A.mode != MODE_KSM && thp_min && (n << A.pshift) >= thp_min; }

/* Set while this thread holds the lock or is taking it. memcpy is async-signal-safe: a
 * signal handler that copies while its thread is inside the shim must not wait for the
 * lock that thread holds (a deadlock), so such a copy is a plain one. Set before the
 * lock is taken and cleared after it is released, so a handler never sees it clear
 * while the lock is this thread's. Initial-exec TLS: no allocation on first use. */
extern __thread volatile int lock_mine __attribute__((tls_model("initial-exec")));
void lock_take(void);
void lock_drop(void);
extern int state; /* 0 none, 1 initialising, 2 ready, 3 disabled */
extern uintptr_t arena_lo, arena_len; /* 0 until ready: in_arena() is false */
extern size_t copy_min;               /* copies at least this big are looked at */

/* ---- statistics ------------------------------------------------------------------ */

enum counter {
    S_BLOCKS, S_BLOCK_BYTES, S_LIVE_BYTES, S_PEAK_BYTES, S_ALLOC_FALLBACK,
    S_COPIES_SEEN, S_COPIES_VIRTUAL, S_PAGES_SHARED, S_BYTES_PARTIAL, S_PAGES_MOVED,
    S_FB_NOT_ARENA, S_FB_OFFSET, S_FB_OVERLAP, S_FB_SHORT, S_FB_BUDGET,
    S_FB_ERROR, S_FB_BYTES, S_REALLOC_INPLACE, S_REALLOC_MREMAP, S_REALLOC_SHRINK,
    S_FB_REENTRANT, S_FORKS, S_GENS_EXHAUSTED, S_CACHE_HITS, S_DIRTY_HITS, S_PAGES_SALVAGED, S_PAGES_FRESH, S_PAGES_RETURNED,
    S_PAGES_DETACHED, S_PAGES_ADOPTED, S_FDS_LOST, S_FB_PROTECTED, S_PAGES_TRIMMED, S_TRIMS, S_TRIM_US, S_PAGES_DROPPED,
    S_COPIES_FENCED, S_FB_UNFENCED, S_MAPS_READ, S_MAPS_READ_US, S_NSTATS
};
extern uint64_t stats[S_NSTATS];

static inline void st_add(enum counter s, uint64_t v) { __atomic_fetch_add(&stats[s], v, __ATOMIC_RELAXED); }

static inline void live_add(int64_t bytes) {
    uint64_t now = __atomic_add_fetch(&stats[S_LIVE_BYTES], (uint64_t)bytes, __ATOMIC_RELAXED);
    if (bytes > 0 && now > stats[S_PEAK_BYTES]) stats[S_PEAK_BYTES] = now;
}

typedef void *(*copy_fn)(void *, const void *, size_t);
extern copy_fn real_memcpy;

static inline void *page_addr(uint64_t v) { return (void *)(A.base + (v << A.pshift)); }
static inline uint64_t page_of(const void *p) { return ((uintptr_t)p - A.base) >> A.pshift; }
static inline int in_arena(const void *p) { return (uintptr_t)p - arena_lo < arena_len; }
static inline off_t off_of(uint64_t m) { return (off_t)((m & VM_FPAGE_MASK) << A.pshift); }
static inline void set_head(uint64_t v, uint64_t n) {
    A.vmeta[v] = (A.vmeta[v] & ~VM_NPAGES_MASK) | VM_HEAD | (n << VM_NPAGES_SHIFT);
}
static inline uint64_t head_pages(uint64_t v) { return (A.vmeta[v] & VM_NPAGES_MASK) >> VM_NPAGES_SHIFT; }

/* Whether pagemap entry e is the process's own anonymous page (present or swapped, not a
 * page of a file): in a private view of the memfd, a page the program has written. A
 * swap-type entry of a file page (a page under migration: bits 62 and 61) is the file's. */
static inline int pm_written(uint64_t e) { return ((e >> 62 | e >> 63) & 1) && !((e >> 61) & 1); }

/* Whether pagemap entry e is surely such a page: not a swap-type entry carrying the
 * userfaultfd write-protect bit (57), which may be a marker over a page never faulted,
 * still read from the file. What may be either is neither punched under (pm_surely) nor
 * adopted (!pm_written). */
static inline int pm_surely(uint64_t e) { return pm_written(e) && !((e >> 62) & (e >> 57) & 1); }

/* arena.c: the reservation's tables, extents, VMA budget, memfd generations, blocks */
void *map_table(size_t bytes);
int ext_init(struct extents *e);
int64_t ext_alloc(struct extents *e, uint32_t len);
void ext_free(struct extents *e, uint32_t start, uint32_t len);
void seg_mapped(uint64_t v, uint64_t n);
int fd_is(int fd, dev_t dev, ino_t ino);
int gen_fd(int g);
void gen_unref(int g, uint64_t n);
void new_generation(void);
void unshare_lost(uint64_t v, uint64_t n);
int cur_fd(void);
void unref_pages(uint64_t v, uint64_t n);
extern uint64_t trim_every; /* pages allocated between two trims (ADVM_TRIM_KIB; 0: none) */
void trim_views(void);
void trim_count(uint64_t pages);
void view_moved(uint64_t from, uint64_t to, uint64_t n);
int pagemap_fd(void);
/* The pagemap entries of the arena's pages v..v+n into pm (n at most its length); 1
 * when all n were read. */
static inline int pm_read(int pfd, uint64_t v, uint64_t n, uint64_t *pm) {
    off_t off = (off_t)(((uintptr_t)page_addr(v) >> A.pshift) * 8);
    return pread(pfd, pm, n * 8, off) == (ssize_t)(n * 8);
}
int map_fresh(uint64_t v, uint64_t n);
void unmap_pages(uint64_t v, uint64_t n);
uint64_t run_len(uint64_t v, uint64_t max);
void *block_alloc(size_t size, int *dirty);
int64_t block_of(const void *p);
void bad_pointer(const char *what);
void release_block(uint64_t v, uint64_t n);
void *block_realloc(void *p, size_t size);
void retire_arena(void);
int limits_finite(void);

/* freecache.c: freed blocks kept with their mapping (and pages) for reuse */
uint64_t dirty_cap(void);
int keeps_pages(uint64_t n);
void cache_flush(void);
int single_owner(uint64_t v, uint64_t n);
struct freeblk fb_entry(uint64_t v, uint64_t n, int dirty);
int fb_insert(struct freeblk e);
int fb_take(uint64_t n, int *dirty, uint64_t *v);
int fb_at(uint64_t v, uint64_t *to);
void decay(void);
void kept_after_huge(void);
void block_free(void *p);

/* arena.c: pages whose protection the program changed (protbits); views the program
 * drops (madvise) */
int prot_any(uint64_t v, uint64_t n);
void prot_set(uint64_t v, uint64_t n, int on);
void make_private(uint64_t v, uint64_t n);
void drop_views(uint64_t v, uint64_t n);
int single_threaded(void);
void fork_mark(uint64_t v, uint64_t n, int views);

/* maps.c: the mapping budget (the arena's mappings and an estimate of the program's
 * against vm.max_map_count) */
void maps_init(uint64_t max_map_count);
void maps_added(uint64_t n);
void maps_failed(void);
int budget_ok(void);

/* copy.c: virtual copies between arena blocks */
void *big_copy(void *d, const void *s, size_t n, copy_fn plain);

/* interpose.c: the program's madvise over arena pages (pmem.c's madvise asks first) */
int advise_arena(void *addr, size_t len, int advice);

/* fork.c: the pthread_atfork handlers */
void fork_prepare(void);
void fork_parent(void);
void fork_child(void);

/* init.c: reads the environment and sets the arena up (lock held) */
void init_locked(void);

#endif
