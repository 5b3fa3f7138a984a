//! A heap whose spaces are `advm::pager` regions: what a collection frees is marked
//! discardable (dropped, never written), what the heap writes again is marked needed
//! first, live objects survive eviction and read-back, and a flush after each major
//! collection (PU) drops the freed pages. Every heap here runs the verifier.

use std::sync::Arc;

use advm::pager::{Config as PagerConfig, Pager};
use advm_gc::{Config, Generational, Heap, Mutator, Paging, Policy};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn pager(budget: usize) -> Option<Arc<Pager>> {
    if let Err(why) = advm::pager::available() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Arc::new(Pager::new(PagerConfig::new(budget)).unwrap()))
}

fn paged_heap(pager: &Arc<Pager>, heap: usize, g: Option<Generational>, flush: bool) -> Heap {
    let mut c = Config::new(heap);
    c.verify = true;
    c.gc_threads = 2;
    c.large_object_bytes = Some(16 * PAGE);
    c.generational = g;
    c.paging = Some(Paging { pager: pager.clone(), flush_after_major: flush });
    Heap::with_config(c).unwrap()
}

/// Keeps `keep` rooted objects of 256 raw bytes, replaced at random while `total`
/// objects are allocated; each object's words are a function of its number, checked
/// when replaced and at the end against the model. Returns a checksum.
fn churn(m: &mut Mutator, keep: usize, total: u64) -> u64 {
    let base = m.roots_len();
    let mut model = vec![0u64; keep];
    for _ in 0..keep {
        m.push_root(None);
    }
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let check = |m: &Mutator, slot: usize, want: u64| {
        if let Some(o) = m.root(base + slot) {
            assert_eq!(m.word(o, 0), want, "object {want} in slot {slot}");
            assert_eq!(m.word(o, 31), want.wrapping_mul(0x9E37_79B9), "object {want}'s last word");
        }
    };
    for id in 1..=total {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let o = m.alloc(0, 256).unwrap();
        m.set_word(o, 0, id);
        m.set_word(o, 31, id.wrapping_mul(0x9E37_79B9));
        let slot = (rng % keep as u64) as usize;
        check(m, slot, model[slot]);
        m.set_root(base + slot, Some(o));
        model[slot] = id;
    }
    let mut sum = 0u64;
    for (slot, &want) in model.iter().enumerate() {
        check(m, slot, want);
        sum = sum.wrapping_mul(31).wrapping_add(want);
    }
    m.truncate_roots(base);
    sum
}

fn modified() -> Policy {
    Policy::Modified { mem_lim: 2 * MIB, min_new_size: 512 << 10, min_old_incr: MIB }
}

fn original() -> Policy {
    Policy::Original { ratio: 3.0, mem_limit: 4 * MIB }
}

#[test]
fn collected_garbage_is_dropped_unwritten_by_the_flush_after_a_major_collection() {
    for flush in [true, false] {
        let Some(p) = pager(64 * MIB) else { return };
        let h = paged_heap(&p, 16 * MIB, None, flush);
        let mut m = h.attach();
        // 8 MiB of objects, all garbage once churn returns
        churn(&mut m, 256, (8 * MIB / 288) as u64);
        let c = m.collect().unwrap();
        assert!(c.bytes_freed_pages >= 7 * MIB, "freed {}", c.bytes_freed_pages);
        let s = p.stats();
        if flush {
            // every page the heap touched was garbage: every one dropped by the flush
            assert_eq!(s.preflushed_by_user, s.write_faults.zero_filled + s.zero_ahead_pages, "{s:?}");
            assert_eq!(s.discarded_pages, s.preflushed_by_user, "{s:?}");
            assert_eq!(s.resident_pages, 0, "{s:?}");
        } else {
            assert_eq!(s.preflushed_by_user, 0);
            assert!(s.resident_pages as usize * PAGE >= 7 * MIB, "{s:?}");
        }
        assert_eq!(s.written_pages, 0, "no garbage page written");
    }
}

