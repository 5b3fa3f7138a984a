/* advm: application-directed virtual memory — C API.
 *
 * Link with -ladvm (libadvm.so or libadvm.a from `cargo build -p advm-capi`).
 * Both headers need C99 or later (stdint.h, long long) or C++11 or later; tested with
 * -std=c99/c11 -pedantic and -std=c++11/c++17 (tests/c_programs.rs).
 * No function is async-signal-safe: do not call them from a signal handler.
 * Functions returning int return 0 (or a count) on success or a negative errno (errno
 * is set to it too, for callers that check errno); functions returning a pointer
 * return NULL with errno set. A call that succeeds leaves errno as it found it. A NULL
 * handle or NULL output pointer is EINVAL everywhere (a destroy/free of NULL does
 * nothing); docs/capi.md has the table of every call's errors.
 *
 * Naming: functions are advm_<verb> or advm_<capability>_<verb> (advm_dup,
 * advm_vcopy_get_stats, advm_batch_run). Types are `struct advm_<name>`, always
 * written with `struct`: no typedefs, and no type shares its name with a function
 * (the deprecated advm_vcopy_stats() aside).
 * Opaque handles are incomplete structs (struct advm_batch). A renamed name stays for
 * one release as a deprecated alias (ADVM_DEPRECATED): it compiles with a warning
 * that names its replacement and behaves exactly as the new name.
 */
#ifndef ADVM_H
#define ADVM_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define ADVM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define ADVM_DEPRECATED(msg)
#endif

#ifdef __cplusplus
/* The C names give a function and a struct one name (advm_pager_stats); g++ -Wshadow
 * says the function "hides the constructor" of the struct, which C code never has. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
extern "C" {
#endif

/* The library version, a static string. */
const char *advm_version(void);

/* ---- virtual copy (docs/vcopy.md) ------------------------------------------
 * Blocks live in one process-wide arena of memfd pages. A virtual copy shares the
 * source's pages copy-on-write: only pages written later are duplicated.
 *
 * Every function may be called from any thread, and in the child of a fork() made
 * while other threads were calling them. A reader of a block sees its bytes
 * unchanged while the block is copied (advm_dup/advm_vcopy source).
 *
 * After a panic inside the library (a bug) the call that met it fails with EIO and
 * the arena, whose state may be half updated, refuses every later call with
 * ENOTRECOVERABLE (blocks stay mapped, so their bytes can still be saved). */

/* A zero-filled, page-aligned block of len bytes (rounded up to whole pages); NULL
 * with errno set on failure: ENOMEM when len does not fit (e.g. SIZE_MAX, or more
 * than the arena's free address space). advm_alloc(0) returns a unique one-page
 * block, to be freed like any other (as glibc's malloc(0)).
 * The arena is made by the first call: it reserves 256 GiB of address space (no
 * memory), or under an address-space limit (RLIMIT_AS) the largest half of that which
 * fits, down to 64 MiB. A first call that cannot make it fails with the reason's
 * errno (ENOMEM, EMFILE...) and the next call tries again. */
void *advm_alloc(size_t len);
/* Frees a block from advm_alloc/advm_dup (NULL: no-op; a non-block pointer sets errno
 * to EINVAL and is left alone). */
void advm_free(void *p);
/* A new block that is a virtual copy of [p, p+len) (inside one block); NULL + errno
 * (EINVAL for len 0 or a range outside a block, ENOMEM when it does not fit). */
void *advm_dup(const void *p, size_t len);
/* memcpy(dst, src, len) by page sharing when dst - src is a multiple of the page size
 * (partial first/last pages copied), by memcpy otherwise. Both ranges must lie inside
 * arena blocks and must not overlap. 0 or -errno (-EINVAL with a bad argument). */
int advm_vcopy(void *dst, const void *src, size_t len);

struct advm_vcopy_stats {
    unsigned long long blocks;               /* live blocks */
    unsigned long long memfd_pages_live;     /* distinct memfd pages in use */
    unsigned long long memfd_resident_bytes; /* memory the memfds hold */
    unsigned long long pages_shared;         /* pages shared by copies (cumulative) */
    unsigned long long bytes_copied;         /* bytes copied by memcpy (cumulative) */
    unsigned long long pages_rehomed;        /* written pages moved to fresh memfd pages */
    unsigned long long fallback_unaligned;   /* memcpy: dst - src not page-congruent */
    unsigned long long fallback_small;       /* memcpy: under the small-block threshold */
    unsigned long long fallback_vma_budget;  /* memcpy: VMA budget reached */
    unsigned long long vmas;                 /* VMAs of the arena (upper bound) */
};
/* Fills *out; 0 or -errno. Before the first arena call (advm_alloc, advm_dup...) every
 * field is 0, and the arena is not made for it. */
