//! The pager: data kept, discardable pages dropped, budget held, races, bad use.

use std::sync::Arc;

use advm::pager::{self, Config, FaultMode, NeededPaging, Pager};

fn ps() -> usize {
    advm::mem::page_size()
}

/// Runs a test body bounded in time: a thread left waiting for ever (a fault the pager
/// never serves) fails the test after this long, with the state of the pagers it made,
/// instead of hanging the test run.
fn bounded(body: impl FnOnce() + Send + 'static) {
    let name = std::thread::current().name().unwrap_or("pager test").to_string();
    pager::run_bounded(&name, std::time::Duration::from_secs(180), body)
}

/// A pager serving faults in `mode`, or None (with the reason printed) where
/// userfaultfd/UFFDIO_MOVE, or the SIGBUS mode asked for, is missing.
fn pager(mode: FaultMode, budget_pages: usize) -> Option<Pager> {
    pager_with(mode, Config::new(budget_pages * ps()))
}

fn pager_with(mode: FaultMode, mut cfg: Config) -> Option<Pager> {
    if let Err(why) = pager::available() {
        eprintln!("skipped: {why}");
        return None;
    }
    if mode == FaultMode::Sigbus && !pager::sigbus_available() {
        eprintln!("skipped: no userfaultfd SIGBUS mode here");
        return None;
    }
    cfg.fault_mode = mode;
    let p = Pager::new(cfg).expect("pager");
    assert_eq!(p.fault_mode(), mode);
    Some(p)
}

/// Each named test body, run once with faults served on the pager's handler thread
/// and once on the faulting threads (SIGBUS mode).
macro_rules! in_both_fault_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn handler_thread() {
                super::bounded(|| super::$name(advm::pager::FaultMode::Thread))
            }
            #[test]
            fn sigbus() {
                super::bounded(|| super::$name(advm::pager::FaultMode::Sigbus))
            }
        }
    )*};
}

in_both_fault_modes!(
    needed_data_is_never_lost_over_twice_the_budget,
    discardable_pages_read_back_as_zeros_and_are_never_written,
    the_budget_is_held,
    budget_eviction_drops_discardable_pages_before_writing_needed_ones,
    discardable_pages_filled_after_a_scan_found_none_are_dropped_before_needed_ones_are_written,
    threads_mapping_touching_and_unmapping_small_regions_under_eviction_lose_nothing,
    concurrent_faulting_threads_see_their_data,
    threads_faulting_the_same_pages_at_once_each_see_them_once,
    a_write_racing_eviction_is_never_lost,
    a_page_marked_needed_while_it_is_dropped_keeps_its_later_writes,
    purgeable_lock_reports_discarded_pages,
    a_full_swap_file_is_a_clear_error_and_loses_nothing,
    a_region_unmapped_while_pages_are_evicted,
    discarded_pages_marked_needed_are_zero_filled_ahead_of_their_faults,
    empty_pages_after_a_first_touch_are_zero_filled_ahead_within_the_budget,
    a_written_out_page_marked_discardable_is_never_read_back,
    flush_discardable_drops_only_the_discardable_pages,
    a_failed_swap_read_is_retried_and_the_fault_served_once_the_file_reads,
    dropping_the_pager_while_a_thread_faults_on_its_region_never_hangs_that_thread,
    a_purgeable_cache_shared_by_threads_never_hands_out_wrong_bytes,
);

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn needed_data_is_never_lost_over_twice_the_budget(mode: FaultMode) {
    let Some(p) = pager(mode, 64) else { return };
    let r = p.map(128 * ps()).unwrap();
    let mut copy = vec![0u8; r.len()];
    let mut rng = Rng(7);
    for _ in 0..4000 {
        let off = (rng.next() as usize % (r.len() / 8)) * 8;
        if rng.next() % 3 == 0 {
            let mut got = [0u8; 8];
            r.read(off, &mut got).unwrap();
            assert_eq!(got, copy[off..off + 8], "offset {off}");
        } else {
            let v = rng.next().to_ne_bytes();
            r.write(off, &v).unwrap();
            copy[off..off + 8].copy_from_slice(&v);
        }
    }
    let mut all = vec![0u8; r.len()];
    r.read(0, &mut all).unwrap();
    assert!(all == copy, "region differs from its copy");
    let s = p.stats();
    assert!(s.written_pages > 0 && s.read_pages() > 0, "{s:?}");
    assert_eq!(s.discarded_pages, 0);
}

fn discardable_pages_read_back_as_zeros_and_are_never_written(mode: FaultMode) {
    let Some(p) = pager(mode, 1024) else { return };
    let r = p.map(64 * ps()).unwrap();
    r.write(0, &vec![0xAB; r.len()]).unwrap();
    // half discardable, half needed
    p.discardable(r.as_ptr() as usize, 32 * ps()).unwrap();
    assert_eq!(p.flush(r.as_ptr() as usize, r.len()).unwrap(), 64);
    let s = p.stats();
    assert_eq!((s.discarded_pages, s.written_pages, s.preflushed_by_user), (32, 32, 64), "{s:?}");
    let mut back = vec![0u8; r.len()];
    r.read(0, &mut back).unwrap();
    assert!(back[..32 * ps()].iter().all(|&b| b == 0));
    assert!(back[32 * ps()..].iter().all(|&b| b == 0xAB));
    let s = p.stats();
    // each needed page read back once, by its fault or ahead of one
    assert_eq!((s.read_faults.not_read, s.read_faults.read + s.read_ahead_pages), (32, 32), "{s:?}");
}

fn the_budget_is_held(mode: FaultMode) {
    let Some(p) = pager(mode, 32) else { return };
    let r = p.map(256 * ps()).unwrap();
    for i in 0..256 {
        r.write(i * ps(), &[i as u8]).unwrap();
        // the handler evicts right after the fault that crossed the budget
        let res = p.stats().resident_pages;
        assert!(res <= 32, "resident {res} pages after touching page {i}");
    }
    for i in 0..256 {
        let mut b = [0u8];
        r.read(i * ps(), &mut b).unwrap();
        assert_eq!(b[0], i as u8);
    }
}

fn budget_eviction_drops_discardable_pages_before_writing_needed_ones(mode: FaultMode) {
    let Some(p) = pager(mode, 64) else { return };
    let r = p.map(128 * ps()).unwrap();
    r.write(0, &vec![1; 64 * ps()]).unwrap();
    p.discardable(r.as_ptr() as usize, 32 * ps()).unwrap();
    // 64 more pages: 64 must go, 32 of them discardable
    r.write(64 * ps(), &vec![2; 64 * ps()]).unwrap();
    let s = p.stats();
    assert_eq!(s.discarded_pages, 32, "{s:?}");
    assert!(s.written_pages <= 32 + 2, "wrote {} needed pages, the budget forces out 32", s.written_pages);
}