#[test]
fn garbage_is_dropped_before_live_data_is_written_under_a_budget() {
    let Some(p) = pager(3 * MIB) else { return };
    let h = paged_heap(&p, 16 * MIB, Some(Generational { policy: modified(), copy_back: false }), false);
    let mut m = h.attach();
    // 24 MiB allocated, 288 KiB live: the nursery's garbage goes first, and it is
    // enough to keep within the budget
    churn(&mut m, 1024, (24 * MIB / 288) as u64);
    let s = p.stats();
    assert!(s.discarded_pages as usize * PAGE >= 4 * MIB, "{s:?}");
    assert_eq!(s.written_pages, 0, "{s:?}");
    assert!(s.resident_pages <= p.budget_pages() as u64, "{s:?}");
}

#[test]
fn live_objects_survive_eviction_and_read_back() {
    let Some(p) = pager(512 << 10) else { return };
    let h = paged_heap(&p, 4 * MIB, None, false);
    let mut m = h.attach();
    // 1.1 MiB live under a 512 KiB budget, collections included; churn checks every object
    churn(&mut m, 4096, (8 * MIB / 288) as u64);
    m.collect().unwrap();
    let s = p.stats();
    assert!(h.stats().collections >= 2);
    assert!(s.written_pages > 0 && s.read_pages() > 0, "{s:?}");
}

#[test]
fn pages_the_heap_reuses_are_needed_before_it_writes_them() {
    let Some(p) = pager(2 * MIB) else { return };
    let h = paged_heap(&p, 16 * MIB, None, false);
    let mut m = h.attach();
    churn(&mut m, 16, (8 * MIB / 288) as u64);
    m.collect().unwrap();
    // the freed 8 MiB are discardable; new live objects (2.3 MiB, over the budget)
    // land there, and eviction must write them rather than drop them
    churn(&mut m, 8192, 8192 * 3);
    assert!(p.stats().written_pages > 0);
}

#[test]
fn a_generational_heap_runs_under_a_budget_smaller_than_the_heap() {
    let kernel = |in_place: bool| {
        let mut c = Config::new(16 * MIB);
        c.verify = true;
        c.generational = Some(Generational { policy: modified(), copy_back: false });
        c.old_in_place = in_place;
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        churn(&mut m, 2048, 20_000)
    };
    let kernel = [kernel(false), kernel(true)];
    assert_eq!(kernel[0], kernel[1], "plain memory, drift or in place");
    let kernel = kernel[0];
    for policy in [original(), modified()] {
        for (copy_back, in_place) in [(true, false), (false, false), (false, true)] {
            let Some(p) = pager(2 * MIB) else { return };
            let mut c = Config::new(16 * MIB);
            c.verify = true;
            c.gc_threads = 2;
            c.large_object_bytes = Some(16 * PAGE);
            c.generational = Some(Generational { policy, copy_back });
            c.old_in_place = in_place;
            c.paging = Some(Paging { pager: p.clone(), flush_after_major: true });
            let h = Heap::with_config(c).unwrap();
            let mut m = h.attach();
            let sum = churn(&mut m, 2048, 20_000);
            m.collect().unwrap();
            let s = p.stats();
            let what = format!("{} copy-back {copy_back} in place {in_place}: {s:?}", policy.name());
            assert_eq!(sum, kernel, "{what}");
            assert!(s.resident_pages <= p.budget_pages() as u64, "{what}");
            assert!(s.discarded_pages > 0 && s.preflushed_by_user > 0, "{what}");
            let st = h.stats();
            assert!(st.history.iter().any(|c| c.kind == "major") && st.collections >= 3, "{what}");
        }
    }
}

#[test]
fn large_objects_in_pager_regions_move_by_memmove() {
    let Some(p) = pager(64 * MIB) else { return };
    let h = paged_heap(&p, 16 * MIB, None, false);
    let mut m = h.attach();
    let mut rs = Vec::new();
    for i in 0..8u64 {
        let o = m.alloc(0, 20 * PAGE).unwrap();
        m.set_word(o, 0, i);
        m.set_word(o, 20 * PAGE / 8 - 1, i + 100);
        rs.push(m.push_root(Some(o)));
    }
    // every other one dies: the survivors slide down
    for &r in rs.iter().step_by(2) {
        m.set_root(r, None);
    }
    let c = m.collect().unwrap();
    assert_eq!(c.bytes_remap, 0);
    assert!(c.bytes_memmove >= 20 * PAGE as u64, "{c:?}");
    for (i, &r) in rs.iter().enumerate().skip(1).step_by(2) {
        let o = m.root(r).unwrap();
        assert_eq!((m.word(o, 0), m.word(o, 20 * PAGE / 8 - 1)), (i as u64, i as u64 + 100));
    }
}

