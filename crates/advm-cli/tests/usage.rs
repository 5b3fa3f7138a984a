//! The command line as a script meets it: every command's `--help`, values refused
//! while the arguments are parsed (status 2, nothing run), and a benchmark's `--out`
//! checked before the benchmark runs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// Runs `advm args`, killing it after 20 s; returns (status, stdout, stderr).
fn advm(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(ADVM).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("advm {args:?} still ran after 20 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), s(out.stdout), s(out.stderr))
}

/// The subcommands a `--help` lists (its "Commands:" section, without `help`).
fn subcommands(help: &str) -> Vec<String> {
    let Some(list) = help.split("Commands:\n").nth(1) else { return Vec::new() };
    list.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect()
}

/// Every command's `--help` (and `-h`) prints its usage on stdout and exits 0, and
/// none shows a rustdoc link: `advm vm run --help` said "blocks of at least
/// [`QEMU_BLOCK_MIN`]" (a doc comment that clap prints as written).
#[test]
fn every_command_has_help_without_rustdoc_links() {
    let mut todo = vec![Vec::<String>::new()];
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        for flag in ["--help", "-h"] {
            let args: Vec<&str> = path.iter().map(String::as_str).chain([flag]).collect();
            let (code, out, err) = advm(&args);
            assert_eq!((code, err.as_str()), (0, ""), "advm {args:?}");
            assert!(out.contains("Usage: advm"), "advm {args:?}: {out}");
            assert!(!out.contains("[`"), "advm {args:?} shows a rustdoc link: {out}");
            if flag == "--help" {
                todo.extend(subcommands(&out).into_iter().map(|s| [path.clone(), vec![s]].concat()));
            }
        }
        seen += 1;
    }
    // advm, doctor, stat, image (info, map, cat), bench, vm (image, build, run, dump),
    // run, merge, daemon, demo
    assert!(seen >= 17, "only {seen} commands found");
}

/// Values no run can use are refused by the argument parser: `stat --watch inf` (and
/// 1e300) panicked converting to a Duration (status 101), `--watch nan` and
/// `--watch=-1` sampled until the process exited, as `--watch 0` does;
/// `bench --runs 0` ran one repetition and reported `"runs": 0`.
/// `advm run --json` needs `--stats` or `--cgroup` (either or both).
#[test]
fn values_out_of_range_are_refused_before_anything_runs() {
    for (args, says) in [
        (&["stat", "self", "--watch", "inf"][..], "\"inf\" is not a number of seconds in 0..=31536000"),
        (&["stat", "self", "--watch", "1e300"][..], "\"1e300\" is not a number of seconds in 0..=31536000"),
        (&["stat", "self", "--watch", "nan"][..], "\"nan\" is not a number of seconds in 0..=31536000"),
        (&["stat", "self", "--watch=-1"][..], "\"-1\" is not a number of seconds in 0..=31536000"),
        (&["stat", "--cgroup", "/", "--watch", "inf"][..], "\"inf\" is not a number of seconds in 0..=31536000"),
        (&["bench", "stat", "--quick", "--runs", "0"][..], "0 is not in 1..=1000000"),
        // These two were refused after parsing, with status 1, as if something had failed.
        (&["stat", "self", "--watch", "1", "--interval", "0"][..], "0 is not in 1..=86400000"),
        (&["run", "--json", "--", "true"][..], "<--stats|--cgroup>"),
    ] {
        let (code, out, err) = advm(args);
        assert_eq!((code, out.as_str()), (2, ""), "advm {args:?}: {err}");
        assert!(err.contains(says), "advm {args:?}: {err}");
    }
    let (code, _, err) = advm(&["run", "--mode", "off", "--json", "--stats", "--cgroup", "--", "true"]);
    assert!(code == 0 || err.contains("needs root"), "{err}");
}

/// `advm bench NAME --out FILE` checks FILE can be written before it runs the
/// benchmark: it wrote the file at the end, so a missing directory lost the report of
/// a run that may take an hour. The check leaves no file behind, and a file that was
/// there keeps its contents when the run fails.
#[test]
fn bench_out_that_cannot_be_written_fails_before_the_benchmark() {
    let dir = std::env::temp_dir().join(format!("advm-cli-test-{}-bench-out", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing/stat.json");
    let (code, out, err) = advm(&["bench", "stat", "--quick", "--out", missing.to_str().unwrap()]);
    assert_eq!(
        (code, out.as_str(), err),
        (1, "", format!("advm: --out {}: No such file or directory (os error 2)\n", missing.display()))
    );
    let (code, out, err) = advm(&["bench", "stat", "--quick", "--out", dir.to_str().unwrap()]);
    assert_eq!(
        (code, out.as_str(), err),
        (1, "", format!("advm: --out {}: Is a directory (os error 21)\n", dir.display()))
    );
    // A writable path passes the check and is not left behind when the name is unknown.
    let fresh = dir.join("fresh.json");
    let (code, _, err) = advm(&["bench", "no-such-bench", "--out", fresh.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("advm: no benchmark named \"no-such-bench\""), "{err}");
    assert!(!fresh.exists(), "the check left {}", fresh.display());
    let kept = dir.join("kept.json");
    std::fs::write(&kept, "earlier report").unwrap();
    let (code, _, _) = advm(&["bench", "no-such-bench", "--out", kept.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "earlier report");
    std::fs::remove_dir_all(&dir).unwrap();
}
