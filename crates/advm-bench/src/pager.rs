//! `advm bench pager`: the SML/NJ external-pager experiment (Cooper, Nettles and
//! Subramanian, LFP 1992) under a real memory limit.
//!
//! Each workload runs in a forked child inside a fresh memory cgroup whose limit is
//! below the workload's footprint, with a kernel swap file the benchmark creates (and
//! always disables and removes, Ctrl-C included), in the paper's four settings:
//! - NP: no pager, the kernel pages the heap to its swap file;
//! - PO: the heap lives in an `advm::pager` region under a budget below the limit;
//!   from-space is marked discardable after each collection;
//! - PF: PO plus pager-initiated pre-flush (every discardable page dropped when the
//!   budget comes within a headroom);
//! - PU: PO plus a user-initiated flush of from-space after each collection.
//!
//! The collector is the paper's own shape, a two-space copying collector written here
//! over the heap memory; the workloads are shaped like the paper's three (a compiler
//! whose live data rises and falls, a sort whose live data grows, a CPU-bound primes
//! loop with little live data). [`Workload`] is the plug for real advm-gc workloads.

use std::time::Instant;

use advm::mem::Region;
use advm::pager::{Config, FaultMode, Interrupts, KernelSwap, PagedRegion, Pager, ProcessTimes, Stats};
use advm::stats::cgroup::Group;
use serde::{Deserialize, Serialize};

use crate::{Bench, BenchError, BenchOpts, DemoRow, Figure, Report, Row};

/// The pager benchmark.
pub struct PagerBench;

/// The paper's four settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Setting {
    /// Kernel paging only.
    NP,
    /// Pager, discardable pages.
    PO,
    /// Plus pager-initiated flush.
    PF,
    /// Plus user-initiated flush after each collection.
    PU,
    /// PO with the swap file written through the page cache instead of O_DIRECT.
    POCache,
}

const SETTINGS: [Setting; 5] = [Setting::NP, Setting::PO, Setting::PF, Setting::PU, Setting::POCache];

/// The heap a workload's collector works in: kernel memory or a pager region.
pub trait Heap {
    /// Copies bytes out.
    fn read(&mut self, off: usize, out: &mut [u8]) -> Result<(), BenchError>;
    /// Copies bytes in.
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), BenchError>;
    /// The collector no longer needs `[off, off+len)` (from-space after a copy).
    fn discardable(&mut self, off: usize, len: usize) -> Result<(), BenchError>;
    /// The collector is about to use `[off, off+len)` again (to-space).
    fn needed(&mut self, off: usize, len: usize) -> Result<(), BenchError>;
    /// A collection finished with `[off, off+len)` as garbage (the paper's PU hook).
    fn collected(&mut self, off: usize, len: usize) -> Result<(), BenchError>;
}

struct KernelHeap(Region);

impl Heap for KernelHeap {
    fn read(&mut self, off: usize, out: &mut [u8]) -> Result<(), BenchError> {
        out.copy_from_slice(&self.0.bytes()[off..off + out.len()]);
        Ok(())
    }
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), BenchError> {
        self.0.bytes_mut()[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn discardable(&mut self, _: usize, _: usize) -> Result<(), BenchError> {
        Ok(())
    }
    fn needed(&mut self, _: usize, _: usize) -> Result<(), BenchError> {
        Ok(())
    }
    fn collected(&mut self, _: usize, _: usize) -> Result<(), BenchError> {
        Ok(())
    }
}

struct PagedHeap {
    pager: Pager,
    region: PagedRegion,
    user_flush: bool,
}

impl Heap for PagedHeap {
    fn read(&mut self, off: usize, out: &mut [u8]) -> Result<(), BenchError> {
        Ok(self.region.read(off, out)?)
    }
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), BenchError> {
        Ok(self.region.write(off, data)?)
    }
    fn discardable(&mut self, off: usize, len: usize) -> Result<(), BenchError> {
        Ok(self.pager.discardable(self.region.as_ptr() as usize + off, len)?)
    }
    fn needed(&mut self, off: usize, len: usize) -> Result<(), BenchError> {
        Ok(self.pager.needed(self.region.as_ptr() as usize + off, len)?)
    }
    fn collected(&mut self, off: usize, len: usize) -> Result<(), BenchError> {
        if self.user_flush {
            self.pager.flush(self.region.as_ptr() as usize + off, len)?;
        }
        Ok(())
    }
}

