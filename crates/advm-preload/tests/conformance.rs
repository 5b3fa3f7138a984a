//! The virtual-copy conformance suite (`tests/conformance/vcopy/` at the repository
//! root): every C program there is compiled once per backend and run on each variant,
//! with the same oracle (shadow copies kept by the program itself):
//!
//! - `capi`: the Rust arena through `include/advm.h` and `libadvm.so`;
//! - `shim`: plain malloc/free/memcpy under the LD_PRELOAD shim, mode vcopy;
//! - `shim-memfd`: the same binary, mode vcopy with `ADVM_VCOPY_FRESH=memfd`.
//!
//! A run passes when the program exits 0 within its time limit and made virtual
//! copies (pages shared > 0: a suite that only ever fell back to memcpy proves nothing).
//! The report lists every program and variant; failures not in [`KNOWN_FAILING`] fail
//! the test.
//!
//! It lives in advm-preload because this crate builds the shim; `libadvm.so` comes from
//! `cargo build` (which `make test` runs first), found next to this test's binary.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../advm-capi/tests/support/fresh_so.rs"]
mod fresh_so;

/// Runs that fail on today's code because of known defects being fixed elsewhere:
/// (program, variant, defect). Printed as KNOWN FAILING whether they fail or not;
/// remove an entry once its fix is merged (the run then has to pass).
const KNOWN_FAILING: &[(&str, &str, &str)] = &[];

const VARIANTS: &[&str] = &["capi", "shim", "shim-memfd"];
/// A hang's limit, not a speed check: vma_budget takes 1.2 s on a quiet machine, 5-7.5 s
/// at load 8, and once hit 30 s at load 9.
const TIME_LIMIT: Duration = Duration::from_secs(90);

