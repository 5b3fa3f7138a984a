/* pmem.c: an image's mapping plan in place of a VMM's memory-backend file (FlexMem).
 *
 * advm vm run hands QEMU a plan memfd as the file of a virtio-pmem memory backend
 * (mem-path=/proc/self/fd/N) and names that descriptor in ADVM_PMEM_PLAN_FD. When the
 * program maps that file, this mmap maps the plan's pieces there instead: layer files
 * and the materialised-pages memfd MAP_PRIVATE (the guest's writes stay in this
 * process, its reads share the host's page cache), zeros anonymous. The format is
 * written by crates/advm/src/image/pmem.rs. Every other mmap goes straight to the
 * kernel. Independent of the arena: ADVM_MODE=off leaves malloc to glibc.
 *
 * Fast dump of a running VM (`advm vm dump`): with ADVM_PMEM_DUMP_DIR set, signal
 * ADVM_DUMP_SIGNAL makes the program fork (the pause), with everything but the device
 * and what the copier touches marked MADV_DONTFORK for that instant (so the fork copies
 * and write-protects only the device's page tables); a grandchild, whose memory is
 * the copy-on-write view frozen at that fork, writes the 64 KiB clusters of the device
 * holding pages the guest wrote (present, anonymous, not the zero page) to
 * DIR/dump.raw at their guest offsets, their indices to DIR/dump.clusters, and then
 * DIR/dump.done; advm turns them into a qcow2 overlay. Raw syscalls only: this runs
 * in a signal handler and in a child of a threaded program. */
#include "shim.h"
#include <sched.h>
#include <sys/stat.h>

/* SIGRTMAX - 3 on Linux x86_64; crates/advm/src/image/pmem.rs sends it. */
#define ADVM_DUMP_SIGNAL 61
#define DUMP_CLUSTER (64u << 10)

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

static const char *getvar(const char *name) {
    for (char **e = environ; e && *e; e++) {
        const char *p = *e, *q = name;
        while (*q && *p == *q) p++, q++;
        if (!*q && *p == '=') return p + 1;
    }
    return NULL;
}

static int read_plan_fd(void) {
    const char *p = getvar("ADVM_PMEM_PLAN_FD");
    if (!p) return -1;
    int fd = 0;
    for (; *p >= '0' && *p <= '9'; p++) fd = fd * 10 + (*p - '0');
    return fd;
}

/* ---- fast dump ------------------------------------------------------------------ */

/* the device: where the plan was mapped */
static char *dump_base;
static size_t dump_len;
static char dump_dir[200];
/* ADVM_PMEM_DUMP_WHOLE=1: fork all of the program, as before stop 29 (for comparison) */
static int dump_whole;

/* dir + "/" + name into out (sizeof >= 256) */
static void path_of(char *out, const char *name) {
    size_t n = 0;
    for (const char *p = dump_dir; *p; p++) out[n++] = *p;
    out[n++] = '/';
    for (const char *p = name; *p; p++) out[n++] = *p;
    out[n] = 0;
}

