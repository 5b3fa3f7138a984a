//! Physical memory accounting: every page the measured processes hold, each once.
//!
//! RSS counts a page once per mapping, so a page shared at many addresses (a virtual
//! copy, a KSM-merged page) is counted many times. This module reads the
//! virtual-to-physical map of each process from /proc/PID/pagemap and counts
//! **distinct physical pages**: a page mapped at several addresses, or in several of the
//! measured processes, counts once (the mmapcopy paper's meter, section 5.2). To those
//! it adds the pages **held, not mapped**: resident pages of shmem objects (memfds,
//! tmpfs files) the processes have open or mapped but do not map at the moment, such
//! as an arena's memfd pages after a virtual copy tore the page tables down (see
//! `held.rs`). It also reports RSS, PSS and USS from /proc/PID/smaps_rollup, the KSM
//! counters and ksmd's CPU time (from `crate::ksm`).
//!
//! Without CAP_SYS_ADMIN the kernel hides PFNs (they read as 0); the sample then says
//! so (`pfn_visible: false`) and `physical_bytes` falls back to PSS (plus held pages).

pub mod cgroup;
mod held;
pub mod mappings;
mod proc_files;
mod watch;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use procfs::process::{MMapPath, Process};
use serde::Serialize;

use crate::sys::fs::procfd;
use crate::sys::pagemap::{category, Entry, Pagemap, Region};
use crate::sys::SysError;
use crate::{Error, Result};
use held::Objects;

use crate::ksm::{self, ksmd_cpu_seconds};
pub use watch::{watch, Aggregate, WatchSummary};

/// How to measure.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Pretend PFNs are hidden, as they are without CAP_SYS_ADMIN (for tests and for
    /// comparing the fallback with the real count).
    pub hide_pfns: bool,
    /// Read whole VMAs from pagemap instead of asking `PAGEMAP_SCAN` for present runs
    /// first (for comparison and for kernels before 6.7, where it is automatic).
    pub no_scan: bool,
    /// Count mapped pages only, as the mmapcopy paper does: skip the pages of shmem
    /// objects held but not mapped (and the walk of /proc/PID/fd that finds them).
    pub mapped_only: bool,
    /// Count resident pages of held objects with `mincore` instead of `cachestat`
    /// (for comparison, and what kernels before 6.5 get automatically).
    pub no_cachestat: bool,
}

/// Distinct physical pages by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PageCounts {
    /// All distinct pages (anon + shmem + file).
    pub total: u64,
    /// Private anonymous pages (including KSM-merged and copy-on-write copies).
    pub anon: u64,
    /// Shared memory pages: memfd, shared anonymous, SysV.
    pub shmem: u64,
    /// Page-cache pages of regular files.
    pub file: u64,
}

/// Per-process figures of one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessFigures {
    /// The pid.
    pub pid: i32,
    /// Short command name.
    pub comm: String,
    /// Number of VMAs (lines of /proc/PID/maps).
    pub vmas: u64,
    /// Present pages counted once per mapping (what RSS counts), from pagemap.
    pub mapped_pages: u64,
    /// Distinct physical pages of this process alone (None when PFNs are hidden).
    pub distinct_pages: Option<u64>,
    /// Pages of shmem objects this process alone holds (open or mapped) but does not map.
    pub held_pages: u64,
    /// RSS from smaps_rollup.
    pub rss_bytes: u64,
    /// PSS from smaps_rollup.
    pub pss_bytes: u64,
    /// USS (Private_Clean + Private_Dirty) from smaps_rollup.
    pub uss_bytes: u64,
    /// Swapped out, from smaps_rollup.
    pub swap_bytes: u64,
    /// /proc/PID/ksm_stat, when the kernel has it.
    pub ksm_stat: BTreeMap<String, i64>,
}