int advm_vcopy_get_stats(struct advm_vcopy_stats *out);
/* Deprecated alias of advm_vcopy_get_stats (the old name, which the struct shares). */
int advm_vcopy_stats(struct advm_vcopy_stats *out) ADVM_DEPRECATED("use advm_vcopy_get_stats");
/* ---- end virtual copy ---- */
/* ---- Zero-copy move and swap of page ranges (advm::remap) ----------------------
 *
 * Addresses and lengths must be page aligned. The caller must own every range it
 * passes: no other thread may use them during the call, except to read them (a
 * reader then sees, per page, the old bytes, zeros, or the new bytes). advm checks
 * that each range is mapped read-write before it changes anything.
 *
 * Engine per request: memmove below the break-even (measured on this machine at
 * first use, cached in $XDG_CACHE_HOME/advm or ~/.cache/advm, overridable with
 * ADVM_REMAP_BREAK_EVEN_PAGES or advm_remap_set_break_even_pages), else UFFDIO_MOVE
 * (private anonymous memory, VMAs untouched), or mremap for 2 MiB-aligned moves of
 * 2 MiB or more (one mremap call into an empty destination; into one holding pages,
 * an exchange of page tables that frees nothing). MAP_SHARED memory is always copied.
 *
 * Arena memory (advm_alloc/advm_dup blocks, any advm arena's mappings) is never
 * remapped: an operation with a range that touches it copies bytes instead (memmove,
 * byte swap), except that advm_move between two blocks of the advm_alloc arena is
 * done by advm_vcopy (pages stay shared). stats.arena_vcopy_bytes counts those.
 *
 * After a move, dst holds src's old bytes; src stays mapped and its vacated bytes
 * are unspecified (zeros where pages moved, stale bytes where they were copied, the
 * destination's old bytes after a 2 MiB-aligned exchange).
 * Errors (-errno, memory unchanged): -EINVAL for unaligned or wrapping ranges,
 * overlapping swap ranges, or ranges not mapped read-write; -ENOMEM when the scratch
 * area a swap needs cannot be made. A kernel call that fails after the first change
 * (madvise or mmap refusing under a memory or VMA limit) leaves the operation partly
 * done, as in advm_batch_run; advm_move_stats says which (memory_changed).
 */

/* Totals of a call: bytes per engine and system calls made. */
struct advm_remap_stats {
    size_t uffd_move_bytes;   /* moved (or swapped) by UFFDIO_MOVE */
    size_t mremap_bytes;      /* moved by mremap */
    size_t memmove_bytes;     /* copied (memmove, byte swap), fallback_bytes included */
    size_t fallback_bytes;    /* of those, page moves the kernel refused (shared/COW
                                 pages), copied */
    unsigned int syscalls;    /* system calls that moved, remapped, emptied or
                                 registered memory */
    size_t arena_vcopy_bytes; /* arena blocks copied by advm_vcopy (pages shared) */
    size_t completed_ops;     /* operations that ran completely (all, on success) */
    int memory_changed;       /* on error: 0 nothing changed, 1 see advm_batch_run */
};

/* Moves len bytes from src to dst (the ranges may overlap: a slide). */
int advm_move(void *dst, const void *src, size_t len);
/* As advm_move, and fills *out (when not NULL), also on error: memory_changed 0 (the
 * errors above: nothing changed) or 1 (partly done, as advm_batch_run's operation
 * completed_ops). */
int advm_move_stats(void *dst, const void *src, size_t len, struct advm_remap_stats *out);
/* Swaps the contents of [a, a+len) and [b, b+len) (disjoint). */
int advm_swap(void *a, void *b, size_t len);

/* Many moves and swaps run in order with as few kernel calls as the kernel allows:
 * continuing operations merge, destinations are emptied with one vectored call. */
struct advm_batch; /* opaque */
struct advm_batch *advm_batch_new(void);
/* Queue one operation; 0, or -EINVAL (nothing queued) for a NULL batch or a range that
 * is unaligned or wraps. Mappings are checked by advm_batch_run. */
