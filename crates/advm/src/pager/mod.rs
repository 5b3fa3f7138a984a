//! A user-level pager with discardable pages: the SML/NJ + Mach external pager of
//! Cooper, Nettles and Subramanian (LFP 1992) on userfaultfd.
//!
//! A [`Pager`] manages [`PagedRegion`]s under a budget of resident bytes. The
//! application marks pages *discardable* (their contents may be dropped; a later access
//! reads zeros) or *needed* again in a shared [`Bitmap`] (an atomic bit flip, no system
//! call). When the pages the pager has filled reach the budget, or the memory cgroup
//! it watches nears its limit, the pager evicts: resident discardable pages first,
//! dropped and never written; then needed pages in the order they were faulted in
//! (user space sees no accessed bits, so "cold" means "faulted in longest ago"),
//! written to a swap file the pager owns. A fault on an evicted page is served by the
//! pager's handler thread, or (by choice, [`FaultMode`]) on the faulting thread itself
//! from userfaultfd's SIGBUS mode where the kernel offers it: a discarded (or never used)
//! page gets zeros, a written one is read back with `UFFDIO_COPY`. With
//! [`NeededPaging::Kernel`] the pager writes no needed page: it drops discardable
//! pages only and leaves needed ones to the kernel's reclaim and swap.
//!
//! In SIGBUS mode the fault is served in a signal handler, so that path takes no lock
//! and allocates nothing: page states are atomics, a page mid-eviction is waited out
//! (the evicting thread never faults), a fill is recorded in a lock-free ring the pager
//! drains later, and when the budget leaves no room the faulting thread rings the
//! handler thread and sleeps on a futex until one eviction pass is done.
//!
//! Eviction takes a page out of its region with `UFFDIO_MOVE` before it looks at it
//! (see `sys::pager`): a write before the move travels with the page, an access after
//! it faults and waits until the page is written and can be read back. The
//! discardable bit is read again after the move, so an application that marks a page
//! needed and then writes it never loses the write. That is the race test
//! `a_write_racing_eviction_is_never_lost` checks.
//!
//! Pre-flushing: with [`Config::preflush_headroom_bytes`] the pager drops every
//! resident discardable page as soon as the budget comes within the headroom (the
//! paper's pager-initiated flush, PF); [`Pager::flush`] evicts a range now (the
//! paper's user-initiated flush, PU). [`Pager::lock`] and [`Pager::unlock`] are the
//! purgeable-memory API on top.

mod bitmap;
mod kernel_swap;
mod report;
mod ring;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use bitmap::Bitmap;
pub use kernel_swap::{Interrupts, KernelSwap, ProcessTimes};
pub use report::{report, run_bounded};

use crate::mem::{page_size, HostAddr, PageRange};
use crate::stats::cgroup::Group;
use crate::sys::pager::{self as sp, Area, Doorbell, PageBuf, SwapFile};
use crate::sys::uffd::{self, Event, Userfaultfd};
use crate::sys::uffd_sigbus::{self, Registration};
use crate::sys::zeroed::zeroed;
use crate::{Error, Result};
use ring::Ring;

/// The process a pager belongs to. Its regions are `MADV_DONTFORK` and its handler
/// thread is not copied by `fork`, so in a forked child the pager is only a shell whose
/// locks a parent thread may have held at the fork: every use there fails at once.
#[derive(Debug, Clone, Copy)]
struct Owner {
    /// Which process (read without a system call: see `ProcessKey`).
    key: crate::sys::process::ProcessKey,
    /// Its pid, for the error message.
    pid: u32,
}

impl Owner {
    fn this_process() -> Self {
        Self { key: crate::sys::process::ProcessKey::current(), pid: std::process::id() }
    }

    /// Whether this is still the process that made the pager.
    fn is_here(&self) -> bool {
        self.key.is_this_process()
    }

    /// Ok in the owner; in a forked child, the error every use of the pager gets.
    /// Inlined: a paged heap checks it on every object access (see [`Pager::usable`]),
    /// so only the common case (fork handler registered, no fork since) is inline,
    /// with no call in it: a call there made every object access of a heap in plain
    /// memory save registers too.
    #[inline]
    fn check(&self) -> Result<()> {
        if self.key.is_this_process_at_a_glance() {
            return Ok(());
        }
        self.check_closely()
    }

    #[cold]
    #[inline(never)]
    fn check_closely(&self) -> Result<()> {
        if self.is_here() {
            return Ok(());
        }
        Err(Error::Unrecoverable {
            what: "pager",
            why: format!(
                "it was made by process {} and this is a child forked from it (pid {}): its regions are not \
                 mapped here (MADV_DONTFORK) and its handler thread stayed in the parent; make a new pager in the child",
                self.pid,
                std::process::id()
            ),
        })
    }
}

/// Pages moved out per `UFFDIO_MOVE` while discardable pages are dropped.
const STAGE_PAGES: usize = 256;
/// Most pages one read-back brings in: the faulting page and the pages after it that
/// were written to the slots after its slot (read-ahead, handler thread only).
const READ_AHEAD: usize = 16;
/// Most pages one zero-fill fault fills: the faulting page and the needed pages in
/// the same state after it (zero-fill ahead, both fault modes, in one call).
const ZERO_AHEAD: usize = sp::ZERO_FILL_PAGES;
/// How often the handler thread looks at the cgroup and at its stop flag.
const TICK: Duration = Duration::from_millis(10);

// Page states.
const EMPTY: u8 = 0;
// A region's states start as zeroed memory (`Pager::map`).
const _: () = assert!(EMPTY == 0);
const RESIDENT: u8 = 1;
const EVICTING: u8 = 2;
const DISCARDED: u8 = 3;
const SWAPPED: u8 = 4;
/// Unmapped: a fill that finds this counts nothing and frees its swap slot.
const GONE: u8 = 5;

/// The page size SIGBUS mode serves (its read-back buffer lives on the signal stack).
const SIGBUS_PAGE: usize = 4096;
/// A ring record's page word for "no page, only a swap slot to free".
const NO_PAGE: u64 = u64::MAX;

/// Where faults on the pager's regions are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// SIGBUS where the kernel offers it, else the handler thread.
    Auto,
    /// On the faulting thread, from userfaultfd's SIGBUS mode: no round trip to
    /// another thread. [`Pager::new`] fails where the kernel lacks it. A system call
    /// that touches a page not resident gets `EFAULT` in this mode.
    Sigbus,
    /// On the pager's handler thread, which reads the userfaultfd's events (the
    /// default: SIGBUS mode still livelocked once in the paging benchmark, and it
    /// does not read ahead; docs/pager.md). A system call touching a page not resident
    /// waits for it as a load or store does. (Where the only userfaultfd is the
    /// user-mode-only kind, which the kernel does not hand its own faults, [`Pager::new`]
    /// refuses: such calls would get `EFAULT`.)
    Thread,
}

/// Whether this kernel offers userfaultfd's SIGBUS mode to the pager.
pub fn sigbus_available() -> bool {
    page_size() == SIGBUS_PAGE && Userfaultfd::probe().map(|i| i.features & uffd::feature::SIGBUS != 0).unwrap_or(false)
}

/// How the swap file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapIo {
    /// `O_DIRECT`: no page cache, so nothing written is charged to the memory cgroup
    /// the pager is relieving (the default; see docs/pager.md for the measurement).
    Direct,
    /// Through the page cache.
    PageCache,
}

/// Who pages out the *needed* pages (discardable ones are always the pager's: it
/// drops them, never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NeededPaging {
    /// The pager: the oldest filled needed pages are written to its own swap file
    /// when the budget or the cgroup forces them out, and read back on a fault.
    SwapFile,
    /// The kernel: the pager never writes a page; needed pages stay in the region
    /// and the kernel's own reclaim (its LRU, its swap) pages them out when the
    /// memory cgroup reaches its limit, and swaps them in without a fault to the
    /// pager. The budget and the cgroup watch then only drop discardable pages, and
    /// [`Pager::flush`] hands the needed pages of its range to the kernel
    /// (`MADV_PAGEOUT`). The budget bounds no needed page here: the memory
    /// cgroup's limit does. With [`FaultMode::Sigbus`] one livelock is unexplained
    /// (docs/pager.md has the runs).
    Kernel,
}

/// What a pager is given.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most bytes of its regions the pager keeps resident (at least one page).
    pub budget_bytes: usize,
    /// The swap file: created at this path (an existing file is refused, never
    /// overwritten; a block device is used as it is); `None`, or a directory: an
    /// unlinked temporary file there (`None`: in `/var/tmp`).
    pub swap_path: Option<PathBuf>,
    /// Most bytes the swap file may hold (at least one page); eviction of needed pages
    /// beyond it fails.
    pub swap_capacity_bytes: u64,
    /// `O_DIRECT` or page cache.
    pub swap_io: SwapIo,
    /// Pager-initiated pre-flush: when the resident pages come within this many bytes
    /// of the budget (or the cgroup's usage within it of its limit), every resident
    /// discardable page is dropped. `None`: only what the budget forces out.
    pub preflush_headroom_bytes: Option<usize>,
    /// A memory cgroup whose usage against its limit is watched (pressure).
    pub cgroup: Option<PathBuf>,
    /// Where faults are served.
    pub fault_mode: FaultMode,
    /// Who pages out needed pages.
    pub needed_paging: NeededPaging,
}

impl Config {
    /// A budget, an unlinked swap file in `/var/tmp` of up to 4 GiB, `O_DIRECT`, no
    /// pre-flush, no cgroup, faults served on the handler thread, needed pages
    /// written to the pager's swap file.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            swap_path: None,
            swap_capacity_bytes: 4 << 30,
            swap_io: SwapIo::Direct,
            preflush_headroom_bytes: None,
            cgroup: None,
            fault_mode: FaultMode::Thread,
            needed_paging: NeededPaging::SwapFile,
        }
    }
}