/// A scan for discardable pages that found none is not repeated until something
/// changes: a page marked discardable, or (this test) a page already marked
/// discardable filled again, which the next eviction must drop instead of writing a
/// needed page.
fn discardable_pages_filled_after_a_scan_found_none_are_dropped_before_needed_ones_are_written(mode: FaultMode) {
    let Some(p) = pager(mode, 16) else { return };
    let r = p.map(64 * ps()).unwrap();
    let base = r.as_ptr() as usize;
    // marked before they are ever touched: no mark comes after the scan below
    p.discardable(base + 32 * ps(), 8 * ps()).unwrap();
    for i in 0..17 {
        // the 17th needed page: the scan finds no discardable page, a needed one is written
        r.write(i * ps(), &[1]).unwrap();
    }
    let before = p.stats();
    assert!(before.written_pages >= 1 && before.discarded_pages == 0, "{before:?}");
    for i in 32..40 {
        r.write(i * ps(), &[2]).unwrap();
    }
    let s = p.stats();
    // the first of them needs a needed page's room (it is not resident yet); each
    // later one finds the one before it resident and discardable
    assert!(s.discarded_pages >= 6, "{s:?}");
    assert!(s.written_pages <= before.written_pages + 2, "{before:?}\n{s:?}");
    let mut b = [0u8];
    for i in 0..17 {
        r.read(i * ps(), &mut b).unwrap();
        assert_eq!(b[0], 1, "page {i}");
    }
}

