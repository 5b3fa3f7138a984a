//! The merge agent's whole-process merge (`advm::merge::agent::merge_process`, what
//! `advm run --mode merge` and `advm vm run --merge` run) gives back all-zero pages the
//! process holds: they read as zeros after, hold no memory, and their mapping joins its
//! neighbours again with the flags it had; a thread writing zero pages throughout the
//! merge loses no write. A locked mapping stays locked (and its zero pages resident), a
//! wipe-on-fork one is left alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use advm::mem::{page_size, PageRange, Region};
use advm::stats::page_frames;

mod pagemap;
use pagemap::page_kinds;

/// The mapping of /proc/self/maps holding `addr`: (start, end, the VmFlags line of smaps).
fn mapping_of(addr: usize) -> (usize, usize, String) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut cur: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((s, e)) = cur.filter(|&(s, e)| s <= addr && addr < e) {
                return (s, e, flags.trim().to_string());
            }
        } else if let Some((s, e)) = line.split_whitespace().next().and_then(|r| r.split_once('-')) {
            if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                cur = Some((s, e));
            }
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[test]
fn zero_pages_are_given_back_and_a_writer_during_the_merge_loses_nothing() {
    if !advm::probe::facts().pfn_visible {
        eprintln!("skipped: PFNs are hidden here (needs CAP_SYS_ADMIN): residency is read from page frames");
        return;
    }
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    // The process's own store, whatever daemon runs on this machine (set before any
    // thread starts).
    std::env::set_var("ADVM_SOCKET", "/nonexistent/advmd.sock");
    let ps = page_size();
    let words = ps / 8;

    // A: 2048 pages, the first half distinct non-zero pages, the second half written
    // and zeroed again (resident all-zero pages), marked mergeable (a flag the anonymous
    // memory that replaces them must carry too, or the mapping stays split).
    let n = 2048;
    let mut a = Region::new(n * ps).unwrap();
    let flagged = a.set_mergeable(true).is_ok();
    for (i, page) in a.bytes_mut().chunks_exact_mut(ps).enumerate() {
        page.fill(if i < n / 2 { (i % 251 + 1) as u8 } else { 0x5a });
        page[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        if i >= n / 2 {
            page.fill(0);
        }
    }
    let resident = |r: PageRange| page_frames(r).unwrap().iter().filter(|f| f.is_some()).count();
    let zero_half = PageRange::new("zero half", a.addr().0 + n / 2 * ps, n / 2 * ps).unwrap();
    assert_eq!(resident(zero_half), n / 2, "the zero half is resident before the merge");

    // C: 256 pages locked (`mlock`), the last 64 all-zero; D: 256 pages marked
    // MADV_WIPEONFORK (glibc's arc4random state is). The agent unlocked C's merged pages
    // and merged D, whose forked children then read the parent's bytes.
    let cn = 256;
    let (mut c, mut d) = (Region::new(cn * ps).unwrap(), Region::new(cn * ps).unwrap());
    for (i, (pc, pd)) in c.bytes_mut().chunks_exact_mut(ps).zip(d.bytes_mut().chunks_exact_mut(ps)).enumerate() {
        pc.fill(if i < cn - 64 { (i % 13) as u8 | 0x80 } else { 0 });
        pd.fill((i % 17) as u8 | 0x40);
        pd[..8].copy_from_slice(&(i as u64 + 7).to_le_bytes());
    }
    let (c_before, d_before) = (c.bytes().to_vec(), d.bytes().to_vec());
    // SAFETY: flags and residency of this test's own mappings; no content changes.
    unsafe {
        assert_eq!(libc::mlock(c.addr().0 as *mut libc::c_void, cn * ps), 0, "mlock");
        assert_eq!(libc::madvise(d.addr().0 as *mut libc::c_void, cn * ps, libc::MADV_WIPEONFORK), 0);
    }

    // B: 1024 pages of zeros (written, so resident), one thread writing pages 0..64 of
    // it throughout the merge; its last value per page is what must be there after.
    let bn = 1024;
    let b: Vec<AtomicU64> = (0..bn * words + words).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let written = 64;
    let (r, last) = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut last = vec![0u64; written];
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let p = (k as usize * 7) % written;
                b[p * words + words / 2].store(k, Ordering::Relaxed);
                last[p] = k;
            }
            last
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = advm::merge::agent::merge_process(1 << 20).unwrap();
        stop.store(true, Ordering::Relaxed);
        (r, w.join().unwrap())
    });
    eprintln!("{r:?}");

    // A's zero half is given back (a full chunk of it at least: the merge goes in
    // 4 MiB chunks), and reads as zeros; its first half is intact.
    assert!(r.zero_dropped >= (n / 2 + bn - written - 2) as u64, "{r:?}");
    assert_eq!(resident(zero_half), 0, "zero pages still resident after the merge: {r:?}");
    for (i, page) in a.bytes().chunks_exact(ps).enumerate() {
        if i < n / 2 {
            assert_eq!(page[..8], (i as u64 + 1).to_le_bytes(), "page {i}");
            assert!(page[8..].iter().all(|&x| x == (i % 251 + 1) as u8), "page {i}");
        } else {
            assert!(page.iter().all(|&x| x == 0), "page {i} is not zero after the merge");
        }
    }
    // One mapping again over the zero half, with the flag it had.
    let (start, end, flags) = mapping_of(zero_half.start().0 + ps);
    assert!(start <= zero_half.start().0 + ps && end >= zero_half.end().0, "{start:#x}-{end:#x} vs {zero_half:?}");
    if flagged {
        assert!(flags.split_whitespace().any(|f| f == "mg"), "the replaced zero pages lost MADV_MERGEABLE: {flags}");
    }
    // C: merged (the store's pages, mapped: 13 distinct ones), still locked, the zero
    // pages resident; D: as it was.
    let (_, _, flags) = mapping_of(c.addr().0);
    assert!(flags.split_whitespace().any(|f| f == "lo"), "C lost its lock: {flags}");
    let kinds = page_kinds(c.addr().0, cn);
    assert_eq!(kinds[..cn - 64], vec!["file"; cn - 64][..], "C's pages: the store's, mapped, not copies");
    assert_eq!(kinds[cn - 64..], vec!["anon"; 64][..], "C's zero pages stay resident");
    assert_eq!(c.bytes(), &c_before[..]);
    let (_, _, flags) = mapping_of(d.addr().0);
    assert!(flags.split_whitespace().any(|f| f == "wf"), "D is no longer wiped on fork: {flags}");
    assert_eq!(page_kinds(d.addr().0, cn), vec!["anon"; cn], "D was merged");
    assert_eq!(d.bytes(), &d_before[..]);

    // B: every write of the writer is there, and nothing else.
    for (i, w) in b.iter().enumerate() {
        let p = i / words;
        let expect = if p < written && i % words == words / 2 { last[p] } else { 0 };
        assert_eq!(w.load(Ordering::Relaxed), expect, "word {i} (page {p})");
    }
}
