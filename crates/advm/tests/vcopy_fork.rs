//! Fork isolation: after fork, parent and child never see each other's writes to
//! arena blocks, whether a block was shared (single owner) or a virtual copy.
//! One test in its own binary: fork from a process with few threads.

use advm::vcopy::{Arena, Config};

#[test]
fn parent_and_child_do_not_see_each_others_writes() {
    let ps = advm::addr::page_size();
    let a = Arena::with_config(Config::default().reserve_bytes(1 << 30)).unwrap();
    let len = 8 * ps;
    let owned = a.alloc(len).unwrap(); // single owner: MAP_SHARED before the fork
    a.fill(owned, 1, len).unwrap();
    let copy = a.dup(owned, len).unwrap(); // now both private views
    let solo = a.alloc(len).unwrap();
    a.fill(solo, 2, len).unwrap();
    // a large copy right before the fork leaves a moved-aside mapping for the reaper;
    // the fork handler unmaps it itself
    let big_len = 4 << 20;
    let big = a.alloc(big_len).unwrap();
    a.fill(big, 3, big_len).unwrap();
    let big_copy = a.dup(big, big_len).unwrap();
    let rd = unsafe_pipe();
    // SAFETY: fork; the child only uses the arena and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // child: write everything, then wait for the parent's writes and check
        let ok = (|| -> advm::Result<bool> {
            a.fill(solo, 0xc, ps)?;
            a.fill(copy, 0xc, ps)?;
            // new allocations in the child use a fresh memfd
            let mine = a.alloc(len)?;
            a.fill(mine, 0xd, len)?;
            a.free(mine)?;
            wait_byte(rd.0);
            let mut b = vec![0u8; len];
            a.read(solo, &mut b)?;
            let solo_ok = b[..ps].iter().all(|&x| x == 0xc) && b[ps..].iter().all(|&x| x == 2);
            a.read(owned, &mut b)?;
            let owned_ok = b.iter().all(|&x| x == 1);
            a.read(copy, &mut b)?;
            let copy_ok = b[..ps].iter().all(|&x| x == 0xc) && b[ps..].iter().all(|&x| x == 1);
            a.fill(big_copy, 0xc, ps)?;
            let mut bb = vec![0u8; big_len];
            a.read(big, &mut bb)?;
            let big_ok = bb.iter().all(|&x| x == 3);
            Ok(solo_ok && owned_ok && copy_ok && big_ok)
        })();
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    // parent: write after the child's writes are (possibly) done, then let it check
    a.fill(solo, 0xa, 2 * ps).unwrap();
    a.fill(owned, 0xa, ps).unwrap();
    let fresh = a.alloc(len).unwrap();
    a.fill(fresh, 0xb, len).unwrap();
    a.free(fresh).unwrap();
    signal_byte(rd.1);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child saw the parent's writes (status {status})"
    );
    let mut b = vec![0u8; len];
    a.read(solo, &mut b).unwrap();
    assert!(
        b[..2 * ps].iter().all(|&x| x == 0xa) && b[2 * ps..].iter().all(|&x| x == 2),
        "parent saw the child's writes"
    );
    a.read(copy, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1), "parent saw the child's writes to the copy");
    assert_eq!(a.stats().forks, 1);
    let mut bb = vec![0u8; big_len];
    a.read(big_copy, &mut bb).unwrap();
    assert!(bb.iter().all(|&x| x == 3), "parent saw the child's writes to the large copy");
    assert_eq!(a.stats().deferred_pending, 0, "the fork handler unmapped the moved-aside mapping");
    for p in [owned, copy, solo, big, big_copy] {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().memfds, 1, "the retired memfd closes once the parent maps none of it; the new one stays");
}

fn unsafe_pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two fds into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn wait_byte(fd: i32) {
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a live buffer.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
}

fn signal_byte(fd: i32) {
    // SAFETY: writes one byte from a live buffer.
    unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
}
