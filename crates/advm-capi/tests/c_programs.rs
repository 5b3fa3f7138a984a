//! Compiles every C program in `tests/c/` against `include/advm.h` and `libadvm.so`,
//! runs it, and expects exit status 0. A program prints what it checked.

use std::path::{Path, PathBuf};
use std::process::Command;

fn target_dir() -> PathBuf {
    // .../target/<profile>/deps/c_programs-HASH -> .../target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn compile_and_run(src: &Path, libdir: &Path, include: &Path, out_dir: &Path) {
    let exe = out_dir.join(src.file_stem().unwrap());
    let status = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-ladvm")
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&exe).output().expect("run C test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{} failed ({}):\n{text}", src.display(), out.status);
    eprintln!("{}: ok\n{text}", src.display());
}

#[test]
fn c_programs_pass() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = manifest.join("../../include");
    let libdir = target_dir();
    // cargo test links tests against the rlib only; the C library comes from
    // `cargo build` (make test runs it first). A stale one would test old code.
    let so = libdir.join("libadvm.so");
    let rlib = libdir.join("libadvm.rlib"); // the library crate the C API wraps
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    assert!(so.exists(), "{} missing: run `cargo build -p advm-capi` first (make test does)", so.display());
    assert!(mtime(&so) >= mtime(&rlib), "{} is older than the rlib: run `cargo build -p advm-capi`", so.display());
    let out_dir = libdir.join("c-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut sources: Vec<_> = std::fs::read_dir(manifest.join("tests/c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C programs in tests/c");
    for src in &sources {
        compile_and_run(src, &libdir, &include, &out_dir);
    }
}
