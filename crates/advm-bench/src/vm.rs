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
//! The VMs are started as `advm vm run` processes of this same binary. How many fit in
//! a budget is measured by `advm bench vm-fill`, not projected from these points.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

struct Vm {
    child: Child,
    group: Group,
    ready_s: f64,
}

fn start(advm: &PathBuf, image: &PathBuf, method: &str, i: usize) -> Result<Vm, BenchError> {
    let group = Group::create(&format!("vm-{method}-{i}"))?;
    let mut cmd = Command::new(advm);
    let disk = if method == "pmem" { "pmem" } else { "blk" };
    cmd.args(["vm", "run", "--image"]).arg(image).args(["--disk", disk, "--timeout", "900"]);
    if method == "blk-ksm" {
        cmd.arg("--ksm");
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    group.join_at_exec(&mut cmd)?;
    let child = cmd.spawn().map_err(|e| BenchError::Io(format!("starting {} vm run", advm.display()), e))?;
    Ok(Vm { child, group, ready_s: f64::NAN })
}

/// Reads each VM's `ready ... after N ms` line.
fn wait_ready(vms: &mut [Vm]) -> Result<(), BenchError> {
    for vm in vms.iter_mut() {
        let mut line = String::new();
        let out = vm.child.stdout.take().expect("piped");
        BufReader::new(out).read_line(&mut line).map_err(|e| BenchError::Io("advm vm run output".into(), e))?;
        let ms = line.split("after ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<f64>().ok());
        vm.ready_s = ms.ok_or_else(|| {
            BenchError::Usage(format!("a VM did not come up: {line:?} (see its console under /tmp/advm-vm-PID)"))
        })? / 1000.0;
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
        "N real VMs booting one qcow2 chain: memory per VM and boot time under blk, blk+KSM and pmem (FlexMem)"
    }

    fn default_runs(&self) -> usize {
        1
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        // One boot per point: a point takes minutes.
        report.runs = 1;
        let image = image()?;
        let advm = std::env::current_exe().map_err(|e| BenchError::Io("this program's path".into(), e))?;
        let ns: &[usize] = if opts.quick { &[1, 2] } else { &[1, 2, 4, 8] };
        let settle = |method: &str| Duration::from_secs(if method == "blk-ksm" { 60 } else { 10 });
        report.configuration.insert("image".into(), image.display().to_string().into());
        for method in ["pmem", "blk", "blk-ksm"] {
            for &n in ns {
                drop_caches();
                std::thread::sleep(Duration::from_secs(1));
                let t0 = Instant::now();
                let mut vms = Vec::new();
                for i in 0..n {
                    match start(&advm, &image, method, i) {
                        Ok(vm) => vms.push(vm),
                        Err(e) => {
                            stop(vms);
                            return Err(e);
                        }
                    }
                }
                if let Err(e) = wait_ready(&mut vms) {
                    stop(vms);
                    return Err(e);
                }
                let boot = t0.elapsed().as_secs_f64();
                let ksmd_before = advm::ksm::ksmd_cpu_seconds();
                std::thread::sleep(settle(method));
                let ksmd_s = match (ksmd_before, advm::ksm::ksmd_cpu_seconds()) {
                    (Some(a), Some(b)) => b - a,
                    _ => f64::NAN,
                };
                let mut cg_anon_shmem = 0u64;
                let mut cache = 0u64;
                let mut pids = Vec::new();
                for vm in &vms {
                    let u = vm.group.usage()?;
                    cg_anon_shmem += u.anon_shmem_bytes();
                    cache += u.page_cache_bytes;
                    pids.extend(vm.group.pids()?);
                }
                let ready: Vec<f64> = vms.iter().map(|v| v.ready_s).collect();
                let sample = measure(&pids, Options::default());
                stop(vms);
                let sample = sample?;
                let total = (cg_anon_shmem + cache) as f64;
                let mib = |b: f64| b / (1u64 << 20) as f64;
                if method != "blk-ksm" {
                    // KSM merges pages across groups that stay charged where they were.
                    report.meter_disagreements.extend(crate::meters::disagreement(
                        &format!("{method} N={n}: anon+shmem of all VMs"),
                        sample.anon_shmem_bytes as f64,
                        cg_anon_shmem as f64,
                    ));
                }
                report.rows.push(
                    Row::new()
                        .with("method", method)
                        .with("VMs", n)
                        .figure(Figure::new(
                            "cgroup anon+shmem per VM",
                            "MiB",
                            vec![mib(cg_anon_shmem as f64 / n as f64)],
                        ))
                        .figure(Figure::new("page cache per VM", "MiB", vec![mib(cache as f64 / n as f64)]))
                        .figure(Figure::new("memory per VM", "MiB", vec![mib(total / n as f64)]))
                        .figure(Figure::new(
                            "distinct pages per VM",
                            "MiB",
                            vec![mib(sample.physical_bytes as f64 / n as f64)],
                        ))
                        .figure(Figure::new("boot to answer", "s", ready))
                        .figure(Figure::new("all answering", "s", vec![boot]))
                        .figure(Figure::new("ksmd CPU while settling", "s", vec![ksmd_s])),
                );
            }
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        // Booting VMs takes minutes; the demo table stays with the image benchmark.
        Ok(Vec::new())
    }
}
