//! `Grant::free_lazily` (`MADV_FREE`): a freed page keeps what is written to it
//! afterwards, and under a memory limit the kernel drops freed pages without swapping
//! them. The second test needs root and a memory cgroup; it skips with the reason
//! otherwise.

use advm::mem::{page_size, PageRange, Region};
use advm::stats::cgroup::{Group, Version};

const MIB: usize = 1 << 20;

/// KiB of `LazyFree` in this process's smaps_rollup: freed pages not written since.
fn lazy_free_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let line = text.lines().find(|l| l.starts_with("LazyFree:")).expect("smaps_rollup has LazyFree");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_lazily_freed_page_written_again_keeps_the_write_and_the_rest_reads_old_bytes_or_zeros() {
    let ps = page_size();
    let (pages, nfreed) = (128, 64);
    let mut r = Region::new(pages * ps).unwrap();
    for (i, b) in r.bytes_mut().iter_mut().enumerate() {
        *b = (i % 251) as u8 | 1;
    }
    let base = r.addr().0;
    let before = lazy_free_kib();
    let freed = PageRange::new("freed", base, nfreed * ps).unwrap();
    r.grant().free_lazily(freed).unwrap();
    let after = lazy_free_kib();
    // Write the first byte of every other freed page.
    for p in (0..nfreed).step_by(2) {
        r.bytes_mut()[p * ps] = 0;
    }
    let mut dropped = 0;
    for p in 0..pages {
        let page = &r.bytes()[p * ps..(p + 1) * ps];
        let old = |j: usize| ((p * ps + j) % 251) as u8 | 1;
        let written = p < nfreed && p % 2 == 0;
        if written {
            assert_eq!(page[0], 0, "page {p}: the write after the free was lost");
        }
        let from = usize::from(written);
        if p >= nfreed {
            assert!((0..ps).all(|j| page[j] == old(j)), "page {p} was not freed but changed");
        } else if page[from..].iter().all(|&b| b == 0) {
            dropped += 1;
        } else {
            // kept: the whole page still holds its old bytes
            assert!((from..ps).all(|j| page[j] == old(j)), "freed page {p} holds neither its old bytes nor zeros");
        }
    }
    // Unless the kernel dropped them meanwhile, the pages are counted as lazily freed
    // (other tests of this binary free nothing lazily), all but those still in the
    // kernel's per-CPU batch (31 pages) that moves them to the lazy-free list.
    let seen = (after.saturating_sub(before) as usize * 1024) / ps + dropped;
    assert!(
        seen + 31 >= nfreed,
        "{} KiB more LazyFree and {dropped} pages dropped for {nfreed} pages freed",
        after - before
    );
    // Outside the grant: refused.
    let outside = PageRange::new("outside", base + pages * ps, ps).unwrap();
    assert!(r.grant().free_lazily(outside).is_err());
}

#[test]
fn under_a_memory_limit_lazily_freed_pages_are_dropped_without_swap() {
    let g = match Group::create("test-free-lazily") {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    // No swap for the group: the only way to stay under the limit is to drop the freed
    // pages (lazily freed pages sit on the file LRU, which reclaim takes anyway).
    let (knob, value) = match g.version() {
        Version::V1 => ("memory.swappiness", "0"),
        Version::V2 => ("memory.swap.max", "0"),
    };
    std::fs::write(g.path().join(knob), value).unwrap();
    g.set_limit_bytes(16 * MIB as u64).unwrap();
    let reply = g
        .run_in_child(|| {
            let err = |e: advm::Error| e.to_string();
            let ps = page_size();
            let mut old = Region::new(12 * MIB).map_err(err)?;
            old.bytes_mut().fill(0xa5);
            let range = old.range();
            old.grant().free_lazily(range).map_err(err)?;
            let mut new = Region::new(12 * MIB).map_err(err)?;
            new.bytes_mut().fill(0x5a);
            let dropped = old.bytes().chunks(ps).filter(|p| p.iter().all(|&b| b == 0)).count();
            let kept_ok = old.bytes().chunks(ps).all(|p| p.iter().all(|&b| b == 0) || p.iter().all(|&b| b == 0xa5));
            let new_ok = new.bytes().iter().all(|&b| b == 0x5a);
            Ok(format!("{dropped} {kept_ok} {new_ok}").into_bytes())
        })
        .unwrap();
    g.remove().unwrap();
    let reply = String::from_utf8(reply.expect("the child ran out of memory or failed")).unwrap();
    let f: Vec<&str> = reply.split(' ').collect();
    let dropped: usize = f[0].parse().unwrap();
    assert_eq!(f[1], "true", "a freed page held neither its old bytes nor zeros");
    assert_eq!(f[2], "true", "the pages written after the free lost data");
    // 24 MiB touched under a 16 MiB limit with no swap: at least 8 MiB of the freed
    // pages had to go (less the slack of what is charged elsewhere).
    assert!(dropped * page_size() >= 4 * MIB, "only {dropped} freed pages were dropped");
}
