//! Virtual copy (the mmapcopy paper) on stock Linux: an arena of memfd-backed blocks.
//!
//! An [`Arena`] reserves one large `PROT_NONE` range and places page-aligned blocks in
//! it. Each block page is a *frame*: one page of a memfd, mapped either
//!
//! - **shared** (`MAP_SHARED`): the block is the page's only owner, writes go straight
//!   to the memfd page, no copy-on-write fault ever; or
//! - **private** (`MAP_PRIVATE`): the page may be seen by several blocks (virtual
//!   copies); reads see the memfd page, the first write gives this block its own
//!   anonymous copy (a copy-on-write fault) and nobody else sees it.
//!
//! A virtual copy turns source and destination frames into private views of the same
//! memfd pages: one `mmap` per run of contiguous pages, no byte copied. Reference
//! counts say when a memfd page is unused; it is then hole-punched. Frames and counts
//! are kept per extent (maximal runs in sorted maps, `extent::RunMap`), so the cost
//! of every call grows with the runs it touches, not with the pages.
//!
//! Copying a block that is itself a modified copy: its written (anonymous) pages are
//! found in `/proc/self/pagemap` and *re-homed* once into fresh memfd pages (one
//! `pwrite` per run), so the new copy shares them too instead of copying them again.
//!
//! Guarantees and limits:
//! - a memfd page is never written once two frames (or two processes) can see it:
//!   every view of a shared page is private;
//! - `fork`: a `pthread_atfork` handler turns every shared frame private in one pass
//!   (coalescing neighbouring blocks into one `mmap`) and retires the memfd, so parent
//!   and child never see each other's writes; retired memfd pages are never punched or
//!   reused (the other process may still read them) and the file is closed when this
//!   process no longer maps any of it;
//! - a VMA budget: a copy whose mappings would push the arena's VMA count over its
//!   budget is done by memcpy instead ([`Stats::fallback_vma_budget`]);
//! - copies of fewer than [`Config::small_block_pages`] whole pages, and copies whose
//!   source and destination are not page-congruent, are done by memcpy and counted.
//!
//! All state sits behind one mutex; every call is safe from any thread, and takes
//! that mutex only inside the fork gate (`fork.rs`), so a forked child never finds it
//! held by a thread the child does not have. A panic inside a call (a bug) leaves the
//! mutex poisoned and the state possibly half updated: every later call then fails
//! with [`Error::Unrecoverable`] instead of running on it.

mod extent;
mod fork;

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use std::time::Instant;

use serde::Serialize;

use crate::sys::mman::reservation::Reservation;
use crate::sys::mman::Share;
use crate::sys::pagemap::{Entry, Pagemap};
use crate::{Error, Result};
use extent::{Count, Extents, Run, RunMap};
pub use fork::ForkGate;

/// Default copy size, in whole pages, under which a copy is done by memcpy (the
/// paper's choice). Measured by `advm bench vcopy` (docs/vcopy.md): duplicating into
/// a new block by sharing beats memcpy from 1 page on (the new block's pages would
/// fault in anyway); copying into an existing, already written block beats memcpy in
/// time only from about 64 pages, but from 2 pages on it saves the destination's
/// memory, which is what a virtual copy is for.
pub const DEFAULT_SMALL_BLOCK_PAGES: usize = 2;

/// Arena settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address space reserved for blocks (bytes, rounded up to pages). Costs no memory.
    pub reserve_bytes: usize,
    /// Most VMAs the arena may create; `None`: half of what vm.max_map_count leaves
    /// after the mappings the process has when the arena is made.
    pub vma_budget: Option<usize>,
    /// Copies of fewer whole pages than this are done by memcpy.
    pub small_block_pages: usize,
    /// Move a copied source's old page tables aside and unmap them in a background
    /// thread (true), or unmap them in place during the copy (false).
    pub background_unmap: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            reserve_bytes: 256 << 30,
            vma_budget: None,
            small_block_pages: DEFAULT_SMALL_BLOCK_PAGES,
            background_unmap: true,
        }
    }
}

/// How a [`Arena::vcopy`] was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum CopyHow {
    /// Whole pages shared (copy-on-write); `copied_bytes` of partial first/last pages
    /// were copied.
    Shared {
        /// Pages now shared between source and destination.
        pages: usize,
        /// Bytes copied for partial first/last pages.
        copied_bytes: usize,
    },
    /// Copied by memcpy because `dst - src` is not a multiple of the page size.
    CopiedUnaligned,
    /// Copied by memcpy because fewer than [`Config::small_block_pages`] whole pages.
    CopiedSmall,
    /// Copied by memcpy because sharing would exceed the VMA budget.
    CopiedVmaBudget,
}

/// Arena statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Live blocks.
    pub blocks: u64,
    /// Bytes in live blocks (address space handed out).
    pub block_bytes: u64,
    /// Distinct memfd pages referenced by some block (an upper bound of the pages the
    /// arena holds; pages never written are not allocated by the kernel).
    pub memfd_pages_live: u64,
    /// Memory the arena's memfds really hold, from `st_blocks`.
    pub memfd_resident_bytes: u64,
    /// VMAs the arena's mappings make (upper bound: blocks' runs plus gaps).
    pub vmas: u64,
    /// The VMA budget.
    pub vma_budget: u64,
    /// Virtual copies requested.
    pub vcopies: u64,
    /// Pages shared by virtual copies (cumulative).
    pub pages_shared: u64,
    /// Bytes copied by memcpy, partial pages and fallbacks included (cumulative).
    pub bytes_copied: u64,
    /// Written pages of a copied source moved into fresh memfd pages (cumulative).
    pub pages_rehomed: u64,
    /// Copies done by memcpy because source and destination were not page-congruent.
    pub fallback_unaligned: u64,
    /// Copies done by memcpy because they were under the small-block threshold.
    pub fallback_small: u64,
    /// Copies (or parts) done by memcpy because of the VMA budget or a failed mmap.
    pub fallback_vma_budget: u64,
    /// Forks this arena was frozen for.
    pub forks: u64,
    /// Time the reaper thread spent unmapping the old mappings of copied sources:
    /// CPU moved off the copy's critical path, not saved (cumulative).
    pub deferred_unmap_ms: f64,
    /// Old mappings still waiting for the reaper.
    pub deferred_pending: u64,
    /// Memfds still open (the active one plus retired ones still mapped).
    pub memfds: u64,
    /// Small-block threshold in pages.
    pub small_block_pages: u64,
    /// Measured write fraction above which memcpy beats a virtual copy, when
    /// [`Arena::calibrate`] was run.
    pub crossover_write_fraction: Option<f64>,
}

/// One block page: which memfd page it shows, and how. In a [`RunMap`] it labels a
/// run: page `k` further on shows memfd page `page + k` of the same file, same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    page: u32,
    /// Index into `Inner::files` (a new memfd per fork: 65536 is plenty).
    file: u16,
    private: bool,
}

impl Frame {
    /// A page of a block being made by `dup`, not yet given its copy: unmapped
    /// (`PROT_NONE`), owns no memfd page. Never outlives the `dup` call.
    const UNBACKED: Frame = Frame { page: u32::MAX, file: u16::MAX, private: false };

    fn unbacked(&self) -> bool {
        self.file == u16::MAX
    }

    #[cfg(test)]
    fn follows(&self, prev: &Frame) -> bool {
        self.file == prev.file && self.private == prev.private && prev.page.checked_add(1) == Some(self.page)
    }
}

impl Run for Frame {
    fn advance(self, k: usize) -> Self {
        if self.unbacked() {
            self
        } else {
            Frame { page: self.page.wrapping_add(k as u32), ..self }
        }
    }

    /// An unbacked run is no mapping (it lies in the reservation's `PROT_NONE`).
    fn counted(&self) -> bool {
        !self.unbacked()
    }
}

/// A block: its frames per extent (one entry per mapping, whatever its length).
#[derive(Debug)]
struct Block {
    frames: RunMap<Frame>,
    pages: usize,
}

#[derive(Debug)]
struct MemFile {
    fd: OwnedFd,
    /// Reference counts per run of pages with the same count; unreferenced pages
    /// are absent.
    refs: RunMap<Count>,
    free: Extents,
    live: usize,
    /// Retired by a fork: never punched, never reused, closed when unused.
    retired: bool,
}