static int open_out(const char *name) {
    char path[256];
    path_of(path, name);
    return (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
}

static void put_u64(int fd, uint64_t v) {
    char b[24];
    int n = 0;
    do b[n++] = (char)('0' + v % 10); while ((v /= 10));
    char o[24];
    for (int i = 0; i < n; i++) o[i] = b[n - 1 - i];
    o[n++] = '\n';
    if (syscall(SYS_write, fd, o, n) < 0) return;
}

static void finish(int status) {
    int fd = open_out("dump.done.tmp");
    if (fd >= 0) {
        put_u64(fd, (uint64_t)status);
        syscall(SYS_close, fd);
    }
    char a[256], b[256];
    path_of(a, "dump.done.tmp");
    path_of(b, "dump.done");
    syscall(SYS_renameat, AT_FDCWD, a, AT_FDCWD, b);
    syscall(SYS_exit_group, status);
}

/* ---- leaving the rest of the program out of the dump's fork --------------------- */

/* The dump's fork needs only the device, this thread's stack and thread block, and the
 * shim's own variables. Everything else with pages in it (guest RAM QEMU did not mark
 * MADV_DONTFORK itself, the TCG translation buffer, heaps, thread arenas, a merged
 * guest's store mappings) would have its page tables copied and write-protected by the
 * fork, every page of it a copy-on-write fault for the VM until the copier exits. So
 * before the fork such mappings are marked MADV_DONTFORK, and right after it (in the
 * parent, whatever the fork did) the mark is lifted again from exactly those: the ones
 * QEMU marked itself (`dc` in /proc/self/smaps) are never touched.
 *
 * Left out: private mappings, anonymous or of a memfd, holding at least LEAVE_MIN_KB
 * (Rss), that hold none of the addresses the copier touches. Kept: files (the
 * program's and libraries' text and data: the copier calls libc), [stack], [vdso] and
 * the like. A mapping made after the scan is forked as before; one unmapped after it
 * and its range reused is marked and unmarked in turn, a no-op unless its owner marked
 * it MADV_DONTFORK in that instant (QEMU does so only when it adds RAM). */
#define LEAVE_MAX 8192
#define LEAVE_MIN_KB 64

static struct {
    uintptr_t lo, hi;
} leave[LEAVE_MAX];
static int n_leave;
static uint64_t leave_kb;
static char smaps_buf[32768];

/* the mapping being read, decided when the next one starts */
static struct {
    uintptr_t lo, hi;
    int candidate, dont_fork;
    uint64_t rss_kb;
} cur;

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static const char *skip_spaces(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p;
}

static int starts(const char *p, const char *end, const char *s) {
    for (; *s; s++, p++)
        if (p >= end || *p != *s) return 0;
    return 1;
}

static int contains(const char *p, const char *end, const char *s) {
    for (; p < end; p++)
        if (starts(p, end, s)) return 1;
    return 0;
}

/* Adds [lo, hi) (holding kb KiB) to leave[], joined to the range before it when they
 * touch, unless it overlaps the device or holds a kept address. */
static void leave_range(uintptr_t lo, uintptr_t hi, uint64_t kb, const uintptr_t *keep, int nkeep) {
    uintptr_t dlo = (uintptr_t)dump_base, dhi = dlo + dump_len;
    if (lo < dhi && hi > dlo) return;
    for (int i = 0; i < nkeep; i++)
        if (keep[i] >= lo && keep[i] < hi) return;
    leave_kb += kb;
    if (n_leave && leave[n_leave - 1].hi == lo)
        leave[n_leave - 1].hi = hi;
    else if (n_leave < LEAVE_MAX)
        leave[n_leave].lo = lo, leave[n_leave].hi = hi, n_leave++;
}

static void decide(const uintptr_t *keep, int nkeep) {
    if (!cur.hi || !cur.candidate || cur.dont_fork || cur.rss_kb < LEAVE_MIN_KB) return;
    leave_range(cur.lo, cur.hi, cur.rss_kb, keep, nkeep);
}

/* A maps line's head, "lo-hi perms offset dev inode   path". */
struct maps_head {
    uintptr_t lo, hi;
    int private_, accessible, no_inode;
    const char *path; /* at the end of the line when there is none */
};

/* 0, or -1 when the line does not start like a mapping's. */
static int parse_head(const char *p, const char *end, struct maps_head *h) {
    h->lo = h->hi = 0;
    for (; p < end && hexval(*p) >= 0; p++) h->lo = h->lo << 4 | (uintptr_t)hexval(*p);
    if (p >= end || *p++ != '-') return -1;
    for (; p < end && hexval(*p) >= 0; p++) h->hi = h->hi << 4 | (uintptr_t)hexval(*p);
    p = skip_spaces(p, end);
    if (end - p < 4) return -1;
    h->private_ = p[3] == 'p';
    h->accessible = p[0] == 'r' || p[1] == 'w';
    p += 4;
    const char *inode = p;
    for (int field = 0; field < 3; field++) { /* offset, dev, inode */
        p = skip_spaces(p, end);
        inode = p;
        while (p < end && *p != ' ') p++;
    }
    h->no_inode = p - inode == 1 && *inode == '0';
    h->path = skip_spaces(p, end);
    return 0;
}

static void smaps_line(const char *p, const char *end, const uintptr_t *keep, int nkeep) {
    if (p < end && hexval(*p) >= 0) {
        decide(keep, nkeep);
        cur.lo = cur.hi = 0;
        cur.candidate = cur.dont_fork = 0;
        cur.rss_kb = 0;
        struct maps_head h;
        if (parse_head(p, end, &h) < 0) return;
        int anonymous = h.path == end || starts(h.path, end, "[heap]") || starts(h.path, end, "[anon");
        int memfd = starts(h.path, end, "/memfd:");
        cur.lo = h.lo;
        cur.hi = h.hi;
        cur.candidate = h.private_ && (anonymous || memfd);
    } else if (starts(p, end, "Rss:")) {
        p = skip_spaces(p + 4, end);
        uint64_t kb = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) kb = kb * 10 + (uint64_t)(*p - '0');
        cur.rss_kb = kb;
    } else if (starts(p, end, "VmFlags:")) {
        for (p += 8; p + 1 < end; p++)
            if (p[0] == 'd' && p[1] == 'c' && p[-1] == ' ' && (p + 2 == end || p[2] == ' ')) cur.dont_fork = 1;
    }
}

