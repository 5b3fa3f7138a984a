//! `advm run --cgroup` and `advm stat --cgroup PATH`: the cgroup meter from the command
//! line. Needs root and a memory cgroup; skips with the reason otherwise.

use std::process::Command;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// Why the cgroup meter cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    match advm::stats::cgroup::Group::create("cli-probe") {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn json_of(stderr: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stderr);
    let start = text.find('{').unwrap_or_else(|| panic!("no JSON in {text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn run_cgroup_reports_the_programs_anon_peak_and_removes_its_group() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    // 64 MiB written and held 300 ms (several 50 ms samples), then the program ends
    let script = "import time; b = b'x' * (64 << 20); time.sleep(0.3)";
    let out = Command::new(ADVM)
        .args(["run", "--mode", "off", "--cgroup", "--json", "--", "python3", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out.stderr);
    let peak = v["anon_shmem_bytes"]["max"].as_f64().unwrap() / 1048576.0;
    // the interpreter's own few MiB on top
    assert!((64.0..96.0).contains(&peak), "peak {peak} MiB, want 64 MiB and the interpreter");
    let group = std::path::PathBuf::from(v["group"].as_str().unwrap());
    assert!(!group.exists(), "{} left behind", group.display());
}

#[test]
fn run_cgroup_passes_on_the_exit_status_and_leaves_no_group() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let out =
        Command::new(ADVM).args(["run", "--mode", "off", "--cgroup", "--", "sh", "-c", "exit 5"]).output().unwrap();
    assert_eq!(out.status.code(), Some(5));
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text.lines().find(|l| l.contains("memory cgroup")).unwrap_or_else(|| panic!("{text}"));
    let path = line.split_whitespace().nth(3).unwrap();
    assert!(!std::path::Path::new(path).exists(), "{path} left behind");
    assert!(text.contains("anon+shmem") && text.contains("page cache"), "{text}");
}

/// A process the program leaves running in the background outlives `advm run --cgroup`
/// as it outlives the program without advm; the group is removed all the same. advm
/// used to kill it a second after the program exited (the group's removal killed
/// whatever was still in it).
#[test]
fn run_cgroup_lets_a_background_child_live_on_and_removes_its_group() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let out = Command::new(ADVM)
        .args(["run", "--mode", "off", "--cgroup", "--json", "--", "sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(") ").next().and_then(|rest| rest.chars().next());
    // SAFETY: kill(2) on the sleep this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(state, Some('S'), "the background sleep {pid} did not live on: {stat:?}");
    let group = std::path::PathBuf::from(json_of(&out.stderr)["group"].as_str().unwrap().to_string());
    assert!(!group.exists(), "{} left behind", group.display());
}

#[test]
fn stat_cgroup_reads_an_existing_group() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let g = advm::stats::cgroup::Group::create("cli-stat").unwrap();
    let out = Command::new(ADVM).arg("stat").arg("--cgroup").arg(g.path()).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["usage"]["page_cache_bytes"].is_u64(), "{v}");
    let out = Command::new(ADVM).args(["stat", "--cgroup", "/proc/self"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory.stat"));
}

/// `advm stat --cgroup PATH --watch SECS` ends after SECS, whatever `--interval`: the
/// sampler slept a whole interval before it saw the stop (`--watch 0.3 --interval
/// 60000` took 60 s), and its JSON has the documented fields (docs/stat.md).
#[test]
fn stat_cgroup_watch_ends_on_time_with_a_long_interval() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let g = advm::stats::cgroup::Group::create("cli-stat-watch").unwrap();
    let t0 = std::time::Instant::now();
    let out = Command::new(ADVM)
        .arg("stat")
        .arg("--cgroup")
        .arg(g.path())
        .args(["--json", "--watch", "0.3", "--interval", "60000"])
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in ["group", "version", "samples", "interval_ms", "anon_shmem_bytes", "page_cache_bytes", "last"] {
        assert!(v.get(f).is_some(), "no field {f:?} in {v}");
    }
    assert!(v["anon_shmem_bytes"]["max"].is_number() && v["last"]["page_cache_bytes"].is_u64(), "{v}");
}
