//! The heap, its configuration, mutators, allocation and stopping the world.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use advm::mem::{page_align_up, page_size, PageRange, Region};
use serde::Serialize;

use crate::barrier::Remembered;
use crate::paged::{PagedSpaces, Paging};
use crate::policy::{Generational, Sizing};
use crate::raw::{Mem, Slot, Span};
use crate::stats::{Collection, Stats};
use crate::{Error, Result};

/// Set in a paged heap's epoch in a child forked from its process (see
/// [`Inner::mark_forked`]); never in a handle's.
const FORKED: u64 = 1 << 63;

/// Header words before an object's first pointer slot.
pub(crate) const HDR: usize = 16;
/// Object sizes (header included) are multiples of this, so every leftover of an
/// allocation buffer can hold a filler header.
pub(crate) const ALIGN: usize = 16;
const SIZE_BITS: u32 = 40;
const NPTRS_BITS: u32 = 23;
/// The mark bit of header word 0.
pub(crate) const MARK: usize = 1 << 63;
/// The most pointer slots an object may have.
pub const MAX_NPTRS: usize = (1 << NPTRS_BITS) - 1;
/// The largest object (header included).
const MAX_SIZE: usize = (1 << SIZE_BITS) - 1;
/// The largest heap (`Config::heap_bytes`): 1 TiB, what an object header can span.
pub const MAX_HEAP_BYTES: usize = 1 << SIZE_BITS;

/// Header word 0 of an object of `size` bytes (header included) with `nptrs` slots.
pub(crate) fn header(size: usize, nptrs: usize) -> usize {
    size | (nptrs << SIZE_BITS)
}
/// Size in bytes, header included.
pub(crate) fn size_of(h0: usize) -> usize {
    h0 & MAX_SIZE
}
/// Pointer slots.
pub(crate) fn nptrs_of(h0: usize) -> usize {
    (h0 >> SIZE_BITS) & MAX_NPTRS
}

/// Where a large object of `size` bytes starts: on a page, or on a 2 MiB boundary from
/// 2 MiB on, so that compaction moves it by whole page tables (mremap moves PMDs) and
/// its padding stays under half its size.
pub(crate) fn large_align(size: usize) -> usize {
    if size >= advm::remap::PMD_SIZE {
        advm::remap::PMD_SIZE
    } else {
        page_size()
    }
}

/// An object of a heap: the address of its first pointer slot (its raw bytes start
/// `nptrs` words later). Valid until the next collection (which any mutator's
/// allocation may run): keep objects across allocations in root slots, and read them
/// back after. Using one after a collection panics: it carries the heap's collection
/// count from when it was made (a moved object's old address may hold anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Obj(pub(crate) usize, pub(crate) u64);

impl Obj {
    /// The address (for C, and for tests that compare placement).
    pub fn addr(self) -> usize {
        self.0
    }
}

/// How compaction moves large objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// Page remapping through `advm::remap` (memmove below its break-even).
    #[default]
    Remap,
    /// memmove for everything: the baseline.
    Memmove,
}

impl Engine {
    /// `"remap"` or `"memmove"`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Remap => "remap",
            Engine::Memmove => "memmove",
        }
    }
}

impl std::str::FromStr for Engine {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "remap" => Ok(Engine::Remap),
            "memmove" => Ok(Engine::Memmove),
            _ => Err(Error::UnknownEngine(s.into())),
        }
    }
}

/// Called with each page range that holds no live data after a collection (the freed
/// tails of both spaces), while the world is still stopped: what happens to their
/// pages is the hook's decision (a pager marks them discardable). Without a hook the
/// heap keeps them for its next allocations.
pub type FreeHook = Box<dyn FnMut(PageRange) + Send>;

/// A heap's settings.
pub struct Config {
    /// Most bytes the objects may take (small and large together, headers included).
    pub heap_bytes: usize,
    /// GC threads (default: the machine's CPUs).
    pub gc_threads: usize,
    /// A full collection whose small space holds fewer bytes than this runs on one GC
    /// thread (default 64 MiB: on 2 shared CPUs a second thread made the pauses of
    /// 6-20 MiB heaps 2-5x longer, see docs/gc.md).
    pub parallel_from_bytes: usize,
    /// Objects of this many bytes or more (header included) are large: page aligned and
    /// moved by remapping. Default: the compaction break-even measured by
    /// `advm::remap` (`BreakEven::pages_compaction`).
    pub large_object_bytes: Option<usize>,
    /// Large-object compaction engine.
    pub engine: Engine,
    /// Per-thread allocation buffer size.
    pub tlab_bytes: usize,
    /// Run the heap verifier after every collection (tests); a failure makes the
    /// collection return [`Error::Corrupt`].
    pub verify: bool,
    /// Where freed pages go (see [`FreeHook`]).
    pub free_hook: Option<FreeHook>,
    /// Generational mode (a nursery copied into an old generation, sized by a policy);
    /// `None`: every collection is a full one.
    pub generational: Option<Generational>,
    /// Place the spaces in regions of an `advm::pager` pager, freed ranges marked
    /// discardable (see [`Paging`]); large objects then move by memmove. `None`: plain
    /// memory the kernel pages. Such a heap cannot be used in a child forked from its
    /// process: the pager's regions, and so the heap's memory, are not inherited. There
    /// allocation and collection fail with the pager's [`advm::Error::Unrecoverable`],
    /// reading or writing an object panics saying so, and dropping the heap and its
    /// mutators leaves the parent's memory alone.
    pub paging: Option<Paging>,
    /// The most recent collections [`Heap::stats`] gives one by one (default 1,024,
    /// about 300 KiB); its totals count every collection. Every record was kept before:
    /// 100,000 collections held 26 MiB, and reading the statistics copied them all
    /// (20,000 collections with a read after each took 18 s instead of 0.06).
    pub history_limit: usize,
    /// Generational mode without copy-back: a major collection slides the old
    /// generation down where it lies, its to-space over its own from-space, whose
    /// pages are resident, instead of placing it beside itself (the drift, default).
    /// Under a memory limit the drift needs from-space and to-space at once, and its
    /// to-space lands on pages freed (and, in a pager, dropped) a major collection
    /// ago; in place it needs no page it does not hold. Ignored with copy-back.
    pub old_in_place: bool,
    /// Plain memory only (no `paging`): every range a collection frees (the ranges
    /// the free hook sees) is advised lazily freeable (`MADV_FREE`, through
    /// `advm::mem::Grant::free_lazily`): under memory pressure the kernel drops those
    /// pages instead of swapping them out, and a page the heap reuses before that
    /// costs no fault. The heap never reads freed space before it writes it (it
    /// zeroes what an earlier use left below each space's zeroed frontier), so a page
    /// that reads as zeros or as its old bytes is the same to it. Default off: the
    /// kernel pages freed space like any other.
    pub free_lazily: bool,
}