/* What a scan's line handler needs: the addresses to keep in the fork, and (maps) the
 * end of the last file mapping seen. */
struct scan_ctx {
    const uintptr_t *keep;
    int nkeep;
    uintptr_t prev_file_hi;
};

/* Calls line(ctx, start, end) for each line of a /proc file, read with raw system calls
 * into smaps_buf (a line longer than the buffer is dropped); 0, or -1 when it cannot be
 * read. */
static int for_each_line(const char *path, void (*line)(struct scan_ctx *, const char *, const char *),
                         struct scan_ctx *ctx) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t have = 0;
    for (;;) {
        long got = syscall(SYS_read, fd, smaps_buf + have, sizeof smaps_buf - have);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            syscall(SYS_close, fd);
            return -1;
        }
        have += (size_t)got;
        size_t start = 0;
        for (size_t i = 0; i < have; i++)
            if (smaps_buf[i] == '\n') {
                line(ctx, smaps_buf + start, smaps_buf + i);
                start = i + 1;
            }
        if (got == 0) {
            if (start < have) line(ctx, smaps_buf + start, smaps_buf + have);
            break;
        }
        if (start == 0 && have == sizeof smaps_buf) start = have;
        for (size_t i = start; i < have; i++) smaps_buf[i - start] = smaps_buf[i];
        have -= start;
    }
    syscall(SYS_close, fd);
    return 0;
}

static void smaps_scan_line(struct scan_ctx *c, const char *p, const char *end) {
    smaps_line(p, end, c->keep, c->nkeep);
}

/* Fills leave[] from /proc/self/smaps; 0, or -1 when it cannot be read (nothing is
 * left out then). */
static int scan_leave(const uintptr_t *keep, int nkeep) {
    n_leave = 0;
    leave_kb = 0;
    cur.hi = 0;
    struct scan_ctx c = {keep, nkeep, 0};
    if (for_each_line("/proc/self/smaps", smaps_scan_line, &c) < 0) {
        n_leave = 0;
        return -1;
    }
    decide(keep, nkeep);
    return 0;
}

