/* advm_move / advm_swap / batches from C: contents, errors, memory left untouched. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = 64;
    unsigned char *m = mmap(NULL, n * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    for (size_t i = 0; i < n; i++) memset(m + i * ps, (int)(i + 1), ps);

    /* Force page engines for any size, then move 8 pages: dst gets src's bytes. */
    advm_remap_set_break_even_pages(1);
    CHECK(advm_remap_break_even_pages() == 1);
    struct advm_remap_stats st;
    CHECK(advm_move_stats(m + 32 * ps, m, 8 * ps, &st) == 0);
    for (size_t i = 0; i < 8; i++) CHECK(all(m + (32 + i) * ps, ps, (unsigned char)(i + 1)));
    CHECK(st.uffd_move_bytes + st.mremap_bytes + st.memmove_bytes == 8 * ps);
    printf("move: %zu bytes by UFFDIO_MOVE, %zu by mremap, %zu copied, %u syscalls\n", st.uffd_move_bytes,
           st.mremap_bytes, st.memmove_bytes, st.syscalls);

    /* Slide 16 pages down by 1 page (overlapping move). */
    for (size_t i = 0; i < 17; i++) memset(m + (40 + i) * ps, (int)(100 + i), ps);
    CHECK(advm_move(m + 40 * ps, m + 41 * ps, 16 * ps) == 0);
    for (size_t i = 0; i < 16; i++) CHECK(all(m + (40 + i) * ps, ps, (unsigned char)(101 + i)));

    /* Swap. */
    memset(m + 8 * ps, 0xaa, 4 * ps);
    memset(m + 16 * ps, 0xbb, 4 * ps);
    CHECK(advm_swap(m + 8 * ps, m + 16 * ps, 4 * ps) == 0);
    CHECK(all(m + 8 * ps, 4 * ps, 0xbb) && all(m + 16 * ps, 4 * ps, 0xaa));

    /* Misuse: unaligned, overlapping swap, unmapped, read-only, wrapping; nothing changes. */
    memset(m, 7, 8 * ps);
    CHECK(advm_move(m + 1, m + ps, ps) == -EINVAL);
    CHECK(advm_move(m, m + ps, 100) == -EINVAL);
    CHECK(advm_swap(m, m + 2 * ps, 4 * ps) == -EINVAL);
    CHECK(munmap(m + 63 * ps, ps) == 0);
    CHECK(advm_move(m, m + 62 * ps, 2 * ps) == -EINVAL);
    CHECK(mprotect(m + 61 * ps, ps, PROT_READ) == 0);
    CHECK(advm_move(m + 60 * ps, m, 2 * ps) == -EINVAL);
    CHECK(advm_move(m, (void *)(~(size_t)0 - ps + 1), 2 * ps) == -EINVAL);
    CHECK(all(m, 8 * ps, 7));

    /* A batch: three objects compacted to the front, then a swap. */
    struct advm_batch *b = advm_batch_new();
    CHECK(b != NULL);
    for (size_t i = 0; i < 3; i++) memset(m + (20 + 3 * i) * ps, (int)(50 + i), 2 * ps);
    for (size_t i = 0; i < 3; i++) CHECK(advm_batch_move(b, m + 2 * i * ps, m + (20 + 3 * i) * ps, 2 * ps) == 0);
    CHECK(advm_batch_swap(b, m, m + 2 * ps, 2 * ps) == 0);
    CHECK(advm_batch_run(b, &st) == 0);
    CHECK(all(m, 2 * ps, 51) && all(m + 2 * ps, 2 * ps, 50) && all(m + 4 * ps, 2 * ps, 52));
    /* A batch with one bad operation runs nothing. */
    CHECK(advm_batch_move(b, m + 8 * ps, m + 4 * ps, 2 * ps) == 0);
    CHECK(advm_batch_swap(b, m, m + ps, 2 * ps) == 0);
    CHECK(advm_batch_run(b, NULL) == -EINVAL);
    CHECK(all(m + 4 * ps, 2 * ps, 52));
    advm_batch_free(b);
    advm_remap_set_break_even_pages(0);
    printf("remap: moves, slide, swap, batch and misuse ok\n");
    return 0;
}