int advm_batch_move(struct advm_batch *b, void *dst, const void *src, size_t len);
int advm_batch_swap(struct advm_batch *b, void *x, void *y, size_t len);
/* Runs the queued operations and empties the batch; *out (when not NULL) gets the
 * totals, also on error. Everything that can be checked or made beforehand is
 * (arguments, mappings, the swap scratch area): such an error returns with
 * memory_changed = 0, nothing ran and memory is unchanged. A kernel call that fails
 * after the first change (in practice madvise or mmap refusing under a memory or
 * VMA limit) stops the batch with memory_changed = 1: operations [0, completed_ops)
 * ran completely, operation completed_ops may be partly done (a move: each page is at
 * its source or its destination), later ones did not run, though destinations of
 * later moves may already read as zeros. */
int advm_batch_run(struct advm_batch *b, struct advm_remap_stats *out);
void advm_batch_free(struct advm_batch *b);

/* Moves shorter than this many pages are copied. */
size_t advm_remap_break_even_pages(void);
/* Overrides the break-even for this process; 0 restores the measured value. */
void advm_remap_set_break_even_pages(size_t pages);

/* ---- User-level pager with discardable pages (advm::pager) ---------------------
 *
 * Regions under a budget of resident bytes. Pages marked discardable may be dropped
 * (they read back as zeros, never written); needed pages beyond the budget are written
 * to the pager's swap file (O_DIRECT) and read back on the next touch by the pager's
 * handler thread (userfaultfd). Functions return 0 (flush: pages evicted) or -errno:
 * -EINVAL for a range not page aligned or not inside one region of this pager, -ENOMEM
 * when the swap file is full, -ENOSPC when the filesystem under it is (every page
 * stays readable; the pages that could not be written stay resident, over the budget).
 * See docs/pager.md.
 *
 * Signals: the pager's own thread blocks every signal a program or another process
 * sends, so those are handled on the program's threads (a handler may read paged
 * memory), and a fault served in SIGBUS mode defers them until it is served.
 *
 * fork(): a pager and its regions stay with the process that made it. The regions are
 * not inherited (MADV_DONTFORK: touching them in a child is a segmentation fault), and
 * in a child every function on an inherited pager fails at once with -ENOTRECOVERABLE
 * (advm_pager_map: NULL, errno ENOTRECOVERABLE); advm_pager_destroy there frees
 * nothing of the parent's. A child that needs a pager makes its own. */
typedef struct advm_pager advm_pager;

struct advm_pager_stats {
    uint64_t discarded_pages;     /* page-outs that dropped a discardable page */
    uint64_t written_pages;       /* page-outs that wrote a needed page */
    uint64_t read_pages;          /* faults that read a page back */
    uint64_t zero_fills;          /* faults served with zeros (new or discarded pages) */
    uint64_t resident_pages;      /* pages resident now */
    uint64_t preflushed_by_pager; /* pages evicted by the pager's own pre-flush */
    uint64_t preflushed_by_user;  /* pages evicted by advm_pager_flush */
    uint64_t bytes_written;       /* swap file bytes written */
    uint64_t bytes_read;          /* swap file bytes read */
    uint64_t read_ahead_pages;    /* pages read back with a faulting page, ahead of their fault */
    uint64_t zero_ahead_pages;    /* needed pages zero-filled with a faulting one, ahead of theirs */
    uint64_t clean_dropped_pages; /* page-outs of pages read back and not written since: no write */
};

/* budget_bytes: at least one page (EINVAL below). swap_path: a file to create (an existing file is
 * refused with EEXIST, never overwritten; a block device is used as it is; the file
 * the pager created is removed by advm_pager_destroy, so a second run may name it
 * again), or NULL (or a directory): an unlinked temporary file (in /var/tmp), gone
 * with the pager. NULL on error, errno set
 * (a swap file that cannot be created: the open's own errno, ENOENT, EACCES...;
 * ENOSYS where userfaultfd with UFFDIO_MOVE is missing: Linux before 6.8, or under
 * valgrind, which has no userfaultfd; EMFILE when the process is out of fds). */
advm_pager *advm_pager_new(size_t budget_bytes, const char *swap_path);
/* Every setting of the pager (docs/pager.md), for advm_pager_new_with. Zero a struct,
 * set size = sizeof(struct advm_pager_options) and budget_bytes, then what you need:
 * zero means the default everywhere. size lets later versions add fields: a library
 * older than your header refuses fields it does not know when they are set (ENOSYS),
 * never ignores them. */
