//! `advm bench` and `advm demo`: each paper's experiment re-run here, one file per
//! benchmark.
//!
//! Every benchmark fills the same [`Report`] shape: name, configuration, rows of
//! figures (each with its runs, median, min and max, and unit), notes, and the machine
//! facts from `advm doctor`. To add one: write `src/<name>.rs` with a type that
//! implements [`Bench`], and list it in [`all`]. [`table`] formats reports (and the
//! advm command's other tables); `workloads.rs` embeds the programs under `bench/`.

mod error;
mod gc;
mod image;
mod merge;
mod merge_plot;
pub mod meters;
mod pager;
mod r;
mod remap;
mod shim_stress;
mod stat;
pub mod table;
mod vcopy;
mod vm;
mod vm_fill;
mod workloads;

pub use error::BenchError;
pub use table::{fmt_bytes, fmt_num, render_cells, render_table};

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// A directory of this process's under the temporary directory, `advm-<name>-<pid>-<n>`,
/// removed on drop (also when a run fails or is interrupted part way) or, after a
/// SIGKILL, by the next run ([`advm::process::ScratchDir`]).
pub(crate) struct Scratch(advm::process::ScratchDir);

impl Scratch {
    pub(crate) fn new(name: &str) -> Result<Self, BenchError> {
        Ok(Self(advm::process::ScratchDir::new(&format!("advm-{name}"))?))
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

/// How a benchmark is asked to run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// Finish in seconds (for tests): small sizes, few runs.
    pub quick: bool,
    /// Repetitions per measured point.
    pub runs: usize,
    /// Show progress on the terminal.
    pub progress: bool,
}

impl BenchOpts {
    /// A progress bar over `len` steps: drawn on a terminal, hidden in pipes and JSON runs.
    pub fn progress_bar(&self, len: u64, what: &str) -> indicatif::ProgressBar {
        if !self.progress {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(len);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}") {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        bar
    }
}

/// One measured quantity at one configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// What was measured, e.g. "copy time".
    pub name: String,
    /// Unit, e.g. "ms", "pages", "x".
    pub unit: String,
    /// Every run's value.
    #[serde(deserialize_with = "nan_for_null_each")]
    pub runs: Vec<f64>,
    /// Median of the runs.
    #[serde(deserialize_with = "nan_for_null")]
    pub median: f64,
    /// Smallest run.
    #[serde(deserialize_with = "nan_for_null")]
    pub min: f64,
    /// Largest run.
    #[serde(deserialize_with = "nan_for_null")]
    pub max: f64,
}

impl Figure {
    /// A figure from its runs (at least one).
    pub fn new(name: impl Into<String>, unit: impl Into<String>, runs: Vec<f64>) -> Self {
        let min = runs.iter().copied().min_by(f64::total_cmp).unwrap_or(f64::NAN);
        let max = runs.iter().copied().max_by(f64::total_cmp).unwrap_or(f64::NAN);
        Self { name: name.into(), unit: unit.into(), min, max, median: median(&runs), runs }
    }

    /// A figure measured once.
    pub fn single(name: impl Into<String>, unit: impl Into<String>, value: f64) -> Self {
        Self::new(name, unit, vec![value])
    }
}

/// JSON writes a NaN as null: read it back as NaN (figures cross from a measured child).
fn nan_for_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nan_for_null_each<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

/// The median of `v` (the mean of the middle two for an even count; NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `$var` as a comma separated list (blank items skipped), each item through `item`,
/// whose error says what the item should have been; `None` when `var` is unset. The
/// benchmarks' pickers of workloads, settings and sizes.
pub(crate) fn env_list<T>(var: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Option<Vec<T>>, BenchError> {
    let Ok(list) = std::env::var(var) else { return Ok(None) };
    list.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| item(v).map_err(|why| BenchError::Usage(format!("{var}: {why}"))))
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// One configuration (e.g. "engine=uffd-move, size=2 MiB") and its figures.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Row {
    /// Configuration, in column order.
    pub config: Vec<(String, String)>,
    /// Figures, in column order.
    pub figures: Vec<Figure>,
}

impl Row {
    /// An empty row.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a configuration column.
    pub fn with(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.config.push((key.into(), value.to_string()));
        self
    }
    /// Adds a figure.
    pub fn figure(mut self, f: Figure) -> Self {
        self.figures.push(f);
        self
    }
    /// Adds a figure when `cond` holds (a figure some rows of a table do not have).
    pub fn figure_if(self, cond: bool, f: Figure) -> Self {
        if cond {
            self.figure(f)
        } else {
            self
        }
    }
}

