//! Zero-copy move and swap of page ranges: SwapVA (Ataie & Yu) on stock Linux.
//!
//! A move or swap of page-aligned ranges is done by one of three engines, chosen per
//! operation and reported in the [`Outcome`]:
//!
//! - [`Engine::UffdMove`]: `UFFDIO_MOVE` (Linux 6.8+) moves page-table entries of
//!   private anonymous memory. It leaves VMAs alone. The destination must be empty: a
//!   single move first just tries (free when an earlier move vacated it) and empties it
//!   (`MADV_DONTNEED`) or copies instead only when the kernel finds pages there; a
//!   batch empties all its destinations with one vectored `process_madvise`.
//!   The kernel refuses pages shared with another mapping (copy-on-write after fork,
//!   KSM: `EBUSY`); advm then copies those bytes instead.
//! - [`Engine::Mremap`]: `mremap(MREMAP_MAYMOVE|MREMAP_FIXED)` moves whole page tables
//!   when source, destination and length are 2 MiB aligned, so it is used for large
//!   aligned moves. It splits VMAs (a few per move), so advm stops using it
//!   when the process's VMA count nears half of `vm.max_map_count`. Into an empty
//!   destination (its first page sampled with `mincore`) a move is one `mremap` with
//!   `MREMAP_DONTUNMAP` where the kernel allows it with `MREMAP_FIXED` (probed once;
//!   any mapping since Linux 5.13): the source keeps its mapping with empty page
//!   tables. Into a destination holding pages, private anonymous memory is
//!   *exchanged* (three DONTUNMAP remaps through a scratch area: the source gets the
//!   destination's old page tables), since freeing a populated range costs about as
//!   much as copying it. Without DONTUNMAP: a plain remap and fresh anonymous memory
//!   mapped at the source (two calls).
//! - [`Engine::Memmove`]: plain `memmove` (or a byte swap), for operations shorter than
//!   the **break-even**, which is measured on this machine at first use and cached
//!   (see [`break_even`]).
//!
//! # Semantics
//!
//! - **Destination**: afterwards holds the source's old bytes, whatever the engine.
//! - **Source of a move**: stays mapped, with the same protection. Its *vacated* bytes
//!   (those not overwritten by the destination) are unspecified: zero where pages were
//!   moved (the pages are gone; the next touch faults in a zero page), the old bytes
//!   where memmove copied them. [`Outcome`] says how many bytes each engine handled.
//!   After an mremap move into an empty destination it reads as zeros too (a
//!   file-backed view's source gets fresh anonymous memory); after an exchange it
//!   holds the destination's old bytes.
//! - **Swap**: both ranges keep their mappings and exchange contents. Swap ranges must
//!   not overlap (an overlapping swap is an error); a slide within one region is a
//!   move with overlapping ranges, done with O(n+δ) page-table work (see [`Batch`]).
//! - **Huge pages**: UFFDIO_MOVE moves a transparent huge page whole (one PMD) when
//!   the move covers it and both ends are 2 MiB aligned, and splits it otherwise;
//!   mremap moves PMDs of aligned ranges whole.
//! - **memfd and shared memory**: page engines change which pages an address shows, not
//!   the file, so for `MAP_SHARED` mappings advm always copies bytes (other sharers see
//!   the change). `MAP_PRIVATE` file mappings (e.g. virtual-copy views of a memfd) are
//!   moved with mremap: pages not yet written keep sharing the file's page cache.
//! - **Memory owned by an allocator**: a grant over memory whose mappings someone else
//!   keeps records of, such as the blocks of a virtual-copy arena ([`crate::vcopy`]),
//!   breaks the promise [`crate::mem::Grant::for_caller_memory`] asks for: a page
//!   engine would remap a block's view behind the arena's back (its later frees and copies would read the wrong
//!   pages). Such ranges may only be copied: [`Choice::Only`]`(`[`Engine::Memmove`]`)`,
//!   [`Batch::push_move_by_copy`], [`Batch::push_swap_by_copy`]; between two blocks of
//!   one arena, `Arena::vcopy` keeps the pages shared. The C API does this itself: it
//!   recognises arena mappings and routes them (see `include/advm.h`).
//! - **Concurrent readers**: each page switches atomically from old to new content
//!   (page-table entries are swapped under the page-table lock); a thread reading a
//!   destination during a move sees, per page, the old bytes, zeros, or the new bytes,
//!   never a mix within one page, and never faults. Readers of a source may see zeros.
//! - **fork**: a child inherits advm's userfaultfd, whose ioctls act on the parent's
//!   memory; a child therefore never uses it (mremap or memmove instead).
//! - **Errors**: arguments are checked, and the scratch area swaps need is made, before
//!   anything changes (alignment, wrap-around, mapped and read-write, overlapping
//!   swaps); a page move the kernel refuses midway is completed by copying. Only a
//!   failing `madvise` (emptying destinations) or, without DONTUNMAP, the `mmap` after
//!   a remap can stop an operation after it changed memory; nothing is rolled back
//!   then, and [`Batch::execute_with_progress`] says how far the batch got
//!   ([`Incomplete`]).
//!
//! # VMA count
//!
//! The UFFDIO_MOVE and memmove engines never change the VMA count (registering a range
//! for UFFDIO_MOVE is done once per whole mapping, which does not split it). Only the
//! mremap engine adds VMAs (each of its remaps can split the mapping it lands in: at
//! most 6 per exchange), and advm stops choosing it when the count could reach half of
//! `vm.max_map_count` (re-counted from /proc/self/maps when the worst case since the
//! last count reaches a quarter of it, and every 1024 mremap moves).

