//! `advm run [--mode cow|alloc|ksm|ksm-aggr|off] [--stats] -- CMD ARGS...`: runs an
//! unmodified program with the advm preload shim (crates/advm-preload), in one of the
//! mmapcopy paper's five configurations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::CliError;

/// The paper's five configurations (section 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Virtual copies: large blocks in a memfd arena, large copies become copy-on-write.
    Cow,
    /// Only large blocks moved to an anonymous page-aligned arena (the paper's orig+alloc).
    Alloc,
    /// alloc + arena marked mergeable, KSM scanning 100 pages per 20 ms.
    Ksm,
    /// alloc + arena marked mergeable, KSM scanning 1000 pages per 20 ms.
    #[value(name = "ksm-aggr")]
    KsmAggr,
    /// The untouched program: no shim.
    Off,
}

impl Mode {
    /// All five, in the paper's order (baseline first).
    pub const ALL: [Mode; 5] = [Mode::Off, Mode::Alloc, Mode::Ksm, Mode::KsmAggr, Mode::Cow];

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cow => "cow",
            Mode::Alloc => "alloc",
            Mode::Ksm => "ksm",
            Mode::KsmAggr => "ksm-aggr",
            Mode::Off => "off",
        }
    }

    /// KSM pages scanned per 20 ms wake-up, for the KSM modes.
    pub fn ksm_pages_to_scan(self) -> Option<u32> {
        match self {
            Mode::Ksm => Some(100),
            Mode::KsmAggr => Some(1000),
            _ => None,
        }
    }

    /// What the shim is told (ADVM_MODE); None when the shim is not loaded.
    fn shim_mode(self) -> Option<&'static str> {
        match self {
            Mode::Cow => Some("cow"),
            Mode::Alloc => Some("alloc"),
            Mode::Ksm | Mode::KsmAggr => Some("ksm"),
            Mode::Off => None,
        }
    }
}

/// Arguments of `advm run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Configuration: cow (virtual copies), alloc, ksm, ksm-aggr, off.
    #[arg(long, value_enum, default_value = "cow")]
    pub mode: Mode,
    /// At exit, print on stderr the copies made virtual, bytes not copied and fallbacks.
    #[arg(long)]
    pub stats: bool,
    /// Allocations and copies of at least this many pages use the arena.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub threshold_pages: u64,
    /// In cow mode, copies of at least this many pages become virtual (default 16,
    /// measured with `advm bench r`; never below --threshold-pages).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub copy_min_pages: Option<u64>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A command prepared to run under a mode. Keep it alive while the program runs: it
/// holds the KSM settings and the statistics directory.
pub struct Prepared {
    /// The command, with LD_PRELOAD and the shim's variables set.
    pub command: Command,
    /// Where the shim's processes write their statistics.
    pub stats_dir: Option<PathBuf>,
    _ksm: Option<advm::ksm::Session>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(d) = &self.stats_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn fresh_stats_dir() -> Result<PathBuf, CliError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir =
        std::env::temp_dir().join(format!("advm-run-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| CliError::Io(dir.display().to_string(), e))?;
    Ok(dir)
}

/// The installed shim (written once per content hash into the cache directory).
pub fn shim_path() -> Result<PathBuf, CliError> {
    let dir = advm_preload::default_cache_dir();
    advm_preload::install(&dir)
        .map_err(|e| CliError::Io(format!("installing the preload shim into {}", dir.display()), e))
}

/// Prepares `program args` to run under `mode`; with `stats`, the shim reports into a
/// fresh directory.
pub fn prepare(
    mode: Mode,
    threshold_pages: u64,
    program: &str,
    args: &[String],
    stats: bool,
) -> Result<Prepared, CliError> {
    let mut command = Command::new(program);
    command.args(args);
    let mut stats_dir = None;
    if let Some(shim_mode) = mode.shim_mode() {
        let so = shim_path()?;
        let mut preload = so.display().to_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
            preload = format!("{preload}:{}", old.to_string_lossy());
        }
        command
            .env("LD_PRELOAD", preload)
            .env(advm_preload::env::MODE, shim_mode)
            .env(advm_preload::env::THRESHOLD_PAGES, threshold_pages.to_string());
        if stats {
            let d = fresh_stats_dir()?;
            command.env(advm_preload::env::STATS_DIR, &d);
            stats_dir = Some(d);
        }
    }
    let ksm = mode.ksm_pages_to_scan().map(|pages| advm::ksm::Session::start(pages, 20)).transpose()?;
    Ok(Prepared { command, stats_dir, _ksm: ksm })
}

/// The shim's counters summed over every process that wrote `<pid>.stats`, and how many
/// did. Forked children that end with `_exit` write nothing (their copies are not counted).
pub fn read_stats(dir: &Path) -> (BTreeMap<String, u64>, usize) {
    let mut sum = BTreeMap::new();
    let mut files = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return (sum, 0) };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        files += 1;
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Ok(n) = v.parse::<u64>() {
                    let slot = sum.entry(k.to_string()).or_insert(0);
                    // sizes that are per-process levels are reported as the largest
                    *slot = if matches!(
                        k,
                        "threshold_bytes" | "copy_min_bytes" | "peak_live_bytes" | "live_bytes" | "vma_segments"
                    ) {
                        (*slot).max(n)
                    } else {
                        *slot + n
                    };
                }
            }
        }
    }
    (sum, files)
}

