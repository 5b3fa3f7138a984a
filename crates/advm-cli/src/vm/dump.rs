//! `advm vm dump`: asks the shim inside a running `--disk pmem` VM's QEMU for the
//! clusters its guest wrote (it forks, leaving all but the device and what the copier
//! touches out of the fork: that is the pause; a grandchild copies from the frozen view
//! while the guest runs on) and turns them into a qcow2 overlay whose
//! backing file is the chain's top layer.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use advm::image::{dump, request_dump, LayerFormat};

use super::run::{workdir_of, VM_INFO};
use crate::CliError;

fn usage(s: String) -> CliError {
    CliError::Usage(s)
}

/// Runs `advm vm dump --vm PID --out FILE`.
pub fn run(vm: u32, out: &Path, timeout: Duration, json: bool) -> Result<(), CliError> {
    let dir = workdir_of(vm);
    let info_path = dir.join(VM_INFO);
    let text = std::fs::read_to_string(&info_path).map_err(|e| {
        CliError::Io(format!("{} (is {vm} the pid of a running `advm vm run`?)", info_path.display()), e)
    })?;
    let info: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| usage(format!("{}: {e}", info_path.display())))?;
    if info["disk"] != "pmem" {
        return Err(usage(format!("VM {vm} runs with --disk {}; dumps need --disk pmem", info["disk"])));
    }
    let (Some(qemu), Some(size), Some(image)) =
        (info["qemu_pid"].as_u64(), info["size"].as_u64(), info["image"].as_str())
    else {
        return Err(usage(format!("{}: missing qemu_pid, size or image", info_path.display())));
    };
    if out.exists() {
        return Err(usage(format!("{}: already exists; a dump never overwrites a file", out.display())));
    }
    for f in ["dump.done", "dump.raw", "dump.clusters", "dump.pause_ns", "dump.timing"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let faults_before = minor_faults(qemu);
    let t0 = Instant::now();
    request_dump(qemu as u32)?;
    while !dir.join("dump.done").exists() {
        if t0.elapsed() > timeout {
            return Err(usage(format!("no dump from QEMU {qemu} within {} s", timeout.as_secs())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let copied = t0.elapsed();
    let faults = faults_before.zip(minor_faults(qemu)).map(|(a, b)| b.saturating_sub(a));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let status = read("dump.done");
    if status.trim() != "0" {
        return Err(usage(format!("the shim's dump failed (status {})", status.trim())));
    }
    let clusters: Vec<u64> = read("dump.clusters").lines().filter_map(|l| l.parse().ok()).collect();
    let raw_path = dir.join("dump.raw");
    let raw = std::fs::File::open(&raw_path).map_err(|e| CliError::Io(raw_path.display().to_string(), e))?;
    // A vm.json of a VM started before the format was recorded: its top was qcow2.
    let format = if info["format"] == "raw" { LayerFormat::Raw } else { LayerFormat::Qcow2 };
    let bytes = dump::write_overlay(out, size, &clusters, image, format, |guest, buf| {
        raw.read_exact_at(buf, guest).map_err(|e| advm::Error::io(&raw_path, e))
    })?;
    let _ = std::fs::remove_file(&raw_path);
    let pause_ns: u64 = read("dump.pause_ns").trim().parse().unwrap_or(0);
    // The shim's parts of the pause (a shim before stop 29 writes none). Stop 30's shim
    // adds how it scanned: 1 /proc/self/maps and its own records of the program's
    // MADV_DONTFORK (bytes mapped), 0 /proc/self/smaps (bytes resident).
    let t: Vec<u64> = read("dump.timing").lines().filter_map(|l| l.parse().ok()).collect();
    let (parts, kind) = match t[..] {
        [a, b, c, d, e, f, kind] => (Some([a, b, c, d, e, f]), kind),
        [a, b, c, d, e, f] => (Some([a, b, c, d, e, f]), 0),
        _ => (None, 0),
    };
    let ms = |ns: u64| ns as f64 / 1e6;
    let (scan, bytes_kind) = if kind == 1 { ("maps", "mapped") } else { ("smaps", "resident") };
    let data_files: Vec<(usize, String)> = serde_json::from_value(info["data_files"].clone()).unwrap_or_default();
    if json {
        let written = Written { out, backing: image, clusters: clusters.len(), bytes, data_files: &data_files };
        let report = report_json(&written, pause_ns, copied, parts.map(|p| (p, kind)), faults);
        outln!("{report}");
        return Ok(());
    }
    outln!(
        "{}: {} clusters of 64 KiB ({} bytes) over {image}; QEMU's signal handler paused {:.3} ms (marks, fork, \
         unmarks, first child), copy done after {} ms",
        out.display(),
        clusters.len(),
        bytes,
        ms(pause_ns),
        copied.as_millis()
    );
    if let Some([scan_ns, marks, fork, after, ranges, kib]) = parts {
        outln!(
            "  {scan} scan {:.3} ms (guest running), marks {:.3} ms, fork {:.3} ms, unmarks + first child {:.3} ms; \
             left out of the fork: {ranges} ranges, {:.1} MiB {bytes_kind}",
            ms(scan_ns),
            ms(marks),
            ms(fork),
            ms(after),
            kib as f64 / 1024.0
        );
    }
    if let Some(n) = faults {
        outln!("  QEMU's minor faults from the request until the copy was done: {n}");
    }
    if let Some(opts) = image_opts(out, &data_files) {
        outln!("{}", data_file_hint(&opts));
    }
    Ok(())
}

/// The `--image-opts` that open the overlay `out` with qemu-img from any directory when
/// the chain below it keeps data in external data files (`data_files`: depth in the
/// VM's chain, absolute path): QEMU 7.2 looks for a relative data file name in its
/// working directory, so `qemu-img check` of the overlay failed anywhere but there
/// (`Could not open 'base.data'`). None without data files.
fn image_opts(out: &Path, data_files: &[(usize, String)]) -> Option<String> {
    if data_files.is_empty() {
        return None;
    }
    let esc = |s: &str| s.replace(',', ",,");
    let abs = std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf());
    // The overlay is depth 0; the VM's chain starts below it.
    let opts: String = data_files
        .iter()
        .map(|(depth, path)| format!(",{}data-file.filename={}", "backing.".repeat(depth + 1), esc(path)))
        .collect();
    Some(format!("driver=qcow2,file.filename={}{opts}", esc(&abs.display().to_string())))
}

/// The text mode's line saying how to open the overlay ([`image_opts`]).
fn data_file_hint(image_opts: &str) -> String {
    format!(
        "  the chain keeps data in external data files, which QEMU looks for in its working directory when \
         named relative; open the overlay with them named: qemu-img check --image-opts {image_opts}"
    )
}

/// The shim's parts of the pause, in order: scan, marks, fork, unmarks and the first
/// child (ns), ranges left out of the fork and their KiB.
type Parts = [u64; 6];

/// The overlay a dump wrote: the `--json` object's first fields.
struct Written<'a> {
    out: &'a Path,
    /// The chain's top, absolute.
    backing: &'a str,
    clusters: usize,
    /// The overlay's file size.
    bytes: u64,
    /// The chain's external data files (depth, absolute path).
    data_files: &'a [(usize, String)],
}

/// `--json`'s object (every key is listed in docs/vm.md, "Fast dump"). `parts` is the
/// shim's timing with how it scanned (1 /proc/self/maps, 0 smaps), `None` from a shim
/// before stop 29; `faults` `None` when /proc/QEMU/stat could not be read.
fn report_json(
    w: &Written<'_>,
    pause_ns: u64,
    copied: Duration,
    parts: Option<(Parts, u64)>,
    faults: Option<u64>,
) -> serde_json::Value {
    let ms = |ns: u64| ns as f64 / 1e6;
    let parts = parts.map(|([scan_ns, marks, fork, after, ranges, kib], kind)| {
        let (scan, bytes_kind) = if kind == 1 { ("maps", "mapped") } else { ("smaps", "resident") };
        serde_json::json!({
            "scan": scan,
            "scan_ms": ms(scan_ns),
            "marks_ms": ms(marks),
            "fork_ms": ms(fork),
            "unmarks_and_first_child_ms": ms(after),
            "ranges_left_out": ranges,
            "left_out_kib": kib,
            "left_out_kind": bytes_kind,
        })
    });
    serde_json::json!({
        "out": w.out.display().to_string(),
        "backing": w.backing,
        "clusters": w.clusters,
        "cluster_bytes": dump::DUMP_CLUSTER,
        "bytes": w.bytes,
        "data_files": w.data_files.iter().map(|(_, p)| p).collect::<Vec<_>>(),
        "image_opts": image_opts(w.out, w.data_files),
        "pause_ms": ms(pause_ns),
        "copy_ms": copied.as_secs_f64() * 1e3,
        "parts": parts,
        "qemu_minor_faults": faults,
    })
}

/// The minor faults of process `pid` so far, all its threads (/proc/PID/stat field 10).
fn minor_faults(pid: u64) -> Option<u64> {
    Some(procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?.minflt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the JSON object, nested ones too.
    fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
        if let Some(m) = v.as_object() {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
    }

    /// A dump over a chain with external data files says how qemu-img opens it from
    /// any directory (it looked for a relative data file name in its working
    /// directory, and `qemu-img check` of the overlay failed elsewhere).
    #[test]
    fn a_dump_over_data_files_names_them_for_qemu_img() {
        assert_eq!(image_opts(Path::new("/d/o.qcow2"), &[]), None);
        let files = [(1, "/d/b,1.data".to_string()), (0, "/d/top.data".to_string())];
        let opts = image_opts(Path::new("/d/o.qcow2"), &files).unwrap();
        let want = "driver=qcow2,file.filename=/d/o.qcow2,\
                    backing.backing.data-file.filename=/d/b,,1.data,backing.data-file.filename=/d/top.data";
        assert_eq!(opts, want);
        let hint = data_file_hint(&opts);
        assert!(hint.ends_with(&format!("qemu-img check --image-opts {want}")), "{hint}");
        // --json: the same, in a field of its own (it had only the text mode's line)
        let w = Written {
            out: Path::new("/d/o.qcow2"),
            backing: "/d/top.qcow2",
            clusters: 1,
            bytes: 1,
            data_files: &files,
        };
        let report = report_json(&w, 0, Duration::ZERO, None, None);
        assert_eq!(report["image_opts"], want, "{report}");
        assert_eq!(report["data_files"], serde_json::json!(["/d/b,1.data", "/d/top.data"]), "{report}");
    }

    #[test]
    fn every_field_of_dump_json_is_listed_in_the_docs() {
        let docs = include_str!("../../../../docs/vm.md");
        let files = [(0, "/d/base.data".to_string())];
        let w = Written {
            out: Path::new("/d/o.qcow2"),
            backing: "/d/top.qcow2",
            clusters: 3,
            bytes: 7 << 16,
            data_files: &files,
        };
        let report = report_json(&w, 2_500_000, Duration::from_millis(40), Some(([1, 2, 3, 4, 5, 6], 1)), Some(11));
        let mut all = Vec::new();
        keys(&report, &mut all);
        assert!(all.len() >= 19, "{all:?}");
        let missing: Vec<&String> = all.iter().filter(|k| !docs.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty(), "docs/vm.md does not list {missing:?} of `advm vm dump --json`");
        assert_eq!(report["parts"]["left_out_kind"], "mapped");
        assert_eq!(report["parts"]["fork_ms"], 3e-6);
        // A shim without timings, a QEMU whose stat could not be read: null, not absent.
        let w = Written { out: Path::new("o"), backing: "b", clusters: 0, bytes: 0, data_files: &[] };
        let bare = report_json(&w, 0, Duration::ZERO, None, None);
        assert!(bare["parts"].is_null() && bare["qemu_minor_faults"].is_null() && bare["image_opts"].is_null());
        assert_eq!(bare["data_files"], serde_json::json!([]));
        assert_eq!(bare.as_object().unwrap().len(), report.as_object().unwrap().len());
    }
}