impl Config {
    /// Defaults for a heap of `heap_bytes`.
    pub fn new(heap_bytes: usize) -> Self {
        Config {
            heap_bytes,
            gc_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            parallel_from_bytes: 64 << 20,
            large_object_bytes: None,
            engine: Engine::Remap,
            tlab_bytes: 32 << 10,
            verify: false,
            free_hook: None,
            generational: None,
            paging: None,
            history_limit: 1024,
            old_in_place: false,
            free_lazily: false,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("heap_bytes", &self.heap_bytes)
            .field("gc_threads", &self.gc_threads)
            .field("parallel_from_bytes", &self.parallel_from_bytes)
            .field("large_object_bytes", &self.large_object_bytes)
            .field("engine", &self.engine)
            .field("tlab_bytes", &self.tlab_bytes)
            .field("verify", &self.verify)
            .field("free_hook", &self.free_hook.is_some())
            .field("generational", &self.generational)
            .field("paging", &self.paging.is_some())
            .field("history_limit", &self.history_limit)
            .field("old_in_place", &self.old_in_place)
            .field("free_lazily", &self.free_lazily)
            .finish()
    }
}

/// Allocation state, under one lock (buffer refills and large objects take it).
#[derive(Debug)]
pub(crate) struct Alloc {
    /// Where the old small objects start (the space's base except in generational
    /// mode, where the old generation may drift through its reservation).
    pub(crate) small_bottom: usize,
    pub(crate) small_top: usize,
    /// Generational mode: the nursery's bump pointer, and its zeroed frontier.
    pub(crate) nursery_top: usize,
    pub(crate) nursery_clean: usize,
    pub(crate) large_top: usize,
    /// From here up, the space reads as zeros (never used).
    pub(crate) small_clean: usize,
    pub(crate) large_clean: usize,
    /// Large objects' header addresses, ascending.
    pub(crate) large: Vec<usize>,
    /// Addresses in the small space where an object starts, ascending (buffer starts,
    /// direct allocations): where the parallel phases may cut the space into units.
    pub(crate) starts: Vec<usize>,
    pub(crate) allocated: u64,
}

/// The bump-allocated spaces of [`Alloc`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Space {
    Nursery,
    Small,
    Large,
}

impl Alloc {
    /// A space's bump pointer and its zeroed frontier.
    fn bump(&mut self, space: Space) -> (&mut usize, &mut usize) {
        match space {
            Space::Nursery => (&mut self.nursery_top, &mut self.nursery_clean),
            Space::Small => (&mut self.small_top, &mut self.small_clean),
            Space::Large => (&mut self.large_top, &mut self.large_clean),
        }
    }

    pub(crate) fn used(&self, mem: &Mem) -> usize {
        self.old(mem) + (self.nursery_top - mem.nursery.base)
    }

    /// Bytes of the old generation: small objects and large ones.
    pub(crate) fn old(&self, mem: &Mem) -> usize {
        (self.small_top - self.small_bottom) + (self.large_top - mem.large.base)
    }
}

#[derive(Debug, Default)]
struct World {
    attached: usize,
    parked: usize,
    /// Attached mutators inside [`Mutator::blocking`]: stopped as far as a collection
    /// is concerned, for as long as they stay there.
    blocked: usize,
    stopping: bool,
    epoch: u64,
}

/// Roots: the mutators' root stacks and the slots C registered; and the weak ones,
/// which a collection reads and rewrites but does not mark from.
#[derive(Debug, Default)]
pub(crate) struct Roots {
    pub(crate) stacks: Vec<Arc<Mutex<Vec<usize>>>>,
    pub(crate) slots: Vec<Slot>,
    /// Where each of `slots` is, by address: registering and forgetting a slot cost
    /// the same with 100,000 registered as with 10 (a search of `slots` made 50,000
    /// roots registered and forgotten take 11 s).
    slot_index: std::collections::HashMap<usize, usize>,
    /// The mutators' weak root stacks.
    pub(crate) weak_stacks: Vec<Arc<Mutex<Vec<usize>>>>,
    /// Weak slots C registered, indexed by address as `slots` are.
    pub(crate) weak_slots: Vec<Slot>,
    weak_index: std::collections::HashMap<usize, usize>,
}

/// Calls `f` on every non-null weak root (the mutators' weak stacks, locked, and C's
/// weak slots) and stores what it returns: null when the object died, its new
/// address when it moved.
pub(crate) fn update_weak(
    stacks: &mut [MutexGuard<'_, Vec<usize>>],
    slots: &[Slot],
    mut f: impl FnMut(usize) -> usize,
) {
    for s in stacks.iter_mut() {
        for v in s.iter_mut().filter(|v| **v != 0) {
            *v = f(*v);
        }
    }
    for s in slots {
        let v = s.load();
        if v != 0 {
            let n = f(v);
            if n != v {
                s.store(n);
            }
        }
    }
}

pub(crate) struct Inner {
    pub(crate) mem: Mem,
    pub(crate) heap_bytes: usize,
    /// The GC threads, started by its first parallel phase (see pool.rs).
    pub(crate) pool: crate::pool::Pool,
    pub(crate) parallel_from_bytes: usize,
    pub(crate) large_bytes: usize,
    pub(crate) tlab_bytes: usize,
    pub(crate) verify: bool,
    /// Remap break-even in pages: into space earlier moves of the compaction's batch
    /// vacated (measured for a batch of sliding objects), into space holding pages.
    pub(crate) break_even: (usize, usize),
    /// The measured costs of large-object moves, from which each compaction chooses
    /// its plan (`None` when the break-even was set, not measured).
    pub(crate) move_costs: Option<crate::collect::MoveCosts>,
    /// The small space's mapping: reached through `mem`, and locked only to free its
    /// pages lazily. `None` when the old generation drifts (`drift` holds the space
    /// then) or when the spaces are pager regions (the large one too then).
    small_region: Mutex<Option<Region>>,
    /// Generational mode without copy-back: the old generation's reservation and the
    /// part of it mapped read-write.
    pub(crate) drift: Option<crate::nursery::Drift>,
    pub(crate) large_region: Mutex<Option<Region>>,
    /// The spaces' pager regions, in a paged heap.
    pub(crate) paged: Option<PagedSpaces>,
    pub(crate) alloc: Mutex<Alloc>,
    pub(crate) roots: Mutex<Roots>,
    /// Pinned objects (their addresses, ascending) and how many times each is pinned:
    /// roots that a collection leaves where they are.
    pub(crate) pins: Mutex<std::collections::BTreeMap<usize, usize>>,
    pub(crate) stats: Mutex<crate::stats::Record>,
    pub(crate) free_hook: Mutex<Option<FreeHook>>,
    pub(crate) generational: Option<Generational>,
    /// Major collections compact the old generation where it lies (see
    /// [`Config::old_in_place`]).
    pub(crate) old_in_place: bool,
    /// Freed ranges are advised lazily freeable (see [`Config::free_lazily`]).
    free_lazily: bool,
    pub(crate) sizing: Mutex<Option<Sizing>>,
    pub(crate) remembered: Remembered,
    /// The nursery's mapping, held like the small space's.
    nursery_region: Mutex<Option<Region>>,
    created: Instant,
    engine: AtomicU8,
    stop: AtomicBool,
    /// A collection panicked part way (a bug, or a root or slot holding something that
    /// is not an object of this heap): objects may be half moved, so every later
    /// collection fails with [`Error::Corrupt`] instead of running on them.
    broken: AtomicBool,
    /// Collections run (finished or failed): stamps every [`Obj`] handed out, so a
    /// handle kept across a collection is caught.
    epoch: AtomicU64,
    world: Mutex<World>,
    cv: Condvar,
}

/// Locks a mutex, going on after a panic elsewhere (the data is plain counters and
/// lists that every writer leaves consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A garbage-collected heap, shared by its mutators (cheap to clone).
#[derive(Clone)]
pub struct Heap {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("heap_bytes", &self.inner.heap_bytes)
            .field("large_object_bytes", &self.inner.large_bytes)
            .finish()
    }
}