#define ADVM_PAGER_FAULTS_THREAD 0    /* the pager's handler thread (default) */
#define ADVM_PAGER_FAULTS_SIGBUS 1    /* on the faulting thread (userfaultfd's SIGBUS mode;
                                         ENOSYS where the kernel lacks it), by a
                                         process-wide SIGBUS handler that passes other
                                         SIGBUS on to the one it replaced: a handler the
                                         program installs later must call it. Code
                                         running with SIGBUS blocked (a thread that
                                         blocks every signal, a handler whose sa_mask
                                         has it) must not touch paged memory: the
                                         kernel kills the process */
#define ADVM_PAGER_FAULTS_AUTO 2      /* SIGBUS where offered, else the thread */
#define ADVM_PAGER_NEEDED_SWAP_FILE 0 /* needed pages written to the pager's swap file (default) */
#define ADVM_PAGER_NEEDED_KERNEL 1    /* left to the kernel's reclaim and swap; the pager only
                                         drops discardable pages */
#define ADVM_PAGER_SWAP_DIRECT 0      /* swap file written O_DIRECT (default) */
#define ADVM_PAGER_SWAP_PAGE_CACHE 1  /* through the page cache */
struct advm_pager_options {
    size_t size;                    /* sizeof(struct advm_pager_options) */
    size_t budget_bytes;            /* most bytes resident, at least one page */
    const char *swap_path;          /* as advm_pager_new's (NULL: unlinked temporary file) */
    uint64_t swap_capacity_bytes;   /* most bytes the swap file holds (0: 4 GiB; 1 to a
                                       page - 1: EINVAL) */
    size_t preflush_headroom_bytes; /* pager-initiated pre-flush: drop every discardable
                                       page when within this of the budget or of the
                                       cgroup's limit (0: none) */
    const char *cgroup;             /* a memory cgroup directory to watch (NULL: none;
                                       not one: the open's errno, ENOENT...) */
    int fault_mode;                 /* ADVM_PAGER_FAULTS_* */
    int needed_paging;              /* ADVM_PAGER_NEEDED_* */
    int swap_io;                    /* ADVM_PAGER_SWAP_* */
};
/* A pager with these options; NULL on error, errno set (EINVAL: NULL, a size below
 * this header's or above 4096, an unknown mode, a budget or a swap capacity (not 0)
 * below one page; ENOSYS: SIGBUS mode not offered here, or set fields of a newer
 * header; as advm_pager_new otherwise). */
advm_pager *advm_pager_new_with(const struct advm_pager_options *opts);
/* Where p serves faults: ADVM_PAGER_FAULTS_THREAD or ADVM_PAGER_FAULTS_SIGBUS (what
 * AUTO chose); -EINVAL for NULL, -ENOTRECOVERABLE in a forked child. */
int advm_pager_fault_mode(advm_pager *p);
/* A new region of len bytes (rounded up to pages), reading as zeros. NULL on error,
 * errno: EINVAL for a NULL pager or len 0; ENOMEM when len does not fit (2^32 pages or
 * more, SIZE_MAX, more address space or memory than the kernel grants, out of VMAs). */
void *advm_pager_map(advm_pager *p, size_t len);
/* The calls on a range [addr, addr+len) below fail with -EINVAL (errno EINVAL) for a
 * NULL pager, len 0, addr or len not page aligned, or a range not wholly inside one
 * region that this pager's advm_pager_map returned (memory of its own or of another
 * pager, a range across two regions, one that wraps past the top of memory); the
 * range is then left as it was. */
/* Mark pages discardable / needed: bit flips in a shared bitmap, no system call. */
int advm_pager_discardable(advm_pager *p, void *addr, size_t len);
int advm_pager_needed(advm_pager *p, void *addr, size_t len);
/* Evict the range now (user-initiated pre-flush); returns the pages evicted (>= 0),
 * or -ENOMEM / -ENOSPC when the swap file / its filesystem is full (see above). */
int advm_pager_flush(advm_pager *p, void *addr, size_t len);
/* Purgeable memory: lock returns 1 when the contents survived, 0 when a page was
 * discarded while unlocked; unlock makes the range discardable. */
int advm_pager_lock(advm_pager *p, void *addr, size_t len);
int advm_pager_unlock(advm_pager *p, void *addr, size_t len);
/* Gives back a region advm_pager_map of this pager returned, whole: addr its start, len
 * the length mapped (or it rounded up to pages). Its resident pages and swap slots are
 * freed (resident_pages drops by its resident pages) and its memory unmapped: touching
 * it afterwards is a segmentation fault. The pager and its other regions go on as
 * before. 0, or -EINVAL for a NULL pager, an addr that is not the start of such a
 * region (inside one, unmapped already, another pager's or the program's own memory)
 * or a len other than the region's (a part of a region cannot be unmapped);
 * -ENOTRECOVERABLE in a forked child. */
