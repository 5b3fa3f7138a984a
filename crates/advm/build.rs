//! Sets `ADVM_SOURCE_ID`: a hash of every file under `src/`, so programs built
//! separately from the same sources (the CLI, the Python package) can tell whether
//! they run the same library code (`advm bench merge` checks its Python package).

use std::hash::{Hash, Hasher};
use std::path::Path;

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, files);
        } else {
            files.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    let mut files = Vec::new();
    walk(Path::new("src"), &mut files);
    files.sort();
    // SipHash with fixed keys: the same sources give the same id in every build.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    println!("cargo:rustc-env=ADVM_SOURCE_ID={:016x}", h.finish());
}
