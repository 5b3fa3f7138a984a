//! The [`Arena`] handle and its state: construction, the lock every call takes
//! (inside the fork gate), the public calls, and where blocks sit in the reservation.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::copy::DEFER_MIN_PAGES;
use super::extent::{Extents, RunMap};
use super::fork::{self, ForkGate};
use super::frames::{lay_out, Block, Frame, MemFile};
use super::{invalid, Config, CopyHow, Stats};
use crate::mem::{HostAddr, PageRange};
use crate::sys::mman::reservation::Reservation;
use crate::sys::pagemap::Pagemap;
use crate::{Error, Result};

/// The arena's state, behind its one mutex. Addresses inside are plain `usize` (the
/// public calls take [`HostAddr`]); block and frame positions are page indices from
/// the reservation's start.
pub(super) struct Inner {
    pub(super) res: Arc<Reservation>,
    pub(super) ps: usize,
    /// Live blocks by first page index in the reservation: the sorted region table.
    pub(super) blocks: BTreeMap<usize, Block>,
    pub(super) va: Extents,
    pub(super) files: Vec<Option<MemFile>>,
    pub(super) active: Option<u16>,
    pub(super) run_vmas: usize,
    pub(super) budget: usize,
    pub(super) small: usize,
    pub(super) stats: Stats,
    /// /proc/self/pagemap and the pid it was opened by (a forked child reopens it).
    pub(super) pagemap: Option<(u32, Pagemap)>,
    /// False once `PAGEMAP_SCAN` failed (kernels before 6.7): whole reads instead.
    pub(super) scan_works: bool,
    /// Old source mappings whose page tables a copy moved aside, waiting for the
    /// reaper thread to unmap them: (first reservation page, pages).
    pub(super) pending: Vec<(usize, usize)>,
    /// The reaper thread and the pid it runs in (a forked child starts its own).
    pub(super) reaper: Option<(u32, std::thread::Thread)>,
    /// False once moving page tables aside failed (kernels that refuse
    /// `MREMAP_DONTUNMAP` here): sources are unmapped in place.
    pub(super) move_aside: bool,
    pub(super) me: Weak<Shared>,
    /// Tests whose arena no other thread touches: adopt as if single-threaded.
    #[cfg(test)]
    pub(super) sole_writer: bool,
}

pub(super) struct Shared {
    pub(super) inner: Mutex<Inner>,
}

/// An arena of virtually copyable blocks. Cheap to clone (a handle); `Send + Sync`.
#[derive(Clone)]
pub struct Arena {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("stats", &self.stats()).finish()
    }
}

