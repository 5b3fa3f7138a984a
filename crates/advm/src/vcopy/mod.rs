//! Virtual copy (the mmapcopy paper) on stock Linux: an arena of memfd-backed blocks.
//!
//! An [`Arena`] reserves one large `PROT_NONE` range and places page-aligned blocks in
//! it; its calls take and return [`HostAddr`](crate::mem::HostAddr) and
//! [`PageRange`](crate::mem::PageRange) (raw pointers only in the C API). Each block
//! page is a *frame*: one page of a memfd, mapped either
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
//! A block left the only view of memfd pages by a free *adopts* them (`Inner::adopt`
//! in `frames.rs`): its unwritten runs become shared views again, so a copy whose
//! source is freed (`b = dup(a); free(a)`) keeps one home per page when rewritten.
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
//!
//! Files: `arena.rs` (the [`Arena`] handle, its state and locking, block placement
//! and lookup), `frames.rs` (frames, memfds and reference counts, hole punching,
//! `trim`), `copy.rs` (the copy engine: sharing, re-homing written pages, remapping),
//! `reaper.rs` (the thread that unmaps moved-aside page tables), `fork.rs` (the fork
//! gate and the freeze before a fork), `extent.rs` (run maps and free lists),
//! `calibrate.rs` ([`Arena::calibrate`]: what a copy costs on this machine).

mod arena;
mod calibrate;
mod copy;
mod extent;
mod fork;
mod frames;
mod reaper;

use serde::Serialize;

use crate::Error;
pub use arena::Arena;
pub use calibrate::Calibration;
pub use fork::ForkGate;

/// Default copy size, in whole pages, under which a copy is done by memcpy (the
/// paper's choice). Measured by `advm bench vcopy` (docs/vcopy.md): duplicating into
/// a new block by sharing beats memcpy from 1 page on (the new block's pages would
/// fault in anyway); copying into an existing, already written block beats memcpy in
/// time only from about 64 pages, but from 2 pages on it saves the destination's
/// memory, which is what a virtual copy is for.
pub const DEFAULT_SMALL_BLOCK_PAGES: usize = 2;

/// Arena settings: [`Config::default`], then the setters below (new settings may be
/// added, so the struct is not built field by field outside this crate).
#[derive(Debug, Clone)]
#[non_exhaustive]
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

impl Config {
    /// Sets [`Config::reserve_bytes`].
    pub fn reserve_bytes(mut self, bytes: usize) -> Self {
        self.reserve_bytes = bytes;
        self
    }

    /// Sets [`Config::vma_budget`].
    pub fn vma_budget(mut self, vmas: Option<usize>) -> Self {
        self.vma_budget = vmas;
        self
    }

    /// Sets [`Config::small_block_pages`].
    pub fn small_block_pages(mut self, pages: usize) -> Self {
        self.small_block_pages = pages;
        self
    }

    /// Sets [`Config::background_unmap`].
    pub fn background_unmap(mut self, on: bool) -> Self {
        self.background_unmap = on;
        self
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
#[non_exhaustive]
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
    /// Pages whose last view, a private one left by freeing the other views, was
    /// remapped shared onto its memfd page: later writes go there, no second copy
    /// (cumulative).
    pub pages_adopted: u64,
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

fn invalid(what: &'static str, why: String) -> Error {
    Error::InvalidArgument { what, why }
}