impl Heap {
    /// A heap with the default [`Config`] for `heap_bytes`.
    pub fn new(heap_bytes: usize) -> Result<Self> {
        Self::with_config(Config::new(heap_bytes))
    }

    /// A heap with `cfg`. Reserves `heap_bytes` of address space for each of the two
    /// spaces (memory comes only as objects are written).
    pub fn with_config(cfg: Config) -> Result<Self> {
        let ps = page_size();
        let max = MAX_HEAP_BYTES;
        if cfg.heap_bytes < ps || cfg.heap_bytes > max {
            return Err(Error::InvalidArgument {
                what: "heap_bytes",
                why: format!("{} is outside {ps}..={max} (one page to 1 TiB)", cfg.heap_bytes),
            });
        }
        if cfg.gc_threads == 0 || cfg.gc_threads > 256 {
            return Err(Error::InvalidArgument {
                what: "gc_threads",
                why: format!("{} is outside 1..=256", cfg.gc_threads),
            });
        }
        if cfg.tlab_bytes < 256 || cfg.tlab_bytes % ALIGN != 0 || cfg.tlab_bytes > 16 << 20 {
            return Err(Error::InvalidArgument {
                what: "tlab_bytes",
                why: format!("{} is not a multiple of {ALIGN} in 256..=16 MiB", cfg.tlab_bytes),
            });
        }
        if let Some(g) = &cfg.generational {
            g.policy.check(cfg.tlab_bytes, cfg.heap_bytes)?;
        }
        if cfg.free_lazily && cfg.paging.is_some() {
            return Err(Error::InvalidArgument {
                what: "free_lazily",
                why: "is for plain memory: a paged heap's freed ranges are its pager's discardable pages".into(),
            });
        }
        let be = advm::remap::break_even();
        let large_bytes = match cfg.large_object_bytes {
            Some(b) if b < 2 * HDR => {
                return Err(Error::InvalidArgument {
                    what: "large_object_bytes",
                    why: format!("{b} is below the smallest object with a payload ({} bytes)", 2 * HDR),
                })
            }
            Some(b) => b,
            // The compaction break-even: smaller objects would only be copied.
            None => be.pages_compaction.max(1) * ps,
        };
        let len = page_align_up(cfg.heap_bytes).unwrap_or(cfg.heap_bytes);
        // Generational mode: the old generation drifts through a reservation of four
        // heaps (see nursery::place_old); the nursery has its own region.
        let small_len = if cfg.generational.is_some() { len.saturating_mul(4) } else { len };
        let span = |r: &Region| Span { base: r.addr().0, end: r.addr().0 + r.len() };
        let no_nursery = Span { base: 0, end: 0 };
        let (small, drift, large, nursery, paged, mem) = match cfg.paging {
            None => {
                // Without copy-back the old generation drifts through a PROT_NONE
                // reservation with only one heap of it mapped read-write, around the
                // old generation.
                let drifts = cfg.generational.is_some_and(|g| !g.copy_back);
                let drift = drifts.then(|| crate::nursery::Drift::new(small_len, len)).transpose()?;
                let small = (!drifts).then(|| Region::for_remap(small_len)).transpose()?;
                // The large space's upper half is address space for compaction to park
                // dead pages in while live objects slide over their place (see
                // collect::page_moves); objects live in the lower half.
                let large = Region::for_remap(len.saturating_mul(2))?;
                let nursery = cfg.generational.map(|_| Region::new(len)).transpose()?;
                let small_span = match (&small, &drift) {
                    (Some(r), _) => span(r),
                    (None, Some(d)) => d.span(),
                    (None, None) => unreachable!("one of the two is made"),
                };
                let mem = Mem {
                    small: small_span,
                    large: Span { base: large.addr().0, end: large.addr().0 + len },
                    nursery: nursery.as_ref().map_or(no_nursery, span),
                };
                (small, drift, Some(large), nursery, None, mem)
            }
            // Pager regions: the old generation drifts through the small space's region
            // (four heaps), whose untouched pages cost nothing either.
            Some(p) => {
                let lens: &[usize] =
                    if cfg.generational.is_some() { &[small_len, len, len] } else { &[small_len, len] };
                let (paged, spans) = PagedSpaces::map(p, lens)?;
                let mem =
                    Mem { small: spans[0], large: spans[1], nursery: spans.get(2).copied().unwrap_or(no_nursery) };
                (None, None, None, None, Some(paged), mem)
            }
        };
        let free_hook = match &paged {
            Some(p) => Some(p.free_hook(cfg.free_hook)),
            None => cfg.free_hook,
        };
        let alloc = Alloc {
            small_bottom: mem.small.base,
            nursery_top: mem.nursery.base,
            nursery_clean: mem.nursery.base,
            small_top: mem.small.base,
            large_top: mem.large.base,
            small_clean: mem.small.base,
            large_clean: mem.large.base,
            large: Vec::new(),
            starts: Vec::new(),
            allocated: 0,
        };
        let inner = Inner {
            mem,
            heap_bytes: cfg.heap_bytes,
            pool: crate::pool::Pool::new(cfg.gc_threads)?,
            parallel_from_bytes: cfg.parallel_from_bytes,
            large_bytes,
            tlab_bytes: cfg.tlab_bytes,
            verify: cfg.verify,
            // A populated break-even past the measured curve means no measured size won.
            break_even: (
                be.pages_compaction,
                match be.curve.last() {
                    Some(last) if be.pages_populated > last.pages => usize::MAX,
                    _ => be.pages_populated,
                },
            ),
            move_costs: crate::collect::MoveCosts::from_break_even(&be),
            small_region: Mutex::new(small),
            drift,
            large_region: Mutex::new(large),
            paged,
            alloc: Mutex::new(alloc),
            roots: Mutex::new(Roots::default()),
            pins: Mutex::new(Default::default()),
            stats: Mutex::new(crate::stats::Record::new(cfg.history_limit)),
            free_hook: Mutex::new(free_hook),
            generational: cfg.generational,
            old_in_place: cfg.old_in_place,
            sizing: Mutex::new(cfg.generational.map(|g| Sizing::new(g.policy))),
            remembered: Remembered::default(),
            nursery_region: Mutex::new(nursery),
            free_lazily: cfg.free_lazily,
            created: Instant::now(),
            engine: AtomicU8::new(cfg.engine as u8),
            stop: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            world: Mutex::new(World::default()),
            cv: Condvar::new(),
        };
        let inner = Arc::new(inner);
        if inner.paged.is_some() {
            crate::paged::enlist(&inner)?;
        }
        Ok(Heap { inner })
    }

    /// Objects of this many bytes or more (header included) are large.
    pub fn large_object_bytes(&self) -> usize {
        self.inner.large_bytes
    }

    /// The size limit.
    pub fn heap_bytes(&self) -> usize {
        self.inner.heap_bytes
    }

    /// Bytes in use now (allocated since the last collection plus what it kept).
    pub fn used_bytes(&self) -> usize {
        lock(&self.inner.alloc).used(&self.inner.mem)
    }

