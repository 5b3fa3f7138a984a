//! `advm stat` against an independent count, and its failure modes.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// The `testproc` example (examples/testproc.rs), a process with a known memory
/// layout: `cargo test -p advm-cli` builds it into target/<profile>/examples/, the
/// directory above this test binary's.
fn testproc() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let path = profile.join("examples").join("testproc");
    assert!(
        path.exists(),
        "{} is missing: `cargo test -p advm-cli` builds it (a run with only `--test stat` does not; \
         `cargo build -p advm-cli --examples` then)",
        path.display()
    );
    path
}

/// A testproc child, killed on drop.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(testproc())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn testproc");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Proc(child)
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pfns_visible() -> bool {
    if !advm::probe::facts().pfn_visible {
        eprintln!("skipped: PFNs are hidden here (needs CAP_SYS_ADMIN)");
        return false;
    }
    true
}

/// Counts distinct present PFNs of `pid` the slow, obvious way: every VMA of maps,
/// one pagemap entry at a time, into a HashSet. Shares no code with advm::stats.
fn independent_distinct_pfns(pid: i32) -> (usize, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut set = HashSet::new();
    let mut mapped = 0u64;
    for line in maps.lines() {
        if line.ends_with("[vsyscall]") {
            continue;
        }
        let range = line.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap());
        for page in (a..b).step_by(4096) {
            pagemap.seek(SeekFrom::Start(page / 4096 * 8)).unwrap();
            let mut e = [0u8; 8];
            pagemap.read_exact(&mut e).unwrap();
            let e = u64::from_le_bytes(e);
            if e >> 63 == 1 {
                mapped += 1;
                set.insert(e & ((1 << 55) - 1));
            }
        }
    }
    (set.len(), mapped)
}

fn stat_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(ADVM).arg("stat").arg("--json").args(args).output().unwrap();
    assert!(out.status.success(), "advm stat failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn distinct_pages_agree_with_independent_count_and_rss_double_counts() {
    if !pfns_visible() {
        return;
    }
    // 64 MiB of memfd pages mapped at two addresses.
    let p = Proc::spawn(&["shared-pages", "--pages", "16384", "--times", "2"]);
    let s = stat_json(&[&p.pid().to_string()]);
    let (independent, mapped) = independent_distinct_pfns(p.pid());
    let ours = s["distinct"]["total"].as_u64().unwrap() as f64;
    let diff = (ours - independent as f64).abs() / independent as f64;
    assert!(diff < 0.01, "advm {ours} vs independent {independent} distinct pages");
    assert!(s["distinct"]["shmem"].as_u64().unwrap() >= 16384);
    // The zero page is reported apart from distinct pages; the independent count keeps it.
    assert!((s["mapped_pages"].as_u64().unwrap() + s["zero_page_mappings"].as_u64().unwrap()).abs_diff(mapped) < 100);
    let rss_pages = s["rss_bytes"].as_u64().unwrap() as f64 / 4096.0;
    let ratio = rss_pages / ours;
    assert!((1.8..2.05).contains(&ratio), "RSS {rss_pages} pages vs {ours} distinct: ratio {ratio}");
    assert_eq!(s["physical_source"], "distinct_pfns");
}

#[test]
fn pages_shared_between_two_processes_count_once() {
    if !pfns_visible() {
        return;
    }
    let a = Proc::spawn(&["shared-pages", "--pages", "4096", "--times", "1"]);
    let b = Proc::spawn(&["anon", "--mib", "16"]);
    let sa = stat_json(&[&a.pid().to_string()]);
    let both = stat_json(&[&a.pid().to_string(), &b.pid().to_string()]);
    let sb = stat_json(&[&b.pid().to_string()]);
    let (ta, tb, tboth) = (
        sa["distinct"]["total"].as_u64().unwrap(),
        sb["distinct"]["total"].as_u64().unwrap(),
        both["distinct"]["total"].as_u64().unwrap(),
    );
    // The two processes run the same binary: its file pages count once in the union.
    assert!(tboth < ta + tb, "union {tboth} should be below {ta} + {tb}");
    assert!(tboth >= ta.max(tb) + 4096 - 64, "union {tboth} too small");
    assert_eq!(both["processes"].as_array().unwrap().len(), 2);
}

#[test]
fn process_exiting_mid_measurement_is_a_clear_error() {
    let mut p = Proc::spawn(&["anon", "--mib", "4"]);
    let mut meter = advm::stats::Meter::new(&[p.pid()], Default::default()).unwrap();
    meter.sample().unwrap();
    p.0.kill().unwrap();
    p.0.wait().unwrap();
    let e = meter.sample().unwrap_err();
    assert_eq!(e.to_string(), format!("process {} exited during measurement", p.pid()));
}

