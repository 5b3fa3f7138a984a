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

/// The compilers the header tests use: gcc and g++ (as `cc` and `c++`), and clang and
/// clang++ where installed (skipped, said so, where not).
fn compilers() -> (Vec<&'static str>, Vec<&'static str>) {
    let found = |c: &str| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success());
    let pick = |names: [&'static str; 2]| -> Vec<&'static str> {
        let (have, missing): (Vec<_>, Vec<_>) = names.into_iter().partition(|c| found(c));
        for c in missing {
            eprintln!("{c}: not installed, not tried");
        }
        have
    };
    (pick(["cc", "clang"]), pick(["c++", "clang++"]))
}

/// The warnings the header tests turn into errors, in C and in C++.
const C_WARNINGS: &[&str] = &[
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Wstrict-prototypes",
    "-Wmissing-prototypes",
    "-Wold-style-definition",
    "-Wshadow",
    "-Wundef",
    "-Wcast-qual",
    "-Wconversion",
    "-Wsign-conversion",
    "-Wredundant-decls",
    "-Werror",
];
const CXX_WARNINGS: &[&str] = &[
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Wshadow",
    "-Wundef",
    "-Wold-style-cast",
    "-Wzero-as-null-pointer-constant",
    "-Wredundant-decls",
    "-Werror",
];

/// The system headers a C program includes beside advm's: the headers must compile
/// before and after them (no name of advm's collides with libc's or POSIX's, and
/// neither header relies on another being included first).
const LIBC: &str = "#include <errno.h>\n#include <pthread.h>\n#include <signal.h>\n#include <stddef.h>\n\
#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <sys/mman.h>\n\
#include <sys/types.h>\n#include <unistd.h>\n";

