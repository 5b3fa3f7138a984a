//! A forked child inherits advm's userfaultfd, whose ioctls would act on the parent's
//! memory: the child must not use it. (Alone in its test binary, so the fork happens
//! with no other test thread running.)

use advm::mem::Region;
use advm::remap::{self, Choice, Engine, Options};

#[test]
fn a_forked_child_never_moves_its_parents_pages() {
    if !remap::uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = advm::addr::page_size();
    let mut r = Region::for_remap(64 * ps).unwrap();
    r.bytes_mut().fill(1);
    let opts = Options { break_even_pages: Some(1), ..Options::default() };
    r.move_pages_with(32 * ps, 0, 8 * ps, &opts).unwrap(); // the parent uses UFFDIO_MOVE
    r.bytes_mut()[..8 * ps].fill(2);
    // SAFETY: the child only runs the code under test and exits with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let forced = r.move_pages_with(40 * ps, 0, 8 * ps, &Options { engine: Choice::Only(Engine::UffdMove), ..opts });
        let auto = r.move_pages_with(40 * ps, 0, 8 * ps, &opts);
        let ok = forced.is_err()
            && auto.is_ok_and(|o| o.uffd_move_bytes == 0)
            && r.bytes()[40 * ps..48 * ps].iter().all(|&b| b == 2);
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    let b = r.bytes();
    assert!(b[..8 * ps].iter().all(|&x| x == 2), "the parent's source is untouched");
    assert!(b[40 * ps..48 * ps].iter().all(|&x| x == 1), "the parent's destination is untouched");
}
