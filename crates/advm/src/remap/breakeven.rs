//! The break-even: the size (in pages) from which moving page-table entries beats
//! copying bytes. Measured on this machine at first use with a cache-cold source (as
//! in GC compaction), cached on disk, and overridable.
//!
//! Order of precedence: [`set_break_even_pages`] (API), the `ADVM_REMAP_BREAK_EVEN_PAGES`
//! environment variable, the cache file (`$XDG_CACHE_HOME/advm/remap-break-even.json`
//! or `~/.cache/advm/...`, `-debug` for debug builds, valid for the same kernel, CPU, page
//! size and profile, and only if plausible: see [`PLAUSIBLE_MEMMOVE_US_PER_PAGE`]), a fresh
//! measurement (about a tenth of a second), and a fixed default when UFFDIO_MOVE is
//! not available (then only 2 MiB-aligned moves use pages, through mremap).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{move_pages_with, uffd_move_available, Choice, Engine, Options, PMD_SIZE};
use crate::mem::{page_size, HostAddr};
use crate::sys::lazy::Lazy;
use crate::sys::mman::grant::RwMapping;
use crate::Result;

/// Environment variable that overrides the measured break-even (in pages).
pub const ENV_BREAK_EVEN: &str = "ADVM_REMAP_BREAK_EVEN_PAGES";

/// Page counts the measurement tries.
const GRID: [usize; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];

/// Object sizes (pages) the compaction measurement tries: a batch of lone moves costs a
/// call each, so its crossing lies far above a single move's.
const COMPACTION_GRID: [usize; 7] = [8, 16, 32, 64, 128, 256, 511];
/// Objects per size in one timed compaction.
const COMPACTION_OBJECTS: usize = 8;

/// Where the break-even came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakEvenSource {
    /// [`set_break_even_pages`].
    Api,
    /// The environment variable.
    Env,
    /// The cache file.
    Cache,
    /// Measured by this process (and written to the cache).
    Measured,
    /// No page engine for small moves here: a fixed value.
    Default,
}

/// One size of the measured curve (medians, microseconds per operation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Pages per operation.
    pub pages: usize,
    /// memmove into a destination that holds (dead) data.
    pub memmove_us: f64,
    /// UFFDIO_MOVE into an empty destination (vacated by an earlier move, as in
    /// compaction).
    pub uffd_move_us: f64,
    /// `move_pages` forced to UFFDIO_MOVE into a destination that holds data: the
    /// attempt finds it populated, empties it (`MADV_DONTNEED` frees its pages), moves.
    pub uffd_move_populated_us: f64,
}

/// One object size of the compaction measurement (medians, microseconds per object).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CompactionPoint {
    /// Pages per object.
    pub pages: usize,
    /// memmove of each object in turn.
    pub memmove_us: f64,
    /// One [`super::Batch`]: one UFFDIO_MOVE per object.
    pub batch_us: f64,
}

/// The break-even and how it was obtained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakEven {
    /// Moves of fewer pages are copied without trying the kernel (break-even against an
    /// empty destination).
    pub pages: usize,
    /// When the destination turns out to hold pages, moves of fewer pages are copied
    /// instead of freeing them (break-even against a populated destination).
    pub pages_populated: usize,
    /// Compaction (a garbage collector sliding objects down): in one batch, objects of
    /// at least this many pages, each moving into space the move before it vacated, are
    /// moved faster as pages than by memmove. Higher than `pages`: memmove streams
    /// through consecutive objects, and each page move still costs a call.
    pub pages_compaction: usize,
    /// Where the value came from.
    pub source: BreakEvenSource,
    /// The measured curve (empty unless measured or cached).
    pub curve: Vec<CurvePoint>,
    /// The measured compaction curve (empty unless measured or cached).
    pub compaction: Vec<CompactionPoint>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CacheFile {
    key: String,
    measured: BreakEven,
}

static API_OVERRIDE: AtomicUsize = AtomicUsize::new(0);

/// Overrides the break-even for this process (`None` restores the measured value).
pub fn set_break_even_pages(pages: Option<usize>) {
    API_OVERRIDE.store(pages.map_or(0, |p| p.saturating_add(1)), Ordering::Relaxed);
}

