//! `advm run` on realistic unmodified Python and R programs (tests/programs/sweep/),
//! the fast tier of `bench/run/pysweep.py`: under every mode (off, alloc, vcopy, ksm,
//! ksm-aggr, merge) each prints what the plain run prints and exits as it does
//! (multiprocessing with fork and forkserver, os.fork + os.wait, NumPy copies, memmap,
//! save/load, pandas, R copies, data frames and mclapply, exit 3, SIGKILL, SIGSEGV,
//! os._exit in a child), `--stats --json` (and `--cgroup --json` where a memory cgroup
//! can be made) are well-formed; SIGINT gives Python its KeyboardInterrupt as without
//! advm; a weights server merged by `advm merge PID` keeps its bytes and writes stay
//! private; fork and forkserver workers merge under `--mode merge`. Skipped with the
//! reason without NumPy/pandas or R.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");
const PY: &str = "/usr/bin/python3";

/// KSM settings are global: runs under the ksm modes take turns.
static KSM: Mutex<()> = Mutex::new(());

fn program(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/sweep").join(name).display().to_string()
}

fn have(program: &str, args: &[&str], what: &str) -> bool {
    let ok = Command::new(program).args(args).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: `{program} {}` failed: {what} missing (make deps-system installs it)", args.join(" "));
    }
    ok
}

fn have_numpy() -> bool {
    have(PY, &["-c", "import numpy, pandas"], "NumPy or pandas")
}

fn have_r() -> bool {
    common::have("Rscript")
}

fn modes() -> Vec<&'static str> {
    if advm::probe::facts().root && advm::ksm::available() {
        vec!["alloc", "vcopy", "ksm", "ksm-aggr", "merge"]
    } else {
        eprintln!("ksm and ksm-aggr modes not run: they need root and KSM (/sys/kernel/mm/ksm)");
        vec!["alloc", "vcopy", "merge"]
    }
}

fn cgroup_here() -> bool {
    advm::stats::cgroup::Group::create("sweep-probe").is_ok()
}

/// `argv` at this scale; no advm daemon (merge mode keeps its store in the process).
fn command(prefix: &[&str], argv: &[&str], scale: &str) -> Command {
    let all: Vec<&str> = prefix.iter().chain(argv).copied().collect();
    let mut c = Command::new(all[0]);
    c.args(&all[1..])
        .env("SWEEP_SCALE", scale)
        .env("ADVM_SOCKET", "/nonexistent/advm-sweep-test.sock")
        .current_dir(std::env::temp_dir());
    c
}

/// advm's JSON reports: the objects that start a line of stderr.
fn reports(stderr: &str) -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    for (k, _) in stderr.match_indices('{').filter(|(k, _)| *k == 0 || stderr.as_bytes()[k - 1] == b'\n') {
        let mut it = serde_json::Deserializer::from_str(&stderr[k..]).into_iter::<serde_json::Value>();
        if let Some(Ok(v)) = it.next() {
            docs.push(v);
        }
    }
    docs
}

/// Runs `argv` plainly, then under every mode with `--stats --json` (and `--cgroup`):
/// the same stdout and exit status, and well-formed reports.
fn same_everywhere(argv: &[&str], scale: &str) {
    let plain = command(&[], argv, scale).output().unwrap();
    let cgroup = cgroup_here();
    if !cgroup {
        eprintln!("--cgroup not checked: no memory cgroup can be made here");
    }
    for mode in modes() {
        let _ksm = mode.starts_with("ksm").then(|| KSM.lock().unwrap_or_else(|e| e.into_inner()));
        let mut prefix = vec![ADVM, "run", "--mode", mode, "--stats", "--json"];
        if cgroup {
            prefix.push("--cgroup");
        }
        prefix.push("--");
        let out: Output = command(&prefix, argv, scale).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{argv:?} under {mode}: stdout differs from the plain run; stderr:\n{err}"
        );
        assert_eq!(out.status.code(), plain.status.code(), "{argv:?} under {mode}: exit status; stderr:\n{err}");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            std::os::unix::process::ExitStatusExt::signal(&plain.status),
            "{argv:?} under {mode}: signal; stderr:\n{err}"
        );
        let docs = reports(&err);
        let stats: Vec<_> = docs.iter().filter(|d| d.get("mode").is_some()).collect();
        assert_eq!(stats.len(), 1, "{argv:?} under {mode}: one --stats document wanted:\n{err}");
        assert_eq!(stats[0]["mode"], mode, "{err}");
        let key = if mode == "merge" { "merge_agent" } else { "counters" };
        assert!(stats[0][key].is_object(), "{argv:?} under {mode}: no {key} in {}", stats[0]);
        if cgroup {
            let g: Vec<_> = docs.iter().filter(|d| d.get("anon_shmem_bytes").is_some()).collect();
            assert_eq!(g.len(), 1, "{argv:?} under {mode}: one --cgroup document wanted:\n{err}");
            assert!(g[0]["anon_shmem_bytes"]["max"].as_f64().is_some_and(|m| m >= 0.0), "{}", g[0]);
        }
    }
}

