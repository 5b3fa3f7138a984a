//! The full collection: parallel LISP2 mark-compact.
//!
//! 1. **Mark** from the roots, on `gc_threads` threads sharing work through
//!    work-stealing deques (one thread alone: a plain stack). A large object's mark is
//!    its header word 0's top bit; a small object's is a side bitmap ([`MarkMap`], one
//!    bit per 16-byte granule) in which a marked object sets the bits of every granule
//!    it covers.
//! 2. **Forward**: a prefix sum of the bitmap's population counts ([`LiveMap`]) gives
//!    every live small object its new address (the live bytes below it): nothing is
//!    written to the heap. The small space is cut into units of about [`UNIT`] bytes
//!    at object starts the allocator recorded. Large objects are forwarded in address
//!    order within their own space, into header word 1.
//! 3. **Adjust**: every root and every large object's slots are rewritten to the new
//!    addresses; the small objects' slots in the next phase.
//! 4. **Move**: units in parallel; unit k starts once every lower unit whose old
//!    objects lie under k's destination has finished (they cannot be overwritten
//!    before they moved), then per run of adjacent live objects adjusts their slots in
//!    place and moves the run by one memmove (a pointer is forwarded from the bitmap,
//!    not from its target, so each object is visited once, adjust and move together).
//!    Large objects slide in one `advm::remap::Batch`: page remapping at or above the
//!    break-even, memmove below it or with the memmove engine.
//!
//! Then the freed tails of both spaces go to the free hook, if any.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use advm::mem::{page_align_up, page_size, HostAddr, PageRange};
use advm::remap::{Batch, Choice, Options};
use crossbeam_deque::{Injector, Stealer, Worker};

use crate::heap::{large_align, lock, nptrs_of, size_of, Alloc, Inner, ALIGN, HDR, MARK};
use crate::pool::Pool;
use crate::raw::{Mem, Span};
use crate::stats::Collection;
use crate::{Engine, Error, Result};

/// Bytes of the small space per parallel unit.
const UNIT: usize = 256 << 10;
/// After compaction, an object start is recorded at least this often, for the next
/// collection's units.
pub(crate) const GRANULE: usize = 64 << 10;

/// The marks of the small space's objects: one bit per [`ALIGN`] bytes (a granule) of
/// `[base, top)`, set for every granule a marked object covers, header included. A
/// small object's header is not written to mark it, so an object that keeps its place
/// (the dense prefix, see [`full`]) is written by no phase. Because the bits cover
/// whole objects, the live bytes below any address are a population count, and so is
/// every object's new address ([`LiveMap::to`]): no forwarding word is written or read
/// for small objects, a pointer is forwarded from this bitmap (1/128 of the space, in
/// cache) instead of from its target's header (a cache miss each), and each run of
/// adjacent live objects moves by one memmove without reading their headers again.
/// The first granule's bit doubles as the mark: it is set first (by one thread), the
/// rest when the object is scanned. Large objects carry their mark in their header.
struct MarkMap {
    base: usize,
    top: usize,
    words: Vec<AtomicU64>,
    /// The used part of the large space, `[start, end)`: any other header address is
    /// no object of this heap.
    large: (usize, usize),
    /// The page size less one (large objects start on pages).
    page_mask: usize,
}

impl MarkMap {
    fn new(base: usize, top: usize, large: (usize, usize)) -> Self {
        let words = ((top - base) / ALIGN).div_ceil(64);
        MarkMap { base, top, words: (0..words).map(|_| AtomicU64::new(0)).collect(), large, page_mask: page_size() - 1 }
    }

    /// A header outside the small space must be a large object's: in the used part
    /// of the large space, on a page. Else the pointer is not an object (a slot the
    /// program wrote directly): marking it would write a mark bit into whatever lies
    /// there, or fault (the drifting old generation's reservation is `PROT_NONE`
    /// outside its window), so the collection fails instead.
    #[inline]
    fn check_large(&self, h: usize) {
        assert!(
            h >= self.large.0 && h < self.large.1 && h & self.page_mask == 0,
            "a slot holds {:#x}, not an object of this heap",
            h.wrapping_add(HDR)
        );
    }

    /// True when the object whose header is at `h` is marked (after marking: the
    /// referent of a weak root is kept when it is).
    fn marked(&self, mem: &Mem, h: usize) -> bool {
        if h >= self.base && h < self.top {
            let (b, w) = self.bit(h);
            w.load(Ordering::Relaxed) & b != 0
        } else {
            self.check_large(h);
            mem.load(h) & MARK != 0
        }
    }

    /// Marks the object whose header is at `h`; true when it was not marked before.
    fn mark(&self, mem: &Mem, h: usize) -> bool {
        if h >= self.base && h < self.top {
            let (b, w) = self.bit(h);
            w.fetch_or(b, Ordering::Relaxed) & b == 0
        } else {
            self.check_large(h);
            mem.fetch_or(h, MARK) & MARK == 0
        }
    }

    /// Sets the bits of the granules after the first of the marked object at `h` of
    /// `size` bytes (nothing for a large object). `alone`: plain loads and stores (no
    /// other thread marks); else `fetch_or`, since objects share bitmap words.
    fn cover(&self, h: usize, size: usize, alone: bool) {
        if h < self.base || h >= self.top {
            return;
        }
        assert!(size >= HDR && size <= self.top - h, "broken header at {h:#x} (size {size})");
        let g = (h - self.base) / ALIGN;
        self.set(g + 1, g + size / ALIGN, alone);
    }

    /// Sets the bits of granules `[g, end)`.
    #[inline]
    fn set(&self, mut g: usize, end: usize, alone: bool) {
        // most objects lie inside one word: one mask, no loop
        if g < end && end - g < 64 && g % 64 + (end - g) <= 64 {
            let m = ((1u64 << (end - g)) - 1) << (g % 64);
            let word = &self.words[g / 64];
            if alone {
                word.store(word.load(Ordering::Relaxed) | m, Ordering::Relaxed);
            } else {
                word.fetch_or(m, Ordering::Relaxed);
            }
            return;
        }
        while g < end {
            let (w, lo) = (g / 64, g % 64);
            let hi = (end - w * 64).min(64);
            let m = if hi - lo == 64 { !0 } else { ((1u64 << (hi - lo)) - 1) << lo };
            let word = &self.words[w];
            if alone {
                word.store(word.load(Ordering::Relaxed) | m, Ordering::Relaxed);
            } else {
                word.fetch_or(m, Ordering::Relaxed);
            }
            g = w * 64 + hi;
        }
    }

    /// The bit of the header at `h` and its word.
    fn bit(&self, h: usize) -> (u64, &AtomicU64) {
        let b = (h - self.base) / ALIGN;
        (1 << (b % 64), &self.words[b / 64])
    }
}