/// A workload shape for the two-space collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Workload {
    /// Live data rising and falling (the paper's compiler).
    CompilerLike,
    /// Live data growing to the maximum (the paper's sort).
    GrowingSort,
    /// Little live data, CPU work per allocation (the paper's primes).
    Primes,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::CompilerLike => "compiler-like",
            Workload::GrowingSort => "growing-sort",
            Workload::Primes => "primes",
        }
    }

    /// Live objects wanted at progress `t` in [0, 1], out of `max`.
    fn live_target(self, t: f64, max: usize) -> usize {
        let f = match self {
            Workload::CompilerLike => 0.3 + 0.7 * ((t * 4.0).fract()),
            Workload::GrowingSort => t,
            Workload::Primes => 0.05,
        };
        (f * max as f64) as usize
    }
}

/// Sizes of one run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Sizes {
    limit: u64,
    semispace: usize,
    max_live: usize,
    allocate: usize,
    budget: usize,
    headroom: usize,
}

fn sizes(quick: bool) -> Sizes {
    let mib = 1usize << 20;
    let (limit, semi, live, alloc) =
        if quick { (48 * mib, 32 * mib, 20 * mib, 192 * mib) } else { (96 * mib, 64 * mib, 40 * mib, 1024 * mib) };
    // the heap gets what the limit leaves after the program itself (binary, roots)
    let budget = limit - 6 * mib;
    Sizes { limit: limit as u64, semispace: semi, max_live: live, allocate: alloc, budget, headroom: budget / 8 }
}

const OBJ: usize = 256;

/// The paper's collector shape: allocate in to-space; when full, copy the live
/// objects (the roots) to the other space, mark the old one discardable, flip.
fn run_collector(heap: &mut dyn Heap, w: Workload, s: &Sizes) -> Result<u64, BenchError> {
    let max_objs = s.max_live / OBJ;
    let mut roots: Vec<(u32, u64)> = Vec::with_capacity(max_objs);
    let (mut space, mut top) = (0usize, 0usize);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut obj = [0u8; OBJ];
    let steps = s.allocate / OBJ;
    let mut collections = 0u64;
    let mut checksum = 0u64;
    heap.needed(0, s.semispace)?;
    heap.discardable(s.semispace, s.semispace)?;
    for id in 1..=steps as u64 {
        if top + OBJ > s.semispace {
            // collect: to-space needed, copy roots, from-space garbage
            let other = 1 - space;
            heap.needed(other * s.semispace, s.semispace)?;
            let mut to = 0usize;
            for r in roots.iter_mut() {
                heap.read(space * s.semispace + r.0 as usize, &mut obj)?;
                heap.write(other * s.semispace + to, &obj)?;
                r.0 = to as u32;
                to += OBJ;
            }
            heap.discardable(space * s.semispace, s.semispace)?;
            heap.collected(space * s.semispace, s.semispace)?;
            space = other;
            top = to;
            collections += 1;
            if top + OBJ > s.semispace {
                return Err(BenchError::Usage("live data fills a semispace".into()));
            }
        }
        obj[..8].copy_from_slice(&id.to_ne_bytes());
        obj[8..16].copy_from_slice(&id.wrapping_mul(0x100_0000_01B3).to_ne_bytes());
        heap.write(space * s.semispace + top, &obj)?;
        let new = (top as u32, id);
        top += OBJ;
        let target = w.live_target(id as f64 / steps as f64, max_objs);
        if roots.len() < target {
            roots.push(new);
        } else if !roots.is_empty() {
            let i = (next() % roots.len() as u64) as usize;
            if roots.len() > target {
                roots.swap_remove(i);
            } else {
                roots[i] = new;
            }
        }
        if w == Workload::Primes {
            checksum += count_primes(id % 2000 + 500);
        }
        // the mutator reads a live object now and then, and checks it
        if id % 16 == 0 && !roots.is_empty() {
            let (off, want) = roots[(next() % roots.len() as u64) as usize];
            heap.read(space * s.semispace + off as usize, &mut obj)?;
            let got = u64::from_ne_bytes(obj[..8].try_into().expect("8 bytes"));
            if got != want {
                return Err(BenchError::Usage(format!("object {want} reads as {got}: heap corrupted")));
            }
        }
    }
    std::hint::black_box(checksum);
    Ok(collections)
}

