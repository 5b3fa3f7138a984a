//! advm::merge in one process (its own store): content, sharing, privacy of writes,
//! fork, merging twice, refusals, the byte limit, and a writer during the merge.

use advm::mem::{page_size, PageRange, Region};
use advm::merge::{Client, MergeStats, Via};
use advm::stats::page_frames;

mod pagemap;
use pagemap::page_kinds;

fn fill(r: &mut Region, seed: u64) {
    let mut x = seed | 1;
    for c in r.bytes_mut().chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// Whether this process sees page frames (CAP_SYS_ADMIN); the tests comparing frames
/// skip, saying so, where it does not.
fn pfns_visible() -> bool {
    let visible = advm::probe::facts().pfn_visible;
    if !visible {
        eprintln!("skipped: PFNs are hidden here (needs CAP_SYS_ADMIN)");
    }
    visible
}

fn frames(r: &Region) -> Vec<Option<u64>> {
    page_frames(r.range()).unwrap()
}

fn local(limit: u64) -> Client {
    Client::local(limit, "test").unwrap()
}

fn fence_ok() -> bool {
    let ok = advm::probe::facts().uffd_features.is_some();
    if !ok {
        eprintln!("skipped: userfaultfd not available here");
    }
    ok
}

/// Pages equal to each other in one range (a buffer filled with one value) all map one
/// store page: one is added, the others are merged, and they share one frame. (They
/// were all counted as added, 64 of 64, while the store gained one page: the stats
/// hid what the merge saved.)
#[test]
fn equal_pages_in_one_range_count_one_added_and_the_rest_merged() {
    if !pfns_visible() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let mut a = Region::new(64 * ps).unwrap();
    a.bytes_mut().fill(0x5a);
    let mut b = Region::new(8 * ps).unwrap();
    fill(&mut b, 3);
    a.bytes_mut()[..8 * ps].copy_from_slice(b.bytes());
    let s = c.merge(a.bytes()).unwrap();
    assert_eq!((s.added, s.merged, s.skipped), (9, 55, 0), "8 distinct pages and one repeated 56 times: {s:?}");
    assert!(a.bytes()[8 * ps..].iter().all(|&x| x == 0x5a));
    let f = frames(&a);
    assert!(f[8..].iter().all(|x| x.is_some() && *x == f[8]), "the equal pages share one frame: {:?}", &f[8..12]);
}

#[test]
fn merged_content_is_identical_and_pages_are_shared() {
    if !pfns_visible() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let (mut a, mut b) = (Region::new(64 * ps).unwrap(), Region::new(64 * ps).unwrap());
    fill(&mut a, 7);
    fill(&mut b, 7);
    let before = b.bytes().to_vec();
    let sa = c.merge(a.bytes()).unwrap();
    assert_eq!((sa.merged, sa.added, sa.skipped, sa.refused), (0, 64, 0, 0), "{sa:?}");
    assert!(matches!(sa.via, Via::Local { .. }));
    let sb = c.merge(b.bytes()).unwrap();
    assert_eq!((sb.merged, sb.added, sb.skipped), (64, 0, 0), "{sb:?}");
    assert_eq!(b.bytes(), &before[..], "content identical byte for byte");
    assert_eq!(a.bytes(), &before[..]);
    let (fa, fb) = (frames(&a), frames(&b));
    assert!(fa.iter().all(Option::is_some), "pages present");
    assert_eq!(fa, fb, "both regions map the store's pages");
    assert_eq!(c.usage().unwrap().pages, 64, "the store holds each page once");
}

#[test]
fn partial_end_pages_and_zero_pages_are_left_alone() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let mut a = Region::new(8 * ps).unwrap();
    fill(&mut a, 3);
    a.bytes_mut()[4 * ps..5 * ps].fill(0);
    let before = a.bytes().to_vec();
    // From the middle of page 0 to the middle of page 7: pages 1..=6 are full.
    let s = c.merge(&a.bytes()[ps / 2..7 * ps + ps / 2]).unwrap();
    assert_eq!((s.added, s.skipped), (5, 3), "2 partial + 1 zero page skipped: {s:?}");
    assert_eq!(a.bytes(), &before[..]);
}

