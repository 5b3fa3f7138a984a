/* interpose.c: the exported entry points (malloc family, memcpy/memmove and their _chk
 * variants), glibc's versions found with dlsym, the lock and initialisation on first use. */
#include "shim.h"
#include <linux/sched.h> /* CLONE_VM, struct clone_args */
#include <stdarg.h>

#define EXPORT __attribute__((visibility("default")))

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* set while this thread holds the lock or is taking it (see shim.h) */
__thread volatile int lock_mine __attribute__((tls_model("initial-exec")));

void lock_take(void) {
    lock_mine = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_lock(&lock);
    if (UNLIKELY(A.retire)) new_generation(); /* the program closed the current memfd (arena.c) */
}
void lock_drop(void) {
    pthread_mutex_unlock(&lock);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    lock_mine = 0;
}

int state; /* 0 none, 1 initialising, 2 ready, 3 disabled */
uintptr_t arena_lo, arena_len; /* 0 until ready: in_arena() is false */
size_t copy_min = SIZE_MAX;    /* copies at least this big are looked at */
uint64_t populate_max; /* malloc pre-faults blocks up to this many bytes */

/* ---- the plain path: glibc's functions ------------------------------------------ */

typedef void *(*chk_fn)(void *, const void *, size_t, size_t);
static void *boot_memcpy(void *d, const void *s, size_t n);
static void *boot_memmove(void *d, const void *s, size_t n);
copy_fn real_memcpy = boot_memcpy;
static copy_fn real_memmove = boot_memmove;
static chk_fn real_memcpy_chk, real_memmove_chk;
static int (*real_posix_memalign)(void **, size_t, size_t);
static size_t (*real_usable)(void *);
static int (*real_mprotect)(void *, size_t, int);
static long (*real_syscall)(long, ...);

/* Byte loops for calls made before glibc's versions are known (volatile so that the
 * compiler cannot turn them back into calls to memcpy, which is us). */
static void *byte_move(void *d, const void *s, size_t n) {
    volatile unsigned char *dd = d;
    const volatile unsigned char *ss = s;
    if (dd < ss)
        for (size_t i = 0; i < n; i++) dd[i] = ss[i];
    else
        for (size_t i = n; i > 0; i--) dd[i - 1] = ss[i - 1];
    return d;
}

static int resolving;
static void resolve(void) {
    if (real_memcpy != boot_memcpy || environ == NULL || __atomic_exchange_n(&resolving, 1, __ATOMIC_ACQ_REL))
        return;
    void *m = dlsym(RTLD_NEXT, "memcpy"), *mv = dlsym(RTLD_NEXT, "memmove");
    real_memcpy_chk = (chk_fn)dlsym(RTLD_NEXT, "__memcpy_chk");
    real_memmove_chk = (chk_fn)dlsym(RTLD_NEXT, "__memmove_chk");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    real_mprotect = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "mprotect");
    real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    if (mv) real_memmove = (copy_fn)mv;
    if (m) real_memcpy = (copy_fn)m;
}

static void *boot_memcpy(void *d, const void *s, size_t n) {
    resolve();
    if (real_memcpy != boot_memcpy) return real_memcpy(d, s, n);
    return byte_move(d, s, n);
}
static void *boot_memmove(void *d, const void *s, size_t n) {
    resolve();
    if (real_memmove != boot_memmove) return real_memmove(d, s, n);
    return byte_move(d, s, n);
}

/* Returns 1 when the arena is ready. Calls made while another thread (or this one,
 * from inside dlsym) initialises are served by glibc. */
