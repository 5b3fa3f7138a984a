/* docs/remap.md's example: move, swap and batch page ranges.
 * cc -Iinclude examples/c/remap.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int main(void) {
    size_t mib = 1 << 20, len = 64 * mib;
    char *heap = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (heap == MAP_FAILED) return perror("mmap"), 1;
    memset(heap + 8 * mib, 7, 4 * mib);
    int rc = advm_move(heap, heap + 8 * mib, 4 * mib);  /* 0 or -errno; ranges may overlap (a slide) */
    if (rc) return fprintf(stderr, "advm_move: %s\n", strerror(-rc)), 1;
    rc = advm_swap(heap, heap + 32 * mib, 4 * mib);      /* disjoint ranges */
    if (rc || heap[32 * mib] != 7) return fprintf(stderr, "advm_swap: %d\n", rc), 1;

    /* A compaction: many moves, one batch (run in order, as if one after another). */
    struct advm_batch *bt = advm_batch_new();
    advm_batch_move(bt, heap, heap + 32 * mib, 2 * mib);
    advm_batch_move(bt, heap + 2 * mib, heap + 34 * mib, 2 * mib);
    struct advm_remap_stats st;
    rc = advm_batch_run(bt, &st);
    advm_batch_free(bt);
    if (rc) return fprintf(stderr, "advm_batch_run: %s\n", strerror(-rc)), 1;
    printf("%zu bytes as pages (UFFDIO_MOVE), %zu by mremap, %zu copied, %u syscalls\n",
           st.uffd_move_bytes, st.mremap_bytes, st.memmove_bytes, st.syscalls);
    return heap[0] == 7 && heap[4 * mib - 1] == 7 ? 0 : 1;
}
