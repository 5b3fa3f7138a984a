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
//!   keeps records of, such as the blocks of a virtual-copy arena ([`crate::cow`]),
//!   breaks the promise [`Grant::new`] asks for: a page engine would remap a block's
//!   view behind the arena's back (its later frees and copies would read the wrong
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
//! `vm.max_map_count` (re-counted from /proc/self/maps every 32 mremap moves).

mod breakeven;
mod intervals;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;

pub use breakeven::{
    break_even, cache_path, measure_break_even, set_break_even_pages, BreakEven, BreakEvenSource, CurvePoint,
    ENV_BREAK_EVEN,
};
use intervals::IntervalSet;

use crate::addr::{page_size, PageRange};
use crate::sys::grant::{self, Grant, Known, RwMapping};
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

/// Process-wide kernel resources: one userfaultfd for UFFDIO_MOVE and a registered
/// scratch area for swaps.
struct Kernel {
    uffd: Option<Userfaultfd>,
    scratch: Mutex<Option<RwMapping>>,
    /// 2 MiB-aligned scratch address space for mremap exchanges (grown on demand).
    remap_scratch: Mutex<Option<RwMapping>>,
}

/// Bytes of scratch used per swap step (swaps of more are done in steps).
const SCRATCH_LEN: usize = 16 << 20;

/// Set in a forked child of the process that opened the userfaultfd: the child inherits
/// the fd, but its ioctls would act on the parent's memory. A flag set by a fork
/// handler costs nothing per operation, where comparing process ids costs a `getpid`.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

extern "C" fn fork_nothing() {}

extern "C" fn fork_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}

fn kernel() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let want = feature::MOVE | feature::PAGEFAULT_FLAG_WP;
        let uffd = Userfaultfd::probe()
            .ok()
            .filter(|i| i.features & want == want)
            // Without the fork handler a child could not tell it is one: no userfaultfd.
            .filter(|_| crate::sys::fork::at_fork(fork_nothing, fork_nothing, fork_child).is_ok())
            .and_then(|_| Userfaultfd::new(want, true).ok());
        Kernel { uffd, scratch: Mutex::new(None), remap_scratch: Mutex::new(None) }
    })
}

/// The process's userfaultfd, unless this is a forked child of the process that
/// opened it.
fn uffd() -> Option<&'static Userfaultfd> {
    kernel().uffd.as_ref().filter(|_| !FORKED_CHILD.load(Ordering::Relaxed))
}

/// True when UFFDIO_MOVE can be used here (Linux 6.8+ with userfaultfd write-protect;
/// not in a forked child of a process that already used it).
pub fn uffd_move_available() -> bool {
    uffd().is_some()
}

/// Estimated VMA count of this process, refreshed every few mremap moves.
static VMA_ESTIMATE: AtomicUsize = AtomicUsize::new(0);
static MREMAPS_SINCE_COUNT: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

/// The VMA ceiling the mremap engine keeps under: half of `vm.max_map_count`.
pub fn vma_budget() -> usize {
    (crate::probe::facts().max_map_count as usize) / 2
}

fn mremap_budget_ok() -> bool {
    if MREMAPS_SINCE_COUNT.load(Ordering::Relaxed) >= 32 {
        if let Ok(n) = procmap::vma_count() {
            VMA_ESTIMATE.store(n, Ordering::Relaxed);
        }
        MREMAPS_SINCE_COUNT.store(0, Ordering::Relaxed);
    }
    // A move is up to three remaps (an exchange), each of which can split the VMA it
    // lands in.
    let worst = VMA_ESTIMATE.load(Ordering::Relaxed) + 6 * (MREMAPS_SINCE_COUNT.load(Ordering::Relaxed) + 1);
    worst < vma_budget()
}

/// What kind of memory a range is, as far as engines care (ordered: a range of mixed
/// kinds is treated as its most restrictive part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    AnonPrivate,
    FilePrivate,
    Shared,
}

fn class_of(v: &Vma) -> Class {
    if v.shared {
        Class::Shared
    } else if v.file_backed {
        Class::FilePrivate
    } else {
        Class::AnonPrivate
    }
}

/// Checks that `[s, s+len)` is mapped read-write and returns its class.
fn check_mapped(what: &'static str, s: usize, len: usize, known: Known, seen: &mut Vec<Vma>) -> Result<Class> {
    if known == Known::PrivateAnonRw {
        return Ok(Class::AnonPrivate);
    }
    let e = s + len;
    let mut at = s;
    let mut class = Class::AnonPrivate;
    while at < e {
        let v = match seen.iter().find(|v| v.start <= at && at < v.end) {
            Some(v) => *v,
            None => {
                let v = procmap::query(at)?.ok_or_else(|| Error::InvalidArgument {
                    what,
                    why: format!("range {s:#x}+{len:#x}: address {at:#x} is not mapped"),
                })?;
                seen.push(v);
                v
            }
        };
        if !v.readable || !v.writable {
            return Err(Error::InvalidArgument {
                what,
                why: format!(
                    "range {s:#x}+{len:#x}: mapping {:#x}-{:#x} is {}, not read-write",
                    v.start,
                    v.end,
                    v.perms()
                ),
            });
        }
        class = class.max(class_of(&v));
        at = v.end;
    }
    Ok(class)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Move,
    Swap,
}

