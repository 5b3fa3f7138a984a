//! `advm image info|map|cat` and `advm bench image --quick` end to end.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

mod common;
use common::{dir, have, qemu, run};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

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
    if !have("qemu-img") {
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
    // a size-0 image (qcow2 and raw) is an empty disk: nothing written, success
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "empty.qcow2", "0"]);
    std::fs::write(d.0.join("empty.raw"), b"").unwrap();
    for empty in ["empty.qcow2", "empty.raw"] {
        assert_eq!(run(&d.0, ADVM, &["image", "cat", empty]), b"", "{empty}");
    }
    let out = Command::new(ADVM).args(["image", "map", "nothere.qcow2"]).current_dir(&d.0).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "advm: nothere.qcow2: No such file or directory (os error 2)\n");
}

#[test]
fn bench_image_quick_shares_pages() {
    if !have("qemu-img") {
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

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// Runs `advm` in `dir`, killing it if it runs longer than 10 s (a hang fails the
/// test instead of hanging it).
fn advm_within_10s(dir: &Path, args: &[&str]) -> std::process::Output {
    use std::process::Stdio;
    let mut child =
        Command::new(ADVM).args(args).current_dir(dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() >= 10 {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("advm {args:?} still running after 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn fails_with(out: &std::process::Output, stderr: &str) {
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), stderr);
}

#[test]
fn cat_stops_at_the_materialise_limit() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("materialise");
    let d = &d.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", "c.qcow2", "300M"]);
    run(d, "qemu-io", &["-c", "write -c -P 0x5a 0 64k", "c.qcow2"]);
    // 4200 copies of that compressed cluster at distinct offsets, each named by one
    // L2 entry: 2 MiB of file, 275 MB once decompressed.
    let p = d.join("c.qcow2");
    let bytes = std::fs::read(&p).unwrap();
    let l2 = (be64(&bytes, be64(&bytes, 40) as usize) & 0x00ff_ffff_ffff_fe00) as usize;
    let e = be64(&bytes, l2);
    let (off, sectors) = (e & ((1 << 54) - 1), ((e >> 54) & 0xff) + 1);
    let stream = &bytes[off as usize..bytes.len().min((off + sectors * 512) as usize)];
    let base = (bytes.len() as u64).div_ceil(512) * 512;
    let stride = (sectors + 1) * 512;
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    for i in 0..4200u64 {
        let at = base + i * stride + (off & 511);
        f.write_all_at(stream, at).unwrap();
        f.write_all_at(&((1u64 << 62) | (sectors - 1) << 54 | at).to_be_bytes(), l2 as u64 + 8 * i).unwrap();
    }
    let out = Command::new(ADVM).args(["image", "cat", "c.qcow2", "--length", "16"]).current_dir(d).output().unwrap();
    fails_with(
        &out,
        "advm: c.qcow2: mapping it would materialise 275251200 bytes in memory (decompressed clusters, partial \
         pages, runs copied over the budget), over the 268435456-byte limit; raise it with --max-materialised \
         (MapOptions::max_materialised_bytes)\n",
    );
    let out = run(d, ADVM, &["image", "cat", "c.qcow2", "--length", "16", "--max-materialised", "300000000"]);
    assert_eq!(out, [0x5a; 16]);
}

/// Removes the backing-format extension of a qcow2 made by qemu-img (its type becomes
/// one nobody knows), as images written without `-F` have none.
fn strip_backing_format(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let mut at = u32::from_be_bytes(bytes[100..104].try_into().unwrap()) as usize;
    loop {
        let ty = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        assert_ne!(ty, 0, "no backing format extension in {}", path.display());
        if ty == 0xe279_2aca {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.write_all_at(&0x0bad_0bad_u32.to_be_bytes(), at as u64).unwrap();
            return;
        }
        at += 8 + len.div_ceil(8) * 8;
    }
}

#[test]
fn backing_files_outside_the_image_directory_or_probed_raw_are_refused() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("confine");
    let d = std::fs::canonicalize(&d.0).unwrap();
    let inner = d.join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(d.join("secret.raw"), b"root:x:0:0:root:/root:/bin/bash\n").unwrap();
    run(
        &inner,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-u", "-b", "../secret.raw", "-F", "raw", "top.qcow2", "1M"],
    );
    strip_backing_format(&inner.join("top.qcow2"));
    let outside = format!(
        "advm: top.qcow2: backing file \"../secret.raw\" resolves to {}, outside {}, the directory of the image \
         opened; refusing to follow it (allow with --allow-backing-outside, ImageOptions::allow_backing_outside)\n",
        d.join("secret.raw").display(),
        inner.display()
    );
    for cmd in ["info", "map", "cat"] {
        fails_with(&advm_within_10s(&inner, &["image", cmd, "top.qcow2"]), &outside);
    }
    let probed = format!(
        "advm: top.qcow2: backing file \"../secret.raw\" ({}) has no backing format and is not qcow2; refusing to \
         probe it as raw (allow with --allow-probed-raw, ImageOptions::allow_probed_raw, or record the format: \
         qemu-img rebase -u -b ../secret.raw -F raw)\n",
        d.join("secret.raw").display()
    );
    fails_with(&advm_within_10s(&inner, &["image", "cat", "top.qcow2", "--allow-backing-outside"]), &probed);
    let out = run(
        &inner,
        ADVM,
        &["image", "cat", "top.qcow2", "--length", "9", "--allow-backing-outside", "--allow-probed-raw"],
    );
    assert_eq!(out, b"root:x:0:");
}

#[test]
fn a_fifo_backing_file_is_refused_without_hanging() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("fifo");
    let d = &d.0;
    run(d, "mkfifo", &["pipe"]);
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-u", "-b", "pipe", "-F", "raw", "top.qcow2", "1M"]);
    let msg = "advm: pipe: is a FIFO; image layers must be regular files or block devices\n";
    for cmd in ["info", "map", "cat"] {
        fails_with(&advm_within_10s(d, &["image", cmd, "top.qcow2"]), msg);
    }
    fails_with(
        &advm_within_10s(d, &["image", "cat", "pipe"]),
        "advm: pipe: is a FIFO; image layers must be regular files or block devices\n",
    );
}

