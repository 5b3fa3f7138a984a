//! advm::image against qemu-img: extent maps agree with `qemu-img map`, bytes read
//! through the mapping equal `qemu-img convert -O raw`, and bad images give clear
//! errors. Images are built by qemu-img / qemu-io (Debian qemu-utils); without them
//! the tests print why and skip.

use std::fs;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

mod qemu;
use qemu::{have_qemu, patch, run, strip_backing_format, Dir, Holder, LoopDevice};

use advm::image::{ExtentKind, GuestOffset, Image, ImageSpace, MapOptions, OverBudget, PmemBacking};

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

fn qemu_io(dir: &Path, image: &str, cmds: &[String]) {
    let mut args = vec![];
    for c in cmds {
        args.push("-c");
        args.push(c.as_str());
    }
    args.push(image);
    run(dir, "qemu-io", &args);
}

/// A tiny deterministic generator (so failures reproduce).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Writes, zero writes, discards and compressed writes into `image` (one layer).
fn scribble(dir: &Path, image: &str, size: u64, cs: u64, seed: u64) {
    let mut r = Lcg(seed);
    let clusters = size / cs;
    // The compressed write comes first: qemu compresses only into unallocated clusters.
    let c = r.below(clusters);
    let mut cmds = vec![format!("write -c -P {} {} {cs}", 1 + r.below(250), c * cs)];
    for _ in 0..4 {
        let off = r.below(size / 512) * 512;
        let len = (1 + r.below(3 * cs.min(64 * K) / 512)) * 512;
        let len = len.min(size - off);
        cmds.push(format!("write -P {} {off} {len}", 1 + r.below(250)));
    }
    let c = r.below(clusters);
    cmds.push(format!("write -z {} {}", c * cs, cs.min(size - c * cs)));
    let c = r.below(clusters);
    cmds.push(format!("discard {} {}", c * cs, cs));
    qemu_io(dir, image, &cmds);
}

#[derive(Debug)]
struct QemuExtent {
    start: u64,
    len: u64,
    depth: usize,
    data: bool,
    zero: bool,
    offset: Option<u64>,
}

fn qemu_map(dir: &Path, image: &str) -> Vec<QemuExtent> {
    let out = run(dir, "qemu-img", &["map", "--output=json", image]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| QemuExtent {
            start: e["start"].as_u64().unwrap(),
            len: e["length"].as_u64().unwrap(),
            depth: e["depth"].as_u64().unwrap() as usize,
            data: e["data"].as_bool().unwrap(),
            zero: e["zero"].as_bool().unwrap(),
            offset: e["offset"].as_u64(),
        })
        .collect()
}

/// The chain's file names by depth, from `qemu-img info --backing-chain`.
fn qemu_chain(dir: &Path, image: &str) -> Vec<String> {
    let out = run(dir, "qemu-img", &["info", "--backing-chain", "--output=json", image]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|l| Path::new(l["filename"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Our extent map against qemu's, range by range; returns the number of extents.
fn check_map(dir: &Path, image: &str) -> usize {
    let img = Image::open(dir.join(image)).unwrap();
    let ours = img.extent_map().unwrap();
    let names: Vec<String> =
        img.layers().iter().map(|l| l.path().file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, qemu_chain(dir, image), "{image}: chain");
    let theirs = qemu_map(dir, image);
    assert_eq!(ours.size, theirs.iter().map(|e| e.len).sum::<u64>(), "{image}: size");
    // Extents are sorted and cover the disk without gaps.
    let mut at = 0;
    for e in &ours.extents {
        assert_eq!(e.start.0, at, "{image}: gap or overlap at {at:#x}");
        assert!(e.len > 0);
        at = e.end();
    }
    assert_eq!(at, ours.size);
    for q in &theirs {
        let mut g = q.start;
        while g < q.start + q.len {
            let e = ours.find(GuestOffset(g)).unwrap();
            let piece = (q.start + q.len).min(e.end()) - g;
            let ctx = format!("{image}: guest {g:#x}+{piece}: ours {e:?}, qemu {q:?}");
            // qemu sees a raw layer in 512-byte sectors: the zeros after an odd-sized
            // raw base up to the next sector it attributes to the base itself.
            let sector_tail = e.kind == ExtentKind::Zero { reason: advm::image::ZeroReason::BeyondBacking }
                && q.depth == e.depth + 1
                && piece < 512;
            assert!(e.depth == q.depth || sector_tail, "{ctx}");
            let qoff = q.offset.map(|o| o + (g - q.start));
            match &e.kind {
                ExtentKind::Data { offset } => {
                    // qemu says zero for holes it finds in the file; we map those too.
                    assert!(q.data || q.zero, "{ctx}");
                    assert_eq!(Some(offset.0 + (g - e.start.0)), qoff, "{ctx}");
                }
                ExtentKind::Compressed { .. } => assert!(q.data && q.offset.is_none(), "{ctx}"),
                ExtentKind::Zero { .. } => assert!(q.zero && !q.data, "{ctx}"),
                other => panic!("{ctx}: unexpected {other:?}"),
            }
            g += piece;
        }
    }
    ours.extents.len()
}

/// Every byte through the mapping (and through `read_at`) equals qemu's raw output.
fn check_bytes(dir: &Path, image: &str, options: &MapOptions) -> advm::image::MapStats {
    run(dir, "qemu-img", &["convert", "-O", "raw", image, "expect.raw"]);
    let expect = fs::read(dir.join("expect.raw")).unwrap();
    let space = ImageSpace::map(dir.join(image), options).unwrap();
    assert_eq!(space.size(), expect.len() as u64);
    let mut got = vec![0u8; expect.len()];
    space.read(GuestOffset(0), &mut got).unwrap();
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expect[i]) {
        panic!("{image}: mapping differs from qemu-img convert at byte {i:#x}: {} vs {}", got[i], expect[i]);
    }
    let img = Image::open_with(dir.join(image), &options.image).unwrap();
    let mut read = vec![0u8; expect.len()];
    img.read_at(GuestOffset(0), &mut read).unwrap();
    assert!(read == expect, "{image}: read_at differs from qemu-img convert");
    space.stats().clone()
}

/// A chain of `depth` qcow2 layers with `cs`-byte clusters, each layer scribbled on.
fn build_chain(dir: &Path, depth: usize, cs: u64, size: u64, seed: u64) -> String {
    let mut below: Option<String> = None;
    for i in 0..depth {
        let name = format!("l{i}.qcow2");
        let mut args = vec!["create".to_string(), "-q".into(), "-f".into(), "qcow2".into()];
        args.push("-o".into());
        args.push(format!("cluster_size={cs}"));
        if let Some(b) = &below {
            args.extend(["-b".into(), b.clone(), "-F".into(), "qcow2".into()]);
        }
        args.push(name.clone());
        args.push(size.to_string());
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        run(dir, "qemu-img", &a);
        scribble(dir, &name, size, cs, seed * 100 + i as u64);
        below = Some(name);
    }
    below.unwrap()
}

#[test]
fn chains_match_qemu_across_cluster_sizes_and_depths() {
    if !have_qemu() {
        return;
    }
    let mut compressed_total = 0;
    for (cs, size, depths) in [
        (4 * K, 2 * M, &[1usize, 2, 8][..]),
        (64 * K, 4 * M, &[1, 3, 5, 8][..]),
        (2 * M, 8 * M, &[1, 4][..]),
        (512, 512 * K, &[2][..]),
    ] {
        for &depth in depths {
            let dir = Dir::new(&format!("chain-{cs}-{depth}"));
            let top = build_chain(&dir.0, depth, cs, size, cs + depth as u64);
            let n = check_map(&dir.0, &top);
            let stats = check_bytes(&dir.0, &top, &MapOptions::default());
            assert!(stats.mappings <= n + 2 * depth + 2, "cs {cs} depth {depth}: {stats:?} for {n} extents");
            let map = Image::open(dir.0.join(&top)).unwrap().extent_map().unwrap();
            let compressed: u64 =
                map.extents.iter().filter(|e| matches!(e.kind, ExtentKind::Compressed { .. })).map(|e| e.len).sum();
            assert!(stats.memfd_bytes >= compressed, "compressed clusters are materialised: {stats:?}");
            compressed_total += compressed;
            if cs >= 4 * K {
                assert!(stats.file_bytes > 0, "data is mapped from layer files: {stats:?}");
            }
        }
    }
    assert!(compressed_total > 0, "the matrix had no compressed cluster left");
}

#[test]
fn raw_base_and_shorter_backing() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("raw-short");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "1M"]);
    qemu_io(d, "base.raw", &["write -P 0x11 0 256k".into(), "write -P 0x12 640k 100k".into()]);
    // Overlay 3 MiB on a 1 MiB base; a middle qcow2 of 2 MiB.
    run(
        d,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", "-b", "base.raw", "-F", "raw", "mid.qcow2", "2M"],
    );
    qemu_io(
        d,
        "mid.qcow2",
        &[
            "write -P 0x22 64k 8k".into(),
            "write -z 128k 8k".into(),
            "write -c -P 0x33 512k 4k".into(),
            "discard 16k 4k".into(),
        ],
    );
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", "top.qcow2", "3M"]);
    qemu_io(d, "top.qcow2", &["write -P 0x44 1536k 4k".into(), "write -P 0x45 2900k 4k".into()]);
    check_map(d, "top.qcow2");
    check_bytes(d, "top.qcow2", &MapOptions::default());
    let map = Image::open(d.join("top.qcow2")).unwrap().extent_map().unwrap();
    let beyond = map.find(GuestOffset(2 * M + 4096)).unwrap();
    assert_eq!(beyond.kind, ExtentKind::Zero { reason: advm::image::ZeroReason::BeyondBacking });
    let hole = map.find(GuestOffset(300 * K)).unwrap();
    assert_eq!((hole.depth, &hole.kind), (2, &ExtentKind::Zero { reason: advm::image::ZeroReason::Hole }));
    // A raw image alone is a chain of one.
    check_bytes(d, "base.raw", &MapOptions::default());
    // A raw base whose size is not a multiple of the page (nor of 512).
    let odd: Vec<u8> = (0..1_000_001u32).map(|i| (i / 4096 + 1) as u8).collect();
    fs::write(d.join("odd.raw"), odd).unwrap();
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "odd.raw", "-F", "raw", "over.qcow2", "2M"]);
    qemu_io(d, "over.qcow2", &["write -P 0x55 8k 4k".into()]);
    check_map(d, "over.qcow2");
    let stats = check_bytes(d, "over.qcow2", &MapOptions::default());
    assert!(stats.memfd_bytes >= 4096, "the partial last page of odd.raw is materialised: {stats:?}");
}