/// Map, fault, evict (the budget is small) and unmap at once on several threads, each
/// with its own small regions: the region index and the clock over it under
/// concurrent change. Every needed page reads back what was written, and at the end
/// nothing is resident or swapped.
fn threads_mapping_touching_and_unmapping_small_regions_under_eviction_lose_nothing(mode: FaultMode) {
    let Some(p) = pager(mode, 16) else { return };
    let p = Arc::new(p);
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut live = std::collections::VecDeque::new();
                for i in 0..150u32 {
                    let r = p.map(2 * ps()).unwrap();
                    let tag = [t, i as u8, (i >> 8) as u8, 7];
                    r.write(0, &tag).unwrap();
                    // the second page is garbage: dropped, never written
                    p.discardable(r.as_ptr() as usize + ps(), ps()).unwrap();
                    r.write(ps(), &[9]).unwrap();
                    live.push_back((r, tag));
                    if live.len() > 8 {
                        let (r, tag) = live.pop_front().unwrap();
                        let mut b = [0u8; 4];
                        r.read(0, &mut b).unwrap();
                        assert_eq!(b, tag);
                        p.unmap(r).unwrap();
                    }
                }
                for (r, tag) in live {
                    let mut b = [0u8; 4];
                    r.read(0, &mut b).unwrap();
                    assert_eq!(b, tag);
                    p.unmap(r).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let s = p.stats();
    assert_eq!((s.resident_pages, s.swapped_pages), (0, 0), "{s:?}");
    assert!(s.discarded_pages > 0, "{s:?}");
}

fn concurrent_faulting_threads_see_their_data(mode: FaultMode) {
    let Some(p) = pager(mode, 48) else { return };
    let p = Arc::new(p);
    let r = Arc::new(p.map(256 * ps()).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                let base = t as usize * 64;
                for round in 0..3u8 {
                    for i in 0..64 {
                        r.write((base + i) * ps() + 8, &[t, round, i as u8]).unwrap();
                    }
                    for i in 0..64 {
                        let mut b = [0u8; 3];
                        r.read((base + i) * ps() + 8, &mut b).unwrap();
                        assert_eq!(b, [t, round, i as u8]);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(p.stats().read_pages() > 0);
}

fn threads_faulting_the_same_pages_at_once_each_see_them_once(mode: FaultMode) {
    let Some(p) = pager(mode, 256) else { return };
    let r = Arc::new(p.map(64 * ps()).unwrap());
    for i in 0..64 {
        r.write(i * ps(), &[i as u8 + 1; 16]).unwrap();
    }
    assert_eq!(p.flush(r.as_ptr() as usize, r.len()).unwrap(), 64);
    let start = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (r, start) = (r.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                // each thread in its own order, so that they meet on pages
                for k in 0..64 {
                    let i = (k * (2 * t + 1)) % 64;
                    let mut b = [0u8; 16];
                    r.read(i * ps(), &mut b).unwrap();
                    assert_eq!(b, [i as u8 + 1; 16], "page {i} on thread {t}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = p.stats();
    // each read back exactly once, by a fault or ahead of one; read, not written, each
    // keeps its swap copy where clean pages are tracked
    let kept = if p.tracks_clean_pages() { 64 } else { 0 };
    assert_eq!((s.read_pages() + s.read_ahead_pages, s.resident_pages, s.swapped_pages), (64, 64, kept), "{s:?}");
}

fn a_write_racing_eviction_is_never_lost(mode: FaultMode) {
    // one thread keeps writing counters into needed pages while another flushes them
    // over and over; every write must be seen afterwards
    let Some(p) = pager(mode, 4096) else { return };
    let p = Arc::new(p);
    let r = Arc::new(p.map(16 * ps()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (p, r, stop) = (p.clone(), r.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += p.flush(r.as_ptr() as usize, r.len()).unwrap();
            }
            n
        })
    };
    // run until the flusher has evicted a thousand pages under the writer's feet
    let mut v = 0u32;
    while (p.stats().preflushed_by_user < 1000 || v < 1000) && v < 2_000_000 {
        v += 1;
        let page = v as usize % 16;
        r.write(page * ps(), &v.to_ne_bytes()).unwrap();
        let mut b = [0u8; 4];
        r.read(page * ps(), &mut b).unwrap();
        assert_eq!(u32::from_ne_bytes(b), v, "write {v} to page {page} lost");
    }
    let total = v;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushed = flusher.join().unwrap();
    assert!(flushed >= 1000, "only {flushed} pages flushed: no race exercised");
    for page in 0..16 {
        let mut b = [0u8; 4];
        r.read(page * ps(), &mut b).unwrap();
        let last = (1..=total).rev().find(|v| *v as usize % 16 == page).unwrap();
        assert_eq!(u32::from_ne_bytes(b), last);
    }
}

fn a_page_marked_needed_while_it_is_dropped_keeps_its_later_writes(mode: FaultMode) {
    let Some(p) = pager(mode, 4096) else { return };
    let p = Arc::new(p);
    let r = Arc::new(p.map(8 * ps()).unwrap());
    let base = r.as_ptr() as usize;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (p, r, stop) = (p.clone(), r.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                p.flush(r.as_ptr() as usize, r.len()).unwrap();
            }
        })
    };
    for v in 1..=2000u32 {
        let page = v as usize % 8;
        p.discardable(base + page * ps(), ps()).unwrap();
        p.needed(base + page * ps(), ps()).unwrap();
        r.write(page * ps(), &v.to_ne_bytes()).unwrap();
        let mut b = [0u8; 4];
        r.read(page * ps(), &mut b).unwrap();
        assert_eq!(u32::from_ne_bytes(b), v, "write after needed() lost on page {page}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
}

fn purgeable_lock_reports_discarded_pages(mode: FaultMode) {
    let Some(p) = pager(mode, 1024) else { return };
    let r = p.map(8 * ps()).unwrap();
    let (a, len) = (r.as_ptr() as usize, r.len());
    r.write(0, &vec![5; len]).unwrap();
    p.unlock(a, len).unwrap();
    assert!(p.lock(a, len).unwrap(), "nothing was discarded yet");
    p.unlock(a, len).unwrap();
    p.flush(a + 2 * ps(), ps()).unwrap();
    // locked pages are kept even when flushed
    assert!(p.lock(a, 2 * ps()).unwrap());
    p.flush(a, 2 * ps()).unwrap();
    assert!(!p.lock(a, len).unwrap(), "page 2 was discarded while unlocked");
    assert!(p.lock(a, len).unwrap(), "the loss is reported once");
    let mut b = [0u8; 1];
    r.read(0, &mut b).unwrap();
    assert_eq!(b[0], 5, "locked page kept its data");
    r.read(2 * ps(), &mut b).unwrap();
    assert_eq!(b[0], 0, "discarded page reads zero");

    // A range dropped as garbage (discardable, no lock), reused as a purgeable entry:
    // its next lock reports only what was dropped since its unlock.
    p.discardable(a, len).unwrap();
    p.flush(a, len).unwrap();
    p.needed(a, len).unwrap();
    r.write(0, &vec![6; len]).unwrap();
    p.unlock(a, len).unwrap();
    assert!(p.lock(a, len).unwrap(), "a drop before the unlock is not this period's loss");
}

fn a_full_swap_file_is_a_clear_error_and_loses_nothing(mode: FaultMode) {
    let mut cfg = Config::new(1024 * ps());
    cfg.swap_capacity_bytes = 8 * ps() as u64;
    let Some(p) = pager_with(mode, cfg) else { return };
    let r = p.map(16 * ps()).unwrap();
    for i in 0..16 {
        r.write(i * ps(), &[i as u8 + 1; 64]).unwrap();
    }
    let e = p.flush(r.as_ptr() as usize, r.len()).unwrap_err();
    assert!(e.to_string().contains("swap file"), "{e}");
    for i in 0..16 {
        let mut b = [0u8; 64];
        r.read(i * ps(), &mut b).unwrap();
        assert_eq!(b, [i as u8 + 1; 64], "page {i}");
    }
    assert_eq!(p.stats().written_pages, 8);
}

fn a_region_unmapped_while_pages_are_evicted(mode: FaultMode) {
    let Some(p) = pager(mode, 64) else { return };
    let p = Arc::new(p);
    let keep = p.map(32 * ps()).unwrap();
    keep.write(0, &vec![9; keep.len()]).unwrap();
    for _ in 0..5 {
        let gone = p.map(128 * ps()).unwrap();
        let addr = gone.as_ptr() as usize;
        gone.write(0, &vec![1; gone.len()]).unwrap();
        let flusher = {
            let p = p.clone();
            std::thread::spawn(move || {
                // the region may be gone by the time this runs: an error, not a crash
                let _ = p.flush(addr, 128 * ps());
            })
        };
        p.unmap(gone).unwrap();
        flusher.join().unwrap();
        assert!(p.flush(addr, ps()).is_err(), "unmapped region still known");
    }
    let mut all = vec![0u8; keep.len()];
    keep.read(0, &mut all).unwrap();
    assert!(all.iter().all(|&b| b == 9));
    assert!(p.stats().resident_pages <= 64);
}

#[test]
fn bad_use_gets_clear_errors() {
    bounded(|| {
        if let Err(why) = pager::available() {
            eprintln!("skipped: {why}");
            return;
        }
        let e = Pager::new(Config::new(ps() - 1)).unwrap_err();
        assert!(e.to_string().contains("below one"), "{e}");
        let mut cfg = Config::new(ps());
        cfg.swap_path = Some("/nonexistent-dir/swap".into());
        let e = Pager::new(cfg).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/swap"), "{e}");
        // An existing file is refused, never overwritten.
        let kept = std::env::temp_dir().join(format!("advm-test-pager-kept-{}", std::process::id()));
        std::fs::write(&kept, b"the user's data").unwrap();
        let mut cfg = Config::new(ps());
        cfg.swap_path = Some(kept.clone());
        let e = Pager::new(cfg).unwrap_err();
        let data = std::fs::read(&kept).unwrap();
        let _ = std::fs::remove_file(&kept);
        assert!(
            matches!(&e, advm::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists),
            "{e}"
        );
        assert_eq!(data, b"the user's data");
        let p = Pager::new(Config::new(16 * ps())).unwrap();
        let r = p.map(4 * ps()).unwrap();
        let a = r.as_ptr() as usize;
        let e = p.discardable(a + 1, ps()).unwrap_err();
        assert!(e.to_string().contains("not aligned"), "{e}");
        let e = p.needed(a, 5 * ps()).unwrap_err();
        assert!(e.to_string().contains("not inside one region"), "{e}");
        let e = p.flush(4096, ps()).unwrap_err();
        assert!(e.to_string().contains("not inside one region"), "{e}");
        assert!(r.mark_discardable(3, 2).is_err());
        // a region of another pager is refused, and stays its own pager's
        let other = Pager::new(Config::new(16 * ps())).unwrap();
        let theirs = other.map(ps()).unwrap();
        let addr = theirs.as_ptr() as usize;
        let e = p.unmap(theirs).unwrap_err();
        assert!(e.to_string().contains("not a region of this pager"), "{e}");
        other.flush(addr, ps()).unwrap();
    });
}

/// Many small regions: the region of a fault or of a range is found by address in
/// O(log n), eviction takes regions round-robin without copying their list, and unmap
/// is O(log n). 20,000 one-page regions, one in ten needed (its index written, read
/// back from the swap file), the rest discardable, under a budget of 4,096 pages so
/// that touching them evicts too. A debug build took 1.5 s here, 15.3 s before the
/// index (load 4.5 on 2 cores; docs/pager.md, "Many regions").
#[test]
fn twenty_thousand_one_page_regions_are_mapped_touched_flushed_read_back_and_unmapped_quickly() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 4096) else { return };
        let n = 20_000;
        let needed = |i: usize| i % 10 == 0;
        let t = std::time::Instant::now();
        let mut regions = Vec::with_capacity(n);
        for i in 0..n {
            let r = p.map(ps()).unwrap();
            if !needed(i) {
                p.discardable(r.as_ptr() as usize, ps()).unwrap();
            }
            r.write(0, &(i as u64).to_le_bytes()).unwrap();
            regions.push(r);
        }
        let touched = t.elapsed();
        assert!(p.stats().resident_pages <= 4096);
        for r in &regions {
            p.flush(r.as_ptr() as usize, ps()).unwrap();
        }
        let flushed = t.elapsed();
        assert_eq!(p.stats().resident_pages, 0);
        for (i, r) in regions.iter().enumerate() {
            let mut b = [0u8; 8];
            r.read(0, &mut b).unwrap();
            let want = if needed(i) { i as u64 } else { 0 };
            assert_eq!(u64::from_le_bytes(b), want, "region {i}");
        }
        let read = t.elapsed();
        for r in regions {
            p.unmap(r).unwrap();
        }
        let all = t.elapsed();
        let s = p.stats();
        eprintln!(
            "{n} regions: map+touch {touched:?}, flush {:?}, read back {:?}, unmap {:?}; {s:?}",
            flushed - touched,
            read - flushed,
            all - read
        );
        assert_eq!((s.written_pages, s.read_pages()), (n as u64 / 10, n as u64 / 10), "{s:?}");
        assert_eq!((s.resident_pages, s.swapped_pages), (0, 0));
        // 1.5 s here; the scans it replaced took 15 s
        assert!(all < std::time::Duration::from_secs(12), "{n} one-page regions took {all:?}");
    });
}

fn a_written_out_page_marked_discardable_is_never_read_back(mode: FaultMode) {
    let Some(p) = pager(mode, 1024) else { return };
    let r = p.map(16 * ps()).unwrap();
    r.write(0, &vec![3; r.len()]).unwrap();
    p.flush(r.as_ptr() as usize, r.len()).unwrap();
    assert_eq!(p.stats().swapped_pages, 16);
    // garbage now (from-space after a collection): the next touch must not read it
    p.discardable(r.as_ptr() as usize, 8 * ps()).unwrap();
    r.write(0, &vec![4; 8 * ps()]).unwrap();
    let s = p.stats();
    assert_eq!((s.write_faults.not_read, s.read_pages(), s.swapped_pages), (8, 0, 8), "{s:?}");
    // and a flush forgets the swap copies of the other discardable pages
    p.discardable(r.as_ptr() as usize + 8 * ps(), 8 * ps()).unwrap();
    p.flush(r.as_ptr() as usize + 8 * ps(), 8 * ps()).unwrap();
    assert_eq!(p.stats().swapped_pages, 0);
}

fn flush_discardable_drops_only_the_discardable_pages(mode: FaultMode) {
    let Some(p) = pager(mode, 1024) else { return };
    let r = p.map(32 * ps()).unwrap();
    let a = r.as_ptr() as usize;
    r.write(0, &vec![5; r.len()]).unwrap();
    p.discardable(a + 8 * ps(), 16 * ps()).unwrap();
    // only the range asked for: pages 8..16 of the discardable 8..24
    assert_eq!(p.flush_discardable(a, 16 * ps()).unwrap(), 8);
    let s = p.stats();
    assert_eq!((s.discarded_pages, s.written_pages, s.resident_pages), (8, 0, 24), "{s:?}");
    assert_eq!(s.preflushed_by_user, 8);
    let mut b = vec![0; ps()];
    r.read(8 * ps(), &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    r.read(16 * ps(), &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 5), "a discardable page outside the range stays");
    r.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 5), "needed pages stay");
    assert!(p.flush_discardable(a + 1, ps()).is_err());
}

