//! `advm`: application-directed virtual memory from the command line.

/// `print!` to stdout that returns from the enclosing function (`Result<_, CliError>`)
/// when the write fails: a reader that closed the pipe ends the command quietly.
macro_rules! out {
    ($($t:tt)*) => { $crate::write_out(format_args!($($t)*))? };
}

/// `println!` to stdout, as [`out!`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::write_out(format_args!("{}\n", format_args!($($t)*)))? };
}

mod daemon_cmd;
mod image_cmd;
mod merge_cmd;
mod run_cmd;
mod stat_cmd;
mod vm;

use std::io::IsTerminal;
use std::process::ExitCode;

use advm_bench::{self as bench, render_cells};
use clap::{Parser, Subcommand};

/// The command's one error type.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// From the library.
    #[error(transparent)]
    Advm(#[from] advm::Error),
    /// From a benchmark or a demo row.
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
    /// Starting a program under the preload shim.
    #[error(transparent)]
    Launch(#[from] advm_preload::launch::Error),
    /// Bad usage.
    #[error("{0}")]
    Usage(String),
    /// stdout was closed by its reader (`advm image cat X | head -c 10`): not an error
    /// for the user; the command stops and exits 0 without a message.
    #[error("stdout closed by its reader")]
    StdoutClosed,
    /// I/O on something named.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// The program to run could not be started: exit 127 if it was not found, else 126,
    /// as a shell and env(1) do, so scripts tell it from the program's own failure.
    #[error("running {0}: {1}")]
    NotStarted(String, #[source] std::io::Error),
}

#[derive(Parser)]
#[command(name = "advm", version, about = "application-directed virtual memory for stock Linux")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What this kernel offers advm, and what each capability will use.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Physical memory of processes: distinct physical pages, RSS, PSS, USS, KSM.
    Stat(stat_cmd::StatArgs),
    /// Layered disk images: a qcow2 chain's layers, its extent map, bytes read through the mapping.
    #[command(subcommand)]
    Image(image_cmd::ImageCmd),
    /// Run a benchmark (`advm bench list` lists them).
    Bench {
        /// Benchmark name, or `list`.
        name: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Small sizes and few runs: finishes in seconds.
        #[arg(long)]
        quick: bool,
        /// Repetitions per point (default: 3 with --quick, else the benchmark's own:
        /// 5 for most, fewer for the long ones; `advm bench list` shows each).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        runs: Option<u64>,
        /// Also write the JSON report to this file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Virtual machines booted from a shared qcow2 chain (FlexMem): build the guest, run it.
    #[command(subcommand)]
    Vm(vm::VmCmd),
    /// Run a program with the preload shim: virtual copies for unmodified programs.
    Run(run_cmd::RunArgs),
    /// Ask a process running under `advm run --mode merge` to merge its large anonymous mappings now.
    Merge(merge_cmd::MergeArgs),
    /// Run advmd, the daemon keeping merge page stores per security domain, in the foreground.
    Daemon(daemon_cmd::DaemonArgs),
    /// Every capability on its built-in workload against its baseline, one table.
    Demo {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only these capabilities' rows (comma separated, as in `advm bench list`).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
}

/// Writes to stdout; a closed pipe is [`CliError::StdoutClosed`], never a panic.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) -> Result<(), CliError> {
    use std::io::Write;
    std::io::stdout().lock().write_fmt(args).map_err(stdout_error)
}

/// The error for a failed write to stdout.
pub(crate) fn stdout_error(e: std::io::Error) -> CliError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::StdoutClosed
    } else {
        CliError::Io("stdout".into(), e)
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).expect("reports serialize")
}

/// Fails at once when `--out` cannot be written (a missing directory, a directory),
/// rather than after a benchmark that may run for an hour: its report was lost. A file
/// this check creates is removed again; one that was there keeps its contents until
/// the report replaces them.
fn check_writable(path: &std::path::Path) -> Result<(), CliError> {
    let existed = path.symlink_metadata().is_ok();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CliError::Io(format!("--out {}", path.display()), e))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn doctor(json: bool) -> Result<(), CliError> {
    let checks = advm::probe::report();
    if json {
        outln!("{}", to_json(&serde_json::json!({ "facts": advm::probe::facts(), "checks": checks })));
        return Ok(());
    }
    let mut cells = vec![vec!["feature".to_string(), "status".into(), "seen".into(), "consequence".into()]];
    for c in &checks {
        cells.push(vec![c.name.to_string(), c.status.label().into(), c.value.clone(), c.consequence.clone()]);
    }
    out!("{}", render_cells(&cells));
    Ok(())
}