static int ready(void) {
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 2) return 1;
    if (s != 0 || environ == NULL) return 0; /* environ is NULL before libc's own init */
    int zero = 0;
    if (!__atomic_compare_exchange_n(&state, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return 0;
    int saved = errno;
    resolve();
    lock_take();
    init_locked();
    if (state != 2) __atomic_store_n(&state, 3, __ATOMIC_RELEASE);
    lock_drop();
    errno = saved;
    return state == 2;
}

__attribute__((constructor)) static void advm_preload_init(void) { ready(); }

/* ---- the hooks ------------------------------------------------------------------- */

static void *arena_alloc_dirty(size_t n, int *dirty) {
    int saved = errno;
    lock_take();
    void *p = block_alloc(n, dirty);
    lock_drop();
    errno = saved;
    if (!p) st_add(S_ALLOC_FALLBACK, 1);
    return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* For malloc (not calloc: its pages may stay untouched and cost nothing) a small block
 * is about to be written whole; one MADV_POPULATE_WRITE is much cheaper than a page
 * fault per page. */
static void *arena_alloc(size_t n) {
    int dirty;
    void *p = arena_alloc_dirty(n, &dirty);
    if (p && !dirty && n <= populate_max) {
        int saved = errno;
        madvise(p, n, MADV_POPULATE_WRITE);
        errno = saved;
    }
    return p;
}

EXPORT void *malloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_malloc(n);
}

EXPORT void *calloc(size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (n >= A.threshold && A.threshold && ready()) {
        int dirty;
        void *p = arena_alloc_dirty(n, &dirty); /* fresh or returned pages are zero */
        if (p && dirty) memset(p, 0, n);
        if (p) return p;
    }
    return __libc_calloc(nmemb, size);
}

/* Whether p, a pointer in the arena's range, is glibc's: only once the arena retired
 * (its unmapped holes may hold anybody's mappings then). Lock held. */
static int glibcs(void *p) { return A.retired && block_of(p) < 0; }

EXPORT void free(void *p) {
    if (UNLIKELY(in_arena(p))) {
        int saved = errno;
        lock_take();
        int theirs = glibcs(p);
        if (!theirs) block_free(p);
        lock_drop();
        errno = saved;
        if (!theirs) return;
    }
    __libc_free(p);
}

/* Returns freed memory: the free table's kept pages as well as glibc's. A freed block
 * that adopted memfd pages (its copy's last view) is kept with them like any freed block,
 * and this is how a program (or a test measuring the memfd) lets them go at once. */
EXPORT int malloc_trim(size_t pad) {
    static int (*real_trim)(size_t);
    if (!real_trim) real_trim = (int (*)(size_t))dlsym(RTLD_NEXT, "malloc_trim");
    int released = 0;
    if (state == 2 && !lock_mine) {
        int saved = errno;
        lock_take();
        released = fb_n > 0;
        cache_flush();
        trim_views();
        lock_drop();
        errno = saved;
    }
    return (real_trim ? real_trim(pad) : 0) | released;
}

EXPORT void *realloc(void *p, size_t n) {
    if (!in_arena(p)) {
        if (p == NULL) return malloc(n);
        return __libc_realloc(p, n);
    }
    if (n == 0) {
        free(p);
        return NULL;
    }
    int saved = errno;
    lock_take();
    int64_t v = block_of(p);
    if (v < 0 && A.retired) {
        lock_drop();
        return __libc_realloc(p, n);
    }
    if (v < 0) bad_pointer("realloc");
    size_t old = head_pages((uint64_t)v) << A.pshift;
    void *q = A.threshold && n >= A.threshold ? block_realloc(p, n) : NULL;
    lock_drop();
    errno = saved;
    if (q) return q;
    /* below the threshold, or the arena could not grow it (or retired): allocate and copy */
    q = A.threshold && n >= A.threshold ? arena_alloc(n) : NULL;
    if (!q) q = __libc_malloc(n);
    if (!q) return NULL;
    real_memcpy(q, p, old < n ? old : n);
    free(p);
    return q;
}

EXPORT void *reallocarray(void *p, size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n);
}

static int pow2(size_t a) { return a && !(a & (a - 1)); }

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    if (pow2(align) && align % sizeof(void *) == 0 && n >= A.threshold && A.threshold && ready() && align <= A.ps) {
        void *p = arena_alloc(n);
        if (p) {
            *out = p;
            return 0;
        }
    }
    resolve();
    if (real_posix_memalign) return real_posix_memalign(out, align, n);
    if (!pow2(align) || align % sizeof(void *)) return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *memalign(size_t align, size_t n) {
    if (align <= 4096 && n >= A.threshold && A.threshold && ready() && align <= A.ps) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_memalign(align, n);
}

