//! `advm bench remap`: zero-copy move and swap of page ranges (SwapVA) against memmove.
//!
//! Sections, all in one run: a size sweep (1 page .. 1 GiB, memmove vs each engine,
//! cache-cold source as in GC compaction), the break-even (cold and hot source, one
//! and two threads), one thread vs two (TLB shootdowns), 2 MiB aligned vs unaligned,
//! single calls vs batches of 1/10/100/1000 ten-page objects (the paper's Fig. 6),
//! and overlapping slides. The report's notes check the three targets.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use advm::mem::{HostAddr, PageRange, Region};
use advm::remap::{self, Batch, Choice, Engine, Options, PMD_SIZE, PUD_SIZE};

use super::{fmt_bytes, median, Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::BenchError;

/// See the module doc.
pub struct RemapBench;

/// Batch-section mode: the aggregation bound (see [`RemapBench::batch_once`]).
const BOUND: &str = "bound: 1 call for all pages";
/// Suffix of the batch-section mode that lets advm choose the engine.
const AUTO: &str = ", auto engine";

/// Reading this much memory evicts a 32 MiB last-level cache.
const EVICT_BYTES: usize = 64 << 20;

fn ps() -> usize {
    advm::mem::page_size()
}

/// The pages `[start, start+len)`.
fn page_range(start: HostAddr, len: usize) -> Result<PageRange, BenchError> {
    Ok(PageRange::new("range", start.0, len)?)
}

/// Whether the source (and destination) are in the cache when the operation starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    Cold,
    Hot,
}

impl Cache {
    fn name(self) -> &'static str {
        match self {
            Cache::Cold => "cold",
            Cache::Hot => "hot",
        }
    }
}

/// What the destination of a move holds before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// Mapped, no pages.
    Empty,
    /// Mapped, every page written.
    Populated,
}

impl Dest {
    fn name(self) -> &'static str {
        match self {
            Dest::Empty => "empty",
            Dest::Populated => "populated",
        }
    }
}

/// How a range of 1 GiB or more is aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// 2 MiB aligned, not 1 GiB: the kernel moves PMD entries.
    Pmd,
    /// 1 GiB aligned: the kernel moves PUD entries.
    Pud,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Pmd => "2 MiB",
            Layout::Pud => "1 GiB",
        }
    }
}

/// Evicts the caches by reading a large buffer (reads allocate cache lines; a memset
/// could stream past the cache).
struct Evictor {
    buf: Region,
}

impl Evictor {
    fn new() -> Result<Self, BenchError> {
        let mut buf = Region::for_remap(EVICT_BYTES)?;
        buf.bytes_mut().fill(1);
        Ok(Self { buf })
    }
    fn evict(&self) {
        let b = self.buf.bytes();
        let mut s = 0u64;
        for i in (0..b.len()).step_by(64) {
            s = s.wrapping_add(b[i] as u64);
        }
        black_box(s);
    }
}

/// A second thread of the process, reading its own memory in a loop: while it runs on
/// the other CPU, every page-table change of the process needs a TLB shootdown there.
struct Toucher {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Toucher {
    fn start(threads: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = (threads > 1).then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let buf = vec![1u8; 256 << 10];
                let mut s = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in (0..buf.len()).step_by(64) {
                        s = s.wrapping_add(black_box(buf[i]) as u64);
                    }
                }
                black_box(s);
            })
        });
        Self { stop, handle }
    }
}

impl Drop for Toucher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn forced(engine: Option<Engine>) -> Options {
    match engine {
        Some(e) => Options { engine: Choice::Only(e), break_even_pages: Some(0), ..Options::default() },
        None => Options::default(),
    }
}

/// Times one move of `len` bytes from offset `src` to offset `dst` of `r`, after
/// filling the source with data and the destination with dead data. Returns
/// (microseconds, engine that did most of it).
fn time_move(
    r: &mut Region,
    ev: &Evictor,
    engine: Option<Engine>,
    dst: usize,
    src: usize,
    len: usize,
    cache: Cache,
) -> Result<(f64, Option<Engine>), BenchError> {
    r.bytes_mut()[src..src + len].fill(0xab);
    r.bytes_mut()[dst..dst + len].fill(0x01);
    match cache {
        Cache::Cold if len < EVICT_BYTES => ev.evict(),
        Cache::Cold => {}
        Cache::Hot => {
            let b = r.bytes();
            black_box(b[src..src + len].iter().step_by(64).fold(0u64, |a, &x| a.wrapping_add(x as u64)));
        }
    }
    let t = Instant::now();
    let out = r.move_pages_with(dst, src, len, &forced(engine))?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    let b = r.bytes();
    if b[dst] != 0xab || b[dst + len - 1] != 0xab {
        return Err(BenchError::Usage(format!("remap bench: a {len}-byte move left wrong bytes at the destination")));
    }
    Ok((us, out.engine()))
}

