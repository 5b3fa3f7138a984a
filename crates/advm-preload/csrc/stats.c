/* stats.c: the counters and, at exit, the statistics file. */
#include "shim.h"

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
    "kept_pages_returned", "memfd_pages_released_under_written_views",
    "memfd_pages_adopted_by_last_view", "fds_closed_by_program", "fallback_protected_pages",
    "memfd_pages_trimmed_under_written_views", "trims", "trim_us", "pages_dropped_by_madvise",
    "copies_fenced_for_writers", "fallback_writers_unfenced", "maps_readings", "maps_reading_us"};
uint64_t stats[S_NSTATS];

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
    p = put_str(p, A.mode == MODE_COW ? "vcopy" : A.mode == MODE_KSM ? "ksm" : "alloc");
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
