//! C API of `advm::remap`: `advm_move`, `advm_swap` and batches (see `include/advm.h`).
//!
//! The caller's raw addresses become one `Grant` spanning all ranges of a call; the
//! header states the promise that makes that sound (the caller owns the ranges).

use advm::remap::{self, Batch};
use advm::sys::grant::Grant;

use crate::guard;

/// Totals of a move, swap or batch, filled by the `_stats` functions.
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
}

impl From<remap::Outcome> for advm_remap_stats {
    fn from(o: remap::Outcome) -> Self {
        Self {
            uffd_move_bytes: o.uffd_move_bytes,
            mremap_bytes: o.mremap_bytes,
            memmove_bytes: o.memmove_bytes,
            fallback_bytes: o.fallback_bytes,
            syscalls: o.syscalls,
        }
    }
}

/// An opaque batch of moves and swaps.
#[allow(non_camel_case_types)] // the C name
pub struct advm_batch {
    batch: Batch,
    lo: usize,
    hi: usize,
}

/// A grant over `[lo, hi)`, or EINVAL-like error when the span wraps.
fn span_grant(lo: usize, hi: usize) -> Result<Grant<'static>, advm::Error> {
    // SAFETY: the header's contract: the caller owns every range it passes (no other
    // thread uses them during the call, they are not referenced by code that assumes
    // their contents stay put). advm touches only the ranges named in the call, checks
    // they are mapped read-write first, and refuses bad ones before changing anything.
    Ok(unsafe { Grant::new(lo, hi.saturating_sub(lo)) }?)
}

fn span(ranges: &[(usize, usize)]) -> (usize, usize) {
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.0.saturating_add(r.1)).max().unwrap_or(0);
    (lo, hi)
}

fn write_stats(out: *mut advm_remap_stats, o: remap::Outcome) {
    if !out.is_null() {
        // SAFETY: a non-null `out` points to a caller-owned advm_remap_stats (header).
        unsafe { out.write(o.into()) };
    }
}

fn run_one(swap: bool, x: usize, y: usize, len: usize, out: *mut advm_remap_stats) -> i32 {
    guard(|| {
        let (lo, hi) = span(&[(x, len), (y, len)]);
        // A wrapping range is reported by the planner, with its message; the grant
        // then only needs to cover what does not wrap.
        let mut g = span_grant(lo, hi)?;
        let o = if swap { remap::swap_pages(&mut g, x, y, len)? } else { remap::move_pages(&mut g, x, y, len)? };
        write_stats(out, o);
        Ok(0)
    })
}

/// `int advm_move(void *dst, const void *src, size_t len)`.
#[no_mangle]
pub extern "C" fn advm_move(dst: *mut u8, src: *const u8, len: usize) -> i32 {
    run_one(false, dst as usize, src as usize, len, std::ptr::null_mut())
}

/// `int advm_move_stats(void *dst, const void *src, size_t len, advm_remap_stats *out)`.
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

/// `advm_batch *advm_batch_new(void)`: NULL only when out of memory.
#[no_mangle]
pub extern "C" fn advm_batch_new() -> *mut advm_batch {
    std::panic::catch_unwind(|| Box::into_raw(Box::new(advm_batch { batch: Batch::new(), lo: usize::MAX, hi: 0 })))
        .unwrap_or(std::ptr::null_mut())
}

fn with_batch(b: *mut advm_batch, f: impl FnOnce(&mut advm_batch) -> Result<i32, advm::Error>) -> i32 {
    if b.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: a non-null batch comes from advm_batch_new and is not freed or used by
    // another thread concurrently (header).
    let b = unsafe { &mut *b };
    guard(|| f(b))
}

fn push(b: *mut advm_batch, swap: bool, x: usize, y: usize, len: usize) -> i32 {
    with_batch(b, |b| {
        let (lo, hi) = span(&[(x, len), (y, len)]);
        b.lo = b.lo.min(lo);
        b.hi = b.hi.max(hi);
        if swap {
            b.batch.push_swap(x, y, len);
        } else {
            b.batch.push_move(x, y, len);
        }
        Ok(0)
    })
}

/// `int advm_batch_move(advm_batch *b, void *dst, const void *src, size_t len)`.
///
/// # Safety
/// `b` is NULL or a live batch from `advm_batch_new`, not used by another thread.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_move(b: *mut advm_batch, dst: *mut u8, src: *const u8, len: usize) -> i32 {
    push(b, false, dst as usize, src as usize, len)
}

/// `int advm_batch_swap(advm_batch *b, void *x, void *y, size_t len)`.
///
/// # Safety
/// As [`advm_batch_move`].
#[no_mangle]
pub unsafe extern "C" fn advm_batch_swap(b: *mut advm_batch, x: *mut u8, y: *mut u8, len: usize) -> i32 {
    push(b, true, x as usize, y as usize, len)
}

/// `int advm_batch_run(advm_batch *b, advm_remap_stats *out)`: runs and empties the
/// batch (also when it fails: nothing ran then).
///
/// # Safety
/// As [`advm_batch_move`]; `out` is NULL or writable for one `advm_remap_stats`.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_run(b: *mut advm_batch, out: *mut advm_remap_stats) -> i32 {
    with_batch(b, |b| {
        let r = if b.batch.is_empty() {
            Ok(remap::Outcome::default())
        } else {
            span_grant(b.lo, b.hi).and_then(|mut g| b.batch.execute(&mut g))
        };
        b.batch.clear();
        b.lo = usize::MAX;
        b.hi = 0;
        write_stats(out, r?);
        Ok(0)
    })
}

/// `void advm_batch_free(advm_batch *b)`.
///
/// # Safety
/// `b` is NULL or a live batch from `advm_batch_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn advm_batch_free(b: *mut advm_batch) {
    if !b.is_null() {
        // SAFETY: from advm_batch_new, freed once (header).
        drop(unsafe { Box::from_raw(b) });
    }
}

/// `size_t advm_remap_break_even_pages(void)`: moves shorter than this are copied.
#[no_mangle]
pub extern "C" fn advm_remap_break_even_pages() -> usize {
    std::panic::catch_unwind(|| remap::break_even().pages).unwrap_or(0)
}

/// `void advm_remap_set_break_even_pages(size_t pages)`: overrides it; 0 restores the
/// measured value.
#[no_mangle]
pub extern "C" fn advm_remap_set_break_even_pages(pages: usize) {
    remap::set_break_even_pages((pages > 0).then_some(pages));
}
