//! A sweep over the images qemu-img and qemu-io can make (external data files among
//! them): every one either maps with
//! exactly the bytes `qemu-img convert -O raw` gives (through the mapping, through
//! `Image::read_at`, and through the image service's plan) or is refused with a clear error naming why. Small images (a few
//! MiB), so the whole sweep takes seconds; the wider one is `bench/image/sweep.sh`.
//! Without qemu-utils the tests print why and skip.

use std::fs;
use std::path::Path;

mod qemu;
use qemu::{have_qemu, patch, run, strip_backing_format, Dir};

use std::os::unix::net::UnixStream;

use advm::image::service::{attach, serve_connection, Service};
use advm::image::{GuestOffset, Image, ImageOptions, ImageSpace, MapOptions};
use advm::wire::Channel;

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

/// `qemu-img create -q -f qcow2 [-o OPTS] [-b BACKING -F FMT] NAME [SIZE]`.
fn create(dir: &Path, name: &str, opts: &str, backing: Option<(&str, &str)>, size: Option<u64>) {
    let mut args = vec!["create", "-q", "-f", "qcow2"];
    if !opts.is_empty() {
        args.extend(["-o", opts]);
    }
    if let Some((b, f)) = backing {
        args.extend(["-b", b, "-F", f]);
    }
    args.push(name);
    let size = size.map(|s| s.to_string());
    if let Some(s) = &size {
        args.push(s);
    }
    run(dir, "qemu-img", &args);
}

/// `qemu-io -c CMD ... IMAGE`.
fn io(dir: &Path, image: &str, cmds: &[String]) {
    let mut args = Vec::new();
    for c in cmds {
        args.extend(["-c", c.as_str()]);
    }
    args.push(image);
    run(dir, "qemu-io", &args);
}

/// qemu's reading of the chain: `qemu-img convert -O raw [EXTRA] IMAGE`.
fn converted(dir: &Path, image: &str, extra: &[&str]) -> Vec<u8> {
    let out = format!("{image}.expect.raw");
    let mut args = vec!["convert"];
    args.extend(extra);
    args.extend(["-O", "raw", image, out.as_str()]);
    run(dir, "qemu-img", &args);
    let bytes = fs::read(dir.join(&out)).unwrap();
    fs::remove_file(dir.join(&out)).unwrap();
    bytes
}

fn options(image: ImageOptions) -> MapOptions {
    MapOptions { image, ..Default::default() }
}

/// Asserts that the mapping and `read_at` of `image` hold exactly `expect`.
fn assert_reads(dir: &Path, image: &str, opts: ImageOptions, expect: &[u8]) {
    let path = dir.join(image);
    let space = ImageSpace::map(&path, &options(opts)).unwrap_or_else(|e| panic!("{image}: mapping: {e}"));
    assert_eq!(space.size(), expect.len() as u64, "{image}: virtual size");
    let mut got = vec![0u8; expect.len()];
    space.read(GuestOffset(0), &mut got).unwrap();
    // (`==` first: a byte loop is slow in a debug build)
    if let Some(i) = (got != expect).then(|| (0..got.len()).find(|&i| got[i] != expect[i])).flatten() {
        panic!("{image}: the mapping differs from qemu-img convert at byte {i:#x}: {:#x} vs {:#x}", got[i], expect[i]);
    }
    let mut read = vec![0u8; expect.len()];
    Image::open_with(&path, &opts).unwrap().read_at(GuestOffset(0), &mut read).unwrap();
    assert!(read == expect, "{image}: read_at differs from qemu-img convert");
    // And as advmd's clients (advm vm run) map it: the plan made by the image service.
    let service = Service::new(options(opts));
    let (client, server) = UnixStream::pair().unwrap();
    let (client, server) = (Channel::from_stream(client), Channel::from_stream(server));
    std::thread::scope(|s| {
        let served = s.spawn(|| serve_connection(&service, &server));
        let (space, _) = attach(&client, &fs::canonicalize(&path).unwrap(), false)
            .unwrap_or_else(|e| panic!("{image}: attach: {e}"));
        read.fill(0);
        space.read(GuestOffset(0), &mut read).unwrap();
        assert!(read == expect, "{image}: the service's plan differs from qemu-img convert");
        drop(client);
        served.join().unwrap().unwrap();
    });
}

