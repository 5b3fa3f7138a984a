//! `advm image info|map|cat` and `advm bench image --quick` end to end.

use std::path::{Path, PathBuf};
use std::process::Command;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

fn have_qemu() -> bool {
    let ok = Command::new("qemu-img").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: qemu-img not found (Debian package qemu-utils)");
    }
    ok
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("advm-cli-image-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn run(dir: &Path, prog: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(prog).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// base.raw <- mid.qcow2 <- top.qcow2, with data, zeros and a compressed cluster.
fn chain(d: &Path) {
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "1M"]);
    run(d, "qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 256k", "base.raw"]);
    run(
        d,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", "-b", "base.raw", "-F", "raw", "mid.qcow2", "2M"],
    );
    run(
        d,
        "qemu-io",
        &["-c", "write -c -P 0x33 512k 4k", "-c", "write -P 0x22 64k 8k", "-c", "write -z 128k 8k", "mid.qcow2"],
    );
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", "top.qcow2"]);
    run(d, "qemu-io", &["-c", "write -P 0x44 1536k 4k", "top.qcow2"]);
}

#[test]
fn info_map_cat() {
    if !have_qemu() {
        return;
    }
    let d = dir("cmds");
    chain(&d.0);
    let info: serde_json::Value =
        serde_json::from_slice(&run(&d.0, ADVM, &["image", "info", "top.qcow2", "--json"])).unwrap();
    let formats: Vec<&str> = info["layers"].as_array().unwrap().iter().map(|l| l["format"].as_str().unwrap()).collect();
    assert_eq!(formats, ["qcow2", "qcow2", "raw"]);
    assert_eq!(info["virtual_size_bytes"], 2 * 1024 * 1024);

    let map: serde_json::Value =
        serde_json::from_slice(&run(&d.0, ADVM, &["image", "map", "top.qcow2", "--json"])).unwrap();
    let ext = map["extents"].as_array().unwrap();
    let first = &ext[0];
    assert_eq!(
        (first["start"].as_u64(), first["kind"].as_str(), first["depth"].as_u64()),
        (Some(0), Some("data"), Some(2))
    );
    assert!(first["file"].as_str().unwrap().ends_with("base.raw"));
    let kinds: Vec<&str> = ext.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"compressed") && kinds.contains(&"zero"), "{kinds:?}");
    let text = String::from_utf8(run(&d.0, ADVM, &["image", "map", "top.qcow2"])).unwrap();
    assert!(text.starts_with("start     length  kind"), "{text}");

    run(&d.0, "qemu-img", &["convert", "-O", "raw", "top.qcow2", "expect.raw"]);
    let expect = std::fs::read(d.0.join("expect.raw")).unwrap();
    let all = run(&d.0, ADVM, &["image", "cat", "top.qcow2"]);
    assert!(all == expect, "advm image cat differs from qemu-img convert");
    let part = run(&d.0, ADVM, &["image", "cat", "top.qcow2", "--offset", "520000", "--length", "10000"]);
    assert_eq!(part, expect[520000..530000]);

    let out = Command::new(ADVM)
        .args(["image", "cat", "top.qcow2", "--offset", "2097000", "--length", "1000"])
        .current_dir(&d.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "advm: --offset 2097000 --length 1000 runs past the 2097152-byte virtual size of top.qcow2\n"
    );
    let out = Command::new(ADVM).args(["image", "map", "nothere.qcow2"]).current_dir(&d.0).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "advm: nothere.qcow2: No such file or directory (os error 2)\n");
}

#[test]
fn bench_image_quick_shares_pages() {
    if !have_qemu() {
        return;
    }
    let out = Command::new(ADVM).args(["bench", "image", "--quick", "--json", "--runs", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Figure `fig` (0: distinct pages, 3: anon+shmem pages) of the row for n readers.
    let figure = |n: &str, reader: &str, fig: usize| -> f64 {
        let row = r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["config"][0][1] == n && row["config"][1][1] == reader)
            .unwrap();
        row["figures"][fig]["median"].as_f64().unwrap()
    };
    if !r["machine"]["pfn_visible"].as_bool().unwrap_or(false) {
        eprintln!("PFNs hidden (not root): checking only that the bench ran");
        return;
    }
    // The image is 16 MiB = 4096 pages. Going from 1 to 4 mapping readers adds each
    // new reader's own memory (its anon+shmem pages) but no second copy of the image;
    // going from 1 to 4 private readers adds three images.
    let image = 4096.0;
    let (mapped1, mapped4) = (figure("1", "mapped", 0), figure("4", "mapped", 0));
    let own = figure("1", "mapped", 3);
    assert!(mapped4 - mapped1 < 3.0 * own + 0.25 * image, "mapped: {mapped1} -> {mapped4} pages (own {own})");
    let (private1, private4) = (figure("1", "private read", 0), figure("4", "private read", 0));
    assert!(private4 - private1 > 3.0 * image * 0.95, "private: {private1} -> {private4} pages");
}