#[test]
fn a_read_back_brings_the_following_swapped_pages_in_the_same_read() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 1024) else { return };
        let r = p.map(64 * ps()).unwrap();
        for i in 0..64 {
            r.write(i * ps(), &vec![i as u8 + 1; ps()]).unwrap();
        }
        p.flush(r.as_ptr() as usize, r.len()).unwrap();
        let mut b = vec![0; ps()];
        for i in 0..64 {
            r.read(i * ps(), &mut b).unwrap();
            assert!(b.iter().all(|&x| x == i as u8 + 1), "page {i}");
        }
        let s = p.stats();
        // one fault per 16 pages: the other 15 came with it
        assert_eq!((s.read_pages(), s.read_ahead_pages), (4, 60), "{s:?}");
        assert_eq!(s.bytes_read, 64 * ps() as u64);
        assert_eq!(s.resident_pages, 64);
    });
}

#[test]
fn read_ahead_stays_within_the_budget_and_skips_discardable_pages() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 8) else { return };
        let r = p.map(32 * ps()).unwrap();
        r.write(0, &vec![7; r.len()]).unwrap();
        p.flush(r.as_ptr() as usize, r.len()).unwrap();
        p.discardable(r.as_ptr() as usize + 4 * ps(), ps()).unwrap();
        let before = p.stats();
        let mut b = [0u8];
        r.read(0, &mut b).unwrap();
        let s = p.stats();
        // pages 1..4 come along; page 4 is garbage and ends the run
        assert_eq!(
            (s.read_pages() - before.read_pages(), s.read_ahead_pages - before.read_ahead_pages, b[0]),
            (1, 3, 7),
            "{s:?}"
        );
        r.read(8 * ps(), &mut b).unwrap();
        r.read(16 * ps(), &mut b).unwrap();
        assert!(p.stats().resident_pages <= 8, "{:?}", p.stats());
    });
}