fn compile(src: &Path, backend: &str, out: &Path, include: &Path, libdir: &Path) -> Result<(), String> {
    let mut cc = Command::new("cc");
    // -fno-builtin: every malloc/memcpy is a real call (the shim backend's subject);
    // no loop distribution: the oracle's byte loops must not become memcpy calls.
    cc.args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-fno-builtin"])
        .arg("-fno-tree-loop-distribute-patterns")
        .arg(src)
        .arg("-o")
        .arg(out);
    if backend == "capi" {
        cc.arg("-DVC_BACKEND_CAPI")
            .arg("-I")
            .arg(include)
            .arg(format!("-L{}", libdir.display()))
            .arg(format!("-Wl,-rpath,{}", libdir.display()))
            .arg("-ladvm");
    } else {
        cc.arg("-DVC_BACKEND_SHIM");
    }
    let o = cc.output().map_err(|e| format!("running cc: {e}"))?;
    if !o.status.success() {
        return Err(format!("compiling failed:\n{}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(())
}

/// Sums `key` over the shim's per-process statistics files in `dir`.
fn shim_stat(dir: &Path, key: &str) -> u64 {
    let mut sum = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for line in std::fs::read_to_string(e.path()).unwrap_or_default().lines() {
            let mut it = line.split_whitespace();
            if it.next() == Some(key) {
                sum += it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    sum
}

/// Runs one program on one variant: Ok(summary line) or Err(how it failed).
fn run(exe: &Path, variant: &str, shim: &Path, work: &Path) -> Result<String, String> {
    let name = exe.file_name().unwrap().to_string_lossy().to_string();
    let stats = work.join(format!("stats-{name}-{variant}"));
    let _ = std::fs::remove_dir_all(&stats);
    std::fs::create_dir_all(&stats).unwrap();
    let out_path = work.join(format!("{name}-{variant}.out"));
    let out = File::create(&out_path).unwrap();
    let mut cmd = Command::new(exe);
    cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
    if variant != "capi" {
        cmd.env("LD_PRELOAD", shim)
            .env("ADVM_MODE", "vcopy")
            .env("ADVM_VCOPY_FRESH", if variant == "shim-memfd" { "memfd" } else { "anon" })
            // copies from 2 pages on are virtual (the capi's default), not from 16
            .env("ADVM_COPY_MIN_PAGES", "2")
            .env("ADVM_STATS_DIR", &stats);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("spawning: {e}"))?;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let secs = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let status = match status {
        None => return Err(format!("timed out after {}s (stuck?); output:\n{text}", TIME_LIMIT.as_secs())),
        Some(s) => s,
    };
    if !status.success() {
        return Err(format!("{status} after {secs:.1}s; output:\n{text}"));
    }
    let shared = if variant == "capi" {
        text.rsplit("pages_shared ").next().and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(0)
    } else {
        shim_stat(&stats, "pages_shared")
    };
    if shared == 0 {
        return Err(format!("exited 0 but shared no page (no virtual copy made); output:\n{text}"));
    }
    let last = text.lines().last().unwrap_or("").replace("pages_shared -1", &format!("pages_shared {shared}"));
    Ok(format!("{last} ({secs:.1}s)"))
}

#[test]
fn vcopy_conformance_both_backends() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let suite = root.join("tests/conformance/vcopy");
    let include = root.join("include");
    let libdir = fresh_so::libadvm_dir();
    let work = fresh_so::work_dir("vcopy-conformance");
    let shim = advm_preload::install(&work).unwrap();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&suite)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 6, "conformance programs missing in {}: {sources:?}", suite.display());
    for &(prog, variant, _) in KNOWN_FAILING {
        assert!(VARIANTS.contains(&variant), "KNOWN_FAILING names an unknown variant {variant}");
        assert!(
            sources.iter().any(|s| s.file_stem().is_some_and(|n| n == prog)),
            "KNOWN_FAILING names a missing program {prog}"
        );
    }
    let started = Instant::now();
    let mut results: BTreeMap<(String, &str), Result<String, String>> = BTreeMap::new();
    for src in &sources {
        let prog = src.file_stem().unwrap().to_string_lossy().to_string();
        for backend in ["capi", "shim"] {
            let exe = work.join(format!("{prog}-{backend}"));
            let built = compile(src, backend, &exe, &include, &libdir);
            for &variant in VARIANTS.iter().filter(|v| v.starts_with(backend)) {
                let r = match &built {
                    Ok(()) => run(&exe, variant, &shim, &work),
                    Err(e) => Err(e.clone()),
                };
                results.insert((prog.clone(), variant), r);
            }
        }
    }
    let mut failed = Vec::new();
    eprintln!("virtual-copy conformance ({} programs x {VARIANTS:?}):", sources.len());
    for ((prog, variant), r) in &results {
        let known = KNOWN_FAILING.iter().find(|k| k.0 == prog && k.1 == *variant);
        match (r, known) {
            (Ok(line), None) => eprintln!("  pass  {prog:<14} {variant:<11} {line}"),
            (Ok(line), Some(k)) => loud(&format!(
                "!!!! KNOWN FAILING {prog} on {variant} PASSED this run (defect: {}); \
                 if it is fixed, remove its KNOWN_FAILING entry: {line}",
                k.2
            )),
            (Err(why), Some(k)) => loud(&format!(
                "!!!! KNOWN FAILING {prog} on {variant} failed as expected (defect: {}):\n{}",
                k.2,
                indent(why)
            )),
            (Err(why), None) => {
                eprintln!("  FAIL  {prog:<14} {variant:<11}\n{}", indent(why));
                failed.push(format!("{prog} on {variant}"));
            }
        }
    }
    eprintln!("suite ran in {:.1}s", started.elapsed().as_secs_f64());
    assert!(failed.is_empty(), "virtual-copy conformance failed: {}", failed.join(", "));
}

/// Written to stderr itself, not through eprintln!: the test harness captures that
/// for passing tests, and a known failure must show in every `make test`.
fn loud(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "vcopy conformance: {msg}");
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("        {l}")).collect::<Vec<_>>().join("\n")
}
