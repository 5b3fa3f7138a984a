/* Decay of freed memory kept by the shim (run by tests/c_programs.rs): with 64 MiB
 * live, a 16 MiB block is written and freed (its pages are kept for reuse); after
 * argv[1] ms and one more arena call, prints how many KiB of resident memory went back
 * to the system. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rss.h"

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    long wait_ms = atol(argv[1]);
    unsigned char *keep = malloc(64 << 20), *p = malloc(16 << 20);
    if (!keep || !p) return 3;
    memset(keep, 1, 64 << 20);
    memset(p, 2, 16 << 20);
    free(p);
    long before = rss_kib();
    struct timespec t = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
    free(malloc(3 * 4096)); /* any arena call lets the shim look at the clock */
    long after = rss_kib();
    if (keep[12345] != 1) return 4;
    printf("%ld\n", before - after);
    return 0;
}