#[test]
fn cat_of_a_layer_truncated_while_mapped_fails_clearly() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::Stdio;
    if !have("qemu-img") {
        return;
    }
    let d = dir("shrink");
    let d = &d.0;
    let base = d.join("base.raw");
    std::fs::write(&base, vec![0x11u8; 8 << 20]).unwrap();
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2"]);
    // Starts `advm image cat`, waits until it mapped the image and is writing the first
    // MiB into the (full) pipe, runs `meddle`, then reads everything and its exit.
    let cat = |meddle: &dyn Fn()| {
        let mut child = Command::new(ADVM)
            .args(["image", "cat", "top.qcow2"])
            .current_dir(d)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).unwrap();
        meddle();
        let mut rest = Vec::new();
        stdout.read_to_end(&mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(rest.len() < 8 << 20, "read all of it");
        out
    };
    // A writer opening the layer breaks the read lease cat holds: cat stops.
    let out = cat(&|| {
        let open = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&base);
        assert_eq!(open.unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "cat holds no read lease");
    });
    fails_with(
        &out,
        "advm: base.raw: opened for writing or truncated by another process while mapped (read lease broken); \
         refusing to read through the mapping\n",
    );
    // A writer that had it open already (no lease possible) truncates it: cat sees the
    // size before it reads, rather than dying of SIGBUS.
    let writer = std::fs::OpenOptions::new().write(true).open(&base).unwrap();
    let out = cat(&|| writer.set_len(1 << 20).unwrap());
    fails_with(
        &out,
        "advm: base.raw: shrank from 8388608 to 1048576 bytes while mapped; refusing to read through the mapping\n",
    );
}

