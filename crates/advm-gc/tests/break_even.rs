//! The heap takes its large-object size from the break-even `advm::remap` measured for
//! compaction (a batch of objects sliding down), not from a lone move's: below it,
//! page moves in a collection's batch lose to memmove. Its own process: the break-even
//! is read process wide, and other tests override it.

use advm_gc::Heap;

#[test]
fn default_large_object_size_is_the_compaction_break_even() {
    let be = advm::remap::break_even();
    let h = Heap::new(64 << 20).unwrap();
    assert_eq!(h.large_object_bytes(), be.pages_compaction * advm::mem::page_size(), "{be:?}");
}
