//! What the image and vm tests share: a program present or a printed skip, a scratch
//! directory, and running a program in it.

use std::path::{Path, PathBuf};
use std::process::Command;

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
pub fn run(dir: &Path, prog: &str, args: &[&str]) -> Vec<u8> {
    qemu::run_bytes(dir, prog, args)
}
