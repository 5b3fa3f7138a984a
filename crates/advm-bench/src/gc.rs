//! `advm bench gc`: the SVAGC experiment. Every workload of `bench/gc/` runs on an
//! advm-gc heap at 1.2x and 2x its minimum heap (found by bisection), with large
//! objects compacted by page remapping and by memmove, runs interleaved; per run:
//! full-GC pause mean, p99 and max, the phases, bytes moved each way, total time. The
//! Java versions run under OpenJDK's ParallelGC and Shenandoah at 1.2x and 2x their own
//! minimum heap, pauses read from `-Xlog:gc`.
//!
//! SML/NJ's policies (Cooper, Nettles & Subramanian): the compiler-like and the
//! growing-sort workloads on a generational heap under the original and the modified
//! sizing policy, copy-back on and off: heap size (old generation plus nursery) after
//! every collection over time, elapsed time, collections, bytes freed to the hook, and
//! memory with both meters at the end of the run (in a cgroup child per run).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use advm_gc::{Collection, Config, Engine, Generational, Heap, Policy};

use super::{env_list, median, Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::meters::{in_group, Both, Part};
use crate::workloads::bench_file;
use crate::BenchError;

#[allow(missing_docs)]
#[path = "../../../bench/gc/workloads.rs"]
pub(crate) mod workloads;

use workloads::{Scale, Workload, ALL};

/// See the module doc.
pub struct GcBench;

const FACTORS: [f64; 2] = [1.2, 2.0];
/// Smallest heap tried for advm-gc.
const ADVM_FLOOR: usize = 256 << 10;
/// Smallest heap tried for the JVM (it refuses to start with much less): a workload
/// that fits it is reported with this minimum.
const JVM_FLOOR: usize = 4 << 20;
const JAVA_SRC: &str = bench_file!("gc/GcWorkloads.java");

fn gc_err(e: advm_gc::Error) -> BenchError {
    BenchError::Usage(format!("gc workload: {e}"))
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct RunFigures {
    pauses_ms: Vec<f64>,
    /// Of the pauses, full collections (every collection of a non-generational
    /// advm-gc heap, the major ones of a generational one; `Pause Full` for the JVM):
    /// what the paper compares (its "maximum pause time of Full GC", whose phases it
    /// breaks down into compaction and the rest).
    full_pauses_ms: Vec<f64>,
    /// Shenandoah's degenerated pauses (a concurrent cycle finished with the world
    /// stopped): not full collections, reported beside them.
    degenerated_ms: Vec<f64>,
    /// A generational advm-gc heap's minor collections.
    minor_ms: Vec<f64>,
    total_s: f64,
    phases_ms: [f64; 4],
    memmove_mib: f64,
    remap_mib: f64,
    /// Per collection: the large objects' batch (ms) and the bytes it moved as pages.
    large_moves: Vec<(f64, u64)>,
    checksum: u64,
}

fn p99(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The generational configuration of the JVM comparison's `advm-gen` rows, for a
/// heap limit of `heap` bytes: SML/NJ's modified policy with the limit as `mem_lim`,
/// `min_new_size` heap/8, `min_old_incr` heap/4, copy-back on (its to-space pages are
/// reused; a drifting old generation faults fresh pages in at each major collection).
fn generational(heap: usize) -> Generational {
    Generational {
        policy: Policy::Modified { mem_lim: heap, min_new_size: heap / 8, min_old_incr: heap / 4 },
        copy_back: true,
    }
}

/// Runs `w` on a fresh heap, generational ([`generational`]) or not; `Ok(None)` when
/// the heap was too small.
fn run_advm(
    w: Workload,
    scale: Scale,
    heap: usize,
    engine: Engine,
    gen: bool,
) -> Result<Option<RunFigures>, BenchError> {
    let mut cfg = Config::new(heap);
    // the figures come from every collection
    cfg.history_limit = usize::MAX;
    cfg.engine = engine;
    cfg.generational = gen.then(|| generational(heap));
    let h = Heap::with_config(cfg).map_err(gc_err)?;
    let mut m = h.attach();
    let t = Instant::now();
    let sum = match w(&mut m, scale) {
        Ok(s) => s,
        Err(advm_gc::Error::HeapExhausted { .. } | advm_gc::Error::ObjectTooLarge { .. }) => return Ok(None),
        Err(e) => return Err(gc_err(e)),
    };
    let total_s = t.elapsed().as_secs_f64();
    drop(m);
    let s = h.stats();
    let ms = |ns: u64| ns as f64 / 1e6;
    // Full collections: every one of a non-generational heap, the major ones (each
    // with its minor collection first) of a generational one.
    let full: Vec<&Collection> = s.history.iter().filter(|c| c.kind != "minor").collect();
    let per = |f: fn(&Collection) -> u64| mean(&full.iter().map(|c| ms(f(c))).collect::<Vec<_>>());
    Ok(Some(RunFigures {
        pauses_ms: s.history.iter().map(|c| ms(c.pause_ns)).collect(),
        full_pauses_ms: full.iter().map(|c| ms(c.pause_ns)).collect(),
        minor_ms: s.history.iter().filter(|c| c.kind == "minor").map(|c| ms(c.pause_ns)).collect(),
        total_s,
        phases_ms: [per(|c| c.mark_ns), per(|c| c.forward_ns), per(|c| c.adjust_ns), per(|c| c.move_ns)],
        memmove_mib: s.bytes_moved_memmove as f64 / (1 << 20) as f64,
        remap_mib: s.bytes_moved_remap as f64 / (1 << 20) as f64,
        large_moves: s.history.iter().map(|c| (ms(c.move_large_ns), c.bytes_remap)).collect(),
        checksum: sum,
        degenerated_ms: Vec::new(),
    }))
}

/// One generational run's figures.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct PolicyRun {
    total_s: f64,
    minors: u64,
    majors: u64,
    pause_total_ms: f64,
    copied_back_mib: f64,
    freed_mib: f64,
    /// Old generation plus nursery after each collection, MiB, and when (ms).
    series: Vec<(f64, f64)>,
    mem: Both,
    checksum: u64,
}

/// The four configurations of the paper's comparison, with parameters scaled to the
/// workload's minimum (full-collection) heap `min`: original `ratio` 5 and `mem_limit`
/// 2*min; modified `mem_lim` min, `min_new_size` min/8, `min_old_incr` min/4.
fn policies(min: usize) -> [(&'static str, Generational); 4] {
    let original = Policy::Original { ratio: 5.0, mem_limit: 2 * min };
    let modified = Policy::Modified { mem_lim: min, min_new_size: min / 8, min_old_incr: min / 4 };
    [
        ("original+copy-back", Generational { policy: original, copy_back: true }),
        ("original-drift", Generational { policy: original, copy_back: false }),
        ("modified+copy-back", Generational { policy: modified, copy_back: true }),
        ("modified-drift", Generational { policy: modified, copy_back: false }),
    ]
}

/// Runs `w` on a generational heap with a limit of `heap` bytes, in a cgroup child.
fn run_policy(
    w: Workload,
    scale: Scale,
    heap: usize,
    g: Generational,
    part: &mut Part,
) -> Result<PolicyRun, BenchError> {
    let mut unavailable = None;
    let r = in_group("advm-bench-gc-policy", &mut unavailable, |group| {
        // A warm-up run first, configured as the measured one: the malloc arena's free
        // pages are shared copy-on-write with the parent (which ran the workload while
        // finding its minimum heap); the cgroup would charge their copies to this run
        // while the distinct-page meter already counted them before it. The same
        // configuration matters: a generational heap's remembered set grows in the
        // arena, which a full-collection warm-up does not reach.
        let config = || {
            let mut cfg = Config::new(heap);
            // the figures come from every collection
            cfg.history_limit = usize::MAX;
            cfg.generational = Some(g);
            cfg
        };
        let warm = Heap::with_config(config()).map_err(gc_err)?;
        w(&mut warm.attach(), scale).map_err(gc_err)?;
        drop(warm);
        let before = Both::read(&advm::stats::measure_self()?, group)?;
        let h = Heap::with_config(config()).map_err(gc_err)?;
        let mut m = h.attach();
        let t = Instant::now();
        let checksum = w(&mut m, scale).map_err(gc_err)?;
        let total_s = t.elapsed().as_secs_f64();
        let mem = Both::read(&advm::stats::measure_self()?, group)?.since(&before);
        drop(m);
        let s = h.stats();
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        Ok(PolicyRun {
            total_s,
            minors: s.history.iter().filter(|c| c.kind == "minor").count() as u64,
            majors: s.history.iter().filter(|c| c.kind == "major").count() as u64,
            pause_total_ms: s.total_pause_ns as f64 / 1e6,
            copied_back_mib: mib(s.history.iter().map(|c| c.bytes_copied_back).sum()),
            freed_mib: mib(s.history.iter().map(|c| c.bytes_freed_pages as u64).sum()),
            series: s
                .history
                .iter()
                .map(|c| (c.at_ns as f64 / 1e6, mib((c.old_bytes + c.nursery_bytes) as u64)))
                .collect(),
            mem,
            checksum,
        })
    })?;
    if let Some(u) = unavailable {
        if !part.notes.contains(&u) {
            part.notes.push(u);
        }
    }
    Ok(r)
}

/// The policy comparison rows for the compiler-like and the growing-sort workloads.
fn policy_section(scale: Scale, runs: usize, report: &mut Report) -> Result<(), BenchError> {
    let mut part = Part::default();
    for (name, w) in ALL.iter().filter(|(n, _)| *n == "compiler-sawtooth" || *n == "growing-sort") {
        let min = min_heap(ADVM_FLOOR, |h| Ok(run_advm(*w, scale, h, Engine::Remap, false)?.is_some()))?;
        // The limit leaves the sizing to the policy.
        let heap = 4 * min;
        let configs = policies(min);
        let mut all: Vec<Vec<PolicyRun>> = vec![Vec::new(); configs.len()];
        for _ in 0..runs {
            for (i, (_, g)) in configs.iter().enumerate() {
                all[i].push(run_policy(*w, scale, heap, *g, &mut part)?);
            }
        }
        for ((label, g), rs) in configs.iter().zip(&all) {
            if rs.iter().any(|r| r.checksum != rs[0].checksum) {
                return Err(BenchError::Usage(format!("{name} {label}: runs computed different results")));
            }
            let fig = |n: &str, u: &str, f: &dyn Fn(&PolicyRun) -> f64| Figure::new(n, u, rs.iter().map(f).collect());
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            for r in rs {
                part.check(&format!("gc policy {name} {label}"), r.mem.distinct as f64, r.mem.cgroup.map(|c| c as f64));
            }
            let heap_max = |r: &PolicyRun| r.series.iter().map(|p| p.1).fold(0.0, f64::max);
            let heap_mean = |r: &PolicyRun| mean(&r.series.iter().map(|p| p.1).collect::<Vec<_>>());
            part.rows.push(
                Row::new()
                    .with("workload", name)
                    .with("collector", format!("advm-gen-{label}"))
                    .with("policy", g.policy.name())
                    .with("copy_back", g.copy_back)
                    .with("min_heap_mib", format!("{:.1}", mib(min as u64)))
                    .figure(fig("total_s", "s", &|r| r.total_s))
                    .figure(fig("pause_total_ms", "ms", &|r| r.pause_total_ms))
                    .figure(fig("minor_collections", "", &|r| r.minors as f64))
                    .figure(fig("major_collections", "", &|r| r.majors as f64))
                    .figure(fig("heap_mib_max", "MiB", &heap_max))
                    .figure(fig("heap_mib_mean", "MiB", &heap_mean))
                    .figure(fig("copied_back_mib", "MiB", &|r| r.copied_back_mib))
                    .figure(fig("freed_to_hook_mib", "MiB", &|r| r.freed_mib))
                    .figure(fig("mem_distinct_mib", "MiB", &|r| mib(r.mem.distinct)))
                    .figure(fig("mem_cgroup_mib", "MiB", &|r| r.mem.cgroup.map_or(f64::NAN, mib))),
            );
            // The first run's heap-size series, for the plot.
            part.configuration.insert(format!("heap_series_{name}_{label}"), serde_json::json!(rs[0].series));
        }
    }
    report.merge(part);
    report.notes.push(
        "policies: heap limit 4x the workload's minimum full-collection heap; original ratio 5, mem_limit 2x min; \
         modified mem_lim = min, min_new_size = min/8, min_old_incr = min/4; heap size = old generation + nursery \
         after each collection; memory = both meters at the end of the run (freed pages are only reported to the \
         hook, not discarded: no pager yet)"
            .into(),
    );
    Ok(())
}

/// Object sizes of the pause-vs-size section (KiB): both sides of the compaction
/// break-even, and the 2 MiB-aligned sizes whose page tables move whole.
const SIZES_KIB: [usize; 9] = [16, 64, 256, 1024, 2048, 4096, 10240, 32768, 102400];
/// Collections per heap in that section; the first two (nothing or one object to move
/// yet) are left out.
const SIZE_ROUNDS: usize = 10;

/// Pauses of a window of two live objects of `size` bytes (headers included): each
/// round replaces the older one and collects, so each collection slides the newer one
/// down over the dead one (its destination holds pages). Returns the pauses and the
/// large-object moves (ms), and the bytes moved as pages.
fn size_run(size: usize, engine: Engine) -> Result<(Vec<f64>, Vec<f64>, u64), BenchError> {
    let mut cfg = Config::new(4 * size + (1 << 20));
    // the figures come from every collection
    cfg.history_limit = usize::MAX;
    cfg.engine = engine;
    let h = Heap::with_config(cfg).map_err(gc_err)?;
    let mut m = h.attach();
    let win = m.alloc(2, 0).map_err(gc_err)?;
    let wr = m.push_root(Some(win));
    for r in 0..SIZE_ROUNDS {
        let o = m.alloc(0, size - 16).map_err(gc_err)?;
        for off in (0..size - 16).step_by(4096) {
            m.write_bytes(o, off, &[r as u8; 8]);
        }
        let w = m.root(wr).expect("rooted window");
        m.set(w, r % 2, Some(o));
        m.collect().map_err(gc_err)?;
    }
    drop(m);
    let s = h.stats();
    let ms = |ns: u64| ns as f64 / 1e6;
    let steady = &s.history[2..];
    Ok((
        steady.iter().map(|c| ms(c.pause_ns)).collect(),
        steady.iter().map(|c| ms(c.move_large_ns)).collect(),
        steady.iter().map(|c| c.bytes_remap).sum(),
    ))
}

/// Full-GC pause against object size, both engines (runs alternate), and the
/// compaction break-even curve `advm::remap` measured that decides between them.
fn size_section(quick: bool, runs: usize, report: &mut Report) -> Result<(), BenchError> {
    let sizes = SIZES_KIB.iter().filter(|&&k| !quick || k <= 10240);
    for &kib in sizes {
        let size = kib << 10;
        let mut per = [(Vec::new(), Vec::new(), 0u64), (Vec::new(), Vec::new(), 0u64)];
        for _ in 0..runs {
            for (i, e) in [Engine::Remap, Engine::Memmove].into_iter().enumerate() {
                let (p, l, b) = size_run(size, e)?;
                per[i].0.extend(p);
                per[i].1.extend(l);
                per[i].2 += b;
            }
        }
        for ((pauses, large, remapped), collector) in per.into_iter().zip(["advm-remap", "advm-memmove"]) {
            report.rows.push(
                Row::new()
                    .with("workload", "object-size")
                    .with("object_kib", kib)
                    .with("collector", collector)
                    .figure(Figure::new("pause_ms", "ms", pauses))
                    .figure(Figure::new("move_large_ms", "ms", large))
                    .figure(Figure::single("moved_remap_mib", "MiB", remapped as f64 / (1 << 20) as f64)),
            );
        }
    }
    let be = advm::remap::break_even();
    report.configuration.insert("break_even_compaction_pages".into(), serde_json::json!(be.pages_compaction));
    report.configuration.insert("break_even_compaction_curve".into(), serde_json::json!(be.compaction));
    report.notes.push(format!(
        "object-size rows: a window of two live objects, {SIZE_ROUNDS} collections per heap (the first two left \
         out), each sliding the newer object over the dead one; figures are every collection of every run"
    ));
    Ok(())
}

/// `$ADVM_BENCH_GC_WORKLOADS` (comma separated names): a subset of the workloads, and
/// then neither the object-size nor the policy section (the full run takes hours).
fn picked_workloads() -> Result<Option<Vec<(&'static str, Workload)>>, BenchError> {
    env_list("ADVM_BENCH_GC_WORKLOADS", |name| {
        ALL.iter().copied().find(|(n, _)| *n == name).ok_or_else(|| {
            let names: Vec<_> = ALL.iter().map(|(n, _)| *n).collect();
            format!("no workload {name:?} (there are {})", names.join(", "))
        })
    })
}

/// The smallest heap from `floor` up (within 1/16 of the doubling step) on which `fits`
/// holds.
fn min_heap(floor: usize, mut fits: impl FnMut(usize) -> Result<bool, BenchError>) -> Result<usize, BenchError> {
    let mut hi = floor;
    if fits(hi)? {
        return Ok(hi);
    }
    loop {
        hi *= 2;
        if hi > 8 << 30 {
            return Err(BenchError::Usage("workload does not fit 8 GiB".into()));
        }
        if fits(hi)? {
            break;
        }
    }
    let mut lo = (hi / 2).max(floor);
    for _ in 0..4 {
        let mid = (lo + hi) / 2 / 4096 * 4096;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

fn row(workload: &str, factor: f64, collector: &str, heap: usize, runs: &[RunFigures]) -> Row {
    let fig =
        |name: &str, unit: &str, f: &dyn Fn(&RunFigures) -> f64| Figure::new(name, unit, runs.iter().map(f).collect());
    let mut r = Row::new()
        .with("workload", workload)
        .with("heap_factor", factor)
        .with("collector", collector)
        .with("heap_mib", format!("{:.1}", heap as f64 / (1 << 20) as f64))
        .figure(fig("pause_ms_mean", "ms", &|r| mean(&r.pauses_ms)))
        .figure(fig("pause_ms_p99", "ms", &|r| p99(&r.pauses_ms)))
        .figure(fig("pause_ms_max", "ms", &|r| r.pauses_ms.iter().copied().fold(0.0, f64::max)))
        .figure(fig("full_pause_ms_max", "ms", &|r| r.full_pauses_ms.iter().copied().fold(0.0, f64::max)))
        // The typical full pause beside the maximum (which one descheduled thread sets).
        .figure(fig("full_pause_ms_median", "ms", &|r| {
            if r.full_pauses_ms.is_empty() {
                0.0
            } else {
                median(&r.full_pauses_ms)
            }
        }))
        .figure(fig("full_collections", "", &|r| r.full_pauses_ms.len() as f64))
        .figure(fig("collections", "", &|r| r.pauses_ms.len() as f64))
        .figure(fig("total_s", "s", &|r| r.total_s));
    if collector == "advm-gen" {
        r = r.figure(fig("minor_pause_ms_max", "ms", &|r| r.minor_ms.iter().copied().fold(0.0, f64::max))).figure(fig(
            "minor_collections",
            "",
            &|r| r.minor_ms.len() as f64,
        ));
    }
    if collector == "shenandoah" {
        r = r
            .figure(fig("degenerated_pause_ms_max", "ms", &|r| r.degenerated_ms.iter().copied().fold(0.0, f64::max)))
            .figure(fig("degenerated_collections", "", &|r| r.degenerated_ms.len() as f64));
    }
    if collector.starts_with("advm") {
        for (i, p) in ["mark_ms_mean", "forward_ms_mean", "adjust_ms_mean", "move_ms_mean"].iter().enumerate() {
            r = r.figure(fig(p, "ms", &|r| r.phases_ms[i]));
        }
        r = r
            .figure(fig("moved_memmove_mib", "MiB", &|r| r.memmove_mib))
            .figure(fig("moved_remap_mib", "MiB", &|r| r.remap_mib));
    }
    r
}

/// Per pair of runs (remap run k against memmove run k, which ran next to it and
/// collected at the same points: the workloads are deterministic), the median of
/// memmove/remap over what `per` makes of each run's pauses: the sum (one value), or
/// every collection (the ratio of collection i to collection i). Paired ratios do not
/// depend on one descheduled GC thread the way a maximum does.
fn paired(remap: &[RunFigures], copy: &[RunFigures], per: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    remap
        .iter()
        .zip(copy)
        .filter_map(|(a, b)| {
            let r: Vec<f64> =
                per(&a.pauses_ms).iter().zip(per(&b.pauses_ms)).filter(|p| *p.0 > 0.0).map(|(x, y)| y / x).collect();
            (!r.is_empty()).then(|| median(&r))
        })
        .collect()
}

/// Per pair of runs, the median of memmove/remap over the large objects' batch of the
/// collections in which the remap engine moved pages: the part of the pause the engine
/// changes, without the phases both engines share.
fn page_move_batches(remap: &[RunFigures], copy: &[RunFigures]) -> Vec<f64> {
    remap
        .iter()
        .zip(copy)
        .filter_map(|(a, b)| {
            let r: Vec<f64> = a
                .large_moves
                .iter()
                .zip(&b.large_moves)
                .filter(|(x, _)| x.1 > 0 && x.0 > 0.0)
                .map(|(x, y)| y.0 / x.0)
                .collect();
            (!r.is_empty()).then(|| median(&r))
        })
        .collect()
}

fn max_pause_median(runs: &[RunFigures]) -> f64 {
    median(&runs.iter().map(|r| r.pauses_ms.iter().copied().fold(0.0, f64::max)).collect::<Vec<_>>())
}

/// The Java side: compiled classes, and the JVM.
struct Java {
    dir: PathBuf,
}

impl Drop for Java {
    fn drop(&mut self) {
        // The classes and GC logs of this run only.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Java {
    fn setup() -> Result<Option<Self>, BenchError> {
        if Command::new("javac").arg("-version").output().is_err() {
            return Ok(None);
        }
        let dir = std::env::temp_dir().join(format!("advm-gc-java-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::Io(dir.display().to_string(), e))?;
        let src = dir.join("GcWorkloads.java");
        std::fs::write(&src, JAVA_SRC).map_err(|e| BenchError::Io(src.display().to_string(), e))?;
        let out = Command::new("javac")
            .arg("-d")
            .arg(&dir)
            .arg(&src)
            .output()
            .map_err(|e| BenchError::Io("javac".into(), e))?;
        if !out.status.success() {
            return Err(BenchError::Usage(format!("javac failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(Some(Java { dir }))
    }

    /// One run; `None` on OutOfMemoryError.
    fn run(&self, gc: &str, heap: usize, workload: &str, quick: bool) -> Result<Option<RunFigures>, BenchError> {
        let log = self.dir.join(format!("gc-{gc}-{workload}.log"));
        let _ = std::fs::remove_file(&log);
        let flag = if gc == "parallel" { "-XX:+UseParallelGC" } else { "-XX:+UseShenandoahGC" };
        let heap_k = heap / 1024;
        let out = Command::new("java")
            .arg(format!("-Xmx{heap_k}k"))
            .arg(format!("-Xms{heap_k}k"))
            .arg(flag)
            .arg(format!("-XX:ParallelGCThreads={}", advm::probe::facts().cpus.max(1)))
            .arg(format!("-Xlog:gc:file={}", log.display()))
            .arg("-cp")
            .arg(&self.dir)
            .arg("GcWorkloads")
            .arg(workload)
            .arg(if quick { "quick" } else { "full" })
            .output()
            .map_err(|e| BenchError::Io("java".into(), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("OutOfMemoryError") || stdout.contains("OutOfMemoryError") {
                return Ok(None);
            }
            return Err(BenchError::Usage(format!("java {workload} ({gc}, {heap_k}k) failed: {err}")));
        }
        let total_s = stdout
            .lines()
            .find_map(|l| l.strip_prefix("elapsed_s "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN);
        let text = std::fs::read_to_string(&log).map_err(|e| BenchError::Io(log.display().to_string(), e))?;
        Ok(Some(RunFigures {
            pauses_ms: pauses(&text, " Pause "),
            full_pauses_ms: pauses(&text, " Pause Full"),
            degenerated_ms: pauses(&text, " Pause Degenerated"),
            total_s,
            ..Default::default()
        }))
    }
}

/// Pause times (ms) of the `-Xlog:gc` lines containing `what`:
/// `... GC(3) Pause Full (...) 10M->2M(20M) 12.345ms`.
fn pauses(log: &str, what: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.trim().rsplit(' ').next()?.strip_suffix("ms")?.parse().ok())
        .collect()
}

impl Bench for GcBench {
    fn name(&self) -> &'static str {
        "gc"
    }

    fn description(&self) -> &'static str {
        "advm-gc full-GC pauses with large objects moved by page remapping vs memmove (SVAGC), and OpenJDK ParallelGC/Shenandoah"
    }

    fn default_runs(&self) -> usize {
        3
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        let scale = Scale { quick: opts.quick };
        let runs = opts.runs.max(1);
        let java = Java::setup()?;
        report.configuration.insert("gc_threads".into(), serde_json::json!(advm::probe::facts().cpus));
        report.configuration.insert("break_even".into(), serde_json::json!(advm::remap::break_even().pages));
        report.configuration.insert(
            "large_object_bytes".into(),
            serde_json::json!(Heap::new(1 << 20).map_err(gc_err)?.large_object_bytes()),
        );
        let picked = picked_workloads()?;
        let bar = opts.progress_bar(picked.as_ref().map_or(ALL.len(), Vec::len) as u64, "gc workloads");
        for (name, w) in picked.clone().unwrap_or(ALL.to_vec()) {
            let min = min_heap(ADVM_FLOOR, |h| Ok(run_advm(w, scale, h, Engine::Remap, false)?.is_some()))?;
            report.configuration.insert(format!("min_heap_{name}"), serde_json::json!(min));
            for factor in FACTORS {
                let heap = ((min as f64 * factor) as usize).div_ceil(4096) * 4096;
                let (mut remap, mut copy) = (Vec::new(), Vec::new());
                for _ in 0..runs {
                    for (engine, into) in [(Engine::Remap, &mut remap), (Engine::Memmove, &mut copy)] {
                        let r = run_advm(w, scale, heap, engine, false)?
                            .ok_or_else(|| BenchError::Usage(format!("{name} ran out of a {heap}-byte heap")))?;
                        into.push(r);
                    }
                }
                if remap.iter().chain(&copy).any(|r| r.checksum != remap[0].checksum) {
                    return Err(BenchError::Usage(format!("{name}: runs computed different results")));
                }
                let ratio = max_pause_median(&copy) / max_pause_median(&remap);
                report.rows.push(row(name, factor, "advm-remap", heap, &remap));
                report.rows.push(row(name, factor, "advm-memmove", heap, &copy));
                report.rows.push(
                    Row::new()
                        .with("workload", name)
                        .with("heap_factor", factor)
                        .with("collector", "memmove/remap")
                        .figure(Figure::single("max_pause_ratio", "x", ratio))
                        .figure(Figure::new("total_pause_ratio", "x", paired(&remap, &copy, |r| vec![r.iter().sum()])))
                        .figure(Figure::new("collection_pause_ratio", "x", paired(&remap, &copy, |r| r.to_vec())))
                        .figure(Figure::new("page_move_batch_ratio", "x", page_move_batches(&remap, &copy))),
                );
            }
            // Generational (minor collections in between, as in HotSpot's ParallelGC,
            // inside which SVAGC ran), at 1.2x and 2x its own minimum heap.
            let gen_min = min_heap(ADVM_FLOOR, |h| Ok(run_advm(w, scale, h, Engine::Remap, true)?.is_some()))?;
            report.configuration.insert(format!("min_heap_gen_{name}"), serde_json::json!(gen_min));
            for factor in FACTORS {
                let heap = ((gen_min as f64 * factor) as usize).div_ceil(4096) * 4096;
                let mut rs = Vec::new();
                for _ in 0..runs {
                    rs.push(
                        run_advm(w, scale, heap, Engine::Remap, true)?
                            .ok_or_else(|| BenchError::Usage(format!("{name} ran out of a {heap}-byte heap (gen)")))?,
                    );
                }
                if rs.iter().any(|r| r.checksum != rs[0].checksum) {
                    return Err(BenchError::Usage(format!("{name}: generational runs computed different results")));
                }
                report.rows.push(row(name, factor, "advm-gen", heap, &rs));
            }
            if let Some(j) = &java {
                for gc in ["parallel", "shenandoah"] {
                    // The JVM's heap use varies from run to run (adaptive sizing,
                    // concurrent collection): a heap fits when two runs in a row fit.
                    let fits = |h| -> Result<bool, BenchError> {
                        Ok(j.run(gc, h, name, opts.quick)?.is_some() && j.run(gc, h, name, opts.quick)?.is_some())
                    };
                    let jmin = min_heap(JVM_FLOOR, fits)?;
                    for factor in FACTORS {
                        let heap = ((jmin as f64 * factor) as usize).div_ceil(4096) * 4096;
                        let mut rs = Vec::new();
                        for _ in 0..runs {
                            match j.run(gc, heap, name, opts.quick)? {
                                Some(r) => rs.push(r),
                                None => report.notes.push(format!(
                                    "java {name} ({gc}, {factor}x) ran out of {heap} bytes in one run: left out"
                                )),
                            }
                        }
                        if !rs.is_empty() {
                            report.rows.push(row(name, factor, gc, heap, &rs));
                        }
                    }
                }
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        if picked.is_none() {
            size_section(opts.quick, runs, report)?;
            policy_section(scale, runs, report)?;
        } else {
            report.notes.push("ADVM_BENCH_GC_WORKLOADS picked workloads: no object-size or policy rows".into());
        }
        if java.is_none() {
            report.notes.push(
                "javac not found: the Java collectors were skipped (make deps installs openjdk-17-jdk-headless)".into(),
            );
        }
        report.notes.push(
            "heaps: 1.2x and 2x each collector's own minimum heap (bisection to 1/16 of a doubling step; \
             at least 4 MiB for the JVM); \
             pauses are stop-the-world collections (advm-remap, advm-memmove: every collection is full; \
             advm-gen: full = major, SML/NJ's modified policy with mem_lim the heap, copy-back on)"
                .into(),
        );
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let scale = Scale { quick: true };
        let (name, w) = ALL[5]; // sigverify-10m
        let min = min_heap(ADVM_FLOOR, |h| Ok(run_advm(w, scale, h, Engine::Remap, false)?.is_some()))?;
        let heap = ((min as f64 * 1.2) as usize).div_ceil(4096) * 4096;
        let mut maxes = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, e) in [Engine::Remap, Engine::Memmove].into_iter().enumerate() {
                let r = run_advm(w, scale, heap, e, false)?
                    .ok_or_else(|| BenchError::Usage("demo heap too small".into()))?;
                maxes[i].push(r.pauses_ms.iter().copied().fold(0.0, f64::max));
            }
        }
        let (a, b) = (median(&maxes[0]), median(&maxes[1]));
        Ok(vec![DemoRow {
            capability: "gc".into(),
            workload: format!("{name} (quick), 1.2x min heap, full-GC max pause"),
            advm: format!("{a:.2} ms (remap)"),
            baseline: format!("{b:.2} ms (memmove)"),
            gain: format!("{:.1}x", b / a),
        }])
    }
}

/// `advm bench gc-policy`: the policy section of `advm bench gc` alone.
pub struct GcPolicyBench;

impl Bench for GcPolicyBench {
    fn name(&self) -> &'static str {
        "gc-policy"
    }

    fn description(&self) -> &'static str {
        "advm-gc generational mode: SML/NJ's original and modified heap-sizing policies, copy-back on and off (heap size over time, elapsed time, both memory meters)"
    }

    fn default_runs(&self) -> usize {
        3
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        policy_section(Scale { quick: opts.quick }, opts.runs.max(1), report)
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let scale = Scale { quick: true };
        let (name, w) = ALL[9]; // compiler-sawtooth
        let min = min_heap(ADVM_FLOOR, |h| Ok(run_advm(w, scale, h, Engine::Remap, false)?.is_some()))?;
        let [orig, _, _, modi] = policies(min);
        let mut part = Part::default();
        let mean_heap = |r: &PolicyRun| mean(&r.series.iter().map(|p| p.1).collect::<Vec<_>>());
        let a = run_policy(w, scale, 4 * min, modi.1, &mut part)?;
        let b = run_policy(w, scale, 4 * min, orig.1, &mut part)?;
        Ok(vec![DemoRow {
            capability: "gc-policy".into(),
            workload: format!("{name} (quick), generational heap, mean heap size"),
            advm: format!("{:.1} MiB, {:.2} s ({})", mean_heap(&a), a.total_s, modi.0),
            baseline: format!("{:.1} MiB, {:.2} s ({})", mean_heap(&b), b.total_s, orig.0),
            gain: format!("{:.2}x the mean heap", mean_heap(&a) / mean_heap(&b)),
        }])
    }
}

/// `advm bench gc-sizes`: the pause-vs-object-size section of `advm bench gc` alone.
pub struct GcSizesBench;

impl Bench for GcSizesBench {
    fn name(&self) -> &'static str {
        "gc-sizes"
    }

    fn description(&self) -> &'static str {
        "advm-gc full-GC pause against object size (16 KiB to 100 MiB), remap vs memmove, with the compaction break-even curve that decides between them"
    }

    fn default_runs(&self) -> usize {
        3
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        size_section(opts.quick, opts.runs.max(1), report)
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let size = 4 << 20;
        let mut med = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, e) in [Engine::Remap, Engine::Memmove].into_iter().enumerate() {
                med[i].extend(size_run(size, e)?.0);
            }
        }
        let (a, b) = (median(&med[0]), median(&med[1]));
        Ok(vec![DemoRow {
            capability: "gc-sizes".into(),
            workload: "window of two live 4 MiB objects, full-GC pause (median)".into(),
            advm: format!("{a:.2} ms (remap)"),
            baseline: format!("{b:.2} ms (memmove)"),
            gain: format!("{:.1}x", b / a),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratios_compare_runs_and_collections_side_by_side() {
        let run = |p: &[f64]| RunFigures { pauses_ms: p.to_vec(), ..Default::default() };
        let remap = [run(&[1.0, 2.0, 4.0]), run(&[2.0, 2.0, 2.0])];
        let copy = [run(&[3.0, 2.0, 4.0]), run(&[4.0, 8.0, 2.0])];
        assert_eq!(paired(&remap, &copy, |r| vec![r.iter().sum()]), vec![9.0 / 7.0, 14.0 / 6.0]);
        assert_eq!(paired(&remap, &copy, |r| r.to_vec()), vec![1.0, 2.0]);
        let moves = |m: &[(f64, u64)]| RunFigures { large_moves: m.to_vec(), ..Default::default() };
        let (a, b) = ([moves(&[(1.0, 0), (2.0, 4096), (1.0, 4096)])], [moves(&[(9.0, 0), (4.0, 0), (3.0, 0)])]);
        assert_eq!(page_move_batches(&a, &b), vec![2.5], "only collections with page moves, 2x and 3x");
    }

    #[test]
    fn a_window_of_large_objects_moves_them_by_pages_only_with_the_remap_engine() {
        let (pauses, _, remapped) = size_run(4 << 20, Engine::Remap).unwrap();
        assert_eq!(pauses.len(), SIZE_ROUNDS - 2);
        assert!(remapped > 0 || !advm::remap::uffd_move_available());
        assert_eq!(size_run(4 << 20, Engine::Memmove).unwrap().2, 0);
    }

    #[test]
    fn pauses_are_read_from_parallel_and_shenandoah_logs() {
        let log = "[0.101s][info][gc] GC(0) Pause Young (Allocation Failure) 24M->3M(98M) 2.345ms\n\
                   [0.2s][info][gc] GC(1) Pause Full (Ergonomics) 20M->10M(98M) 12.5ms\n\
                   [0.3s][info][gc] GC(2) Concurrent marking 20M->10M(98M) 30.0ms\n\
                   [0.3s][info][gc] GC(2) Pause Init Mark 0.120ms\n";
        assert_eq!(pauses(log, " Pause "), vec![2.345, 12.5, 0.12]);
        assert_eq!(pauses(log, " Pause Full"), vec![12.5]);
    }

    #[test]
    fn policy_workloads_compute_the_same_result_generational_or_not() {
        for (name, w) in ALL.iter().filter(|(n, _)| *n == "compiler-sawtooth" || *n == "growing-sort") {
            let full = run_advm(*w, Scale { quick: true }, 64 << 20, Engine::Remap, false).unwrap().unwrap();
            let mut minors = 0;
            for (label, g) in policies(1 << 20) {
                let r = run_policy(*w, Scale { quick: true }, 64 << 20, g, &mut Part::default()).unwrap();
                assert_eq!(r.checksum, full.checksum, "{name} {label}");
                assert!(!r.series.is_empty(), "{name} {label}: no collection");
                minors += r.minors;
            }
            // The quick sort's live data only grows (its arrays are large, old at
            // birth): its collections may all be major.
            assert!(minors > 0 || *name == "growing-sort", "{name}: no minor collection under any policy");
        }
    }

    #[test]
    fn generational_runs_count_major_collections_as_full_and_compute_the_same_result() {
        let (_, w) = ALL.iter().find(|(n, _)| *n == "gcbench").unwrap();
        let heap = 3 << 20;
        let full = run_advm(*w, Scale { quick: true }, heap, Engine::Remap, false).unwrap().unwrap();
        let gen = run_advm(*w, Scale { quick: true }, heap, Engine::Remap, true).unwrap().unwrap();
        assert_eq!(gen.checksum, full.checksum);
        assert_eq!(full.full_pauses_ms.len(), full.pauses_ms.len());
        // minor collections in between: fewer full pauses than pauses
        assert!(gen.full_pauses_ms.len() < gen.pauses_ms.len(), "{gen:?}");
    }

    #[test]
    fn every_workload_computes_the_same_result_under_both_engines() {
        for (name, w) in ALL.iter().filter(|(n, _)| !n.ends_with("100m")) {
            let a = run_advm(*w, Scale { quick: true }, 64 << 20, Engine::Remap, false).unwrap().unwrap();
            let b = run_advm(*w, Scale { quick: true }, 64 << 20, Engine::Memmove, false).unwrap().unwrap();
            assert_eq!(a.checksum, b.checksum, "{name}");
        }
    }
}
