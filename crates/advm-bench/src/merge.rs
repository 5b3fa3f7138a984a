//! `advm bench merge`: the UPM paper's experiment. N Python workers serve one model
//! with onnxruntime, its weights in page-aligned anonymous memory; they run with no
//! dedup, with KSM (the whole process mergeable, `PR_SET_MEMORY_MERGE`) at 100 and 1000
//! pages per 20 ms, merge their weight buffers with `advm.merge` through an advmd
//! started for the run, or run unmodified under `advm run --mode merge` (the merge
//! agent merges each worker's large anonymous mappings after a quiet period of
//! [`RUN_MERGE_AFTER`] seconds, through the same kind of advmd). Workers and daemon share one memory cgroup, so the daemon's
//! store is counted by both meters. Per run: memory of all of them together at the end
//! (both meters) against no dedup, time from load to that saving, merge throughput,
//! ksmd CPU, request latency before and after merging.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use advm::stats::cgroup::Group;
use advm::stats::{self as st, Options};

use crate::merge_plot;
use crate::meters::{in_group, Both};
use crate::{Bench, BenchError, BenchOpts, DemoRow, Figure, Report, Row};

const WORKER: &str = include_str!("../../../bench/merge/worker.py");
const MAKE_MODELS: &str = include_str!("../../../bench/merge/make_models.py");

/// The benchmark.
pub struct MergeBench;

/// `--merge-after` of the run-mode workers, seconds.
const RUN_MERGE_AFTER: f64 = 0.5;

#[derive(Clone, Copy, PartialEq)]
enum Method {
    None,
    Ksm(u32),
    Merge,
    /// Unmodified workers under `advm run --mode merge`.
    RunMerge,
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::None => "no dedup".into(),
            Method::Ksm(p) => format!("KSM {p} pages/20 ms"),
            Method::Merge => "advm.merge (advmd)".into(),
            Method::RunMerge => "advm run --mode merge (advmd)".into(),
        }
    }
    fn worker_arg(self) -> &'static str {
        match self {
            Method::None | Method::RunMerge => "none",
            Method::Ksm(_) => "ksm",
            Method::Merge => "merge",
        }
    }
}

/// What one run measured.
struct Outcome {
    distinct: f64,
    cgroup: Option<f64>,
    /// Seconds from all workers loaded to within 5% of the final memory (KSM), or the
    /// longest merge (advm.merge).
    to_saving_s: f64,
    throughput_gbs: Vec<f64>,
    ksmd_cpu_s: f64,
    lat_before: Vec<f64>,
    lat_after: Vec<f64>,
    /// (seconds since start, distinct bytes, cgroup bytes) every 100 ms.
    series: Vec<(f64, u64, Option<u64>)>,
    /// Where the workers' merges spent their time (advm.merge), for the notes.
    phases: Option<String>,
}

/// Each worker's merge in one line: seconds, pages added and merged, and its phases
/// (seconds), slowest first.
fn merge_phases(merges: &[&serde_json::Value]) -> Option<String> {
    let mut rows: Vec<(f64, String)> = merges
        .iter()
        .filter_map(|m| {
            let p = &m["phases"];
            let f = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
            let s = m["seconds"].as_f64()?;
            Some((
                s,
                format!(
                    "{s:.2} s ({} added, {} merged: fence {:.2}, hash {:.2}, lookup {:.2}, add {:.2}, map {:.2})",
                    m["added"],
                    m["merged"],
                    f("fence"),
                    f("hash"),
                    f("lookup"),
                    f("add"),
                    f("map")
                ),
            ))
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    (!rows.is_empty()).then(|| rows.into_iter().map(|r| r.1).collect::<Vec<_>>().join("; "))
}

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-merge")
}

/// The Python with onnxruntime, onnx, numpy and advm: `$ADVM_PYTHON`, else the
/// virtualenv `make deps-python-bench` fills.
fn python() -> Result<PathBuf, BenchError> {
    let py = std::env::var_os("ADVM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python"));
    // One interpreter start checks the packages and prints the advm package's source
    // id: the workers merge through the package's own copy of the library, and a
    // package built from other sources would measure other code than this build's.
    let out = Command::new(&py)
        .args([
            "-c",
            "import onnxruntime, onnx, numpy, advm, rapidocr_onnxruntime; \
             print(getattr(advm._advm, '__source_id__', 'none'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(out) = out else {
        return Err(BenchError::Usage(format!(
            "bench merge needs {} with onnxruntime, onnx, rapidocr-onnxruntime, numpy and the advm package: \
             run `make deps-python-bench test-python` (or set ADVM_PYTHON)",
            py.display()
        )));
    };
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if id != advm::SOURCE_ID {
        return Err(BenchError::Usage(format!(
            "the advm package in {} was built from other sources than this advm (source id {id}, this build {}): \
             run `make test-python` (or `pip install ./crates/advm-py` into it) first",
            py.display(),
            advm::SOURCE_ID
        )));
    }
    Ok(py)
}

fn io(what: &str, e: std::io::Error) -> BenchError {
    BenchError::Usage(format!("{what}: {e}"))
}

/// Writes the scripts and builds the models once.
fn models(py: &Path) -> Result<PathBuf, BenchError> {
    let dir = bench_dir();
    std::fs::create_dir_all(&dir).map_err(|e| io("bench dir", e))?;
    std::fs::write(dir.join("worker.py"), WORKER).map_err(|e| io("worker.py", e))?;
    std::fs::write(dir.join("make_models.py"), MAKE_MODELS).map_err(|e| io("make_models.py", e))?;
    let models = dir.join("models");
    if !models.join("resnet50.json").exists() {
        let s = Command::new(py).arg(dir.join("make_models.py")).arg(&models).status().map_err(|e| io("python", e))?;
        if !s.success() {
            return Err(BenchError::Usage(format!("building the models failed ({s})")));
        }
    }
    Ok(models)
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

fn line(w: &mut Worker) -> Result<serde_json::Value, BenchError> {
    let mut s = String::new();
    w.out.read_line(&mut s).map_err(|e| io("worker output", e))?;
    if s.is_empty() {
        let status = w.child.wait().map_err(|e| io("worker", e))?;
        if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
            if [libc::SIGTERM, libc::SIGHUP, libc::SIGINT].contains(&sig) {
                return Err(BenchError::Interrupted(format!("a worker got signal {sig}")));
            }
        }
        return Err(BenchError::Usage(format!("a worker ended without reporting ({status})")));
    }
    serde_json::from_str(&s).map_err(|e| BenchError::Usage(format!("worker said {s:?}: {e}")))
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default()
}

/// `advm daemon` on a socket of the bench's, stopped (socket and lock file gone) on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        crate::stop_daemon(&mut self.child, &self.socket);
    }
}

