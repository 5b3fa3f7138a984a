/* arena.c: the reservation and its tables (vmeta, fref, extents, VMA budget), memfd
 * generations and runs, and blocks: allocation, realloc (in place or by mremap). */
#include "shim.h"

struct arena A;
int cow_fresh_memfd;
uint64_t thp_min;

static void say(const char *msg) {
    size_t n = 0;
    while (msg[n]) n++;
    ssize_t r = write(2, msg, n);
    (void)r;
}

void *map_table(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- extent allocator over a page index space (free list in a fixed table) ------ */

static void ext_shift(struct extents *e, uint32_t at, int by) {
    if (by > 0)
        for (uint32_t i = e->n; i > at; i--) e->v[i] = e->v[i - 1];
    else
        for (uint32_t i = at; i + 1 < e->n; i++) e->v[i] = e->v[i + 1];
    e->n = (uint32_t)((int)e->n + by);
}

int64_t ext_alloc(struct extents *e, uint32_t len) {
    for (uint32_t i = 0; i < e->n; i++) {
        if (e->v[i].len < len) continue;
        uint32_t s = e->v[i].start;
        e->v[i].start += len;
        e->v[i].len -= len;
        if (e->v[i].len == 0) ext_shift(e, i, -1);
        return s;
    }
    return -1;
}

/* Claims [start, start+len) if it is free (realloc growing in place). */
static int ext_claim(struct extents *e, uint32_t start, uint32_t len) {
    for (uint32_t i = 0; i < e->n; i++) {
        struct extent *x = &e->v[i];
        if (x->start > start) return 0;
        if (x->start + x->len < start + len) continue;
        if (x->start == start) {
            x->start += len;
            x->len -= len;
            if (x->len == 0) ext_shift(e, i, -1);
            return 1;
        }
        if (x->start + x->len == start + len) {
            x->len -= len;
            return 1;
        }
        if (e->n == MAX_EXTENTS) return 0;
        ext_shift(e, i + 1, 1);
        e->v[i + 1].start = start + len;
        e->v[i + 1].len = x->start + x->len - (start + len);
        x->len = start - x->start;
        return 1;
    }
    return 0;
}

void ext_free(struct extents *e, uint32_t start, uint32_t len) {
    uint32_t lo = 0, hi = e->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (e->v[mid].start < start) lo = mid + 1; else hi = mid;
    }
    int prev = lo > 0 && e->v[lo - 1].start + e->v[lo - 1].len == start;
    int next = lo < e->n && start + len == e->v[lo].start;
    if (prev && next) {
        e->v[lo - 1].len += len + e->v[lo].len;
        ext_shift(e, lo, -1);
    } else if (prev) {
        e->v[lo - 1].len += len;
    } else if (next) {
        e->v[lo].start = start;
        e->v[lo].len += len;
    } else if (e->n < MAX_EXTENTS) {
        ext_shift(e, lo, 1);
        e->v[lo].start = start;
        e->v[lo].len = len;
    } /* else: the table is full and the range is leaked (address space only) */
}

int ext_init(struct extents *e) {
    e->v = map_table(sizeof(struct extent) * (MAX_EXTENTS + 1));
    if (!e->v) return -1;
    e->n = 1;
    e->v[0].start = 0;
    e->v[0].len = (uint32_t)ARENA_PAGES;
    return 0;
}

/* ---- VMA budget: a bit marks a page where a mapping may begin ------------------ */

static void seg_set(uint64_t v) {
    if (v >= ARENA_PAGES) return;
    uint64_t m = 1ull << (v & 63);
    if (!(A.segbits[v >> 6] & m)) A.segbits[v >> 6] |= m, A.segs++;
}
static void seg_clear(uint64_t v) {
    uint64_t m = 1ull << (v & 63);
    if (A.segbits[v >> 6] & m) A.segbits[v >> 6] &= ~m, A.segs--;
}
/* One mmap/mremap over [v, v+n): one mapping there, maybe split neighbours. */
void seg_mapped(uint64_t v, uint64_t n) {
    seg_set(v);
    for (uint64_t i = v + 1; i < v + n; i++) seg_clear(i);
    seg_set(v + n);
}

/* ---- pages the program protected ------------------------------------------------- */

/* Whether [v, v+n) holds a page the program protected or marked for fork (forkbits). A
 * word at a time where it can: every large copy asks (48,828 pages for 200 MB). */
int prot_any(uint64_t v, uint64_t n) {
    uint64_t i = v, end = v + n;
    while (i < end) {
        if (!(i & 63) && end - i >= 64) {
            if (A.protbits[i >> 6] | A.forkbits[i >> 6]) return 1;
            i += 64;
            continue;
        }
        if (((A.protbits[i >> 6] | A.forkbits[i >> 6]) >> (i & 63)) & 1) return 1;
        i++;
    }
    return 0;
}

static void bits_set(uint64_t *bits, uint64_t v, uint64_t n, int on) {
    for (uint64_t i = v; i < v + n; i++) {
        if (on) bits[i >> 6] |= 1ull << (i & 63);
        else bits[i >> 6] &= ~(1ull << (i & 63));
    }
}