/// The chain of `image` reads as `qemu-img convert -O raw` reads it.
fn same(dir: &Path, image: &str) {
    same_with(dir, image, ImageOptions::default());
}

fn same_with(dir: &Path, image: &str, opts: ImageOptions) {
    assert_reads(dir, image, opts, &converted(dir, image, &[]));
}

/// Mapping `image` is refused; the error.
fn refused(dir: &Path, image: &str, opts: ImageOptions) -> String {
    match ImageSpace::map(dir.join(image), &options(opts)) {
        Ok(_) => panic!("{image}: mapped, but it should be refused"),
        Err(e) => e.to_string(),
    }
}

/// Data, zero writes (kept and unmapped), a discard, a compressed cluster, writes
/// that start and end inside clusters, and the last bytes of the disk.
fn mix(cs: u64, size: u64, compress: bool) -> Vec<String> {
    let mut cmds = Vec::new();
    if compress {
        // First: qemu compresses only into unallocated clusters.
        cmds.push(format!("write -c -P 0x21 {} {cs}", size / 2 / cs * cs));
    }
    cmds.extend([
        format!("write -P 0x11 0 {}", (size / 4).max(cs)),
        format!("write -P 0x12 {} {}", 3 * K + 512, 5 * K),
        format!("write -z {} {}", cs, cs),
        format!("write -z -u {} {}", 3 * cs, cs),
        format!("discard {} {}", 5 * cs, cs),
        format!("write -P 0x13 {} 1536", size - 1536),
    ]);
    cmds
}

#[test]
fn cluster_sizes_from_512_bytes_to_2_mib_in_v2_and_v3() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-clusters");
    let d = &dir.0;
    for cs in [512, K, 2 * K, 4 * K, 64 * K, 2 * M] {
        for compat in ["0.10", "1.1"] {
            let name = format!("c{cs}-{compat}.qcow2");
            let size = (3 * M).max(8 * cs);
            create(d, &name, &format!("cluster_size={cs},compat={compat}"), None, Some(size));
            io(d, &name, &mix(cs, size, true));
            same(d, &name);
        }
    }
}

#[test]
fn refcount_widths_lazy_refcounts_and_the_dirty_bit() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-refcounts");
    let d = &dir.0;
    for bits in [1, 2, 4, 8, 16, 32, 64] {
        let name = format!("r{bits}.qcow2");
        create(d, &name, &format!("refcount_bits={bits},cluster_size=4k"), None, Some(2 * M));
        io(d, &name, &mix(4 * K, 2 * M, true));
        same(d, &name);
    }
    // A writer that dies with lazy refcounts leaves the dirty bit set (refcounts may
    // be stale; advm never reads them).
    create(d, "lazy.qcow2", "lazy_refcounts=on", None, Some(2 * M));
    let out = std::process::Command::new("qemu-io")
        .args(["-c", "write -P 0x31 0 1M", "-c", "write -P 0x32 1536k 4k", "-c", "abort", "lazy.qcow2"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(!out.status.success(), "qemu-io abort");
    let header = fs::read(d.join("lazy.qcow2")).unwrap();
    assert_eq!(header[79] & 1, 1, "the dirty bit is set");
    same(d, "lazy.qcow2");
}

#[test]
fn extended_l2_subclusters_below_and_above_a_page() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-subclusters");
    let d = &dir.0;
    fs::write(d.join("base.raw"), (0..3 * M).map(|i| (i / 512 % 251) as u8 + 1).collect::<Vec<u8>>()).unwrap();
    create(d, "base.qcow2", "cluster_size=4k", None, Some(3 * M));
    io(d, "base.qcow2", &["write -P 0x41 0 3M".into(), "write -z 1M 64k".into()]);
    // Subclusters of 512 B, 2 KiB, a page, 64 KiB.
    for cs in [16 * K, 64 * K, 128 * K, 2 * M] {
        for backing in [None, Some(("base.raw", "raw")), Some(("base.qcow2", "qcow2"))] {
            let name = format!("x{cs}-{}.qcow2", backing.map_or("alone", |b| b.1));
            let size = (3 * M).max(8 * cs);
            create(d, &name, &format!("cluster_size={cs},extended_l2=on"), backing, Some(size));
            // Single subclusters (512 B to 64 KiB, some within one page) in a
            // cluster nothing else wrote: the rest of it reads from below.
            let (sub, at) = (cs / 32, (size / 2 / cs + 1) * cs);
            let mut cmds = mix(cs, size, true);
            cmds.extend([
                format!("write -P 0x51 {} {sub}", at + 9 * sub),
                format!("write -z {} {sub}", at + 11 * sub),
                format!("write -z -u {} {sub}", at + 13 * sub),
                format!("discard {} {sub}", at + 15 * sub),
                format!("write -P 0x52 {} 512", 2 * M + 1536),
            ]);
            io(d, &name, &cmds);
            same(d, &name);
        }
    }
}

