//! The write barrier of generational mode: a remembered set of the old-generation slots
//! that hold a nursery object. Every pointer store goes through the heap's own store
//! ([`crate::Mutator::set`], `advm_gc_store` in C), which records the slot when it lies
//! outside the nursery and the stored object inside it; a minor collection treats the
//! recorded slots as roots and then empties the set (the nursery is empty after it).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::heap::lock;
use crate::raw::Span;

/// Locks the remembered set is split over: mutators storing into different objects
/// rarely wait for each other.
const SHARDS: usize = 16;

/// Slot addresses (old objects' pointer slots) that may point into the nursery, in
/// [`SHARDS`] sets chosen by address (a 512-byte stretch of slots per shard in turn).
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    shards: [Mutex<HashSet<usize>>; SHARDS],
}

impl Remembered {
    fn shard(&self, slot: usize) -> &Mutex<HashSet<usize>> {
        &self.shards[(slot >> 9) % SHARDS]
    }

    /// The barrier: called for every store of `value` into the slot at `slot`.
    #[inline]
    pub(crate) fn on_store(&self, nursery: &Span, slot: usize, value: usize) {
        if nursery.contains_object(value) && !nursery.contains(slot) {
            lock(self.shard(slot)).insert(slot);
        }
    }

    /// Whether `slot` is recorded (the verifier's check of the barrier).
    pub(crate) fn holds(&self, slot: usize) -> bool {
        lock(self.shard(slot)).contains(&slot)
    }

    /// Takes every recorded slot, leaving the set empty.
    pub(crate) fn take(&self) -> Vec<usize> {
        self.shards.iter().flat_map(|s| lock(s).drain().collect::<Vec<_>>()).collect()
    }

    /// Forgets every slot (after a major collection moved the old objects).
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            lock(s).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_in_every_shard_are_remembered_taken_and_cleared() {
        let r = Remembered::default();
        let nursery = Span { base: 1 << 40, end: (1 << 40) + (1 << 20) };
        let slots: Vec<usize> = (0..SHARDS * 4).map(|i| 0x10_0000 + i * 256).collect();
        for &s in &slots {
            r.on_store(&nursery, s, nursery.base + 16);
            r.on_store(&nursery, s + 8, 0x1000); // not a nursery object: not recorded
        }
        assert!(slots.iter().all(|&s| r.holds(s) && !r.holds(s + 8)));
        assert!(r.shards.iter().all(|s| !lock(s).is_empty()), "spread over every shard");
        let mut taken = r.take();
        taken.sort_unstable();
        assert_eq!(taken, slots);
        assert!(r.take().is_empty());
        r.on_store(&nursery, slots[0], nursery.base + 16);
        r.clear();
        assert!(!r.holds(slots[0]));
    }
}
