/* Helpers for the shim's C tests: each program runs under LD_PRELOAD=libadvm-preload
 * (ADVM_MODE from the runner) and exits 0 when every check passed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PS 4096u
#define CHECK(c)                                                                     \
    do {                                                                             \
        if (!(c)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);    \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* vcopy mode, by its name or its deprecated name cow (the shim's default) */
static inline int vcopy_mode(void) {
    const char *m = getenv("ADVM_MODE");
    return !m || strcmp(m, "vcopy") == 0 || strcmp(m, "cow") == 0;
}

/* Physical frame of the page at p, read first so that it is present (0 when PFNs
 * are hidden). */
static inline uint64_t pfn(const void *p) {
    static int fd = -1;
    (void)*(const volatile unsigned char *)p;
    if (fd < 0) fd = open("/proc/self/pagemap", O_RDONLY);
    uint64_t e = 0;
    if (pread(fd, &e, 8, (off_t)((uintptr_t)p / PS * 8)) != 8) return 0;
    return (e >> 63) ? (e & ((1ull << 55) - 1)) : 0;
}

/* True when PFNs are visible (root): sharing can then be checked directly. */
static inline int pfns_visible(void) {
    static volatile char probe[PS * 2];
    probe[PS] = 1;
    return pfn((const void *)&probe[PS]) != 0;
}

static inline void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed + i / PS);
}
static inline int same(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31 + seed + i / PS)) return 0;
    return 1;
}
/* An arena block: page aligned, usable size rounded up to whole pages. */
static inline int in_arena(void *p, size_t n) {
    return ((uintptr_t)p % PS) == 0 && malloc_usable_size(p) == (n + PS - 1) / PS * PS;
}

/* vcopy mode with anonymous fresh blocks: the arena memfds then hold only pages under
 * copies, so their size measures what copies keep. */
static inline int memfd_holds_only_copies(void) {
    const char *fresh = getenv("ADVM_VCOPY_FRESH");
    return vcopy_mode() && !(fresh && strcmp(fresh, "memfd") == 0);
}

/* Pages allocated in this process's arena memfds (fstat st_blocks of each open
 * `memfd:advm-arena`). */
static inline long memfd_pages(void) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    long blocks = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[64], target[128];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        struct stat st;
        if (strstr(target, "memfd:advm-arena") && fstat(atoi(e->d_name), &st) == 0) blocks += st.st_blocks;
    }
    closedir(d);
    return blocks * 512 / PS;
}
