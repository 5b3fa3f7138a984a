//! Weak roots and pinned objects as an embedding runtime uses them: a weak slot follows
//! its object while it lives and is null once it died (full collections with both
//! engines, minor ones, copy-back on and off, several threads); a pinned object, small
//! or large, keeps its address while the objects around it are compacted, and moves
//! again once unpinned. Every heap runs the verifier.

use advm_gc::{Config, Engine, Error, Generational, Heap, Mutator, Policy};

const PAGE: usize = 4096;
const LARGE: usize = 4 * PAGE;

fn config(engine: Engine, generational: Option<bool>) -> Config {
    let mut c = Config::new(16 << 20);
    c.large_object_bytes = Some(LARGE);
    c.engine = engine;
    c.verify = true;
    c.gc_threads = 2;
    c.generational = generational.map(|copy_back| Generational {
        policy: Policy::Modified { mem_lim: 1 << 20, min_new_size: 64 << 10, min_old_incr: 256 << 10 },
        copy_back,
    });
    c
}

/// Every heap kind: both engines, and generational with copy-back on and off.
fn heaps() -> Vec<(String, Config)> {
    let mut out = Vec::new();
    for engine in [Engine::Remap, Engine::Memmove] {
        out.push((format!("{engine:?}"), config(engine, None)));
    }
    for copy_back in [false, true] {
        out.push((format!("generational, copy_back {copy_back}"), config(Engine::Remap, Some(copy_back))));
    }
    out
}

fn filled(m: &mut Mutator, nptrs: usize, n: usize, seed: u8) -> advm_gc::Obj {
    let o = m.alloc(nptrs, n).unwrap();
    let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect();
    m.write_bytes(o, 0, &bytes);
    o
}

fn assert_filled(m: &Mutator, o: advm_gc::Obj, n: usize, seed: u8) {
    let mut got = vec![0u8; n];
    m.read_bytes(o, 0, &mut got);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(7) ^ seed), "contents of seed {seed}");
}

#[test]
fn a_weak_slot_follows_a_live_object_and_is_null_once_it_died() {
    for (name, c) in heaps() {
        let heap = Heap::with_config(c).unwrap();
        let mut m = heap.attach();
        let _garbage = m.alloc(0, 3000).unwrap(); // below the others: they move down
        let (small, large) = (filled(&mut m, 0, 100, 1), filled(&mut m, 0, LARGE, 2));
        let (dead_small, dead_large) = (filled(&mut m, 0, 100, 3), filled(&mut m, 0, LARGE, 4));
        let roots = [m.push_root(Some(small)), m.push_root(Some(large))];
        let weak: Vec<usize> = [small, large, dead_small, dead_large].iter().map(|&o| m.push_weak(Some(o))).collect();
        let before = (small.addr(), large.addr());
        assert_eq!(m.collect().unwrap().weak_cleared, 2, "{name}: the two dead objects' slots");
        assert_eq!(m.weak(weak[0]), m.root(roots[0]), "{name}: small live");
        assert_eq!(m.weak(weak[1]), m.root(roots[1]), "{name}: large live");
        assert_ne!((m.root(roots[0]).unwrap().addr(), m.root(roots[1]).unwrap().addr()), before, "{name}: moved");
        assert_eq!(m.weak(weak[2]), None, "{name}: small dead");
        assert_eq!(m.weak(weak[3]), None, "{name}: large dead");
        assert_filled(&m, m.weak(weak[0]).unwrap(), 100, 1);
        assert_filled(&m, m.weak(weak[1]).unwrap(), LARGE, 2);
        // Dropping the last root: the next collection clears the slot.
        m.set_root(roots[0], None);
        assert_eq!(m.collect().unwrap().weak_cleared, 1);
        assert_eq!(m.weak(weak[0]), None, "{name}: small dead after its root went");
        assert!(m.weak(weak[1]).is_some());
    }
}

