//! `advm stat PID...`.

use std::ops::ControlFlow;
use std::time::Duration;

use advm::stats::cgroup::{Group, Usage};
use advm::stats::{self, Meter, Options, Sample};

use crate::CliError;
use advm_bench::{fmt_bytes, render_cells};

/// Arguments of `advm stat`.
#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Process ids (or `self`); a page shared among them counts once.
    #[arg(required_unless_present = "cgroup", conflicts_with = "cgroup")]
    pids: Vec<String>,
    /// Read an existing memory cgroup instead (its directory, e.g.
    /// /sys/fs/cgroup/memory/foo): anon+shmem and page cache charged to it.
    #[arg(long, value_name = "PATH")]
    cgroup: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Sample for SECS seconds and report mean and max (0: until the processes exit).
    #[arg(long, value_name = "SECS", value_parser = watch_parser)]
    watch: Option<f64>,
    /// Sampling interval with --watch, milliseconds (the paper samples each second).
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    interval: u64,
    /// Ignore PFNs and report the PSS fallback, as a process without CAP_SYS_ADMIN sees.
    #[arg(long)]
    hide_pfns: bool,
}

/// The longest `--watch` in seconds: a year (`inf` and `1e300` made a Duration panic,
/// and NaN or a negative number ran until the processes exit, as 0 does).
const WATCH_MAX_S: f64 = 365.0 * 86400.0;

fn watch_parser(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|x| (0.0..=WATCH_MAX_S).contains(x))
        .ok_or_else(|| format!("{s:?} is not a number of seconds in 0..={WATCH_MAX_S}"))
}

fn parse_pid(s: &str) -> Result<i32, CliError> {
    if s == "self" {
        return Ok(std::process::id() as i32);
    }
    s.parse::<i32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| CliError::Usage(format!("invalid pid {s:?}: expected a positive number or `self`")))
}

fn human(s: &Sample) -> String {
    let ps = s.page_size_bytes;
    let pids: Vec<String> = s.processes.iter().map(|p| format!("{} ({})", p.pid, p.comm)).collect();
    let mut rows = vec![vec!["processes".to_string(), pids.join(", ")]];
    let held = if s.held_pages > 0 { format!(" + {} held pages", s.held_pages) } else { String::new() };
    rows.push(vec![
        "physical memory".into(),
        match s.distinct {
            Some(d) => format!(
                "{} = {} distinct mapped pages (anon {}, shmem {}, file {}){held}",
                fmt_bytes(s.physical_bytes),
                d.total,
                d.anon,
                d.shmem,
                d.file
            ),
            None => {
                format!("{} = PSS{held} (PFNs hidden: run as root for distinct pages)", fmt_bytes(s.physical_bytes))
            }
        },
    ]);
    let mut held_line = format!(
        "{} = {} pages of {} shmem objects open or mapped, not mapped now",
        fmt_bytes(s.held_pages * ps),
        s.held_pages,
        s.shmem_objects
    );
    if s.held_swapped_pages > 0 {
        held_line.push_str(&format!("; {} more in swap (not counted)", s.held_swapped_pages));
    }
    if s.shmem_objects_unread > 0 {
        held_line.push_str(&format!("; {} objects could not be read (run as root)", s.shmem_objects_unread));
    }
    rows.push(vec!["held, not mapped".into(), held_line]);
    rows.push(vec![
        "anon + shmem".into(),
        format!("{} (physical memory without page cache of regular files)", fmt_bytes(s.anon_shmem_bytes)),
    ]);
    rows.push(vec![
        "mapped pages".into(),
        format!(
            "{} (each mapping counted, as RSS does); zero-page mappings {}; swapped {}",
            s.mapped_pages, s.zero_page_mappings, s.swapped_pages
        ),
    ]);
    rows.push(vec![
        "RSS / PSS / USS".into(),
        format!("{} / {} / {}", fmt_bytes(s.rss_bytes), fmt_bytes(s.pss_bytes), fmt_bytes(s.uss_bytes)),
    ]);
    if let Some(k) = &s.ksm {
        rows.push(vec![
            "KSM (system)".into(),
            format!(
                "run={} pages_shared={} pages_sharing={} general_profit={}",
                k.run,
                k.pages_shared,
                k.pages_sharing,
                k.general_profit.map_or("-".into(), |g| fmt_bytes(g.max(0) as u64))
            ),
        ]);
    }
    for p in &s.processes {
        if let Some(m) = p.ksm_stat.get("ksm_merging_pages") {
            rows.push(vec![
                format!("KSM pid {}", p.pid),
                format!(
                    "merging pages {m}, profit {}",
                    fmt_bytes(p.ksm_stat.get("ksm_process_profit").copied().unwrap_or(0).max(0) as u64)
                ),
            ]);
        }
    }
    rows.push(vec!["ksmd CPU".into(), s.ksmd_cpu_seconds.map_or("-".into(), |c| format!("{c:.2} s"))]);
    rows.push(vec!["measured in".into(), format!("{:.1} ms ({} pages of {} bytes)", s.measure_ms, s.mapped_pages, ps)]);
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!("{:<16} {}\n", r[0], r[1]));
    }
    out
}

