//! `advm bench r`: the mmapcopy paper's evaluation (section 5) on Debian's unmodified R,
//! with virtual copies supplied by the preload shim instead of a patched interpreter.
//!
//! Each workload (bench/run/*.R and bench/run/numpy_copy.py, embedded) runs under
//! the paper's five configurations: off (untouched), alloc (large blocks in a page-aligned
//! anonymous arena), ksm and ksm-aggr (alloc + KSM at 100 / 1000 pages per 20 ms), cow
//! (virtual copies). Memory is the mean of distinct physical pages sampled once a second
//! (`advm::stats`, the paper's meter) next to the anon+shmem charged to the program's own
//! memory cgroup (`advm::stats::cgroup`, sampled every 50 ms, and read at the distinct
//! meter's instants to compare the two), time is the program's CPU time (user + system, children included) and
//! wall time, and ksmd's CPU time is read before and after.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{median, Bench, BenchOpts, DemoRow, Figure, Report, Row, Scratch};
use crate::meters;
use crate::workloads::{python_workload, r_script, r_workloads, Workload, COMMON_R, FORK_SCRIPT, THRESHOLD_PROBE};
use crate::BenchError;
use advm::stats::cgroup::{self, Group};
use advm::stats::{Meter, Options};
use advm_preload::launch::{self, Mode};

/// See the module doc.
pub struct RBench;

/// The paper's figures (Korb et al., SAC 2016, section 5.3-5.4), geometric means over its
/// 14 R benchmarks, relative to unmodified R. Runtime for ksm and mmcp is derived from
/// the paper's text (3.4 pp less than ksm, 2.9 pp less than alloc's 6.5%).
fn paper(mode: Mode) -> (Option<f64>, Option<f64>, Option<f64>) {
    // (memory %, interpreter runtime %, ksmd CPU % of interpreter CPU)
    match mode {
        Mode::Alloc => (Some(74.7), Some(106.5), None),
        Mode::Ksm => (Some(67.4), Some(107.0), Some(6.7)),
        Mode::KsmAggr => (Some(60.1), None, Some(40.2)),
        Mode::Vcopy => (Some(64.6), Some(103.6), None),
        Mode::Off => (Some(100.0), Some(100.0), None),
        Mode::Merge => (None, None, None),
    }
}

/// What one run of one workload under one mode measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Mean distinct physical pages over the samples.
    pub mean_pages: f64,
    /// Number of samples.
    pub samples: usize,
    /// Mean anon+shmem by the distinct-page meter at its samples, bytes.
    pub distinct_anon_shmem: f64,
    /// Mean anon+shmem charged to the cgroup at the same instants (read around each
    /// distinct sample), bytes: the figure to set beside `distinct_anon_shmem`. NaN
    /// without cgroups.
    pub cgroup_at_samples: f64,
    /// The two meters compared: mean anon+shmem (bytes) by the distinct meter and by
    /// the cgroup over the samples during which the cgroup's figure moved by less than
    /// 2% (read just before and just after the distinct sample: a program allocating
    /// or freeing fast changes under a sample), with how many samples that was. None
    /// without cgroups or without a steady sample.
    pub compared: Option<(f64, f64, usize)>,
    /// The cgroup meter sampled every 50 ms over the whole run.
    pub cgroup: Option<cgroup::Summary>,
    /// CPU time of the program and its reaped children, seconds.
    pub cpu_s: f64,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// ksmd CPU time during the run, seconds.
    pub ksmd_s: f64,
    /// The program's standard output.
    pub stdout: Vec<u8>,
    /// The shim's counters (empty for `off`).
    pub shim: std::collections::BTreeMap<String, u64>,
    /// KSM was already running (started by someone else) in a mode that does not use it.
    pub foreign_ksm: bool,
}