/// A minor collection clears a weak slot to a young object it does not keep, updates
/// one to a young object it promotes, and leaves one to an old object alone (even a
/// dead one: only a full collection finds old objects dead).
#[test]
fn a_minor_collection_clears_weak_slots_of_young_objects_it_does_not_keep() {
    for copy_back in [false, true] {
        let heap = Heap::with_config(config(Engine::Remap, Some(copy_back))).unwrap();
        let mut m = heap.attach();
        let old_dead = filled(&mut m, 0, 64, 9);
        let r = m.push_root(Some(old_dead));
        m.collect_minor().unwrap();
        let old_dead = m.root(r).unwrap();
        m.set_root(r, None);
        let young_live = filled(&mut m, 0, 64, 5);
        let young_dead = filled(&mut m, 0, 64, 6);
        m.set_root(r, Some(young_live));
        let w: Vec<usize> = [young_live, young_dead, old_dead].iter().map(|&o| m.push_weak(Some(o))).collect();
        let c = m.collect_minor().unwrap();
        assert_eq!(c.kind, "minor");
        assert_eq!(c.weak_cleared, 1, "the young dead object's slot");
        assert_eq!(m.weak(w[0]), m.root(r));
        assert_ne!(m.weak(w[0]).unwrap().addr(), young_live.addr(), "promoted");
        assert_filled(&m, m.weak(w[0]).unwrap(), 64, 5);
        assert_eq!(m.weak(w[1]), None);
        assert_eq!(m.weak(w[2]).map(|o| o.addr()), Some(old_dead.addr()), "an old object outlives a minor collection");
        m.collect().unwrap();
        assert_eq!(m.weak(w[2]), None, "a full collection finds it dead");
        assert_filled(&m, m.weak(w[0]).unwrap(), 64, 5);
    }
}

#[test]
fn a_weak_slot_holding_no_object_fails_the_collection_before_anything_moves() {
    let heap = Heap::with_config(config(Engine::Remap, None)).unwrap();
    let mut m = heap.attach();
    let o = m.alloc(0, 64).unwrap();
    m.push_weak(Some(o));
    let mut slot: *mut std::ffi::c_void = (o.addr() + 8) as *mut _; // inside the object
                                                                    // SAFETY: `slot` lives until it is removed below, and no other thread writes it.
    #[allow(unsafe_code)]
    unsafe { heap.add_weak_slot(&mut slot) }.unwrap();
    assert!(matches!(m.collect(), Err(Error::BadRoot(e)) if e.contains("weak slot")));
    slot = std::ptr::null_mut();
    m.collect().unwrap();
    assert!(slot.is_null());
    heap.remove_weak_slot(&mut slot).unwrap();
    assert!(heap.remove_weak_slot(&mut slot).is_err(), "removed twice");
}

/// Small and large objects pinned among garbage: the live objects around them slide
/// down to them, they keep their addresses and contents, and once unpinned they move
/// down too.
#[test]
fn pinned_objects_keep_their_addresses_while_the_others_slide_around_them() {
    for (name, c) in heaps() {
        let heap = Heap::with_config(c).unwrap();
        let mut m = heap.attach();
        // [garbage][a][pinned small][garbage][b] and the same with large objects.
        let mut rooted = Vec::new();
        let mut pinned = Vec::new();
        for (k, n) in [(0u8, 200), (1, LARGE + 3 * PAGE)] {
            let _ = m.alloc(0, n).unwrap();
            let o = filled(&mut m, 1, n, 10 + k);
            rooted.push((m.push_root(Some(o)), n, 10 + k));
            let p = filled(&mut m, 1, n, 20 + k);
            let p = m.pin(p).unwrap();
            pinned.push((p.addr(), n, 20 + k));
            let _ = m.alloc(0, n).unwrap();
            let o = filled(&mut m, 1, n, 30 + k);
            rooted.push((m.push_root(Some(o)), n, 30 + k));
        }
        // A pinned object is a root: nothing else holds these. Their slots point at
        // rooted objects, which the collections move.
        for (i, &(a, _, _)) in pinned.iter().enumerate() {
            let p = m.object_at(a).unwrap();
            m.set(p, 0, m.root(rooted[2 * i + 1].0));
        }
        for round in 0..3 {
            if round == 1 {
                m.collect_minor().unwrap();
            } else {
                m.collect().unwrap();
            }
            for (i, &(a, n, seed)) in pinned.iter().enumerate() {
                let p = m.object_at(a).unwrap_or_else(|e| panic!("{name}: pinned {a:#x} lost: {e}"));
                assert_filled(&m, p, n, seed);
                assert_eq!(m.get(p, 0), m.root(rooted[2 * i + 1].0), "{name}: its slot follows its referent");
            }
            for &(r, n, seed) in &rooted {
                assert_filled(&m, m.root(r).unwrap(), n, seed);
            }
        }
        // The object above each pinned one slid down to its end (the garbage between
        // them is gone); the one below it sits below it.
        for (i, &(a, n, _)) in pinned.iter().enumerate() {
            let (below, above) = (m.root(rooted[2 * i].0).unwrap(), m.root(rooted[2 * i + 1].0).unwrap());
            assert!(below.addr() < a && above.addr() > a, "{name}");
            let size = (16 + 8 + n).next_multiple_of(if n >= LARGE { PAGE } else { 16 });
            assert_eq!(above.addr(), a + size, "{name}: object {i} above the pinned one slid down to its end");
        }
        // Unpinned, a pinned object is garbage (nothing else holds it) or moves down.
        let keep = m.push_root(Some(m.object_at(pinned[1].0).unwrap()));
        for &(a, _, _) in &pinned {
            let p = m.object_at(a).unwrap();
            assert_eq!(m.pin_count(p), 1);
            m.unpin(p).unwrap();
            assert!(m.unpin(p).is_err(), "{name}: unpinned twice");
        }
        m.collect().unwrap();
        let moved = m.root(keep).unwrap();
        assert_ne!(moved.addr(), pinned[1].0, "{name}: unpinned, it moves down");
        assert_filled(&m, moved, pinned[1].1, pinned[1].2);
    }
}