fn count_primes(n: u64) -> u64 {
    (2..n).filter(|&k| (2..).take_while(|d| d * d <= k).all(|d| k % d != 0)).count() as u64
}

/// What one child run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Measured {
    elapsed_s: f64,
    times: ProcessTimes,
    collections: u64,
    pager: Option<Stats>,
    swap_in_pages: u64,
    swap_out_pages: u64,
    distinct_bytes: u64,
    cgroup_bytes: u64,
    cgroup_peak_bytes: f64,
}

fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok()))
        .unwrap_or(0)
}

fn run_in_child(group: &Group, w: Workload, setting: Setting, s: Sizes) -> Result<Measured, BenchError> {
    let path = group.path().to_path_buf();
    let reply = group.run_in_child(move || {
        let _ = Interrupts::default_in_child();
        let sampler = Group::open(&path).map_err(|e| e.to_string())?.sample_every(std::time::Duration::from_millis(20));
        let (pin, pout) = (vmstat("pswpin "), vmstat("pswpout "));
        let meters = || -> Result<(u64, u64), String> {
            let distinct = advm::stats::measure_self().map_err(|e| e.to_string())?.anon_shmem_bytes;
            let cgroup = Group::open(&path).and_then(|g| g.usage()).map_err(|e| e.to_string())?.anon_shmem_bytes();
            Ok((distinct, cgroup))
        };
        let before = meters()?;
        let t0 = ProcessTimes::now().map_err(|e| e.to_string())?;
        let start = Instant::now();
        let len = 2 * s.semispace;
        let (collections, pager, distinct) = if setting == Setting::NP {
            let mut heap = KernelHeap(Region::new(len).map_err(|e| e.to_string())?);
            let c = run_collector(&mut heap, w, &s).map_err(|e| e.to_string())?;
            (c, None, meters()?)
        } else {
            let mut cfg = Config::new(s.budget);
            if setting == Setting::PF {
                cfg.preflush_headroom_bytes = Some(s.headroom);
            }
            if setting == Setting::POCache {
                cfg.swap_io = advm::pager::SwapIo::PageCache;
            }
            cfg.cgroup = Some(path.clone());
            let pager = Pager::new(cfg).map_err(|e| e.to_string())?;
            let region = pager.map(len).map_err(|e| e.to_string())?;
            let mut heap = PagedHeap { pager, region, user_flush: setting == Setting::PU };
            let c = run_collector(&mut heap, w, &s).map_err(|e| e.to_string())?;
            (c, Some(heap.pager.stats()), meters()?)
        };
        let elapsed_s = start.elapsed().as_secs_f64();
        let t1 = ProcessTimes::now().map_err(|e| e.to_string())?;
        let summary = sampler.stop().map_err(|e| e.to_string())?;
        let m = Measured {
            elapsed_s,
            times: ProcessTimes {
                user_s: t1.user_s - t0.user_s,
                sys_s: t1.sys_s - t0.sys_s,
                major_faults: t1.major_faults - t0.major_faults,
            },
            collections,
            pager,
            swap_in_pages: vmstat("pswpin ") - pin,
            swap_out_pages: vmstat("pswpout ") - pout,
            distinct_bytes: distinct.0.saturating_sub(before.0),
            cgroup_bytes: distinct.1.saturating_sub(before.1),
            cgroup_peak_bytes: summary.anon_shmem_bytes.max,
        };
        serde_json::to_vec(&m).map_err(|e| e.to_string())
    })?;
    let bytes = reply.map_err(BenchError::Usage)?;
    serde_json::from_slice(&bytes).map_err(|e| BenchError::Usage(format!("reply of the measured child: {e}")))
}

