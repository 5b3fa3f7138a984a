//! Generational mode's minor collection: the live objects of the nursery are copied
//! (Cheney) to the top of the old generation's small space; the roots are the
//! mutators' roots, C's root slots and the remembered slots of the write barrier.
//! Afterwards the nursery is empty and its pages, which hold no live data, go to the
//! free hook.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use advm::mem::{page_align_up, page_size, PageRange, Reservation};

use crate::collect::GRANULE;
use crate::heap::{lock, nptrs_of, size_of, update_weak, Alloc, Inner, Roots, HDR};
use crate::raw::Span;
use crate::stats::Collection;
use crate::{Error, Result};

/// Copies the nursery's live objects into the old generation, with the world stopped.
/// Fails (copying nothing) when the old generation's reservation has no room for the
/// whole nursery above its top; the caller then runs a major collection first.
pub(crate) fn minor(inner: &Inner, why: &str) -> Result<Collection> {
    let mem = inner.mem;
    let mut alloc = lock(&inner.alloc);
    let roots = lock(&inner.roots);
    if inner.verify {
        // Before copying: the nursery parses and the barrier recorded every old slot
        // that points into it.
        crate::verify::check(inner, &alloc, &roots, false).map_err(Error::Corrupt)?;
    }
    let mut stacks: Vec<MutexGuard<'_, Vec<usize>>> = roots.stacks.iter().map(|s| lock(s)).collect();
    let index = lock(&inner.stats).totals.collections + 1;
    let mut c = Collection {
        index,
        engine: inner.engine(),
        kind: "minor",
        heap_before: alloc.used(&mem),
        decision: why.to_string(),
        ..Default::default()
    };
    let nursery_used = alloc.nursery_top - mem.nursery.base;
    if alloc.small_top + nursery_used > mem.small.end {
        return Err(Error::Corrupt("old generation reservation full before a minor collection".into()));
    }
    // the to-space: the end of the old generation
    inner.reuse(alloc.small_top, nursery_used);
    let t = Instant::now();
    let mut copy = Copier { inner, alloc: &mut alloc, objects: 0, bytes: 0 };
    let scan_from = copy.alloc.small_top;
    for s in stacks.iter_mut() {
        for v in s.iter_mut() {
            *v = copy.forward(*v);
        }
    }
    for s in &roots.slots {
        s.store(copy.forward(s.load()));
    }
    for slot in inner.remembered.take() {
        mem.store(slot, copy.forward(mem.load(slot)));
    }
    // Cheney scan of the copies: their slots are forwarded in turn.
    let mut a = scan_from;
    while a < copy.alloc.small_top {
        let h0 = mem.load(a);
        for i in 0..nptrs_of(h0) {
            let slot = a + HDR + 8 * i;
            mem.store(slot, copy.forward(mem.load(slot)));
        }
        a += size_of(h0);
    }
    // Weak roots of young objects: the copy's address, or null when it was not kept.
    let mut weak: Vec<MutexGuard<'_, Vec<usize>>> = roots.weak_stacks.iter().map(|s| lock(s)).collect();
    update_weak(&mut weak, &roots.weak_slots, |p| {
        if !mem.nursery.contains_object(p) {
            return p;
        }
        let to = mem.load(p - HDR + 8);
        c.weak_cleared += u64::from(to == 0);
        to
    });
    drop(weak);
    let (objects, bytes) = (copy.objects, copy.bytes);
    c.mark_ns = t.elapsed().as_nanos() as u64;
    c.move_ns = c.mark_ns;
    c.live_objects = objects;
    c.objects_memmove = objects;
    c.bytes_memmove = bytes;
    let freed_to = page_align_up(alloc.nursery_top).unwrap_or(alloc.nursery_top);
    alloc.nursery_top = mem.nursery.base;
    c.heap_after = alloc.used(&mem);
    if freed_to > mem.nursery.base {
        let r = PageRange::new("nursery from-space", mem.nursery.base, freed_to - mem.nursery.base)?;
        c.bytes_freed_pages = r.len();
        inner.freed(&mut lock(&inner.free_hook), r)?;
    }
    drop(stacks);
    if inner.verify {
        crate::verify::check(inner, &alloc, &roots, false).map_err(Error::Corrupt)?;
    }
    Ok(c)
}

struct Copier<'a> {
    inner: &'a Inner,
    alloc: &'a mut Alloc,
    objects: u64,
    bytes: u64,
}

impl Copier<'_> {
    /// The new address of `p`: copied on first sight when it is a nursery object
    /// (header word 1 keeps the copy's address), itself otherwise.
    fn forward(&mut self, p: usize) -> usize {
        let mem = &self.inner.mem;
        if !mem.nursery.contains_object(p) {
            return p;
        }
        let h = p - HDR;
        let top = self.alloc.nursery_top;
        // A slot written directly with a pointer into the nursery's unused part (or
        // into an object) would "copy" a zero-size object and take the next copy's
        // address: the collection fails instead.
        let bad = || panic!("a slot holds {p:#x}, not an object of this heap");
        if h >= top {
            bad();
        }
        let done = mem.load(h + 8);
        if done != 0 {
            return done;
        }
        let size = size_of(mem.load(h));
        if size < HDR || size > top - h {
            bad();
        }
        let to = self.alloc.small_top;
        mem.copy(to, h, size);
        mem.store(h + 8, to + HDR);
        if self.alloc.starts.last().map_or(true, |&l| to - l >= GRANULE) {
            self.alloc.starts.push(to);
        }
        self.alloc.small_top = to + size;
        self.alloc.small_clean = self.alloc.small_clean.max(self.alloc.small_top);
        self.objects += 1;
        self.bytes += size as u64;
        to + HDR
    }
}

