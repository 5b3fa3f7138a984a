//! `advm bench pager`: the SML/NJ external-pager experiment (Cooper, Nettles and
//! Subramanian, LFP 1992) under a real memory limit, on advm-gc.
//!
//! Each workload ([`workloads`]: compiler-like, growing sort, primes) runs on a
//! generational advm-gc heap, under SML/NJ's original or the paper's modified sizing
//! policy, copy-back on or off, in a forked child inside a fresh memory cgroup whose
//! limit is below the heap's footprint, with a kernel swap file the benchmark creates
//! (and always disables and removes, Ctrl-C included), in the paper's four settings:
//! - NP: no pager, the heap is plain memory the kernel pages to its swap file;
//!   NPFree: NP with each range the collector frees advised lazily freeable
//!   (`MADV_FREE`), so the kernel drops that garbage instead of swapping it;
//! - PO: the heap's spaces are `advm::pager` regions under a budget below the limit;
//!   what each collection frees is marked discardable, what the heap reuses needed;
//! - PF: PO plus pager-initiated pre-flush (every discardable page dropped when the
//!   budget or the cgroup comes within a headroom);
//! - PU: PO plus a user-initiated flush of the discardable pages after each major
//!   collection.
//!
//! Each pager setting also runs with the needed pages left to the kernel's own
//! reclaim and swap (`POKernel`, `PFKernel`, `PUKernel`: the pager drops the
//! discardable pages and writes nothing). The full run adds PO with the pager's swap
//! file through the page cache (POCache). NoLimit is NP with the limit lifted: the
//! time without paging, the floor of every setting. `$ADVM_BENCH_PAGER_LIMITS_MIB` runs
//! several cgroup limits (a sweep), `$ADVM_BENCH_PAGER_SETTINGS` and
//! `$ADVM_BENCH_PAGER_HEAPS` pick settings and heap configurations,
//! `$ADVM_BENCH_PAGER_FAULT_MODES` the fault modes each pager setting runs in,
//! `$ADVM_BENCH_PAGER_TLAB_KIB` the heap's allocation buffer.

mod workloads;

use std::sync::Arc;
use std::time::Instant;

use advm::mem::Region;
use advm::pager::{Config, FaultMode, Interrupts, KernelSwap, NeededPaging, Pager, ProcessTimes, Stats};
use advm::stats::cgroup::Group;
use advm_gc::{Generational, Heap, Paging, Policy};
use serde::{Deserialize, Serialize};

use crate::{env_list, Bench, BenchError, BenchOpts, DemoRow, Figure, Report, Row};
use workloads::Workload;

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
    /// Plus user-initiated flush after each major collection.
    PU,
    /// PO with the swap file written through the page cache instead of O_DIRECT.
    POCache,
    /// PO, needed pages paged by the kernel ([`NeededPaging::Kernel`]).
    POKernel,
    /// PF, needed pages paged by the kernel.
    PFKernel,
    /// PU, needed pages paged by the kernel.
    PUKernel,
    /// NP, with every range the collector frees advised lazily freeable
    /// (`advm_gc::Config::free_lazily`, `MADV_FREE`): no pager; the kernel drops those
    /// pages unwritten when the cgroup needs memory and swaps the rest.
    NPFree,
    /// NP with the cgroup's limit lifted: the time without paging, which no setting
    /// can beat (the most any can gain is NP/NoLimit).
    NoLimit,
}

impl Setting {
    const ALL: [Setting; 10] = [
        Setting::NP,
        Setting::NPFree,
        Setting::PO,
        Setting::PF,
        Setting::PU,
        Setting::POCache,
        Setting::POKernel,
        Setting::PFKernel,
        Setting::PUKernel,
        Setting::NoLimit,
    ];

    /// An `advm::pager` holds the heap (NP, NPFree and NoLimit are plain memory).
    fn pager(self) -> bool {
        !matches!(self, Setting::NP | Setting::NPFree | Setting::NoLimit)
    }

    fn preflush(self) -> bool {
        matches!(self, Setting::PF | Setting::PFKernel)
    }

    fn flush_after_major(self) -> bool {
        matches!(self, Setting::PU | Setting::PUKernel)
    }

    fn needed_paging(self) -> NeededPaging {
        match self {
            Setting::POKernel | Setting::PFKernel | Setting::PUKernel => NeededPaging::Kernel,
            _ => NeededPaging::SwapFile,
        }
    }
}

