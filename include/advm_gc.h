/* advm_gc: a precise, moving garbage-collected heap — C API (libadvm).
 *
 * Link with -ladvm. Functions returning int return 0 on success or a negative errno
 * (errno is set to it too); functions returning a pointer return NULL with errno set.
 * A call that succeeds leaves errno as it found it. Every call given a NULL heap fails
 * with EINVAL (advm_gc_destroy(NULL) does nothing); docs/capi.md has the table of
 * every call's errors.
 *
 * Objects: advm_gc_alloc returns an object's first pointer slot; its nptrs slots
 * (void *, NULL or objects of the same heap) come first, then nbytes raw bytes at
 * (void **)obj + nptrs; all zeroed. Objects move at every collection, which any
 * advm_gc_alloc or advm_gc_collect may run: keep every object you still need in a
 * registered root slot (or in a slot of an object reachable from one) and reload it
 * from there after each such call (a pinned object excepted: advm_gc_pin). Weak slots
 * (advm_gc_weak) follow their object without keeping it alive. Objects of at least
 * the large-object size start on a page boundary and are moved by remapping their
 * pages ("remap" engine).
 *
 * Generational heaps (advm_gc_new_with): store pointers into objects with
 * advm_gc_store, never by writing a slot directly: its write barrier remembers old
 * objects that point to young ones (a direct write may lose the young object).
 *
 * Threads: any thread may call; calls on one heap run one at a time. A call from one
 * thread may move every object of the heap, including an object another thread holds
 * in a local variable between its calls (one advm_gc_alloc returned and not yet stored
 * in a root): threads sharing a heap hold their own lock around each call and their
 * uses of objects, or give each thread a heap of its own. The heap's own GC threads
 * block every signal a program or another process sends: handlers run on the
 * program's threads. fork() waits
 * for calls in progress on any heap to finish, so a child can use the heaps it
 * inherits (a heap placed in an advm_pager excepted: the pager's regions are not
 * inherited, see advm.h; in a child every call on such a heap fails with
 * -ENOTRECOVERABLE, NULL and errno ENOTRECOVERABLE from advm_gc_alloc).
 */
#ifndef ADVM_GC_H
#define ADVM_GC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* The C names give a function and a struct one name (advm_pager_stats); g++ -Wshadow
 * says the function "hides the constructor" of the struct, which C code never has. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