/// The median time of `pages` faults, each timed alone, in microseconds.
fn median_fault(pages: usize, mut fault: impl FnMut(usize) -> advm::Result<()>) -> Result<f64, BenchError> {
    let mut us = Vec::with_capacity(pages);
    for i in 0..pages {
        let t = Instant::now();
        fault(i)?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    Ok(us[us.len() / 2])
}

/// Microseconds per fault, seen by the faulting thread: first touch of kernel memory
/// (mean), and the pager's zero-fill, discarded-page and read-back faults (median of
/// `pages` faults, one byte written or read per page), with faults served on the
/// pager's handler thread and on the faulting thread (SIGBUS mode, where offered)
/// side by side.
fn fault_costs(pages: usize, runs: usize) -> Result<Vec<Row>, BenchError> {
    let ps = advm::mem::page_size();
    let len = pages * ps;
    let mut kernel = Vec::new();
    let mut sigbus = Vec::new();
    let modes: &[(FaultMode, &str)] = if advm::pager::sigbus_available() {
        &[(FaultMode::Thread, "handler thread"), (FaultMode::Sigbus, "SIGBUS mode")]
    } else {
        &[(FaultMode::Thread, "handler thread")]
    };
    // [mode][zero-fill, read back, discarded]
    let mut pager_costs = vec![[Vec::new(), Vec::new(), Vec::new()]; modes.len()];
    let per = |t: Instant| t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    for _ in 0..runs {
        let mut r = Region::new(len)?;
        let t = Instant::now();
        for i in 0..pages {
            r.bytes_mut()[i * ps] = 1;
        }
        kernel.push(per(t));
        if let Some(d) = advm::pager::sigbus_zero_fill_cost(pages)? {
            sigbus.push(d.as_secs_f64() * 1e6);
        }
        for (&(mode, _), costs) in modes.iter().zip(&mut pager_costs) {
            let mut cfg = Config::new(2 * len);
            cfg.fault_mode = mode;
            let pager = Pager::new(cfg)?;
            let region = pager.map(len)?;
            costs[0].push(median_fault(pages, |i| region.write(i * ps, &[1]))?);
            pager.flush(region.as_ptr() as usize, len)?;
            let mut b = [0u8];
            costs[1].push(median_fault(pages, |i| region.read(i * ps, &mut b))?);
            pager.discardable(region.as_ptr() as usize, len)?;
            pager.flush(region.as_ptr() as usize, len)?;
            costs[2].push(median_fault(pages, |i| region.write(i * ps, &[2]))?);
        }
    }
    let row = |what: String, v: Vec<f64>| {
        Row::new().with("workload", "fault cost").with("setting", what).figure(Figure::new("per fault", "us", v))
    };
    let mut rows = vec![
        row("kernel first touch (mean)".into(), kernel),
        row("uffd SIGBUS zero page alone, on the faulting thread (mean)".into(), sigbus),
    ];
    for (&(_, name), [zero, read, discarded]) in modes.iter().zip(pager_costs) {
        rows.push(row(format!("pager zero-fill, {name}"), zero));
        rows.push(row(format!("pager discarded page, {name}"), discarded));
        rows.push(row(format!("pager read back (O_DIRECT), {name}"), read));
    }
    Ok(rows)
}

impl Bench for PagerBench {
    fn name(&self) -> &'static str {
        "pager"
    }

    fn description(&self) -> &'static str {
        "SML/NJ external-pager paper: a copying collector under a cgroup memory limit with swap, NP/PO/PF/PU"
    }

    fn default_runs(&self) -> usize {
        3
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        if let Err(why) = advm::pager::available() {
            return Err(BenchError::Usage(format!("the pager cannot run here: {why}")));
        }
        let s = sizes(opts.quick);
        let interrupts = Interrupts::catch()?;
        let swap_path = std::path::PathBuf::from(format!("/var/tmp/advm-bench-pager-{}.swap", std::process::id()));
        let swap = KernelSwap::create(&swap_path, 4 * s.semispace as u64)?;
        let group = Group::create("bench-pager")?;
        group.set_limit_bytes(s.limit)?;
        report.configuration.insert("cgroup_limit_bytes".into(), s.limit.into());
        report.configuration.insert("semispace_bytes".into(), s.semispace.into());
        report.configuration.insert("max_live_bytes".into(), s.max_live.into());
        report.configuration.insert("allocated_bytes".into(), s.allocate.into());
        report.configuration.insert("pager_budget_bytes".into(), s.budget.into());
        report.configuration.insert("pf_headroom_bytes".into(), s.headroom.into());
        report.configuration.insert("kernel_swap_file".into(), swap_path.display().to_string().into());
        let workloads = if opts.quick {
            vec![Workload::CompilerLike, Workload::Primes]
        } else {
            vec![Workload::CompilerLike, Workload::GrowingSort, Workload::Primes]
        };
        let bar = opts.progress_bar((workloads.len() * SETTINGS.len() * opts.runs) as u64, "pager");
        let mut result = Ok(());
        'all: for &w in &workloads {
            let mut per: Vec<Vec<Measured>> = vec![Vec::new(); SETTINGS.len()];
            // settings interleaved run by run, so drifting machine load hits all alike
            for _ in 0..opts.runs {
                for (si, &setting) in SETTINGS.iter().enumerate() {
                    let m = run_in_child(&group, w, setting, s);
                    bar.inc(1);
                    if let Some(sig) = interrupts.caught() {
                        result = Err(BenchError::Interrupted(format!("signal {sig}")));
                        break 'all;
                    }
                    match m {
                        Ok(m) => per[si].push(m),
                        Err(e) => {
                            result = Err(e);
                            break 'all;
                        }
                    }
                }
            }
            let np_elapsed = crate::median(&per[0].iter().map(|m| m.elapsed_s).collect::<Vec<_>>());
            for (si, ms) in per.iter().enumerate() {
                let fig = |name: &str, unit: &str, f: &dyn Fn(&Measured) -> f64| {
                    Figure::new(name, unit, ms.iter().map(f).collect())
                };
                let pf = |f: fn(&Stats) -> u64| move |m: &Measured| m.pager.map_or(0.0, |p| f(&p) as f64);
                let mut row = Row::new()
                    .with("workload", w.name())
                    .with("setting", format!("{:?}", SETTINGS[si]))
                    .figure(fig("elapsed", "s", &|m| m.elapsed_s))
                    .figure(fig("NP/this", "x", &|m| np_elapsed / m.elapsed_s))
                    .figure(fig("user", "s", &|m| m.times.user_s))
                    .figure(fig("system", "s", &|m| m.times.sys_s))
                    .figure(fig("major faults", "", &|m| m.times.major_faults as f64))
                    .figure(fig("kernel swap in", "pages", &|m| m.swap_in_pages as f64))
                    .figure(fig("kernel swap out", "pages", &|m| m.swap_out_pages as f64))
                    .figure(fig("collections", "", &|m| m.collections as f64));
                if SETTINGS[si] != Setting::NP {
                    for (name, unit, f) in [
                        ("read faults zero-filled", "pages", pf(|p| p.read_faults.zero_filled) as _),
                        ("read faults not read", "pages", pf(|p| p.read_faults.not_read)),
                        ("read faults read", "pages", pf(|p| p.read_faults.read)),
                        ("write faults zero-filled", "pages", pf(|p| p.write_faults.zero_filled)),
                        ("write faults not read", "pages", pf(|p| p.write_faults.not_read)),
                        ("write faults read", "pages", pf(|p| p.write_faults.read)),
                        ("page-out discarded", "pages", pf(|p| p.discarded_pages)),
                        ("page-out written", "pages", pf(|p| p.written_pages)),
                        ("flushed by pager", "pages", pf(|p| p.preflushed_by_pager)),
                        ("flushed by user", "pages", pf(|p| p.preflushed_by_user)),
                        ("handler time per fault", "ns", pf(|p| p.fault_ns / p.faults().max(1))),
                    ] {
                        let f: Box<dyn Fn(&Measured) -> f64> = Box::new(f);
                        row = row.figure(fig(name, unit, &*f));
                    }
                }
                row = row
                    .figure(fig("anon+shmem distinct (end, growth)", "MiB", &|m| m.distinct_bytes as f64 / 1048576.0))
                    .figure(fig("anon+shmem cgroup (end, growth)", "MiB", &|m| m.cgroup_bytes as f64 / 1048576.0))
                    .figure(fig("anon+shmem cgroup (peak)", "MiB", &|m| m.cgroup_peak_bytes / 1048576.0));
                for m in ms {
                    crate::meters::check(
                        &mut report.meter_disagreements,
                        &format!("{} {:?}", w.name(), SETTINGS[si]),
                        m.distinct_bytes as f64,
                        Some(m.cgroup_bytes as f64),
                    );
                }
                report.rows.push(row);
            }
        }
        bar.finish_and_clear();
        if result.is_ok() {
            match fault_costs(if opts.quick { 4096 } else { 16384 }, opts.runs) {
                Ok(rows) => report.rows.extend(rows),
                Err(e) => result = Err(e),
            }
        }
        // cleanup on every path: the group first (its processes are gone), then swap
        let removed = group.remove().map_err(BenchError::from).and(swap.remove().map_err(BenchError::from));
        report.notes.push(
            "collector: a two-space copying collector written in the benchmark (the paper's shape); \
             workloads shaped like the paper's, not advm-gc's (not merged yet)"
                .into(),
        );
        report
            .notes
            .push("kernel swap in/out are /proc/vmstat deltas: system-wide, other processes' paging included".into());
        result.and(removed)
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        if let Err(why) = advm::pager::available() {
            return Ok(vec![DemoRow {
                capability: "pager".into(),
                workload: "-".into(),
                advm: format!("skipped: the pager cannot run here: {why}"),
                baseline: "-".into(),
                gain: "-".into(),
            }]);
        }
        let budget = 16 << 20;
        let told = demo_pass(budget, true)?;
        let blind = demo_pass(budget, false)?;
        let bytes = |pages: u64| crate::table::fmt_bytes(pages * advm::mem::page_size() as u64);
        let say = |p: &DemoPass| {
            format!(
                "{} pages written ({}), {} read back, {} zero-filled, {:.0} ms",
                p.stats.written_pages,
                bytes(p.stats.written_pages),
                p.stats.read_pages(),
                p.stats.zero_fills(),
                p.ms
            )
        };
        Ok(vec![DemoRow {
            capability: "pager".into(),
            workload: format!(
                "{} region under a {} budget: first half written then marked discardable (a collector's \
                 from-space), second half written, all read through",
                crate::table::fmt_bytes(2 * budget as u64),
                crate::table::fmt_bytes(budget as u64)
            ),
            advm: format!("{}; {} evicted pages dropped unwritten", say(&told), told.stats.discarded_pages),
            baseline: format!("same pager, nothing marked: {}", say(&blind)),
            gain: format!(
                "{:.1}x fewer pages written, {:.1}x faster",
                blind.stats.written_pages as f64 / told.stats.written_pages.max(1) as f64,
                blind.ms / told.ms
            ),
        }])
    }
}