/// Finds a tool, or installs the Debian packages that provide it when running as root.
fn ensure_tool(tool: &str, check: &[&str], packages: &[&str]) -> Result<(), BenchError> {
    let ok = || {
        Command::new(tool).args(check).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if ok() {
        return Ok(());
    }
    if advm::probe::facts().root {
        eprintln!("advm bench r: {tool} missing, installing {}", packages.join(" "));
        let _ = Command::new("apt-get").args(["install", "-y", "-qq"]).args(packages).status();
        if ok() {
            return Ok(());
        }
    }
    Err(BenchError::Usage(format!(
        "{tool} is not usable; install the Debian packages {} (make deps-system does)",
        packages.join(" ")
    )))
}

/// The Debian packages the R workloads need.
pub const R_PACKAGES: &[&str] = &[
    "r-base-core",
    "r-cran-randomforest",
    "r-cran-kernlab",
    "r-cran-e1071",
    "r-cran-rpart",
    "r-cran-nnet",
    "r-cran-gbm",
    "r-cran-class",
    "r-cran-glmnet",
];

/// Writes the embedded workloads into a fresh directory.
fn write_workloads(dir: &Path, workloads: &[Workload]) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::Io(dir.display().to_string(), e))?;
    let mut files = vec![("common.R", COMMON_R), ("fork_mclapply.R", FORK_SCRIPT)];
    files.extend(workloads.iter().map(|w| (w.file, w.text)));
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| BenchError::Io(p.display().to_string(), e))?;
    }
    Ok(())
}

/// (state, cpu seconds incl. reaped children) from /proc/PID/stat.
fn proc_state(pid: u32) -> Option<(char, f64)> {
    let s = crate::proc_stat(pid).ok()?;
    let ticks = s.utime as f64 + s.stime as f64 + (s.cutime + s.cstime) as f64;
    Some((s.state, ticks / procfs::ticks_per_second() as f64))
}