#[test]
fn writes_after_a_merge_stay_private_and_the_store_never_changes() {
    if !pfns_visible() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let (mut a, mut b) = (Region::new(16 * ps).unwrap(), Region::new(16 * ps).unwrap());
    fill(&mut a, 11);
    fill(&mut b, 11);
    let orig = a.bytes().to_vec();
    c.merge(a.bytes()).unwrap();
    c.merge(b.bytes()).unwrap();
    b.bytes_mut()[3 * ps..4 * ps].fill(0xAB);
    assert_eq!(a.bytes(), &orig[..], "a does not see b's write");
    assert!(b.bytes()[3 * ps..4 * ps].iter().all(|&x| x == 0xAB));
    assert_ne!(frames(&a)[3], frames(&b)[3], "b's written page is its own copy");
    // The store still holds the original page: a third copy merges fully.
    let mut d = Region::new(16 * ps).unwrap();
    fill(&mut d, 11);
    let s = c.merge(d.bytes()).unwrap();
    assert_eq!((s.merged, s.added), (16, 0), "{s:?}");
    assert_eq!(d.bytes(), &orig[..]);
}

#[test]
fn merging_the_same_range_twice_changes_nothing() {
    if !pfns_visible() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let mut a = Region::new(32 * ps).unwrap();
    fill(&mut a, 5);
    let orig = a.bytes().to_vec();
    let s1 = c.merge(a.bytes()).unwrap();
    let f1 = frames(&a);
    let s2 = c.merge(a.bytes()).unwrap();
    assert_eq!((s1.added, s2.merged, s2.added), (32, 32, 0));
    assert_eq!(frames(&a), f1);
    assert_eq!(a.bytes(), &orig[..]);
    assert_eq!(c.usage().unwrap().pages, 32);
}

#[test]
fn a_range_partly_unmapped_or_file_backed_or_shared_is_refused_before_any_change() {
    if !pfns_visible() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    // Below vm.mmap_min_addr (64 KiB): never mapped, unlike a range just unmapped,
    // which a test running beside this one may map again at once.
    let addr = ps;
    // SAFETY: the range is unmapped; merge only checks it and refuses.
    let e = unsafe { c.merge_raw(addr, 4 * ps) }.unwrap_err().to_string();
    assert!(e.contains("is not mapped"), "{e}");

    let f = std::fs::File::open("/proc/self/exe").unwrap();
    // SAFETY: a fresh private read-only mapping of our own executable, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * ps,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: mapped above for 4 pages.
    let e = unsafe { c.merge_raw(p as usize, 4 * ps) }.unwrap_err().to_string();
    assert!(e.contains("file-backed"), "{e}");
    // SAFETY: ours.
    unsafe { libc::munmap(p, 4 * ps) };

    // SAFETY: a fresh shared anonymous mapping, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * ps,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    // SAFETY: mapped above.
    let e = unsafe { c.merge_raw(p as usize, 2 * ps) }.unwrap_err().to_string();
    assert!(e.contains("shared mapping"), "{e}");
    // SAFETY: ours.
    unsafe { libc::munmap(p, 2 * ps) };

    // Part anonymous, part unmapped (page 4 moved away): refused, and nothing changed.
    let mut r = Region::new(8 * ps).unwrap();
    fill(&mut r, 9);
    let base = r.addr();
    r.grant().mremap_unmapping_source(base + 7 * ps, base + 4 * ps, ps).unwrap();
    let f0 = page_frames(PageRange::new("r", base.0, 4 * ps).unwrap()).unwrap();
    // SAFETY: pages 0..4 and 5..8 are ours, page 4 is unmapped; merge refuses the range.
    let e = unsafe { c.merge_raw(base.0, 8 * ps) }.unwrap_err().to_string();
    assert!(e.contains("is not mapped"), "{e}");
    assert_eq!(page_frames(PageRange::new("r", base.0, 4 * ps).unwrap()).unwrap(), f0, "nothing changed");
    assert!(f0.iter().all(Option::is_some));
}

#[test]
fn the_store_refuses_pages_past_its_byte_limit() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(4 * ps as u64);
    let mut a = Region::new(8 * ps).unwrap();
    fill(&mut a, 13);
    let orig = a.bytes().to_vec();
    let s: MergeStats = c.merge(a.bytes()).unwrap();
    assert_eq!((s.added, s.refused, s.skipped), (4, 4, 4), "{s:?}");
    let why = s.refusal.unwrap();
    assert!(why.contains("full") && why.contains(&format!("limit is {} bytes", 4 * ps)), "{why}");
    assert_eq!(a.bytes(), &orig[..]);
    let u = c.usage().unwrap();
    assert_eq!((u.pages, u.limit_bytes), (4, 4 * ps as u64));
}

