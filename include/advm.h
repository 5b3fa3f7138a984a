/* advm: application-directed virtual memory — C API.
 *
 * Link with -ladvm (libadvm.so or libadvm.a from `cargo build -p advm-capi`).
 * Functions returning int return 0 on success or a negative errno.
 */
#ifndef ADVM_H
#define ADVM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library version, a static string. */
const char *advm_version(void);

/* ---- virtual copy (docs/vcopy.md) ------------------------------------------
 * Blocks live in one process-wide arena of memfd pages. A virtual copy shares the
 * source's pages copy-on-write: only pages written later are duplicated. */

/* A zero-filled, page-aligned block of len bytes; NULL with errno set on failure. */
void *advm_alloc(size_t len);
/* Frees a block from advm_alloc/advm_dup (NULL: no-op; a non-block pointer sets errno
 * to EINVAL and is left alone). */
void advm_free(void *p);
/* A new block that is a virtual copy of [p, p+len) (inside one block); NULL + errno. */
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
/* Fills *out; 0 or -errno. */
int advm_vcopy_stats(struct advm_vcopy_stats *out);
/* ---- end virtual copy ---- */

#ifdef __cplusplus
}
#endif

#endif /* ADVM_H */
