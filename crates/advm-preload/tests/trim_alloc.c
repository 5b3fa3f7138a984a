/* Trimming triggered by allocations (run by tests/c_programs.rs): a 16 MiB block copied,
 * both sides written whole, then 16 MiB allocated and written in 1 MiB blocks. With
 * ADVM_TRIM_KIB=4096 an allocation after the writes trims: the copy's 4096 memfd pages
 * go back (--stats: memfd_pages_trimmed_under_written_views). Exits 0 when the bytes
 * are right. */
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t len = 16 << 20;
    unsigned char *a = malloc(len), *b = malloc(len);
    if (!a || !b) return 2;
    memset(a, 1, len);
    memcpy(b, a, len);
    memset(a, 2, len);
    memset(b, 3, len);
    unsigned char *k[16];
    for (int i = 0; i < 16; i++) {
        k[i] = malloc(1 << 20);
        if (!k[i]) return 2;
        memset(k[i], i, 1 << 20);
    }
    for (size_t i = 0; i < len; i += 4096)
        if (a[i] != 2 || b[i] != 3) return 1;
    for (int i = 0; i < 16; i++) free(k[i]);
    free(a);
    free(b);
    return 0;
}