    /// The large-object engine.
    pub fn engine(&self) -> Engine {
        self.inner.engine()
    }

    /// Sets the large-object engine for later collections.
    pub fn set_engine(&self, e: Engine) {
        self.inner.engine.store(e as u8, Ordering::Relaxed)
    }

    /// Totals, and the most recent collections (see [`Config::history_limit`]).
    pub fn stats(&self) -> Stats {
        let mut s = lock(&self.inner.stats).stats(true);
        s.bytes_allocated = lock(&self.inner.alloc).allocated;
        s
    }

    /// Totals only (`history` empty): no copy of the recent collections, for a
    /// program that reads them after every collection.
    pub fn totals(&self) -> Stats {
        let mut s = lock(&self.inner.stats).stats(false);
        s.bytes_allocated = lock(&self.inner.alloc).allocated;
        s
    }

    /// A mutator for the calling thread (waits while a collection runs).
    pub fn attach(&self) -> Mutator {
        let mut w = lock(&self.inner.world);
        while w.stopping {
            w = self.inner.cv.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        w.attached += 1;
        drop(w);
        let roots = Arc::new(Mutex::new(Vec::new()));
        let weak = Arc::new(Mutex::new(Vec::new()));
        {
            let mut r = lock(&self.inner.roots);
            r.stacks.push(roots.clone());
            r.weak_stacks.push(weak.clone());
        }
        Mutator { heap: self.clone(), cur: 0, end: 0, roots, weak }
    }

    /// Runs a full collection from a thread that is not a mutator (it waits until every
    /// mutator reaches a safepoint). A thread with an attached mutator uses
    /// [`Mutator::collect`] instead: here it would wait for itself.
    pub fn collect(&self) -> Result<Collection> {
        self.inner.collect(false, "requested", true)
    }

    /// Runs a minor collection (generational mode; a full one otherwise) from a thread
    /// that is not a mutator, as [`Heap::collect`].
    pub fn collect_minor(&self) -> Result<Collection> {
        self.inner.collect(false, "requested", false)
    }

    /// Generational mode's settings, if on.
    pub fn generational(&self) -> Option<Generational> {
        self.inner.generational
    }

    /// Registers a root slot in the program's memory: each collection reads it and
    /// rewrites it when its object moves.
    ///
    /// # Safety
    /// Until [`Heap::remove_root_slot`], `slot` must stay valid, aligned, and hold null
    /// or an object of this heap whenever a collection may run; no other thread may
    /// write it while a collection runs.
    #[allow(unsafe_code)] // forwards the slot contract to the caller; no unsafe op here
    pub unsafe fn add_root_slot(&self, slot: *mut *mut std::ffi::c_void) -> Result<()> {
        self.add_slot(slot as usize, false)
    }

    /// Forgets a root slot registered with [`Heap::add_root_slot`].
    pub fn remove_root_slot(&self, slot: *mut *mut std::ffi::c_void) -> Result<()> {
        self.remove_slot(slot as usize, false)
    }

    /// Registers a weak slot in the program's memory: each collection reads it, does
    /// not keep its object alive for it, and rewrites it: null when the object died,
    /// its new address when it moved. (A minor collection clears it only when the
    /// object was young and is not kept; a full one whenever the object is
    /// unreachable from the roots.)
    ///
    /// # Safety
    /// As [`Heap::add_root_slot`], until [`Heap::remove_weak_slot`].
    #[allow(unsafe_code)] // forwards the slot contract to the caller; no unsafe op here
    pub unsafe fn add_weak_slot(&self, slot: *mut *mut std::ffi::c_void) -> Result<()> {
        self.add_slot(slot as usize, true)
    }

    /// Forgets a weak slot registered with [`Heap::add_weak_slot`].
    pub fn remove_weak_slot(&self, slot: *mut *mut std::ffi::c_void) -> Result<()> {
        self.remove_slot(slot as usize, true)
    }

    fn add_slot(&self, a: usize, weak: bool) -> Result<()> {
        if a == 0 || a % std::mem::align_of::<usize>() != 0 {
            return Err(Error::InvalidArgument { what: "slot", why: format!("{a:#x} is null or not word aligned") });
        }
        if self.inner.mem.holds(a, 8) {
            // An object's slot moves with it: the collector would write the old place.
            return Err(Error::InvalidArgument {
                what: "slot",
                why: format!("{a:#x} is inside the heap (an object's slot moves with it; roots live outside the heap)"),
            });
        }
        let mut r = lock(&self.inner.roots);
        if r.slot_index.contains_key(&a) || r.weak_index.contains_key(&a) {
            return Err(Error::InvalidArgument { what: "slot", why: format!("{a:#x} is already a root or weak slot") });
        }
        let r = &mut *r;
        let (slots, index) =
            if weak { (&mut r.weak_slots, &mut r.weak_index) } else { (&mut r.slots, &mut r.slot_index) };
        index.insert(a, slots.len());
        slots.push(Slot(a));
        Ok(())
    }

    fn remove_slot(&self, a: usize, weak: bool) -> Result<()> {
        let mut r = lock(&self.inner.roots);
        let r = &mut *r;
        let (slots, index, what) = if weak {
            (&mut r.weak_slots, &mut r.weak_index, "a registered weak slot")
        } else {
            (&mut r.slots, &mut r.slot_index, "a registered root")
        };
        let Some(i) = index.remove(&a) else {
            return Err(Error::InvalidArgument { what: "slot", why: format!("{a:#x} is not {what}") });
        };
        slots.swap_remove(i);
        if let Some(moved) = slots.get(i).map(|s| s.0) {
            index.insert(moved, i);
        }
        Ok(())
    }
}

/// Restarts the world after a collection, when dropped: normally, or while a panic
/// unwinds out of the collection (the heap is then marked broken).
struct Restart<'a>(&'a Inner);

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        let inner = self.0;
        if std::thread::panicking() {
            inner.broken.store(true, Ordering::SeqCst);
        }
        // Objects may have moved even when the collection failed part way.
        inner.epoch.fetch_add(1, Ordering::Relaxed);
        let mut w = lock(&inner.world);
        w.stopping = false;
        inner.stop.store(false, Ordering::SeqCst);
        w.epoch += 1;
        inner.cv.notify_all();
    }
}

impl Inner {
    /// Claims `[h, h + len)` for allocation in `space` (`h` at or above its bump
    /// pointer): the pager is told the bytes are needed again, the bump pointer moves
    /// past them, and what an earlier use left below the zeroed frontier is zeroed.
    fn claim(&self, a: &mut Alloc, space: Space, h: usize, len: usize) {
        self.reuse(h, len);
        a.allocated += len as u64;
        let (top, clean) = a.bump(space);
        *top = h + len;
        if h < *clean {
            self.mem.zero(h, (*clean).min(h + len) - h);
        }
        *clean = (*clean).max(h + len);
    }

