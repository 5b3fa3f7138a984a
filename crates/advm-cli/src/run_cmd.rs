//! `advm run [--mode vcopy|alloc|ksm|ksm-aggr|off|merge] [--stats] -- CMD ARGS...`: runs an
//! unmodified program with the advm preload shim (crates/advm-preload), in one of the
//! mmapcopy paper's five configurations, or with the merge agent (`--mode merge`,
//! `advm::merge::agent`). Launching is `advm_preload::launch`'s; this
//! file parses the arguments and prints.

use std::collections::BTreeMap;

use advm::stats::cgroup::{self, Group, DEFAULT_INTERVAL};
use advm_bench::fmt_bytes;
use advm_preload::launch::{self, Mode};

use crate::CliError;

/// `--mode`: the launch modes by name, each with its one-line help, in the order the
/// help lists them; a deprecated name is accepted as an alias and named in the help.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = Mode> {
    use clap::builder::{PossibleValue, TypedValueParser};
    let values = Mode::RUNNABLE.map(|m| {
        let old: Vec<&str> = Mode::DEPRECATED_NAMES.iter().filter(|(_, to)| *to == m).map(|(old, _)| *old).collect();
        let value = PossibleValue::new(m.name()).aliases(old.iter().copied());
        if old.is_empty() {
            value.help(m.about())
        } else {
            value.help(format!("{} (`{}`: deprecated name, still accepted)", m.about(), old.join("`, `")))
        }
    });
    clap::builder::PossibleValuesParser::new(values)
        .map(|name| Mode::from_name(&name).expect("parser admits only mode names"))
}

/// Arguments of `advm run`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("report").multiple(true)))]
pub struct RunArgs {
    /// Configuration: vcopy (virtual copies; `cow` is its deprecated name), alloc, ksm,
    /// ksm-aggr, off, merge.
    #[arg(long, value_parser = mode_parser(), default_value = "vcopy")]
    pub mode: Mode,
    /// At exit, print on stderr the copies made virtual, bytes not copied and fallbacks.
    #[arg(long, group = "report")]
    pub stats: bool,
    /// Allocations and copies of at least this many pages use the arena.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub threshold_pages: u64,
    /// In vcopy mode, copies of at least this many pages become virtual (default 16,
    /// measured with `advm bench r`; never below --threshold-pages).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub copy_min_pages: Option<u64>,
    /// In merge mode: merge once the program's anonymous memory has grown (by 32 MiB)
    /// and then stayed within 1 MiB of growth for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = merge_after_parser)]
    pub merge_after: f64,
    /// Run the program in its own memory cgroup and, after it exits, print on stderr
    /// the anon+shmem and page cache charged to it (mean and peak, sampled every 50 ms).
    #[arg(long, group = "report")]
    pub cgroup: bool,
    /// With --cgroup or --stats: print those reports as JSON (on stderr, after the
    /// program's output; the cgroup's first, then the statistics, one document each).
    #[arg(long, requires = "report")]
    pub json: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn merge_after_parser(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && (0.0..=86400.0).contains(x))
        .ok_or_else(|| format!("{s:?} is not a number of seconds in 0..=86400"))
}