#[test]
fn compressed_clusters_deflate_and_zstd_from_convert_and_qemu_io() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-compressed");
    let d = &dir.0;
    create(d, "src.qcow2", "", None, Some(3 * M));
    io(d, "src.qcow2", &["write -P 0x11 0 1M".into(), "write -P 0x12 2M 100k".into(), "write -z 1M 4k".into()]);
    for ty in ["zlib", "zstd"] {
        for cs in [512, 4 * K, 64 * K, 2 * M] {
            // qemu-img convert -c: every data cluster compressed
            let name = format!("cv-{ty}-{cs}.qcow2");
            let opts = format!("cluster_size={cs},compression_type={ty}");
            run(d, "qemu-img", &["convert", "-c", "-O", "qcow2", "-o", &opts, "src.qcow2", &name]);
            same(d, &name);
            // qemu-io write -c, then partial overwrites of compressed clusters
            let name = format!("io-{ty}-{cs}.qcow2");
            create(d, &name, &opts, None, Some((3 * M).max(4 * cs)));
            io(
                d,
                &name,
                &[
                    format!("write -c -P 0x21 0 {cs}"),
                    format!("write -c -P 0x22 {cs} {cs}"),
                    format!("write -c -P 0x23 {} {cs}", 3 * cs),
                    format!("write -P 0x24 {} 512", cs + 512),
                ],
            );
            same(d, &name);
        }
    }
}

#[test]
fn preallocation_modes() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-prealloc");
    let d = &dir.0;
    for mode in ["off", "metadata", "falloc", "full"] {
        for extra in ["compat=0.10", "compat=1.1", "extended_l2=on", "cluster_size=4k"] {
            let name = format!("p-{mode}-{extra}.qcow2");
            create(d, &name, &format!("preallocation={mode},{extra}"), None, Some(2 * M + 512));
            io(
                d,
                &name,
                &["write -P 0x11 100k 300k".into(), "write -z 1M 64k".into(), "write -P 0x12 1025k 1k".into()],
            );
            same(d, &name);
        }
    }
}