#[test]
fn watch_ends_early_when_the_process_exits() {
    let mut p = Proc::spawn(&["anon", "--mib", "4"]);
    let mut meter = advm::stats::Meter::new(&[p.pid()], Default::default()).unwrap();
    let mut n = 0;
    let summary = advm::stats::watch(&mut meter, None, std::time::Duration::from_millis(20), |_| {
        n += 1;
        if n == 3 {
            p.0.kill().unwrap();
            p.0.wait().unwrap();
        }
    })
    .unwrap();
    assert_eq!(summary.samples, 3);
    assert!(summary.ended_early.unwrap().contains("exited during measurement"));
    assert!(summary.physical_bytes.mean >= 4.0 * 1024.0 * 1024.0);
}

#[test]
fn missing_pid_is_named() {
    let out = Command::new(ADVM).args(["stat", "2147483647"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "advm: process 2147483647 does not exist");
    let out = Command::new(ADVM).args(["stat", "-5"]).output().unwrap();
    assert!(!out.status.success());
    let out = Command::new(ADVM).args(["stat", "abc"]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "advm: invalid pid \"abc\": expected a positive number or `self`"
    );
}

#[test]
fn hidden_pfns_fall_back_to_pss() {
    let s = stat_json(&["--hide-pfns", "self"]);
    assert_eq!(s["pfn_visible"], false);
    assert_eq!(s["physical_source"], "pss");
    assert!(s["distinct"].is_null());
    assert_eq!(s["physical_bytes"], s["pss_bytes"]);
}

#[test]
fn unprivileged_user_sees_the_pss_fallback() {
    if !advm::process::is_root() {
        eprintln!("skipped: needs root to switch to an unprivileged uid");
        return;
    }
    let out = Command::new(ADVM).args(["stat", "--json", "self"]).uid(65534).gid(65534).output().unwrap();
    if !out.status.success() {
        // A target dir the nobody user cannot reach is an environment limit, not a bug.
        eprintln!("skipped: advm not runnable as uid 65534: {}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["pfn_visible"], false);
    assert_eq!(s["physical_source"], "pss");
    assert!(s["pss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn watch_reports_mean_and_max() {
    let p = Proc::spawn(&["anon", "--mib", "8"]);
    let out = Command::new(ADVM)
        .args(["stat", "--json", "--watch", "0.3", "--interval", "50", &p.pid().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(s["samples"].as_u64().unwrap() >= 3);
    assert!(s["physical_bytes"]["max"].as_f64().unwrap() >= s["physical_bytes"]["mean"].as_f64().unwrap());
    assert!(s["ended_early"].is_null());
}

#[test]
fn doctor_json_lists_checks_and_facts() {
    let out = Command::new(ADVM).args(["doctor", "--json"]).output().unwrap();
    assert!(out.status.success());
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = d["checks"].as_array().unwrap();
    for name in [
        "kernel",
        "userfaultfd",
        "uffd MOVE",
        "uffd WP",
        "memfd",
        "ksm",
        "pagemap PFNs",
        "max_map_count",
        "THP",
        "swap",
    ] {
        let c = checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"));
        assert!(["ok", "degraded", "missing"].contains(&c["status"].as_str().unwrap()));
        assert!(!c["consequence"].as_str().unwrap().is_empty());
    }
    assert!(d["facts"]["page_size_bytes"].as_u64().unwrap() >= 4096);
}

#[test]
fn bench_quick_json_has_the_shared_shape() {
    let out = Command::new(ADVM).args(["bench", "stat", "--quick", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["name"], "stat");
    let fig = &r["rows"][0]["figures"][0];
    for k in ["name", "unit", "runs", "median", "min", "max"] {
        assert!(!fig[k].is_null(), "figure lacks {k}");
    }
    assert!(r["machine"]["kernel_release"].is_string());
    let out = Command::new(ADVM).args(["bench", "nosuch"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no benchmark named \"nosuch\"; available: stat"));
}

#[test]
fn a_process_that_execs_is_followed_into_its_new_image() {
    // Rscript and many launchers exec: the pagemap opened before pins the old mm.
    let script = format!("read line; exec {} anon --mib 8", testproc().display());
    let mut child =
        Command::new("/bin/sh").args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let mut meter = advm::stats::Meter::new(&[pid], Default::default()).unwrap();
    let before = meter.sample().unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let after = meter.sample().unwrap();
    assert!(
        after.rss_bytes >= 8 << 20 && after.rss_bytes > before.rss_bytes,
        "{} -> {}",
        before.rss_bytes,
        after.rss_bytes
    );
    assert_eq!(after.processes[0].comm, "testproc");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}
