/* One long-lived client merging the same buffer again and again through advmd: the
 * daemon's memory must not grow with the merges (docs/merge.md, "Merging the same pages
 * again"). Prints one line per 1000 merges, then "done", and keeps its session open
 * until its stdin closes, so the daemon can be measured meanwhile.
 * Build: cc -O2 -Iinclude -o repeat bench/merge/repeat.c -Ltarget/debug -ladvm \
 *          -Wl,-rpath,$PWD/target/debug
 * Run:   ADVM_SOCKET=/tmp/x/advmd.sock ./repeat TIMES KIB   (bench/merge/repeat.py does) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "advm.h"

int main(int argc, char **argv) {
    long times = argc > 1 ? atol(argv[1]) : 10000;
    size_t len = (argc > 2 ? atol(argv[2]) : 1024) << 10;
    uint8_t *buf = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return perror("mmap"), 1;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    for (long k = 0; k < times; k++) {
        struct advm_merge_stats s;
        int r = advm_merge(buf, len, &s);
        if (r != 0 || !s.via_daemon || s.merged + s.added != len / 4096) {
            fprintf(stderr, "merge %ld: %d (merged %lu added %lu via %s)\n", k, r, (unsigned long)s.merged,
                    (unsigned long)s.added, advm_merge_via());
            return 1;
        }
        if ((k + 1) % 1000 == 0) printf("%ld\n", k + 1), fflush(stdout);
    }
    printf("done\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