fn discarded_pages_marked_needed_are_zero_filled_ahead_of_their_faults(mode: FaultMode) {
    let Some(p) = pager(mode, 1024) else { return };
    let r = p.map(32 * ps()).unwrap();
    let a = r.as_ptr() as usize;
    r.write(0, &vec![9; r.len()]).unwrap();
    p.discardable(a, r.len()).unwrap();
    p.flush(a, r.len()).unwrap();
    // reused: the first 8 pages needed again (an allocation buffer), the rest garbage
    p.needed(a, 8 * ps()).unwrap();
    let before = p.stats();
    r.write(0, &[1]).unwrap();
    let s = p.stats();
    assert_eq!(
        (s.write_faults.not_read, s.zero_ahead_pages - before.zero_ahead_pages, s.resident_pages),
        (1, 7, 8),
        "{s:?}"
    );
    let mut b = vec![1; ps()];
    r.read(7 * ps(), &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(p.stats().faults(), before.faults() + 1, "no fault on the pages filled ahead");
}

fn empty_pages_after_a_first_touch_are_zero_filled_ahead_within_the_budget(mode: FaultMode) {
    let Some(p) = pager(mode, 80) else { return };
    let r = p.map(128 * ps()).unwrap();
    // one fault fills up to 64 pages while the budget has room
    r.write(0, &vec![3; 64 * ps()]).unwrap();
    let s = p.stats();
    assert_eq!((s.write_faults.zero_filled, s.zero_ahead_pages, s.resident_pages), (1, 63, 64), "{s:?}");
    // 16 pages of room left: the next fault fills 1 + 15
    r.write(64 * ps(), &[3]).unwrap();
    let s = p.stats();
    assert_eq!((s.zero_ahead_pages, s.resident_pages), (78, 80), "{s:?}");
}

#[test]
fn a_page_read_back_and_not_written_since_is_evicted_without_a_write() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 1024) else { return };
        if !p.tracks_clean_pages() {
            eprintln!("skipped: no userfaultfd write protection here");
            return;
        }
        let r = p.map(32 * ps()).unwrap();
        let a = r.as_ptr() as usize;
        for i in 0..32 {
            r.write(i * ps(), &vec![i as u8 + 1; ps()]).unwrap();
        }
        p.flush(a, r.len()).unwrap();
        let mut b = vec![0; ps()];
        for round in 0..3 {
            // all read back, page 5 written in the last round only
            for i in 0..32 {
                r.read(i * ps(), &mut b).unwrap();
                assert!(b.iter().all(|&x| x == i as u8 + 1), "page {i}, round {round}");
            }
            if round == 2 {
                r.write(5 * ps(), &vec![6; ps()]).unwrap();
            }
            p.flush(a, r.len()).unwrap();
        }
        let s = p.stats();
        // written once at first, and page 5 once more; every other eviction dropped a clean page
        assert_eq!((s.written_pages, s.clean_dropped_pages), (33, 2 * 32 + 31), "{s:?}");
        assert_eq!(s.swapped_pages, 32, "{s:?}");
        for i in 0..32 {
            r.read(i * ps(), &mut b).unwrap();
            assert!(b.iter().all(|&x| x == i as u8 + 1), "page {i} at the end");
        }
        // a clean page unmapped gives its slot back
        p.unmap(r).unwrap();
        assert_eq!(p.stats().swapped_pages, 0);
    });
}

#[test]
fn a_write_racing_the_eviction_of_a_clean_page_is_never_lost() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 1024) else { return };
        let p = Arc::new(p);
        let r = Arc::new(p.map(16 * ps()).unwrap());
        let a = r.as_ptr() as usize;
        r.write(0, &vec![0; r.len()]).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flusher = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    p.flush(a, 16 * ps()).unwrap();
                }
            })
        };
        // each page read (back, clean) then written with a counter; the counter must stick
        let mut b = [0u8; 8];
        for n in 1..=3000u64 {
            let off = (n as usize % 16) * ps();
            r.read(off, &mut b).unwrap();
            r.write(off, &n.to_ne_bytes()).unwrap();
            r.read(off, &mut b).unwrap();
            assert_eq!(u64::from_ne_bytes(b), n, "write {n} lost");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flusher.join().unwrap();
        for k in 0..16u64 {
            r.read(k as usize * ps(), &mut b).unwrap();
            let last = (1..=3000u64).rev().find(|n| n % 16 == k).unwrap();
            assert_eq!(u64::from_ne_bytes(b), last, "page {k}");
        }
    });
}

#[test]
fn a_kernel_swap_file_is_disabled_and_removed_on_drop() {
    bounded(|| {
        if !advm::process::is_root() {
            eprintln!("skipped: swapon needs root");
            return;
        }
        let path = std::path::PathBuf::from(format!("/var/tmp/advm-test-swap-{}", std::process::id()));
        let listed = || std::fs::read_to_string("/proc/swaps").unwrap().contains(path.to_str().unwrap());
        {
            let swap = match advm::pager::KernelSwap::create(&path, 4 << 20) {
                Ok(s) => s,
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    eprintln!("skipped: no swap file here: {e}");
                    return;
                }
            };
            assert!(listed(), "{} not in /proc/swaps", swap.path().display());
        }
        assert!(!listed(), "still enabled after drop");
        assert!(!path.exists(), "still on disk after drop");
    });
}

