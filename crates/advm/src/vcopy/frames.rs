//! Frames and their memfd pages: what each block page shows ([`Frame`], kept per run
//! in a block's [`RunMap`]), the memfds pages come from, reference counts per run of
//! memfd pages, and giving pages back to the kernel (hole punching on the last
//! reference, [`Inner::trim`] for pages every sharer rewrote).

use std::collections::BTreeMap;

use super::arena::Inner;
use super::extent::{Count, Extents, Run, RunMap};
use crate::sys::mman::Share;
use crate::{Error, Result};

/// One block page: which memfd page it shows, and how. In a [`RunMap`] it labels a
/// run: page `k` further on shows memfd page `page + k` of the same file, same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) page: u32,
    /// Index into `Inner::files` (a new memfd per fork: 65536 is plenty).
    pub(super) file: u16,
    pub(super) private: bool,
}

impl Frame {
    /// A page of a block being made by `dup`, not yet given its copy: unmapped
    /// (`PROT_NONE`), owns no memfd page. Never outlives the `dup` call.
    pub(super) const UNBACKED: Frame = Frame { page: u32::MAX, file: u16::MAX, private: false };

    pub(super) fn unbacked(&self) -> bool {
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
pub(super) struct Block {
    pub(super) frames: RunMap<Frame>,
    pub(super) pages: usize,
}

#[derive(Debug)]
pub(super) struct MemFile {
    /// Checked before every use: the program may have closed the number ([`Held`]).
    pub(super) fd: crate::sys::memfd::Held,
    /// Reference counts per run of pages with the same count; unreferenced pages
    /// are absent.
    pub(super) refs: RunMap<Count>,
    pub(super) free: Extents,
    pub(super) live: usize,
    /// Retired by a fork: never punched, never reused, closed when unused.
    pub(super) retired: bool,
}

/// What an arena memfd's error names when the program closed its descriptor.
pub(super) const CLOSED: &str = "arena memfd (its descriptor was closed by the program)";

/// A run of block pages: (first index, pages, frame of the first page).
pub(super) type Piece = (usize, usize, Frame);

/// Appends `p` to `runs`, merged into the last run when it directly continues it.
pub(super) fn push_run(runs: &mut Vec<Piece>, p: Piece) {
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
pub(super) fn lay_out(spans: &[(usize, usize)], fresh: &[(Frame, usize)]) -> Vec<Piece> {
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
pub(super) fn intersect(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
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
pub(super) fn subtract(run: (usize, usize), minus: &[(usize, usize)]) -> Vec<(usize, usize)> {
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
pub(super) fn count_runs(frames: &[Frame]) -> usize {
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

impl Inner {
    pub(super) fn file(&mut self, id: u16) -> &mut MemFile {
        self.files[id as usize].as_mut().expect("frames only name open files")
    }

    /// The memfd new pages come from (a fresh one after a fork retired the last).
    /// A memfd the program closed is retired as after a fork: its pages stay mapped where
    /// they are shown, and new pages come from a new one.
    pub(super) fn active_file(&mut self) -> Result<u16> {
        if let Some(id) = self.active {
            if self.file(id).fd.intact() {
                return Ok(id);
            }
            self.file(id).retired = true;
            self.active = None;
        }
        let fd = crate::sys::memfd::create("advm-arena")?;
        crate::sys::memfd::set_len(&fd, self.res.len() as u64)?;
        let fd = crate::sys::memfd::Held::new(fd)?;
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
    pub(super) fn new_frames(&mut self, n: usize) -> Result<Vec<(Frame, usize)>> {
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
    pub(super) fn incref(&mut self, runs: &[(Frame, usize)]) {
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
    pub(super) fn decref(&mut self, runs: &[(Frame, usize)]) -> Result<()> {
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
                match f
                    .fd
                    .get(CLOSED)
                    .and_then(|fd| crate::sys::memfd::punch_hole(fd, (start * ps) as u64, (n * ps) as u64))
                {
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
    pub(super) fn map_frames(&mut self, key: usize, runs: &[Piece]) -> Result<()> {
        for &(i, n, fr) in runs {
            let share = if fr.private { Share::Private } else { Share::Shared };
            self.remap(key + i, n, share, fr.file, fr.page, false)?;
        }
        Ok(())
    }

    /// Sets `runs` (`(index, len, frame)`) into block `key`'s frames, keeping the
    /// arena's run count.
    pub(super) fn set_frames(&mut self, key: usize, runs: &[Piece]) {
        let block = self.blocks.get_mut(&key).expect("live block");
        let before = block.frames.runs();
        for &(i, l, f) in runs {
            block.frames.set(i, l, f);
        }
        self.run_vmas = self.run_vmas - before + block.frames.runs();
    }

    /// After a free (`freed`: the freed block's frame runs, already decref'd): memfd
    /// pages left with one view (`b = dup(a); free(a)`, R's `y <- x; x <- NULL`). That
    /// view is private, so each later write would put a private copy beside a memfd
    /// page nobody else reads: two homes. Each run of at least `small` such pages
    /// becomes their one home: stretches it has not written are remapped shared onto
    /// the same memfd pages (same bytes; the block's records become a single owner's),
    /// stretches it wrote already hold their own copy, so their memfd pages are punched
    /// (as [`Inner::trim`] would, the count staying 1 until the block lets go).
    ///
    /// Threads: a write into an unwritten stretch between the pagemap read and the
    /// remap would land in a private copy the remap discards. That write is no misuse
    /// (it touches the survivor, not the freed block) and the arena lock does not stop
    /// it, so, as the preload shim does, unwritten stretches are remapped only while
    /// no other thread can write: the process has no thread besides this one and the
    /// arena's reaper (which never touches block bytes). Otherwise they stay private
    /// views (correct; two homes once rewritten, until `trim`). A signal handler on
    /// this thread that writes the survivor during `free` is not guarded against.
    pub(super) fn adopt(&mut self, freed: &[(Frame, usize)]) -> Result<()> {
        // memfd pages now seen once, in runs long enough to be worth a mapping
        let small = self.small;
        let mut found: Vec<(u16, usize, usize)> = Vec::new();
        for &(fr, n) in freed.iter().filter(|r| !r.0.unbacked() && r.1 >= small) {
            // retired pages may be read by the other side of a fork: never written here
            let Some(f) = self.files[fr.file as usize].as_ref().filter(|f| !f.retired) else { continue };
            for (s, l, c) in f.refs.pieces(fr.page as usize, fr.page as usize + n) {
                if c.0 == 1 && l >= small {
                    found.push((fr.file, s, l));
                }
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        // disjoint (a block may have shown the same pages twice)
        found.sort_unstable();
        let mut lone: BTreeMap<(u16, usize), usize> = BTreeMap::new();
        let mut last: Option<(u16, usize)> = None;
        for (file, s, l) in found {
            match last.and_then(|k| lone.get_mut(&k).map(|ml| (k, ml))) {
                Some(((lf, ls), ml)) if lf == file && ls + *ml >= s => *ml = (*ml).max(s + l - ls),
                _ => {
                    lone.insert((file, s), l);
                    last = Some((file, s));
                }
            }
        }
        // their one view each: (block, index, len, frame), private by construction
        let mut views: Vec<(usize, Piece)> = Vec::new();
        for (&key, b) in &self.blocks {
            for (i, l, f) in b.frames.iter().filter(|p| p.2.private && !p.2.unbacked()) {
                let (p, end) = (f.page as usize, f.page as usize + l);
                for (&(_, s), &sl) in lone.range((f.file, 0)..(f.file, end)).rev().take_while(|(k, &sl)| k.1 + sl > p) {
                    let (a, e) = (s.max(p), (s + sl).min(end));
                    if e - a >= small {
                        views.push((key, (i + (a - p), e - a, f.advance(a - p))));
                    }
                }
            }
        }
        let alone = views.is_empty() || self.no_other_writer();
        let ps = self.ps;
        for (key, (i, l, f)) in views {
            // pagemap read over this stretch only, not the block's pages before it
            let written: Vec<(usize, usize)> =
                self.written_runs(key + i, &[(0, l, f)])?.into_iter().map(|(w, wl)| (i + w, wl)).collect();
            for &(s, sl) in &written {
                let fd = self.files[f.file as usize].as_ref().expect("open").fd.get(CLOSED)?;
                crate::sys::memfd::punch_hole(fd, (f.page as usize + s - i) as u64 * ps as u64, (sl * ps) as u64)?;
            }
            if !alone {
                continue;
            }
            for (s, sl) in subtract((i, l), &written).into_iter().filter(|u| u.1 >= small) {
                // a stretch inside a run splits its VMA in three
                if self.vma_estimate() + 2 > self.budget {
                    break;
                }
                let home = Frame { private: false, ..f.advance(s - i) };
                // The old view's page tables may be moved aside: its pages are unwritten,
                // so the memfd pages are the bytes it shows, and nothing writes meanwhile.
                // A failed mmap leaves the private view, still correct.
                if self.remap(key + s, sl, Share::Shared, home.file, home.page, true).is_ok() {
                    self.set_frames(key, &[(s, sl, home)]);
                    self.stats.pages_adopted += sl as u64;
                }
            }
        }
        Ok(())
    }

    /// True when no thread of this process but the caller and this arena's reaper
    /// exists (`num_threads`, field 20 of /proc/self/stat), so none can write a block.
    pub(super) fn no_other_writer(&self) -> bool {
        #[cfg(test)]
        if self.sole_writer {
            return true;
        }
        let Ok(stat) = procfs::process::Process::myself().and_then(|p| p.stat()) else { return false };
        let reaper = self.reaper.as_ref().is_some_and(|(pid, _)| *pid == std::process::id());
        stat.num_threads <= 1 + i64::from(reaper)
    }

    pub(super) fn trim(&mut self) -> Result<u64> {
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
                    crate::sys::memfd::punch_hole(f.fd.get(CLOSED)?, (a * ps) as u64, (b * ps) as u64)?;
                    released += b as u64;
                }
            }
        }
        Ok(released)
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
}
