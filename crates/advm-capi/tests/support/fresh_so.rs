//! Shared by the C test programs of advm-capi and advm-preload (included by path):
//! whether `libadvm.so` is as new as the code it is built from.

use std::path::Path;

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
