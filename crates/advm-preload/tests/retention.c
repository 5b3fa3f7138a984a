/* Reuse of freed memory by the shim (run by tests/c_programs.rs with chosen settings).
 * argv[1] = pages per copied block: two blocks are filled, one copied into the other
 * and compared. argv[2] = MiB kept live while 32 blocks of argv[3] MiB are allocated,
 * written and freed in turn. Exits 0 when every byte checks out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    size_t ps = 4096, copy = (size_t)atol(argv[1]) * ps;
    size_t live = (size_t)atol(argv[2]) << 20, churn = (size_t)atol(argv[3]) << 20;
    unsigned char *a = malloc(copy), *b = malloc(copy);
    if (!a || !b) return 3;
    for (size_t i = 0; i < copy; i++) a[i] = (unsigned char)(i * 7);
    memcpy(b, a, copy);
    for (size_t i = 0; i < copy; i++)
        if (b[i] != (unsigned char)(i * 7)) return 4;
    free(a);
    free(b);
    unsigned char *keep = malloc(live);
    if (!keep) return 3;
    memset(keep, 1, live);
    for (int k = 0; k < 32; k++) {
        unsigned char *p = malloc(churn);
        if (!p) return 3;
        /* a reused block may hold old bytes (malloc does not promise zeros): write all */
        memset(p, k, churn);
        if (p[churn / 2] != (unsigned char)k) return 5;
        free(p);
    }
    if (keep[live - 1] != 1) return 6;
    free(keep);
    puts("retention: ok");
    return 0;
}