/// Pinning a young object promotes it first (a minor collection); from then on it
/// stays through minor and major collections, copy-back on and off.
#[test]
fn a_pinned_young_object_is_promoted_once_and_then_stays() {
    for copy_back in [false, true] {
        let heap = Heap::with_config(config(Engine::Remap, Some(copy_back))).unwrap();
        let mut m = heap.attach();
        let young = filled(&mut m, 0, 300, 42);
        let before = heap.stats().collections;
        let p = m.pin(young).unwrap();
        assert_eq!(heap.stats().collections, before + 1, "one minor collection");
        assert_ne!(p.addr(), young.addr(), "promoted out of the nursery");
        let a = p.addr();
        let r = m.push_root(None);
        for i in 0..4000u64 {
            // garbage, and a list that survives: the old generation grows and is
            // compacted by the major collections the policy brings
            let o = m.alloc(1, 64).unwrap();
            if i % 4 == 0 {
                m.set(o, 0, m.root(r));
                m.set_root(r, Some(o));
            }
        }
        m.collect().unwrap();
        m.collect_minor().unwrap();
        assert!(heap.stats().history.iter().any(|c| c.kind == "major"));
        assert_filled(&m, m.object_at(a).unwrap(), 300, 42);
        let mut n = 0;
        let mut o = m.root(r);
        while let Some(x) = o {
            n += 1;
            o = m.get(x, 0);
        }
        assert_eq!(n, 1000);
    }
}

