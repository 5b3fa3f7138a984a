//! Compiles every C program in `tests/c/` against `include/advm.h` and `libadvm.so`,
//! with `-Werror`, runs it, and expects exit status 0. A program prints what it checked.
//! Programs named `deprecated_*.c` use the header's deprecated aliases on purpose and
//! are built with `-Wno-deprecated-declarations`; every other one uses current names
//! only (a deprecated name there fails the build). The docs' C examples
//! (`examples/c/*.c`) are built and run the same way; advm's `doc_examples` test checks
//! that the pages show them as they are.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/fresh_so.rs"]
mod fresh_so;

/// Whether `src` exercises the deprecated aliases (built without deprecation errors).
fn uses_deprecated_names(src: &Path) -> bool {
    src.file_name().unwrap().to_string_lossy().starts_with("deprecated_")
}

/// `cc` with the flags every program gets (`-Werror` included), plus `extra`.
fn cc(src: &Path, exe: &Path, libdir: &Path, include: &Path, extra: &[&str]) -> std::process::Output {
    Command::new("cc")
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .args(extra)
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(exe)
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-ladvm")
        .output()
        .expect("run cc")
}

fn compile_and_run(src: &Path, libdir: &Path, include: &Path, out_dir: &Path) {
    let exe = out_dir.join(src.file_stem().unwrap());
    let extra: &[&str] = if uses_deprecated_names(src) { &["-Wno-deprecated-declarations"] } else { &[] };
    let built = cc(src, &exe, libdir, include, extra);
    assert!(built.status.success(), "compiling {} failed:\n{}", src.display(), String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().expect("run C test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{} failed ({}):\n{text}", src.display(), out.status);
    eprintln!("{}: ok\n{text}", src.display());
}

/// The include directory, the directory of a fresh `libadvm.so`, and where programs
/// are built; None (reason printed) without a C compiler.
fn setup() -> Option<(PathBuf, PathBuf, PathBuf)> {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return None;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = manifest.join("../../include");
    let libdir = fresh_so::libadvm_dir();
    let out_dir = fresh_so::work_dir("c-tests");
    Some((include, libdir, out_dir))
}

#[test]
fn c_programs_pass() {
    let Some((include, libdir, out_dir)) = setup() else { return };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
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

/// The old names are marked deprecated in the header: the program that uses them on
/// purpose fails to build under `-Werror`, with a message naming the replacement.
#[test]
fn deprecated_c_names_warn_with_their_replacement() {
    let Some((include, libdir, out_dir)) = setup() else { return };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/deprecated_names.c");
    let built = cc(&src, &out_dir.join("deprecated_names-werror"), &libdir, &include, &[]);
    let err = String::from_utf8_lossy(&built.stderr);
    assert!(!built.status.success(), "the deprecated names built without a warning under -Werror");
    for replacement in ["use advm_vcopy_get_stats", "use struct advm_remap_stats", "use struct advm_batch"] {
        assert!(err.contains(replacement), "no deprecation naming `{replacement}`:\n{err}");
    }
}

/// Each header compiles alone and with the other in either order, as strict C99 and
/// C11 (`-pedantic -Werror`) and as C++11 and C++17 (`extern "C"`, nothing C-only),
/// the language levels include/advm.h names.
#[test]
fn headers_compile_alone_and_together_as_c_and_cxx() {
    let Some((include, _, out_dir)) = setup() else { return };
    let orders: [&[&str]; 4] = [&["advm.h"], &["advm_gc.h"], &["advm.h", "advm_gc.h"], &["advm_gc.h", "advm.h"]];
    let cxx = Command::new("c++").arg("--version").output().is_ok();
    if !cxx {
        eprintln!("C++ part skipped: no C++ compiler (c++) on PATH");
    }
    for (i, headers) in orders.iter().enumerate() {
        let mut src: String = headers.iter().map(|h| format!("#include <{h}>\n")).collect();
        src.push_str("int main(void) { return 0; }\n");
        let (c, cc_file) = (out_dir.join(format!("headers{i}.c")), out_dir.join(format!("headers{i}.cc")));
        std::fs::write(&c, &src).unwrap();
        std::fs::write(&cc_file, src.replace("(void)", "()")).unwrap();
        let mut runs: Vec<(&str, &str, &Path)> = vec![("cc", "-std=c99", &c), ("cc", "-std=c11", &c)];
        if cxx {
            runs.extend([("c++", "-std=c++11", cc_file.as_path()), ("c++", "-std=c++17", cc_file.as_path())]);
        }
        for (compiler, std, file) in runs {
            let out = Command::new(compiler)
                .args([std, "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
                .arg(&include)
                .arg(file)
                .output()
                .expect("run the compiler");
            assert!(
                out.status.success(),
                "{headers:?} with {compiler} {std}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A C programmer's first debugging tool: `tests/c/under_valgrind.c` runs clean under
/// valgrind (no crash, no invalid access, nothing definitely lost). It crashed on the
/// library's first call (rustix read the vDSO's ELF header, which valgrind leaves
/// unmapped: rustix issue 1559; now `use-libc-auxv`), and `advm_alloc` failed (valgrind
/// refuses the arena's 256 GiB reservation with EINVAL; the arena now reserves less).
#[test]
fn a_c_program_runs_clean_under_valgrind() {
    let Some((include, libdir, out_dir)) = setup() else { return };
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("skipped: no valgrind on PATH");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/under_valgrind.c");
    let exe = out_dir.join("under_valgrind-vg");
    let built = cc(&src, &exe, &libdir, &include, &[]);
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new("valgrind")
        .args(["--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite", "-q"])
        .arg(&exe)
        .output()
        .expect("run valgrind");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "under valgrind ({}):\n{text}", out.status);
}

#[test]
fn the_docs_c_examples_build_and_run() {
    let Some((include, libdir, out_dir)) = setup() else { return };
    // apart from tests/c, whose programs have some of the same names
    let out_dir = out_dir.join("examples");
    std::fs::create_dir_all(&out_dir).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let no_pager = advm::pager::Pager::new(advm::pager::Config::new(1 << 20)).err().map(|e| e.to_string());
    let mut sources: Vec<PathBuf> =
        std::fs::read_dir(root.join("examples/c")).unwrap().map(|e| e.unwrap().path()).collect();
    sources.sort();
    assert!(sources.len() >= 5, "C examples missing: {sources:?}");
    for src in &sources {
        let name = src.file_stem().unwrap().to_string_lossy().to_string();
        let exe = out_dir.join(&name);
        let built = cc(src, &exe, &libdir, &include, &[]);
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