void prot_set(uint64_t v, uint64_t n, int on) { bits_set(A.protbits, v, n, on); }

/* Remaps the shared memfd runs in [v, v+n) private onto the same pages (contents
 * unchanged), as before fork: before the program changes their protection, so that
 * nothing (fork, a later copy) ever has to remap them again. */
void make_private(uint64_t v, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint64_t m = A.vmeta[v + i], r = run_len(v + i, n - i);
        if ((m & VM_MAPPED) && !(m & (VM_ANON | VM_PRIV))) {
            int fd = gen_fd((int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT));
            if (fd < 0) {
                unshare_lost(v + i, r);
            } else if (mmap(page_addr(v + i), r << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
                            off_of(m)) != MAP_FAILED) {
                for (uint64_t j = 0; j < r; j++) A.vmeta[v + i + j] |= VM_PRIV;
                seg_mapped(v + i, r);
            }
        }
        i += r;
    }
}

/* ---- the program's MADV_DONTNEED and MADV_FREE ------------------------------------
 * On the anonymous memory glibc hands out, a page dropped with MADV_DONTNEED reads as
 * zeros, and MADV_FREE succeeds. On a memfd view (a copy's side, or a block that adopted
 * its pages) DONTNEED reads the memfd page again (the copy's bytes, not zeros) and
 * MADV_FREE fails with EINVAL (the kernel takes it on private anonymous memory only).
 * So before either advice the views among the live blocks' pages in its range become
 * fresh anonymous memory (zeros, as the advice leaves them) and drop their references,
 * as a freed block's would; the advice then acts on them as under glibc. Pages the
 * program protected (protbits) are left as they are. */

/* Whether [v, v+n) holds a memfd view (mapped, not anonymous). */
static int any_view(uint64_t v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if ((A.vmeta[v + i] & (VM_MAPPED | VM_ANON)) == VM_MAPPED) return 1;
    return 0;
}

/* A mapped page not in the free table is a live block's (the lock is held: no block is
 * half made). The fresh mapping asks for no huge pages: the view it replaces had none. */
void drop_views(uint64_t v, uint64_t n) {
    if (!any_view(v, n)) return;
    uint64_t i = 0, to;
    while (i < n) {
        if (fb_at(v + i, &to)) {
            i = to - v;
            continue;
        }
        uint64_t w = v + i, m = A.vmeta[w], r = run_len(w, (to < v + n ? to - v : n) - i);
        if ((m & (VM_MAPPED | VM_ANON)) == VM_MAPPED && !prot_any(w, r) &&
            mmap(page_addr(w), r << A.pshift, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
                MAP_FAILED) {
            unref_pages(w, r);
            for (uint64_t j = 0; j < r; j++)
                A.vmeta[w + j] = (A.vmeta[w + j] & (VM_HEAD | VM_NPAGES_MASK)) | VM_MAPPED | VM_ANON;
            seg_mapped(w, r);
            st_add(S_PAGES_DROPPED, r);
        }
        i += r;
    }
}

/* ---- the program's MADV_WIPEONFORK and MADV_DONTFORK -------------------------------
 * The kernel refuses MADV_WIPEONFORK on a file mapping (EINVAL), so on a copy's pages (memfd
 * views) the program's advice failed where glibc's anonymous memory takes it. And a mark
 * the kernel took (MADV_DONTFORK on a view, either on a block never copied) was lost when
 * the shim mapped over the pages: a copy into or out of the block, a last view adopting
 * its pages; a forked child then read the parent's bytes, or had the range at all. So
 * before either advice the views among the live blocks' pages in its range become
 * anonymous memory with the same bytes (copied into a fresh mapping that replaces them
 * with one mremap), and every page of the range is marked (forkbits): the shim never maps
 * over it again, and a block holding one is unmapped at free, as a protected one is
 * (the kernel's mark would stay on the mapping for the next block). MADV_KEEPONFORK and
 * MADV_DOFORK are the kernel's alone; the pages stay marked (they only miss virtual
 * copies) until unmapped. A thread of the program writing such a view while it is
 * copied may lose that write: only in this corner. Pages the program protected
 * (protbits) stay views: MADV_WIPEONFORK fails there with EINVAL. */

/* [w, w+r), views of a live block, becomes anonymous memory with the same bytes. */
static void view_to_anon(uint64_t w, uint64_t r) {
    size_t len = r << A.pshift;
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) return;
    real_memcpy(tmp, page_addr(w), len);
    if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, page_addr(w)) == MAP_FAILED) {
        munmap(tmp, len);
        return;
    }
    unref_pages(w, r);
    for (uint64_t j = 0; j < r; j++) A.vmeta[w + j] = (A.vmeta[w + j] & (VM_HEAD | VM_NPAGES_MASK)) | VM_MAPPED | VM_ANON;
    seg_mapped(w, r);
}

/* The program marks [v, v+n) MADV_WIPEONFORK or MADV_DONTFORK; views: the arena may hold
 * memfd views (vcopy). Lock held. */