/// Sizes of one run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Sizes {
    limit: u64,
    /// The heap's most bytes (the policy decides how much of it is used).
    heap: usize,
    /// Peak live data of the compiler-like and the sort, MiB.
    live_mib: usize,
    /// Primes: candidates in units of 64k.
    primes: usize,
    budget: usize,
    headroom: usize,
}

/// The sizes of a run at the cgroup limit `limit_mib` (`None`: the default, 48 MiB
/// quick, 96 MiB full); live data and primes depend on `quick` only.
fn sizes(quick: bool, limit_mib: Option<usize>) -> Sizes {
    let mib = 1usize << 20;
    let (limit, live, primes) = if quick { (48 * mib, 24, 64) } else { (96 * mib, 48, 128) };
    let limit = limit_mib.map_or(limit, |l| l * mib);
    // the heap gets what the limit leaves after the program itself (binary, pager state)
    let budget = limit - 6 * mib;
    Sizes { limit: limit as u64, heap: 2 * limit, live_mib: live, primes, budget, headroom: budget / 8 }
}

/// The heap configurations of the paper's figures, parameters scaled to the limit
/// (one setting for all four pager settings, not searched per setting as the paper
/// did): original `ratio` 5, `mem_limit` the limit; modified `mem_lim` half the
/// limit, `min_new_size` an eighth, `min_old_incr` a quarter. Then the two policies
/// with copy-back off and the old generation compacted in place
/// (`advm_gc::Config::old_in_place`: its to-space over its own resident from-space, the
/// placement the paper's conclusion wished for), in every setting NP included. Each:
/// name, generational settings, in place.
fn heap_configs(limit: usize) -> [(&'static str, Generational, bool); 6] {
    let original = Policy::Original { ratio: 5.0, mem_limit: limit };
    let modified = Policy::Modified { mem_lim: limit / 2, min_new_size: limit / 8, min_old_incr: limit / 4 };
    [
        ("original, copy-back on", Generational { policy: original, copy_back: true }, false),
        ("original, copy-back off", Generational { policy: original, copy_back: false }, false),
        ("modified, copy-back off", Generational { policy: modified, copy_back: false }, false),
        ("modified, copy-back on", Generational { policy: modified, copy_back: true }, false),
        ("modified, in place", Generational { policy: modified, copy_back: false }, true),
        ("original, in place", Generational { policy: original, copy_back: false }, true),
    ]
}

/// What one child run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Measured {
    elapsed_s: f64,
    times: ProcessTimes,
    minors: u64,
    majors: u64,
    /// Summed pauses of the minor and of the other (major, full) collections.
    minor_pause_s: f64,
    major_pause_s: f64,
    checksum: u64,
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

fn run_in_child(
    group: &Group,
    w: Workload,
    (g, in_place): (Generational, bool),
    setting: Setting,
    s: Sizes,
    fault_mode: FaultMode,
    tlab_kib: Option<usize>,
) -> Result<Measured, BenchError> {
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
        let mut cfg = advm_gc::Config::new(s.heap);
        // the figures come from every collection
        cfg.history_limit = usize::MAX;
        // one GC thread: the paper's collector is sequential, and the cores are shared
        cfg.gc_threads = 1;
        if let Some(kib) = tlab_kib {
            cfg.tlab_bytes = kib << 10;
        }
        cfg.generational = Some(g);
        cfg.old_in_place = in_place;
        cfg.free_lazily = setting == Setting::NPFree;
        let pager = if !setting.pager() {
            None
        } else {
            let mut pc = Config::new(s.budget);
            if setting.preflush() {
                pc.preflush_headroom_bytes = Some(s.headroom);
            }
            if setting == Setting::POCache {
                pc.swap_io = advm::pager::SwapIo::PageCache;
            }
            pc.needed_paging = setting.needed_paging();
            pc.fault_mode = fault_mode;
            pc.cgroup = Some(path.clone());
            let pager = Arc::new(Pager::new(pc).map_err(|e| e.to_string())?);
            cfg.paging = Some(Paging { pager: pager.clone(), flush_after_major: setting.flush_after_major() });
            Some(pager)
        };
        // a child that livelocks (a fault that never resolves) is reported with the
        // pager's state and ended, so the benchmark goes on (its run is FAILED)
        // (the run is over when `done` is dropped)
        let (done, watched) = std::sync::mpsc::channel::<()>();
        if pager.is_some() {
            let limit = child_limit();
            std::thread::spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = watched.recv_timeout(limit) {
                    eprintln!(
                        "advm bench pager: the measured child ran past {limit:?}: ended. The pager:\n{}",
                        advm::pager::report(None)
                    );
                    std::process::exit(97);
                }
            });
        }
        let heap = Heap::with_config(cfg).map_err(|e| e.to_string())?;
        let mut m = heap.attach();
        let size = if w == Workload::Primes { s.primes } else { s.live_mib };
        let checksum = w.run(&mut m, size).map_err(|e| format!("{}: {e}", w.name()))?;
        let elapsed_s = start.elapsed().as_secs_f64();
        drop(done);
        let t1 = ProcessTimes::now().map_err(|e| e.to_string())?;
        // At the limit, the meters' own work touches pages of this process the kernel
        // swapped out (allocator, stacks), and each swap-in reclaims another page: the
        // distinct-page walk counts pages that are gone by the time the cgroup is read
        // (a 5.6 MiB disagreement was seen on an NP run). So the peak is taken first and
        // the end meters are read with the limit lifted: nothing is evicted under them.
        let peak = sampler.stop().map_err(|e| e.to_string())?.anon_shmem_bytes.max;
        Group::open(&path).and_then(|g| g.set_limit_bytes(1 << 46)).map_err(|e| e.to_string())?;
        let end = meters()?;
        drop(m);
        let hs = heap.stats();
        let m = Measured {
            elapsed_s,
            times: ProcessTimes {
                user_s: t1.user_s - t0.user_s,
                sys_s: t1.sys_s - t0.sys_s,
                major_faults: t1.major_faults - t0.major_faults,
            },
            minors: hs.history.iter().filter(|c| c.kind == "minor").count() as u64,
            majors: hs.history.iter().filter(|c| c.kind != "minor").count() as u64,
            minor_pause_s: pauses(&hs.history, true),
            major_pause_s: pauses(&hs.history, false),
            checksum,
            pager: pager.map(|p| p.stats()),
            swap_in_pages: vmstat("pswpin ") - pin,
            swap_out_pages: vmstat("pswpout ") - pout,
            distinct_bytes: end.0.saturating_sub(before.0),
            cgroup_bytes: end.1.saturating_sub(before.1),
            cgroup_peak_bytes: peak,
        };
        serde_json::to_vec(&m).map_err(|e| e.to_string())
    })?;
    let bytes = reply.map_err(BenchError::Usage)?;
    serde_json::from_slice(&bytes).map_err(|e| BenchError::Usage(format!("reply of the measured child: {e}")))
}