#[test]
fn a_thread_writing_during_the_merge_never_loses_a_write() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let pages = 1024;
    let mut c = local(1 << 30);
    let mut twin = Region::new(pages * ps).unwrap();
    fill(&mut twin, 21);
    c.merge(twin.bytes()).unwrap();
    let mut lost = 0;
    let mut merged = 0;
    for round in 0..6u64 {
        let mut r = Region::new(pages * ps).unwrap();
        fill(&mut r, 21);
        let base = r.addr().0;
        // The writer sweeps the pages backwards while the merge compares them forwards,
        // writing word 1 of each page once: it crosses pages already compared and not
        // yet remapped, which is where an unfenced merge would drop the write.
        let writer = std::thread::spawn(move || {
            for i in (0..pages).rev() {
                let p = (base + i * ps + 8) as *mut u64;
                // SAFETY: the region outlives the thread (joined below); word 1 of each
                // page is written by this thread only and read after the join.
                unsafe { std::ptr::write_volatile(p, round * 10_000 + i as u64 + 1) };
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(20) {}
            }
        });
        // SAFETY: the region stays mapped until after the join; this thread does not
        // write it while merging.
        let s = unsafe { c.merge_raw(base, pages * ps) }.unwrap();
        merged += s.merged;
        writer.join().unwrap();
        let b = r.bytes();
        for i in 0..pages {
            let got = u64::from_le_bytes(b[i * ps + 8..i * ps + 16].try_into().unwrap());
            lost += (got != round * 10_000 + i as u64 + 1) as usize;
            assert_eq!(b[i * ps..i * ps + 8], twin.bytes()[i * ps..i * ps + 8]);
            assert_eq!(b[i * ps + 16..(i + 1) * ps], twin.bytes()[i * ps + 16..(i + 1) * ps]);
        }
    }
    assert!(merged > 0, "some pages were merged while the writer ran");
    assert_eq!(lost, 0, "writes lost");
}

/// New pages are mapped over the range batch by batch as they land in the store, so
/// the range's own pages are freed while the copy goes on: a merge that adds a whole
/// range never holds it twice. Peak anon+shmem of the merging child against the
/// range's size (mapping only at the end peaks at twice the range).
#[test]
fn adding_a_range_never_holds_it_twice() {
    use advm::stats::cgroup::Group;
    use std::time::Duration;
    if !fence_ok() {
        return;
    }
    let g = match Group::create("test-merge-peak") {
        Ok(g) => g,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    const LEN: usize = 384 << 20;
    let sampler = g.sample_every(Duration::from_millis(5));
    let reply = g
        .run_in_child(|| {
            let mut r = Region::new(LEN).map_err(|e| e.to_string())?;
            fill(&mut r, 11);
            let mut c = Client::local(1 << 30, "test").map_err(|e| e.to_string())?;
            let s = c.merge(r.bytes()).map_err(|e| e.to_string())?;
            Ok(s.added.to_le_bytes().to_vec())
        })
        .unwrap()
        .unwrap();
    let summary = sampler.stop().unwrap();
    g.remove().unwrap();
    let added = u64::from_le_bytes(reply.try_into().unwrap());
    assert_eq!(added as usize, LEN / page_size(), "every page is new to the store");
    let peak = summary.anon_shmem_bytes.max;
    eprintln!("peak anon+shmem {:.0} MiB for a {} MiB range", peak / (1 << 20) as f64, LEN >> 20);
    assert!(
        peak < LEN as f64 * 1.6,
        "peak anon+shmem {:.0} MiB for a {} MiB range: the range was held twice",
        peak / (1 << 20) as f64,
        LEN >> 20
    );
}

/// The `VmFlags` of the mapping holding `addr` (/proc/self/smaps).
fn vm_flags(addr: usize) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        // a mapping's first line starts with its range; its fields with "Name:"
        let range = line.split_whitespace().next().filter(|w| !w.ends_with(':')).and_then(|r| r.split_once('-'));
        if let Some((s, e)) = range {
            if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                inside = s <= addr && addr < e;
                continue;
            }
        }
        if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
            return flags.split_whitespace().map(String::from).collect();
        }
    }
    panic!("{addr:#x} is not mapped")
}