    /// Hands a range a collection freed to the free hook, first advised lazily
    /// freeable with [`Config::free_lazily`].
    pub(crate) fn freed(&self, hook: &mut Option<FreeHook>, r: PageRange) -> Result<()> {
        if self.free_lazily {
            let a = r.start().0;
            match &self.drift {
                Some(d) if self.mem.small.contains(a) => d.free_lazily(r)?,
                _ => {
                    let region = if self.mem.nursery.contains(a) {
                        &self.nursery_region
                    } else if self.mem.large.contains(a) {
                        &self.large_region
                    } else {
                        &self.small_region
                    };
                    if let Some(region) = lock(region).as_mut() {
                        region.grant().free_lazily(r)?;
                    }
                }
            }
        }
        if let Some(h) = hook.as_mut() {
            h(r);
        }
        Ok(())
    }

    /// Ok, except in a child forked from the process that made a paged heap: the
    /// pager's regions, the heap's memory, are not mapped there (every use of it
    /// faulted), so allocation and collection fail with the pager's error and object
    /// access panics with it. One branch for a heap not in a pager.
    #[inline]
    pub(crate) fn usable(&self) -> Result<()> {
        match &self.paged {
            Some(p) => p.usable(),
            None => Ok(()),
        }
    }

    /// `p`'s header word 0 when `p` looks like an object's pointer: its header lies in
    /// the used part of one of the spaces (a recorded large object in the large space), and fits there.
    /// Only the used parts are read: the rest of a space may be unmapped (the drifting
    /// old generation's reservation is `PROT_NONE` outside its window: reading there
    /// was a segmentation fault), and zeroed space above a top is no object (its zero
    /// header was taken for one). An address inside an object may still pass when its
    /// bytes look like a header.
    pub(crate) fn object_header(&self, a: &Alloc, p: usize) -> Option<usize> {
        let mem = &self.mem;
        let h = p.wrapping_sub(HDR);
        let end = if h % ALIGN != 0 {
            return None;
        } else if h >= a.small_bottom && h < a.small_top {
            a.small_top
        } else if h >= mem.nursery.base && h < a.nursery_top {
            a.nursery_top
        } else if a.large.binary_search(&h).is_ok() {
            a.large_top
        } else {
            return None;
        };
        let h0 = mem.load(h);
        let size = size_of(h0);
        let fits = h0 & MARK == 0
            && mem.load(h + 8) == 0
            && size >= HDR
            && size % ALIGN == 0
            && size <= end - h
            && HDR + 8 * nptrs_of(h0) <= size;
        fits.then_some(h0)
    }