void fork_mark(uint64_t v, uint64_t n, int views) {
    uint64_t i = views && any_view(v, n) ? 0 : n, to;
    while (i < n) {
        if (fb_at(v + i, &to)) {
            i = to - v;
            continue;
        }
        uint64_t w = v + i, m = A.vmeta[w], r = run_len(w, (to < v + n ? to - v : n) - i);
        if ((m & (VM_MAPPED | VM_ANON)) == VM_MAPPED && !prot_any(w, r)) view_to_anon(w, r);
        i += r;
    }
    bits_set(A.forkbits, v, n, 1);
}

/* ---- memfd generations ----------------------------------------------------------- */

/* ---- the shim's descriptors --------------------------------------------------------
 * A program may close descriptors it did not open (a daemon closing every fd above 2,
 * closefrom, close_range) and get the same numbers back for its own files: the shim
 * then punched holes into the program's file, wrote into it, mapped it as a copy's
 * source and closed it at fork. So each of its descriptors (a generation's memfd, the
 * pagemap file) is checked by device and inode (one fstat) before every use; a number
 * that is no longer the shim's is forgotten: never written, punched, mapped or closed.
 * A generation whose memfd is gone is retired as at fork (lock_take: new_generation):
 * its pages stay mapped by their views and go back when the last one is unmapped;
 * its shared runs are copied private at fork (unshare_lost). */
int fd_is(int fd, dev_t dev, ino_t ino) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* Generation g's memfd, or -1 when it has none or the program closed it (then lost). */
int gen_fd(int g) {
    int fd = A.gen_fd[g];
    if (fd < 0 || fd_is(fd, A.gen_dev[g], A.gen_ino[g])) return fd;
    A.gen_fd[g] = -1;
    A.gen_lost |= 1ull << g;
    if (g == A.gen) A.retire = 1;
    st_add(S_FDS_LOST, 1);
    return -1;
}

int cur_fd(void) {
    if (A.gen < 0) return -1;
    int have = gen_fd(A.gen);
    if (have >= 0 || ((A.gen_lost >> A.gen) & 1)) return have;
    int fd = memfd_create("advm-arena", MFD_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (ftruncate(fd, (off_t)(ARENA_PAGES << A.pshift)) != 0 || fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    A.gen_dev[A.gen] = st.st_dev;
    A.gen_ino[A.gen] = st.st_ino;
    A.gen_fd[A.gen] = fd;
    return fd;
}

void gen_unref(int g, uint64_t n) {
    A.gen_refs[g] -= n;
    if (A.gen_refs[g] == 0 && g != A.gen) {
        int fd = gen_fd(g);
        if (fd >= 0) close(fd);
        A.gen_fd[g] = -1;
        A.gen_lost &= ~(1ull << g); /* the slot is free again */
    }
}

/* [v, v+n), a shared run of a generation whose memfd the program closed, becomes
 * anonymous memory with the same bytes (before fork: a shared mapping would be shared
 * with the child, and without the memfd it cannot be remapped private). A thread of
 * the program writing the run meanwhile may lose that write: only in this corner. */
void unshare_lost(uint64_t v, uint64_t n) {
    size_t len = n << A.pshift;
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) return;
    real_memcpy(tmp, page_addr(v), len);
    if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, page_addr(v)) == MAP_FAILED) {
        munmap(tmp, len);
        return;
    }
    int g = (int)((A.vmeta[v] & VM_GEN_MASK) >> VM_GEN_SHIFT);
    for (uint64_t i = 0; i < n; i++) A.vmeta[v + i] = (A.vmeta[v + i] & (VM_HEAD | VM_NPAGES_MASK)) | VM_MAPPED | VM_ANON;
    seg_mapped(v, n);
    gen_unref(g, n);
}

/* Frees memfd pages f..f+k of generation g (their memory and their offsets). */
static void punch(int g, uint64_t f, uint64_t k) {
    int fd = gen_fd(g);
    if (fd >= 0)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(f << A.pshift),
              (off_t)(k << A.pshift));
    ext_free(&A.fd, (uint32_t)f, (uint32_t)k);
}

/* Frees the memory of memfd pages f..f+k (current generation) but keeps their offsets:
 * detached views still map them (see fdet). */
static void punch_kept(uint64_t f, uint64_t k) {
    int fd = gen_fd(A.gen);
    if (fd >= 0)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(f << A.pshift), (off_t)(k << A.pshift));
}

/* Memfd page f (current generation) has one view left, arena page w (a private one).
 * Where w has written the page, the memfd page is dead weight (the kernel keeps w's own
 * copy and nothing else maps f): it is punched and w detached. Where w has not written
 * it, w becomes its home: remapped MAP_SHARED onto f, so that a later write goes into
 * the memfd page instead of a private copy beside it (R's `y <- x; x <- NULL; y[i] <- v`
 * kept both). Consecutive such pages are gathered into runs (f..f+k at w..w+k) so that
 * pagemap is read once per run and each unwritten stretch is one mmap. */
static uint64_t dead_f, dead_w, dead_k;

/* Whether the process has one thread: then, with signals blocked, nothing can write a
 * page between pagemap's answer and the mmap that replaces it, which would lose that
 * write. /proc/self/task's link count is 2 + its threads: one stat, 1.2 us where
 * reading num_threads from /proc/self/stat took 2.5 us (copies ask on every re-home). */