#[test]
fn a_swap_file_left_by_a_killed_process_is_turned_off_and_removed() {
    bounded(|| {
        let path = std::path::PathBuf::from(format!("/var/tmp/advm-test-swap-left-{}", std::process::id()));
        let listed = || std::fs::read_to_string("/proc/swaps").unwrap().contains(path.to_str().unwrap());
        // as a killed process leaves it: enabled, on disk, nobody holding it (made by
        // the tools, since a KernelSwap of this process would hold its lock)
        std::fs::write(&path, vec![0u8; 4 << 20]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let made = std::process::Command::new("mkswap")
            .arg(&path)
            .output()
            .and_then(|_| std::process::Command::new("swapon").arg(&path).output());
        if !made.is_ok_and(|o| o.status.success()) || !listed() {
            let _ = std::fs::remove_file(&path);
            eprintln!("skipped: no mkswap/swapon or no swap files here");
            return;
        }
        assert!(advm::pager::KernelSwap::remove_left(&path).unwrap());
        assert!(!listed(), "still enabled");
        assert!(!path.exists(), "still on disk");
        // one that is only on disk (killed before swapon)
        std::fs::write(&path, b"x").unwrap();
        assert!(advm::pager::KernelSwap::remove_left(&path).unwrap());
        assert!(!path.exists());
        // a live one (another run, perhaps in another PID namespace) is left alone
        let live = advm::pager::KernelSwap::create(&path, 4 << 20).unwrap();
        assert!(!advm::pager::KernelSwap::remove_left(&path).unwrap());
        assert!(listed() && path.exists(), "a live swap file was removed");
        live.remove().unwrap();
    });
}

#[test]
fn a_cgroup_limit_is_set_and_read_back() {
    bounded(|| {
        let g = match advm::stats::cgroup::Group::create("pager-test") {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        g.set_limit_bytes(64 << 20).unwrap();
        assert_eq!(g.limit_bytes().unwrap(), 64 << 20);
        assert!(g.usage_bytes().unwrap() < 64 << 20);
        let dir = g.path().to_path_buf();
        g.remove().unwrap();
        assert!(!dir.exists());
    });
}

#[test]
fn sigbus_mode_resolves_faults_on_the_faulting_thread() {
    bounded(|| {
        if let Err(why) = pager::available() {
            eprintln!("skipped: {why}");
            return;
        }
        match pager::sigbus_zero_fill_cost(2048).unwrap() {
            Some(d) => eprintln!("SIGBUS-mode zero-fill: {:.2} us a fault", d.as_secs_f64() * 1e6),
            None => eprintln!("skipped: no UFFD_FEATURE_SIGBUS"),
        }
    });
}

/// Needed pages left to the kernel, faults served on the faulting thread: the budget
/// bounds no needed page there, so a fault past it is served at once. (The faulting
/// thread used to wait for room that the handler thread, which drops discardable
/// pages only, never made: the benchmark's child livelocked in its first collection.)
#[test]
fn with_kernel_paging_faults_past_the_budget_are_served_in_sigbus_mode() {
    bounded(|| {
        let mut cfg = Config::new(16 * ps());
        cfg.needed_paging = NeededPaging::Kernel;
        let Some(p) = pager_with(FaultMode::Sigbus, cfg) else { return };
        let r = p.map(64 * ps()).unwrap();
        // a hang fails the test (bounded)
        for i in 0..64 {
            r.write(i * ps(), &(i as u32 + 1).to_ne_bytes()).unwrap();
        }
        let mut b = [0u8; 4];
        for i in 0..64 {
            r.read(i * ps(), &mut b).unwrap();
            assert_eq!(u32::from_ne_bytes(b), i as u32 + 1, "page {i}");
        }
        let s = p.stats();
        assert_eq!((s.resident_pages, s.written_pages), (64, 0), "{s:?}");
    });
}

/// A swap read that fails (here: the swap file cut to nothing under the pager) leaves
/// the faulting thread waiting, not handed wrong data, and the fault is served once
/// the file reads again. (On the handler thread the fault used to be dropped: its
/// thread, which never faults again by itself, waited for ever.)
fn a_failed_swap_read_is_retried_and_the_fault_served_once_the_file_reads(mode: FaultMode) {
    use std::os::unix::fs::FileExt;
    let path = std::path::PathBuf::from(format!("/var/tmp/advm-test-pager-unread-{}-{mode:?}", std::process::id()));
    // removed also when the test fails
    struct Removed(std::path::PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _removed = Removed(path.clone());
    let mut cfg = Config::new(64 * ps());
    cfg.swap_path = Some(path.clone());
    let Some(p) = pager_with(mode, cfg) else { return };
    // one page: nothing read ahead
    let r = Arc::new(p.map(ps()).unwrap());
    r.write(0, &[9; 64]).unwrap();
    p.flush(r.as_ptr() as usize, ps()).unwrap();
    let saved = std::fs::read(&path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let r = r.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            r.read(0, &mut b).unwrap();
            tx.send(b).unwrap();
        })
    };
    let waited = rx.recv_timeout(std::time::Duration::from_millis(200));
    assert!(waited.is_err(), "served from a swap file that reads nothing: {waited:?}");
    file.write_all_at(&saved, 0).unwrap();
    let b = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("not served once the swap file reads again");
    assert_eq!(b, [9; 64]);
    reader.join().unwrap();
    let s = p.stats();
    // read back clean where clean pages are tracked: its swap copy kept
    assert_eq!((s.read_pages(), s.swapped_pages), (1, u64::from(p.tracks_clean_pages())), "{s:?}");
}

/// The swap file a pager created at a path goes with the pager, so the next run can
/// name the same path (it stayed, and the second run met `EEXIST`); a file put in its
/// place meanwhile is not the pager's and stays.
#[test]
fn a_named_swap_file_goes_with_its_pager_and_the_path_can_be_used_again() {
    bounded(|| {
        if let Err(why) = pager::available() {
            eprintln!("skipped: {why}");
            return;
        }
        let path = std::env::temp_dir().join(format!("advm-test-pager-named-{}", std::process::id()));
        for _ in 0..2 {
            let mut cfg = Config::new(16 * ps());
            cfg.swap_path = Some(path.clone());
            let p = Pager::new(cfg).unwrap();
            let r = p.map(4 * ps()).unwrap();
            r.write(0, &[7; 64]).unwrap();
            p.flush(r.as_ptr() as usize, ps()).unwrap();
            assert!(path.exists());
            drop(r);
            drop(p);
            assert!(!path.exists(), "{} stayed after its pager", path.display());
        }
        let mut cfg = Config::new(16 * ps());
        cfg.swap_path = Some(path.clone());
        let p = Pager::new(cfg).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's").unwrap();
        drop(p);
        let kept = std::fs::read(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(kept.unwrap(), b"someone else's");
    });
}

/// A test that never ends fails instead, after its limit, and says what its pagers
/// were doing.
#[test]
fn a_test_that_hangs_fails_with_the_state_of_its_pagers() {
    if let Err(why) = pager::available() {
        eprintln!("skipped: {why}");
        return;
    }
    // the pager is made first, by a thread of the name the bounded body gets (so the
    // report finds it whatever the load), and kept until the test lets go
    let name = "a hanging body";
    let (ready, made) = std::sync::mpsc::channel();
    let (release, hang) = std::sync::mpsc::channel::<()>();
    let maker = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let p = Pager::new(Config::new(8 * ps())).unwrap();
            let r = p.map(4 * ps()).unwrap();
            r.write(0, &[1]).unwrap();
            ready.send(()).unwrap();
            let _ = hang.recv();
        })
        .unwrap();
    made.recv().unwrap();
    let (release_body, hang_body) = std::sync::mpsc::channel::<()>();
    let failed = std::panic::catch_unwind(move || {
        pager::run_bounded(name, std::time::Duration::from_millis(300), move || {
            let _ = hang_body.recv();
        })
    });
    drop((release, release_body));
    maker.join().unwrap();
    let why = failed.expect_err("a body that never returns did not fail");
    let why = why.downcast_ref::<String>().expect("a message");
    for part in ["a hanging body: not done in 300ms", "handler thread running", "4 pages: empty 0, resident 4"] {
        assert!(why.contains(part), "{part:?} is not in {why}");
    }
}