/// The summed pauses of the minor (`minor`) or the other collections, seconds.
fn pauses(history: &[advm_gc::Collection], minor: bool) -> f64 {
    history.iter().filter(|c| (c.kind == "minor") == minor).map(|c| c.pause_ns as f64 / 1e9).sum()
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

impl PagerBench {
    /// One row per setting of workload `w` under heap configuration `cname`.
    fn rows(
        &self,
        report: &mut Report,
        (w, cname, limit): (Workload, &str, u64),
        settings: &[(Setting, FaultMode)],
        per: &[Vec<Measured>],
    ) {
        let np_elapsed = crate::median(&per[0].iter().map(|m| m.elapsed_s).collect::<Vec<_>>());
        for (ms, &(setting, fault_mode)) in per.iter().zip(settings) {
            let pager = setting.pager();
            let fig = |name: &str, unit: &str, f: &dyn Fn(&Measured) -> f64| {
                Figure::new(name, unit, ms.iter().map(f).collect())
            };
            let pf = |f: fn(&Stats) -> u64| move |m: &Measured| m.pager.map_or(0.0, |p| f(&p) as f64);
            let mut row = Row::new()
                .with("workload", w.name())
                .with("heap", cname)
                .with("limit", format!("{} MiB", limit >> 20))
                .with("setting", format!("{setting:?}"))
                .with("faults", if pager { fault_mode_name(fault_mode) } else { "-" })
                .figure(fig("elapsed", "s", &|m| m.elapsed_s))
                .figure(fig("NP/this", "x", &|m| np_elapsed / m.elapsed_s))
                .figure(fig("user", "s", &|m| m.times.user_s))
                .figure(fig("system", "s", &|m| m.times.sys_s))
                .figure(fig("major faults", "", &|m| m.times.major_faults as f64))
                .figure(fig("kernel swap in", "pages", &|m| m.swap_in_pages as f64))
                .figure(fig("kernel swap out", "pages", &|m| m.swap_out_pages as f64))
                .figure(fig("minor collections", "", &|m| m.minors as f64))
                .figure(fig("major collections", "", &|m| m.majors as f64))
                .figure(fig("minor collection pauses", "s", &|m| m.minor_pause_s))
                .figure(fig("major collection pauses", "s", &|m| m.major_pause_s));
            if pager {
                for (name, unit, f) in [
                    ("read faults zero-filled", "pages", pf(|p| p.read_faults.zero_filled) as _),
                    ("read faults not read", "pages", pf(|p| p.read_faults.not_read)),
                    ("read faults read", "pages", pf(|p| p.read_faults.read)),
                    ("write faults zero-filled", "pages", pf(|p| p.write_faults.zero_filled)),
                    ("write faults not read", "pages", pf(|p| p.write_faults.not_read)),
                    ("write faults read", "pages", pf(|p| p.write_faults.read)),
                    ("read ahead", "pages", pf(|p| p.read_ahead_pages)),
                    ("zero-filled ahead", "pages", pf(|p| p.zero_ahead_pages)),
                    ("page-out discarded", "pages", pf(|p| p.discarded_pages)),
                    ("page-out written", "pages", pf(|p| p.written_pages)),
                    ("page-out clean (not written)", "pages", pf(|p| p.clean_dropped_pages)),
                    ("flushed by pager", "pages", pf(|p| p.preflushed_by_pager)),
                    ("flushed by user", "pages", pf(|p| p.preflushed_by_user)),
                    ("swap bytes written", "MiB", pf(|p| p.bytes_written >> 20)),
                    ("swap bytes read", "MiB", pf(|p| p.bytes_read >> 20)),
                    ("handler time per fault", "ns", pf(|p| p.fault_ns / p.faults().max(1))),
                    ("fault time", "ms", pf(|p| p.fault_ns / 1_000_000)),
                    ("eviction time", "ms", pf(|p| p.evict_ns / 1_000_000)),
                    ("of which swap writes", "ms", pf(|p| p.write_ns / 1_000_000)),
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
                    &format!("{} {cname} {} MiB {setting:?} ({})", w.name(), limit >> 20, fault_mode_name(fault_mode)),
                    m.distinct_bytes as f64,
                    Some(m.cgroup_bytes as f64),
                );
            }
            report.rows.push(row);
        }
    }
}

impl Bench for PagerBench {
    fn name(&self) -> &'static str {
        "pager"
    }

    fn description(&self) -> &'static str {
        "SML/NJ external-pager paper: advm-gc workloads under a cgroup memory limit with swap, NP/PO/PF/PU"
    }

    fn default_runs(&self) -> usize {
        3
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        if let Err(why) = advm::pager::available() {
            return Err(BenchError::Usage(format!("the pager cannot run here: {why}")));
        }
        let picked = picked_workloads()?;
        let limits: Vec<Option<usize>> = match picked_limits()? {
            Some(l) => l.into_iter().map(Some).collect(),
            None => vec![None],
        };
        let picked_settings = picked_settings()?;
        let fault_modes = picked_fault_modes()?;
        let tlab_kib = picked_tlab_kib()?;
        let sweep: Vec<Sizes> = limits.iter().map(|&l| sizes(opts.quick, l)).collect();
        let interrupts = Interrupts::catch()?;
        let swap_path = swap_file_path(std::process::id());
        remove_swap_files_left()?;
        // NP swaps the garbage of every space the old generation drifted through: up to
        // three heaps of its four-heap reservation, plus the nursery and large objects
        let most_heap = sweep.iter().map(|s| s.heap).max().unwrap_or(0);
        let swap = KernelSwap::create(&swap_path, 6 * most_heap as u64)?;
        let group = Group::create("bench-pager")?;
        let s0 = sweep[0];
        let conf = &mut report.configuration;
        conf.insert("cgroup_limit_bytes".into(), serde_json::json!(sweep.iter().map(|s| s.limit).collect::<Vec<_>>()));
        conf.insert("heap_bytes".into(), "twice the cgroup limit".into());
        conf.insert("peak_live_mib".into(), s0.live_mib.into());
        conf.insert("primes_candidates".into(), ((s0.primes as u64) << 16).into());
        conf.insert("pager_budget_bytes".into(), "the cgroup limit - 6 MiB".into());
        conf.insert("pf_headroom_bytes".into(), "the budget / 8".into());
        conf.insert("pager_fault_modes".into(), serde_json::json!(fault_modes));
        conf.insert("tlab_kib".into(), serde_json::json!(tlab_kib));
        conf.insert("kernel_swap_file".into(), swap_path.display().to_string().into());
        for (name, g, _) in &heap_configs(s0.limit as usize) {
            conf.insert(format!("heap {name} (at the first limit)"), serde_json::json!(g.policy));
        }
        // quick: the paper's base configurations (figures 13 and 19), two workloads
        let (mut workloads, mut config_ix): (Vec<Workload>, Vec<usize>) = if opts.quick {
            (vec![Workload::CompilerLike, Workload::Primes], vec![0, 2])
        } else {
            (vec![Workload::CompilerLike, Workload::GrowingSort, Workload::Primes], vec![0, 1, 2, 3])
        };
        if let Some(picked) = &picked {
            workloads = picked.clone();
        }
        if let Some(picked) = picked_heaps()? {
            config_ix = picked;
        }
        let settings = |w: Workload, ci: usize| -> Vec<(Setting, FaultMode)> {
            // each pager setting in each fault mode; NP, NPFree and NoLimit have no pager
            let with_modes = |v: Vec<Setting>| -> Vec<(Setting, FaultMode)> {
                v.into_iter()
                    .flat_map(|s| {
                        let modes = if s.pager() { &fault_modes } else { &fault_modes[..1] };
                        modes.iter().map(move |&m| (s, m))
                    })
                    .collect()
            };
            if let Some(p) = &picked_settings {
                return with_modes(p.clone());
            }
            let mut v = vec![
                Setting::NP,
                Setting::NPFree,
                Setting::PO,
                Setting::PF,
                Setting::PU,
                Setting::POKernel,
                Setting::PFKernel,
                Setting::PUKernel,
                Setting::NoLimit,
            ];
            if !opts.quick && w == Workload::CompilerLike && ci == 2 {
                v.push(Setting::POCache);
            }
            with_modes(v)
        };
        let total: usize = sweep.len()
            * workloads
                .iter()
                .map(|&w| config_ix.iter().map(|&ci| settings(w, ci).len()).sum::<usize>())
                .sum::<usize>();
        let bar = opts.progress_bar((total * opts.runs) as u64, "pager");
        let mut result = Ok(());
        'all: for &w in &workloads {
            for &ci in &config_ix {
                'limits: for &s in &sweep {
                    let (cname, g, in_place) = heap_configs(s.limit as usize)[ci];
                    let settings = settings(w, ci);
                    let mut per: Vec<Vec<Measured>> = vec![Vec::new(); settings.len()];
                    // settings interleaved run by run, so drifting machine load hits all alike
                    for _ in 0..opts.runs {
                        for (si, &(setting, fault_mode)) in settings.iter().enumerate() {
                            group.set_limit_bytes(if setting == Setting::NoLimit { 1 << 46 } else { s.limit })?;
                            let m = run_in_child(&group, w, (g, in_place), setting, s, fault_mode, tlab_kib);
                            bar.inc(1);
                            if let Some(sig) = interrupts.caught() {
                                result = Err(BenchError::Interrupted(format!(
                                    "{} during {} {cname} {setting:?}",
                                    crate::signal_name(sig),
                                    w.name()
                                )));
                                break 'all;
                            }
                            match m {
                                Ok(m) => per[si].push(m),
                                // the workload's failure in its child (heap exhausted, a panic):
                                // reported as FAILED in the notes, the other configurations run
                                Err(BenchError::Usage(e)) => {
                                    report.notes.push(format!(
                                        "FAILED: {} {cname} {} MiB {setting:?} ({} faults): {e}",
                                        w.name(),
                                        s.limit >> 20,
                                        fault_mode_name(fault_mode)
                                    ));
                                    continue 'limits;
                                }
                                Err(e) => {
                                    result = Err(e);
                                    break 'all;
                                }
                            }
                        }
                    }
                    if let Some(bad) = per.iter().flatten().find(|m| m.checksum != per[0][0].checksum) {
                        result = Err(BenchError::Usage(format!(
                            "{} {cname}: settings computed different results ({:#x} and {:#x})",
                            w.name(),
                            per[0][0].checksum,
                            bad.checksum
                        )));
                        break 'all;
                    }
                    self.rows(report, (w, cname, s.limit), &settings, &per);
                }
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
            "heap: advm-gc, generational, one GC thread; the same policy parameters in every pager setting \
             (the paper searched them per setting)"
                .into(),
        );
        report
            .notes
            .push("kernel swap in/out are /proc/vmstat deltas: system-wide, other processes' paging included".into());
        match (result, removed) {
            // a failed cleanup must not hide behind the run's own error
            (Err(e), Err(r)) => Err(BenchError::Usage(format!("{e}; then cleaning up failed: {r}"))),
            (result, removed) => result.and(removed),
        }
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        if let Err(why) = advm::pager::available() {
            return Ok(vec![DemoRow::skipped("pager", &format!("the pager cannot run here: {why}"))]);
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
                "{} region under a {} budget, one copying-collector cycle: from-space (first half) written, \
                 marked discardable after the copy, to-space (second half) written, from-space marked needed \
                 and reused (written again), all read",
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

/// Where run `pid` keeps its swap file.
fn swap_file_path(pid: u32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/var/tmp/advm-bench-pager-{pid}.swap"))
}

/// Turns off and removes the swap files of runs that were killed outright (their pid
/// is gone and nobody holds the file): otherwise the kernel keeps swapping to them,
/// under every later run.
fn remove_swap_files_left() -> Result<(), BenchError> {
    let Ok(dir) = std::fs::read_dir("/var/tmp") else { return Ok(()) };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix("advm-bench-pager-")?.strip_suffix(".swap")?.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            KernelSwap::remove_left(&swap_file_path(pid)).map_err(|e| {
                BenchError::Usage(format!(
                    "a killed run's swap file {} is still there and could not be removed ({e}); \
                     run `swapoff {0}; rm {0}`",
                    swap_file_path(pid).display()
                ))
            })?;
        }
    }
    Ok(())
}

