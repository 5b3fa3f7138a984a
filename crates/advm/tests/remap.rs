//! advm::remap on memory it does not own: raw addresses from mmap (the C API's case),
//! memfd mappings, pages shared copy-on-write with a child, read-only and unmapped
//! ranges, transparent huge pages, and a thread reading while pages move.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use advm::mem::{Grant, HostAddr, PageRange, Region};
use advm::remap::{self, Choice, Engine, Options, PMD_SIZE};

fn ps() -> usize {
    advm::addr::page_size()
}

/// A raw private anonymous mapping, unmapped on drop.
struct Raw {
    addr: usize,
    len: usize,
}

impl Raw {
    fn new(len: usize, flags: i32, fd: i32) -> Raw {
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        Raw { addr: p as usize, len }
    }
    fn anon(len: usize) -> Raw {
        Raw::new(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }
    fn grant(&self) -> Grant<'static> {
        // SAFETY: the test owns the mapping and reads it only between operations.
        unsafe { Grant::for_caller_memory(PageRange::new("grant", self.addr, self.len).unwrap()) }.unwrap()
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped read-write for the test's life; no operation runs meanwhile.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as above; the test holds one slice at a time.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

fn only(engine: Engine) -> Options {
    Options { engine: Choice::Only(engine), break_even_pages: Some(0), ..Options::default() }
}

#[test]
fn raw_anonymous_memory_moves_by_page_table() {
    let ps = ps();
    let m = Raw::anon(64 * ps);
    m.bytes_mut()[..16 * ps].fill(5);
    let out = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 32 * ps),
        HostAddr(m.addr),
        16 * ps,
        &Options { break_even_pages: Some(1), ..Options::default() },
    )
    .unwrap();
    assert!(m.bytes()[32 * ps..48 * ps].iter().all(|&b| b == 5));
    if remap::uffd_move_available() {
        // The first move registers the whole mapping for UFFDIO_MOVE, then moves.
        assert_eq!(out.engine(), Some(Engine::UffdMove), "{out:?}");
        assert!(m.bytes()[..16 * ps].iter().all(|&b| b == 0));
    }
}

#[test]
fn read_only_and_unmapped_ranges_are_refused_before_anything_changes() {
    let ps = ps();
    let m = Raw::anon(8 * ps);
    m.bytes_mut().fill(9);
    // SAFETY: our mapping; page 5 becomes read-only.
    assert_eq!(unsafe { libc::mprotect((m.addr + 5 * ps) as *mut libc::c_void, ps, libc::PROT_READ) }, 0);
    let e =
        remap::move_pages(&mut m.grant(), HostAddr(m.addr + 4 * ps), HostAddr(m.addr), 2 * ps).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "invalid dst: range {:#x}+{:#x}: mapping {:#x}-{:#x} is r--p, not read-write",
            m.addr + 4 * ps,
            2 * ps,
            m.addr + 5 * ps,
            m.addr + 6 * ps
        )
    );
    // SAFETY: our mapping; page 7 goes away.
    assert_eq!(unsafe { libc::munmap((m.addr + 7 * ps) as *mut libc::c_void, ps) }, 0);
    let e =
        remap::swap_pages(&mut m.grant(), HostAddr(m.addr), HostAddr(m.addr + 6 * ps), 2 * ps).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("invalid b: range {:#x}+{:#x}: address {:#x} is not mapped", m.addr + 6 * ps, 2 * ps, m.addr + 7 * ps)
    );
    assert!(m.bytes()[..7 * ps].iter().all(|&b| b == 9), "memory changed");
    // SAFETY: restore so Drop's munmap covers mapped pages only in a well-defined way.
    unsafe { libc::mprotect((m.addr + 5 * ps) as *mut libc::c_void, ps, libc::PROT_READ | libc::PROT_WRITE) };
}

fn memfd(len: usize) -> i32 {
    // SAFETY: plain syscalls on a fresh fd.
    unsafe {
        let fd = libc::memfd_create(c"advm-remap-test".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len as i64), 0);
        fd
    }
}