/// The arena state, locked, with the fork gate held (released in this order).
pub(super) struct Locked<'a> {
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
pub(super) fn lock(shared: &Shared) -> Result<Locked<'_>> {
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
pub(super) fn lock_any(shared: &Shared) -> Locked<'_> {
    let gate = ForkGate::hold();
    Locked { inner: shared.inner.lock().unwrap_or_else(|e| e.into_inner()), _gate: gate }
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
            #[cfg(test)]
            sole_writer: false,
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
    /// page aligned; returns its first address. Memory is allocated by the kernel only
    /// as pages are written.
    pub fn alloc(&self, len: usize) -> Result<HostAddr> {
        let mut g = lock(&self.shared)?;
        g.alloc(len).map(HostAddr)
    }

    /// Frees the block starting at `block`. Pages no other block shares are returned
    /// to the kernel (hole-punched) now.
    pub fn free(&self, block: HostAddr) -> Result<()> {
        let mut g = lock(&self.shared)?;
        g.free(block.0)
    }

    /// A new block of `len` bytes that is a virtual copy of `[src, src+len)`.
    pub fn dup(&self, src: HostAddr, len: usize) -> Result<HostAddr> {
        let mut g = lock(&self.shared)?;
        g.find("src", src.0, len)?;
        let dst = g.alloc_unbacked(len)?;
        match g.vcopy(dst, src.0, len) {
            Ok(_) => Ok(HostAddr(dst)),
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
    pub fn vcopy(&self, dst: HostAddr, src: HostAddr, len: usize) -> Result<CopyHow> {
        let mut g = lock(&self.shared)?;
        g.vcopy(dst.0, src.0, len)
    }

    /// Like [`Arena::vcopy`], but only whole pages and only by sharing (the paper's
    /// `mmapcopy`): `dst` takes a copy of the pages of `src`. A copy that would have to
    /// fall back to memcpy (VMA budget) is still done, by memcpy, and reported.
    pub fn vcopy_pages(&self, dst: PageRange, src: PageRange) -> Result<CopyHow> {
        if dst.len() != src.len() {
            return Err(invalid(
                "dst",
                format!(
                    "{} bytes at {} for a source of {} bytes: a copy needs equal lengths",
                    dst.len(),
                    dst.start(),
                    src.len()
                ),
            ));
        }
        self.vcopy(dst.start(), src.start(), src.len())
    }

    /// Says that `[addr, addr+len)` is about to be written: breaks copy-on-write for
    /// all its pages in one call instead of one fault per page.
    pub fn prepare_write(&self, addr: HostAddr, len: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        let (start, end) = g.page_span("addr", addr.0, len)?;
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
    pub fn write(&self, dst: HostAddr, data: &[u8]) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("dst", dst.0, data.len())?;
        Ok(g.res.write(dst.0 - g.res.base(), data)?)
    }

    /// Fills `[dst, dst+len)` (inside one block) with `byte`.
    pub fn fill(&self, dst: HostAddr, byte: u8, len: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("dst", dst.0, len)?;
        Ok(g.res.fill(dst.0 - g.res.base(), len, byte)?)
    }

    /// Copies `[src, src+buf.len())` (inside one block) into `buf`.
    pub fn read(&self, src: HostAddr, buf: &mut [u8]) -> Result<()> {
        let g = lock(&self.shared)?;
        g.find("src", src.0, buf.len())?;
        Ok(g.res.read(src.0 - g.res.base(), buf)?)
    }

    /// The length in bytes of the block that starts at `block`.
    pub fn block_len(&self, block: HostAddr) -> Result<usize> {
        let g = lock(&self.shared)?;
        let key = g.block_start("block", block.0)?;
        Ok(g.blocks[&key].pages * g.ps)
    }

    /// True when `addr` lies inside a live block of this arena (false for every
    /// address after a panic inside the arena).
    pub fn contains(&self, addr: HostAddr) -> bool {
        lock(&self.shared).is_ok_and(|g| g.find("addr", addr.0, 0).is_ok())
    }

    /// True when some byte of `[start, start+len)` lies inside a live block of this
    /// arena (false for an empty range, and for every range after a panic inside
    /// the arena). One lookup in the sorted block table, whatever the length.
    pub fn touches(&self, start: HostAddr, len: usize) -> bool {
        lock(&self.shared).is_ok_and(|g| g.touches(start.0, len))
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
            files.filter_map(|f| crate::sys::mman::reservation::allocated_bytes(f.fd.get("fstat").ok()?).ok()).sum();
        s
    }
}

impl Inner {
    pub(super) fn vma_estimate(&self) -> usize {
        // each block's runs, plus the reserved gaps around blocks and moved-aside maps
        self.run_vmas + self.blocks.len() + 1 + 2 * self.pending.len()
    }

    /// Place for a block of `len` bytes, with frames not yet chosen (all PROT_NONE).
    pub(super) fn place(&mut self, len: usize) -> Result<usize> {
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

    pub(super) fn alloc(&mut self, len: usize) -> Result<usize> {
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
        Ok(self.res.base() + key * self.ps)
    }

    /// A block whose frames will all be replaced by a copy right away: unbacked
    /// (`PROT_NONE`, no memfd page) until then; whatever the copy does not share gets
    /// fresh pages when bytes are copied there.
    pub(super) fn alloc_unbacked(&mut self, len: usize) -> Result<usize> {
        let key = self.place(len)?;
        let pages = len.div_ceil(self.ps);
        let mut frames = RunMap::new();
        frames.set(0, pages, Frame::UNBACKED);
        self.blocks.insert(key, Block { frames, pages });
        Ok(self.res.base() + key * self.ps)
    }

    /// Gives the unbacked pages of `[addr, addr+len)` fresh memfd pages, mapped, so
    /// that bytes can be copied there.
    pub(super) fn back(&mut self, addr: usize, len: usize) -> Result<()> {
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

    pub(super) fn free(&mut self, addr: usize) -> Result<()> {
        let key = self.block_start("block", addr)?;
        let block = self.blocks.remove(&key).expect("block_start found it");
        self.run_vmas -= block.frames.runs();
        self.res.release(key * self.ps, block.pages * self.ps)?;
        self.va.free(key, block.pages);
        let runs: Vec<(Frame, usize)> = block.frames.iter().map(|(_, l, f)| (f, l)).collect();
        self.decref(&runs)?;
        self.adopt(&runs)
    }

    /// The key of the block that starts exactly at `addr`.
    pub(super) fn block_start(&self, what: &'static str, addr: usize) -> Result<usize> {
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
    pub(super) fn find(&self, what: &'static str, addr: usize, len: usize) -> Result<(usize, usize)> {
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

    /// True when some byte of `[addr, addr+len)` lies in a live block.
    pub(super) fn touches(&self, addr: usize, len: usize) -> bool {
        let base = self.res.base();
        let Some(end) = addr.checked_add(len) else { return false };
        let (lo, hi) = (addr.max(base), end.min(base + self.res.len()));
        if lo >= hi {
            return false;
        }
        // the last block starting before the range's last page reaches into it, or none does
        let last = (hi - 1 - base) / self.ps;
        self.blocks.range(..=last).next_back().is_some_and(|(&key, b)| base + (key + b.pages) * self.ps > lo)
    }

    /// Offsets (from the reservation base) of the whole pages spanned by a range.
    pub(super) fn page_span(&self, what: &'static str, addr: usize, len: usize) -> Result<(usize, usize)> {
        self.find(what, addr, len)?;
        let off = addr - self.res.base();
        Ok((off / self.ps * self.ps, (off + len).div_ceil(self.ps) * self.ps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vcopy::extent::Run;
    use crate::vcopy::frames::count_runs;

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
        /// later copies re-home them; frees leave survivors that adopt pages): after
        /// every call the per-extent frames, reference counts, live pages and run
        /// counts equal their per-page recount, and every block holds its bytes.
        #[test]
        fn arena_bookkeeping_matches_per_page_recount(ops in proptest::collection::vec(arena_op(), 1..24)) {
            let ps = crate::addr::page_size();
            let arena = Arena::with_config(Config { reserve_bytes: 16 << 20, ..Default::default() }).unwrap();
            // only this thread writes the arena's blocks: let frees adopt
            lock(&arena.shared).unwrap().sole_writer = true;
            let mut blocks: Vec<(HostAddr, usize)> = Vec::new();
            let mut model: Vec<Vec<u8>> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    ArenaOp::Alloc(n) => {
                        blocks.push((arena.alloc(n * ps).unwrap(), n));
                        model.push(vec![0; n * ps]);
                    }
                    ArenaOp::Dup(b, o, n) if !blocks.is_empty() => {
                        let (p, len) = blocks[b % blocks.len()];
                        let o = o % len;
                        let n = n.min(len - o);
                        let src = HostAddr(p.0 + o * ps);
                        blocks.push((arena.dup(src, n * ps).unwrap(), n));
                        model.push(model[b % model.len()][o * ps..(o + n) * ps].to_vec());
                    }
                    ArenaOp::Vcopy(d, s, dof, sof, n) if !blocks.is_empty() => {
                        let (dp, dl) = blocks[d % blocks.len()];
                        let (sp, sl) = blocks[s % blocks.len()];
                        let (dof, sof) = (dof % dl, sof % sl);
                        let n = n.min(dl - dof).min(sl - sof);
                        let (dst, src) = (HostAddr(dp.0 + dof * ps), HostAddr(sp.0 + sof * ps));
                        // overlapping ranges are refused (an error, nothing changed)
                        if arena.vcopy(dst, src, n * ps).is_ok() {
                            let bytes = model[s % model.len()][sof * ps..(sof + n) * ps].to_vec();
                            model[d % blocks.len()][dof * ps..(dof + n) * ps].copy_from_slice(&bytes);
                        }
                    }
                    ArenaOp::Write(b, o, n) if !blocks.is_empty() => {
                        let (p, len) = blocks[b % blocks.len()];
                        let o = o % len;
                        let n = n.min(len - o);
                        let byte = step as u8 + 1;
                        arena.fill(HostAddr(p.0 + o * ps), byte, n * ps).unwrap();
                        model[b % blocks.len()][o * ps..(o + n) * ps].fill(byte);
                    }
                    ArenaOp::Free(b) if !blocks.is_empty() => {
                        let (p, _) = blocks.remove(b % blocks.len());
                        model.remove(b % model.len());
                        arena.free(p).unwrap();
                    }
                    _ => {}
                }
                let g = lock(&arena.shared).unwrap();
                let checked = g.check_per_page();
                drop(g);
                proptest::prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
                for (k, (&(p, n), want)) in blocks.iter().zip(&model).enumerate() {
                    let mut got = vec![0; n * ps];
                    arena.read(p, &mut got).unwrap();
                    proptest::prop_assert!(got == *want, "block {} differs after step {}", k, step);
                }
            }
            for (p, _) in blocks {
                arena.free(p).unwrap();
            }
            proptest::prop_assert_eq!(arena.stats().memfd_pages_live, 0);
        }
    }
}