#[test]
fn python_multiprocessing_fork_and_forkserver() {
    if have_numpy() {
        for w in ["mp_fork", "mp_forkserver"] {
            same_everywhere(&[PY, &program("py_workloads.py"), w], "0.15");
        }
    }
}

#[test]
fn python_os_fork_wait_and_numpy_arrays() {
    if have_numpy() {
        for w in ["fork_wait", "numpy_ops"] {
            same_everywhere(&[PY, &program("py_workloads.py"), w], "0.25");
        }
    }
}

#[test]
fn pandas_groupby_and_merge() {
    if have_numpy() {
        same_everywhere(&[PY, &program("py_workloads.py"), "pandas_ops"], "0.1");
    }
}

#[test]
fn python_exit_3_sigkill_sigsegv_and_os_exit_in_a_child() {
    if have_numpy() {
        for how in ["code3", "sigkill", "sigsegv", "child_os_exit"] {
            same_everywhere(&[PY, &program("py_workloads.py"), "exits", how], "0.1");
        }
    }
}

#[test]
fn r_vectors_frames_and_mclapply() {
    if have_r() {
        for w in ["vectors", "parallel"] {
            same_everywhere(&["Rscript", "--vanilla", &program("r_workloads.R"), w], "0.1");
        }
    }
}

/// SIGINT sent to the Python process under advm, or to the whole process group as a
/// terminal's Ctrl-C: KeyboardInterrupt caught, exit 0; uncaught, Python dies of
/// SIGINT, and so does advm; the traceback as without advm.
#[test]
fn sigint_gives_python_its_keyboard_interrupt() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    if !have_numpy() {
        return;
    }
    let py = program("py_workloads.py");
    let run = |mode: Option<&str>, catch: bool, group: bool| {
        let mut argv = vec![PY, &py, "interrupt"];
        if catch {
            argv.push("catch");
        }
        // SIGINT at its default, whatever this test inherited: Python started with it
        // ignored (a runner's `&` job) keeps it ignored, under advm or not.
        let mut prefix = vec!["env", "--default-signal=INT"];
        if let Some(m) = mode {
            prefix.extend([ADVM, "run", "--mode", m, "--"]);
        }
        let mut cmd = command(&prefix, &argv, "0.1");
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "{mode:?}");
        let pid = if mode.is_some() { target_pid(child.id()) } else { child.id() };
        std::thread::sleep(std::time::Duration::from_millis(200));
        // the group's id is the first process's (advm's, or the plain Python's)
        let whom = if group { format!("-{}", child.id()) } else { pid.to_string() };
        assert!(Command::new("kill").args(["-INT", "--", &whom]).status().unwrap().success());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let o = child.wait_with_output().unwrap();
        let tb = String::from_utf8_lossy(&o.stderr).contains("KeyboardInterrupt");
        (o.status.code(), o.status.signal(), rest, tb)
    };
    for (catch, group) in [(true, false), (false, false), (true, true), (false, true)] {
        let plain = run(None, catch, group);
        assert_eq!(plain.0.or(plain.1), Some(if catch { 0 } else { libc::SIGINT }), "{plain:?}");
        for mode in ["vcopy", "merge"] {
            assert_eq!(
                run(Some(mode), catch, group),
                plain,
                "SIGINT under {mode}, caught: {catch}, to the group: {group}"
            );
        }
    }
}

