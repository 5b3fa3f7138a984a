/* maps.c: the mapping budget. The kernel refuses a new mapping (mmap, mprotect's split,
 * ...) once the process holds vm.max_map_count of them, whoever made them. The arena
 * uses more mappings than glibc (every copy's side is its own mapping), and it used to
 * count only its own against half the limit: a program that held all but 300 of the
 * limit itself and then allocated and copied 1,280 blocks of 256 KiB saw 980 of its
 * mallocs return NULL (the arena's copies took the last mappings, and glibc's mmap then
 * failed), none under glibc.
 *
 * So the arena takes a new mapping only while its own (segs, an upper bound) plus the
 * program's stay a reserve (an eighth of the limit) below the limit, and its own stay
 * under half of it. Counting the program's (/proc/self/maps, 0.35 us a line: 23 ms at
 * 65,000 mappings) on every call would cost too much, so the program's are an estimate:
 * the count at the last reading plus an upper bound on what the program's calls that the
 * shim sees (mmap, mprotect, madvise, and those made through syscall()) may have added
 * since. The maps are read again when the estimate says no and when the arena's own
 * count has grown by half the headroom the last reading left (mappings made where the
 * shim does not see: glibc's own mmaps, threads' stacks), both at most once per interval
 * (a hundred times the last reading's time and at least 100 ms, so readings cost at most
 * 1%), and after a mapping of the shim's failed. Refusing is always safe: the allocation
 * is glibc's, the copy a plain one. What the arena already holds it keeps: mappings the
 * program makes unseen after that can still leave glibc without (docs/run.md). */
#include "shim.h"

static uint64_t map_max;      /* vm.max_map_count */
static uint64_t others;       /* the program's mappings at the last reading */
static uint64_t next_reading; /* A.segs at which the next reading is due */
static uint64_t read_ns, read_cost_ns; /* when the last reading was, and what it took */
/* upper bound on the mappings the program's calls added since the last reading (updated
 * without the lock) */
static uint64_t added;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Read with the lock held, so one buffer serves (no allocation, little stack). */
static char maps_buf[1 << 16];

/* Reads /proc/self/maps: every mapping, and those that start in the arena. 0 on success. */
static int read_maps(uint64_t *total, uint64_t *arena) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    uint64_t n = 0, in = 0, addr = 0;
    int at_start = 1, in_addr = 0;
    uintptr_t lo = A.base, hi = A.base + (ARENA_PAGES << A.pshift);
    ssize_t r;
    while ((r = read(fd, maps_buf, sizeof maps_buf)) > 0) {
        for (ssize_t i = 0; i < r; i++) {
            char c = maps_buf[i];
            if (at_start) addr = 0, in_addr = 1, at_start = 0;
            if (in_addr) {
                int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
                if (d >= 0) addr = addr << 4 | (uint64_t)d;
                else {
                    in_addr = 0;
                    in += addr >= lo && addr < hi;
                }
            }
            if (c == '\n') n++, at_start = 1;
        }
    }
    close(fd);
    if (r < 0) return -1;
    *total = n;
    *arena = in;
    return 0;
}

/* The most mappings the arena may hold now (segs included). */
static uint64_t allowance(void) {
    uint64_t theirs = others + __atomic_load_n(&added, __ATOMIC_RELAXED), reserve = map_max / 8;
    uint64_t room = theirs + reserve < map_max ? map_max - reserve - theirs : 0;
    return room < A.seg_budget ? room : A.seg_budget;
}

/* Reads the maps and sets the estimate and the next reading. Lock held. */
static void reading(void) {
    int saved = errno;
    uint64_t t0 = now_ns(), total, arena;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (read_maps(&total, &arena) == 0) {
        /* the arena's segs may undercount its mappings (the program's mprotect split
         * them): whatever the reading shows beyond segs is the program's */
        uint64_t ours = arena < A.segs ? arena : A.segs;
        others = total - ours;
        __atomic_store_n(&added, 0, __ATOMIC_RELAXED);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    read_cost_ns = (uint64_t)((b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec));
    read_ns = t0;
    uint64_t room = allowance(), step = room > A.segs ? (room - A.segs) / 2 : 0;
    next_reading = A.segs + (step > 64 ? step : 64);
    st_add(S_MAPS_READ, 1);
    st_add(S_MAPS_READ_US, read_cost_ns / 1000);
    errno = saved;
}

void maps_init(uint64_t max) {
    map_max = max ? max : 65530;
    A.seg_budget = map_max / 2; /* the arena's own never more than half, as before */
    reading();
}

/* The program may have added up to n mappings (a call the shim passed on). */
void maps_added(uint64_t n) { __atomic_fetch_add(&added, n, __ATOMIC_RELAXED); }

/* A mapping call of the shim failed: the next check reads the maps. Lock held. */
void maps_failed(void) { next_reading = 0; }

/* Whether the arena may make a few more mappings (each caller makes at most a handful
 * before it asks again). A reading, when the estimate says no or the arena has grown
 * since, only after the interval (an arena going up and down across next_reading would
 * read at every crossing), or at once after a failure. Lock held. */
int budget_ok(void) {
    if (A.segs + 8 < allowance() && A.segs < next_reading) return 1;
    uint64_t wait = read_cost_ns * 100 > 100000000u ? read_cost_ns * 100 : 100000000u;
    if (next_reading == 0 || now_ns() - read_ns >= wait) reading();
    return A.segs + 8 < allowance();
}
