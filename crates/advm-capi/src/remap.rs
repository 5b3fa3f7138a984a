//! C API of `advm::remap`: `advm_move`, `advm_swap` and batches (see `include/advm.h`).
//!
//! The caller's raw addresses become one `Grant` spanning all ranges of a call; the
//! header states the promise that makes that sound (the caller owns the ranges).
//!
//! Ranges inside a virtual-copy arena (`advm_alloc`/`advm_dup` blocks, or any advm
//! arena's memfd mappings) are never remapped: the arena keeps records of which file
//! page each of its pages maps, which a page move would make false. Such operations
//! copy bytes instead (the arena's pages are written by ordinary stores anyway), and a
//! move between two blocks of the C arena is a virtual copy (`advm_vcopy`), which keeps
//! the pages shared.

use advm::mem::{page_size, Grant, HostAddr, MappingInfo, PageRange};
use advm::remap::{self, Batch, Incomplete};

use crate::guard;

/// `struct advm_remap_stats`: totals of a move, swap or batch, filled by the `_stats` functions.
#[allow(non_camel_case_types)] // the C name
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct advm_remap_stats {
    /// Bytes moved by UFFDIO_MOVE.
    pub uffd_move_bytes: usize,
    /// Bytes moved by mremap.
    pub mremap_bytes: usize,
    /// Bytes copied (memmove or byte swap).
    pub memmove_bytes: usize,
    /// Copied bytes that a page engine was asked to move but the kernel refused.
    pub fallback_bytes: usize,
    /// System calls made.
    pub syscalls: u32,
    /// Bytes of arena blocks copied by the arena's virtual copy (pages shared).
    pub arena_vcopy_bytes: usize,
    /// Operations that ran completely (all of them on success).
    pub completed_ops: usize,
    /// On error: 0 when nothing changed, 1 when the error came after memory changed.
    pub memory_changed: i32,
}

impl From<remap::Outcome> for advm_remap_stats {
    fn from(o: remap::Outcome) -> Self {
        Self {
            uffd_move_bytes: o.uffd_move_bytes,
            mremap_bytes: o.mremap_bytes,
            memmove_bytes: o.memmove_bytes,
            fallback_bytes: o.fallback_bytes,
            syscalls: o.syscalls,
            arena_vcopy_bytes: 0,
            completed_ops: o.completed_ops,
            memory_changed: 0,
        }
    }
}

/// One queued operation of a C batch.
#[derive(Debug, Clone, Copy)]
struct Queued {
    swap: bool,
    x: usize,
    y: usize,
    len: usize,
}

/// `struct advm_batch`: an opaque batch of moves and swaps.
#[allow(non_camel_case_types)] // the C name
pub struct advm_batch {
    ops: Vec<Queued>,
}

/// A grant over the pages covering `[lo, hi)`. Rounded out to pages so that an
/// unaligned argument is reported by the planner, which names it.
fn span_grant(lo: usize, hi: usize) -> Result<Grant<'static>, advm::Error> {
    let ps = page_size();
    let start = lo & !(ps - 1);
    let end = hi.checked_add(ps - 1).map_or(usize::MAX & !(ps - 1), |e| e & !(ps - 1));
    let range = PageRange::new("range", start, end.saturating_sub(start))?;
    // SAFETY: the header's contract: the caller owns every range it passes (no other
    // thread uses them during the call, they are not referenced by code that assumes
    // their contents stay put). advm touches only the ranges named in the call, checks
    // they are mapped read-write first, and refuses bad ones before changing anything.
    unsafe { Grant::for_caller_memory(range) }
}

fn span(ranges: &[(usize, usize)]) -> (usize, usize) {
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.0.saturating_add(r.1)).max().unwrap_or(0);
    (lo, hi)
}

fn write_stats(out: *mut advm_remap_stats, st: advm_remap_stats) {
    if !out.is_null() {
        // SAFETY: a non-null `out` points to a caller-owned advm_remap_stats (header).
        unsafe { out.write(st) };
    }
}

/// Finds which ranges touch an advm arena's mappings. Mappings are looked up through
/// the call's grant, which keeps them for the planner's own checks (one PROCMAP_QUERY
/// per mapping per call); only file-backed ones can be arena memory, and only for those
/// are the names in /proc/self/maps read. Unmapped or wrapping ranges count as not
/// arena memory: the planner refuses them with its own message.
struct ArenaProbe {
    /// Starts of the arena's mappings, read on the first file-backed mapping.
    arena_starts: Option<Vec<usize>>,
}