#[test]
fn compressed_images_deflate_and_zstd() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("compressed");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "src.raw", "3M"]);
    qemu_io(d, "src.raw", &["write -P 0x5a 0 1M".into(), "write -P 0x17 1500k 300k".into()]);
    run(d, "qemu-img", &["convert", "-c", "-O", "qcow2", "src.raw", "deflate.qcow2"]);
    run(d, "qemu-img", &["convert", "-c", "-O", "qcow2", "-o", "compression_type=zstd", "src.raw", "zstd.qcow2"]);
    for image in ["deflate.qcow2", "zstd.qcow2"] {
        check_map(d, image);
        let stats = check_bytes(d, image, &MapOptions::default());
        assert!(stats.memfd_bytes >= M, "{image}: {stats:?}");
    }
}

#[test]
fn vma_budget_fails_clearly_or_copies_small_runs() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("budget");
    let d = &dir.0;
    let top = build_chain(d, 3, 64 * K, 4 * M, 7);
    let img = Image::open(d.join(&top)).unwrap();
    let natural = ImageSpace::map_image(&img, &MapOptions::default()).unwrap().stats().mappings;
    assert!(natural > 4, "{natural}");
    let e = ImageSpace::map_image(&img, &MapOptions { max_mappings: Some(4), ..Default::default() }).unwrap_err();
    let msg = e.to_string();
    let max = advm::probe::facts().max_map_count;
    assert!(
        msg.starts_with(&format!("{}: needs {natural} mappings (", d.join(&top).display()))
            && msg.ends_with(&format!(
                "but the budget is 4 (vm.max_map_count {max}); map with OverBudget::CopySmallRuns to read small runs into memory"
            )),
        "{msg}"
    );
    let options = MapOptions { max_mappings: Some(4), over_budget: OverBudget::CopySmallRuns, ..Default::default() };
    let stats = check_bytes(d, &top, &options);
    assert!(stats.mappings <= 4 && stats.over_budget_bytes > 0, "{stats:?}");
}

/// Writes a qcow2 v3 file by hand: `clusters` 4 KiB clusters whose even clusters all
/// point at one data cluster (so no two are contiguous) and odd ones are unallocated.
/// qemu-io could build the same map only with hundreds of thousands of commands.
fn fragmented_qcow2(path: &Path, clusters: u64) {
    let cs = 4096u64;
    let l2_entries = cs / 8;
    let l1_size = clusters.div_ceil(l2_entries);
    let l1_clusters = (l1_size * 8).div_ceil(cs);
    let refcount_table = cs; // cluster 1: an empty refcount table
    let l1_off = 2 * cs;
    let data_off = l1_off + l1_clusters * cs;
    let l2_first = data_off + cs;
    let mut h = vec![0u8; cs as usize];
    h[0..4].copy_from_slice(b"QFI\xfb");
    h[4..8].copy_from_slice(&3u32.to_be_bytes());
    h[20..24].copy_from_slice(&12u32.to_be_bytes());
    h[24..32].copy_from_slice(&(clusters * cs).to_be_bytes());
    h[36..40].copy_from_slice(&(l1_size as u32).to_be_bytes());
    h[40..48].copy_from_slice(&l1_off.to_be_bytes());
    h[48..56].copy_from_slice(&refcount_table.to_be_bytes());
    h[56..60].copy_from_slice(&1u32.to_be_bytes());
    h[96..100].copy_from_slice(&4u32.to_be_bytes());
    h[100..104].copy_from_slice(&104u32.to_be_bytes());
    let f = fs::File::create(path).unwrap();
    f.write_all_at(&h, 0).unwrap();
    let l1: Vec<u8> = (0..l1_size).flat_map(|i| ((l2_first + i * cs) | 1 << 63).to_be_bytes()).collect();
    f.write_all_at(&l1, l1_off).unwrap();
    f.write_all_at(&vec![0xc3u8; cs as usize], data_off).unwrap();
    let l2: Vec<u8> = (0..l1_size * l2_entries)
        .flat_map(|c| if c % 2 == 0 && c < clusters { data_off.to_be_bytes() } else { [0u8; 8] })
        .collect();
    f.write_all_at(&l2, l2_first).unwrap();
}

#[test]
fn hundreds_of_thousands_of_runs_exceed_the_vma_budget() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("runs");
    let d = &dir.0;
    let clusters = 200_000;
    fragmented_qcow2(&d.join("frag.qcow2"), clusters);
    let n = check_map(d, "frag.qcow2");
    assert_eq!(n, clusters as usize);
    let msg = ImageSpace::map(d.join("frag.qcow2"), &MapOptions::default()).unwrap_err().to_string();
    assert!(msg.contains(&format!("needs {clusters} mappings ({clusters} extents after coalescing)")), "{msg}");
    // Copying every run materialises the whole 800 MB disk: over the default limit.
    let options = MapOptions { over_budget: OverBudget::CopySmallRuns, ..Default::default() };
    let msg = ImageSpace::map(d.join("frag.qcow2"), &options).unwrap_err().to_string();
    assert!(msg.contains("would materialise 819200000 bytes in memory"), "{msg}");
    let options = MapOptions { max_materialised_bytes: Some(1 << 30), ..options };
    let space = ImageSpace::map(d.join("frag.qcow2"), &options).unwrap();
    assert!(space.stats().mappings <= space.stats().budget, "{:?}", space.stats());
    let mut buf = vec![0u8; 8192];
    for c in [0u64, 1, 2, 77_777, 199_998] {
        space.read(GuestOffset(c * 4096), &mut buf[..4096]).unwrap();
        let want = if c % 2 == 0 { 0xc3 } else { 0 };
        assert!(buf[..4096].iter().all(|&b| b == want), "cluster {c}");
    }
}

