//! What the image and vm tests share: a program present or a printed skip, a scratch
//! directory, and running a program in it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// The advm image tests' helpers (its runner below; the image tests use its `Holder`).
#[allow(dead_code)]
#[path = "../../../advm/tests/qemu/mod.rs"]
pub mod qemu;

/// True when `prog --version` runs; else prints why the test skips.
pub fn have(prog: &str) -> bool {
    let ok = Command::new(prog).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: {prog} not found");
    }
    ok
}

/// A scratch directory, removed on drop.
pub struct Dir(pub PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh scratch directory named after the test binary's pid and `name`.
pub fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("advm-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// Runs `prog args` in `dir`, asserts it succeeded, returns its stdout (the image
/// tests' runner, with its retry of qemu-img's LUKS timing hiccup).
#[allow(dead_code)] // the image and vm tests only
pub fn run(dir: &Path, prog: &str, args: &[&str]) -> Vec<u8> {
    qemu::run_bytes(dir, prog, args)
}

/// `advm daemon --socket SOCK`, started (its output piped); waits until it answers.
#[allow(dead_code)] // the daemon tests only
pub fn spawn_daemon(sock: &Path) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_advm"))
        .args(["daemon", "--socket"])
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "advm daemon did not listen on {}", sock.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}
