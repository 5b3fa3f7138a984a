//! A long-lived process merging with the process-wide client (`advm::merge::merge`,
//! C's `advm_merge`, Python's `advm.merge`) while `advm daemon` is restarted on its
//! socket. A test binary of its own: it sets `ADVM_SOCKET` for the whole process.

#[allow(dead_code)] // the scratch directory and the daemon only
mod common;

use std::path::Path;
use std::process::{Child, Command};

use advm::mem::{page_size, Region};
use advm::merge::Via;

/// The daemon, killed if the test fails before stopping it.
struct Daemon(Option<Child>);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_daemon(sock: &Path) -> Daemon {
    Daemon(Some(common::spawn_daemon(sock)))
}

fn stop(mut d: Daemon) {
    let mut child = d.0.take().expect("running");
    let st = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(st.success());
    assert!(child.wait().unwrap().success());
}

fn filled(pages: usize, seed: u8) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i / page_size()) as u8).wrapping_mul(31) ^ (i as u8) ^ seed;
    }
    r
}

/// The call that finds the daemon gone says so; the next one reaches the restarted
/// daemon. (The process-wide client kept its lost connection and failed every later
/// call with "closed the connection": a worker outliving a daemon restart never
/// merged through advmd again.)
#[test]
fn the_process_wide_client_reaches_a_restarted_daemon() {
    let dir = common::dir("daemon-restart");
    let sock = dir.0.join("advmd.sock");
    std::env::set_var("ADVM_SOCKET", &sock);
    let daemon = spawn_daemon(&sock);
    let a = filled(64, 1);
    let want = a.bytes().to_vec();
    let st = advm::merge::merge(a.bytes()).unwrap();
    assert!(matches!(st.via, Via::Daemon { .. }), "{:?}", st.via);
    stop(daemon);
    let daemon = spawn_daemon(&sock);
    let mut b = filled(64, 1);
    let e = advm::merge::merge(b.bytes()).unwrap_err();
    assert!(matches!(e, advm::Error::Disconnected { .. }), "{e:?}");
    for _ in 0..2 {
        let st = advm::merge::merge(b.bytes()).unwrap();
        assert!(matches!(st.via, Via::Daemon { .. }), "{:?}", st.via);
    }
    // The memory merged into the old store merges again, into the new one.
    let st = advm::merge::merge(a.bytes()).unwrap();
    assert_eq!(st.merged, 64, "{st:?}");
    assert!(a.bytes() == want.as_slice() && b.bytes() == want.as_slice());
    b.bytes_mut()[0] ^= 1;
    assert!(a.bytes() == want.as_slice());
    stop(daemon);
}