/// `$ADVM_BENCH_PAGER_WORKLOADS` (comma separated names): a subset of the workloads,
/// since the full matrix takes the better part of an hour.
fn picked_workloads() -> Result<Option<Vec<Workload>>, BenchError> {
    let all = [Workload::CompilerLike, Workload::GrowingSort, Workload::Primes];
    env_list("ADVM_BENCH_PAGER_WORKLOADS", |name| {
        all.iter().copied().find(|w| w.name() == name).ok_or_else(|| {
            let names: Vec<_> = all.iter().map(|w| w.name()).collect();
            format!("no workload {name:?} (there are {})", names.join(", "))
        })
    })
}

/// `$ADVM_BENCH_PAGER_LIMITS_MIB` (comma separated MiB): cgroup limits to sweep.
fn picked_limits() -> Result<Option<Vec<usize>>, BenchError> {
    let limits = env_list("ADVM_BENCH_PAGER_LIMITS_MIB", |v| match v.parse::<usize>() {
        Ok(l) if (16..=1 << 20).contains(&l) => Ok(l),
        _ => Err(format!("{v:?} is not a limit in MiB from 16 to 1048576")),
    })?;
    Ok(limits.filter(|l| !l.is_empty()))
}

/// `$ADVM_BENCH_PAGER_SETTINGS` (comma separated, e.g. `NP,PF,PFKernel`): the
/// settings to run; NP always runs first (the others are compared with it).
fn picked_settings() -> Result<Option<Vec<Setting>>, BenchError> {
    let named = env_list("ADVM_BENCH_PAGER_SETTINGS", |name| {
        Setting::ALL.iter().copied().find(|s| format!("{s:?}") == name).ok_or_else(|| {
            let names: Vec<_> = Setting::ALL.iter().map(|s| format!("{s:?}")).collect();
            format!("no setting {name:?} (there are {})", names.join(", "))
        })
    })?;
    Ok(named.map(|named| std::iter::once(Setting::NP).chain(named.into_iter().filter(|&s| s != Setting::NP)).collect()))
}