/* ---- the program's own MADV_DONTFORK marks, as it makes them ---------------------
 *
 * /proc/self/smaps says which mappings carry MADV_DONTFORK (`dc`), but reading it walks
 * the page tables of the whole program (8-50 ms for QEMU, the guest running on). The
 * program marks through madvise(), which this shim interposes: it records every range
 * the program marks MADV_DONTFORK and unmarks MADV_DOFORK, and forgets a range a new
 * mmap() (through the shim) replaces. The dump then reads /proc/self/maps (no page
 * tables) and never touches a mapping that overlaps a recorded range. A stale record
 * (the range unmapped, or mapped again other than through mmap()) only keeps that
 * mapping in the fork. A mark made without madvise() (a raw syscall) is not seen: the
 * dump would lift it; advm's merge agent marks with raw syscalls, but only store
 * mappings and zeros that replace memory the program marked itself (recorded), and
 * QEMU marks through madvise(). A full table falls back to smaps.
 * Measured (docs/vm.md, stops 30-31): the maps scan takes 0.5-0.7 ms against smaps'
 * 11-18 (unmerged VMs; 6-7 against 52-54 merged, its marks 0.2 ms against 0.03), but
 * the guest waits only for the marks, the fork and the unmarks, and those were the same
 * within the noise (unmerged: medians 5.2-6.0 ms against 6.1-11.2 in two runs; merged:
 * 9.5 against 7.0 in one); so smaps stays the default and ADVM_PMEM_DUMP_MAPS=1 picks
 * the maps scan. */
#define OWN_MAX 512

static struct {
    uintptr_t lo, hi;
} own_dc[OWN_MAX];
static int n_own;
static int own_full;
/* 0 free, else the thread id holding it */
static int own_lock;
static int dump_smaps;

static int my_tid(void) {
    return (int)syscall(SYS_gettid);
}

static void own_take(void) {
    int me = my_tid(), free_ = 0;
    while (!__atomic_compare_exchange_n(&own_lock, &free_, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        free_ = 0;
        syscall(SYS_sched_yield);
    }
}

static void own_give(void) {
    __atomic_store_n(&own_lock, 0, __ATOMIC_RELEASE);
}

/* Cuts [lo, hi) out of the records. */
static void own_cut(uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < n_own; i++) {
        uintptr_t a = own_dc[i].lo, b = own_dc[i].hi;
        if (b <= lo || a >= hi) continue;
        if (a < lo && b > hi) { /* a hole in the middle: two records */
            if (n_own == OWN_MAX) {
                own_full = 1;
                continue;
            }
            own_dc[n_own].lo = hi, own_dc[n_own].hi = b, n_own++;
            own_dc[i].hi = lo;
        } else if (a < lo) {
            own_dc[i].hi = lo;
        } else if (b > hi) {
            own_dc[i].lo = hi;
        } else {
            own_dc[i--] = own_dc[--n_own];
        }
    }
}

static void own_add(uintptr_t lo, uintptr_t hi) {
    own_cut(lo, hi);
    if (n_own == OWN_MAX)
        own_full = 1;
    else
        own_dc[n_own].lo = lo, own_dc[n_own].hi = hi, n_own++;
}

static int own_overlaps(uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < n_own; i++)
        if (own_dc[i].lo < hi && own_dc[i].hi > lo) return 1;
    return 0;
}

/* A new mapping through the shim's mmap carries no MADV_DONTFORK. */
static void own_mapped(void *r, size_t len) {
    if (r == MAP_FAILED || !__atomic_load_n(&n_own, __ATOMIC_RELAXED)) return;
    uintptr_t lo = (uintptr_t)r / 4096 * 4096, hi = ((uintptr_t)r + len + 4095) / 4096 * 4096;
    own_take();
    own_cut(lo, hi);
    own_give();
}

/* Fills leave[] from /proc/self/maps and the records (the caller holds own_lock):
 * private mappings, anonymous or of a memfd, readable or writable, of at least
 * LEAVE_MIN_KB (size: a mapping left out that holds nothing costs nothing) or right
 * after one left out, not
 * overlapping a recorded mark, the device or a kept address, and not an anonymous
 * mapping that starts where a shared library's mapping ends (its .bss: the copier calls
 * libc). The program's own .bss is left out as smaps would leave it (QEMU's: 204 KiB, 80
 * resident, written by its threads: kept, it cost copy-on-write faults during the copy).
 * 0, or -1 when maps cannot be read. */
