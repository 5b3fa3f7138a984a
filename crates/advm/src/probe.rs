//! What this kernel offers advm, probed once: the facts capabilities decide on, and the
//! report `advm doctor` prints (one line per feature: OK / degraded / missing, and what
//! that means for advm).

use crate::sys::lazy::Lazy;

use serde::Serialize;

use crate::sys::{self, ksm, uffd::feature, uffd::Userfaultfd};

/// How well a feature is there (non-exhaustive: a probe may learn finer states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// Present and usable.
    Ok,
    /// Present with limits, or advm works around it at a cost.
    Degraded,
    /// Not there.
    Missing,
}

impl Status {
    /// The word for a report: `OK`, `degraded` or `missing`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Degraded => "degraded",
            Status::Missing => "missing",
        }
    }
}

/// One line of the doctor's report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Feature name.
    pub name: &'static str,
    /// OK / degraded / missing.
    pub status: Status,
    /// What was seen.
    pub value: String,
    /// What it means for advm.
    pub consequence: String,
}

/// The facts capabilities decide on, and benchmarks print beside their figures.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// `uname -r`.
    pub kernel_release: String,
    /// (major, minor) parsed from the release.
    pub kernel_version: (u32, u32),
    /// Base page size.
    pub page_size_bytes: u64,
    /// Online CPUs.
    pub cpus: usize,
    /// MemTotal.
    pub mem_total_bytes: u64,
    /// Supported userfaultfd features (None: no userfaultfd).
    pub uffd_features: Option<u64>,
    /// How userfaultfd is obtained.
    pub uffd_source: Option<sys::uffd::Source>,
    /// memfd_create works.
    pub memfd: bool,
    /// mremap(MREMAP_FIXED|MREMAP_DONTUNMAP) works (what advm uses).
    pub mremap_dontunmap: bool,
    /// mremap(MREMAP_DONTUNMAP) to a kernel-chosen address works.
    pub mremap_dontunmap_anywhere: bool,
    /// KSM present.
    pub ksm: bool,
    /// PFNs visible in pagemap.
    pub pfn_visible: bool,
    /// PAGEMAP_SCAN available.
    pub pagemap_scan: bool,
    /// vm.max_map_count.
    pub max_map_count: u64,
    /// THP mode for anonymous memory (the bracketed word).
    pub thp_enabled: String,
    /// Effective uid is 0.
    pub root: bool,
}

impl Facts {
    /// True when UFFDIO_MOVE is available.
    pub fn uffd_move(&self) -> bool {
        self.uffd_features.is_some_and(|f| f & feature::MOVE != 0)
    }
    /// True when userfaultfd write protection of anonymous memory is available.
    pub fn uffd_wp(&self) -> bool {
        self.uffd_features.is_some_and(|f| f & feature::PAGEFAULT_FLAG_WP != 0)
    }
}

fn read_trim(path: impl AsRef<std::path::Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The bracketed choice of a sysfs selector like `always [madvise] never`.
fn bracketed(s: &str) -> String {
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(['[', ']']).to_string())
        .unwrap_or_else(|| s.to_string())
}