#[test]
fn external_data_files_map_alone_under_an_overlay_and_in_the_middle() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-datafile");
    let d = &dir.0;
    let size = 3 * M + 512;
    // data_file_raw=on makes qemu-img preallocate the metadata itself; zero writes then
    // write zeros into the data file too.
    for raw in ["off", "on"] {
        for prealloc in ["off", "metadata", "falloc", "full"] {
            for extra in ["cluster_size=4k", "cluster_size=64k", "extended_l2=on", "cluster_size=2M"] {
                let cs = match extra {
                    "cluster_size=4k" => 4 * K,
                    "cluster_size=2M" => 2 * M,
                    _ => 64 * K,
                };
                let size = (3 * M).max(8 * cs) + 512;
                let name = format!("df-{raw}-{prealloc}-{}.qcow2", extra.replace('=', ""));
                let opts = format!("data_file={name}.data,data_file_raw={raw},preallocation={prealloc},{extra}");
                create(d, &name, &opts, None, Some(size));
                // No compressed clusters: QEMU refuses them in a data file.
                io(d, &name, &mix(cs, size, false));
                same(d, &name);
            }
        }
    }
    // Under an overlay (written over part of the data), below an overlay with a data
    // file of its own, and in the middle of a chain over a plain base.
    create(d, "base.qcow2", "data_file=base.data,data_file_raw=on", None, Some(size));
    io(d, "base.qcow2", &["write -P 0x71 0 2M".into(), "write -z 512k 64k".into()]);
    create(d, "over.qcow2", "cluster_size=4k", Some(("base.qcow2", "qcow2")), None);
    io(d, "over.qcow2", &["write -P 0x72 60k 8k".into(), "write -z -u 1M 4k".into(), "discard 1536k 4k".into()]);
    same(d, "over.qcow2");
    create(d, "plain.qcow2", "", None, Some(size));
    io(d, "plain.qcow2", &["write -P 0x73 0 3M".into()]);
    create(d, "mid.qcow2", "data_file=mid.data,cluster_size=16k", Some(("plain.qcow2", "qcow2")), None);
    io(d, "mid.qcow2", &["write -P 0x74 8k 24k".into(), "write -z 1M 32k".into(), "write -P 0x75 2M 100k".into()]);
    create(d, "top.qcow2", "data_file=top.data", Some(("mid.qcow2", "qcow2")), None);
    io(d, "top.qcow2", &["write -P 0x76 0 4k".into(), "write -P 0x77 2040k 16k".into()]);
    same(d, "top.qcow2");
    // A data file shorter than its clusters (cut inside one): zeros past its end, as
    // QEMU reads the file.
    create(d, "short.qcow2", "data_file=short.data", None, Some(M));
    io(d, "short.qcow2", &["write -P 0x7a 512k 128k".into()]);
    fs::OpenOptions::new().write(true).open(d.join("short.data")).unwrap().set_len(540_000).unwrap();
    same(d, "short.qcow2");
    // Data files elsewhere: in a subdirectory (named relative to the layer), and by an
    // absolute name outside the image's directory, refused unless allowed.
    fs::create_dir(d.join("sub")).unwrap();
    create(d, "rel.qcow2", "data_file=sub/rel.data", None, Some(M));
    io(d, "rel.qcow2", &["write -P 0x78 4k 4k".into()]);
    same(d, "rel.qcow2");
    let outside = Dir::new("variants-datafile-outside");
    let data = outside.0.join("abs.data");
    create(d, "abs.qcow2", &format!("data_file={}", data.display()), None, Some(M));
    io(d, "abs.qcow2", &["write -P 0x79 8k 4k".into()]);
    let e = refused(d, "abs.qcow2", ImageOptions::default());
    assert!(e.contains("external data file") && e.contains("outside") && e.contains("--allow-backing-outside"), "{e}");
    same_with(d, "abs.qcow2", ImageOptions { allow_backing_outside: true, ..Default::default() });
}

#[test]
fn a_missing_data_file_is_an_error_naming_it() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-datafile-missing");
    let d = &fs::canonicalize(&dir.0).unwrap();
    create(d, "gone.qcow2", "data_file=gone.data", None, Some(M));
    io(d, "gone.qcow2", &["write -P 0x11 0 64k".into()]);
    fs::remove_file(d.join("gone.data")).unwrap();
    assert_eq!(
        refused(d, "gone.qcow2", ImageOptions::default()),
        format!(
            "{}: external data file \"gone.data\" (resolved to {}): No such file or directory (os error 2)",
            d.join("gone.qcow2").display(),
            d.join("gone.data").display()
        )
    );
    // Below an overlay, the layer that names it is the one named.
    create(d, "o.qcow2", "", Some(("gone.qcow2", "qcow2")), None);
    let e = refused(d, "o.qcow2", ImageOptions::default());
    assert!(e.starts_with(&format!("{}: external data file", d.join("gone.qcow2").display())), "{e}");
}