/// One queued operation: a move `dst <- src` or a swap `a <-> b` (a = `x`, b = `y`).
#[derive(Debug, Clone, Copy)]
struct Op {
    kind: Kind,
    x: usize,
    y: usize,
    len: usize,
    /// Copy bytes (memmove engine) whatever the options say.
    copy: bool,
}

/// Many moves and swaps executed together, in order, with as few kernel calls as the
/// kernel allows (the paper's aggregation):
///
/// - operations whose both ends continue the previous one are merged into one;
/// - all destinations that must be emptied are emptied with one vectored
///   `process_madvise(MADV_DONTNEED)` (one TLB flush), except where an earlier
///   operation of the batch wrote there, which is emptied just before its turn;
/// - destinations that an earlier page move of the batch already vacated are not
///   emptied at all (the compaction pattern: each object moves into the space the
///   previous one left);
/// - then one UFFDIO_MOVE (or mremap) per remaining operation. A move whose ranges
///   overlap (a slide by δ pages) costs one call when sliding down; sliding up, n/δ
///   calls when n/δ ≤ 4, else two calls per 16 MiB through a scratch area (2n entry
///   moves). Page-table work is O(n+δ) either way: never a bounce copy of bytes.
///
/// The result is as if the operations ran one after another.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    ops: Vec<Op>,
    /// How to run it.
    pub options: Options,
}

impl Batch {
    /// An empty batch with default options.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty batch with `options`.
    pub fn with_options(options: Options) -> Self {
        Self { ops: Vec::new(), options }
    }
    /// Queues a move of `len` bytes from `src` to `dst` (ranges may overlap).
    pub fn push_move(&mut self, dst: usize, src: usize, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Move, x: dst, y: src, len, copy: false });
        self
    }
    /// Queues a swap of `len` bytes between `a` and `b` (ranges must not overlap).
    pub fn push_swap(&mut self, a: usize, b: usize, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Swap, x: a, y: b, len, copy: false });
        self
    }
    /// As [`Batch::push_move`], but always done by copying bytes (memory whose mappings
    /// someone else keeps records of, such as a virtual-copy arena's blocks: see the
    /// module doc's *Memory owned by an allocator*).
    pub fn push_move_by_copy(&mut self, dst: usize, src: usize, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Move, x: dst, y: src, len, copy: true });
        self
    }
    /// As [`Batch::push_swap`], but always done by swapping bytes.
    pub fn push_swap_by_copy(&mut self, a: usize, b: usize, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Swap, x: a, y: b, len, copy: true });
        self
    }
    /// Queued operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Forgets the queued operations (keeps the options).
    pub fn clear(&mut self) {
        self.ops.clear();
    }

    /// Runs the queued operations on memory `mem` grants. Nothing changes unless every
    /// operation's arguments are valid.
    pub fn execute(&self, mem: &mut Grant<'_>) -> Result<Outcome> {
        execute(mem, &self.ops, &self.options).map_err(|i| i.error)
    }

    /// As [`Batch::execute`], and on error says how far the batch got ([`Incomplete`]).
    pub fn execute_with_progress(&self, mem: &mut Grant<'_>) -> std::result::Result<Outcome, Box<Incomplete>> {
        execute(mem, &self.ops, &self.options)
    }
}

/// Moves `len` bytes from `src` to `dst` (page aligned; the ranges may overlap).
pub fn move_pages(mem: &mut Grant<'_>, dst: usize, src: usize, len: usize) -> Result<Outcome> {
    move_pages_with(mem, dst, src, len, &Options::default())
}

/// [`move_pages`] with explicit options.
pub fn move_pages_with(mem: &mut Grant<'_>, dst: usize, src: usize, len: usize, opts: &Options) -> Result<Outcome> {
    execute(mem, &[Op { kind: Kind::Move, x: dst, y: src, len, copy: false }], opts).map_err(|i| i.error)
}

/// Swaps the contents of `[a, a+len)` and `[b, b+len)` (page aligned, disjoint).
pub fn swap_pages(mem: &mut Grant<'_>, a: usize, b: usize, len: usize) -> Result<Outcome> {
    swap_pages_with(mem, a, b, len, &Options::default())
}

/// [`swap_pages`] with explicit options.
pub fn swap_pages_with(mem: &mut Grant<'_>, a: usize, b: usize, len: usize, opts: &Options) -> Result<Outcome> {
    execute(mem, &[Op { kind: Kind::Swap, x: a, y: b, len, copy: false }], opts).map_err(|i| i.error)
}

/// A step of a plan: an operation (possibly merged) with its engine.
#[derive(Debug, Clone, Copy)]
struct Step {
    op: Op,
    engine: Engine,
    class: Class,
    /// Index after the last queued operation this step does.
    end: usize,
    /// Whether both ranges lie inside one VMA each, when validation already learnt it
    /// (a lone operation: in a batch, earlier steps may split VMAs).
    one_vma_each: Option<bool>,
}