/// The mark bitmap after marking, with each word's count of marked granules below it:
/// where every live small object goes. Word `i` is `(bits, granules marked in words
/// 0..i)`, side by side so that forwarding a pointer reads one cache line.
struct LiveMap {
    base: usize,
    /// Where the small space's live data starts after the compaction.
    to: usize,
    table: Vec<(u64, u64)>,
    /// Pinned objects: (granule of the header, free granules left below it and every
    /// earlier pinned one), ascending. An object at or above such a granule goes that
    /// many granules higher than the live bytes below it say, so that the pinned
    /// object's new address is its own and the objects above it slide down to its
    /// end. Empty without pins (one branch in [`LiveMap::to`]).
    pads: Vec<(usize, usize)>,
}

impl LiveMap {
    /// `to`: the new bottom of the small space.
    fn new(marks: MarkMap) -> Self {
        let mut below = 0u64;
        let table = marks
            .words
            .into_iter()
            .map(|w| {
                let bits = w.into_inner();
                let e = (bits, below);
                below += u64::from(bits.count_ones());
                e
            })
            .collect();
        LiveMap { base: marks.base, to: marks.base, table, pads: Vec::new() }
    }

    /// Keeps the pinned objects whose headers are at `pinned` (ascending, marked, in
    /// the small space) in place, once `to` is set (at the space's bottom or below:
    /// the live data below a pinned object fits below it). Returns the free ranges
    /// `(start, len)` left below pinned objects: the caller makes them filler objects
    /// once everything moved, so the space parses.
    fn pin(&mut self, pinned: &[usize]) -> Vec<(usize, usize)> {
        let mut free = Vec::new();
        let mut pad = 0;
        for &h in pinned {
            let g = (h - self.base) / ALIGN;
            let at = self.to + ALIGN * (self.below(g) + pad);
            assert!(at <= h, "pinned object {:#x} would move up to {at:#x}", h + HDR);
            if at < h {
                free.push((at, h - at));
                pad += (h - at) / ALIGN;
                self.pads.push((g, pad));
            }
        }
        free
    }

    /// Granules added below granule `g` for pinned objects. Not inlined: kept out of
    /// [`LiveMap::to`]'s code, which every pointer of a compaction goes through (inlined,
    /// the move phase of gcbench's 0.7 MiB heap took 15 µs instead of 11 with no pin).
    #[inline(never)]
    fn pad(&self, g: usize) -> usize {
        match self.pads.partition_point(|p| p.0 <= g) {
            0 => 0,
            i => self.pads[i - 1].1,
        }
    }

    /// Where the data after the last live object ends (pinned objects' free space
    /// included).
    fn end(&self) -> usize {
        self.to + ALIGN * (self.live_granules() + self.pads.last().map_or(0, |p| p.1))
    }

    /// Marked granules below granule `g`.
    #[inline]
    fn below(&self, g: usize) -> usize {
        match self.table.get(g / 64) {
            Some(&(bits, n)) => n as usize + (bits & ((1u64 << (g % 64)) - 1)).count_ones() as usize,
            None => self.live_granules(),
        }
    }

    /// Every marked granule.
    fn live_granules(&self) -> usize {
        self.table.last().map_or(0, |&(bits, n)| n as usize + bits.count_ones() as usize)
    }

    /// The new address of the live object (or run of them) whose header is at `h`.
    #[inline]
    fn to(&self, h: usize) -> usize {
        let g = (h - self.base) / ALIGN;
        let below = self.below(g);
        let below = if self.pads.is_empty() { below } else { below + self.pad(g) };
        self.to + ALIGN * below
    }

    /// The address of the first unmarked granule from the bottom (the end of the dense
    /// prefix), at most `top`.
    fn first_gap(&self, top: usize) -> usize {
        let g = self
            .table
            .iter()
            .position(|&(bits, _)| bits != !0)
            .map_or(self.table.len() * 64, |w| w * 64 + (!self.table[w].0).trailing_zeros() as usize);
        (self.base + g * ALIGN).min(top)
    }

    /// The first granule in `[g, limit)` whose bit is `set`.
    fn next(&self, g: usize, limit: usize, set: bool) -> Option<usize> {
        let word = |w: usize| if set { self.table[w].0 } else { !self.table[w].0 };
        let mut w = g / 64;
        let mut m = word(w) & (!0u64 << (g % 64));
        loop {
            if m != 0 {
                let r = w * 64 + m.trailing_zeros() as usize;
                return (r < limit).then_some(r);
            }
            w += 1;
            if w * 64 >= limit {
                return None;
            }
            m = word(w);
        }
    }

    /// Calls `f(start, end)` for every run of adjacent marked objects in `[start, end)`
    /// (their headers and bytes: `[start, end)` of each run), in address order. A run
    /// is cut where a pinned object starts: the objects on either side move by
    /// different distances.
    fn runs(&self, (start, end): (usize, usize), mut f: impl FnMut(usize, usize)) {
        let (mut g, limit) = ((start - self.base) / ALIGN, (end - self.base) / ALIGN);
        while g < limit {
            let Some(s) = self.next(g, limit, true) else { return };
            let mut e = self.next(s, limit, false).unwrap_or(limit);
            if !self.pads.is_empty() {
                let i = self.pads.partition_point(|p| p.0 <= s);
                if let Some(&(p, _)) = self.pads.get(i).filter(|p| p.0 < e) {
                    e = p;
                }
            }
            f(self.base + s * ALIGN, self.base + e * ALIGN);
            g = e;
        }
    }
}

/// Objects whose headers are prefetched ahead of the one a lone marker scans.
const PREFETCH: usize = 8;

/// Marks everything reachable from `roots` on this thread alone; returns the number of
/// live objects. Objects are marked when they leave the stack (a plain load and store:
/// no other thread marks), after passing through a queue of [`PREFETCH`] whose
/// headers were prefetched on entry, so the cache misses of a pointer graph overlap
/// instead of stalling each scan. Not inlined, and a small object's header, slots and
/// bitmap word are read through slices bounds-checked once for the whole space: the
/// loop is instruction-bound where the objects lie in order (a list), and inlined into
/// [`full`] its stack and counters lived in memory.
#[inline(never)]
fn mark_alone(mem: &Mem, marks: &MarkMap, roots: &[usize]) -> u64 {
    let span = marks.top - marks.base;
    let small = mem.words(marks.base, span / 8);
    let bits = &marks.words[..];
    let mut stack: Vec<usize> = roots.iter().copied().filter(|&r| r != 0).collect();
    stack.reserve(1024);
    let mut queue = [0usize; PREFETCH];
    let (mut head, mut len, mut n) = (0, 0, 0u64);
    loop {
        while len < PREFETCH {
            let Some(o) = stack.pop() else { break };
            mem.prefetch(o - HDR);
            queue[(head + len) % PREFETCH] = o;
            len += 1;
        }
        if len == 0 {
            return n;
        }
        let o = queue[head];
        head = (head + 1) % PREFETCH;
        len -= 1;
        let h = o - HDR;
        let off = h.wrapping_sub(marks.base);
        let slots = if off < span {
            let g = off / ALIGN;
            let word = &bits[g / 64];
            let v = word.load(Ordering::Relaxed);
            if v & 1 << (g % 64) != 0 {
                continue;
            }
            let i = off / 8;
            let h0 = small[i].load(Ordering::Relaxed);
            let size = size_of(h0);
            assert!(size >= HDR && size <= span - off, "broken header at {h:#x} (size {size})");
            let granules = size / ALIGN;
            // most objects lie inside one bitmap word: one mask
            if granules < 64 && g % 64 + granules <= 64 {
                word.store(v | ((1u64 << granules) - 1) << (g % 64), Ordering::Relaxed);
            } else {
                marks.set(g, g + granules, true);
            }
            let first = i + HDR / 8;
            small.get(first..first + nptrs_of(h0)).expect("pointer slots inside the object")
        } else {
            marks.check_large(h);
            let h0 = mem.load(h);
            if h0 & MARK != 0 {
                continue;
            }
            mem.store(h, h0 | MARK);
            mem.words(o, nptrs_of(h0))
        };
        n += 1;
        for p in slots {
            let p = p.load(Ordering::Relaxed);
            if p != 0 {
                stack.push(p);
            }
        }
    }
}

