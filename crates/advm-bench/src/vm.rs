//! `advm bench vm-density`: FlexMem's density experiment with real VMs. N guests boot
//! the chain built by `advm vm image build` under each method: `blk` (QEMU's qcow2 on
//! virtio-blk: each guest caches what it reads), `blk-ksm` (the same with guest RAM
//! mergeable and ksmd running) and `pmem` (the chain as a DAX virtio-pmem device backed
//! by advm's mapping: the guests read the host's one page-cache copy). Each VM (its
//! `advm vm run` and QEMU) runs in its own memory cgroup; the layer files' page cache
//! is dropped before each point so what the VMs read is charged to them. Memory per VM
//! is the groups' anon + shmem + page cache over N, next to the distinct-page meter's
//! figure for all VM processes.
//!
//! `pmem-merge` is `pmem` with `advm vm run --merge`: once each guest answers, its RAM
//! is merged once into the store of an advmd started for the point (`advm daemon`, in a
//! group of its own: the store's pages are charged to it, counted as shared). The
//! merge's wall time, the CPU of the agent's threads in QEMU and of advmd are reported.
//!
//! `ADVM_VM_METHODS` picks methods (comma-separated), `ADVM_VM_COUNTS` the numbers of VMs
//! (default 1, 2, 4, 8, 16); every method's guests boot with
//! `--no-aslr` unless `ADVM_VM_ASLR=1`.
//!
//! The VMs are started as `advm vm run` processes of this same binary. How many fit in
//! a budget is measured by `advm bench vm-fill`, not projected from these points.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use advm::stats::cgroup::Group;
use advm::stats::{measure, Options};

use super::{Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::BenchError;

/// See the module doc.
pub struct VmDensityBench;

pub(crate) fn image() -> Result<PathBuf, BenchError> {
    let path = std::env::var_os("ADVM_VM_IMAGE").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/var/cache"));
        cache.join("advm/vm/app.qcow2")
    });
    if !path.exists() {
        return Err(BenchError::Usage(format!(
            "{}: no guest image; build it with `advm vm image build` (or set ADVM_VM_IMAGE)",
            path.display()
        )));
    }
    Ok(path)
}

/// The methods, in the order they run; `ADVM_VM_METHODS` picks some (comma-separated).
pub(crate) const METHODS: [&str; 4] = ["blk", "blk-ksm", "pmem", "pmem-merge"];

/// `ADVM_VM_METHODS`, checked against [`METHODS`]; all of them when unset.
pub(crate) fn methods() -> Result<Vec<String>, BenchError> {
    parse_methods(std::env::var("ADVM_VM_METHODS").ok().as_deref())
}

fn parse_methods(list: Option<&str>) -> Result<Vec<String>, BenchError> {
    let Some(list) = list else { return Ok(METHODS.map(str::to_string).to_vec()) };
    let picked: Vec<String> = list.split(',').map(|m| m.trim().to_string()).collect();
    match picked.iter().find(|m| !METHODS.contains(&m.as_str())) {
        Some(m) => Err(BenchError::Usage(format!("ADVM_VM_METHODS: {m:?}: expected some of {}", METHODS.join(", ")))),
        None => Ok(picked),
    }
}

/// `advm vm run`'s arguments for `method` after the image.
pub(crate) fn method_args(method: &str) -> Vec<&'static str> {
    match method {
        "pmem" => vec!["--disk", "pmem"],
        "pmem-merge" => vec!["--disk", "pmem", "--merge"],
        "blk-ksm" => vec!["--disk", "blk", "--ksm"],
        _ => vec!["--disk", "blk"],
    }
}

/// Guests boot with `--no-aslr` under every method (laid out alike, so KSM and the merge
/// find equal pages) unless `ADVM_VM_ASLR=1` keeps randomisation on.
pub(crate) fn aslr() -> Result<bool, BenchError> {
    match std::env::var("ADVM_VM_ASLR").as_deref() {
        Err(_) | Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(v) => Err(BenchError::Usage(format!("ADVM_VM_ASLR={v:?}: expected 0 or 1"))),
    }
}

/// The numbers of VMs, one point each: 1, 2, 4, 8, 16 (the issue's sweep; `--quick`: 1, 2),
/// or `ADVM_VM_COUNTS` (comma-separated), so a long sweep can be split over several runs.
pub(crate) fn counts(quick: bool) -> Result<Vec<usize>, BenchError> {
    parse_counts(std::env::var("ADVM_VM_COUNTS").ok().as_deref(), quick)
}