/// The fault modes `$ADVM_BENCH_PAGER_FAULT_MODES` may name.
const FAULT_MODES: [(&str, FaultMode); 3] =
    [("thread", FaultMode::Thread), ("sigbus", FaultMode::Sigbus), ("auto", FaultMode::Auto)];

/// `$ADVM_BENCH_PAGER_FAULT_MODES` (comma separated: `thread`, `sigbus`, `auto`; the
/// library's default when unset): where the pager settings' faults are served. Each
/// pager setting runs in each mode, interleaved.
fn picked_fault_modes() -> Result<Vec<FaultMode>, BenchError> {
    let picked = env_list("ADVM_BENCH_PAGER_FAULT_MODES", |name| {
        FAULT_MODES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, m)| m)
            .ok_or_else(|| format!("no fault mode {name:?} (there are thread, sigbus, auto)"))
    })?;
    Ok(picked.filter(|m| !m.is_empty()).unwrap_or_else(|| vec![Config::new(1 << 20).fault_mode]))
}

fn fault_mode_name(mode: FaultMode) -> &'static str {
    FAULT_MODES.iter().find(|(_, m)| *m == mode).map_or("?", |(n, _)| n)
}

/// `$ADVM_BENCH_PAGER_CHILD_LIMIT_S`: how long one measured child with a pager may
/// run before it is ended as livelocked (its state printed); default 600 s.
fn child_limit() -> std::time::Duration {
    let s = std::env::var("ADVM_BENCH_PAGER_CHILD_LIMIT_S").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(600);
    std::time::Duration::from_secs(s.max(1))
}