/// Renders the counters for `--stats`.
pub fn render_stats(mode: Mode, stats: &BTreeMap<String, u64>, processes: usize) -> String {
    let g = |k: &str| stats.get(k).copied().unwrap_or(0);
    let ps = advm::addr::page_size() as u64;
    let fb = fmt_bytes;
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
    out += &format!("  large copies         {} seen, {} made virtual", g("large_copies_seen"), g("copies_virtual"));
    // copies that re-homed written pages while another thread could write them
    let fenced = g("copies_fenced_for_writers");
    if fenced > 0 {
        out += &format!("; {fenced} fenced other threads' writes");
    }
    out += "\n";
    out += &format!(
        "  bytes not copied     {} ({} pages shared); {} of partial pages copied\n",
        fb(g("pages_shared") * ps),
        g("pages_shared"),
        fb(g("bytes_copied_partial_pages"))
    );
    out += &format!(
        "  dirty pages moved    {} (written once into the memfd to be shared); {} memfd pages released under written views, {} adopted by their last view{}\n",
        g("dirty_pages_moved_to_memfd"),
        g("memfd_pages_released_under_written_views"),
        g("memfd_pages_adopted_by_last_view"),
        match g("pages_dropped_by_madvise") {
            0 => String::new(),
            d => format!(", {d} dropped by the program (madvise)"),
        }
    );
    out += &format!(
        "  trims                {} ({} memfd pages every view of which was written given back; {:.1} ms)\n",
        g("trims"),
        g("memfd_pages_trimmed_under_written_views"),
        g("trim_us") as f64 / 1000.0
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
        ("fallback_copy_inside_shim", "copy from inside the shim (signal handler)"),
        ("fallback_protected_pages", "pages the program protected (mprotect)"),
        ("fallback_writers_unfenced", "other threads may write, userfaultfd refused"),
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
    if g("fds_closed_by_program") > 0 {
        out += &format!(
            "  descriptors lost     {} (the program closed the shim's memfd or pagemap: forgotten, never reused)\n",
            g("fds_closed_by_program")
        );
    }
    out
}

/// Renders the merge agents' totals for `--mode merge --stats`.
pub fn render_merge_totals(t: &advm::merge::agent::AgentTotals) -> String {
    let ps = advm::addr::page_size() as u64;
    if t.merges == 0 {
        return format!(
            "advm run: mode merge, {} process(es) reported: no merge ran (the program ended before its memory, once grown, stayed quiet for --merge-after seconds, and no `advm merge PID` asked)\n",
            t.processes
        );
    }
    format!(
        "advm run: mode merge, {} process(es) reported\n  agent merges         {} ({} of mappings in {:.3} s)\n  pages                {} merged ({}), {} added to the store, {} skipped ({} busy, {} all-zero given back)\n",
        t.processes,
        t.merges,
        fmt_bytes(t.bytes),
        t.seconds,
        t.merged,
        fmt_bytes(t.merged * ps),
        t.added,
        t.skipped,
        t.busy,
        t.zero_dropped
    )
}

/// Renders the cgroup meter's report for `--cgroup`, its lines led by `who` (the
/// command: `advm run`, `advm vm run`).
fn render_cgroup(who: &str, s: &cgroup::Summary) -> String {
    let agg =
        |a: advm::stats::Aggregate| format!("mean {}, peak {}", fmt_bytes(a.mean as u64), fmt_bytes(a.max as u64));
    format!(
        "{who}: memory cgroup {} ({:?}), {} samples every {} ms\n  anon+shmem   {}\n  page cache   {}\n",
        s.group.display(),
        s.version,
        s.samples,
        s.interval_ms,
        agg(s.anon_shmem_bytes),
        agg(s.page_cache_bytes)
    )
}

/// Ends `--cgroup` once the measured program has been reaped: stops the sampler,
/// releases the group (what the program left running lives on, as it would without
/// advm) and prints the report on stderr, as JSON with `json`.
pub fn report_cgroup(who: &str, group: Group, sampler: cgroup::Sampler, json: bool) -> Result<(), CliError> {
    let summary = sampler.stop()?;
    group.release()?;
    if json {
        eprintln!("{}", serde_json::to_string_pretty(&summary).expect("serializes"));
    } else {
        eprint!("{}", render_cgroup(who, &summary));
    }
    Ok(())
}

/// `advm run`: runs the program, then exits with its status.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let (program, rest) = args.command.split_first().ok_or_else(|| CliError::Usage("no command given".into()))?;
    // Ctrl-C and kill must end the program, not advm: advm still has to restore KSM
    // settings (changed in `prepare`) and report. Installed first: a kill until the
    // program exists is held for it.
    let signals = advm::process::ForwardSignals::hold()?;
    let mut prepared = launch::prepare(args.mode, args.threshold_pages, program, rest, args.stats)?;
    if matches!(args.mode, Mode::Vcopy | Mode::Alloc | Mode::Ksm | Mode::KsmAggr) {
        if let Some(limit) = launch::finite_memory_limit() {
            eprintln!(
                "advm run: {limit} is limited (ulimit): the shim stays off, so {program} runs as under --mode off"
            );
        }
    }
    let preloaded = if args.mode == Mode::Merge { "merge agent" } else { "shim" };
    if args.mode != Mode::Off && launch::statically_linked(program) {
        eprintln!(
            "advm run: {program} is statically linked: LD_PRELOAD cannot load the {preloaded} into it, so it runs untouched (as --mode off)"
        );
    } else if let Some(why) = launch::preload_ignored(program).filter(|_| args.mode != Mode::Off) {
        eprintln!(
            "advm run: {program} is {why}: the dynamic loader ignores LD_PRELOAD in it (secure-execution mode), so the {preloaded} is not loaded and it runs untouched (as --mode off)"
        );
    }
    if args.mode == Mode::Merge {
        prepared.command.env(launch::MERGE_AFTER, args.merge_after.to_string());
    }
    if let Some(p) = args.copy_min_pages {
        prepared.command.env(advm_preload::env::COPY_MIN_PAGES, p.to_string());
    }
    let group = if args.cgroup { Some(Group::create("run")?) } else { None };
    if let Some(g) = &group {
        g.join_at_exec(&mut prepared.command)?;
    }
    let sampler = group.as_ref().map(|g| g.sample_every(DEFAULT_INTERVAL));
    let mut child = prepared.command.spawn().map_err(|e| CliError::NotStarted(program.clone(), e))?;
    signals.child(child.id())?;
    let status = child.wait().map_err(|e| CliError::Io(format!("waiting for {program}"), e))?;
    drop(signals);
    if let (Some(g), Some(sampler)) = (group, sampler) {
        report_cgroup("advm run", g, sampler, args.json)?;
    }
    if args.stats {
        let mode = args.mode.name();
        match (&prepared.stats_dir, &prepared.merge_report_dir) {
            (Some(d), _) => {
                let (stats, n) = launch::read_stats(d);
                if args.json {
                    let v = serde_json::json!({"mode": mode, "processes": n, "counters": stats});
                    eprintln!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
                } else {
                    eprint!("{}", render_stats(args.mode, &stats, n));
                }
            }
            (None, Some(d)) => {
                let totals = advm::merge::agent::read_totals(d);
                if args.json {
                    let v = serde_json::json!({"mode": mode, "merge_agent": totals});
                    eprintln!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
                } else {
                    eprint!("{}", render_merge_totals(&totals));
                }
            }
            (None, None) => eprintln!("advm run: mode {mode}: the shim was not loaded, nothing to report"),
        }
    }
    drop(prepared);
    if !status.success() {
        // Flushed by hand: exiting skips the destructors.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        advm::process::exit_like(status);
    }
    Ok(())
}
