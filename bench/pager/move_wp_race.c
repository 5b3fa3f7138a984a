// Does UFFDIO_MOVE report a failure for a page it did move, when another thread
// clears userfaultfd write protection on that page at the same moment? On Linux 6.18
// here: about 8 in 200,000 moves (docs/pager.md). advm's pager checks the page tables
// after every failed move because of it.
//   gcc -O2 -pthread -o move_wp_race move_wp_race.c && ./move_wp_race 200000
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef UFFDIO_MOVE // headers older than Linux 6.8
struct uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif

static int uffd;
static char *region, *staging;
static long ps;
static volatile int stop;

// The page has a page-table entry (present) by /proc/self/pagemap.
static int present(void *p) {
    int fd = open("/proc/self/pagemap", O_RDONLY);
    uint64_t e = 0;
    if (fd < 0 || pread(fd, &e, 8, (uintptr_t)p / ps * 8) != 8) { perror("pagemap"); exit(2); }
    close(fd);
    return e >> 63 & 1;
}

static void *unprotect(void *arg) {
    (void)arg;
    while (!stop) {
        struct uffdio_writeprotect wp = {.range = {(uintptr_t)region, ps}, .mode = 0};
        ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200000, failed = 0, moved_anyway = 0;
    ps = sysconf(_SC_PAGESIZE);
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("userfaultfd"); return 2; }
    region = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    staging = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register r1 = {.range = {(uintptr_t)region, ps},
                                 .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    struct uffdio_register r2 = {.range = {(uintptr_t)staging, ps}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &r1) || ioctl(uffd, UFFDIO_REGISTER, &r2)) { perror("register"); return 2; }
    static char page[65536] __attribute__((aligned(65536)));
    memset(page, 7, ps);
    pthread_t t;
    pthread_create(&t, NULL, unprotect, NULL);
    for (long i = 0; i < rounds; i++) {
        struct uffdio_copy c = {.dst = (uintptr_t)region, .src = (uintptr_t)page, .len = ps,
                                .mode = UFFDIO_COPY_MODE_WP | UFFDIO_COPY_MODE_DONTWAKE};
        if (ioctl(uffd, UFFDIO_COPY, &c)) { perror("UFFDIO_COPY"); return 2; }
        struct uffdio_move m = {.dst = (uintptr_t)staging, .src = (uintptr_t)region, .len = ps};
        if (ioctl(uffd, UFFDIO_MOVE, &m)) {
            failed++;
            if (present(staging) && !present(region)) moved_anyway++;
        }
        madvise(staging, ps, MADV_DONTNEED);
        madvise(region, ps, MADV_DONTNEED);
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("%ld moves, %ld reported failed, %ld of those moved the page anyway\n", rounds, failed, moved_anyway);
    return moved_anyway ? 1 : 0;
}