/// A benchmark's whole result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Benchmark name.
    pub name: String,
    /// One line on what it measures.
    pub description: String,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// Repetitions per point.
    pub runs: usize,
    /// Benchmark-wide settings.
    pub configuration: BTreeMap<String, serde_json::Value>,
    /// The figures.
    pub rows: Vec<Row>,
    /// Observations worth a sentence (fallbacks, skipped baselines and why).
    pub notes: Vec<String>,
    /// Memory figures on which the two meters (distinct pages, cgroup) disagree by more
    /// than [`meters::TOLERANCE`] on anon + shmem: the benchmark fails when any.
    pub meter_disagreements: Vec<String>,
    /// Machine facts from `advm doctor`.
    pub machine: advm::probe::Facts,
    /// Wall time of the whole benchmark.
    pub elapsed_s: f64,
}

/// A row of the `advm demo` table: one capability against its baseline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DemoRow {
    /// Capability name.
    pub capability: String,
    /// The workload in a few words.
    pub workload: String,
    /// What advm achieved.
    pub advm: String,
    /// What the baseline achieved.
    pub baseline: String,
    /// The ratio or difference that matters.
    pub gain: String,
}

impl DemoRow {
    /// The row of a capability that cannot run here, saying why.
    pub fn skipped(capability: &str, why: &str) -> Self {
        DemoRow {
            capability: capability.into(),
            workload: "-".into(),
            advm: format!("skipped: {why}"),
            baseline: "-".into(),
            gain: "-".into(),
        }
    }
}

/// A benchmark.
pub trait Bench {
    /// `advm bench <name>`.
    fn name(&self) -> &'static str;
    /// One line on what it measures.
    fn description(&self) -> &'static str;
    /// Runs it, filling `report.rows`, `report.configuration` and `report.notes`.
    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError>;
    /// The rows this capability adds to `advm demo` (its built-in default workload).
    fn demo(&self) -> Result<Vec<DemoRow>, BenchError>;
    /// Repetitions per point when `--runs` is not given (and not `--quick`).
    fn default_runs(&self) -> usize {
        5
    }
}

/// The default repetitions of the named benchmark (5 for an unknown name).
pub fn default_runs(name: &str) -> usize {
    all().iter().find(|b| b.name() == name).map_or(5, |b| b.default_runs())
}

/// Every benchmark, in demo order.
pub fn all() -> Vec<Box<dyn Bench>> {
    vec![
        Box::new(stat::StatBench),
        Box::new(vcopy::VcopyBench),
        Box::new(remap::RemapBench),
        Box::new(image::ImageBench),
        Box::new(r::RBench),
        Box::new(shim_stress::ShimStressBench),
        Box::new(merge::MergeBench),
        Box::new(gc::GcBench),
        Box::new(pager::PagerBench),
        Box::new(vm::VmDensityBench),
        Box::new(vm_fill::VmFillBench),
        Box::new(gc::GcPolicyBench),
        Box::new(gc::GcSizesBench),
    ]
}

/// Runs benchmark `name`.
pub fn run(name: &str, opts: &BenchOpts) -> Result<Report, BenchError> {
    let benches = all();
    let bench = benches.iter().find(|b| b.name() == name).ok_or_else(|| {
        let names: Vec<_> = benches.iter().map(|b| b.name()).collect();
        BenchError::Usage(format!("no benchmark named {name:?}; available: {}", names.join(", ")))
    })?;
    let started = Instant::now();
    let mut report = Report::new(name, bench.description(), opts.quick, opts.runs);
    // Ctrl-C or kill must not end this process before it restores what the benchmark
    // changed (cgroups, swap, KSM, scratch files, daemons): the signal is noted, the
    // benchmark's programs are stopped, and its run unwinds through its cleanup.
    let stop = std::sync::Arc::new(advm::process::StopSignals::install()?);
    // KSM as a killed run left it would skew every figure (and ksmd's CPU time).
    if restore_abandoned_ksm() {
        report.notes.push("KSM settings left by a run that was killed were restored before this run".into());
    }
    let stopper = ChildStopper::start(stop.clone());
    let result = bench.run(opts, &mut report);
    drop(stopper);
    // A measured child that started a KSM session and died of the signal could not end it.
    restore_abandoned_ksm();
    if let Some(sig) = stop.received() {
        let how = match result {
            Ok(()) => "it had finished; results dropped".to_string(),
            Err(BenchError::Interrupted(e)) => format!("it stopped: {e}"),
            Err(e) => format!("it stopped with: {e}"),
        };
        return Err(BenchError::Interrupted(format!("bench {name} stopped by {} ({how})", signal_name(sig))));
    }
    result?;
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// [`advm::ksm::restore_abandoned`] where KSM exists and may be changed (root).
fn restore_abandoned_ksm() -> bool {
    advm::ksm::available() && advm::process::is_root() && advm::ksm::restore_abandoned().unwrap_or(false)
}

/// Tests that run a whole benchmark ([`run`] notes stopping signals process-wide) and
/// tests that send this process a stopping signal take turns.
#[cfg(test)]
pub(crate) static SIGNAL_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The usual name of a stopping signal.
/// Stops a daemon the bench started on `socket`: SIGTERM, so it removes its socket
/// and lock file itself (SIGKILL left both behind), then SIGKILL if it has not exited
/// within 5 s, and the two files removed here.
pub(crate) fn stop_daemon(child: &mut std::process::Child, socket: &std::path::Path) {
    let _ = advm::process::terminate(child.id());
    let t = Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(5) {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(socket);
    let mut lock = socket.as_os_str().to_owned();
    lock.push(".lock");
    let _ = std::fs::remove_file(lock);
}

pub(crate) fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT (Ctrl-C)".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        _ => format!("signal {sig}"),
    }
}