fn speed_figures(runs: Vec<f64>, pages: usize, baseline_us: Option<f64>) -> Vec<Figure> {
    let pps: Vec<f64> = runs.iter().map(|us| pages as f64 / (us / 1e6)).collect();
    let med = median(&runs);
    let mut v = vec![Figure::new("time per op", "us", runs), Figure::new("pages/s", "pages/s", pps)];
    if let Some(b) = baseline_us {
        v.push(Figure::single("vs memmove", "x", b / med));
    }
    v
}

impl RemapBench {
    fn size_sweep(&self, opts: &BenchOpts, report: &mut Report, ev: &Evictor) -> Result<Option<f64>, BenchError> {
        let ps = ps();
        let sizes: &[usize] = if opts.quick {
            &[1, 4, 16, 64, 512, 4096]
        } else {
            &[1, 2, 4, 8, 16, 32, 64, 256, 512, 8192, 65536, 262144]
        };
        let uffd = remap::uffd_move_available();
        // (label, engine, destination vacated by an earlier move)
        let mut engines = vec![("memmove", Some(Engine::Memmove), false)];
        if uffd {
            engines.push(("uffd-move", Some(Engine::UffdMove), false));
            engines.push(("uffd-move, vacated dst", Some(Engine::UffdMove), true));
        }
        engines.push(("mremap", Some(Engine::Mremap), false));
        engines.push(("auto", None, false));
        let bar = opts.progress_bar(sizes.len() as u64, "remap: sizes");
        let mut gib_gain = None;
        for &pages in sizes {
            bar.inc(1);
            let len = pages * ps;
            let span = len.div_ceil(PMD_SIZE) * PMD_SIZE;
            let runs = if len >= 64 << 20 { opts.runs.min(3) } else { opts.runs };
            // Small sizes: one pool with a fresh (source, destination) pair of 2 MiB
            // aligned slots per operation, filled once and then evicted, so the data is
            // cold while the kernel's code stays warm, as in a compaction loop. Large
            // sizes (2 MiB and up): one pair, refilled and evicted before each run.
            let pooled = len < PMD_SIZE;
            let pairs = if pooled { runs * engines.len() } else { 1 };
            let mut r = Region::for_remap(2 * span * pairs)?;
            if pooled {
                r.bytes_mut().fill(0x01);
                ev.evict();
            }
            let mut pair = 0;
            let mut base_us = None;
            let mut best_page_us = f64::INFINITY;
            for &(label, engine, vacated) in &engines {
                let mut times = Vec::new();
                let mut used = None;
                for _ in 0..runs {
                    let (dst, src) = (2 * span * pair, 2 * span * pair + span);
                    if pooled {
                        pair += 1;
                    } else {
                        r.bytes_mut()[src..src + len].fill(0xab);
                        r.bytes_mut()[dst..dst + len].fill(0x01);
                        ev.evict();
                    }
                    if vacated {
                        let a = r.addr() + dst;
                        r.grant().discard(&[page_range(a, len)?])?;
                    }
                    let t = Instant::now();
                    let out = r.move_pages_with(dst, src, len, &forced(engine))?;
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                    used = out.engine();
                }
                let med = median(&times);
                let name = match engine {
                    Some(_) => label.to_string(),
                    None => format!("auto ({})", used.map_or("-", |e| e.name())),
                };
                if engine.is_some_and(|e| e != Engine::Memmove) {
                    best_page_us = best_page_us.min(med);
                }
                let mut row =
                    Row::new().with("section", "size").with("size", fmt_bytes(len as u64)).with("engine", name);
                for f in speed_figures(times, pages, base_us) {
                    row = row.figure(f);
                }
                report.rows.push(row);
                if engine == Some(Engine::Memmove) {
                    base_us = Some(med);
                }
            }
            if pages == 262144 {
                gib_gain = base_us.map(|b| b / best_page_us);
            }
        }
        bar.finish_and_clear();
        Ok(gib_gain)
    }