int single_threaded(void) {
    struct stat st;
    return stat("/proc/self/task", &st) == 0 && st.st_nlink == 3;
}

/* Remaps the unwritten pages [w, w+k) (views of f..f+k) shared: the same bytes, read
 * from the same memfd pages, and one mmap(MAP_FIXED) so no reader sees a hole. Runs
 * shorter than a copy worth making virtual are left private: converting them costs a
 * mapping split for little. */
static void adopt(uint64_t f, uint64_t w, uint64_t k) {
    int fd = gen_fd(A.gen);
    if ((k << A.pshift) < copy_min || !budget_ok() || fd < 0 || prot_any(w, k)) return;
    if (mmap(page_addr(w), k << A.pshift, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
             (off_t)(f << A.pshift)) == MAP_FAILED)
        return; /* the old mapping stays: still a correct private view */
    for (uint64_t i = 0; i < k; i++) A.vmeta[w + i] &= ~VM_PRIV;
    seg_mapped(w, k);
    st_add(S_PAGES_ADOPTED, k);
}

static void release_dead_run(void) {
    uint64_t k = dead_k, pm[512];
    dead_k = 0;
    int pfd = pagemap_fd();
    if (pfd < 0) return;
    sigset_t all, old;
    int share = (k << A.pshift) >= copy_min && single_threaded();
    if (share) {
        sigfillset(&all);
        share = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
    }
    uint64_t at = 0, len = 0; /* the unwritten stretch gathered so far, across chunks */
    for (uint64_t done = 0; done < k;) {
        uint64_t chunk = k - done < 512 ? k - done : 512;
        if (!pm_read(pfd, dead_w + done, chunk, pm)) break;
        uint64_t j = 0;
        while (j < chunk) {
            uint64_t f = dead_f + done + j, w = dead_w + done + j;
            /* still the one view of its page: an earlier page of the same unref may have
             * dropped the page to no view (punched already) */
            int mine = A.fref[f] == 1 && A.fview[f] == w;
            if (mine && !pm_written(pm[j])) {
                if (!len) at = done + j;
                len++;
                j++;
                continue;
            }
            if (len && share) adopt(dead_f + at, dead_w + at, len);
            len = 0;
            if (!mine || !pm_surely(pm[j])) {
                j++;
                continue;
            }
            uint64_t a = j;
            while (j < chunk && pm_surely(pm[j]) && A.fref[dead_f + done + j] == 1 &&
                   A.fview[dead_f + done + j] == dead_w + done + j)
                j++;
            uint64_t cnt = j - a;
            f = dead_f + done + a, w = dead_w + done + a;
            for (uint64_t i = 0; i < cnt; i++) {
                A.fref[f + i] = 0;
                A.fview[f + i] = 0;
                A.fdet[f + i] = 1;
                A.vmeta[w + i] |= VM_DETACHED;
            }
            A.gen_refs[A.gen] -= cnt;
            A.gen_det[A.gen] += cnt;
            punch_kept(f, cnt);
            st_add(S_PAGES_DETACHED, cnt);
        }
        done += chunk;
    }
    if (len && share) adopt(dead_f + at, dead_w + at, len);
    if (share) pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Memfd page f of the current generation is left with one view: a candidate (see above). */
static void one_view_left(uint64_t f) {
    uint64_t w = A.fview[f], m = A.vmeta[w];
    if (!(m & VM_PRIV) || (m & VM_FPAGE_MASK) != f) return; /* a shared view writes the memfd page itself */
    if (dead_k && f == dead_f + dead_k && w == dead_w + dead_k && dead_k < MAX_BLOCK_PAGES) {
        dead_k++;
        return;
    }
    if (dead_k) release_dead_run();
    dead_f = f, dead_w = w, dead_k = 1;
}

/* [from, from+n) now maps at [to, to+n) (its pages moved with mremap; vmeta not yet
 * moved): the memfd pages it maps get their new view address. */
void view_moved(uint64_t from, uint64_t to, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t m = A.vmeta[from + i];
        if ((m & VM_MAPPED) && !(m & (VM_ANON | VM_DETACHED)) && (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT) == A.gen)
            A.fview[m & VM_FPAGE_MASK] ^= (uint32_t)((from + i) ^ (to + i));
    }
}

/* [v, v+max) starts with a detached view no longer mapped: the offsets its run of
 * detached views (current generation, consecutive memfd pages) kept are freed where it
 * was the last view to keep them. Returns the run's length. */
static uint64_t undetach(uint64_t v, uint64_t max) {
    uint64_t m = A.vmeta[v], f = m & VM_FPAGE_MASK, k = 1;
    int g = (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT);
    while (k < max && A.vmeta[v + k] == (m & ~(VM_HEAD | VM_NPAGES_MASK)) + k) k++;
    A.gen_det[g] -= k;
    if (g != A.gen) return k; /* a frozen generation's offsets are never reused */
    uint64_t at = 0, len = 0;
    for (uint64_t i = 0; i < k; i++) {
        if (A.fdet[f + i] && --A.fdet[f + i] == 0) {
            if (!len) at = i;
            len++;
            continue;
        }
        if (len) punch(g, f + at, len);
        len = 0;
    }
    if (len) punch(g, f + at, len);
    return k;
}

