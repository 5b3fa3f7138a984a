/* What one advm_move of a large range costs beyond the kernel's bare move, piece by
 * piece (docs/remap.md, "vs raw mremap"). Each variant runs right after the same
 * refill (memset of the source, MADV_DONTNEED of the destination), interleaved, and
 * prints its median.
 *
 *   cc -O2 -Iinclude -o /tmp/move_floor bench/remap/move_floor.c \
 *      -Ltarget/release -ladvm -Wl,-rpath,$PWD/target/release
 *   /tmp/move_floor SIZE_MIB RUNS ALIGN_MIB      e.g. 1024 9 1024, or 16 15 2
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "advm.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* Linux 6.11's PROCMAP_QUERY (Debian 12's headers predate it). */
struct procmap_query {
    uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define PROCMAP_QUERY _IOWR(0x66, 17, struct procmap_query)

enum { VARIANTS = 6, MAX_RUNS = 64 };
static const char *names[VARIANTS] = {
    "plain mremap", "DONTUNMAP mremap", "query + DONTUNMAP",
    "2 queries + mincore + DONTUNMAP", "advm_move", "advm_move, code warmed",
};

static int maps_fd;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void query(void *addr) {
    struct procmap_query q = {.size = sizeof q, .query_addr = (uintptr_t)addr};
    if (ioctl(maps_fd, PROCMAP_QUERY, &q)) {
        perror("PROCMAP_QUERY");
        exit(1);
    }
}

static void *dontunmap(char *src, char *dst, size_t len) {
    return mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, dst);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SIZE_MIB RUNS ALIGN_MIB\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)atol(argv[1]) << 20, align = (size_t)atol(argv[3]) << 20;
    int runs = atoi(argv[2]);
    if (runs < 1 || runs > MAX_RUNS || len == 0 || align == 0) {
        fprintf(stderr, "RUNS is 1..%d, sizes are positive\n", MAX_RUNS);
        return 2;
    }
    maps_fd = open("/proc/self/maps", O_RDONLY);
    char *base = mmap(NULL, 2 * len + align, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (maps_fd < 0 || base == MAP_FAILED) {
        perror("setup");
        return 1;
    }
    char *dst = (char *)(((uintptr_t)base + align - 1) & ~(align - 1)), *src = dst + len;
    static double us[VARIANTS][MAX_RUNS];
    unsigned char resident;
    for (int i = 0; i < runs; i++) {
        for (int v = 0; v < VARIANTS; v++) {
            madvise(dst, 2 * len, MADV_HUGEPAGE);
            memset(src, 0xab, len);
            madvise(dst, len, MADV_DONTNEED);
            if (v == 5)
                advm_move(dst + 4096, src + 4096, 4096); /* a small move: brings the code back */
            double t = now_us();
            void *r = dst;
            switch (v) {
            case 0: r = mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, dst); break;
            case 1: r = dontunmap(src, dst, len); break;
            case 2: query(dst); r = dontunmap(src, dst, len); break;
            case 3: query(dst); query(src); mincore(dst, 4096, &resident); r = dontunmap(src, dst, len); break;
            default: if (advm_move(dst, src, len)) r = MAP_FAILED; break;
            }
            us[v][i] = now_us() - t;
            if (r == MAP_FAILED) {
                perror(names[v]);
                return 1;
            }
            if (dst[0] != (char)0xab || dst[len - 1] != (char)0xab) {
                fprintf(stderr, "%s: wrong bytes at the destination\n", names[v]);
                return 1;
            }
            if (v == 0) /* the plain call unmapped the source */
                mmap(src, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        }
    }
    for (int v = 0; v < VARIANTS; v++) {
        qsort(us[v], runs, sizeof(double), by_value);
        printf("%zu MiB, %zu MiB aligned: %-32s %7.1f us\n", len >> 20, align >> 20, names[v], us[v][runs / 2]);
    }
    return 0;
}
