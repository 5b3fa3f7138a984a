/* freecache.c: the free table. Freed single-owner blocks keep their mapping (and, within
 * dirty_cap, their pages) for the next allocation; decay gives unused pages back. */
#include "shim.h"

/* Freed single-owner blocks keep their mapping, in one table sorted by address: a freed
 * block merges with free neighbours, and a request takes the best fit and leaves the
 * rest, as glibc's heap does. The next allocation then costs no mmap and no VMA split,
 * and the newest keep their pages (see dirty_cap and decay), so that a program that
 * frees and allocates in a loop (R between collections) does not fault and zero every
 * page again. Per-size bins (the first design) left the freed pages of one size unused
 * while another size was faulted fresh: on ml_lssvm.R, 85,000 faulted pages against
 * 23,000 with this table (replayed allocation trace). */
static struct freeblk fb[FREE_SLOTS];
int fb_n;
uint64_t dirty_pages, dirty_floor_pages, dirty_live_pct;

/* Milliseconds of a coarse monotonic clock (vDSO: no syscall, no allocation). */
static uint32_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint32_t)((uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000);
}

/* Freed memory kept with its pages: up to dirty_live_pct of the peak live arena bytes,
 * at least the floor. glibc keeps all freed memory below its heap top; a fixed cap made
 * programs that free and reallocate more than it between collections (R) fault and
 * zero every page again (ml_lssvm.R: 3.7x glibc's page faults at 4 MiB). The peak, not
 * the current live size: a collection frees most of the heap at once, right before the
 * program allocates it again. What stays unused is returned by the decay. */
uint64_t dirty_cap(void) {
    uint64_t peak = __atomic_load_n(&stats[S_PEAK_BYTES], __ATOMIC_RELAXED) >> A.pshift;
    uint64_t c = peak / 100 * dirty_live_pct;
    return c > dirty_floor_pages ? c : dirty_floor_pages;
}

/* Whether a freed block of n pages keeps its pages (within the cap). One that asks for
 * transparent huge pages gives them back at free by default: kept for the ordinary
 * decay, they were most of what the arena held above untouched R (b25_matrix.R: 15
 * points of R's memory; over the 11 R workloads of `advm bench r`, 92.6% -> 88.2% of
 * untouched R on the cgroup meter), and faulting such a block in again costs one fault
 * per 2 MiB, not 512. With huge_decay_ms (ADVM_HUGE_DECAY_MS) it keeps them until the
 * next allocation of such a block, at most that long: a program that frees one and
 * allocates the same size right after (R: a collection, then the allocation that asked
 * for it) then does not zero fresh huge pages each time, where glibc reuses its heap
 * (at 20 ms: system time 150% of untouched R's instead of 163%, memory 88.9% instead of
 * 87.5%; docs/run.md, "Where vcopy's time goes"). Its mapping is kept either way. */
int keeps_pages(uint64_t n) { return !thp_wanted(n) || huge_decay_ms; }

/* Whether the table may hold pages of a block that asks for huge pages (kept_after_huge
 * gives them back). */
static int huge_kept;

void cache_flush(void) {
    for (int i = 0; i < fb_n; i++) release_block(fb[i].start, fb[i].len);
    fb_n = 0;
    dirty_pages = 0;
}

/* Returns the memory of a single-owner block whose mapping stays (run by run: a freed
 * copy is shared memfd pages between anonymous partial first and last pages). */
static int give_back(uint64_t v, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint64_t m = A.vmeta[v + i], r = run_len(v + i, n - i);
        int fd = (m & VM_ANON) ? -1 : gen_fd((int)((m & VM_GEN_MASK) >> VM_GEN_SHIFT));
        /* a shared run whose memfd the program closed: the mapping punches it instead */
        int rc = (m & VM_ANON) ? madvise(page_addr(v + i), r << A.pshift, MADV_DONTNEED)
                 : fd >= 0     ? fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_of(m), (off_t)(r << A.pshift))
                               : madvise(page_addr(v + i), r << A.pshift, MADV_REMOVE);
        if (rc != 0) return rc;
        i += r;
    }
    st_add(S_PAGES_RETURNED, n);
    return 0;
}