/// The old generation's address space when it drifts (copy-back off): a `PROT_NONE`
/// reservation of four heaps, of which only the window the old generation can reach
/// until the next major collection is mapped read-write: one heap from its bottom.
/// A stray access anywhere else faults instead of reading stale bytes, and the pages
/// the old generation drifted away from hold no memory.
pub(crate) struct Drift {
    space: Reservation,
    /// Read-write part, `[start, end)` as addresses.
    window: Mutex<(usize, usize)>,
    /// One heap, page aligned: how far above its bottom the old generation can reach.
    reach: usize,
}

impl Drift {
    pub(crate) fn new(len: usize, reach: usize) -> Result<Self> {
        let space = Reservation::new(len)?;
        space.commit(0, reach)?;
        let base = space.base().0;
        Ok(Drift { space, window: Mutex::new((base, base + reach)), reach })
    }

    pub(crate) fn span(&self) -> Span {
        let r = self.space.range();
        Span { base: r.start().0, end: r.end().0 }
    }

    /// Before a major collection places the old generation at `bottom`: maps what the
    /// window lacks of `[bottom, bottom + reach)` (the to-space; the from-space stays
    /// mapped until the move is done).
    pub(crate) fn cover(&self, bottom: usize) -> Result<()> {
        let base = self.space.base().0;
        let (lo, hi) = (bottom & !(page_size() - 1), self.top_of(bottom));
        let mut w = lock(&self.window);
        if lo < w.0 {
            self.space.commit(lo - base, w.0 - lo)?;
            w.0 = lo;
        }
        if hi > w.1 {
            self.space.commit(w.1 - base, hi - w.1)?;
            w.1 = hi;
        }
        Ok(())
    }

    /// Lets the kernel free the pages of `r` (inside the window) when it needs memory.
    pub(crate) fn free_lazily(&self, r: PageRange) -> Result<()> {
        Ok(self.space.free_lazily(r.start().0 - self.space.base().0, r.len())?)
    }

    /// After the move: returns everything outside `[bottom, bottom + reach)` to
    /// `PROT_NONE` (the from-space's pages are freed with it).
    pub(crate) fn trim(&self, bottom: usize) -> Result<()> {
        let base = self.space.base().0;
        let (lo, hi) = (bottom & !(page_size() - 1), self.top_of(bottom));
        let mut w = lock(&self.window);
        if lo > w.0 {
            self.space.release(w.0 - base, lo - w.0)?;
            w.0 = lo;
        }
        if hi < w.1 {
            self.space.release(hi - base, w.1 - hi)?;
            w.1 = hi;
        }
        Ok(())
    }

    /// The window's end for an old generation starting at `bottom`.
    fn top_of(&self, bottom: usize) -> usize {
        let up = page_align_up(bottom + self.reach).unwrap_or(usize::MAX);
        up.min(self.space.range().end().0)
    }
}

/// Where a major collection of generational mode puts the `live` small old bytes: the
/// start of the reservation when they fit below the old generation (or when copy-back
/// brings them there anyway and nothing fits above), else right above the current old
/// generation (a to-space that does not overlap it). The reservation is four heaps
/// long, so the space above is always there while the old generation sits in the lower
/// half. With [`crate::Config::old_in_place`] (copy-back off): where the old
/// generation starts now (compacted in place).
pub(crate) fn place_old(inner: &Inner, alloc: &Alloc, live: usize) -> usize {
    let base = inner.mem.small.base;
    if inner.old_in_place && inner.generational.is_some_and(|g| !g.copy_back) {
        return alloc.small_bottom;
    }
    if base + live <= alloc.small_bottom {
        return base;
    }
    if alloc.small_top + live + inner.heap_bytes <= inner.mem.small.end {
        alloc.small_top
    } else {
        base
    }
}

/// SML/NJ's copy-back: the old generation, compacted to `[from, top)`, is block-copied
/// to the start of the reservation and every pointer into it (object slots, roots) is
/// shifted by the distance. Returns the bytes copied.
pub(crate) fn copy_back(
    inner: &Inner,
    alloc: &mut Alloc,
    stacks: &mut [MutexGuard<'_, Vec<usize>>],
    weak: &mut [MutexGuard<'_, Vec<usize>>],
    roots: &Roots,
) -> u64 {
    let mem = inner.mem;
    let (base, from, top) = (mem.small.base, alloc.small_bottom, alloc.small_top);
    if from == base {
        return 0;
    }
    let shift = from - base;
    // an object's pointer is its header's address + HDR, so the last object's may
    // be `top` itself (an object with no pointers and no bytes is a bare header)
    let moved = |p: usize| if p >= from + HDR && p <= top { p - shift } else { p };
    inner.reuse(base, top - from);
    mem.copy(base, from, top - from);
    let new_top = top - shift;
    let fix = |h: usize| {
        for i in 0..nptrs_of(mem.load(h)) {
            let slot = h + HDR + 8 * i;
            mem.store(slot, moved(mem.load(slot)));
        }
    };
    let mut a = base;
    while a < new_top {
        fix(a);
        a += size_of(mem.load(a));
    }
    for &h in &alloc.large {
        fix(h);
    }
    for s in stacks.iter_mut() {
        for v in s.iter_mut() {
            *v = moved(*v);
        }
    }
    for s in &roots.slots {
        s.store(moved(s.load()));
    }
    update_weak(weak, &roots.weak_slots, moved);
    for s in alloc.starts.iter_mut() {
        *s -= shift;
    }
    alloc.small_bottom = base;
    alloc.small_top = new_top;
    (top - from) as u64
}