/// One pass of the demo workload and what the pager did.
struct DemoPass {
    stats: Stats,
    ms: f64,
}

/// The demo workload over a region twice `budget`: its first half written, marked
/// discardable when `mark` (the budget-blind baseline keeps it), the second half
/// written, then every page read; each page's first word checked (a discarded page
/// reads as zero).
fn demo_pass(budget: usize, mark: bool) -> Result<DemoPass, BenchError> {
    let ps = advm::mem::page_size();
    let len = 2 * budget;
    let pager = Pager::new(Config::new(budget))?;
    let region = pager.map(len)?;
    let t = Instant::now();
    let mut page = vec![0xA5u8; ps];
    let mut write = |from: usize, to: usize| -> Result<(), BenchError> {
        for off in (from..to).step_by(ps) {
            page[..8].copy_from_slice(&(off as u64 + 1).to_ne_bytes());
            region.write(off, &page)?;
        }
        Ok(())
    };
    write(0, budget)?;
    if mark {
        pager.discardable(region.as_ptr() as usize, budget)?;
    }
    write(budget, len)?;
    let mut word = [0u8; 8];
    for off in (0..len).step_by(ps) {
        region.read(off, &mut word)?;
        let want = if mark && off < budget { 0 } else { off as u64 + 1 };
        if u64::from_ne_bytes(word) != want {
            return Err(BenchError::Usage(format!(
                "pager demo: page at {off} reads {} (want {want})",
                u64::from_ne_bytes(word)
            )));
        }
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(DemoPass { stats: pager.stats(), ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints the rows too: `cargo test --release -p advm-bench fault_cost -- --nocapture`.
    #[test]
    fn fault_cost_rows_cover_both_fault_modes() {
        if let Err(why) = advm::pager::available() {
            eprintln!("skipped: {why}");
            return;
        }
        let rows = fault_costs(2048, 3).unwrap();
        let modes = if advm::pager::sigbus_available() { 2 } else { 1 };
        assert_eq!(rows.len(), 2 + 3 * modes);
        for r in &rows {
            eprintln!("{}", serde_json::to_string(r).unwrap());
        }
    }
}