/// A header whose virtual size is not a multiple of 512 (written by hand: qemu-img
/// rounds up when it creates) reads as QEMU reads it: rounded down to whole sectors.
#[test]
fn a_virtual_size_not_a_multiple_of_512_reads_as_qemu_reads_it() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("oddsize");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "odd.qcow2", "1000448"]);
    run(&d.0, "qemu-io", &["-c", "write -P 0x5a 0 1000448", "odd.qcow2"]);
    let f = std::fs::OpenOptions::new().write(true).open(d.0.join("odd.qcow2")).unwrap();
    f.write_all_at(&1_000_001u64.to_be_bytes(), 24).unwrap();
    run(&d.0, "qemu-img", &["convert", "-O", "raw", "odd.qcow2", "odd.raw"]);
    let want = std::fs::read(d.0.join("odd.raw")).unwrap();
    assert_eq!(want.len(), 999_936, "QEMU's reading of the size");
    let out = Command::new(ADVM).args(["image", "cat", "odd.qcow2"]).current_dir(&d.0).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout == want, "advm read {} bytes, QEMU {}", out.stdout.len(), want.len());
}

#[test]
fn an_image_a_qemu_writes_is_refused_and_force_share_reads_it() {
    if !have("qemu-io") {
        return;
    }
    let d = dir("writer");
    let d = &d.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "w.qcow2", "1M"]);
    run(d, "qemu-io", &["-c", "write -P 0x77 0 4k", "w.qcow2"]);
    let _writer = qemu::Holder::start(d, "qemu-io", &["-c", "sleep 60000", "w.qcow2"], &d.join("w.qcow2"), 101);
    let refused = "advm: w.qcow2: another process has it open for writing (it holds QEMU's write lock, byte 101 \
                   of the file), so the disk may change while it is read; refusing to read it (stop the writer, \
                   which `fuser w.qcow2` names, or read anyway with --force-share/-U, ImageOptions::force_share)\n";
    // qemu-io takes its locks when it has opened the image.
    let start = std::time::Instant::now();
    while advm_within_10s(d, &["image", "info", "w.qcow2"]).status.success() {
        assert!(start.elapsed().as_secs() < 10, "qemu-io took no lock in 10 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for cmd in ["info", "map", "cat"] {
        fails_with(&advm_within_10s(d, &["image", cmd, "w.qcow2"]), refused);
    }
    let out = run(d, ADVM, &["image", "cat", "-U", "w.qcow2", "--length", "2"]);
    assert_eq!(out, [0x77, 0x77]);
    run(d, ADVM, &["image", "map", "--force-share", "w.qcow2"]);
}

#[test]
fn qcow_v1_is_refused_with_the_command_that_converts_it_and_external_data_files_are_read() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("convert");
    let d = std::fs::canonicalize(&d.0).unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow", "v1.qcow", "1M"]);
    fails_with(
        &advm_within_10s(&d, &["image", "info", "v1.qcow"]),
        "advm: v1.qcow: is a qcow (version 1) image, not qcow2; convert it: qemu-img convert -O qcow2 v1.qcow \
         out.qcow2\n",
    );
    // An external data file is read (beside the layer that names it), not refused.
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "data_file=df.raw", "df.qcow2", "1M"]);
    run(&d, "qemu-io", &["-c", "write -P 0x23 4k 8k", "df.qcow2"]);
    let mut expect = vec![0u8; 1 << 20];
    expect[4096..12288].fill(0x23);
    assert!(run(&d, ADVM, &["image", "cat", "df.qcow2"]) == expect, "advm image cat df.qcow2 differs");
    let map = String::from_utf8(run(&d, ADVM, &["image", "map", "df.qcow2"])).unwrap();
    assert!(map.lines().any(|l| l.starts_with("0x0 ") && l.contains("data") && l.contains("df.raw")), "{map}");
    let info = String::from_utf8(run(&d, ADVM, &["image", "info", "df.qcow2"])).unwrap();
    assert!(info.contains("data file df.raw"), "{info}");
    // Below an overlay: the copy, and the overlay pointed at it; both commands work.
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow", "sub/base.qcow", "1M"]);
    run(&d, "qemu-io", &["-f", "qcow", "-c", "write -P 0x21 0 8k", "sub/base.qcow"]);
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow", "-F", "qcow", "sub/top.qcow2"]);
    run(&d, "qemu-io", &["-c", "write -P 0x22 4k 8k", "sub/top.qcow2"]);
    let out = d.join("sub/out.qcow2");
    let out = out.display();
    fails_with(
        &advm_within_10s(&d, &["image", "map", "sub/top.qcow2"]),
        &format!(
            "advm: sub/base.qcow: unsupported layer format \"qcow\" (supported: qcow2, raw); convert it: qemu-img \
             convert -O qcow2 sub/base.qcow {out}, then qemu-img rebase -u -b {out} -F qcow2 sub/top.qcow2\n"
        ),
    );
    run(&d, "qemu-img", &["convert", "-O", "raw", "sub/top.qcow2", "expect.raw"]);
    run(&d, "qemu-img", &["convert", "-O", "qcow2", "sub/base.qcow", &out.to_string()]);
    run(&d, "qemu-img", &["rebase", "-u", "-b", &out.to_string(), "-F", "qcow2", "sub/top.qcow2"]);
    assert!(run(&d, ADVM, &["image", "cat", "sub/top.qcow2"]) == std::fs::read(d.join("expect.raw")).unwrap());
}

