//! Starting a program under one of the mmapcopy paper's five configurations: the shim
//! in `LD_PRELOAD` with its variables, a statistics directory, and the KSM settings a
//! mode needs for as long as the program runs. `advm run` and `advm bench r` both
//! launch through here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What launching can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the library (KSM settings).
    #[error(transparent)]
    Advm(#[from] advm::Error),
    /// I/O on something named.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

/// The paper's five configurations (section 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Virtual copies: large blocks in a memfd arena, large copies become copy-on-write.
    Vcopy,
    /// Only large blocks moved to an anonymous page-aligned arena (the paper's orig+alloc).
    Alloc,
    /// alloc + arena marked mergeable, KSM scanning 100 pages per 20 ms.
    Ksm,
    /// alloc + arena marked mergeable, KSM scanning 1000 pages per 20 ms.
    KsmAggr,
    /// The untouched program: no shim.
    Off,
    /// No shim: libadvm's merge agent merges the program's large anonymous mappings
    /// once it has loaded (not one of the paper's five).
    Merge,
}

impl Mode {
    /// All five, in the paper's order (baseline first).
    pub const ALL: [Mode; 5] = [Mode::Off, Mode::Alloc, Mode::Ksm, Mode::KsmAggr, Mode::Vcopy];

    /// Old names still accepted on the command line, for one release, and the mode each
    /// stands for.
    pub const DEPRECATED_NAMES: [(&'static str, Mode); 1] = [("cow", Mode::Vcopy)];

    /// Every mode `advm run` accepts: the paper's five, then merge.
    pub const RUNNABLE: [Mode; 6] = [Mode::Vcopy, Mode::Alloc, Mode::Ksm, Mode::KsmAggr, Mode::Off, Mode::Merge];

    /// The name used on the command line, in `--stats` and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Vcopy => "vcopy",
            Mode::Alloc => "alloc",
            Mode::Ksm => "ksm",
            Mode::KsmAggr => "ksm-aggr",
            Mode::Off => "off",
            Mode::Merge => "merge",
        }
    }

    /// The mode called `name`, by its name or a deprecated one.
    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::RUNNABLE
            .into_iter()
            .find(|m| m.name() == name)
            .or_else(|| Mode::DEPRECATED_NAMES.iter().find(|(old, _)| *old == name).map(|(_, m)| *m))
    }

    /// The name in benchmark results (`advm bench r` JSON, `bench/run/results/`): the
    /// names recorded before the rename, so that old and new results compare.
    pub fn result_name(self) -> &'static str {
        match self {
            Mode::Vcopy => "cow",
            other => other.name(),
        }
    }

    /// One line on what the mode does (the variant's doc, for `--help`).
    pub fn about(self) -> &'static str {
        match self {
            Mode::Vcopy => "Virtual copies: large blocks in a memfd arena, large copies become copy-on-write",
            Mode::Alloc => "Only large blocks moved to an anonymous page-aligned arena (the paper's orig+alloc)",
            Mode::Ksm => "alloc + arena marked mergeable, KSM scanning 100 pages per 20 ms",
            Mode::KsmAggr => "alloc + arena marked mergeable, KSM scanning 1000 pages per 20 ms",
            Mode::Off => "The untouched program: no shim",
            Mode::Merge => {
                "Merge the program's large anonymous mappings (heap, anonymous mmaps) into advmd's page store once it has loaded"
            }
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
            Mode::Vcopy => Some("vcopy"),
            Mode::Alloc => Some("alloc"),
            Mode::Ksm | Mode::KsmAggr => Some("ksm"),
            Mode::Off | Mode::Merge => None,
        }
    }
}

/// Environment variables of the merge agent (libadvm's `advm::merge::agent`).
pub use advm::merge::agent::{ENV_AFTER as MERGE_AFTER, ENV_AGENT as MERGE_AGENT, ENV_REPORT_DIR as MERGE_REPORT_DIR};