/// One measurement of one or more processes.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Base page size.
    pub page_size_bytes: u64,
    /// False when PFNs read as 0 (no CAP_SYS_ADMIN) or were hidden on request.
    pub pfn_visible: bool,
    /// Distinct mapped physical pages across all listed processes (None when PFNs
    /// hidden): the mmapcopy paper's figure.
    pub distinct: Option<PageCounts>,
    /// Resident pages of shmem objects (memfd, tmpfs, shared anonymous, SysV) the
    /// processes have open or mapped that no listed process maps now, each counted
    /// once ("held, not mapped").
    pub held_pages: u64,
    /// Pages of those shmem objects in swap (not in `physical_bytes`; 0 when only
    /// mincore could be asked, which cannot see swap).
    pub held_swapped_pages: u64,
    /// Distinct shmem objects the processes have open or mapped.
    pub shmem_objects: u64,
    /// Of those, objects that could not be reopened to count their pages (no
    /// permission, or closed mid-sample): their held pages are missing.
    pub shmem_objects_unread: u64,
    /// Best figure of physical memory: (distinct mapped pages + held pages) x page
    /// size, or the summed PSS plus held pages when PFNs are hidden.
    pub physical_bytes: u64,
    /// Which figure `physical_bytes` is: "distinct_pfns" or "pss".
    pub physical_source: &'static str,
    /// The anonymous and shmem part of `physical_bytes`: distinct anon and shmem
    /// pages plus held pages, without page cache of regular files (what a memory
    /// cgroup charges as anon + shmem). With hidden PFNs, USS plus held pages.
    pub anon_shmem_bytes: u64,
    /// Present pages summed over mappings and processes (RSS in pages, from pagemap).
    pub mapped_pages: u64,
    /// Mappings of the shared zero page (not counted as distinct pages).
    pub zero_page_mappings: u64,
    /// Pages in swap.
    pub swapped_pages: u64,
    /// Sum of RSS.
    pub rss_bytes: u64,
    /// Sum of PSS.
    pub pss_bytes: u64,
    /// Sum of USS.
    pub uss_bytes: u64,
    /// Each process.
    pub processes: Vec<ProcessFigures>,
    /// System-wide KSM counters (None without KSM).
    pub ksm: Option<ksm::System>,
    /// ksmd's total CPU time (user + system), seconds.
    pub ksmd_cpu_seconds: Option<f64>,
    /// How long this sample took to take.
    pub measure_ms: f64,
}

struct Target {
    pid: i32,
    process: Process,
    /// The /proc/PID directory, for the fd/ and map_files/ links.
    dir: OwnedFd,
    pagemap: Pagemap,
}

/// A reusable measurer of a fixed set of processes. Buffers are kept between samples,
/// and each process is pinned by a /proc/PID directory fd so a recycled pid is never
/// measured by mistake.
pub struct Meter {
    targets: Vec<Target>,
    options: Options,
    zero_pfn: Option<u64>,
    scan_works: bool,
    entries: Vec<u64>,
    regions: Vec<Region>,
    /// (pfn << 2 | kind) of every present page of the current sample.
    pfns: Vec<u64>,
    /// Shmem objects of the current sample.
    objects: Objects,
    cachestat_works: bool,
}

const CHUNK_PAGES: usize = 64 * 1024;
const KIND_ANON: u64 = 0;
const KIND_SHMEM: u64 = 1;
const KIND_FILE: u64 = 2;

fn open_error(pid: i32, what: &str, e: procfs::ProcError) -> Error {
    match e {
        procfs::ProcError::NotFound(_) => Error::NoSuchProcess { pid },
        procfs::ProcError::PermissionDenied(_) => Error::PermissionDenied { pid, what: what.to_string() },
        procfs::ProcError::Io(e, _) if e.raw_os_error() == Some(libc::ESRCH) => Error::NoSuchProcess { pid },
        other => Error::io(format!("/proc/{pid}/{what}"), std::io::Error::other(other.to_string())),
    }
}

/// Whether `process` is a kernel thread (`PF_KTHREAD` in its flags).
pub(crate) fn is_kernel_thread(process: &Process) -> bool {
    const PF_KTHREAD: u32 = 0x0020_0000;
    process.stat().is_ok_and(|s| s.flags & PF_KTHREAD != 0)
}

/// Why `process`, which is there, has no address space to measure: a kernel thread,
/// or a zombie (exited, not yet reaped); `None` when it has one.
pub(crate) fn without_memory(pid: i32, process: &Process) -> Option<Error> {
    if is_kernel_thread(process) {
        Some(Error::KernelThread { pid })
    } else if process.stat().is_ok_and(|s| s.state == 'Z') {
        Some(Error::Zombie { pid })
    } else {
        None
    }
}

/// A refused /proc/PID/`what` as [`Error::PermissionDenied`], other failures as they are.
fn permission_or(pid: i32, what: &str, e: SysError) -> Error {
    match e.errno {
        rustix::io::Errno::ACCESS | rustix::io::Errno::PERM => Error::PermissionDenied { pid, what: what.to_string() },
        _ => e.into(),
    }
}

