//! `advm run` with a JVM (OpenJDK's HotSpot): the same output as a plain run under
//! every mode, with HotSpot's own SIGSEGV use (stack overflows, implicit null checks,
//! safepoints), threads, child processes and direct buffers; and a live Java heap
//! merged (`advm merge PID`) while four threads write and the collector moves objects
//! keeps every write. Skipped, with the reason, when `java`/`javac` are absent.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// AdvmJava compiled into `dir`, or None (reason printed) without a JDK.
fn compiled(dir: &Path) -> Option<PathBuf> {
    if !common::have("java") || !common::have("javac") {
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/AdvmJava.java");
    let st = Command::new("javac").arg("-d").arg(dir).arg(&src).status().unwrap();
    assert!(st.success(), "javac {} failed", src.display());
    Some(dir.to_path_buf())
}

/// `java [opts] AdvmJava args` under `advm run --mode mode` (None: no advm at all);
/// asserts it exited 0 and left no hs_err file; returns its stdout.
fn java(cls: &Path, mode: Option<&str>, opts: &[&str], args: &[&str]) -> String {
    let mut cmd = match mode {
        Some(m) => {
            let mut c = Command::new(ADVM);
            c.args(["run", "--mode", m, "--", "java"]);
            c
        }
        None => Command::new("java"),
    };
    let out = cmd
        .args(opts)
        .arg("-cp")
        .arg(cls)
        .arg("AdvmJava")
        .args(args)
        .current_dir(cls)
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let crashed: Vec<_> = std::fs::read_dir(cls)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with("hs_err"))
        .collect();
    assert!(
        out.status.success() && crashed.is_empty(),
        "{mode:?} {args:?}: {} {crashed:?}\n{stdout}\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

/// Whether this user may open a userfaultfd (the merge agent's fence) for user pages.
fn fence_allowed() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false);
    root || std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "1")
}

#[test]
fn java_prints_the_same_under_every_mode() {
    let d = common::dir("java-modes");
    let Some(cls) = compiled(&d.0) else { return };
    let opts = ["-XX:+UseSerialGC", "-Xmx512m", "-XX:TieredStopAtLevel=1"];
    let plain = java(&cls, None, &opts, &["suite"]);
    assert!(plain.contains("signals 5 overflows 2500 null checks") && plain.contains("fork 4/4"), "{plain}");
    for mode in ["alloc", "vcopy", "merge"] {
        assert_eq!(java(&cls, Some(mode), &opts, &["suite"]), plain, "mode {mode}");
    }
}

#[test]
fn a_live_java_heap_merged_while_threads_write_and_the_collector_moves_keeps_every_write() {
    let d = common::dir("java-merge");
    let Some(cls) = compiled(&d.0) else { return };
    if !fence_allowed() {
        eprintln!("skipped: the merge agent's fence needs userfaultfd (root, or vm.unprivileged_userfaultfd=1)");
        return;
    }
    let mut child = Command::new(ADVM)
        .args(["run", "--mode", "merge", "--merge-after", "3600", "--", "java", "-XX:+UseG1GC", "-Xmx256m", "-cp"])
        .arg(&cls)
        .args(["AdvmJava", "hold", "32", "0"])
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
    let pid = kids.split_whitespace().next().expect("advm run has a child");
    let r = Command::new(ADVM).args(["merge", pid, "--json"]).output().unwrap();
    assert!(r.status.success(), "advm merge: {}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    // the 32 MiB are held twice, in 1 MiB arrays G1 puts at region starts
    assert!(v["merged"].as_u64().unwrap() >= 4096, "{v}");
    // writes go on over the merged pages, then the program checks every array
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(child.stdin.take());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "hold 32 MiB ok", "a write was lost or a byte changed");
    assert!(child.wait().unwrap().success());
}
