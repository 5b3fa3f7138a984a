//! A trim lets go of the store pages a process no longer maps, and of no other: not
//! while a forked child maps them, not after the merged range moved (`mremap`) or was
//! written, and then, once nothing maps them, they are punched out of the in-process
//! store. (Alone in its test binary, so the forks happen with no other test thread
//! running.)

use advm::mem::{page_size, Region};
use advm::merge::Client;

/// `pages` pages that differ from one another and from other seeds'.
fn distinct(pages: usize, seed: u64) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i as u64 ^ seed << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
    }
    r
}

fn pipe() -> [i32; 2] {
    let mut p = [0; 2];
    // SAFETY: a pipe; its fds are ours.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    p
}

fn wait(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: our child; waitpid writes one int.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// A trim reads the maps of the client's process and of the processes of its uid
/// started since: one that cannot be told (a client in another pid namespace, pid 0)
/// fails the look rather than counting as mapping nothing.
fn the_processes_that_may_map_the_pages_must_be_readable() {
    use advm::process::{boot_ticks, each_process_maps_of, Mappers};
    let uid = advm::process::euid();
    let unknown = Mappers { pid: 0, uid, since_ticks: 0 };
    assert!(each_process_maps_of(unknown, |_| {}).is_err());
    let me = Mappers { pid: std::process::id(), uid, since_ticks: boot_ticks().unwrap() };
    let mut read = 0;
    assert_eq!(each_process_maps_of(me, |_| read += 1).unwrap(), Vec::<u32>::new());
    assert!(read >= 1, "this process's own maps were read");
}

#[test]
fn a_trim_releases_only_pages_no_process_maps() {
    the_processes_that_may_map_the_pages_must_be_readable();
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    const N: usize = 32;
    let ps = page_size();
    let mut c = Client::local(64 << 20, "test").unwrap();

    // Merged, then forked; the parent unmaps its copy: the child's keeps the pages.
    let buf = distinct(N, 1);
    let want = buf.bytes().to_vec();
    assert_eq!(c.merge(buf.bytes()).unwrap().added, N as u64);
    assert_eq!(c.usage().unwrap().pages, N as u64);
    let go = pipe();
    // SAFETY: the child waits, checks its bytes and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut b = [0u8];
        // SAFETY: a byte from our pipe into our stack.
        unsafe { libc::read(go[0], b.as_mut_ptr().cast(), 1) };
        let code = if buf.bytes() == &want[..] { 0 } else { 1 };
        // SAFETY: leave without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    drop(buf);
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (0, N as u64), "the child maps every page");
    assert_eq!(c.usage().unwrap().pages, N as u64);
    // SAFETY: a byte from our stack to our pipe.
    assert_eq!(unsafe { libc::write(go[1], [1u8].as_ptr().cast(), 1) }, 1);
    assert_eq!(wait(child), 0, "the child read other bytes than were merged");
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (N as u64, 0), "nobody maps them now");
    assert_eq!(c.usage().unwrap().pages, 0);

    // Merged, moved, written: still mapped, so kept; MADV_DONTNEED reads them again.
    let mut buf = distinct(N, 2);
    let want = buf.bytes().to_vec();
    assert_eq!(c.merge(buf.bytes()).unwrap().added, N as u64);
    let len = N * ps;
    // SAFETY: a new address range of our own, then the merged range moved onto it
    // (the region's own range is gone after the move: forgotten, never unmapped twice).
    let moved = unsafe {
        let to = libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        assert_ne!(to, libc::MAP_FAILED);
        let from = buf.bytes_mut().as_mut_ptr().cast();
        let m = libc::mremap(from, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to);
        assert_eq!(m, to, "mremap: {}", std::io::Error::last_os_error());
        std::mem::forget(buf);
        std::slice::from_raw_parts_mut(m.cast::<u8>(), len)
    };
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (0, N as u64), "the moved range maps every page");
    assert!(moved == &want[..]);
    moved.fill(7);
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (0, N as u64), "written pages are still covered by their mapping");
    // SAFETY: our mapping; MADV_DONTNEED drops the private copies.
    assert_eq!(unsafe { libc::madvise(moved.as_mut_ptr().cast(), len, libc::MADV_DONTNEED) }, 0);
    assert!(moved == &want[..], "a private file mapping reads the store's page again");
    // SAFETY: our mapping, unmapped once; not used after.
    assert_eq!(unsafe { libc::munmap(moved.as_mut_ptr().cast(), len) }, 0);
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (N as u64, 0));
    assert_eq!(c.usage().unwrap().pages, 0);

    // Half unmapped: half released, the rest still reads right; a new merge reuses the
    // punched slots.
    let buf = distinct(N, 3);
    let want = buf.bytes().to_vec();
    assert_eq!(c.merge(buf.bytes()).unwrap().added, N as u64);
    // SAFETY: the region's upper half, unmapped once; only the lower half is read after.
    assert_eq!(unsafe { libc::munmap(buf.bytes().as_ptr().add(len / 2) as *mut _, len / 2) }, 0);
    let t = c.trim().unwrap();
    assert_eq!((t.released, t.kept), (N as u64 / 2, N as u64 / 2));
    assert_eq!(buf.bytes()[..len / 2], want[..len / 2]);
    let again = distinct(N, 4);
    let want4 = again.bytes().to_vec();
    assert_eq!(c.merge(again.bytes()).unwrap().added, N as u64);
    assert_eq!(c.usage().unwrap().pages, N as u64 + N as u64 / 2);
    assert!(again.bytes() == &want4[..] && buf.bytes()[..len / 2] == want[..len / 2]);
    // SAFETY: the lower half, unmapped once; the region is forgotten, never dropped.
    assert_eq!(unsafe { libc::munmap(buf.bytes().as_ptr() as *mut _, len / 2) }, 0);
    std::mem::forget(buf);
}