    /// Before a collection: every root holds null or an object, else the collection is
    /// refused before anything moves (a root above a space's top was nulled, one in
    /// the drifting old generation's `PROT_NONE` reservation faulted).
    fn check_roots(&self) -> Result<()> {
        let a = lock(&self.alloc);
        let roots = lock(&self.roots);
        let bad = |p: usize| p != 0 && self.object_header(&a, p).is_none();
        for (s, what) in
            roots.stacks.iter().map(|s| (s, "root")).chain(roots.weak_stacks.iter().map(|s| (s, "weak root")))
        {
            if let Some(p) = lock(s).iter().copied().find(|&p| bad(p)) {
                return Err(Error::BadRoot(format!("a mutator's {what} holds {p:#x}, not an object of this heap")));
            }
        }
        let slots = roots.slots.iter().map(|s| (s, "root")).chain(roots.weak_slots.iter().map(|s| (s, "weak")));
        for (s, what) in slots {
            if bad(s.load()) {
                return Err(Error::BadRoot(format!(
                    "{what} slot {:#x} holds {:#x}, not an object of this heap",
                    s.0,
                    s.load()
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn engine(&self) -> Engine {
        if self.engine.load(Ordering::Relaxed) == Engine::Memmove as u8 {
            Engine::Memmove
        } else {
            Engine::Remap
        }
    }

    /// Stops the world (the caller, when `attached`, is a mutator that already left its
    /// buffer), collects, restarts it. When another thread is already collecting, the
    /// caller waits for that collection instead and gets `None`.
    pub(crate) fn collect(&self, attached: bool, why: &str, major: bool) -> Result<Collection> {
        self.usable()?;
        let t0 = Instant::now();
        let mut w = lock(&self.world);
        // Mutators parked by the previous collection must have left before a new one
        // counts its parked mutators (one still counted but about to run would mutate
        // during the collection).
        while !w.stopping && w.parked > 0 {
            w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        if w.stopping {
            // Someone else collects: take part as a stopped mutator, then report theirs.
            let epoch = w.epoch;
            if attached {
                w.parked += 1;
                self.cv.notify_all();
            }
            while w.epoch == epoch {
                w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            if attached {
                w.parked -= 1;
                self.cv.notify_all();
            }
            drop(w);
            return lock(&self.stats).last().cloned().ok_or(Error::Corrupt("no collection recorded".into()));
        }
        w.stopping = true;
        self.stop.store(true, Ordering::SeqCst);
        let others = w.attached - usize::from(attached);
        while w.parked + w.blocked < others {
            w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        drop(w);
        let stop_ns = t0.elapsed().as_nanos() as u64;
        let (at_ns, allocated_before) = (self.created.elapsed().as_nanos() as u64, lock(&self.alloc).allocated);
        // The world restarts also when the collection panics (the panic goes on to the
        // caller): stopped mutators and later collections would otherwise wait for ever.
        let restart = Restart(self);
        let result = if self.broken.load(Ordering::SeqCst) {
            Err(Error::Corrupt(
                "an earlier collection of this heap panicked part way; objects may be half moved".into(),
            ))
        } else if let Err(e) = self.check_roots() {
            Err(e)
        } else if self.generational.is_some() {
            self.generational(why, major)
        } else {
            crate::collect::full(self, why)
        };
        if let Ok(c) = &result {
            self.after_collection(c);
        }
        // Recorded before the world restarts: a thread that waited for this collection
        // reads its record as soon as it wakes (it read none, or the one before).
        let result = result.map(|mut c| {
            c.at_ns = at_ns;
            c.allocated_before = allocated_before;
            c.stop_ns = stop_ns;
            c.pause_ns = t0.elapsed().as_nanos() as u64;
            lock(&self.stats).record(c.clone());
            c
        });
        drop(restart);
        result
    }

    /// Generational mode, world stopped: a minor collection, then a major one when
    /// asked for or when the policy says so; one record for both.
    fn generational(&self, why: &str, major: bool) -> Result<Collection> {
        let mut c = crate::nursery::minor(self, why)?;
        let mut sizing = lock(&self.sizing);
        let sizing = sizing.as_mut().expect("generational heaps have a sizing policy");
        let (due, decision) = sizing.after_minor(lock(&self.alloc).old(&self.mem));
        if major || due {
            let minor = c;
            c = crate::collect::full(self, why)?;
            c.kind = "major";
            c.heap_before = minor.heap_before;
            c.objects_memmove += minor.objects_memmove;
            c.bytes_memmove += minor.bytes_memmove;
            c.bytes_freed_pages += minor.bytes_freed_pages;
            c.weak_cleared += minor.weak_cleared;
            c.mark_ns += minor.mark_ns;
            self.remembered.clear();
            let live = lock(&self.alloc).old(&self.mem);
            c.decision = format!("{why}; {decision}; major: {}", sizing.after_major(live));
        } else {
            c.decision = format!("{why}; {decision}");
        }
        c.old_bytes = lock(&self.alloc).old(&self.mem);
        c.nursery_bytes = sizing.nursery;
        Ok(c)
    }

    /// Parks a mutator (its buffer already left) until the collection ends.
    fn park(&self) {
        let mut w = lock(&self.world);
        if !w.stopping {
            return;
        }
        let epoch = w.epoch;
        w.parked += 1;
        self.cv.notify_all();
        while w.epoch == epoch {
            w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        w.parked -= 1;
        self.cv.notify_all();
    }

    /// The handle of the object at `addr`, valid until the next collection.
    fn obj(&self, addr: usize) -> Obj {
        Obj(addr, self.epoch.load(Ordering::Relaxed) & !FORKED)
    }

    /// In a child forked from this process (a paged heap's fork handler, see
    /// `paged::enlist`): no handle matches the epoch any more, so every object access
    /// takes [`Inner::stale`], which asks the pager why.
    pub(crate) fn mark_forked(&self) {
        self.epoch.fetch_or(FORKED, Ordering::Relaxed);
    }

    /// Header address of `o`, checked to be inside the heap with its whole object.
    fn checked(&self, o: Obj) -> (usize, usize) {
        // No collection runs while a mutator is between safepoints: the count is stable.
        // One compare for a paged heap too: a forked child fails it (`mark_forked`),
        // where asking the pager on every access cost the CPU-bound primes 5% of its
        // user time inlined, 24% out of line (docs/pager.md, 2026-11-29).
        let epoch = self.epoch.load(Ordering::Relaxed);
        if o.1 != epoch {
            self.stale(o);
        }
        let h = o.0.wrapping_sub(HDR);
        assert!(self.mem.holds(h, HDR), "object {:#x} is not in this heap", o.0);
        let h0 = self.mem.load(h);
        assert!(self.mem.holds(h, size_of(h0)), "object {:#x} has a broken header", o.0);
        (h, h0)
    }

    #[cold]
    #[inline(never)]
    fn stale(&self, o: Obj) -> ! {
        if let Err(e) = self.usable() {
            panic!("object {:#x} cannot be used here: {e}", o.0);
        }
        panic!(
            "object {:#x} was read before collection {}: objects move, so keep them in root \
             slots across allocations and read them back",
            o.0,
            o.1 + 1
        );
    }
}

/// A thread's access to the heap: allocation buffer, root stack, object access.
/// Dropping it detaches the thread.
pub struct Mutator {
    heap: Heap,
    cur: usize,
    end: usize,
    roots: Arc<Mutex<Vec<usize>>>,
    weak: Arc<Mutex<Vec<usize>>>,
}

impl std::fmt::Debug for Mutator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutator").field("buffer", &(self.cur, self.end)).finish()
    }
}

fn word_count(nptrs: usize, nbytes: usize) -> Option<usize> {
    nptrs.checked_mul(8)?.checked_add(nbytes)?.checked_add(HDR + ALIGN - 1).map(|s| s & !(ALIGN - 1))
}

impl Mutator {
    /// The heap.
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// Allocates an object with `nptrs` pointer slots (null) and `nbytes` raw bytes
    /// (zero). Runs a full collection when the heap is full, and fails with
    /// [`Error::HeapExhausted`] when that does not make room; with
    /// [`Error::ObjectTooLarge`] at once when the object (header included) is larger
    /// than the heap, [`Error::InvalidArgument`] when it has more than [`MAX_NPTRS`]
    /// pointer slots.
    pub fn alloc(&mut self, nptrs: usize, nbytes: usize) -> Result<Obj> {
        self.safepoint();
        self.heap.inner.usable()?;
        let size = match word_count(nptrs, nbytes) {
            // Larger than the whole heap (or than the address space): no collection can
            // make room, so none is run.
            s if s.map_or(true, |s| s > self.heap.inner.heap_bytes) => {
                return Err(Error::ObjectTooLarge { nptrs, nbytes, heap: self.heap.inner.heap_bytes })
            }
            Some(s) if s <= MAX_SIZE && nptrs <= MAX_NPTRS => s,
            _ => {
                return Err(Error::InvalidArgument {
                    what: "object size",
                    why: format!(
                        "{nptrs} pointers and {nbytes} bytes exceed the largest object \
                         ({MAX_NPTRS} pointers, {MAX_SIZE} bytes)"
                    ),
                })
            }
        };
        // Large objects never come from the buffer (one that fit its rest was placed
        // among the small objects).
        if size <= self.end - self.cur && size < self.heap.inner.large_bytes {
            let h = self.cur;
            self.cur += size;
            return Ok(self.init(h, size, nptrs));
        }
        let inner = self.heap.inner.clone();
        // Attempts: as is; after a collection (a minor one in generational mode); in
        // generational mode, after a major one. When the last collection left room for
        // this object but other mutators took it before this one ran again, the whole
        // sequence is tried again (a few times: the heap is then full of live data in
        // all likelihood).
        let attempts = if inner.generational.is_some() { 3 } else { 2 };
        let mut last = None;
        for _round in 0..4 {
            for attempt in 0..attempts {
                if let Some(o) = self.alloc_slow(size, nptrs, attempt > 0) {
                    return Ok(o);
                }
                if attempt + 1 == attempts {
                    break;
                }
                self.retire_buffer();
                last = Some(inner.collect(true, "allocation failed", attempt > 0)?);
            }
            if last.as_ref().map_or(true, |c: &Collection| c.heap_after + size > inner.heap_bytes) {
                break;
            }
        }
        let live = last.map_or(0, |c: Collection| c.heap_after);
        Err(Error::HeapExhausted { requested: size, live, heap: inner.heap_bytes })
    }

    fn init(&self, h: usize, size: usize, nptrs: usize) -> Obj {
        let mem = &self.heap.inner.mem;
        mem.store(h, header(size, nptrs));
        mem.store(h + 8, 0);
        self.heap.inner.obj(h + HDR)
    }

    /// Allocation outside the buffer: a new buffer, a direct small object, or a large
    /// object; `None` when the heap has no room. In generational mode small objects go
    /// to the nursery, or, with `pretenure` when it has no room, straight into the old
    /// generation.
    fn alloc_slow(&mut self, size: usize, nptrs: usize, pretenure: bool) -> Option<Obj> {
        let inner = &*self.heap.inner;
        let mem = &inner.mem;
        // Read before the allocation lock: a collection takes them in the other order.
        let sizing = lock(&inner.sizing).clone();
        let capacity = sizing.as_ref().map_or(0, |s| s.nursery);
        let mut a = lock(&inner.alloc);
        let used = a.used(mem);
        if inner.generational.is_some() && size < inner.large_bytes {
            let room = mem.nursery.base.saturating_add(capacity).min(mem.nursery.end).saturating_sub(a.nursery_top);
            let left = room.min(inner.heap_bytes.saturating_sub(used)) & !(ALIGN - 1);
            let direct = size > inner.tlab_bytes / 4;
            let want = if direct { size } else { inner.tlab_bytes };
            let take = if want <= left { Some(want) } else { (!direct && size <= left).then_some(left) };
            if let Some(take) = take {
                let h = a.nursery_top;
                inner.claim(&mut a, Space::Nursery, h, take);
                drop(a);
                return Some(self.start(h, size, nptrs, (!direct).then_some(take)));
            }
            if !pretenure {
                return None;
            }
            // Straight into the old generation, as a direct object.
            let h = a.small_top;
            if used + size > inner.heap_bytes || h + size > mem.small.end {
                return None;
            }
            inner.claim(&mut a, Space::Small, h, size);
            a.starts.push(h);
            drop(a);
            return Some(self.init(h, size, nptrs));
        }
        if size >= inner.large_bytes {
            let align = large_align(size);
            let len = size.checked_next_multiple_of(align)?;
            let h = a.large_top.next_multiple_of(align);
            if used + (h - a.large_top) + len > inner.heap_bytes {
                return None;
            }
            // Large objects are old at birth: one that takes the old generation past
            // the policy's limit first brings a collection (a major one when due).
            if !pretenure && sizing.is_some_and(|s| s.over(a.old(mem) + len)) {
                return None;
            }
            inner.claim(&mut a, Space::Large, h, len);
            a.large.push(h);
            drop(a);
            // The object's size is its page-rounded length, so compaction moves pages.
            return Some(self.init(h, len, nptrs));
        }
        let direct = size > inner.tlab_bytes / 4;
        let want = if direct { size } else { inner.tlab_bytes };
        // Near the limit the last buffer may be smaller than usual.
        let left = inner.heap_bytes.saturating_sub(used) & !(ALIGN - 1);
        let take = if want <= left {
            want
        } else if !direct && size <= left {
            left
        } else {
            return None;
        };
        let h = a.small_top;
        inner.claim(&mut a, Space::Small, h, take);
        a.starts.push(h);
        drop(a);
        Some(self.start(h, size, nptrs, (!direct).then_some(take)))
    }

    /// The object at `h`, and with `buffer` the bytes from `h` on become this
    /// mutator's allocation buffer (the object first in it).
    fn start(&mut self, h: usize, size: usize, nptrs: usize, buffer: Option<usize>) -> Obj {
        if let Some(take) = buffer {
            self.retire_buffer();
            self.cur = h + size;
            self.end = h + take;
        }
        self.init(h, size, nptrs)
    }

    /// Leaves the allocation buffer: its unused rest becomes a filler object, so the
    /// space stays parsable.
    fn retire_buffer(&mut self) {
        if self.cur < self.end && self.heap.inner.usable().is_ok() {
            let mem = &self.heap.inner.mem;
            mem.store(self.cur, header(self.end - self.cur, 0));
            mem.store(self.cur + 8, 0);
        }
        self.cur = 0;
        self.end = 0;
    }

    /// Takes part in a collection that another thread asked for. Allocation does this
    /// itself; a thread that runs long without allocating calls it, and one that may
    /// block wraps that call in [`Mutator::blocking`].
    pub fn safepoint(&mut self) {
        if self.heap.inner.stop.load(Ordering::SeqCst) {
            self.retire_buffer();
            self.heap.inner.park();
        }
    }

    /// Runs `f`, which must not touch the heap, with this thread counted as stopped:
    /// collections that other threads run meanwhile do not wait for it. Wrap every
    /// call that may block (a lock, a channel, I/O, joining a thread): a mutator
    /// thread blocked outside it, waiting for another thread that needs a collection,
    /// waits for ever, since a collection waits until every attached mutator reaches a
    /// safepoint. Objects may move meanwhile: read them back from their roots after.
    /// On return it waits for a collection in progress to finish.
    pub fn blocking<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.retire_buffer();
        let inner = &*self.heap.inner;
        {
            let mut w = lock(&inner.world);
            w.blocked += 1;
            inner.cv.notify_all();
        }
        // Leaves the region also when `f` panics: a count left behind would make every
        // later collection go on while this mutator runs.
        struct Leave<'a>(&'a Inner);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let inner = self.0;
                let mut w = lock(&inner.world);
                while w.stopping {
                    w = inner.cv.wait(w).unwrap_or_else(|e| e.into_inner());
                }
                w.blocked -= 1;
                inner.cv.notify_all();
            }
        }
        let _leave = Leave(inner);
        f()
    }

    /// Runs a full collection now (a major one in generational mode).
    pub fn collect(&mut self) -> Result<Collection> {
        self.retire_buffer();
        self.heap.inner.collect(true, "requested", true)
    }

    /// Runs a minor collection now (generational mode; a full one otherwise).
    pub fn collect_minor(&mut self) -> Result<Collection> {
        self.retire_buffer();
        self.heap.inner.collect(true, "requested", false)
    }

    /// Pushes a root slot holding `o`; returns its index.
    pub fn push_root(&mut self, o: Option<Obj>) -> usize {
        self.push_slot(&self.roots, o)
    }

    /// The object in root slot `i` (panics when `i` is not a slot).
    pub fn root(&self, i: usize) -> Option<Obj> {
        self.slot(&self.roots, i)
    }

    /// Stores into root slot `i`.
    pub fn set_root(&mut self, i: usize, o: Option<Obj>) {
        self.set_slot(&self.roots, i, o)
    }

    /// Root slots.
    pub fn roots_len(&self) -> usize {
        lock(&self.roots).len()
    }

    /// Drops root slots from index `n` on.
    pub fn truncate_roots(&mut self, n: usize) {
        lock(&self.roots).truncate(n);
    }

    /// Pushes a weak root slot holding `o`; returns its index. A weak slot does not
    /// keep its object alive: after a collection it holds the object's new address,
    /// or null when the object died (see [`Heap::add_weak_slot`] for when).
    pub fn push_weak(&mut self, o: Option<Obj>) -> usize {
        self.push_slot(&self.weak, o)
    }

    /// The object in weak slot `i` (null once it died; panics when `i` is not a slot).
    pub fn weak(&self, i: usize) -> Option<Obj> {
        self.slot(&self.weak, i)
    }

    /// Stores into weak slot `i`.
    pub fn set_weak(&mut self, i: usize, o: Option<Obj>) {
        self.set_slot(&self.weak, i, o)
    }

    /// Weak slots.
    pub fn weak_len(&self) -> usize {
        lock(&self.weak).len()
    }

    /// Drops weak slots from index `n` on.
    pub fn truncate_weak(&mut self, n: usize) {
        lock(&self.weak).truncate(n);
    }

    // One stack of slots (the roots or the weak ones), as addresses (0: null).
    fn push_slot(&self, slots: &Mutex<Vec<usize>>, o: Option<Obj>) -> usize {
        if let Some(o) = o {
            self.heap.inner.checked(o);
        }
        let mut v = lock(slots);
        v.push(o.map_or(0, |o| o.0));
        v.len() - 1
    }

    fn slot(&self, slots: &Mutex<Vec<usize>>, i: usize) -> Option<Obj> {
        let v = lock(slots)[i];
        (v != 0).then(|| self.heap.inner.obj(v))
    }

    fn set_slot(&self, slots: &Mutex<Vec<usize>>, i: usize, o: Option<Obj>) {
        if let Some(o) = o {
            self.heap.inner.checked(o);
        }
        lock(slots)[i] = o.map_or(0, |o| o.0);
    }

    /// Pins `o`: until as many [`Mutator::unpin`] calls as pins, it is a root and no
    /// collection moves it, so its address may be handed to C code or the kernel.
    /// Returns the object, which is `o` except for a young object of a generational
    /// heap: pinning one first runs a minor collection (the nursery is emptied by
    /// every collection, so a pinned object must be old), which moves it, and every
    /// other young object, once more. Compaction slides the other objects around
    /// pinned ones (the space below a pinned object that its lower neighbours do not
    /// fill stays free until it is unpinned), and a generational heap with a pinned
    /// small object compacts its old generation where it lies (no copy-back).
    pub fn pin(&mut self, o: Obj) -> Result<Obj> {
        self.heap.inner.checked(o);
        let inner = self.heap.inner.clone();
        let o = if inner.mem.nursery.contains_object(o.0) {
            let r = self.push_root(Some(o));
            let done = self.collect_minor();
            let o = self.root(r).expect("a root keeps its object");
            self.truncate_roots(r);
            done?;
            o
        } else {
            o
        };
        *lock(&inner.pins).entry(o.0).or_insert(0) += 1;
        Ok(o)
    }

    /// Undoes one [`Mutator::pin`] of the object at `o`'s address (a pinned object's
    /// address does not change, so an `o` read before a collection still names it).
    /// [`Error::InvalidArgument`] when it is not pinned.
    pub fn unpin(&mut self, o: Obj) -> Result<()> {
        let mut pins = lock(&self.heap.inner.pins);
        match pins.get_mut(&o.0) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                pins.remove(&o.0);
            }
            None => return Err(Error::InvalidArgument { what: "object", why: format!("{:#x} is not pinned", o.0) }),
        }
        Ok(())
    }

    /// Times the object at `o`'s address is pinned (0: not pinned).
    pub fn pin_count(&self, o: Obj) -> usize {
        lock(&self.heap.inner.pins).get(&o.0).copied().unwrap_or(0)
    }

    /// The object at `addr` (a C `void *`), checked to be one of this heap's: its
    /// header lies in the used part of a space and fits there (an address inside an
    /// object whose bytes look like a header may still pass).
    pub fn object_at(&self, addr: usize) -> Result<Obj> {
        let inner = &self.heap.inner;
        inner.usable()?;
        if inner.object_header(&lock(&inner.alloc), addr).is_none() {
            return Err(Error::InvalidArgument {
                what: "object",
                why: format!("{addr:#x} is not the start of an object of this heap"),
            });
        }
        Ok(inner.obj(addr))
    }

    /// Stores the object at address `value` (0: null) into pointer slot `i` of the
    /// object at address `obj`, both checked as [`Mutator::object_at`] does: the C
    /// API's store, through the write barrier. One look at the heap's bounds for both,
    /// and no second check of what it found (a store through `object_at` and
    /// [`Mutator::set`] took 57 ns here instead of 36; this, 38-39: release
    /// libadvm, 2 million `advm_gc_store` calls, the least of six runs).
    pub fn set_at(&mut self, obj: usize, i: usize, value: usize) -> Result<()> {
        let inner = &*self.heap.inner;
        inner.usable()?;
        let bad = |p: usize| Error::InvalidArgument {
            what: "object",
            why: format!("{p:#x} is not the start of an object of this heap"),
        };
        let h0 = {
            let a = lock(&inner.alloc);
            let h0 = inner.object_header(&a, obj).ok_or_else(|| bad(obj))?;
            if value != 0 && inner.object_header(&a, value).is_none() {
                return Err(bad(value));
            }
            h0
        };
        let n = nptrs_of(h0);
        if i >= n {
            return Err(Error::InvalidArgument {
                what: "slot",
                why: format!("{i} is not below the object's {n} pointers"),
            });
        }
        let slot = obj + 8 * i;
        inner.remembered.on_store(&inner.mem.nursery, slot, value);
        inner.mem.store(slot, value);
        Ok(())
    }

    /// Pointer slots of `o`.
    pub fn nptrs(&self, o: Obj) -> usize {
        nptrs_of(self.heap.inner.checked(o).1)
    }

    /// Raw bytes of `o` (rounded up to 8 bytes beyond what was asked).
    pub fn nbytes(&self, o: Obj) -> usize {
        let (_, h0) = self.heap.inner.checked(o);
        size_of(h0) - HDR - 8 * nptrs_of(h0)
    }

    /// Pointer slot `i` of `o`.
    pub fn get(&self, o: Obj, i: usize) -> Option<Obj> {
        let (_, h0) = self.heap.inner.checked(o);
        assert!(i < nptrs_of(h0), "pointer slot {i} of an object with {}", nptrs_of(h0));
        let v = self.heap.inner.mem.load(o.0 + 8 * i);
        (v != 0).then(|| self.heap.inner.obj(v))
    }

    /// Stores `v` into pointer slot `i` of `o`.
    pub fn set(&mut self, o: Obj, i: usize, v: Option<Obj>) {
        let (_, h0) = self.heap.inner.checked(o);
        assert!(i < nptrs_of(h0), "pointer slot {i} of an object with {}", nptrs_of(h0));
        if let Some(v) = v {
            self.heap.inner.checked(v);
        }
        let (slot, value) = (o.0 + 8 * i, v.map_or(0, |v| v.0));
        let inner = &self.heap.inner;
        inner.remembered.on_store(&inner.mem.nursery, slot, value);
        inner.mem.store(slot, value);
    }

    fn data(&self, o: Obj, off: usize, len: usize) -> usize {
        let (_, h0) = self.heap.inner.checked(o);
        let n = size_of(h0) - HDR - 8 * nptrs_of(h0);
        assert!(off.checked_add(len).is_some_and(|e| e <= n), "bytes {off}+{len} of an object with {n}");
        o.0 + 8 * nptrs_of(h0) + off
    }

    /// Raw word `i` (8 bytes at byte offset `8*i` of the raw bytes).
    pub fn word(&self, o: Obj, i: usize) -> u64 {
        let a = self.data(o, 8 * i, 8);
        self.heap.inner.mem.load(a) as u64
    }

    /// Writes raw word `i`.
    pub fn set_word(&mut self, o: Obj, i: usize, v: u64) {
        let a = self.data(o, 8 * i, 8);
        self.heap.inner.mem.store(a, v as usize)
    }

    /// Copies raw bytes from offset `off` of `o` into `out`.
    pub fn read_bytes(&self, o: Obj, off: usize, out: &mut [u8]) {
        let a = self.data(o, off, out.len());
        self.heap.inner.mem.read(a, out)
    }

    /// Copies `data` into the raw bytes of `o` at `off`.
    pub fn write_bytes(&mut self, o: Obj, off: usize, data: &[u8]) {
        let a = self.data(o, off, data.len());
        self.heap.inner.mem.write(a, data)
    }
}

impl Drop for Mutator {
    fn drop(&mut self) {
        let inner = self.heap.inner.clone();
        {
            let mut r = lock(&inner.roots);
            r.stacks.retain(|s| !Arc::ptr_eq(s, &self.roots));
            r.weak_stacks.retain(|s| !Arc::ptr_eq(s, &self.weak));
        }
        // Under the world lock no collection can start; one already stopping waits
        // for this thread, which takes part as a stopped mutator first.
        let mut w = lock(&inner.world);
        while w.stopping {
            self.retire_buffer();
            let epoch = w.epoch;
            w.parked += 1;
            inner.cv.notify_all();
            while w.epoch == epoch {
                w = inner.cv.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            w.parked -= 1;
            inner.cv.notify_all();
        }
        self.retire_buffer();
        w.attached -= 1;
        inner.cv.notify_all();
    }
}
