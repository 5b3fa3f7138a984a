/* The program's own mappings beside the shim's blocks: mmap, mremap (grow, move,
 * shrink), munmap of part of a mapping, copies both ways between them and large
 * blocks; guard pages (mprotect) in page-aligned blocks, which must fault, and blocks
 * freed while still read-only, after which a new block of the same size must be
 * writable. */
#include "sweep.h"
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define MB (1ul << 20)

static void poke(void *p) { *(volatile char *)p = 1; }

int main(void) {
    char *m = mmap(NULL, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    char *a = malloc(8 * MB), *b = malloc(8 * MB);
    CHECK(a && b);
    fill(a, 8 * MB, 1);
    memcpy(m, a, 8 * MB);
    m = mremap(m, 8 * MB, 16 * MB, MREMAP_MAYMOVE);
    CHECK(m != MAP_FAILED && holds(m, 8 * MB, 1, 0));
    memcpy(m + 8 * MB, a, 8 * MB);
    memcpy(b, m + 8 * MB, 8 * MB);
    CHECK(holds(b, 8 * MB, 1, 0));
    m = mremap(m, 16 * MB, 4 * MB, 0);
    CHECK(m != MAP_FAILED && holds(m, 4 * MB, 1, 0));
    CHECK(munmap(m + MB, MB) == 0);
    memcpy(b + 4096, m + 2 * MB, 2 * MB);
    CHECK(holds(b + 4096, 2 * MB, 1, 2 * MB));
    munmap(m, MB), munmap(m + 2 * MB, 2 * MB);
    printf("own mappings: %016llx\n", (unsigned long long)sum(b, 8 * MB));

    /* a guard page at the end of a page-aligned block */
    char *g = valloc(MB);
    CHECK(g);
    fill(g, MB, 3);
    CHECK(mprotect(g + MB - 4096, 4096, PROT_NONE) == 0);
    memcpy(a, g, MB - 4096);
    CHECK(holds(a, MB - 4096, 3, 0));
    in_child("write to the guard page", poke, g + MB - 1);
    in_child("write before the guard page", poke, g + MB - 4097);
    CHECK(mprotect(g + MB - 4096, 4096, PROT_READ | PROT_WRITE) == 0);
    memcpy(g, b, MB); /* writable again: copies into it work */
    CHECK(holds(g + 4096, MB - 8192, 1, 2 * MB));
    free(g);

    /* freed while read-only (glibc unmaps a block this big, with the mmap threshold
     * fixed: its dynamic one moves such blocks into the heap after a free, and freeing a
     * read-only heap chunk crashes glibc): the next one is writable */
    CHECK(mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1);
    for (int i = 0; i < 4; i++) {
        char *r = valloc(2 * MB);
        CHECK(r);
        memset(r, 7, 2 * MB);
        CHECK(mprotect(r, 2 * MB, PROT_READ) == 0);
        free(r);
        char *w = malloc(2 * MB);
        CHECK(w);
        memset(w, 8, 2 * MB);
        free(w);
    }
    printf("blocks freed read-only: the next ones are writable\n");
    free(a), free(b);
    return 0;
}
