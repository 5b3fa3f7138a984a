/* The aligned allocators: page alignment or less is served by the arena for large
 * sizes; larger alignments and small sizes go to glibc; bad arguments fail as glibc's. */
#include "t.h"

int main(void) {
    size_t aligns[] = {16, 64, 4096, 8192, 1 << 16};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        size_t al = aligns[i];
        void *p = NULL;
        CHECK(posix_memalign(&p, al, 3 * PS) == 0 && p && (uintptr_t)p % al == 0);
        if (al <= PS) CHECK(in_arena(p, 3 * PS));
        fill(p, 3 * PS, (unsigned)i);
        CHECK(same(p, 3 * PS, (unsigned)i));
        free(p);
        p = aligned_alloc(al, 4 * PS);
        CHECK(p && (uintptr_t)p % al == 0);
        free(p);
        p = memalign(al, 5 * PS);
        CHECK(p && (uintptr_t)p % al == 0);
        free(p);
        p = memalign(al, 100);
        CHECK(p && (uintptr_t)p % al == 0 && !in_arena(p, 100));
        free(p);
    }
    void *p = (void *)1;
    CHECK(posix_memalign(&p, 3, 3 * PS) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, 4, 3 * PS) == EINVAL); /* not a multiple of sizeof(void *) */
    /* glibc's answer: EINVAL from 2.38, before it the alignment rounded up (4) */
    errno = 0;
    void *odd = aligned_alloc(3, 3 * PS);
    CHECK(odd ? (uintptr_t)odd % 4 == 0 : errno == EINVAL);
    free(odd);
    void *v = valloc(2 * PS);
    CHECK(v && in_arena(v, 2 * PS));
    free(v);
    v = valloc(10);
    CHECK(v && (uintptr_t)v % PS == 0);
    free(v);
    v = pvalloc(3 * PS - 5);
    CHECK(v && (uintptr_t)v % PS == 0);
    free(v);
    printf("memalign: ok\n");
    return 0;
}