fn validate(mem: &Grant<'_>, op: &Op, seen: &mut Vec<Vma>) -> Result<Class> {
    let (xn, yn) = match op.kind {
        Kind::Move => ("dst", "src"),
        Kind::Swap => ("a", "b"),
    };
    let x = PageRange::new(xn, op.x, op.len)?;
    let y = PageRange::new(yn, op.y, op.len)?;
    if op.kind == Kind::Swap && x.overlaps(&y) {
        return Err(Error::InvalidArgument {
            what: "b",
            why: format!(
                "swap of {:#x}+{:#x} with {:#x}+{:#x}: the ranges overlap (swap needs disjoint ranges; \
                 to slide a block within a region, move it)",
                op.x, op.len, op.y, op.len
            ),
        });
    }
    for (what, r) in [(xn, x), (yn, y)] {
        if r.start().0 < mem.start() || r.end().0 > mem.end() {
            return Err(Error::InvalidArgument {
                what,
                why: format!(
                    "range {:#x}+{:#x} is outside the granted memory {:#x}-{:#x}",
                    r.start().0,
                    r.len(),
                    mem.start(),
                    mem.end()
                ),
            });
        }
    }
    if op.len == 0 {
        return Ok(Class::AnonPrivate);
    }
    let cx = check_mapped(xn, op.x, op.len, mem.known(), seen)?;
    let cy = check_mapped(yn, op.y, op.len, mem.known(), seen)?;
    Ok(cx.max(cy))
}

/// True when `b` continues `a` on both ends and running them merged equals running
/// them in order.
fn mergeable(a: &Op, b: &Op) -> bool {
    if a.kind != b.kind
        || a.copy != b.copy
        || a.x.checked_add(a.len) != Some(b.x)
        || a.y.checked_add(a.len) != Some(b.y)
    {
        return false;
    }
    match a.kind {
        // a's destination must not be b's source (b would read what a wrote).
        Kind::Move => a.x + a.len <= b.y || a.x >= b.y + b.len,
        Kind::Swap => {
            let (lo, hi) = (a.x.min(a.y), a.x.max(a.y));
            lo + a.len + b.len <= hi
        }
    }
}

