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

/// A daemon in a pid namespace of its own (a Kubernetes pod without `hostPID`) sees its
/// clients' pid as 0 and cannot see their processes at all. A client that merged,
/// forked a child holding the merged pages and exited used to have its pages
/// released (no process it could see mapped them) and handed to the next add: the
/// child's bytes changed under it. Now such a session's pages are kept.
#[test]
fn a_daemon_in_another_pid_namespace_keeps_the_pages_of_clients_it_cannot_see() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !common::have("unshare") {
        eprintln!("skipped: needs root and unshare(1) for a pid namespace");
        return;
    }
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let dir = common::dir("daemon-pidns");
    let sock = sock_in(&dir);
    /// unshare(1) ignores SIGTERM while it waits; killed, it takes the daemon with it
    /// (`--kill-child`), however the test ends.
    struct Unshared(Child);
    impl Drop for Unshared {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let daemon = Unshared(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(env!("CARGO_BIN_EXE_advm"))
            .args(["daemon", "--domain-limit-mib", "64", "--socket"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "advm daemon did not listen in its pid namespace");
        std::thread::sleep(Duration::from_millis(20));
    }
    // below advm::merge::COPY_BELOW_PAGES: copied into the store's own file, whose
    // released slots the next adds take
    let pages = 64;
    assert!(pages < advm::merge::COPY_BELOW_PAGES);
    let distinct = |seed: u64| {
        let mut r = Region::new(pages * page_size()).unwrap();
        for (i, x) in r.bytes_mut().iter_mut().enumerate() {
            *x = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7];
        }
        r
    };
    let mut fds = [0; 2];
    // SAFETY: a pipe for the grandchild's verdict.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let [verdict_in, verdict_out] = fds;
    // SAFETY: the child merges, forks and _exits; its child checks, then _exits.
    let parent = unsafe { libc::fork() };
    if parent == 0 {
        let buf = distinct(1);
        let want = buf.bytes().to_vec();
        let merged = advm::merge::Client::connect(&sock, "").and_then(|mut c| c.merge(buf.bytes()));
        let merged = merged.is_ok_and(|s| s.added as usize == pages);
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        // SAFETY: the grandchild only reads its bytes and writes a pipe, then _exits.
        if unsafe { libc::fork() } == 0 {
            // SAFETY: getppid has no preconditions; it changes once the parent is gone.
            while unsafe { libc::getppid() } == me {
                std::thread::sleep(Duration::from_millis(5));
            }
            for fd in 3..1024 {
                if fd != verdict_out {
                    // SAFETY: closing descriptors (the connection among them), as a
                    // daemonizing program does.
                    unsafe { libc::close(fd) };
                }
            }
            // The daemon looks at closed sessions of exited processes every second;
            // then another client's adds would take released slots.
            std::thread::sleep(Duration::from_millis(3000));
            let code: u8 = if !merged {
                2
            } else if buf.bytes() != &want[..] {
                1
            } else {
                0
            };
            // SAFETY: one byte from a live buffer into our pipe.
            unsafe { libc::write(verdict_out, [code].as_ptr().cast(), 1) };
            // SAFETY: leave without the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: leave without the test's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(parent, &mut status, 0) }, parent);
    // SAFETY: our copy of the write end; the grandchild holds its own.
    unsafe { libc::close(verdict_out) };
    std::thread::sleep(Duration::from_millis(1500));
    let mut other = advm::merge::Client::connect(&sock, "").unwrap();
    let mut added = 0;
    for seed in 2..6 {
        let o = distinct(seed);
        added += other.merge(o.bytes()).unwrap().added;
    }
    assert_eq!(added as usize, 4 * pages);
    let mut code = [9u8];
    // SAFETY: one byte into a live buffer from our pipe.
    assert_eq!(unsafe { libc::read(verdict_in, code.as_mut_ptr().cast(), 1) }, 1, "no verdict");
    // SAFETY: our pipe's read end, closed once.
    unsafe { libc::close(verdict_in) };
    drop(daemon);
    assert_eq!(code[0], 0, "1: the orphaned child's merged pages changed under it; 2: the merge failed");
}