/// libadvm.so, which holds the merge agent: `$ADVM_LIB`, else next to the running
/// executable (`target/*/advm` beside `target/*/libadvm.so`, or `bin/` beside `lib/`).
pub fn agent_library() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os("ADVM_LIB").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| Error::Io("locating the advm executable".into(), e))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let tries = [dir.join("libadvm.so"), dir.join("../libadvm.so"), dir.join("../lib/libadvm.so")];
    tries.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        Error::Io(
            format!(
                "libadvm.so (the merge agent) is not at {} nor {}; build it (`cargo build -p advm-capi`) or set ADVM_LIB",
                tries[0].display(),
                tries[2].display()
            ),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

fn prepend_preload(command: &mut Command, so: &Path) {
    let mut preload = so.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload = format!("{preload}:{}", old.to_string_lossy());
    }
    command.env("LD_PRELOAD", preload);
}

/// A command prepared to run under a mode. Keep it alive while the program runs: it
/// holds the KSM settings and the statistics directory.
pub struct Prepared {
    /// The command, with LD_PRELOAD and the shim's variables set.
    pub command: Command,
    /// Where the shim's processes write their statistics.
    pub stats_dir: Option<PathBuf>,
    /// Where the merge agents write their reports (`--mode merge` with statistics).
    pub merge_report_dir: Option<PathBuf>,
    /// The two directories, removed on drop (and by a later run's sweep when this one
    /// is killed outright).
    _scratch: Vec<advm::process::ScratchDir>,
    _ksm: Option<advm::ksm::Session>,
}

/// The installed shim (written once per content hash into the cache directory).
pub fn shim_path() -> Result<PathBuf, Error> {
    let dir = crate::default_cache_dir();
    crate::install(&dir).map_err(|e| Error::Io(format!("installing the preload shim into {}", dir.display()), e))
}

/// Prepares `program args` to run under `mode`; with `stats`, the shim reports into a
/// fresh directory.
pub fn prepare(
    mode: Mode,
    threshold_pages: u64,
    program: &str,
    args: &[String],
    stats: bool,
) -> Result<Prepared, Error> {
    // First, so that a refusal (KSM's knobs need root) leaves nothing behind.
    let ksm = mode.ksm_pages_to_scan().map(|pages| advm::ksm::Session::start(pages, 20)).transpose()?;
    // Every run, not only those that make a directory: a killed run's directories
    // would stay until the next run with statistics. Once: the directories below are
    // made without sweeping again.
    advm::process::ScratchDir::remove_dead();
    let mut command = Command::new(program);
    command.args(args);
    let (mut stats_dir, mut merge_report_dir, mut scratch) = (None, None, Vec::new());
    if let Some(shim_mode) = mode.shim_mode() {
        prepend_preload(&mut command, &shim_path()?);
        command.env(crate::env::MODE, shim_mode).env(crate::env::THRESHOLD_PAGES, threshold_pages.to_string());
        if stats {
            let d = advm::process::ScratchDir::create("advm-run")?;
            command.env(crate::env::STATS_DIR, d.path());
            stats_dir = Some(d.path().to_path_buf());
            scratch.push(d);
        }
    }
    if mode == Mode::Merge {
        prepend_preload(&mut command, &agent_library()?);
        command.env(MERGE_AGENT, "1");
        if stats {
            let d = advm::process::ScratchDir::create("advm-run")?;
            command.env(MERGE_REPORT_DIR, d.path());
            merge_report_dir = Some(d.path().to_path_buf());
            scratch.push(d);
        }
    }
    Ok(Prepared { command, stats_dir, merge_report_dir, _scratch: scratch, _ksm: ksm })
}

/// `program` as exec finds it: a path as given, or a name looked up in `PATH`.
fn program_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        Some(PathBuf::from(program))
    } else {
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|p| p.is_file()))
    }
}

