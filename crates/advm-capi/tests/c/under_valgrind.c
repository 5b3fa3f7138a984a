/* A program a C programmer would run under valgrind: virtual copies, a move, a GC heap,
 * a merge and a trim. tests/c_programs.rs also runs it under valgrind (when
 * installed), where libadvm crashed on its first call (rustix read the vDSO's ELF
 * header through auxv, which valgrind does not map), advm_alloc failed (valgrind
 * refuses the arena's 256 GiB reservation with EINVAL), and so did advm_merge and
 * advm_merge_trim without advmd (-EINVAL, as for a bad range: valgrind refused the
 * process's own store's 64 GiB view). A merge needs userfaultfd, which valgrind lacks:
 * there it is -ENOSYS, and the trim finds nothing held. */
#define _GNU_SOURCE
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < 20; i++) {
        unsigned char *a = advm_alloc(4 * ps);
        if (!a) perror("advm_alloc");
        CHECK(a != NULL);
        memset(a, i, 4 * ps);
        unsigned char *b = advm_dup(a, 4 * ps);
        CHECK(b != NULL && all(b, 4 * ps, (unsigned char)i));
        b[ps] = 0xff;
        CHECK(a[ps] == (unsigned char)i);
        advm_free(a);
        advm_free(b);
    }
    unsigned char *m = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m + 4 * ps, 3, 4 * ps);
    CHECK(advm_move(m, m + 4 * ps, 4 * ps) == 0 && all(m, 4 * ps, 3));
    munmap(m, 8 * ps);
    for (int i = 0; i < 10; i++) {
        advm_gc *gc = advm_gc_new(1 << 20);
        CHECK(gc != NULL);
        void *root = advm_gc_alloc(gc, 1, 64);
        CHECK(root != NULL && advm_gc_root(gc, &root) == 0);
        for (int j = 0; j < 100; j++) {
            void *o = advm_gc_alloc(gc, 1, 32);
            CHECK(o != NULL && advm_gc_store(gc, o, 0, root) == 0);
            root = o;
        }
        CHECK(advm_gc_collect(gc, 1) == 0 && root != NULL);
        CHECK(advm_gc_unroot(gc, &root) == 0);
        advm_gc_destroy(gc);
    }
    setenv("ADVM_SOCKET", "/nonexistent/advmd.sock", 1);
    unsigned char *g = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(g != MAP_FAILED);
    memset(g, 5, 8 * ps);
    struct advm_merge_stats ms;
    int rc = advm_merge(g, 8 * ps, &ms);
    if (rc != 0) fprintf(stderr, "advm_merge: %d (%s)\n", rc, advm_merge_via());
    CHECK(rc == 0 || rc == -ENOSYS);
    CHECK(rc != 0 || (ms.added == 1 && ms.merged == 7));
    CHECK(all(g, 8 * ps, 5));
    CHECK(munmap(g, 8 * ps) == 0);
    struct advm_trim_stats ts;
    CHECK(advm_merge_trim(&ts) == 0 && ts.released == (rc == 0 ? 1 : 0) && ts.kept == 0);
    printf("under_valgrind: 20 virtual copies, a move, 10 GC heaps, a merge and a trim\n");
    return 0;
}