/// A missing backing file or external data file of an image named relative is named
/// by the absolute path it was looked for at, as docs/image.md shows it (it said
/// `(resolved to gone.data)`, the name again, for `advm image info top.qcow2`).
#[test]
fn a_missing_backing_or_data_file_is_named_by_its_absolute_path() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("missing-abs");
    let d = std::fs::canonicalize(&d.0).unwrap();
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-u", "-b", "gone.qcow2", "-F", "qcow2", "o.qcow2", "1M"]);
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "data_file=gone.data", "df.qcow2", "1M"]);
    std::fs::remove_file(d.join("gone.data")).unwrap();
    let no_such = "No such file or directory (os error 2)";
    fails_with(
        &advm_within_10s(&d, &["image", "info", "o.qcow2"]),
        &format!(
            "advm: o.qcow2: backing file \"gone.qcow2\" (resolved to {}): {no_such}\n",
            d.join("gone.qcow2").display()
        ),
    );
    fails_with(
        &advm_within_10s(&d, &["image", "info", "df.qcow2"]),
        &format!(
            "advm: df.qcow2: external data file \"gone.data\" (resolved to {}): {no_such}\n",
            d.join("gone.data").display()
        ),
    );
}

/// An image made from its parent directory (`qemu-img create -o data_file=sub/x.data
/// sub/x.qcow2`) names its data file relative to that directory, where QEMU 7.2 looks;
/// advm looks beside the layer. The refusal says where QEMU finds it and the amend
/// that records it for both, and after that amend both read it.
#[test]
fn a_data_file_named_from_the_parent_directory_is_refused_with_the_amend_that_fixes_it() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("datafile-parent");
    let d = std::fs::canonicalize(&d.0).unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "data_file=sub/x.data", "sub/x.qcow2", "1M"]);
    run(&d, "qemu-io", &["-c", "write -P 0x5a 0 64k", "sub/x.qcow2"]);
    let here = d.join("sub/x.data").display().to_string();
    fails_with(
        &advm_within_10s(&d, &["image", "info", "sub/x.qcow2"]),
        &format!(
            "advm: sub/x.qcow2: external data file \"sub/x.data\" (resolved to {}): No such file or directory (os \
             error 2); QEMU, which looks for a relative name in its working directory, finds {here}: record it \
             absolute, qemu-img amend -o data_file={here} sub/x.qcow2\n",
            d.join("sub/sub/x.data").display()
        ),
    );
    run(&d, "qemu-img", &["amend", "-o", &format!("data_file={here}"), "sub/x.qcow2"]);
    run(&d, "qemu-img", &["convert", "-O", "raw", "sub/x.qcow2", "expect.raw"]);
    assert!(run(&d.join("sub"), ADVM, &["image", "cat", "x.qcow2"]) == std::fs::read(d.join("expect.raw")).unwrap());
}
