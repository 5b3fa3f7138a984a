//! The heap's spaces in `advm::pager` regions: the collector tells the pager which
//! pages hold garbage (Cooper, Nettles & Subramanian, LFP 1992).
//!
//! - The spaces start discardable (all free). Every range a collection frees (the nursery after a minor collection, the old
//!   generation's from-space and tails after a full or major one) is marked
//!   *discardable* through the free hook: under pressure the pager drops those pages
//!   instead of writing them, and a later touch gets zeros without a read.
//! - Before the heap writes into a range again (a new allocation buffer, a direct or
//!   large object, the to-space of a minor collection, the destination of a
//!   compaction or copy-back) it marks the range *needed* (bit flips, no system call).
//! - With [`Paging::flush_after_major`] every discardable page still resident is
//!   dropped after each full or major collection, inside its pause (the paper's
//!   user-initiated pre-flush, PU).
//!
//! Large objects in a pager region are moved by memmove, never by page remapping:
//! the pager keeps each page's state (resident, swapped and its slot, discardable) by
//! its address, so a page moved by `mremap` or `UFFDIO_MOVE` would leave that state
//! behind (a swapped-out page is not even there to move), and `mremap` of a range
//! registered with the pager's userfaultfd drops the registration on the moved pages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError, Weak};

use advm::mem::{page_size, PageRange};
use advm::pager::{PagedRegion, Pager};

use crate::heap::{FreeHook, Inner};
use crate::raw::Span;
use crate::stats::Collection;
use crate::Result;

/// This process's paged heaps, for the fork handler.
static HEAPS: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());
/// Held around every use of [`HEAPS`] and from a fork's prepare handler to its
/// parent or child handler: so no thread holds [`HEAPS`]' lock at a fork, and the
/// child's handler (the only thread there) finds it free.
static ENLISTING: AtomicBool = AtomicBool::new(false);

fn hold() {
    while ENLISTING.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::thread::yield_now();
    }
}

extern "C" fn release() {
    ENLISTING.store(false, Ordering::Release);
}

extern "C" fn prepare() {
    hold();
}

extern "C" fn child() {
    // Never taken here (see `ENLISTING`); poisoned, its list is still whole.
    let heaps = match HEAPS.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    };
    for h in heaps.iter().flat_map(|g| g.iter()).filter_map(Weak::upgrade) {
        h.mark_forked();
    }
    release();
}

/// Lists a paged heap for the fork handler, which makes its object access fail in a
/// forked child (where its memory, the pager's regions, is not mapped): the heap
/// checks the pager only when a handle's epoch does not match (see `Inner::checked`).
pub(crate) fn enlist(inner: &Arc<Inner>) -> Result<()> {
    advm::process::at_fork(prepare, release, child)?;
    hold();
    let mut heaps = HEAPS.lock().unwrap_or_else(PoisonError::into_inner);
    heaps.retain(|w| w.strong_count() > 0);
    heaps.push(Arc::downgrade(inner));
    drop(heaps);
    release();
    Ok(())
}

/// Heap spaces placed in regions of a pager (see [`crate::Config::paging`]).
#[derive(Debug, Clone)]
pub struct Paging {
    /// The pager whose regions hold the spaces; the heap keeps it alive.
    pub pager: Arc<Pager>,
    /// Drop the resident discardable pages after each full or major collection (PU).
    pub flush_after_major: bool,
}

impl Paging {
    /// Spaces in `pager`'s regions, no flush after major collections (PO, or PF when
    /// the pager pre-flushes on its own).
    pub fn new(pager: Arc<Pager>) -> Self {
        Paging { pager, flush_after_major: false }
    }
}

/// The pager regions of one heap, unmapped with it.
pub(crate) struct PagedSpaces {
    paging: Paging,
    regions: Vec<PagedRegion>,
}

impl std::fmt::Debug for PagedSpaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedSpaces").field("regions", &self.regions).finish()
    }
}

impl PagedSpaces {
    /// Maps one pager region per length; returns their spans in the same order.
    pub(crate) fn map(paging: Paging, lens: &[usize]) -> Result<(Self, Vec<Span>)> {
        let mut spaces = PagedSpaces { paging, regions: Vec::new() };
        let mut spans = Vec::new();
        for &len in lens {
            let r = spaces.paging.pager.map(len)?;
            // all free: discardable until the heap marks a range needed to use it
            r.mark_discardable(0, r.len() / page_size())?;
            let base = r.as_ptr() as usize;
            spans.push(Span { base, end: base + r.len() });
            spaces.regions.push(r);
        }
        Ok((spaces, spans))
    }

    /// The free hook of a paged heap: freed ranges become discardable, then `user`
    /// (the hook the heap was configured with, if any) sees them.
    pub(crate) fn free_hook(&self, mut user: Option<FreeHook>) -> FreeHook {
        let pager = self.paging.pager.clone();
        Box::new(move |r: PageRange| {
            // inside one of the heap's regions by construction
            let _ = pager.discardable(r.start().0, r.len());
            if let Some(h) = user.as_mut() {
                h(r);
            }
        })
    }

    /// Marks the pages holding `[a, a+len)` needed.
    fn needed(&self, a: usize, len: usize) {
        let ps = page_size();
        let (s, e) = (a & !(ps - 1), (a + len).next_multiple_of(ps));
        if e > s {
            // inside one of the heap's regions by construction
            let _ = self.paging.pager.needed(s, e - s);
        }
    }

    /// Ok in the process that made the pager (see [`Pager::usable`]).
    #[inline]
    pub(crate) fn usable(&self) -> Result<()> {
        Ok(self.paging.pager.usable()?)
    }

    /// PU: drops every resident discardable page of the heap's regions.
    fn flush(&self) {
        for r in &self.regions {
            let _ = self.paging.pager.flush_discardable(r.as_ptr() as usize, r.len());
        }
    }
}

impl Drop for PagedSpaces {
    fn drop(&mut self) {
        for r in self.regions.drain(..) {
            let _ = self.paging.pager.unmap(r);
        }
    }
}

impl Inner {
    /// The heap is about to write `[a, a+len)`: in a paged heap its pages become needed.
    #[inline]
    pub(crate) fn reuse(&self, a: usize, len: usize) {
        if let Some(p) = &self.paged {
            p.needed(a, len);
        }
    }

    /// After a collection, world still stopped: PU's flush after a full or major one.
    pub(crate) fn after_collection(&self, c: &Collection) {
        if let Some(p) = &self.paged {
            if p.paging.flush_after_major && c.kind != "minor" {
                p.flush();
            }
        }
    }
}