/// QEMU's rules for data files: a cluster lives at its guest offset, and none is
/// compressed; an L2 entry breaking either is refused, as QEMU fails the read.
#[test]
fn data_file_clusters_away_from_their_guest_offset_or_compressed_are_refused() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-datafile-l2");
    let d = &dir.0;
    for (name, entry, why) in [
        ("moved.qcow2", (1u64 << 63) | 0x20000, "cluster for guest 0x10000 is at 0x20000 of the external data file"),
        (
            "compressed.qcow2",
            (1u64 << 62) | 0x10000,
            "compressed cluster for guest 0x10000 in an image with an external data file",
        ),
    ] {
        create(d, name, &format!("data_file={name}.data"), None, Some(M));
        io(d, name, &["write -P 0x11 64k 64k".into()]);
        let p = d.join(name);
        patch(&p, l2_entry_at(&p, 1), &entry.to_be_bytes());
        let e = refused(d, name, ImageOptions::default());
        assert!(e.contains(why), "{e}");
        let q = std::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw", name, "x.raw"])
            .current_dir(d)
            .output();
        assert!(!q.unwrap().status.success(), "{name}: qemu-img read it");
    }
}

/// A plan of the service is keyed by the data file too: one replaced under its name
/// (`mv`), or written in place with its mtime put back, is planned again and read
/// fresh, never served from the plan holding the old file.
#[test]
fn a_changed_data_file_is_planned_again_by_the_image_service() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-datafile-service");
    let d = &fs::canonicalize(&dir.0).unwrap();
    create(d, "s.qcow2", "data_file=s.data,data_file_raw=on", None, Some(M));
    io(d, "s.qcow2", &["write -P 0x11 0 1M".into()]);
    // The service keeps only plans of files unchanged for 2 s.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let service = Service::new(options(ImageOptions::default()));
    let (client, server) = UnixStream::pair().unwrap();
    let end = client.try_clone().unwrap();
    let (client, server) = (Channel::from_stream(client), Channel::from_stream(server));
    let path = d.join("s.qcow2");
    std::thread::scope(|s| {
        let served = s.spawn(|| serve_connection(&service, &server));
        let byte = |at: u64| {
            let (space, cached) = attach(&client, &path, false).unwrap();
            let mut b = [0u8; 1];
            space.read(GuestOffset(at), &mut b).unwrap();
            (b[0], cached)
        };
        assert_eq!(byte(0), (0x11, false));
        assert_eq!(byte(0), (0x11, true), "kept");
        // A new data file under the old name.
        fs::write(d.join("new.data"), vec![0x22u8; M as usize]).unwrap();
        fs::rename(d.join("new.data"), d.join("s.data")).unwrap();
        assert_eq!(byte(0), (0x22, false), "the replaced data file was served from the old plan");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        assert_eq!(byte(4096), (0x22, false));
        assert_eq!(byte(4096), (0x22, true));
        // Written in place, its size and mtime as they were.
        let before = fs::metadata(d.join("s.data")).unwrap();
        {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(d.join("s.data")).unwrap();
            f.write_all_at(&[0x33u8; 4096], 4096).unwrap();
            f.set_modified(before.modified().unwrap()).unwrap();
        }
        assert_eq!(fs::metadata(d.join("s.data")).unwrap().modified().unwrap(), before.modified().unwrap());
        assert_eq!(byte(4096), (0x33, false));
        // The end of the connection (`byte` still borrows the client's channel).
        end.shutdown(std::net::Shutdown::Both).unwrap();
        served.join().unwrap().unwrap();
    });
}

