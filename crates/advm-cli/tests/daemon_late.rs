//! A long-lived process that merged before `advm daemon` served on its socket (a worker
//! started before the daemon): its later merges reach the daemon. A test binary of its
//! own: it sets `ADVM_SOCKET` for the whole process.

#[allow(dead_code)] // the scratch directory and the daemon only
mod common;

use std::process::Command;

use advm::mem::{page_size, Region};
use advm::merge::{Via, RETRY_DAEMON};

fn filled(pages: usize, seed: u8) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i / page_size()) as u8).wrapping_mul(37) ^ (i as u8) ^ seed;
    }
    r
}

/// The process-wide client that fell back to its own store kept it for good: a worker
/// started before advmd never merged through it.
#[test]
fn the_process_wide_client_reaches_a_daemon_started_after_it() {
    let dir = common::dir("daemon-late");
    let sock = dir.0.join("advmd.sock");
    std::env::set_var("ADVM_SOCKET", &sock);
    let a = filled(64, 3);
    let want = a.bytes().to_vec();
    let st = advm::merge::merge(a.bytes()).unwrap();
    assert!(matches!(st.via, Via::Local { .. }) && st.added == 64, "{st:?}");
    let mut daemon = common::spawn_daemon(&sock);
    std::thread::sleep(RETRY_DAEMON);
    let b = filled(64, 3);
    let st = advm::merge::merge(b.bytes()).unwrap();
    let ok = matches!(st.via, Via::Daemon { .. }) && st.added == 64;
    // The memory merged into the process's own store merges again, into advmd's.
    let again = advm::merge::merge(a.bytes()).unwrap();
    let _ = Command::new("kill").arg("-TERM").arg(daemon.id().to_string()).status();
    let stopped = daemon.wait().unwrap();
    assert!(ok, "{st:?}");
    assert_eq!((again.merged, again.added), (64, 0), "{again:?}");
    assert!(a.bytes() == want.as_slice() && b.bytes() == want.as_slice());
    assert!(stopped.success());
}