extern "C" {
#endif

/* A heap (opaque). The typedef gives the spelling `advm_gc *`. */
typedef struct advm_gc advm_gc;

struct advm_gc_stats {
    uint64_t collections;         /* collections run */
    uint64_t last_pause_ns;       /* pause of the last one */
    uint64_t max_pause_ns;        /* longest pause */
    uint64_t total_pause_ns;      /* sum of pauses */
    uint64_t bytes_moved_memmove; /* compaction bytes copied, all collections */
    uint64_t bytes_moved_remap;   /* compaction bytes moved as pages, all collections */
    uint64_t heap_bytes;          /* the size limit */
    uint64_t used_bytes;          /* in use now */
    uint64_t large_object_bytes;  /* objects this large (header included) are moved as pages */
};

/* A heap whose objects may take heap_bytes (headers included); NULL with errno set
 * (EINVAL: below one page (4096); ENOMEM: above 1 TiB (SIZE_MAX included), or no
 * address space or overcommit for it).
 * The heap maps its spaces read-write up front (pages cost memory only once written):
 * 3 x heap_bytes (up to 7 x for a generational heap with copy_back), mapped in pieces
 * so that Linux's default overcommit heuristic, which refuses one mmap larger than
 * RAM + swap, lets heaps larger than memory be made, as a JVM's -Xmx may be. Under
 * strict overcommit (vm.overcommit_memory = 2) all of it is counted: ENOMEM past the
 * commit limit. */
advm_gc *advm_gc_new(size_t heap_bytes);

/* Heap sizing of a generational heap (SML/NJ's policies, sizes in bytes). */
#define ADVM_GC_ORIGINAL 1 /* ratio, mem_limit */
#define ADVM_GC_MODIFIED 2 /* mem_lim, min_new_size, min_old_incr */
struct advm_gc_policy {
    int kind;            /* ADVM_GC_ORIGINAL or ADVM_GC_MODIFIED */
    double ratio;        /* original: target heap size / live size (>= 1) */
    size_t mem_limit;    /* original: memory use target */
    size_t mem_lim;      /* modified: memory use target */
    size_t min_new_size; /* modified: smallest nursery, at least 32768 (one allocation
                            buffer: a smaller nursery would collect at every allocation)
                            and at most the heap's size */
    size_t min_old_incr; /* modified: smallest old-generation increment */
    int copy_back;       /* nonzero: the old generation is copied back to the start of its
                            reservation after a major collection; 0: it drifts */
};

/* A generational heap: a nursery copied into an old generation, sized by *policy
 * (NULL: a non-generational heap, as advm_gc_new). NULL with errno EINVAL for a bad
 * policy (an unknown kind, a ratio that is not a number >= 1, a min_new_size below
 * 32768 or above heap_bytes), as advm_gc_new otherwise. */
advm_gc *advm_gc_new_with(size_t heap_bytes, const struct advm_gc_policy *policy);

/* As advm_gc_new_with, with the heap's spaces in regions of an advm_pager (advm.h):
 * every range a collection frees is marked discardable (dropped, never written, under
 * pressure), ranges the heap writes again are marked needed first; nonzero
 * flush_after_major drops the discardable pages after each full or major collection
 * (the paper's PU). Large objects then move by memmove. The heap keeps the pager alive
 * (advm_pager_destroy may come first). NULL with errno EINVAL for a NULL pager. */
struct advm_pager;
advm_gc *advm_gc_new_paged(size_t heap_bytes, const struct advm_gc_policy *policy, struct advm_pager *pager,
                           int flush_after_major);

/* Every setting of a heap, for advm_gc_new_opts. Zero a struct, set size =
 * sizeof(struct advm_gc_options) and heap_bytes, then what you need: zero means the
 * default everywhere. size lets later versions add fields at the end: a library older
 * than your header refuses fields it does not know when they are set (ENOSYS), never
 * ignores them. */
struct advm_gc_options {
    size_t size;                         /* sizeof(struct advm_gc_options) */
    size_t heap_bytes;                   /* as advm_gc_new's */
    const struct advm_gc_policy *policy; /* generational sizing (NULL: non-generational) */
    struct advm_pager *pager;            /* place the heap in this pager, as advm_gc_new_paged
                                            (NULL: plain memory) */
    const char *engine;                  /* "remap" or "memmove" (NULL: "remap") */
    size_t large_object_bytes;           /* objects this large (header included) or larger are
                                            page aligned and moved as pages (0: the break-even
                                            measured at first use; at least 32) */
    size_t gc_threads;                   /* GC threads (0: one per CPU; at most 256) */
    int flush_after_major;               /* with a pager: as advm_gc_new_paged's */
    int verify;                          /* nonzero: the heap verifier runs after every
                                            collection (a broken heap: ENOTRECOVERABLE) */
    int free_lazily;                     /* nonzero: freed ranges are advised MADV_FREE
                                            (plain memory only) */
};
/* A heap with these settings; NULL with errno: EINVAL for NULL, a size below this
 * header's or above 4096, an unknown engine, flush_after_major without a pager,
 * free_lazily with a pager, gc_threads above 256, large_object_bytes below 32, a bad
 * policy; ENOSYS for set fields of a newer header; as advm_gc_new otherwise. */
advm_gc *advm_gc_new_opts(const struct advm_gc_options *opts);

/* Pointer slot i of obj := value (NULL or an object of this heap), through the write
 * barrier. -EINVAL: obj or value not the start of an object of this heap (as far as
 * its header tells: a pointer into an object's raw bytes that look like a header may
 * pass), i not below obj's nptrs. */
int advm_gc_store(advm_gc *gc, void *obj, size_t i, void *value);

/* Frees the heap and all its objects (NULL: no-op; errno is left alone). No call on the heap may be in
 * progress on another thread, nor come after it; registered root slots need no
 * unroot (they keep the freed objects' addresses). */
void advm_gc_destroy(advm_gc *gc);

/* A new object (nptrs 0 and nbytes 0 included), or NULL with errno:
 * - ENOMEM when a full collection cannot make room (the heap stays usable: drop roots,
 *   collect, allocate again), or at once, without a collection, when the object is
 *   larger than the whole heap (nptrs * 8 + nbytes + its 16-byte header), SIZE_MAX
 *   and sizes whose sum overflows included;
 * - EINVAL for a NULL heap, or more than 8388607 pointer slots (the header's limit) in
 *   a heap the object would fit in;
 * - EIO or ENOTRECOVERABLE when the collection it needed failed (see advm_gc_collect). */
void *advm_gc_alloc(advm_gc *gc, size_t nptrs, size_t nbytes);

/* Registers / forgets a root slot: each collection reads *slot and rewrites it when
 * its object moves. The slot must stay valid until unrooted (a slot on the C stack is
 * unrooted before its function returns) and lie outside the heap (an object's slot
 * moves with it). Both take constant time, however many slots are registered.
 * -EINVAL: NULL, misaligned, inside the heap, already a root or weak slot (root) or
 * not a root (unroot). */
int advm_gc_root(advm_gc *gc, void **slot);
int advm_gc_unroot(advm_gc *gc, void **slot);

/* Registers / forgets a weak slot: each collection reads *slot and rewrites it, but
 * does not keep its object alive for it: it becomes NULL when the object died, else
 * the object's new address. A full collection clears it when the object is reachable
 * from no root, root slot, pinned object or live object; a minor one only when the
 * object is young and was not kept (an old object lives on until the next full
 * collection). Reloading the object from the slot makes it reachable again if stored
 * in a root. The slot's rules are a root slot's (valid until unweak'd, outside the
 * heap, NULL or an object); a slot may not be a root and weak at once. Both take
 * constant time. -EINVAL: NULL, misaligned, inside the heap, already a root or weak
 * slot (weak) or not a weak slot (unweak). */
int advm_gc_weak(advm_gc *gc, void **slot);
int advm_gc_unweak(advm_gc *gc, void **slot);

/* Pins obj: until as many advm_gc_unpin calls as advm_gc_pin calls, no collection
 * moves it and it is a root (it stays alive), so its address may be handed to C code
 * or the kernel. Returns that address: obj itself, except for a young object of a
 * generational heap, which is promoted first by a minor collection (every object may
 * move then, as in advm_gc_alloc: reload them from their roots). Pin buffers at
 * least large_object_bytes long (old at birth: no collection), or pin young objects
 * in one go after a minor collection. Compaction slides the other objects around a
 * pinned one; the space below it that they do not fill stays free while it is pinned,
 * and a generational heap with a pinned small object compacts its old generation
 * where it lies (no copy_back). NULL with errno EINVAL: obj is not an object of this
 * heap; as advm_gc_collect when the promotion's collection fails. */
void *advm_gc_pin(advm_gc *gc, void *obj);
/* -EINVAL: obj is not a pinned object of this heap. */
int advm_gc_unpin(advm_gc *gc, void *obj);

/* Runs a collection now (of an empty heap too): full nonzero, a full mark-compact (on a generational heap a
 * major collection: a minor one, then the old generation's); 0, a minor collection
 * (a full one on a non-generational heap). A root slot that holds something other
 * than NULL or an object of this heap fails the collection with -EIO before anything
 * moves (every collection does, advm_gc_alloc's included, until the root is fixed).
 * A slot of an object written directly with such a pointer fails the collection with
 * -EIO too; objects may then be half moved, and every later collection of the heap
 * fails with -ENOTRECOVERABLE. (A pointer into the middle of an object is caught
 * only where its bytes do not look like an object's header.) */
int advm_gc_collect(advm_gc *gc, int full);

/* "remap" (default: large objects moved as pages) or "memmove", spelled exactly so;
 * -EINVAL for any other name, NULL included (the engine is then unchanged). */
int advm_gc_set_engine(advm_gc *gc, const char *engine);

/* Fills *out (a new heap's counters are 0); -EINVAL for a NULL out. */
int advm_gc_stats(advm_gc *gc, struct advm_gc_stats *out);

#ifdef __cplusplus
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif

#endif
