//! `Config::free_lazily`: a heap in plain memory advises every range a collection frees
//! as lazily freeable (`MADV_FREE`). The heap never reads freed space before writing
//! it, so it computes the same as without, whichever of its old bytes or zeros a page
//! reads. Every heap here runs the verifier.

use advm_gc::{Config, Generational, Heap, Mutator, Policy};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// KiB of `LazyFree` in this process's smaps_rollup (freed pages not written since).
fn lazy_free_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let line = text.lines().find(|l| l.starts_with("LazyFree:")).expect("smaps_rollup has LazyFree");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Keeps `keep` rooted objects, replaced at random while `total` are allocated: 256
/// raw bytes each, and every 64th a large one of 20 pages (its own pages in the large
/// space). Each object's first and last words are a function of its number, checked
/// when replaced and at the end. Returns a checksum.
fn bytes_of(id: u64) -> usize {
    if id % 64 == 0 {
        20 * PAGE
    } else {
        256
    }
}

fn churn(m: &mut Mutator, keep: usize, total: u64) -> u64 {
    let mut model = vec![0u64; keep];
    for _ in 0..keep {
        m.push_root(None);
    }
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let check = |m: &Mutator, slot: usize, want: u64| {
        if let Some(o) = m.root(slot) {
            let last = bytes_of(want) / 8 - 1;
            assert_eq!(m.word(o, 0), want, "object {want} in slot {slot}");
            assert_eq!(m.word(o, last), want.wrapping_mul(0x9E37_79B9), "object {want}'s last word");
        }
    };
    for id in 1..=total {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let bytes = bytes_of(id);
        let o = m.alloc(0, bytes).unwrap();
        m.set_word(o, 0, id);
        m.set_word(o, bytes / 8 - 1, id.wrapping_mul(0x9E37_79B9));
        let slot = (rng % keep as u64) as usize;
        check(m, slot, model[slot]);
        m.set_root(slot, Some(o));
        model[slot] = id;
    }
    let mut sum = 0u64;
    for (slot, &want) in model.iter().enumerate() {
        check(m, slot, want);
        sum = sum.wrapping_mul(31).wrapping_add(want);
    }
    sum
}

/// Held by each test while its heaps live: the `LazyFree` figure is the process's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(g: Option<Generational>, in_place: bool, lazily: bool) -> (u64, u64) {
    let mut c = Config::new(24 * MIB);
    c.verify = true;
    c.gc_threads = 2;
    c.large_object_bytes = Some(16 * PAGE);
    c.generational = g;
    c.old_in_place = in_place;
    c.free_lazily = lazily;
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    let sum = churn(&mut m, 1024, 12_000);
    m.collect().unwrap();
    let freed: u64 = h.stats().history.iter().map(|c| c.bytes_freed_pages as u64).sum();
    (sum, freed)
}

#[test]
fn a_heap_that_frees_lazily_computes_what_one_that_does_not_computes() {
    let modified = Policy::Modified { mem_lim: 2 * MIB, min_new_size: 512 << 10, min_old_incr: MIB };
    let original = Policy::Original { ratio: 3.0, mem_limit: 4 * MIB };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut heaps = vec![(None, false)];
    for policy in [original, modified] {
        for (copy_back, in_place) in [(true, false), (false, false), (false, true)] {
            heaps.push((Some(Generational { policy, copy_back }), in_place));
        }
    }
    for (g, in_place) in heaps {
        let what = format!("{g:?} in place {in_place}");
        let (plain, _) = run(g, in_place, false);
        let (lazily, freed) = run(g, in_place, true);
        assert_eq!(plain, lazily, "{what}");
        assert!(freed > 0, "{what}: no collection freed a page");
    }
}

#[test]
fn freed_ranges_are_lazily_free_until_the_heap_writes_them_again() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Config::new(24 * MIB);
    c.verify = true;
    c.generational = Some(Generational {
        policy: Policy::Modified { mem_lim: 2 * MIB, min_new_size: 4 * MIB, min_old_incr: MIB },
        copy_back: false,
    });
    c.free_lazily = true;
    let h = Heap::with_config(c).unwrap();
    let mut m = h.attach();
    let before = lazy_free_kib();
    // Fill most of the nursery with garbage, then a minor collection frees it.
    for _ in 0..12_000 {
        m.alloc(0, 256).unwrap();
    }
    let c = m.collect_minor().unwrap();
    let after = lazy_free_kib();
    assert!(c.bytes_freed_pages >= 2 * MIB, "{c:?}");
    // All of it but the kernel's per-CPU batch (31 pages) still on its way.
    let want = (c.bytes_freed_pages / 1024) as u64 - 31 * PAGE as u64 / 1024;
    assert!(
        after - before >= want,
        "LazyFree rose by {} KiB, {} KiB freed",
        after - before,
        c.bytes_freed_pages / 1024
    );
    // Allocation writes the nursery again: those pages are no longer lazily free.
    for _ in 0..4_000 {
        m.alloc(0, 256).unwrap();
    }
    let reused = lazy_free_kib();
    assert!(reused + 900 <= after, "LazyFree {after} KiB -> {reused} KiB after 1 MiB was allocated again");

    // Without the option nothing is lazily freed.
    let mut c = Config::new(24 * MIB);
    c.generational = h.generational();
    let plain = Heap::with_config(c).unwrap();
    let mut m = plain.attach();
    for _ in 0..12_000 {
        m.alloc(0, 256).unwrap();
    }
    let before = lazy_free_kib();
    m.collect_minor().unwrap();
    assert!(lazy_free_kib() <= before, "a heap without the option freed lazily");
}

#[test]
fn a_paged_heap_refuses_free_lazily() {
    if let Err(why) = advm::pager::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let pager = std::sync::Arc::new(advm::pager::Pager::new(advm::pager::Config::new(8 * MIB)).unwrap());
    let mut c = Config::new(8 * MIB);
    c.paging = Some(advm_gc::Paging::new(pager));
    c.free_lazily = true;
    let e = Heap::with_config(c).unwrap_err().to_string();
    assert!(e.contains("free_lazily"), "{e}");
}
