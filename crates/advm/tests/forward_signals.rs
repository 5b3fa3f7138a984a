//! `advm::process::ForwardSignals`: a stopping signal that reaches the parent between
//! installing the forwarder and spawning the child is held and given to the child, so
//! the parent lives to clean up (the window in which `advm bench r` died under load
//! before it could restore KSM). One test per binary: signal dispositions are per process.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use advm::process::{terminate, ForwardSignals};

#[test]
fn a_signal_before_the_child_exists_is_held_for_it_and_then_forwarded() {
    let signals = ForwardSignals::hold().unwrap();
    // SIGTERM to ourselves before any child: without the hold it ends this test binary.
    terminate(std::process::id()).unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    // The child inherits no ignored signal (the handlers reset at exec), and gets the
    // held SIGTERM once named.
    signals.child(child.id()).unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the held SIGTERM never reached the child");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");

    // Named child: a later SIGTERM goes to it, and SIGINT (the terminal's) is left to it.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    signals.child(child.id()).unwrap();
    // SAFETY: kill(2) on our own pid with SIGINT, which the forwarder handles.
    assert_eq!(unsafe { libc::kill(std::process::id() as i32, libc::SIGINT) }, 0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "SIGINT was forwarded; the terminal delivers it itself");
    terminate(std::process::id()).unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    drop(signals);

    assert!(ForwardSignals::hold().unwrap().child(0).is_err(), "pid 0 is not a child");
}