/// Renders the counters for `--stats`.
pub fn render_stats(mode: Mode, stats: &BTreeMap<String, u64>, processes: usize) -> String {
    let g = |k: &str| stats.get(k).copied().unwrap_or(0);
    let ps = advm::addr::page_size() as u64;
    let fb = crate::bench::fmt_bytes;
    let mut out = format!(
        "advm run: mode {}, threshold {} bytes{}, {} process(es) reported\n",
        mode.name(),
        g("threshold_bytes"),
        match g("copy_min_bytes") {
            0 => String::new(),
            c => format!(", copies from {c} bytes"),
        },
        processes
    );
    out += &format!(
        "  arena blocks         {} ({} reused from the free table, {} of them with their pages; {} allocated, peak live {}); {} allocations left to glibc\n",
        g("blocks_allocated"),
        g("blocks_reused_from_free_cache"),
        g("blocks_reused_with_pages"),
        fb(g("block_bytes_allocated")),
        fb(g("peak_live_bytes")),
        g("alloc_fallbacks_to_glibc")
    );
    out += &format!("  large copies         {} seen, {} made virtual\n", g("large_copies_seen"), g("copies_virtual"));
    out += &format!(
        "  bytes not copied     {} ({} pages shared); {} of partial pages copied\n",
        fb(g("pages_shared") * ps),
        g("pages_shared"),
        fb(g("bytes_copied_partial_pages"))
    );
    out += &format!(
        "  dirty pages moved    {} (written once into the memfd to be shared)\n",
        g("dirty_pages_moved_to_memfd")
    );
    out += &format!(
        "  page reuse           {} pages mapped fresh, {} kept pages returned; {} pages kept from under copies\n",
        g("pages_mapped_fresh"),
        g("kept_pages_returned"),
        g("pages_kept_from_copied_over")
    );
    let reasons = [
        ("fallback_not_both_in_arena", "not both in the arena"),
        ("fallback_page_offsets_differ", "page offsets differ"),
        ("fallback_overlap", "overlapping"),
        ("fallback_no_whole_page", "no whole page"),
        ("fallback_vma_budget", "VMA budget"),
        ("fallback_syscall_error", "syscall error"),
    ];
    let total: u64 = reasons.iter().map(|(k, _)| g(k)).sum();
    let why: Vec<String> =
        reasons.iter().filter(|(k, _)| g(k) > 0).map(|(k, name)| format!("{name} {}", g(k))).collect();
    out += &format!(
        "  fallbacks            {total} ({} copied){}{}\n",
        fb(g("fallback_bytes_copied")),
        if why.is_empty() { "" } else { ": " },
        why.join(", ")
    );
    out += &format!(
        "  realloc              {} in place, {} moved by mremap, {} shrunk\n",
        g("realloc_in_place"),
        g("realloc_mremap"),
        g("realloc_shrink")
    );
    out += &format!("  forks                {} (arena frozen to private at each)\n", g("forks"));
    if g("generations_exhausted") > 0 {
        out += &format!(
            "  anonymous blocks     {} (memfd generations exhausted after forks)\n",
            g("generations_exhausted")
        );
    }
    out
}

/// `advm run`: runs the program, then exits with its status.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let (program, rest) = args.command.split_first().ok_or_else(|| CliError::Usage("no command given".into()))?;
    let mut prepared = prepare(args.mode, args.threshold_pages, program, rest, args.stats)?;
    if let Some(p) = args.copy_min_pages {
        prepared.command.env(advm_preload::env::COPY_MIN_PAGES, p.to_string());
    }
    let mut child = prepared.command.spawn().map_err(|e| CliError::Io(format!("running {program}"), e))?;
    // Ctrl-C and kill must end the program, not advm: advm still has to restore KSM
    // settings and report.
    let signals = advm::sys::signal::ChildSignals::install(child.id() as i32)?;
    let status = child.wait().map_err(|e| CliError::Io(format!("waiting for {program}"), e))?;
    drop(signals);
    if args.stats {
        match &prepared.stats_dir {
            Some(d) => {
                let (stats, n) = read_stats(d);
                eprint!("{}", render_stats(args.mode, &stats, n));
            }
            None => eprintln!("advm run: mode off: the shim was not loaded, nothing to report"),
        }
    }
    drop(prepared);
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}