/// Opens the pagemap of the mm `process` has now (relative to its /proc/PID fd).
fn open_pagemap(pid: i32, process: &Process) -> Result<Pagemap> {
    let file = process.open_relative("pagemap").map_err(|e| open_error(pid, "pagemap", e))?;
    Ok(Pagemap::from_file(file))
}

impl Meter {
    /// Opens the processes `pids` for measurement.
    pub fn new(pids: &[i32], options: Options) -> Result<Self> {
        if pids.is_empty() {
            return Err(Error::InvalidArgument { what: "pid list", why: "no process given".into() });
        }
        let mut targets = Vec::with_capacity(pids.len());
        let mut seen = std::collections::HashSet::new();
        for &pid in pids {
            if pid <= 0 {
                return Err(Error::NoSuchProcess { pid });
            }
            let process = Process::new(pid).map_err(|e| open_error(pid, "", e))?;
            // A process listed twice, or beside one of its threads' ids (/proc/TID shows
            // the same memory), is measured once: its RSS, PSS and USS were summed twice.
            if !seen.insert(process.status().map_or(pid, |s| s.tgid)) {
                continue;
            }
            let pagemap = open_pagemap(pid, &process).map_err(|e| match e {
                // a kernel thread or zombie has no mm: its pagemap cannot be opened (ESRCH
                // for root; EACCES for other users, whose ptrace check fails without one)
                Error::NoSuchProcess { .. } | Error::PermissionDenied { .. } => {
                    without_memory(pid, &process).unwrap_or(e)
                }
                e => e,
            })?;
            let dir = process.open_relative(".").map_err(|e| open_error(pid, "", e))?.into();
            targets.push(Target { pid, process, dir, pagemap });
        }
        Ok(Self {
            targets,
            zero_pfn: crate::sys::pagemap::zero_pfn(),
            scan_works: !options.no_scan,
            cachestat_works: !options.no_cachestat,
            objects: Objects::default(),
            options,
            entries: vec![0; CHUNK_PAGES],
            regions: vec![Region::default(); 4096],
            pfns: Vec::new(),
        })
    }

    /// Opens the calling process.
    pub fn for_self(options: Options) -> Result<Self> {
        Self::new(&[std::process::id() as i32], options)
    }

    /// The pids measured.
    pub fn pids(&self) -> Vec<i32> {
        self.targets.iter().map(|t| t.pid).collect()
    }

