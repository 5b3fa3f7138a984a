//! Compiles the C shim (every `csrc/*.c`, sharing the internal header `csrc/shim.h`) into
//! `$OUT_DIR/libadvm_preload.so` with the system C compiler; `src/lib.rs` embeds the
//! result. One plain `cc` call over all the files is enough and keeps the build free of
//! extra crates.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libadvm_preload.so");
    // A directory: cargo reruns this script when any file in it changes.
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=CC");
    let mut sources: Vec<PathBuf> = std::fs::read_dir("csrc")
        .unwrap_or_else(|e| panic!("reading crates/advm-preload/csrc: {e}"))
        .map(|entry| entry.unwrap_or_else(|e| panic!("reading crates/advm-preload/csrc: {e}")).path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    // A fixed order: the same inputs give the same object.
    sources.sort();
    assert!(!sources.is_empty(), "crates/advm-preload/csrc holds no .c file");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror"])
        // The shim is memcpy: the compiler must not turn its loops into calls to it.
        .args(["-fno-tree-loop-distribute-patterns", "-fvisibility=hidden"])
        .args(&sources)
        .arg("-o")
        .arg(&so)
        .args(["-ldl", "-pthread"])
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` for the advm preload shim: {e}"));
    assert!(status.success(), "compiling crates/advm-preload/csrc/*.c failed ({status})");
}
