/* interpose.c: the exported entry points (malloc family, memcpy/memmove and their _chk
 * variants), glibc's versions found with dlsym, the lock and initialisation on first use. */
#include "shim.h"

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

EXPORT void free(void *p) {
    if (UNLIKELY(in_arena(p))) {
        int saved = errno;
        lock_take();
        block_free(p);
        lock_drop();
        errno = saved;
        return;
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
    if (v < 0) bad_pointer("realloc");
    size_t old = head_pages((uint64_t)v) << A.pshift;
    void *q = n >= A.threshold ? block_realloc(p, n) : NULL;
    lock_drop();
    errno = saved;
    if (q) return q;
    /* below the threshold, or the arena could not grow it: allocate and copy */
    q = n >= A.threshold ? arena_alloc(n) : NULL;
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

EXPORT void *aligned_alloc(size_t align, size_t n) {
    if (!pow2(align)) { /* as glibc 2.38+: the alignment must be a power of two */
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
        size_t n = v < 0 ? 0 : head_pages((uint64_t)v) << A.pshift;
        lock_drop();
        return n;
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