#[test]
fn encrypted_layers_are_refused_where_their_data_would_be_read() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-luks");
    let d = &dir.0;
    let secret = "secret,id=sec0,data=advm";
    let opts = "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10";
    let key = |name: &str| format!("driver=qcow2,file.filename={name},encrypt.key-secret=sec0");
    // One create (qemu times its key derivation for seconds), then a copy.
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "--object", secret, "-o", opts, "empty.qcow2", "1M"]);
    fs::copy(d.join("empty.qcow2"), d.join("written.qcow2")).unwrap();
    let written = key("written.qcow2");
    run(d, "qemu-io", &["--object", secret, "--image-opts", "-c", "write -P 0x11 64k 4k", &written]);
    let p = d.join("written.qcow2");
    assert_eq!(
        refused(d, "written.qcow2", ImageOptions::default()),
        format!(
            "{}: cannot map guest 0x10000+65536 (layer 0): layer is encrypted (LUKS); decryption is not supported",
            p.display()
        )
    );
    // The old AES encryption (qemu-img still makes it; no key derivation to wait for).
    run(
        d,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "--object",
            secret,
            "-o",
            "encrypt.format=aes,encrypt.key-secret=sec0",
            "aes.qcow2",
            "1M",
        ],
    );
    run(d, "qemu-io", &["--object", secret, "--image-opts", "-c", "write -P 0x11 0 4k", &key("aes.qcow2")]);
    assert_eq!(
        refused(d, "aes.qcow2", ImageOptions::default()),
        format!(
            "{}: cannot map guest 0x0+65536 (layer 0): layer is encrypted (AES); decryption is not supported",
            d.join("aes.qcow2").display()
        )
    );
    // Nothing written: every cluster is unallocated, which qemu reads as zeros without
    // decrypting anything, and so does the mapping.
    let empty = key("empty.qcow2");
    let expect = converted(d, &empty, &["--object", secret, "--image-opts"]);
    assert!(expect.iter().all(|&b| b == 0) && expect.len() == M as usize);
    assert_reads(d, "empty.qcow2", ImageOptions::default(), &expect);
    // Below an overlay: refused where the overlay leaves the encrypted layer's data
    // showing, read where the overlay covers it.
    for (name, covered) in [("over.qcow2", true), ("through.qcow2", false)] {
        // Written first, then put over it (qemu-io would need the key to open it).
        create(d, name, "", None, Some(M));
        io(d, name, &[format!("write -P 0x22 {} 64k", if covered { 64 * K } else { 0 })]);
        run(d, "qemu-img", &["rebase", "-u", "-b", "written.qcow2", "-F", "qcow2", name]);
    }
    let mut expect = vec![0u8; M as usize];
    expect[64 * K as usize..128 * K as usize].fill(0x22);
    assert_reads(d, "over.qcow2", ImageOptions::default(), &expect);
    assert_eq!(
        refused(d, "through.qcow2", ImageOptions::default()),
        format!(
            "{}: cannot map guest 0x10000+65536 (layer 1, {}): layer is encrypted (LUKS); decryption is not supported",
            d.join("through.qcow2").display(),
            p.display()
        )
    );
}

#[test]
fn internal_snapshots_leave_the_active_state_mapped() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-snapshots");
    let d = &dir.0;
    for opts in ["cluster_size=4k,compat=0.10", "cluster_size=64k", "cluster_size=64k,extended_l2=on"] {
        let name = format!("s-{opts}.qcow2");
        create(d, &name, opts, None, Some(2 * M));
        io(d, &name, &["write -P 0x11 0 1M".into(), "write -c -P 0x12 1536k 64k".into()]);
        run(d, "qemu-img", &["snapshot", "-c", "one", &name]);
        io(
            d,
            &name,
            &[
                "write -P 0x21 64k 64k".into(),
                "write -z 256k 8k".into(),
                "discard 512k 64k".into(),
                "write -P 0x22 1536k 4k".into(),
            ],
        );
        run(d, "qemu-img", &["snapshot", "-c", "two", &name]);
        io(d, &name, &["write -P 0x31 70k 4k".into(), "write -P 0x32 1200k 4k".into()]);
        same(d, &name);
        // Back to the first snapshot, and with it deleted.
        run(d, "qemu-img", &["snapshot", "-a", "one", &name]);
        same(d, &name);
        run(d, "qemu-img", &["snapshot", "-d", "one", &name]);
        same(d, &name);
    }
}

