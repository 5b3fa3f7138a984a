//! The fault/unmap race, driven step by step from inside the pager.

use super::*;

fn pager(mode: FaultMode) -> Option<Pager> {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return None;
    }
    if mode == FaultMode::Sigbus && !sigbus_available() {
        eprintln!("skipped: no userfaultfd SIGBUS mode");
        return None;
    }
    let mut cfg = Config::new(1024 * page_size());
    cfg.fault_mode = mode;
    Some(Pager::new(cfg).unwrap())
}

/// A fault is filled, then the region is unmapped before the fault's bookkeeping
/// runs (the window between `UFFDIO_ZEROPAGE`/`UFFDIO_COPY` and the state update):
/// the resident count and the swap slots come out exact.
#[test]
fn a_fault_settled_after_unmap_of_its_region_counts_nothing() {
    let Some(p) = pager(FaultMode::Thread) else { return };
    let s = p.shared.clone();
    let r = p.map(4 * page_size()).unwrap();
    // page 1 written out, so its fault is a read-back holding a swap slot (pages 2
    // and 3 discardable: not zero-filled ahead of page 1's first touch)
    p.discardable(r.as_ptr() as usize + 2 * page_size(), 2 * page_size()).unwrap();
    r.write(page_size(), &[7; 16]).unwrap();
    p.flush(r.as_ptr() as usize + page_size(), page_size()).unwrap();
    assert_eq!((p.stats().resident_pages, p.stats().swapped_pages), (0, 1));
    let m = r.m.clone();
    // fault on page 0 (never used), filled
    s.reserve(false);
    assert!(m.area.fill_zero(&s.fd, 0, true).unwrap());
    // fault on page 1, claimed, read and filled
    assert!(m.state[1].compare_exchange(SWAPPED, EVICTING, Ordering::AcqRel, Ordering::Acquire).is_ok());
    let slot = m.slot[1].load(Ordering::Acquire);
    let mut buf = PageBuf::new(1).unwrap();
    s.swap.read_page(slot as usize, buf.bytes_mut()).unwrap();
    s.reserve(false);
    assert!(m.area.fill_copy(&s.fd, 1, buf.bytes_mut()).unwrap());
    p.unmap(r).unwrap();
    s.filled_from(&m, 0, EMPTY, true, None, false);
    s.filled_from(&m, 1, EVICTING, true, Some(slot), false);
    let st = p.stats();
    assert_eq!((st.resident_pages, st.swapped_pages), (0, 0), "{st:?}");
}

/// The same race run for real: threads keep faulting on a region (kept mapped by
/// their handle on it) while it is unmapped; afterwards nothing is counted resident.
fn faults_racing_unmap_leave_the_resident_count_exact(mode: FaultMode) {
    let Some(p) = pager(mode) else { return };
    let ps = page_size();
    for round in 0..20 {
        let r = p.map(64 * ps).unwrap();
        r.write(0, &vec![1; 32 * ps]).unwrap();
        p.flush(r.as_ptr() as usize, 32 * ps).unwrap();
        let m = r.m.clone();
        let go = Arc::new(std::sync::Barrier::new(3));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (m, go) = (m.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for k in 0..64 {
                        let mut b = [0u8; 1];
                        let _ = m.area.read(((k + 32 * t) % 64) * ps, &mut b);
                    }
                })
            })
            .collect();
        go.wait();
        if round % 2 == 1 {
            std::thread::yield_now();
        }
        p.unmap(r).unwrap();
        threads.into_iter().for_each(|t| t.join().unwrap());
        // a fault the handler thread read before the unmap may still be settling
        let t = std::time::Instant::now();
        let mut st = p.stats();
        while (st.resident_pages, st.swapped_pages) != (0, 0) && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(5));
            st = p.stats();
        }
        assert_eq!((st.resident_pages, st.swapped_pages), (0, 0), "round {round}: {st:?}");
    }
}

#[test]
fn faults_racing_unmap_leave_the_resident_count_exact_handler_thread() {
    faults_racing_unmap_leave_the_resident_count_exact(FaultMode::Thread);
}

#[test]
fn faults_racing_unmap_leave_the_resident_count_exact_sigbus() {
    faults_racing_unmap_leave_the_resident_count_exact(FaultMode::Sigbus);
}
