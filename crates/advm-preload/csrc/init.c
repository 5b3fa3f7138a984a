/* init.c: the configuration (ADVM_* variables) and setting the arena up. */
#include "shim.h"

/* ---- small helpers (no libc string functions: they may be us) ------------------- */

static int str_eq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static const char *env(const char *name) {
    if (!environ) return NULL;
    for (char **e = environ; *e; e++) {
        const char *p = *e, *q = name;
        while (*q && *p == *q) p++, q++;
        if (!*q && *p == '=') return p + 1;
    }
    return NULL;
}

static uint64_t parse_u64(const char *s, uint64_t dflt) {
    if (!s || !*s) return dflt;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (uint64_t)(*s - '0');
    return v;
}

static uint64_t read_number(const char *path, uint64_t dflt) {
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dflt;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return dflt;
    buf[n] = 0;
    return parse_u64(buf, dflt);
}

void init_locked(void) {
    const char *m = env("ADVM_MODE");
    /* "cow" is the deprecated name of "vcopy", kept for one release */
    A.mode = !m || str_eq(m, "vcopy") || str_eq(m, "cow") ? MODE_COW : str_eq(m, "ksm") ? MODE_KSM : MODE_ALLOC;
    if (m && str_eq(m, "off")) return; /* stays disabled: everything goes to glibc */
    /* under a finite RLIMIT_AS or RLIMIT_DATA the reservation and tables would count
     * against the program's own limit (arena.c, "address-space limits") */
    if (limits_finite()) return;
    A.ps = (size_t)sysconf(_SC_PAGESIZE);
    A.pshift = (unsigned)__builtin_ctzl(A.ps);
    uint64_t tp = parse_u64(env("ADVM_THRESHOLD_PAGES"), 2);
    A.threshold = (tp ? tp : 1) << A.pshift;
    A.stats_dir = env("ADVM_STATS_DIR");
    thp_min = parse_u64(env("ADVM_THP_MIN_KIB"), 2048) << 10;
    const char *fresh = env("ADVM_VCOPY_FRESH");
    if (!fresh) fresh = env("ADVM_COW_FRESH"); /* the deprecated name, for one release */
    cow_fresh_memfd = fresh && str_eq(fresh, "memfd");
    populate_max = parse_u64(env("ADVM_POPULATE_KIB"), 256) << 10;
    dirty_floor_pages = (parse_u64(env("ADVM_DIRTY_CACHE_KIB"), 4096) << 10) >> A.pshift;
    dirty_live_pct = parse_u64(env("ADVM_DIRTY_CACHE_PCT"), 100);
    decay_ms = (uint32_t)parse_u64(env("ADVM_DIRTY_DECAY_MS"), 250);
    huge_decay_ms = (uint32_t)parse_u64(env("ADVM_HUGE_DECAY_MS"), 0);
    uint64_t trim_kib = parse_u64(env("ADVM_TRIM_KIB"), 32768);
    trim_every = trim_kib ? ((trim_kib << 10) + A.ps - 1) >> A.pshift : 0; /* 0 only when asked */
    A.pagemap_fd = -1;
    A.pid = getpid();
    for (int g = 0; g < MAX_GENS; g++) A.gen_fd[g] = -1;
    A.gen = 0;
    size_t len = ARENA_PAGES << A.pshift;
    /* A high fixed hint: the kernel's top-down search for mmap(NULL) never reaches it
     * in practice, so the short hole left by mremap is never taken by someone else. */
    void *base = MAP_FAILED;
    for (uintptr_t hint = 0x100000000000ull; hint <= 0x500000000000ull && base == MAP_FAILED;
         hint += 0x100000000000ull)
        base = mmap((void *)hint, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                    -1, 0);
    if (base == MAP_FAILED) base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return;
    A.base = (uintptr_t)base;
    A.vmeta = map_table(sizeof(uint64_t) * ARENA_PAGES);
    A.fref = map_table(sizeof(uint32_t) * ARENA_PAGES);
    A.fview = map_table(sizeof(uint32_t) * ARENA_PAGES);
    A.fdet = map_table(sizeof(uint32_t) * ARENA_PAGES);
    A.segbits = map_table(ARENA_PAGES / 8);
    A.protbits = map_table(ARENA_PAGES / 8);
    A.forkbits = map_table(ARENA_PAGES / 8);
    if (!A.vmeta || !A.fref || !A.fview || !A.fdet || !A.segbits || !A.protbits || !A.forkbits || ext_init(&A.va) ||
        ext_init(&A.fd))
        return;
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) return;
    arena_lo = A.base;
    arena_len = len;
    maps_init(read_number("/proc/sys/vm/max_map_count", 65530)); /* the mapping budget (maps.c) */
    /* copies may use a higher threshold than allocations (ADVM_COPY_MIN_PAGES) */
    uint64_t cp = parse_u64(env("ADVM_COPY_MIN_PAGES"), 16) << A.pshift;
    if (A.mode == MODE_COW) copy_min = cp > A.threshold ? cp : A.threshold;
    __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
}