/// The break-even this process uses.
pub fn break_even() -> BreakEven {
    let api = API_OVERRIDE.load(Ordering::Relaxed);
    if api > 0 {
        return BreakEven::fixed(api - 1, BreakEvenSource::Api);
    }
    if let Some(p) = env_pages() {
        return BreakEven::fixed(p, BreakEvenSource::Env);
    }
    measured().clone()
}

impl BreakEven {
    /// One value for every kind of move.
    fn fixed(pages: usize, source: BreakEvenSource) -> Self {
        BreakEven {
            pages,
            pages_populated: pages,
            pages_compaction: pages,
            source,
            curve: Vec::new(),
            compaction: Vec::new(),
        }
    }
}

/// `(pages, pages_populated)` of [`break_even`], without copying its curve: what every
/// operation asks, so it costs an atomic load and no allocation.
pub(super) fn break_even_pages() -> (usize, usize) {
    let api = API_OVERRIDE.load(Ordering::Relaxed);
    if api > 0 {
        return (api - 1, api - 1);
    }
    if let Some(p) = env_pages() {
        return (p, p);
    }
    let m = measured();
    (m.pages, m.pages_populated)
}

/// [`ENV_BREAK_EVEN`], read once: the environment is the process's start-up setting,
/// and reading it takes the environment lock on every call.
fn env_pages() -> Option<usize> {
    // Reading it twice is harmless.
    static ENV: Lazy<Option<usize>> = Lazy::new();
    *ENV.get_or_init(|| std::env::var(ENV_BREAK_EVEN).ok().and_then(|v| v.trim().parse().ok()))
}

fn measured() -> &'static BreakEven {
    // Threads that race on the first use may each measure (a cache hit is a read); each
    // writes the cache file whole under its own temporary name, then renames it, so the
    // file holds one whole measurement, and all use the first published.
    static MEASURED: Lazy<BreakEven> = Lazy::new();
    // While the userfaultfd could not be opened for want of fds, moves use memmove and
    // mremap only (as without UFFDIO_MOVE), and nothing is kept: measured on a later call.
    static UNSETTLED: Lazy<BreakEven> = Lazy::new();
    if let Some(m) = MEASURED.get() {
        return m;
    }
    if !super::engine::kernel_settled() {
        return UNSETTLED.get_or_init(|| BreakEven::fixed(PMD_SIZE / page_size(), BreakEvenSource::Default));
    }
    MEASURED.get_or_init(load_or_measure)
}

fn machine_key() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    // `layout` names the cache file's format: files of an older one are measured anew.
    // The profile matters: a debug build's batches cost more per operation.
    format!(
        "layout=2 kernel={} cpu={} page={} cpus={} profile={}",
        crate::sys::kernel_release(),
        cpu,
        page_size(),
        crate::probe::facts().cpus,
        if cfg!(debug_assertions) { "debug" } else { "release" }
    )
}

/// The cache file's path.
pub fn cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    // one file per build profile: debug and release runs do not overwrite each other
    let name = if cfg!(debug_assertions) { "remap-break-even-debug.json" } else { "remap-break-even.json" };
    Some(base.join("advm").join(name))
}

fn load_or_measure() -> BreakEven {
    if !uffd_move_available() {
        return BreakEven::fixed(PMD_SIZE / page_size(), BreakEvenSource::Default);
    }
    let key = machine_key();
    if let Some(path) = cache_path() {
        if let Some(c) = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<CacheFile>(&b).ok()) {
            if c.key == key && plausible(&c.measured) {
                return BreakEven { source: BreakEvenSource::Cache, ..c.measured };
            }
        }
    }
    match measure_break_even(true, 5) {
        Ok(m) if !plausible(&m) => BreakEven { source: BreakEvenSource::Default, ..default_break_even() },
        Ok(m) => {
            if let Some(path) = cache_path() {
                let file = CacheFile { key, measured: m.clone() };
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                // Write then rename, so a concurrent reader never sees half a file.
                static WRITES: AtomicU64 = AtomicU64::new(0);
                let n = WRITES.fetch_add(1, Ordering::Relaxed);
                let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
                if std::fs::write(&tmp, serde_json::to_vec_pretty(&file).unwrap_or_default()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
            }
            m
        }
        Err(_) => default_break_even(),
    }
}

