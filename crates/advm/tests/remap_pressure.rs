//! advm::remap under real memory pressure: ranges partly swapped out (MADV_PAGEOUT to a
//! swap file this test enables), partly transparent huge pages (collapsed with
//! MADV_COLLAPSE, split by unaligned moves), partly KSM-merged (ksmd scanning while
//! operations run), partly never touched, checked against a byte oracle. Needs root
//! and swap: skips with the reason otherwise.

use advm::mem::HostAddr;
use advm::remap::{self, Choice, Engine, Options, PMD_SIZE};

mod pressure;
use pressure::*;

#[test]
fn moves_and_swaps_of_swapped_out_huge_and_merged_pages_keep_every_byte() {
    let Some(_pressure) = pressure("ops") else { return };
    let len = 16 << 20;
    let m = Raw::anon(len);
    // Whole-mapping advice: per-run advice would split it into VMAs too small to collapse.
    assert_eq!(m.madvise(0, len, libc::MADV_MERGEABLE), 0);
    assert_eq!(m.madvise(0, len, libc::MADV_HUGEPAGE), 0);
    let mut model = vec![0u8; len];
    let seed = std::env::var("RPRESS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_1234_abcd_0001);
    let mut rng = Rng(seed);
    shape(&m, &mut model, 0, len, &mut rng);
    let (swapped, merged) = (status_kib("VmSwap:"), wait_merged());
    eprintln!("swapped out {swapped} KiB, KSM-merged {merged} pages, THP {} KiB", status_kib("AnonHugePages:"));
    assert!(swapped > 0, "MADV_PAGEOUT swapped nothing out");
    check(&m, &model, "after shaping");
    let rounds = std::env::var("RPRESS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    let total = fuzz(&m, &mut model, &mut rng, rounds, true);
    eprintln!("{total:?}");
    assert!(total.uffd_move_bytes + total.mremap_bytes > 0, "no page engine ran: {total:?}");
}

#[test]
fn a_move_of_swapped_out_pages_moves_their_swap_entries() {
    let Some(_pressure) = pressure("probe") else { return };
    if !remap::uffd_move_available() {
        eprintln!("skipped: no UFFDIO_MOVE here");
        return;
    }
    let ps = ps();
    let len = 8 << 20;
    let m = Raw::anon(len);
    let o = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), ..Options::default() };
    // swapped out
    for (i, b) in m.bytes_mut()[..512 * ps].iter_mut().enumerate() {
        *b = (i / 7) as u8 | 1;
    }
    let want = m.bytes()[..512 * ps].to_vec();
    assert_eq!(m.madvise(0, 512 * ps, MADV_PAGEOUT), 0);
    assert!(status_kib("VmSwap:") >= 512 * ps as u64 / 1024 / 2, "pageout left pages in memory");
    let out = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 4 * PMD_SIZE - 600 * ps),
        HostAddr(m.addr),
        512 * ps,
        &o,
    )
    .unwrap();
    assert_eq!(out.fallback_bytes, 0, "{out:?}");
    assert_eq!(&m.bytes()[4 * PMD_SIZE - 600 * ps..][..512 * ps], &want[..]);
}

fn filled(len: usize, seed: u8) -> Raw {
    let m = Raw::anon(len);
    for (i, w) in m.bytes_mut().chunks_mut(8).enumerate() {
        w.copy_from_slice(&((i as u64) << 8 | seed as u64).to_le_bytes());
    }
    m
}

#[test]
fn moves_into_swapped_out_mlocked_and_foreign_userfaultfd_destinations_and_from_mlocked_sources_complete() {
    let Some(_pressure) = pressure("probed") else { return };
    let ps = ps();
    for engine in [Choice::Only(Engine::UffdMove), Choice::Only(Engine::Memmove), Choice::Auto] {
        if engine == Choice::Only(Engine::UffdMove) && !remap::uffd_move_available() {
            continue;
        }
        for n in [4 * ps, 64 * ps, PMD_SIZE] {
            let o = Options { engine, break_even_pages: Some(8), ..Options::default() };
            // swapped-out destination
            let m = filled(4 * PMD_SIZE, 1);
            let want = m.bytes()[..n].to_vec();
            m.madvise(2 * PMD_SIZE, PMD_SIZE, MADV_PAGEOUT);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} swapped-out dst: {e}"));
            assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            // mlocked destination
            let m = filled(4 * PMD_SIZE, 2);
            let want = m.bytes()[..n].to_vec();
            // SAFETY: locks part of our own mapping.
            assert_eq!(unsafe { libc::mlock((m.addr + 2 * PMD_SIZE) as *const libc::c_void, PMD_SIZE) }, 0);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            let out = r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} mlocked dst: {e}"));
            // UFFDIO_MOVE refuses a locked destination: copied after one registration
            // and one retry, not after 16 (34 calls)
            assert!(out.syscalls <= 6, "{engine:?} {n:#x} mlocked dst: {out:?}");
            {
                assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            }
            // mlocked source
            let m = filled(4 * PMD_SIZE, 3);
            let want = m.bytes()[..n].to_vec();
            // SAFETY: locks part of our own mapping.
            assert_eq!(unsafe { libc::mlock(m.addr as *const libc::c_void, PMD_SIZE) }, 0);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            let out = r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} mlocked src: {e}"));
            assert!(out.syscalls <= 8, "{engine:?} {n:#x} mlocked src: {out:?}");
            {
                assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            }
            // destination registered (missing mode) on someone else's userfaultfd
            let m = filled(4 * PMD_SIZE, 4);
            let want = m.bytes()[..n].to_vec();
            m.madvise(2 * PMD_SIZE, PMD_SIZE, libc::MADV_DONTNEED);
            let fd = foreign_uffd(m.addr + 2 * PMD_SIZE, PMD_SIZE);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let server = serve_zero_pages(fd, stop.clone());
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let served = server.join().unwrap();
            r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} foreign-uffd dst ({served} faults served): {e}"));
            assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
        }
    }
}

