/* Fresh memory on this VM, with bare system calls: (1) the first touch of new
 * anonymous memory, 256 MiB at a time, none of it freed (the host backs guest memory
 * it was told is free only when it is touched again); (2) the merge's add, copying
 * 1 GiB into sealed memfds in batches, keeping the source against mapping each
 * batch's file pages over the source right after it (the source's pages are freed
 * and the next batch reuses them). docs/merge.md, "Fresh memory", quotes it.
 * Build and run: cc -O2 -o fresh bench/merge/fresh.c && ./fresh 48 && ./fresh behind 1024 16 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void first_touch(int chunks) {
    size_t len = 256 << 20;
    for (int i = 0; i < chunks; i++) {
        char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return perror("mmap");
        double t = now();
        memset(p, 1, len);
        printf("%.2f ", len / (now() - t) / 1e9);
        fflush(stdout);
    }
    printf(" GB/s, first touch of each new 256 MiB\n");
}

/* mode 0: keep the source; mode 1: map each batch's file pages over it. */
static double add(size_t len, size_t batch, int mode) {
    unsigned char *src = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned long long x = 88172645463325252ULL;
    for (size_t i = 0; i < len / 8; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((unsigned long long *)src)[i] = x;
    }
    int fds[4096], nf = 0;
    double t = now();
    for (size_t off = 0; off < len; off += batch) {
        int fd = memfd_create("add", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (pwrite(fd, src + off, batch, 0) != (ssize_t)batch) perror("pwrite"), exit(1);
        fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
        if (mode == 1 && mmap(src + off, batch, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED)
            perror("mmap"), exit(1);
        fds[nf++] = fd;
    }
    t = now() - t;
    munmap(src, len);
    for (int i = 0; i < nf; i++) close(fds[i]);
    return len / t / 1e9;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "behind")) {
        size_t len = (size_t)atoi(argv[2]) << 20, batch = (size_t)atoi(argv[3]) << 20;
        for (int r = 0; r < 3; r++) {
            double a = add(len, batch, 0), b = add(len, batch, 1);
            printf("keep the source %.2f GB/s   map each batch over it %.2f GB/s\n", a, b);
        }
        return 0;
    }
    first_touch(argc > 1 ? atoi(argv[1]) : 16);
    return 0;
}