fn open_err(path: &Path) -> String {
    match Image::open(path).and_then(|i| i.extent_map()) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_images_give_clear_errors() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("bad");
    let d = &dir.0;
    let good = |name: &str| -> PathBuf {
        run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", name, "1M"]);
        qemu_io(d, name, &["write -P 0x66 0 64k".into()]);
        d.join(name)
    };
    // Truncated header.
    let p = good("trunc.qcow2");
    fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(50).unwrap();
    assert_eq!(
        open_err(&p),
        format!("{}: truncated qcow2 header: file is 50 bytes, a header needs at least 72", p.display())
    );
    // L1 table past EOF.
    let p = good("l1.qcow2");
    patch(&p, 40, &(1u64 << 40).to_be_bytes());
    let mut n = [0u8; 4];
    fs::File::open(&p).unwrap().read_exact_at(&mut n, 36).unwrap();
    assert_eq!(
        open_err(&p),
        format!(
            "{}: L1 table at 0x10000000000 ({} entries) is past the end of the file ({} bytes)",
            p.display(),
            u32::from_be_bytes(n),
            fs::metadata(&p).unwrap().len()
        )
    );
    // L2 table past EOF.
    let p = good("l2.qcow2");
    let mut b = [0u8; 8];
    fs::File::open(&p).unwrap().read_exact_at(&mut b, 40).unwrap();
    patch(&p, u64::from_be_bytes(b), &((1u64 << 63) | (1 << 30)).to_be_bytes());
    assert_eq!(
        open_err(&p),
        format!(
            "{}: L2 table at 0x40000000 is past the end of the file ({} bytes)",
            p.display(),
            fs::metadata(&p).unwrap().len()
        )
    );
    // Unknown incompatible feature.
    let p = good("feature.qcow2");
    patch(&p, 72, &(1u64 << 5).to_be_bytes());
    assert_eq!(open_err(&p), format!("{}: unknown incompatible feature bit 5 (known bits: 0-4)", p.display()));
    // Marked corrupt.
    let p = good("corrupt.qcow2");
    patch(&p, 72, &2u64.to_be_bytes());
    assert!(open_err(&p).ends_with("image is marked corrupt (incompatible bit 1); run `qemu-img check -r all` first"));
    // Missing backing file.
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "gone.qcow2", "1M"]);
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "gone.qcow2", "-F", "qcow2", "orphan.qcow2"]);
    fs::remove_file(d.join("gone.qcow2")).unwrap();
    let p = d.join("orphan.qcow2");
    assert_eq!(
        open_err(&p),
        format!(
            "{}: backing file \"gone.qcow2\" (resolved to {}): No such file or directory (os error 2)",
            p.display(),
            d.join("gone.qcow2").display()
        )
    );
    // Backing loop: a -> b -> a.
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "a.qcow2", "1M"]);
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "a.qcow2", "-F", "qcow2", "b.qcow2"]);
    run(d, "qemu-img", &["rebase", "-u", "-b", "b.qcow2", "-F", "qcow2", "a.qcow2"]);
    let msg = open_err(&d.join("a.qcow2"));
    assert_eq!(
        msg,
        format!(
            "{}: backing loop: {} -> {} -> {} (already layer 0)",
            d.join("b.qcow2").display(),
            d.join("a.qcow2").display(),
            d.join("b.qcow2").display(),
            d.join("a.qcow2").display()
        )
    );
    // Encrypted (LUKS): opens and maps as "unsupported", mapping refuses.
    let secret = "secret,id=sec0,data=advm";
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "plain.raw", "1M"]);
    qemu_io(d, "plain.raw", &["write -P 0x77 0 64k".into()]);
    run(
        d,
        "qemu-img",
        &[
            "convert",
            "--object",
            secret,
            "-O",
            "qcow2",
            "-o",
            "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10",
            "plain.raw",
            "enc.qcow2",
        ],
    );
    let p = d.join("enc.qcow2");
    let map = Image::open(&p).unwrap().extent_map().unwrap();
    assert!(map.extents.iter().any(|e| matches!(&e.kind, ExtentKind::Unsupported { reason } if reason == "layer is encrypted (LUKS); decryption is not supported")));
    let msg = ImageSpace::map(&p, &MapOptions::default()).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: cannot map guest 0x0+", p.display()))
            && msg.ends_with("(layer 0): layer is encrypted (LUKS); decryption is not supported"),
        "{msg}"
    );
    // Not an image at all, and a directory.
    assert_eq!(
        open_err(d),
        format!("{}: is a directory; image layers must be regular files or block devices", d.display())
    );
}

/// Random writes, zero writes and discards at 512-byte granularity: with extended L2
/// entries they leave clusters whose subclusters are allocated, zero and unallocated
/// side by side.
fn scribble_sectors(dir: &Path, image: &str, size: u64, seed: u64) {
    let mut r = Lcg(seed);
    let cmds: Vec<String> = (0..12)
        .map(|_| {
            let off = r.below(size / 512) * 512;
            let len = ((1 + r.below(32)) * 512).min(size - off);
            match r.below(4) {
                0 => format!("write -z {off} {len}"),
                1 => format!("discard {off} {len}"),
                _ => format!("write -P {} {off} {len}", 1 + r.below(250)),
            }
        })
        .collect();
    qemu_io(dir, image, &cmds);
}