/// Under `--mode merge`, `multiprocessing` workers started by fork and forkserver (a
/// fork of a fork) merge what they load, as spawn's do: each loads 16 MiB of weights,
/// waits, loads them again and serves; the quiet-period merges add the first copy and
/// share the second's pages. A forked child had no merge agent (the agent thread
/// stays in the parent): 0 pages merged under fork and forkserver.
#[test]
fn merge_mode_merges_in_forked_multiprocessing_workers() {
    if !have_numpy() {
        return;
    }
    for method in ["fork", "forkserver"] {
        let prefix = [ADVM, "run", "--mode", "merge", "--merge-after", "0.3", "--stats", "--json", "--"];
        let out = command(&prefix, &[PY, &program("py_workloads.py"), "pool_load", method], "1")
            .env("SWEEP_HOLD", "1.5")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{method}: {err}");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("[(True, "), "{method}: {err}");
        let docs = reports(&err);
        let agent =
            &docs.iter().find(|d| d["mode"] == "merge").unwrap_or_else(|| panic!("no report: {err}"))["merge_agent"];
        // two workers, each sharing its second 16 MiB copy (4096 pages) with its first
        let merged = agent["merged"].as_u64().unwrap();
        assert!(merged >= 2 * 4000, "{method}: {merged} pages merged: {agent}");
    }
}

/// The program under `advm run` (advm's only child).
fn target_pid(advm: u32) -> u32 {
    let t = std::time::Instant::now();
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{advm}/task/{advm}/children")).unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next() {
            return k.parse().unwrap();
        }
        assert!(t.elapsed().as_secs() < 10, "advm run {advm} has no child");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn distinct_anon(pid: u32) -> f64 {
    let o = Command::new(ADVM).args(["stat", "--json", &pid.to_string()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["anon_shmem_bytes"].as_f64().unwrap()
}

/// A worker that loads the same 40 MB of weights twice (np.load, a fine-tune touching
/// one page in a hundred) and serves, under `--mode merge --merge-after 1`, then
/// `advm merge PID`: pages merged, every weight as loaded, later writes private.
#[test]
fn a_numpy_weights_server_merged_keeps_its_bytes_and_writes_stay_private() {
    if !have_numpy() {
        return;
    }
    let dir = common::dir("sweep-serve");
    let weights = dir.0.join("w.npy").display().to_string();
    let py = program("py_workloads.py");
    assert!(command(&[], &[PY, &py, "make_weights", &weights], "0.4").status().unwrap().success());
    let prefix = [ADVM, "run", "--mode", "merge", "--merge-after", "1", "--stats", "--json", "--"];
    let mut child = command(&prefix, &[PY, &py, "serve", &weights], "0.4")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    assert!(ready.starts_with("ready "), "{ready:?}");
    let mut input = child.stdin.take().unwrap();
    let mut ask = |cmd: &str| {
        writeln!(input, "{cmd}").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim().to_string()
    };
    let pid = target_pid(child.id());
    let before = distinct_anon(pid);
    let sum = ask("sum");
    let m = Command::new(ADVM).args(["merge", &pid.to_string(), "--json"]).output().unwrap();
    assert!(m.status.success(), "advm merge: {}", String::from_utf8_lossy(&m.stderr));
    let after = distinct_anon(pid);
    assert_eq!(ask("check"), "check [True, True]");
    assert_eq!(ask("sum"), sum, "the weights' sums changed by the merge");
    assert_eq!(ask("write 5 42.5"), "wrote 42.5 True", "a write to one model showed in the other");
    assert_eq!(ask("write 300000 -1"), "wrote -1.0 True");
    assert_eq!(ask("check"), "check [True, True]");
    writeln!(input, "quit").unwrap();
    drop(input);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let docs = reports(&err);
    let agent =
        &docs.iter().find(|d| d["mode"] == "merge").unwrap_or_else(|| panic!("no report: {err}"))["merge_agent"];
    let merged = agent["merged"].as_u64().unwrap();
    // two models of 40 MB alike but for 1%: at least half of one model's pages shared
    assert!(merged >= 4000, "{merged} pages merged: {agent}");
    assert!(after < before - 16.0 * 1048576.0, "distinct anon+shmem {before} -> {after}: nothing saved");
}
