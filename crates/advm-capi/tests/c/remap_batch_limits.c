/* A batch that cannot get what it needs (here: address space for its swap scratch
 * area, under a tight RLIMIT_AS) fails before it changes anything; a lone
 * advm_move_stats says so the same way (its stats are written on error too). */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = 64;
    unsigned char *m = mmap(NULL, n * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    advm_remap_set_break_even_pages(1);
    /* Warm up: userfaultfd, registration, vectored zap (no swap: no scratch area yet). */
    struct advm_batch *b = advm_batch_new();
    CHECK(b != NULL);
    CHECK(advm_batch_move(b, m + 48 * ps, m + 56 * ps, 2 * ps) == 0);
    CHECK(advm_batch_move(b, m + 52 * ps, m + 60 * ps, 2 * ps) == 0);
    CHECK(advm_batch_run(b, NULL) == 0);
    for (size_t i = 0; i < n; i++) memset(m + i * ps, (int)(i + 1), ps);

    /* Leave a few MiB of address space: the swap's 16 MiB scratch area cannot be made. */
    struct rlimit rl = {vm_size() + (4u << 20), RLIM_INFINITY};
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    CHECK(advm_batch_move(b, m, m + 16 * ps, 8 * ps) == 0);
    CHECK(advm_batch_swap(b, m + 32 * ps, m + 40 * ps, 4 * ps) == 0);
    struct advm_remap_stats st, lone;
    memset(&st, 0xff, sizeof st);
    int r = advm_batch_run(b, &st);
    /* A lone move sliding up by one page (through the scratch area too): its stats are
     * written on error as a batch's are (advm_move_stats left them unwritten). */
    memset(&lone, 0xff, sizeof lone);
    int rm = advm_move_stats(m + 49 * ps, m + 48 * ps, 12 * ps, &lone);
    rl.rlim_cur = RLIM_INFINITY;
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    printf("batch under RLIMIT_AS: %d (%s)\n", r, r ? strerror(-r) : "ran");
    if (r == 0) {
        for (size_t i = 0; i < 8; i++) CHECK(all(m + i * ps, ps, (unsigned char)(17 + i)));
        for (size_t i = 0; i < 4; i++) CHECK(all(m + (32 + i) * ps, ps, (unsigned char)(41 + i)));
    } else {
        CHECK(r == -ENOMEM && st.completed_ops == 0 && st.memory_changed == 0);
        /* Nothing ran: every page still holds its own tag. */
        for (size_t i = 0; i < 48; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
    }
    printf("lone move under RLIMIT_AS: %d (%s)\n", rm, rm ? strerror(-rm) : "ran");
    if (rm == 0) {
        CHECK(lone.completed_ops == 1 && lone.memory_changed == 0);
        for (size_t i = 0; i < 12; i++) CHECK(all(m + (49 + i) * ps, ps, (unsigned char)(49 + i)));
    } else {
        CHECK(rm == -ENOMEM && lone.completed_ops == 0 && lone.memory_changed == 0);
        for (size_t i = 48; i < 61; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
    }
    /* Refused before anything changed (unaligned): written too, nothing changed. */
    memset(&lone, 0xff, sizeof lone);
    CHECK(advm_move_stats(m + 1, m + 8 * ps, ps, &lone) == -EINVAL);
    CHECK(lone.completed_ops == 0 && lone.memory_changed == 0 && lone.uffd_move_bytes == 0);
    advm_batch_free(b);
    advm_remap_set_break_even_pages(0);
    printf("remap batch limits: ok\n");
    return 0;
}