#[test]
fn persistent_dirty_bitmaps_are_ignored() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-bitmaps");
    let d = &dir.0;
    create(d, "b.qcow2", "", None, Some(2 * M));
    run(d, "qemu-img", &["bitmap", "--add", "b.qcow2", "all"]);
    io(d, "b.qcow2", &["write -P 0x11 0 1M".into()]);
    run(d, "qemu-img", &["bitmap", "--add", "--granularity", "512", "b.qcow2", "fine"]);
    run(d, "qemu-img", &["bitmap", "--add", "--disable", "b.qcow2", "off"]);
    io(d, "b.qcow2", &["write -P 0x12 64k 64k".into(), "write -z 128k 64k".into()]);
    same(d, "b.qcow2");
}

/// The host offset field of the L2 entry of guest cluster `index` of a small qcow2
/// (one L2 table), and where that entry is in the file.
fn l2_entry_at(path: &Path, index: u64) -> u64 {
    let b = fs::read(path).unwrap();
    let be64 = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    let l1 = be64(40) as usize;
    (be64(l1) & 0x00ff_ffff_ffff_fe00) + index * 8
}

#[test]
fn the_corrupt_bit_and_zero_clusters_in_v2_images_are_refused() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-corrupt");
    let d = &dir.0;
    create(d, "c.qcow2", "", None, Some(M));
    io(d, "c.qcow2", &["write -P 0x11 0 64k".into()]);
    patch(&d.join("c.qcow2"), 72, &2u64.to_be_bytes());
    assert_eq!(
        refused(d, "c.qcow2", ImageOptions::default()),
        format!(
            "{}: image is marked corrupt (incompatible bit 1); run `qemu-img check -r all` first",
            d.join("c.qcow2").display()
        )
    );
    // Version 2 has no zero clusters: QEMU reads an L2 entry with the zero flag as
    // corrupt metadata (EIO), whether the cluster has a host offset or not. Before,
    // advm read the host cluster (or the backing file) there.
    create(d, "v2base.qcow2", "compat=0.10", None, Some(M));
    io(d, "v2base.qcow2", &["write -P 0x22 0 1M".into()]);
    for host in [true, false] {
        let name = format!("v2-{host}.qcow2");
        create(d, &name, "compat=0.10,cluster_size=4k", Some(("v2base.qcow2", "qcow2")), Some(M));
        io(d, &name, &["write -P 0x11 0 8k".into()]);
        let p = d.join(&name);
        let at = l2_entry_at(&p, 1);
        let mut entry = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&p).unwrap(), &mut entry, at).unwrap();
        let entry = u64::from_be_bytes(entry);
        assert_ne!(entry & 0x00ff_ffff_ffff_fe00, 0, "guest cluster 1 is allocated");
        patch(&p, at, &(if host { entry | 1 } else { 1 }).to_be_bytes());
        let out = std::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw", &name, "x.raw"])
            .current_dir(d)
            .output()
            .unwrap();
        assert!(!out.status.success(), "qemu-img reads {name}");
        assert_eq!(
            refused(d, &name, ImageOptions::default()),
            format!(
                "{}: cluster for guest 0x1000: zero flag in a version 2 image (zero clusters need version 3); \
                 QEMU reads it as corrupt",
                p.display()
            )
        );
    }
}