fn choose(op: &Op, class: Class, opts: &Options, be_pages: usize, have_uffd: bool) -> Result<Engine> {
    let overlap = op.x < op.y + op.len && op.y < op.x + op.len;
    let uffd = have_uffd && class == Class::AnonPrivate;
    let aligned = op.x % PMD_SIZE == 0 && op.y % PMD_SIZE == 0 && op.len % PMD_SIZE == 0 && op.len > 0;
    let mremap_ok = op.kind == Kind::Move && !overlap && class != Class::Shared;
    if op.copy {
        return Ok(Engine::Memmove);
    }
    match opts.engine {
        Choice::Only(Engine::Memmove) => Ok(Engine::Memmove),
        Choice::Only(Engine::UffdMove) if uffd => Ok(Engine::UffdMove),
        Choice::Only(Engine::UffdMove) => Err(Error::Unsupported {
            what: "UFFDIO_MOVE",
            why: if have_uffd {
                "it moves only private anonymous memory".into()
            } else {
                "needs Linux 6.8+ with userfaultfd (and write-protect) available to this process".into()
            },
        }),
        Choice::Only(Engine::Mremap) if mremap_ok => Ok(Engine::Mremap),
        Choice::Only(Engine::Mremap) => Err(Error::Unsupported {
            what: "the mremap engine",
            why: "it moves disjoint ranges of private memory only (no swaps, no overlapping moves, no MAP_SHARED)"
                .into(),
        }),
        Choice::Auto => {
            if class == Class::Shared || op.len / page_size() < be_pages {
                Ok(Engine::Memmove)
            } else if mremap_ok && (aligned || !uffd) && mremap_budget_ok() {
                Ok(Engine::Mremap)
            } else if uffd {
                Ok(Engine::UffdMove)
            } else {
                Ok(Engine::Memmove)
            }
        }
    }
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

/// True when a UFFDIO_MOVE move slides up by a small δ, through the scratch area.
fn slides_up_via_scratch(op: &Op) -> bool {
    op.kind == Kind::Move && op.x > op.y && op.x < op.y + op.len && op.len / (op.x - op.y) > 4
}

fn execute(mem: &mut Grant<'_>, ops: &[Op], opts: &Options) -> std::result::Result<Outcome, Box<Incomplete>> {
    let mut out = Outcome { ops: ops.len(), ..Default::default() };
    match plan(mem, ops, opts, &mut out) {
        Ok(steps) => run_plan(mem, ops.len(), &steps, opts, &mut out).map(|_| out),
        Err(error) => Err(Box::new(Incomplete { error, completed_ops: 0, memory_changed: false, outcome: out })),
    }
}

/// The planned steps of a batch, with what they need made; nothing changed yet.
struct Plan {
    steps: Vec<Step>,
    k: Option<&'static Userfaultfd>,
}

/// Checks every operation, merges, chooses engines and makes what the steps need
/// (scratch area) before the first change, so that arguments and resources can only
/// fail here.
fn plan(mem: &Grant<'_>, ops: &[Op], opts: &Options, out: &mut Outcome) -> Result<Plan> {
    // 1. Check everything before changing anything.
    let mut seen = Vec::new();
    let mut classes = Vec::with_capacity(ops.len());
    for op in ops {
        classes.push(validate(mem, op, &mut seen)?);
    }
    // 2. Merge continuing operations; each keeps the index after its last queued op.
    let mut merged: Vec<(Op, Class, usize)> = Vec::with_capacity(ops.len());
    for (i, (op, class)) in ops.iter().zip(classes).enumerate() {
        if op.len == 0 {
            continue;
        }
        if let Some((last, lc, end)) = merged.last_mut() {
            if opts.coalesce && mergeable(last, op) {
                last.len += op.len;
                *lc = (*lc).max(class);
                *end = i + 1;
                continue;
            }
        }
        merged.push((*op, class, i + 1));
    }
    out.merged_ops = merged.len();
    let k = uffd();
    let be_pages = opts.break_even_pages.unwrap_or_else(|| breakeven::break_even_pages().0);
    let mut steps = Vec::with_capacity(merged.len());
    for (op, class, end) in &merged {
        let engine = choose(op, *class, opts, be_pages, k.is_some())?;
        steps.push(Step { op: *op, engine, class: *class, end: *end, one_vma_each: None });
    }
    if let [st] = steps.as_mut_slice() {
        if !seen.is_empty() {
            let inside_one = |a: usize| seen.iter().any(|v| v.start <= a && a + st.op.len <= v.end);
            st.one_vma_each = Some(inside_one(st.op.x) && inside_one(st.op.y));
        }
    }
    if let Some(k) = k {
        if steps
            .iter()
            .any(|st| st.engine == Engine::UffdMove && (st.op.kind == Kind::Swap || slides_up_via_scratch(&st.op)))
        {
            uffd_scratch_ready(k, out)?;
        }
    }
    Ok(Plan { steps, k })
}

fn run_plan(
    mem: &mut Grant<'_>,
    n_ops: usize,
    plan: &Plan,
    opts: &Options,
    out: &mut Outcome,
) -> std::result::Result<(), Box<Incomplete>> {
    let (steps, k) = (&plan.steps, plan.k);
    let stopped = |error: Error, completed_ops: usize, out: &Outcome| {
        Box::new(Incomplete { error, completed_ops, memory_changed: true, outcome: *out })
    };
    // A single operation needs no emptying plan: a UFFDIO_MOVE move does not empty its
    // destination first (it tries the move, free when the destination is empty, as
    // after an earlier move vacated it, and only empties it, or copies instead, when
    // the kernel finds pages there); the other engines replace the destination.
    if let [st] = steps.as_slice() {
        let state = if st.op.kind == Kind::Move && st.engine == Engine::UffdMove {
            DstState::Unknown {
                copy_below: match opts.engine {
                    Choice::Auto => opts.break_even_pages.unwrap_or_else(|| breakeven::break_even_pages().1),
                    Choice::Only(_) => 0,
                },
            }
        } else {
            DstState::Empty
        };
        run_step(k, mem, st, state, out).map_err(|e| stopped(e, 0, out))?;
        out.completed_ops = n_ops;
        return Ok(());
    }
    // 3. Plan which destinations to empty: up front (one vectored call) where no
    // earlier step touched them, just in time where an earlier step wrote there, and
    // not at all where an earlier page move left them empty.
    let mut touched = IntervalSet::default();
    let mut emptied = IntervalSet::default();
    let mut upfront: Vec<(usize, usize)> = Vec::new();
    // (step, start, end), in step order: flat, so a batch costs no allocation per step.
    let mut jit: Vec<(usize, usize, usize)> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let Op { kind, x, y, len, .. } = st.op;
        if kind == Kind::Move && st.engine == Engine::UffdMove {
            // The part of the destination not covered by its own source (the ranges
            // have equal lengths, so it is one interval).
            let (s, e) = if y <= x && x < y + len {
                (y + len, x + len)
            } else if x < y && y < x + len {
                (x, y)
            } else {
                (x, x + len)
            };
            upfront.extend(touched.outside(s, e));
            for (ts, te) in touched.inside(s, e) {
                jit.extend(emptied.outside(ts, te).map(|(a, b)| (i, a, b)));
            }
        }
        touched.insert(x, x + len);
        touched.insert(y, y + len);
        match (kind, st.engine) {
            (Kind::Move, Engine::UffdMove | Engine::Mremap) => {
                emptied.insert(y, y + len);
                emptied.remove(x, x + len);
            }
            _ => {
                emptied.remove(x, x + len);
                emptied.remove(y, y + len);
            }
        }
    }
    // 4. Run. Intervals are (start, end); zap takes (start, len).
    if !upfront.is_empty() {
        let ranges: Vec<_> = upfront.iter().map(|&(s, e)| (s, e - s)).collect();
        out.syscalls += mem.zap(&ranges).map_err(|e| stopped(e.into(), 0, out))?;
    }
    let mut jit = jit.into_iter().peekable();
    let mut now: Vec<(usize, usize)> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        now.clear();
        while let Some(&(_, s, e)) = jit.peek().filter(|j| j.0 == i) {
            now.push((s, e - s));
            jit.next();
        }
        let r = if now.is_empty() { Ok(()) } else { mem.zap(&now).map(|c| out.syscalls += c).map_err(Error::from) };
        r.and_then(|_| run_step(k, mem, st, DstState::Empty, out)).map_err(|e| stopped(e, out.completed_ops, out))?;
        out.completed_ops = st.end;
    }
    out.completed_ops = n_ops;
    Ok(())
}