    /// Takes one sample of all processes.
    pub fn sample(&mut self) -> Result<Sample> {
        let started = Instant::now();
        let ps = crate::sys::page_size() as u64;
        self.pfns.clear();
        self.objects.clear();
        let mut totals = Tally { pfn_visible: true, ..Default::default() };
        let mut processes = Vec::with_capacity(self.targets.len());
        for i in 0..self.targets.len() {
            let first = self.pfns.len();
            let (offsets_mark, held_mark) = (self.objects.mark(), self.objects.held_mark());
            let t = match self.walk_target(i) {
                Err(Error::Sys(e)) if e.errno == rustix::io::Errno::SRCH && self.targets[i].process.is_alive() => {
                    // The process exec'd: its old mm, which the pagemap fd pins, is gone.
                    self.pfns.truncate(first);
                    self.objects.truncate(offsets_mark, held_mark);
                    let target = &mut self.targets[i];
                    target.pagemap = open_pagemap(target.pid, &target.process)?;
                    self.walk_target(i)?
                }
                r => r?,
            };
            let pid = self.targets[i].pid;
            let process = &self.targets[i].process;
            let exited = |e| if process.is_alive() { e } else { Error::ProcessExited { pid } };
            if !self.options.mapped_only {
                self.objects
                    .scan_fds(i, self.targets[i].dir.as_fd())
                    .map_err(|e| exited(permission_or(pid, "fd", e)))?;
            }
            self.objects.end_target(i, offsets_mark, held_mark);
            let rollup = proc_files::smaps_rollup(process).map_err(exited)?;
            let own = &mut self.pfns[first..];
            own.sort_unstable();
            let own_distinct = dedup_count(own).total;
            processes.push(ProcessFigures {
                pid,
                comm: process.stat().map(|s| s.comm).unwrap_or_default(),
                vmas: t.vmas,
                mapped_pages: t.mapped,
                distinct_pages: t.pfn_visible.then_some(own_distinct),
                held_pages: 0,
                rss_bytes: rollup.rss_bytes,
                pss_bytes: rollup.pss_bytes,
                uss_bytes: rollup.uss_bytes,
                swap_bytes: rollup.swap_bytes,
                ksm_stat: proc_files::ksm_stat(process),
            });
            totals.add(&t);
        }
        let dirs: Vec<BorrowedFd<'_>> = self.targets.iter().map(|t| t.dir.as_fd()).collect();
        self.objects.measure(&dirs, &mut self.cachestat_works);
        for (i, p) in processes.iter_mut().enumerate() {
            p.held_pages = self.objects.target_held(i);
        }
        let held = self.objects.totals();
        self.pfns.sort_unstable();
        let counts = dedup_count(&self.pfns);
        let pss: u64 = processes.iter().map(|p| p.pss_bytes).sum();
        let uss: u64 = processes.iter().map(|p| p.uss_bytes).sum();
        let visible = totals.pfn_visible && !self.options.hide_pfns;
        Ok(Sample {
            page_size_bytes: ps,
            pfn_visible: visible,
            distinct: visible.then_some(counts),
            held_pages: held.held,
            held_swapped_pages: held.swapped,
            shmem_objects: held.objects,
            shmem_objects_unread: held.unread,
            physical_bytes: if visible { (counts.total + held.held) * ps } else { pss + held.held * ps },
            physical_source: if visible { "distinct_pfns" } else { "pss" },
            anon_shmem_bytes: if visible {
                (counts.anon + counts.shmem + held.held) * ps
            } else {
                uss + held.held * ps
            },
            mapped_pages: totals.mapped,
            zero_page_mappings: totals.zero,
            swapped_pages: totals.swapped,
            rss_bytes: processes.iter().map(|p| p.rss_bytes).sum(),
            pss_bytes: pss,
            uss_bytes: uss,
            processes,
            ksm: ksm::system(),
            ksmd_cpu_seconds: ksmd_cpu_seconds(),
            measure_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Which kind the file-or-shared pages of `vma` are, and the shmem object it maps
    /// (noted for target `i`), if it maps one.
    fn vma_kind(&mut self, i: usize, vma: &procfs::process::MemoryMap) -> (u64, Option<u32>) {
        if vma.inode == 0 {
            // vdso, vvar and the like: kernel pages, nobody's memory.
            return (KIND_FILE, None);
        }
        let (start, end) = vma.address;
        let link = format!("map_files/{start:x}-{end:x}");
        let dev = procfd::dev_of(vma.dev.0 as u32, vma.dev.1 as u32);
        let dir = self.targets[i].dir.as_fd();
        let shmem = match (&vma.pathname, self.objects.is_shmem_dev(dir, dev, &link)) {
            (_, Some(known)) => known,
            // map_files needs CAP_SYS_ADMIN: without it, judge by the name.
            (MMapPath::Path(p), None) => is_shmem_path(&p.to_string_lossy()),
            (MMapPath::Vsys(_), None) => true,
            _ => false,
        };
        if !shmem {
            return (KIND_FILE, None);
        }
        let id = if self.options.mapped_only {
            None
        } else {
            self.objects
                .note(i, dev, vma.inode, &link, false, || procfd::stat_link(dir, &link).map(|f| f.size).unwrap_or(0))
        };
        (KIND_SHMEM, id)
    }

    /// Walks every VMA of target `i`, appending its present PFNs to `self.pfns`.
    fn walk_target(&mut self, i: usize) -> Result<Tally> {
        let pid = self.targets[i].pid;
        let alive_or_exited =
            |process: &Process, e: Error| if process.is_alive() { e } else { Error::ProcessExited { pid } };
        let maps = {
            let process = &self.targets[i].process;
            process.maps().map_err(|e| alive_or_exited(process, open_error(pid, "maps", e)))?
        };
        let ps = crate::sys::page_size() as u64;
        let mut tally = Tally { pfn_visible: true, ..Default::default() };
        let mut any_present = false;
        let mut any_pfn = false;
        for vma in maps.iter() {
            tally.vmas += 1;
            if matches!(vma.pathname, MMapPath::Vsyscall) {
                continue;
            }
            let (kind_if_shared, object) = self.vma_kind(i, vma);
            let (start, end) = vma.address;
            // Page offset in the object of the page at virtual page 0 (may wrap; only
            // differences within the VMA are used).
            let page_base = (vma.offset / ps).wrapping_sub(start / ps);
            let mut runs = Vec::new();
            if self.scan_works {
                match self.present_runs(i, start, end, &mut runs) {
                    Ok(()) => {}
                    Err(e) if e.errno == rustix::io::Errno::NOTTY || e.errno == rustix::io::Errno::INVAL => {
                        self.scan_works = false;
                        runs.clear();
                        runs.push(Region { start, end, categories: 0 });
                    }
                    Err(e) => return Err(alive_or_exited(&self.targets[i].process, e.into())),
                }
            } else {
                runs.push(Region { start, end, categories: 0 });
            }
            for run in runs {
                let mut vpn = run.start / ps;
                let end_vpn = run.end / ps;
                while vpn < end_vpn {
                    let want = ((end_vpn - vpn) as usize).min(CHUNK_PAGES);
                    let got = self.targets[i]
                        .pagemap
                        .read(vpn, &mut self.entries[..want])
                        .map_err(|e| alive_or_exited(&self.targets[i].process, e.into()))?;
                    if got == 0 {
                        // The mm our pagemap fd pins is gone: the process exited, or it
                        // is alive and exec'd (sample() then reopens pagemap).
                        let gone = SysError::new("pread(/proc/PID/pagemap)", rustix::io::Errno::SRCH);
                        return Err(alive_or_exited(&self.targets[i].process, gone.into()));
                    }
                    for (k, &raw) in self.entries[..got].iter().enumerate() {
                        let e = Entry(raw);
                        if e.swapped() {
                            tally.swapped += 1;
                        }
                        let Some(pfn) = e.pfn() else { continue };
                        any_present = true;
                        if Some(pfn) == self.zero_pfn && pfn != 0 {
                            tally.zero += 1;
                            continue;
                        }
                        tally.mapped += 1;
                        if pfn != 0 {
                            any_pfn = true;
                        }
                        let kind = if e.file_or_shared() { kind_if_shared } else { KIND_ANON };
                        self.pfns.push(pfn << 2 | kind);
                        if let (Some(id), true) = (object, e.file_or_shared()) {
                            // The object's own page (a private copy would not have the
                            // file/shared bit): counted here, not as held.
                            self.objects.mapped(id, page_base.wrapping_add(vpn + k as u64));
                        }
                    }
                    vpn += got as u64;
                }
            }
        }
        tally.pfn_visible = any_pfn || !any_present;
        Ok(tally)
    }

    /// Fills `runs` with the runs of present pages in `[start, end)` via PAGEMAP_SCAN.
    fn present_runs(&mut self, i: usize, start: u64, end: u64, runs: &mut Vec<Region>) -> crate::sys::SysResult<()> {
        let mut at = start;
        while at < end {
            let (n, walk_end) = self.targets[i].pagemap.scan(
                at,
                end,
                category::PRESENT | category::SWAPPED,
                category::PRESENT | category::SWAPPED,
                &mut self.regions,
            )?;
            runs.extend_from_slice(&self.regions[..n]);
            if walk_end <= at {
                break;
            }
            at = walk_end;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Tally {
    vmas: u64,
    mapped: u64,
    zero: u64,
    swapped: u64,
    pfn_visible: bool,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.vmas += other.vmas;
        self.mapped += other.mapped;
        self.zero += other.zero;
        self.swapped += other.swapped;
        self.pfn_visible &= other.pfn_visible;
    }
}

/// memfd, shared anonymous (`/dev/zero (deleted)`) and SysV segments are shmem.
fn is_shmem_path(p: &str) -> bool {
    p.starts_with("/memfd:") || p.starts_with("/dev/zero") || p.starts_with("/SYSV") || p.starts_with("/dev/shm/")
}

/// Counts distinct PFNs in a sorted slice of `pfn << 2 | kind`; a page's kind is taken
/// from its first occurrence.
fn dedup_count(sorted: &[u64]) -> PageCounts {
    let mut c = PageCounts::default();
    let mut last = None;
    for &v in sorted {
        let pfn = v >> 2;
        if last == Some(pfn) {
            continue;
        }
        last = Some(pfn);
        c.total += 1;
        match v & 3 {
            KIND_ANON => c.anon += 1,
            KIND_SHMEM => c.shmem += 1,
            _ => c.file += 1,
        }
    }
    c
}

/// Measures `pids` once.
pub fn measure(pids: &[i32], options: Options) -> Result<Sample> {
    Meter::new(pids, options)?.sample()
}

/// Measures the calling process once.
pub fn measure_self() -> Result<Sample> {
    Meter::for_self(Options::default())?.sample()
}

/// The physical frame of each page of `range` in this process: `Some(pfn)` for a
/// present page, `None` for one not in memory (or when the kernel hides PFNs: see
/// [`crate::probe::Facts::pfn_visible`]). Reads pagemap only; faults nothing in.
pub fn page_frames(range: crate::mem::PageRange) -> Result<Vec<Option<u64>>> {
    let ps = crate::mem::page_size();
    let pm = Pagemap::open("self")?;
    let mut raw = vec![0u64; range.pages()];
    let mut done = 0;
    while done < raw.len() {
        let n = pm.read((range.start().0 / ps + done) as u64, &mut raw[done..])?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(raw.into_iter().map(|e| Entry(e).pfn().filter(|&p| p != 0)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_counts_each_pfn_once_by_kind() {
        let mut v =
            vec![5 << 2 | KIND_ANON, 7 << 2 | KIND_SHMEM, 5 << 2 | KIND_ANON, 9 << 2 | KIND_FILE, 7 << 2 | KIND_SHMEM];
        v.sort_unstable();
        assert_eq!(dedup_count(&v), PageCounts { total: 3, anon: 1, shmem: 1, file: 1 });
        assert_eq!(dedup_count(&[]), PageCounts::default());
    }

    #[test]
    fn shmem_paths() {
        assert!(is_shmem_path("/memfd:advm-arena (deleted)"));
        assert!(is_shmem_path("/dev/zero (deleted)"));
        assert!(!is_shmem_path("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    }

    /// A kernel thread (kthreadd, pid 2, where it is visible) has no user memory: the
    /// error says so, not that the process does not exist.
    #[test]
    fn a_kernel_thread_is_named_as_one() {
        let Some(pid) = (2..64).find(|&p| Process::new(p).is_ok_and(|pr| is_kernel_thread(&pr))) else {
            eprintln!("skipped: no kernel thread visible in /proc here (a pid namespace)");
            return;
        };
        let want = format!("process {pid} is a kernel thread: it has no user memory to measure");
        assert_eq!(measure(&[pid], Options::default()).expect_err("a kernel thread").to_string(), want);
        assert_eq!(mappings::mapping_frames(pid).expect_err("a kernel thread").to_string(), want);
        assert!(!is_kernel_thread(&Process::myself().expect("self")));
    }

    /// The same for a user who may not read the thread's pagemap (uid 65534 when the
    /// tests run as root): it was told "permission denied reading pagemap".
    #[test]
    fn a_kernel_thread_is_named_as_one_to_other_users_too() {
        let Some(pid) = (2..64).find(|&p| Process::new(p).is_ok_and(|pr| is_kernel_thread(&pr))) else {
            eprintln!("skipped: no kernel thread visible in /proc here (a pid namespace)");
            return;
        };
        let want = format!("process {pid} is a kernel thread: it has no user memory to measure");
        let code = crate::sys::process::run_unprivileged(|| {
            let got = measure(&[pid], Options::default()).map(|_| ()).map_err(|e| e.to_string());
            if got == Err(want.clone()) {
                0
            } else {
                eprintln!("got {got:?}");
                1
            }
        })
        .unwrap();
        assert_eq!(code, 0);
    }

    /// A process listed twice, or with a thread's id beside its own, counts once.
    #[test]
    fn a_process_listed_twice_is_measured_once() {
        let me = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // /proc/thread-self links to "PID/task/TID"
            let link = std::fs::read_link("/proc/thread-self").unwrap();
            tx.send(link.file_name().unwrap().to_str().unwrap().parse::<i32>().unwrap()).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let once = measure(&[me], Options::default()).unwrap();
        let twice = measure(&[me, me, tid], Options::default()).unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(twice.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [me]);
        // the same process a moment later: within 25% (the test's own allocations)
        assert!(twice.rss_bytes < once.rss_bytes * 5 / 4, "{} against {}", twice.rss_bytes, once.rss_bytes);
    }

    /// A zombie (exited, not reaped) is named as one, not as a process that does not
    /// exist.
    #[test]
    fn a_zombie_is_named_as_one() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id() as i32;
        let t = std::time::Instant::now();
        while !Process::new(pid).is_ok_and(|p| p.stat().is_ok_and(|s| s.state == 'Z')) {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let got = measure(&[pid], Options::default()).expect_err("a zombie").to_string();
        child.wait().expect("reap");
        assert_eq!(
            got,
            format!(
                "process {pid} has exited and is not yet reaped by its parent (a zombie): it has no memory to measure"
            )
        );
    }
}
