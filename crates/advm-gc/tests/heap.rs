//! The heap's behaviour: objects survive collections intact, large objects move by
//! pages and small ones by memmove, bad use gets typed errors. Every heap here runs the
//! verifier after each collection.

use advm_gc::{Config, Engine, Error, Heap, Mutator, Obj};

const PAGE: usize = 4096;

fn heap(bytes: usize, large: usize, engine: Engine) -> Heap {
    let mut c = Config::new(bytes);
    c.large_object_bytes = Some(large);
    c.engine = engine;
    c.verify = true;
    c.gc_threads = 2;
    Heap::with_config(c).unwrap()
}

/// A byte pattern that names the object (`seed`) and the offset.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8).collect()
}

/// A list of `n` objects with `bytes` raw bytes each, rooted at a new root slot,
/// with garbage of the same size between them; returns the root index.
fn list_with_garbage(m: &mut Mutator, n: usize, bytes: usize) -> usize {
    let r = m.push_root(None);
    for i in 0..n {
        let _garbage = m.alloc(0, bytes).unwrap();
        let o = m.alloc(1, bytes).unwrap();
        m.write_bytes(o, 0, &pattern(i as u64, bytes));
        let head = m.root(r);
        m.set(o, 0, head);
        m.set_root(r, Some(o));
    }
    r
}

fn check_list(m: &Mutator, r: usize, n: usize, bytes: usize) -> Vec<Obj> {
    let mut out = Vec::new();
    let mut cur = m.root(r);
    let mut buf = vec![0; bytes];
    for i in (0..n).rev() {
        let o = cur.expect("list too short");
        m.read_bytes(o, 0, &mut buf);
        assert_eq!(buf, pattern(i as u64, bytes), "object {i} changed");
        out.push(o);
        cur = m.get(o, 0);
    }
    assert!(cur.is_none());
    out
}

#[test]
fn live_objects_keep_their_contents_and_links_across_collections() {
    let h = heap(16 << 20, 8 * PAGE, Engine::Remap);
    let mut m = h.attach();
    let r = list_with_garbage(&mut m, 300, 200);
    let before = check_list(&m, r, 300, 200);
    let c = m.collect().unwrap();
    let after = check_list(&m, r, 300, 200);
    assert_ne!(before, after, "half the heap was garbage: survivors slide down");
    assert!(c.objects_memmove > 0 && c.heap_after < c.heap_before);
    assert_eq!(c.live_objects, 300);
    m.collect().unwrap();
    check_list(&m, r, 300, 200);
}

#[test]
fn large_objects_are_page_aligned_and_moved_by_remap_small_ones_by_memmove() {
    // The break-even decides which objects move as pages: set it (process wide) so
    // that these 41-page objects do, into space holding dead pages too.
    advm::remap::set_break_even_pages(Some(4));
    let h = heap(64 << 20, 4 * PAGE, Engine::Remap);
    let mut m = h.attach();
    let large = list_with_garbage(&mut m, 20, 40 * PAGE);
    let small = list_with_garbage(&mut m, 100, 64);
    for o in check_list(&m, large, 20, 40 * PAGE) {
        assert_eq!((o.addr() - 16) % PAGE, 0, "large objects start on a page");
    }
    let c = m.collect().unwrap();
    check_list(&m, large, 20, 40 * PAGE);
    check_list(&m, small, 100, 64);
    if advm::remap::uffd_move_available() {
        assert!(c.bytes_remap >= 19 * 40 * PAGE as u64, "large survivors moved as pages: {c:?}");
        assert!(c.objects_remap >= 19);
    }
    assert!(c.objects_memmove > 0, "small survivors memmoved: {c:?}");
    let s = h.stats();
    assert_eq!(s.collections, 1);
    assert!(s.bytes_allocated >= 40 * 41 * PAGE as u64);
    assert_eq!(s.bytes_moved_remap, c.bytes_remap);
}

#[test]
fn memmove_engine_moves_no_pages() {
    let h = heap(64 << 20, 4 * PAGE, Engine::Remap);
    h.set_engine("memmove".parse().unwrap());
    let mut m = h.attach();
    let large = list_with_garbage(&mut m, 10, 40 * PAGE);
    let c = m.collect().unwrap();
    check_list(&m, large, 10, 40 * PAGE);
    assert_eq!(c.bytes_remap, 0);
    assert!(c.bytes_memmove >= 9 * 40 * PAGE as u64);
    assert_eq!(c.engine, Engine::Memmove);
}