fn run_step(
    k: Option<&Userfaultfd>,
    mem: &mut Grant<'_>,
    st: &Step,
    dst_state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let Op { kind, x, y, len, .. } = st.op;
    let need = || k.expect("uffd engine chosen only when available");
    match (kind, st.engine) {
        (Kind::Move, Engine::Memmove) => {
            mem.memmove(x, y, len)?;
            out.memmove_bytes += len;
        }
        (Kind::Swap, Engine::Memmove) => {
            mem.swap_bytes(x, y, len)?;
            out.memmove_bytes += len;
        }
        (Kind::Move, Engine::Mremap) => {
            // Into a destination holding pages (sampled: its first page resident),
            // private anonymous memory is exchanged: freeing a populated range costs
            // about as much as copying it. Else one remap; a file-backed view's vacated
            // source gets fresh anonymous memory (else it would show the file's bytes
            // again).
            let anon = st.class == Class::AnonPrivate && grant::dontunmap_fixed_available();
            let populated = anon && mem.page_resident(x)?;
            // Only ranges inside one VMA each. Kernels from 6.17 move a range that spans
            // several VMAs one VMA at a time, and a DONTUNMAP remap out of such a range
            // lost the pages of its first VMA here (the property test's saved case: a
            // move out of a range that an earlier move had made a VMA of its own). A
            // plain move replaces whatever maps the destination, so only its source
            // must be one VMA; an exchange also moves the destination away.
            let one_vma = match st.one_vma_each {
                Some(one) => one,
                None if populated => !crosses_vmas(x, y, len),
                None => vma_room(y) >= len,
            };
            let refused = if !one_vma {
                true
            } else {
                let r = match populated.then(|| mremap_exchange_via_scratch(mem, x, y, len)) {
                    // No scratch area (out of address space; the exchange's own calls
                    // are `mremap`): a plain move still works.
                    Some(Err(Error::Sys(e))) if e.call != "mremap" => mem
                        .mremap_move(x, y, len, Prot::READ | Prot::WRITE, st.class != Class::AnonPrivate)
                        .map_err(Error::from),
                    None => mem
                        .mremap_move(x, y, len, Prot::READ | Prot::WRITE, st.class != Class::AnonPrivate)
                        .map_err(Error::from),
                    Some(r) => r,
                };
                match r {
                    Ok(calls) => {
                        out.syscalls += calls;
                        out.mremap_bytes += len;
                        MREMAPS_SINCE_COUNT.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                    Err(Error::Sys(e)) if e.call == "mremap" => {
                        out.syscalls += 1;
                        true
                    }
                    Err(e) => return Err(e),
                }
            };
            if refused {
                // Refused before anything moved: fall back to moving entries, or copying.
                if let Some(k) = k {
                    move_or_copy(k, mem, x, y, len, DstState::Unknown { copy_below: 0 }, out)?;
                } else {
                    mem.memmove(x, y, len)?;
                    out.memmove_bytes += len;
                    out.fallback_bytes += len;
                }
            }
        }
        (Kind::Move, Engine::UffdMove) => {
            if slides_up_via_scratch(&st.op) {
                // Sliding up by a small δ: through the scratch area.
                slide_up_via_scratch(need(), mem, x, y, len, dst_state, out)?;
            } else if x > y && x < y + len {
                // Sliding up by δ: chunks of δ from the end, each into the space the
                // previous chunk vacated.
                let delta = x - y;
                let mut end = len;
                while end > 0 {
                    let start = end.saturating_sub(delta);
                    move_or_copy(need(), mem, x + start, y + start, end - start, dst_state, out)?;
                    end = start;
                }
            } else {
                // Disjoint, or sliding down: one forward pass; each destination page
                // is empty by the time the pass reaches it.
                move_or_copy(need(), mem, x, y, len, dst_state, out)?;
            }
        }
        (Kind::Swap, Engine::UffdMove) => swap_via_scratch(need(), mem, x, y, len, out)?,
        (Kind::Swap, Engine::Mremap) => unreachable!("choose() never picks mremap for a swap"),
    }
    Ok(())
}

/// [`grant::mremap_exchange`] through the process's mremap scratch area.
fn mremap_exchange_via_scratch(mem: &mut Grant<'_>, dst: usize, src: usize, len: usize) -> Result<u32> {
    let mut guard = kernel().remap_scratch.lock().unwrap_or_else(|p| p.into_inner());
    if !guard.as_ref().is_some_and(|m| m.len() >= len) {
        *guard = None; // unmap the smaller one first
                       // Aligned like the moves it serves, so its legs move PUDs where theirs can.
        let align = if len >= PUD_SIZE { PUD_SIZE } else { PMD_SIZE };
        *guard = Some(RwMapping::new(len.div_ceil(align) * align, align, false)?);
    }
    let scratch = guard.as_mut().expect("just created");
    let s = scratch.addr();
    Ok(grant::mremap_exchange(mem, dst, src, &mut scratch.grant(), s, len)?)
}

/// Where the source of a move lies.
enum Src<'s, 'a> {
    /// In the same grant as the destination.
    Same,
    /// In another grant (the scratch area).
    Other(&'s mut Grant<'a>),
}

fn uffd_once(
    k: &Userfaultfd,
    dst_g: &mut Grant<'_>,
    src: &mut Src<'_, '_>,
    dst: usize,
    s: usize,
    n: usize,
    holes: bool,
) -> Result<usize, Partial> {
    match src {
        Src::Same => dst_g.uffd_move(k, dst, s, n, holes),
        Src::Other(g) => grant::uffd_move_across(k, dst_g, dst, g, s, n, holes),
    }
}

/// What is known about a move's destination before the first UFFDIO_MOVE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DstState {
    /// Emptied (or vacated) by the planner.
    Empty,
    /// Not known: try moving without emptying it (free when it is empty, as when it was
    /// vacated by an earlier move); if it holds pages, copy instead when the move is
    /// shorter than `copy_below` pages, else empty it and move.
    Unknown { copy_below: usize },
}

