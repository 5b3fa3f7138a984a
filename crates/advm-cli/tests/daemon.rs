//! `advm daemon` as a deployment runs it: the process, its socket and its signals.

#[allow(dead_code)] // the scratch directory and the daemon only
mod common;
use common::spawn_daemon;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use advm::mem::{page_size, Region};

fn kill(child: &Child, sig: &str) {
    let st = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap();
    assert!(st.success());
}

/// Waits for `child` to exit (at most 10 s); returns its status and stderr.
fn wait_exit(mut child: Child) -> (std::process::ExitStatus, String) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("advm daemon did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Pages whose content repeats every other page, so merging shares them with the store.
fn pairs(pages: usize) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        let (page, at) = (i / page_size(), i % page_size());
        *x = ((page / 2) as u8).wrapping_mul(31) ^ (at as u8);
    }
    r
}

fn sock_in(dir: &common::Dir) -> PathBuf {
    dir.0.join("advmd.sock")
}

#[test]
fn sigterm_and_sigint_stop_the_daemon_cleanly_and_sighup_is_ignored() {
    for stop in ["TERM", "INT"] {
        let dir = common::dir(&format!("daemon-signal-{stop}"));
        let sock = sock_in(&dir);
        let daemon = spawn_daemon(&sock);
        let mut client = advm::merge::Client::connect(&sock, "").unwrap();
        let mut buf = pairs(64);
        let want = buf.bytes().to_vec();
        let st = client.merge(buf.bytes()).unwrap();
        assert!(st.merged > 0, "{st:?}");

        kill(&daemon, "HUP");
        std::thread::sleep(Duration::from_millis(200));
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok(), "SIGHUP stopped the daemon");

        kill(&daemon, stop);
        let (status, stderr) = wait_exit(daemon);
        assert!(status.success(), "SIG{stop}: {status}; {stderr}");
        assert!(stderr.contains(&format!("stopped on SIG{stop}")), "{stderr}");
        assert!(stderr.contains("SIGHUP ignored"), "{stderr}");
        assert!(!sock.exists(), "SIG{stop} left {}", sock.display());
        assert!(!dir.0.join("advmd.sock.lock").exists(), "SIG{stop} left the socket's lock file");

        // The merged pages map the store, which outlives the daemon while mapped.
        assert!(buf.bytes() == want.as_slice(), "merged bytes changed when the daemon exited");
        // The next request fails at once, saying why.
        let t0 = Instant::now();
        let e = client.merge(buf.bytes()).unwrap_err().to_string();
        assert!(t0.elapsed() < Duration::from_secs(5), "a request to a stopped daemon took {:?}", t0.elapsed());
        assert!(e.contains("closed the connection") && e.contains("stopped or restarted"), "{e}");
        buf.bytes_mut()[0] ^= 1;
        assert_eq!(buf.bytes()[1..], want[1..]);
    }
}

/// A daemon whose stderr reader went away (a journald restart, `advm daemon 2>&1 |
/// head -1`) goes on serving, and stops cleanly: its messages are dropped. (Its first
/// message panicked on the closed pipe and the daemon died, leaving its socket.)
#[test]
fn a_daemon_whose_stderr_is_closed_goes_on_serving() {
    let dir = common::dir("daemon-stderr");
    let sock = sock_in(&dir);
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_advm"))
        .args(["daemon", "--socket"])
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the daemon's first message.
    drop(daemon.stderr.take());
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(daemon.try_wait().unwrap().is_none(), "the daemon died: {:?}", daemon.try_wait());
        assert!(t0.elapsed() < Duration::from_secs(20), "advm daemon did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(&daemon, "HUP");
    std::thread::sleep(Duration::from_millis(200));
    assert!(daemon.try_wait().unwrap().is_none(), "SIGHUP with stderr closed ended the daemon");
    assert!(advm::merge::Client::connect(&sock, "").is_ok());
    kill(&daemon, "TERM");
    let (status, _) = wait_exit(daemon);
    assert!(status.success(), "{status}");
    assert!(!sock.exists());
}

/// A daemon whose socket file was removed under it (by hand, or by whoever started it)
/// still stops on SIGTERM, and removes its lock file: stopping woke the accept loop by
/// connecting to the path, so it waited for ever once the path was gone (benchmarks
/// then killed it, leaving `SOCK.lock` behind).
#[test]
fn a_daemon_whose_socket_file_was_removed_still_stops_on_sigterm() {
    let dir = common::dir("daemon-unlinked");
    let sock = sock_in(&dir);
    let child = spawn_daemon(&sock);
    std::fs::remove_file(&sock).unwrap();
    kill(&child, "TERM");
    let (status, err) = wait_exit(child);
    assert!(status.success(), "{status}: {err}");
    let mut lock = sock.into_os_string();
    lock.push(".lock");
    assert!(!Path::new(&lock).exists(), "the lock file stayed");
}

/// A socket path longer than a UNIX address holds is refused before anything is made,
/// with one `advm:` before the message (it said `advm: advm daemon: ...`).
#[test]
fn a_socket_path_too_long_is_refused_naming_its_length() {
    let dir = common::dir("daemon-long-path");
    let sock = dir.0.join(format!("{}.sock", "s".repeat(120)));
    let out = Command::new(env!("CARGO_BIN_EXE_advm")).args(["daemon", "--socket"]).arg(&sock).output().unwrap();
    let len = sock.as_os_str().len();
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref(), String::from_utf8_lossy(&out.stderr)),
        (
            Some(1),
            "",
            format!(
                "advm: daemon: {}: {len} bytes long; a UNIX socket path holds at most 107 bytes (name a shorter path \
                 with --socket or ADVM_SOCKET)\n",
                sock.display()
            )
            .into()
        )
    );
    assert!(!sock.exists());
}