#[test]
fn unknown_engine_name_is_an_error() {
    let e = "swap".parse::<Engine>().unwrap_err();
    assert!(matches!(e, Error::UnknownEngine(_)));
    assert_eq!(e.to_string(), "unknown engine \"swap\": expected \"remap\" or \"memmove\"");
}

#[test]
fn exhausted_heap_is_a_typed_error_and_the_heap_stays_usable() {
    let h = heap(1 << 20, 16 * PAGE, Engine::Remap);
    let mut m = h.attach();
    let r = list_with_garbage(&mut m, 50, 1000);
    let err = loop {
        match m.alloc(1, 5000) {
            Ok(o) => {
                // Objects move at each allocation's collection: the list's head is
                // read from its root every time.
                let head = m.root(r);
                m.set(o, 0, head);
                m.set_root(r, Some(o));
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::HeapExhausted { heap, .. } if heap == 1 << 20), "{err}");
    let big = m.alloc(0, 2 << 20).unwrap_err();
    assert!(matches!(big, Error::ObjectTooLarge { .. }), "{big}");
    // Dropping the live data makes room again.
    m.set_root(r, None);
    m.alloc(0, 500_000).unwrap();
    assert!(h.stats().collections >= 2);
}

#[test]
fn bad_heap_sizes_and_object_sizes_are_errors() {
    assert!(matches!(Heap::new(0), Err(Error::InvalidArgument { what: "heap_bytes", .. })));
    assert!(matches!(Heap::new(usize::MAX), Err(Error::InvalidArgument { what: "heap_bytes", .. })));
    // Larger than RAM and swap together: made, as a JVM's -Xmx may be (pages are charged
    // as they are written), except under strict overcommit. It was refused (ENOMEM)
    // from a third of RAM, the kernel taking one mapping of it for an obvious overcommit.
    let kib = |key: &str| -> usize {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap();
        text.lines().find(|l| l.starts_with(key)).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let past_memory = ((kib("MemTotal:") + kib("SwapTotal:")) * 1024 * 3 / 2).next_multiple_of(1 << 30);
    let strict = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap().trim() == "2";
    match Heap::new(past_memory) {
        Ok(h) => h.attach().alloc(2, 4096).map(|_| ()).unwrap(),
        Err(Error::Memory(e)) if strict => eprintln!("strict overcommit refused it: {e}"),
        Err(e) => panic!("a {past_memory}-byte heap: {e}"),
    }
    let h = Heap::new(1 << 20).unwrap();
    let mut m = h.attach();
    // Larger than the heap, or overflowing: refused at once, without a collection.
    for (nptrs, nbytes) in
        [(usize::MAX / 8, 0), (usize::MAX / 8 + 1, 0), (usize::MAX, 0), (0, usize::MAX), (1 << 24, 0)]
    {
        let err = m.alloc(nptrs, nbytes).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("object too large: {nptrs} pointers and {nbytes} bytes do not fit in a 1048576-byte heap")
        );
    }
    // The whole heap is too small for an object of the whole heap plus its header.
    assert!(matches!(m.alloc(0, 1 << 20), Err(Error::ObjectTooLarge { .. })));
    assert_eq!(h.stats().collections, 0);
    m.alloc(0, 1000).unwrap();
    // More pointer slots than a header holds, in a heap they would fit in.
    let big = Heap::new(128 << 20).unwrap();
    let mut m = big.attach();
    let err = m.alloc(advm_gc::MAX_NPTRS + 1, 0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { what: "object size", .. }), "{err}");
}