    fn break_evens(&self, opts: &BenchOpts, report: &mut Report) -> Result<Option<usize>, BenchError> {
        if !remap::uffd_move_available() {
            report.notes.push("UFFDIO_MOVE unavailable: no break-even to measure".into());
            return Ok(None);
        }
        let reps = if opts.quick { 3 } else { 7 };
        let mut cold_1 = None;
        let mut curves = serde_json::Map::new();
        for threads in [1, 2] {
            for cache in [Cache::Cold, Cache::Hot] {
                let _t = Toucher::start(threads);
                let be = remap::measure_break_even(cache == Cache::Cold, reps)?;
                if threads == 1 && cache == Cache::Cold {
                    cold_1 = Some(be.pages);
                }
                curves.insert(
                    format!("{}-{}t", cache.name(), threads),
                    serde_json::to_value(&be.curve).unwrap_or_default(),
                );
                report.rows.push(
                    Row::new()
                        .with("section", "break-even")
                        .with("cache", cache.name())
                        .with("threads", threads)
                        .figure(Figure::single("break-even", "pages", be.pages as f64)),
                );
            }
        }
        report.configuration.insert("break_even_curves".into(), serde_json::Value::Object(curves));
        let b = remap::break_even();
        report.notes.push(format!(
            "break-even in use by this process: {} pages ({:?}; cache file {})",
            b.pages,
            b.source,
            remap::cache_path().map_or("-".into(), |p| p.display().to_string())
        ));
        Ok(cold_1)
    }

    fn threads(&self, opts: &BenchOpts, report: &mut Report, ev: &Evictor) -> Result<(), BenchError> {
        let ps = ps();
        let sizes: &[usize] = if opts.quick { &[16, 512] } else { &[16, 512, 8192] };
        for &pages in sizes {
            let len = pages * ps;
            let span = len.div_ceil(PMD_SIZE) * PMD_SIZE;
            let mut r = Region::for_remap(2 * span)?;
            for engine in [Engine::Memmove, Engine::UffdMove, Engine::Mremap] {
                if engine == Engine::UffdMove && !remap::uffd_move_available() {
                    continue;
                }
                for threads in [1, 2] {
                    let _t = Toucher::start(threads);
                    let mut times = Vec::new();
                    for _ in 0..opts.runs {
                        times.push(time_move(&mut r, ev, Some(engine), 0, span, len, Cache::Cold)?.0);
                    }
                    let mut row = Row::new()
                        .with("section", "threads")
                        .with("size", fmt_bytes(len as u64))
                        .with("engine", engine.name())
                        .with("threads", threads);
                    for f in speed_figures(times, pages, None) {
                        row = row.figure(f);
                    }
                    report.rows.push(row);
                }
            }
        }
        Ok(())
    }

    fn alignment(&self, opts: &BenchOpts, report: &mut Report, ev: &Evictor) -> Result<(), BenchError> {
        let ps = ps();
        let sizes: &[usize] =
            if opts.quick { &[PMD_SIZE, 4 * PMD_SIZE] } else { &[PMD_SIZE, 16 * PMD_SIZE, 64 * PMD_SIZE] };
        for &len in sizes {
            let mut r = Region::for_remap(2 * len + 2 * PMD_SIZE)?;
            for (label, dst) in [("2 MiB aligned", 0), ("unaligned (+1 page)", ps)] {
                for engine in [Some(Engine::Memmove), None] {
                    let mut times = Vec::new();
                    let mut used = None;
                    for _ in 0..opts.runs {
                        let (us, e) = time_move(&mut r, ev, engine, dst, len + PMD_SIZE, len, Cache::Cold)?;
                        times.push(us);
                        used = e;
                    }
                    let name = match engine {
                        Some(e) => e.name().to_string(),
                        None => format!("auto ({})", used.map_or("-", |e| e.name())),
                    };
                    let mut row = Row::new()
                        .with("section", "alignment")
                        .with("size", fmt_bytes(len as u64))
                        .with("layout", label)
                        .with("engine", name);
                    for f in speed_figures(times, len / ps, None) {
                        row = row.figure(f);
                    }
                    report.rows.push(row);
                }
            }
        }
        Ok(())
    }

