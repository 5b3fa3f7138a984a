//! `advm bench vm-fill`: how many VMs fit in a memory budget, for real. Under each method
//! (`blk`, `blk-ksm`, `pmem`, `pmem-merge`) VMs booting the chain of `advm vm image build` start one
//! by one in one memory cgroup whose limit is the budget, until one does not come up,
//! one that ran stops answering, or the group's OOM killer fires. After each VM that
//! came up (and a settling pause) both meters are read: the group's anon + shmem + page
//! cache, and the distinct pages of all its processes, broken down by what holds them
//! (`advm::stats::mappings`): guest RAM, the emulator's translation buffer, the pmem
//! device (private pages, and the image pages it maps), QEMU's own memory; beside
//! them each guest's page cache (its /proc/meminfo) and the image layers' pages in the
//! host's page cache. Optionally writes an SVG of memory against N per method.
//! Under `pmem-merge` an advmd (`advm daemon`) runs in the budget's group too: the
//! merged guest RAM's store is charged to it, inside the budget.
//!
//! Settings (environment, with defaults): ADVM_VM_IMAGE (the built chain),
//! ADVM_VM_BUDGET_MIB (1536), ADVM_VM_MEM_MIB (guest RAM, 128), ADVM_VM_TB_MIB (the
//! translation buffer, 16), ADVM_VM_MAX (16; `--quick`: 2), ADVM_VM_METHODS
//! (`blk,blk-ksm,pmem,pmem-merge`), ADVM_VM_ASLR (0: guests boot with `--no-aslr`;
//! 1: randomised), ADVM_VM_TIMEOUT_S (300: a VM that has not answered by then did not
//! fit), ADVM_VM_MERGE_SCOPE (`--merge-scope` of pmem-merge's VMs), ADVM_VM_BOOT_LOOKUP
//! (`--boot-lookup-every` of pmem-merge's VMs), ADVM_VM_SVG (where to write the plot). ADVM_VM_PLOT_FROM
//! (a saved report of this bench) only draws that report's plot. ADVM_VM_PARTIAL
//! (default `$TMPDIR/advm-vm-fill-PID.json`): after every point the report so far is
//! written there (JSON) and beside it as a table (`.txt`), so a run that is killed keeps
//! its figures.
//!
//! SIGTERM, SIGINT and SIGHUP stop a fill cleanly: every process in the method's
//! group (VMs, advmd) gets SIGTERM, the group is removed, the partial report says where
//! it stopped, and the bench ends with an error (`interrupted`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use advm::stats::cgroup::Group;
use advm::stats::mappings::{file_cached_pages, mapping_frames, MappingFrames};
use advm::stats::{measure, Options};

use super::vm::{method_args, read_merged, Advmd, Merged};
use super::{Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::BenchError;

/// See the module doc.
pub struct VmFillBench;

const MIB: f64 = (1u64 << 20) as f64;

fn env_u64(name: &str, default: u64) -> Result<u64, BenchError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v.parse().map_err(|_| BenchError::Usage(format!("{name}={v:?}: expected a whole number"))),
    }
}

struct Settings {
    image: PathBuf,
    budget_mib: u64,
    mem_mib: u64,
    tb_mib: u64,
    max: usize,
    methods: Vec<String>,
    svg: Option<PathBuf>,
    aslr: bool,
    /// How long a VM may take to answer before it counts as not fitting, s.
    timeout_s: u64,
    /// `--merge-scope` of the pmem-merge VMs (unset: `advm vm run`'s default).
    merge_scope: Option<String>,
    /// `--boot-lookup-every` of the pmem-merge VMs (unset: `advm vm run`'s default).
    boot_lookup: Option<String>,
    /// Where the report so far is written after every point (and `.txt`: its table).
    partial: PathBuf,
}

impl Settings {
    fn from_env(quick: bool) -> Result<Self, BenchError> {
        let methods = super::vm::methods()?;
        Ok(Self {
            image: super::vm::image()?,
            budget_mib: env_u64("ADVM_VM_BUDGET_MIB", 1536)?,
            mem_mib: env_u64("ADVM_VM_MEM_MIB", 128)?,
            tb_mib: env_u64("ADVM_VM_TB_MIB", 16)?,
            max: env_u64("ADVM_VM_MAX", if quick { 2 } else { 16 })? as usize,
            methods,
            svg: std::env::var_os("ADVM_VM_SVG").map(PathBuf::from),
            aslr: super::vm::aslr()?,
            timeout_s: env_u64("ADVM_VM_TIMEOUT_S", 300)?.max(1),
            merge_scope: std::env::var("ADVM_VM_MERGE_SCOPE").ok(),
            boot_lookup: std::env::var("ADVM_VM_BOOT_LOOKUP").ok(),
            partial: std::env::var_os("ADVM_VM_PARTIAL")
                .map(PathBuf::from)
                .unwrap_or_else(|| std::env::temp_dir().join(format!("advm-vm-fill-{}.json", std::process::id()))),
        })
    }
}

struct Vm {
    child: Child,
    port: u16,
    ready_s: f64,
    merged: Option<Merged>,
}

