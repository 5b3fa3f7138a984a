/* copy.c: virtual copies. A large copy between arena blocks maps the source's memfd pages
 * privately at the destination (prepare_source, remap_private), keeping the pages it maps
 * over (salvage). */
#include "shim.h"

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

/* newer than some systems' headers (Linux 6.4; /dev/userfaultfd: 6.1) */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

#define SALVAGE_MIN_PAGES 16
#define REMAP_STEP 2048 /* pages of a first copy written into the memfd between remaps (8 MiB) */ /* below this, moving pages costs more than faulting them again */

/* This process's pagemap, opened once; reopened when the program closed the number (it
 * is forgotten, not closed: the number may be the program's own file now). */
int pagemap_fd(void) {
    if (A.pagemap_fd >= 0 && !fd_is(A.pagemap_fd, A.pm_dev, A.pm_ino)) {
        A.pagemap_fd = -1;
        st_add(S_FDS_LOST, 1);
    }
    if (A.pagemap_fd < 0) {
        int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0) return -1;
        if (fstat(fd, &st) != 0) {
            close(fd);
            return -1;
        }
        A.pm_dev = st.st_dev;
        A.pm_ino = st.st_ino;
        A.pagemap_fd = fd;
    }
    return A.pagemap_fd;
}

static int write_all(int fd, const void *buf, size_t len, off_t off) {
    const char *b = buf;
    while (len) {
        ssize_t w = pwrite(fd, b, len, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w, len -= (size_t)w, off += w;
    }
    return 0;
}

/* Keeping the pages a copy maps over. A virtual copy maps memfd pages over its
 * destination, and the pages the program had last written there were thrown away, so
 * the next allocations faulted and zeroed as many again (b25_matrix.R: twice glibc's
 * page allocations). Instead they are moved (mremap: page tables only) into a new range
 * the size of the block they belong to, so that the next allocation of that size (a
 * program copying a vector allocates the same size again) takes them, and that range
 * is cached as a freed block with its pages.
 *
 * Only the destination's: its whole pages are being overwritten by the copy, and the
 * move leaves them mapped (MREMAP_DONTUNMAP: empty until the memfd mapping replaces
 * them), so no access there ever faults. The source must keep its bytes readable
 * throughout (another thread may read it: legal C), so it is never moved: the memfd
 * mapping replaces it in one mmap, and a reader sees the old page or the new one, with
 * the same bytes. */
struct salvage {
    int64_t base; /* the new range, -1 when nothing was kept */
    uint64_t len, off; /* its pages; where the moved pages start in it */
};

/* Moves the pages of [v, v+k) away; [v, v+k) stays mapped, empty, for the caller to map
 * over. */
static struct salvage salvage_begin(uint64_t v, uint64_t k) {
    struct salvage sv = {-1, k, 0};
    /* the block around [v, v+k): a copy skips only its partial first and last pages */
    for (uint64_t h = v; h + 4 > v && h < A.va_high; h--) {
        if ((A.vmeta[h] & VM_HEAD) && h + head_pages(h) >= v + k && h + head_pages(h) <= v + k + 4) {
            sv.len = head_pages(h);
            sv.off = v - h;
            break;
        }
        if (h == 0) break;
    }
    uint64_t n = sv.len;
    /* a block that would not keep its pages at free (keeps_pages) does not keep them here */
    if (k < SALVAGE_MIN_PAGES || !keeps_pages(n) || fb_n == FREE_SLOTS || dirty_pages + k > dirty_cap() ||
        !single_owner(v, k) || !budget_ok())
        return sv;
    int64_t r = ext_alloc(&A.va, (uint32_t)n);
    if (r < 0) return sv;
    if (n > k && map_fresh((uint64_t)r, n) != 0) {
        ext_free(&A.va, (uint32_t)r, (uint32_t)n);
        return sv;
    }
    uint64_t to = (uint64_t)r + sv.off;
    if (mremap(page_addr(v), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               page_addr(to)) == MAP_FAILED) {
        if (n > k) unmap_pages((uint64_t)r, n);
        ext_free(&A.va, (uint32_t)r, (uint32_t)n);
        return sv;
    }
    view_moved(v, to, k);
    for (uint64_t j = 0; j < k; j++) {
        A.vmeta[to + j] = A.vmeta[v + j] & ~(VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + j] &= VM_HEAD | VM_NPAGES_MASK;
    }
    seg_mapped(to, k);
    if ((uint64_t)r + n > A.va_high) A.va_high = (uint64_t)r + n;
    st_add(S_PAGES_FRESH, n - k); /* the partial first and last pages around the kept ones */
    sv.base = r;
    return sv;
}

/* After the mapping over [v, v+k): caches the kept range, or on failure (ok == 0)
 * moves the pages back. */
static void salvage_end(uint64_t v, uint64_t k, struct salvage sv, int ok) {
    if (sv.base < 0) return;
    uint64_t r = (uint64_t)sv.base, n = sv.len, from = r + sv.off;
    if (!ok) {
        mremap(page_addr(from), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED, page_addr(v));
        view_moved(from, v, k);
        for (uint64_t j = 0; j < k; j++) {
            A.vmeta[v + j] = (A.vmeta[v + j] & (VM_HEAD | VM_NPAGES_MASK)) | A.vmeta[from + j];
            A.vmeta[from + j] = VM_MAPPED | VM_ANON; /* a hole now; released below */
        }
        release_block(r, n);
        return;
    }
    /* huge when its size asks for it: the moved mapping kept its THP advice */
    if (fb_insert(fb_entry(r, n, 1)) != 0) release_block(r, n);
    else st_add(S_PAGES_SALVAGED, k);
}

/* Remaps [v, v+k) privately onto memfd page (gen g, page f..): takes the new references
 * first, then drops the old ones, so a page mapped on both sides is never punched.
 * keep: [v, v+k) is a copy's destination, whose pages may be kept (see salvage). */
static int remap_private(uint64_t v, uint64_t k, int g, uint64_t f, int keep) {
    int fd = gen_fd(g);
    if (!budget_ok() || fd < 0) return -1;
    /* a source's shared run is remapped onto its own pages: nothing to keep */
    int same = 0;
    for (uint64_t i = 0; i < k && !same; i++) {
        uint64_t m = A.vmeta[v + i];
        same = !(m & VM_ANON) && (m & VM_MAPPED) && (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT) == g &&
               (m & VM_FPAGE_MASK) == f + i;
    }
    struct salvage kept = {-1, 0, 0};
    if (keep && !same) kept = salvage_begin(v, k);
    if (mmap(page_addr(v), k << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, (off_t)(f << A.pshift)) ==
        MAP_FAILED) {
        salvage_end(v, k, kept, 0);
        maps_failed();
        return -1;
    }
    salvage_end(v, k, kept, 1);
    if (g == A.gen)
        for (uint64_t i = 0; i < k; i++) A.fref[f + i]++, A.fview[f + i] ^= (uint32_t)(v + i);
    A.gen_refs[g] += k;
    unref_pages(v, k);
    for (uint64_t i = 0; i < k; i++) {
        uint64_t keep = A.vmeta[v + i] & (VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + i] = keep | VM_MAPPED | VM_PRIV | ((uint64_t)g << VM_GEN_SHIFT) | (f + i);
    }
    seg_mapped(v, k);
    return 0;
}

/* ---- writers of a source being re-homed ------------------------------------------
 * Re-homing a written page of the source reads its bytes into a fresh memfd page, then
 * maps that page over it (mmap MAP_FIXED): a write landing between the two went away
 * with the old page (a thread storing random words into a 64 MiB block while another
 * copied it lost 640-4363 of them in 3 s; a signal handler, 400-600). So before a copy
 * re-homes its first page, signals are blocked (a handler on this thread could write
 * the page, or wait at the fence for ever), and when the process has another thread,
 * each run about to be re-homed is registered with a userfaultfd and write-protected
 * (fence_run): its writers wait until it is remapped, then write into the new mapping
 * (run_done wakes them); writers of other pages go on. Only the run is registered: its
 * remap drops the registration, where unregistering the whole source cost a walk of
 * all its page tables (some 130 us for 64 MiB, one run). Where userfaultfd is refused
 * the rest of the copy is a plain one. */
enum { G_UNSET, G_ALONE, G_FENCED };
struct guard {
    int state, refused, uffd;
    sigset_t old; /* the signal mask to restore */
};

/* A userfaultfd whose waits include the kernel's own writes (another thread's read(2)
 * into the block): the syscall, else /dev/userfaultfd. Never UFFD_USER_MODE_ONLY: its
 * kernel-mode faults fail with EFAULT instead of waiting. */
static int uffd_open(void) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
        if (dev < 0) return -1;
        fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
        close(dev);
        if (fd < 0) return -1;
    }
    /* write protection of unpopulated pages (a first copy maps holes over them) and of
     * memfd mappings */
    struct uffdio_api api = {.api = UFFD_API,
                             .features = UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
    if (ioctl(fd, UFFDIO_API, &api) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Before the copy re-homes a run. Returns 0 when it must not: another thread may
 * write the source and there is no fence. */
static int guard_up(struct guard *g) {
    if (g->refused) return 0;
    if (g->state != G_UNSET) return 1;
    sigset_t all;
    sigfillset(&all);
    if (pthread_sigmask(SIG_SETMASK, &all, &g->old) != 0) {
        g->refused = 1;
        return 0;
    }
    if (single_threaded()) g->state = G_ALONE;
    else if ((g->uffd = uffd_open()) >= 0) g->state = G_FENCED;
    else {
        pthread_sigmask(SIG_SETMASK, &g->old, NULL);
        g->refused = 1;
        return 0;
    }
    return 1;
}

static struct uffdio_range uffd_range(uint64_t v, uint64_t k) {
    return (struct uffdio_range){(uint64_t)(uintptr_t)page_addr(v), k << A.pshift};
}

/* [v, v+k), about to be re-homed: its writers wait from now on. 0, or -1 (nothing
 * fenced: the memory is another userfaultfd's, or of a kind it cannot protect). */
static int fence_run(struct guard *g, uint64_t v, uint64_t k) {
    if (g->state != G_FENCED) return 0;
    struct uffdio_register reg = {.range = uffd_range(v, k), .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = reg.range, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(g->uffd, UFFDIO_REGISTER, &reg) == 0) {
        if (ioctl(g->uffd, UFFDIO_WRITEPROTECT, &wp) == 0) return 0;
        ioctl(g->uffd, UFFDIO_UNREGISTER, &reg.range);
    }
    g->refused = 1;
    return -1;
}

/* After fence_run(v, k): the run was remapped (its new mapping is watched by no
 * userfaultfd) or not (unregistering clears its protection); its writers go on. */
static void run_done(struct guard *g, uint64_t v, uint64_t k, int remapped) {
    if (g->state != G_FENCED) return;
    struct uffdio_range r = uffd_range(v, k);
    if (!remapped) ioctl(g->uffd, UFFDIO_UNREGISTER, &r);
    ioctl(g->uffd, UFFDIO_WAKE, &r);
}

static void guard_down(struct guard *g) {
    if (g->state == G_FENCED) {
        close(g->uffd);
        st_add(S_COPIES_FENCED, 1);
    }
    if (g->state != G_UNSET) pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Makes [v, v+k) of the source shareable: every page becomes a private mapping of a
 * memfd page holding its current contents. Shared runs are only remapped private;
 * pages already copied-on-write (anonymous, seen in pagemap) are written once into
 * fresh memfd pages so that the copy shares them too (behind g). Returns how many pages
 * are ready. */
static uint64_t prepare_source(uint64_t v, uint64_t k, struct guard *g) {
    uint64_t i = 0;
    uint64_t pm[512];
    while (i < k) {
        uint64_t m = A.vmeta[v + i];
        uint64_t r = run_len(v + i, k - i);
        if (m & VM_ANON) {
            /* nobody shares this block yet: its present pages are written once into fresh
             * memfd pages (the others stay holes, which read as zero), and every
             * REMAP_STEP pages are mapped private onto them, so that the block is held
             * twice (its anonymous pages and the memfd's) for one step at a time, not
             * whole: a first copy of 200 MB peaked at 400 MB */
            if (!guard_up(g)) return i;
            int fd = cur_fd();
            int64_t f = fd < 0 ? -1 : ext_alloc(&A.fd, (uint32_t)r);
            if (f < 0) return i;
            uint64_t done = 0, moved = 0;
            while (done < r) {
                uint64_t step = r - done < REMAP_STEP ? r - done : REMAP_STEP, at = done;
                int fenced = fence_run(g, v + i + done, step) == 0, ok = fenced;
                while (ok && at < done + step) {
                    uint64_t chunk = done + step - at < 512 ? done + step - at : 512;
                    int pfd = pagemap_fd();
                    if (pfd < 0 || !pm_read(pfd, v + i + at, chunk, pm)) {
                        ok = 0;
                        break;
                    }
                    uint64_t j = 0;
                    while (ok && j < chunk) {
                        if (!((pm[j] >> 63 | pm[j] >> 62) & 1)) {
                            j++;
                            continue;
                        }
                        uint64_t a = j;
                        while (j < chunk && ((pm[j] >> 63 | pm[j] >> 62) & 1)) j++;
                        uint64_t p = at + a, cnt = j - a;
                        ok = write_all(fd, page_addr(v + i + p), cnt << A.pshift,
                                       (off_t)(((uint64_t)f + p) << A.pshift)) == 0;
                        moved += cnt;
                    }
                    at += chunk;
                }
                ok = ok && remap_private(v + i + done, step, A.gen, (uint64_t)f + done, 0) == 0;
                if (fenced) run_done(g, v + i + done, step, ok);
                if (!ok) {
                    /* the steps mapped so far are ready; the rest of the memfd range is not used */
                    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(((uint64_t)f + done) << A.pshift),
                              (off_t)((r - done) << A.pshift));
                    ext_free(&A.fd, (uint32_t)((uint64_t)f + done), (uint32_t)(r - done));
                    st_add(S_PAGES_MOVED, moved);
                    return i + done;
                }
                done += step;
            }
            st_add(S_PAGES_MOVED, moved);
            i += r;
            continue;
        }
        if (!(m & VM_PRIV)) {
            if (remap_private(v + i, r, (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT), m & VM_FPAGE_MASK, 0) != 0)
                return i;
            i += r;
            continue;
        }
        /* private: look for pages that were written since they were shared */
        uint64_t done = 0;
        while (done < r) {
            uint64_t chunk = r - done < 512 ? r - done : 512;
            int pfd = pagemap_fd();
            if (pfd < 0 || !pm_read(pfd, v + i + done, chunk, pm)) return i + done;
            /* a detached page's memfd offset was released: its bytes are only its own */
            if (m & VM_DETACHED) for (uint64_t j = 0; j < chunk; j++) pm[j] |= 1ull << 63, pm[j] &= ~(1ull << 61);
            uint64_t j = 0;
            while (j < chunk) {
                if (!pm_written(pm[j])) {
                    j++;
                    continue;
                }
                uint64_t a = j;
                while (j < chunk && pm_written(pm[j])) j++;
                uint64_t pv = v + i + done + a, cnt = j - a;
                if (!guard_up(g)) return i + done + a;
                int fd = cur_fd();
                int64_t f = fd < 0 ? -1 : ext_alloc(&A.fd, (uint32_t)cnt);
                if (f < 0) return i + done + a;
                int fenced = fence_run(g, pv, cnt) == 0;
                int ok = fenced &&
                         write_all(fd, page_addr(pv), cnt << A.pshift, (off_t)((uint64_t)f << A.pshift)) == 0 &&
                         remap_private(pv, cnt, A.gen, (uint64_t)f, 0) == 0;
                if (fenced) run_done(g, pv, cnt, ok);
                if (!ok) {
                    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((uint64_t)f << A.pshift),
                              (off_t)(cnt << A.pshift));
                    ext_free(&A.fd, (uint32_t)f, (uint32_t)cnt);
                    return i + done + a;
                }
                /* remap_private took the source's reference to the fresh pages */
                st_add(S_PAGES_MOVED, cnt);
            }
            done += chunk;
        }
        i += r;
    }
    return k;
}

/* A large copy between arena addresses. Returns d; falls back to glibc where it must. */
void *big_copy(void *d, const void *s, size_t n, copy_fn plain) {
    st_add(S_COPIES_SEEN, 1);
    uintptr_t du = (uintptr_t)d, su = (uintptr_t)s;
    enum counter why;
    if (!in_arena(d) || !in_arena(s) || !in_arena((const char *)d + n - 1) || !in_arena((const char *)s + n - 1))
        why = S_FB_NOT_ARENA;
    else if (((du - su) & (A.ps - 1)) != 0)
        why = S_FB_OFFSET;
    else if ((du < su ? su - du : du - su) < n)
        why = S_FB_OVERLAP;
    else if (A.mode != MODE_COW)
        return plain(d, s, n);
    else
        why = S_NSTATS;
    size_t head = (A.ps - (du & (A.ps - 1))) & (A.ps - 1);
    if (why == S_NSTATS && (head >= n || ((n - head) >> A.pshift) == 0)) why = S_FB_SHORT;
    if (why != S_NSTATS) {
        st_add(why, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    if (lock_mine) { /* a signal handler interrupted this thread inside the shim */
        st_add(S_FB_REENTRANT, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    uint64_t k = (n - head) >> A.pshift;
    size_t tail = n - head - (k << A.pshift);
    uint64_t dv = page_of((char *)d + head), sv = page_of((const char *)s + head);
    int saved = errno;
    lock_take();
    uint64_t shared = 0;
    why = S_NSTATS;
    for (uint64_t i = 0; i < k && why == S_NSTATS; i++)
        if (!(A.vmeta[sv + i] & VM_MAPPED) || !(A.vmeta[dv + i] & VM_MAPPED)) why = S_FB_NOT_ARENA;
    if (why == S_NSTATS && (prot_any(sv, k) || prot_any(dv, k))) why = S_FB_PROTECTED;
    if (why == S_NSTATS) {
        if (!budget_ok()) why = S_FB_BUDGET;
        else {
            struct guard g = {G_UNSET, 0, -1, {{0}}};
            uint64_t ready = prepare_source(sv, k, &g);
            guard_down(&g);
            uint64_t i = 0;
            while (i < ready) {
                uint64_t m = A.vmeta[sv + i];
                uint64_t r = run_len(sv + i, ready - i);
                if (remap_private(dv + i, r, (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT), m & VM_FPAGE_MASK, 1) != 0)
                    break;
                i += r;
            }
            shared = i;
            if (shared < k) why = g.refused ? S_FB_UNFENCED : budget_ok() ? S_FB_ERROR : S_FB_BUDGET;
        }
    }
    lock_drop();
    errno = saved;
    if (shared == 0 && why != S_NSTATS) {
        st_add(why, 1);
        st_add(S_FB_BYTES, n);
        return plain(d, s, n);
    }
    if (head) real_memcpy(d, s, head);
    size_t rest = (k - shared) << A.pshift;
    if (rest + tail)
        real_memcpy((char *)d + head + (shared << A.pshift), (const char *)s + head + (shared << A.pshift), rest + tail);
    st_add(S_COPIES_VIRTUAL, 1);
    st_add(S_PAGES_SHARED, shared);
    st_add(S_BYTES_PARTIAL, head + tail);
    if (shared < k) {
        st_add(why, 1);
        st_add(S_FB_BYTES, rest);
    }
    return d;
}