/// Serves missing faults on `fd` with zero pages until `stop`; returns how many.
fn serve_zero_pages(fd: i32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut served = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let mut msg = [0u64; 4];
            // SAFETY: reads one 32-byte uffd_msg into our buffer.
            let r = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), 32) };
            if r != 32 {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            if msg[0] & 0xff == 0x12 {
                let page = msg[2] & !(ps() as u64 - 1);
                let mut zp = [page, ps() as u64, 0, 0];
                // SAFETY: UFFDIO_ZEROPAGE with a correctly sized struct.
                unsafe { libc::ioctl(fd, 0xc020aa04, zp.as_mut_ptr()) };
                served += 1;
            }
        }
        served
    })
}

/// A userfaultfd of the test's own with `[addr, addr+len)` registered in missing mode.
fn foreign_uffd(addr: usize, len: usize) -> i32 {
    // SAFETY: plain syscalls and ioctls on a fresh fd with correctly sized structs.
    unsafe {
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32;
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        let mut api = [0xAAu64, 0, 0];
        assert_eq!(libc::ioctl(fd, 0xc018aa3f, api.as_mut_ptr()), 0);
        let mut reg = [addr as u64, len as u64, 1, 0];
        assert_eq!(libc::ioctl(fd, 0xc020aa00, reg.as_mut_ptr()), 0, "{}", std::io::Error::last_os_error());
        fd
    }
}

/// A move out of a range spanning a private file view and anonymous memory is copied
/// (neither page engine takes it whole); the copied source must then read as zeros or
/// its old bytes, never as the file's bytes again (it did: the copied source was emptied
/// with MADV_DONTNEED, which makes a private file view show the file).
#[test]
fn a_copied_move_out_of_a_private_file_view_never_shows_the_file_again() {
    let ps = ps();
    let file = std::path::PathBuf::from(format!("/tmp/rpress-file2-{}", std::process::id()));
    std::fs::write(&file, vec![0x77u8; 8 << 20]).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let _ = std::fs::remove_file(&file); // mappings keep the file's pages
    let engines = [Choice::Auto, Choice::Only(Engine::Mremap), Choice::Only(Engine::UffdMove)];
    for engine in engines {
        for (from, n) in [(6 << 20, 4 << 20), ((8 << 20) - 4 * ps, 8 * ps), (14 << 20, 4 << 20)] {
            let m = Raw::anon(24 << 20);
            use std::os::fd::AsRawFd;
            // SAFETY: replaces the middle of our own mapping with a private view of the file.
            let p = unsafe {
                libc::mmap(
                    (m.addr + (8 << 20)) as *mut libc::c_void,
                    8 << 20,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            m.bytes_mut()[from..from + n].fill(5); // private copies of the file's pages
            let o = Options { engine, break_even_pages: Some(0), ..Options::default() };
            let what = format!("{engine:?} move of {n:#x} from {from:#x}");
            match remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + (20 << 20)), HostAddr(m.addr + from), n, &o)
            {
                Ok(_) => {}
                Err(e) if engine == Choice::Only(Engine::UffdMove) => {
                    // the engine's refusal names the memory, not the kernel
                    assert!(matches!(e, advm::Error::InvalidArgument { what: "engine", .. }), "{what}: {e}");
                    assert!(e.to_string().contains("file-backed"), "{what}: {e}");
                    continue;
                }
                Err(e) => panic!("{what}: {e}"),
            }
            assert!(m.bytes()[20 << 20..][..n].iter().all(|&b| b == 5), "{what}: destination");
            if let Some(i) = m.bytes()[from..from + n].iter().position(|&b| b != 0 && b != 5) {
                panic!("{what}: source byte {:#x} reads {:#x} (the file's)", from + i, m.bytes()[from + i]);
            }
        }
    }
}