/// Each header compiles alone and with the other in either order, before and after
/// libc's headers, with and without `_GNU_SOURCE`, as strict C99 and C11 and as C++11
/// and C++17 (`extern "C"`, nothing C-only), with gcc and (where installed) clang, every
/// warning of `C_WARNINGS`/`CXX_WARNINGS` an error (`-fsyntax-only`: 64 runs take
/// about 3 s). Each header is included twice: the include guards.
#[test]
fn headers_compile_alone_and_together_as_c_and_cxx() {
    let Some((include, _, out_dir)) = setup() else { return };
    let orders: [&[&str]; 4] = [&["advm.h"], &["advm_gc.h"], &["advm.h", "advm_gc.h"], &["advm_gc.h", "advm.h"]];
    let (c_compilers, cxx_compilers) = compilers();
    let mut files = Vec::new();
    for (i, headers) in orders.iter().enumerate() {
        let ours: String = headers.iter().map(|h| format!("#include <{h}>\n")).collect();
        for (j, (gnu, libc_first)) in
            [(false, false), (false, true), (true, false), (true, true)].into_iter().enumerate()
        {
            // g++ defines _GNU_SOURCE itself
            let mut src = String::from(if gnu { "#ifndef _GNU_SOURCE\n#define _GNU_SOURCE\n#endif\n" } else { "" });
            if libc_first {
                src.push_str(LIBC);
            }
            // twice: the include guards
            src.push_str(&ours);
            src.push_str(&ours);
            if !libc_first {
                src.push_str(LIBC);
            }
            src.push_str("int main(void) { return 0; }\n");
            let stem = out_dir.join(format!("headers{i}_{j}"));
            let (c, cxx) = (stem.with_extension("c"), stem.with_extension("cc"));
            std::fs::write(&c, &src).unwrap();
            std::fs::write(&cxx, src.replace("(void)", "()")).unwrap();
            files.push((headers.to_vec(), gnu, libc_first, c, cxx));
        }
    }
    for (compiler, cxx) in c_compilers.iter().map(|c| (*c, false)).chain(cxx_compilers.iter().map(|c| (*c, true))) {
        let (stds, warnings): (&[&str], &[&str]) =
            if cxx { (&["-std=c++11", "-std=c++17"], CXX_WARNINGS) } else { (&["-std=c99", "-std=c11"], C_WARNINGS) };
        for std in stds {
            for (headers, gnu, libc_first, c, cc_file) in &files {
                let out = Command::new(compiler)
                    .arg(std)
                    .args(warnings)
                    .args(["-fsyntax-only", "-I"])
                    .arg(&include)
                    .arg(if cxx { cc_file } else { c })
                    .output()
                    .expect("run the compiler");
                assert!(
                    out.status.success(),
                    "{headers:?} (_GNU_SOURCE {gnu}, libc first {libc_first}) with {compiler} {std}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// A C++ program (`tests/cxx/linkage.cc`) calls the C API and links against libadvm:
/// the headers' `extern "C"` gives the functions their C names (a syntax check alone
/// would pass mangled ones).
#[test]
fn a_cxx_program_links_and_runs() {
    let Some((include, libdir, out_dir)) = setup() else { return };
    let (_, cxx) = compilers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cxx/linkage.cc");
    for compiler in cxx {
        let exe = out_dir.join(format!("linkage-{compiler}"));
        let built = Command::new(compiler)
            .args(["-std=c++11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-I"])
            .arg(&include)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", libdir.display()))
            .arg(format!("-Wl,-rpath,{}", libdir.display()))
            .arg("-ladvm")
            .output()
            .expect("run the C++ compiler");
        assert!(built.status.success(), "{compiler}: {}", String::from_utf8_lossy(&built.stderr));
        let out = Command::new(&exe).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{compiler} build ({}):\n{text}", out.status);
        eprintln!("{compiler}: {text}");
    }
}

/// Every name the headers declare is advm's: functions and types start with `advm_`,
/// macros with `ADVM_` (so none collides with a program's or the C library's), and
/// nothing else is declared; the headers include only `stddef.h` and `stdint.h`.
#[test]
fn the_headers_declare_only_advm_names() {
    let Some((include, _, out_dir)) = setup() else { return };
    let src = out_dir.join("names.c");
    std::fs::write(&src, "#include <stddef.h>\n#include <stdint.h>\n#include <advm.h>\n#include <advm_gc.h>\n")
        .unwrap();
    let base = out_dir.join("names-base.c");
    std::fs::write(&base, "#include <stddef.h>\n#include <stdint.h>\n").unwrap();
    let macros = |file: &Path| -> std::collections::BTreeSet<String> {
        let out = Command::new("cc").args(["-std=c11", "-E", "-dM", "-I"]).arg(&include).arg(file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("#define ")?.split(['(', ' ']).next().map(str::to_string))
            .collect()
    };
    let ours: Vec<String> = macros(&src).difference(&macros(&base)).cloned().collect();
    assert!(ours.iter().all(|m| m.starts_with("ADVM_")), "macros without the ADVM_ prefix: {ours:?}");
    assert!(ours.contains(&"ADVM_H".to_string()) && ours.contains(&"ADVM_GC_H".to_string()), "{ours:?}");
    // Every #include of the headers, and every declaration outside comments.
    for h in ["advm.h", "advm_gc.h"] {
        let text = std::fs::read_to_string(include.join(h)).unwrap();
        let includes: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("#include")).collect();
        assert_eq!(includes, ["#include <stddef.h>", "#include <stdint.h>"], "{h}");
    }
    let aux = out_dir.join("names.aux");
    let out = Command::new("cc")
        .args(["-std=c11", "-fsyntax-only", "-aux-info"])
        .arg(&aux)
        .arg("-I")
        .arg(&include)
        .arg(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let aux = std::fs::read_to_string(&aux).unwrap();
    let functions: Vec<&str> = aux.lines().filter(|l| l.contains("/include/advm")).collect();
    assert!(functions.len() >= 40, "{functions:#?}");
    for f in &functions {
        let name = f.split('(').next().unwrap().rsplit([' ', '*']).find(|s| !s.is_empty()).unwrap();
        assert!(name.starts_with("advm_"), "a function without the advm_ prefix: {f}");
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
