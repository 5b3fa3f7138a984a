//! Fast dump and the pmem plan, checked with qemu-img: a dump of the pages written
//! through a mapped chain, taken while a writer keeps writing, passes `qemu-img check`
//! and reads (`qemu-img compare`) as the disk was at the dump; the plan handed to a VMM
//! names every byte of the disk. Without qemu-utils the tests print why and skip.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

mod qemu;
use qemu::{have_qemu, run, Dir};

use advm::image::{dump, GuestOffset, Image, ImageSpace, LayerFormat, MapOptions, PmemBacking, PLAN_MAGIC};

const M: u64 = 1 << 20;

/// base.raw (data, then a hole) under top.qcow2 (new data, zeroes, a compressed cluster).
fn chain(dir: &Path) {
    run(dir, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "8M"]);
    run(dir, "qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 3M", "base.raw"]);
    run(dir, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2"]);
    run(
        dir,
        "qemu-io",
        &["-c", "write -P 0x22 1M 256k", "-c", "write -z 2M 64k", "-c", "write -c -P 0x33 5M 64k", "top.qcow2"],
    );
}

/// Writes `byte` over `len` bytes at `guest` of the mapping, through /proc/self/mem (a
/// write like a guest's: it makes private copies of the pages).
fn poke(space: &ImageSpace, guest: u64, len: usize, byte: u8) {
    let mem = fs::OpenOptions::new().write(true).open("/proc/self/mem").unwrap();
    mem.write_all_at(&vec![byte; len], space.addr() as u64 + guest).unwrap();
}

#[test]
fn dump_while_writing_holds_the_disk_as_it_was_at_the_dump_and_passes_qemu_img_check() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("dump");
    chain(&d.0);
    let space = ImageSpace::map(d.0.join("top.qcow2"), &MapOptions::default()).unwrap();
    // Written: in base data, in the overlay's data, in a zero cluster, in the hole, in
    // the compressed cluster, and the last page.
    for (at, len, b) in [
        (4096, 4096, 0xa1),
        (M + 8192, 3 * 4096, 0xa2),
        (2 * M, 4096, 0xa3),
        (6 * M, 64 << 10, 0xa4),
        (5 * M + 4096, 4096, 0xa5),
        (8 * M - 4096, 4096, 0xa6),
    ] {
        poke(&space, at, len, b);
    }
    let (clusters, pages) = dump::written_clusters(&space).unwrap();
    assert_eq!(pages, 1 + 3 + 1 + 16 + 1 + 1, "written pages found: {pages}");
    assert_eq!(clusters.len(), 6, "clusters: {clusters:?}");
    let mut expected = vec![0u8; space.size() as usize];
    space.read(GuestOffset(0), &mut expected).unwrap();
    fs::write(d.0.join("expected.raw"), &expected).unwrap();

    // The rest of the program's memory: 32 MiB it has written, which the dump's fork
    // leaves out (neither copied nor write-protected).
    let mut other = std::hint::black_box(vec![1u8; 32 << 20]);
    let out = d.0.join("dump.qcow2");
    let dumping = dump::start(&space, &out, "top.qcow2", LayerFormat::Qcow2).unwrap();
    // The writer goes on during the copy: over every dumped cluster and beyond.
    for round in 0..20u8 {
        for c in 0..128u64 {
            poke(&space, c * (64 << 10), 4096, 0xc0 ^ round);
        }
        other[round as usize * 4096] = round;
    }
    let report = dumping.wait().unwrap();
    assert_eq!(report.clusters, 6);
    eprintln!("dump: {report:?}");
    // All but the window kept around the stack pointer, should the allocation have
    // joined the thread's stack mapping.
    assert!(report.left_out_bytes >= 28 << 20, "left out of the fork: {} bytes", report.left_out_bytes);
    run(&d.0, "qemu-img", &["check", "-q", "dump.qcow2"]);
    run(&d.0, "qemu-img", &["compare", "-q", "-F", "raw", "dump.qcow2", "expected.raw"]);
    let info = run(&d.0, "qemu-img", &["info", "dump.qcow2"]);
    assert!(info.contains("backing file: top.qcow2"), "{info}");
    // A dump never overwrites a file.
    assert!(dump::start(&space, &out, "top.qcow2", LayerFormat::Qcow2).is_err());
}

#[test]
fn dump_of_an_unwritten_space_is_an_empty_overlay_equal_to_the_chain() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("empty");
    chain(&d.0);
    let space = ImageSpace::map(d.0.join("top.qcow2"), &MapOptions::default()).unwrap();
    space.read_all().unwrap();
    let report = dump::start(&space, &d.0.join("dump.qcow2"), "top.qcow2", LayerFormat::Qcow2).unwrap().wait().unwrap();
    assert_eq!((report.written_pages, report.clusters), (0, 0));
    run(&d.0, "qemu-img", &["check", "-q", "dump.qcow2"]);
    run(&d.0, "qemu-img", &["compare", "-q", "dump.qcow2", "top.qcow2"]);
}