fn human_usage(g: &Group, u: &Usage) -> String {
    format!(
        "{:<16} {} ({:?})\n{:<16} {} (anon {}, shmem {})\n{:<16} {}\n",
        "memory cgroup",
        g.path().display(),
        g.version(),
        "anon+shmem",
        fmt_bytes(u.anon_shmem_bytes()),
        fmt_bytes(u.anon_bytes),
        fmt_bytes(u.shmem_bytes),
        "page cache",
        fmt_bytes(u.page_cache_bytes)
    )
}

/// `advm stat --cgroup PATH`: once, or sampled with --watch.
fn run_cgroup(args: &StatArgs, path: &std::path::Path) -> Result<(), CliError> {
    let g = Group::open(path)?;
    let Some(secs) = args.watch else {
        let u = g.usage()?;
        if args.json {
            let v = serde_json::json!({ "group": g.path(), "version": g.version(), "usage": u,
                "anon_shmem_bytes": u.anon_shmem_bytes() });
            outln!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
        } else {
            out!("{}", human_usage(&g, &u));
        }
        return Ok(());
    };
    let sampler = g.sample_every(Duration::from_millis(args.interval));
    let start = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(args.interval.min(100)));
        let done = if secs > 0.0 { start.elapsed().as_secs_f64() >= secs } else { g.pids()?.is_empty() };
        if done {
            break;
        }
    }
    let s = sampler.stop()?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&s).expect("serializes"));
    } else {
        out!("{}", human_usage(&g, &s.last));
        let agg = |a: stats::Aggregate| format!("mean {}  max {}", fmt_bytes(a.mean as u64), fmt_bytes(a.max as u64));
        out!(
            "{}",
            render_cells(&[
                vec![
                    "over the run".to_string(),
                    format!("{} samples in {:.1} s", s.samples, start.elapsed().as_secs_f64())
                ],
                vec!["anon+shmem".into(), agg(s.anon_shmem_bytes)],
                vec!["page cache".into(), agg(s.page_cache_bytes)],
            ])
        );
    }
    Ok(())
}

/// Runs `advm stat`.
pub fn run(args: StatArgs) -> Result<(), CliError> {
    if let Some(path) = &args.cgroup {
        return run_cgroup(&args, path);
    }
    let pids = args.pids.iter().map(|p| parse_pid(p)).collect::<Result<Vec<_>, _>>()?;
    let mut meter = Meter::new(&pids, Options { hide_pfns: args.hide_pfns, ..Default::default() })?;
    let Some(secs) = args.watch else {
        let s = meter.sample()?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&s).expect("serializes"));
        } else {
            out!("{}", human(&s));
        }
        return Ok(());
    };
    let duration = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
    let mut header = !args.json;
    // A watch without a duration runs until stopped: a reader closing the pipe stops
    // it (exit 0, as every command whose stdout is closed), any other error is named.
    let mut failed = None;
    let summary = stats::watch(&mut meter, duration, Duration::from_millis(args.interval), |s| {
        if args.json {
            return ControlFlow::Continue(());
        }
        let header_line = if std::mem::take(&mut header) {
            crate::write_out(format_args!(
                "{:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>10}\n",
                "t", "physical", "held", "anon+shmem", "RSS", "PSS", "ksmd CPU"
            ))
        } else {
            Ok(())
        };
        let written = header_line.and_then(|()| {
            crate::write_out(format_args!(
                "{:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>10}\n",
                format!("{:.1} ms", s.measure_ms),
                fmt_bytes(s.physical_bytes),
                fmt_bytes(s.held_pages * s.page_size_bytes),
                fmt_bytes(s.anon_shmem_bytes),
                fmt_bytes(s.rss_bytes),
                fmt_bytes(s.pss_bytes),
                s.ksmd_cpu_seconds.map_or("-".into(), |c| format!("{c:.2} s"))
            ))
        });
        match written {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&summary).expect("serializes"));
        return Ok(());
    }
    let agg = |a: stats::Aggregate| format!("mean {}  max {}", fmt_bytes(a.mean as u64), fmt_bytes(a.max as u64));
    let mut cells =
        vec![vec!["over the run".to_string(), format!("{} samples in {:.1} s", summary.samples, summary.duration_s)]];
    cells.push(vec!["physical".into(), agg(summary.physical_bytes)]);
    cells.push(vec!["held, not mapped".into(), agg(summary.held_bytes)]);
    cells.push(vec!["anon + shmem".into(), agg(summary.anon_shmem_bytes)]);
    cells.push(vec!["RSS".into(), agg(summary.rss_bytes)]);
    cells.push(vec!["PSS".into(), agg(summary.pss_bytes)]);
    if let Some(k) = summary.ksmd_cpu_seconds {
        cells.push(vec!["ksmd CPU spent".into(), format!("{k:.2} s")]);
    }
    if let Some(why) = &summary.ended_early {
        cells.push(vec!["ended early".into(), why.clone()]);
    }
    out!("{}", render_cells(&cells));
    Ok(())
}