/// Faults by what serving them took (the paper's appendix rows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Never-used pages: zero-filled.
    pub zero_filled: u64,
    /// Discarded pages: zeros, nothing read.
    pub not_read: u64,
    /// Written-out pages: read back from the swap file.
    pub read: u64,
}

/// What a pager did (the paper's appendix statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Read faults.
    pub read_faults: FaultCounts,
    /// Write faults.
    pub write_faults: FaultCounts,
    /// Page-outs that dropped a discardable page.
    pub discarded_pages: u64,
    /// Page-outs that wrote a needed page to the swap file.
    pub written_pages: u64,
    /// Pages evicted by pager-initiated pre-flush (cgroup pressure or headroom).
    pub preflushed_by_pager: u64,
    /// Pages evicted by [`Pager::flush`] (user-initiated pre-flush).
    pub preflushed_by_user: u64,
    /// Bytes written to the swap file.
    pub bytes_written: u64,
    /// Bytes read back from it.
    pub bytes_read: u64,
    /// Pages read back ahead of a fault with the faulting page (in the same read):
    /// the pages after it, swapped to the slots after its slot, while the budget had room.
    pub read_ahead_pages: u64,
    /// Empty pages, and discarded pages marked needed again, zero-filled with a
    /// zero-fill fault on the page before them (memory is used upwards), ahead of
    /// their own fault, while the budget had room.
    pub zero_ahead_pages: u64,
    /// Page-outs of clean pages: read back, not written since, so dropped without a
    /// write, their swap copy kept (handler-thread mode).
    pub clean_dropped_pages: u64,
    /// Pages resident now (filled by the pager and not evicted).
    pub resident_pages: u64,
    /// Pages held in the swap file now.
    pub swapped_pages: u64,
    /// Time spent serving faults, nanoseconds: on the handler thread, not counting the
    /// eviction that made room first; in SIGBUS mode, the whole signal handler.
    pub fault_ns: u64,
    /// Time the eviction lock was held, nanoseconds: page-outs for the budget, the
    /// cgroup watch and the pre-flushes, [`Pager::flush`], and the short holds of
    /// [`Pager::lock`] and unmap. On the handler thread it delays the fault it makes
    /// room for.
    pub evict_ns: u64,
    /// Of `evict_ns`, the writes to the swap file.
    pub write_ns: u64,
    /// Budget evictions that could not write a needed page (swap file full or an
    /// I/O error) or could take no page at all (every candidate's move refused, e.g.
    /// pinned); the budget was exceeded meanwhile.
    pub eviction_failures: u64,
}

impl Stats {
    /// Faults that read nothing: zero-filled or discarded, read or write.
    pub fn zero_fills(&self) -> u64 {
        self.read_faults.zero_filled
            + self.read_faults.not_read
            + self.write_faults.zero_filled
            + self.write_faults.not_read
    }

    /// Faults that read a page back.
    pub fn read_pages(&self) -> u64 {
        self.read_faults.read + self.write_faults.read
    }

    /// All faults served.
    pub fn faults(&self) -> u64 {
        self.zero_fills() + self.read_pages()
    }
}

#[derive(Default)]
struct Counters {
    fault: [[AtomicU64; 3]; 2],
    discarded: AtomicU64,
    written: AtomicU64,
    by_pager: AtomicU64,
    by_user: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    read_ahead: AtomicU64,
    zero_ahead: AtomicU64,
    clean_dropped: AtomicU64,
    fault_ns: AtomicU64,
    evict_ns: AtomicU64,
    write_ns: AtomicU64,
    failures: AtomicU64,
}

/// Tests: a step run inside a race window of the pager (see `Shared::written_race`).
#[cfg(test)]
type RaceStep = Box<dyn Fn(&Shared) + Send + Sync>;

/// Who asked for an eviction, for the statistics.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    Budget,
    Pager,
    User,
}

/// One managed region's pages.
struct Managed {
    id: u64,
    /// The pager's process (the region is not mapped in a forked child).
    owner: Owner,
    /// SIGBUS mode: the route from the signal handler, retired at unmap and dropped
    /// (before the area is unmapped) with the region.
    route: OnceLock<Registration>,
    area: Area,
    /// Set when the pager is dropped with the region still held: the pages it had
    /// evicted are gone with its swap file.
    orphaned: AtomicBool,
    discardable: Bitmap,
    /// Pages dropped as discardable since the last [`Pager::lock`] of them.
    purged: Bitmap,
    /// Resident pages read back and not written since (installed write-protected):
    /// each still owns its swap slot, and whoever clears the bit decides the slot's
    /// fate (the eviction keeps it, a write frees it).
    clean: Bitmap,
    /// Pages resident (a hint for the scans that drop discardable pages, so they never
    /// walk pages already dropped): set once a page is RESIDENT, cleared before it
    /// leaves that state, so a resident page always has its bit. The state decides.
    resident: Bitmap,
    state: Box<[AtomicU8]>,
    slot: Box<[AtomicU32]>,
    /// Incremented at each fill: queue entries of an earlier residency are stale.
    gen: Box<[AtomicU32]>,
}

impl Managed {
    fn pages(&self) -> usize {
        self.state.len()
    }

    /// Whether a page of the region is resident (by its bit).
    fn holds_resident(&self) -> bool {
        (0..self.pages().div_ceil(64)).any(|w| self.resident.word(w) != 0)
    }
}

/// A pager's regions, looked up by address (faults, ranges: `O(log n)` in the number
/// of regions) and by id (the replacement queue's entries, and the clock that drops
/// discardable pages region after region). Both hold the same regions.
#[derive(Default)]
struct Regions {
    by_addr: BTreeMap<usize, Arc<Managed>>,
    by_id: BTreeMap<u64, Arc<Managed>>,
}

impl Regions {
    fn insert(&mut self, m: Arc<Managed>) {
        self.by_addr.insert(m.area.addr(), m.clone());
        self.by_id.insert(m.id, m);
    }

    fn remove(&mut self, m: &Managed) {
        self.by_id.remove(&m.id);
        // the address is not mapped again while its region is held here
        self.by_addr.remove(&m.area.addr());
    }

    /// The region whose pages include `addr`.
    fn holding(&self, addr: usize) -> Option<&Arc<Managed>> {
        let (_, m) = self.by_addr.range(..=addr).next_back()?;
        (addr - m.area.addr() < m.area.len()).then_some(m)
    }
}

/// Regions the clock takes from the region index at a time (under its lock).
const CLOCK_BATCH: usize = 64;
/// The replacement queue is not compacted below this many entries.
const QUEUE_COMPACT_MIN: usize = 4096;

/// Free and used slots of the swap file.
struct Slots {
    free: Vec<u32>,
    next: u32,
    capacity: u32,
}

impl Slots {
    fn take(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.next < self.capacity {
            self.next += 1;
            return Some(self.next - 1);
        }
        None
    }

    fn give_back(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot), "swap slot {slot} freed twice");
        self.free.push(slot);
    }

    fn used(&self) -> u64 {
        u64::from(self.next) - self.free.len() as u64
    }
}

struct Shared {
    fd: Userfaultfd,
    /// The process that made the pager (uses in a forked child fail).
    owner: Owner,
    /// Faults are served on the faulting threads (SIGBUS mode).
    sigbus: bool,
    /// Pages read back on a read fault are installed write-protected and keep their
    /// swap slot until written (handler-thread mode, where write protection is offered).
    track_clean: bool,
    /// Needed pages are left to the kernel's reclaim ([`NeededPaging::Kernel`]).
    kernel_needed: bool,
    /// Calls that marked pages discardable, in any region (shared by their bitmaps).
    marks: Arc<AtomicU64>,
    /// Fills of pages marked discardable (resident and discardable without a new mark).
    refills: AtomicU64,
    /// The marks when pre-flush last scanned the regions.
    preflush_seen: AtomicU64,
    /// [`Shared::drop_epoch`] when a scan for discardable pages last went round every
    /// region and found fewer than it wanted: until it moves, none is resident, and
    /// the scans (one per eviction) are skipped.
    short_seen: AtomicU64,
    /// The clock's hand: the id of the region the next scan for discardable pages
    /// starts from (round-robin over the regions; the eviction lock guards it).
    hand: AtomicU64,
    /// The regions the clock visits: every region with a resident page is here or
    /// has a fill record in `filled` (added when drained, taken out by the clock when
    /// it finds none resident), so a scan never walks regions whose pages are all
    /// evicted or never used.
    active: Mutex<BTreeSet<u64>>,
    /// Fills (and swap slots to free) recorded by faulting threads, drained into
    /// `queue` (and `slots`) by whoever holds the queue lock.
    filled: Ring,
    /// Rung by a faulting thread that needs room (or a drained ring).
    bell: Doorbell,
    /// Counts the handler thread's answers to the bell; faulting threads sleep on it.
    answered: AtomicU32,
    /// A faulting thread asked for room since the last answer.
    room_asked: AtomicBool,
    budget: usize,
    headroom: Option<usize>,
    cgroup: Option<(Group, u64)>,
    regions: RwLock<Regions>,
    next_id: AtomicU64,
    staging: Area,
    swap: SwapFile,
    slots: Mutex<Slots>,
    /// (region id, page, gen) in fill order: the replacement order of needed pages.
    queue: Mutex<VecDeque<(u64, u32, u32)>>,
    /// The queue's length at which its stale entries are dropped (twice its length
    /// after the last compaction).
    queue_compact_at: AtomicUsize,
    /// One eviction at a time; also held by unmap and lock.
    evicting: Mutex<()>,
    resident: AtomicUsize,
    counters: Counters,
    stop: AtomicBool,
    /// Tests: run by `written` between its read of the page's slot and its take of
    /// the clean bit (an eviction racing the write-protect fault).
    #[cfg(test)]
    written_race: Mutex<Option<RaceStep>>,
    /// The handler thread: 0 running, 1 ended, 2 ended by a panic.
    handler_state: AtomicU8,
    /// Faults (address, flags) whose swap read failed, served again each tick by the
    /// handler thread (their threads wait meanwhile).
    unread: Mutex<Vec<(usize, u64)>>,
    /// The address of the last fault served (either mode), for [`report`].
    last_fault: AtomicUsize,
}