/// Dropping a pager wakes its handler thread instead of waiting for the thread's poll
/// to time out (10 ms a pager before: a loop making and dropping pagers crawled).
#[test]
fn dropping_a_pager_does_not_wait_for_the_handler_threads_tick() {
    bounded(|| {
        let mut drops = Vec::new();
        for _ in 0..20 {
            let Some(p) = pager(FaultMode::Thread, 16) else { return };
            let r = p.map(4 * ps()).expect("map");
            // SAFETY: the region's 4 pages are ours; the pager serves their faults.
            unsafe { std::ptr::write_bytes(r.as_ptr(), 1, 4 * ps()) };
            drop(r);
            let t = std::time::Instant::now();
            drop(p);
            drops.push(t.elapsed());
        }
        drops.sort();
        let median = drops[drops.len() / 2];
        assert!(median < std::time::Duration::from_millis(5), "median drop {median:?} (each: {drops:?})");
    });
}

/// A pager dropped while another thread, holding one of its regions, faults there all
/// the time (a budget of 4 pages under a sweep of 64): the thread is never left
/// waiting on a fault (or in SIGBUS mode on room in the budget) that nobody serves,
/// and its next `write` after the drop is an error.
fn dropping_the_pager_while_a_thread_faults_on_its_region_never_hangs_that_thread(mode: FaultMode) {
    for _ in 0..5 {
        let Some(p) = pager(mode, 4) else { return };
        let r = p.map(64 * ps()).expect("map");
        let (done, finished) = std::sync::mpsc::channel();
        let sweeps = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let sweeper = {
            let sweeps = sweeps.clone();
            std::thread::spawn(move || {
                let e = 'sweep: loop {
                    for page in 0..64 {
                        if let Err(e) = r.write(page * ps(), &[1; 64]) {
                            break 'sweep e;
                        }
                    }
                    sweeps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                };
                assert!(matches!(e, advm::Error::Unrecoverable { .. }), "{e}");
                done.send(()).unwrap();
                r
            })
        };
        // dropped mid-sweep: every sweep faults 60 pages in
        while sweeps.load(std::sync::atomic::Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        drop(p);
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the faulting thread still waits 10 s after the pager was dropped");
        drop(sweeper.join().unwrap());
    }
}

/// A region held after its pager is dropped: the pages the pager had evicted are lost
/// with its swap file (they read as zeros), so `read` and `write` say so instead of
/// handing out zeros for data that was written (they returned the zeros before).
#[test]
fn a_region_held_after_its_pager_is_dropped_refuses_read_and_write() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Thread, 4) else { return };
        let r = p.map(16 * ps()).expect("map");
        for i in 0..16 {
            r.write(i * ps(), &[i as u8 + 1; 8]).expect("write");
        }
        drop(p);
        let mut b = [0u8; 1];
        for e in [r.read(0, &mut b).unwrap_err(), r.write(0, &[1]).unwrap_err()] {
            assert!(matches!(e, advm::Error::Unrecoverable { .. }), "{e}");
            assert!(e.to_string().contains("its pager was dropped"), "{e}");
        }
    });
}

/// A purgeable cache of 32 entries of 4 pages under a budget of 24 pages, used by 4
/// threads at once (each entry behind its own mutex, as a cache would have): a lock
/// that says kept finds every byte of the entry's last decode; one that says lost
/// finds each page whole or zeros, at least one zeros.
fn a_purgeable_cache_shared_by_threads_never_hands_out_wrong_bytes(mode: FaultMode) {
    const ENTRIES: usize = 32;
    const PAGES: usize = 4;
    let Some(p) = pager(mode, 24) else { return };
    let p = Arc::new(p);
    let r = Arc::new(p.map(ENTRIES * PAGES * ps()).expect("map"));
    let base = r.as_ptr() as usize;
    let entries: Arc<Vec<std::sync::Mutex<u8>>> = Arc::new((0..ENTRIES).map(|_| std::sync::Mutex::new(0)).collect());
    let page_of = |e: usize, pg: usize, gen: u8| vec![((e * 8 + pg) as u8 ^ gen.wrapping_mul(37)) | 1; ps()];
    let (mut kept, mut lost) = (0, 0);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (p, r, entries) = (p.clone(), r.clone(), entries.clone());
            std::thread::spawn(move || {
                let (mut kept, mut lost) = (0, 0);
                let mut rng = Rng(t * 7919 + 1);
                for _ in 0..250 {
                    let e = rng.next() as usize % ENTRIES;
                    let mut gen = entries[e].lock().unwrap();
                    let at = base + e * PAGES * ps();
                    let survived = p.lock(at, PAGES * ps()).expect("lock");
                    let mut zeros = 0;
                    for pg in 0..PAGES {
                        let mut got = vec![0u8; ps()];
                        r.read((e * PAGES + pg) * ps(), &mut got).expect("read");
                        let whole = *gen != 0 && got == page_of(e, pg, *gen);
                        let zero = got.iter().all(|&b| b == 0);
                        assert!(whole || (zero && !survived) || *gen == 0, "entry {e} page {pg}: wrong bytes");
                        zeros += zero as usize;
                    }
                    if survived && *gen != 0 {
                        kept += 1;
                    } else {
                        assert!(*gen == 0 || zeros > 0, "entry {e}: lost, yet every page intact");
                        lost += (*gen != 0) as usize;
                        *gen = gen.wrapping_add(1).max(1);
                        for pg in 0..PAGES {
                            r.write((e * PAGES + pg) * ps(), &page_of(e, pg, *gen)).expect("decode");
                        }
                    }
                    p.unlock(at, PAGES * ps()).expect("unlock");
                }
                (kept, lost)
            })
        })
        .collect();
    for t in threads {
        let (k, l) = t.join().unwrap();
        kept += k;
        lost += l;
    }
    assert!(kept > 0 && lost > 0, "kept {kept}, lost {lost}: the budget purged nothing or everything");
    assert!(p.stats().resident_pages <= 24);
}

