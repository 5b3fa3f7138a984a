//! What the image and vm tests share: a program present or a printed skip, a scratch
//! directory, and running a program in it.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Runs `prog args` in `dir`, asserts it succeeded, returns its stdout.
pub fn run(dir: &Path, prog: &str, args: &[&str]) -> Vec<u8> {
    let mut out = Command::new(prog).args(args).current_dir(dir).output().unwrap();
    // qemu-img times its LUKS key derivation in CPU time and now and then measures
    // none ("Unable to get accurate CPU usage"): qemu's hiccup, not ours; try again.
    for _ in 0..5 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("accurate CPU usage") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        out = Command::new(prog).args(args).current_dir(dir).output().unwrap();
    }
    assert!(out.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}
