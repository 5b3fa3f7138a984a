/* docs/pager.md's example: a region twice its budget, half of it discardable, and a
 * purgeable cache entry. Any user: userfaultfd for user-mode faults suffices
 * (docs/pager.md, "Without root").
 * cc -Iinclude examples/c/pager.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    size_t mib = 1 << 20;
    advm_pager *p = advm_pager_new(4 * mib, NULL); /* 4 MiB resident; swap: a temporary file */
    if (!p) return perror("advm_pager_new"), 1;
    char *r = advm_pager_map(p, 8 * mib);
    if (!r) return perror("advm_pager_map"), 1;
    memset(r, 7, 4 * mib);                        /* live data */
    memset(r + 4 * mib, 9, 4 * mib);              /* garbage, e.g. a collector's from-space */
    advm_pager_discardable(p, r + 4 * mib, 4 * mib); /* bit flips, no system call */
    advm_pager_flush(p, r, 8 * mib);              /* evict now: garbage dropped, live data written */
    if (r[0] != 7 || r[4 * mib - 1] != 7 || r[4 * mib] != 0) return 1; /* read back; zeros */

    /* Purgeable memory: unlocked, a range may be dropped; lock says whether it was. */
    char *entry = r + 4 * mib;
    advm_pager_needed(p, entry, 4 * mib);
    memset(entry, 5, 4 * mib);
    advm_pager_unlock(p, entry, 4 * mib);
    int kept = advm_pager_lock(p, entry, 4 * mib);  /* 1: nothing dropped meanwhile */
    advm_pager_unlock(p, entry, 4 * mib);
    advm_pager_flush(p, entry, 4 * mib);            /* memory pressure */
    int kept_after = advm_pager_lock(p, entry, 4 * mib); /* 0: dropped, rebuild it */

    struct advm_pager_stats s;
    advm_pager_stats(p, &s);
    printf("kept %d then %d; discarded %llu pages unwritten, wrote %llu, read back %llu\n", kept, kept_after,
           (unsigned long long)s.discarded_pages, (unsigned long long)s.written_pages,
           (unsigned long long)s.read_pages);
    advm_pager_destroy(p);
    return kept == 1 && kept_after == 0 ? 0 : 1;
}