/// What a machine that cannot be measured gets.
fn default_break_even() -> BreakEven {
    BreakEven {
        pages: 16,
        pages_populated: 64,
        pages_compaction: 128,
        source: BreakEvenSource::Default,
        curve: Vec::new(),
        compaction: Vec::new(),
    }
}

/// Most microseconds a page the memmove of the measurement's largest size may take:
/// slower than 1 GB/s, the pool was faulting or swapping (a measurement made inside a
/// memory-limited cgroup once cost 87 us a page and made 32 KiB objects "large"), so
/// the measurement says nothing about this machine and is neither used nor cached.
const PLAUSIBLE_MEMMOVE_US_PER_PAGE: f64 = 4.0;

fn plausible(m: &BreakEven) -> bool {
    m.curve.last().is_some_and(|c| c.memmove_us / c.pages as f64 <= PLAUSIBLE_MEMMOVE_US_PER_PAGE)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Measures memmove against UFFDIO_MOVE for 1..64 pages, `reps` times each, into an
/// empty destination and into a populated one, and returns for each the smallest size
/// from which the page move is at least as fast for it and the next size. `cold`:
/// every operation uses memory last touched tens of MiB ago (more than the last-level
/// cache; the kernel's own code and data stay warm, as in a compaction loop);
/// otherwise source and destination are touched right before.
pub fn measure_break_even(cold: bool, reps: usize) -> Result<BreakEven> {
    let ps = page_size();
    let reps = reps.max(1);
    let per_size: usize = GRID.iter().sum::<usize>() * ps * 2 * 3;
    // Used slots, plus 64 MiB written after them so they have left a 32 MiB L3.
    let pool_len = per_size * reps + (64 << 20);
    let mut pool = RwMapping::new(pool_len, PMD_SIZE, false)?;
    pool.bytes_mut().fill(0x5a);
    let base = pool.addr();
    let mut g = crate::mem::Grant::wrap(pool.grant());
    let uffd_opts = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), coalesce: false };
    let mut cursor = base;
    let mut curve = Vec::with_capacity(GRID.len());
    for &k in &GRID {
        let len = k * ps;
        let mut t: [Vec<f64>; 3] = Default::default();
        for _ in 0..reps {
            for (which, ts) in t.iter_mut().enumerate() {
                let (src, dst) = (cursor, cursor + len);
                cursor += 2 * len;
                if which == 1 {
                    g.inner.zap(&[(dst, len)])?; // vacated by an earlier move
                }
                if !cold {
                    g.inner.touch(src, len, 64)?;
                    if which != 1 {
                        g.inner.fill(dst, len, 1)?;
                    }
                }
                let start = Instant::now();
                if which == 0 {
                    g.inner.memmove(dst, src, len)?;
                } else {
                    move_pages_with(&mut g, HostAddr(dst), HostAddr(src), len, &uffd_opts)?;
                }
                ts.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        let [mm, ue, up] = &mut t;
        curve.push(CurvePoint {
            pages: k,
            memmove_us: median(mm),
            uffd_move_us: median(ue),
            uffd_move_populated_us: median(up),
        });
    }
    let empty: Vec<(usize, f64, f64)> = curve.iter().map(|c| (c.pages, c.memmove_us, c.uffd_move_us)).collect();
    let full: Vec<(usize, f64, f64)> =
        curve.iter().map(|c| (c.pages, c.memmove_us, c.uffd_move_populated_us)).collect();
    drop(pool);
    let compaction = measure_compaction(reps.max(5))?;
    let slides: Vec<(usize, f64, f64)> = compaction.iter().map(|c| (c.pages, c.memmove_us, c.batch_us)).collect();
    Ok(BreakEven {
        pages: crossing(&empty),
        pages_populated: crossing(&full),
        pages_compaction: crossing(&slides),
        source: BreakEvenSource::Measured,
        curve,
        compaction,
    })
}

/// Times a compaction per object size: [`COMPACTION_OBJECTS`] objects, contiguous above
/// one dead object, slide down by one object, cache-cold; once by memmove, once in one
/// [`super::Batch`] of UFFDIO_MOVEs (each object moving into the space the one before
/// it vacated; the dead object's pages are freed before the clock starts, as the
/// collector only page-moves into vacated space). Sizes and both ways take turns
/// within each of `reps` rounds, so a change of load on a shared machine reaches all of
/// them alike; medians.
fn measure_compaction(reps: usize) -> Result<Vec<CompactionPoint>> {
    let ps = page_size();
    let span = |k: usize| (COMPACTION_OBJECTS + 1) * k * ps;
    let len: usize = COMPACTION_GRID.iter().map(|&k| span(k)).sum();
    let mut area = RwMapping::new(len, PMD_SIZE, false)?;
    // Read after each fill so the objects have left a 32 MiB last-level cache.
    let mut evict = RwMapping::new(64 << 20, PMD_SIZE, false)?;
    evict.bytes_mut().fill(1);
    let base = area.addr();
    let ev = evict.addr();
    let mut g = crate::mem::Grant::wrap(area.grant());
    let eg = crate::mem::Grant::wrap(evict.grant());
    let uffd_opts = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), coalesce: false };
    let mut times = vec![[Vec::with_capacity(reps), Vec::with_capacity(reps)]; COMPACTION_GRID.len()];
    for _ in 0..reps {
        for (way, batch) in [(0, false), (1, true)] {
            let mut at = base;
            for (i, &k) in COMPACTION_GRID.iter().enumerate() {
                let obj = k * ps;
                g.inner.fill(at, span(k), 0x5a)?;
                eg.inner.touch(ev, 64 << 20, 64)?;
                let start = if batch {
                    g.inner.zap(&[(at, obj)])?;
                    let mut b = super::Batch::with_options(uffd_opts);
                    for j in 0..COMPACTION_OBJECTS {
                        b.push_move(HostAddr(at + j * obj), HostAddr(at + (j + 1) * obj), obj);
                    }
                    let start = Instant::now();
                    b.execute(&mut g)?;
                    start
                } else {
                    let start = Instant::now();
                    for j in 0..COMPACTION_OBJECTS {
                        g.inner.memmove(at + j * obj, at + (j + 1) * obj, obj)?;
                    }
                    start
                };
                times[i][way].push(start.elapsed().as_secs_f64() * 1e6 / COMPACTION_OBJECTS as f64);
                at += span(k);
            }
        }
    }
    Ok(COMPACTION_GRID
        .iter()
        .zip(&mut times)
        .map(|(&pages, [mm, bt])| CompactionPoint { pages, memmove_us: median(mm), batch_us: median(bt) })
        .collect())
}