    /// One advm move against the kernel's bare move of the same range: 2 MiB aligned,
    /// populated source, into a mapped destination that is either empty or populated.
    /// Each round runs every variant once, interleaved, so that load on a shared
    /// machine hits them alike; the ratio is the median over rounds of advm's time over
    /// the raw mremap's in the same round. Variants: advm through a region's grant
    /// (memory advm mapped: no checks with the kernel), advm through a raw-address
    /// grant (as the C API's `advm_move`: the ranges are checked with PROCMAP_QUERY),
    /// the raw mremap, and the raw mremap plus fresh memory mapped over the vacated
    /// source (the other way to keep the source mapped). Returns (size, alignment,
    /// destination, ratio of the slower advm move) rows.
    fn versus_raw(&self, opts: &BenchOpts, report: &mut Report) -> Result<Vec<(usize, Layout, Dest, f64)>, BenchError> {
        let sizes: &[usize] = if opts.quick { &[16 << 20] } else { &[16 << 20, 256 << 20, 1 << 30] };
        let runs = if opts.quick { 3 } else { 9 };
        let mut ratios = Vec::new();
        // A 1 GiB range also runs 1 GiB aligned, where the kernel moves whole PUD entries
        // and the raw mremap takes ~40 us instead of ~250: advm's constant work (range
        // checks, the residency sample) then weighs more.
        let layouts = |len: usize| if len >= PUD_SIZE { &[Layout::Pmd, Layout::Pud][..] } else { &[Layout::Pmd][..] };
        for &len in sizes {
            for &layout in layouts(len) {
                for dest in [Dest::Empty, Dest::Populated] {
                    // 2 MiB aligned only: start one PMD into a 1 GiB aligned region.
                    let skew = if layout == Layout::Pmd && len >= PUD_SIZE { PMD_SIZE } else { 0 };
                    let mut r = Region::for_remap(2 * len + skew)?;
                    let (dst, src) = (r.addr() + skew, r.addr() + skew + len);
                    let mut us = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
                    let (mut ratio_region, mut ratio_raw) = (Vec::new(), Vec::new());
                    for _ in 0..runs {
                        for (v, times) in us.iter_mut().enumerate() {
                            r.bytes_mut()[skew + len..].fill(0xab);
                            match dest {
                                Dest::Empty => {
                                    r.grant().discard(&[page_range(dst, len)?])?;
                                }
                                Dest::Populated => r.bytes_mut()[skew..skew + len].fill(1),
                            }
                            let t = Instant::now();
                            match v {
                                0 | 1 => {
                                    let out = if v == 0 {
                                        remap::move_pages(&mut r.grant(), dst, src, len)?
                                    } else {
                                        remap::move_pages(&mut r.grant_as_raw(), dst, src, len)?
                                    };
                                    times.push(t.elapsed().as_secs_f64() * 1e6);
                                    if out.engine() != Some(Engine::Mremap) {
                                        return Err(BenchError::Usage(format!(
                                            "remap bench: the move used {:?}",
                                            out.engine()
                                        )));
                                    }
                                }
                                2 => {
                                    r.grant().mremap_unmapping_source(dst, src, len)?;
                                    times.push(t.elapsed().as_secs_f64() * 1e6);
                                    r.grant().map_fresh(page_range(src, len)?)?;
                                }
                                _ => {
                                    let mut g = r.grant();
                                    g.mremap_unmapping_source(dst, src, len)?;
                                    g.map_fresh(page_range(src, len)?)?;
                                    times.push(t.elapsed().as_secs_f64() * 1e6);
                                }
                            }
                            if r.bytes()[skew] != 0xab || r.bytes()[skew + len - 1] != 0xab {
                                return Err(BenchError::Usage(
                                    "remap bench: a move left wrong bytes at the destination".into(),
                                ));
                            }
                        }
                        let raw = us[2].last().copied().unwrap_or(f64::NAN);
                        ratio_region.push(us[0].last().copied().unwrap_or(f64::NAN) / raw);
                        ratio_raw.push(us[1].last().copied().unwrap_or(f64::NAN) / raw);
                    }
                    let [region_us, raw_addr_us, raw_us, raw_map_us] = us;
                    let (rr, ra) = (median(&ratio_region), median(&ratio_raw));
                    let map_ratio = median(&raw_map_us) / median(&raw_us);
                    report.rows.push(
                        Row::new()
                            .with("section", "vs raw mremap")
                            .with("size", fmt_bytes(len as u64))
                            .with("alignment", layout.name())
                            .with("destination", dest.name())
                            .figure(Figure::new("advm move (region)", "us", region_us))
                            .figure(Figure::new("advm move (raw addresses)", "us", raw_addr_us))
                            .figure(Figure::new("raw mremap", "us", raw_us))
                            .figure(Figure::new("raw mremap + mmap", "us", raw_map_us))
                            .figure(Figure::single("region / raw mremap", "x", rr))
                            .figure(Figure::single("raw addresses / raw mremap", "x", ra))
                            .figure(Figure::single("(mremap + mmap) / raw mremap", "x", map_ratio)),
                    );
                    ratios.push((len, layout, dest, ra.max(rr)));
                }
            }
        }
        Ok(ratios)
    }

