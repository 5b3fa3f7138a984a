/* A program that holds nearly all of vm.max_map_count itself still gets every malloc it
 * would get under glibc (run by tests/c_programs.rs under every variant, and without the
 * shim).
 *
 * A virtual copy's sides are mappings of their own. The shim used to count only its own
 * mappings, against half the limit: a program that held all but a few hundred of the
 * limit and then allocated and copied blocks saw the copies take the last mappings, and
 * glibc's mmap, to which the shim hands what it cannot serve, fail: malloc returned NULL
 * (980 of 1,280 blocks of 256 KiB), where glibc had none. Here the program makes its
 * mappings (mprotect splits, half of them through syscall()) until 100 of the limit are
 * left, and then allocates and
 * copies blocks of 128 KiB (glibc maps each: its mmap threshold) four times that; every
 * one must be there with its bytes. Then it gives its mappings back, and blocks allocated
 * and copied again must all be there too (with an argument it waits before, and
 * tests/c_programs.rs checks that the shim made those copies virtual again). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "checks.h"

#define PS 4096
#define BLOCK (128 << 10)
#define LEFT 100
#define BLOCKS (4 * LEFT)

static char buf[1 << 16];

/* The mappings this process holds (lines of /proc/self/maps; [vsyscall] is one more than
 * the kernel counts, which errs on the safe side). */
static long mappings(void) {
    int fd = open("/proc/self/maps", O_RDONLY);
    CHECK(fd >= 0, "open maps: %s", strerror(errno));
    long n = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < r; i++) n += buf[i] == '\n';
    close(fd);
    return n;
}

/* Allocates and copies BLOCKS blocks from src; checks each; frees them. */
static void copies(const unsigned char *src, const char *when) {
    static unsigned char *b[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        b[i] = malloc(BLOCK);
        CHECK(b[i], "%s: malloc %d of %d returned NULL (%s), %ld mappings", when, i, BLOCKS, strerror(errno),
              mappings());
        memcpy(b[i], src, BLOCK);
    }
    for (int i = 0; i < BLOCKS; i++) {
        CHECK(memcmp(b[i], src, BLOCK) == 0, "%s: block %d differs from its source", when, i);
        free(b[i]);
    }
}

int main(int argc, char **argv) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long max;
    CHECK(f && fscanf(f, "%ld", &max) == 1, "read vm.max_map_count");
    fclose(f);
    unsigned char *src = malloc(BLOCK);
    CHECK(src, "malloc src");
    for (int i = 0; i < BLOCK; i++) src[i] = (unsigned char)(i * 7 + i / PS + 1);

    /* every other page of one region read-only: each mprotect makes two more mappings */
    long want = max - LEFT - mappings();
    CHECK(want > 0, "already %ld mappings", mappings());
    size_t len = (size_t)(want + 2) * PS;
    char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(r != MAP_FAILED, "mmap: %s", strerror(errno));
    for (long i = 0; i < want / 2; i++) {
        /* half through syscall(): the shim counts those too */
        void *page = r + (2 * i + 1) * PS;
        int rc = i % 2 ? mprotect(page, PS, PROT_READ) : (int)syscall(SYS_mprotect, page, PS, PROT_READ);
        CHECK(rc == 0, "mprotect %ld: %s", i, strerror(errno));
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long held = mappings();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double reading_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    CHECK(held >= max - LEFT - 2 && held <= max - LEFT + 2, "%ld mappings, wanted %ld", held, max - LEFT);

    copies(src, "near the limit");
    CHECK(munmap(r, len) == 0, "munmap: %s", strerror(errno));
    /* while it refuses, the shim reads the maps again only after a hundred times what its
     * last reading took (as long as this program's own: 23 ms at 65,000 mappings), and
     * at least 100 ms; with an argument (tests/c_programs.rs), this waits that long */
    (void)argv;
    if (argc > 1) usleep((useconds_t)((reading_s * 200 > 0.1 ? reading_s * 200 : 0.1) * 1e6));
    copies(src, "after the program's mappings are gone");
    free(src);
    printf("map_count: ok (%ld of %ld mappings held, %d blocks of %d KiB copied)\n", held, max, BLOCKS, BLOCK >> 10);
    return 0;
}