/// Bytes from `addr` to the end of its VMA (0 when unmapped).
fn vma_room(addr: usize) -> usize {
    match procmap::query(addr) {
        Ok(Some(v)) => v.end - addr,
        _ => 0,
    }
}

/// True when `[dst, dst+n)` or `[src, src+n)` spans more than one VMA.
fn crosses_vmas(dst: usize, src: usize, n: usize) -> bool {
    let (a, b) = (vma_room(dst), vma_room(src));
    a > 0 && b > 0 && (a < n || b < n)
}

/// Registers the mapping around `dst` for UFFDIO_MOVE (whole VMA, so it is not split).
fn register_around(k: &Userfaultfd, mem: &mut Grant<'_>, dst: usize, len: usize, out: &mut Outcome) -> bool {
    let (s, e) = if mem.known() == Known::PrivateAnonRw {
        (mem.start(), mem.end())
    } else {
        match procmap::query(dst) {
            Ok(Some(v)) => (v.start, v.end.max(dst + len)),
            _ => return false,
        }
    };
    out.syscalls += 1;
    mem.register_for_move(k, s, e - s).is_ok()
}

/// Moves page-table entries `dst <- src`, finishing by copying whatever the kernel
/// refuses, and emptying the copied source so it reads like a moved one.
// The one planner primitive: every argument is a separate fact about the move.
#[allow(clippy::too_many_arguments)]
fn move_or_copy_from(
    k: &Userfaultfd,
    dst_g: &mut Grant<'_>,
    mut src: Src<'_, '_>,
    dst: usize,
    s: usize,
    n: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let mut done = 0;
    let mut retries = 0;
    // Holes in the source may be skipped only over an empty destination.
    let mut holes = state == DstState::Empty;
    let same = matches!(src, Src::Same);
    // The not-yet-moved destination minus the not-yet-moved source (a slide's overlap
    // must not be emptied), as (start, len) for zap.
    let dst_rest = |done: usize| -> Vec<(usize, usize)> {
        let mut own = IntervalSet::default();
        if same {
            own.insert(s + done, s + n);
        }
        own.subtract_from(dst + done, dst + n).into_iter().map(|(a, e)| (a, e - a)).collect()
    };
    // UFFDIO_MOVE wants each range inside one VMA; after mremap moves split a region,
    // a move may have to be cut at VMA boundaries.
    let mut split = false;
    while done < n {
        let step =
            if split { vma_room(dst + done).min(vma_room(s + done)).min(n - done).max(page_size()) } else { n - done };
        out.syscalls += 1;
        match uffd_once(k, dst_g, &mut src, dst + done, s + done, step, holes) {
            Ok(m) => {
                out.uffd_move_bytes += m.min(step);
                done += step;
            }
            Err(Partial { done: d, error }) => {
                out.uffd_move_bytes += d;
                done += d;
                match error.errno {
                    Errno::AGAIN if retries < 16 => retries += 1,
                    // The destination holds pages. Untouched and short: copying is
                    // cheaper than freeing them. Otherwise (or when a concurrent reader
                    // faulted a page back in) empty it and retry.
                    Errno::EXIST | Errno::NOENT if retries < 16 => {
                        if let DstState::Unknown { copy_below } = state {
                            if done == 0 && error.errno == Errno::EXIST && n / page_size() < copy_below {
                                match &mut src {
                                    Src::Same => dst_g.memmove(dst, s, n)?,
                                    Src::Other(g) => grant::copy_across(dst_g, dst, g, s, n)?,
                                }
                                out.memmove_bytes += n;
                                return Ok(());
                            }
                        }
                        retries += 1;
                        let rest = dst_rest(done);
                        if !rest.is_empty() {
                            out.syscalls += dst_g.zap(&rest)?;
                        }
                        holes = true;
                    }
                    // The move spans several VMAs (cut it at their boundaries), or the
                    // destination's mapping is not registered yet (register it): retry.
                    Errno::INVAL
                        if retries < 16
                            && if !split && crosses_vmas(dst + done, s + done, n - done) {
                                split = true;
                                true
                            } else {
                                register_around(k, dst_g, dst + done, n - done, out)
                            } =>
                    {
                        retries += 1
                    }
                    _ => {
                        let rest = n - done;
                        match &mut src {
                            Src::Same => dst_g.memmove(dst + done, s + done, rest)?,
                            Src::Other(g) => grant::copy_across(dst_g, dst + done, g, s + done, rest)?,
                        }
                        out.memmove_bytes += rest;
                        out.fallback_bytes += rest;
                        // Empty the copied source (not where it overlaps the destination).
                        let mut d = IntervalSet::default();
                        d.insert(dst, dst + n);
                        let zap: Vec<_> = match &src {
                            Src::Same => d.subtract_from(s + done, s + n),
                            Src::Other(_) => vec![(s + done, s + n)],
                        }
                        .into_iter()
                        .map(|(a, e)| (a, e - a))
                        .collect();
                        if !zap.is_empty() {
                            out.syscalls += match &mut src {
                                Src::Same => dst_g.zap(&zap)?,
                                Src::Other(g) => g.zap(&zap)?,
                            };
                        }
                        done = n;
                    }
                }
            }
        }
    }
    Ok(())
}

