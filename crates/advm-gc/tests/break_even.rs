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

#[test]
fn an_object_sliding_into_space_an_exchange_left_holding_dead_pages_is_copied_unless_they_were_parked() {
    let be = advm::remap::break_even();
    let populated_never = be.curve.last().is_some_and(|l| be.pages_populated > l.pages);
    if !advm::remap::uffd_move_available() || be.pages_compaction > 511 || !populated_never {
        eprintln!("skipped: needs UFFDIO_MOVE, a compaction break-even up to 511 pages and no populated one: {be:?}");
        return;
    }
    let mut c = advm_gc::Config::new(64 << 20);
    c.verify = true;
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    // [dead 2 MiB][a: 2 MiB][b: 511 pages]: a moves into the dead object's place by
    // an mremap exchange, which leaves the dead pages where a was; b's destination.
    let _dead = m.alloc(0, (2 << 20) - 16).unwrap();
    let a = m.alloc(0, (2 << 20) - 16).unwrap();
    m.push_root(Some(a));
    let b = m.alloc(0, 511 * 4096 - 16).unwrap();
    m.write_bytes(b, 0, &[7; 64]);
    m.push_root(Some(b));
    let c = m.collect().unwrap();
    // Two plans (the measured costs choose): b is copied (its destination holds the
    // dead pages the exchange left), or the dead object's pages are parked first, a
    // moves into emptied space, leaving its source vacated, and b follows as pages.
    if c.bytes_parked == 0 {
        assert_eq!((c.objects_remap, c.bytes_remap), (1, 2 << 20), "only the aligned object moved as pages: {c:?}");
    } else {
        assert_eq!(c.bytes_parked, 2 << 20, "{c:?}");
        assert_eq!((c.objects_remap, c.bytes_remap), (2, (2 << 20) + 511 * 4096), "{c:?}");
    }
    let mut buf = [0; 64];
    m.read_bytes(m.root(1).unwrap(), 0, &mut buf);
    assert_eq!(buf, [7; 64]);
}
