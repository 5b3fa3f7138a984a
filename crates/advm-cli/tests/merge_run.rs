//! `advm run --mode merge` and `advm merge PID`: an unmodified Python program holding
//! the same content twice gets its heap merged (pagemap shows shared frames) while its
//! threads write throughout (checked against a shadow copy), keeps running, forks after;
//! `advm merge` on a process not under the mode says so.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

fn program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/merge_target.py")
}

/// libadvm.so (the agent) comes from `cargo build` (make test runs it first); a stale
/// one would test old code. None (reason printed) when pagemap frames are hidden.
fn ready() -> bool {
    let dir = Path::new(ADVM).parent().unwrap();
    let (so, rlib) = (dir.join("libadvm.so"), dir.join("libadvm.rlib"));
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    assert!(so.exists(), "{} missing: run `cargo build -p advm-capi` first (make test does)", so.display());
    assert!(mtime(&so) >= mtime(&rlib), "{} is older than the rlib: run `cargo build -p advm-capi`", so.display());
    if !rustix_is_root() {
        eprintln!("skipped: pagemap shows frame numbers to root only");
        return false;
    }
    true
}

fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

fn start(mode: &str, after: &str) -> std::process::Child {
    start_with(mode, after, &[])
}

fn start_with(mode: &str, after: &str, options: &[&str]) -> std::process::Child {
    Command::new(ADVM)
        .args(["run", "--mode", "merge", "--merge-after", after])
        .args(options)
        .args(["--", "python3"])
        .arg(program())
        .arg(mode)
        // the process's own store: no dependence on a daemon on this machine
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(if options.is_empty() { Stdio::inherit() } else { Stdio::piped() })
        .spawn()
        .expect("start advm run")
}

/// The python process under `advm run` (advm's only child).
fn target_pid(advm: u32) -> u32 {
    let kids = std::fs::read_to_string(format!("/proc/{advm}/task/{advm}/children")).unwrap();
    kids.split_whitespace().next().expect("advm run has a child").parse().unwrap()
}

fn finish(child: std::process::Child, out: BufReader<std::process::ChildStdout>) {
    finish_with_stderr(child, out);
}

/// Waits for the program's "ok" and its end; returns what advm wrote on stderr (when
/// piped).
fn finish_with_stderr(mut child: std::process::Child, mut out: BufReader<std::process::ChildStdout>) -> String {
    let mut line = String::new();
    while line.trim().is_empty() || line.trim() == "ready" {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success() && line.starts_with("ok"), "the program failed ({status}): {line} {err}");
    eprintln!("{line}");
    err
}