impl Daemon {
    /// Starts `advm daemon` on `sock` (in `group` when given) and waits up to 10 s
    /// for it to listen. `$ADVM_BENCH_MERGE_DAEMON_ARGS` (split at spaces) is added to
    /// its command line, e.g. `--check-hashes-one-in 1` to compare settings.
    fn start(sock: &Path, group: Option<&Group>) -> Result<Self, BenchError> {
        let exe = std::env::current_exe().map_err(|e| io("current exe", e))?;
        let mut cmd = Command::new(exe);
        cmd.args(["daemon", "--socket"]).arg(sock).stderr(Stdio::null());
        let extra = std::env::var("ADVM_BENCH_MERGE_DAEMON_ARGS").unwrap_or_default();
        cmd.args(extra.split_whitespace());
        if let Some(g) = group {
            g.join_at_exec(&mut cmd)?;
        }
        let d = Daemon { child: cmd.spawn().map_err(|e| io("advm daemon", e))?, socket: sock.to_path_buf() };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::Usage("advm daemon did not start listening in 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }
}

fn run_one(
    py: &Path,
    models: &Path,
    model: &str,
    n: usize,
    method: Method,
    quick: bool,
    stagger: bool,
) -> Result<Outcome, BenchError> {
    let group = Group::create(&format!("advm-bench-merge-{}", std::process::id()))?;
    let sock = bench_dir().join(format!("advmd-{}.sock", std::process::id()));
    let mut pids: Vec<i32> = Vec::new();
    // Ctrl-C and kill end the first worker, not the bench, which then cleans up (KSM,
    // the cgroup, the daemon); held until that worker exists.
    let signals = advm::process::ForwardSignals::hold().ok();
    let daemon = if matches!(method, Method::Merge | Method::RunMerge) {
        let d = Daemon::start(&sock, Some(&group))?;
        pids.push(d.child.id() as i32);
        Some(d)
    } else {
        None
    };
    let ksm = match method {
        Method::Ksm(p) => Some(advm::ksm::Session::start(p, 20)?),
        _ => None,
    };
    let ksmd0 = advm::ksm::ksmd_cpu_seconds().unwrap_or(0.0);
    let requests = if quick { "2" } else { "5" };
    // Where the run-mode agents report their merges (throughput).
    let reports = bench_dir().join(format!("agent-reports-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&reports);
    std::fs::create_dir_all(&reports).map_err(|e| io("agent report dir", e))?;
    let t0 = Instant::now();
    let mut workers = Vec::new();
    let mut ready = Vec::new();
    for _ in 0..n {
        let args = [
            bench_dir().join("worker.py").display().to_string(),
            models.display().to_string(),
            model.to_string(),
            method.worker_arg().to_string(),
            requests.to_string(),
        ];
        // The run-mode worker is the same program, started as `advm run --mode merge`
        // starts it (libadvm.so preloaded with the agent on), so its pid is python's.
        let (mut cmd, _prepared) = if method == Method::RunMerge {
            let p = advm_preload::launch::prepare(
                advm_preload::launch::Mode::Merge,
                2,
                &py.display().to_string(),
                &args,
                false,
            )?;
            let mut c = Command::new(py);
            c.args(&args);
            for (k, v) in p.command.get_envs() {
                if let Some(v) = v {
                    c.env(k, v);
                }
            }
            c.env(advm_preload::launch::MERGE_AFTER, RUN_MERGE_AFTER.to_string())
                .env(advm::merge::agent::ENV_REPORT_DIR, &reports);
            (c, Some(p))
        } else {
            let mut c = Command::new(py);
            c.args(&args);
            (c, None)
        };
        cmd.env("ADVM_SOCKET", &sock).stdin(Stdio::piped()).stdout(Stdio::piped());
        group.join_at_exec(&mut cmd)?;
        let mut child = cmd.spawn().map_err(|e| io("python worker", e))?;
        let (stdin, out) = (child.stdin.take().expect("piped"), child.stdout.take().expect("piped"));
        pids.push(child.id() as i32);
        workers.push(Worker { child, stdin, out: BufReader::new(out) });
        if let (1, Some(s)) = (workers.len(), &signals) {
            s.child(workers[0].child.id())?;
        }
        if stagger {
            // Scale-out: the next worker starts once this one has loaded, merged and
            // served (its ready line), not all at one moment on shared cores.
            let w = workers.last_mut().expect("just pushed");
            ready.push(line(w)?);
        }
    }
    // Sample both meters every 100 ms on a thread while the workers load.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, pids, gpath) = (stop.clone(), pids.clone(), group.path().to_path_buf());
        std::thread::spawn(move || -> Vec<(f64, u64, Option<u64>)> {
            let g = Group::open(&gpath).ok();
            let mut out = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = st::measure(&pids, Options::default()).map(|s| s.anon_shmem_bytes).unwrap_or(0);
                let c = g.as_ref().and_then(|g| g.usage().ok()).map(|u| u.anon_shmem_bytes());
                out.push((t0.elapsed().as_secs_f64(), d, c));
                std::thread::sleep(Duration::from_millis(100));
            }
            out
        })
    };
    for w in workers.iter_mut().skip(ready.len()) {
        ready.push(line(w)?);
    }
    let t_ready = t0.elapsed().as_secs_f64();
    // KSM needs time: it merges a page on its second full scan at the earliest. Wait
    // for two full scans after the load and memory no longer falling (1% over 3 s), or
    // the limit.
    let limit = if quick { 20.0 } else { 120.0 };
    let scans = || advm::ksm::system().map_or(0, |s| s.full_scans);
    let scans0 = scans();
    // The agents merge only after their quiet period: wait until every worker's agent
    // has reported a merge, or memory fell once here. (Memory alone is not enough: the
    // agents can be done before this loop starts, and then it never falls here.)
    let settle = if ksm.is_some() || method == Method::RunMerge { 3.0 } else { 1.0 };
    let mut fell = method != Method::RunMerge;
    let mut last = (f64::MAX, Instant::now());
    let t_wait = Instant::now();
    loop {
        let d = st::measure(&pids, Options::default())?.anon_shmem_bytes as f64;
        if d < last.0 * 0.99 {
            fell |= last.0 < f64::MAX;
            last = (d, Instant::now());
        }
        fell |= method == Method::RunMerge && std::fs::read_dir(&reports).map_or(0, |d| d.count()) >= n;
        let scanned = (ksm.is_none() || scans() >= scans0 + 2) && fell;
        if (scanned && last.1.elapsed().as_secs_f64() >= settle) || t_wait.elapsed().as_secs_f64() >= limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let series = sampler.join().map_err(|_| BenchError::Usage("the sampler panicked".into()))?;
    let ksmd_cpu_s = advm::ksm::ksmd_cpu_seconds().unwrap_or(0.0) - ksmd0;
    // The final figures: three samples of both meters now that memory has settled, the
    // cgroup read right after each distinct-page walk. Not the series' last samples:
    // under load one walk of 16 workers takes seconds, so its last few samples can
    // reach back into the load, and the two meters' medians then come from different
    // moments (a 16-worker run once reported 1850 MiB distinct against 886 cgroup so).
    let mut finals = Vec::new();
    for _ in 0..3 {
        let d = st::measure(&pids, Options::default())?.anon_shmem_bytes as f64;
        let c = group.usage().ok().map(|u| u.anon_shmem_bytes() as f64);
        finals.push((d, c));
    }
    drop(ksm);
    let distinct = crate::median(&finals.iter().map(|s| s.0).collect::<Vec<_>>());
    let cgroup = finals.iter().map(|s| s.1).collect::<Option<Vec<_>>>().map(|v| crate::median(&v));
    let peak = series.iter().map(|s| s.1).max().unwrap_or(0) as f64;
    let reach = series
        .iter()
        .find(|s| s.0 >= t_ready && (s.1 as f64) <= distinct + 0.05 * (peak - distinct).max(0.0))
        .map_or(0.0, |s| s.0 - t_ready);
    let agent_reports: Vec<serde_json::Value> = std::fs::read_dir(&reports)
        .map(|d| {
            d.flatten().filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()).collect()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&reports);
    let merges: Vec<&serde_json::Value> =
        ready.iter().filter_map(|r| r.get("merge").filter(|m| !m.is_null())).chain(agent_reports.iter()).collect();
    let throughput_gbs: Vec<f64> =
        merges.iter().filter_map(|m| Some(m["bytes"].as_f64()? / m["seconds"].as_f64()? / 1e9)).collect();
    let phases = (method == Method::Merge).then(|| merge_phases(&merges)).flatten();
    let to_saving_s = if method == Method::Merge {
        merges.iter().filter_map(|m| m["seconds"].as_f64()).fold(0.0, f64::max)
    } else {
        reach
    };
    let lat_before: Vec<f64> = ready.iter().flat_map(|r| floats(&r["latency_before_ms"])).collect();
    for w in &mut workers {
        w.stdin.write_all(b"go\n").map_err(|e| io("worker stdin", e))?;
    }
    let mut lat_after = Vec::new();
    for w in &mut workers {
        lat_after.extend(floats(&line(w)?["latency_after_ms"]));
        let _ = w.child.wait();
    }
    drop(daemon);
    group.remove()?;
    Ok(Outcome { distinct, cgroup, to_saving_s, throughput_gbs, ksmd_cpu_s, lat_before, lat_after, series, phases })
}

/// The curves of one model and N: each method's name and samples.
type Plotted = Vec<(String, Vec<merge_plot::Sample>)>;

/// Writes the plot of one model and N (`bench_dir()/memory-MODEL-N.svg`), cut 5 s
/// after the last curve settled (within 1% of its last sample), and returns its path.
fn plot(model: &str, n: usize, plotted: &[(String, Vec<merge_plot::Sample>)]) -> Result<String, BenchError> {
    let settled = plotted
        .iter()
        .filter_map(|(_, s)| {
            let last = s.last()?.1;
            let moving = s.iter().rev().find(|x| (x.1 - last).abs() > 0.01 * last);
            Some(moving.map_or(0.0, |x| x.0))
        })
        .fold(0.0, f64::max);
    let curves: Vec<merge_plot::Curve<'_>> =
        plotted.iter().map(|(name, samples)| merge_plot::Curve { name, samples }).collect();
    let path = bench_dir().join(format!("memory-{model}-{n}.svg"));
    let title = format!("{model}, {n} workers: memory of all workers over time");
    std::fs::write(&path, merge_plot::svg(&title, &curves, Some(settled + 5.0))).map_err(|e| io("plot", e))?;
    Ok(path.display().to_string())
}

/// `ADVM_BENCH_MERGE_REPLOT=REPORT.json`: draws the plots again from a saved report's
/// `memory_over_time` samples instead of running anything.
fn replot(path: &Path, report: &mut Report) -> Result<(), BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| io(&path.display().to_string(), e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Usage(format!("{}: not a bench report: {e}", path.display())))?;
    let curves = v["configuration"]["memory_over_time"]
        .as_object()
        .ok_or_else(|| BenchError::Usage(format!("{}: no configuration.memory_over_time in it", path.display())))?;
    // Keys are "model/N/method".
    let mut groups: Vec<((String, usize), Plotted)> = Vec::new();
    for (key, samples) in curves {
        let mut parts = key.splitn(3, '/');
        let (Some(model), Some(n), Some(method)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let Ok(n) = n.parse::<usize>() else { continue };
        let samples: Vec<merge_plot::Sample> = samples
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some((s[0].as_f64()?, s[1].as_f64()?, s[2].as_f64().unwrap_or(f64::NAN))))
            .collect();
        let g = (model.to_string(), n);
        match groups.iter_mut().find(|(k, _)| *k == g) {
            Some((_, v)) => v.push((method.to_string(), samples)),
            None => groups.push((g, vec![(method.to_string(), samples)])),
        }
    }
    std::fs::create_dir_all(bench_dir()).map_err(|e| io("bench dir", e))?;
    let plots = groups.iter().map(|((model, n), p)| plot(model, *n, p)).collect::<Result<Vec<_>, _>>()?;
    report.notes.push(format!("plots drawn again from {}: {}", path.display(), plots.join(", ")));
    Ok(())
}

/// Fills `buf` with xorshift output from `seed`: no zero page, no two pages alike.
fn fill_seeded(buf: &mut [u8], seed: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed << 32;
    for c in buf.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// What one throughput run measured, per merge: GB/s, and CPU seconds per GB of the
/// merging process and the daemon together (steadier than GB/s on a shared machine).
#[derive(Default)]
struct Rates {
    add: Vec<f64>,
    merge: Vec<f64>,
    add_cpu: Vec<f64>,
    merge_cpu: Vec<f64>,
    /// Each merge's phases, seconds per GB.
    add_phases: Vec<advm::merge::Phases>,
    merge_phases: Vec<advm::merge::Phases>,
}

/// Seconds per GB of a merge's phases.
fn phases_per_gb(s: &advm::merge::MergeStats) -> advm::merge::Phases {
    let gb = s.bytes as f64 / 1e9;
    let p = &s.phases;
    advm::merge::Phases {
        fence_s: p.fence_s / gb,
        hash_s: p.hash_s / gb,
        lookup_s: p.lookup_s / gb,
        add_s: p.add_s / gb,
        map_s: p.map_s / gb,
    }
}

/// The medians of each phase, as "fence 0.01, hash 0.05, ..." (s/GB).
fn phase_medians(v: &[advm::merge::Phases]) -> String {
    let median = |f: fn(&advm::merge::Phases) -> f64| crate::median(&v.iter().map(f).collect::<Vec<_>>());
    format!(
        "fence {:.3}, hash {:.3}, lookup {:.3}, add {:.3}, map {:.3}",
        median(|p| p.fence_s),
        median(|p| p.hash_s),
        median(|p| p.lookup_s),
        median(|p| p.add_s),
        median(|p| p.map_s)
    )
}

/// One process merging `mib` MiB twice (new pages through `client`, then the same
/// content again through `again`, or `client` when `None`), `runs` times; `daemon`:
/// the pid whose CPU time counts beside this process's. Through advmd the second merge
/// is another session, as another worker would be: it has none of the first
/// session's store pages faulted in.
fn throughput(
    client: &mut advm::merge::Client,
    mut again: Option<&mut advm::merge::Client>,
    daemon: Option<u32>,
    mib: usize,
    runs: usize,
) -> Result<Rates, BenchError> {
    let mut r = Rates::default();
    let cpu = || -> Result<f64, BenchError> {
        Ok(crate::cpu_seconds(std::process::id())? + daemon.map_or(Ok(0.0), crate::cpu_seconds)?)
    };
    for run in 0..runs {
        let mut a = advm::mem::Region::new(mib << 20)?;
        fill_seeded(a.bytes_mut(), run as u64);
        let mut b = advm::mem::Region::new(mib << 20)?;
        b.bytes_mut().copy_from_slice(a.bytes());
        let c0 = cpu()?;
        let s = client.merge(a.bytes())?;
        let c1 = cpu()?;
        r.add.push(s.throughput() / 1e9);
        r.add_cpu.push((c1 - c0) / (s.bytes as f64 / 1e9));
        r.add_phases.push(phases_per_gb(&s));
        let second = match again.as_deref_mut() {
            Some(c) => c,
            None => &mut *client,
        };
        let s = second.merge(b.bytes())?;
        r.merge.push(s.throughput() / 1e9);
        r.merge_cpu.push((cpu()? - c1) / (s.bytes as f64 / 1e9));
        r.merge_phases.push(phases_per_gb(&s));
    }
    Ok(r)
}

/// Throughput rows: this process's own store, and advmd's (a daemon started for it).
fn throughput_rows(opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
    let mib = if opts.quick { 64 } else { 1024 };
    let runs = opts.runs.max(1);
    let mut local = advm::merge::Client::local(4 << 30, "bench: the process's own store")?;
    let own = throughput(&mut local, None, None, mib, runs)?;
    let sock = bench_dir().join(format!("advmd-tp-{}.sock", std::process::id()));
    let daemon_proc = Daemon::start(&sock, None)?;
    let mut daemon = advm::merge::Client::connect(&sock, "")?;
    let mut other = advm::merge::Client::connect(&sock, "")?;
    let via_daemon = throughput(&mut daemon, Some(&mut other), Some(daemon_proc.child.id()), mib, runs)?;
    charging_rows(if opts.quick { 64 } else { 256 }, report)?;
    for (store, r) in [("own store", own), ("advmd", via_daemon)] {
        report.notes.push(format!(
            "throughput, {store}: wall-clock s/GB by phase (medians): adding new pages: {}; merging stored pages: {}",
            phase_medians(&r.add_phases),
            phase_medians(&r.merge_phases)
        ));
        report.rows.push(
            Row::new()
                .with("model", format!("{mib} MiB buffer"))
                .with("workers", 1)
                .with("method", format!("throughput, {store}"))
                .figure(Figure::new("merge throughput", "GB/s", r.merge))
                .figure(Figure::new("add throughput", "GB/s", r.add))
                .figure(Figure::new("merge CPU", "s/GB", r.merge_cpu))
                .figure(Figure::new("add CPU", "s/GB", r.add_cpu)),
        );
    }
    Ok(())
}

/// Who is charged for pages added through advmd: an adder (its own memory cgroup)
/// adds `mib` MiB of new pages to a daemon (in a cgroup of its own), a second process
/// (this one) merges the same bytes, and the adder exits. Both meters, at two
/// moments: the adder alive, and the adder gone while this process still maps the
/// pages. The pages are shmem of the memfd the adder wrote, so the kernel charges them
/// to the adder's cgroup, for as long as they live; the distinct-page meter counts
/// them in every process that maps them or holds the file (the daemon does). The
/// processes' figures are what each gained since before the adds.
fn charging_rows(mib: usize, report: &mut Report) -> Result<(), BenchError> {
    let groups = Group::create("merge-charge-daemon").and_then(|d| Ok((d, Group::create("merge-charge-adder")?)));
    let (daemon_group, adder_group) = match groups {
        Ok(g) => g,
        Err(e) => {
            report.notes.push(format!("charging rows skipped: cgroup meter unavailable ({e})"));
            return Ok(());
        }
    };
    let sock = bench_dir().join(format!("advmd-charge-{}.sock", std::process::id()));
    let daemon = Daemon::start(&sock, Some(&daemon_group))?;
    let mut holder = advm::merge::Client::connect(&sock, "")?;
    let daemon_pid = daemon.child.id() as i32;
    let mib_of = |b: u64| b as f64 / (1 << 20) as f64;
    let daemon_now = || -> Result<(u64, u64), BenchError> {
        Ok((st::measure(&[daemon_pid], Options::default())?.anon_shmem_bytes, daemon_group.usage()?.anon_shmem_bytes()))
    };
    let daemon0 = daemon_now()?;
    let self0 = st::measure_self()?.anon_shmem_bytes;
    let mut b = advm::mem::Region::new(mib << 20)?;
    fill_seeded(b.bytes_mut(), 77);
    let pair = || std::os::unix::net::UnixStream::pair().map_err(|e| io("socketpair", e));
    let ((mut added_r, added_w), (mut done_r, mut done_w)) = (pair()?, pair()?);
    // This process merges once the adder has added; the adder exits once it has.
    let merger = std::thread::spawn(move || -> Result<(advm::merge::Client, advm::mem::Region, u64), String> {
        let mut byte = [0u8];
        std::io::Read::read_exact(&mut added_r, &mut byte).map_err(|e| format!("the adder's signal: {e}"))?;
        let merged = holder.merge(b.bytes()).map_err(|e| e.to_string())?.merged;
        done_w.write_all(&[1]).map_err(|e| format!("signalling the adder: {e}"))?;
        Ok((holder, b, merged))
    });
    let reply = adder_group.run_in_child(|| {
        let mut added_w = added_w;
        // The child inherits this process's mappings: its own figure is what it adds.
        let before = st::measure_self().map_err(|e| e.to_string())?.anon_shmem_bytes;
        let mut c = advm::merge::Client::connect(&sock, "").map_err(|e| e.to_string())?;
        let mut a = advm::mem::Region::new(mib << 20).map_err(|e| e.to_string())?;
        fill_seeded(a.bytes_mut(), 77);
        let added = c.merge(a.bytes()).map_err(|e| e.to_string())?.added;
        let distinct = st::measure_self().map_err(|e| e.to_string())?.anon_shmem_bytes.saturating_sub(before);
        let cgroup = adder_group.usage().map_err(|e| e.to_string())?.anon_shmem_bytes();
        let daemon = daemon_now().map_err(|e| e.to_string())?;
        added_w.write_all(&[1]).map_err(|e| e.to_string())?;
        let mut byte = [0u8];
        std::io::Read::read_exact(&mut done_r, &mut byte).map_err(|e| e.to_string())?;
        serde_json::to_vec(&(added, distinct, cgroup, daemon)).map_err(|e| e.to_string())
    })?;
    let reply = reply.map_err(BenchError::Usage)?;
    let (added, adder_distinct, adder_cgroup, daemon_alive): (u64, u64, u64, (u64, u64)) =
        serde_json::from_slice(&reply).map_err(|e| BenchError::Usage(format!("the adder's reply: {e}")))?;
    let (_holder, b, merged) = merger
        .join()
        .map_err(|_| BenchError::Usage("the merging thread panicked".into()))?
        .map_err(BenchError::Usage)?;
    let pages = ((mib << 20) / advm::mem::page_size()) as u64;
    if added != pages || merged != pages {
        return Err(BenchError::Usage(format!(
            "charging: expected {pages} pages added, then merged; got {added} added, {merged} merged"
        )));
    }
    let adder_left = adder_group.usage()?.anon_shmem_bytes();
    let daemon_after = daemon_now()?;
    let holder_mapped = st::measure_self()?.anon_shmem_bytes.saturating_sub(self0);
    drop(b);
    let rel = |now: (u64, u64)| (now.0.saturating_sub(daemon0.0), now.1.saturating_sub(daemon0.1));
    let (da, db) = (rel(daemon_alive), rel(daemon_after));
    let row = |moment: &str, figures: Vec<(&str, f64)>| {
        let mut r = Row::new()
            .with("model", format!("{mib} MiB added through advmd"))
            .with("workers", 1)
            .with("method", format!("charging, {moment}"));
        for (name, v) in figures {
            r = r.figure(Figure::new(name, "MiB", vec![v]));
        }
        r
    };
    report.rows.push(row(
        "adder alive",
        vec![
            ("adder distinct", mib_of(adder_distinct)),
            ("adder cgroup", mib_of(adder_cgroup)),
            ("advmd distinct", mib_of(da.0)),
            ("advmd cgroup", mib_of(da.1)),
        ],
    ));
    report.rows.push(row(
        "adder exited, another process maps the pages",
        vec![
            ("adder cgroup", mib_of(adder_left)),
            ("advmd distinct", mib_of(db.0)),
            ("advmd cgroup", mib_of(db.1)),
            ("other process distinct", mib_of(holder_mapped)),
        ],
    ));
    drop(daemon);
    adder_group.remove()?;
    daemon_group.remove()?;
    Ok(())
}

impl Bench for MergeBench {
    fn name(&self) -> &'static str {
        "merge"
    }

    fn description(&self) -> &'static str {
        "UPM: N onnxruntime workers sharing a model; no dedup vs KSM (100, 1000 pages/20 ms) vs advm.merge through advmd vs advm run --mode merge"
    }

    fn default_runs(&self) -> usize {
        1
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        if let Some(path) = std::env::var_os("ADVM_BENCH_MERGE_REPLOT") {
            return replot(Path::new(&path), report);
        }
        // $ADVM_BENCH_MERGE_MODELS and $ADVM_BENCH_MERGE_WORKERS (comma separated) pick a
        // subset: the whole table takes the better part of an hour.
        let pick = |var: &str, default: &str| -> Vec<String> {
            std::env::var(var)
                .unwrap_or_else(|_| default.to_string())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect()
        };
        let names =
            pick("ADVM_BENCH_MERGE_MODELS", if opts.quick { "ppocr-rec" } else { "ppocr-rec,alexnet,resnet50" });
        // `none`: the throughput rows only, which need no Python.
        if names == ["none"] {
            return throughput_rows(opts, report);
        }
        let py = python()?;
        let models = models(&py)?;
        if let Some(bad) = names.iter().find(|m| !["ppocr-rec", "alexnet", "resnet50"].contains(&m.as_str())) {
            return Err(BenchError::Usage(format!(
                "ADVM_BENCH_MERGE_MODELS: no model {bad:?} (ppocr-rec, alexnet, resnet50; or none alone)"
            )));
        }
        let ns = pick("ADVM_BENCH_MERGE_WORKERS", if opts.quick { "1,2" } else { "1,2,4,8,16" })
            .iter()
            .map(|n| n.parse::<usize>().ok().filter(|&n| (1..=64).contains(&n)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| BenchError::Usage("ADVM_BENCH_MERGE_WORKERS: numbers from 1 to 64".into()))?;
        let all = [Method::None, Method::Ksm(100), Method::Ksm(1000), Method::Merge, Method::RunMerge];
        // $ADVM_BENCH_MERGE_METHODS: a subset of none,ksm100,ksm1000,merge,run-merge.
        let wanted = pick("ADVM_BENCH_MERGE_METHODS", "none,ksm100,ksm1000,merge,run-merge");
        let key = |m: Method| match m {
            Method::None => "none".to_string(),
            Method::Ksm(p) => format!("ksm{p}"),
            Method::Merge => "merge".into(),
            Method::RunMerge => "run-merge".into(),
        };
        let methods: Vec<Method> = all.into_iter().filter(|&m| wanted.contains(&key(m))).collect();
        // $ADVM_BENCH_MERGE_STAGGER=1: each worker starts once the one before it is
        // ready (scale-out), instead of all at one moment (a burst).
        let stagger = std::env::var("ADVM_BENCH_MERGE_STAGGER").is_ok_and(|v| v == "1");
        report.configuration.insert(
            "workers start".into(),
            serde_json::json!(if stagger { "one after another (ADVM_BENCH_MERGE_STAGGER=1)" } else { "together" }),
        );
        throughput_rows(opts, report)?;
        let bar = opts.progress_bar((names.len() * ns.len() * methods.len()) as u64, "bench merge");
        let mut curves = serde_json::Map::new();
        let mut plots = Vec::new();
        for model in &names {
            for &n in &ns {
                let mut base: Option<(f64, Option<f64>)> = None;
                let mut plotted: Plotted = Vec::new();
                for &m in &methods {
                    let o = run_one(&py, &models, model, n, m, opts.quick, stagger)?;
                    if let Some(p) = &o.phases {
                        report
                            .notes
                            .push(format!("{model}, {n} workers, {}: each merge, slowest first: {p}", m.name()));
                    }
                    plotted.push((
                        m.name(),
                        o.series.iter().map(|s| (s.0, s.1 as f64, s.2.map_or(f64::NAN, |c| c as f64))).collect(),
                    ));
                    bar.inc(1);
                    let (bd, bc) = *base.get_or_insert((o.distinct, o.cgroup));
                    let saving = |x: f64, b: f64| if b > 0.0 { 100.0 * (b - x) / b } else { 0.0 };
                    let mib = |b: f64| b / (1 << 20) as f64;
                    report.meter_disagreements.extend(crate::meters::disagreement(
                        &format!("{model} n={n} {}", m.name()),
                        o.distinct,
                        o.cgroup.unwrap_or(o.distinct),
                    ));
                    curves.insert(
                        format!("{model}/{n}/{}", m.name()),
                        serde_json::json!(o
                            .series
                            .iter()
                            .map(|s| [s.0, s.1 as f64, s.2.map_or(f64::NAN, |c| c as f64)])
                            .collect::<Vec<_>>()),
                    );
                    report.rows.push(
                        Row::new()
                            .with("model", model)
                            .with("workers", n)
                            .with("method", m.name())
                            .figure(Figure::single("memory (distinct)", "MiB", mib(o.distinct)))
                            .figure(Figure::single("saving (distinct)", "%", saving(o.distinct, bd)))
                            .figure(Figure::single("memory (cgroup)", "MiB", o.cgroup.map_or(f64::NAN, mib)))
                            .figure(Figure::single(
                                "saving (cgroup)",
                                "%",
                                match (o.cgroup, bc) {
                                    (Some(c), Some(b)) => saving(c, b),
                                    _ => f64::NAN,
                                },
                            ))
                            .figure(Figure::single("time to saving", "s", o.to_saving_s))
                            .figure(Figure::new("merge throughput", "GB/s", o.throughput_gbs.clone()))
                            .figure(Figure::single("ksmd CPU", "s", o.ksmd_cpu_s))
                            .figure(Figure::new("latency before", "ms", o.lat_before.clone()))
                            .figure(Figure::new("latency after", "ms", o.lat_after.clone())),
                    );
                }
                plots.push(plot(model, n, &plotted)?);
            }
        }
        report.configuration.insert("plots".into(), serde_json::json!(plots));
        bar.finish_and_clear();
        report.configuration.insert("models".into(), serde_json::json!(names));
        report.configuration.insert("workers".into(), serde_json::json!(ns));
        report.configuration.insert("memory_over_time".into(), serde_json::Value::Object(curves));
        report.notes.push(
            "memory: all workers (and advmd, which holds the store) together at the end, when KSM stopped saving \
             (1% over 3 s) or after 120 s; saving against no dedup at the same N. Latency: every worker's requests, \
             before and after its merge (KSM: before and after convergence)."
                .into(),
        );
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let mut unavailable = None;
        let (row, disagreements) = in_group("demo-merge", &mut unavailable, demo_measured)?;
        if !disagreements.is_empty() {
            return Err(BenchError::Usage(format!("merge demo: {}", disagreements.join("; "))));
        }
        Ok(vec![row])
    }
}

/// Bytes of each of the demo's two identical buffers.
const DEMO_BYTES: usize = 64 << 20;

/// The demo row, measured in this process (`group` is its memory cgroup): two buffers
/// holding the same seeded bytes, as two workers loading one model would, merged
/// through an advmd serving on a thread of this process, against the two left as they
/// are. The daemon's store is a memfd of this process, so both meters count it.
fn demo_measured(group: Option<&Group>) -> Result<(DemoRow, Vec<String>), BenchError> {
    let now = || -> Result<Both, BenchError> { Both::read(&st::measure_self()?, group) };
    let base = now()?;
    let mut a = advm::mem::Region::new(DEMO_BYTES)?;
    fill_seeded(a.bytes_mut(), 1);
    let mut b = advm::mem::Region::new(DEMO_BYTES)?;
    b.bytes_mut().copy_from_slice(a.bytes());
    let unmerged = now()?.since(&base);
    let sock = std::env::temp_dir().join(format!("advm-demo-merge-{}.sock", std::process::id()));
    let daemon = advmd::Daemon::bind(advmd::Config::at(&sock))
        .map_err(|e| BenchError::Usage(format!("advmd at {}: {e}", sock.display())))?
        .spawn();
    let mut client = advm::merge::Client::connect(&sock, "")?;
    let first = client.merge(a.bytes())?;
    let second = client.merge(b.bytes())?;
    let merged = now()?.since(&base);
    // the merged buffers still read as written
    let mut check = vec![0u8; DEMO_BYTES];
    fill_seeded(&mut check, 1);
    if a.bytes() != check.as_slice() || b.bytes() != check.as_slice() {
        return Err(BenchError::Usage("merge demo: a merged buffer no longer reads as written".into()));
    }
    drop(check);
    drop(client);
    daemon.stop();
    let pages = (DEMO_BYTES / advm::mem::page_size()) as u64;
    if first.added != pages || second.merged != pages {
        return Err(BenchError::Usage(format!(
            "merge demo: expected {pages} pages added then {pages} merged, got {} added, {} merged",
            first.added, second.merged
        )));
    }
    let mut disagreements = Vec::new();
    for (what, m) in [("merge demo, merged", &merged), ("merge demo, not merged", &unmerged)] {
        crate::meters::check(&mut disagreements, what, m.distinct as f64, m.cgroup.map(|c| c as f64));
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let cgroup = |m: &Both| m.cgroup.map_or(String::new(), |c| format!(" (cgroup {:.1} MiB)", mib(c)));
    let cgroup_gain = match (unmerged.cgroup, merged.cgroup) {
        (Some(u), Some(m)) => format!(" (cgroup {:.2}x)", u as f64 / m.max(1) as f64),
        _ => String::new(),
    };
    let ms = (first.seconds + second.seconds) * 1e3;
    let row = DemoRow {
        capability: "merge".into(),
        workload: format!(
            "two {} buffers of the same seeded bytes in one process, merged through an in-process advmd \
             (stand-in for two workers loading one model)",
            crate::table::fmt_bytes(DEMO_BYTES as u64)
        ),
        advm: format!(
            "{:.1} MiB{} incl. the store; merge {ms:.0} ms ({:.2} GB/s adding, {:.2} GB/s merging)",
            mib(merged.distinct),
            cgroup(&merged),
            first.throughput() / 1e9,
            second.throughput() / 1e9
        ),
        baseline: format!("no merging: {:.1} MiB{}", mib(unmerged.distinct), cgroup(&unmerged)),
        gain: format!("{:.2}x less memory{cgroup_gain}", unmerged.distinct as f64 / merged.distinct.max(1) as f64),
    };
    Ok((row, disagreements))
}