/// SIGBUS mode with many more regions than its old route table held (1024 ranges; a
/// map past them failed with ENOSPC): 5,000 one-page regions, every other one
/// discardable, under a budget of 512 pages. Needed pages come back from the swap
/// file, discardable ones read as zeros once flushed.
#[test]
fn five_thousand_one_page_regions_are_served_in_sigbus_mode() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Sigbus, 512) else { return };
        let n = 5_000;
        let needed = |i: usize| i % 2 == 0;
        let regions: Vec<_> = (0..n)
            .map(|i| {
                let r = p.map(ps()).unwrap();
                if !needed(i) {
                    p.discardable(r.as_ptr() as usize, ps()).unwrap();
                }
                r.write(0, &(i as u64 + 1).to_le_bytes()).unwrap();
                r
            })
            .collect();
        assert!(p.stats().resident_pages <= 512, "{:?}", p.stats());
        for r in &regions {
            p.flush(r.as_ptr() as usize, ps()).unwrap();
        }
        assert_eq!(p.stats().resident_pages, 0);
        for (i, r) in regions.iter().enumerate() {
            // through the region's memory: the fault is served by the SIGBUS handler
            // SAFETY: the first 8 bytes of a live region of `p`.
            let v = unsafe { std::ptr::read_volatile(r.as_ptr() as *const u64) };
            assert_eq!(v, if needed(i) { i as u64 + 1 } else { 0 }, "region {i}");
        }
        // (reading back under the budget writes needed pages out again: no clean
        // tracking in SIGBUS mode)
        let s = p.stats();
        assert!(s.read_pages() == n as u64 / 2 && s.written_pages >= n as u64 / 2, "{s:?}");
        for r in regions {
            p.unmap(r).unwrap();
        }
        let s = p.stats();
        assert_eq!((s.resident_pages, s.swapped_pages), (0, 0), "{s:?}");
    });
}

/// SIGBUS mode: threads mapping and unmapping regions (each a route added to and
/// taken out of the signal handler's index) while other threads fault on 2,000 other
/// regions that a flusher keeps evicting. Nothing is lost, no fault goes astray.
#[test]
fn in_sigbus_mode_regions_come_and_go_while_other_threads_fault() {
    bounded(|| {
        let Some(p) = pager(FaultMode::Sigbus, 256) else { return };
        let p = Arc::new(p);
        let n = 2_000;
        let needed = |i: usize| i % 3 != 0;
        let tag = |i: usize| i as u64 * 7 + 1;
        let base: Arc<Vec<_>> = Arc::new(
            (0..n)
                .map(|i| {
                    let r = p.map(ps()).unwrap();
                    if !needed(i) {
                        p.discardable(r.as_ptr() as usize, ps()).unwrap();
                    }
                    r.write(0, &tag(i).to_le_bytes()).unwrap();
                    r
                })
                .collect(),
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let faulting: Vec<_> = (0..2u64)
            .map(|t| {
                let base = base.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 + t);
                    for _ in 0..20_000 {
                        let i = rng.next() as usize % n;
                        // SAFETY: the first 8 bytes of a live region.
                        let v = unsafe { std::ptr::read_volatile(base[i].as_ptr() as *const u64) };
                        if needed(i) {
                            assert_eq!(v, tag(i), "region {i}");
                        } else {
                            assert!(v == tag(i) || v == 0, "region {i}: {v}");
                        }
                    }
                })
            })
            .collect();
        let flusher = {
            let (p, base, stop) = (p.clone(), base.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(77);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = &base[rng.next() as usize % n];
                    p.flush(r.as_ptr() as usize, ps()).unwrap();
                }
            })
        };
        let churning: Vec<_> = (0..2u8)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut live = std::collections::VecDeque::new();
                    for i in 0..600u32 {
                        let r = p.map(ps()).unwrap();
                        let mark = [t, i as u8, (i >> 8) as u8, 5];
                        r.write(0, &mark).unwrap();
                        live.push_back((r, mark));
                        if live.len() > 32 {
                            let (r, mark) = live.pop_front().unwrap();
                            let mut b = [0u8; 4];
                            r.read(0, &mut b).unwrap();
                            assert_eq!(b, mark);
                            p.unmap(r).unwrap();
                        }
                    }
                    for (r, _) in live {
                        p.unmap(r).unwrap();
                    }
                })
            })
            .collect();
        faulting.into_iter().chain(churning).for_each(|t| t.join().unwrap());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flusher.join().unwrap();
        let base = Arc::into_inner(base).unwrap();
        for r in base {
            p.unmap(r).unwrap();
        }
        let s = p.stats();
        assert_eq!((s.resident_pages, s.swapped_pages), (0, 0), "{s:?}");
        assert!(s.read_pages() > 0, "{s:?}");
    });
}

mod umode;

/// A user whose only userfaultfd is the user-mode-only kind (uid 65534 with
/// vm.unprivileged_userfaultfd=0 and /dev/userfaultfd root's) is refused the pager,
/// told why and how to get one. It was given a pager whose pages a system call could
/// not fault in: another thread's `recv` into a page not resident failed with EFAULT
/// (the bytes stayed in the socket; a caller treating EFAULT as fatal lost them).
#[test]
fn a_user_mode_only_userfaultfd_is_refused_naming_the_fix() {
    if !umode::body_runs_here("a_user_mode_only_userfaultfd_is_refused_naming_the_fix") {
        return;
    }
    let mut cfg = Config::new(64 * ps());
    cfg.fault_mode = FaultMode::Thread;
    let p = match Pager::new(cfg) {
        Err(e) => {
            let msg = e.to_string();
            for says in
                ["pager needs", "system calls", "vm.unprivileged_userfaultfd=1", "/dev/userfaultfd", "uid 65534"]
            {
                assert!(msg.contains(says), "{msg}");
            }
            assert!(pager::available().is_err());
            return;
        }
        Ok(p) => p,
    };
    // What it did before: a page written, evicted, then filled by the kernel.
    use std::io::{Read, Write};
    let r = p.map(2 * ps()).unwrap();
    r.write(0, &vec![5; ps()]).unwrap();
    p.flush(r.as_ptr() as usize, ps()).unwrap();
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.write_all(&vec![7; ps()]).unwrap();
    // SAFETY: page 0 of the live region, written by the kernel only meanwhile.
    let page = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), ps()) };
    let got = b.read(page);
    panic!("the pager was made; recv into an evicted page: {got:?}");
}