/// `$ADVM_BENCH_PAGER_TLAB_KIB`: the heap's allocation buffer in KiB, the unit in
/// which it marks nursery pages needed again (advm-gc's default when unset).
fn picked_tlab_kib() -> Result<Option<usize>, BenchError> {
    let v = env_list("ADVM_BENCH_PAGER_TLAB_KIB", |v| match v.parse::<usize>() {
        Ok(k) if (1..=16 << 10).contains(&k) => Ok(k),
        _ => Err(format!("{v:?} is not a size in KiB from 1 to 16384")),
    })?;
    match v.as_deref() {
        None | Some([]) => Ok(None),
        Some([k]) => Ok(Some(*k)),
        Some(_) => Err(BenchError::Usage("$ADVM_BENCH_PAGER_TLAB_KIB takes one size".into())),
    }
}

/// `$ADVM_BENCH_PAGER_HEAPS` (comma separated numbers 0-5, in the order of
/// [`heap_configs`]): the heap configurations to run.
fn picked_heaps() -> Result<Option<Vec<usize>>, BenchError> {
    let heaps = env_list("ADVM_BENCH_PAGER_HEAPS", |v| match v.parse::<usize>() {
        Ok(i) if i < 6 => Ok(i),
        _ => Err(format!(
            "{v:?} is not a heap configuration number (0 original/copy-back on, 1 original/off, 2 modified/off, \
             3 modified/on, 4 modified/in place, 5 original/in place)"
        )),
    })?;
    Ok(heaps.filter(|h| !h.is_empty()))
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
    // each page's first word: its offset and the cycle that wrote it
    let word_of = |off: usize, cycle: u64| (off as u64 + 1) << 8 | cycle;
    let mut write = |from: usize, to: usize, cycle: u64| -> Result<(), BenchError> {
        for off in (from..to).step_by(ps) {
            page[..8].copy_from_slice(&word_of(off, cycle).to_ne_bytes());
            region.write(off, &page)?;
        }
        Ok(())
    };
    // one cycle of a copying collector: from-space (the first half) filled, its live
    // data copied to to-space (the second half), from-space garbage; then the flip:
    // from-space is the next allocation space, marked needed before it is written
    write(0, budget, 1)?;
    if mark {
        pager.discardable(region.as_ptr() as usize, budget)?;
    }
    write(budget, len, 1)?;
    if mark {
        pager.needed(region.as_ptr() as usize, budget)?;
    }
    write(0, budget, 2)?;
    let mut word = [0u8; 8];
    for off in (0..len).step_by(ps) {
        region.read(off, &mut word)?;
        let want = word_of(off, if off < budget { 2 } else { 1 });
        if u64::from_ne_bytes(word) != want {
            return Err(BenchError::Usage(format!(
                "pager demo: page at {off} reads {:#x} (want {want:#x})",
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