#[test]
fn shared_memfd_memory_is_copied_so_every_sharer_sees_the_move() {
    let ps = ps();
    let fd = memfd(8 * ps);
    let m = Raw::new(8 * ps, libc::MAP_SHARED, fd);
    m.bytes_mut()[..2 * ps].fill(4);
    let out = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 4 * ps),
        HostAddr(m.addr),
        2 * ps,
        &Options { break_even_pages: Some(0), ..Options::default() },
    )
    .unwrap();
    assert_eq!(out.engine(), Some(Engine::Memmove));
    let mut buf = vec![0u8; ps];
    // SAFETY: reading the file into our buffer.
    assert_eq!(unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), ps, (4 * ps) as i64) }, ps as isize);
    assert!(buf.iter().all(|&b| b == 4), "the file itself holds the moved bytes");
    let e = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 4 * ps),
        HostAddr(m.addr),
        2 * ps,
        &only(Engine::UffdMove),
    );
    assert!(e.unwrap_err().to_string().contains("moves only private anonymous memory"));
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
}

fn pfn(addr: usize) -> Option<u64> {
    let page = PageRange::new("page", addr, ps()).unwrap();
    advm::stats::page_frames(page).unwrap()[0]
}

#[test]
fn private_memfd_views_move_with_mremap_and_keep_sharing_the_file_pages() {
    let ps = ps();
    let fd = memfd(4 * ps);
    let shared = Raw::new(4 * ps, libc::MAP_SHARED, fd);
    shared.bytes_mut().fill(6);
    let view = Raw::new(4 * ps, libc::MAP_PRIVATE, fd);
    let dst = Raw::anon(4 * ps);
    let _ = view.bytes()[0]; // map the first file page read-only (copy-on-write)
                             // One grant over both mappings: take the span from the lower to the higher.
    let (lo, hi) = (view.addr.min(dst.addr), (view.addr + view.len).max(dst.addr + dst.len));
    // SAFETY: both mappings are the test's; nothing else lies in between that we touch
    // (operations only touch the ranges they are given).
    let mut g = unsafe { Grant::for_caller_memory(PageRange::new("grant", lo, hi - lo).unwrap()) }.unwrap();
    let out = remap::move_pages_with(
        &mut g,
        HostAddr(dst.addr),
        HostAddr(view.addr),
        4 * ps,
        &Options { break_even_pages: Some(0), ..Options::default() },
    )
    .unwrap();
    assert_eq!(out.engine(), Some(Engine::Mremap));
    assert!(dst.bytes().iter().all(|&b| b == 6));
    assert!(view.bytes().iter().all(|&b| b == 0), "the vacated view is fresh anonymous memory");
    if advm::probe::facts().pfn_visible {
        assert_eq!(pfn(dst.addr), pfn(shared.addr), "the moved page still shares the file page");
        assert!(pfn(dst.addr).is_some());
    } else {
        eprintln!("skipped the PFN check: PFNs are hidden here (not root)");
    }
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
}

#[test]
fn pages_shared_copy_on_write_with_a_child_are_copied_not_lost() {
    if !remap::uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = ps();
    let m = Raw::anon(32 * ps);
    m.bytes_mut().fill(8);
    // SAFETY: the child only sleeps until it is killed (async-signal-safe calls only).
    let child = unsafe { libc::fork() };
    if child == 0 {
        loop {
            // SAFETY: pause is async-signal-safe.
            unsafe { libc::pause() };
        }
    }
    assert!(child > 0);
    let out = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 16 * ps),
        HostAddr(m.addr),
        16 * ps,
        &only(Engine::UffdMove),
    );
    // SAFETY: our child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    let out = out.unwrap();
    assert_eq!(out.fallback_bytes, 16 * ps, "UFFDIO_MOVE refuses COW-shared pages (EBUSY): {out:?}");
    assert!(m.bytes()[16 * ps..].iter().all(|&b| b == 8));
    assert!(m.bytes()[..16 * ps].iter().all(|&b| b == 0), "the copied source was emptied like a moved one");
}

fn anon_huge_kib(start: usize, end: usize) -> u64 {
    smaps_kib("AnonHugePages:", start, end)
}