/// Smallest size where the page move wins there and at the next size (one noisy point
/// does not decide); one past the grid when it never does.
/// `curve`: (pages, memmove time, page-move time).
pub(crate) fn crossing(curve: &[(usize, f64, f64)]) -> usize {
    let wins: Vec<bool> = curve.iter().map(|c| c.2 <= c.1).collect();
    for i in 0..curve.len() {
        if wins[i] && wins.get(i + 1).copied().unwrap_or(true) {
            return curve[i].0;
        }
    }
    curve.last().map_or(GRID[GRID.len() - 1], |c| c.0) + 1
}

#[cfg(test)]
mod plausibility {
    use super::*;

    fn with_memmove(pages: usize, us: f64) -> BreakEven {
        let point = CurvePoint { pages, memmove_us: us, uffd_move_us: 1.0, uffd_move_populated_us: 1.0 };
        BreakEven { curve: vec![point], source: BreakEvenSource::Measured, ..default_break_even() }
    }

    #[test]
    fn a_measurement_whose_memmove_ran_below_1_gb_per_s_is_not_used() {
        // this machine: 10.7 us for 64 pages; the one made in a 64 MiB cgroup: 87 us a page
        assert!(plausible(&with_memmove(64, 10.7)));
        assert!(!plausible(&with_memmove(64, 64.0 * 87.0)));
        assert!(!plausible(&default_break_even()), "no curve, nothing measured");
    }
}
