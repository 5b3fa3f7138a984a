//! `advm bench` stopped by a signal: it cleans up after itself (its memory cgroups,
//! its measured children) and ends with an `interrupted` error.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// Where `Group::create` makes this process's groups (v1 memory or v2 hierarchy).
fn groups_dir() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (root, rel) = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        if ctl.split(',').any(|c| c == "memory") {
            Some(("/sys/fs/cgroup/memory", path))
        } else {
            None
        }
    })?;
    Some(PathBuf::from(root).join(rel.trim_start_matches('/')).join("advm"))
}

/// Groups of run `pid` (`<name>-<pid>-<n>`).
fn groups_of(pid: u32) -> Vec<String> {
    let Some(dir) = groups_dir() else { return Vec::new() };
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.contains(&format!("-{pid}-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigterm_to_bench_stat_mid_run_removes_its_cgroup_and_says_interrupted() {
    if !advm::process::is_root() || groups_dir().is_none() {
        eprintln!("skipped: needs root and a v1 memory cgroup");
        return;
    }
    let child = Command::new(ADVM)
        .args(["bench", "stat", "--quick"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t = Instant::now();
    // stop it while its measured child runs in a group of its own
    while groups_of(pid).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(60), "bench stat made no cgroup");
        std::thread::sleep(Duration::from_millis(5));
    }
    advm::process::terminate(pid).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the bench went on after SIGTERM: {err}");
    assert!(err.contains("interrupted") && err.contains("SIGTERM"), "{err}");
    assert!(out.stdout.is_empty(), "no report after an interrupt");
    assert_eq!(groups_of(pid), Vec::<String>::new(), "cgroups of the bench left");
    let scratch: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("advm-") && n.contains(&pid.to_string()))
        .collect();
    assert!(scratch.is_empty(), "scratch left: {scratch:?}");
}