static void maps_line(const char *p, const char *end, const uintptr_t *keep, int nkeep, uintptr_t *prev_file_hi) {
    struct maps_head h;
    if (parse_head(p, end, &h) < 0) return;
    uintptr_t lo = h.lo, hi = h.hi;
    const char *path = h.path;
    int anonymous = h.no_inode && (path == end || starts(path, end, "[heap]") || starts(path, end, "[anon"));
    int memfd = starts(path, end, "/memfd:");
    uintptr_t after_file = *prev_file_hi;
    *prev_file_hi = !h.no_inode && contains(path, end, ".so") ? hi : 0;
    /* a small one right after one left out joins it (no call more): the pieces a
     * merge leaves of QEMU's heap, between its store mappings */
    int joins = n_leave && leave[n_leave - 1].hi == lo;
    if (!h.private_ || !h.accessible || !(anonymous || memfd) || (hi - lo < LEAVE_MIN_KB * 1024 && !joins)) return;
    if (anonymous && path == end && after_file == lo) return;
    if (own_overlaps(lo, hi)) return;
    leave_range(lo, hi, (hi - lo) >> 10, keep, nkeep);
}

static void maps_scan_line(struct scan_ctx *c, const char *p, const char *end) {
    maps_line(p, end, c->keep, c->nkeep, &c->prev_file_hi);
}

static int scan_leave_maps(const uintptr_t *keep, int nkeep) {
    n_leave = 0;
    leave_kb = 0;
    struct scan_ctx c = {keep, nkeep, 0};
    if (for_each_line("/proc/self/maps", maps_scan_line, &c) < 0) {
        n_leave = 0;
        return -1;
    }
    return 0;
}

static void mark_leave(int advice) {
    for (int i = 0; i < n_leave; i++) syscall(SYS_madvise, leave[i].lo, leave[i].hi - leave[i].lo, advice);
}

static uintptr_t thread_pointer(void) {
#ifdef __x86_64__
    uintptr_t fs = 0;
    if (syscall(SYS_arch_prctl, 0x1003 /* ARCH_GET_FS */, &fs)) return 0;
    return fs;
#else
    return (uintptr_t)__builtin_thread_pointer();
#endif
}

/* PAGEMAP_SCAN (Linux 6.7+, <linux/fs.h>): the kernel's own page categories. */
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
        category_anyof_mask, return_mask;
};
struct page_region {
    uint64_t start, end, categories;
};
#define PAGEMAP_SCAN_IOCTL ((3ul << 30) | ((unsigned long)sizeof(struct pm_scan_arg) << 16) | (0x66ul << 8) | 16)
#define PAGE_IS_FILE (1ull << 2)
#define PAGE_IS_PRESENT (1ull << 3)
#define PAGE_IS_SWAPPED (1ull << 4)
#define PAGE_IS_PFNZERO (1ull << 5)

/* Whether [at, at+n) holds a written page: present or swapped, anonymous, not the zero
 * page; by PAGEMAP_SCAN, which tells the zero page apart for any user. -1: no
 * PAGEMAP_SCAN here. */
static int scan_written(int pm, uintptr_t at, size_t n) {
    struct page_region r[DUMP_CLUSTER / 4096];
    struct pm_scan_arg a = {
        .size = sizeof a,
        .start = at,
        .end = at + n,
        .vec = (uintptr_t)r,
        .vec_len = sizeof r / sizeof r[0],
        .category_anyof_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        .return_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_FILE | PAGE_IS_PFNZERO,
    };
    long got = syscall(SYS_ioctl, pm, PAGEMAP_SCAN_IOCTL, &a);
    if (got < 0) return -1;
    for (long i = 0; i < got; i++)
        if (!(r[i].categories & (PAGE_IS_FILE | PAGE_IS_PFNZERO))) return 1;
    return 0;
}