/// Writes `report` as it stands to `path` (JSON) and its table beside it (`.txt`),
/// each through a temporary file renamed into place, so a reader (or a run killed
/// meanwhile) sees a whole report.
fn write_partial(path: &Path, report: &Report) -> Result<(), BenchError> {
    let json = serde_json::to_string_pretty(report).expect("reports serialize");
    for (to, text) in [(path.to_path_buf(), json), (path.with_extension("txt"), report.text())] {
        let tmp = to.with_extension("partial-tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &to))
            .map_err(|e| BenchError::Io(to.display().to_string(), e))?;
    }
    Ok(())
}

/// While alive, a thread that, once a stopping signal has come (`stop`), sends SIGTERM
/// to every process in `group` (VMs starting or running, advmd) until it is empty: the
/// fill, blocked on a VM's output or sleeping, then sees its VMs end and cleans up.
struct StopWatch {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StopWatch {
    fn start(stop: Arc<advm::process::StopSignals>, group: PathBuf) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            while !d.load(Ordering::Relaxed) {
                if stop.received().is_some() {
                    // none when the group has gone
                    let pids = Group::open(&group).and_then(|g| g.pids()).unwrap_or_default();
                    for pid in pids.into_iter().filter_map(|p| u32::try_from(p).ok()) {
                        let _ = advm::process::terminate(pid);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { done, thread: Some(thread) }
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The error a fill stopped by signal `sig` ends with.
fn interrupted(sig: i32, method: &str, n: usize) -> BenchError {
    let name = match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    };
    BenchError::Interrupted(format!(
        "{name} during the {method} fill with {n} VM(s) up; VMs, advmd and the group stopped"
    ))
}

/// One HTTP GET: the body of a 200 answer.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
}

/// A guest's page cache (`Cached` of its /proc/meminfo), bytes.
fn guest_cached(port: u16) -> Option<u64> {
    let text = get(port, "/meminfo")?;
    let line = text.lines().find(|l| l.starts_with("Cached:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb << 10)
}

/// Starts `advm vm run` in `group` and waits for its `ready ... http://127.0.0.1:PORT/
/// answered after N ms` line: `Err(reason)` when it ends without one.
/// Starts `advm vm run` in `group` and waits for its `ready ... http://127.0.0.1:PORT/
/// answered after N ms` line (and under `pmem-merge` its `merged:` line): `Err(reason)`
/// when it ends without them.
fn start(
    advm: &Path,
    s: &Settings,
    method: &str,
    group: &Group,
    advmd: Option<&Advmd>,
) -> Result<Result<Vm, String>, BenchError> {
    let mut cmd = Command::new(advm);
    cmd.args(["vm", "run", "--image"]).arg(&s.image).args(method_args(method));
    cmd.args(["--accel", "tcg", "--timeout", &s.timeout_s.to_string()]);
    if !s.aslr {
        cmd.arg("--no-aslr");
    }
    cmd.args(["--mem", &s.mem_mib.to_string(), "--tb-size", &s.tb_mib.to_string()]);
    if let Some(d) = advmd {
        cmd.env("ADVM_SOCKET", &d.socket);
        if let Some(scope) = &s.merge_scope {
            cmd.args(["--merge-scope", scope]);
        }
        if let Some(every) = &s.boot_lookup {
            cmd.args(["--boot-lookup-every", every]);
        }
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    group.join_at_exec(&mut cmd)?;
    let mut child = cmd.spawn().map_err(|e| BenchError::Io(format!("starting {} vm run", advm.display()), e))?;
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    out.read_line(&mut line).map_err(|e| BenchError::Io("advm vm run output".into(), e))?;
    let port = line.split("127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).and_then(|p| p.parse().ok());
    let ms = line.split("after ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<f64>().ok());
    let merged = if advmd.is_some() && port.is_some() { read_merged(&mut out).ok() } else { None };
    match (port, ms, merged.is_some() == advmd.is_some()) {
        (Some(port), Some(ms), true) => Ok(Ok(Vm { child, port, ready_s: ms / 1000.0, merged })),
        _ => {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let _ = child.wait();
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").to_string();
            Ok(Err(format!("did not come up: {last}")))
        }
    }
}

/// The group's OOM kills so far (cgroup v1 `memory.oom_control`, v2 `memory.events`).
fn oom_kills(group: &Group) -> u64 {
    ["memory.oom_control", "memory.events"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(group.path().join(f)).ok())
        .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}

/// Keeps the group's memory out of swap: the budget is RAM (with a swap device on the
/// host, a group at its limit would swap guest RAM out instead of failing to fit).
fn no_swap(group: &Group) -> Result<(), BenchError> {
    let (file, value) = match group.version() {
        advm::stats::cgroup::Version::V1 => ("memory.swappiness", "0"),
        advm::stats::cgroup::Version::V2 => ("memory.swap.max", "0"),
    };
    let path = group.path().join(file);
    std::fs::write(&path, value).map_err(|e| BenchError::Io(path.display().to_string(), e))
}

/// Why the VMs running are no longer all fine, if they are not.
fn trouble(vms: &mut [Vm], group: &Group, ooms_before: u64) -> Option<String> {
    let ooms = oom_kills(group);
    if ooms > ooms_before {
        return Some(format!("the OOM killer fired {} time(s) in the budget's group", ooms - ooms_before));
    }
    for (i, vm) in vms.iter_mut().enumerate() {
        if !matches!(vm.child.try_wait(), Ok(None)) {
            return Some(format!("VM {} exited", i + 1));
        }
        if get(vm.port, "/").is_none() {
            return Some(format!("VM {} stopped answering", i + 1));
        }
    }
    None
}

/// What holds a QEMU's pages, by mapping.
#[derive(Default)]
struct Parts {
    guest_ram: Vec<u64>,
    tb: Vec<u64>,
    device_private: Vec<u64>,
    device_image: Vec<u64>,
    qemu_anon: Vec<u64>,
    qemu_file: Vec<u64>,
}

impl Parts {
    /// Sorts `maps` of one QEMU into the parts: guest RAM is the read-write private
    /// memory of exactly the guest's size at consecutive addresses, anonymous or (once
    /// merged) the merge store's; the translation buffer the executable anonymous
    /// mapping of its size (less QEMU's guard page), the pmem device everything between
    /// the first and last mapping of a layer file.
    fn add(&mut self, maps: Vec<MappingFrames>, s: &Settings, layers: &[PathBuf]) {
        let is_layer = |m: &MappingFrames| layers.iter().any(|l| Path::new(&m.path) == l);
        let device = maps.iter().filter(|m| is_layer(m)).fold(None, |r: Option<(u64, u64)>, m| {
            Some(r.map_or((m.start, m.end), |(a, b)| (a.min(m.start), b.max(m.end))))
        });
        let ram = guest_ram(&maps, s.mem_mib << 20);
        for m in maps {
            let anon = m.path.is_empty();
            if device.is_some_and(|(a, b)| a <= m.start && m.end <= b) {
                self.device_private.extend(m.anon);
                self.device_image.extend(m.file);
            } else if ram.iter().any(|&(a, b)| a <= m.start && m.end <= b) {
                self.guest_ram.extend(m.anon.into_iter().chain(m.file));
            } else if anon && m.perms.starts_with("rwx") && (s.tb_mib << 20).saturating_sub(m.len()) < 1 << 20 {
                self.tb.extend(m.anon.into_iter().chain(m.file));
            } else {
                self.qemu_anon.extend(m.anon);
                self.qemu_file.extend(m.file);
            }
        }
    }
}

/// The frames the advm processes in the group (`advm vm run`, advmd) map, split into
/// their own memory (anonymous pages and private copies: what they add to the group)
/// and pages they map that are held anyway: the advm binary and libraries (page cache,
/// shared with every other advm process) and, in advmd, pages of the merge store it
/// reads (the store's shmem, counted once in the group whoever maps it).
#[derive(Default)]
struct AdvmProcesses {
    own: Vec<u64>,
    mapped: Vec<u64>,
}

impl AdvmProcesses {
    fn add(&mut self, maps: Vec<MappingFrames>) {
        for m in maps {
            self.own.extend(m.anon);
            self.mapped.extend(m.file);
        }
    }
}

/// Where guest RAM lies: a private anonymous read-write mapping of exactly `size`
/// bytes, or once merged, the last `size` bytes of a run of consecutive read-write
/// private mappings, anonymous or of a merge store (advmd's or a process's own memfd),
/// that holds a store mapping. The last: QEMU's guest RAM may follow another anonymous
/// mapping directly, but a guard page follows it.
fn guest_ram(maps: &[MappingFrames], size: u64) -> Vec<(u64, u64)> {
    let store = |m: &MappingFrames| m.path.starts_with("/memfd:advm");
    let ram_like = |m: &MappingFrames| m.perms == "rw-p" && (m.path.is_empty() || store(m));
    let mut out: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.path.is_empty() && m.perms == "rw-p" && m.len() == size)
        .map(|m| (m.start, m.end))
        .collect();
    let mut k = 0;
    while k < maps.len() {
        if !ram_like(&maps[k]) {
            k += 1;
            continue;
        }
        let first = k;
        while k + 1 < maps.len() && ram_like(&maps[k + 1]) && maps[k + 1].start == maps[k].end {
            k += 1;
        }
        let run = &maps[first..=k];
        let end = maps[k].end;
        let start = end.wrapping_sub(size);
        if run.iter().any(|m| m.start == start) && run.iter().filter(|m| m.start >= start).any(store) {
            out.push((start, end));
        }
        k += 1;
    }
    out
}

/// Distinct frames, bytes.
fn distinct_bytes(v: &mut Vec<u64>) -> f64 {
    v.sort_unstable();
    v.dedup();
    v.len() as f64 * advm::mem::page_size() as f64
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3\n");
}

/// One method's points: (N, memory of all VMs by the cgroup, same less the
/// translation buffers).
type Curve = Vec<(usize, f64, f64)>;

impl VmFillBench {
    /// Measures the `vms` running in `group`: one row.
    #[allow(clippy::too_many_arguments)]
    fn point(
        s: &Settings,
        method: &str,
        vms: &[Vm],
        group: &Group,
        layers: &[PathBuf],
        advmd: Option<&Advmd>,
        ksmd_cpu_at_start: Option<f64>,
        report: &mut Report,
    ) -> Result<(f64, f64), BenchError> {
        let n = vms.len() as f64;
        let u = group.usage()?;
        let pids = group.pids()?;
        let sample = measure(&pids, Options::default())?;
        let mut parts = Parts::default();
        let mut advm_procs = AdvmProcesses::default();
        for &pid in &pids {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let Ok(maps) = mapping_frames(pid) else { continue };
            if comm.starts_with("qemu-system") {
                parts.add(maps, s, layers);
            } else {
                advm_procs.add(maps);
            }
        }
        let ps = advm::mem::page_size() as f64;
        let image_cache: u64 = layers.iter().filter_map(|l| file_cached_pages(l).ok()).sum();
        let guest_cache: Vec<f64> = vms.iter().filter_map(|v| guest_cached(v.port)).map(|b| b as f64 / MIB).collect();
        let total = (u.anon_shmem_bytes() + u.page_cache_bytes) as f64;
        let tb = distinct_bytes(&mut parts.tb);
        if method != "blk-ksm" {
            report.meter_disagreements.extend(crate::meters::disagreement(
                &format!("{method} N={}: anon+shmem of all VMs", vms.len()),
                sample.anon_shmem_bytes as f64,
                u.anon_shmem_bytes() as f64,
            ));
        }
        let per = |b: f64| vec![b / n / MIB];
        let mut row = Row::new()
            .with("method", method)
            .with("VMs", vms.len())
            .figure(Figure::new("cgroup anon+shmem per VM", "MiB", per(u.anon_shmem_bytes() as f64)))
            .figure(Figure::new("cgroup page cache per VM", "MiB", per(u.page_cache_bytes as f64)))
            .figure(Figure::new("memory per VM", "MiB", per(total)))
            .figure(Figure::new("memory per VM less translation buffer", "MiB", per(total - tb)))
            .figure(Figure::new("distinct pages per VM", "MiB", per(sample.physical_bytes as f64)))
            .figure(Figure::new("guest RAM per VM", "MiB", per(distinct_bytes(&mut parts.guest_ram))))
            .figure(Figure::new("guest page cache", "MiB", guest_cache))
            .figure(Figure::new("translation buffer per VM", "MiB", per(tb)))
            .figure(Figure::new("pmem private per VM", "MiB", per(distinct_bytes(&mut parts.device_private))))
            .figure(Figure::new("pmem image mapped", "MiB", vec![distinct_bytes(&mut parts.device_image) / MIB]))
            .figure(Figure::new("image in host page cache", "MiB", vec![image_cache as f64 * ps / MIB]))
            .figure(Figure::new("QEMU anon per VM", "MiB", per(distinct_bytes(&mut parts.qemu_anon))))
            .figure(Figure::new("QEMU files mapped", "MiB", vec![distinct_bytes(&mut parts.qemu_file) / MIB]))
            .figure(Figure::new(
                "advm processes' own memory (vm run, advmd)",
                "MiB",
                vec![distinct_bytes(&mut advm_procs.own) / MIB],
            ))
            .figure(Figure::new(
                "advm processes' mapped files and store pages",
                "MiB",
                vec![distinct_bytes(&mut advm_procs.mapped) / MIB],
            ))
            .figure(Figure::new("boot to answer", "s", vms.iter().map(|v| v.ready_s).collect()));
        if let (Some(t0), Some(t)) = (ksmd_cpu_at_start, advm::ksm::ksmd_cpu_seconds()) {
            row = row.figure(Figure::new("ksmd CPU so far", "s", vec![t - t0]));
        }
        if let Some(d) = advmd {
            // The last VM's merge: the store held the others' pages by then.
            let last = vms.last().and_then(|v| v.merged).unwrap_or_default();
            row = row
                .figure(Figure::new("merge wall time (last VM)", "s", vec![last.wall_s]))
                .figure(Figure::new("merge CPU in QEMU (last VM)", "s", vec![last.agent_cpu_s]))
                .figure(Figure::new("advmd CPU so far", "s", vec![d.cpu_seconds()]))
                .figure(Figure::new("last VM: pages already in the store", "MiB", vec![last.merged as f64 * ps / MIB]))
                .figure(Figure::new("last VM: pages added to the store", "MiB", vec![last.added as f64 * ps / MIB]))
                .figure(Figure::new(
                    "last VM: zero pages given back",
                    "MiB",
                    vec![last.zero_dropped as f64 * ps / MIB],
                ));
        }
        report.rows.push(row);
        Ok((total, total - tb))
    }

    /// Fills the budget with VMs of `method`: the points measured and why the next VM
    /// did not fit.
    fn fill(
        s: &Settings,
        advm: &Path,
        method: &str,
        stop: &Arc<advm::process::StopSignals>,
        report: &mut Report,
    ) -> Result<(Curve, String), BenchError> {
        let layers: Vec<PathBuf> = advm::image::Image::open(&s.image)
            .map_err(|e| BenchError::Usage(format!("{}: {e}", s.image.display())))?
            .layers()
            .iter()
            // the files a pmem device maps: each layer's, or its external data file
            .flat_map(|l| std::iter::once(l.path()).chain(l.data_file()).map(Path::to_path_buf))
            .collect();
        drop_caches();
        std::thread::sleep(Duration::from_secs(1));
        let group = Group::create(&format!("vm-fill-{method}"))?;
        let watch = StopWatch::start(stop.clone(), group.path().to_path_buf());
        group.set_limit_bytes(s.budget_mib << 20)?;
        no_swap(&group)?;
        let ooms = oom_kills(&group);
        let settle = Duration::from_secs(if method == "blk-ksm" { 30 } else { 10 });
        let advmd = if method == "pmem-merge" { Some(Advmd::start(advm, &group)?) } else { None };
        let ksmd_cpu = if method == "blk-ksm" { advm::ksm::ksmd_cpu_seconds() } else { None };
        let mut vms: Vec<Vm> = Vec::new();
        let mut curve = Vec::new();
        let result = loop {
            if let Some(sig) = stop.received() {
                break Err(interrupted(sig, method, vms.len()));
            }
            if vms.len() == s.max {
                break Ok(format!("stopped at ADVM_VM_MAX={}", s.max));
            }
            match start(advm, s, method, &group, advmd.as_ref()) {
                Err(e) => break Err(e),
                Ok(Err(why)) => break Ok(format!("VM {} {why}", vms.len() + 1)),
                Ok(Ok(vm)) => vms.push(vm),
            }
            std::thread::sleep(settle);
            if let Some(sig) = stop.received() {
                break Err(interrupted(sig, method, vms.len()));
            }
            if let Some(why) = trouble(&mut vms, &group, ooms) {
                // The last VM did not fit; it is stopped with the others below.
                break Ok(format!("with VM {}: {why}", vms.len()));
            }
            match Self::point(s, method, &vms, &group, &layers, advmd.as_ref(), ksmd_cpu, report) {
                Ok((total, less_tb)) => curve.push((vms.len(), total, less_tb)),
                Err(e) => break Err(e),
            }
            if let Err(e) = write_partial(&s.partial, report) {
                break Err(e);
            }
            eprintln!("vm-fill: {method}: {} VM(s) up", vms.len());
        };
        for vm in &vms {
            let _ = advm::process::terminate(vm.child.id());
        }
        for mut vm in vms {
            let _ = vm.child.wait();
        }
        drop(advmd);
        for _ in 0..100 {
            if group.pids().map(|p| p.is_empty()).unwrap_or(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(watch);
        let _ = group.remove();
        if let Err(e) = &result {
            report.notes.push(format!("{method}: {} VMs fit so far; then {e}", curve.len()));
            let _ = write_partial(&s.partial, report);
        }
        result.map(|why| (curve, why))
    }
}

/// The plot: memory of all VMs against N, one colour per method, solid as the cgroups
/// count it, dashed without the translation buffers; the budget as a grey line.
fn svg(curves: &BTreeMap<String, Curve>, budget_mib: u64, title: &str) -> String {
    let (w, h, left, right, top, bottom) = (640.0, 380.0, 70.0, 440.0, 40.0, 320.0);
    let max_n = curves.values().flatten().map(|p| p.0).max().unwrap_or(1).max(2) as f64;
    let max_y = (budget_mib as f64 * 1.1).max(curves.values().flatten().map(|p| p.1 / MIB).fold(0.0, f64::max));
    let x = |n: f64| left + (n / max_n) * (right - left);
    let y = |mib: f64| bottom - mib / max_y * (bottom - top);
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{:.0}\" y=\"22\" text-anchor=\"middle\">{title}</text>\n\
         <line x1=\"{left}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
         <text x=\"{:.0}\" y=\"{}\" text-anchor=\"middle\">VMs running (N)</text>\n\
         <text x=\"16\" y=\"{:.0}\" transform=\"rotate(-90 16 {:.0})\" text-anchor=\"middle\">memory of all VMs, MiB (cgroup)</text>\n",
        (left + right) / 2.0,
        (left + right) / 2.0,
        bottom + 36.0,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0
    );
    for n in 0..=max_n as usize {
        o += &format!("<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{n}</text>\n", x(n as f64), bottom + 16.0);
    }
    let step = if max_y > 2000.0 { 500.0 } else { 250.0 };
    let mut v = 0.0;
    while v <= max_y {
        o += &format!("<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>\n", left - 6.0, y(v) + 4.0);
        v += step;
    }
    o += &format!(
        "<line x1=\"{left}\" y1=\"{b:.1}\" x2=\"{right}\" y2=\"{b:.1}\" stroke=\"grey\" stroke-dasharray=\"2,3\"/>\n\
         <text x=\"{right}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"grey\">budget {budget_mib} MiB</text>\n",
        y(budget_mib as f64) - 4.0,
        b = y(budget_mib as f64)
    );
    let colours = [("blk", "#d62728"), ("blk-ksm", "#ff7f0e"), ("pmem", "#1f77b4"), ("pmem-merge", "#2ca02c")];
    for (i, (method, curve)) in curves.iter().enumerate() {
        let colour = colours.iter().find(|c| c.0 == method).map_or("black", |c| c.1);
        for (dash, pick) in [("", 1), ("5,4", 2)] {
            let pts: Vec<String> = curve
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.0 as f64), y(if pick == 1 { p.1 } else { p.2 } / MIB)))
                .collect();
            o += &format!(
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n",
                pts.join(" ")
            );
        }
        for p in curve {
            o += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>\n",
                x(p.0 as f64),
                y(p.1 / MIB)
            );
        }
        let ly = top + 10.0 + i as f64 * 18.0;
        o += &format!(
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{:.0}\">{method} (max {} VMs)</text>\n",
            right + 10.0,
            right + 30.0,
            right + 35.0,
            ly + 4.0,
            curve.last().map_or(0, |p| p.0)
        );
    }
    let ly = top + 10.0 + curves.len() as f64 * 18.0;
    o += &format!(
        "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"black\" stroke-dasharray=\"5,4\"/>\n\
         <text x=\"{}\" y=\"{:.0}\">less translation buffers</text>\n</svg>\n",
        right + 10.0,
        right + 30.0,
        right + 35.0,
        ly + 4.0
    );
    o
}

fn write_svg(path: &Path, curves: &BTreeMap<String, Curve>, budget: u64, mem: u64, tb: u64) -> Result<(), BenchError> {
    let title = format!("{mem} MiB guests under TCG (tb-size {tb} MiB), one budget of {budget} MiB");
    std::fs::write(path, svg(curves, budget, &title)).map_err(|e| BenchError::Io(path.display().to_string(), e))
}

/// `ADVM_VM_PLOT_FROM=REPORT.json`: the plot of a saved `--json`/`--out` report of this
/// bench, written to `to`, without running anything.
fn replot(from: &Path, to: &Path) -> Result<(), BenchError> {
    let bad = |why: &str| BenchError::Usage(format!("ADVM_VM_PLOT_FROM={}: {why}", from.display()));
    let text = std::fs::read_to_string(from).map_err(|e| BenchError::Io(from.display().to_string(), e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let conf = |k: &str| v["configuration"][k].as_u64().ok_or_else(|| bad(&format!("no configuration.{k}")));
    let (budget, mem, tb) = (conf("budget_mib")?, conf("guest_mem_mib")?, conf("tb_size_mib")?);
    let mut curves: BTreeMap<String, Curve> = BTreeMap::new();
    for row in v["rows"].as_array().ok_or_else(|| bad("no rows"))? {
        let config = |k: &str| {
            row["config"].as_array()?.iter().find(|c| c[0] == k).and_then(|c| c[1].as_str()).map(str::to_string)
        };
        let figure =
            |k: &str| row["figures"].as_array()?.iter().find(|f| f["name"] == k).and_then(|f| f["median"].as_f64());
        let (Some(method), Some(n), Some(per), Some(less)) = (
            config("method"),
            config("VMs").and_then(|n| n.parse::<usize>().ok()),
            figure("memory per VM"),
            figure("memory per VM less translation buffer"),
        ) else {
            return Err(bad("a row without method, VMs or memory per VM"));
        };
        curves.entry(method).or_default().push((n, per * n as f64 * MIB, less * n as f64 * MIB));
    }
    write_svg(to, &curves, budget, mem, tb)
}

impl Bench for VmFillBench {
    fn name(&self) -> &'static str {
        "vm-fill"
    }

    fn description(&self) -> &'static str {
        "VMs started one by one in a memory budget until one does not fit, under blk, blk+KSM and pmem (FlexMem), with what each VM's memory is"
    }

    fn default_runs(&self) -> usize {
        1
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        report.runs = 1;
        if let Some(from) = std::env::var_os("ADVM_VM_PLOT_FROM") {
            let to = std::env::var_os("ADVM_VM_SVG")
                .map(PathBuf::from)
                .ok_or_else(|| BenchError::Usage("ADVM_VM_PLOT_FROM: set ADVM_VM_SVG too".into()))?;
            replot(Path::new(&from), &to)?;
            report.notes.push(format!("plot of {}: {}", Path::new(&from).display(), to.display()));
            return Ok(());
        }
        let s = Settings::from_env(opts.quick)?;
        let advm = std::env::current_exe().map_err(|e| BenchError::Io("this program's path".into(), e))?;
        for (k, v) in [
            ("budget_mib", s.budget_mib),
            ("guest_mem_mib", s.mem_mib),
            ("tb_size_mib", s.tb_mib),
            ("vm_timeout_s", s.timeout_s),
        ] {
            report.configuration.insert(k.into(), v.into());
        }
        report.configuration.insert("image".into(), s.image.display().to_string().into());
        report.configuration.insert("guest_aslr".into(), s.aslr.into());
        report
            .configuration
            .insert("merge_scope".into(), s.merge_scope.clone().unwrap_or_else(|| "default (qemu)".into()).into());
        report
            .configuration
            .insert("boot_lookup_every".into(), s.boot_lookup.clone().unwrap_or_else(|| "default (0)".into()).into());
        let stop = Arc::new(advm::process::StopSignals::install()?);
        eprintln!("vm-fill: the report so far goes to {} after every point", s.partial.display());
        let mut curves = BTreeMap::new();
        for method in &s.methods {
            let (curve, why) = Self::fill(&s, &advm, method, &stop, report)?;
            report.notes.push(format!("{method}: {} VMs fit in {} MiB; then {why}", curve.len(), s.budget_mib));
            write_partial(&s.partial, report)?;
            curves.insert(method.clone(), curve);
        }
        if let Some(path) = &s.svg {
            write_svg(path, &curves, s.budget_mib, s.mem_mib, s.tb_mib)?;
            report.notes.push(format!("plot: {}", path.display()));
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_report() -> Report {
        Report::new("vm-fill", "t", true, 1)
    }

    #[test]
    fn the_partial_report_is_rewritten_whole_after_every_point() {
        let dir = std::env::temp_dir().join(format!("advm-vm-fill-partial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fill.json");
        let mut report = empty_report();
        for n in 1..=2usize {
            report.rows.push(Row::new().with("method", "pmem-merge").with("VMs", n).figure(Figure::new(
                "memory per VM",
                "MiB",
                vec![60.0 + n as f64],
            )));
            write_partial(&path, &report).unwrap();
            let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(saved["rows"].as_array().unwrap().len(), n);
            let table = std::fs::read_to_string(path.with_extension("txt")).unwrap();
            assert!(
                table.contains(&format!("{:.1}", 60.0 + n as f64)) || table.contains(&format!("{}", 60 + n)),
                "{table}"
            );
        }
        report.notes.push("pmem-merge: 2 VMs fit so far; then interrupted".into());
        write_partial(&path, &report).unwrap();
        assert!(std::fs::read_to_string(path.with_extension("txt")).unwrap().contains("note: pmem-merge: 2 VMs"));
        assert!(!path.with_extension("partial-tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stopping_signal_is_noted_and_ends_every_process_in_the_group() {
        if !advm::process::is_root() {
            eprintln!("skipped: creating a memory cgroup needs root");
            return;
        }
        let _turn = crate::SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let stop = Arc::new(advm::process::StopSignals::install().unwrap());
        let group = Group::create(&format!("vm-fill-test-stop-{}", std::process::id())).unwrap();
        let mut kids: Vec<Child> = (0..2)
            .map(|_| {
                let mut cmd = Command::new("sleep");
                cmd.arg("300");
                group.join_at_exec(&mut cmd).unwrap();
                cmd.spawn().unwrap()
            })
            .collect();
        let watch = StopWatch::start(stop.clone(), group.path().to_path_buf());
        std::thread::sleep(Duration::from_millis(300));
        assert!(kids.iter_mut().all(|k| matches!(k.try_wait(), Ok(None))), "nothing is stopped before a signal");
        assert_eq!(group.pids().unwrap().len(), 2);
        // SIGTERM to this test process: noted, not fatal.
        advm::process::terminate(std::process::id()).unwrap();
        let t = std::time::Instant::now();
        while stop.received().is_none() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stop.received(), Some(libc::SIGTERM));
        for k in &mut kids {
            let status = k.wait().unwrap();
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM));
        }
        drop(watch);
        assert!(group.pids().unwrap().is_empty());
        group.remove().unwrap();
        assert!(
            matches!(interrupted(libc::SIGTERM, "blk-ksm", 3), BenchError::Interrupted(m) if m.contains("SIGTERM") && m.contains("3 VM"))
        );
    }

    #[test]
    fn the_plot_draws_each_method_both_ways_with_the_budget_and_the_max() {
        let mut curves = BTreeMap::new();
        curves.insert("blk".to_string(), vec![(1, 300.0 * MIB, 280.0 * MIB), (2, 560.0 * MIB, 520.0 * MIB)]);
        curves.insert("pmem".to_string(), vec![(1, 250.0 * MIB, 230.0 * MIB)]);
        let out = svg(&curves, 1024, "t");
        assert_eq!(out.matches("<polyline").count(), 4);
        assert!(out.contains("budget 1024 MiB"));
        assert!(out.contains("blk (max 2 VMs)") && out.contains("pmem (max 1 VMs)"));
        assert!(out.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn a_saved_report_is_replotted_from_its_rows_and_a_report_without_them_is_refused() {
        let dir = std::env::temp_dir().join(format!("advm-vm-fill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |m: &str, n: usize, per: f64| {
            serde_json::json!({"config": [["method", m], ["VMs", n.to_string()]], "figures": [
                {"name": "memory per VM", "median": per}, {"name": "memory per VM less translation buffer", "median": per - 16.0}]})
        };
        let saved = serde_json::json!({
            "configuration": {"budget_mib": 512, "guest_mem_mib": 128, "tb_size_mib": 16},
            "rows": [row("blk", 1, 300.0), row("blk", 2, 250.0), row("pmem", 1, 260.0)],
        });
        let (from, svg_path) = (dir.join("r.json"), dir.join("p.svg"));
        std::fs::write(&from, saved.to_string()).unwrap();
        replot(&from, &svg_path).unwrap();
        let out = std::fs::read_to_string(&svg_path).unwrap();
        assert!(out.contains("budget 512 MiB") && out.contains("blk (max 2 VMs)") && out.contains("pmem (max 1 VMs)"));
        assert_eq!(out.matches("<circle").count(), 3);
        std::fs::write(&from, r#"{"configuration": {"budget_mib": 512}}"#).unwrap();
        assert!(replot(&from, &svg_path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn merged_guest_ram_is_found_as_the_run_of_anonymous_and_store_pieces_of_its_size() {
        let m = |start: u64, len: u64, perms: &str, path: &str| MappingFrames {
            start,
            end: start + len,
            perms: perms.into(),
            path: path.into(),
            anon: vec![],
            file: vec![],
        };
        let mib = 1u64 << 20;
        let maps = vec![
            m(0x1000_0000, 4 * mib, "rw-p", ""),
            m(0x2000_0000, 100 * mib, "rw-p", "/memfd:advmd-store-0 (deleted)"),
            m(0x2000_0000 + 100 * mib, 20 * mib, "rw-p", ""),
            m(0x2000_0000 + 120 * mib, 8 * mib, "rw-p", "/memfd:advmd-store-0 (deleted)"),
            m(0x2000_0000 + 128 * mib, 4096, "---p", ""),
            m(0x4000_0000, 128 * mib, "rwxp", ""),
        ];
        assert_eq!(guest_ram(&maps, 128 * mib), vec![(0x2000_0000, 0x2000_0000 + 128 * mib)]);
        // QEMU's heap block right before guest RAM: guest RAM is the run's last 128 MiB.
        let mut after_block = maps.clone();
        after_block[0] = m(0x2000_0000 - 8 * mib, 8 * mib, "rw-p", "");
        assert_eq!(guest_ram(&after_block, 128 * mib), vec![(0x2000_0000, 0x2000_0000 + 128 * mib)]);
        // Without a store mapping a run is not merged guest RAM; a single anonymous
        // mapping of the size is guest RAM.
        let anon: Vec<MappingFrames> = maps.iter().map(|x| m(x.start, x.len(), &x.perms, "")).collect();
        assert!(guest_ram(&anon, 128 * mib).is_empty());
        assert_eq!(guest_ram(&maps[..1], 4 * mib), vec![(0x1000_0000, 0x1000_0000 + 4 * mib)]);
    }

    #[test]
    fn advm_processes_own_only_their_anonymous_pages_not_the_store_or_binary_pages_they_map() {
        let m = |path: &str, anon: &[u64], file: &[u64]| MappingFrames {
            start: 0x1000,
            end: 0x1000 + 4096 * 4,
            perms: "rw-p".into(),
            path: path.into(),
            anon: anon.to_vec(),
            file: file.to_vec(),
        };
        let mut a = AdvmProcesses::default();
        // advmd: its heap, the binary, store pages it read for a hash check.
        a.add(vec![
            m("[heap]", &[1, 2], &[]),
            m("/bin/advm", &[3], &[10, 11]),
            m("/memfd:advm-merge-add", &[], &[20, 21]),
        ]);
        // Two `advm vm run`: own heaps, the same binary pages.
        a.add(vec![m("[heap]", &[4], &[]), m("/bin/advm", &[], &[10, 11])]);
        a.add(vec![m("[heap]", &[5], &[]), m("/bin/advm", &[], &[10])]);
        assert_eq!(distinct_bytes(&mut a.own), 5.0 * 4096.0, "heaps and the binary's relocated page");
        assert_eq!(distinct_bytes(&mut a.mapped), 4.0 * 4096.0, "binary and store pages once");
    }

    #[test]
    fn qemu_mappings_are_sorted_into_guest_ram_translation_buffer_device_and_qemu() {
        let s = Settings {
            image: PathBuf::new(),
            budget_mib: 1024,
            mem_mib: 128,
            tb_mib: 16,
            max: 1,
            methods: vec![],
            svg: None,
            aslr: false,
            timeout_s: 300,
            merge_scope: None,
            boot_lookup: None,
            partial: PathBuf::new(),
        };
        let m = |start: u64, len: u64, perms: &str, path: &str, anon: &[u64], file: &[u64]| MappingFrames {
            start,
            end: start + len,
            perms: perms.into(),
            path: path.into(),
            anon: anon.to_vec(),
            file: file.to_vec(),
        };
        let layers = vec![PathBuf::from("/g/base.qcow2"), PathBuf::from("/g/app.qcow2")];
        let maps = vec![
            m(0x1000_0000, 128 << 20, "rw-p", "", &[1, 2], &[]),
            m(0x2000_0000, (16 << 20) - 4096, "rwxp", "", &[3], &[]),
            m(0x3000_0000, 1 << 20, "rw-p", "/g/base.qcow2", &[4], &[5]),
            m(0x3010_0000, 1 << 20, "rw-p", "", &[6], &[]),
            m(0x3020_0000, 1 << 20, "rw-p", "/g/app.qcow2", &[], &[7]),
            m(0x4000_0000, 1 << 20, "rw-p", "[heap]", &[8], &[]),
            m(0x5000_0000, 1 << 20, "r-xp", "/usr/bin/qemu", &[], &[9]),
        ];
        let mut p = Parts::default();
        p.add(maps, &s, &layers);
        assert_eq!(p.guest_ram, [1, 2]);
        assert_eq!(p.tb, [3]);
        assert_eq!(p.device_private, [4, 6], "private copies in the device, zero pieces included");
        assert_eq!(p.device_image, [5, 7]);
        assert_eq!(p.qemu_anon, [8]);
        assert_eq!(p.qemu_file, [9]);
    }
}
