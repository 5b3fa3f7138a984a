/* Every function the issues name (14: advm_gc, 15: advm_pager, 16: advm_merge; 3 and
 * 5: virtual copy and remap; and advm_pager_unmap) has exactly the signature they give: each is stored in a
 * pointer of that type, which -Werror refuses on any difference. The statistics
 * structs have the named fields, as 64-bit counters, at offsets that only grow (new
 * fields go at the end). Nothing runs but the checks of the fields' offsets. */
#include <advm.h>
#include <advm_gc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FIELD64(type, f) _Static_assert(sizeof(((type *)0)->f) == 8, #type "." #f " is 64 bits")

FIELD64(struct advm_gc_stats, collections);
FIELD64(struct advm_gc_stats, last_pause_ns);
FIELD64(struct advm_gc_stats, max_pause_ns);
FIELD64(struct advm_gc_stats, bytes_moved_memmove);
FIELD64(struct advm_gc_stats, bytes_moved_remap);
FIELD64(struct advm_pager_stats, discarded_pages);
FIELD64(struct advm_pager_stats, written_pages);
FIELD64(struct advm_pager_stats, read_pages);
FIELD64(struct advm_pager_stats, zero_fills);
FIELD64(struct advm_pager_stats, resident_pages);
FIELD64(struct advm_merge_stats, merged);
FIELD64(struct advm_merge_stats, added);
FIELD64(struct advm_merge_stats, skipped);

/* The released layouts: a field's offset never changes. */
_Static_assert(offsetof(struct advm_gc_stats, collections) == 0, "gc stats layout");
_Static_assert(offsetof(struct advm_gc_stats, bytes_moved_remap) == 40, "gc stats layout");
_Static_assert(offsetof(struct advm_gc_stats, large_object_bytes) == 64, "gc stats layout");
_Static_assert(offsetof(struct advm_pager_stats, resident_pages) == 32, "pager stats layout");
_Static_assert(offsetof(struct advm_pager_stats, clean_dropped_pages) == 88, "pager stats layout");
_Static_assert(offsetof(struct advm_pager_options, size) == 0, "options: size first");

/* issue 14 */
static advm_gc *(*const gc_new)(size_t heap_bytes) = advm_gc_new;
static void (*const gc_destroy)(advm_gc *) = advm_gc_destroy;
static void *(*const gc_alloc)(advm_gc *, size_t nptrs, size_t nbytes) = advm_gc_alloc;
static int (*const gc_root)(advm_gc *, void **slot) = advm_gc_root;
static int (*const gc_unroot)(advm_gc *, void **slot) = advm_gc_unroot;
static int (*const gc_collect)(advm_gc *, int full) = advm_gc_collect;
static int (*const gc_set_engine)(advm_gc *, const char *engine) = advm_gc_set_engine;
static int (*const gc_stats)(advm_gc *, struct advm_gc_stats *out) = advm_gc_stats;
/* issue 15 */
static advm_pager *(*const pager_new)(size_t budget_bytes, const char *swap_path) = advm_pager_new;
static void *(*const pager_map)(advm_pager *, size_t len) = advm_pager_map;
static int (*const pager_discardable)(advm_pager *, void *, size_t) = advm_pager_discardable;
static int (*const pager_needed)(advm_pager *, void *, size_t) = advm_pager_needed;
static int (*const pager_flush)(advm_pager *, void *, size_t) = advm_pager_flush;
static int (*const pager_stats)(advm_pager *, struct advm_pager_stats *) = advm_pager_stats;
static void (*const pager_destroy)(advm_pager *) = advm_pager_destroy;
/* added after issue 15, as the Rust pager's unmap */
static int (*const pager_unmap)(advm_pager *, void *addr, size_t len) = advm_pager_unmap;
/* issue 16 */
static int (*const merge)(const void *addr, size_t len, struct advm_merge_stats *out) = advm_merge;
/* issue 3 */
static void *(*const alloc)(size_t len) = advm_alloc;
static void (*const free_)(void *p) = advm_free;
static void *(*const dup)(const void *p, size_t len) = advm_dup;
static int (*const vcopy)(void *dst, const void *src, size_t len) = advm_vcopy;
/* issue 5 (src is const: a caller's void * converts) */
static int (*const move)(void *dst, const void *src, size_t len) = advm_move;
static int (*const swap)(void *a, void *b, size_t len) = advm_swap;

int main(void) {
    const void *all[] = {(const void *)gc_new,        (const void *)gc_destroy,   (const void *)gc_alloc,
                         (const void *)gc_root,       (const void *)gc_unroot,    (const void *)gc_collect,
                         (const void *)gc_set_engine, (const void *)gc_stats,     (const void *)pager_new,
                         (const void *)pager_map,     (const void *)pager_discardable,
                         (const void *)pager_needed,  (const void *)pager_flush,  (const void *)pager_stats,
                         (const void *)pager_destroy, (const void *)merge,        (const void *)alloc,
                         (const void *)free_,         (const void *)dup,          (const void *)vcopy,
                         (const void *)move,          (const void *)swap,         (const void *)pager_unmap};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] == NULL) return 1;
    printf("signatures: %zu functions as the issues give them\n", sizeof all / sizeof all[0]);
    return 0;
}