/// The sum of an smaps field (in KiB) over the mappings overlapping `[start, end)`.
fn smaps_kib(field: &str, start: usize, end: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut total = 0;
    for l in smaps.lines() {
        if let Some((range, _)) = l.split_once(' ') {
            if let Some((s, e)) = range.split_once('-') {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                    inside = s < end && e > start;
                    continue;
                }
            }
        }
        if inside && l.starts_with(field) {
            total += l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

#[test]
fn transparent_huge_pages_move_whole_when_aligned() {
    if advm::probe::facts().thp_enabled == "never" || !remap::uffd_move_available() {
        eprintln!("skipped: THP disabled or UFFDIO_MOVE missing");
        return;
    }
    let mut r = Region::for_remap_with_huge_pages(4 * PMD_SIZE).unwrap();
    r.bytes_mut()[..PMD_SIZE].fill(2);
    let (s, e) = (r.addr().0, r.addr().0 + r.len());
    if anon_huge_kib(s, e) == 0 {
        eprintln!("skipped: the kernel gave no huge page (fragmented memory?)");
        return;
    }
    // Aligned: the PMD moves whole, the huge page stays huge.
    let out = r.move_pages_with(2 * PMD_SIZE, 0, PMD_SIZE, &only(Engine::UffdMove)).unwrap();
    assert_eq!(out.uffd_move_bytes, PMD_SIZE);
    assert!(r.bytes()[2 * PMD_SIZE..3 * PMD_SIZE].iter().all(|&b| b == 2));
    assert_eq!(anon_huge_kib(s, e), 2048, "still one huge page after an aligned move");
    // Unaligned by one page: the huge page is split and moved page by page.
    let ps = ps();
    let out = r.move_pages_with(ps, 2 * PMD_SIZE, PMD_SIZE, &only(Engine::UffdMove)).unwrap();
    assert_eq!(out.uffd_move_bytes, PMD_SIZE);
    assert!(r.bytes()[ps..ps + PMD_SIZE].iter().all(|&b| b == 2));
    assert_eq!(anon_huge_kib(s, e), 0, "split by an unaligned move");
}

/// A move onto itself changes nothing and costs nothing (it used to be memmoved), with
/// every engine, alone or in a batch.
#[test]
fn a_move_onto_itself_does_nothing() {
    let ps = ps();
    let m = Raw::anon(16 * ps);
    for (i, b) in m.bytes_mut().iter_mut().enumerate() {
        *b = (i / ps) as u8 + 1;
    }
    let want = m.bytes().to_vec();
    for e in Engine::ALL {
        let out = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr), HostAddr(m.addr), 8 * ps, &only(e)).unwrap();
        assert_eq!(
            (out.merged_ops, out.syscalls, out.memmove_bytes, out.completed_ops),
            (0, 0, 0, 1),
            "{e:?}: {out:?}"
        );
        assert_eq!(m.bytes(), &want[..], "{e:?}");
    }
    let mut b = remap::Batch::new();
    b.push_move(HostAddr(m.addr), HostAddr(m.addr), 4 * ps);
    b.push_move(HostAddr(m.addr + 8 * ps), HostAddr(m.addr + 12 * ps), 4 * ps);
    let out = b.execute(&mut m.grant()).unwrap();
    assert_eq!((out.merged_ops, out.completed_ops), (1, 2), "{out:?}");
    assert_eq!(&m.bytes()[..8 * ps], &want[..8 * ps]);
    assert_eq!(&m.bytes()[8 * ps..12 * ps], &want[12 * ps..]);
}

