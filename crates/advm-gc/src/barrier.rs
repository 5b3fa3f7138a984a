//! The write barrier of generational mode: a remembered set of the old-generation slots
//! that hold a nursery object. Every pointer store goes through the heap's own store
//! ([`crate::Mutator::set`], `advm_gc_store` in C), which records the slot when it lies
//! outside the nursery and the stored object inside it; a minor collection treats the
//! recorded slots as roots and then empties the set (the nursery is empty after it).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::heap::lock;
use crate::raw::Span;

/// Slot addresses (old objects' pointer slots) that may point into the nursery.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    slots: Mutex<HashSet<usize>>,
}

impl Remembered {
    /// The barrier: called for every store of `value` into the slot at `slot`.
    #[inline]
    pub(crate) fn on_store(&self, nursery: &Span, slot: usize, value: usize) {
        if nursery.contains(value) && !nursery.contains(slot) {
            lock(&self.slots).insert(slot);
        }
    }

    /// Whether `slot` is recorded (the verifier's check of the barrier).
    pub(crate) fn holds(&self, slot: usize) -> bool {
        lock(&self.slots).contains(&slot)
    }

    /// Takes every recorded slot, leaving the set empty.
    pub(crate) fn take(&self) -> Vec<usize> {
        lock(&self.slots).drain().collect()
    }

    /// Forgets every slot (after a major collection moved the old objects).
    pub(crate) fn clear(&self) {
        lock(&self.slots).clear()
    }
}