/// How an advm arena's memfd shows in /proc/self/maps (`advm::vcopy` names it so).
const ARENA_MAPPING_NAME: &str = "/memfd:advm-arena";

impl ArenaProbe {
    fn new() -> Self {
        Self { arena_starts: None }
    }

    fn is_arena(&mut self, v: &MappingInfo) -> bool {
        if !v.file_backed {
            return false;
        }
        let starts = self.arena_starts.get_or_insert_with(|| {
            let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            text.lines()
                .filter(|l| l.contains(ARENA_MAPPING_NAME))
                .filter_map(|l| l.split_once('-').and_then(|(s, _)| usize::from_str_radix(s, 16).ok()))
                .collect()
        });
        starts.contains(&v.start.0)
    }

    /// True when some page of `[addr, addr+len)` is arena memory.
    fn touches(&mut self, g: &mut Grant<'_>, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        let mut at = addr;
        while at < end {
            let Ok(Some(v)) = g.mapping_at(HostAddr(at)) else { return false };
            if self.is_arena(&v) {
                return true;
            }
            at = v.end.0;
        }
        false
    }
}

/// A move between two blocks of the C arena, as a virtual copy; `None` when the arena
/// does not take it (not both in its live blocks, overlapping), to be copied instead.
fn arena_vcopy(dst: usize, src: usize, len: usize) -> Option<advm_remap_stats> {
    let r = crate::vcopy::advm_vcopy(dst as *mut _, src as *const _, len);
    (r == 0).then(|| advm_remap_stats { arena_vcopy_bytes: len, completed_ops: 1, ..Default::default() })
}

/// A lone move or swap, run as a batch of one: on error `*out` says, as
/// `advm_batch_run`'s does, whether memory changed (a kernel call may fail after the
/// first page moved).
fn run_one(swap: bool, x: usize, y: usize, len: usize, out: *mut advm_remap_stats) -> i32 {
    guard(|| {
        let aligned = PageRange::new("dst", x, len).is_ok() && PageRange::new("src", y, len).is_ok();
        if !swap && aligned && crate::vcopy::arena_touches(x, len) && crate::vcopy::arena_touches(y, len) {
            if let Some(st) = arena_vcopy(x, y, len) {
                write_stats(out, st);
                return Ok(0);
            }
        }
        run_queued(&[Queued { swap, x, y, len }], out)
    })
}

/// `int advm_move(void *dst, const void *src, size_t len)`.
#[no_mangle]
pub extern "C" fn advm_move(dst: *mut u8, src: *const u8, len: usize) -> i32 {
    run_one(false, dst as usize, src as usize, len, std::ptr::null_mut())
}

/// `int advm_move_stats(void *dst, const void *src, size_t len, struct advm_remap_stats *out)`.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `advm_remap_stats`.
#[no_mangle]
pub unsafe extern "C" fn advm_move_stats(dst: *mut u8, src: *const u8, len: usize, out: *mut advm_remap_stats) -> i32 {
    run_one(false, dst as usize, src as usize, len, out)
}

/// `int advm_swap(void *a, void *b, size_t len)`.
#[no_mangle]
pub extern "C" fn advm_swap(a: *mut u8, b: *mut u8, len: usize) -> i32 {
    run_one(true, a as usize, b as usize, len, std::ptr::null_mut())
}

/// `struct advm_batch *advm_batch_new(void)`: NULL only when out of memory.
#[no_mangle]
pub extern "C" fn advm_batch_new() -> *mut advm_batch {
    crate::keep_errno(|| {
        std::panic::catch_unwind(|| Box::into_raw(Box::new(advm_batch { ops: Vec::new() })))
            .unwrap_or(std::ptr::null_mut())
    })
}

fn with_batch(b: *mut advm_batch, f: impl FnOnce(&mut advm_batch) -> Result<i32, advm::Error>) -> i32 {
    if b.is_null() {
        return crate::einval();
    }
    // SAFETY: a non-null batch comes from advm_batch_new and is not freed or used by
    // another thread concurrently (header).
    let b = unsafe { &mut *b };
    guard(|| f(b))
}

fn push(b: *mut advm_batch, swap: bool, x: usize, y: usize, len: usize) -> i32 {
    with_batch(b, |b| {
        // What the arguments alone tell (alignment, wrapping) is refused here, where
        // the caller queued it, not at advm_batch_run with the whole batch dropped;
        // mappings are checked when it runs.
        let (xn, yn) = if swap { ("a", "b") } else { ("dst", "src") };
        PageRange::new(xn, x, len)?;
        PageRange::new(yn, y, len)?;
        b.ops.push(Queued { swap, x, y, len });
        Ok(0)
    })
}

