//! `advm run`: unmodified R and Python produce byte-identical output under every mode
//! (scripts that copy, modify, sort, subset and fork via parallel::mclapply), `--stats`
//! reports virtual copies, the exit status is the program's, and `advm bench r --quick`
//! produces its table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// KSM settings are global: tests that change them take turns.
static KSM: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run advm");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `make test` installs R and NumPy (make deps-system): a missing one is a failure,
/// never a silent pass. `ADVM_TEST_SKIP_MISSING=1` turns it into an explicit skip
/// that says why, for machines that run `cargo test` without the deps.
fn need(program: &str, args: &[&str], install: &str) -> bool {
    if Command::new(program).args(args).output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    let why = format!("`{program} {}` failed: install {install} (make deps-system does)", args.join(" "));
    if std::env::var_os("ADVM_TEST_SKIP_MISSING").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED (ADVM_TEST_SKIP_MISSING=1): {why}");
        return false;
    }
    panic!("{why}; set ADVM_TEST_SKIP_MISSING=1 to skip instead");
}

fn need_r() -> bool {
    need("Rscript", &["--version"], "r-base-core")
}

fn need_numpy() -> bool {
    need("/usr/bin/python3", &["-c", "import numpy, pandas"], "python3-numpy python3-pandas")
}

fn modes() -> Vec<&'static str> {
    let root = advm::probe::facts().root;
    if root && advm::ksm::available() {
        vec!["off", "alloc", "ksm", "ksm-aggr", "vcopy"]
    } else {
        eprintln!("ksm and ksm-aggr modes skipped: they need root and KSM (/sys/kernel/mm/ksm)");
        vec!["off", "alloc", "vcopy"]
    }
}

/// Runs `program args` under every mode and asserts the same stdout as `off`.
fn same_output_everywhere(program: &str, args: &[String], scale: &str) {
    let _guard = KSM.lock().unwrap_or_else(|e| e.into_inner());
    let mut reference: Option<Vec<u8>> = None;
    for mode in modes() {
        let out = ok(Command::new(ADVM)
            .args(["run", "--mode", mode, "--"])
            .arg(program)
            .args(args)
            .env("ADVM_BENCH_SCALE", scale)
            .env("ADVM_BENCH_DIR", repo().join("bench/run")));
        assert!(!out.stdout.is_empty(), "{program} {args:?} printed nothing under {mode}");
        match &reference {
            None => reference = Some(out.stdout),
            Some(r) => assert_eq!(
                String::from_utf8_lossy(r),
                String::from_utf8_lossy(&out.stdout),
                "{args:?}: output under mode {mode} differs from the untouched program"
            ),
        }
    }
}

#[test]
fn r_scripts_give_identical_output_in_every_mode() {
    if !need_r() {
        return;
    }
    for script in ["fork_mclapply.R", "b25_sort.R", "b25_matrix.R", "b25_vector.R", "ml_knn.R", "ml_rpart.R"] {
        let path = repo().join("bench/run").join(script).display().to_string();
        same_output_everywhere("Rscript", &["--vanilla".into(), path], "0.02");
    }
}

#[test]
fn python_numpy_pandas_gives_identical_output_in_every_mode() {
    if !need_numpy() {
        return;
    }
    let path = repo().join("bench/run/numpy_copy.py").display().to_string();
    same_output_everywhere("/usr/bin/python3", &[path], "0.05");
}