/// While alive, a thread that, once a stopping signal has been noted, sends SIGTERM to
/// every child of this process, including those started later: a benchmark then
/// sees its programs fail, stops, and cleans up. (Ctrl-C reaches the children from the
/// terminal as well; `kill PID` reaches only this process.)
struct ChildStopper {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ChildStopper {
    fn start(stop: std::sync::Arc<advm::process::StopSignals>) -> Self {
        use std::sync::atomic::Ordering;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let mut stopped = std::collections::BTreeSet::new();
            while !flag.load(Ordering::Acquire) {
                if stop.received().is_some() {
                    for pid in children() {
                        if stopped.insert(pid) {
                            let _ = advm::process::terminate(pid);
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        Self { done, thread: Some(thread) }
    }
}

impl Drop for ChildStopper {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The live children of this process (from `/proc/*/stat`'s parent pid).
fn children() -> Vec<u32> {
    let me = std::process::id() as i32;
    let Ok(all) = procfs::process::all_processes() else { return Vec::new() };
    all.flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.state != 'Z' && s.ppid == me)
        .map(|s| s.pid as u32)
        .collect()
}

/// `/proc/PID/stat`.
pub(crate) fn proc_stat(pid: u32) -> Result<procfs::process::Stat, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let pid = i32::try_from(pid).map_err(|_| BenchError::Usage(format!("{path}: no such pid")))?;
    procfs::process::Process::new(pid).and_then(|p| p.stat()).map_err(|e| BenchError::Usage(format!("{path}: {e}")))
}

/// CPU seconds (user + system) process `pid` has used so far, all its threads.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64, BenchError> {
    let s = proc_stat(pid)?;
    Ok((s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64)
}

impl Report {
    /// The report as `advm bench` prints it: its name and description, the table, the notes.
    pub fn text(&self) -> String {
        let mut text = format!("{}: {}\n{}", self.name, self.description, render_table(&self.rows));
        for n in &self.notes {
            text += &format!("note: {n}\n");
        }
        text
    }

    /// An empty report of benchmark `name`, with this machine's facts.
    pub fn new(name: &str, description: &str, quick: bool, runs: usize) -> Self {
        Self {
            name: name.to_string(),
            description: description.to_string(),
            quick,
            runs,
            configuration: BTreeMap::new(),
            rows: Vec::new(),
            notes: Vec::new(),
            meter_disagreements: Vec::new(),
            machine: advm::probe::facts().clone(),
            elapsed_s: 0.0,
        }
    }

    /// The rows, notes, configuration and disagreements, to be merged into another report.
    pub fn into_part(self) -> meters::Part {
        meters::Part {
            rows: self.rows,
            notes: self.notes,
            configuration: self.configuration,
            disagreements: self.meter_disagreements,
        }
    }

    /// Adds the rows, notes, configuration and disagreements of a part run elsewhere.
    pub fn merge(&mut self, part: meters::Part) {
        self.rows.extend(part.rows);
        self.notes.extend(part.notes);
        self.configuration.extend(part.configuration);
        self.meter_disagreements.extend(part.disagreements);
    }
}

/// Times `f` `runs` times, in milliseconds.
pub fn time_ms(runs: usize, mut f: impl FnMut() -> Result<(), BenchError>) -> Result<Vec<f64>, BenchError> {
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_statistics() {
        let f = Figure::new("t", "ms", vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((f.median, f.min, f.max), (2.5, 1.0, 10.0));
        assert_eq!(Figure::single("x", "x", 4.0).median, 4.0);
    }
}