    /// Moves `n` ten-page objects: "scatter" into a separate, populated area (every
    /// destination must be emptied), or "compaction" sliding them down over 2-page gaps
    /// into the space the previous objects left. Returns per-object microseconds and
    /// the engine that did most of the last call.
    ///
    /// Mode `BOUND` does not move the objects: it empties the destinations a batch must
    /// empty (one vectored zap) and then moves the same number of pages (10n) as ONE
    /// contiguous UFFDIO_MOVE in `bound` (a second region, from a populated half into
    /// an empty half). That is what a batch would cost if the kernel took many ranges
    /// per call, which it does not: a lower bound for aggregation, not a result.
    fn batch_once(
        r: &mut Region,
        bound: &mut Region,
        ev: &Evictor,
        n: usize,
        pattern: &str,
        mode: &str,
        per_batch: usize,
    ) -> Result<(f64, Option<Engine>), BenchError> {
        let ps = ps();
        let obj = 10 * ps;
        let base = r.addr();
        let scatter = pattern == "scatter";
        let src_of = |i: usize| if scatter { i * 12 * ps } else { (2 + i * 12) * ps };
        let dst_of = |i: usize| if scatter { (n * 12 + i * 11) * ps } else { i * 10 * ps };
        r.bytes_mut().fill(0x01);
        for i in 0..n {
            r.bytes_mut()[src_of(i)..src_of(i) + obj].fill((i % 250) as u8 + 2);
        }
        let all = n * obj;
        if mode == BOUND {
            bound.bytes_mut()[..all].fill(0xcd);
            let b = bound.addr();
            bound.grant().discard(&[page_range(b + all, all)?])?;
        }
        ev.evict();
        let opts = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), coalesce: true };
        let mut used = Some(Engine::UffdMove);
        let t = Instant::now();
        match mode {
            "memmove" => {
                for i in 0..n {
                    r.bytes_mut().copy_within(src_of(i)..src_of(i) + obj, dst_of(i));
                }
                used = Some(Engine::Memmove);
            }
            BOUND => {
                // The populated pages the batch must empty: the whole destination area
                // (scatter), the 2-page gaps under the destinations (compaction).
                let zap: Vec<PageRange> = if scatter {
                    (0..n).map(|i| page_range(base + dst_of(i), obj)).collect::<Result<_, _>>()?
                } else {
                    (0..)
                        .map(|j| 12 * j * ps)
                        .take_while(|&g| g < all)
                        .map(|g| page_range(base + g, 2 * ps))
                        .collect::<Result<_, _>>()?
                };
                r.grant().discard(&zap)?;
                bound.move_pages_with(all, 0, all, &opts)?;
            }
            "one call each" => {
                for i in 0..n {
                    remap::move_pages_with(&mut r.grant(), base + dst_of(i), base + src_of(i), obj, &opts)?;
                }
            }
            "one call each, raw" => {
                for i in 0..n {
                    remap::move_pages_with(&mut r.grant_as_raw(), base + dst_of(i), base + src_of(i), obj, &opts)?;
                }
            }
            _ => {
                let auto = mode.ends_with(AUTO);
                let mut b = Batch::with_options(if auto { Options::default() } else { opts });
                for chunk in (0..n).collect::<Vec<_>>().chunks(per_batch) {
                    b.clear();
                    for &i in chunk {
                        b.push_move(base + dst_of(i), base + src_of(i), obj);
                    }
                    used = b.execute(&mut r.grant())?.engine();
                }
            }
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        if mode == BOUND {
            let b = bound.bytes();
            if b[all] != 0xcd || b[2 * all - 1] != 0xcd {
                return Err(BenchError::Usage("remap bench: the bound's contiguous move left wrong bytes".into()));
            }
            return Ok((us, used));
        }
        for i in [0, n / 2, n - 1] {
            if r.bytes()[dst_of(i)] != (i % 250) as u8 + 2 {
                return Err(BenchError::Usage(format!("remap bench: object {i} did not arrive ({pattern}, {mode})")));
            }
        }
        Ok((us, used))
    }

    fn batches(
        &self,
        opts: &BenchOpts,
        report: &mut Report,
        ev: &Evictor,
    ) -> Result<Vec<(String, f64, Option<f64>)>, BenchError> {
        if !remap::uffd_move_available() {
            report.notes.push("UFFDIO_MOVE unavailable: batch section skipped".into());
            return Ok(Vec::new());
        }
        let ps = ps();
        let n = if opts.quick { 200 } else { 1000 };
        let mut gains = Vec::new();
        let mut bound = Region::for_remap(2 * n * 10 * ps)?;
        for pattern in ["scatter", "compaction"] {
            let mut r = Region::for_remap((n * 23 + 16) * ps)?;
            let mut single = None;
            let mut modes: Vec<(String, usize)> =
                vec![("memmove".into(), 0), ("one call each".into(), 0), ("one call each, raw".into(), 0)];
            for b in [1, 10, 100, 1000] {
                if b <= n {
                    modes.push((format!("batch of {b}"), b));
                }
            }
            modes.push((format!("batch of 100{AUTO}"), 100));
            modes.push((BOUND.into(), 0));
            let mut batch100 = None;
            let mut bound_gain = None;
            for (mode, per) in &modes {
                let mut times = Vec::new();
                let mut used = None;
                for _ in 0..opts.runs {
                    let (us, e) = Self::batch_once(&mut r, &mut bound, ev, n, pattern, mode, *per)?;
                    times.push(us);
                    used = e;
                }
                let med = median(&times);
                if mode == "one call each" {
                    single = Some(med);
                }
                let engine = if mode.ends_with(AUTO) {
                    format!("auto ({})", used.map_or("-", |e| e.name()))
                } else {
                    used.map_or("-", |e| e.name()).to_string()
                };
                let mut row = Row::new()
                    .with("section", "batch")
                    .with("size", "10 pages")
                    .with("layout", pattern)
                    .with("engine", engine)
                    .with("calls", mode)
                    .figure(Figure::new("time per op", "us", times.clone()))
                    .figure(Figure::new("pages/s", "pages/s", times.iter().map(|us| 10.0 / (us / 1e6)).collect()));
                if let Some(s) = single {
                    row = row.figure(Figure::single("vs one call each", "x", s / med));
                    if mode == "batch of 100" {
                        batch100 = Some(s / med);
                    }
                    if mode == BOUND {
                        bound_gain = Some(s / med);
                    }
                }
                report.rows.push(row);
            }
            if let Some(g) = batch100 {
                gains.push((pattern.to_string(), g, bound_gain));
            }
        }
        Ok(gains)
    }

    fn slides(&self, opts: &BenchOpts, report: &mut Report, ev: &Evictor) -> Result<(), BenchError> {
        let ps = ps();
        let blocks: &[usize] = if opts.quick { &[64, 1024] } else { &[64, 4096, 65536] };
        for &pages in blocks {
            let mut r = Region::for_remap((pages + 512) * ps)?;
            for delta in [1usize, 16, 256] {
                if delta >= pages {
                    continue;
                }
                for (dir, dst, src) in [("down", 0, delta), ("up", delta, 0)] {
                    for engine in [Engine::Memmove, Engine::UffdMove] {
                        if engine == Engine::UffdMove && !remap::uffd_move_available() {
                            continue;
                        }
                        let mut times = Vec::new();
                        for _ in 0..opts.runs {
                            let len = pages * ps;
                            r.bytes_mut()[..(pages + delta) * ps].fill(0x01);
                            r.bytes_mut()[src * ps..src * ps + len].fill(0xab);
                            ev.evict();
                            let t = Instant::now();
                            r.move_pages_with(dst * ps, src * ps, len, &forced(Some(engine)))?;
                            times.push(t.elapsed().as_secs_f64() * 1e6);
                            if r.bytes()[dst * ps] != 0xab || r.bytes()[dst * ps + len - 1] != 0xab {
                                return Err(BenchError::Usage("remap bench: a slide left wrong bytes".into()));
                            }
                        }
                        let mut row = Row::new()
                            .with("section", "slide")
                            .with("size", fmt_bytes((pages * ps) as u64))
                            .with("layout", format!("{dir} by {delta} pages"))
                            .with("engine", engine.name());
                        for f in speed_figures(times, pages, None) {
                            row = row.figure(f);
                        }
                        report.rows.push(row);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Bench for RemapBench {
    fn name(&self) -> &'static str {
        "remap"
    }

    fn description(&self) -> &'static str {
        "move pages by page table (UFFDIO_MOVE, mremap) vs memmove: sizes 1 page..1 GiB, break-even, threads, alignment, batches, slides"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        let ev = Evictor::new()?;
        report.configuration.insert("uffd_move".into(), serde_json::json!(remap::uffd_move_available()));
        report.configuration.insert("evict_bytes".into(), serde_json::json!(EVICT_BYTES));
        let be = self.break_evens(opts, report)?;
        let gib = self.size_sweep(opts, report, &ev)?;
        self.threads(opts, report, &ev)?;
        self.alignment(opts, report, &ev)?;
        let gains = self.batches(opts, report, &ev)?;
        self.slides(opts, report, &ev)?;
        let raw = self.versus_raw(opts, report)?;
        let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
        let mut targets = serde_json::Map::new();
        if let Some(p) = be {
            report.notes.push(format!("target: cold single-thread break-even < 10 pages: {p} pages, {}", met(p < 10)));
            targets.insert("break_even_cold_1t_pages".into(), serde_json::json!(p));
        }
        match gib {
            Some(g) => {
                report
                    .notes
                    .push(format!("target: 1 GiB move >= 1000x faster than memmove: {g:.0}x, {}", met(g >= 1000.0)));
                targets.insert("gib_move_vs_memmove_x".into(), serde_json::json!(g));
            }
            None => report.notes.push("target: 1 GiB move not measured in --quick".into()),
        }
        for (pattern, g, bound) in &gains {
            report.notes.push(format!(
                "target: batches of 100 ten-page objects >= 3x faster than one call each ({pattern}): {g:.2}x, {}",
                met(*g >= 3.0)
            ));
            targets.insert(format!("batch100_vs_single_{pattern}_x"), serde_json::json!(g));
            if let Some(b) = bound {
                report.notes.push(format!(
                    "bound ({pattern}): if UFFDIO_MOVE took all objects in one call (same zap, one contiguous \
                     move of the same pages) a batch would be at most {b:.2}x faster than one call each"
                ));
                targets.insert(format!("bound_vectored_vs_single_{pattern}_x"), serde_json::json!(b));
            }
        }
        for (len, layout, dest, ratio) in raw {
            let size = fmt_bytes(len as u64);
            report.notes.push(format!(
                "target: a {size} move ({} aligned) into a destination that is {} costs at most 1.25x one raw \
                 mremap: {ratio:.2}x (the slower of region and raw addresses; median of interleaved runs), {}",
                layout.name(),
                dest.name(),
                met(ratio <= 1.25)
            ));
            let key = format!("move_vs_raw_mremap_{size}_{}_{}_x", layout.name(), dest.name());
            targets.insert(key.replace(' ', ""), serde_json::json!(ratio));
        }
        report.configuration.insert("targets".into(), serde_json::Value::Object(targets));
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let ev = Evictor::new()?;
        let len = 256 << 20;
        let mut r = Region::for_remap(2 * len)?;
        let mut page = Vec::new();
        let mut copy = Vec::new();
        let mut used = None;
        for _ in 0..3 {
            let (us, e) = time_move(&mut r, &ev, None, 0, len, len, Cache::Cold)?;
            page.push(us);
            used = e;
            copy.push(time_move(&mut r, &ev, Some(Engine::Memmove), 0, len, len, Cache::Cold)?.0);
        }
        let (p, c) = (median(&page), median(&copy));
        Ok(vec![DemoRow {
            capability: "remap".into(),
            workload: "move 256 MiB (2 MiB aligned) within a heap".into(),
            advm: format!("{:.0} us ({})", p, used.map_or("-", |e| e.name())),
            baseline: format!("memmove {:.1} ms", c / 1e3),
            gain: format!("{:.0}x faster", c / p),
        }])
    }
}