/// The same for a user without CAP_SYS_ADMIN, to whom pagemap shows every PFN as 0:
/// the pages read through holes (the shared zero page) were taken for written ones
/// (1280 pages in 80 clusters here). As root, reruns the test above as uid 65534.
#[test]
fn dump_of_an_unwritten_space_is_empty_for_a_user_who_sees_no_pfns() {
    use std::os::unix::process::CommandExt;
    if !have_qemu() {
        return;
    }
    if !advm::process::is_root() {
        eprintln!("skipped: the test above runs as this user, who sees no PFNs");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "dump_of_an_unwritten_space_is_an_empty_overlay_equal_to_the_chain", "--nocapture"])
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.code() == Some(126)
        || text.contains("Permission denied (os error 13)") && !text.contains("running 1 test")
    {
        eprintln!("skipped: the test binary cannot run as uid 65534: {text}");
        return;
    }
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// A raw disk (a chain flattened with `qemu-img convert -O raw`) dumped: the overlay
/// names its backing file as raw (it said qcow2 whatever the top was, and QEMU and advm
/// then refused the overlay: "backing format says qcow2 but the file has no qcow2 magic").
#[test]
fn dump_over_a_raw_top_names_its_backing_format_raw() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("raw-top");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "raw", "disk.raw", "4M"]);
    run(&d.0, "qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 1M", "disk.raw"]);
    let space = ImageSpace::map(d.0.join("disk.raw"), &MapOptions { writable: true, ..Default::default() }).unwrap();
    poke(&space, 3 * M, 4096, 0x5a);
    let mut expected = vec![0u8; space.size() as usize];
    space.read(GuestOffset(0), &mut expected).unwrap();
    fs::write(d.0.join("expected.raw"), &expected).unwrap();
    let report = dump::start(&space, &d.0.join("dump.qcow2"), "disk.raw", LayerFormat::Raw).unwrap().wait().unwrap();
    assert_eq!(report.clusters, 1);
    run(&d.0, "qemu-img", &["check", "-q", "dump.qcow2"]);
    let info = run(&d.0, "qemu-img", &["info", "dump.qcow2"]);
    assert!(info.contains("backing file format: raw"), "{info}");
    run(&d.0, "qemu-img", &["compare", "-q", "-F", "raw", "dump.qcow2", "expected.raw"]);
    // advm reads it too, by the strict defaults (the format is recorded, nothing probed).
    let again = Image::open(d.0.join("dump.qcow2")).unwrap();
    let mut got = vec![0u8; expected.len()];
    again.read_at(GuestOffset(0), &mut got).unwrap();
    assert!(got == expected, "the overlay over the raw disk reads as the written space");
}

/// The plan's pieces, decoded: (guest, len, fd, offset).
fn pieces(b: &PmemBacking) -> (u64, Vec<[u64; 4]>) {
    let mut head = [0u8; 32];
    b.plan().read_at(&mut head, 0).unwrap();
    let w = |s: &[u8], i: usize| u64::from_le_bytes(s[8 * i..8 * i + 8].try_into().unwrap());
    assert_eq!(&head[..8], PLAN_MAGIC);
    let n = w(&head, 3) as usize;
    let mut body = vec![0u8; 32 * n];
    b.plan().read_at(&mut body, 32).unwrap();
    (
        w(&head, 2),
        (0..n).map(|i| [w(&body, 4 * i), w(&body, 4 * i + 1), w(&body, 4 * i + 2), w(&body, 4 * i + 3)]).collect(),
    )
}

#[test]
fn pmem_plan_covers_the_device_in_order_and_pads_to_the_alignment() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("plan");
    chain(&d.0);
    run(&d.0, "qemu-img", &["resize", "-q", "top.qcow2", "9M"]);
    let image = Image::open(d.0.join("top.qcow2")).unwrap();
    let b = PmemBacking::new(&image, &MapOptions::default(), 2 * M).unwrap();
    assert_eq!(b.size(), 10 * M, "9 MiB rounded up to 2 MiB");
    let (size, ps) = pieces(&b);
    assert_eq!(size, 10 * M);
    let mut at = 0;
    for p in &ps {
        assert_eq!(p[0], at, "pieces are contiguous: {ps:?}");
        at += p[1];
    }
    assert_eq!(at, 10 * M);
    assert_eq!(ps.last().unwrap()[2], u64::MAX, "the padding is anonymous zeros");
    assert!(b.backing_path().starts_with("/proc/self/fd/"));
    assert!(PmemBacking::new(&image, &MapOptions::default(), 3 * M).is_err(), "alignment must be a power of two");
}