/// A region of memory managed by a [`Pager`]. Access it through its address
/// ([`PagedRegion::as_ptr`]) or [`PagedRegion::read`]/[`PagedRegion::write`]; give it
/// back with [`Pager::unmap`] (or drop the pager). A region held after its pager is
/// dropped stays mapped as plain memory, but the pages the pager had evicted are lost
/// (zeros): its `read` and `write` then fail with [`Error::Unrecoverable`].
pub struct PagedRegion {
    m: Arc<Managed>,
}

impl std::fmt::Debug for PagedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PagedRegion({:#x}+{})", self.m.area.addr(), self.m.area.len())
    }
}

impl PagedRegion {
    /// The region's addresses.
    pub fn range(&self) -> PageRange {
        PageRange::new("paged region", self.m.area.addr(), self.m.area.len()).expect("a mapping is page aligned")
    }

    /// First byte. Memory there may be read and written by any thread; an evicted
    /// page is brought back by the pager when touched.
    pub fn as_ptr(&self) -> *mut u8 {
        self.m.area.addr() as *mut u8
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.m.area.len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.m.area.is_empty()
    }

    /// The shared discardable bitmap, one bit a page from the region's start. The
    /// pager only reads it; [`Pager::discardable`] and [`Pager::needed`] flip it.
    pub fn discardable_bits(&self) -> &Bitmap {
        &self.m.discardable
    }

    /// Marks pages `[first, first+n)` discardable (an atomic bit flip).
    pub fn mark_discardable(&self, first: usize, n: usize) -> Result<()> {
        self.check_pages(first, n)?;
        self.m.discardable.set_range(first, n, true);
        Ok(())
    }

    /// Marks pages `[first, first+n)` needed: from now on their contents are kept.
    pub fn mark_needed(&self, first: usize, n: usize) -> Result<()> {
        self.check_pages(first, n)?;
        self.m.discardable.set_range(first, n, false);
        Ok(())
    }

    /// Ok while the pager that made the region serves it, in its process.
    fn usable(&self) -> Result<()> {
        self.m.owner.check()?;
        if self.m.orphaned.load(Ordering::Acquire) {
            return Err(Error::Unrecoverable {
                what: "paged region",
                why: "its pager was dropped while the region was held: the pages the pager had evicted are lost \
                      with its swap file and would read as zeros; unmap regions before dropping their pager"
                    .into(),
            });
        }
        Ok(())
    }

    fn check_pages(&self, first: usize, n: usize) -> Result<()> {
        match first.checked_add(n) {
            Some(end) if end <= self.m.pages() => Ok(()),
            _ => Err(Error::InvalidArgument {
                what: "page range",
                why: format!("pages {first}+{n} run past the region's {} pages", self.m.pages()),
            }),
        }
    }

    /// Copies bytes out from offset `off`. An [`Error::Unrecoverable`] once the
    /// pager is dropped (the pages it had evicted are lost: they would read as zeros).
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.usable()?;
        self.m.area.read(off, out).map_err(|_| self.out_of_bounds(off, out.len()))
    }

    /// Copies bytes in at offset `off`. An [`Error::Unrecoverable`] once the pager is
    /// dropped, as for [`PagedRegion::read`].
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.usable()?;
        self.m.area.write(off, data).map_err(|_| self.out_of_bounds(off, data.len()))
    }

    fn out_of_bounds(&self, off: usize, len: usize) -> Error {
        Error::InvalidArgument {
            what: "offset",
            why: format!("bytes {off}+{len} run past the region's {} bytes", self.len()),
        }
    }
}

/// A user-level pager: see the module documentation.
pub struct Pager {
    shared: Arc<Shared>,
    handler: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pager(budget {} pages)", self.shared.budget)
    }
}

/// Whether this kernel can run the pager (userfaultfd with `UFFDIO_MOVE`), and why not.
pub fn available() -> std::result::Result<(), String> {
    usable_here().map_err(|e| match e {
        Error::Unsupported { why, .. } => why,
        e => e.to_string(),
    })
}

/// As [`available`], for starting a pager: a kernel without what the pager needs is
/// `Unsupported`, but a process out of fds or memory (EMFILE, ENFILE, ENOMEM while
/// opening the probe's userfaultfd) gets that error, which goes when fds are freed.
fn usable_here() -> Result<()> {
    let info = match Userfaultfd::probe() {
        Ok(info) => info,
        Err(e) if e.is_out_of_resources() => return Err(e.into()),
        Err(e) => return Err(Error::Unsupported { what: "pager", why: format!("userfaultfd: {e}") }),
    };
    if info.features & uffd::feature::MOVE == 0 {
        return Err(Error::Unsupported { what: "pager", why: "userfaultfd has no UFFDIO_MOVE (Linux 6.8+)".into() });
    }
    // A user-mode-only userfaultfd is not handed the faults the kernel takes for the
    // program (read(2) into a page not resident, write(2) from one): they failed with
    // EFAULT, in thread mode too, and data read from a socket was lost.
    if info.user_mode_only() {
        return Err(Error::NeedsPrivilege { what: "the pager", needs: uffd::FULL_NEEDS, uid: crate::sys::euid() });
    }
    Ok(())
}

/// Time per fault when a missing-page fault is resolved (zero page) on the faulting
/// thread from userfaultfd's SIGBUS mode, over `pages` faults: the price the pager's
/// handler thread is compared with. `Ok(None)`: the kernel has no SIGBUS mode.
pub fn sigbus_zero_fill_cost(pages: usize) -> Result<Option<Duration>> {
    Ok(crate::sys::uffd_sigbus::zero_fill_cost(pages)?)
}

fn open_swap(cfg: &Config) -> Result<SwapFile> {
    let direct = cfg.swap_io == SwapIo::Direct;
    let (path, temporary) = match &cfg.swap_path {
        None => (PathBuf::from("/var/tmp"), true),
        Some(p) if p.is_dir() => (p.clone(), true),
        Some(p) => (p.clone(), false),
    };
    // The open's own error (ENOENT, EACCES, ENOTDIR...) so a C caller's errno says why.
    SwapFile::open(&path, temporary, direct).map_err(|e| Error::io(&path, e))
}

impl Pager {
    /// Starts a pager (its handler thread included).
    pub fn new(cfg: Config) -> Result<Self> {
        let ps = page_size();
        if cfg.budget_bytes < ps {
            return Err(Error::InvalidArgument {
                what: "budget",
                why: format!("{} bytes is below one {ps}-byte page", cfg.budget_bytes),
            });
        }
        // Below a page it was a swap file of no pages: every needed page evicted failed.
        if cfg.swap_capacity_bytes < ps as u64 {
            return Err(Error::InvalidArgument {
                what: "swap capacity",
                why: format!("{} bytes is below one {ps}-byte page", cfg.swap_capacity_bytes),
            });
        }
        usable_here()?;
        let capacity = (cfg.swap_capacity_bytes / ps as u64).min(u64::from(u32::MAX)) as u32;
        let swap = open_swap(&cfg)?;
        let cgroup = match &cfg.cgroup {
            None => None,
            Some(p) => {
                let g = Group::open(p)?;
                let limit = g.limit_bytes()?;
                Some((g, limit))
            }
        };
        let sigbus = match cfg.fault_mode {
            FaultMode::Thread => false,
            FaultMode::Auto => sigbus_available(),
            FaultMode::Sigbus if sigbus_available() => true,
            FaultMode::Sigbus => {
                return Err(Error::Unsupported {
                    what: "pager SIGBUS fault mode",
                    why: format!("userfaultfd offers no SIGBUS mode here (or pages are not {SIGBUS_PAGE} bytes)"),
                })
            }
        };
        let fd = Userfaultfd::new(if sigbus { uffd::feature::SIGBUS } else { 0 }, true)?;
        let staging = Area::new(&fd, STAGE_PAGES * ps, false, false)?;
        let kernel_needed = cfg.needed_paging == NeededPaging::Kernel;
        // nothing is read back when the kernel pages the needed pages
        let track_clean = !sigbus && !kernel_needed && fd.info().features & uffd::feature::PAGEFAULT_FLAG_WP != 0;
        let shared = Arc::new(Shared {
            fd,
            owner: Owner::this_process(),
            sigbus,
            track_clean,
            kernel_needed,
            marks: Arc::new(AtomicU64::new(0)),
            refills: AtomicU64::new(0),
            preflush_seen: AtomicU64::new(0),
            short_seen: AtomicU64::new(u64::MAX),
            hand: AtomicU64::new(0),
            active: Mutex::new(BTreeSet::new()),
            filled: Ring::new((cfg.budget_bytes / ps).clamp(1024, 1 << 16)),
            bell: Doorbell::new()?,
            answered: AtomicU32::new(0),
            room_asked: AtomicBool::new(false),
            budget: cfg.budget_bytes / ps,
            headroom: cfg.preflush_headroom_bytes.map(|b| b / ps),
            cgroup,
            regions: RwLock::new(Regions::default()),
            next_id: AtomicU64::new(0),
            staging,
            swap,
            slots: Mutex::new(Slots { free: Vec::new(), next: 0, capacity }),
            queue: Mutex::new(VecDeque::new()),
            queue_compact_at: AtomicUsize::new(QUEUE_COMPACT_MIN),
            evicting: Mutex::new(()),
            resident: AtomicUsize::new(0),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            #[cfg(test)]
            written_race: Mutex::new(None),
            handler_state: AtomicU8::new(0),
            unread: Mutex::new(Vec::new()),
            last_fault: AtomicUsize::new(0),
        });
        report::enlist(&shared);
        let s = shared.clone();
        let handler = crate::sys::signal::spawn_with_sent_signals_blocked(|| {
            std::thread::Builder::new().name("advm-pager".into()).spawn(move || s.handle_faults())
        })
        .map_err(|e| Error::io("pager handler thread", e))?;
        Ok(Self { shared, handler: Some(handler) })
    }