/// Why the dynamic loader will ignore `LD_PRELOAD` in `program`, or None: a set-user-ID
/// file owned by another user than this process's real one (or set-group-ID to another
/// group) runs in secure-execution mode, where ld.so preloads no library named by a
/// path, so the shim (the merge agent) is not loaded and the program runs untouched.
/// Not seen: a filesystem mounted `nosuid` (the bits do nothing there, and the shim
/// loads) and file capabilities (secure mode too).
pub fn preload_ignored(program: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(program_path(program)?).ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    // the real id: the first of the "Uid:" / "Gid:" line's four
    let real = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
    };
    if meta.mode() & 0o4000 != 0 && real("Uid:") != Some(meta.uid()) {
        return Some(format!("set-user-ID (to uid {})", meta.uid()));
    }
    if meta.mode() & 0o2000 != 0 && meta.mode() & 0o010 != 0 && real("Gid:") != Some(meta.gid()) {
        return Some(format!("set-group-ID (to gid {})", meta.gid()));
    }
    None
}

/// Whether `program` (a path, or a name looked up in `PATH` as exec does) is an ELF
/// executable without a program interpreter (statically linked, static-pie included):
/// the dynamic loader never runs in it, so `LD_PRELOAD` (the shim, the merge agent) is
/// not loaded and the program runs untouched. False when it cannot be read or is not a
/// 64-bit little-endian ELF file (a script's interpreter is what runs).
pub fn statically_linked(program: &str) -> bool {
    let path = program_path(program);
    // the headers are at the start: the first 64 KiB, not the whole binary
    let mut bytes = Vec::new();
    let read = path
        .and_then(|p| std::fs::File::open(p).ok())
        .map(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 16), &mut bytes));
    if !matches!(read, Some(Ok(_))) {
        return false;
    }
    let u16_at = |o: usize| bytes.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |o: usize| bytes.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
    // ELF magic, 64-bit, little-endian; then the program headers (PT_INTERP is type 3)
    if bytes.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return false;
    }
    let (Some(phoff), Some(size), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else { return false };
    let mut interp = false;
    for i in 0..count {
        match bytes.get(phoff + i * size..phoff + i * size + 4) {
            Some(t) => interp |= u32::from_le_bytes(t.try_into().expect("4 bytes")) == 3,
            None => return false,
        }
    }
    !interp
}

/// The first of RLIMIT_AS and RLIMIT_DATA that is finite for this process (and so for a
/// program it starts), by its name in /proc/self/limits: the shim does not set up
/// under either (its reservation and tables would count against the program's limit).
pub fn finite_memory_limit() -> Option<&'static str> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    ["Max address space", "Max data size"].into_iter().find(|name| {
        limits.lines().any(|l| {
            l.strip_prefix(name).and_then(|rest| rest.split_whitespace().next()).is_some_and(|soft| soft != "unlimited")
        })
    })
}

/// The shim's counters summed over every process that wrote `<pid>.stats`, and how many
/// did. Forked children that end with `_exit` write nothing (their copies are not counted).
pub fn read_stats(dir: &Path) -> (BTreeMap<String, u64>, usize) {
    let mut sum = BTreeMap::new();
    let mut files = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return (sum, 0) };
    // `<pid>.stats` only (the directory also holds its scratch marker)
    for e in entries.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "stats")) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the next names, made first (as another user could in /tmp), is
    /// neither used nor removed; the new one is private. The names used to be removed
    /// and made again with the umask's mode, or taken over when made in between.
    #[test]
    fn a_stats_dir_is_new_and_private_and_never_one_made_before() {
        use std::os::unix::fs::PermissionsExt;
        let planted: Vec<PathBuf> = (0..64)
            .map(|k| std::env::temp_dir().join(format!("advm-run-{}-{k}", std::process::id())))
            .filter(|d| std::fs::create_dir(d).is_ok())
            .collect();
        for d in &planted {
            std::fs::write(d.join("planted"), "x").unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let scratch = advm::process::ScratchDir::new("advm-run").unwrap();
        let dir = scratch.path().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        let fresh = names == [advm::process::ScratchDir::MARKER];
        let kept = planted.iter().all(|d| d.join("planted").exists());
        drop(scratch);
        for d in &planted {
            let _ = std::fs::remove_dir_all(d);
        }
        assert!(!planted.contains(&dir), "took over {}", dir.display());
        assert_eq!(mode, 0o700);
        assert!(fresh && kept);
    }
}
