//! `advm bench stat`: how fast `advm stat` measures a process, and the demo row that
//! shows why distinct pages differ from RSS. Both build their memory layout in this
//! process (advm::mem) and measure this process.

use super::{fmt_bytes, time_ms, Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::meters::{in_group, Both, Part};
use crate::BenchError;
use advm::mem::{Access, Assembly, Backing, Extent, Memfd, Region, Reservation, Share};
use advm::stats::{Meter, Options};

/// See the module doc.
pub struct StatBench;

/// `mib` MiB of private anonymous memory, written (distinct pages), and `reserve_gib`
/// GiB of empty reserved address space, as arenas reserve it.
fn anon_layout(mib: usize, reserve_gib: usize) -> Result<(Region, Option<Reservation>), BenchError> {
    let region = Region::new(mib << 20)?;
    region.populate(true)?;
    let reserved = if reserve_gib > 0 { Some(Reservation::new(reserve_gib << 30)?) } else { None };
    Ok((region, reserved))
}

/// One memfd page with non-zero bytes, mapped shared and read-only at `times`
/// addresses and faulted in: RSS counts it `times` times, distinct pages once.
fn shared_page_layout(times: usize) -> Result<Vec<Assembly>, BenchError> {
    let ps = advm::mem::page_size();
    let memfd = Memfd::create("advm-bench-stat")?;
    memfd.set_len(ps as u64)?;
    let bytes: Vec<u8> = (0..ps).map(|i| (i * 31 + 7) as u8).collect();
    memfd.write_all_at(&bytes, 0)?;
    let mut maps = Vec::with_capacity(times);
    for _ in 0..times {
        let mut a = Assembly::reserve(ps)?;
        a.place(
            Extent { offset: 0, len: ps, backing: Backing::Memfd { memfd: &memfd, offset: 0 } },
            Access::Read,
            Share::Shared,
        )?;
        a.populate_read(0, ps)?;
        maps.push(a);
    }
    Ok(maps)
}

impl Bench for StatBench {
    fn name(&self) -> &'static str {
        "stat"
    }

    fn description(&self) -> &'static str {
        "time to count distinct physical pages of a process of growing size, PAGEMAP_SCAN vs whole-VMA pagemap reads"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        // (populated MiB, empty reserved GiB): dense processes, and a sparse one that
        // reserves address space the way arenas do.
        let cases: &[(usize, usize)] =
            if opts.quick { &[(64, 0), (64, 64)] } else { &[(256, 0), (1024, 0), (4096, 0), (10240, 0), (256, 256)] };
        report.configuration.insert("cases_mib_reserved_gib".into(), serde_json::json!(cases));
        let bar = opts.progress_bar(cases.len() as u64, "stat");
        let mut unavailable = None;
        // The measured process is a child in its own memory cgroup: the cgroup meter
        // sees the layout alone, the distinct-page meter the child's pages.
        let part = in_group("bench-stat", &mut unavailable, |group| {
            let mut part = Part::default();
            for &(mib, reserve_gib) in cases {
                bar.inc(1);
                let before = Both::read(&Meter::for_self(Options::default())?.sample()?, group)?;
                let layout = anon_layout(mib, reserve_gib)?;
                let added = Both::read(&Meter::for_self(Options::default())?.sample()?, group)?.since(&before);
                let what = format!("stat {} populated", fmt_bytes((mib as u64) << 20));
                part.check(&what, added.distinct as f64, added.cgroup.map(|c| c as f64));
                for (mode, no_scan) in [("pagemap-scan", false), ("full-read", true)] {
                    let mut meter = Meter::for_self(Options { no_scan, ..Default::default() })?;
                    let mut distinct = 0;
                    let runs = time_ms(opts.runs, || {
                        let s = meter.sample()?;
                        distinct = s.distinct.map_or(0, |d| d.total);
                        Ok(())
                    })?;
                    let secs_per_gib = runs.iter().map(|ms| ms / 1e3 / (mib as f64 / 1024.0)).collect();
                    part.rows.push(
                        Row::new()
                            .with("populated", fmt_bytes((mib as u64) << 20))
                            .with("reserved", fmt_bytes((reserve_gib as u64) << 30))
                            .with("reader", mode)
                            .figure(Figure::new("measure time", "ms", runs))
                            .figure(Figure::new("per GiB", "s", secs_per_gib))
                            .figure(Figure::single("distinct pages", "pages", distinct as f64))
                            .figure(Figure::single("layout, distinct anon+shmem", "MiB", mib_of(added.distinct)))
                            .figure_if(
                                added.cgroup.is_some(),
                                Figure::single("layout, cgroup anon+shmem", "MiB", mib_of(added.cgroup.unwrap_or(0))),
                            ),
                    );
                }
                drop(layout);
            }
            Ok(part)
        })?;
        report.merge(part);
        report.notes.extend(unavailable);
        report.notes.push(
            "the measured process is a child in its own memory cgroup; \"layout\" figures are what building the \
             layout added: distinct anon+shmem frames (the paper's meter) and anon+shmem charged to the cgroup"
                .into(),
        );
        bar.finish_and_clear();
        if !advm::probe::facts().pfn_visible {
            report.notes.push("PFNs hidden: distinct pages read as 0 and stat falls back to PSS".into());
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let times = 10_000;
        let mut unavailable = None;
        let (s, cgroup_added) = in_group("demo-stat", &mut unavailable, |group| {
            let before = group.map(|g| g.usage()).transpose()?;
            let layout = shared_page_layout(times)?;
            let s = Meter::for_self(Options::default())?.sample()?;
            let after = group.map(|g| g.usage()).transpose()?;
            drop(layout);
            let added = before.zip(after).map(|(b, a)| a.anon_shmem_bytes().saturating_sub(b.anon_shmem_bytes()));
            Ok((Figures::of(&s), added))
        })?;
        let ps = s.page_size_bytes;
        let advm = match s.distinct_pages {
            Some(d) => format!("{d} distinct pages ({})", fmt_bytes(d * ps)),
            None => format!("PSS {} (PFNs hidden)", fmt_bytes(s.pss_bytes)),
        };
        let cgroup = match cgroup_added {
            Some(b) => format!("; cgroup: +{} anon+shmem", fmt_bytes(b)),
            None => String::new(),
        };
        Ok(vec![DemoRow {
            capability: "stat".into(),
            workload: format!("1 memfd page mapped at {times} addresses"),
            advm: format!("{advm}{cgroup}"),
            baseline: format!("RSS {} ({} pages)", fmt_bytes(s.rss_bytes), s.rss_bytes / ps),
            gain: format!("RSS over-counts {:.1}x", s.rss_bytes as f64 / s.physical_bytes.max(1) as f64),
        }])
    }
}

fn mib_of(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The figures of a sample the demo row prints (they cross back from the measured child).
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    page_size_bytes: u64,
    distinct_pages: Option<u64>,
    pss_bytes: u64,
    rss_bytes: u64,
    physical_bytes: u64,
}

impl Figures {
    fn of(s: &advm::stats::Sample) -> Self {
        Self {
            page_size_bytes: s.page_size_bytes,
            distinct_pages: s.distinct.map(|d| d.total),
            pss_bytes: s.pss_bytes,
            rss_bytes: s.rss_bytes,
            physical_bytes: s.physical_bytes,
        }
    }
}
