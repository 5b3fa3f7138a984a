//! `advm bench shim-stress`: the preload shim's stress program
//! (bench/run/stress.c) under every `advm run` mode. Threads copy between
//! large malloc'd blocks, read blocks others are copying from, write, realloc, free and
//! fork at once, every read checked against a shadow copy. Reports per mode the
//! operations done, checks made and failures (wrong bytes, a crashed or hung process).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::BenchError;
use advm_preload::launch::{self, Mode};

/// See the module doc.
pub struct ShimStressBench;

const STRESS_C: &str = crate::workloads::bench_file!("run/stress.c");
const THREADS: u32 = 4;

/// Seconds per run: `ADVM_BENCH_STRESS_SECONDS`, else 30 (1 with `--quick`).
fn seconds(quick: bool) -> f64 {
    std::env::var("ADVM_BENCH_STRESS_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(if quick {
        1.0
    } else {
        30.0
    })
}

fn compile(dir: &Path) -> Result<std::path::PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::Io(dir.display().to_string(), e))?;
    let src = dir.join("stress.c");
    let exe = dir.join("stress");
    std::fs::write(&src, STRESS_C).map_err(|e| BenchError::Io(src.display().to_string(), e))?;
    // -fno-builtin: every memcpy and malloc is a call the shim sees
    let st = Command::new("cc")
        .args(["-std=gnu11", "-O2", "-fno-builtin", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(|e| BenchError::Io("cc (shim stress program)".into(), e))?;
    if !st.success() {
        return Err(BenchError::Usage(format!("compiling {} failed ({st})", src.display())));
    }
    Ok(exe)
}

/// One run's counts: ops, checks, failures, forks; Err(reason) when the process did not
/// end normally (crash, hang, unreadable output) or reported failures.
struct Counts {
    ops: f64,
    checks: f64,
    failures: f64,
    forks: f64,
}

fn parse(stdout: &str) -> Option<Counts> {
    let line = stdout.lines().rev().find(|l| l.starts_with("ops "))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).step_by(2).filter_map(|x| x.parse().ok()).collect();
    (v.len() == 4).then(|| Counts { ops: v[0], checks: v[1], failures: v[2], forks: v[3] })
}

/// Runs the program once under `mode` for `secs`; kills it when it overruns by far.
fn run_once(exe: &Path, mode: Mode, secs: f64, dir: &Path) -> Result<(Counts, f64), String> {
    let mut p = launch::prepare(mode, 2, &exe.display().to_string(), &[secs.to_string(), THREADS.to_string()], false)
        .map_err(|e| e.to_string())?;
    let err_path = dir.join(format!("stress-{}.err", mode.name()));
    let err_file = std::fs::File::create(&err_path).map_err(|e| format!("{}: {e}", err_path.display()))?;
    let started = Instant::now();
    let mut child = p
        .command
        .stdout(Stdio::piped())
        .stderr(err_file)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let limit = Duration::from_secs_f64(secs * 3.0 + 30.0);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for the stress program: {e}")),
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_string(&mut stdout);
    }
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let tail: String = stderr.lines().take(5).collect::<Vec<_>>().join("; ");
    match status {
        None => Err(format!("hung: still running after {limit:?}; {tail}")),
        Some(st) => match parse(&stdout) {
            Some(c) if st.success() && c.failures == 0.0 => Ok((c, wall)),
            Some(c) => Err(format!("{} failed checks ({st}): {tail}", c.failures)),
            None => Err(format!("ended with {st} before reporting: {tail}")),
        },
    }
}

impl Bench for ShimStressBench {
    fn name(&self) -> &'static str {
        "shim-stress"
    }

    fn description(&self) -> &'static str {
        "preload shim under concurrent copies, reads of copy sources, writes, realloc and fork in every mode, checked against shadow copies"
    }

    fn default_runs(&self) -> usize {
        1
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        let secs = seconds(opts.quick);
        let runs = if opts.quick { 1 } else { opts.runs.max(1) };
        report.runs = runs;
        report.configuration.insert("seconds_per_run".into(), serde_json::json!(secs));
        report.configuration.insert("threads".into(), serde_json::json!(THREADS));
        report.configuration.insert("threshold_pages".into(), serde_json::json!(2));
        let dir = std::env::temp_dir().join(format!("advm-bench-shim-stress-{}", std::process::id()));
        let exe = compile(&dir)?;
        let modes = runnable_modes();
        if let Err(why) = advm::ksm::can_change() {
            report.notes.push(format!("ksm and ksm-aggr skipped: {why}"));
        }
        let bar = opts.progress_bar((modes.len() * runs) as u64, "shim-stress");
        let mut failed = Vec::new();
        for mode in modes {
            let (mut ops, mut checks, mut failures, mut forks, mut wall) = (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..runs {
                match run_once(&exe, mode, secs, &dir) {
                    Ok((c, w)) => {
                        ops.push(c.ops);
                        checks.push(c.checks);
                        failures.push(c.failures);
                        forks.push(c.forks);
                        wall.push(w);
                    }
                    Err(why) => {
                        failures.push(1.0);
                        failed.push(format!("{}: {why}", mode.name()));
                    }
                }
                bar.inc(1);
            }
            report.rows.push(
                Row::new()
                    .with("mode", mode.result_name())
                    .figure(Figure::new("ops", "ops", ops))
                    .figure(Figure::new("checks", "checks", checks))
                    .figure(Figure::new("failed runs or checks", "failures", failures))
                    .figure(Figure::new("forks", "forks", forks))
                    .figure(Figure::new("wall time", "s", wall)),
            );
        }
        bar.finish_and_clear();
        let _ = std::fs::remove_dir_all(&dir);
        report.notes.push(format!(
            "{THREADS} threads (one only reading blocks the others copy from), blocks of 16 KiB-4 MiB, \
             allocation threshold 2 pages, copies virtual from 16 pages (cow)"
        ));
        if failed.is_empty() {
            Ok(())
        } else {
            Err(BenchError::Usage(format!("shim stress failed: {}", failed.join(" | "))))
        }
    }

    /// A correctness stress, not a capability: no row in `advm demo`.
    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        Ok(Vec::new())
    }
}

/// The modes this process can run: the KSM ones only where it may change KSM's
/// settings (root), instead of failing them.
fn runnable_modes() -> Vec<Mode> {
    let ksm = advm::ksm::can_change().is_ok();
    Mode::ALL.into_iter().filter(|m| ksm || m.ksm_pages_to_scan().is_none()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `advm bench shim-stress --quick` runs each of the five modes (ksm-aggr included,
    /// with its ksmd settings) for a second, and nothing fails.
    #[test]
    fn quick_shim_stress_passes_in_every_mode() {
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("skipped: no C compiler (cc) on PATH");
            return;
        }
        let opts = BenchOpts { quick: true, runs: 1, progress: false };
        let _turn = crate::SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let report = super::super::run("shim-stress", &opts).unwrap();
        // 5 as root; the KSM modes are skipped, with a note, for other users
        assert_eq!(report.rows.len(), runnable_modes().len(), "{report:?}");
        if advm::process::is_root() && advm::ksm::available() {
            assert_eq!(report.rows.len(), 5, "{report:?}");
        } else {
            assert!(report.notes.iter().any(|n| n.contains("ksm and ksm-aggr skipped")), "{report:?}");
        }
        for row in &report.rows {
            let fig = |name: &str| row.figures.iter().find(|f| f.name == name).unwrap().median;
            assert!(fig("ops") > 0.0 && fig("checks") > 0.0, "{row:?}");
            assert_eq!(fig("failed runs or checks"), 0.0, "{row:?}");
        }
    }
}