/* Drops the references of [v, v+n) (already unmapped or remapped) and punches memfd
 * pages of the current generation nobody needs any more: those nobody maps, and those
 * whose one remaining view has its own copy (release_dead_run). */
void unref_pages(uint64_t v, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint64_t m = A.vmeta[v + i];
        if ((m & (VM_MAPPED | VM_ANON | VM_DETACHED)) == (VM_MAPPED | VM_DETACHED)) {
            i += undetach(v + i, n - i);
            continue;
        }
        if (!(m & VM_MAPPED) || (m & VM_ANON)) {
            i++;
            continue;
        }
        int g = (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT);
        uint64_t f = m & VM_FPAGE_MASK;
        if (g != A.gen) {
            gen_unref(g, 1);
            i++;
            continue;
        }
        /* a run of consecutive memfd pages that all drop to zero is punched at once */
        uint64_t k = 0;
        while (i + k < n) {
            uint64_t mk = A.vmeta[v + i + k];
            if (!(mk & VM_MAPPED) || (mk & (VM_ANON | VM_DETACHED)) ||
                (int)((mk & VM_GEN_MASK) >> VM_GEN_SHIFT) != g || (mk & VM_FPAGE_MASK) != f + k ||
                A.fref[f + k] != 1)
                break;
            k++;
        }
        if (k == 0) { /* still mapped elsewhere */
            A.fref[f]--;
            A.fview[f] ^= (uint32_t)(v + i);
            A.gen_refs[g]--;
            if (A.fref[f] == 1) one_view_left(f);
            i++;
            continue;
        }
        for (uint64_t j = 0; j < k; j++) A.fref[f + j] = 0, A.fview[f + j] = 0;
        A.gen_refs[g] -= k;
        punch(g, f, k);
        i += k;
    }
    if (dead_k) release_dead_run();
}

/* ---- trimming memfd pages no view reads -------------------------------------------
 * A virtual copy maps one memfd page under both sides, privately; each side's first
 * write gives it its own anonymous copy. When every view of a memfd page has written it,
 * nobody reads the page any more, but it stays in the memfd (a third copy) until all but
 * one of the views are freed (unref_pages). The shim sees no writes, so from time to
 * time (trim_count: after ADVM_TRIM_KIB of allocations, default 32 MiB, see there; and
 * at malloc_trim) it asks /proc/self/pagemap
 * which private views of the current generation hold their own page (present
 * anonymous, or swapped: pm_surely) and punches every memfd page all of whose views do.
 * Those views are detached as release_dead_run does.
 *
 * Why what a view reads never changes: a page a private view has written is read from
 * its own anonymous page until the view is unmapped, or the program drops it
 * (MADV_DONTNEED; the shim's own calls hold the lock that the trim holds). A page not
 * yet faulted, or a page of the file, reads the memfd: one such view keeps the page.
 * Views are counted against fref, which counts every view of the generation, shared
 * ones too (they read the file), so a page is punched only when each of its views was
 * seen written. After MADV_DONTNEED a detached view reads its offset again, which stays
 * a hole until every view detached from it is gone (fdet): zeros, as dropped anonymous
 * memory reads, never another side's bytes.
 *
 * Only the current generation: after a fork, what the other process maps belongs to a
 * frozen generation, which is never punched. A child this shim did not see fork (a raw
 * fork by inline assembly) would share the current generation and read zeros where it
 * had not written: no trim runs while the process has any child (waitid), nor in such
 * a child (its pid is not the one the shim knows), so it is safe while it lives as this
 * process's child (an orphaned grandchild of one is not seen). */
uint64_t trim_every;
static uint64_t trim_since, trim_last_views;

/* Whether the process has a child, running or not yet waited for. */
static int has_children(void) {
    siginfo_t si;
    return syscall(SYS_waitid, P_ALL, 0, &si, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT, NULL) == 0 ||
           errno != ECHILD;
}

/* Whether arena page meta m is a private view of the current generation still counted
 * in fref (not detached). */
static int counted_view(uint64_t m) {
    return (m & (VM_MAPPED | VM_PRIV | VM_ANON | VM_DETACHED)) == (VM_MAPPED | VM_PRIV) &&
           (int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT) == A.gen;
}

#define TRIM_ALL (1u << 31) /* fdet during a trim: every view of this page was written */