/* The grandchild: writes the written clusters of its frozen view. */
static void dump_clusters(void) {
    long ps = 4096;
    /* the zero page's frame: read-fault a fresh anonymous page */
    volatile char *z = sys_mmap(NULL, (size_t)ps, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (z == MAP_FAILED) finish(10);
    (void)z[0];
    int pm = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pm < 0) finish(11);
    uint64_t zpfn = 0;
    if (pread(pm, &zpfn, 8, (off_t)((uintptr_t)z / ps * 8)) != 8) finish(12);
    zpfn &= (1ull << 55) - 1;
    int raw = open_out("dump.raw"), list = open_out("dump.clusters");
    if (raw < 0 || list < 0 || syscall(SYS_ftruncate, raw, (long)dump_len)) finish(13);
    uint64_t e[DUMP_CLUSTER / 4096];
    size_t per = DUMP_CLUSTER / (size_t)ps;
    for (size_t c = 0; c * DUMP_CLUSTER < dump_len; c++) {
        size_t off = c * DUMP_CLUSTER, n = dump_len - off < DUMP_CLUSTER ? dump_len - off : DUMP_CLUSTER;
        size_t pages = n / (size_t)ps;
        int written = scan_written(pm, (uintptr_t)dump_base + off, n);
        if (written < 0) {
            if (pread(pm, e, pages * 8, (off_t)(((uintptr_t)dump_base + off) / ps * 8)) != (ssize_t)(pages * 8))
                finish(14);
            written = 0;
            /* Without CAP_SYS_ADMIN every frame reads 0, the zero page's too: a present
             * anonymous page then counts as written (a zero page dumped as zeros costs a
             * cluster; a written page left out would lose data, as it once did). */
            for (size_t i = 0; i < pages && i < per; i++) {
                uint64_t v = e[i], pfn = v & ((1ull << 55) - 1);
                int present = v >> 63 & 1, file = v >> 61 & 1, swapped = v >> 62 & 1;
                if ((present && !file && (zpfn == 0 || pfn != zpfn)) || (swapped && !file)) written = 1;
            }
        }
        if (!written) continue;
        if (pwrite(raw, dump_base + off, n, (off_t)off) != (ssize_t)n) finish(15);
        put_u64(list, c);
    }
    if (syscall(SYS_fsync, raw)) finish(16);
    finish(0);
}

#define COPIER_STACK (256u << 10)

static int copier(void *arg) {
    (void)arg;
    dump_clusters();
    return 0;
}

static uint64_t ns_between(const struct timespec *a, const struct timespec *b) {
    return (uint64_t)((b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec));
}