/// The merged pages become store mappings, which had none of the marks the program
/// set on its memory: `MADV_DONTFORK`, `MADV_DONTDUMP` and `mlock` were lost, and a
/// `MADV_WIPEONFORK` range was no longer wiped in a forked child (which read the
/// parent's bytes). The first three are set again; a wipe-on-fork range is refused.
/// The lock keeps the store's pages mapped: a plain `mlock` of the writable store
/// mapping faulted every page in for writing, a private copy of each (`Locked:` right,
/// nothing saved).
#[test]
fn a_merge_keeps_the_programs_marks_and_refuses_a_wipe_on_fork_range() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let mut c = local(1 << 30);
    let mut a = Region::new(16 * ps).unwrap();
    fill(&mut a, 61);
    let p = a.addr().0 as *mut libc::c_void;
    // SAFETY: flags and residency of our own mapping; no content changes.
    unsafe {
        assert_eq!(libc::madvise(p, 16 * ps, libc::MADV_DONTFORK), 0);
        assert_eq!(libc::madvise(p, 16 * ps, libc::MADV_DONTDUMP), 0);
        assert_eq!(libc::mlock(p, 16 * ps), 0);
    }
    let want = a.bytes().to_vec();
    let s = c.merge(a.bytes()).unwrap();
    assert_eq!(s.added, 16);
    let flags = vm_flags(a.addr().0 + 3 * ps);
    for f in ["dc", "dd", "lo"] {
        assert!(flags.contains(&f.to_string()), "{f} lost: {flags:?}");
    }
    assert_eq!(page_kinds(a.addr().0, 16), vec!["file"; 16], "the locked pages are the store's, mapped, not copies");
    assert_eq!(a.bytes(), &want[..]);

    let mut w = Region::new(4 * ps).unwrap();
    fill(&mut w, 62);
    let before = w.bytes().to_vec();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::madvise(w.addr().0 as *mut libc::c_void, 4 * ps, libc::MADV_WIPEONFORK) }, 0);
    let e = c.merge(w.bytes()).unwrap_err().to_string();
    assert!(e.contains("is marked MADV_WIPEONFORK, which a merged page (a store mapping) cannot keep"), "{e}");
    assert_eq!(w.bytes(), &before[..]);
    assert!(vm_flags(w.addr().0).contains(&"wf".to_string()), "the refused range is left as it was");
}

mod umode;

/// Where the only userfaultfd is the user-mode-only kind, a merge is refused before
/// any change (NeedsPrivilege, EPERM from C), naming the fix. Its fence was made of that kind, and
/// another thread's `recv` into the range being merged failed with EFAULT instead of
/// waiting for the merge.
#[test]
fn a_user_mode_only_userfaultfd_is_refused_naming_the_fix() {
    if !umode::body_runs_here("a_user_mode_only_userfaultfd_is_refused_naming_the_fix") {
        return;
    }
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let pages = 256;
    let mut r = Region::new(pages * page_size()).unwrap();
    fill(&mut r, 3);
    let addr = r.bytes().as_ptr() as usize;
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut efaults = 0;
            let mut k = 0usize;
            while !done.load(Ordering::Acquire) {
                k += 1;
                a.write_all(&[k as u8; 8]).unwrap();
                let at = (k * 4099) % (pages * page_size() - 8);
                // SAFETY: 8 bytes of the region, which lives until this thread is
                // joined; only the kernel writes them, for this thread.
                let dst = unsafe { std::slice::from_raw_parts_mut((addr + at) as *mut u8, 8) };
                match b.read(dst) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                        efaults += 1;
                        let mut lost = [0; 8];
                        b.read_exact(&mut lost).unwrap();
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            efaults
        })
    };
    let mut c = local(1 << 30);
    let t0 = std::time::Instant::now();
    let mut outcome = Ok(0);
    while t0.elapsed() < std::time::Duration::from_millis(300) {
        // SAFETY: the region stays mapped; this thread does not write it meanwhile.
        match unsafe { c.merge_raw(addr, pages * page_size()) } {
            Ok(s) => outcome = Ok(outcome.unwrap() + s.merged + s.added),
            Err(e) => {
                outcome = Err(e.to_string());
                break;
            }
        }
    }
    done.store(true, Ordering::Release);
    let efaults = reader.join().unwrap();
    let msg = outcome.expect_err(&format!("merged, and the reader's recv got EFAULT {efaults} times"));
    for says in ["merging", "EPERM", "vm.unprivileged_userfaultfd is 0", "/dev/userfaultfd", "uid 65534"] {
        assert!(msg.contains(says), "{msg}");
    }
    assert_eq!(efaults, 0);
}
