/* pmem.c: an image's mapping plan in place of a VMM's memory-backend file (FlexMem).
 *
 * advm vm run hands QEMU a plan memfd as the file of a virtio-pmem memory backend
 * (mem-path=/proc/self/fd/N) and names that descriptor in ADVM_PMEM_PLAN_FD. When the
 * program maps that file, this mmap maps the plan's pieces there instead: layer files
 * and the materialised-pages memfd MAP_PRIVATE (the guest's writes stay in this
 * process, its reads share the host's page cache), zeros anonymous. The format is
 * written by crates/advm/src/image/pmem.rs. Every other mmap goes straight to the
 * kernel. Independent of the arena: ADVM_MODE=off leaves malloc to glibc. */
#include "shim.h"
#include <sys/stat.h>

#define EXPORT __attribute__((visibility("default")))

static void *sys_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
}

static void say(const char *m) {
    size_t n = 0;
    while (m[n]) n++;
    if (write(2, m, n) < 0) return;
}

/* -2 not read yet, -1 none */
static int plan_fd = -2;

static int read_plan_fd(void) {
    int fd = -1;
    for (char **e = environ; e && *e; e++) {
        const char *p = *e, *q = "ADVM_PMEM_PLAN_FD=";
        while (*q && *p == *q) p++, q++;
        if (*q) continue;
        fd = 0;
        for (; *p >= '0' && *p <= '9'; p++) fd = fd * 10 + (*p - '0');
    }
    return fd;
}

static int is_plan(int fd) {
    if (plan_fd == -2) plan_fd = read_plan_fd();
    if (plan_fd < 0 || fd < 0) return 0;
    struct stat a, b;
    if (fstat(fd, &a) || fstat(plan_fd, &b)) return 0;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int pread_all(int fd, void *buf, size_t n, off_t off) {
    return pread(fd, buf, n, off) == (ssize_t)n ? 0 : -1;
}

/* Maps the plan at addr (MAP_FIXED) or at a place of its own. */
static void *map_plan(void *addr, size_t len, int prot, int flags, off_t off) {
    uint64_t h[4];
    if (off != 0 || pread_all(plan_fd, h, sizeof h, 0) || h[1] != 1 || len != h[2]) {
        say("advm pmem: the plan does not match the mapping asked for (offset, size or format)\n");
        errno = EINVAL;
        return MAP_FAILED;
    }
    const char *magic = "ADVMPMEM";
    const unsigned char *m = (const unsigned char *)&h[0];
    for (int i = 0; i < 8; i++)
        if (m[i] != (unsigned char)magic[i]) {
            say("advm pmem: the plan's magic is wrong\n");
            errno = EINVAL;
            return MAP_FAILED;
        }
    int fixed = flags & MAP_FIXED;
    char *base = fixed ? addr : sys_mmap(addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return MAP_FAILED;
    int keep = MAP_PRIVATE | MAP_FIXED | (flags & MAP_NORESERVE);
    uint64_t e[4 * 64];
    for (uint64_t i = 0; i < h[3]; i += 64) {
        uint64_t k = h[3] - i < 64 ? h[3] - i : 64;
        if (pread_all(plan_fd, e, k * 32, (off_t)(32 + i * 32))) goto fail;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t *p = &e[4 * j];
            if (p[0] + p[1] > len) goto fail;
            void *r = p[2] == UINT64_MAX ? sys_mmap(base + p[0], p[1], prot, keep | MAP_ANONYMOUS, -1, 0)
                                         : sys_mmap(base + p[0], p[1], prot, keep, (int)p[2], (off_t)p[3]);
            if (r == MAP_FAILED) goto fail;
        }
    }
    return base;
fail:
    say("advm pmem: mapping a piece of the image plan failed\n");
    int saved = errno ? errno : EINVAL;
    sys_mmap(base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (!fixed) syscall(SYS_munmap, base, len);
    errno = saved;
    return MAP_FAILED;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (fd >= 0 && !(flags & MAP_ANONYMOUS) && is_plan(fd)) return map_plan(addr, len, prot, flags, off);
    return sys_mmap(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}
