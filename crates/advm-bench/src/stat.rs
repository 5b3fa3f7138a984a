//! `advm bench stat`: how fast `advm stat` measures a process, and the demo row that
//! shows why distinct pages differ from RSS.

use super::{fmt_bytes, time_ms, Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::testproc;
use crate::CliError;
use advm::stats::{Meter, Options};

/// See the module doc.
pub struct StatBench;

impl Bench for StatBench {
    fn name(&self) -> &'static str {
        "stat"
    }

    fn description(&self) -> &'static str {
        "time to count distinct physical pages of a process of growing size, PAGEMAP_SCAN vs whole-VMA pagemap reads"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), CliError> {
        // (populated MiB, empty reserved GiB): dense processes, and a sparse one that
        // reserves address space the way arenas do.
        let cases: &[(usize, usize)] =
            if opts.quick { &[(64, 0), (64, 64)] } else { &[(256, 0), (1024, 0), (4096, 0), (10240, 0), (256, 256)] };
        report.configuration.insert("cases_mib_reserved_gib".into(), serde_json::json!(cases));
        let bar = opts.progress_bar(cases.len() as u64, "stat");
        for &(mib, reserve_gib) in cases {
            bar.inc(1);
            let child = testproc::Child::spawn(&[
                "anon",
                "--mib",
                &mib.to_string(),
                "--reserve-gib",
                &reserve_gib.to_string(),
            ])?;
            for (mode, no_scan) in [("pagemap-scan", false), ("full-read", true)] {
                let mut meter = Meter::new(&[child.pid()], Options { no_scan, ..Default::default() })?;
                let mut distinct = 0;
                let runs = time_ms(opts.runs, || {
                    let s = meter.sample()?;
                    distinct = s.distinct.map_or(0, |d| d.total);
                    Ok(())
                })?;
                let secs_per_gib = runs.iter().map(|ms| ms / 1e3 / (mib as f64 / 1024.0)).collect();
                report.rows.push(
                    Row::new()
                        .with("populated", fmt_bytes((mib as u64) << 20))
                        .with("reserved", fmt_bytes((reserve_gib as u64) << 30))
                        .with("reader", mode)
                        .figure(Figure::new("measure time", "ms", runs))
                        .figure(Figure::new("per GiB", "s", secs_per_gib))
                        .figure(Figure::single("distinct pages", "pages", distinct as f64)),
                );
            }
        }
        bar.finish_and_clear();
        if !advm::probe::facts().pfn_visible {
            report.notes.push("PFNs hidden: distinct pages read as 0 and stat falls back to PSS".into());
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, CliError> {
        let times = 10_000;
        let child = testproc::Child::spawn(&["shared-pages", "--pages", "1", "--times", &times.to_string()])?;
        let s = advm::stats::measure(&[child.pid()], Options::default())?;
        let ps = s.page_size_bytes;
        let advm = match s.distinct {
            Some(d) => format!("{} distinct pages ({})", d.total, fmt_bytes(d.total * ps)),
            None => format!("PSS {} (PFNs hidden)", fmt_bytes(s.pss_bytes)),
        };
        Ok(vec![DemoRow {
            capability: "stat".into(),
            workload: format!("1 memfd page mapped at {times} addresses"),
            advm,
            baseline: format!("RSS {} ({} pages)", fmt_bytes(s.rss_bytes), s.rss_bytes / ps),
            gain: format!("RSS over-counts {:.1}x", s.rss_bytes as f64 / s.physical_bytes.max(1) as f64),
        }])
    }
}