int advm_pager_unmap(advm_pager *p, void *addr, size_t len);
/* Fills *out (a fresh pager's counters are all 0); -EINVAL for a NULL pager or out. */
int advm_pager_stats(advm_pager *p, struct advm_pager_stats *out);
/* Stops the pager; its regions still mapped are unmapped (NULL: no-op; errno is left alone). */
void advm_pager_destroy(advm_pager *p);

/* Deprecated typedef aliases of the remap structs (the old spelling). */
typedef struct advm_remap_stats advm_remap_stats ADVM_DEPRECATED("use struct advm_remap_stats");
typedef struct advm_batch advm_batch ADVM_DEPRECATED("use struct advm_batch");

/* ---- User-guided page merging (advm::merge, docs/merge.md) ---------------------
 * Merges the full pages of [addr, addr+len): pages equal to ones in the store become
 * copy-on-write private mappings of the store's pages, new pages are added to it,
 * partial end pages and zero pages are left alone. The bytes the process reads never
 * change; a thread writing the range meanwhile waits and its write lands afterwards.
 * The store is advmd's for the caller's uid (socket $ADVM_SOCKET, else
 * /run/advm/advmd.sock), else one of this process's own (advm_merge_via says which).
 * Returns 0, or -EINVAL for a range that is unmapped, shared, file-backed or marked
 * MADV_WIPEONFORK (MADV_DONTFORK, MADV_DONTDUMP and mlock are set again on the merged
 * pages), -ENOSYS where userfaultfd cannot write-protect the range while it is merged
 * (a kernel without it; valgrind, which has no userfaultfd), -EPERM where opening a
 * userfaultfd was refused (EPERM or EACCES: a seccomp filter, or
 * vm.unprivileged_userfaultfd=0 without the privilege), -EPIPE when the advmd of this
 * process's session has gone away (nothing merged; the next call connects again: to
 * advmd when one answers, else to a store of this process's own; advm_merge_trim
 * the same).
 * Through advmd, pages added in runs of 1 MiB or more go to a store file of their
 * own (up to 16 MiB each) that the process keeps one fd and mapping of until it exits;
 * smaller adds cost no fd. So a process holds at most 1,024 such fds per GiB it adds
 * or merges (64 with large ranges); near the RLIMIT_NOFILE soft limit (often 1024)
 * advm_merge fails with -EMFILE. Without advmd, the process's own store maps a view of
 * 64 GiB of address space (halved down to 1 GiB when refused): under an address-space
 * limit (RLIMIT_AS, ulimit -v) that leaves less, advm_merge fails with -ENOMEM. */
struct advm_merge_stats {
    uint64_t merged;      /* pages now mapping a page the store already held (or one an
                             earlier, equal page of the range added) */
    uint64_t added;       /* pages added to the store: one per distinct new page */
    uint64_t skipped;     /* pages left alone */
    uint64_t refused;     /* of skipped: the store reached its byte limit */
    uint64_t nanoseconds; /* time taken */
    uint32_t via_daemon;  /* 1: advmd's store; 0: this process's own */
};
/* out may be NULL; len 0 merges nothing and returns 0. */
int advm_merge(const void *addr, size_t len, struct advm_merge_stats *out);
/* Which store merges use, and why not advmd when not; owned by the library, valid
 * until the next call on the same thread. */
const char *advm_merge_via(void);
/* Lets go of the store pages this process was handed that no process maps any more
 * (memory merged onto them since unmapped; written pages stay: their mappings still
 * cover the store's pages), and frees those nobody else holds. Reads every process's
 * maps: call it after dropping merged data, not per merge. Returns 0, or -ENOSYS
 * (nothing let go) when the maps of this process or of a process of its uid started
 * since its first merge cannot be read, or advmd predates trims; -EMFILE out of fds
 * (as advm_merge). out may be NULL. */
struct advm_trim_stats {
    uint64_t released;    /* store pages let go */
    uint64_t kept;        /* store pages still held: some process maps them */
    uint64_t nanoseconds; /* time taken */
};
int advm_merge_trim(struct advm_trim_stats *out);
/* ---- end merging ---- */

#ifdef __cplusplus
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif

#endif /* ADVM_H */