fn move_or_copy(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    dst: usize,
    src: usize,
    n: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    move_or_copy_from(k, mem, Src::Same, dst, src, n, state, out)
}

/// Moves `dst <- src` where dst is in the scratch grant.
fn move_into_scratch(
    k: &Userfaultfd,
    sg: &mut Grant<'_>,
    sdst: usize,
    mem: &mut Grant<'_>,
    src: usize,
    n: usize,
    out: &mut Outcome,
) -> Result<()> {
    move_or_copy_from(k, sg, Src::Other(mem), sdst, src, n, DstState::Empty, out)
}

/// A new scratch area for UFFDIO_MOVE, registered.
fn make_uffd_scratch(k: &Userfaultfd, out: &mut Outcome) -> Result<RwMapping> {
    let mut m = RwMapping::new(SCRATCH_LEN, PMD_SIZE, false)?;
    let (s, l) = (m.addr(), m.len());
    m.grant().register_for_move(k, s, l)?;
    out.syscalls += 1;
    Ok(m)
}

/// Makes the process's UFFDIO_MOVE scratch area now (it is kept for the process's
/// life), so that a batch needing it cannot fail for want of it after changing memory.
fn uffd_scratch_ready(k: &Userfaultfd, out: &mut Outcome) -> Result<()> {
    let mut guard = kernel().scratch.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Some(make_uffd_scratch(k, out)?);
    }
    Ok(())
}

/// Runs `f` with the process's UFFDIO_MOVE scratch area (empty, registered).
fn with_uffd_scratch<T>(
    k: &Userfaultfd,
    out: &mut Outcome,
    f: impl FnOnce(&mut Grant<'_>, usize, &mut Outcome) -> Result<T>,
) -> Result<T> {
    let mut guard = kernel().scratch.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Some(make_uffd_scratch(k, out)?);
    }
    let scratch = guard.as_mut().expect("just created");
    let sbase = scratch.addr();
    let before = out.fallback_bytes;
    let r = f(&mut scratch.grant(), sbase, out);
    if out.fallback_bytes != before {
        // A copy left pages in the scratch area: empty it for the next user.
        out.syscalls += scratch.grant().zap(&[(sbase, SCRATCH_LEN)])?;
    }
    r
}

/// Swap with three entry moves through the scratch area: a -> scratch, b -> a,
/// scratch -> b.
fn swap_via_scratch(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    a: usize,
    b: usize,
    len: usize,
    out: &mut Outcome,
) -> Result<()> {
    let (u0, c0, f0) = (out.uffd_move_bytes, out.memmove_bytes, out.fallback_bytes);
    with_uffd_scratch(k, out, |sg, sbase, out| {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(SCRATCH_LEN);
            move_into_scratch(k, sg, sbase, mem, a + off, n, out)?;
            move_or_copy(k, mem, a + off, b + off, n, DstState::Empty, out)?;
            move_or_copy_from(k, mem, Src::Other(sg), b + off, sbase, n, DstState::Empty, out)?;
            off += n;
        }
        Ok(())
    })?;
    // Each swapped byte took three entry moves (or copies); report bytes swapped.
    out.uffd_move_bytes = u0 + (out.uffd_move_bytes - u0) / 3;
    out.memmove_bytes = c0 + (out.memmove_bytes - c0) / 3;
    out.fallback_bytes = f0 + (out.fallback_bytes - f0) / 3;
    Ok(())
}

