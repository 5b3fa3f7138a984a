/* The names renamed in 0.1 still work for one release: advm_vcopy_stats() (now
 * advm_vcopy_get_stats) and the typedefs advm_remap_stats and advm_batch (now written
 * struct advm_remap_stats, struct advm_batch). Built with -Wno-deprecated-declarations
 * (c_programs.rs: files named deprecated_*); the same file under -Werror must fail,
 * which shows the old names are marked deprecated. */
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
    memset(a, 5, 4 * ps);
    unsigned char *b = advm_dup(a, 4 * ps);
    CHECK(b != NULL);
    /* the alias fills the same counters as the current name */
    struct advm_vcopy_stats old, cur;
    memset(&old, 0xff, sizeof old);
    CHECK(advm_vcopy_stats(&old) == 0);
    CHECK(advm_vcopy_get_stats(&cur) == 0);
    CHECK(memcmp(&old, &cur, sizeof old) == 0 && old.blocks >= 2 && old.pages_shared >= 4);
    CHECK(advm_vcopy_stats(NULL) < 0);
    advm_free(b);
    advm_free(a);

    unsigned char *m = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 7, 2 * ps);
    advm_remap_stats rs; /* the typedef names the same struct */
    struct advm_remap_stats *same = &rs;
    CHECK(advm_move_stats(m + 4 * ps, m, 2 * ps, same) == 0 && m[4 * ps] == 7 && rs.completed_ops == 1);
    advm_batch *bt = advm_batch_new();
    CHECK(bt != NULL);
    CHECK(advm_batch_move(bt, m, m + 4 * ps, 2 * ps) == 0);
    CHECK(advm_batch_run(bt, &rs) == 0 && m[0] == 7);
    advm_batch_free(bt);
    munmap(m, 8 * ps);
    printf("deprecated names: advm_vcopy_stats(), advm_remap_stats, advm_batch still work\n");
    return 0;
}
