//! Running a test as uid 65534 with vm.unprivileged_userfaultfd=0, where that user
//! gets only a user-mode-only userfaultfd (it sees no fault the kernel takes inside a
//! system call). The test re-runs itself in a child as that user; the parent needs
//! root to switch and to set the sysctl, which it puts back even if the test fails.

use std::os::unix::process::CommandExt;
use std::process::Command;

const CHILD: &str = "ADVM_TEST_UMODE_CHILD";
const SYSCTL: &str = "/proc/sys/vm/unprivileged_userfaultfd";

/// Whether test `name`'s body runs in this process: in the parent it runs the test as
/// uid 65534 ([`run_as_nobody`]) and says no; in that child, yes when the user got the
/// user-mode-only kind ([`user_mode_only`]).
pub fn body_runs_here(name: &str) -> bool {
    if std::env::var_os(CHILD).is_none() {
        run_as_nobody(name);
        return false;
    }
    user_mode_only()
}

/// Puts the sysctl back when dropped.
struct Sysctl(String);

impl Drop for Sysctl {
    fn drop(&mut self) {
        std::fs::write(SYSCTL, &self.0).expect("restoring vm.unprivileged_userfaultfd");
    }
}

/// In the parent: runs test `name` of this binary as uid 65534 with the sysctl at 0
/// and fails if the child fails; skips (prints why) where that cannot be arranged.
fn run_as_nobody(name: &str) {
    if !advm::process::is_root() {
        eprintln!("skipped: needs root to switch to uid 65534 and set vm.unprivileged_userfaultfd");
        return;
    }
    let Ok(old) = std::fs::read_to_string(SYSCTL) else {
        eprintln!("skipped: no {SYSCTL}");
        return;
    };
    let _restore = Sysctl(old);
    if std::fs::write(SYSCTL, "0").is_err() {
        eprintln!("skipped: cannot set vm.unprivileged_userfaultfd (read-only /proc/sys?)");
        return;
    }
    let out = match Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
    {
        Ok(out) => out,
        // a checkout under a directory uid 65534 may not enter (/root)
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("skipped: uid 65534 cannot run this test binary ({e})");
            return;
        }
        Err(e) => panic!("running the test as uid 65534: {e}"),
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "as uid 65534: {text}");
}

/// Whether this user's userfaultfd is the user-mode-only kind (printed when not).
fn user_mode_only() -> bool {
    let kind = advm::probe::facts().uffd_source;
    let yes = kind.is_some_and(|k| format!("{k:?}") == "SyscallUserModeOnly");
    if !yes {
        eprintln!("skipped: this user's userfaultfd is {kind:?}, not the user-mode-only kind");
    }
    yes
}