fn demo(json: bool, only: &[String]) -> Result<(), CliError> {
    let names: Vec<&str> = bench::all().iter().map(|b| b.name()).collect();
    if let Some(bad) = only.iter().find(|o| !names.contains(&o.as_str())) {
        return Err(CliError::Usage(format!("demo --only: no capability '{bad}' (one of: {})", names.join(", "))));
    }
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for b in bench::all().into_iter().filter(|b| only.is_empty() || only.iter().any(|o| o == b.name())) {
        match b.demo() {
            Ok(r) => rows.extend(r),
            Err(e) => failures.push(format!("{}: {e}", b.name())),
        }
    }
    if json {
        outln!("{}", to_json(&serde_json::json!({ "rows": rows, "failures": failures })));
    } else {
        let mut cells =
            vec![vec!["capability".to_string(), "workload".into(), "advm".into(), "baseline".into(), "gain".into()]];
        for r in &rows {
            cells.push(vec![
                r.capability.clone(),
                r.workload.clone(),
                r.advm.clone(),
                r.baseline.clone(),
                r.gain.clone(),
            ]);
        }
        out!("{}", render_cells(&cells));
        for f in &failures {
            eprintln!("demo row failed: {f}");
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Usage(format!("{} demo row(s) failed", failures.len())))
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Doctor { json } => doctor(json)?,
        Command::Stat(args) => stat_cmd::run(args)?,
        Command::Image(cmd) => image_cmd::run(cmd)?,
        Command::Bench { name, json, quick, runs, out } => {
            if name == "list" {
                if json {
                    let list: Vec<_> = bench::all()
                        .iter()
                        .map(|b| {
                            serde_json::json!({ "name": b.name(), "description": b.description(),
                                "default_runs": b.default_runs() })
                        })
                        .collect();
                    outln!("{}", to_json(&list));
                    return Ok(());
                }
                let width = bench::all().iter().map(|b| b.name().len()).max().unwrap_or(0);
                for b in bench::all() {
                    let runs = match b.default_runs() {
                        1 => "1 run".to_string(),
                        n => format!("{n} runs"),
                    };
                    outln!("{:<width$}  {runs:<7}  {}", b.name(), b.description());
                }
                return Ok(());
            }
            if let Some(path) = &out {
                check_writable(path)?;
            }
            let opts = bench::BenchOpts {
                quick,
                runs: runs.map_or_else(|| if quick { 3 } else { bench::default_runs(&name) }, |r| r as usize),
                progress: std::io::stderr().is_terminal() && !json,
            };
            let report = bench::run(&name, &opts)?;
            let text = to_json(&report);
            if let Some(path) = out {
                std::fs::write(&path, &text).map_err(|e| CliError::Io(path.display().to_string(), e))?;
            }
            if json {
                outln!("{text}");
            } else {
                out!("{}", report.text());
                outln!("({} runs per point, {:.1} s)", report.runs, report.elapsed_s);
            }
            if !report.meter_disagreements.is_empty() {
                for d in &report.meter_disagreements {
                    eprintln!("meters disagree: {d}");
                }
                return Err(CliError::Usage(format!(
                    "bench {name}: the distinct-page and cgroup meters disagree by more than {:.0}% on {} memory \
                     figure(s) (listed above)",
                    bench::meters::TOLERANCE * 100.0,
                    report.meter_disagreements.len()
                )));
            }
        }
        Command::Demo { json, only } => demo(json, &only)?,
        Command::Run(args) => run_cmd::run(args)?,
        Command::Daemon(args) => daemon_cmd::run(args)?,
        Command::Vm(cmd) => vm::run(cmd)?,
        Command::Merge(args) => merge_cmd::run(args)?,
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) | Err(CliError::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("advm: {e}");
            match e {
                CliError::NotStarted(_, e) if e.kind() == std::io::ErrorKind::NotFound => ExitCode::from(127),
                CliError::NotStarted(..) => ExitCode::from(126),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