#[test]
fn extended_l2_subclusters() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("subclusters");
    let d = &dir.0;
    // 2 MiB clusters: 64 KiB subclusters, page-sized or larger: mapped like clusters.
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=2M,extended_l2=on", "big.qcow2", "8M"]);
    qemu_io(
        d,
        "big.qcow2",
        &["write -P 0x31 64k 128k".into(), "write -P 0x32 3M 64k".into(), "write -z 4M 64k".into()],
    );
    check_map(d, "big.qcow2");
    check_bytes(d, "big.qcow2", &MapOptions::default());
    // 64 KiB clusters: 2 KiB subclusters, smaller than a page. One cluster holds
    // written, zero and unallocated subclusters over a backing file that has data:
    // the pages are built from the pieces.
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "1M"]);
    qemu_io(d, "base.raw", &["write -P 0x5a 0 1M".into()]);
    let small = ["create", "-q", "-f", "qcow2", "-o", "cluster_size=64k,extended_l2=on"];
    run(d, "qemu-img", &[&small[..], &["-b", "base.raw", "-F", "raw", "small.qcow2", "1M"]].concat());
    qemu_io(d, "small.qcow2", &["write -P 0x33 2k 2k".into(), "write -z 8k 4k".into(), "write -P 0x34 14k 2k".into()]);
    check_map(d, "small.qcow2");
    let stats = check_bytes(d, "small.qcow2", &MapOptions::default());
    assert!(stats.materialised_bytes > 0, "the mixed pages are materialised: {stats:?}");
    // Random mixes at every subcluster size, alone and over a backing file (raw, or
    // extended-L2 qcow2 scribbled the same way).
    let mut images = 0;
    for (i, cs) in [16 * K, 32 * K, 64 * K, 128 * K, 2 * M].into_iter().enumerate() {
        let size = (cs * 8).max(M);
        for backing in [None, Some("raw"), Some("qcow2")] {
            let dir = Dir::new(&format!("subclusters-{cs}-{backing:?}"));
            let d = &dir.0;
            let seed = 1000 * i as u64 + images;
            let opts = format!("cluster_size={cs},extended_l2=on");
            let mut args = vec!["create", "-q", "-f", "qcow2", "-o", &opts];
            match backing {
                Some("raw") => {
                    run(d, "qemu-img", &["create", "-q", "-f", "raw", "base", &size.to_string()]);
                    qemu_io(d, "base", &[format!("write -P 0x5a 0 {size}")]);
                    args.extend(["-b", "base", "-F", "raw"]);
                }
                Some(_) => {
                    run(d, "qemu-img", &[&args[..], &["base", &size.to_string()]].concat());
                    scribble_sectors(d, "base", size, seed + 500);
                    args.extend(["-b", "base", "-F", "qcow2"]);
                }
                None => {}
            }
            let size_arg = size.to_string();
            run(d, "qemu-img", &[&args[..], &["top.qcow2", &size_arg]].concat());
            scribble_sectors(d, "top.qcow2", size, seed);
            check_map(d, "top.qcow2");
            check_bytes(d, "top.qcow2", &MapOptions::default());
            images += 1;
        }
    }
    // Writes to a writable mapping of mixed pages stay in this process.
    let before = fs::read(d.join("small.qcow2")).unwrap();
    let space = ImageSpace::map(d.join("small.qcow2"), &MapOptions { writable: true, ..Default::default() }).unwrap();
    let other = ImageSpace::map(d.join("small.qcow2"), &MapOptions::default()).unwrap();
    // SAFETY: the mapping is writable and 1 MiB long; nothing else in this test
    // references its first 16 KiB.
    unsafe { std::ptr::write_bytes(space.addr() as *mut u8, 0x99, 16 * K as usize) };
    let (mut a, mut b) = (vec![0u8; 16 * K as usize], vec![0u8; 16 * K as usize]);
    space.read(GuestOffset(0), &mut a).unwrap();
    other.read(GuestOffset(0), &mut b).unwrap();
    assert!(a.iter().all(|&x| x == 0x99), "the writer sees its writes");
    assert_eq!((b[0], b[2048], b[8192], b[14336]), (0x5a, 0x33, 0, 0x34), "another mapping does not");
    assert!(fs::read(d.join("small.qcow2")).unwrap() == before, "the layer file is unchanged");
    drop((space, other));
    check_bytes(d, "small.qcow2", &MapOptions::default());
}

#[test]
fn writes_through_a_writable_mapping_stay_private() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("writable");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", "w.qcow2", "256k"]);
    qemu_io(d, "w.qcow2", &["write -P 0x5e 0 64k".into()]);
    let before = fs::read(d.join("w.qcow2")).unwrap();
    let space = ImageSpace::map(d.join("w.qcow2"), &MapOptions { writable: true, ..Default::default() }).unwrap();
    let other = ImageSpace::map(d.join("w.qcow2"), &MapOptions::default()).unwrap();
    // SAFETY: the mapping is writable, at least 64 KiB long, and nothing else in this
    // test references its first page.
    unsafe { std::ptr::write_bytes(space.addr() as *mut u8, 0x99, 16) };
    let mut b = [0u8; 32];
    space.read(GuestOffset(0), &mut b).unwrap();
    assert_eq!((b[0], b[15], b[16]), (0x99, 0x99, 0x5e));
    other.read(GuestOffset(0), &mut b).unwrap();
    assert_eq!(b[0], 0x5e, "another mapping of the image does not see the write");
    assert!(fs::read(d.join("w.qcow2")).unwrap() == before, "the layer file is unchanged");
}

#[test]
fn two_mappings_share_the_page_cache() {
    if !have_qemu() {
        return;
    }
    if !advm::probe::facts().pfn_visible {
        eprintln!("skipping: PFNs hidden in /proc/self/pagemap (needs CAP_SYS_ADMIN)");
        return;
    }
    let dir = Dir::new("share");
    let d = &dir.0;
    let top = build_chain(d, 2, 64 * K, 2 * M, 3);
    let a = ImageSpace::map(d.join(&top), &MapOptions::default()).unwrap();
    let b = ImageSpace::map(d.join(&top), &MapOptions::default()).unwrap();
    a.read_all().unwrap();
    b.read_all().unwrap();
    let ps = advm::addr::page_size() as u64;
    let pages = (2 * M / ps) as usize;
    let frames = |s: &ImageSpace| {
        let r = s.range();
        advm::stats::page_frames(advm::mem::PageRange::new("space", r.start().0, 2 * M as usize).unwrap()).unwrap()
    };
    let (pa, pb) = (frames(&a), frames(&b));
    let map = a.extent_map();
    let mut shared = 0;
    for p in 0..pages {
        let e = map.find(GuestOffset(p as u64 * ps)).unwrap();
        let (ea, eb) = (pa[p], pb[p]);
        assert!(ea.is_some() && eb.is_some(), "page {p} not faulted in");
        if let ExtentKind::Data { .. } = e.kind {
            if e.start.0 % ps == 0 && e.len >= ps {
                assert_eq!(ea, eb, "data page {p} ({e:?}) has two copies");
                shared += 1;
            }
        }
    }
    assert!(shared > 0, "no data page in the chain");
}

#[test]
fn mutated_qemu_images_never_panic_or_map_garbage() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("mutate");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", "base.qcow2", "256k"]);
    qemu_io(
        d,
        "base.qcow2",
        &["write -c -P 0x21 0 4k".into(), "write -P 0x22 64k 32k".into(), "write -z 128k 8k".into()],
    );
    let original = fs::read(d.join("base.qcow2")).unwrap();
    let mut r = Lcg(42);
    let (mut mapped, mut refused) = (0, 0);
    for _ in 0..300 {
        let mut bytes = original.clone();
        for _ in 0..1 + r.below(4) {
            // Mostly metadata: the header cluster, then the L1/L2/refcount clusters.
            let at = if r.below(2) == 0 { r.below(112) } else { r.below(bytes.len() as u64) } as usize;
            bytes[at] = r.next() as u8;
        }
        let p = d.join("m.qcow2");
        fs::write(&p, &bytes).unwrap();
        match ImageSpace::map(&p, &MapOptions::default()) {
            Ok(space) => {
                // Whatever mapped must read back in full, equal to read_at.
                let mut a = vec![0u8; space.size().min(1 << 20) as usize];
                space.read(GuestOffset(0), &mut a).unwrap();
                let mut b = vec![0u8; a.len()];
                Image::open(&p).unwrap().read_at(GuestOffset(0), &mut b).unwrap();
                assert!(a == b, "mapping and read_at disagree");
                mapped += 1;
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with(&p.display().to_string()), "{msg}");
                refused += 1;
            }
        }
    }
    assert!(mapped > 0 && refused > 0, "mapped {mapped}, refused {refused}");
}

/// A qcow2 v3 header for a hand-written file: `bits`-bit clusters, `size` bytes
/// virtual, an L1 table of `l1_entries` at `l1_off`, a one-cluster refcount table at
/// cluster 1 (left empty: advm does not read refcounts).
fn hand_header(bits: u32, size: u64, l1_entries: u32, l1_off: u64) -> Vec<u8> {
    let mut h = vec![0u8; 104];
    h[0..4].copy_from_slice(b"QFI\xfb");
    h[4..8].copy_from_slice(&3u32.to_be_bytes());
    h[20..24].copy_from_slice(&bits.to_be_bytes());
    h[24..32].copy_from_slice(&size.to_be_bytes());
    h[36..40].copy_from_slice(&l1_entries.to_be_bytes());
    h[40..48].copy_from_slice(&l1_off.to_be_bytes());
    h[48..56].copy_from_slice(&(1u64 << bits).to_be_bytes());
    h[56..60].copy_from_slice(&1u32.to_be_bytes());
    h[96..100].copy_from_slice(&4u32.to_be_bytes());
    h[100..104].copy_from_slice(&104u32.to_be_bytes());
    h
}

