//! `advm run` killed mid-run still restores the KSM settings it changed, and ends as
//! its program did.
//! (Its own test binary: test binaries run one at a time, so no other KSM user races it.)

use std::process::Command;
use std::time::{Duration, Instant};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

fn ksm(knob: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{knob}")).ok().map(|s| s.trim().to_string())
}

#[test]
fn sigterm_ends_the_program_and_ksm_settings_come_back() {
    if !advm::process::is_root() || ksm("run").is_none() {
        eprintln!("skipped: needs root and KSM to change KSM settings");
        return;
    }
    let before = (ksm("run"), ksm("pages_to_scan"), ksm("sleep_millisecs"));
    let mut child = Command::new(ADVM).args(["run", "--mode", "ksm-aggr", "--", "sleep", "30"]).spawn().unwrap();
    // Wait until advm has switched KSM to 1000 pages per wake-up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ksm("pages_to_scan").as_deref() != Some("1000") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ksm("pages_to_scan").as_deref(), Some("1000"), "advm run never set KSM");
    std::thread::sleep(Duration::from_millis(200));
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "sleep was not ended by the forwarded SIGTERM");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit.signal(), Some(15), "advm ends as the program did: by SIGTERM");
    assert_eq!((ksm("run"), ksm("pages_to_scan"), ksm("sleep_millisecs")), before);
}

/// `advm run --stats` killed outright (SIGKILL: no cleanup) leaves its statistics
/// directory; the next `advm run`, with `--stats` or without (any mode), removes it,
/// since no live run holds its lock. Only a next run with `--stats` used to.
#[test]
fn a_sigkilled_runs_statistics_directory_is_removed_by_the_next_run() {
    let next: [&[&str]; 3] =
        [&["run", "--stats", "--", "true"], &["run", "--", "true"], &["run", "--mode", "off", "--", "true"]];
    for next in next {
        sigkilled_run_then(next);
    }
}

fn sigkilled_run_then(next: &[&str]) {
    // A directory of its own: any `advm run` removes a killed run's directory, so one
    // in another test of this binary took it before the check below (a CI failure).
    let tmp = std::env::temp_dir().join(format!("advm-run-signals-{}-{}", std::process::id(), next.len()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut child =
        Command::new(ADVM).env("TMPDIR", &tmp).args(["run", "--stats", "--", "sleep", "29.123"]).spawn().unwrap();
    let prefix = format!("advm-run-{}-", child.id());
    let ours = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while ours().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = ours();
    assert_eq!(left.len(), 1, "advm run made no statistics directory");
    child.kill().unwrap();
    child.wait().unwrap();
    // sleep lives on as an orphan; its fds do not hold the directory's lock (close-on-exec)
    assert!(left[0].is_dir());
    let out = Command::new(ADVM).env("TMPDIR", &tmp).args(next).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!left[0].exists(), "the killed run's directory {} is still there after advm {next:?}", left[0].display());
    let _ = Command::new("pkill").args(["-f", "^sleep 29.123$"]).status();
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A program killed by a signal: advm dies of the same signal, as the program itself
/// would look to its waiter. It used to exit with 128 + the signal's number.
#[test]
fn a_program_killed_by_a_signal_kills_advm_by_the_same_signal() {
    use std::os::unix::process::ExitStatusExt;
    for (mode, sig) in [("off", 9), ("vcopy", 11), ("alloc", 6), ("vcopy", 15)] {
        let script = format!("kill -{sig} $$");
        let exit = Command::new(ADVM).args(["run", "--mode", mode, "--", "sh", "-c", &script]).status().unwrap();
        assert_eq!((exit.signal(), exit.code(), exit.core_dumped()), (Some(sig), None, false), "mode {mode}");
    }
    let exit = Command::new(ADVM).args(["run", "--", "sh", "-c", "exit 42"]).status().unwrap();
    assert_eq!(exit.code(), Some(42));
}

/// Ctrl-C (SIGINT to the process group) stops a shell script that runs `advm run` in a
/// loop, as it stops one that runs the program itself: bash goes on after a child that
/// exited, even with 130, and stops only for one that died of SIGINT. The loop used to
/// run to its end.
#[test]
fn ctrl_c_stops_a_shell_loop_over_advm_run() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let script = format!("for i in 1 2 3; do {ADVM} run -- sleep 5; echo next $i; done");
    // SIGINT at its default in bash, whatever this test inherited: a harness started as
    // a script's `&` job ignores it, and then so do bash and (rightly) advm and sleep.
    let child = Command::new("env")
        .args(["--default-signal=INT", "bash", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Until advm has started sleep: then the SIGINT reaches sleep, not a shell between.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = child.id().to_string();
    let sleeping = || {
        let out = Command::new("pgrep").args(["-g", &pid, "-x", "sleep"]).output().unwrap();
        !out.stdout.is_empty()
    };
    while !sleeping() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sleeping(), "advm run never started sleep");
    let pgid = format!("-{pid}");
    assert!(Command::new("kill").args(["-INT", "--", &pgid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "the loop went on after Ctrl-C");
    assert_eq!(out.status.signal(), Some(2), "bash ends by SIGINT");
}

/// Signals ignored when `advm run` starts (`nohup`, a script's `&` job) stay ignored in
/// the program, as without advm; others reach it at their default. advm used to put
/// handlers over ignored SIGHUP and SIGINT, so the program, execed with defaults, died
/// of a hangup `nohup` was meant to keep from it.
#[test]
fn signals_ignored_when_advm_run_starts_stay_ignored_in_the_program() {
    // SigIgn in /proc/self/status: bit n-1 for signal n (HUP 1, INT 2, QUIT 3, TERM 15)
    let ignored = |env_arg: &str| {
        let out = Command::new("env")
            .args([env_arg, ADVM, "run", "--mode", "vcopy", "--", "grep", "^SigIgn:", "/proc/self/status"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        u64::from_str_radix(text.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap()
    };
    let bits = |sigs: &[u32]| sigs.iter().map(|s| 1u64 << (s - 1)).sum::<u64>();
    let all = bits(&[1, 2, 3, 15]);
    assert_eq!(ignored("--ignore-signal=HUP,INT,QUIT,TERM") & all, all);
    assert_eq!(ignored("--default-signal=HUP,INT,QUIT,TERM") & all, 0);
}

/// A program that cannot be started: 127 when not found, 126 when not executable, as
/// a shell and env(1) say, with advm's message. Both used to exit 1, like a program's
/// own failure.
#[test]
fn a_program_not_found_exits_127_and_one_not_executable_126() {
    let plain = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("run_signals-not-executable");
    std::fs::write(&plain, "echo never\n").unwrap();
    let plain = plain.to_str().unwrap();
    for (mode, program, code) in
        [("vcopy", "/nonexistent/advm-test-program", 127), ("off", "advm-no-such-program", 127), ("vcopy", plain, 126)]
    {
        let out = Command::new(ADVM).args(["run", "--mode", mode, "--", program]).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{mode} {program}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("advm: running {program}: ")), "{out:?}");
    }
}