/* Whether [v, v+n) has one owner: every page anonymous or a shared mapping (a shared
 * memfd page is only ever mapped by the block that owns it). */
int single_owner(uint64_t v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t m = A.vmeta[v + i];
        if (!(m & VM_MAPPED) || ((m & VM_PRIV) && !(m & VM_ANON))) return 0;
    }
    return 1;
}

static int fb_mergeable(const struct freeblk *a, const struct freeblk *b) {
    return a->start + a->len == b->start && a->dirty == b->dirty && a->huge == b->huge && !a->mixed && !b->mixed &&
           (uint64_t)a->len + b->len < MAX_BLOCK_PAGES;
}

static void fb_remove(int i) {
    if (fb[i].dirty) dirty_pages -= fb[i].len;
    for (int j = i; j + 1 < fb_n; j++) fb[j] = fb[j + 1];
    fb_n--;
}

/* Merges entry i with its neighbours where they fit together; returns its new index. */
static int fb_merge(int i) {
    if (i + 1 < fb_n && fb_mergeable(&fb[i], &fb[i + 1])) {
        fb[i].len += fb[i + 1].len;
        if (fb[i + 1].time > fb[i].time) fb[i].time = fb[i + 1].time;
        fb[i + 1].dirty = 0; /* its pages stay counted, in fb[i] now */
        fb_remove(i + 1);
    }
    if (i > 0 && fb_mergeable(&fb[i - 1], &fb[i])) {
        fb[i - 1].len += fb[i].len;
        if (fb[i].time > fb[i - 1].time) fb[i - 1].time = fb[i].time;
        fb[i].dirty = 0; /* its pages stay counted, in fb[i - 1] now */
        fb_remove(i);
        i--;
    }
    return i;
}

/* The table entry for the free single-owner range [v, v+n), now (its head bits may be
 * set or not: run_len ignores them). */
struct freeblk fb_entry(uint64_t v, uint64_t n, int dirty) {
    int plain = run_len(v, n) == n && (A.vmeta[v] & VM_ANON);
    struct freeblk e = {(uint32_t)v, (uint32_t)n, now_ms(), (uint8_t)dirty, (uint8_t)(plain && thp_wanted(n)),
                        (uint8_t)!plain};
    return e;
}

/* Caches the free single-owner range e (its pages counted as kept when e.dirty);
 * -1 when the table is full. */
int fb_insert(struct freeblk e) {
    int lo = 0, hi = fb_n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (fb[mid].start < e.start) lo = mid + 1;
        else hi = mid;
    }
    if (fb_n == FREE_SLOTS) return -1;
    for (int j = fb_n; j > lo; j--) fb[j] = fb[j - 1];
    fb[lo] = e;
    fb_n++;
    if (e.dirty) dirty_pages += e.len;
    if (e.dirty && e.huge) huge_kept = 1;
    fb_merge(lo);
    return 0;
}

/* Whether page v is in a free-table entry: 1 and *to = the entry's end, or 0 and *to =
 * the start of the next entry (UINT64_MAX when none follows). */
int fb_at(uint64_t v, uint64_t *to) {
    int lo = 0, hi = fb_n;
    while (lo < hi) { /* the first entry starting after v */
        int mid = (lo + hi) / 2;
        if (fb[mid].start <= v) lo = mid + 1;
        else hi = mid;
    }
    if (lo > 0 && (uint64_t)fb[lo - 1].start + fb[lo - 1].len > v) {
        *to = (uint64_t)fb[lo - 1].start + fb[lo - 1].len;
        return 1;
    }
    *to = lo < fb_n ? fb[lo].start : UINT64_MAX;
    return 0;
}

/* Takes n pages from the table: the best fit among the entries holding pages (no fault,
 * no zeroing: what glibc's heap gets), else among those without, of the same THP
 * kind. A bigger entry is carved: its first n pages are taken, the rest stays. */