/// Sets a phase's end flag when a job panics out of it, so that the other jobs stop
/// waiting for it and the panic reaches the collecting thread.
struct EndOnPanic<'a>(&'a AtomicBool);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// Marks everything reachable from `roots`; returns the number of live objects.
/// Threads share work through work-stealing deques. No counter is touched per object:
/// a thread counts its own objects, and termination is an active count that a thread
/// raises when it starts and before it steals again after going idle, and lowers when
/// it found no work anywhere (its own deque is empty then, and an idle thread pushes
/// nothing): at zero every deque is empty and nobody scans, and the first thread to
/// see it ends the phase. A thread that was not running yet (the pool's jobs start as
/// threads wake; on a busy machine one may wait milliseconds for a CPU) does not hold
/// the others up: it is not counted until it starts, and leaves at once if the phase
/// ended before it did.
fn mark(mem: &Mem, marks: &MarkMap, roots: &[usize], pool: &Pool, threads: usize) -> u64 {
    if threads == 1 {
        return mark_alone(mem, marks, roots);
    }
    let injector = Injector::new();
    for &r in roots {
        if r != 0 && marks.mark(mem, r - HDR) {
            injector.push(r);
        }
    }
    // Threads scanning or about to look for work; a thread counts itself in when it
    // starts and whenever it goes back to stealing, out when it found no work.
    let active = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let live = AtomicU64::new(0);
    let workers: Vec<Worker<usize>> = (0..threads).map(|_| Worker::new_lifo()).collect();
    let stealers: Vec<Stealer<usize>> = workers.iter().map(|w| w.stealer()).collect();
    // each job takes its own deque by its index
    let workers: Vec<Mutex<Option<Worker<usize>>>> = workers.into_iter().map(|w| Mutex::new(Some(w))).collect();
    let steal = |w: &Worker<usize>| {
        std::iter::repeat_with(|| {
            injector.steal_batch_and_pop(w).or_else(|| stealers.iter().map(|s| s.steal_batch_and_pop(w)).collect())
        })
        .find(|s| !s.is_retry())
        .and_then(|s| s.success())
    };
    let run = |w: Worker<usize>| {
        active.fetch_add(1, Ordering::SeqCst);
        if done.load(Ordering::SeqCst) {
            // started after the others finished (the thread was busy or descheduled)
            active.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        // A job that panics (a slot holding something that is not an object) ends
        // the phase for all: the others would wait for it to go idle for ever.
        let _end_on_panic = EndOnPanic(&done);
        let mut n = 0u64;
        'work: loop {
            while let Some(o) = w.pop().or_else(|| steal(&w)) {
                n += 1;
                let h0 = mem.load(o - HDR);
                marks.cover(o - HDR, size_of(h0), false);
                for i in 0..nptrs_of(h0) {
                    let p = mem.load(o + 8 * i);
                    if p != 0 && marks.mark(mem, p - HDR) {
                        w.push(p);
                    }
                }
            }
            active.fetch_sub(1, Ordering::SeqCst);
            loop {
                if done.load(Ordering::SeqCst) {
                    break 'work;
                }
                if active.load(Ordering::SeqCst) == 0 {
                    done.store(true, Ordering::SeqCst);
                    break 'work;
                }
                if !injector.is_empty() || stealers.iter().any(|s| !s.is_empty()) {
                    active.fetch_add(1, Ordering::SeqCst);
                    continue 'work;
                }
                std::hint::spin_loop();
                std::thread::yield_now();
            }
        }
        live.fetch_add(n, Ordering::Relaxed);
    };
    pool.run(threads, |i| run(lock(&workers[i]).take().expect("one deque per job")));
    live.into_inner()
}

/// Units `[start, end)` of the small space, cut at recorded object starts.
fn units(starts: &[usize], top: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut cur: Option<usize> = None;
    for &a in starts {
        match cur {
            None => cur = Some(a),
            Some(s) if a - s >= UNIT => {
                out.push((s, a));
                cur = Some(a);
            }
            Some(_) => {}
        }
    }
    if let Some(s) = cur {
        if s < top {
            out.push((s, top));
        }
    }
    out
}

/// The measured costs of moving one large object (microseconds), from
/// `advm::remap`'s break-even measurement.
#[derive(Debug, Clone)]
pub(crate) struct MoveCosts {
    /// (pages, memmove, batch of page moves) per object sliding into space the one
    /// before it vacated, ascending by pages (`BreakEven::compaction`).
    points: Vec<(usize, f64, f64)>,
    /// memmove's median per-page rate over `points` (see [`Self::at`]).
    copy_us_per_page: f64,
    /// Per page of a destination that holds pages: freeing it before a page move
    /// (`MADV_DONTNEED`); also what a copy into emptied space pays per page to fault
    /// it in again.
    pub(crate) populated_us_per_page: f64,
}

impl MoveCosts {
    /// `None` when the break-even was set rather than measured (no curves).
    pub(crate) fn from_break_even(be: &advm::remap::BreakEven) -> Option<Self> {
        let points: Vec<_> = be.compaction.iter().map(|p| (p.pages, p.memmove_us, p.batch_us)).collect();
        // The largest point of the single-move curve measured both ways: the extra a
        // populated destination costs, per page.
        let last = be.curve.iter().rev().find(|p| p.uffd_move_populated_us > 0.0 && p.uffd_move_us > 0.0)?;
        let populated_us_per_page = ((last.uffd_move_populated_us - last.uffd_move_us) / last.pages as f64).max(0.0);
        (!points.is_empty()).then(|| MoveCosts::new(points, populated_us_per_page))
    }