static void on_dump(int sig) {
    (void)sig;
    int saved = errno;
    struct timespec t0, t1, t2, t3, t4;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* what the copier touches besides the device: this stack, this thread's block
     * (errno, the stack guard), the shim's variables */
    uintptr_t keep[] = {(uintptr_t)&saved, thread_pointer(), (uintptr_t)&errno, (uintptr_t)dump_dir,
                        (uintptr_t)&dump_base, (uintptr_t)&dump_len};
    int nkeep = (int)(sizeof keep / sizeof keep[0]);
    /* The records stay still until the marks are lifted: a madvise(MADV_DONTFORK) of
     * another thread meanwhile waits. Interrupted inside the shim's own bookkeeping
     * (this thread holds the lock), or with a full table: smaps. */
    int me = my_tid(), free_ = 0, held = 0, kind = 0;
    if (!dump_whole && !dump_smaps && __atomic_load_n(&own_lock, __ATOMIC_RELAXED) != me) {
        while (!__atomic_compare_exchange_n(&own_lock, &free_, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            free_ = 0;
            syscall(SYS_sched_yield);
        }
        held = 1;
    }
    int scanned = -1;
    if (dump_whole)
        scanned = -1;
    else if (held && !own_full)
        scanned = scan_leave_maps(keep, nkeep), kind = 1;
    else
        scanned = scan_leave(keep, nkeep);
    if (scanned < 0) n_leave = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    mark_leave(MADV_DONTFORK);
    /* QEMU marks guest memory MADV_DONTFORK: let this fork see the device, then put
     * the mark back */
    syscall(SYS_madvise, dump_base, dump_len, MADV_DOFORK);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    /* a raw fork: no atfork handlers (they take locks); the child forks the writer and
     * leaves at once, so the program never has a child of ours to reap */
    long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) {
        /* The copier shares this child's memory (CLONE_VM, on a stack of its own): no
         * second copy of the page tables, and none to tear down when this child leaves
         * at once, which is what the program waits for. */
        char *stack = sys_mmap(NULL, COPIER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        long g = stack == MAP_FAILED ? -1 : clone(copier, stack + COPIER_STACK, CLONE_VM | SIGCHLD, NULL);
        syscall(SYS_exit_group, g < 0 ? 1 : 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t3);
    /* whether the fork worked or not */
    syscall(SYS_madvise, dump_base, dump_len, MADV_DONTFORK);
    mark_leave(MADV_DOFORK);
    if (held) own_give();
    if (pid > 0) syscall(SYS_wait4, pid, 0, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &t4);
    /* the pause as before (marks, fork, unmarks, the first child's clone and exit);
     * then the parts */
    int fd = open_out("dump.pause_ns");
    if (fd >= 0) {
        put_u64(fd, ns_between(&t1, &t4));
        syscall(SYS_close, fd);
    }
    fd = open_out("dump.timing");
    if (fd >= 0) {
        put_u64(fd, ns_between(&t0, &t1)); /* scan of smaps */
        put_u64(fd, ns_between(&t1, &t2)); /* marks */
        put_u64(fd, ns_between(&t2, &t3)); /* fork */
        put_u64(fd, ns_between(&t3, &t4)); /* unmarks, the first child's clone and exit */
        put_u64(fd, scanned < 0 ? 0 : (uint64_t)n_leave);
        put_u64(fd, scanned < 0 ? 0 : leave_kb);
        put_u64(fd, (uint64_t)kind); /* 1: maps and the records (sizes), 0: smaps (Rss) */
        syscall(SYS_close, fd);
    }
    errno = saved;
}

static void arm_dump(char *base, size_t len) {
    dump_base = base;
    dump_len = len;
    const char *d = getvar("ADVM_PMEM_DUMP_DIR");
    if (!d) return;
    const char *w = getvar("ADVM_PMEM_DUMP_WHOLE");
    dump_whole = w && w[0] == '1';
    const char *sm = getvar("ADVM_PMEM_DUMP_MAPS");
    dump_smaps = !(sm && sm[0] == '1');
    size_t n = 0;
    while (d[n] && n + 1 < sizeof dump_dir) dump_dir[n] = d[n], n++;
    dump_dir[n] = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_dump;
    sa.sa_flags = SA_RESTART;
    sigaction(ADVM_DUMP_SIGNAL, &sa, NULL);
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
    /* The image's zeros: private mappings of /dev/zero, anonymous memory to the kernel
     * (zero page, copies the guest writes are anonymous pages, as the dump expects) but
     * a file in /proc/PID/maps. Plain anonymous mappings of a few MiB would be taken by
     * `--merge`'s agent (it merges private anonymous mappings), and a page the guest
     * wrote there, once a store page, reads as a file page: the dump lost it. Plain
     * anonymous memory where /dev/zero cannot be opened. */
    int zero = (int)syscall(SYS_openat, AT_FDCWD, "/dev/zero", O_RDONLY | O_CLOEXEC);
    int keep = MAP_PRIVATE | MAP_FIXED | (flags & MAP_NORESERVE);
    uint64_t e[4 * 64];
    for (uint64_t i = 0; i < h[3]; i += 64) {
        uint64_t k = h[3] - i < 64 ? h[3] - i : 64;
        if (pread_all(plan_fd, e, k * 32, (off_t)(32 + i * 32))) goto fail;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t *p = &e[4 * j];
            if (p[0] + p[1] > len) goto fail;
            void *r = p[2] != UINT64_MAX ? sys_mmap(base + p[0], p[1], prot, keep, (int)p[2], (off_t)p[3])
                      : zero >= 0        ? sys_mmap(base + p[0], p[1], prot, keep, zero, 0)
                                         : sys_mmap(base + p[0], p[1], prot, keep | MAP_ANONYMOUS, -1, 0);
            if (r == MAP_FAILED) goto fail;
            /* A guest reads its disk a page here and a page there (DAX): the kernel's
             * read-around of 32 pages per page-cache miss would read most of the
             * image into the host's page cache. Pages already cached are still
             * mapped around a fault. */
            if (p[2] != UINT64_MAX) syscall(SYS_madvise, r, p[1], MADV_RANDOM);
        }
    }
    if (zero >= 0) syscall(SYS_close, zero);
    arm_dump(base, len);
    return base;
fail:
    say("advm pmem: mapping a piece of the image plan failed\n");
    int saved = errno ? errno : EINVAL;
    if (zero >= 0) syscall(SYS_close, zero);
    sys_mmap(base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (!fixed) syscall(SYS_munmap, base, len);
    errno = saved;
    return MAP_FAILED;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *r = fd >= 0 && !(flags & MAP_ANONYMOUS) && is_plan(fd) ? map_plan(addr, len, prot, flags, off)
                                                                  : sys_mmap(addr, len, prot, flags, fd, off);
    /* a new mapping, or one split in three (maps.c: the program's estimate) */
    if (r != MAP_FAILED && !lock_mine) maps_added(flags & MAP_FIXED ? 2 : 1);
    own_mapped(r, len);
    return r;
}

/* Whether advice changes the flags of the mappings in its range, which may split one in
 * three (maps.c: the program's estimate). */
static int splits(int advice) {
    switch (advice) {
    case MADV_DONTNEED: case MADV_FREE: case MADV_WILLNEED: case MADV_REMOVE: case MADV_COLD: case MADV_PAGEOUT:
    case 22 /* MADV_POPULATE_READ */: case 23 /* MADV_POPULATE_WRITE */: case 24 /* MADV_DONTNEED_LOCKED */:
        return 0;
    default:
        return 1;
    }
}

/* The arena's blocks first (interpose.c, advise_arena). QEMU asks for transparent huge
 * pages on all guest memory. On the plan's file
 * mappings that makes every page-cache miss read 2 MiB around the fault (the huge-page
 * readahead), so a guest touching a few blocks here and there pulls the whole image
 * into the host's page cache: the advice is dropped for the device. */
EXPORT int madvise(void *addr, size_t len, int advice) {
    if (advise_arena(addr, len, advice) != 0) return -1;
    if (!lock_mine && splits(advice)) maps_added(2);
    char *a = addr, *b = a + len, *lo = dump_base, *hi = dump_base + dump_len;
    if (advice == MADV_HUGEPAGE && dump_len && a < hi && b > lo) {
        int r = 0;
        if (a < lo) r = (int)syscall(SYS_madvise, a, (size_t)(lo - a), advice);
        if (r == 0 && b > hi) r = (int)syscall(SYS_madvise, hi, (size_t)(b - hi), advice);
        return r;
    }
    if (advice != MADV_DONTFORK && advice != MADV_DOFORK) return (int)syscall(SYS_madvise, addr, len, advice);
    /* the mark and its record together: a dump in between would see neither or both */
    own_take();
    int r = (int)syscall(SYS_madvise, addr, len, advice);
    /* ENOMEM (a hole in the range) still marks what is mapped */
    if (r == 0 || errno == ENOMEM) {
        uintptr_t lo = (uintptr_t)addr, hi = ((uintptr_t)addr + len + 4095) / 4096 * 4096;
        if (advice == MADV_DONTFORK)
            own_add(lo, hi);
        else
            own_cut(lo, hi);
    }
    own_give();
    return r;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}
