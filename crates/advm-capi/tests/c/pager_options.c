/* advm_pager_new_with: every pager setting from C (fault mode, who pages needed
 * pages, swap I/O, capacity, pre-flush headroom, cgroup), and its bad use. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static struct advm_pager_options opts(size_t budget) {
    struct advm_pager_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.budget_bytes = budget;
    return o;
}

/* needed data survives a region four times the budget */
static void round_trip(advm_pager *p, size_t ps) {
    size_t n = 64;
    unsigned char *m = advm_pager_map(p, n * ps);
    CHECK(m != NULL);
    for (size_t i = 0; i < n; i++) memset(m + i * ps, (int)(i + 1), ps);
    for (size_t i = 0; i < n; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
}

int main(void) {
    skip_without_pager();
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    struct advm_pager_options o = opts(16 * ps);

    /* bad use: NULL, short or oversized structs, unknown modes, a budget or a swap
     * capacity below a page */
    CHECK(advm_pager_new_with(NULL) == NULL && errno == EINVAL);
    o.size = sizeof o - 1;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o = opts(16 * ps);
    o.fault_mode = 7;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o = opts(16 * ps);
    o.needed_paging = -1;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o = opts(16 * ps);
    o.swap_io = 2;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o = opts(ps - 1);
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    /* a swap capacity below a page (not 0, the default) was a swap file of no pages */
    o = opts(16 * ps);
    o.swap_capacity_bytes = ps - 1;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o.swap_capacity_bytes = 1;
    CHECK(advm_pager_new_with(&o) == NULL && errno == EINVAL);
    o = opts(16 * ps);
    o.cgroup = "/nonexistent-cgroup";
    CHECK(advm_pager_new_with(&o) == NULL && errno == ENOENT);
    o.cgroup = "/tmp"; /* a directory, but no memory cgroup's */
    CHECK(advm_pager_new_with(&o) == NULL && errno == ENOENT);

    /* a newer header's struct: zero extra fields are fine, a set one is refused */
    struct {
        struct advm_pager_options o;
        uint64_t later;
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.o = opts(16 * ps);
    newer.o.size = sizeof newer;
    advm_pager *p = advm_pager_new_with(&newer.o);
    CHECK(p != NULL);
    advm_pager_destroy(p);
    newer.later = 1;
    CHECK(advm_pager_new_with(&newer.o) == NULL && errno == ENOSYS);

    /* the defaults: the handler thread, needed pages to the pager's swap file */
    o = opts(16 * ps);
    p = advm_pager_new_with(&o);
    CHECK(p != NULL && advm_pager_fault_mode(p) == ADVM_PAGER_FAULTS_THREAD);
    round_trip(p, ps);
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0 && st.written_pages >= 48);
    advm_pager_destroy(p);
    CHECK(advm_pager_fault_mode(NULL) == -EINVAL);

    /* the page cache, a small capacity: the swap file full is a clear error */
    o = opts(16 * ps);
    o.swap_io = ADVM_PAGER_SWAP_PAGE_CACHE;
    o.swap_capacity_bytes = 8 * ps;
    p = advm_pager_new_with(&o);
    CHECK(p != NULL);
    unsigned char *m = advm_pager_map(p, 64 * ps);
    CHECK(m != NULL);
    for (size_t i = 0; i < 64; i++) memset(m + i * ps, (int)(i + 1), ps);
    CHECK(advm_pager_flush(p, m, 64 * ps) == -ENOMEM);
    for (size_t i = 0; i < 64; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
    advm_pager_destroy(p);

    /* needed pages left to the kernel: the pager writes none */
    o = opts(16 * ps);
    o.needed_paging = ADVM_PAGER_NEEDED_KERNEL;
    p = advm_pager_new_with(&o);
    CHECK(p != NULL);
    round_trip(p, ps);
    CHECK(advm_pager_stats(p, &st) == 0 && st.written_pages == 0);
    advm_pager_destroy(p);

    /* pre-flush headroom: once the resident pages come within 16 pages of the budget,
     * the next fault drops every discardable page, before the budget forces anything */
    o = opts(32 * ps);
    o.preflush_headroom_bytes = 16 * ps;
    p = advm_pager_new_with(&o);
    CHECK(p != NULL);
    m = advm_pager_map(p, 64 * ps);
    CHECK(m != NULL);
    memset(m, 1, 24 * ps);
    CHECK(advm_pager_discardable(p, m, 8 * ps) == 0);
    memset(m + 24 * ps, 2, 16 * ps);
    CHECK(advm_pager_stats(p, &st) == 0);
    printf("pre-flush: %llu pages by the pager, %llu discarded, %llu written, %llu resident\n",
           (unsigned long long)st.preflushed_by_pager, (unsigned long long)st.discarded_pages,
           (unsigned long long)st.written_pages, (unsigned long long)st.resident_pages);
    CHECK(st.preflushed_by_pager >= 8 && st.discarded_pages >= 8);
    CHECK(all(m, 8 * ps, 0));
    CHECK(all(m + 8 * ps, 16 * ps, 1) && all(m + 24 * ps, 16 * ps, 2));
    advm_pager_destroy(p);

    /* SIGBUS mode where the kernel offers it, and AUTO's choice */
    o = opts(16 * ps);
    o.fault_mode = ADVM_PAGER_FAULTS_SIGBUS;
    p = advm_pager_new_with(&o);
    if (p == NULL) {
        CHECK(errno == ENOSYS);
        printf("SIGBUS mode not offered here\n");
    } else {
        CHECK(advm_pager_fault_mode(p) == ADVM_PAGER_FAULTS_SIGBUS);
        round_trip(p, ps);
        advm_pager_destroy(p);
    }
    o.fault_mode = ADVM_PAGER_FAULTS_AUTO;
    p = advm_pager_new_with(&o);
    CHECK(p != NULL);
    int mode = advm_pager_fault_mode(p);
    CHECK(mode == ADVM_PAGER_FAULTS_THREAD || mode == ADVM_PAGER_FAULTS_SIGBUS);
    round_trip(p, ps);
    advm_pager_destroy(p);
    printf("pager_options: ok (auto chose %s)\n", mode == ADVM_PAGER_FAULTS_SIGBUS ? "sigbus" : "thread");
    return 0;
}