#[test]
fn backing_chains_as_qemu_reads_them() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-chains");
    let d = &fs::canonicalize(&dir.0).unwrap();
    let inner = d.join("in");
    fs::create_dir(&inner).unwrap();
    let i = inner.as_path();
    // qcow2 over qcow2 over raw, names relative; a raw base of an odd size, shorter
    // than the layers above it.
    fs::write(i.join("base.raw"), (0..M + 1000).map(|x| (x / 4096 % 250) as u8 + 1).collect::<Vec<u8>>()).unwrap();
    create(i, "mid.qcow2", "cluster_size=4k", Some(("base.raw", "raw")), Some(3 * M));
    io(i, "mid.qcow2", &mix(4 * K, 3 * M, true));
    create(i, "top.qcow2", "cluster_size=64k", Some(("mid.qcow2", "qcow2")), None);
    io(i, "top.qcow2", &["write -P 0x61 96k 8k".into(), "write -z -u 0 64k".into(), "discard 1M 64k".into()]);
    same(i, "top.qcow2");
    // An absolute name inside the image's directory.
    let abs = i.join("mid.qcow2");
    create(i, "abs.qcow2", "", Some((abs.to_str().unwrap(), "qcow2")), None);
    io(i, "abs.qcow2", &["write -P 0x62 0 4k".into()]);
    same(i, "abs.qcow2");
    // An absolute name outside it: refused unless allowed.
    fs::write(d.join("out.raw"), vec![0x71u8; 256 * K as usize]).unwrap();
    let out = d.join("out.raw");
    create(i, "outside.qcow2", "", Some((out.to_str().unwrap(), "raw")), Some(M));
    let e = refused(i, "outside.qcow2", ImageOptions::default());
    assert!(e.contains("outside") && e.contains("--allow-backing-outside"), "{e}");
    same_with(i, "outside.qcow2", ImageOptions { allow_backing_outside: true, ..Default::default() });
    // No backing format: qemu probes; a qcow2 backing file is qcow2 by its magic, a
    // raw one is refused unless probing is allowed.
    for (name, below, fmt) in [("nofmt-q.qcow2", "mid.qcow2", "qcow2"), ("nofmt-r.qcow2", "base.raw", "raw")] {
        create(i, name, "", Some((below, fmt)), Some(2 * M));
        io(i, name, &["write -P 0x63 4k 4k".into()]);
        strip_backing_format(&i.join(name));
        if fmt == "qcow2" {
            same(i, name);
        } else {
            let e = refused(i, name, ImageOptions::default());
            assert!(e.contains("has no backing format and is not qcow2; refusing to probe it as raw"), "{e}");
            same_with(i, name, ImageOptions { allow_probed_raw: true, ..Default::default() });
        }
    }
    // An overlay smaller than its backing file, and one larger (reads past the
    // backing file's end are zeros), with clusters smaller and larger than below.
    for (name, cs, size) in
        [("small.qcow2", 512, M / 2), ("big.qcow2", 2 * M, 8 * M), ("odd.qcow2", 4 * K, 3 * M + 1536)]
    {
        create(i, name, &format!("cluster_size={cs}"), Some(("top.qcow2", "qcow2")), Some(size));
        io(i, name, &[format!("write -P 0x64 {} 1k", size - 1024), "write -P 0x65 100k 1k".into()]);
        same(i, name);
    }
    // Version 2: a discard leaves the cluster unallocated, so the backing file shows.
    create(i, "v2.qcow2", "compat=0.10,cluster_size=4k", Some(("top.qcow2", "qcow2")), None);
    io(i, "v2.qcow2", &["write -P 0x66 0 64k".into(), "discard 8k 8k".into(), "write -z 32k 4k".into()]);
    same(i, "v2.qcow2");
}

#[test]
fn virtual_sizes_off_the_cluster_and_page_grid() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("variants-sizes");
    let d = &dir.0;
    for size in [M + 512, M + 3584, 2 * M + 64 * K + 512] {
        for (cs, extended_l2) in [(512, false), (4 * K, false), (64 * K, false), (2 * M, false), (64 * K, true)] {
            let name = format!("z{size}-{cs}-{extended_l2}.qcow2");
            let opts = format!("cluster_size={cs},extended_l2={}", if extended_l2 { "on" } else { "off" });
            create(d, &name, &opts, None, Some(size));
            // A compressed last cluster, then a write into its tail.
            let last = (size - 1) / cs * cs;
            io(
                d,
                &name,
                &[
                    format!("write -c -P 0x11 {last} {}", size - last),
                    format!("write -P 0x12 {} 512", size - 512),
                    "write -P 0x13 0 1k".into(),
                ],
            );
            same(d, &name);
        }
    }
    // A raw image is a disk of whole 512-byte sectors, the last padded with zeros.
    // Before, one of 70,001 bytes read as 70,001 bytes (qemu-img convert gives 70,144).
    fs::write(d.join("odd.raw"), (0..70_001u32).map(|i| (i % 251) as u8 + 1).collect::<Vec<u8>>()).unwrap();
    same(d, "odd.raw");
    assert_eq!(Image::open(d.join("odd.raw")).unwrap().virtual_size(), 70_144);
}