/// Mutator threads each keep weak slots to their own objects, pin some, and allocate
/// until collections run: every thread finds its live objects through its weak slots,
/// the dead ones' slots null, its pinned objects in place.
#[test]
fn threads_with_weak_slots_and_pins_survive_each_others_collections() {
    for generational in [None, Some(false), Some(true)] {
        let heap = Heap::with_config(config(Engine::Remap, generational)).unwrap();
        let threads: Vec<_> = (0..3u8)
            .map(|t| {
                let heap = heap.clone();
                std::thread::spawn(move || {
                    let mut m = heap.attach();
                    let mut live = Vec::new(); // (root, weak)
                    let mut dead = Vec::new(); // weak
                    let mut pins = Vec::new();
                    for i in 0..300u32 {
                        let o = filled(&mut m, 0, 40 + i as usize % 100, t);
                        let w = m.push_weak(Some(o));
                        if i % 3 == 0 {
                            live.push((m.push_root(Some(o)), w, 40 + i as usize % 100));
                        } else {
                            dead.push(w);
                        }
                        if i % 48 == 0 {
                            let (r, _, n) = *live.last().unwrap();
                            let o = m.root(r).unwrap();
                            pins.push((m.pin(o).unwrap().addr(), n));
                        }
                        // garbage, small and large: brings collections
                        let _ = m.alloc(0, if i % 2 == 0 { 2000 } else { 200_000 }).unwrap();
                    }
                    // A full collection (a thread that asks while another collects gets
                    // that one, which may be a minor one).
                    while m.collect().unwrap().kind == "minor" {}
                    for &(r, w, n) in &live {
                        assert_eq!(m.weak(w), m.root(r));
                        assert_filled(&m, m.weak(w).unwrap(), n, t);
                    }
                    // Other threads' full collections ran since; this one's too.
                    assert!(dead.iter().all(|&w| m.weak(w).is_none()), "thread {t}: a dead object's weak slot");
                    for &(a, n) in &pins {
                        assert_filled(&m, m.object_at(a).unwrap(), n, t);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(heap.stats().collections > 3, "{generational:?}: {} collections", heap.stats().collections);
    }
}

/// `set_weak` points an existing weak slot at another object (or at none): the slot then
/// follows that object while it lives and is null once it died, and never keeps it
/// alive; a slot set to null stays null and its old object lives on as long as a root
/// holds it. Every heap kind.
#[test]
fn set_weak_retargets_a_slot_without_keeping_its_object_alive() {
    for (name, c) in heaps() {
        let heap = Heap::with_config(c).unwrap();
        let mut m = heap.attach();
        let _garbage = m.alloc(0, 3000).unwrap(); // below the others: they move down
        let live = filled(&mut m, 0, 100, 1);
        let large = filled(&mut m, 0, LARGE, 2);
        let dead = filled(&mut m, 0, 100, 3);
        let root = m.push_root(Some(live));
        let large_root = m.push_root(Some(large));
        let (a, b, c) = (m.push_weak(None), m.push_weak(Some(live)), m.push_weak(Some(live)));
        m.set_weak(a, Some(dead)); // was null: now a dead object
        m.set_weak(b, Some(large)); // was a live object: now another one
        m.set_weak(c, None); // was a live object: now null
        assert_eq!(m.weak(a), Some(dead), "{name}: read back before a collection");
        assert_eq!(m.collect().unwrap().weak_cleared, 1, "{name}: only the dead object's slot");
        assert_eq!(m.weak(a), None, "{name}: set to a dead object: cleared");
        assert_eq!(m.weak(b), m.root(large_root), "{name}: set to a live object: follows it");
        assert_filled(&m, m.weak(b).unwrap(), LARGE, 2);
        assert_eq!(m.weak(c), None, "{name}: set to null: stays null");
        assert_filled(&m, m.root(root).unwrap(), 100, 1);
        // The weak slot alone does not keep its object: once the root goes, it dies.
        m.set_root(large_root, None);
        m.set_weak(c, m.root(root));
        assert_eq!(m.collect().unwrap().weak_cleared, 1, "{name}: the large object's slot");
        assert_eq!(m.weak(b), None, "{name}: its object lost its root");
        assert_eq!(m.weak(c), m.root(root), "{name}: set back to the live object");
        assert_filled(&m, m.weak(c).unwrap(), 100, 1);
    }
}

/// `truncate_weak(n)` drops the slots from index `n` on, as `truncate_roots` does for
/// roots: `weak_len` is then `n`, the slots below `n` keep working, the next
/// `push_weak` gets index `n` again, a dropped slot's object is neither kept nor
/// touched (it lives or dies by its roots), and `n` at or past the end changes nothing.
#[test]
fn truncate_weak_drops_the_slots_from_n_on_and_keeps_the_others_working() {
    for (name, c) in heaps() {
        let heap = Heap::with_config(c).unwrap();
        let mut m = heap.attach();
        let objs: Vec<advm_gc::Obj> = (0..4).map(|i| filled(&mut m, 0, 64, i as u8)).collect();
        let roots: Vec<usize> = objs.iter().map(|&o| m.push_root(Some(o))).collect();
        let weak: Vec<usize> = objs.iter().map(|&o| m.push_weak(Some(o))).collect();
        assert_eq!((weak[0], weak[3], m.weak_len()), (0, 3, 4), "{name}");
        m.truncate_weak(9);
        assert_eq!(m.weak_len(), 4, "{name}: past the end: nothing dropped");
        m.truncate_weak(2);
        assert_eq!(m.weak_len(), 2, "{name}");
        // Dropped slots no longer count: only a root keeps object 2, none keeps object 3.
        m.set_root(roots[3], None);
        let c = m.collect().unwrap();
        assert_eq!(c.weak_cleared, 0, "{name}: no slot below 2 held a dead object");
        for i in 0..2 {
            assert_eq!(m.weak(weak[i]), m.root(roots[i]), "{name}: slot {i} follows its object");
            assert_filled(&m, m.weak(weak[i]).unwrap(), 64, i as u8);
        }
        assert_filled(&m, m.root(roots[2]).unwrap(), 64, 2);
        let again = m.push_weak(m.root(roots[2]));
        assert_eq!(again, 2, "{name}: the next slot reuses index 2");
        m.set_root(roots[2], None);
        m.collect().unwrap();
        assert_eq!(m.weak(again), None, "{name}: a new slot at a dropped index works");
        m.truncate_weak(0);
        assert_eq!(m.weak_len(), 0, "{name}");
        m.collect().unwrap();
        assert_filled(&m, m.root(roots[0]).unwrap(), 64, 0);
        // An index past the end is not a slot: reading or writing it panics.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.weak(0)));
        assert!(read.is_err(), "{name}: weak(0) after truncate_weak(0)");
        let write = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.set_weak(0, None)));
        assert!(write.is_err(), "{name}: set_weak(0) after truncate_weak(0)");
        // The heap still works after those panics (no lock left poisoned for good).
        assert_eq!(m.push_weak(m.root(roots[1])), 0, "{name}");
        m.collect().unwrap();
        assert_filled(&m, m.weak(0).unwrap(), 64, 1);
    }
}