mod batch;
mod breakeven;
mod engine;
mod intervals;
mod region;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::sys::lazy::Lazy;

use serde::Serialize;

use batch::*;
pub use batch::{move_pages, move_pages_with, swap_pages, swap_pages_with, Batch};
pub use breakeven::{
    break_even, cache_path, measure_break_even, set_break_even_pages, BreakEven, BreakEvenSource, CompactionPoint,
    CurvePoint, ENV_BREAK_EVEN,
};
use engine::*;
use intervals::IntervalSet;

use crate::mem::{page_size, Grant as MemGrant, HostAddr, PageRange};
use crate::sys::mman::grant::{self, Grant, Known, RwMapping};
use crate::sys::mman::Prot;
use crate::sys::procmap::{self, Vma};
use crate::sys::uffd::{feature, Partial, Userfaultfd};
use crate::sys::Errno;
use crate::{Error, Result};

/// 2 MiB: one PMD of page tables, the unit mremap moves whole.
pub const PMD_SIZE: usize = 2 << 20;
/// 1 GiB: one PUD entry, which mremap moves whole when both ends are 1 GiB aligned.
pub const PUD_SIZE: usize = 1 << 30;

/// A way to move pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// `UFFDIO_MOVE`: page-table entries move; VMAs stay as they are.
    UffdMove,
    /// `mremap(MREMAP_MAYMOVE|MREMAP_FIXED)`: mappings (whole page tables when
    /// 2 MiB aligned) move; VMAs split.
    Mremap,
    /// `memmove` (a byte swap for swaps).
    Memmove,
}

impl Engine {
    /// Every engine.
    pub const ALL: [Engine; 3] = [Engine::UffdMove, Engine::Mremap, Engine::Memmove];
    /// Short name, as in reports.
    pub fn name(self) -> &'static str {
        match self {
            Engine::UffdMove => "uffd-move",
            Engine::Mremap => "mremap",
            Engine::Memmove => "memmove",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which engine to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Choice {
    /// Chosen per operation: memmove under the break-even, mremap for 2 MiB-aligned
    /// moves of 2 MiB or more, UFFDIO_MOVE otherwise.
    #[default]
    Auto,
    /// Always this engine (an error when it cannot do the operation).
    Only(Engine),
}

/// How to run moves and swaps.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Engine choice.
    pub engine: Choice,
    /// Break-even in pages (operations shorter than this are copied); `None`: the
    /// machine's measured value ([`break_even`]).
    pub break_even_pages: Option<usize>,
    /// Merge operations whose source and destination both continue the previous one
    /// (adjacent objects of a compaction) into one.
    pub coalesce: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { engine: Choice::Auto, break_even_pages: None, coalesce: true }
    }
}

/// What an operation (or batch) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Operations asked for.
    pub ops: usize,
    /// Operations executed after coalescing.
    pub merged_ops: usize,
    /// Bytes moved (or swapped) by UFFDIO_MOVE.
    pub uffd_move_bytes: usize,
    /// Bytes moved by mremap.
    pub mremap_bytes: usize,
    /// Bytes copied (memmove or byte swap).
    pub memmove_bytes: usize,
    /// Of the copied bytes, those a page engine was asked to move but the kernel refused
    /// (shared or copy-on-write pages, incompatible mappings).
    pub fallback_bytes: usize,
    /// System calls made that move, remap, empty or register memory (not the
    /// read-only one-page `mincore` sample of an mremap move's destination).
    pub syscalls: u32,
    /// Operations (as queued) that ran completely: all of them on success.
    pub completed_ops: usize,
}

impl Outcome {
    /// The engine that handled most bytes (`None` for an empty operation).
    pub fn engine(&self) -> Option<Engine> {
        let v = [
            (self.uffd_move_bytes, Engine::UffdMove),
            (self.mremap_bytes, Engine::Mremap),
            (self.memmove_bytes, Engine::Memmove),
        ];
        v.iter().filter(|(b, _)| *b > 0).max_by_key(|(b, _)| *b).map(|&(_, e)| e)
    }
}

/// True when UFFDIO_MOVE can be used here (Linux 6.8+ with userfaultfd write-protect;
/// not in a forked child of a process that already used it).
pub fn uffd_move_available() -> bool {
    uffd().is_some()
}

/// The VMA ceiling the mremap engine keeps under: half of `vm.max_map_count`.
pub fn vma_budget() -> usize {
    (crate::probe::facts().max_map_count as usize) / 2
}

/// A batch that stopped with an error: how far it got.
#[derive(Debug)]
pub struct Incomplete {
    /// The error.
    pub error: Error,
    /// Operations (as queued, counted from the first) that ran completely. The
    /// operation at this index may be partly done (a move: each page is at its source
    /// or at its destination; a swap: parts may be swapped); later ones did not run.
    pub completed_ops: usize,
    /// False when the batch stopped before changing any memory (arguments, scratch
    /// areas): then nothing ran and memory is as it was. True when a kernel call failed
    /// after the first change; besides the partly done operation, destinations of later
    /// moves may then already have been emptied (they read as zeros).
    pub memory_changed: bool,
    /// What was done up to the error.
    pub outcome: Outcome,
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (after {} of {} operations)", self.error, self.completed_ops, self.outcome.ops)
    }
}

impl std::error::Error for Incomplete {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests;