/// Runs `program args` under `mode` with `env`, sampling its distinct physical pages
/// every `interval`; stdout is captured, stderr kept for errors.
pub fn measure(
    mode: Mode,
    program: &str,
    args: &[String],
    env: &[(&str, String)],
    interval: Duration,
) -> Result<Measured, BenchError> {
    // A KSM mode changes the system's KSM settings for this run (in `prepare`): Ctrl-C
    // and kill end the program, not the bench, so the settings are restored when the
    // run's session drops (KSM modes are never run in concurrent pairs, so one forwarder
    // at a time). Installed before the settings change: a kill until the program
    // exists is held for it.
    let signals = if mode.ksm_pages_to_scan().is_some() { advm::process::ForwardSignals::hold().ok() } else { None };
    let mut prepared = launch::prepare(mode, 2, program, args, true)?;
    // unique per call: the paired runs measure two programs at once
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_dir = Scratch::new(&format!("bench-r-out-{call}"))?;
    let out_path = out_dir.path().join("stdout");
    let err_path = out_dir.path().join("stderr");
    let open = |p: &PathBuf| std::fs::File::create(p).map_err(|e| BenchError::Io(p.display().to_string(), e));
    prepared.command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    prepared.command.stdin(Stdio::null()).stdout(open(&out_path)?).stderr(open(&err_path)?);
    let foreign_ksm = mode.ksm_pages_to_scan().is_none() && advm::ksm::knob("run") == Some(1);
    // its own memory cgroup, joined before exec: every page the program and its
    // children charge lands there
    let group = Group::create("bench-r").ok();
    if let Some(g) = &group {
        g.join_at_exec(&mut prepared.command)?;
    }
    let sampler = group.as_ref().map(|g| g.sample_every(cgroup::DEFAULT_INTERVAL));
    let (mut anon_shmem, mut steady, mut cgroup_at) = (Vec::new(), Vec::new(), Vec::new());
    let ksmd_before = advm::ksm::ksmd_cpu_seconds();
    let started = Instant::now();
    let mut child = prepared.command.spawn().map_err(|e| BenchError::Io(format!("running {program}"), e))?;
    let pid = child.id();
    if let Some(s) = &signals {
        s.child(pid)?;
    }
    let mut pages = Vec::new();
    // Samples at interval/2, 3*interval/2, ...: the exec'ing first instant is left out.
    let mut next = started + interval / 2;
    let mut cpu_s = 0.0;
    loop {
        match proc_state(pid) {
            Some(('Z', cpu)) | Some(('X', cpu)) => {
                cpu_s = cpu;
                break;
            }
            None => break,
            _ => {}
        }
        if Instant::now() >= next {
            // Opened afresh at every sample: a meter opened before the launcher's exec
            // chain (Rscript, sh, R) ends kept measuring a near-empty mm in some runs
            // (0.4 MiB where the cgroup saw 31 MiB), so each sample reads the current one.
            let mut meter = Meter::new(&[pid as i32], Options::default()).ok();
            let cgroup_before = group.as_ref().and_then(|g| g.usage().ok());
            if let Some(Ok(s)) = meter.as_mut().map(|m| m.sample()) {
                let cgroup_after = group.as_ref().and_then(|g| g.usage().ok());
                pages.push(s.distinct.map_or(s.physical_bytes / advm::addr::page_size() as u64, |d| d.total) as f64);
                let distinct = s.anon_shmem_bytes as f64;
                anon_shmem.push(distinct);
                if let (Some(b), Some(a)) = (cgroup_before, cgroup_after) {
                    let (b, a) = (b.anon_shmem_bytes() as f64, a.anon_shmem_bytes() as f64);
                    cgroup_at.push((a + b) / 2.0);
                    if (a - b).abs() <= 0.02 * a.max(b) {
                        steady.push((distinct, (a + b) / 2.0));
                    }
                }
            }
            next += interval;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let status = child.wait().map_err(|e| BenchError::Io(format!("waiting for {program}"), e))?;
    let cgroup = sampler.map(|s| s.stop()).transpose()?;
    if let Some(g) = group {
        g.remove()?;
    }
    let ksmd_s = match (ksmd_before, advm::ksm::ksmd_cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    let stdout = std::fs::read(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    drop(out_dir);
    if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
        if [libc::SIGTERM, libc::SIGHUP, libc::SIGINT].contains(&sig) {
            return Err(BenchError::Interrupted(format!("{program} under mode {} got signal {sig}", mode.name())));
        }
    }
    if !status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(BenchError::Usage(format!(
            "{program} {} under mode {} failed ({status}): {}",
            args.join(" "),
            mode.name(),
            tail.join(" | ")
        )));
    }
    let shim = prepared.stats_dir.as_deref().map(|d| launch::read_stats(d).0).unwrap_or_default();
    let samples = pages.len();
    let mean_pages = if samples == 0 { f64::NAN } else { pages.iter().sum::<f64>() / samples as f64 };
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    let compared = (!steady.is_empty()).then(|| {
        let (d, c): (Vec<f64>, Vec<f64>) = steady.iter().copied().unzip();
        (mean(&d), mean(&c), steady.len())
    });
    Ok(Measured {
        mean_pages,
        samples,
        distinct_anon_shmem: mean(&anon_shmem),
        cgroup_at_samples: mean(&cgroup_at),
        compared,
        cgroup,
        cpu_s,
        wall_s,
        ksmd_s,
        stdout,
        shim,
        foreign_ksm,
    })
}

/// Runs the threshold probe (bench/run/threshold.c) untouched and under
/// the shim with a 1-page threshold: ns per "allocate, fill, copy, write a byte, free"
/// cycle by block size. Returns rows and the smallest size where cow is not slower.
fn threshold_probe(dir: &Path, iters: u32) -> Result<(Vec<Row>, Option<u64>), BenchError> {
    let src = dir.join("threshold.c");
    let exe = dir.join("threshold");
    std::fs::write(&src, THRESHOLD_PROBE).map_err(|e| BenchError::Io(src.display().to_string(), e))?;
    let st = Command::new("cc")
        .args(["-O2", "-fno-builtin", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(|e| BenchError::Io("cc (threshold probe)".into(), e))?;
    if !st.success() {
        return Err(BenchError::Usage(format!("compiling the threshold probe failed ({st})")));
    }
    let mut by_mode = Vec::new();
    for mode in [Mode::Off, Mode::Alloc, Mode::Vcopy] {
        let mut p = launch::prepare(mode, 1, &exe.display().to_string(), &[iters.to_string()], false)?;
        // every size, also those below the default copy threshold
        p.command.env(advm_preload::env::COPY_MIN_PAGES, "1");
        let out = p.command.output().map_err(|e| BenchError::Io("threshold probe".into(), e))?;
        if !out.status.success() {
            return Err(BenchError::Usage(format!("threshold probe under {} failed ({})", mode.name(), out.status)));
        }
        let points: Vec<(u64, f64)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
            })
            .collect();
        by_mode.push((mode, points));
    }
    let mut rows = Vec::new();
    for (mode, points) in &by_mode {
        for (pages, ns) in points {
            rows.push(
                Row::new()
                    .with("workload", format!("threshold probe, {pages} page block"))
                    .with("mode", mode.result_name())
                    .figure(Figure::single("cycle time", "us", ns / 1e3)),
            );
        }
    }
    let off = &by_mode[0].1;
    let cow = &by_mode[2].1;
    // the smallest size from which cow is never slower, at that size and every bigger one
    let pairs: Vec<(u64, bool)> = off.iter().zip(cow).map(|((p, o), (_, c))| (*p, c <= o)).collect();
    let crossover = (0..pairs.len()).find(|&i| pairs[i..].iter().all(|(_, ok)| *ok)).map(|i| pairs[i].0);
    Ok((rows, crossover))
}

fn geomean(xs: &[f64]) -> f64 {
    let xs: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if xs.is_empty() {
        return f64::NAN;
    }
    (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp()
}

/// How a workload is started.
fn invocation(w: &Workload, dir: &Path) -> (String, Vec<String>) {
    let path = dir.join(w.file).display().to_string();
    if w.python {
        ("/usr/bin/python3".into(), vec![path])
    } else {
        ("Rscript".into(), vec!["--vanilla".into(), path])
    }
}

impl Bench for RBench {
    fn name(&self) -> &'static str {
        "r"
    }

    fn description(&self) -> &'static str {
        "mmapcopy paper section 5 on unmodified R (and NumPy): memory, CPU time, ksmd CPU under off/alloc/ksm/ksm-aggr/cow"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        ensure_tool("Rscript", &["--version"], R_PACKAGES)?;
        let (workloads, scale, interval) = if opts.quick {
            (vec![r_script!("b25_sort.R")], 0.03, Duration::from_millis(100))
        } else {
            let mut w = r_workloads();
            w.push(python_workload());
            // every 250 ms: at one a second a 1-3 s script gave 1-3 samples, too few for
            // a mean to set beside the cgroup's
            (w, 1.0, Duration::from_millis(250))
        };
        let scratch = Scratch::new("bench-r")?;
        let dir = scratch.path();
        write_workloads(dir, &workloads)?;
        report.configuration.insert("scale".into(), serde_json::json!(scale));
        report.configuration.insert("sample_interval_ms".into(), serde_json::json!(interval.as_millis() as u64));
        report.configuration.insert("threshold_pages".into(), serde_json::json!(2));
        report.notes.push(
            "memory: `memory` / `memory vs off` is the mmapcopy paper's meter (distinct physical pages the program \
             maps, file pages included), kept for comparison with the paper; it misses pages held but not mapped. \
             The honest pair: `distinct anon+shmem` (distinct anon and shmem frames plus shmem pages held but not \
             mapped) and `cgroup anon+shmem at samples` (the program's memory cgroup, read at the same instants); \
             `cgroup anon+shmem mean/peak` sample the group every 50 ms over the whole run, start-up included"
                .into(),
        );
        let runs = opts.runs.max(1);
        report.configuration.insert("runs_per_point".into(), serde_json::json!(runs));
        report.notes.push(format!(
            "{runs} run(s) per workload and mode, interleaved (run 1 of every workload and mode, then run 2, ...) so \
             that a slow phase of the machine hits every mode alike; figures are medians, ratios are of medians; CPU \
             time is user+system of the program and its children"
        ));
        let env = vec![("ADVM_BENCH_SCALE", scale.to_string()), ("ADVM_BENCH_DIR", dir.display().to_string())];
        let ksm_ok = advm::ksm::available() && advm::probe::facts().root;
        if !ksm_ok {
            report.notes.push("ksm and ksm-aggr skipped: KSM needs root and /sys/kernel/mm/ksm".into());
        }
        // ADVM_BENCH_R_MODES / ADVM_BENCH_R_WORKLOADS (comma lists) narrow the run for
        // experiments; `off` is always run, it is the baseline.
        let wanted = |var: &str, name: &str| {
            std::env::var(var).map_or(true, |l| l.split(',').any(|x| !x.is_empty() && name.starts_with(x.trim())))
        };
        let modes: Vec<Mode> = Mode::ALL
            .iter()
            .copied()
            .filter(|m| ksm_ok || m.ksm_pages_to_scan().is_none())
            .filter(|m| *m == Mode::Off || wanted("ADVM_BENCH_R_MODES", m.name()))
            .collect();
        let workloads: Vec<Workload> =
            workloads.into_iter().filter(|w| wanted("ADVM_BENCH_R_WORKLOADS", w.file)).collect();
        let mut skipped = vec![false; workloads.len()];
        for (wi, w) in workloads.iter().enumerate() {
            let (program, _) = invocation(w, dir);
            if w.python
                && !Command::new(&program).args(["-c", "import numpy, pandas"]).status().is_ok_and(|s| s.success())
            {
                report.notes.push(format!("{} skipped: {program} cannot import numpy and pandas", w.file));
                skipped[wi] = true;
            }
        }
        let bar = opts.progress_bar((runs * workloads.len() * modes.len()) as u64, "bench r");
        // measured[workload][mode] = one entry per run
        let mut measured: Vec<Vec<Vec<Measured>>> = vec![vec![Vec::new(); modes.len()]; workloads.len()];
        for run in 0..runs {
            for (wi, w) in workloads.iter().enumerate() {
                if skipped[wi] {
                    continue;
                }
                let (program, args) = invocation(w, dir);
                for (mi, &mode) in modes.iter().enumerate() {
                    bar.set_message(format!("run {} {} {}", run + 1, w.file, mode.name()));
                    bar.inc(1);
                    match measure(mode, &program, &args, &env, interval) {
                        Ok(m) => {
                            if m.foreign_ksm && run == 0 {
                                report.notes.push(format!(
                                    "{} {}: KSM was already running (started outside this benchmark); its ksmd CPU \
                                     is not ours",
                                    w.file,
                                    mode.name()
                                ));
                            }
                            if let Some(b) = measured[wi][0].get(run) {
                                if mode != Mode::Off && m.stdout != b.stdout {
                                    report.notes.push(format!(
                                        "{} {} (run {}): output differs from the untouched program",
                                        w.file,
                                        mode.name(),
                                        run + 1
                                    ));
                                }
                            }
                            measured[wi][mi].push(m);
                        }
                        Err(e @ BenchError::Interrupted(_)) => return Err(e),
                        Err(e) => {
                            report.notes.push(format!("{} {} (run {}): {e}", w.file, mode.name(), run + 1));
                            if mode == Mode::Off {
                                skipped[wi] = true;
                                break;
                            }
                        }
                    }
                }
            }
        }
        bar.finish_and_clear();
        // Concurrent pairs: the untouched program and one mode at the same time, one on
        // each core, so that the machine's speed changes (up to ±20% over minutes on this
        // VM) hit both alike. Not for the KSM modes, whose ksmd would take a core.
        let pair_modes: Vec<usize> =
            (0..modes.len()).filter(|&mi| modes[mi] != Mode::Off && modes[mi].ksm_pages_to_scan().is_none()).collect();
        let pairs = if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            report.notes.push("concurrent pairs skipped: they need two CPUs".into());
            0
        } else {
            std::env::var("ADVM_BENCH_R_PAIRS").ok().and_then(|v| v.parse().ok()).unwrap_or(if opts.quick {
                1
            } else {
                4
            })
        };
        // paired[workload][mode] = CPU ratios (%) of the concurrent pairs
        let mut paired: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); modes.len()]; workloads.len()];
        let bar = opts.progress_bar((pairs * workloads.len() * pair_modes.len()) as u64, "bench r pairs");
        for round in 0..pairs {
            for (wi, w) in workloads.iter().enumerate() {
                if skipped[wi] {
                    continue;
                }
                let (program, args) = invocation(w, dir);
                for &mi in &pair_modes {
                    bar.set_message(format!("pair {} {} {}", round + 1, w.file, modes[mi].name()));
                    bar.inc(1);
                    // who starts first alternates between rounds
                    let run = |mode| measure(mode, &program, &args, &env, interval);
                    let run = &run;
                    let (off, other) = std::thread::scope(|s| {
                        if round % 2 == 0 {
                            let a = s.spawn(|| run(Mode::Off));
                            let b = s.spawn(|| run(modes[mi]));
                            (a.join(), b.join())
                        } else {
                            let b = s.spawn(|| run(modes[mi]));
                            let a = s.spawn(|| run(Mode::Off));
                            (a.join(), b.join())
                        }
                    });
                    match (off, other) {
                        (Ok(Ok(a)), Ok(Ok(b))) => paired[wi][mi].push(100.0 * b.cpu_s / a.cpu_s.max(1e-9)),
                        (Ok(Err(e)), _) | (_, Ok(Err(e))) => {
                            report.notes.push(format!("{} pair {} {}: {e}", w.file, round + 1, modes[mi].name()))
                        }
                        _ => report.notes.push(format!("{} pair {}: a measuring thread panicked", w.file, round + 1)),
                    }
                }
            }
        }
        bar.finish_and_clear();
        if pairs > 0 {
            report.notes.push(format!(
                "cpu vs off, pairs: {pairs} round(s) per workload in which the untouched program and the mode ran \
                 at the same time, one per core (who starts first alternates); each figure is that pair's CPU time \
                 ratio, the geomean row is the geomean over workloads of each workload's geomean"
            ));
        }
        let mut pair_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        // ratios per mode over the R workloads, for the geometric means
        let mut mem_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        // per pass k: the mode's CPU time over untouched R's in the same pass, per workload
        // (the two ran minutes apart at most, so a slow phase of the machine cancels out)
        let mut per_pass_cpu: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); runs]; modes.len()];
        let mut cpu_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut ksmd_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut cg_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        // the honest pair: the distinct meter's anon+shmem (held pages included) and the
        // cgroup's at the same instants, each against untouched R
        let mut distinct_as_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut cg_at_ratio: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let ps_mib = advm::addr::page_size() as f64 / (1 << 20) as f64;
        for (wi, w) in workloads.iter().enumerate() {
            let Some(base) = measured[wi].first().filter(|b| !b.is_empty()) else { continue };
            let base_pages = median(&base.iter().map(|m| m.mean_pages).collect::<Vec<_>>());
            let base_cpu = median(&base.iter().map(|m| m.cpu_s).collect::<Vec<_>>());
            let cgroup_mean = |ms: &[Measured]| {
                median(
                    &ms.iter().filter_map(|m| m.cgroup.as_ref().map(|c| c.anon_shmem_bytes.mean)).collect::<Vec<_>>(),
                )
            };
            let base_cg = cgroup_mean(base);
            let med_of = |ms: &[Measured], f: fn(&Measured) -> f64| median(&ms.iter().map(f).collect::<Vec<_>>());
            let base_das = med_of(base, |m| m.distinct_anon_shmem);
            let base_cga = med_of(base, |m| m.cgroup_at_samples);
            for (mi, &mode) in modes.iter().enumerate() {
                let ms = &measured[wi][mi];
                if ms.is_empty() {
                    continue;
                }
                let pages = Figure::new("memory", "MiB", ms.iter().map(|m| m.mean_pages * ps_mib).collect());
                let cpu = Figure::new("cpu", "s", ms.iter().map(|m| m.cpu_s).collect());
                let ksmd = Figure::new(
                    "ksmd cpu",
                    "% of cpu",
                    ms.iter().map(|m| 100.0 * m.ksmd_s / m.cpu_s.max(1e-9)).collect(),
                );
                let mem_pct = 100.0 * pages.median / (base_pages * ps_mib);
                let cpu_pct = 100.0 * cpu.median / base_cpu;
                if !w.python {
                    mem_ratio[mi].push(mem_pct);
                    if ms.len() == runs && base.len() == runs {
                        for k in 0..runs {
                            per_pass_cpu[mi][k].push(100.0 * ms[k].cpu_s / base[k].cpu_s);
                        }
                    }
                    cpu_ratio[mi].push(cpu_pct);
                    ksmd_ratio[mi].push(ksmd.median);
                }
                let pairs = Figure::new("cpu vs off, pairs", "%", paired[wi][mi].clone());
                if !w.python && !paired[wi][mi].is_empty() {
                    pair_ratio[mi].push(geomean(&paired[wi][mi]));
                }
                let last = ms.last().expect("non-empty");
                let mib = |b: f64| b / (1 << 20) as f64;
                let distinct_as =
                    Figure::new("distinct anon+shmem", "MiB", ms.iter().map(|m| mib(m.distinct_anon_shmem)).collect());
                let cgroup_of = |f: fn(&cgroup::Summary) -> f64| -> Vec<f64> {
                    ms.iter().filter_map(|m| m.cgroup.as_ref()).map(|c| mib(f(c))).collect()
                };
                let cg_mean = Figure::new("cgroup anon+shmem mean", "MiB", cgroup_of(|c| c.anon_shmem_bytes.mean));
                let cg_peak = Figure::new("cgroup anon+shmem peak", "MiB", cgroup_of(|c| c.anon_shmem_bytes.max));
                let cg_cache = Figure::new("cgroup page cache mean", "MiB", cgroup_of(|c| c.page_cache_bytes.mean));
                let compared: Vec<(f64, f64, usize)> = ms.iter().filter_map(|m| m.compared).collect();
                if !compared.is_empty() {
                    let n: usize = compared.iter().map(|c| c.2).sum();
                    meters::check(
                        &mut report.meter_disagreements,
                        &format!("bench r {} {} (mean over {n} steady samples)", w.file, mode.name()),
                        median(&compared.iter().map(|c| c.0).collect::<Vec<_>>()),
                        Some(median(&compared.iter().map(|c| c.1).collect::<Vec<_>>())),
                    );
                }
                let has_cgroup = !cg_mean.runs.is_empty();
                let cg_pct = 100.0 * cgroup_mean(ms) / base_cg;
                let das_pct = 100.0 * med_of(ms, |m| m.distinct_anon_shmem) / base_das;
                let cga_pct = 100.0 * med_of(ms, |m| m.cgroup_at_samples) / base_cga;
                if !w.python {
                    distinct_as_ratio[mi].push(das_pct);
                }
                if !w.python && has_cgroup {
                    cg_ratio[mi].push(cg_pct);
                    cg_at_ratio[mi].push(cga_pct);
                }
                let cg_at = Figure::new(
                    "cgroup anon+shmem at samples",
                    "MiB",
                    ms.iter().map(|m| mib(m.cgroup_at_samples)).collect(),
                );
                let g = |k: &str| last.shim.get(k).copied().unwrap_or(0) as f64;
                report.rows.push(
                    Row::new()
                        .with("workload", w.file)
                        .with("mode", mode.result_name())
                        .figure(pages)
                        .figure(Figure::single("memory vs off", "%", mem_pct))
                        .figure(distinct_as)
                        .figure(Figure::single("distinct anon+shmem vs off", "%", das_pct))
                        .figure_if(has_cgroup, cg_at)
                        .figure_if(has_cgroup, Figure::single("cgroup at samples vs off", "%", cga_pct))
                        .figure_if(has_cgroup, cg_mean)
                        .figure_if(has_cgroup, cg_peak)
                        .figure_if(has_cgroup, cg_cache)
                        .figure_if(has_cgroup, Figure::single("cgroup memory vs off", "%", cg_pct))
                        .figure(cpu)
                        .figure(Figure::single("cpu vs off", "%", cpu_pct))
                        .figure_if(!pairs.runs.is_empty(), pairs)
                        .figure(Figure::new("wall", "s", ms.iter().map(|m| m.wall_s).collect()))
                        .figure(ksmd)
                        .figure(Figure::single("virtual copies", "n", g("copies_virtual")))
                        .figure(Figure::single("not copied", "MiB", g("pages_shared") * ps_mib))
                        .figure(Figure::new("samples", "n", ms.iter().map(|m| m.samples as f64).collect())),
                );
            }
        }
        match threshold_probe(dir, if opts.quick { 50 } else { 1000 }) {
            Ok((rows, crossover)) => {
                report.rows.extend(rows);
                report.notes.push(match crossover {
                    Some(p) => format!(
                        "threshold probe: from {p}-page blocks on, allocate+fill+copy+write+free under cow is not \
                         slower than glibc (the shim's threshold stays 2 pages, the paper's, for memory)"
                    ),
                    None => "threshold probe: for a block copied right after it was written and freed at once, cow \
                             is slower than glibc at some size up to 64 pages (the first copy writes the block into \
                             the memfd; the saving is memory, later copies are the cheap ones)"
                        .into(),
                });
            }
            Err(e) => report.notes.push(format!("threshold probe skipped: {e}")),
        }
        for (mi, &mode) in modes.iter().enumerate() {
            if mem_ratio[mi].is_empty() {
                continue;
            }
            let (pm, pr, pk) = paper(mode);
            let nan = f64::NAN;
            report.rows.push(
                Row::new()
                    .with("workload", format!("geomean of {} R workloads", mem_ratio[mi].len()))
                    .with("mode", mode.result_name())
                    .figure(Figure::single("memory vs off", "%", geomean(&mem_ratio[mi])))
                    .figure(Figure::single("distinct anon+shmem vs off", "%", geomean(&distinct_as_ratio[mi])))
                    .figure_if(
                        !cg_at_ratio[mi].is_empty(),
                        Figure::single("cgroup at samples vs off", "%", geomean(&cg_at_ratio[mi])),
                    )
                    .figure_if(
                        !cg_ratio[mi].is_empty(),
                        Figure::single("cgroup memory vs off", "%", geomean(&cg_ratio[mi])),
                    )
                    .figure(Figure::single("cpu vs off", "%", geomean(&cpu_ratio[mi])))
                    .figure(Figure::new(
                        "cpu vs off per pass",
                        "%",
                        per_pass_cpu[mi].iter().filter(|p| !p.is_empty()).map(|p| geomean(p)).collect(),
                    ))
                    .figure(Figure::single("cpu vs off, pairs", "%", geomean(&pair_ratio[mi])))
                    .figure(Figure::single(
                        "ksmd cpu",
                        "% of cpu",
                        ksmd_ratio[mi].iter().sum::<f64>() / ksmd_ratio[mi].len() as f64,
                    ))
                    .figure(Figure::single("paper memory", "%", pm.unwrap_or(nan)))
                    .figure(Figure::single("paper runtime", "%", pr.unwrap_or(nan)))
                    .figure(Figure::single("paper ksmd", "% of cpu", pk.unwrap_or(nan))),
            );
        }
        Ok(())
    }

    /// Three runs of every workload and mode: a full run takes about 20 minutes here.
    fn default_runs(&self) -> usize {
        3
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        ensure_tool("Rscript", &["--version"], R_PACKAGES)?;
        let scratch = Scratch::new("demo-r")?;
        let dir = scratch.path();
        let w = r_script!("b25_sort.R");
        write_workloads(dir, std::slice::from_ref(&w))?;
        let env = vec![("ADVM_BENCH_SCALE", "0.5".to_string()), ("ADVM_BENCH_DIR", dir.display().to_string())];
        let (program, args) = invocation(&w, dir);
        let interval = Duration::from_millis(250);
        let off = measure(Mode::Off, &program, &args, &env, interval)?;
        let cow = measure(Mode::Vcopy, &program, &args, &env, interval)?;
        drop(scratch);
        let mib = |p: f64| p * advm::addr::page_size() as f64 / (1 << 20) as f64;
        let mut disagreements = Vec::new();
        for (what, m) in [("R demo, vcopy", &cow), ("R demo, untouched", &off)] {
            if let Some((d, c, _)) = m.compared {
                meters::check(&mut disagreements, what, d, Some(c));
            }
        }
        if !disagreements.is_empty() {
            return Err(BenchError::Usage(disagreements.join("; ")));
        }
        // The honest pair at the same instants: distinct anon+shmem (held pages
        // included) and the cgroup's anon+shmem; the paper's meter (distinct mapped
        // pages, file pages included) in brackets for comparison with the paper.
        let mb = |b: f64| b / (1 << 20) as f64;
        let side = |m: &Measured| {
            let cg = if m.cgroup_at_samples.is_nan() {
                String::new()
            } else {
                format!(", cgroup {:.0} MiB", mb(m.cgroup_at_samples))
            };
            format!(
                "anon+shmem {:.0} MiB{cg} (paper's meter {:.0} MiB), cpu {:.2} s",
                mb(m.distinct_anon_shmem),
                mib(m.mean_pages),
                m.cpu_s
            )
        };
        let cg_gain = if cow.cgroup_at_samples.is_nan() {
            String::new()
        } else {
            format!(", {:.1}% by the cgroup", 100.0 * cow.cgroup_at_samples / off.cgroup_at_samples)
        };
        Ok(vec![DemoRow {
            capability: "run (virtual copy, unmodified R)".into(),
            workload: "R sort/copy loop (b25_sort, 1.5 M doubles), mean over samples".into(),
            advm: side(&cow),
            baseline: format!("{} (untouched R)", side(&off)),
            gain: format!(
                "{:.1}% of the memory{cg_gain} (paper's meter {:.1}%)",
                100.0 * cow.distinct_anon_shmem / off.distinct_anon_shmem,
                100.0 * cow.mean_pages / off.mean_pages
            ),
        }])
    }
}