    /// Costs from measured `points` (not empty, ascending by pages).
    fn new(points: Vec<(usize, f64, f64)>, populated_us_per_page: f64) -> Self {
        let mut rates: Vec<f64> = points.iter().map(|q| q.1 / q.0.max(1) as f64).collect();
        rates.sort_by(f64::total_cmp);
        let copy_us_per_page = rates[rates.len() / 2];
        MoveCosts { points, copy_us_per_page, populated_us_per_page }
    }

    /// (memmove, page move) of an object of `pages` pages. memmove: `pages` times the
    /// median per-page rate of the measured sizes (a copy costs in proportion to its
    /// length; one slow point of a measurement on a busy machine, such as 1.4 µs a page
    /// at 511 pages against 0.35-0.43 at the others, must not make every object near
    /// it look expensive to copy). Page moves: interpolated between the measured sizes
    /// (a call's fixed cost fades with the size), in proportion outside them.
    fn at(&self, pages: usize) -> (f64, f64) {
        let p = &self.points;
        let copy = pages as f64 * self.copy_us_per_page;
        let i = p.partition_point(|q| q.0 < pages);
        let scaled = |q: (usize, f64, f64)| q.2 * pages as f64 / q.0.max(1) as f64;
        let remap = if i == 0 {
            scaled(p[0])
        } else if i == p.len() {
            scaled(p[i - 1])
        } else {
            let (a, b) = (p[i - 1], p[i]);
            a.2 + (pages - a.0) as f64 / (b.0 - a.0) as f64 * (b.2 - a.2)
        };
        (copy, remap)
    }
}

/// The parts of `[s, e)` outside the union of `vacated` (ascending, disjoint).
fn uncovered(vacated: &[(usize, usize)], s: usize, e: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = s;
    for &(vs, ve) in &vacated[vacated.partition_point(|v| v.1 <= s)..] {
        if vs >= e {
            break;
        }
        if vs > at {
            out.push((at, vs));
        }
        at = at.max(ve);
    }
    if at < e {
        out.push((at, e));
    }
    out
}

/// How a compaction moves its large objects.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LargePlan {
    /// Per move: as pages (else copied).
    pub(crate) as_pages: Vec<bool>,
    /// (move, start, end): dead pages under that move's destination, parked (moved
    /// above the large space) before the move and put back into `tail` after all of
    /// them, so the heap keeps its pages as with memmove instead of freeing them and
    /// faulting them in again at the next allocations.
    pub(crate) parked: Vec<(usize, usize, usize)>,
    /// Where the parked pages go: the parts of the freed tail that page moves vacated,
    /// ascending; at least as long as the parked pages.
    pub(crate) tail: Vec<(usize, usize)>,
    /// The measured costs' estimate (µs; 0 without costs).
    pub(crate) cost_us: f64,
}

/// One way to move a compaction's large objects (`park`: page moves into space that
/// holds dead pages park them first). `None` when parking is asked and the vacated
/// tail cannot take the parked pages back.
fn plan_page_moves(
    moves: &[(usize, usize, usize)],
    (into_vacated, into_populated): (usize, usize),
    costs: Option<&MoveCosts>,
    park: bool,
) -> Option<LargePlan> {
    let ps = page_size();
    let pmd = advm::remap::PMD_SIZE;
    let mut vacated: Vec<(usize, usize)> = Vec::new(); // sources of page moves, ascending
    let mut plan = LargePlan::default();
    for (i, &(to, from, len)) in moves.iter().enumerate() {
        if to == from {
            plan.as_pages.push(false);
            continue;
        }
        // The part of the destination the object's own old pages do not cover.
        let (s, e) = (to, (to + len).min(from));
        let dead = uncovered(&vacated, s, e);
        let populated: usize = dead.iter().map(|d| d.1 - d.0).sum();
        let pages = len / ps;
        let aligned = len % pmd == 0 && to % pmd == 0 && from % pmd == 0;
        let as_pages = aligned || pages >= if populated == 0 { into_vacated } else { into_populated };
        // An aligned move exchanges page tables (mremap): the dead pages go to its
        // source at no extra cost, so it never parks them.
        let parks = park && !aligned;
        if let Some(c) = costs {
            let (copy, remap) = c.at(pages);
            plan.cost_us += match (as_pages, parks) {
                // two moves per dead range: out, and back into the tail
                (true, true) => remap + dead.iter().map(|d| 2.0 * c.at((d.1 - d.0) / ps).1).sum::<f64>(),
                (true, false) => remap + c.populated_us_per_page * (populated / ps) as f64,
                (false, _) => copy + c.populated_us_per_page * ((e - s - populated) / ps) as f64,
            };
        }
        if as_pages {
            if parks {
                plan.parked.extend(dead.iter().map(|d| (i, d.0, d.1)));
            }
            // A page-table move into space that still holds pages exchanges them
            // (mremap): its source then holds the dead pages, and a later move into it
            // would have to free them. Other page moves leave their source empty.
            if populated == 0 || !aligned {
                match vacated.last_mut() {
                    Some(last) if last.1 == from => last.1 = from + len,
                    _ => vacated.push((from, from + len)),
                }
            }
        }
        plan.as_pages.push(as_pages);
    }
    if park {
        let new_top = moves.last().map_or(0, |m| m.0 + m.2);
        plan.tail = vacated.iter().filter(|v| v.1 > new_top).map(|v| (v.0.max(new_top), v.1)).collect();
        let room: usize = plan.tail.iter().map(|t| t.1 - t.0).sum();
        if plan.parked.iter().map(|p| p.2 - p.1).sum::<usize>() > room {
            return None;
        }
    }
    Some(plan)
}

/// How a compaction's large objects move, chosen for the whole compaction:
/// 2 MiB-aligned objects as pages always (whole page tables move, whatever the
/// destination holds); into space earlier page moves of this compaction vacated,
/// objects at the compaction break-even (measured for a batch of objects sliding into
/// vacated space, where a UFFDIO_MOVE per object competes with a memmove that streams
/// through them). Into space that still holds (dead) pages two plans are costed with
/// the measured curves:
/// - copy there (the break-even for a populated destination: no size below 2 MiB wins
///   alone), so the objects after it slide into populated space too;
/// - move as pages anyway, parking the dead pages above the large space first and
///   putting them back into the vacated tail at the end (two page moves each, instead
///   of freeing them inside the pause and faulting them in again at the next
///   allocations). Every later object of the slide then lands in vacated space.
///
/// The cheaper estimate wins, so a compaction moves pages only where its estimate is
/// below memmove's. Not merged: adjacent objects sliding together would become one
/// overlapping slide, moved entry by entry, where each aligned object alone is a
/// page-table move.
pub(crate) fn page_moves(moves: &[(usize, usize, usize)], be: (usize, usize), costs: Option<&MoveCosts>) -> LargePlan {
    let copying = plan_page_moves(moves, be, costs, false).expect("a plan that parks nothing");
    if costs.is_none() || be.1 <= be.0 {
        return copying;
    }
    match plan_page_moves(moves, (be.0, be.0), costs, true) {
        Some(parking) if parking.cost_us < copying.cost_us => parking,
        _ => copying,
    }
}