/* An alignment that is not a power of two (0 included) gets glibc's own answer: 2.38 and
 * later refuse it (EINVAL), older ones round it up like memalign; the shim used to refuse
 * it everywhere, so a program that worked under glibc 2.36 got NULL. */
EXPORT void *aligned_alloc(size_t align, size_t n) {
    static void *(*real_aligned)(size_t, size_t);
    if (!pow2(align)) {
        if (!real_aligned) real_aligned = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
        if (real_aligned) return real_aligned(align, n);
        errno = EINVAL;
        return NULL;
    }
    return memalign(align, n);
}

EXPORT void *valloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_valloc(n);
}

EXPORT void *pvalloc(size_t n) {
    if (n >= A.threshold && A.threshold && ready()) {
        void *p = arena_alloc(n);
        if (p) return p;
    }
    return __libc_pvalloc(n);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (in_arena(p)) {
        lock_take();
        int64_t v = block_of(p);
        int theirs = v < 0 && A.retired;
        size_t n = v < 0 ? 0 : head_pages((uint64_t)v) << A.pshift;
        lock_drop();
        if (!theirs) return n;
    }
    resolve();
    return real_usable ? real_usable(p) : 0;
}

EXPORT void *memcpy(void *restrict d, const void *restrict s, size_t n) {
    if (UNLIKELY(n >= copy_min) && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memcpy);
    return real_memcpy(d, s, n);
}

EXPORT void *memmove(void *d, const void *s, size_t n) {
    if (UNLIKELY(n >= copy_min) && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memmove);
    return real_memmove(d, s, n);
}

EXPORT void *__memcpy_chk(void *d, const void *s, size_t n, size_t dlen) {
    if (UNLIKELY(n >= copy_min) && n <= dlen && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memcpy);
    if (!real_memcpy_chk) resolve();
    if (real_memcpy_chk) return real_memcpy_chk(d, s, n, dlen);
    if (n > dlen) abort();
    return real_memcpy(d, s, n);
}

EXPORT void *__memmove_chk(void *d, const void *s, size_t n, size_t dlen) {
    if (UNLIKELY(n >= copy_min) && n <= dlen && in_arena(d) && in_arena(s)) return big_copy(d, s, n, real_memmove);
    if (!real_memmove_chk) resolve();
    if (real_memmove_chk) return real_memmove_chk(d, s, n, dlen);
    if (n > dlen) abort();
    return real_memmove(d, s, n);
}

/* ---- calls that change what the arena may do with a page -------------------------- */

/* mprotect over arena pages: shared runs become private first, and pages left other
 * than read-write are marked (protbits) so that the shim never maps over them (a copy
 * into or out of them is a plain one and faults as under glibc; a freed one is not
 * kept). A virtual copy used to remap a read-only source or destination read-write:
 * writes that fault under glibc went through. */
EXPORT int mprotect(void *addr, size_t len, int prot) {
    if (!real_mprotect) real_mprotect = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "mprotect");
    uintptr_t a = (uintptr_t)addr, lo = arena_lo, hi = arena_lo + arena_len;
    if (!lock_mine) maps_added(2); /* may split a mapping in three (maps.c) */
    if (state != 2 || lock_mine || !len || (a & (A.ps - 1)) || a >= hi || len > hi - a || a + len <= lo)
        return real_mprotect(addr, len, prot);
    uintptr_t from = a > lo ? a : lo, to = a + len < hi ? a + len : hi;
    uint64_t v = page_of((void *)from), n = (to - from + A.ps - 1) >> A.pshift;
    int saved = errno;
    lock_take();
    int rw = prot == (PROT_READ | PROT_WRITE);
    if (!rw) make_private(v, n);
    errno = saved;
    int rc = real_mprotect(addr, len, prot);
    saved = errno;
    if (rc == 0) prot_set(v, n, !rw);
    lock_drop();
    errno = saved;
    return rc;
}

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