struct Inner {
    res: Arc<Reservation>,
    ps: usize,
    /// Live blocks by first page index in the reservation: the sorted region table.
    blocks: BTreeMap<usize, Block>,
    va: Extents,
    files: Vec<Option<MemFile>>,
    active: Option<u16>,
    run_vmas: usize,
    budget: usize,
    small: usize,
    stats: Stats,
    /// /proc/self/pagemap and the pid it was opened by (a forked child reopens it).
    pagemap: Option<(u32, Pagemap)>,
    /// False once `PAGEMAP_SCAN` failed (kernels before 6.7): whole reads instead.
    scan_works: bool,
    /// Old source mappings whose page tables a copy moved aside, waiting for the
    /// reaper thread to unmap them: (first reservation page, pages).
    pending: Vec<(usize, usize)>,
    /// The reaper thread and the pid it runs in (a forked child starts its own).
    reaper: Option<(u32, std::thread::Thread)>,
    /// False once moving page tables aside failed (kernels that refuse
    /// `MREMAP_DONTUNMAP` here): sources are unmapped in place.
    move_aside: bool,
    me: Weak<Shared>,
}

/// Source runs of at least this many pages (2 MiB) have their old page tables moved
/// aside and unmapped in the background when a copy turns them private; shorter runs
/// are unmapped in place. Blocks this large start on a 2 MiB boundary so whole page
/// tables move.
const DEFER_MIN_PAGES: usize = 512;

pub(crate) struct Shared {
    inner: Mutex<Inner>,
}

/// An arena of virtually copyable blocks. Cheap to clone (a handle); `Send + Sync`.
#[derive(Clone)]
pub struct Arena {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("stats", &self.stats()).finish()
    }
}

/// Calibration of this machine: what a virtual copy and its later writes cost
/// against memcpy, per page.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Calibration {
    /// Pages per measured block.
    pub pages: usize,
    /// memcpy into a fresh block, per page (faults of the destination included).
    pub memcpy_ns_per_page: f64,
    /// Virtual copy into a fresh block, per page.
    pub vcopy_ns_per_page: f64,
    /// Writing one byte to each page of a plain, already-owned page (no fault).
    pub plain_write_ns_per_page: f64,
    /// Writing one byte to each page of a virtual copy (one copy-on-write fault each).
    pub cow_write_ns_per_page: f64,
    /// The fraction of pages written after the copy at which memcpy and virtual copy
    /// cost the same; above it memcpy wins. 1.0 or more: virtual copy always wins.
    pub crossover_write_fraction: f64,
}

/// The arena state, locked, with the fork gate held (released in this order).
struct Locked<'a> {
    inner: MutexGuard<'a, Inner>,
    _gate: ForkGate,
}

impl Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

/// Locks the arena state for a call. A panic inside an earlier call may have left
/// it half updated (reference counts of a copy, frames of a block): refuse.
fn lock(shared: &Shared) -> Result<Locked<'_>> {
    let gate = ForkGate::hold();
    match shared.inner.lock() {
        Ok(inner) => Ok(Locked { inner, _gate: gate }),
        Err(_) => Err(Error::Unrecoverable {
            what: "the advm arena",
            why: "an earlier call panicked while changing it; its blocks stay mapped but it takes no further calls"
                .into(),
        }),
    }
}

/// Locks the arena state to read counters, poisoned or not.
fn lock_any(shared: &Shared) -> Locked<'_> {
    let gate = ForkGate::hold();
    Locked { inner: shared.inner.lock().unwrap_or_else(|e| e.into_inner()), _gate: gate }
}

fn invalid(what: &'static str, why: String) -> Error {
    Error::InvalidArgument { what, why }
}

/// A run of block pages: (first index, pages, frame of the first page).
type Piece = (usize, usize, Frame);

/// Appends `p` to `runs`, merged into the last run when it directly continues it.
fn push_run(runs: &mut Vec<Piece>, p: Piece) {
    if let Some((s, l, f)) = runs.last_mut() {
        if *s + *l == p.0 && f.advance(*l) == p.2 {
            *l += p.1;
            return;
        }
    }
    runs.push(p);
}

/// Lays the frame runs `fresh` out, in order, over the index `spans` (as many pages
/// in all): maximal runs `(index, len, frame)`.
fn lay_out(spans: &[(usize, usize)], fresh: &[(Frame, usize)]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut src = fresh.iter().copied();
    let mut cur: Option<(Frame, usize)> = None;
    for &(i, l) in spans {
        let mut at = i;
        while at < i + l {
            let (f, fl) = match cur.take() {
                Some(c) => c,
                None => src.next().expect("as many fresh pages as span pages"),
            };
            let take = fl.min(i + l - at);
            push_run(&mut out, (at, take, f));
            if fl > take {
                cur = Some((f.advance(take), fl - take));
            }
            at += take;
        }
    }
    out
}

/// Pages in both sorted, disjoint run lists `a` and `b`.
fn intersect(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (mut x, mut y) = (0, 0);
    let mut out = Vec::new();
    while x < a.len() && y < b.len() {
        let (s, e) = (a[x].0.max(b[y].0), (a[x].0 + a[x].1).min(b[y].0 + b[y].1));
        if s < e {
            out.push((s, e - s));
        }
        if a[x].0 + a[x].1 < b[y].0 + b[y].1 {
            x += 1;
        } else {
            y += 1;
        }
    }
    out
}

/// The pages of `run` in none of the sorted, disjoint `minus` runs.
fn subtract(run: (usize, usize), minus: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (mut at, end) = (run.0, run.0 + run.1);
    let mut out = Vec::new();
    for &(s, l) in minus {
        if s + l <= at || s >= end {
            continue;
        }
        if s > at {
            out.push((at, s - at));
        }
        at = at.max(s + l);
    }
    if at < end {
        out.push((at, end - at));
    }
    out
}

/// Number of maximal runs (one `mmap` / VMA each) in `frames`.
#[cfg(test)]
fn count_runs(frames: &[Frame]) -> usize {
    // an unbacked frame is in no run, and the frame after it starts one
    (0..frames.len()).filter(|&i| !frames[i].unbacked() && (i == 0 || !frames[i].follows(&frames[i - 1]))).count()
}

/// [`count_runs`] of the frames `get(0..len)`.
#[cfg(test)]
fn count_runs_by(len: usize, get: impl Fn(usize) -> Frame) -> usize {
    let mut runs = 0;
    let mut prev: Option<Frame> = None;
    for i in 0..len {
        let f = get(i);
        if !f.unbacked() && !prev.is_some_and(|p| f.follows(&p)) {
            runs += 1;
        }
        prev = Some(f);
    }
    runs
}

