//! Shared by the C test programs of advm-capi and advm-preload (included by path):
//! where `libadvm.so` is, and whether it is as new as the code it is built from.

use std::path::{Path, PathBuf};

/// The test binary's target directory: .../target/<profile>/deps/NAME-HASH ->
/// .../target/<profile>, where `cargo build` puts `libadvm.so`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// A directory for the tests' programs and files: `name` in the target directory, or,
/// where that is not this user's own (a tree another user built, run as this one), a
/// private `advm-<name>-<euid>` in the temporary directory. The shim is installed only
/// into a directory of the user's own.
pub fn work_dir(name: &str) -> PathBuf {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let me = advm::process::euid();
    let own = |d: &Path| std::fs::metadata(d).is_ok_and(|m| m.uid() == me && m.mode() & 0o022 == 0);
    let beside = target_dir().join(name);
    if std::fs::create_dir_all(&beside).is_ok() && own(&beside) {
        return beside;
    }
    let private = std::env::temp_dir().join(format!("advm-{name}-{me}"));
    let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&private);
    assert!(own(&private), "{}: not this user's own directory", private.display());
    private
}

/// `libadvm.so`'s directory; panics when it is missing or older than the sources it is
/// built from (a stale one would test old code). `cargo test` links tests against the
/// rlib only; the C library comes from `cargo build` (which `make test` runs first).
pub fn libadvm_dir() -> PathBuf {
    let dir = target_dir();
    let so = dir.join("libadvm.so");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    assert!(so.exists(), "{} missing: run `cargo build -p advm-capi` first (make test does)", so.display());
    assert!(
        mtime(&so) >= newest_source(),
        "{} is older than its sources: run `cargo build -p advm-capi`",
        so.display()
    );
    dir
}

/// The newest modification time of the sources `libadvm.so` is built from (the
/// advm, advm-gc and advm-capi crates' src/ and include/). Compared with the .so, not
/// with the rlibs in target/: a test run of a subset of the crates may rebuild an rlib
/// (another feature set, another hash) after the .so without any source changing.
pub fn newest_source() -> Option<std::time::SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<std::time::SystemTime>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, newest);
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                *newest = (*newest).max(Some(t));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut newest = None;
    for d in ["crates/advm/src", "crates/advm-gc/src", "crates/advm-capi/src", "include"] {
        walk(&root.join(d), &mut newest);
    }
    newest
}