/// A 4 KiB-cluster qcow2 of `tables` L2 tables whose every entry names the same
/// compressed cluster (0x5a bytes): a few KiB of file, `tables` * 2 MiB of disk.
fn one_compressed_cluster_everywhere(path: &Path, tables: u64) {
    let cs = 4096u64;
    let (l1_off, l2_first) = (2 * cs, 3 * cs);
    let payload = l2_first + tables * cs;
    let mut c = flate2::Compress::new(flate2::Compression::fast(), false);
    let mut stream = vec![0u8; 512];
    c.compress(&[0x5au8; 4096], &mut stream, flate2::FlushCompress::Finish).unwrap();
    stream.truncate(c.total_out() as usize);
    // Compressed entry (cluster_bits 12): offset in bits 0..58, sectors - 1 above.
    let entry = (1u64 << 62) | payload;
    let f = fs::File::create(path).unwrap();
    f.write_all_at(&hand_header(12, tables * 512 * cs, tables as u32, l1_off), 0).unwrap();
    let l1: Vec<u8> = (0..tables).flat_map(|i| ((l2_first + i * cs) | 1 << 63).to_be_bytes()).collect();
    f.write_all_at(&l1, l1_off).unwrap();
    let l2: Vec<u8> = (0..tables * 512).flat_map(|_| entry.to_be_bytes()).collect();
    f.write_all_at(&l2, l2_first).unwrap();
    f.write_all_at(&stream, payload).unwrap();
    f.set_len(payload + 512).unwrap();
}

/// Proportional set size (KiB) of the memfd mappings inside `[start, end)` of this
/// process: what the materialised pages cost, counting a page mapped n times once.
fn memfd_pss_kib(start: usize, end: usize) -> u64 {
    let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|(a, _)| a.chars().all(|c| c.is_ascii_hexdigit())) {
            let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
            inside = a >= start && b <= end && line.contains("/memfd:advm-image");
        } else if inside && first == "Pss:" {
            kib += words.next().unwrap().parse::<u64>().unwrap();
        }
    }
    kib
}

#[test]
fn a_compressed_cluster_named_many_times_is_materialised_once() {
    let dir = Dir::new("dedupe");
    let p = dir.0.join("same.qcow2");
    // 8192 references to one 4 KiB cluster: 32 MiB of disk.
    one_compressed_cluster_everywhere(&p, 16);
    let space = ImageSpace::map(&p, &MapOptions::default()).unwrap();
    assert_eq!(space.read_all().unwrap(), 0x5a * 32 * M);
    let pss = memfd_pss_kib(space.addr(), space.addr() + space.size() as usize);
    assert!(pss <= 64, "the decompressed cluster costs {pss} KiB, not 4");
    assert_eq!(space.stats().materialised_bytes, 4096);
    // Copied over a tiny budget, every reference becomes a copy of its own: refused
    // before anything is decompressed.
    let options = MapOptions {
        max_mappings: Some(4),
        over_budget: OverBudget::CopySmallRuns,
        max_materialised_bytes: Some(M),
        ..Default::default()
    };
    assert_eq!(
        ImageSpace::map(&p, &options).unwrap_err().to_string(),
        format!(
            "{}: mapping it would materialise 33554432 bytes in memory (decompressed clusters, partial pages, \
             runs copied over the budget), over the 1048576-byte limit; raise it with --max-materialised \
             (MapOptions::max_materialised_bytes)",
            p.display()
        )
    );
}

#[test]
fn an_l2_table_named_by_two_l1_entries_is_refused() {
    let dir = Dir::new("l2-twice");
    let p = dir.0.join("twice.qcow2");
    one_compressed_cluster_everywhere(&p, 2);
    // L1 entry 1 names entry 0's table: each table could be repeated a million times.
    patch(&p, 2 * 4096 + 8, &((3 * 4096u64) | 1 << 63).to_be_bytes());
    assert_eq!(
        open_err(&p),
        format!(
            "{}: L1 entries 0 and 1 both name the L2 table at 0x3000; an active L1 table names each L2 table once",
            p.display()
        )
    );
}

#[test]
fn backing_files_outside_the_image_directory_are_refused() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("confine");
    let d = fs::canonicalize(&dir.0).unwrap();
    let inner = d.join("inner");
    fs::create_dir(&inner).unwrap();
    fs::write(d.join("secret.raw"), vec![0x73u8; 64 * 1024]).unwrap();
    let create = |name: &str, backing: &str| {
        run(&inner, "qemu-img", &["create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw", name, "64k"]);
        inner.join(name)
    };
    let secret = d.join("secret.raw");
    let outside = |p: &Path, name: &str| {
        format!(
            "{}: backing file \"{name}\" resolves to {}, outside {}, the directory of the image opened; \
             refusing to follow it (allow with --allow-backing-outside, ImageOptions::allow_backing_outside)",
            p.display(),
            secret.display(),
            inner.display()
        )
    };
    let rel = create("rel.qcow2", "../secret.raw");
    assert_eq!(open_err(&rel), outside(&rel, "../secret.raw"));
    let abs = create("abs.qcow2", secret.to_str().unwrap());
    assert_eq!(open_err(&abs), outside(&abs, secret.to_str().unwrap()));
    std::os::unix::fs::symlink("../secret.raw", inner.join("link.raw")).unwrap();
    let sym = create("sym.qcow2", "link.raw");
    assert_eq!(open_err(&sym), outside(&sym, "link.raw"));
    // Inside the directory tree (a subdirectory) is fine.
    fs::create_dir(inner.join("sub")).unwrap();
    fs::write(inner.join("sub/base.raw"), vec![0x62u8; 64 * 1024]).unwrap();
    let ok = create("ok.qcow2", "sub/base.raw");
    let mut b = [0u8; 4];
    Image::open(&ok).unwrap().read_at(GuestOffset(0), &mut b).unwrap();
    assert_eq!(b, [0x62; 4]);
}

/// QEMU's `file:` protocol names a local file: followed (qemu-img writes such names and
/// QEMU opens them); any other protocol is refused by name.
#[test]
fn a_file_protocol_backing_name_is_followed_and_other_protocols_refused() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("fileproto");
    let d = fs::canonicalize(&dir.0).unwrap();
    fs::write(d.join("base.raw"), vec![0x62u8; 64 * 1024]).unwrap();
    let create = |name: &str, backing: &str| {
        run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw", name, "64k"]);
        d.join(name)
    };
    let file = create("file.qcow2", &format!("file:{}", d.join("base.raw").display()));
    let mut b = [0u8; 4];
    Image::open(&file).unwrap().read_at(GuestOffset(0), &mut b).unwrap();
    assert_eq!(b, [0x62; 4]);
    let nbd = create("nbd.qcow2", "nbd:localhost:10809");
    let e = open_err(&nbd);
    assert!(e.contains("\"nbd:localhost:10809\" uses a protocol prefix"), "{e}");
}

#[test]
fn a_backing_file_without_format_is_not_probed_as_raw() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("probe");
    let d = fs::canonicalize(&dir.0).unwrap();
    fs::write(d.join("base.raw"), vec![0x62u8; 64 * 1024]).unwrap();
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2", "64k"]);
    strip_backing_format(&d.join("top.qcow2"));
    let top = d.join("top.qcow2");
    assert_eq!(
        open_err(&top),
        format!(
            "{}: backing file \"base.raw\" ({}) has no backing format and is not qcow2; refusing to probe it as raw \
             (allow with --allow-probed-raw, ImageOptions::allow_probed_raw, or record the format: \
             qemu-img rebase -u -b base.raw -F raw)",
            top.display(),
            d.join("base.raw").display()
        )
    );
    // A qcow2 backing file is recognised by its magic without the extension.
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "mid.qcow2", "64k"]);
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", "over.qcow2", "64k"]);
    strip_backing_format(&d.join("over.qcow2"));
    assert_eq!(Image::open(d.join("over.qcow2")).unwrap().layers().len(), 2);
}

