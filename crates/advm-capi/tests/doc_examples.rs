//! The docs' C examples (`examples/c/*.c`) build with `-Werror` against the public
//! headers and `libadvm.so` and run; advm's `doc_examples` test checks the pages show
//! them as they are.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/fresh_so.rs"]
mod fresh_so;

#[test]
fn c_examples_build_and_run() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let libdir = fresh_so::libadvm_dir();
    let out_dir = libdir.join("c-examples");
    std::fs::create_dir_all(&out_dir).unwrap();
    let no_pager = advm::pager::Pager::new(advm::pager::Config::new(1 << 20)).err().map(|e| e.to_string());
    let mut sources: Vec<PathBuf> =
        std::fs::read_dir(root.join("examples/c")).unwrap().map(|e| e.unwrap().path()).collect();
    sources.sort();
    assert!(sources.len() >= 5, "C examples missing: {sources:?}");
    for src in &sources {
        let name = src.file_stem().unwrap().to_string_lossy().to_string();
        let exe = out_dir.join(&name);
        let built = Command::new("cc")
            .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root.join("include"))
            .arg(src)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", libdir.display()))
            .arg(format!("-Wl,-rpath,{}", libdir.display()))
            .arg("-ladvm")
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{} does not build:\n{}",
            src.display(),
            String::from_utf8_lossy(&built.stderr)
        );
        if let (true, Some(why)) = (name == "pager", &no_pager) {
            eprintln!("{name}: built; not run: {why}");
            continue;
        }
        // The merge example uses this process's own store, never a daemon of the machine.
        let out = Command::new(&exe).env("ADVM_SOCKET", "/nonexistent/advmd.sock").output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{} failed ({}):\n{text}", src.display(), out.status);
        eprintln!("{name}: {text}");
    }
}