/// Copy-back off, the old generation compacted in place (`Config::old_in_place`): a
/// major collection's to-space is its own from-space, resident, so it faults in no
/// page, while the drift's to-space lands on the pages the flush after the last major
/// collection dropped (each one zero-filled again). The data survives either way (verifier, churn's checks).
#[test]
fn an_old_generation_compacted_in_place_faults_no_page_for_its_to_space() {
    let mut faulted = Vec::new();
    for in_place in [false, true] {
        let Some(p) = pager(64 * MIB) else { return };
        let mut c = Config::new(16 * MIB);
        c.verify = true;
        c.gc_threads = 1;
        c.generational = Some(Generational { policy: modified(), copy_back: false });
        c.old_in_place = in_place;
        // every page a major collection frees is dropped after it (as a pre-flush would)
        c.paging = Some(Paging { pager: p.clone(), flush_after_major: true });
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        // 2.1 MiB live (8192 objects of 272 bytes) in the old generation, garbage between
        let base = m.roots_len();
        for _ in 0..8192 {
            let o = m.alloc(0, 256).unwrap();
            m.push_root(Some(o));
            m.alloc(0, 256).unwrap();
        }
        m.collect().unwrap();
        churn(&mut m, 1024, 20_000);
        m.collect_minor().unwrap();
        let before = p.stats();
        let c = m.collect().unwrap();
        let after = p.stats();
        let filled = (after.zero_fills() + after.zero_ahead_pages) - (before.zero_fills() + before.zero_ahead_pages);
        assert_eq!(c.kind, "major");
        assert!(h.stats().history.iter().filter(|c| c.kind == "major").count() >= 2);
        // the rooted objects are intact
        for i in 0..8192 {
            assert!(m.root(base + i).is_some());
        }
        faulted.push(filled);
    }
    // 8192 objects of 16 + 256 bytes
    let live_pages = (8192 * 272 / PAGE) as u64;
    assert!(faulted[0] >= live_pages * 9 / 10, "the drift's to-space is faulted in: {faulted:?}");
    assert!(faulted[1] < 16, "in place: no page faulted for the to-space: {faulted:?}");
}

/// In pager regions (large objects move by memmove there) a pinned small and a pinned
/// large object keep their addresses and bytes while the objects around them slide,
/// and a weak slot to a dead object is cleared.
#[test]
fn pinned_objects_and_weak_slots_in_pager_regions() {
    let Some(p) = pager(64 * MIB) else { return };
    for g in [None, Some(Generational { policy: Policy::Original { ratio: 3.0, mem_limit: 4 * MIB }, copy_back: true })]
    {
        let heap = paged_heap(&p, 16 * MIB, g, true);
        let mut m = heap.attach();
        let mut pinned = Vec::new();
        let mut above = Vec::new();
        for n in [300, 20 * PAGE] {
            let _garbage = m.alloc(0, n).unwrap();
            let o = m.alloc(0, n).unwrap();
            m.write_bytes(o, 0, &vec![0x5a; n]);
            let o = m.pin(o).unwrap();
            pinned.push((o.addr(), n));
            let _garbage = m.alloc(0, n).unwrap();
            let a = m.alloc(0, n).unwrap();
            m.write_bytes(a, 0, &vec![0x6b; n]);
            above.push((m.push_root(Some(a)), n));
        }
        let dead = m.alloc(0, 64).unwrap();
        let w = m.push_weak(Some(dead));
        for _ in 0..3 {
            m.collect().unwrap();
            for &(a, n) in &pinned {
                let mut got = vec![0u8; n];
                m.read_bytes(m.object_at(a).unwrap(), 0, &mut got);
                assert!(got.iter().all(|&b| b == 0x5a), "pinned object at {a:#x}");
            }
            for &(r, n) in &above {
                let mut got = vec![0u8; n];
                m.read_bytes(m.root(r).unwrap(), 0, &mut got);
                assert!(got.iter().all(|&b| b == 0x6b));
            }
            assert_eq!(m.weak(w), None);
        }
        let (a, n) = pinned[1];
        assert_eq!(m.root(above[1].0).unwrap().addr(), a + (16 + n).next_multiple_of(PAGE), "slid to its end");
    }
}