#[test]
fn advm_merge_pid_merges_a_running_program_while_its_threads_write_and_it_forks_after() {
    if !ready() {
        return;
    }
    let mut child = start_with("ask", "3600", &["--stats", "--json"]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = target_pid(child.id());
    let r = Command::new(ADVM).args(["merge", &pid.to_string(), "--json"]).output().unwrap();
    assert!(r.status.success(), "advm merge failed: {}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let pages = |k: &str| v[k].as_u64().unwrap();
    // b alone is 8192 pages nobody writes (equal to a's, and repeating every 256 pages)
    assert!(pages("merged") + pages("added") >= 8192, "merged too few pages: {v}");
    assert!(pages("mappings") >= 2, "{v}");
    assert!(v["via"]["local"]["reason"].as_str().unwrap().contains("not reachable"), "{v}");
    // The fields docs/merge.md lists for `advm merge --json`, and no others.
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    let listed = [
        "added",
        "busy",
        "bytes",
        "mappings",
        "merged",
        "ok",
        "phases",
        "refusal",
        "refused",
        "seconds",
        "skipped",
        "stopped",
        "via",
        "zero_dropped",
    ];
    assert_eq!(keys, listed, "{v}");
    // The phases say where the time went (they were all 0 for the agent's merges).
    let phase = |k: &str| v["phases"][k].as_f64().unwrap_or_else(|| panic!("phases.{k} in {v}"));
    let sum: f64 = ["fence_s", "hash_s", "lookup_s", "add_s", "map_s"].iter().map(|k| phase(k)).sum();
    assert!(phase("fence_s") > 0.0 && phase("hash_s") > 0.0 && phase("map_s") > 0.0, "{v}");
    assert!(sum <= v["seconds"].as_f64().unwrap() * 1.01 + 1e-3, "the phases are parts of the seconds: {v}");
    child.stdin.as_mut().unwrap().write_all(b"check\n").unwrap();
    // --stats counts the requested merge (no quiet period came in 3600 s)
    let err = finish_with_stderr(child, out);
    let s: serde_json::Value = serde_json::from_str(&err).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(s["merge_agent"]["merges"], 1, "{s}");
    assert_eq!(s["merge_agent"]["merged"], v["merged"], "{s} against {v}");
}

#[test]
fn a_program_under_merge_mode_is_merged_after_a_quiet_period() {
    if !ready() {
        return;
    }
    let mut child = start("auto", "0.5");
    let out = BufReader::new(child.stdout.take().unwrap());
    finish(child, out);
}

/// `--stats` reports the agent's merges, in text and in JSON.
#[test]
fn merge_mode_stats_report_the_agents_merges() {
    if !ready() {
        return;
    }
    let mut child = start_with("auto", "0.5", &["--stats", "--json"]);
    let out = BufReader::new(child.stdout.take().unwrap());
    let err = finish_with_stderr(child, out);
    let v: serde_json::Value = serde_json::from_str(&err).unwrap_or_else(|e| panic!("{e}: {err}"));
    let t = &v["merge_agent"];
    let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_eq!(v["mode"], "merge", "{v}");
    assert_eq!(n("processes"), 1, "{v}");
    assert!(n("merges") >= 1, "{v}");
    // b alone is 8192 pages nobody writes (equal to a's, and repeating every 256 pages)
    assert!(n("merged") + n("added") >= 8192, "{v}");
    assert!(t["seconds"].as_f64().unwrap() > 0.0 && n("bytes") > 0, "{v}");

    let mut child = start_with("auto", "0.5", &["--stats"]);
    let out = BufReader::new(child.stdout.take().unwrap());
    let err = finish_with_stderr(child, out);
    assert!(err.starts_with("advm run: mode merge, 1 process(es) reported\n  agent merges "), "{err}");
}

/// A program that merged its data and then drops it: the agent sees the process's
/// store mappings shrink and trims, letting the dropped pages go while it runs.
#[test]
fn the_agent_trims_the_pages_a_program_dropped() {
    if !ready() {
        return;
    }
    // 48 MiB of new bytes (glibc maps them on their own, and unmaps them at `del`),
    // merged after 0.3 s of quiet, then dropped.
    let prog =
        "import os, time\na = bytearray(os.urandom(48 << 20))\ntime.sleep(3)\ndel a\ntime.sleep(2.5)\nprint('ok')";
    let mut child = Command::new(ADVM)
        .args(["run", "--mode", "merge", "--merge-after", "0.3", "--stats", "--json", "--", "python3", "-c", prog])
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start advm run");
    let out = BufReader::new(child.stdout.take().unwrap());
    let err = finish_with_stderr(child, out);
    let v: serde_json::Value = serde_json::from_str(&err).unwrap_or_else(|e| panic!("{e}: {err}"));
    let n = |k: &str| v["merge_agent"][k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert!(n("added") >= 12_000, "the 48 MiB were added: {v}");
    assert!(n("trims") >= 2 && n("released") >= 12_000, "a trim after the merge, one after the drop: {v}");
}

#[test]
fn advm_merge_on_a_process_not_under_merge_mode_says_so() {
    let mut sleeper = Command::new("sleep").arg("10").spawn().unwrap();
    let r = Command::new(ADVM).args(["merge", &sleeper.id().to_string()]).output().unwrap();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success());
    assert!(err.contains("not running under `advm run --mode merge`"), "{err}");
    let r = Command::new(ADVM).args(["merge", "4000000"]).output().unwrap();
    assert!(String::from_utf8_lossy(&r.stderr).contains("no process 4000000"));
}

/// A program that closes every descriptor above stderr and gets the merge agent's
/// control socket number back for a listening socket of its own accepts all its
/// connections (the agent used to accept one and close it), and the agent binds its
/// name again: a lookup on it still answers.
#[test]
fn a_program_that_closes_every_fd_keeps_its_connections_and_the_agent_still_answers() {
    if !ready() {
        return;
    }
    let prog = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/closes_fds.py");
    let out = Command::new(ADVM)
        .args(["run", "--mode", "merge", "--", "python3"])
        .arg(prog)
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("accepted 5 of 5\n"), "{text}");
    assert!(text.contains("\"ok\":true"), "{text}");
}