int fb_take(uint64_t n, int *dirty, uint64_t *v) {
    uint8_t huge = (uint8_t)thp_wanted(n);
    int best = -1;
    for (int i = 0; i < fb_n; i++) {
        if (fb[i].len < n || (!fb[i].dirty && fb[i].huge != huge)) continue;
        if (best < 0 || fb[i].dirty > fb[best].dirty || (fb[i].dirty == fb[best].dirty && fb[i].len < fb[best].len))
            best = i;
    }
    if (best < 0) return -1;
    *v = fb[best].start;
    *dirty = fb[best].dirty;
    if (fb[best].len == n) {
        fb_remove(best);
    } else {
        fb[best].start += (uint32_t)n;
        fb[best].len -= (uint32_t)n;
        if (*dirty) dirty_pages -= n;
    }
    return 0;
}

/* Returns the memory of entry i (its mapping stays cached); its new index, or -1 when
 * the memory could not be returned. */
static int fb_give_back(int i) {
    if (!fb[i].dirty || give_back(fb[i].start, fb[i].len) != 0) return -1;
    fb[i].dirty = 0;
    dirty_pages -= fb[i].len;
    return fb_merge(i);
}

/* Returns the oldest kept memory; 0 when there was some. */
static int fb_give_back_oldest(void) {
    int old = -1;
    for (int i = 0; i < fb_n; i++)
        if (fb[i].dirty && (old < 0 || fb[i].time < fb[old].time)) old = i;
    return old >= 0 && fb_give_back(old) >= 0 ? 0 : -1;
}

/* Freed memory not reused within ADVM_DIRTY_DECAY_MS (default 250; 0 = kept until the
 * cap pushes it out) is given back: a program that stops allocating does not sit on
 * garbage, while one that frees and allocates in a loop keeps reusing warm pages. 250
 * rather than 1000 ms: over the 11 R workloads of `advm bench r`, 1.4-2.1 points less
 * memory (of untouched R) and no measurable change in CPU time.
 * Checked on arena calls only (no thread of our own), at most every decay/4. */
uint32_t decay_ms = 250, huge_decay_ms;
static uint32_t last_sweep;

/* How long entry e keeps its pages unused. */
static uint32_t decay_of(const struct freeblk *e) { return e->huge && huge_decay_ms ? huge_decay_ms : decay_ms; }

void decay(void) {
    if (!dirty_pages) return;
    uint32_t every = huge_decay_ms && (!decay_ms || huge_decay_ms < decay_ms) ? huge_decay_ms : decay_ms;
    if (!every) return;
    uint32_t now = now_ms();
    if (now - last_sweep < every / 4 + 1) return;
    last_sweep = now;
    for (int i = 0; i < fb_n; i++) {
        uint32_t d = decay_of(&fb[i]);
        if (fb[i].dirty && d && now - fb[i].time >= d) {
            int j = fb_give_back(i);
            if (j >= 0) i = j; /* merged: go on after it */
        }
    }
}

/* After an allocation that asks for huge pages (served first, from kept pages if any
 * fit): the huge blocks' pages still kept are given back. What that allocation did not
 * take would otherwise sit until the decay, through whatever the program computes next:
 * kept for 20 ms without this rule, b25_vector.R held 5 points more of untouched R's
 * memory (one sweep). */
void kept_after_huge(void) {
    if (!huge_kept) return;
    huge_kept = 0;
    for (int i = 0; i < fb_n; i++)
        if (fb[i].dirty && fb[i].huge) {
            int j = fb_give_back(i);
            if (j >= 0) i = j;
        }
}

void block_free(void *p) {
    decay();
    int64_t sv = block_of(p);
    if (sv < 0) bad_pointer("free");
    uint64_t v = (uint64_t)sv, n = head_pages(v);
    live_add(-(int64_t)(n << A.pshift));
    /* one owner: keep the mapping (and within the cap, the pages) for reuse */
    if (fb_n < FREE_SLOTS && !A.retired && single_owner(v, n) && !prot_any(v, n)) {
        uint64_t cap = keeps_pages(n) ? dirty_cap() : 0;
        while (cap && dirty_pages + n > cap && fb_give_back_oldest() == 0) {
        }
        int dirty = dirty_pages + n <= cap;
        if (dirty || give_back(v, n) == 0) {
            A.vmeta[v] &= ~(VM_HEAD | VM_NPAGES_MASK);
            if (fb_insert(fb_entry(v, n, dirty)) == 0) return;
        }
    }
    release_block(v, n);
}