/* madvise over arena pages (called by the exported madvise in pmem.c, before the advice):
 * MADV_DONTNEED (and MADV_DONTNEED_LOCKED) and MADV_FREE turn the memfd views in the
 * range into anonymous memory first (arena.c, drop_views), so that the advice acts as
 * on glibc's memory: a copy's
 * page read back its source's bytes after MADV_DONTNEED instead of zeros, and MADV_FREE
 * failed with EINVAL. MADV_WIPEONFORK and MADV_DONTFORK turn them into anonymous memory
 * with the same bytes and mark the range, which the shim never maps over again (arena.c,
 * fork_mark): WIPEONFORK failed with EINVAL on a view, and a mark the kernel took was
 * lost when a copy remapped the pages. MADV_REMOVE is refused (EINVAL), as on glibc's private anonymous
 * memory: on a block that adopted its memfd pages it would punch them. Returns 0 to go
 * on with the advice, -1 (errno set) to refuse it. The shim's own calls (lock held) pass. */
int advise_arena(void *addr, size_t len, int advice) {
    uintptr_t a = (uintptr_t)addr, lo = arena_lo, hi = arena_lo + arena_len;
    int fork_advice = advice == MADV_WIPEONFORK || advice == MADV_DONTFORK;
    if ((advice != MADV_DONTNEED && advice != MADV_DONTNEED_LOCKED && advice != MADV_FREE && advice != MADV_REMOVE &&
         !fork_advice) ||
        state != 2 || lock_mine ||
        A.retired || !len || (a & (A.ps - 1)) || a >= hi || len > hi - a || a + len <= lo)
        return 0;
    if (advice == MADV_REMOVE) {
        errno = EINVAL;
        return -1;
    }
    if (A.mode != MODE_COW && !fork_advice) return 0;
    uintptr_t from = a > lo ? a : lo, to = a + len < hi ? a + len : hi;
    uint64_t v = page_of((void *)from), n = (to - from + A.ps - 1) >> A.pshift;
    int saved = errno;
    lock_take();
    if (fork_advice) fork_mark(v, n, A.mode == MODE_COW);
    else drop_views(v, n);
    lock_drop();
    errno = saved;
    return 0;
}

/* Whether system call nr (arguments a1, a2) makes a process that does not share this
 * one's memory: fork, or clone/clone3 without CLONE_VM. */
static int new_process(long nr, long a1, long a2) {
    if (nr == SYS_fork) return 1;
    if (nr == SYS_clone) return !((unsigned long)a1 & CLONE_VM);
    if (nr == SYS_clone3 && a1 && (unsigned long)a2 >= sizeof(uint64_t))
        return !(((const struct clone_args *)a1)->flags & CLONE_VM);
    return 0;
}

/* Whether system call nr may make or split a mapping (maps.c: the program's estimate). */
static int maps_call(long nr) {
    return nr == SYS_mmap || nr == SYS_mprotect || nr == SYS_pkey_mprotect || nr == SYS_madvise ||
           nr == SYS_mremap || nr == SYS_munmap || nr == SYS_mlock || nr == SYS_mlock2 || nr == SYS_munlock ||
           nr == SYS_remap_file_pages;
}

/* syscall(2) itself: a child made by the raw fork or clone system call runs no
 * pthread_atfork handler, so it used to keep the shim's shared memfd mappings (its
 * writes showed in the parent's blocks and the parent's in its), its copies read the
 * parent's pagemap and lost its own writes, and both went on writing and punching one
 * memfd generation. The fork handlers run around such a call, as around glibc's fork().
 * A call that may make or split a mapping is counted for the mapping budget (maps.c).
 * Every call is passed on unchanged (six arguments, as glibc's syscall reads). */
EXPORT long syscall(long nr, ...) {
    va_list ap;
    va_start(ap, nr);
    long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
    long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
    va_end(ap);
    if (!real_syscall) real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    int forks = state == 2 && !lock_mine && new_process(nr, a1, a2);
    if (!lock_mine && maps_call(nr)) maps_added(2);
    if (forks) fork_prepare();
    long r = real_syscall(nr, a1, a2, a3, a4, a5, a6);
    if (forks) {
        int saved = errno;
        if (r == 0) fork_child();
        else fork_parent();
        errno = saved;
    }
    return r;
}