/* Punches the memfd pages (current generation) whose every view has its own copy. Lock held. */
void trim_views(void) {
    trim_since = 0;
    if (A.mode != MODE_COW || A.retired || A.gen < 0 || A.gen_refs[A.gen] == 0 || gen_fd(A.gen) < 0) return;
    int saved = errno;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int pfd = pagemap_fd();
    /* a process of another pid is a child the shim did not see fork (raw fork) */
    if (pfd < 0 || getpid() != A.pid || has_children()) {
        errno = saved;
        return;
    }
    /* count each page's written views in fdet (0 there: fref is not) */
    uint64_t pm[512], views = 0, v = 0;
    while (v < A.va_high) {
        if (!counted_view(A.vmeta[v])) {
            v++;
            continue;
        }
        uint64_t k = 1;
        while (v + k < A.va_high && k < 512 && counted_view(A.vmeta[v + k])) k++;
        if (!pm_read(pfd, v, k, pm)) break; /* counted so far: fewer, never too many */
        for (uint64_t j = 0; j < k; j++)
            if (pm_surely(pm[j])) A.fdet[A.vmeta[v + j] & VM_FPAGE_MASK]++;
        views += k;
        v += k;
    }
    /* at each page's first view: all counted (every view written: detach them all) or not
     * (forget the count); fdet ends as the views detached from a punched page, else 0 */
    uint64_t pf = 0, pk = 0, trimmed = 0;
    for (v = 0; v < A.va_high; v++) {
        uint64_t m = A.vmeta[v];
        if (!counted_view(m)) continue;
        uint64_t f = m & VM_FPAGE_MASK;
        if (!(A.fdet[f] & TRIM_ALL)) {
            if (A.fdet[f] != A.fref[f]) {
                A.fdet[f] = 0;
                continue;
            }
            A.fdet[f] = TRIM_ALL;
        }
        A.fdet[f]++;
        A.fref[f]--;
        A.fview[f] ^= (uint32_t)v;
        A.gen_refs[A.gen]--;
        A.gen_det[A.gen]++;
        A.vmeta[v] |= VM_DETACHED;
        if (A.fref[f]) continue;
        A.fdet[f] &= ~TRIM_ALL;
        trimmed++;
        if (pk && f == pf + pk) {
            pk++;
            continue;
        }
        if (pk) punch_kept(pf, pk);
        pf = f, pk = 1;
    }
    if (pk) punch_kept(pf, pk);
    trim_last_views = views - trimmed;
    st_add(S_PAGES_TRIMMED, trimmed);
    st_add(S_TRIMS, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    st_add(S_TRIM_US, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
    errno = saved;
}

/* Pages were allocated: trims when enough were since the last trim: at least
 * ADVM_TRIM_KIB, twice the views the last trim left counted (each costs 8 bytes of
 * pagemap) and a quarter of the arena's high-water mark (its table is walked twice), so
 * that a trim costs little beside the page faults of what was allocated. Lock held. */
void trim_count(uint64_t pages) {
    if (!trim_every) return;
    trim_since += pages;
    if (trim_since >= trim_every && trim_since >= 2 * trim_last_views && trim_since >= A.va_high / 4) trim_views();
}

/* ---- blocks ----------------------------------------------------------------------- */

/* Maps fresh zeroed memory at [v, v+n) (a new block or a grown tail). */
int map_fresh(uint64_t v, uint64_t n) {
    void *a = page_addr(v);
    size_t len = n << A.pshift;
    int fd = A.mode == MODE_COW && cow_fresh_memfd ? cur_fd() : -1;
    if (fd >= 0) {
        int64_t f = ext_alloc(&A.fd, (uint32_t)n);
        if (f < 0) fd = -1;
        else if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)((uint64_t)f << A.pshift)) ==
                 MAP_FAILED) {
            ext_free(&A.fd, (uint32_t)f, (uint32_t)n);
            maps_failed();
            return -1;
        } else {
            for (uint64_t i = 0; i < n; i++) {
                A.vmeta[v + i] = VM_MAPPED | ((uint64_t)A.gen << VM_GEN_SHIFT) | ((uint64_t)f + i);
                A.fref[f + i] = 1;
                A.fview[f + i] = (uint32_t)(v + i);
            }
            A.gen_refs[A.gen] += n;
        }
    }
    if (fd < 0) {
        if (A.mode == MODE_COW && cow_fresh_memfd) st_add(S_GENS_EXHAUSTED, 1);
        if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
            maps_failed();
            return -1;
        }
        if (A.mode == MODE_KSM) madvise(a, len, MADV_MERGEABLE);
        else if (thp_wanted(n)) madvise(a, len, MADV_HUGEPAGE);
        for (uint64_t i = 0; i < n; i++) A.vmeta[v + i] = VM_MAPPED | VM_ANON;
    }
    seg_mapped(v, n);
    if (v + n > A.va_high) A.va_high = v + n;
    return 0;
}

