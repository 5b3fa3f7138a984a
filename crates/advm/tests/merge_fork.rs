//! After a merge, a forked child sees the same bytes and its writes stay its own; the
//! process-wide client says when no daemon answers; a child gets a session of its own.
//! (Alone in its test binary, so the fork happens with no other test thread running.)

use advm::mem::{page_size, Region};
use advm::merge::{self, Via};

#[test]
fn fork_after_a_merge_keeps_content_and_writes_private() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    std::env::set_var("ADVM_SOCKET", "/nonexistent/advmd.sock");
    let ps = page_size();
    let (mut a, mut b) = (Region::new(16 * ps).unwrap(), Region::new(16 * ps).unwrap());
    for (i, x) in a.bytes_mut().iter_mut().enumerate() {
        *x = (i * 31 % 251) as u8;
    }
    b.bytes_mut().copy_from_slice(a.bytes());
    let orig = a.bytes().to_vec();
    let sa = merge::merge(a.bytes()).unwrap();
    let sb = merge::merge(b.bytes()).unwrap();
    assert_eq!((sa.added, sb.merged), (16, 16));
    match &sb.via {
        Via::Local { reason } => assert!(reason.contains("not reachable at /nonexistent/advmd.sock"), "{reason}"),
        v => panic!("expected the local fallback, got {v:?}"),
    }
    // SAFETY: the child only runs the checks below and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let same = b.bytes() == &orig[..];
        b.bytes_mut()[2 * ps..3 * ps].fill(0xEE);
        let a_kept = a.bytes() == &orig[..];
        // A child merges through a session of its own (four equal pages: one added).
        let mut c = Region::new(4 * ps).unwrap();
        c.bytes_mut().fill(3);
        let own =
            merge::merge(c.bytes()).is_ok_and(|s| (s.added, s.merged) == (1, 3)) && c.bytes().iter().all(|&x| x == 3);
        // Memory the parent merged maps the parent's store: the child merges it again
        // (it was refused as "file-backed"), its own write included, bytes unchanged.
        let mut want = orig.clone();
        want[2 * ps..3 * ps].fill(0xEE);
        let again = merge::merge(b.bytes());
        let remerged = again.as_ref().is_ok_and(|s| s.merged + s.added == 16) && b.bytes() == &want[..];
        if !remerged {
            eprintln!("child: merging the parent's merged memory again: {again:?}");
        }
        let code = if !same {
            1
        } else if !a_kept {
            2
        } else if !own {
            3
        } else if !remerged {
            4
        } else {
            0
        };
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    assert_eq!(b.bytes(), &orig[..], "the child's write stayed in the child");
    assert_eq!(a.bytes(), &orig[..]);
}