#[test]
fn collections_from_several_mutator_threads_keep_every_threads_objects() {
    let h = heap(8 << 20, 8 * PAGE, Engine::Remap);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                let mut m = h.attach();
                for round in 0..6 {
                    let bytes = if round % 2 == 0 { 48 } else { 9 * PAGE };
                    let n = if round % 2 == 0 { 2000 } else { 20 };
                    let r = list_with_garbage(&mut m, n, bytes);
                    if t == 0 && round == 3 {
                        m.collect().unwrap();
                    }
                    check_list(&m, r, n, bytes);
                    m.truncate_roots(0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = h.stats();
    assert!(s.collections >= 2, "the threads filled the heap several times: {}", s.collections);
}

#[test]
fn objects_on_both_sides_of_every_unit_boundary_keep_their_place_through_repeated_collections() {
    // Units are cut at object starts: after a first compaction, at whatever objects
    // lie every 64 KiB, so the next collections' unit boundaries fall inside the
    // mark bitmap's words. A unit that counted (or missed) a neighbour's live objects
    // there would slide its objects to the wrong place. One and two GC threads.
    for parallel in [false, true] {
        let mut c = Config::new(32 << 20);
        c.large_object_bytes = Some(64 * PAGE);
        c.verify = true;
        c.gc_threads = 2;
        if parallel {
            c.parallel_from_bytes = 0;
        }
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        let r = m.push_root(None);
        let size = |i: u64| 8 + (i * 37 % 23) as usize * 16 + if i % 97 == 0 { 9000 } else { 0 };
        let mut kept: Vec<u64> = Vec::new();
        for round in 0..4u64 {
            for j in 0..20_000u64 {
                let i = round * 20_000 + j;
                let o = m.alloc(1, size(i)).unwrap();
                // live runs and dead runs of varying lengths
                if (i * 7919) % 11 < 4 + round {
                    m.write_bytes(o, 0, &pattern(i, size(i)));
                    m.set(o, 0, m.root(r));
                    m.set_root(r, Some(o));
                    kept.push(i);
                }
            }
            m.collect().unwrap();
            let mut cur = m.root(r);
            for &i in kept.iter().rev() {
                let o = cur.expect("list too short");
                let mut buf = vec![0; size(i)];
                m.read_bytes(o, 0, &mut buf);
                assert_eq!(buf, pattern(i, size(i)), "object {i}, round {round}, parallel {parallel}");
                cur = m.get(o, 0);
            }
            assert!(cur.is_none());
        }
    }
}

#[test]
fn freed_pages_go_to_the_hook() {
    let freed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let f = freed.clone();
    let mut c = Config::new(32 << 20);
    c.large_object_bytes = Some(4 * PAGE);
    c.verify = true;
    c.free_hook = Some(Box::new(move |r| f.lock().unwrap().push(r)));
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    let r = list_with_garbage(&mut m, 10, 10 * PAGE);
    let small = list_with_garbage(&mut m, 1000, 100);
    let col = m.collect().unwrap();
    check_list(&m, r, 10, 10 * PAGE);
    check_list(&m, small, 1000, 100);
    let got = freed.lock().unwrap().clone();
    let total: usize = got.iter().map(|r| r.len()).sum();
    assert_eq!(total, col.bytes_freed_pages);
    assert!(total >= 10 * 11 * PAGE, "the dead large objects' pages at least: {got:?}");
}

#[test]
fn objects_of_2_mib_or_more_sit_on_2_mib_boundaries_and_move_as_page_tables() {
    let h = heap(64 << 20, 16 * PAGE, Engine::Remap);
    let mut m = h.attach();
    let large = list_with_garbage(&mut m, 4, 3 << 20);
    for o in check_list(&m, large, 4, 3 << 20) {
        assert_eq!((o.addr() - 16) % (2 << 20), 0);
    }
    let c = m.collect().unwrap();
    check_list(&m, large, 4, 3 << 20);
    assert_eq!(c.bytes_remap, 4 * (4 << 20), "every survivor moved by pages: {c:?}");
    assert_eq!(c.objects_remap, 4);
}

#[test]
fn parallel_compaction_of_many_units_keeps_every_object() {
    // 24 MiB of small objects, most of them garbage in long runs: about a hundred
    // units slide by different distances on four GC threads.
    let mut c = Config::new(64 << 20);
    c.verify = true;
    c.gc_threads = 4;
    c.parallel_from_bytes = 0;
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    let r = m.push_root(None);
    let mut n = 0u64;
    for i in 0..60_000u64 {
        let o = m.alloc(1, 384).unwrap();
        if i % 7 == 0 || (i / 3000) % 2 == 0 {
            m.write_bytes(o, 0, &pattern(i, 384));
            m.set_word(o, 0, i);
            let head = m.root(r);
            m.set(o, 0, head);
            m.set_root(r, Some(o));
            n += 1;
        }
    }
    let c = m.collect().unwrap();
    assert!(c.objects_memmove > 1000, "{c:?}");
    let mut cur = m.root(r);
    let mut buf = vec![0; 384];
    let mut seen = 0;
    while let Some(o) = cur {
        let i = m.word(o, 0);
        m.read_bytes(o, 8, &mut buf[8..]);
        assert_eq!(buf[8..], pattern(i, 384)[8..], "object {i}");
        seen += 1;
        cur = m.get(o, 0);
    }
    assert_eq!(seen, n);
}

#[test]
fn objects_below_the_first_gap_keep_their_place_and_pointers_into_and_out_of_them_are_rewritten() {
    for threads in [1, 2] {
        let mut c = Config::new(16 << 20);
        c.large_object_bytes = Some(8 * PAGE);
        c.verify = true;
        c.gc_threads = threads;
        c.parallel_from_bytes = 0; // units in parallel with two threads
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        // A long-lived list, compacted by a first collection (allocation buffers end
        // in fillers): then no garbage lies below or inside it, the dense prefix.
        let old = m.push_root(None);
        for i in 0..3000 {
            let o = m.alloc(2, 40).unwrap();
            m.write_bytes(o, 0, &pattern(i, 40));
            let head = m.root(old);
            m.set(o, 0, head);
            m.set_root(old, Some(o));
        }
        m.collect().unwrap();
        let prefix: Vec<usize> = check_list(&m, old, 3000, 40).iter().map(|o| o.addr()).collect();
        // Then a list with garbage between its cells (it moves), whose cells point
        // into the prefix, and prefix cells that point at them (rewritten in place).
        let young = list_with_garbage(&mut m, 2000, 40);
        let cells = check_list(&m, young, 2000, 40);
        let olds = check_list(&m, old, 3000, 40);
        for (i, &y) in cells.iter().enumerate() {
            m.set(olds[i], 1, Some(y));
        }
        let c = m.collect().unwrap();
        assert!(c.bytes_in_place >= 3000 * 64, "in place {} B", c.bytes_in_place);
        let after: Vec<usize> = check_list(&m, old, 3000, 40).iter().map(|o| o.addr()).collect();
        assert_eq!(after, prefix, "prefix objects moved ({threads} threads)");
        let cells = check_list(&m, young, 2000, 40);
        let olds = check_list(&m, old, 3000, 40);
        for (i, &y) in cells.iter().enumerate() {
            assert_eq!(m.get(olds[i], 1), Some(y), "prefix slot {i} not rewritten ({threads} threads)");
        }
        // A second collection finds the whole live data in place.
        let c2 = m.collect().unwrap();
        assert_eq!(c2.bytes_in_place as usize, c2.heap_after, "{threads} threads");
        assert_eq!(c2.bytes_memmove, 0);
        check_list(&m, young, 2000, 40);
    }
}

/// Only the most recent collections are kept one by one; the totals count all of
/// them, and `totals` copies none. Every record was kept before (100,000 collections
/// held 26 MiB) and every statistics read copied them all.
#[test]
fn statistics_keep_the_last_collections_and_count_them_all() {
    let mut c = Config::new(1 << 20);
    c.history_limit = 3;
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    let mut moved = 0;
    for _ in 0..10 {
        m.alloc(0, 100).unwrap();
        moved += m.collect().unwrap().bytes_memmove;
    }
    let s = h.stats();
    assert_eq!(s.collections, 10);
    assert_eq!(s.bytes_moved_memmove, moved);
    assert_eq!(s.history.iter().map(|c| c.index).collect::<Vec<_>>(), [8, 9, 10]);
    let t = h.totals();
    assert!(t.history.is_empty() && t.collections == 10 && t.last_pause_ns == s.history[2].pause_ns);
    assert_eq!(Config::new(1 << 20).history_limit, 1024);
}

/// An object at or above the large-object size that fits the rest of the mutator's
/// allocation buffer (a threshold below the buffer size: the measured break-even is a
/// few pages on a loaded machine, the buffer 32 KiB) is still a large object: page
/// aligned in the large space. It was bump-allocated in the buffer among the small
/// objects (memmoved by every compaction, and the verifier failed the collection on
/// one with pointer slots: a small object above the size).
#[test]
fn a_large_object_that_fits_the_allocation_buffer_is_still_large() {
    let h = heap(16 << 20, 4 * PAGE, Engine::Remap);
    let mut m = h.attach();
    let small = m.alloc(0, 100).unwrap();
    let r = m.push_root(Some(small));
    let big = m.alloc(1, 5 * PAGE).unwrap();
    assert_eq!(big.addr() % PAGE, 16, "a large object's header starts a page");
    let r2 = m.push_root(Some(big));
    m.set(big, 0, m.root(r));
    m.collect().unwrap();
    let big = m.root(r2).unwrap();
    assert!(m.nbytes(big) >= 5 * PAGE);
    assert_eq!(m.get(big, 0), m.root(r));
}