#[test]
fn a_fifo_layer_is_refused_without_blocking() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("fifo");
    let d = fs::canonicalize(&dir.0).unwrap();
    run(&d, "mkfifo", &["pipe"]);
    run(&d, "qemu-img", &["create", "-q", "-f", "qcow2", "-u", "-b", "pipe", "-F", "raw", "top.qcow2", "64k"]);
    let (tx, rx) = std::sync::mpsc::channel();
    let top = d.join("top.qcow2");
    std::thread::spawn(move || tx.send(open_err(&top)).unwrap());
    let got = rx.recv_timeout(std::time::Duration::from_secs(10));
    if got.is_err() {
        // Unblock the opener so the thread ends.
        let _ = fs::OpenOptions::new().write(true).open(d.join("pipe"));
    }
    let pipe = d.join("pipe");
    assert_eq!(
        got.expect("opening an image whose backing file is a FIFO blocked for 10 s"),
        format!("{}: is a FIFO; image layers must be regular files or block devices", pipe.display())
    );
    let msg = open_err(&d);
    assert_eq!(msg, format!("{}: is a directory; image layers must be regular files or block devices", d.display()));
}

#[test]
fn a_layer_truncated_while_mapped_gives_an_error_not_sigbus() {
    let dir = Dir::new("shrink");
    let base = dir.0.join("base.raw");
    fs::write(&base, vec![0x11u8; 8 * M as usize]).unwrap();
    let mut b = vec![0u8; 4096];
    // A writer already has the file open, so no read lease can be had: the size check
    // before every read is what stands between the reader and SIGBUS.
    let writer = fs::OpenOptions::new().write(true).open(&base).unwrap();
    let space = ImageSpace::map(&base, &MapOptions::default()).unwrap();
    let img = Image::open(&base).unwrap();
    space.read(GuestOffset(4 * M), &mut b).unwrap();
    writer.set_len(M).unwrap();
    let shrank = format!(
        "{}: shrank from 8388608 to 1048576 bytes while mapped; refusing to read through the mapping",
        base.display()
    );
    assert_eq!(space.read(GuestOffset(4 * M), &mut b).unwrap_err().to_string(), shrank);
    assert_eq!(space.read_all().unwrap_err().to_string(), shrank);
    assert_eq!(
        img.read_at(GuestOffset(4 * M), &mut b).unwrap_err().to_string(),
        format!("{}: shrank from 8388608 to 1048576 bytes since it was opened", base.display())
    );
    writer.set_len(8 * M).unwrap();
    drop((writer, space));
    // No writer: the mapping holds a read lease, and a writer's open breaks it.
    let space = ImageSpace::map(&base, &MapOptions::default()).unwrap();
    space.read(GuestOffset(4 * M), &mut b).unwrap();
    let open = fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&base);
    assert_eq!(open.unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "no read lease on {}", base.display());
    let broken = format!(
        "{}: opened for writing or truncated by another process while mapped (read lease broken); \
         refusing to read through the mapping",
        base.display()
    );
    assert_eq!(space.read(GuestOffset(0), &mut b).unwrap_err().to_string(), broken);
    // The reader let go of the lease: the writer is not kept waiting.
    let t = std::time::Instant::now();
    fs::OpenOptions::new().write(true).open(&base).unwrap().set_len(M).unwrap();
    assert!(t.elapsed().as_secs() < 5, "the writer waited {:?}", t.elapsed());
    assert_eq!(space.read(GuestOffset(4 * M), &mut b).unwrap_err().to_string(), broken);
}

/// An image of a format qemu knows and advm does not read, named as the image to open
/// (which is probed: qcow2 or raw) or as a backing file without a format, is refused
/// by name; read as raw it was mapped with its metadata as disk bytes.
#[test]
fn images_of_other_formats_are_refused_not_read_as_raw() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("other-formats");
    let d = &dir.0;
    let cases: [(&str, &[&str], &str); 7] = [
        ("a.vmdk", &["-f", "vmdk"], "vmdk"),
        ("flat.vmdk", &["-f", "vmdk", "-o", "subformat=monolithicFlat"], "vmdk (descriptor)"),
        ("a.vdi", &["-f", "vdi"], "vdi"),
        ("a.qed", &["-f", "qed"], "qed"),
        ("a.vpc", &["-f", "vpc"], "vpc (VHD)"),
        ("a.vhdx", &["-f", "vhdx"], "vhdx"),
        ("a.hdd", &["-f", "parallels"], "parallels"),
    ];
    for (name, args, what) in cases {
        let mut a = vec!["create", "-q"];
        a.extend_from_slice(args);
        a.extend_from_slice(&[name, "1M"]);
        run(d, "qemu-img", &a);
        let p = d.join(name);
        assert_eq!(
            open_err(&p),
            format!(
                "{}: is a {what} image, not qcow2 or raw; refusing to read it as raw \
                 (convert it: qemu-img convert -O qcow2 {} out.qcow2)",
                p.display(),
                p.display()
            )
        );
    }
    run(
        d,
        "qemu-img",
        &["create", "-q", "-f", "luks", "--object", "secret,id=s0,data=pw", "-o", "key-secret=s0", "a.luks", "1M"],
    );
    assert!(open_err(&d.join("a.luks")).contains("is a LUKS (encrypted) image"), "{}", open_err(&d.join("a.luks")));
    // A backing file of such a format without a backing format is refused the same way.
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "a.vmdk", "-F", "vmdk", "over.qcow2"]);
    strip_backing_format(&d.join("over.qcow2"));
    assert!(open_err(&d.join("over.qcow2")).contains("a.vmdk: is a vmdk image"), "{}", open_err(&d.join("over.qcow2")));
    // A raw image is still probed as raw.
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "plain.raw", "1M"]);
    assert!(Image::open(d.join("plain.raw")).is_ok());
}

/// A size-0 image (qcow2 or raw) is an empty disk: it opens, resolves to no extent and
/// reads nothing; only mapping it is refused (a mapping of no bytes has no address).
#[test]
fn a_size_0_image_reads_as_empty() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("size-0");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "empty.qcow2", "0"]);
    fs::write(d.join("empty.raw"), b"").unwrap();
    for name in ["empty.qcow2", "empty.raw"] {
        let img = Image::open(d.join(name)).unwrap();
        assert_eq!(img.virtual_size(), 0, "{name}");
        assert!(img.extent_map().unwrap().extents.is_empty(), "{name}");
        img.read_at(GuestOffset(0), &mut []).unwrap();
        let err = ImageSpace::map(d.join(name), &MapOptions::default()).unwrap_err().to_string();
        assert!(err.ends_with("cannot map an image of virtual size 0"), "{name}: {err}");
    }
}

/// A qcow2 image on a block device (a loop device here) is read as qcow2: the format
/// is sniffed by `pread` at offset 0, not at the file position, which measuring a
/// block device's length leaves at its end (it was read as a raw disk of its own
/// metadata).
#[test]
fn a_qcow2_image_on_a_block_device_is_qcow2() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("on-a-block-device");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", "b.qcow2", "4M"]);
    run(d, "qemu-io", &["-c", "write -P 0x5a 64k 64k", "b.qcow2"]);
    // a whole number of 512-byte sectors, so the loop device holds all of it
    let len = fs::metadata(d.join("b.qcow2")).unwrap().len();
    fs::OpenOptions::new().write(true).open(d.join("b.qcow2")).unwrap().set_len(len.div_ceil(4096) * 4096).unwrap();
    let Some(lo) = LoopDevice::attach(&d.join("b.qcow2"), true) else { return };
    let dev = lo.0.clone();
    let img = Image::open(&dev).unwrap();
    assert_eq!(img.virtual_size(), 4 << 20, "{dev} read as raw: {img:?}");
    let mut buf = vec![0u8; 128 << 10];
    img.read_at(GuestOffset(0), &mut buf).unwrap();
    assert!(buf[..64 << 10].iter().all(|&b| b == 0) && buf[64 << 10..].iter().all(|&b| b == 0x5a));
}

