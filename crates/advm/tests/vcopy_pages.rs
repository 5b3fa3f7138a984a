//! Pages really freed: the process's distinct physical page count (advm::stats, the
//! mmapcopy paper's measure) shows sharing after a copy and returns to its baseline
//! after free. One test in its own binary so other tests' memory does not interfere.

use advm::mem::HostAddr;
use advm::stats::{Meter, Options};
use advm::vcopy::{Arena, Config};

#[test]
fn distinct_pages_show_sharing_and_return_to_baseline() {
    if !advm::probe::facts().pfn_visible {
        eprintln!("skipped: PFNs are hidden here (needs CAP_SYS_ADMIN), distinct pages cannot be counted");
        return;
    }
    let ps = advm::addr::page_size();
    let pages = 2048; // 8 MiB: far above the test harness's own noise
    let len = pages * ps;
    let a = Arena::with_config(Config::default().reserve_bytes(1 << 30)).unwrap();
    let mut meter = Meter::for_self(Options::default()).unwrap();
    let distinct = |m: &mut Meter| m.sample().unwrap().distinct.unwrap().total as i64;
    // one small buffer: reading whole blocks into a big one would add its own pages
    let mut buf = vec![0u8; ps];
    let read_all = |p: HostAddr, buf: &mut Vec<u8>| {
        for i in 0..pages {
            a.read(HostAddr(p.0 + i * ps), buf).unwrap();
        }
    };
    // one warm-up round so that allocator and meter buffers reach their steady size
    for _ in 0..2 {
        let w = a.alloc(len).unwrap();
        a.fill(w, 1, len).unwrap();
        let c = a.dup(w, len).unwrap();
        read_all(c, &mut buf);
        distinct(&mut meter);
        a.free(w).unwrap();
        a.free(c).unwrap();
    }
    let base = distinct(&mut meter);

    let src = a.alloc(len).unwrap();
    a.fill(src, 7, len).unwrap();
    let one = distinct(&mut meter) - base;
    let dst = a.dup(src, len).unwrap();
    read_all(src, &mut buf);
    read_all(dst, &mut buf); // both sides mapped again
    let after_copy = distinct(&mut meter) - base;
    let slack = 64; // page tables and the harness
    assert!((one - pages as i64).abs() < slack, "source holds {one} pages, expected ~{pages}");
    assert!(after_copy < one + slack, "a copy must not add pages: {one} -> {after_copy}");

    // write a tenth of the copy: that tenth is duplicated, nothing more
    for p in (0..pages).step_by(10) {
        a.fill(HostAddr(dst.0 + p * ps), 9, 1).unwrap();
    }
    let after_writes = distinct(&mut meter) - base;
    let tenth = pages.div_ceil(10) as i64;
    assert!((after_writes - one - tenth).abs() < slack, "{one} + {tenth} written pages, measured {after_writes}");

    a.free(src).unwrap();
    a.free(dst).unwrap();
    drop(buf);
    let end = distinct(&mut meter) - base;
    assert!(end < slack, "after free, {end} pages above baseline remain");
    assert_eq!(a.stats().memfd_resident_bytes, 0);
}