/* Gives [v, v+n) back to the reservation (PROT_NONE) and drops its pages. */
void unmap_pages(uint64_t v, uint64_t n) {
    mmap(page_addr(v), n << A.pshift, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    unref_pages(v, n);
    for (uint64_t i = 0; i < n; i++) A.vmeta[v + i] = 0;
    prot_set(v, n, 0);
    bits_set(A.forkbits, v, n, 0);
    seg_mapped(v, n);
}

/* Length of the run of pages starting at v (at most max) that one mmap could map:
 * the same kind, generation and sharing, consecutive memfd pages. */
uint64_t run_len(uint64_t v, uint64_t max) {
    uint64_t m = A.vmeta[v] & ~(VM_HEAD | VM_NPAGES_MASK);
    uint64_t k = 1;
    while (k < max) {
        uint64_t mk = A.vmeta[v + k] & ~(VM_HEAD | VM_NPAGES_MASK);
        uint64_t want = (m & VM_ANON) ? m : m + k;
        if (mk != want) break;
        k++;
    }
    return k;
}

/* Pages needed for size bytes; at least MAX_BLOCK_PAGES (which every caller refuses)
 * when rounding up would overflow: realloc(p, SIZE_MAX) once wrapped to 0 pages and was
 * taken for a shrink. */
static uint64_t pages_for(size_t size) {
    if (size > SIZE_MAX - (A.ps - 1)) return MAX_BLOCK_PAGES;
    return (size + A.ps - 1) >> A.pshift;
}

/* Makes [v, v+n) a live block and counts it (reused: it came from the free table). */
static void *hand_out(uint64_t v, uint64_t n, int reused, int dirty) {
    set_head(v, n);
    st_add(S_BLOCKS, 1);
    if (reused) st_add(S_CACHE_HITS, 1);
    if (dirty) st_add(S_DIRTY_HITS, 1);
    st_add(S_BLOCK_BYTES, n << A.pshift);
    live_add((int64_t)(n << A.pshift));
    return page_addr(v);
}

/* Returns a block of at least size bytes; *dirty says whether it may hold old bytes. */
void *block_alloc(size_t size, int *dirty) {
    decay();
    uint64_t n = pages_for(size);
    *dirty = 0;
    if (n == 0 || n >= MAX_BLOCK_PAGES) return NULL;
    uint64_t v;
    trim_count(n);
    int took = fb_take(n, dirty, &v) == 0;
    if (thp_wanted(n)) kept_after_huge();
    if (took) return hand_out(v, n, 1, *dirty);
    if (!budget_ok()) return NULL;
    int64_t nv = ext_alloc(&A.va, (uint32_t)n);
    if (nv < 0) return NULL;
    if (map_fresh((uint64_t)nv, n) != 0) {
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    st_add(S_PAGES_FRESH, n);
    return hand_out((uint64_t)nv, n, 0, 0);
}

/* The block whose head is p, or -1 (a pointer into the arena that is not a block). */
int64_t block_of(const void *p) {
    if (((uintptr_t)p & (A.ps - 1)) != 0) return -1;
    uint64_t v = page_of(p);
    return (A.vmeta[v] & VM_HEAD) ? (int64_t)v : -1;
}

void bad_pointer(const char *what) {
    say("advm-preload: ");
    say(what);
    say(": pointer inside the arena is not the start of a live block\n");
    abort();
}

void release_block(uint64_t v, uint64_t n) {
    unmap_pages(v, n);
    if (A.retired) munmap(page_addr(v), n << A.pshift); /* nothing reserved any more */
    else ext_free(&A.va, (uint32_t)v, (uint32_t)n);
}

/* ---- address-space limits -----------------------------------------------------------
 * The reservation (64 GiB PROT_NONE) counts against RLIMIT_AS and the tables (260 MiB
 * of MAP_NORESERVE memory, read-write) against RLIMIT_AS and RLIMIT_DATA, whether
 * touched or not: a program that lowered either limit to a size glibc's heap lives
 * with got NULL from every malloc that had to map memory, small ones included. */

/* Whether this process has a finite RLIMIT_AS or RLIMIT_DATA. */
int limits_finite(void) {
    struct rlimit as, data;
    return getrlimit(RLIMIT_AS, &as) != 0 || getrlimit(RLIMIT_DATA, &data) != 0 || as.rlim_cur != RLIM_INFINITY ||
           data.rlim_cur != RLIM_INFINITY;
}

/* Unmaps [p, p + len) rounded out to pages: the part of a table nothing will index. */
static void trim(void *p, size_t keep, size_t len) {
    uintptr_t from = ((uintptr_t)p + keep + A.ps - 1) & ~(uintptr_t)(A.ps - 1), to = (uintptr_t)p + len;
    if (from < to) munmap((void *)from, to - from);
}

/* The program lowered a limit (setrlimit): from now on every new block and copy is
 * glibc's, and the arena keeps only its live blocks. The free table's blocks and the
 * reservation around the live blocks are unmapped, and the tables are cut down to the
 * pages the live blocks use. A live block is unmapped when freed. (Lock held.) */
void retire_arena(void) {
    if (A.retired) return;
    cache_flush();
    uint64_t top = 0, v = 0, fd_top = 0;
    while (v < A.va_high) {
        if (A.vmeta[v] & VM_HEAD) {
            uint64_t n = head_pages(v);
            for (uint64_t i = v; i < v + n; i++)
                if ((A.vmeta[i] & VM_MAPPED) && !(A.vmeta[i] & VM_ANON) && (A.vmeta[i] & VM_FPAGE_MASK) >= fd_top)
                    fd_top = (A.vmeta[i] & VM_FPAGE_MASK) + 1;
            v += n;
            top = v;
            continue;
        }
        uint64_t s = v;
        while (v < A.va_high && !(A.vmeta[v] & VM_HEAD)) v++;
        munmap(page_addr(s), (v - s) << A.pshift);
    }
    munmap(page_addr(A.va_high), (ARENA_PAGES - A.va_high) << A.pshift);
    trim(A.vmeta, top * sizeof(uint64_t), sizeof(uint64_t) * ARENA_PAGES);
    trim(A.protbits, (top + 63) / 64 * sizeof(uint64_t), ARENA_PAGES / 8);
    trim(A.forkbits, (top + 63) / 64 * sizeof(uint64_t), ARENA_PAGES / 8);
    trim(A.segbits, (top + 64) / 64 * sizeof(uint64_t), ARENA_PAGES / 8);
    trim(A.fref, fd_top * sizeof(uint32_t), sizeof(uint32_t) * ARENA_PAGES);
    trim(A.fview, fd_top * sizeof(uint32_t), sizeof(uint32_t) * ARENA_PAGES);
    trim(A.fdet, fd_top * sizeof(uint32_t), sizeof(uint32_t) * ARENA_PAGES);
    A.va_high = top;
    arena_len = top << A.pshift; /* what lies above may be anybody's mapping now */
    A.retired = 1;
    A.threshold = 0; /* malloc & co. test it before anything else */
    copy_min = SIZE_MAX;
}

/* Moves the pages of block [v, v+old) to [nv, nv+old), run by run, with mremap. */
static int move_pages(uint64_t v, uint64_t nv, uint64_t old) {
    uint64_t i = 0;
    while (i < old) {
        uint64_t k = run_len(v + i, old - i);
        if (!budget_ok() || mremap(page_addr(v + i), k << A.pshift, k << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED,
                                   page_addr(nv + i)) == MAP_FAILED) {
            /* put back what moved; the caller copies instead */
            uint64_t j = 0;
            while (j < i) {
                uint64_t kj = run_len(v + j, i - j);
                mremap(page_addr(nv + j), kj << A.pshift, kj << A.pshift, MREMAP_MAYMOVE | MREMAP_FIXED,
                       page_addr(v + j));
                j += kj;
            }
            if (i) mmap(page_addr(nv), i << A.pshift, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            return -1;
        }
        seg_mapped(nv + i, k);
        i += k;
    }
    /* the old range is a hole now: reserve it again at once */
    mmap(page_addr(v), old << A.pshift, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    view_moved(v, nv, old);
    for (uint64_t j = 0; j < old; j++) {
        A.vmeta[nv + j] = A.vmeta[v + j] & ~(VM_HEAD | VM_NPAGES_MASK);
        A.vmeta[v + j] = 0;
        /* mremap moved the protection and the fork marks too */
        prot_set(nv + j, 1, (A.protbits[(v + j) >> 6] >> ((v + j) & 63)) & 1);
        bits_set(A.forkbits, nv + j, 1, (A.forkbits[(v + j) >> 6] >> ((v + j) & 63)) & 1);
        prot_set(v + j, 1, 0);
        bits_set(A.forkbits, v + j, 1, 0);
    }
    seg_mapped(v, old);
    if (nv + old > A.va_high) A.va_high = nv + old;
    return 0;
}

/* realloc of an arena block; NULL when the caller must allocate and copy. */
void *block_realloc(void *p, size_t size) {
    int64_t sv = block_of(p);
    if (sv < 0) bad_pointer("realloc");
    uint64_t v = (uint64_t)sv, old = head_pages(v), n = pages_for(size);
    if (n == old) return p;
    if (n < old) {
        unmap_pages(v + n, old - n);
        ext_free(&A.va, (uint32_t)(v + n), (uint32_t)(old - n));
        set_head(v, n);
        st_add(S_REALLOC_SHRINK, 1);
        live_add(-(int64_t)((old - n) << A.pshift));
        return p;
    }
    if (n >= MAX_BLOCK_PAGES || !budget_ok()) return NULL;
    if (ext_claim(&A.va, (uint32_t)(v + old), (uint32_t)(n - old))) {
        if (map_fresh(v + old, n - old) != 0) {
            ext_free(&A.va, (uint32_t)(v + old), (uint32_t)(n - old));
            return NULL;
        }
        st_add(S_PAGES_FRESH, n - old);
        set_head(v, n);
        st_add(S_REALLOC_INPLACE, 1);
        live_add((int64_t)((n - old) << A.pshift));
        return p;
    }
    int64_t nv = ext_alloc(&A.va, (uint32_t)n);
    if (nv < 0) return NULL;
    if (map_fresh((uint64_t)nv + old, n - old) != 0) {
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    if (move_pages(v, (uint64_t)nv, old) != 0) {
        unmap_pages((uint64_t)nv + old, n - old);
        ext_free(&A.va, (uint32_t)nv, (uint32_t)n);
        return NULL;
    }
    st_add(S_PAGES_FRESH, n - old);
    ext_free(&A.va, (uint32_t)v, (uint32_t)old);
    set_head((uint64_t)nv, n);
    st_add(S_REALLOC_MREMAP, 1);
    live_add((int64_t)((n - old) << A.pshift));
    return page_addr((uint64_t)nv);
}
