/* Every type and renamed function of advm.h by its current name (struct advm_X, no
 * typedefs): built with -Werror like every program here, so a header change that
 * made a current name warn (or deprecated one by mistake) fails the build. */
#include <advm.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *a = advm_alloc(4 * ps);
    CHECK(a != NULL);
    memset(a, 3, 4 * ps);
    unsigned char *b = advm_dup(a, 4 * ps);
    CHECK(b != NULL && b[4 * ps - 1] == 3);
    struct advm_vcopy_stats vs;
    CHECK(advm_vcopy_get_stats(&vs) == 0 && vs.blocks >= 2 && vs.pages_shared >= 4);
    advm_free(b);
    advm_free(a);

    unsigned char *m = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 9, 2 * ps);
    struct advm_remap_stats rs;
    CHECK(advm_move_stats(m + 4 * ps, m, 2 * ps, &rs) == 0 && m[4 * ps] == 9 && rs.completed_ops == 1);
    struct advm_batch *bt = advm_batch_new();
    CHECK(bt != NULL);
    CHECK(advm_batch_move(bt, m, m + 4 * ps, 2 * ps) == 0);
    CHECK(advm_batch_run(bt, &rs) == 0 && m[0] == 9 && rs.completed_ops == 1);
    advm_batch_free(bt);
    munmap(m, 8 * ps);
    printf("current names: struct advm_vcopy_stats, advm_vcopy_get_stats, struct advm_remap_stats, struct advm_batch\n");
    return 0;
}