fn parse_counts(v: Option<&str>, quick: bool) -> Result<Vec<usize>, BenchError> {
    let Some(v) = v else {
        return Ok(if quick { vec![1, 2] } else { vec![1, 2, 4, 8, 16] });
    };
    let bad = || BenchError::Usage(format!("ADVM_VM_COUNTS={v:?}: expected VM counts like 1,2,4 (each at least 1)"));
    let ns = v
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|&n| n >= 1))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    if ns.is_empty() {
        return Err(bad());
    }
    Ok(ns)
}

/// An advmd (`advm daemon`) started for `pmem-merge`, stopped (by its pid) when dropped.
pub(crate) struct Advmd {
    child: Child,
    pub socket: PathBuf,
}

impl Advmd {
    /// Starts `advm daemon` in `group` on a fresh socket and waits until it listens.
    pub(crate) fn start(advm: &Path, group: &Group) -> Result<Self, BenchError> {
        let socket = std::env::temp_dir().join(format!("advm-vm-advmd-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(advm);
        cmd.args(["daemon", "--socket"]).arg(&socket).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        group.join_at_exec(&mut cmd)?;
        let child = cmd.spawn().map_err(|e| BenchError::Io(format!("starting {} daemon", advm.display()), e))?;
        let d = Self { child, socket };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::Usage("advm daemon did not listen within 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU seconds the daemon has used so far (all threads; USER_HZ is 100 on Linux).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        crate::cpu_seconds(self.pid()).unwrap_or(0.0)
    }
}

impl Drop for Advmd {
    fn drop(&mut self) {
        crate::stop_daemon(&mut self.child, &self.socket);
    }
}

/// What `advm vm run --merge` printed: `merged: {JSON}`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Merged {
    /// Pages mapped from store pages another VM (or this one) had put there.
    pub merged: u64,
    /// Pages this VM put into the store.
    pub added: u64,
    /// All-zero pages the guest held that the merge gave back (0 from an agent that
    /// did not report them).
    pub zero_dropped: u64,
    /// The request's wall time, s.
    pub wall_s: f64,
    /// CPU of the agent's threads in QEMU, s.
    pub agent_cpu_s: f64,
}

impl Merged {
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(line.trim().strip_prefix("merged: ")?).ok()?;
        Some(Self {
            merged: v["merged"].as_u64()?,
            added: v["added"].as_u64()?,
            zero_dropped: v["zero_dropped"].as_u64().unwrap_or(0),
            wall_s: v["wall_s"].as_f64()?,
            agent_cpu_s: v["agent_cpu_s"].as_f64()?,
        })
    }
}

/// Reads `advm vm run --merge`'s `merged:` line from `out`.
pub(crate) fn read_merged(out: &mut BufReader<ChildStdout>) -> Result<Merged, String> {
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| format!("reading advm vm run's output: {e}"))?;
    Merged::parse(&line).ok_or_else(|| format!("a VM's merge did not report: {line:?}"))
}

struct Vm {
    child: Child,
    out: Option<BufReader<ChildStdout>>,
    /// Where `advm vm run` writes its errors: their last line goes into the bench's.
    stderr: PathBuf,
    group: Group,
    ready_s: f64,
    merged: Option<Merged>,
}

fn start(advm: &Path, image: &Path, method: &str, i: usize, advmd: Option<&Advmd>) -> Result<Vm, BenchError> {
    let group = Group::create(&format!("vm-{method}-{i}"))?;
    let mut cmd = Command::new(advm);
    cmd.args(["vm", "run", "--image"]).arg(image).args(method_args(method)).args(["--timeout", "900"]);
    if !aslr()? {
        cmd.arg("--no-aslr");
    }
    if let Some(d) = advmd {
        cmd.env("ADVM_SOCKET", &d.socket);
    }
    let stderr = std::env::temp_dir().join(format!("advm-bench-vm-{}-{method}-{i}.err", std::process::id()));
    let file = std::fs::File::create(&stderr).map_err(|e| BenchError::Io(stderr.display().to_string(), e))?;
    cmd.stdout(Stdio::piped()).stderr(file);
    group.join_at_exec(&mut cmd)?;
    let mut child = cmd.spawn().map_err(|e| BenchError::Io(format!("starting {} vm run", advm.display()), e))?;
    let out = child.stdout.take().map(BufReader::new);
    Ok(Vm { child, out, stderr, group, ready_s: f64::NAN, merged: None })
}