/// Full collection with the world stopped.
pub(crate) fn full(inner: &Inner, why: &str) -> Result<Collection> {
    let mem = inner.mem;
    let threads = inner.pool.threads();
    // pager regions move large objects by memmove (see paged.rs)
    let engine = if inner.paged.is_some() { Engine::Memmove } else { inner.engine() };
    let mut alloc = lock(&inner.alloc);
    let roots = lock(&inner.roots);
    let mut stacks: Vec<MutexGuard<'_, Vec<usize>>> = roots.stacks.iter().map(|s| lock(s)).collect();
    let mut weak: Vec<MutexGuard<'_, Vec<usize>>> = roots.weak_stacks.iter().map(|s| lock(s)).collect();
    // Pinned objects, ascending: roots that keep their place.
    let pins: Vec<usize> = lock(&inner.pins).keys().copied().collect();
    let small_pins: Vec<usize> =
        pins.iter().map(|p| p - HDR).filter(|&h| h >= alloc.small_bottom && h < alloc.small_top).collect();
    let index = lock(&inner.stats).totals.collections + 1;
    let mut c = Collection {
        index,
        engine,
        kind: "full",
        heap_before: alloc.used(&mem),
        decision: why.to_string(),
        ..Default::default()
    };

    // Starting GC threads costs more than it saves on a small heap (and on a busy
    // machine a thread may wait milliseconds for a CPU): small heaps collect on one
    // (large objects are few; their cost is the move).
    let threads = if alloc.small_top - alloc.small_bottom >= inner.parallel_from_bytes { threads } else { 1 };
    let t = Instant::now();
    let root_vals: Vec<usize> = stacks
        .iter()
        .flat_map(|s| s.iter().copied())
        .chain(roots.slots.iter().map(|s| s.load()))
        .chain(pins.iter().copied())
        .collect();
    let marks = MarkMap::new(alloc.small_bottom, alloc.small_top, (mem.large.base, alloc.large_top));
    c.live_objects = mark(&mem, &marks, &root_vals, &inner.pool, threads);
    // Weak roots whose objects were not marked are cleared; the others are adjusted
    // with the roots below.
    crate::heap::update_weak(&mut weak, &roots.weak_slots, |p| {
        if marks.marked(&mem, p - HDR) {
            p
        } else {
            c.weak_cleared += 1;
            0
        }
    });
    c.mark_ns = t.elapsed().as_nanos() as u64;

    let t = Instant::now();
    let us = units(&alloc.starts, alloc.small_top);
    let mut live = LiveMap::new(marks);
    // Generational mode may put the old generation elsewhere in its reservation.
    let total = live.live_granules() * ALIGN;
    // Pinned small objects keep the old generation where it lies.
    let new_small_bottom = if inner.generational.is_some() && small_pins.is_empty() {
        crate::nursery::place_old(inner, &alloc, total)
    } else {
        alloc.small_bottom
    };
    if let Some(drift) = &inner.drift {
        drift.cover(new_small_bottom)?;
    }
    live.to = new_small_bottom;
    let free_below_pins = live.pin(&small_pins);
    let new_small_top = live.end();
    inner.reuse(new_small_bottom, new_small_top - new_small_bottom);
    // Where each unit's live data goes.
    let dest: Vec<usize> = us.iter().map(|u| live.to(u.0)).collect();
    // The objects below the first gap keep their place (the dense prefix: data that
    // survived earlier collections sits at the bottom): adjust leaves pointers into the
    // prefix alone and move skips it, so of the long-lived data only marking it and
    // reading its slots are left.
    let in_place =
        if new_small_bottom == alloc.small_bottom { live.first_gap(alloc.small_top) } else { alloc.small_bottom };
    let stay = Span { base: alloc.small_bottom, end: in_place };
    c.bytes_in_place = (in_place - alloc.small_bottom) as u64;
    let mut large_moves = Vec::new(); // (dst, src, len) of every live large object
    let mut cursor = mem.large.base;
    for &h in &alloc.large {
        let h0 = mem.load(h);
        if h0 & MARK != 0 {
            cursor = cursor.next_multiple_of(large_align(size_of(h0)));
            // A pinned object stays; the ones above it slide down to its end.
            if !pins.is_empty() && pins.binary_search(&(h + HDR)).is_ok() {
                assert!(cursor <= h, "pinned large object {:#x} would move up", h + HDR);
                cursor = h;
            }
            mem.store(h + 8, cursor + HDR);
            large_moves.push((cursor, h, size_of(h0)));
            cursor += size_of(h0);
        }
    }
    let new_large_top = cursor;
    c.forward_ns = t.elapsed().as_nanos() as u64;

    // A pointer's new value: small objects from the live map, large ones from their
    // header word 1.
    let small = Span { base: alloc.small_bottom, end: alloc.small_top };
    let fwd = |p: usize| {
        if p == 0 || stay.contains_object(p) {
            p
        } else if small.contains_object(p) {
            live.to(p - HDR) + HDR
        } else {
            mem.load(p - HDR + 8)
        }
    };
    let adjust = |h: usize, h0: usize| {
        for i in 0..nptrs_of(h0) {
            let slot = h + HDR + 8 * i;
            let p = mem.load(slot);
            let q = fwd(p);
            if q != p {
                mem.store(slot, q);
            }
        }
    };
    // Roots and the large objects' slots here; the small objects' slots in the move
    // below, unit by unit, just before they move (nothing reads a small object's
    // contents to forward a pointer to it, so an object can be adjusted and moved in
    // one visit).
    let t = Instant::now();
    for &(_, h, _) in &large_moves {
        adjust(h, mem.load(h));
    }
    for s in stacks.iter_mut() {
        for v in s.iter_mut() {
            *v = fwd(*v);
        }
    }
    for s in &roots.slots {
        s.store(fwd(s.load()));
    }
    crate::heap::update_weak(&mut weak, &roots.weak_slots, fwd);
    c.adjust_ns = t.elapsed().as_nanos() as u64;

    let t = Instant::now();
    let done: Vec<AtomicBool> = us.iter().map(|_| AtomicBool::new(false)).collect();
    let next = AtomicUsize::new(0);
    let moved = inner.pool.run(threads, |_| {
        let (mut objs, mut bytes) = (0u64, 0u64);
        let mut recorded = Vec::new(); // (unit, the object starts it recorded)
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= us.len() {
                break;
            }
            // Lower units whose old objects lie under this unit's destination must
            // have moved first; they were claimed earlier and never wait for k.
            let first = us.partition_point(|u| u.1 <= dest[k]).min(k);
            for d in &done[first..k] {
                while !d.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
            }
            // Each run of adjacent live objects: adjust their slots in place, then one
            // memmove (they all move by the same distance) unless they keep their place.
            // A run's destination ends below the next run's source, and higher units
            // wait for this one, so no object is overwritten before it was visited.
            let (s, e) = us[k];
            let mut rec: Vec<usize> = Vec::new();
            live.runs((s, e), |rs, re| {
                let to = live.to(rs);
                let mut h = rs;
                let mut n = 0u64;
                // the run's words, bounds-checked once
                let words = mem.words(rs, (re - rs) / 8);
                while h < re {
                    let i = (h - rs) / 8;
                    let h0 = words[i].load(Ordering::Relaxed);
                    let size = size_of(h0);
                    assert!(size >= HDR && size <= re - h, "broken header at {h:#x} ({h0:#x})");
                    let d = to + (h - rs);
                    if rec.last().map_or(true, |&l| d - l >= GRANULE) {
                        rec.push(d);
                    }
                    let first = i + HDR / 8;
                    let slots = words.get(first..first + nptrs_of(h0)).expect("pointer slots inside the object");
                    for slot in slots {
                        let p = slot.load(Ordering::Relaxed);
                        let q = fwd(p);
                        if q != p {
                            slot.store(q, Ordering::Relaxed);
                        }
                    }
                    h += size;
                    n += 1;
                }
                if to != rs {
                    mem.copy(to, rs, re - rs);
                    objs += n;
                    bytes += (re - rs) as u64;
                }
            });
            recorded.push((k, rec));
            done[k].store(true, Ordering::Release);
        }
        (objs, bytes, recorded)
    });
    let mut recorded: Vec<(usize, Vec<usize>)> = Vec::with_capacity(us.len());
    let moved: Vec<(u64, u64)> = moved
        .into_iter()
        .map(|(o, b, r)| {
            recorded.extend(r);
            (o, b)
        })
        .collect();
    recorded.sort_unstable_by_key(|r| r.0);
    let recorded: Vec<Vec<usize>> = recorded.into_iter().map(|r| r.1).collect();
    for (o, b) in moved {
        c.objects_memmove += o;
        c.bytes_memmove += b;
    }
    // What pinned objects left free below them parses as filler objects, none above
    // the largest small object (or a retired buffer's filler) the verifier allows.
    let most = (inner.large_bytes - 1).max(inner.tlab_bytes) & !(ALIGN - 1);
    for &(mut a, mut len) in &free_below_pins {
        while len > 0 {
            let n = len.min(most);
            mem.store(a, crate::heap::header(n, 0));
            mem.store(a + 8, 0);
            (a, len) = (a + n, len - n);
        }
    }
    let tl = Instant::now();
    // Which objects move as pages: see `page_moves`.
    let mut batch = Batch::with_options(Options { engine: Choice::Auto, break_even_pages: Some(0), coalesce: false });
    let plan = if engine == Engine::Remap {
        page_moves(&large_moves, inner.break_even, inner.move_costs.as_ref())
    } else {
        LargePlan { as_pages: vec![false; large_moves.len()], ..Default::default() }
    };
    let (mut by_pages, mut by_copy) = (0u64, 0u64);
    // Parked dead pages: above the large space (its region is twice as long), in order.
    let mut parking = mem.large.end;
    let mut parked = plan.parked.iter().peekable();
    let mut stash: Vec<(usize, usize)> = Vec::new();
    for (i, (&(to, from, len), &pages)) in large_moves.iter().zip(&plan.as_pages).enumerate() {
        while let Some(&&(_, s, e)) = parked.peek().filter(|p| p.0 == i) {
            batch.push_move(HostAddr(parking), HostAddr(s), e - s);
            stash.push((parking, e - s));
            parking += e - s;
            parked.next();
        }
        if to == from {
            continue;
        }
        if pages {
            batch.push_move(HostAddr(to), HostAddr(from), len);
            by_pages += 1;
        } else {
            batch.push_move_by_copy(HostAddr(to), HostAddr(from), len);
            by_copy += 1;
        }
    }
    // The parked pages go back into the vacated tail (page_moves made sure it has room).
    let mut tail = plan.tail.iter().copied();
    let mut room = (0, 0);
    for (mut at, mut len) in stash {
        while len > 0 {
            if room.0 == room.1 {
                room = tail.next().expect("page_moves left room in the tail for every parked page");
            }
            let n = len.min(room.1 - room.0);
            batch.push_move(HostAddr(room.0), HostAddr(at), n);
            (room.0, at, len) = (room.0 + n, at + n, len - n);
        }
    }
    if !batch.is_empty() {
        match lock(&inner.large_region).as_mut() {
            Some(region) => {
                let out = region.run(&batch)?;
                c.bytes_parked = plan.parked.iter().map(|p| (p.2 - p.1) as u64).sum();
                c.bytes_remap = (out.uffd_move_bytes + out.mremap_bytes) as u64 - 2 * c.bytes_parked;
                c.bytes_memmove += out.memmove_bytes as u64;
                c.objects_remap = by_pages;
                c.objects_memmove += by_copy;
            }
            // a pager region: memmove (see paged.rs), in address order as they slide down
            None => {
                for &(to, from, len) in large_moves.iter().filter(|m| m.0 != m.1) {
                    mem.copy(to, from, len);
                    c.bytes_memmove += len as u64;
                    c.objects_memmove += 1;
                }
            }
        }
    }
    for &(to, _, _) in &large_moves {
        mem.store(to, mem.load(to) & !MARK);
        mem.store(to + 8, 0);
    }
    c.move_large_ns = tl.elapsed().as_nanos() as u64;
    c.move_ns = t.elapsed().as_nanos() as u64;

    let old_small = (alloc.small_bottom, alloc.small_top);
    let old_large_top = alloc.large_top;
    alloc.small_bottom = new_small_bottom;
    alloc.small_top = new_small_top;
    // In generational mode the to-space may lie above everything allocated so far:
    // once the old generation leaves it, allocation there must zero what it left
    // (new objects read stale bytes of earlier copies).
    alloc.small_clean = alloc.small_clean.max(new_small_top);
    alloc.large_top = new_large_top;
    alloc.large = large_moves.iter().map(|m| m.0).collect();
    alloc.starts = recorded.into_iter().flatten().collect();
    if inner.generational.is_some_and(|g| g.copy_back) && small_pins.is_empty() {
        let t = Instant::now();
        c.bytes_copied_back = crate::nursery::copy_back(inner, &mut alloc, &mut stacks, &mut weak, &roots);
        c.copy_back_ns = t.elapsed().as_nanos() as u64;
        c.bytes_memmove += c.bytes_copied_back;
    }
    c.heap_after = alloc.used(&mem);
    c.bytes_freed_pages = free_tails(inner, &alloc, old_small, old_large_top)?;
    if let Some(drift) = &inner.drift {
        drift.trim(alloc.small_bottom)?;
    }
    drop(stacks);
    drop(weak);
    if inner.verify {
        crate::verify::check(inner, &alloc, &roots, true).map_err(Error::Corrupt)?;
    }
    Ok(c)
}

