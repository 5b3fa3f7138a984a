//! The heap's only `unsafe`: word and byte access at addresses inside the heap's two
//! regions (mapped read-write for the heap's whole life), and the loads and stores of
//! root slots that C registered. Every heap address is checked against the regions
//! first, so a bad object handle panics instead of touching memory outside the heap.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

/// `[base, end)` of one region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) base: usize,
    pub(crate) end: usize,
}

impl Span {
    /// True when `a` lies inside.
    #[inline]
    pub(crate) fn contains(&self, a: usize) -> bool {
        a >= self.base && a < self.end
    }

    /// True when the object at pointer `p` (null or an object's first slot) lies
    /// inside: judged by its header, since an object with no slots and no bytes is a
    /// bare header whose pointer is the address just past it (the span's end, or the
    /// next span's base).
    #[inline]
    pub(crate) fn contains_object(&self, p: usize) -> bool {
        p != 0 && self.contains(p - crate::heap::HDR)
    }

    /// Two comparisons (`a - base` wraps for an address below the span): every heap
    /// word access checks this, in the collector's innermost loops.
    #[inline]
    fn holds(&self, a: usize, len: usize) -> bool {
        let size = self.end - self.base;
        len <= size && a.wrapping_sub(self.base) <= size - len
    }
}

/// The heap's memory: the small-object and the large-object region, and in
/// generational mode the nursery (empty otherwise). The heap owns the regions and
/// drops its `Mem` users before unmapping them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mem {
    pub(crate) small: Span,
    pub(crate) large: Span,
    pub(crate) nursery: Span,
}

impl Mem {
    /// True when `[a, a+len)` lies inside one region.
    #[inline]
    pub(crate) fn holds(&self, a: usize, len: usize) -> bool {
        self.small.holds(a, len) || self.large.holds(a, len) || self.nursery.holds(a, len)
    }

    #[inline]
    fn word(&self, a: usize) -> &AtomicUsize {
        assert!(a % 8 == 0 && self.holds(a, 8), "heap word {a:#x} is outside the heap");
        // SAFETY: `a` is 8-byte aligned and inside a region mapped read-write for as long
        // as the heap (which owns this `Mem`'s regions) lives; all access to heap words
        // is atomic, so mutator threads and GC threads never race in Rust's sense.
        unsafe { AtomicUsize::from_ptr(a as *mut usize) }
    }

    /// The `n` words from `a`, bounds-checked once for all of them (the collector's
    /// loops over an object's slots or a run of objects).
    #[inline]
    pub(crate) fn words(&self, a: usize, n: usize) -> &[AtomicUsize] {
        assert!(
            a % 8 == 0 && n <= isize::MAX as usize / 8 && self.holds(a, 8 * n),
            "heap words {a:#x}+{n} leave the heap"
        );
        // SAFETY: as in `word`, for each of the `n` words: `[a, a + 8n)` is aligned and
        // inside one region mapped read-write for as long as the heap lives, and
        // every access to them is atomic.
        unsafe { std::slice::from_raw_parts(a as *const AtomicUsize, n) }
    }

    /// The word at `a`.
    #[inline]
    pub(crate) fn load(&self, a: usize) -> usize {
        self.word(a).load(Ordering::Relaxed)
    }

    /// Writes the word at `a`.
    #[inline]
    pub(crate) fn store(&self, a: usize, v: usize) {
        self.word(a).store(v, Ordering::Relaxed)
    }

    /// Asks the CPU to start loading the cache line of `a` (an object header the
    /// marker will read a few objects later). A hint only: nothing is read, so no
    /// bounds check is needed and a stale address costs nothing.
    #[inline]
    pub(crate) fn prefetch(&self, a: usize) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 never faults and has no architectural effect, whatever
        // the address; SSE is part of the x86_64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(a as *const i8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = a;
    }

    /// Sets bits of the word at `a`; returns its old value.
    #[inline]
    pub(crate) fn fetch_or(&self, a: usize, bits: usize) -> usize {
        self.word(a).fetch_or(bits, Ordering::Relaxed)
    }

    /// memmove of `len` bytes inside the heap (both ranges in one region). Only the
    /// collector calls it, while every mutator is stopped.
    pub(crate) fn copy(&self, dst: usize, src: usize, len: usize) {
        assert!(self.holds(dst, len) && self.holds(src, len), "heap copy {src:#x}->{dst:#x}+{len} leaves the heap");
        // SAFETY: both ranges are inside the mapped regions (checked above); the world
        // is stopped, so no other thread reads or writes them; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
    }

    /// Zeroes `len` bytes inside the heap (fresh allocation space).
    pub(crate) fn zero(&self, a: usize, len: usize) {
        assert!(self.holds(a, len), "heap zero {a:#x}+{len} leaves the heap");
        // SAFETY: inside the mapped regions (checked); the range is allocation space
        // that only the allocating thread holds.
        unsafe { std::ptr::write_bytes(a as *mut u8, 0, len) }
    }

    /// Copies object bytes out of the heap.
    pub(crate) fn read(&self, a: usize, out: &mut [u8]) {
        assert!(self.holds(a, out.len()), "heap read {a:#x}+{} leaves the heap", out.len());
        // SAFETY: inside the mapped regions (checked); `out` is a distinct Rust buffer.
        // A write by another mutator thread to the same bytes at the same time is the
        // program's race, as for any shared memory (the heap's words are atomic).
        unsafe { std::ptr::copy_nonoverlapping(a as *const u8, out.as_mut_ptr(), out.len()) }
    }

    /// Copies bytes into the heap.
    pub(crate) fn write(&self, a: usize, data: &[u8]) {
        assert!(self.holds(a, data.len()), "heap write {a:#x}+{} leaves the heap", data.len());
        // SAFETY: as in `read`, with the roles exchanged.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), a as *mut u8, data.len()) }
    }
}

/// A root slot in the embedding program's memory (the C API's `void **`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot(pub(crate) usize);

impl Slot {
    pub(crate) fn load(self) -> usize {
        // SAFETY: `Heap::add_root_slot`'s contract: the slot stays valid, aligned and
        // untouched by other threads during a collection until it is removed.
        unsafe { std::ptr::read_volatile(self.0 as *const usize) }
    }
    pub(crate) fn store(self, v: usize) {
        // SAFETY: as in `load`.
        unsafe { std::ptr::write_volatile(self.0 as *mut usize, v) }
    }
}