/// docs/remap.md: an `mremap` move takes the source's mapping, lock included, while a
/// copy leaves each address's lock where it was.
#[test]
fn an_mremap_move_carries_the_sources_lock_to_the_destination() {
    let mut r = Region::for_remap_with_huge_pages(4 * PMD_SIZE).unwrap();
    r.bytes_mut()[..PMD_SIZE].fill(3);
    let (s, e) = (r.addr().0, r.addr().0 + r.len());
    // SAFETY: locks part of the test's own region.
    if unsafe { libc::mlock(s as *const libc::c_void, PMD_SIZE) } != 0 {
        eprintln!("skipped: mlock of 2 MiB refused (RLIMIT_MEMLOCK)");
        return;
    }
    let out = r.move_pages_with(2 * PMD_SIZE, 0, PMD_SIZE, &only(Engine::Mremap)).unwrap();
    assert_eq!(out.mremap_bytes, PMD_SIZE, "{out:?}");
    assert!(r.bytes()[2 * PMD_SIZE..3 * PMD_SIZE].iter().all(|&b| b == 3));
    let (d, d_end) = (s + 2 * PMD_SIZE, s + 3 * PMD_SIZE);
    assert_eq!(smaps_kib("Locked:", d, d_end), 2048, "the destination is locked now");
    assert_eq!(smaps_kib("Locked:", s, s + PMD_SIZE), 0, "the source is not");
    // SAFETY: unlocks the test's own region.
    unsafe { libc::munlock(s as *const libc::c_void, e - s) };
}

#[test]
fn a_thread_reading_the_destination_sees_old_zero_or_new_per_page_never_garbage() {
    if !remap::uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = ps();
    let pages = 16;
    let m = Raw::anon(2 * pages * ps);
    let (dst, src) = (m.addr, m.addr + pages * ps);
    const OLD: u64 = 0x1111_1111_1111_1111;
    const NEW: u64 = 0x2222_2222_2222_2222;
    let word = |a: usize| {
        // SAFETY: an aligned address inside our mapping, which stays mapped; AtomicU64
        // makes concurrent access well defined.
        unsafe { &*(a as *const AtomicU64) }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, bad, reads) = (stop.clone(), bad.clone(), reads.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for p in 0..pages {
                    let first = word(dst + p * ps).load(Ordering::Relaxed);
                    let last = word(dst + p * ps + ps - 8).load(Ordering::Relaxed);
                    for v in [first, last] {
                        if v != OLD && v != NEW && v != 0 {
                            bad.store(v, Ordering::Relaxed);
                        }
                    }
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut failures, mut fallbacks) = (Vec::new(), 0);
    for _ in 0..300 {
        for p in 0..pages {
            for w in (0..ps).step_by(8) {
                word(dst + p * ps + w).store(OLD, Ordering::Relaxed);
                word(src + p * ps + w).store(NEW, Ordering::Relaxed);
            }
        }
        let out =
            remap::move_pages_with(&mut m.grant(), HostAddr(dst), HostAddr(src), pages * ps, &only(Engine::UffdMove));
        let ok = out.as_ref().is_ok_and(|o| o.uffd_move_bytes + o.memmove_bytes == pages * ps);
        let moved = (0..pages).all(|p| word(dst + p * ps).load(Ordering::Relaxed) == NEW);
        if !ok || !moved {
            failures.push(format!("{out:?}, contents moved: {moved}"));
        }
        fallbacks += out.map_or(0, |o| o.fallback_bytes);
    }
    // Stop and join the reader before any assertion can unmap its memory.
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    eprintln!(
        "{} reads; {fallbacks} bytes copied because the reader refilled a destination",
        reads.load(Ordering::Relaxed)
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "a reader saw a value that was never written: {:#x}",
        bad.load(Ordering::Relaxed)
    );
    assert!(reads.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_grant_describes_its_mappings_and_forgets_them_after_a_change() {
    let ps = ps();
    let m = Raw::anon(8 * ps);
    let mut g = m.grant();
    let v = g.mapping_at(HostAddr(m.addr + ps)).unwrap().expect("mapped");
    assert!(v.start.0 <= m.addr && v.end.0 >= m.addr + 8 * ps, "{v:?}");
    assert!(v.readable && v.writable && !v.shared && !v.file_backed, "{v:?}");
    assert_eq!(g.mapping_at(HostAddr(ps)).unwrap(), None, "page 1 is never mapped");
    // A change through the grant drops what it looked up: the next lookup sees the
    // hole the bare remap leaves at its source.
    g.mremap_unmapping_source(HostAddr(m.addr), HostAddr(m.addr + 4 * ps), 4 * ps).unwrap();
    assert_eq!(g.mapping_at(HostAddr(m.addr + 4 * ps)).unwrap(), None);
    g.map_fresh(PageRange::new("src", m.addr + 4 * ps, 4 * ps).unwrap()).unwrap();
}