impl Vm {
    /// A VM that failed, with the last line `advm vm run` wrote on stderr (it names the
    /// console's directory when QEMU got that far).
    fn failed(&self, what: String) -> BenchError {
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no error output");
        BenchError::Usage(format!("{what}; advm vm run said: {last}"))
    }
}

/// Reads each VM's `ready ... after N ms` line, and under `--merge` its `merged:` line.
fn wait_ready(vms: &mut [Vm], merge: bool) -> Result<(), BenchError> {
    for vm in vms.iter_mut() {
        let mut line = String::new();
        let out = vm.out.as_mut().expect("piped");
        out.read_line(&mut line).map_err(|e| BenchError::Io("advm vm run output".into(), e))?;
        let ms = line.split("after ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<f64>().ok());
        vm.ready_s = ms.ok_or_else(|| vm.failed(format!("a VM did not come up: {line:?}")))? / 1000.0;
    }
    if merge {
        for vm in vms.iter_mut() {
            let merged = read_merged(vm.out.as_mut().expect("piped"));
            vm.merged = Some(merged.map_err(|e| vm.failed(e))?);
        }
    }
    Ok(())
}

fn stop(vms: Vec<Vm>) {
    for vm in &vms {
        let _ = advm::process::terminate(vm.child.id());
    }
    for mut vm in vms {
        let _ = vm.child.wait();
        // The group goes once its processes have.
        for _ in 0..50 {
            if vm.group.pids().map(|p| p.is_empty()).unwrap_or(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = vm.group.remove();
        let _ = std::fs::remove_file(&vm.stderr);
    }
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3\n");
}

impl Bench for VmDensityBench {
    fn name(&self) -> &'static str {
        "vm-density"
    }

    fn description(&self) -> &'static str {
        "N real VMs booting one qcow2 chain: memory per VM and boot time under blk, blk+KSM, pmem (FlexMem) and pmem with guest RAM merged once (advmd)"
    }

    fn default_runs(&self) -> usize {
        1
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        // One boot per point: a point takes minutes.
        report.runs = 1;
        let image = image()?;
        let advm = std::env::current_exe().map_err(|e| BenchError::Io("this program's path".into(), e))?;
        let ns = counts(opts.quick)?;
        report.configuration.insert("image".into(), image.display().to_string().into());
        report.configuration.insert("guest_aslr".into(), aslr()?.into());
        for method in methods()? {
            for &n in &ns {
                let p = point(&advm, &image, &method, n)?;
                report.meter_disagreements.extend(p.disagreement.clone());
                report.rows.push(p.row());
            }
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let skipped = |why: String| Ok(vec![DemoRow::skipped("vm-density", &why)]);
        let image = match image() {
            Ok(i) => i,
            Err(e) => return skipped(e.to_string()),
        };
        if let Err(e) = Command::new("qemu-system-x86_64").arg("--version").output() {
            return skipped(format!("qemu-system-x86_64: {e} (Debian: qemu-system-x86)"));
        }
        let advm = std::env::current_exe().map_err(|e| BenchError::Io("this program's path".into(), e))?;
        let n = 2;
        let blk = point(&advm, &image, "blk", n)?;
        let pmem = point(&advm, &image, "pmem", n)?;
        let merged = point(&advm, &image, "pmem-merge", n)?;
        let problems: Vec<String> = [&blk, &pmem, &merged].iter().filter_map(|p| p.disagreement.clone()).collect();
        if !problems.is_empty() {
            return Err(BenchError::Usage(problems.join("; ")));
        }
        let per = |p: &Point| {
            format!(
                "{:.0} MiB/VM (distinct {:.0}), answers after {:.0} s",
                p.memory_mib() / n as f64,
                p.distinct_mib() / n as f64,
                p.boot_s
            )
        };
        Ok(vec![DemoRow {
            capability: "vm-density".into(),
            workload: format!(
                "{n} VMs boot one qcow2 chain (Debian guest, {} MiB, HTTP service), host memory per VM (cgroup: anon+shmem+page cache)",
                GUEST_MIB
            ),
            advm: format!("pmem (FlexMem): {}; pmem + merge: {}", per(&pmem), per(&merged)),
            baseline: format!("blk (virtio-blk, QEMU's qcow2): {}", per(&blk)),
            gain: format!(
                "pmem {:+.0}%, pmem + merge {:+.0}% (cgroup)",
                (pmem.memory_mib() / blk.memory_mib() - 1.0) * 100.0,
                (merged.memory_mib() / blk.memory_mib() - 1.0) * 100.0
            ),
        }])
    }
}

/// `advm vm run`'s default `--mem`, which the benches keep.
const GUEST_MIB: u32 = 256;

/// One point: `n` VMs of one method booted together, measured after they answer and settle.
struct Point {
    method: String,
    n: usize,
    cg_anon_shmem: u64,
    cache: u64,
    distinct: u64,
    ready: Vec<f64>,
    boot_s: f64,
    ksmd_s: f64,
    merged: Vec<Merged>,
    store: Option<u64>,
    advmd_cpu: Option<f64>,
    /// The anon + shmem meters' disagreement, if any (not checked under KSM).
    disagreement: Option<String>,
}

const MIB: f64 = (1u64 << 20) as f64;

impl Point {
    /// All the VMs' memory by the cgroups: anon + shmem + page cache, MiB.
    fn memory_mib(&self) -> f64 {
        (self.cg_anon_shmem + self.cache) as f64 / MIB
    }

    fn distinct_mib(&self) -> f64 {
        self.distinct as f64 / MIB
    }

    fn row(&self) -> Row {
        let n = self.n as f64;
        let mut row = Row::new()
            .with("method", self.method.as_str())
            .with("VMs", self.n)
            .figure(Figure::new("cgroup anon+shmem per VM", "MiB", vec![self.cg_anon_shmem as f64 / MIB / n]))
            .figure(Figure::new("page cache per VM", "MiB", vec![self.cache as f64 / MIB / n]))
            .figure(Figure::new("memory per VM", "MiB", vec![self.memory_mib() / n]))
            .figure(Figure::new("distinct pages per VM", "MiB", vec![self.distinct_mib() / n]))
            .figure(Figure::new("boot to answer", "s", self.ready.clone()))
            .figure(Figure::new("all answering", "s", vec![self.boot_s]))
            .figure(Figure::new("ksmd CPU while settling", "s", vec![self.ksmd_s]));
        if self.method == "pmem-merge" {
            let ps = advm::mem::page_size() as f64;
            let each = |f: &dyn Fn(&Merged) -> f64| self.merged.iter().map(f).collect::<Vec<f64>>();
            row = row
                .figure(Figure::new("merge wall time", "s", each(&|m| m.wall_s)))
                .figure(Figure::new("merge CPU in QEMU", "s", each(&|m| m.agent_cpu_s)))
                .figure(Figure::new("advmd CPU (plans and merges)", "s", vec![self.advmd_cpu.unwrap_or(f64::NAN)]))
                .figure(Figure::new("pages already in the store", "MiB", each(&|m| m.merged as f64 * ps / MIB)))
                .figure(Figure::new("pages added to the store", "MiB", each(&|m| m.added as f64 * ps / MIB)))
                .figure(Figure::new("store (advmd anon+shmem)", "MiB", vec![self.store.unwrap_or(0) as f64 / MIB]));
        }
        row
    }
}

/// Boots `n` VMs of `method` together, lets them settle, reads both meters, stops them.
fn point(advm: &Path, image: &Path, method: &str, n: usize) -> Result<Point, BenchError> {
    let merge = method == "pmem-merge";
    let settle = Duration::from_secs(if method == "blk-ksm" { 60 } else { 10 });
    drop_caches();
    std::thread::sleep(Duration::from_secs(1));
    let daemon_group = if merge { Some(Group::create("vm-advmd")?) } else { None };
    let advmd = daemon_group.as_ref().map(|g| Advmd::start(advm, g)).transpose()?;
    let t0 = Instant::now();
    let mut vms = Vec::new();
    for i in 0..n {
        match start(advm, image, method, i, advmd.as_ref()) {
            Ok(vm) => vms.push(vm),
            Err(e) => {
                stop(vms);
                return Err(e);
            }
        }
    }
    if let Err(e) = wait_ready(&mut vms, merge) {
        stop(vms);
        return Err(e);
    }
    let boot_s = t0.elapsed().as_secs_f64();
    let ksmd_before = advm::ksm::ksmd_cpu_seconds();
    std::thread::sleep(settle);
    let ksmd_s = match (ksmd_before, advm::ksm::ksmd_cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let read = || -> Result<(u64, u64, Vec<i32>, Option<u64>), BenchError> {
        let (mut anon_shmem, mut cache, mut pids) = (0, 0, Vec::new());
        // advmd's group holds the store: shared by the VMs, counted once.
        for g in vms.iter().map(|v| &v.group).chain(daemon_group.as_ref()) {
            let u = g.usage()?;
            anon_shmem += u.anon_shmem_bytes();
            cache += u.page_cache_bytes;
            pids.extend(g.pids()?);
        }
        let store = daemon_group.as_ref().map(|g| g.usage().map(|u| u.anon_shmem_bytes())).transpose()?;
        Ok((anon_shmem, cache, pids, store))
    };
    let groups = read();
    let advmd_cpu = advmd.as_ref().map(Advmd::cpu_seconds);
    let ready: Vec<f64> = vms.iter().map(|v| v.ready_s).collect();
    let merged: Vec<Merged> = vms.iter().filter_map(|v| v.merged).collect();
    let sample = groups.as_ref().ok().map(|g| measure(&g.2, Options::default()));
    stop(vms);
    drop(advmd);
    if let Some(g) = daemon_group {
        let _ = g.remove();
    }
    let (cg_anon_shmem, cache, _, store) = groups?;
    let sample = sample.expect("measured when the groups were read")?;
    // KSM merges pages across groups that stay charged where they were.
    let disagreement = (method != "blk-ksm")
        .then(|| {
            crate::meters::disagreement(
                &format!("{method} N={n}: anon+shmem of all VMs"),
                sample.anon_shmem_bytes as f64,
                cg_anon_shmem as f64,
            )
        })
        .flatten();
    Ok(Point {
        method: method.to_string(),
        n,
        cg_anon_shmem,
        cache,
        distinct: sample.physical_bytes,
        ready,
        boot_s,
        ksmd_s,
        merged,
        store,
        advmd_cpu,
        disagreement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_default_to_all_four_and_an_unknown_one_is_named() {
        assert_eq!(parse_methods(None).unwrap(), METHODS.to_vec());
        assert_eq!(parse_methods(Some("pmem-merge, blk")).unwrap(), vec!["pmem-merge", "blk"]);
        let e = parse_methods(Some("pmem,ksm")).unwrap_err().to_string();
        assert!(e.contains("\"ksm\"") && e.contains("pmem-merge"), "{e}");
        assert_eq!(method_args("pmem-merge"), vec!["--disk", "pmem", "--merge"]);
        assert_eq!(method_args("blk-ksm"), vec!["--disk", "blk", "--ksm"]);
    }

    #[test]
    fn counts_default_to_the_issues_sweep_and_bad_ones_are_named() {
        assert_eq!(parse_counts(None, false).unwrap(), vec![1, 2, 4, 8, 16]);
        assert_eq!(parse_counts(None, true).unwrap(), vec![1, 2]);
        assert_eq!(parse_counts(Some("16"), true).unwrap(), vec![16]);
        assert_eq!(parse_counts(Some("4, 12"), false).unwrap(), vec![4, 12]);
        for bad in ["", "0", "2,x", "-1"] {
            let e = parse_counts(Some(bad), false).unwrap_err().to_string();
            assert!(e.contains("ADVM_VM_COUNTS"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_merge_line_gives_its_counts_and_times_and_anything_else_is_refused() {
        let line = r#"merged: {"added":7388,"agent_cpu_s":0.14,"busy":0,"merged":11748,"ok":true,"wall_s":0.245}"#;
        let m = Merged::parse(line).unwrap();
        assert_eq!((m.merged, m.added, m.zero_dropped), (11748, 7388, 0));
        let line =
            r#"merged: {"added":7,"agent_cpu_s":0.1,"busy":0,"merged":11,"ok":true,"wall_s":0.2,"zero_dropped":6656}"#;
        assert_eq!(Merged::parse(line).unwrap().zero_dropped, 6656);
        assert_eq!((m.wall_s, m.agent_cpu_s), (0.245, 0.14));
        assert_eq!(Merged::parse("ready: http://127.0.0.1:1/ answered after 5 ms (x)"), None);
        assert_eq!(Merged::parse(r#"merged: {"ok":false,"error":"x"}"#), None);
    }
}