/* glibc's clone() without CLONE_VM makes a process too, and runs no atfork handler: the
 * handlers run around it as around syscall(SYS_clone); the child runs fork_child on its
 * new stack before the program's function (the trampoline's arguments are on the
 * parent's stack, which the child has a copy of). */
struct clone_call {
    int (*fn)(void *);
    void *arg;
};

static int clone_child(void *p) {
    struct clone_call *c = p;
    fork_child();
    return c->fn(c->arg);
}

EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...) {
    static int (*real)(int (*)(void *), void *, int, void *, ...);
    if (!real) real = (int (*)(int (*)(void *), void *, int, void *, ...))dlsym(RTLD_NEXT, "clone");
    va_list ap;
    va_start(ap, arg);
    pid_t *ptid = va_arg(ap, pid_t *);
    void *tls = va_arg(ap, void *);
    pid_t *ctid = va_arg(ap, pid_t *);
    va_end(ap);
    if (state != 2 || lock_mine || (flags & CLONE_VM)) return real(fn, stack, flags, arg, ptid, tls, ctid);
    struct clone_call call = {fn, arg};
    fork_prepare();
    int r = real(clone_child, stack, flags, &call, ptid, tls, ctid);
    int saved = errno;
    fork_parent();
    errno = saved;
    return r;
}

/* A finite RLIMIT_AS or RLIMIT_DATA set by the program for itself retires the arena
 * (arena.c, "address-space limits"), after the call succeeded. */
static void limit_set(int resource, rlim_t soft) {
    if ((resource != RLIMIT_AS && resource != RLIMIT_DATA) || soft == RLIM_INFINITY || state != 2 || lock_mine) return;
    int saved = errno;
    lock_take();
    retire_arena();
    lock_drop();
    errno = saved;
}

EXPORT int setrlimit(__rlimit_resource_t resource, const struct rlimit *rl) {
    static int (*real)(__rlimit_resource_t, const struct rlimit *);
    if (!real) real = (int (*)(__rlimit_resource_t, const struct rlimit *))dlsym(RTLD_NEXT, "setrlimit");
    int rc = real(resource, rl);
    if (rc == 0) limit_set((int)resource, rl->rlim_cur);
    return rc;
}

EXPORT int setrlimit64(__rlimit_resource_t resource, const struct rlimit64 *rl) {
    static int (*real)(__rlimit_resource_t, const struct rlimit64 *);
    if (!real) real = (int (*)(__rlimit_resource_t, const struct rlimit64 *))dlsym(RTLD_NEXT, "setrlimit64");
    int rc = real(resource, rl);
    if (rc == 0) limit_set((int)resource, (rlim_t)rl->rlim_cur);
    return rc;
}

EXPORT int prlimit(pid_t pid, __rlimit_resource_t resource, const struct rlimit *rl, struct rlimit *old) {
    static int (*real)(pid_t, __rlimit_resource_t, const struct rlimit *, struct rlimit *);
    if (!real) real = (int (*)(pid_t, __rlimit_resource_t, const struct rlimit *, struct rlimit *))dlsym(RTLD_NEXT, "prlimit");
    int rc = real(pid, resource, rl, old);
    if (rc == 0 && rl && (pid == 0 || pid == getpid())) limit_set((int)resource, rl->rlim_cur);
    return rc;
}

EXPORT int prlimit64(pid_t pid, __rlimit_resource_t resource, const struct rlimit64 *rl, struct rlimit64 *old) {
    static int (*real)(pid_t, __rlimit_resource_t, const struct rlimit64 *, struct rlimit64 *);
    if (!real)
        real = (int (*)(pid_t, __rlimit_resource_t, const struct rlimit64 *, struct rlimit64 *))dlsym(RTLD_NEXT, "prlimit64");
    int rc = real(pid, resource, rl, old);
    if (rc == 0 && rl && (pid == 0 || pid == getpid())) limit_set((int)resource, (rlim_t)rl->rlim_cur);
    return rc;
}
