//! `advm bench image`: the FlexMem experiment on one machine. N readers (the VMs)
//! each read a whole layered qcow2 image. Mapped through `ImageSpace` (MAP_PRIVATE of
//! the layer files), they share one page-cache copy; reading it into private memory
//! (as a block device does), each keeps its own. The readers live in this process;
//! memory is the distinct physical pages they add to it (`advm::stats`), so the
//! figures hold no per-process overhead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use advm::image::{GuestOffset, Image, ImageSpace, MapOptions};
use advm::stats::{Meter, Options};

use super::{fmt_bytes, Bench, BenchOpts, DemoRow, Figure, Report, Row, Scratch};
use crate::meters::{self, in_group};
use crate::BenchError;
use advm::stats::cgroup::Group;

/// See the module doc.
pub struct ImageBench;

fn sh(dir: &Path, prog: &str, args: &[String]) -> Result<(), BenchError> {
    let out = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| BenchError::Io(format!("{prog} (install qemu-utils)"), e))?;
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "{prog} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Builds a three-layer chain of `mib` MiB: a base full of data, a middle layer that
/// rewrites an eighth and zeroes some, a top layer with new data and a few compressed
/// clusters. Returns the top image.
fn build_chain(dir: &Path, mib: u64) -> Result<PathBuf, BenchError> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let size = format!("{mib}M");
    sh(dir, "qemu-img", &s(&["create", "-q", "-f", "qcow2", "base.qcow2", &size]))?;
    let mut cmds = Vec::new();
    for m in 0..mib {
        cmds.push("-c".to_string());
        cmds.push(format!("write -P {} {}M 1M", 1 + m % 250, m));
    }
    cmds.push("base.qcow2".into());
    sh(dir, "qemu-io", &cmds)?;
    sh(dir, "qemu-img", &s(&["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "mid.qcow2"]))?;
    let mut cmds = Vec::new();
    for m in (0..mib).step_by(8) {
        cmds.extend(["-c".to_string(), format!("write -P 0xee {}M 256k", m)]);
        cmds.extend(["-c".to_string(), format!("write -z {}k 128k", m * 1024 + 512)]);
    }
    cmds.push("mid.qcow2".into());
    sh(dir, "qemu-io", &cmds)?;
    sh(dir, "qemu-img", &s(&["create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", "top.qcow2"]))?;
    let mut cmds = Vec::new();
    for m in (4..mib).step_by(16) {
        cmds.extend(["-c".to_string(), format!("write -c -P 0x5c {}M 64k", m)]);
        cmds.extend(["-c".to_string(), format!("write -P 0x7d {}k 192k", m * 1024 + 256)]);
    }
    cmds.push("top.qcow2".into());
    sh(dir, "qemu-io", &cmds)?;
    Ok(dir.join("top.qcow2"))
}

/// One reader's hold on the whole image, kept until dropped: mapped (sharing the page
/// cache), or read into its own heap memory (as a VM with a block device keeps its own
/// copy of what it read).
fn hold(image: &Path, private: bool) -> Result<Box<dyn std::any::Any>, BenchError> {
    if private {
        let img = Image::open(image)?;
        let mut buf = vec![0u8; img.virtual_size() as usize];
        for (i, chunk) in buf.chunks_mut(1 << 20).enumerate() {
            img.read_at(GuestOffset((i as u64) << 20), chunk)?;
        }
        Ok(Box::new(buf))
    } else {
        let space = ImageSpace::map(image, &MapOptions::default())?;
        space.read_all()?;
        Ok(Box::new(space))
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Point {
    distinct: u64,
    file: u64,
    anon_shmem: u64,
    setup_ms: f64,
    /// What the readers added as the cgroup meter sees it (None without cgroups).
    cgroup: Option<CgroupAdded>,
}

/// Pages charged to the readers' memory cgroup.
#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
struct CgroupAdded {
    anon_shmem: u64,
    page_cache: u64,
}

/// This process's distinct pages: (all, file, anon + shmem); PSS pages when PFNs are hidden.
fn pages_now() -> Result<(u64, u64, u64), BenchError> {
    let s = Meter::for_self(Options::default())?.sample()?;
    let d = s.distinct.unwrap_or_default();
    let distinct = if s.pfn_visible { d.total } else { s.pss_bytes / s.page_size_bytes };
    Ok((distinct, d.file, d.anon + d.shmem))
}

/// Drops the clean page cache of the chain's layer files, so the readers' own reads
/// bring it in (and it is charged to their group): `sync` then `dd iflag=nocache
/// count=0`, which asks the kernel to drop a whole file's cache.
fn drop_page_cache(image: &Path) -> Result<(), BenchError> {
    let dir = image.parent().unwrap_or(Path::new("."));
    for layer in ["base.qcow2", "mid.qcow2", "top.qcow2"] {
        let f = dir.join(layer).display().to_string();
        sh(dir, "sync", std::slice::from_ref(&f))?;
        sh(dir, "dd", &[format!("if={f}"), "iflag=nocache".into(), "count=0".into(), "status=none".into()])?;
    }
    Ok(())
}

/// `n` readers holding the image at once, in a child in its own memory cgroup: the
/// pages they add, by both meters.
fn measure(image: &Path, n: usize, private: bool, unavailable: &mut Option<String>) -> Result<Point, BenchError> {
    drop_page_cache(image)?;
    in_group("bench-image", unavailable, |group| measure_here(image, n, private, group))
}

/// [`measure`] in the measured process.
fn measure_here(image: &Path, n: usize, private: bool, group: Option<&Group>) -> Result<Point, BenchError> {
    let usage = || group.map(|g| g.usage()).transpose();
    let cgroup_before = usage()?;
    let before = pages_now()?;
    let t = Instant::now();
    let holds = (0..n).map(|_| hold(image, private)).collect::<Result<Vec<_>, _>>()?;
    let setup_ms = t.elapsed().as_secs_f64() * 1e3;
    let after = pages_now()?;
    let cgroup_after = usage()?;
    drop(holds);
    let added = |a: u64, b: u64| a.saturating_sub(b);
    let ps = advm::addr::page_size() as u64;
    Ok(Point {
        distinct: added(after.0, before.0),
        file: added(after.1, before.1),
        anon_shmem: added(after.2, before.2),
        setup_ms,
        cgroup: cgroup_before.zip(cgroup_after).map(|(b, a)| CgroupAdded {
            anon_shmem: added(a.anon_shmem_bytes(), b.anon_shmem_bytes()) / ps,
            page_cache: added(a.page_cache_bytes, b.page_cache_bytes) / ps,
        }),
    })
}

impl Bench for ImageBench {
    fn name(&self) -> &'static str {
        "image"
    }

    fn description(&self) -> &'static str {
        "N readers of one 3-layer qcow2 chain: distinct physical pages when mapped (shared page cache) vs read into private memory"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        let (mib, ns): (u64, &[usize]) = if opts.quick { (16, &[1, 2, 4]) } else { (256, &[1, 2, 4, 8, 16]) };
        let dir = Scratch::new("bench-image")?;
        let image = build_chain(dir.path(), mib)?;
        let img = Image::open(&image)?;
        let map = img.extent_map()?;
        let ps = advm::addr::page_size() as u64;
        let image_pages = mib * 1024 * 1024 / ps;
        report.configuration.insert("image_mib".into(), serde_json::json!(mib));
        report.configuration.insert("layers".into(), serde_json::json!(img.layers().len()));
        report.configuration.insert("extents".into(), serde_json::json!(map.extents.len()));
        report.configuration.insert("readers".into(), serde_json::json!(ns));
        let bar = opts.progress_bar(2 * ns.len() as u64, "image");
        let mut unavailable = None;
        for &n in ns {
            for (mode, private) in [("mapped", false), ("private read", true)] {
                bar.inc(1);
                let mut distinct = Vec::new();
                let mut setup = Vec::new();
                let mut last = None;
                for _ in 0..opts.runs.max(1) {
                    let p = measure(&image, n, private, &mut unavailable)?;
                    distinct.push(p.distinct as f64);
                    setup.push(p.setup_ms);
                    last = Some(p);
                }
                let p = last.expect("at least one run");
                meters::check(
                    &mut report.meter_disagreements,
                    &format!("image, {n} readers, {mode}"),
                    (p.anon_shmem * ps) as f64,
                    p.cgroup.map(|c| (c.anon_shmem * ps) as f64),
                );
                let per_image: Vec<f64> = distinct.iter().map(|d| d / image_pages as f64).collect();
                report.rows.push(
                    Row::new()
                        .with("readers", n)
                        .with("reader", mode)
                        .figure(Figure::new("distinct pages", "pages", distinct))
                        .figure(Figure::new("images' worth", "x", per_image))
                        .figure(Figure::single("file pages", "pages", p.file as f64))
                        .figure(Figure::single("anon+shmem pages", "pages", p.anon_shmem as f64))
                        .figure_if(
                            p.cgroup.is_some(),
                            Figure::single(
                                "cgroup anon+shmem pages",
                                "pages",
                                p.cgroup.map_or(0, |c| c.anon_shmem) as f64,
                            ),
                        )
                        .figure_if(
                            p.cgroup.is_some(),
                            Figure::single(
                                "cgroup page cache pages",
                                "pages",
                                p.cgroup.map_or(0, |c| c.page_cache) as f64,
                            ),
                        )
                        .figure(Figure::new("setup+read", "ms", setup)),
                );
            }
        }
        bar.finish_and_clear();
        report.notes.push(format!(
            "image: {} virtual, {} pages; {} extents over {} layers",
            fmt_bytes(mib << 20),
            image_pages,
            map.extents.len(),
            img.layers().len()
        ));
        report.notes.extend(unavailable);
        report.notes.push(
            "distinct pages (the mmapcopy paper's meter) count what the readers map; private readers also leave one \
             page-cache copy behind, unmapped: the distinct meter misses it, the cgroup page cache counts it (the \
             layer files' cache is dropped before each point and the readers run in a child in their own memory cgroup)"
                .into(),
        );
        report.notes.push(
            "compressed clusters are decompressed into a memfd per reader (a daemon would share it): part of the mapped anon+shmem pages".into(),
        );
        if !advm::probe::facts().pfn_visible {
            report.notes.push("PFNs hidden: distinct pages fall back to PSS".into());
        }
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        let (mib, n) = (64, 4);
        let dir = Scratch::new("bench-image")?;
        let image = build_chain(dir.path(), mib)?;
        let mut unavailable = None;
        let mapped = measure(&image, n, false, &mut unavailable)?;
        let private = measure(&image, n, true, &mut unavailable)?;
        let ps = advm::addr::page_size() as u64;
        let mut disagreements = Vec::new();
        for (what, p) in [("image demo, mapped", &mapped), ("image demo, private", &private)] {
            let cgroup = p.cgroup.map(|c| (c.anon_shmem * ps) as f64);
            meters::check(&mut disagreements, what, (p.anon_shmem * ps) as f64, cgroup);
        }
        if !disagreements.is_empty() {
            return Err(BenchError::Usage(disagreements.join("; ")));
        }
        // the cgroup's whole charge: anon+shmem and the page cache the readers brought in
        let charged = |p: &Point| {
            p.cgroup.map_or(String::new(), |c| {
                format!("; cgroup {} with page cache", fmt_bytes((c.anon_shmem + c.page_cache) * ps))
            })
        };
        Ok(vec![DemoRow {
            capability: "image".into(),
            workload: format!("{n} readers of a {mib} MiB 3-layer qcow2 chain"),
            advm: format!(
                "{} distinct pages ({}){}",
                mapped.distinct,
                fmt_bytes(mapped.distinct * ps),
                charged(&mapped)
            ),
            baseline: format!(
                "private reads: {} pages ({}){}",
                private.distinct,
                fmt_bytes(private.distinct * ps),
                charged(&private)
            ),
            gain: format!("{:.1}x less memory", private.distinct as f64 / mapped.distinct.max(1) as f64),
        }])
    }
}
