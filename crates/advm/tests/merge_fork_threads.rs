//! A fork while another thread is merging: the child's first merge must not wait for
//! the process-wide client's lock, which the parent's merging thread held at the fork
//! and which no thread of the child would ever release (it waited for ever).
//! (Alone in its test binary: it forks while a thread of its own merges.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use advm::mem::{page_size, Region};
use advm::merge;

#[test]
fn a_child_forked_while_a_thread_merges_can_merge() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    std::env::set_var("ADVM_SOCKET", "/nonexistent/advmd.sock");
    let ps = page_size();
    let stop = Arc::new(AtomicBool::new(false));
    let merging = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut r = Region::new(1024 * ps).unwrap();
            let mut n = 0u8;
            while !stop.load(Ordering::Relaxed) {
                n = n.wrapping_add(1);
                r.bytes_mut().fill(n | 1);
                merge::merge(r.bytes()).unwrap();
            }
        })
    };
    let mut small = Region::new(4 * ps).unwrap();
    small.bytes_mut().fill(9);
    for round in 0..20 {
        std::thread::sleep(Duration::from_millis(3));
        // SAFETY: the child runs only the merge below (no lock the merging thread may
        // hold, but the one under test) and leaves with _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: alarm only sets a timer; SIGALRM's default action ends the child.
            unsafe { libc::alarm(5) };
            let ok = merge::merge(small.bytes()).is_ok() && small.bytes().iter().all(|&b| b == 9);
            // SAFETY: leaves the child at once, running no parent state's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        if status != 0 {
            stop.store(true, Ordering::Relaxed);
            merging.join().unwrap();
            panic!(
                "round {round}: the child's merge failed (status {status:#x}; SIGALRM {:#x}: it waited for ever)",
                libc::SIGALRM
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    merging.join().unwrap();
}
