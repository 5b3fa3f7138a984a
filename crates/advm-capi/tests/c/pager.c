/* advm_pager from C: needed data survives eviction, discardable pages read as zeros,
 * the statistics count both, purgeable lock/unlock, bad use. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    CHECK(advm_pager_new(ps - 1, NULL) == NULL && errno == EINVAL);
    /* a swap file that cannot be created: the open's own errno */
    CHECK(advm_pager_new(ps, "/nonexistent-dir/swap") == NULL && errno == ENOENT);
    CHECK(advm_pager_new(ps, "/dev/null/swap") == NULL && errno == ENOTDIR);
    advm_pager *p = advm_pager_new(16 * ps, NULL);
    if (!p && errno == ENOSYS) {
        printf("skipped: the pager needs userfaultfd with UFFDIO_MOVE\n");
        return 0;
    }
    CHECK(p != NULL);
    size_t n = 64;
    unsigned char *m = advm_pager_map(p, n * ps);
    CHECK(m != NULL);
    /* 64 pages through a 16-page budget: 48 written out, read back intact */
    for (size_t i = 0; i < n; i++) memset(m + i * ps, (int)(i + 1), ps);
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0);
    CHECK(st.resident_pages <= 16 && st.written_pages >= 48 && st.zero_fills + st.zero_ahead_pages == n);
    for (size_t i = 0; i < n; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
    CHECK(advm_pager_stats(p, &st) == 0);
    CHECK(st.read_pages + st.read_ahead_pages >= 48);

    /* the last 8 pages (resident) discardable: flushed without a write, read as zeros */
    uint64_t written = st.written_pages, clean = st.clean_dropped_pages;
    CHECK(advm_pager_discardable(p, m + 56 * ps, 8 * ps) == 0);
    CHECK(advm_pager_flush(p, m, n * ps) >= 0);
    CHECK(advm_pager_stats(p, &st) == 0);
    /* the 8 needed ones were read back and not written: dropped clean where tracked */
    CHECK(st.discarded_pages == 8 && st.written_pages + st.clean_dropped_pages == written + clean + 8);
    CHECK(all(m + 56 * ps, 8 * ps, 0));
    CHECK(all(m + 55 * ps, ps, 56));
    CHECK(advm_pager_stats(p, &st) == 0);
    printf("pager: %llu written (%llu before the flush), %llu discarded, %llu read back, %llu zero fills\n",
           (unsigned long long)st.written_pages, (unsigned long long)written, (unsigned long long)st.discarded_pages,
           (unsigned long long)st.read_pages, (unsigned long long)st.zero_fills);

    /* purgeable */
    CHECK(advm_pager_unlock(p, m + 16 * ps, 4 * ps) == 0);
    CHECK(advm_pager_lock(p, m + 16 * ps, 4 * ps) == 1);
    CHECK(advm_pager_unlock(p, m + 16 * ps, 4 * ps) == 0);
    CHECK(advm_pager_flush(p, m + 16 * ps, 4 * ps) >= 0);
    CHECK(advm_pager_lock(p, m + 16 * ps, 4 * ps) == 0);

    /* bad use */
    CHECK(advm_pager_discardable(p, m + 1, ps) == -EINVAL);
    CHECK(advm_pager_needed(p, m, (n + 1) * ps) == -EINVAL);
    CHECK(advm_pager_flush(p, (void *)ps, ps) == -EINVAL);
    CHECK(advm_pager_stats(p, NULL) == -EINVAL);
    advm_pager_destroy(p);
    advm_pager_destroy(NULL);
    return 0;
}