/// Slides `[src, src+len)` up by δ = dst - src (< len) through the scratch area, top
/// chunk first: each chunk moves to scratch, then to its destination, whose lowest part
/// it just vacated and whose top δ pages the previous chunk vacated (or were emptied).
/// Two calls per 16 MiB and 2n entry moves, instead of n/δ calls.
fn slide_up_via_scratch(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    dst: usize,
    src: usize,
    len: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let (u0, c0, f0) = (out.uffd_move_bytes, out.memmove_bytes, out.fallback_bytes);
    let delta = dst - src;
    // The part of the destination above the source: empty it first, unless known empty.
    if state != DstState::Empty {
        out.syscalls += mem.zap(&[(src + len, delta)])?;
    }
    with_uffd_scratch(k, out, |sg, sbase, out| {
        let mut end = len;
        while end > 0 {
            let start = end.saturating_sub(SCRATCH_LEN);
            let n = end - start;
            move_into_scratch(k, sg, sbase, mem, src + start, n, out)?;
            move_or_copy_from(k, mem, Src::Other(sg), dst + start, sbase, n, DstState::Empty, out)?;
            end = start;
        }
        Ok(())
    })?;
    // Each byte took two entry moves (or copies).
    out.uffd_move_bytes = u0 + (out.uffd_move_bytes - u0) / 2;
    out.memmove_bytes = c0 + (out.memmove_bytes - c0) / 2;
    out.fallback_bytes = f0 + (out.fallback_bytes - f0) / 2;
    Ok(())
}

/// An owned region of private anonymous memory, 2 MiB aligned (1 GiB aligned from
/// 1 GiB up) and registered for
/// UFFDIO_MOVE, whose pages can be moved and swapped with safe calls (a heap, an
/// arena). Offsets are relative to [`Region::addr`].
#[derive(Debug)]
pub struct Region {
    map: RwMapping,
}

impl Region {
    /// Maps `len` bytes (rounded up to pages), 2 MiB aligned (1 GiB aligned from 1 GiB).
    pub fn new(len: usize) -> Result<Self> {
        Self::build(len, false)
    }

    /// As [`Region::new`], with `MADV_HUGEPAGE` (transparent huge pages where the THP
    /// mode allows).
    pub fn with_huge_pages(len: usize) -> Result<Self> {
        Self::build(len, true)
    }

    fn build(len: usize, huge: bool) -> Result<Self> {
        let len = crate::addr::page_align_up(len)
            .filter(|&l| l > 0)
            .ok_or_else(|| Error::InvalidArgument { what: "len", why: format!("{len} is zero or too large") })?;
        // Regions of 1 GiB or more are 1 GiB aligned, so aligned moves in them can move
        // whole PUD entries (one per GiB) rather than PMDs.
        let align = if len >= PUD_SIZE { PUD_SIZE } else { PMD_SIZE };
        let mut map = RwMapping::new(len, align, huge)?;
        if let Some(k) = uffd() {
            let (s, l) = (map.addr(), map.len());
            // Registering now, whole, keeps later moves from splitting the VMA.
            if let Err(e) = map.grant().register_for_move(k, s, l) {
                if !matches!(e.errno, Errno::PERM | Errno::NOSYS | Errno::INVAL | Errno::BUSY) {
                    return Err(e.into());
                }
            }
        }
        Ok(Self { map })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.map.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The region's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
    /// The region's bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.bytes_mut()
    }
    /// A grant over the region, for [`move_pages`], [`swap_pages`] and [`Batch`].
    pub fn grant(&mut self) -> Grant<'_> {
        self.map.grant()
    }

    /// A grant over the region whose operations check their ranges with the kernel
    /// (PROCMAP_QUERY) as raw-address callers' do: for measuring that cost.
    pub fn grant_as_raw(&mut self) -> Grant<'_> {
        self.map.grant_as_raw()
    }

    fn abs(&self, what: &'static str, off: usize, len: usize) -> Result<usize> {
        match off.checked_add(len) {
            Some(e) if e <= self.len() => Ok(self.addr() + off),
            _ => Err(Error::InvalidArgument {
                what,
                why: format!("offset {off:#x}+{len:#x} is outside the {:#x}-byte region", self.len()),
            }),
        }
    }

    /// Moves `len` bytes from offset `src` to offset `dst`.
    pub fn move_pages(&mut self, dst: usize, src: usize, len: usize) -> Result<Outcome> {
        self.move_pages_with(dst, src, len, &Options::default())
    }

    /// [`Region::move_pages`] with explicit options.
    pub fn move_pages_with(&mut self, dst: usize, src: usize, len: usize, opts: &Options) -> Result<Outcome> {
        let (d, s) = (self.abs("dst", dst, len)?, self.abs("src", src, len)?);
        move_pages_with(&mut self.grant(), d, s, len, opts)
    }

    /// Swaps `len` bytes at offsets `a` and `b`.
    pub fn swap_pages(&mut self, a: usize, b: usize, len: usize) -> Result<Outcome> {
        self.swap_pages_with(a, b, len, &Options::default())
    }

    /// [`Region::swap_pages`] with explicit options.
    pub fn swap_pages_with(&mut self, a: usize, b: usize, len: usize, opts: &Options) -> Result<Outcome> {
        let (x, y) = (self.abs("a", a, len)?, self.abs("b", b, len)?);
        swap_pages_with(&mut self.grant(), x, y, len, opts)
    }

    /// Runs a batch whose addresses lie in this region.
    pub fn run(&mut self, batch: &Batch) -> Result<Outcome> {
        batch.execute(&mut self.grant())
    }
}

#[cfg(test)]
mod tests;