/// A raw layer on a block device (an LVM volume, a disk partition), as the image and
/// under a qcow2 overlay, maps and reads as qemu-img reads it: the device cannot say
/// where holes are (`lseek(SEEK_DATA)` on a block device is EINVAL), so all of it is
/// data (every map failed with "lseek(SEEK_DATA): Invalid argument").
#[test]
fn a_raw_layer_on_a_block_device_maps_as_qemu_reads_it() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("raw-block-device");
    let d = &dir.0;
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "disk.raw", "1M"]);
    run(d, "qemu-io", &["-f", "raw", "-c", "write -P 0x5b 64k 64k", "-c", "write -P 0x5c 900k 4k", "disk.raw"]);
    let Some(lo) = LoopDevice::attach(&d.join("disk.raw"), true) else { return };
    let dev = lo.0.clone();
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", &dev, "-F", "raw", "top.qcow2"]);
    run(d, "qemu-io", &["-c", "write -P 0x5d 68k 4k", "top.qcow2"]);
    let outside = advm::image::ImageOptions { allow_backing_outside: true, ..Default::default() };
    for image in [dev.as_str(), "top.qcow2"] {
        let map = Image::open_with(d.join(image), &outside).unwrap().extent_map().unwrap();
        assert_eq!(map.size, 1 << 20, "{image}: {map:?}");
        check_bytes(d, image, &MapOptions { image: outside, ..Default::default() });
    }
}

/// base.qcow2 (1 MiB, its first 64 KiB `fill`) under top.qcow2 (empty), in `d`.
fn base_and_top(d: &Path, fill: u8) {
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "base.qcow2", "1M"]);
    qemu_io(d, "base.qcow2", &[format!("write -P {fill} 0 64k")]);
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2", "1M"]);
}

#[test]
fn an_image_a_qemu_writes_is_refused_unless_force_share() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("writer-lock");
    let d = &dir.0;
    base_and_top(d, 0x61);
    let (top, base) = (d.join("top.qcow2"), d.join("base.qcow2"));
    let force = advm::image::ImageOptions { force_share: true, ..Default::default() };
    let refused = |p: &Path| {
        format!(
            "{}: another process has it open for writing (it holds QEMU's write lock, byte 101 of the file), so \
             the disk may change while it is read; refusing to read it (stop the writer, which `fuser {}` names, \
             or read anyway with --force-share/-U, ImageOptions::force_share)",
            p.display(),
            p.display()
        )
    };
    // QEMU's write lock is byte 101 (its permission bytes start at 100; writing is bit 1).
    {
        let _w = Holder::start(d, "qemu-io", &["-c", "sleep 60000", "top.qcow2"], &top, 101);
        assert_eq!(open_err(&top), refused(&top));
        let err = ImageSpace::map(&top, &MapOptions::default()).unwrap_err().to_string();
        assert_eq!(err, refused(&top));
        let space = ImageSpace::map(&top, &MapOptions { image: force, ..Default::default() }).unwrap();
        let mut b = [0u8; 2];
        space.read(GuestOffset(65535), &mut b).unwrap();
        assert_eq!(b, [0x61, 0]);
    }
    // A writer of a backing file (a block-commit, another VM using it as its top).
    {
        let _w = Holder::start(d, "qemu-io", &["-f", "qcow2", "-c", "sleep 60000", "base.qcow2"], &base, 101);
        assert_eq!(open_err(&top), refused(&base));
        Image::open_with(&top, &force).unwrap();
    }
    // Readers sharing the image are not writers: a read-only qemu-io, and a QEMU
    // with the image as its disk under a temporary overlay (`advm vm run --disk blk`).
    {
        let _r = Holder::start(d, "qemu-io", &["-r", "-c", "sleep 60000", "top.qcow2"], &top, 100);
        check_bytes(d, "top.qcow2", &MapOptions::default());
    }
    let qemu = "qemu-system-x86_64";
    if std::process::Command::new(qemu).arg("--version").output().is_ok_and(|o| o.status.success()) {
        let vm = |extra: &str| {
            let drive = format!("file=top.qcow2,if=none,id=d0,format=qcow2{extra}");
            ["-M", "none", "-nodefaults", "-display", "none", "-S", "-drive"]
                .map(String::from)
                .into_iter()
                .chain([drive])
        };
        let args: Vec<String> = vm(",snapshot=on").collect();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let snapshot = Holder::start(d, qemu, &a, &top, 100);
        check_bytes(d, "top.qcow2", &MapOptions::default());
        drop(snapshot);
        let args: Vec<String> = vm("").collect();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let _writer = Holder::start(d, qemu, &a, &top, 101);
        assert_eq!(open_err(&top), refused(&top));
    } else {
        eprintln!("{qemu} not found: the VM cases are skipped");
    }
}

/// Whether some open file description holds a shared OFD lock on byte `byte` of `file`.
fn read_locked(file: &Path, byte: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ino = format!(":{}", fs::metadata(file).unwrap().ino());
    fs::read_to_string("/proc/locks").unwrap().lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 8 && f[1] == "OFDLCK" && f[3] == "READ" && f[5].ends_with(&ino) && f[6] == byte.to_string()
    })
}

/// While a chain is mapped (a `PmemBacking` a VMM holds, or an `ImageSpace`), its
/// mapped layers carry QEMU's "no writers" lock (byte 201, as a QEMU reading them as
/// backing files holds): QEMU, qemu-img and qemu-io refuse to open them for writing,
/// and readers go on. Before, a writer was refused only at open, and one that came
/// later changed the disk under a running VM. A writer that gets in between the open
/// and the lock is refused by the mapping.
#[test]
fn a_mapped_chain_locks_qemu_writers_out_until_it_is_unmapped() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("writers-out");
    let d = &dir.0;
    base_and_top(d, 0x61);
    qemu_io(d, "top.qcow2", &["write -P 0x62 128k 64k".into()]);
    let write = |file: &str| {
        let out = std::process::Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x63 192k 4k", file])
            .current_dir(d)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let refused = |(ok, e): (bool, String)| !ok && e.contains("Failed to get \"write\" lock");
    let (top, base) = (d.join("top.qcow2"), d.join("base.qcow2"));
    // A mapping in this process. (A QEMU writer would first wait out the mapping's
    // read lease, lease-break-time, 45 s by default: the lock is looked at instead.)
    let space = ImageSpace::map(&top, &MapOptions::default()).unwrap();
    assert!(read_locked(&top, 201) && read_locked(&base, 201));
    // Readers are not locked out.
    run(d, "qemu-img", &["convert", "-O", "raw", "top.qcow2", "flat.raw"]);
    let mut b = [0u8; 2];
    space.read(GuestOffset(128 << 10), &mut b).unwrap();
    assert_eq!(b, [0x62, 0x62]);
    drop(space);
    // A child another test's thread is spawning holds a copy of every descriptor until
    // its exec closes them (close-on-exec): the lock goes with the last copy.
    let t = std::time::Instant::now();
    while (read_locked(&top, 201) || read_locked(&base, 201)) && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!read_locked(&top, 201) && !read_locked(&base, 201));
    assert_eq!(write("top.qcow2"), (true, String::new()), "unmapped: writers may go on");
    // --force-share reads while a writer writes: it locks nobody out.
    let force = advm::image::ImageOptions { force_share: true, ..Default::default() };
    let image = Image::open_with(&top, &force).unwrap();
    let backing = PmemBacking::new(&image, &MapOptions { image: force, ..Default::default() }, 2 << 20).unwrap();
    assert!(write("top.qcow2").0);
    drop(backing);
    // A writer that opened the top after the chain was opened, before it was mapped.
    let image = Image::open(&top).unwrap();
    let writer = Holder::start(d, "qemu-io", &["-c", "sleep 60000", "top.qcow2"], &top, 101);
    let err = PmemBacking::new(&image, &MapOptions::default(), 2 << 20).unwrap_err().to_string();
    assert!(err.contains("another process has it open for writing"), "{err}");
    drop(writer);
    // A VMM's plan: the lock lives as long as the VMM's descriptors (here ours; they
    // are inheritable, so a child another test starts meanwhile may keep them: the
    // release is checked with the in-process mapping above).
    let backing = PmemBacking::new(&image, &MapOptions::default(), 2 << 20).unwrap();
    drop(image);
    assert!(refused(write("top.qcow2")), "a QEMU writer of the top while a VMM holds the plan");
    assert!(refused(write("base.qcow2")), "a QEMU writer of a backing file while a VMM holds the plan");
    drop(backing);
}

