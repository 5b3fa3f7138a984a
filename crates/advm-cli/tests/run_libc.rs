//! The libc sweep: small C programs (`tests/libc/*.c`) that call every memory function a
//! C program may use (the malloc family with odd sizes and alignments, large memcpy and
//! memmove in every shape, mprotect'd and file-backed memory, fork, vfork, posix_spawn,
//! system, raw clone/fork/clone3, threads forking, signal handlers copying, exec,
//! closing every descriptor, low RLIMIT_AS/RLIMIT_DATA) run plainly and under
//! `advm run --mode M` for every mode: stdout and exit status must be the same. Each
//! program also checks itself, so the plain run shows the checks are glibc's behaviour.
//! One program is also linked statically: the shim cannot load into it and it runs as
//! it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

fn sources() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/libc");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    v.sort();
    v
}

/// Compiles `src` into `out` (extra flags: `-static`); the compiler's message on failure.
fn compile(src: &Path, out: &Path, extra: &[&str]) -> Result<(), String> {
    // -fno-builtin: every malloc and memcpy is a real call, as with sizes the compiler
    // cannot see.
    let o = Command::new("cc")
        .args([
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-alloc-size-larger-than",
            "-fno-builtin",
            "-pthread",
        ])
        .args(extra)
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

/// One `advm run` variant: its arguments before `--`, and extra environment.
type Variant = (Vec<&'static str>, Vec<(&'static str, &'static str)>);

/// The `advm run` variants.
fn variants() -> Vec<Variant> {
    let mut v = vec![
        (vec!["--mode", "off"], vec![]),
        (vec!["--mode", "alloc"], vec![]),
        (vec!["--mode", "vcopy"], vec![]),
        // the paper's 2-page copy threshold: every copy in the programs is looked at
        (vec!["--mode", "vcopy", "--copy-min-pages", "2"], vec![]),
        // every block a shared memfd mapping from the start
        (vec!["--mode", "vcopy", "--copy-min-pages", "2"], vec![("ADVM_VCOPY_FRESH", "memfd")]),
        (vec!["--mode", "merge"], vec![]),
    ];
    if advm::probe::facts().root && advm::ksm::available() {
        v.push((vec!["--mode", "ksm"], vec![]));
        v.push((vec!["--mode", "ksm-aggr"], vec![]));
    } else {
        eprintln!("ksm and ksm-aggr modes skipped: they need root and KSM (/sys/kernel/mm/ksm)");
    }
    v
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn c_programs_behave_as_under_glibc_in_every_mode() {
    if !common::have("cc") {
        return;
    }
    let dir = common::dir("libc-sweep");
    let mut programs = Vec::new();
    for src in sources() {
        let exe = dir.0.join(src.file_stem().unwrap());
        compile(&src, &exe, &[]).unwrap_or_else(|e| panic!("compiling {}: {e}", src.display()));
        programs.push(exe);
    }
    assert!(programs.len() >= 9, "sweep programs missing: {programs:?}");
    let alloc = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/libc/alloc.c");
    let static_exe = dir.0.join("alloc-static");
    match compile(&alloc, &static_exe, &["-static"]) {
        Ok(()) => programs.push(static_exe),
        Err(e) => eprintln!("static program skipped: no static libc ({})", e.lines().next().unwrap_or("")),
    }
    let variants = variants();
    for exe in &programs {
        let plain = Command::new(exe).output().unwrap();
        assert!(plain.status.success(), "{} failed without advm ({}):\n{}", exe.display(), plain.status, text(&plain));
        for (args, env) in &variants {
            let out =
                Command::new(ADVM).arg("run").args(args).arg("--").arg(exe).envs(env.iter().copied()).output().unwrap();
            assert_eq!(
                (String::from_utf8_lossy(&plain.stdout), plain.status.code()),
                (String::from_utf8_lossy(&out.stdout), out.status.code()),
                "{} under `advm run {}` {env:?} differs from the plain run; its stderr:\n{}",
                exe.display(),
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A statically linked program runs untouched under every mode, and `advm run` says why
/// on stderr; a dynamic one gets no such line.
#[test]
fn static_programs_run_untouched_and_advm_run_says_so() {
    if !common::have("cc") {
        return;
    }
    let dir = common::dir("libc-static");
    let src = dir.0.join("hello.c");
    std::fs::write(&src, "#include <stdio.h>\n#include <stdlib.h>\nint main(void) { char *p = malloc(1 << 20); p[0] = 'x'; printf(\"%c\\n\", p[0]); free(p); return 3; }\n").unwrap();
    let (stat, dynamic) = (dir.0.join("hello-static"), dir.0.join("hello"));
    compile(&src, &dynamic, &[]).unwrap();
    if let Err(e) = compile(&src, &stat, &["-static"]) {
        eprintln!("skipped: no static libc ({})", e.lines().next().unwrap_or(""));
        return;
    }
    for mode in ["vcopy", "alloc", "merge"] {
        let out = Command::new(ADVM).args(["run", "--mode", mode, "--"]).arg(&stat).output().unwrap();
        assert_eq!((out.stdout.as_slice(), out.status.code()), (&b"x\n"[..], Some(3)), "{}", text(&out));
        let what = if mode == "merge" { "merge agent" } else { "shim" };
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "advm run: {} is statically linked: LD_PRELOAD cannot load the {what} into it, so it runs untouched (as --mode off)\n",
                stat.display()
            )
        );
        let out = Command::new(ADVM).args(["run", "--mode", mode, "--"]).arg(&dynamic).output().unwrap();
        assert_eq!((out.stdout.as_slice(), out.status.code()), (&b"x\n"[..], Some(3)), "{}", text(&out));
        assert!(!String::from_utf8_lossy(&out.stderr).contains("statically"), "{}", text(&out));
    }
}

/// A set-user-ID program owned by another user runs in the loader's secure-execution
/// mode, which ignores LD_PRELOAD: it runs untouched, and `advm run` says so (it used to
/// say nothing, and `--stats` reported no process); root's own set-user-ID program loads
/// the shim as any other.
#[test]
fn set_user_id_programs_of_another_user_run_untouched_and_advm_run_says_so() {
    use std::os::unix::fs::PermissionsExt;
    if !advm::process::is_root() {
        eprintln!("skipped: making a set-user-ID program of another user needs root");
        return;
    }
    let dir = common::dir("libc-setuid");
    let id = dir.0.join("id");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::os::unix::fs::chown(&id, Some(65534), None).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let plain = Command::new(&id).arg("-u").output().unwrap();
    if plain.stdout != b"65534\n" {
        eprintln!("skipped: the set-user-ID bit does nothing in {} (nosuid?)", dir.0.display());
        return;
    }
    for (mode, what) in [("vcopy", "shim"), ("merge", "merge agent")] {
        let out =
            Command::new(ADVM).args(["run", "--stats", "--mode", mode, "--"]).arg(&id).arg("-u").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.stdout.as_slice(), out.status.code()), (&b"65534\n"[..], Some(0)), "{}", text(&out));
        assert!(
            err.starts_with(&format!(
                "advm run: {} is set-user-ID (to uid 65534): the dynamic loader ignores LD_PRELOAD in it (secure-execution mode), so the {what} is not loaded and it runs untouched (as --mode off)\n",
                id.display()
            )),
            "{err}"
        );
        assert!(err.contains("0 process(es) reported") || err.contains("no merge ran"), "{err}");
    }
    std::os::unix::fs::chown(&id, Some(0), None).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = Command::new(ADVM).args(["run", "--stats", "--"]).arg(&id).arg("-u").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("set-user-ID") && err.contains(", 1 process(es) reported"), "{err}");
}

/// Under a finite RLIMIT_AS or RLIMIT_DATA from the start (`ulimit -v`, `ulimit -d`) the
/// shim stays off: the program runs as without advm, and `advm run` says why.
#[test]
fn a_finite_memory_limit_at_start_keeps_the_shim_off_and_advm_run_says_so() {
    for (flag, name) in [("-v", "Max address space"), ("-d", "Max data size")] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit {flag} 4000000 && exec \"$0\" run --stats -- true",))
            .arg(ADVM)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.starts_with(&format!(
                "advm run: {name} is limited (ulimit): the shim stays off, so true runs as under --mode off\n"
            )),
            "{err}"
        );
        assert!(err.contains(", 0 process(es) reported"), "the shim set up under ulimit {flag}: {err}");
    }
}