#[test]
fn stats_report_virtual_copies_on_stderr_only() {
    if !need_numpy() {
        return;
    }
    let prog = "import numpy as np\na = np.arange(1 << 20, dtype=np.float64)\nb = a.copy()\nb[5] = -1\nprint(a[5], b[5], int(b.sum()))";
    let out = ok(Command::new(ADVM).args(["run", "--stats", "--", "/usr/bin/python3", "-c", prog]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5.0 -1.0 549755289594\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("advm run: mode vcopy, threshold 8192 bytes"), "{err}");
    let line = err.lines().find(|l| l.contains("large copies")).expect("copies line");
    let made: u64 = line.split_whitespace().rev().nth(2).unwrap().parse().unwrap();
    assert!(made >= 1, "no virtual copy reported: {err}");
    assert!(err.contains("bytes not copied"), "{err}");
}

/// `--mode cow`, the name before `vcopy`, still selects virtual copies for one release;
/// `--stats` reports the current name and `--help` says which name is deprecated.
#[test]
fn deprecated_mode_name_cow_runs_vcopy() {
    // a 64 KiB block copied with memcpy: a virtual copy in vcopy mode, none in alloc
    let c = "#include <stdlib.h>\n#include <string.h>\nint main(void){char*a=malloc(1<<16),*b=malloc(1<<16);\n\
             memset(a,1,1<<16);memcpy(b,a,1<<16);return b[100]!=1;}\n";
    let dir = std::env::temp_dir().join(format!("advm-run-alias-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("copy.c"), dir.join("copy"));
    std::fs::write(&src, c).unwrap();
    let built = Command::new("cc").args(["-O1", "-fno-builtin", "-o"]).arg(&exe).arg(&src).status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let exe = exe.display().to_string();
    for mode in ["cow", "vcopy"] {
        let out = ok(Command::new(ADVM).args(["run", "--stats", "--mode", mode, "--", &exe]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("advm run: mode vcopy,"), "--mode {mode}: {err}");
        assert!(err.contains("1 seen, 1 made virtual"), "--mode {mode} made no virtual copy: {err}");
    }
    let out = ok(Command::new(ADVM).args(["run", "--stats", "--mode", "alloc", "--", &exe]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 made virtual"));
    let help = ok(Command::new(ADVM).args(["run", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    let line = help.lines().find(|l| l.trim_start().starts_with("- vcopy:")).expect("vcopy in --help");
    assert!(line.contains("`cow`: deprecated name"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exit_status_and_bad_usage() {
    let st = Command::new(ADVM).args(["run", "--", "sh", "-c", "exit 7"]).status().unwrap();
    assert_eq!(st.code(), Some(7));
    let out = Command::new(ADVM).args(["run", "--mode", "bogus", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'bogus' for '--mode <MODE>'"));
    let out = Command::new(ADVM).args(["run", "--", "/nonexistent/prog"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "advm: running /nonexistent/prog: No such file or directory (os error 2)"
    );
    let out = Command::new(ADVM).args(["run", "--stats", "--mode", "off", "--", "true"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mode off: the shim was not loaded"));
}

#[test]
fn killing_bench_r_during_a_ksm_mode_stops_it_and_restores_ksm() {
    if !need_r() {
        return;
    }
    let knob = |k: &str| std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{k}")).ok();
    let _guard = KSM.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(before), Some(run_before)) = (knob("pages_to_scan"), knob("run")) else {
        eprintln!("skipped: no KSM here");
        return;
    };
    if before.trim() == "1000" {
        eprintln!("skipped: KSM already scans 1000 pages, the ksm-aggr setting this test waits for");
        return;
    }
    let mut child = Command::new(ADVM)
        .args(["bench", "r", "--quick"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    // Kill as soon as the ksm-aggr run has changed KSM: the bench holds stopping
    // signals from before that change until its program exists, then hands them on.
    while knob("pages_to_scan").as_deref().map(str::trim) != Some("1000") {
        if child.try_wait().unwrap().is_some() {
            eprintln!("skipped: the bench ended before its ksm-aggr run (no KSM modes without root)");
            return;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(120), "ksm-aggr run never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the bench went on after SIGTERM: {err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(knob("pages_to_scan"), Some(before), "KSM scan rate not restored");
    assert_eq!(knob("run"), Some(run_before), "KSM run state not restored");
}

#[test]
fn bench_r_quick_runs_all_five_modes() {
    if !need_r() {
        return;
    }
    let _guard = KSM.lock().unwrap_or_else(|e| e.into_inner());
    let out = ok(Command::new(ADVM).args(["bench", "r", "--quick", "--runs", "2", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let modes: Vec<&str> = rows
        .iter()
        .filter(|r| r["config"][0][1] == "b25_sort.R")
        .map(|r| r["config"][1][1].as_str().unwrap())
        .collect();
    let expected =
        if modes.len() == 5 { vec!["off", "alloc", "ksm", "ksm-aggr", "cow"] } else { vec!["off", "alloc", "cow"] };
    assert_eq!(modes, expected);
    let cow = rows.iter().find(|r| r["config"][0][1] == "b25_sort.R" && r["config"][1][1] == "cow").unwrap();
    let fig = |name: &str| {
        cow["figures"].as_array().unwrap().iter().find(|f| f["name"] == name).unwrap()["median"].as_f64().unwrap()
    };
    assert!(fig("virtual copies") >= 1.0, "{cow}");
    assert!(fig("samples") >= 1.0, "{cow}");
    let notes = v["notes"].as_array().unwrap();
    assert!(!notes.iter().any(|n| n.as_str().unwrap().contains("differs")), "{notes:?}");
}

/// As a user who may not change KSM's settings (uid 65534 when the tests run as root),
/// `--mode ksm` says that root is needed and leaves nothing behind. It used to fail
/// with a bare "Permission denied" on /run/advm and leave its statistics directory.
#[test]
fn ksm_mode_without_root_says_root_is_needed_and_leaves_nothing() {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    if !advm::ksm::available() {
        eprintln!("skipped: no KSM");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("advm-test-run-ksm-unprivileged-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cmd = Command::new(ADVM);
    cmd.args(["run", "--stats", "--mode", "ksm", "--", "true"]).env("TMPDIR", &tmp).env("XDG_CACHE_HOME", &tmp);
    if advm::process::is_root() {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("advm-run-"))
        .collect();
    let _ = std::fs::remove_dir_all(&tmp);
    if err.contains("advm: ") && err.contains("os error 13") && err.contains("target") {
        eprintln!("skipped: advm not runnable as uid 65534: {err}");
        return;
    }
    assert!(!out.status.success());
    assert!(err.contains("changing KSM's settings (/sys/kernel/mm/ksm) needs root"), "{err}");
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A home where no cache can be made (a service account's `/nonexistent`, here a path
/// under /proc that nobody may create) puts the shim in `$TMPDIR/advm-<euid>` instead:
/// `advm run` used to fail with "installing the preload shim into ...: Permission
/// denied" before running the program.
#[test]
fn a_home_without_a_cache_directory_keeps_the_shim_in_the_temporary_directory() {
    let tmp = std::env::temp_dir().join(format!("advm-test-run-no-home-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new(ADVM)
        .args(["run", "--stats", "--", "true"])
        .env("HOME", "/proc/advm-no-home")
        .env_remove("XDG_CACHE_HOME")
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let installed = std::fs::read_dir(tmp.join(format!("advm-{}", advm::process::euid())))
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libadvm-preload-")));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(", 1 process(es) reported"), "{err}");
    assert!(matches!(installed, Ok(true)), "no shim in the temporary directory: {installed:?}");
}
