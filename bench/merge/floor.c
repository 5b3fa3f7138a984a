/* The kernel's floor under one merge, with bare system calls: what adding new pages
 * to a shmem store and mapping store pages over a range cost on this machine, with
 * no advm code in the way. Build and run: cc -O2 -pthread -o floor bench/merge/floor.c && ./floor 512
 * (MiB). Figures in GB/s of the range; docs/merge.md quotes them. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One receiver of the two-pipe line: splices its half into the memfd at its offset. */
struct half {
    int pipe, file;
    loff_t off;
    size_t len;
};

static void *receive_half(void *arg) {
    struct half *h = arg;
    for (size_t got = 0; got < h->len;) {
        ssize_t r = splice(h->pipe, 0, h->file, &h->off, h->len - got, SPLICE_F_MOVE);
        if (r <= 0) return perror("splice"), (void *)1;
        got += r;
    }
    return 0;
}

static void report(const char *what, size_t len, double t0) { printf("%-44s %6.2f GB/s\n", what, len / (now() - t0) / 1e9); }

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 512) << 20, chunk = 8 << 20;
    char *a = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED) return perror("mmap"), 1;
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(a + i, &x, 8);
    }
    double t = now();
    memcpy(b, a, len);
    report("memcpy into new anonymous pages", len, t);
    t = now();
    volatile int c = memcmp(a, b, len);
    report("memcmp", len, t);

    int store = memfd_create("store", 0);
    if (ftruncate(store, len) != 0) return perror("ftruncate"), 1;
    t = now();
    for (size_t o = 0; o < len; o += chunk)
        if (pwrite(store, a + o, chunk, o) != (ssize_t)chunk) return perror("pwrite"), 1;
    report("pwrite into new memfd pages (one copy)", len, t);

    int spliced = memfd_create("spliced", 0), p[2];
    if (ftruncate(spliced, len) != 0 || pipe(p) != 0) return perror("pipe"), 1;
    fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    t = now();
    pid_t child = fork();
    if (child == 0) {
        for (size_t d = 0; d < len;) {
            struct iovec v = {a + d, len - d < (1 << 20) ? len - d : (1 << 20)};
            ssize_t r = vmsplice(p[1], &v, 1, 0);
            if (r <= 0) _exit(1);
            d += r;
        }
        _exit(0);
    }
    close(p[1]);
    loff_t off = 0;
    for (size_t got = 0; got < len;) {
        ssize_t r = splice(p[0], 0, spliced, &off, len - got, SPLICE_F_MOVE);
        if (r <= 0) return perror("splice"), 1;
        got += r;
    }
    waitpid(child, 0, 0);
    report("vmsplice in one process, splice into memfd", len, t);

    /* The same, split in two halves over two pipes: one sender feeding whichever pipe
     * has room, two receiving threads (advmd's two-pipe add). */
    int two = memfd_create("two", 0), q[2][2];
    if (ftruncate(two, len) != 0 || pipe(q[0]) != 0 || pipe(q[1]) != 0) return perror("pipe"), 1;
    for (int k = 0; k < 2; k++) fcntl(q[k][1], F_SETPIPE_SZ, 1 << 20), fcntl(q[k][1], F_SETFL, O_NONBLOCK);
    t = now();
    child = fork();
    if (child == 0) {
        size_t done[2] = {0, 0}, half = len / 2;
        while (done[0] < half || done[1] < half) {
            struct pollfd pf[2] = {{done[0] < half ? q[0][1] : -1, POLLOUT, 0}, {done[1] < half ? q[1][1] : -1, POLLOUT, 0}};
            poll(pf, 2, -1);
            for (int k = 0; k < 2; k++) {
                if (done[k] >= half) continue;
                struct iovec v = {a + k * half + done[k], half - done[k] < (1 << 20) ? half - done[k] : (1 << 20)};
                ssize_t r = vmsplice(q[k][1], &v, 1, SPLICE_F_NONBLOCK);
                if (r > 0) done[k] += r;
            }
        }
        _exit(0);
    }
    close(q[0][1]);
    close(q[1][1]);
    struct half h[2] = {{q[0][0], two, 0, len / 2}, {q[1][0], two, len / 2, len / 2}};
    pthread_t th;
    pthread_create(&th, 0, receive_half, &h[1]);
    receive_half(&h[0]);
    pthread_join(th, 0);
    waitpid(child, 0, 0);
    report("the same through two pipes, two receivers", len, t);

    char *view = mmap(0, len, PROT_READ, MAP_SHARED, store, 0);
    t = now();
    c = memcmp(a, view, len);
    report("memcmp against store pages, faulting", len, t);
    /* Compare without mapping the store: pread 64 pages at a time into a buffer that
     * stays in cache, then memcmp (no page tables to fill and tear down). */
    char *buf = malloc(64 << 12);
    t = now();
    for (size_t o = 0; o < len; o += 64 << 12) {
        if (pread(store, buf, 64 << 12, o) != 64 << 12) return perror("pread"), 1;
        c += memcmp(a + o, buf, 64 << 12);
    }
    report("pread 256 KiB into a buffer, then memcmp", len, t);
    char *view2 = mmap(0, len, PROT_READ, MAP_SHARED, spliced, 0);
    t = now();
    madvise(view2, len, MADV_POPULATE_READ);
    c = memcmp(a, view2, len);
    report("MADV_POPULATE_READ, then memcmp", len, t);
    t = now();
    if (mmap(b, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, store, 0) != b) return perror("mmap"), 1;
    report("one mmap MAP_FIXED|MAP_PRIVATE over the range", len, t);
    t = now();
    for (size_t i = 0; i < len; i += 4096) c += b[i];
    report("first read of each merged page (fault)", len, t);
    (void)c;
    return 0;
}
