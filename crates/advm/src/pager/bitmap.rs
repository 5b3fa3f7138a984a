//! One bit a page, flipped with atomic operations: the shared "discardable" map the
//! application writes and the pager reads (the paper's bitmap; no system call).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A fixed-size bitmap of atomic bits.
#[derive(Debug)]
pub struct Bitmap {
    words: Box<[AtomicU64]>,
    bits: usize,
    /// Counts the calls that set bits: the pager rescans for discardable pages only
    /// when it moved since its last scan. One counter for all the maps of a pager, so
    /// that it reads one word, not one a region.
    marks: Arc<AtomicU64>,
}

impl Bitmap {
    /// `bits` bits, all clear, in zeroed memory (a large map costs memory only where
    /// bits are set); None when the allocator refuses it.
    pub fn new(bits: usize) -> Option<Self> {
        Self::counting_into(bits, Arc::new(AtomicU64::new(0)))
    }

    /// As [`Bitmap::new`], its marks counted in `marks` (shared with other maps).
    pub(crate) fn counting_into(bits: usize, marks: Arc<AtomicU64>) -> Option<Self> {
        Some(Self { words: crate::sys::zeroed::zeroed(bits.div_ceil(64))?, bits, marks })
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.bits
    }

    /// Never true for a region's map (a region has at least one page).
    pub fn is_empty(&self) -> bool {
        self.bits == 0
    }

    /// Bit `i`.
    pub fn get(&self, i: usize) -> bool {
        self.words[i / 64].load(Ordering::SeqCst) & (1 << (i % 64)) != 0
    }

    /// Sets (`value`) or clears bits `[first, first+n)`; the caller checked the range.
    pub(crate) fn set_range(&self, first: usize, n: usize, value: bool) {
        let mut i = first;
        let end = first + n;
        while i < end {
            let w = i / 64;
            let lo = i % 64;
            let hi = (end - w * 64).min(64);
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            // SeqCst: the pager re-reads a bit after it took the page away; an
            // application that clears it before writing must be ordered with that read.
            if value {
                self.words[w].fetch_or(mask, Ordering::SeqCst);
            } else {
                self.words[w].fetch_and(!mask, Ordering::SeqCst);
            }
            i = w * 64 + hi;
        }
        if value {
            self.marks.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Sets bit `i` (no mark counted: for the pager's own maps).
    pub(crate) fn set(&self, i: usize) {
        self.words[i / 64].fetch_or(1 << (i % 64), Ordering::SeqCst);
    }

    /// Clears bit `i`.
    pub(crate) fn clear(&self, i: usize) {
        self.words[i / 64].fetch_and(!(1 << (i % 64)), Ordering::SeqCst);
    }

    /// Clears bits `[first, first+n)` and says whether any was set.
    pub(crate) fn take_range(&self, first: usize, n: usize) -> bool {
        let mut any = false;
        for i in first..first + n {
            let mask = 1u64 << (i % 64);
            any |= self.words[i / 64].fetch_and(!mask, Ordering::SeqCst) & mask != 0;
        }
        any
    }

    /// How many calls set bits so far (in every map sharing the counter).
    #[cfg(test)]
    pub(crate) fn marks(&self) -> u64 {
        self.marks.load(Ordering::SeqCst)
    }

    /// Word `w` (bits `64*w ..`), for scans.
    pub(crate) fn word(&self, w: usize) -> u64 {
        self.words[w].load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_set_and_clear_across_words() {
        let b = Bitmap::new(200).unwrap();
        b.set_range(60, 70, true);
        assert!(!b.get(59) && b.get(60) && b.get(129) && !b.get(130));
        b.set_range(64, 64, false);
        assert!(b.get(63) && !b.get(64) && !b.get(127) && b.get(128));
        assert!(b.take_range(0, 200));
        assert!(!b.take_range(0, 200));
        assert_eq!(b.marks(), 1);
    }
}
