//! Compiles the C shim (csrc/shim.c) into `$OUT_DIR/libadvm_preload.so` with the system
//! C compiler; `src/lib.rs` embeds the result. A plain `cc` call is enough for one file
//! and keeps the build free of extra crates.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libadvm_preload.so");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror"])
        // The shim is memcpy: the compiler must not turn its loops into calls to it.
        .args(["-fno-tree-loop-distribute-patterns", "-fvisibility=hidden"])
        .arg("csrc/shim.c")
        .arg("-o")
        .arg(&so)
        .args(["-ldl", "-pthread"])
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` for the advm preload shim: {e}"));
    assert!(status.success(), "compiling crates/advm-preload/csrc/shim.c failed ({status})");
}