#[test]
fn backing_names_and_formats_end_at_a_nul_as_qemu_reads_them() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("nul-names");
    let d = &dir.0;
    base_and_top(d, 0x41);
    qemu_io(d, "top.qcow2", &["write -P 0x42 64k 4k".into()]);
    let top = fs::read(d.join("top.qcow2")).unwrap();
    let be32 = |at: usize| u32::from_be_bytes(top[at..at + 4].try_into().unwrap());
    let (name_at, name_len) = (u64::from_be_bytes(top[8..16].try_into().unwrap()) as usize, be32(16) as usize);
    assert_eq!(&top[name_at..name_at + name_len], b"base.qcow2");
    assert!(top[name_at + name_len..name_at + name_len + 6].iter().all(|&b| b == 0));
    // The name's length counts 6 NULs after it: still base.qcow2.
    fs::write(d.join("padded.qcow2"), &top).unwrap();
    patch(&d.join("padded.qcow2"), 16, &(name_len as u32 + 6).to_be_bytes());
    check_bytes(d, "padded.qcow2", &MapOptions::default());
    // An all-NUL name: no backing file at all.
    fs::write(d.join("none.qcow2"), &top).unwrap();
    patch(&d.join("none.qcow2"), name_at as u64, &vec![0u8; name_len]);
    assert_eq!(Image::open(d.join("none.qcow2")).unwrap().layers().len(), 1);
    check_bytes(d, "none.qcow2", &MapOptions::default());
    // An all-NUL backing format: none given, so the qcow2 magic decides.
    fs::write(d.join("noformat.qcow2"), &top).unwrap();
    let mut at = be32(100) as usize;
    while be32(at) != 0xe279_2aca {
        at += 8 + (be32(at + 4) as usize).div_ceil(8) * 8;
    }
    patch(&d.join("noformat.qcow2"), at as u64 + 8, &vec![0u8; be32(at + 4) as usize]);
    check_bytes(d, "noformat.qcow2", &MapOptions::default());
}

#[test]
fn header_extensions_end_where_the_backing_name_starts() {
    if !have_qemu() {
        return;
    }
    let dir = Dir::new("ext-end");
    let d = &dir.0;
    base_and_top(d, 0x41);
    let top = fs::read(d.join("top.qcow2")).unwrap();
    let be32 = |at: usize| u32::from_be_bytes(top[at..at + 4].try_into().unwrap());
    let mut at = be32(100) as usize;
    while be32(at) != 0 {
        at += 8 + (be32(at + 4) as usize).div_ceil(8) * 8;
    }
    assert_eq!(u64::from_be_bytes(top[8..16].try_into().unwrap()), at as u64 + 8, "the name follows the end mark");
    // The end mark turned into an empty unknown extension: QEMU stops at the name and
    // reads the image; so must we, not take the name for an extension.
    patch(&d.join("top.qcow2"), at as u64, &0x1234_5678_u32.to_be_bytes());
    check_bytes(d, "top.qcow2", &MapOptions::default());
    // A backing file name offset past the first cluster is refused, as QEMU refuses it.
    patch(&d.join("top.qcow2"), 8, &0x10008_u64.to_be_bytes());
    let p = d.join("top.qcow2");
    assert_eq!(
        open_err(&p),
        format!("{}: backing file name offset 0x10008 is past the first cluster (65536 bytes)", p.display())
    );
}

/// A layer written in place is seen as changed (a process mapping it would read the
/// new bytes); one with another file put in its place under its name is not (the open
/// layer, and its mappings, still read the old one), though its ctime moved.
#[test]
fn a_layer_written_in_place_is_changed_and_one_replaced_under_its_name_is_not() {
    let dir = Dir::new("stamp");
    let d = &dir.0;
    // the times come from a coarse clock: a tick passes before each change
    let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
    fs::write(d.join("disk.raw"), vec![7u8; 64 * 1024]).unwrap();
    let image = Image::open(d.join("disk.raw")).unwrap();
    let before = image.layers()[0].stamp().unwrap();
    tick();
    fs::write(d.join("new.raw"), vec![9u8; 64 * 1024]).unwrap();
    fs::rename(d.join("new.raw"), d.join("disk.raw")).unwrap();
    let after = image.layers()[0].stamp().unwrap();
    assert!(!before.changed_in_place(&after), "{before:?} -> {after:?}");
    let image = Image::open(d.join("disk.raw")).unwrap();
    let before = image.layers()[0].stamp().unwrap();
    tick();
    let f = fs::OpenOptions::new().write(true).open(d.join("disk.raw")).unwrap();
    f.write_all_at(b"x", 4096).unwrap();
    let after = image.layers()[0].stamp().unwrap();
    assert!(before.changed_in_place(&after) && after.ino == before.ino, "{before:?} -> {after:?}");
    // written, then its mtime put back: the ctime still says so
    tick();
    f.write_all_at(b"y", 4096).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::new(after.mtime.0 as u64, after.mtime.1 as u32))
        .unwrap();
    let put_back = image.layers()[0].stamp().unwrap();
    assert_eq!(put_back.mtime, after.mtime);
    assert!(after.changed_in_place(&put_back), "{after:?} -> {put_back:?}");
}

/// A block device written through another node keeps the layer node's times: the
/// sectors the kernel counts as written to the device tell the change.
#[test]
fn a_layer_on_a_block_device_written_through_another_node_is_changed() {
    let dir = Dir::new("stamp-blk");
    let file = dir.0.join("disk.raw");
    fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    let Some(dev) = LoopDevice::attach(&file, false) else { return };
    let image = Image::open(&dev.0).unwrap();
    let before = image.layers()[0].stamp().unwrap();
    assert!(before.sectors_written.is_some(), "no sysfs count for {}: {before:?}", dev.0);
    let unchanged = image.layers()[0].stamp().unwrap();
    assert!(!before.changed_in_place(&unchanged), "{before:?} -> {unchanged:?}");
    // written through another node of the same disk (its own inode: the layer's node
    // keeps its times), through the page cache and flushed
    use std::os::unix::fs::MetadataExt;
    let rdev = fs::metadata(&dev.0).unwrap().rdev();
    let other = dir.0.join("other-node");
    let made = std::process::Command::new("mknod")
        .arg(&other)
        .arg("b")
        .arg(rustix::fs::major(rdev).to_string())
        .arg(rustix::fs::minor(rdev).to_string())
        .status()
        .unwrap();
    assert!(made.success());
    let f = fs::OpenOptions::new().write(true).open(&other).unwrap();
    f.write_all_at(&[9u8; 4096], 65536).unwrap();
    f.sync_all().unwrap();
    let after = image.layers()[0].stamp().unwrap();
    assert_eq!((after.mtime, after.ctime, after.size), (before.mtime, before.ctime, before.size));
    assert!(before.changed_in_place(&after), "{before:?} -> {after:?}");
    // Written and not flushed (`dd` without conv=fsync): the bytes are in the device's
    // page cache, which a mapping of the layer reads at once, while the kernel counts
    // the sectors only at writeback, up to 30 s later (they were seen only then, and
    // never when the VM stopped first).
    f.write_all_at(&[5u8; 4096], 131072).unwrap();
    drop(f);
    let unflushed = image.layers()[0].stamp().unwrap();
    assert!(after.changed_in_place(&unflushed), "{after:?} -> {unflushed:?}");
}