/// `int advm_batch_move(struct advm_batch *b, void *dst, const void *src, size_t len)`.
///
/// # Safety
/// `b` is NULL or a live batch from `advm_batch_new`, not used by another thread.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_move(b: *mut advm_batch, dst: *mut u8, src: *const u8, len: usize) -> i32 {
    push(b, false, dst as usize, src as usize, len)
}

/// `int advm_batch_swap(struct advm_batch *b, void *x, void *y, size_t len)`.
///
/// # Safety
/// As [`advm_batch_move`].
#[no_mangle]
pub unsafe extern "C" fn advm_batch_swap(b: *mut advm_batch, x: *mut u8, y: *mut u8, len: usize) -> i32 {
    push(b, true, x as usize, y as usize, len)
}

/// `int advm_batch_run(struct advm_batch *b, struct advm_remap_stats *out)`: runs and empties the
/// batch (also when it fails; `out->completed_ops` then says how far it got).
///
/// # Safety
/// As [`advm_batch_move`]; `out` is NULL or writable for one `advm_remap_stats`.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_run(b: *mut advm_batch, out: *mut advm_remap_stats) -> i32 {
    with_batch(b, |b| run_queued(&std::mem::take(&mut b.ops), out))
}

/// Runs `ops` as one batch and fills `*out` (when not NULL) with its totals, also on
/// error (how far it got, and whether memory changed).
fn run_queued(ops: &[Queued], out: *mut advm_remap_stats) -> Result<i32, advm::Error> {
    let ranges: Vec<_> = ops.iter().flat_map(|q| [(q.x, q.len), (q.y, q.len)]).collect();
    let (lo, hi) = span(&ranges);
    let r = if ops.is_empty() {
        Ok(remap::Outcome::default())
    } else {
        match span_grant(lo, hi) {
            Ok(mut g) => {
                // Operations touching an arena are queued as copies (see the module doc).
                let mut probe = ArenaProbe::new();
                let mut batch = Batch::new();
                for q in ops {
                    let by_copy = probe.touches(&mut g, q.x, q.len) || probe.touches(&mut g, q.y, q.len);
                    let (x, y) = (HostAddr(q.x), HostAddr(q.y));
                    match (q.swap, by_copy) {
                        (false, false) => batch.push_move(x, y, q.len),
                        (false, true) => batch.push_move_by_copy(x, y, q.len),
                        (true, false) => batch.push_swap(x, y, q.len),
                        (true, true) => batch.push_swap_by_copy(x, y, q.len),
                    };
                }
                batch.execute_with_progress(&mut g)
            }
            Err(error) => Err(Box::new(Incomplete {
                error,
                completed_ops: 0,
                memory_changed: false,
                outcome: remap::Outcome { ops: ops.len(), ..Default::default() },
            })),
        }
    };
    match r {
        Ok(o) => {
            write_stats(out, o.into());
            Ok(0)
        }
        Err(i) => {
            let mut st = advm_remap_stats::from(i.outcome);
            st.completed_ops = i.completed_ops;
            st.memory_changed = i.memory_changed as i32;
            write_stats(out, st);
            Err(i.error)
        }
    }
}

/// `void advm_batch_free(struct advm_batch *b)`.
///
/// # Safety
/// `b` is NULL or a live batch from `advm_batch_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_free(b: *mut advm_batch) {
    if !b.is_null() {
        // SAFETY: from advm_batch_new, freed once (header).
        let b = unsafe { Box::from_raw(b) };
        crate::quietly(move || drop(b));
    }
}

/// `size_t advm_remap_break_even_pages(void)`: moves shorter than this are copied.
#[no_mangle]
pub extern "C" fn advm_remap_break_even_pages() -> usize {
    // the first call measures (or reads the cache file): its system calls' errno stays inside
    crate::keep_errno(|| std::panic::catch_unwind(|| remap::break_even().pages).unwrap_or(0))
}

/// `void advm_remap_set_break_even_pages(size_t pages)`: overrides it; 0 restores the
/// measured value.
#[no_mangle]
pub extern "C" fn advm_remap_set_break_even_pages(pages: usize) {
    crate::keep_errno(|| remap::set_break_even_pages((pages > 0).then_some(pages)));
}