/// Hands the whole pages that held old small objects and hold none now (the tail above
/// the new top; in generational mode also a from-space below the new place), and the
/// large space's freed tail, to the free hook. Without one the heap keeps them for its
/// next allocations (freeing them inside the pause costs about as much as copying
/// them, and allocation would fault them in again).
fn free_tails(inner: &Inner, alloc: &Alloc, (old_b, old_t): (usize, usize), old_large: usize) -> Result<usize> {
    let up = |a: usize| page_align_up(a).unwrap_or(a);
    let down = |a: usize| a & !(page_size() - 1);
    let (new_b, new_t) = (alloc.small_bottom, alloc.small_top);
    let mut hook = lock(&inner.free_hook);
    let mut freed = 0;
    let below = (up(old_b), down(old_t.min(new_b)));
    let above = (up(old_b.max(new_t)), up(old_t));
    for (s, e) in [below, above, (alloc.large_top, old_large)] {
        if e > s {
            let r = PageRange::new("freed pages", s, e - s)?;
            freed += r.len();
            inner.freed(&mut hook, r)?;
        }
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Heap, Mutator};

    /// A slot holding something that is not an object (a C caller's direct write) makes
    /// a parallel mark panic on a GC thread: the phase ends for every job, the panic
    /// reaches the collecting thread, the world restarts, and later collections fail
    /// with `Corrupt` instead of waiting for ever (the other jobs waited for the one
    /// that panicked to go idle; a second collection waited for the world to restart).
    #[test]
    fn a_panic_in_a_parallel_mark_fails_the_collection_and_breaks_the_heap() {
        let mut c = Config::new(16 << 20);
        c.gc_threads = 2;
        c.parallel_from_bytes = 0;
        let heap = Heap::with_config(c).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = heap.clone();
        std::thread::spawn(move || {
            let mut m = h.attach();
            let root = m.push_root(None);
            for _ in 0..20_000 {
                let next = m.root(root);
                let o = m.alloc(2, 8).unwrap();
                m.set(o, 0, next);
                m.set_root(root, Some(o));
            }
            let deep = (0..10_000).fold(m.root(root).unwrap(), |o, _| m.get(o, 0).unwrap());
            h.inner.mem.store(deep.addr() + 8, 0x1234);
            let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.collect().map(|_| ())));
            let second = m.collect().map(|_| ());
            let _ = tx.send((first.is_err(), format!("{second:?}")));
        });
        let (panicked, second) =
            rx.recv_timeout(std::time::Duration::from_secs(30)).expect("the collections waited for ever");
        assert!(panicked, "the junk slot was followed without a panic");
        assert!(second.starts_with("Err(Corrupt(\"an earlier collection of this heap panicked"), "{second}");
    }

    /// Random objects (sizes 16 B to 2 KiB, so some cross bitmap words) of which a
    /// random subset is marked by both markers: the live map's runs, new addresses and
    /// first gap agree with a plain walk of the marked objects.
    #[test]
    fn the_live_map_gives_every_marked_object_the_address_a_walk_of_the_marked_objects_gives() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..200 {
            let base = 0x10_0000usize;
            let mut objs = Vec::new(); // (header, size, marked)
            let mut a = base;
            let count = 1 + next(300) as usize;
            for i in 0..count {
                let size = ALIGN * (1 + next(if i % 7 == 0 { 128 } else { 6 }) as usize);
                // a dense prefix in some rounds
                let marked = (round % 3 == 0 && i < count / 4) || next(3) != 0;
                objs.push((a, size, marked));
                a += size;
            }
            let top = a;
            let marks = MarkMap::new(base, top, (0, 0));
            for (k, &(h, size, m)) in objs.iter().enumerate() {
                if !m {
                    continue;
                }
                if k % 2 == 0 {
                    // the lone marker's path: start and rest at once
                    let g = (h - base) / ALIGN;
                    marks.set(g, g + size / ALIGN, true);
                } else {
                    // the parallel marker's path: the start bit, then the rest
                    let (b, w) = marks.bit(h);
                    w.fetch_or(b, Ordering::Relaxed);
                    marks.cover(h, size, false);
                }
            }
            let mut live = LiveMap::new(marks);
            live.to = 0x4000_0000;
            // oracle: marked objects slide down in order; runs are maximal adjacent marked ones
            let mut to = live.to;
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for &(h, size, m) in &objs {
                if m {
                    assert_eq!(live.to(h), to, "round {round}: new address of {h:#x}");
                    to += size;
                    match runs.last_mut() {
                        Some(r) if r.1 == h => r.1 += size,
                        _ => runs.push((h, h + size)),
                    }
                }
            }
            assert_eq!(live.live_granules() * ALIGN, to - live.to, "round {round}: live bytes");
            let gap = objs.iter().find(|o| !o.2).map_or(top, |o| o.0);
            assert_eq!(live.first_gap(top), gap, "round {round}: first gap");
            let mut got = Vec::new();
            live.runs((base, top), |s, e| got.push((s, e)));
            assert_eq!(got, runs, "round {round}: runs");
            // a window cut at object starts sees the runs clipped to it
            let (i, j) = (next(count as u64) as usize, next(count as u64) as usize);
            let (lo, hi) = (objs[i.min(j)].0, objs[i.max(j)].0);
            let mut got = Vec::new();
            live.runs((lo, hi), |s, e| got.push((s, e)));
            let want: Vec<_> = runs.iter().map(|&(s, e)| (s.max(lo), e.min(hi))).filter(|&(s, e)| s < e).collect();
            assert_eq!(got, want, "round {round}: runs in [{lo:#x}, {hi:#x})");
        }
    }

    /// Costs under which page moves win at every size, and freeing a page costs a
    /// microsecond.
    fn pages_win() -> MoveCosts {
        MoveCosts::new(vec![(1, 1.0, 0.9), (512, 512.0, 60.0)], 1.0)
    }

    fn memmove_wins() -> MoveCosts {
        MoveCosts::new(vec![(1, 0.1, 2.0), (512, 50.0, 200.0)], 1.0)
    }

    #[test]
    fn a_slide_over_a_dead_object_is_costed_as_a_whole_and_parks_the_dead_pages_in_the_tail() {
        let ps = page_size();
        let p = |n: usize| 0x1000_0000 + n * ps;
        // [dead 4][live 4][live 4] -> both live objects slide down by 4 pages.
        let moves = [(p(0), p(4), 4 * ps), (p(4), p(8), 4 * ps)];
        // Copying into the dead object's place would leave every later object populated
        // space: the whole slide is copied.
        let copy = page_moves(&moves, (1, usize::MAX), Some(&memmove_wins()));
        assert_eq!(copy.as_pages, [false, false]);
        assert!(copy.parked.is_empty());
        // Where pages win, the first move parks the dead pages under its destination,
        // the second lands in the space the first vacated, and the parked pages go to
        // the vacated tail.
        let pages = page_moves(&moves, (1, usize::MAX), Some(&pages_win()));
        assert_eq!(pages.as_pages, [true, true]);
        assert_eq!(pages.parked, [(0, p(0), p(4))]);
        assert_eq!(pages.tail, [(p(8), p(12))]);
        // Without measured costs (a break-even set by hand) each object decides alone.
        let alone = page_moves(&moves, (1, usize::MAX), None);
        assert_eq!(alone.as_pages, [false, false]);
    }

    /// A 2 MiB-aligned move exchanges page tables, taking the dead pages to its source
    /// for free: parking them (two page moves each) made Sigverify's pauses 3x longer.
    #[test]
    fn an_aligned_move_over_dead_pages_parks_nothing() {
        let ps = page_size();
        let n = advm::remap::PMD_SIZE / ps;
        let p = |k: usize| 0x1000_0000 + k * ps;
        // [dead 2 MiB][live 2 MiB] -> the live object slides down by 2 MiB.
        let plan = page_moves(&[(p(0), p(n), n * ps)], (1, usize::MAX), Some(&pages_win()));
        assert_eq!(plan.as_pages, [true]);
        assert!(plan.parked.is_empty() && plan.tail.is_empty(), "{plan:?}");
    }

    #[test]
    fn parking_is_not_chosen_when_the_vacated_tail_cannot_take_the_dead_pages_back() {
        let ps = page_size();
        let p = |n: usize| 0x1000_0000 + n * ps;
        // [dead 4][live 4][live 2 (below the break-even: copied)]: the first object parks
        // 4 dead pages, the second is copied into 2 of the pages the first vacated, and
        // the vacated tail keeps only 2 pages.
        let moves = [(p(0), p(4), 4 * ps), (p(4), p(8), 2 * ps)];
        let plan = page_moves(&moves, (3, usize::MAX), Some(&pages_win()));
        assert!(plan.parked.is_empty(), "{plan:?}");
    }

    /// Pages of `[start, end)` present in this process (pagemap bit 63).
    fn present_pages(start: usize, end: usize) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let ps = page_size();
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start((start / ps * 8) as u64)).unwrap();
        let mut buf = vec![0u8; (end - start) / ps * 8];
        f.read_exact(&mut buf).unwrap();
        buf.chunks(8).filter(|c| c[7] >> 7 == 1).count()
    }

    #[test]
    fn large_objects_sliding_over_a_dead_one_move_as_pages_and_the_heap_keeps_the_dead_pages() {
        if !advm::remap::uffd_move_available() {
            eprintln!("skipped: no UFFDIO_MOVE here");
            return;
        }
        let ps = page_size();
        let mut c = Config::new(64 << 20);
        c.large_object_bytes = Some(16 * ps);
        c.verify = true;
        let mut heap = Heap::with_config(c).unwrap();
        {
            let inner = std::sync::Arc::get_mut(&mut heap.inner).expect("no mutator yet");
            // Copy into populated space when deciding alone; pages win as a whole.
            inner.break_even = (1, usize::MAX);
            inner.move_costs = Some(pages_win());
        }
        let base = heap.inner.mem.large.base;
        let mut m = heap.attach();
        let n = 32 * ps - HDR; // 32 pages with the header
        let fill = |m: &mut Mutator, o, seed: u8| {
            let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            m.write_bytes(o, 0, &bytes);
        };
        let dead = m.alloc(0, n).unwrap();
        fill(&mut m, dead, 0xff);
        let mut roots = Vec::new();
        for k in 0..6u8 {
            let o = m.alloc(0, n).unwrap();
            fill(&mut m, o, k);
            roots.push(m.push_root(Some(o)));
        }
        assert_eq!(present_pages(base, base + 7 * 32 * ps), 7 * 32);
        let c = m.collect().unwrap();
        assert_eq!(c.objects_remap, 6, "every survivor moved as pages: {c:?}");
        assert_eq!((c.bytes_remap, c.bytes_parked), (6 * 32 * ps as u64, 32 * ps as u64), "{c:?}");
        for (k, &r) in roots.iter().enumerate() {
            let o = m.root(r).unwrap();
            assert_eq!(o.addr(), base + k * 32 * ps + HDR);
            let mut got = vec![0u8; n];
            m.read_bytes(o, 0, &mut got);
            assert!(got.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(31) ^ k as u8), "object {k}");
        }
        // The dead object's pages were parked and put back in the freed tail: the heap
        // still holds all 7 objects' pages, as memmove would have left it.
        assert_eq!(present_pages(base, base + 7 * 32 * ps), 7 * 32, "{c:?}");
        assert_eq!(present_pages(base + 7 * 32 * ps, base + 14 * 32 * ps), 0);
        assert_eq!(
            present_pages(heap.inner.mem.large.end, heap.inner.mem.large.end + 32 * ps),
            0,
            "nothing left parked"
        );
    }

    #[test]
    fn random_large_objects_survive_repeated_collections_with_parked_dead_pages() {
        if !advm::remap::uffd_move_available() {
            eprintln!("skipped: no UFFDIO_MOVE here");
            return;
        }
        let ps = page_size();
        for seed in 1..=6u64 {
            let mut c = Config::new(32 << 20);
            c.large_object_bytes = Some(4 * ps);
            c.verify = true;
            let mut heap = Heap::with_config(c).unwrap();
            {
                let inner = std::sync::Arc::get_mut(&mut heap.inner).expect("no mutator yet");
                inner.break_even = (8, usize::MAX);
                inner.move_costs = Some(pages_win());
            }
            let mut m = heap.attach();
            let mut rng = seed;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            // (root, length, fill byte) of the live objects
            let mut live: Vec<(usize, usize, u8)> = Vec::new();
            let mut parked = 0;
            for round in 0..12 {
                for _ in 0..6 {
                    let n = (4 + next() as usize % 60) * ps - HDR - (next() as usize % 3) * 8;
                    let fill = next() as u8;
                    let o = m.alloc(0, n).unwrap();
                    m.write_bytes(o, 0, &vec![fill; n]);
                    if next() % 3 != 0 {
                        live.push((m.push_root(Some(o)), n, fill));
                    }
                }
                // drop some of the older ones
                for l in live.iter_mut() {
                    if next() % 4 == 0 {
                        m.set_root(l.0, None);
                        l.1 = 0;
                    }
                }
                live.retain(|l| l.1 > 0);
                let c = m.collect().unwrap();
                parked += c.bytes_parked;
                for &(r, n, fill) in &live {
                    let mut got = vec![0u8; n];
                    m.read_bytes(m.root(r).unwrap(), 0, &mut got);
                    assert!(got.iter().all(|&b| b == fill), "seed {seed} round {round}");
                }
                let end = heap.inner.mem.large.end;
                assert_eq!(present_pages(end, end + (4 << 20)), 0, "nothing left parked");
            }
            assert!(parked > 0, "seed {seed}: no collection parked dead pages");
        }
    }
}