fn parse_version(release: &str) -> (u32, u32) {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

fn mem_total_bytes() -> u64 {
    read_trim("/proc/meminfo")
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// The facts, probed on first use and cached for the process.
pub fn facts() -> &'static Facts {
    // Every probe reads or makes and drops something of its own (a userfaultfd, a
    // memfd, mappings): probing twice when threads race on the first use is harmless.
    static FACTS: Lazy<Facts> = Lazy::new();
    FACTS.get_or_init(|| {
        let release = sys::kernel_release();
        let uffd = Userfaultfd::probe().ok();
        Facts {
            kernel_version: parse_version(&release),
            kernel_release: release,
            page_size_bytes: sys::page_size() as u64,
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            mem_total_bytes: mem_total_bytes(),
            uffd_features: uffd.map(|u| u.features),
            uffd_source: uffd.map(|u| u.source),
            memfd: sys::memfd::create("advm-probe").is_ok(),
            mremap_dontunmap: sys::mman::dontunmap_fixed_available(),
            mremap_dontunmap_anywhere: sys::mman::dontunmap_available().is_ok(),
            ksm: ksm::available(),
            pfn_visible: sys::pagemap::pfns_visible().unwrap_or(false),
            pagemap_scan: sys::pagemap::scan_available(),
            max_map_count: read_trim("/proc/sys/vm/max_map_count").and_then(|s| s.parse().ok()).unwrap_or(65530),
            thp_enabled: read_trim("/sys/kernel/mm/transparent_hugepage/enabled")
                .map(|s| bracketed(&s))
                .unwrap_or_else(|| "absent".into()),
            root: sys::is_root(),
        }
    })
}

fn check(name: &'static str, status: Status, value: impl Into<String>, consequence: impl Into<String>) -> Check {
    Check { name, status, value: value.into(), consequence: consequence.into() }
}

/// The doctor's report: one [`Check`] per feature.
pub fn report() -> Vec<Check> {
    let f = facts();
    let mut out = Vec::new();
    let (maj, min) = f.kernel_version;
    out.push(if (maj, min) >= (6, 8) {
        check("kernel", Status::Ok, &f.kernel_release, "6.8 or newer: every advm capability can run")
    } else {
        check(
            "kernel",
            Status::Degraded,
            &f.kernel_release,
            "older than 6.8: no UFFDIO_MOVE, remap uses mremap and memmove only",
        )
    });

    let unpriv = read_trim("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_else(|| "?".into());
    out.push(match (f.uffd_features, f.uffd_source) {
        (Some(_), Some(src)) => {
            let how = match src {
                sys::uffd::Source::Syscall => "userfaultfd(2)",
                sys::uffd::Source::Device => "/dev/userfaultfd",
                sys::uffd::Source::SyscallUserModeOnly => "userfaultfd(2), user-mode faults only",
            };
            let user_mode_only = src == sys::uffd::Source::SyscallUserModeOnly;
            check(
                "userfaultfd",
                if user_mode_only { Status::Degraded } else { Status::Ok },
                format!("via {how} (vm.unprivileged_userfaultfd={unpriv})"),
                if user_mode_only {
                    "UFFDIO_MOVE engine available; no pager, no merging, and virtual copies of a block another \
                     thread writes are made by memcpy (a system call touching a range they fence or page would fail \
                     with EFAULT); for full use: sysctl vm.unprivileged_userfaultfd=1, or read-write access to \
                     /dev/userfaultfd for this user, or CAP_SYS_PTRACE"
                } else {
                    "pager and UFFDIO_MOVE engine available"
                },
            )
        }
        _ => check(
            "userfaultfd",
            Status::Missing,
            format!("no access (vm.unprivileged_userfaultfd={unpriv})"),
            "no user-level pager; remap falls back to mremap/memmove",
        ),
    });
    let feat = |bit| f.uffd_features.is_some_and(|x| x & bit != 0);
    let uffd_lines: [(&'static str, u64, &str, &str); 5] = [
        (
            "uffd MOVE",
            feature::MOVE,
            "zero-copy moves without VMA splits (remap engine uffd-move)",
            "remap uses mremap, which splits VMAs on scattered moves",
        ),
        (
            "uffd WP",
            feature::PAGEFAULT_FLAG_WP,
            "write tracking for the pager and image dumps",
            "dirty tracking falls back to soft-dirty bits",
        ),
        (
            "uffd WP_ASYNC",
            feature::WP_ASYNC,
            "kernel-resolved write protection: cheap dirty tracking",
            "dirty tracking needs a fault handler thread",
        ),
        ("uffd SIGBUS", feature::SIGBUS, "faults can raise SIGBUS instead of blocking", "pager cannot use SIGBUS mode"),
        (
            "uffd MINOR_SHMEM",
            feature::MINOR_SHMEM,
            "pager can map page-cache pages of memfds on demand",
            "memfd-backed pager pages must be copied in",
        ),
    ];
    for (name, bit, ok, missing) in uffd_lines {
        out.push(if feat(bit) {
            check(name, Status::Ok, "yes", ok)
        } else {
            check(name, Status::Missing, "no", missing)
        });
    }
    out.push(if f.memfd {
        check("memfd", Status::Ok, "memfd_create works", "virtual-copy arena available")
    } else {
        check("memfd", Status::Missing, "memfd_create failed", "no virtual copies: vcopy falls back to memcpy")
    });
    out.push(if f.mremap_dontunmap {
        let value = if f.mremap_dontunmap_anywhere { "yes" } else { "with MREMAP_FIXED only (EINVAL without)" };
        check(
            "mremap DONTUNMAP",
            Status::Ok,
            value,
            "large aligned moves exchange page tables and keep the source mapped",
        )
    } else {
        check("mremap DONTUNMAP", Status::Missing, "no", "moves unmap their source")
    });
    out.push(if f.ksm {
        let run = ksm::read("run").unwrap_or(0);
        let value = format!(
            "run={run} pages_to_scan={} sleep_millisecs={} max_page_sharing={} use_zero_pages={} advisor={}",
            ksm::read("pages_to_scan").unwrap_or(0),
            ksm::read("sleep_millisecs").unwrap_or(0),
            ksm::read("max_page_sharing").unwrap_or(0),
            ksm::read("use_zero_pages").unwrap_or(0),
            ksm::read_text("advisor_mode").unwrap_or_else(|| "none".into()),
        );
        if !ksm::writable() {
            check(
                "ksm",
                Status::Degraded,
                value,
                "changing KSM's settings needs root: advm run --mode ksm/ksm-aggr and the KSM baselines are not \
                 available to this user",
            )
        } else {
            let consequence = if run == 1 {
                "KSM running: baselines available; it also merges other processes now"
            } else {
                "KSM present, stopped: benchmarks start it for their KSM baselines"
            };
            check("ksm", Status::Ok, value, consequence)
        }
    } else {
        check("ksm", Status::Missing, "no /sys/kernel/mm/ksm", "KSM baselines are skipped")
    });
    out.push(if f.pfn_visible {
        check("pagemap PFNs", Status::Ok, "visible", "advm stat counts distinct physical pages")
    } else {
        check("pagemap PFNs", Status::Degraded, "hidden (needs CAP_SYS_ADMIN)", "advm stat falls back to PSS")
    });
    out.push(if f.pagemap_scan {
        check("PAGEMAP_SCAN", Status::Ok, "yes", "advm stat reads pagemap only where pages are present")
    } else {
        check("PAGEMAP_SCAN", Status::Degraded, "no (before 6.7)", "advm stat reads pagemap for every mapped page")
    });
    out.push(check(
        "max_map_count",
        if f.max_map_count >= 65530 { Status::Ok } else { Status::Degraded },
        f.max_map_count.to_string(),
        format!("VMA budget for advm plans: {} mappings (half the limit)", f.max_map_count / 2),
    ));
    let shmem_thp = read_trim("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map(|s| bracketed(&s))
        .unwrap_or_else(|| "absent".into());
    out.push(check(
        "THP",
        Status::Ok,
        format!("anon={} shmem={shmem_thp}", f.thp_enabled),
        "2 MiB-aligned moves can move whole page tables; THP splits on partial moves",
    ));
    let swaps = read_trim("/proc/swaps").map(|s| s.lines().skip(1).count()).unwrap_or(0);
    out.push(if !f.root {
        check(
            "swap",
            Status::Degraded,
            format!("{swaps} device(s)"),
            "the kernel-swap baselines (advm bench pager) enable a swap file of their own: swapon needs root \
             (CAP_SYS_ADMIN)",
        )
    } else if swaps > 0 {
        check("swap", Status::Ok, format!("{swaps} device(s)"), "kernel-swap baselines can run")
    } else {
        check("swap", Status::Degraded, "none", "kernel-swap baselines need a swap file (swapon works here as root)")
    });
    let reporting_order =
        read_trim("/sys/module/page_reporting/parameters/page_reporting_order").and_then(|o| o.parse().ok());
    let balloons = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon")
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("virtio")).count())
        .unwrap_or(0);
    out.push(page_reporting_check(reporting_order, balloons));
    out.push(damon_check(&damon_schemes()));
    let v2_memory =
        read_trim("/sys/fs/cgroup/cgroup.controllers").is_some_and(|c| c.split_whitespace().any(|w| w == "memory"));
    let v1_memory = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    out.push(match (v1_memory, v2_memory) {
        (true, _) | (_, true) if !f.root => check(
            "cgroup memory",
            Status::Degraded,
            if v2_memory { "v2" } else { "v1" },
            "creating memory cgroups needs root: advm run --cgroup, bench pager and the benchmarks' cgroup meter \
             are not available to this user",
        ),
        (_, true) => check("cgroup memory", Status::Ok, "v2", "memory-limit experiments use cgroup v2"),
        (true, false) => check("cgroup memory", Status::Ok, "v1", "memory-limit experiments use cgroup v1"),
        _ => check("cgroup memory", Status::Missing, "no memory controller", "memory-limit experiments are skipped"),
    });
    out
}

/// Whether this machine is a guest that hands freed memory back to its host (virtio
/// balloon free page reporting): memory touched again after a large free then faults
/// on the host too, so allocation-heavy benchmarks run in fast and slow episodes.
fn page_reporting_check(order: Option<u32>, balloons: usize) -> Check {
    match order {
        Some(order) if balloons > 0 => check(
            "free page reporting",
            Status::Degraded,
            format!("on (order {order}, {balloons} balloon device(s))"),
            "this guest returns freed memory to its host: fresh memory after large frees also faults on the host, \
             so allocation-heavy benchmarks show slow episodes",
        ),
        _ => check("free page reporting", Status::Ok, "off", "freed memory stays with this machine"),
    }
}

/// A DAMON scheme running on this machine: its monitoring operations (`vaddr`,
/// `paddr`), its action, and how long a region must have been idle for it to act.
#[derive(Debug, Clone, PartialEq)]
struct DamonScheme {
    ops: String,
    action: String,
    min_idle_s: f64,
}

/// The schemes of every DAMON context that is on, from DAMON's sysfs interface; Err
/// (the file and why) when a kdamond's state cannot be read: its files are root's,
/// mode 0600, and a user who cannot read them cannot tell whether DAMON reclaims.
fn damon_schemes() -> Result<Vec<DamonScheme>, String> {
    let root = std::path::Path::new("/sys/kernel/mm/damon/admin/kdamonds");
    let dirs = |p: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut out = Vec::new();
    for k in dirs(root) {
        let state = k.join("state");
        match std::fs::read_to_string(&state) {
            Ok(s) if s.trim() == "on" => {}
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", state.display())),
        }
        for c in dirs(&k.join("contexts")) {
            let ops = read_trim(c.join("operations")).unwrap_or_default();
            let attrs = c.join("monitoring_attrs/intervals");
            let aggr_us: f64 = read_trim(attrs.join("aggr_us")).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            for sc in dirs(&c.join("schemes")) {
                let Some(action) = read_trim(sc.join("action")) else { continue };
                let age: f64 = read_trim(sc.join("access_pattern/age/min")).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                out.push(DamonScheme { ops: ops.clone(), action, min_idle_s: age * aggr_us / 1e6 });
            }
        }
    }
    Ok(out)
}

/// DAMON schemes that reclaim memory on their own (`pageout`, `lru_deprio`) move pages
/// a program has not touched for a while, whatever the program knows about them.
fn damon_check(schemes: &Result<Vec<DamonScheme>, String>) -> Check {
    let schemes = match schemes {
        Ok(s) => s,
        // Not "OK, off": root may see a scheme paging out idle memory here.
        Err(why) => {
            return check(
                "DAMON",
                Status::Degraded,
                format!("unknown ({why})"),
                "DAMON's settings are readable by root only: whether the kernel pages out idle memory on its own \
                 (which would slow a benchmark touching long-idle pages) cannot be seen; run advm doctor as root",
            )
        }
    };
    let acting: Vec<String> = schemes
        .iter()
        .filter(|s| s.action == "pageout" || s.action == "lru_deprio")
        .map(|s| format!("{} on {} after {:.0} s idle", s.action, s.ops, s.min_idle_s))
        .collect();
    if acting.is_empty() {
        let value = if schemes.is_empty() {
            "off".to_string()
        } else {
            format!("{} scheme(s), none reclaiming", schemes.len())
        };
        return check("DAMON", Status::Ok, value, "the kernel reclaims only under memory pressure");
    }
    check(
        "DAMON",
        Status::Degraded,
        acting.join("; "),
        "the kernel pages out memory idle that long on its own (to swap when there is swap): \
         long-idle pages of a benchmark may be out when it touches them again",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damon_is_a_warning_only_when_a_scheme_reclaims() {
        let s = |action: &str| DamonScheme { ops: "paddr".into(), action: action.into(), min_idle_s: 60.0 };
        assert_eq!(damon_check(&Ok(vec![])).status, Status::Ok);
        assert_eq!(damon_check(&Ok(vec![s("stat")])).status, Status::Ok);
        let c = damon_check(&Ok(vec![s("stat"), s("pageout")]));
        assert_eq!(c.status, Status::Degraded);
        assert!(c.value.contains("pageout on paddr after 60 s idle"), "{}", c.value);
        // Unreadable (a user who is not root): unknown, never "OK, off".
        let c = damon_check(&Err("state: Permission denied (os error 13)".into()));
        assert_eq!(
            (c.status, c.value.as_str()),
            (Status::Degraded, "unknown (state: Permission denied (os error 13))")
        );
    }

    #[test]
    fn parses_versions_and_selectors() {
        assert_eq!(parse_version("6.18.44-fc-v782"), (6, 18));
        assert_eq!(parse_version("5.10.0-28-amd64"), (5, 10));
        assert_eq!(bracketed("always [madvise] never"), "madvise");
    }

    #[test]
    fn free_page_reporting_is_a_warning_only_with_a_balloon_to_report_to() {
        assert_eq!(page_reporting_check(Some(9), 1).status, Status::Degraded);
        assert!(page_reporting_check(Some(9), 1).value.contains("order 9"));
        assert_eq!(page_reporting_check(Some(9), 0).status, Status::Ok);
        assert_eq!(page_reporting_check(None, 1).status, Status::Ok);
    }

    #[test]
    fn report_names_each_feature_once() {
        let r = report();
        let mut names: Vec<_> = r.iter().map(|c| c.name).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(names.contains(&"uffd MOVE") && names.contains(&"pagemap PFNs"));
    }
}