/// Maximal runs `(first index, len)` of `frames[from..to]` whose pages satisfy `pick`.
#[cfg(test)]
fn runs_where(frames: &[Frame], from: usize, to: usize, pick: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for i in from..to {
        if !pick(i) {
            continue;
        }
        match out.last_mut() {
            Some((s, l)) if *s + *l == i && frames[i].follows(&frames[i - 1]) => *l += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

fn process_vmas() -> usize {
    std::fs::read_to_string("/proc/self/maps").map(|s| s.lines().count()).unwrap_or(0)
}

impl Arena {
    /// An arena with the default [`Config`].
    pub fn new() -> Result<Self> {
        Self::with_config(Config::default())
    }

    /// An arena with `config`.
    pub fn with_config(config: Config) -> Result<Self> {
        let ps = crate::addr::page_size();
        let reserve = crate::addr::page_align_up(config.reserve_bytes)
            .filter(|&r| r > 0 && r / ps <= u32::MAX as usize)
            .ok_or_else(|| {
                invalid(
                    "reserve_bytes",
                    format!("{} must be between 1 byte and {} pages", config.reserve_bytes, u32::MAX),
                )
            })?;
        let budget = match config.vma_budget {
            Some(b) => b,
            None => {
                let max = crate::probe::facts().max_map_count as usize;
                max.saturating_sub(process_vmas()) / 2
            }
        };
        let res = Arc::new(Reservation::new(reserve)?);
        let small = config.small_block_pages.max(1);
        let inner = Inner {
            ps,
            va: Extents::new(reserve / ps),
            res,
            blocks: BTreeMap::new(),
            files: Vec::new(),
            active: None,
            run_vmas: 0,
            budget,
            small,
            stats: Stats { vma_budget: budget as u64, small_block_pages: small as u64, ..Default::default() },
            pagemap: None,
            scan_works: true,
            pending: Vec::new(),
            reaper: None,
            move_aside: config.background_unmap,
            me: Weak::new(),
        };
        let shared = Arc::new_cyclic(|me| {
            let mut inner = inner;
            inner.me = me.clone();
            Shared { inner: Mutex::new(inner) }
        });
        fork::register(&shared)?;
        Ok(Self { shared })
    }

    /// Allocates a block of `len` bytes (rounded up to whole pages), zero-filled,
    /// page aligned. Memory is allocated by the kernel only as pages are written.
    pub fn alloc(&self, len: usize) -> Result<*mut u8> {
        let mut g = lock(&self.shared)?;
        g.alloc(len)
    }

    /// Frees the block starting at `ptr`. Pages no other block shares are returned
    /// to the kernel (hole-punched) now.
    pub fn free(&self, ptr: *const u8) -> Result<()> {
        let mut g = lock(&self.shared)?;
        g.free(ptr as usize)
    }

    /// A new block of `len` bytes that is a virtual copy of `[src, src+len)`.
    pub fn dup(&self, src: *const u8, len: usize) -> Result<*mut u8> {
        let mut g = lock(&self.shared)?;
        g.find("src", src as usize, len)?;
        let dst = g.alloc_unbacked(len)?;
        match g.vcopy(dst, src as usize, len) {
            Ok(_) => Ok(dst as *mut u8),
            Err(e) => {
                let _ = g.free(dst);
                Err(e)
            }
        }
    }

    /// Makes `[dst, dst+len)` a copy of `[src, src+len)`, as memcpy would, sharing
    /// whole pages when `dst - src` is a multiple of the page size (partial first and
    /// last pages are copied) and copying otherwise. Both ranges must lie inside live
    /// blocks of this arena and must not overlap.
    pub fn vcopy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<CopyHow> {
        let mut g = lock(&self.shared)?;
        g.vcopy(dst as usize, src as usize, len)
    }

    /// Like [`Arena::vcopy`], but only whole pages and only by sharing (the paper's
    /// `mmapcopy`): addresses and length must be page aligned, and a copy that would
    /// have to fall back to memcpy (VMA budget) is still done, by memcpy, and reported.
    pub fn vcopy_pages(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<CopyHow> {
        crate::addr::PageRange::new("src", src as usize, len)?;
        crate::addr::PageRange::new("dst", dst as usize, len)?;
        self.vcopy(dst, src, len)
    }

    /// Says that `[ptr, ptr+len)` is about to be written: breaks copy-on-write for
    /// all its pages in one call instead of one fault per page.
    pub fn prepare_write(&self, ptr: *mut u8, len: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        let (start, end) = g.page_span("ptr", ptr as usize, len)?;
        if end > start {
            g.res.populate_write(start, end - start)?;
        }
        Ok(())
    }

    /// Returns to the kernel the memfd pages that every block sharing them has since
    /// rewritten (each holds its own copy, so nobody reads the shared page any more).
    /// Without this, a source and a copy that are both rewritten entirely hold three
    /// pages per page until one is freed or copied again. Costs one pagemap read of
    /// every private page. Returns the number of pages released.
    pub fn trim(&self) -> Result<u64> {
        let mut g = lock(&self.shared)?;
        g.trim()
    }

    /// Copies `data` into the arena at `dst` (inside one block).
    pub fn write(&self, dst: *mut u8, data: &[u8]) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("dst", dst as usize, data.len())?;
        Ok(g.res.write(dst as usize - g.res.base(), data)?)
    }

    /// Fills `[dst, dst+len)` (inside one block) with `byte`.
    pub fn fill(&self, dst: *mut u8, byte: u8, len: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("dst", dst as usize, len)?;
        Ok(g.res.fill(dst as usize - g.res.base(), len, byte)?)
    }

    /// Copies `[src, src+buf.len())` (inside one block) into `buf`.
    pub fn read(&self, src: *const u8, buf: &mut [u8]) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("src", src as usize, buf.len())?;
        Ok(g.res.read(src as usize - g.res.base(), buf)?)
    }

    /// The length in bytes of the block that starts at `ptr`.
    pub fn block_len(&self, ptr: *const u8) -> Result<usize> {
        let g = lock(&self.shared)?;
        let key = g.block_start("ptr", ptr as usize)?;
        Ok(g.blocks[&key].pages * g.ps)
    }

    /// True when `ptr` lies inside a live block of this arena (false for every
    /// pointer after a panic inside the arena).
    pub fn contains(&self, ptr: *const u8) -> bool {
        lock(&self.shared).is_ok_and(|g| g.find("ptr", ptr as usize, 0).is_ok())
    }

    /// Testing only (fault injection, never for use): panics while holding the arena's
    /// lock, as a bug part way through a call would. Every later call then fails
    /// with [`Error::Unrecoverable`]. The C API's `advm_vcopy_test_inject_panic`
    /// calls it.
    #[doc(hidden)]
    pub fn test_inject_panic(&self) {
        let _g = lock_any(&self.shared);
        panic!("advm arena: panic injected by test_inject_panic");
    }

    /// Current statistics. After a panic inside the arena ([`Error::Unrecoverable`]
    /// from every other call) they are the counters as the panic left them.
    pub fn stats(&self) -> Stats {
        Self::stats_of(&lock_any(&self.shared))
    }

    /// Current statistics, or [`Error::Unrecoverable`] after a panic inside the arena.
    pub fn try_stats(&self) -> Result<Stats> {
        Ok(Self::stats_of(&*lock(&self.shared)?))
    }

    fn stats_of(g: &Inner) -> Stats {
        let mut s = g.stats.clone();
        s.blocks = g.blocks.len() as u64;
        s.block_bytes = g.blocks.values().map(|b| (b.pages * g.ps) as u64).sum();
        s.vmas = g.vma_estimate() as u64;
        s.deferred_pending = g.pending.len() as u64;
        let files = g.files.iter().flatten();
        s.memfds = files.clone().count() as u64;
        s.memfd_pages_live = files.clone().map(|f| f.live as u64).sum();
        s.memfd_resident_bytes =
            files.map(|f| crate::sys::mman::reservation::allocated_bytes(&f.fd).unwrap_or(0)).sum();
        s
    }

    /// Measures memcpy, virtual copy and first-write costs on blocks of `pages`
    /// pages of this arena, stores the crossover write fraction in [`Stats`] and
    /// returns the calibration. Takes a few milliseconds per 1000 pages.
    pub fn calibrate(&self, pages: usize) -> Result<Calibration> {
        let ps = crate::addr::page_size();
        let pages = pages.max(self.stats().small_block_pages as usize);
        let len = pages * ps;
        let src = self.alloc(len)?;
        let result = (|| -> Result<Calibration> {
            self.fill(src, 0x5a, len)?;
            let mut memcpy = Vec::new();
            let mut vcopy = Vec::new();
            let mut plain = Vec::new();
            let mut cow = Vec::new();
            for _ in 0..3 {
                // memcpy into a fresh block (its pages fault in as memcpy writes them).
                let dst = self.alloc(len)?;
                let t = Instant::now();
                {
                    let g = lock(&self.shared)?;
                    let base = g.res.base();
                    g.res.copy(src as usize - base, dst as usize - base, len)?;
                }
                memcpy.push(t.elapsed().as_nanos() as f64);
                let t = Instant::now();
                self.touch_pages(dst, pages)?;
                plain.push(t.elapsed().as_nanos() as f64);
                self.free(dst)?;
                let t = Instant::now();
                let copy = self.dup(src, len)?;
                vcopy.push(t.elapsed().as_nanos() as f64);
                let t = Instant::now();
                self.touch_pages(copy, pages)?;
                cow.push(t.elapsed().as_nanos() as f64);
                self.free(copy)?;
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2] / pages as f64
            };
            let (m, v, p, c) = (med(&mut memcpy), med(&mut vcopy), med(&mut plain), med(&mut cow));
            // vcopy + f*(cow) = memcpy + f*(plain)  =>  f = (memcpy - vcopy) / (cow - plain)
            let crossover = if c > p { ((m - v) / (c - p)).max(0.0) } else { f64::INFINITY };
            Ok(Calibration {
                pages,
                memcpy_ns_per_page: m,
                vcopy_ns_per_page: v,
                plain_write_ns_per_page: p,
                cow_write_ns_per_page: c,
                crossover_write_fraction: crossover,
            })
        })();
        self.free(src)?;
        let cal = result?;
        lock(&self.shared)?.stats.crossover_write_fraction = Some(cal.crossover_write_fraction);
        Ok(cal)
    }

    /// Writes one byte in each of the first `pages` pages at `ptr`.
    fn touch_pages(&self, ptr: *mut u8, pages: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        let off = ptr as usize - g.res.base();
        for i in 0..pages {
            g.res.fill(off + i * g.ps, 1, 0xa5)?;
        }
        Ok(())
    }
}

impl Inner {
    fn vma_estimate(&self) -> usize {
        // each block's runs, plus the reserved gaps around blocks and moved-aside maps
        self.run_vmas + self.blocks.len() + 1 + 2 * self.pending.len()
    }

    /// Maps `n` pages at reservation page `page` onto `file` from `file_page`. With
    /// `move_aside`, a long run's old page tables are first moved to a scratch range
    /// (cheap, nothing unmapped) that the reaper thread unmaps later: a copy does not
    /// wait for a GiB of page-table entries to be torn down.
    ///
    /// Between the move and the new mapping the old mapping stays in place with
    /// empty page tables, and a reader faults its pages in again from the old
    /// mapping's file pages. So `move_aside` is only for a run whose old view is a
    /// shared (`MAP_SHARED`) view of the same memfd pages as the new one: the file
    /// pages are then the bytes the block holds. Any other run (one with private
    /// written pages, whose file pages are stale) is replaced by one `MAP_FIXED`
    /// mmap, which readers see switch at once.
    fn remap(
        &mut self,
        page: usize,
        n: usize,
        share: Share,
        file: u16,
        file_page: u32,
        move_aside: bool,
    ) -> Result<()> {
        let ps = self.ps;
        if move_aside && self.move_aside && n >= DEFER_MIN_PAGES {
            if let Some(scratch) = self.va.alloc_aligned(n, DEFER_MIN_PAGES, page % DEFER_MIN_PAGES) {
                match self.res.move_tables(page * ps, scratch * ps, n * ps) {
                    Ok(()) => {
                        self.pending.push((scratch, n));
                        self.wake_reaper();
                    }
                    Err(e) => {
                        self.va.free(scratch, n);
                        // EINVAL: the kernel refuses the move here at all; other errors
                        // (a run spanning two VMAs) only this time
                        if e.errno == crate::sys::Errno::INVAL {
                            self.move_aside = false;
                        }
                    }
                }
            }
        }
        let fd = self.files[file as usize].as_ref().expect("open file").fd.as_fd();
        Ok(self.res.map_file(page * ps, n * ps, share, fd, file_page as u64 * ps as u64)?)
    }

    /// Makes sure this process's reaper thread runs, and wakes it. Waking is an
    /// unpark, which takes no lock a forked child could find held.
    fn wake_reaper(&mut self) {
        let pid = std::process::id();
        match &self.reaper {
            Some((p, thread)) if *p == pid => thread.unpark(),
            _ => {
                let me = self.me.clone();
                let res = Arc::clone(&self.res);
                match std::thread::Builder::new().name("advm-reaper".into()).spawn(move || reaper(me, res)) {
                    Ok(h) => self.reaper = Some((pid, h.thread().clone())),
                    // no thread: unmap now
                    Err(_) => self.reap_all(),
                }
            }
        }
    }

    /// Unmaps every moved-aside mapping now (before a fork, or without a thread).
    fn reap_all(&mut self) {
        for (page, n) in std::mem::take(&mut self.pending) {
            let t = Instant::now();
            if self.res.release(page * self.ps, n * self.ps).is_ok() {
                self.va.free(page, n);
            }
            self.stats.deferred_unmap_ms += t.elapsed().as_secs_f64() * 1e3;
        }
    }

    fn file(&mut self, id: u16) -> &mut MemFile {
        self.files[id as usize].as_mut().expect("frames only name open files")
    }

    /// The memfd new pages come from (a fresh one after a fork retired the last).
    fn active_file(&mut self) -> Result<u16> {
        if let Some(id) = self.active {
            return Ok(id);
        }
        let fd = crate::sys::memfd::create("advm-arena")?;
        crate::sys::memfd::set_len(&fd, self.res.len() as u64)?;
        let pages = self.res.len() / self.ps;
        let f = MemFile { fd, refs: RunMap::new(), free: Extents::new(pages), live: 0, retired: false };
        let id = match self.files.iter().position(|f| f.is_none()) {
            Some(i) => {
                self.files[i] = Some(f);
                i as u16
            }
            None if self.files.len() < u16::MAX as usize => {
                self.files.push(Some(f));
                (self.files.len() - 1) as u16
            }
            None => {
                return Err(Error::Unsupported {
                    what: "another arena memfd",
                    why: format!("the arena already has {} memfds (one per fork still mapped)", self.files.len()),
                })
            }
        };
        self.active = Some(id);
        Ok(id)
    }

    /// `n` fresh memfd pages (reference count 1 each), as runs of shared frames.
    fn new_frames(&mut self, n: usize) -> Result<Vec<(Frame, usize)>> {
        let id = self.active_file()?;
        let f = self.file(id);
        let runs = f.free.alloc_any(n).ok_or_else(|| Error::OutOfMemory {
            what: "arena memfd pages",
            why: format!("{n} pages do not fit in the arena's memfd (all its pages are in use)"),
        })?;
        let mut out = Vec::with_capacity(runs.len());
        for (s, l) in runs {
            f.refs.set(s, l, Count(1));
            out.push((Frame { file: id, page: s as u32, private: false }, l));
        }
        f.live += n;
        Ok(out)
    }

    /// Adds one reference to each page of each run.
    fn incref(&mut self, runs: &[(Frame, usize)]) {
        for &(fr, n) in runs.iter().filter(|r| !r.0.unbacked()) {
            let f = self.file(fr.file);
            let mut born = 0;
            f.refs.update(fr.page as usize, n, |_, l, c| match c {
                Some(Count(c)) => Some(Count(c + 1)),
                None => {
                    born += l;
                    Some(Count(1))
                }
            });
            f.live += born;
        }
    }

    /// Drops one reference to each page of each run; pages left unused are punched
    /// and reused (or, in a retired memfd, just forgotten until the file closes).
    fn decref(&mut self, runs: &[(Frame, usize)]) -> Result<()> {
        let mut dead: Vec<(u16, usize, usize)> = Vec::new();
        for &(fr, n) in runs.iter().filter(|r| !r.0.unbacked()) {
            let f = self.file(fr.file);
            let mut gone = 0;
            f.refs.update(fr.page as usize, n, |s, l, c| match c {
                Some(Count(c)) if c > 1 => Some(Count(c - 1)),
                Some(_) => {
                    gone += l;
                    dead.push((fr.file, s, l));
                    None
                }
                None => {
                    debug_assert!(false, "decref of unreferenced pages {s}..{} of memfd {}", s + l, fr.file);
                    None
                }
            });
            f.live -= gone;
        }
        if !dead.windows(2).all(|w| w[0] <= w[1]) {
            dead.sort_unstable();
        }
        // one punch per run of contiguous dead pages
        let mut merged: Vec<(u16, usize, usize)> = Vec::with_capacity(dead.len());
        for (file, s, l) in dead {
            match merged.last_mut() {
                Some((f, ms, ml)) if *f == file && *ms + *ml == s => *ml += l,
                _ => merged.push((file, s, l)),
            }
        }
        let ps = self.ps;
        let mut first_err = None;
        for (file, start, n) in merged {
            let f = self.file(file);
            if !f.retired {
                match crate::sys::memfd::punch_hole(&f.fd, (start * ps) as u64, (n * ps) as u64) {
                    Ok(()) => f.free.free(start, n),
                    // The pages stay allocated and are not reused; the memory is freed
                    // when the file closes.
                    Err(e) => first_err = first_err.or(Some(e)),
                }
            }
        }
        // Retired memfds nobody here maps any more are closed.
        for slot in self.files.iter_mut() {
            if slot.as_ref().is_some_and(|f| f.retired && f.live == 0) {
                *slot = None;
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Maps the `runs` (`(index from key, len, frame)`) at reservation page `key`.
    /// Nothing is moved aside: these are fresh mappings or a copy's destination.
    fn map_frames(&mut self, key: usize, runs: &[Piece]) -> Result<()> {
        for &(i, n, fr) in runs {
            let share = if fr.private { Share::Private } else { Share::Shared };
            self.remap(key + i, n, share, fr.file, fr.page, false)?;
        }
        Ok(())
    }

    /// Sets `runs` (`(index, len, frame)`) into block `key`'s frames, keeping the
    /// arena's run count.
    fn set_frames(&mut self, key: usize, runs: &[Piece]) {
        let block = self.blocks.get_mut(&key).expect("live block");
        let before = block.frames.runs();
        for &(i, l, f) in runs {
            block.frames.set(i, l, f);
        }
        self.run_vmas = self.run_vmas - before + block.frames.runs();
    }

    /// Place for a block of `len` bytes, with frames not yet chosen (all PROT_NONE).
    fn place(&mut self, len: usize) -> Result<usize> {
        if len == 0 {
            return Err(invalid("len", "0: a block needs at least one byte".into()));
        }
        let oom = |why: String| Error::OutOfMemory { what: "an arena block", why };
        let pages = crate::addr::page_align_up(len)
            .ok_or_else(|| oom(format!("{len} bytes overflow the address space when rounded up to pages")))?
            / self.ps;
        // large blocks start on 2 MiB so their page tables can move whole
        let aligned = if pages >= DEFER_MIN_PAGES { self.va.alloc_aligned(pages, DEFER_MIN_PAGES, 0) } else { None };
        aligned.or_else(|| self.va.alloc_contig(pages)).ok_or_else(|| {
            oom(format!("{len} bytes do not fit in the free space of the arena's {}-byte reservation", self.res.len()))
        })
    }

    fn alloc(&mut self, len: usize) -> Result<*mut u8> {
        let key = self.place(len)?;
        let pages = len.div_ceil(self.ps);
        let fresh = match self.new_frames(pages) {
            Ok(f) => f,
            Err(e) => {
                self.va.free(key, pages);
                return Err(e);
            }
        };
        let runs = lay_out(&[(0, pages)], &fresh);
        if let Err(e) = self.map_frames(key, &runs) {
            let _ = self.res.release(key * self.ps, pages * self.ps);
            self.va.free(key, pages);
            self.decref(&fresh)?;
            return Err(e);
        }
        let mut frames = RunMap::new();
        for &(i, l, f) in &runs {
            frames.set(i, l, f);
        }
        self.run_vmas += frames.runs();
        self.blocks.insert(key, Block { frames, pages });
        Ok((self.res.base() + key * self.ps) as *mut u8)
    }

    /// A block whose frames will all be replaced by a copy right away: unbacked
    /// (`PROT_NONE`, no memfd page) until then; whatever the copy does not share gets
    /// fresh pages when bytes are copied there.
    fn alloc_unbacked(&mut self, len: usize) -> Result<usize> {
        let key = self.place(len)?;
        let pages = len.div_ceil(self.ps);
        let mut frames = RunMap::new();
        frames.set(0, pages, Frame::UNBACKED);
        self.blocks.insert(key, Block { frames, pages });
        Ok(self.res.base() + key * self.ps)
    }

    /// Gives the unbacked pages of `[addr, addr+len)` fresh memfd pages, mapped, so
    /// that bytes can be copied there.
    fn back(&mut self, addr: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (key, first) = self.find("dst", addr, len)?;
        let last = (addr + len - 1 - self.res.base()) / self.ps - key;
        let missing: Vec<(usize, usize)> = self.blocks[&key]
            .frames
            .pieces(first, last + 1)
            .into_iter()
            .filter(|p| p.2.unbacked())
            .map(|(i, l, _)| (i, l))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let fresh = self.new_frames(missing.iter().map(|m| m.1).sum())?;
        let runs = lay_out(&missing, &fresh);
        if let Err(e) = self.map_frames(key, &runs) {
            self.decref(&fresh)?;
            return Err(e);
        }
        self.set_frames(key, &runs);
        Ok(())
    }

    fn free(&mut self, addr: usize) -> Result<()> {
        let key = self.block_start("ptr", addr)?;
        let block = self.blocks.remove(&key).expect("block_start found it");
        self.run_vmas -= block.frames.runs();
        self.res.release(key * self.ps, block.pages * self.ps)?;
        self.va.free(key, block.pages);
        let runs: Vec<(Frame, usize)> = block.frames.iter().map(|(_, l, f)| (f, l)).collect();
        self.decref(&runs)
    }

    /// The key of the block that starts exactly at `addr`.
    fn block_start(&self, what: &'static str, addr: usize) -> Result<usize> {
        let (key, _) = self.find(what, addr, 0)?;
        if self.res.base() + key * self.ps != addr {
            return Err(invalid(
                what,
                format!("{addr:#x} is inside the block at {:#x}, not at its start", self.res.base() + key * self.ps),
            ));
        }
        Ok(key)
    }

    /// The block holding `[addr, addr+len)`: its key and the page index of `addr`.
    fn find(&self, what: &'static str, addr: usize, len: usize) -> Result<(usize, usize)> {
        let base = self.res.base();
        let outside = || {
            invalid(
                what,
                format!("{addr:#x} is not inside a live block of this arena (advm_alloc/Arena::alloc memory)"),
            )
        };
        if addr < base || addr >= base + self.res.len() {
            return Err(outside());
        }
        let page = (addr - base) / self.ps;
        let (&key, block) = self.blocks.range(..=page).next_back().ok_or_else(outside)?;
        let pages = block.pages;
        if page >= key + pages {
            return Err(outside());
        }
        let end = base + (key + pages) * self.ps;
        if addr.checked_add(len).map_or(true, |e| e > end) {
            return Err(invalid(
                what,
                format!(
                    "range {addr:#x}+{len} runs past the end of its block ({:#x}, {} bytes) by {} bytes",
                    base + key * self.ps,
                    pages * self.ps,
                    addr.saturating_add(len) - end
                ),
            ));
        }
        Ok((key, page - key))
    }

    /// Offsets (from the reservation base) of the whole pages spanned by a range.
    fn page_span(&self, what: &'static str, addr: usize, len: usize) -> Result<(usize, usize)> {
        self.find(what, addr, len)?;
        let off = addr - self.res.base();
        Ok((off / self.ps * self.ps, (off + len).div_ceil(self.ps) * self.ps))
    }

    fn memcpy(&mut self, dst: usize, src: usize, len: usize) -> Result<()> {
        self.back(dst, len)?;
        let base = self.res.base();
        self.res.copy(src - base, dst - base, len)?;
        self.stats.bytes_copied += len as u64;
        Ok(())
    }

    fn vcopy(&mut self, dst: usize, src: usize, len: usize) -> Result<CopyHow> {
        if len == 0 {
            return Ok(CopyHow::Shared { pages: 0, copied_bytes: 0 });
        }
        let (skey, _) = self.find("src", src, len)?;
        let (dkey, _) = self.find("dst", dst, len)?;
        if src < dst + len && dst < src + len {
            return Err(invalid(
                "dst",
                format!("range {dst:#x}+{len} overlaps src range {src:#x}+{len}; a copy needs disjoint ranges"),
            ));
        }
        self.stats.vcopies += 1;
        let ps = self.ps;
        if (dst.wrapping_sub(src)) % ps != 0 {
            self.memcpy(dst, src, len)?;
            self.stats.fallback_unaligned += 1;
            return Ok(CopyHow::CopiedUnaligned);
        }
        let head = (ps - src % ps) % ps;
        let head = head.min(len);
        let pages = (len - head) / ps;
        let tail = len - head - pages * ps;
        if pages < self.small {
            self.memcpy(dst, src, len)?;
            self.stats.fallback_small += 1;
            return Ok(CopyHow::CopiedSmall);
        }
        let base = self.res.base();
        let sidx = (src + head - base) / ps - skey;
        let didx = (dst + head - base) / ps - dkey;
        let shared = self.share_pages(dkey, didx, skey, sidx, pages)?;
        self.memcpy(dst, src, head)?;
        self.memcpy(dst + head + pages * ps, src + head + pages * ps, tail)?;
        if shared < pages {
            self.stats.fallback_vma_budget += 1;
            if shared == 0 {
                return Ok(CopyHow::CopiedVmaBudget);
            }
        }
        Ok(CopyHow::Shared { pages: shared, copied_bytes: head + tail })
    }

    /// Which pages of the private `pieces` (`(index from reservation page first, len,
    /// frame)`, in order) hold their own (written, anonymous) copy rather than the
    /// memfd page: sorted, disjoint `(index, len)` runs.
    fn written_runs(&mut self, first: usize, pieces: &[Piece]) -> Result<Vec<(usize, usize)>> {
        let private: Vec<(usize, usize)> = pieces.iter().filter(|p| p.2.private).map(|&(i, l, _)| (i, l)).collect();
        let Some(&(li, ll)) = private.last() else { return Ok(Vec::new()) };
        let n = li + ll;
        // Kept open (opening costs more than a small copy), but reopened after a fork:
        // an inherited fd reads the parent's page tables.
        let pid = std::process::id();
        if self.pagemap.as_ref().map_or(true, |(p, _)| *p != pid) {
            self.pagemap = Some((pid, Pagemap::open("self")?));
        }
        let pm = &self.pagemap.as_ref().expect("opened above").1;
        let ps = self.ps as u64;
        let start = self.res.base() as u64 + first as u64 * ps;
        let end = start + n as u64 * ps;
        let mut anon: Vec<(usize, usize)> = Vec::new();
        let push = |anon: &mut Vec<(usize, usize)>, i: usize, l: usize| match anon.last_mut() {
            Some((s, sl)) if *s + *sl == i => *sl += l,
            _ => anon.push((i, l)),
        };
        // PAGEMAP_SCAN (Linux 6.7+) reports runs, so a source nobody wrote costs
        // almost nothing; written pages are present and not file pages, or swapped.
        if self.scan_works {
            use crate::sys::pagemap::{category, Region};
            let mut regions = [Region::default(); 512];
            let mut at = start;
            let mut ok = true;
            while at < end {
                match pm.scan(
                    at,
                    end,
                    category::PRESENT | category::SWAPPED,
                    category::PRESENT | category::SWAPPED | category::FILE | category::PFNZERO,
                    &mut regions,
                ) {
                    Ok((k, walk_end)) => {
                        for r in &regions[..k] {
                            let c = r.categories;
                            // the shared zero page is nobody's write
                            let is_anon = (c & category::SWAPPED != 0)
                                || (c & category::PRESENT != 0 && c & (category::FILE | category::PFNZERO) == 0);
                            let (a, b) = (r.start.max(start), r.end.min(end));
                            if is_anon && b > a {
                                push(&mut anon, ((a - start) / ps) as usize, ((b - a) / ps) as usize);
                            }
                        }
                        if walk_end <= at {
                            break;
                        }
                        at = walk_end;
                    }
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Ok(intersect(&anon, &private));
            }
            self.scan_works = false;
            anon.clear();
        }
        let pm = &self.pagemap.as_ref().expect("opened above").1;
        let vpn0 = start / ps;
        let mut buf = vec![0u64; n.min(64 * 1024)];
        let mut done = 0;
        while done < n {
            let want = (n - done).min(buf.len());
            let got = pm.read(vpn0 + done as u64, &mut buf[..want])?;
            if got == 0 {
                break;
            }
            for (k, &e) in buf[..got].iter().enumerate() {
                let e = Entry(e);
                if (e.present() && !e.file_or_shared()) || e.swapped() {
                    push(&mut anon, done + k, 1);
                }
            }
            done += got;
        }
        Ok(intersect(&anon, &private))
    }

    /// Shares `n` pages of block `skey` from page `sidx` into block `dkey` from page
    /// `didx`. Returns how many were shared; the rest were copied (VMA budget or a
    /// failed mmap). Either way the destination ends up a copy of the source.
    fn share_pages(&mut self, dkey: usize, didx: usize, skey: usize, sidx: usize, n: usize) -> Result<usize> {
        let ps = self.ps;
        let base = self.res.base();
        let old: Vec<Piece> =
            self.blocks[&skey].frames.pieces(sidx, sidx + n).into_iter().map(|(i, l, f)| (i - sidx, l, f)).collect();
        let written = self.written_runs(skey + sidx, &old)?;
        let n_written: usize = written.iter().map(|w| w.1).sum();

        // Plan, per piece: the source's frames become private; written ones move to
        // fresh pages. parts: (index, len, old frame, new frame, written).
        let fresh = if n_written > 0 { self.new_frames(n_written)? } else { Vec::new() };
        let rehomed_at = lay_out(&written, &fresh);
        let mut parts: Vec<(usize, usize, Frame, Frame, bool)> = Vec::new();
        let mut w = rehomed_at.iter().peekable();
        for &(i, l, f) in &old {
            let mut at = i;
            while at < i + l {
                while w.peek().is_some_and(|r| r.0 + r.1 <= at) {
                    w.next();
                }
                let oldf = f.advance(at - i);
                match w.peek() {
                    Some(&&(ws, wl, wf)) if ws <= at => {
                        let upto = (ws + wl).min(i + l);
                        parts.push((at, upto - at, oldf, Frame { private: true, ..wf.advance(at - ws) }, true));
                        at = upto;
                    }
                    next => {
                        let upto = next.map_or(i + l, |r| r.0.min(i + l));
                        parts.push((at, upto - at, oldf, Frame { private: true, ..oldf }, false));
                        at = upto;
                    }
                }
            }
        }
        let mut all_runs = Vec::new();
        // The source runs whose frames change: shared pages turning private (same
        // memfd page, same bytes) and re-homed ones (a new memfd page). Kept apart:
        // only the first may have their old view emptied before the new one is
        // mapped (see `remap`).
        let mut src_runs: Vec<(Piece, bool)> = Vec::new();
        let mut rehome = Vec::new();
        for &(i, l, o, nf, wr) in &parts {
            push_run(&mut all_runs, (i, l, nf));
            if nf != o {
                match src_runs.last_mut() {
                    Some(((s, sl, f), k)) if *k == wr && *s + *sl == i && f.advance(*sl) == nf => *sl += l,
                    _ => src_runs.push(((i, l, nf), wr)),
                }
            }
            if wr {
                push_run(&mut rehome, (i, l, nf));
            }
        }

        // VMA budget: the runs both blocks would have afterwards. Each block gains at
        // most the copy's runs plus two splits; only near the budget are they counted
        // exactly (on copies of the blocks' extent maps).
        let est = self.vma_estimate();
        let after = if est + 2 * all_runs.len() + 4 <= self.budget {
            0
        } else {
            let src_map = &self.blocks[&skey].frames;
            let mut s = src_map.clone();
            for &(i, l, f) in &all_runs {
                s.set(sidx + i, l, f);
            }
            if dkey != skey {
                let dst_map = &self.blocks[&dkey].frames;
                let mut d = dst_map.clone();
                for &(i, l, f) in &all_runs {
                    d.set(didx + i, l, f);
                }
                est - src_map.runs() - dst_map.runs() + s.runs() + d.runs()
            } else {
                for &(i, l, f) in &all_runs {
                    s.set(didx + i, l, f);
                }
                est - src_map.runs() + s.runs()
            }
        };
        if after > self.budget {
            self.decref(&fresh)?;
            self.memcpy(base + (dkey + didx) * ps, base + (skey + sidx) * ps, n * ps)?;
            return Ok(0);
        }

        // Re-home written pages: their bytes go into the fresh memfd pages.
        for &(i, len, fr) in &rehome {
            let fd = self.files[fr.file as usize].as_ref().expect("open").fd.as_fd();
            if let Err(e) = self.res.write_to_file((skey + sidx + i) * ps, len * ps, fd, fr.page as u64 * ps as u64) {
                self.decref(&fresh)?;
                return Err(e.into());
            }
        }

        // Remap the source where its frames change (content is the same before and
        // after, so a failure part way leaves the source intact). A re-homed run
        // switches in one mmap: its old view reads other bytes than it holds.
        let mut src_done = 0;
        for &((i, l, f), rehomed) in &src_runs {
            if self.remap(skey + sidx + i, l, Share::Private, f.file, f.page, !rehomed).is_err() {
                break;
            }
            src_done += 1;
        }
        // Apply what was mapped: frames of remapped runs take their new value.
        let done_end = src_runs.get(src_done).map_or(usize::MAX, |r| r.0 .0);
        let mut dropped = Vec::new();
        let mut unused = Vec::new();
        for &(i, l, o, nf, _) in parts.iter().filter(|p| p.4) {
            if i < done_end {
                dropped.push((o, l));
            } else {
                unused.push((nf, l));
            }
        }
        let applied: Vec<Piece> = src_runs[..src_done].iter().map(|&((i, l, f), _)| (sidx + i, l, f)).collect();
        self.set_frames(skey, &applied);
        self.decref(&dropped)?;
        self.decref(&unused)?;
        if src_done < src_runs.len() {
            self.memcpy(base + (dkey + didx) * ps, base + (skey + sidx) * ps, n * ps)?;
            return Ok(0);
        }

        // Map the destination as private views of the source's pages, run by run.
        let mut shared = 0;
        for &(i, l, f) in &all_runs {
            match self.map_frames(dkey + didx, &[(i, l, f)]) {
                Ok(()) => {
                    self.incref(&[(f, l)]);
                    let old_dst: Vec<(Frame, usize)> = self.blocks[&dkey]
                        .frames
                        .pieces(didx + i, didx + i + l)
                        .into_iter()
                        .map(|(_, l, f)| (f, l))
                        .collect();
                    self.set_frames(dkey, &[(didx + i, l, f)]);
                    self.decref(&old_dst)?;
                    shared += l;
                }
                Err(_) => {
                    self.memcpy(base + (dkey + didx + i) * ps, base + (skey + sidx + i) * ps, l * ps)?;
                }
            }
        }
        self.stats.pages_shared += shared as u64;
        self.stats.pages_rehomed += n_written as u64;
        Ok(shared)
    }

    fn trim(&mut self) -> Result<u64> {
        // per memfd: pages some view still reads (shared frames, unwritten private ones)
        let mut read: Vec<RunMap<Count>> = vec![RunMap::new(); self.files.len()];
        let keys: Vec<usize> = self.blocks.keys().copied().collect();
        for key in keys {
            let pieces: Vec<Piece> = self.blocks[&key].frames.iter().filter(|p| !p.2.unbacked()).collect();
            let written = self.written_runs(key, &pieces)?;
            for &(i, l, f) in &pieces {
                for (s, sl) in subtract((i, l), &written) {
                    read[f.file as usize].update(f.page as usize + (s - i), sl, |_, _, _| Some(Count(1)));
                }
            }
        }
        let ps = self.ps;
        let mut released = 0;
        for (id, reading) in read.iter().enumerate() {
            let Some(f) = self.files[id].as_ref() else { continue };
            // retired pages may still be read by the other side of a fork
            if f.retired {
                continue;
            }
            for (s, l, _) in f.refs.iter() {
                let covered: Vec<(usize, usize)> =
                    reading.pieces(s, s + l).into_iter().map(|(a, b, _)| (a, b)).collect();
                for (a, b) in subtract((s, l), &covered) {
                    crate::sys::memfd::punch_hole(&f.fd, (a * ps) as u64, (b * ps) as u64)?;
                    released += b as u64;
                }
            }
        }
        Ok(released)
    }

    /// Before a fork: every shared frame becomes private (neighbouring blocks with
    /// contiguous pages in one `mmap`), and the memfds are retired.
    fn freeze_for_fork(&mut self) {
        // the child would have no reaper thread: unmap moved-aside mappings now
        self.reap_all();
        let ps = self.ps;
        // (first reservation page, file, first file page, pages)
        let mut runs: Vec<(usize, u16, u32, usize)> = Vec::new();
        for (&key, block) in &self.blocks {
            for (i, l, fr) in block.frames.iter() {
                if fr.private || fr.unbacked() {
                    continue;
                }
                match runs.last_mut() {
                    Some((va, file, page, len))
                        if *va + *len == key + i && *file == fr.file && *page as usize + *len == fr.page as usize =>
                    {
                        *len += l
                    }
                    _ => runs.push((key + i, fr.file, fr.page, l)),
                }
            }
        }
        for (va, file, page, len) in runs {
            let f = self.files[file as usize].as_ref().expect("open");
            // A failure here would leave a page shared across the fork; there is no
            // way to report from a fork handler, so stop sharing by other means: the
            // page stays shared only in that (unlikely, ENOMEM) case.
            let _ = self.res.map_file(va * ps, len * ps, Share::Private, f.fd.as_fd(), page as u64 * ps as u64);
        }
        let keys: Vec<usize> = self.blocks.keys().copied().collect();
        for key in keys {
            let now: Vec<Piece> = self.blocks[&key]
                .frames
                .iter()
                .filter(|p| !p.2.private && !p.2.unbacked())
                .map(|(i, l, f)| (i, l, Frame { private: true, ..f }))
                .collect();
            self.set_frames(key, &now);
        }
        for f in self.files.iter_mut().flatten() {
            f.retired = true;
        }
        self.files.iter_mut().for_each(|slot| {
            if slot.as_ref().is_some_and(|f| f.live == 0) {
                *slot = None;
            }
        });
        self.active = None;
        self.stats.forks += 1;
    }
}

/// The reaper thread: unmaps the old mappings copies moved aside, outside the arena
/// lock. Holds the arena weakly (exits once it is gone) and the reservation strongly
/// (the ranges it unmaps stay the arena's while it works).
fn reaper(me: Weak<Shared>, res: Arc<Reservation>) {
    let ps = crate::addr::page_size();
    loop {
        let Some(shared) = me.upgrade() else { return };
        // The fork gate, held from picking a range to unmapping it, keeps a fork
        // (whose prepare handler unmaps pending ranges itself) out meanwhile; taken
        // with every lock of the arena state, so a fork never copies that lock held.
        let gate = ForkGate::hold();
        // a poisoned arena takes no further work, the reaper's included
        let Ok(g) = lock(&shared) else { return };
        let Some((page, n)) = g.pending.last().copied() else {
            drop(g);
            drop(gate);
            drop(shared); // the arena may go meanwhile
            std::thread::park_timeout(Duration::from_millis(200));
            continue;
        };
        drop(g);
        let t = Instant::now();
        // Tear the page tables down under the shared mmap lock, 16 MiB at a time, so
        // a copy waiting to map (exclusive lock) waits for one chunk at most; then
        // re-reserve the empty range.
        const CHUNK: usize = 4096;
        for at in (page..page + n).step_by(CHUNK) {
            let _ = res.discard(at * ps, CHUNK.min(page + n - at) * ps);
        }
        let ok = res.release(page * ps, n * ps).is_ok();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let Ok(mut g) = lock(&shared) else { return };
        if let Some(i) = g.pending.iter().position(|&j| j == (page, n)) {
            g.pending.swap_remove(i);
            if ok {
                g.va.free(page, n);
            }
        }
        g.stats.deferred_unmap_ms += ms;
        drop((g, gate));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: u16, page: u32, private: bool) -> Frame {
        Frame { file, page, private }
    }

    #[test]
    fn runs_break_on_file_page_and_mode() {
        let f = [frame(0, 1, false), frame(0, 2, false), frame(0, 3, true), frame(1, 4, true), frame(1, 6, true)];
        assert_eq!(count_runs(&f), 4);
        assert_eq!(runs_where(&f, 0, 5, |_| true), vec![(0, 2), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(runs_where(&f, 0, 5, |i| i != 1), vec![(0, 1), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(count_runs(&[]), 0);
        // unbacked frames are in no run and break runs
        let g = [frame(0, 1, true), Frame::UNBACKED, frame(0, 3, true), frame(0, 4, true)];
        assert_eq!(count_runs(&g), 2);
        assert_eq!(count_runs_by(4, |i| g[i]), 2);
    }

    proptest::proptest! {
        /// Block frames per extent against the per-page frame table they replace:
        /// every page's frame, and the run (VMA) count `count_runs` gives.
        #[test]
        fn frames_per_extent_match_per_page_table(
            ops in proptest::collection::vec((0usize..48, 1usize..16, 0u16..3, 0u32..40, proptest::bool::ANY), 1..30)
        ) {
            let total = 64;
            let mut m: RunMap<Frame> = RunMap::new();
            m.set(0, total, Frame::UNBACKED);
            let mut table = vec![Frame::UNBACKED; total];
            for (s, l, file, page, private) in ops {
                let l = l.min(total - s);
                // file 2 stands for "unbacked again"
                let f = if file == 2 { Frame::UNBACKED } else { frame(file, page, private) };
                m.set(s, l, f);
                for k in 0..l {
                    table[s + k] = f.advance(k);
                }
                for (i, want) in table.iter().enumerate() {
                    proptest::prop_assert_eq!(m.get(i), Some(*want));
                }
                proptest::prop_assert_eq!(m.runs(), count_runs(&table));
                let backed: Vec<(usize, usize)> =
                    m.iter().filter(|p| !p.2.unbacked()).map(|(i, l, _)| (i, l)).collect();
                let want: Vec<(usize, usize)> = runs_where(&table, 0, total, |i| !table[i].unbacked());
                proptest::prop_assert_eq!(backed, want);
            }
        }

        /// lay_out, intersect and subtract against per-page sets.
        #[test]
        fn run_helpers_match_per_page_sets(
            a in proptest::collection::vec(proptest::bool::ANY, 40),
            b in proptest::collection::vec(proptest::bool::ANY, 40),
            cuts in proptest::collection::vec(1usize..7, 1..12),
        ) {
            let runs = |v: &[bool]| {
                let mut out: Vec<(usize, usize)> = Vec::new();
                for (i, _) in v.iter().enumerate().filter(|p| *p.1) {
                    match out.last_mut() {
                        Some((s, l)) if *s + *l == i => *l += 1,
                        _ => out.push((i, 1)),
                    }
                }
                out
            };
            let (ra, rb) = (runs(&a), runs(&b));
            let both: Vec<bool> = a.iter().zip(&b).map(|(x, y)| *x && *y).collect();
            proptest::prop_assert_eq!(intersect(&ra, &rb), runs(&both));
            let only: Vec<bool> = (0..40).map(|i| (5..33).contains(&i) && !b[i]).collect();
            proptest::prop_assert_eq!(subtract((5, 28), &rb), runs(&only));
            // fresh runs of total length = pages in `a`, laid out in order
            let need: usize = ra.iter().map(|r| r.1).sum();
            let mut fresh = Vec::new();
            let (mut left, mut page, mut k) = (need, 100u32, 0);
            while left > 0 {
                let l = cuts[k % cuts.len()].min(left);
                fresh.push((frame(0, page, false), l));
                page += l as u32 + (k % 2) as u32;
                left -= l;
                k += 1;
            }
            let mut per_page = Vec::new();
            for &(f, l) in &fresh {
                per_page.extend((0..l).map(|k| f.advance(k)));
            }
            let laid = lay_out(&ra, &fresh);
            let mut got = vec![None; 40];
            for &(i, l, f) in &laid {
                for k in 0..l {
                    got[i + k] = Some(f.advance(k));
                }
            }
            let mut want = vec![None; 40];
            for (idx, f) in a.iter().enumerate().filter(|p| *p.1).map(|p| p.0).zip(per_page) {
                want[idx] = Some(f);
            }
            proptest::prop_assert_eq!(got, want);
            // maximal: no run continues the one before it
            for w in laid.windows(2) {
                proptest::prop_assert!(!(w[0].0 + w[0].1 == w[1].0 && w[0].2.advance(w[0].1) == w[1].2));
            }
        }
    }

    impl Inner {
        /// Test oracle: every block's frames expanded page by page, reference counts
        /// recounted page by page from them, runs counted page by page; all must
        /// agree with the per-extent state.
        fn check_per_page(&self) -> std::result::Result<(), String> {
            let mut counts: BTreeMap<(u16, u32), u32> = BTreeMap::new();
            let mut runs = 0;
            for (&key, b) in &self.blocks {
                let mut table = Vec::new();
                for (i, l, f) in b.frames.iter() {
                    if i != table.len() {
                        return Err(format!("block {key}: extent at {i} leaves a gap at {}", table.len()));
                    }
                    table.extend((0..l).map(|k| f.advance(k)));
                }
                if table.len() != b.pages {
                    return Err(format!("block {key}: {} frames for {} pages", table.len(), b.pages));
                }
                if b.frames.runs() != count_runs(&table) {
                    return Err(format!("block {key}: {} runs, per page {}", b.frames.runs(), count_runs(&table)));
                }
                runs += count_runs(&table);
                for f in table.iter().filter(|f| !f.unbacked()) {
                    *counts.entry((f.file, f.page)).or_insert(0) += 1;
                }
            }
            if runs != self.run_vmas {
                return Err(format!("run_vmas {} but blocks have {runs} runs", self.run_vmas));
            }
            for (id, f) in self.files.iter().enumerate() {
                let Some(f) = f else { continue };
                let mut live = 0;
                for (s, l, c) in f.refs.iter() {
                    live += l;
                    for p in s..s + l {
                        let want = counts.remove(&(id as u16, p as u32)).unwrap_or(0);
                        if want != c.0 {
                            return Err(format!("memfd {id} page {p}: refcount {} but {want} frames show it", c.0));
                        }
                    }
                }
                if live != f.live {
                    return Err(format!("memfd {id}: live {} but {live} pages referenced", f.live));
                }
            }
            match counts.into_iter().next() {
                Some(((id, p), n)) => Err(format!("memfd {id} page {p}: shown by {n} frames, no refcount")),
                None => Ok(()),
            }
        }
    }

    #[derive(Debug, Clone)]
    enum ArenaOp {
        Alloc(usize),
        Dup(usize, usize, usize),
        Vcopy(usize, usize, usize, usize, usize),
        Write(usize, usize, usize),
        Free(usize),
    }

    fn arena_op() -> impl proptest::strategy::Strategy<Value = ArenaOp> {
        use proptest::prelude::*;
        prop_oneof![
            (1usize..24).prop_map(ArenaOp::Alloc),
            (0usize..8, 0usize..24, 1usize..24).prop_map(|(b, o, n)| ArenaOp::Dup(b, o, n)),
            (0usize..8, 0usize..8, 0usize..24, 0usize..24, 1usize..24)
                .prop_map(|(d, s, dof, sof, n)| ArenaOp::Vcopy(d, s, dof, sof, n)),
            (0usize..8, 0usize..24, 1usize..8).prop_map(|(b, o, n)| ArenaOp::Write(b, o, n)),
            (0usize..8).prop_map(ArenaOp::Free),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]
        /// Random alloc/dup/vcopy/writes/free (writes make copied pages anonymous, so
        /// later copies re-home them): after every call the per-extent frames,
        /// reference counts, live pages and run counts equal their per-page recount.
        #[test]
        fn arena_bookkeeping_matches_per_page_recount(ops in proptest::collection::vec(arena_op(), 1..24)) {
            let ps = crate::addr::page_size();
            let arena = Arena::with_config(Config { reserve_bytes: 16 << 20, ..Default::default() }).unwrap();
            let mut blocks: Vec<(*mut u8, usize)> = Vec::new();
            for op in ops {
                match op {
                    ArenaOp::Alloc(n) => blocks.push((arena.alloc(n * ps).unwrap(), n)),
                    ArenaOp::Dup(b, o, n) if !blocks.is_empty() => {
                        let (p, len) = blocks[b % blocks.len()];
                        let o = o % len;
                        let n = n.min(len - o);
                        let src = p.wrapping_add(o * ps);
                        blocks.push((arena.dup(src, n * ps).unwrap(), n));
                    }
                    ArenaOp::Vcopy(d, s, dof, sof, n) if !blocks.is_empty() => {
                        let (dp, dl) = blocks[d % blocks.len()];
                        let (sp, sl) = blocks[s % blocks.len()];
                        let (dof, sof) = (dof % dl, sof % sl);
                        let n = n.min(dl - dof).min(sl - sof);
                        let (dst, src) = (dp.wrapping_add(dof * ps), sp.wrapping_add(sof * ps));
                        // overlapping ranges are refused (an error, nothing changed)
                        let _ = arena.vcopy(dst, src, n * ps);
                    }
                    ArenaOp::Write(b, o, n) if !blocks.is_empty() => {
                        let (p, len) = blocks[b % blocks.len()];
                        let o = o % len;
                        let n = n.min(len - o);
                        arena.fill(p.wrapping_add(o * ps), 0x5a, n * ps).unwrap();
                    }
                    ArenaOp::Free(b) if !blocks.is_empty() => {
                        let (p, _) = blocks.remove(b % blocks.len());
                        arena.free(p).unwrap();
                    }
                    _ => {}
                }
                let g = lock(&arena.shared).unwrap();
                let checked = g.check_per_page();
                drop(g);
                proptest::prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
            }
            for (p, _) in blocks {
                arena.free(p).unwrap();
            }
            proptest::prop_assert_eq!(arena.stats().memfd_pages_live, 0);
        }
    }
}