    /// Where faults are served: [`FaultMode::Sigbus`] or [`FaultMode::Thread`].
    pub fn fault_mode(&self) -> FaultMode {
        if self.shared.sigbus {
            FaultMode::Sigbus
        } else {
            FaultMode::Thread
        }
    }

    /// Whether pages read back on a read fault keep their swap copy until written
    /// (clean-page tracking: handler-thread mode, with userfaultfd write protection).
    pub fn tracks_clean_pages(&self) -> bool {
        self.shared.track_clean
    }

    /// Whether the swap file bypasses the page cache.
    pub fn swap_is_direct(&self) -> bool {
        self.shared.swap.direct()
    }

    /// Maps a new region of `len` bytes (rounded up to pages), every page empty:
    /// the first touch of each is a zero-fill fault.
    pub fn map(&self, len: usize) -> Result<PagedRegion> {
        self.shared.owner.check()?;
        let ps = page_size();
        if len == 0 {
            return Err(Error::InvalidArgument { what: "length", why: "0 bytes: use 1 byte or more".into() });
        }
        // Too large is a lack of room (ENOMEM, as mmap says), not a bad argument.
        let len = match crate::mem::page_align_up(len) {
            Some(l) if u32::try_from(l / ps).is_ok() => l,
            _ => {
                return Err(Error::OutOfMemory {
                    what: "pager region",
                    why: format!("{len} bytes: at most 2^32 pages"),
                })
            }
        };
        let pages = len / ps;
        // The per-page records, zeroed (EMPTY, no slot, generation 0) and made before
        // the mapping: they cost memory only for pages that are used, and a refusal is
        // ENOMEM, not an abort.
        let oom =
            || Error::OutOfMemory { what: "pager region", why: format!("no memory for the records of {pages} pages") };
        let bitmap = || Bitmap::new(pages).ok_or_else(oom);
        let discardable = Bitmap::counting_into(pages, self.shared.marks.clone()).ok_or_else(oom)?;
        let (purged, clean, resident) = (bitmap()?, bitmap()?, bitmap()?);
        let state = zeroed::<AtomicU8>(pages).ok_or_else(oom)?;
        let (slot, gen) = (zeroed::<AtomicU32>(pages).ok_or_else(oom)?, zeroed::<AtomicU32>(pages).ok_or_else(oom)?);
        let area = Area::new(&self.shared.fd, len, true, self.shared.track_clean)?;
        let m = Arc::new(Managed {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            owner: self.shared.owner,
            route: OnceLock::new(),
            area,
            orphaned: AtomicBool::new(false),
            discardable,
            purged,
            clean,
            resident,
            state,
            slot,
            gen,
        });
        if self.shared.sigbus {
            let (s, mm) = (self.shared.clone(), m.clone());
            let route = uffd_sigbus::register(
                m.area.addr(),
                len,
                Box::new(move |addr, write| s.serve_signal(&mm, addr, write)),
            );
            match route {
                // the route holds the region; retiring it (unmap, drop) lets go
                Ok(r) => drop(m.route.set(r)),
                Err(e) => {
                    let _ = m.area.unregister(&self.shared.fd);
                    return Err(e.into());
                }
            }
        }
        self.shared.regions.write().unwrap_or_else(|p| p.into_inner()).insert(m.clone());
        Ok(PagedRegion { m })
    }

    /// Gives a region back: waits for an eviction under way, frees its swap slots and
    /// unmaps it: its memory is unmapped when this returns.
    pub fn unmap(&self, region: PagedRegion) -> Result<()> {
        self.give_back(&region)?;
        // The memory goes with the last handle. Another thread may still hold one for a
        // moment (the handler thread that just served a fault, a flush, an eviction's
        // batch, all found before `give_back` took the region out, and none waiting for
        // a lock it holds): wait for them, so the memory is unmapped when this returns.
        // Left to them, it went later, and took with it what the program had mapped there
        // since.
        while Arc::strong_count(&region.m) > 1 {
            std::thread::yield_now();
        }
        drop(region);
        Ok(())
    }

    /// [`Pager::unmap`] but for the unmapping: no fault is served in the region any
    /// more, its pages are counted out and its swap slots freed.
    fn give_back(&self, region: &PagedRegion) -> Result<()> {
        let s = &self.shared;
        s.owner.check()?;
        let m = &region.m;
        let ours =
            s.regions.read().unwrap_or_else(|p| p.into_inner()).by_id.get(&m.id).is_some_and(|r| Arc::ptr_eq(r, m));
        if !ours {
            return Err(Error::InvalidArgument {
                what: "paged region",
                why: format!("{region:?} is not a region of this pager"),
            });
        }
        // no new faults from here; then wait out the signal handlers running in it
        // (before the eviction lock: one may be waiting for an eviction to make room)
        m.area.unregister(&s.fd)?;
        if let Some(r) = m.route.get() {
            r.retire();
        }
        let _ev = s.lock_evicting();
        s.regions.write().unwrap_or_else(|p| p.into_inner()).remove(m);
        s.drain();
        let mut slots = s.slots.lock().unwrap_or_else(|p| p.into_inner());
        // GONE for good: a fault being served now finds it and counts nothing (a fill
        // that counted first takes its count back), and frees the slot it claimed
        for p in 0..m.pages() {
            match m.state[p].swap(GONE, Ordering::AcqRel) {
                RESIDENT => {
                    s.resident.fetch_sub(1, Ordering::AcqRel);
                    if m.clean.take_range(p, 1) {
                        slots.give_back(m.slot[p].load(Ordering::Acquire));
                    }
                }
                SWAPPED => slots.give_back(m.slot[p].load(Ordering::Acquire)),
                _ => {}
            }
        }
        Ok(())
    }

    /// Marks `[addr, addr+len)` discardable (bit flips, no system call).
    pub fn discardable(&self, addr: usize, len: usize) -> Result<()> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        m.discardable.set_range(first, n, true);
        Ok(())
    }

    /// Marks `[addr, addr+len)` needed again.
    pub fn needed(&self, addr: usize, len: usize) -> Result<()> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        m.discardable.set_range(first, n, false);
        Ok(())
    }

    /// Evicts every resident page of `[addr, addr+len)` now: discardable pages are
    /// dropped, needed ones written out (user-initiated pre-flush). Returns the
    /// pages evicted. Fails (with every page still readable) when the swap file is full.
    /// With [`NeededPaging::Kernel`] the needed pages are handed to the kernel's
    /// reclaim instead (`MADV_PAGEOUT`) and only the dropped ones are counted.
    pub fn flush(&self, addr: usize, len: usize) -> Result<usize> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        let _ev = self.shared.lock_evicting();
        if self.shared.kernel_needed {
            let dropped = self.shared.drop_discardable_in(&m, first, first + n, usize::MAX, Cause::User);
            m.area.page_out(first, n)?;
            return Ok(dropped);
        }
        self.shared.evict_range(&m, first, n, Cause::User)
    }

    /// Who pages out needed pages.
    pub fn needed_paging(&self) -> NeededPaging {
        if self.shared.kernel_needed {
            NeededPaging::Kernel
        } else {
            NeededPaging::SwapFile
        }
    }

    /// Drops every resident discardable page of `[addr, addr+len)` now and writes
    /// nothing (the paper's `FlushDiscardable`, a collector's user-initiated
    /// pre-flush); needed pages stay. Returns the pages dropped.
    pub fn flush_discardable(&self, addr: usize, len: usize) -> Result<usize> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        let _ev = self.shared.lock_evicting();
        Ok(self.shared.drop_discardable_in(&m, first, first + n, usize::MAX, Cause::User))
    }

    /// Purgeable memory: makes `[addr, addr+len)` needed and says whether its
    /// contents survived (false: a page was discarded while it was unlocked).
    pub fn lock(&self, addr: usize, len: usize) -> Result<bool> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        // under the eviction lock, no page is between its move and its re-check
        let _ev = self.shared.lock_evicting();
        m.discardable.set_range(first, n, false);
        Ok(!m.purged.take_range(first, n))
    }

    /// Purgeable memory: `[addr, addr+len)` may be discarded until locked again.
    /// Starts a new unlocked period: the next [`Pager::lock`] reports only pages
    /// discarded from now on (not a drop from an earlier use of the range, e.g. as a
    /// collector's garbage, that no lock reported).
    pub fn unlock(&self, addr: usize, len: usize) -> Result<()> {
        let (m, first, n) = self.shared.locate(addr, len)?;
        // under the eviction lock, no drop of this range is between its bit and ours
        let _ev = self.shared.lock_evicting();
        m.purged.take_range(first, n);
        m.discardable.set_range(first, n, true);
        Ok(())
    }

    /// The statistics so far.
    ///
    /// In a child forked from the pager's process: the figures as the fork left them,
    /// taking no lock (see [`Pager::usable`]).
    pub fn stats(&self) -> Stats {
        let here = self.shared.owner.is_here();
        if here {
            self.shared.drain();
        }
        let c = &self.shared.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let fc = |w: usize| FaultCounts {
            zero_filled: ld(&c.fault[w][0]),
            not_read: ld(&c.fault[w][1]),
            read: ld(&c.fault[w][2]),
        };
        Stats {
            read_faults: fc(0),
            write_faults: fc(1),
            discarded_pages: ld(&c.discarded),
            written_pages: ld(&c.written),
            preflushed_by_pager: ld(&c.by_pager),
            preflushed_by_user: ld(&c.by_user),
            bytes_written: ld(&c.bytes_written),
            bytes_read: ld(&c.bytes_read),
            read_ahead_pages: ld(&c.read_ahead),
            zero_ahead_pages: ld(&c.zero_ahead),
            clean_dropped_pages: ld(&c.clean_dropped),
            resident_pages: self.shared.resident.load(Ordering::Acquire) as u64,
            swapped_pages: match here {
                true => self.shared.slots.lock().unwrap_or_else(|p| p.into_inner()).used(),
                false => self.shared.slots.try_lock().map_or(0, |s| s.used()),
            },
            fault_ns: ld(&c.fault_ns),
            evict_ns: ld(&c.evict_ns),
            write_ns: ld(&c.write_ns),
            eviction_failures: ld(&c.failures),
        }
    }

    /// Ok in the process that made the pager. In a child forked from it, an
    /// [`Error::Unrecoverable`] saying so: there every call that takes a range, maps or
    /// unmaps fails with it (the regions are not inherited, and a parent thread may have
    /// held one of the pager's locks at the fork), and dropping the pager leaves the
    /// parent's state alone.
    ///
    /// Inlined, a few loads and a compare: advm-gc calls it on every object access of
    /// a paged heap. Out of line it cost the CPU-bound primes run 24% more user time
    /// than the same heap in plain memory (docs/pager.md, measured 2026-11-29).
    #[inline]
    pub fn usable(&self) -> Result<()> {
        self.shared.owner.check()
    }

    /// The budget, pages.
    pub fn budget_pages(&self) -> usize {
        self.shared.budget
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        if !self.shared.owner.is_here() {
            // A forked child: the handler thread is the parent's (joining it panicked),
            // the uffd acts on the parent's memory and the regions' addresses are not
            // this process's mappings (unmapping them could hit the child's own): leave
            // it all alone, leaked.
            std::mem::forget(self.handler.take());
            std::mem::forget(self.shared.clone());
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the handler thread now: waiting out its poll's tick made every drop
        // take about 10 ms (a C program's create/destroy loop: 29 ms a pager).
        self.shared.bell.ring();
        if let Some(h) = self.handler.take() {
            let _ = h.join();
        }
        // regions still held by callers stay mapped; closing the userfaultfd (with
        // the last reference) unregisters them, so they behave as plain memory
        for m in self.shared.regions.read().unwrap_or_else(|p| p.into_inner()).by_id.values() {
            m.orphaned.store(true, Ordering::Release);
            let _ = m.area.unregister(&self.shared.fd);
            if let Some(r) = m.route.get() {
                r.retire();
            }
        }
    }
}

/// The eviction lock held: adds the time it was held to a counter when dropped.
struct Evicting<'a> {
    _guard: MutexGuard<'a, ()>,
    since: Instant,
    ns: &'a AtomicU64,
}

impl Drop for Evicting<'_> {
    fn drop(&mut self) {
        self.ns.fetch_add(self.since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Shared {
    /// The eviction lock; the time it is held is counted in `evict_ns`.
    fn lock_evicting(&self) -> Evicting<'_> {
        let guard = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        Evicting { _guard: guard, since: Instant::now(), ns: &self.counters.evict_ns }
    }

    /// The region holding `[addr, addr+len)`, and the range as pages.
    fn locate(&self, addr: usize, len: usize) -> Result<(Arc<Managed>, usize, usize)> {
        // before any lock: in a forked child one may be held for ever
        self.owner.check()?;
        let r = PageRange::new("range", addr, len)?;
        if r.is_empty() {
            return Err(Error::InvalidArgument { what: "range", why: format!("{addr:#x}+0 is empty") });
        }
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let m = regions
            .holding(addr)
            .filter(|m| r.pages() <= m.pages() - (addr - m.area.addr()) / page_size())
            .ok_or_else(|| Error::InvalidArgument {
                what: "range",
                why: format!("{} is not inside one region of this pager", HostAddr(addr)),
            })?;
        Ok((m.clone(), (addr - m.area.addr()) / page_size(), r.pages()))
    }

    fn find(&self, addr: usize) -> Option<(Arc<Managed>, usize)> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let m = regions.holding(addr)?;
        Some((m.clone(), (addr - m.area.addr()) / page_size()))
    }

    fn handle_faults(&self) {
        // says how the thread ended (a panic too) to `report`
        struct Ended<'a>(&'a AtomicU8);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.store(if std::thread::panicking() { 2 } else { 1 }, Ordering::Release);
            }
        }
        let _ended = Ended(&self.handler_state);
        let mut buf = match PageBuf::new(READ_AHEAD) {
            Ok(b) => b,
            Err(_) => return,
        };
        let mut last_look = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            if sp::wait_event(&self.fd, &self.bell, TICK.as_millis() as i32) {
                while let Ok(Some(ev)) = self.fd.read_event() {
                    if let Event::Pagefault { address, flags } = ev {
                        if flags & uffd::fault_flag::WP != 0 {
                            match self.find(address as usize) {
                                Some((m, page)) => self.written(&m, page),
                                // unmapped meanwhile: as for a missing page below
                                None => self.wake_unheld(address as usize),
                            }
                            continue;
                        }
                        if !self.serve_fault(address as usize, flags, buf.bytes_mut()) {
                            self.unread.lock().unwrap_or_else(|p| p.into_inner()).push((address as usize, flags));
                        }
                    }
                }
            }
            if self.sigbus {
                self.answer_bell();
            }
            if last_look.elapsed() >= TICK {
                last_look = Instant::now();
                self.retry_unread(buf.bytes_mut());
                self.watch_cgroup();
            }
        }
        // faulting threads waiting for room go ahead without it
        self.answer_bell();
    }

    /// Serves the missing-page fault of a thread blocked at `addr` (its `flags`) and
    /// wakes it. False: the swap file could not be read, and the thread still waits
    /// (it is not handed wrong data, nor woken to fault again at once): the fault is
    /// to be retried.
    fn serve_fault(&self, addr: usize, flags: u64, buf: &mut [u8]) -> bool {
        self.last_fault.store(addr, Ordering::Relaxed);
        self.keep_budget(1);
        // the fault itself, without the eviction that made room for it
        let t = Instant::now();
        let served = match self.find(addr) {
            Some((m, page)) => {
                let served = self.serve(&m, page, flags & uffd::fault_flag::WRITE != 0, buf, false);
                if served {
                    let _ = m.area.wake(&self.fd, page);
                }
                served
            }
            // A region being unmapped: the kernel wakes the faults waiting when it
            // unregisters, but one that got in between that wake and the unregistering
            // itself (a fault under the VMA lock, not mmap_lock) waits for us. Woken, it
            // faults again: on plain memory, or here once more until the unregistering ends.
            None => {
                self.wake_unheld(addr);
                true
            }
        };
        self.counters.fault_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        served
    }

    /// Serves again the faults whose swap read failed (once a tick): a thread blocked
    /// on one is never woken otherwise, since it does not fault again.
    fn retry_unread(&self, buf: &mut [u8]) {
        let waiting = std::mem::take(&mut *self.unread.lock().unwrap_or_else(|p| p.into_inner()));
        for (addr, flags) in waiting {
            if !self.serve_fault(addr, flags, buf) {
                self.unread.lock().unwrap_or_else(|p| p.into_inner()).push((addr, flags));
            }
        }
    }

    /// Makes the room faulting threads asked for (or drains their records), then
    /// wakes them.
    fn answer_bell(&self) {
        self.bell.clear();
        if self.room_asked.swap(false, Ordering::AcqRel) {
            self.keep_budget(1);
        } else {
            self.drain();
        }
        self.answered.fetch_add(1, Ordering::AcqRel);
        sp::wake_all(&self.answered);
    }

    /// Serves a SIGBUS fault at `addr` of `m` on the faulting thread.
    fn serve_signal(&self, m: &Managed, addr: usize, write: bool) {
        #[repr(C, align(4096))]
        struct OnePage([u8; SIGBUS_PAGE]);
        let t = Instant::now();
        self.last_fault.store(addr, Ordering::Relaxed);
        let mut buf = OnePage([0; SIGBUS_PAGE]);
        if addr < m.area.addr() || addr >= m.area.addr() + m.area.len() {
            return;
        }
        let page = (addr - m.area.addr()) / SIGBUS_PAGE;
        if !self.serve(m, page, write, &mut buf.0, true) {
            // an I/O error: the access faults again and retries, not too eagerly
            std::thread::sleep(TICK);
        }
        self.counters.fault_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Counts one more resident page before a fill. On the handler thread the budget
    /// was made first; on a faulting thread (`signal`), the count is taken only below
    /// the budget, else the handler thread is asked for room and waited for, until
    /// it has room, an eviction failed (the budget gives way, as on the handler
    /// thread) or the pager stops. With [`NeededPaging::Kernel`] the budget bounds
    /// no needed page (the handler thread makes room by dropping discardable pages
    /// only, and there may be none), so the faulting thread asks and goes on.
    fn reserve(&self, signal: bool) {
        if !signal {
            self.resident.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let failures = self.counters.failures.load(Ordering::Acquire);
        loop {
            let r = self.resident.load(Ordering::Acquire);
            let forced = self.kernel_needed
                || self.stop.load(Ordering::Acquire)
                || self.counters.failures.load(Ordering::Acquire) != failures;
            if r < self.budget || forced {
                if self.resident.compare_exchange_weak(r, r + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    continue;
                }
                // the pre-flush headroom or the budget reached: the handler thread
                // drops discardable pages meanwhile
                if r + 1 + self.headroom.unwrap_or(0) >= self.budget {
                    self.ask_room();
                }
                return;
            }
            let seen = self.answered.load(Ordering::Acquire);
            self.ask_room();
            sp::wait_while(&self.answered, seen, TICK);
        }
    }

    /// Counts one more resident page if the budget has room for it (with
    /// [`NeededPaging::Kernel`], whose budget bounds no needed page (the cgroup's
    /// limit does): always). Never waits.
    fn take_room(&self) -> bool {
        if self.kernel_needed {
            self.resident.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        let budget = self.budget;
        self.resident.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| (r < budget).then_some(r + 1)).is_ok()
    }

    fn ask_room(&self) {
        if !self.room_asked.swap(true, Ordering::AcqRel) {
            self.bell.ring();
        }
    }

    /// Records a fill of `page` (its `gen`) and a swap slot to free, either of them
    /// optional: through the lock-free ring, drained under the queue lock.
    fn record(&self, id: u64, page: Option<(usize, u32)>, slot: Option<u32>, signal: bool) {
        let rec =
            [id, page.map_or(NO_PAGE, |(p, g)| (p as u64) << 32 | u64::from(g)), slot.map_or(0, |s| u64::from(s) + 1)];
        while !self.filled.push(rec) {
            if signal {
                let seen = self.answered.load(Ordering::Acquire);
                self.bell.ring();
                sp::wait_while(&self.answered, seen, TICK);
            } else {
                self.drain();
            }
        }
    }

    /// Moves the ring's records into the replacement queue and frees their slots.
    fn drain(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.drain_into(&mut q);
    }

    fn drain_into(&self, q: &mut VecDeque<(u64, u32, u32)>) {
        let mut freed = Vec::new();
        let mut filled_in = None;
        let mut active = None;
        while let Some([id, page, slot]) = self.filled.pop() {
            if page != NO_PAGE {
                q.push_back((id, (page >> 32) as u32, page as u32));
                if filled_in != Some(id) {
                    filled_in = Some(id);
                    active.get_or_insert_with(|| self.active.lock().unwrap_or_else(|p| p.into_inner())).insert(id);
                }
            }
            if slot != 0 {
                freed.push((slot - 1) as u32);
            }
        }
        if !freed.is_empty() {
            let mut sl = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            freed.into_iter().for_each(|s| sl.give_back(s));
        }
        if q.len() > self.queue_compact_at.load(Ordering::Relaxed) {
            self.compact(q);
        }
    }

    /// Drops the queue's stale entries: pages filled again since (a later entry holds
    /// them), regions unmapped. Entries leave the queue only when the budget evicts;
    /// without this, a program that flushes and touches its pages again and again
    /// below the budget grew it by one entry a fill, for ever. The caller holds the
    /// queue lock (taken before the region index's, never after).
    fn compact(&self, q: &mut VecDeque<(u64, u32, u32)>) {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        q.retain(|&(id, page, gen)| {
            regions.by_id.get(&id).is_some_and(|m| m.gen[page as usize].load(Ordering::Acquire) == gen)
        });
        self.queue_compact_at.store((2 * q.len()).max(QUEUE_COMPACT_MIN), Ordering::Relaxed);
    }

    /// The oldest entry of the replacement queue.
    fn oldest(&self) -> Option<(u64, u32, u32)> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_empty() {
            self.drain_into(&mut q);
        }
        q.pop_front()
    }

    /// Serves a fault on `page` of `m`: fills it with zeros or its swap copy (read
    /// into `buf`, one aligned page) unless another thread did. `signal`: on the
    /// faulting thread's SIGBUS handler, so no lock and no allocation. False: the
    /// swap file could not be read, nothing filled.
    fn serve(&self, m: &Managed, page: usize, write: bool, buf: &mut [u8], signal: bool) -> bool {
        let w = usize::from(write);
        loop {
            let st = m.state[page].load(Ordering::Acquire);
            match st {
                RESIDENT | GONE => return true,
                EVICTING => {
                    // the evicting thread never faults; it will be done in microseconds
                    std::thread::yield_now();
                }
                EMPTY | DISCARDED => {
                    self.reserve(signal);
                    let done = m.area.fill_zero(&self.fd, page, write).unwrap_or(false);
                    if done {
                        let kind = if st == EMPTY { 0 } else { 1 };
                        self.counters.fault[w][kind].fetch_add(1, Ordering::Relaxed);
                    }
                    self.filled_from(m, page, st, done, None, signal);
                    if done {
                        self.zero_ahead(m, page, st, ZERO_AHEAD - 1, signal);
                    }
                    return true;
                }
                _ => {
                    // claimed (EVICTING) so that unmap and flush leave the slot to us
                    if m.state[page].compare_exchange(SWAPPED, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
                        continue;
                    }
                    let slot = m.slot[page].load(Ordering::Acquire);
                    let done = if m.discardable.get(page) {
                        // garbage now: zeros, the swap copy is never read
                        self.reserve(signal);
                        let done = m.area.fill_zero(&self.fd, page, write).unwrap_or(false);
                        if done {
                            m.purged.set_range(page, 1, true);
                            self.counters.fault[w][1].fetch_add(1, Ordering::Relaxed);
                        }
                        done
                    } else {
                        let ps = page_size();
                        let ahead = if signal { 0 } else { self.claim_ahead(m, page, slot, buf.len() / ps - 1) };
                        if self.swap.read_page(slot as usize, &mut buf[..(1 + ahead) * ps]).is_err() {
                            for p in page..=page + ahead {
                                if m.state[p]
                                    .compare_exchange(EVICTING, SWAPPED, Ordering::AcqRel, Ordering::Acquire)
                                    .is_err()
                                {
                                    self.record(m.id, None, Some(m.slot[p].load(Ordering::Acquire)), signal);
                                }
                            }
                            return false;
                        }
                        self.reserve(signal);
                        // read, not written: installed clean (its slot kept) where tracked
                        let done = self.fill_read_back(m, page, &buf[..ps], !write && self.track_clean);
                        if done {
                            self.counters.fault[w][2].fetch_add(1, Ordering::Relaxed);
                            self.counters.bytes_read.fetch_add(ps as u64, Ordering::Relaxed);
                        }
                        // the pages read ahead: resident without a fault (none waits on them)
                        for i in 1..=ahead {
                            let p = page + i;
                            self.reserve(false);
                            let d = self.fill_read_back(m, p, &buf[i * ps..(i + 1) * ps], self.track_clean);
                            if d {
                                self.counters.read_ahead.fetch_add(1, Ordering::Relaxed);
                                self.counters.bytes_read.fetch_add(ps as u64, Ordering::Relaxed);
                            }
                            self.settle_read_back(m, p, d, false);
                        }
                        self.settle_read_back(m, page, done, signal);
                        return true;
                    };
                    self.filled_from(m, page, EVICTING, done, Some(slot), signal);
                    return true;
                }
            }
        }
    }

    /// After a zero-fill fault on a page that was `st` (empty or discarded): the
    /// pages after it in the same state that are needed (a discarded page the
    /// application marked needed again is about to be reused: a collector's next
    /// allocation buffer; memory is used upwards) get their fresh zero pages now, up
    /// to `most` and while the budget has room (with [`NeededPaging::Kernel`]: up to
    /// `most`), each without a fault of its own. `signal`: on a faulting thread's
    /// SIGBUS handler (no lock, no wait for room).
    fn zero_ahead(&self, m: &Managed, page: usize, st: u8, most: usize, signal: bool) {
        // the run claimed first (each page's state and count), then filled in one call
        let end = (page + 1 + most).min(m.pages());
        let mut n = 0;
        while page + 1 + n < end {
            let p = page + 1 + n;
            if m.discardable.get(p)
                || m.state[p].compare_exchange(st, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err()
            {
                break;
            }
            if !self.take_room() {
                let _ = m.state[p].compare_exchange(EVICTING, st, Ordering::AcqRel, Ordering::Acquire);
                break;
            }
            n += 1;
        }
        if n == 0 {
            return;
        }
        let filled = m.area.fill_zeros(&self.fd, page + 1, n).unwrap_or(0);
        for p in page + 1..page + 1 + n {
            if p < page + 1 + filled {
                self.counters.zero_ahead.fetch_add(1, Ordering::Relaxed);
                self.filled_from(m, p, EVICTING, true, None, signal);
            } else {
                // not filled: as it was (or unmapped meanwhile)
                self.resident.fetch_sub(1, Ordering::AcqRel);
                let _ = m.state[p].compare_exchange(EVICTING, st, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// Installs the swap copy `data` of the claimed page `page`; `clean`: write-protected
    /// and marked clean, so that it keeps its swap slot until it is written.
    fn fill_read_back(&self, m: &Managed, page: usize, data: &[u8], clean: bool) -> bool {
        if !clean {
            return m.area.fill_copy(&self.fd, page, data).unwrap_or(false);
        }
        // marked before it can be seen resident: an eviction must find it clean
        m.clean.set_range(page, 1, true);
        let done = m.area.fill_copy_clean(&self.fd, page, data).unwrap_or(false);
        if !done {
            m.clean.take_range(page, 1);
        }
        done
    }

    /// Settles a read-back fill of the claimed `page`: as [`Shared::filled_from`],
    /// except that a page installed clean keeps its slot (freed if it was unmapped).
    fn settle_read_back(&self, m: &Managed, page: usize, done: bool, signal: bool) {
        let slot = m.slot[page].load(Ordering::Acquire);
        if !(done && m.clean.get(page)) {
            self.filled_from(m, page, EVICTING, done, Some(slot), signal);
            return;
        }
        self.filled_from(m, page, EVICTING, true, None, signal);
        if m.state[page].load(Ordering::Acquire) == GONE && m.clean.take_range(page, 1) {
            self.record(m.id, None, Some(slot), signal);
        }
    }

    /// A write-protect fault: the clean page `page` is being written. Its swap copy
    /// is stale from now on (the slot is freed, unless an eviction kept it first);
    /// then the writer goes on (or, the page evicted meanwhile, faults again).
    fn written(&self, m: &Managed, page: usize) {
        // The slot is read before the bit is taken. Read after, it could be the slot of
        // a write-out that ran in between (an eviction that found the bit already
        // taken writes the page to a new slot): that live slot was freed, the old one
        // leaked, and the next free of the live slot freed it twice. While the bit is
        // set the slot stays put (only a write-out changes it, and only once the bit is
        // clear), and only this thread sets the bit again (it serves every read-back).
        let slot = m.slot[page].load(Ordering::Acquire);
        #[cfg(test)]
        self.between_slot_and_clean();
        if m.clean.take_range(page, 1) {
            self.record(m.id, None, Some(slot), false);
        }
        if m.area.unprotect(&self.fd, page).is_err() {
            // unregistered meanwhile: the writer must not wait for ever
            let _ = m.area.wake(&self.fd, page);
        }
    }

    #[cfg(test)]
    fn between_slot_and_clean(&self) {
        if let Some(f) = self.written_race.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            f(self);
        }
    }

    /// Wakes a fault at `addr` that no region holds (see `handle_faults`).
    fn wake_unheld(&self, addr: usize) {
        let _ = self.fd.wake((addr & !(page_size() - 1)) as *mut u8, page_size());
    }

    /// Claims (SWAPPED -> EVICTING) up to `most` pages after `page` (swapped to `slot`)
    /// that are swapped to the slots after it and still needed, while the budget has
    /// room for them besides the faulting page; returns how many.
    fn claim_ahead(&self, m: &Managed, page: usize, slot: u32, most: usize) -> usize {
        let room = self.budget.saturating_sub(self.resident.load(Ordering::Acquire) + 1);
        let mut n = 0;
        while n < most.min(room) {
            let p = page + n + 1;
            if p >= m.pages()
                || m.discardable.get(p)
                || m.state[p].compare_exchange(SWAPPED, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err()
            {
                break;
            }
            if m.slot[p].load(Ordering::Acquire) != slot + n as u32 + 1 || m.discardable.get(p) {
                // unclaimed; unmapped meanwhile (GONE): its slot is ours to free
                if m.state[p].compare_exchange(EVICTING, SWAPPED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    self.record(m.id, None, Some(m.slot[p].load(Ordering::Acquire)), false);
                }
                break;
            }
            n += 1;
        }
        n
    }

    /// Settles a fill attempt of `page`, counted by [`Shared::reserve`], whose state
    /// was `from` (EVICTING: a claimed swapped page holding `slot`). A page filled is
    /// resident, unless it was unmapped meanwhile (then its count is taken back); a
    /// slot read back is freed. Not filled: the count is taken back and a claimed
    /// page keeps its slot, or frees it if unmapped meanwhile.
    fn filled_from(&self, m: &Managed, page: usize, from: u8, done: bool, slot: Option<u32>, signal: bool) {
        let to = if done { RESIDENT } else { SWAPPED };
        // a new residency: queue entries of earlier ones are stale from here
        let gen = m.gen[page].fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let kept = if done || from == EVICTING {
            m.state[page].compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
        } else {
            false
        };
        if done && kept {
            m.resident.set(page);
            if m.discardable.get(page) {
                // a scan for discardable pages must look again (after the bit above)
                self.refills.fetch_add(1, Ordering::SeqCst);
            }
            self.record(m.id, Some((page, gen)), slot, signal);
            return;
        }
        self.resident.fetch_sub(1, Ordering::AcqRel);
        if done || !kept {
            if let Some(s) = slot {
                self.record(m.id, None, Some(s), signal);
            }
        }
    }

    /// Makes room for `incoming` pages: evicts what the budget (and the pre-flush
    /// headroom) asks for before a fault is filled, so the budget is never exceeded.
    fn keep_budget(&self, incoming: usize) {
        let resident = self.resident.load(Ordering::Acquire) + incoming;
        if let Some(h) = self.headroom {
            if resident + h >= self.budget && self.marked_since(&self.preflush_seen) {
                let _ev = self.lock_evicting();
                self.drop_discardable(usize::MAX, Cause::Pager);
            }
        }
        let resident = self.resident.load(Ordering::Acquire) + incoming;
        if resident > self.budget {
            // one eviction step: down to the budget, a little below to batch the work
            let step = (self.budget / 64).max(1);
            let want = resident - self.budget + step - 1;
            if self.kernel_needed {
                // needed pages stay above the budget (the kernel's to page out): scan
                // for discardable ones again only once more were marked (or filled)
                if self.short_seen.load(Ordering::Acquire) == self.drop_epoch() {
                    return;
                }
                let _ev = self.lock_evicting();
                self.drop_discardable(want, Cause::Budget);
                return;
            }
            let _ev = self.lock_evicting();
            // Failed, or not one page could be taken (every candidate pinned, or its
            // move refused): the budget gives way, and a faulting thread waiting for
            // room in SIGBUS mode goes ahead (it would otherwise wait for ever).
            if !matches!(self.evict(want, Cause::Budget), Ok(n) if n > 0) {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Pager-initiated flush on cgroup pressure: the usage within the headroom (or
    /// an eighth of the limit) of the limit.
    fn watch_cgroup(&self) {
        let Some((g, limit)) = &self.cgroup else { return };
        let Ok(usage) = g.usage_bytes() else { return };
        let ps = page_size() as u64;
        let headroom = self.headroom.map(|h| h as u64 * ps).unwrap_or(limit / 8);
        if usage + headroom < *limit {
            return;
        }
        let over = ((usage + headroom - limit) / ps) as usize;
        let _ev = self.lock_evicting();
        // with a headroom, every discardable page goes (pre-flush); the rest of the
        // excess is a page-out the limit forces, as the budget's are
        let dropped = match self.headroom {
            Some(_) => self.drop_discardable(usize::MAX, Cause::Pager),
            None => 0,
        };
        if dropped < over && self.evict(over - dropped, Cause::Budget).is_err() {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The regions' bitmap marks: it moves whenever pages are marked discardable.
    fn marks(&self) -> u64 {
        self.marks.load(Ordering::SeqCst)
    }

    /// Moves whenever a page may have become resident and discardable: a mark, or a
    /// fill of a page marked discardable.
    fn drop_epoch(&self) -> u64 {
        self.marks().wrapping_add(self.refills.load(Ordering::SeqCst))
    }

    /// Whether pages were marked discardable since the last call with `seen`.
    fn marked_since(&self, seen: &AtomicU64) -> bool {
        let now = self.marks();
        seen.swap(now, Ordering::AcqRel) != now
    }

    /// Evicts `want` pages: discardable ones first, then needed ones in fill order
    /// (none with [`NeededPaging::Kernel`]). The caller holds the eviction lock.
    fn evict(&self, want: usize, cause: Cause) -> Result<usize> {
        let mut done = self.drop_discardable(want, cause);
        if self.kernel_needed {
            return Ok(done);
        }
        while done < want {
            // a batch of the oldest resident pages, each claimed and moved to staging
            let mut claimed: Vec<(Arc<Managed>, usize)> = Vec::new();
            let mut unmoved = Vec::new();
            while claimed.len() < (want - done).min(STAGE_PAGES) {
                let Some((id, page, gen)) = self.oldest() else {
                    break;
                };
                let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
                let Some(m) = regions.by_id.get(&id).cloned() else { continue };
                drop(regions);
                let page = page as usize;
                if m.gen[page].load(Ordering::Acquire) != gen
                    || m.state[page].compare_exchange(RESIDENT, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err()
                {
                    continue;
                }
                if sp::move_pages(&self.fd, &self.staging, claimed.len(), &m.area, page, 1).is_err() {
                    // not moved (pinned or shared for now): resident still
                    m.state[page].store(RESIDENT, Ordering::Release);
                    unmoved.push((id, page as u32, gen));
                    continue;
                }
                claimed.push((m, page));
            }
            // queued again as the youngest, or no later eviction would find them
            self.queue.lock().unwrap_or_else(|p| p.into_inner()).extend(unmoved);
            if claimed.is_empty() {
                break;
            }
            let staged: Vec<(&Managed, usize)> = claimed.iter().map(|(m, p)| (&**m, *p)).collect();
            match self.settle(&staged, cause) {
                Ok(n) => done += n,
                Err(e) => {
                    // pages put back are resident again: queue them as the oldest
                    let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                    for (m, p) in claimed.iter().rev() {
                        if m.state[*p].load(Ordering::Acquire) == RESIDENT {
                            q.push_front((m.id, *p as u32, m.gen[*p].load(Ordering::Acquire)));
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Drops up to `want` resident discardable pages; returns how many. A clock over
    /// the regions: the scan starts at the region where the last one stopped and goes
    /// round them once at most, so every region gives up its discardable pages in
    /// turn. The region index is locked only to take the next few regions (no copy of
    /// it, no lock while pages move). Skipped when the last scan that went round found
    /// too few and nothing was marked or filled discardable since. The caller holds
    /// the eviction lock.
    fn drop_discardable(&self, want: usize, cause: Cause) -> usize {
        let epoch = self.drop_epoch();
        if self.short_seen.load(Ordering::Acquire) == epoch {
            return 0;
        }
        // every region filled so far is in `active`
        self.drain();
        let start = self.hand.load(Ordering::Relaxed);
        // ids from the hand up, then from 0 up to the hand
        let mut next = Some(start);
        let mut wrapped = false;
        let mut done = 0;
        let mut batch: Vec<Arc<Managed>> = Vec::with_capacity(CLOCK_BATCH);
        while done < want {
            let Some(from) = next else {
                if wrapped || start == 0 {
                    // round every region once: none holds another discardable page
                    self.short_seen.store(epoch, Ordering::Release);
                    return done;
                }
                (next, wrapped) = (Some(0), true);
                continue;
            };
            let end = if wrapped { start } else { u64::MAX };
            let ids: Vec<u64> = {
                let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
                active.range(from..end).take(CLOCK_BATCH).copied().collect()
            };
            next = match ids.last() {
                Some(&id) if ids.len() == CLOCK_BATCH => id.checked_add(1),
                _ => None,
            };
            let mut idle = Vec::new();
            {
                let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
                for id in ids {
                    match regions.by_id.get(&id) {
                        Some(m) => batch.push(m.clone()),
                        // unmapped
                        None => idle.push(id),
                    }
                }
            }
            let mut visited = 0;
            for m in &batch {
                if done >= want {
                    break;
                }
                done += self.drop_discardable_in(m, 0, m.pages(), want - done, cause);
                visited += 1;
                // the next scan starts here: this region may hold more
                self.hand.store(m.id, Ordering::Relaxed);
            }
            // Regions left with no resident page leave the clock. Under its lock: a
            // page filled after the look has its record drained (and its region put
            // back) after this, since the drain that adds it waits for the lock.
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            for id in idle {
                active.remove(&id);
            }
            for m in batch.drain(..).take(visited) {
                if !m.holds_resident() {
                    active.remove(&m.id);
                }
            }
        }
        done
    }

    /// Drops up to `want` resident discardable pages of pages `[from, to)` of `m`;
    /// returns how many. The caller holds the eviction lock.
    fn drop_discardable_in(&self, m: &Managed, from: usize, to: usize, want: usize, cause: Cause) -> usize {
        // a page resident and discardable by the bitmaps (the state decides)
        let candidate = |i: usize| m.discardable.get(i) && m.resident.get(i);
        let mut done = 0;
        let mut p = from;
        while p < to && done < want {
            // pages already dropped (or needed) are skipped a word at a time
            let w = p / 64;
            let bits = m.discardable.word(w) & m.resident.word(w) & (u64::MAX << (p % 64));
            if bits == 0 {
                p = (w + 1) * 64;
                continue;
            }
            p = w * 64 + bits.trailing_zeros() as usize;
            if p >= to {
                break;
            }
            if m.state[p].load(Ordering::Acquire) != RESIDENT {
                p += 1;
                continue;
            }
            let mut end = p + 1;
            while end < to
                && end - p < STAGE_PAGES
                && end - p < want - done
                && candidate(end)
                && m.state[end].load(Ordering::Acquire) == RESIDENT
            {
                end += 1;
            }
            // a discardable page taken back (needed) meanwhile is written, not lost
            done += self.evict_range(m, p, end - p, cause).unwrap_or(0);
            p = end;
        }
        done
    }

    /// Evicts the resident pages of `[first, first+n)` of `m` through the staging
    /// area: each is dropped if its discardable bit is still set after the move, else
    /// written to the swap file. The caller holds the eviction lock.
    fn evict_range(&self, m: &Managed, first: usize, n: usize, cause: Cause) -> Result<usize> {
        let mut evicted = 0;
        let mut p = first;
        while p < first + n {
            // a run of resident pages, claimed one by one
            if m.state[p].compare_exchange(RESIDENT, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
                self.forget_swapped(m, p);
                p += 1;
                continue;
            }
            let mut end = p + 1;
            while end < first + n
                && end - p < STAGE_PAGES
                && m.state[end].compare_exchange(RESIDENT, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                end += 1;
            }
            let r = self.evict_run(m, p, end - p, cause);
            match r {
                Ok(k) => evicted += k,
                Err(e) => return Err(e),
            }
            p = end;
        }
        Ok(evicted)
    }

    /// A written-out page marked discardable since: its swap copy is garbage, freed
    /// without a read (the paper's "not read" faults, on the next touch).
    fn forget_swapped(&self, m: &Managed, p: usize) {
        if !m.discardable.get(p)
            || m.state[p].compare_exchange(SWAPPED, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return;
        }
        if m.discardable.get(p) {
            self.slots.lock().unwrap_or_else(|e| e.into_inner()).give_back(m.slot[p].load(Ordering::Acquire));
            m.purged.set_range(p, 1, true);
            m.state[p].store(DISCARDED, Ordering::Release);
        } else {
            m.state[p].store(SWAPPED, Ordering::Release);
        }
    }

    /// Moves the claimed (EVICTING) run `[p, p+k)` out and settles each page.
    fn evict_run(&self, m: &Managed, p: usize, k: usize, cause: Cause) -> Result<usize> {
        let ps = page_size();
        let moved = match sp::move_pages(&self.fd, &self.staging, 0, &m.area, p, k) {
            Ok(_) => k,
            Err(partial) => partial.done / ps,
        };
        // pages that did not move stay where they are, resident
        for i in p + moved..p + k {
            m.state[i].store(RESIDENT, Ordering::Release);
        }
        let staged: Vec<(&Managed, usize)> = (p..p + moved).map(|page| (m, page)).collect();
        self.settle(&staged, cause)
    }

    /// Settles the pages at staging `0..staged.len()` (`staged[i]` came from region
    /// page `staged[i].1`): each is dropped if its discardable bit is still set, else
    /// written to the swap file, consecutive slots in one write. A page that cannot
    /// be written goes back where it was.
    fn settle(&self, staged: &[(&Managed, usize)], cause: Cause) -> Result<usize> {
        let ps = page_size();
        // slots freed by faults come back first
        self.drain();
        let mut settled = 0;
        let mut keep: Vec<usize> = Vec::new();
        for (i, &(m, page)) in staged.iter().enumerate() {
            // no longer resident (cleared while it is EVICTING, before a fill can set
            // it again; a page put back gets it back)
            m.resident.clear(page);
            // taken away from the region: a writer waiting on its protection has not
            // written it, so a page still marked clean is its swap copy
            let clean = m.clean.take_range(page, 1);
            if m.discardable.get(page) {
                if clean {
                    self.slots
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .give_back(m.slot[page].load(Ordering::Acquire));
                }
                m.purged.set_range(page, 1, true);
                m.state[page].store(DISCARDED, Ordering::Release);
                self.counters.discarded.fetch_add(1, Ordering::Relaxed);
                settled += 1;
            } else if clean {
                m.state[page].store(SWAPPED, Ordering::Release);
                self.counters.clean_dropped.fetch_add(1, Ordering::Relaxed);
                settled += 1;
            } else {
                keep.push(i);
            }
        }
        if self.kernel_needed {
            // marked needed while it was being dropped: it goes back where it was,
            // for the kernel to page (the pager writes nothing in this mode)
            for &i in &keep {
                self.put_back(staged[i].0, staged[i].1, i);
            }
            keep.clear();
        }
        let (mut slots, capacity) = {
            let mut sl = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let taken: Vec<u32> = (0..keep.len()).map_while(|_| sl.take()).collect();
            (taken, sl.capacity)
        };
        slots.sort_unstable();
        let mut result = Ok(());
        if slots.len() < keep.len() {
            for &i in &keep[slots.len()..] {
                self.put_back(staged[i].0, staged[i].1, i);
            }
            result = Err(Error::OutOfMemory {
                what: "pager swap file",
                why: format!("all {capacity} pages of the swap file are in use"),
            });
        }
        let mut j = 0;
        while j < slots.len() {
            let mut end = j + 1;
            while end < slots.len() && keep[end] == keep[end - 1] + 1 && slots[end] == slots[end - 1] + 1 {
                end += 1;
            }
            let t = Instant::now();
            let written = self
                .staging
                .staged(keep[j], end - j)
                .map_err(Error::from)
                .and_then(|data| Ok(self.swap.write_page(slots[j] as usize, data)?));
            self.counters.write_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match written {
                Ok(()) => {
                    for (&i, &slot) in keep[j..end].iter().zip(&slots[j..end]) {
                        let (m, page) = staged[i];
                        m.slot[page].store(slot, Ordering::Release);
                        m.state[page].store(SWAPPED, Ordering::Release);
                    }
                    let n = (end - j) as u64;
                    self.counters.written.fetch_add(n, Ordering::Relaxed);
                    self.counters.bytes_written.fetch_add(n * ps as u64, Ordering::Relaxed);
                    settled += end - j;
                }
                Err(e) => {
                    let mut sl = self.slots.lock().unwrap_or_else(|p| p.into_inner());
                    for (&i, &slot) in keep[j..end].iter().zip(&slots[j..end]) {
                        sl.give_back(slot);
                        self.put_back(staged[i].0, staged[i].1, i);
                    }
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
            j = end;
        }
        let _ = self.staging.drop_pages(0, staged.len());
        self.resident.fetch_sub(settled, Ordering::AcqRel);
        let c = match cause {
            Cause::Budget => None,
            Cause::Pager => Some(&self.counters.by_pager),
            Cause::User => Some(&self.counters.by_user),
        };
        if let Some(c) = c {
            c.fetch_add(settled as u64, Ordering::Relaxed);
        }
        result.map(|()| settled)
    }

    /// Returns staging page `i` to region page `page` (a write-out failed, or the
    /// page was marked needed while it was dropped): nothing is lost. The move back
    /// can fail for a moment (`EAGAIN`, or `EBUSY` while the kernel's reclaim holds
    /// the page) and the copy with it (`ENOMEM` when the memory cgroup is at its
    /// limit), so both are retried until one lands; a page left out would be resident
    /// by its state with an empty page-table entry, and its every access would fault
    /// for ever.
    fn put_back(&self, m: &Managed, page: usize, i: usize) {
        use rustix::io::Errno;
        loop {
            if sp::move_pages(&self.fd, &m.area, page, &self.staging, i, 1).is_ok() {
                break;
            }
            let copied = self.staging.staged(i, 1).and_then(|data| m.area.fill_copy(&self.fd, page, data));
            match copied {
                Err(e) if matches!(e.errno, Errno::NOMEM | Errno::AGAIN | Errno::BUSY) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                // filled, already there, or the region unregistered meanwhile (unmap
                // waits for this eviction, then forgets the page)
                _ => break,
            }
        }
        m.state[page].store(RESIDENT, Ordering::Release);
        m.resident.set(page);
    }
}

#[cfg(test)]
mod tests;
