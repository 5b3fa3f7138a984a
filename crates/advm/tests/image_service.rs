//! The image service over a UNIX socket pair: a client attaches a chain from the plan
//! the service computed once, reads the same bytes as a mapping of its own, gets the
//! cached plan the second time, a fresh one after a layer changes, and clear errors.
//! Without qemu-utils the tests print why and skip.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

mod qemu;
use qemu::{have_qemu, run, Dir, LoopDevice};

use advm::image::service::{attach, serve_connection, Reply, Request, Service};
use advm::image::{ImageSpace, MapOptions};
use advm::wire::{Channel, Peer};

/// A 512 MiB chain: a base with data every other MiB, a top with data, zeroes and
/// compressed clusters.
fn chain(dir: &Path) {
    run(dir, "qemu-img", &["create", "-q", "-f", "qcow2", "base.qcow2", "512M"]);
    let cmds: Vec<String> = (0..256).map(|i| format!("write -P {} {}M 64k", i % 250 + 1, 2 * i)).collect();
    let mut args = vec!["-f", "qcow2"];
    for c in &cmds {
        args.extend(["-c", c.as_str()]);
    }
    args.push("base.qcow2");
    run(dir, "qemu-io", &args);
    run(dir, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2"]);
    run(
        dir,
        "qemu-io",
        &["-c", "write -P 0x22 1M 256k", "-c", "write -z 4M 64k", "-c", "write -c -P 0x33 9M 64k", "top.qcow2"],
    );
}

fn with_service<T>(f: impl FnOnce(&Channel, &Service) -> T) -> T {
    let service = Service::new(MapOptions::default());
    let (client, server) = UnixStream::pair().unwrap();
    let (client, server) = (Channel::from_stream(client), Channel::from_stream(server));
    std::thread::scope(|s| {
        let h = s.spawn(|| serve_connection(&service, &server));
        let r = f(&client, &service);
        drop(client);
        h.join().unwrap().unwrap();
        r
    })
}

#[test]
fn attach_maps_the_plan_computed_once_and_reads_as_the_chain() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("attach");
    chain(&d.0);
    let top = d.0.join("top.qcow2");
    let own = ImageSpace::map(&top, &MapOptions::default()).unwrap();
    with_service(|sock, service| {
        // Layers written within one clock tick of an attach may change again with the
        // same ctime: their plans are computed each time, never cached.
        for _ in 0..2 {
            let (_, cached) = attach(sock, &top, false).unwrap();
            assert!(!cached, "a plan of layers written just now was cached");
        }
        std::thread::sleep(Duration::from_millis(2100));
        let (first, cached) = attach(sock, &top, false).unwrap();
        assert!(!cached);
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let (again, cached) = attach(sock, &top, false).unwrap();
            times.push(t.elapsed());
            assert!(cached, "the second attach must use the computed plan");
            assert_eq!(again.stats().mappings, first.stats().mappings);
        }
        assert_eq!(service.computed(), 3);
        times.sort();
        eprintln!(
            "attach of a 512 MiB chain ({} extents, {} mappings) from the cached plan: median {:?}",
            first.stats().extents,
            first.stats().mappings,
            times[2]
        );
        assert!(times[2] < Duration::from_millis(200), "attach took {:?}", times[2]);
        assert_eq!(first.size(), own.size());
        assert_eq!(first.extent_map().extents, own.extent_map().extents);
        assert_eq!(first.read_all().unwrap(), own.read_all().unwrap());
    });
}

#[test]
fn a_changed_layer_gets_a_fresh_plan_never_the_stale_one() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("stale");
    chain(&d.0);
    let top = d.0.join("top.qcow2");
    with_service(|sock, service| {
        let (before, _) = attach(sock, &top, false).unwrap();
        let mut buf = [0u8; 4096];
        before.read(advm::image::GuestOffset(20 << 20), &mut buf).unwrap();
        assert_eq!(buf[0], 11);
        drop(before);
        run(&d.0, "qemu-io", &["-c", "write -P 0x77 20M 4k", "top.qcow2"]);
        let (after, cached) = attach(sock, &top, false).unwrap();
        assert!(!cached, "a layer changed: the plan must be recomputed");
        assert_eq!(service.computed(), 2);
        after.read(advm::image::GuestOffset(20 << 20), &mut buf).unwrap();
        assert_eq!(buf[0], 0x77);
    });
}

#[test]
fn attach_errors_name_the_chain() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("errors");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "base.qcow2", "1M"]);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2"]);
    fs::remove_file(d.0.join("base.qcow2")).unwrap();
    with_service(|sock, _| {
        let e = attach(sock, &d.0.join("top.qcow2"), false).unwrap_err().to_string();
        assert!(e.contains("image service") && e.contains("base.qcow2"), "{e}");
        let e = attach(sock, &d.0.join("absent.qcow2"), false).unwrap_err().to_string();
        assert!(e.contains("absent.qcow2"), "{e}");
    });
}

#[test]
fn a_peer_that_may_not_read_a_layer_is_refused_and_the_owner_is_served() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("peer");
    chain(&d.0);
    let top = d.0.join("top.qcow2");
    let base = d.0.join("base.qcow2");
    use std::os::unix::fs::PermissionsExt;
    // Both layers belong to uid 4242; the base is readable by its owner only.
    if std::os::unix::fs::chown(&base, Some(4242), Some(4242)).is_err() {
        eprintln!("skipping: chown needs root");
        return;
    }
    std::os::unix::fs::chown(&top, Some(4242), Some(4242)).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&top, fs::Permissions::from_mode(0o644)).unwrap();
    let service = Service::new(MapOptions::default());
    let request = Request::Attach { path: top.clone() };
    // Another uid: the top is readable, its backing file is not.
    let stranger = Peer { uid: 4243, gid: 4243, pid: 1 };
    match service.handle(Some(stranger), &request) {
        (Reply::Error(why), fds) => {
            assert!(fds.is_empty());
            assert!(why.contains("base.qcow2") && why.contains("may not read"), "{why}");
        }
        (Reply::Plan(_), _) => panic!("a peer that cannot read the base layer got its plan"),
    }
    let owner = Peer { uid: 4242, gid: 4242, pid: 1 };
    assert!(matches!(service.handle(Some(owner), &request), (Reply::Plan(_), _)));
    // A relative path on the wire is refused (the service has its own working directory).
    fs::set_permissions(&base, fs::Permissions::from_mode(0o644)).unwrap();
    with_service(|ch, _| {
        let e = attach(ch, Path::new("no/such/top.qcow2"), false).unwrap_err().to_string();
        assert!(e.contains("top.qcow2"), "{e}");
    });
}

/// A layer's external data file is read for the peer too: one it may not read refuses
/// the chain, naming the data file, before the service opens it.
#[test]
fn a_peer_that_may_not_read_a_data_file_is_refused() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("peer-data");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "data_file=df.data", "df.qcow2", "1M"]);
    run(&d.0, "qemu-io", &["-c", "write -P 0x44 0 64k", "df.qcow2"]);
    let (top, data) = (d.0.join("df.qcow2"), d.0.join("df.data"));
    use std::os::unix::fs::PermissionsExt;
    if std::os::unix::fs::chown(&data, Some(4242), Some(4242)).is_err() {
        eprintln!("skipping: chown needs root");
        return;
    }
    std::os::unix::fs::chown(&top, Some(4242), Some(4242)).unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&top, fs::Permissions::from_mode(0o644)).unwrap();
    let service = Service::new(MapOptions::default());
    let request = Request::Attach { path: top.clone() };
    match service.handle(Some(Peer { uid: 4243, gid: 4243, pid: 1 }), &request) {
        (Reply::Error(why), fds) => {
            assert!(fds.is_empty());
            assert!(why.contains("df.data") && why.contains("may not read"), "{why}");
        }
        (Reply::Plan(_), _) => panic!("a peer that cannot read the data file got its plan"),
    }
    // The owner gets one descriptor for the layer: its data file.
    let (reply, fds) = service.handle(Some(Peer { uid: 4242, gid: 4242, pid: 1 }), &request);
    assert!(matches!(reply, Reply::Plan(_)) && fds.len() == 1, "{reply:?}");
    let sent = fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fds[0]))).unwrap();
    assert_eq!(sent, fs::canonicalize(&data).unwrap());
}

/// (device size, pieces as (guest offset, length, anonymous?, offset in its file)).
fn pmem_plan(b: &advm::image::PmemBacking) -> (u64, Vec<(u64, u64, bool, u64)>) {
    let w = |s: &[u8], i: usize| u64::from_le_bytes(s[8 * i..8 * i + 8].try_into().unwrap());
    let mut head = [0u8; 32];
    b.plan().read_at(&mut head, 0).unwrap();
    assert_eq!(&head[..8], advm::image::PLAN_MAGIC);
    let n = w(&head, 3) as usize;
    let mut body = vec![0u8; 32 * n];
    b.plan().read_at(&mut body, 32).unwrap();
    let pieces =
        (0..n).map(|i| (w(&body, 4 * i), w(&body, 4 * i + 1), w(&body, 4 * i + 2) == u64::MAX, w(&body, 4 * i + 3)));
    (w(&head, 2), pieces.collect())
}

#[test]
fn a_pmem_backing_from_the_service_plans_the_device_as_one_planned_here() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("pmem");
    chain(&d.0);
    let top = d.0.join("top.qcow2");
    let align = 2 << 20;
    let here = advm::image::PmemBacking::new(
        &advm::image::Image::open(&top).unwrap(),
        &MapOptions { writable: true, ..Default::default() },
        align,
    )
    .unwrap();
    let served = with_service(|ch, _| {
        advm::image::PmemBacking::from_service(
            advm::image::service::fetch(ch, &top).unwrap(),
            align,
            &Default::default(),
        )
        .unwrap()
    });
    let (a, b) = (pmem_plan(&here), pmem_plan(&served));
    assert!(a.1.len() > 3, "{:?}", a.1);
    assert_eq!(a, b);
}

#[test]
fn a_chain_a_qemu_writes_is_not_served_and_mixed_subclusters_are_and_stay_private() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new("served");
    let top = d.0.join("top.qcow2");
    // Extended L2 with 64 KiB clusters: 2 KiB subclusters, written, zeroed and left to
    // the backing file within one page.
    run(&d.0, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "1M"]);
    run(&d.0, "qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 1M", "base.raw"]);
    let opts = ["-o", "cluster_size=64k,extended_l2=on", "-b", "base.raw", "-F", "raw", "top.qcow2"];
    run(&d.0, "qemu-img", &[&["create", "-q", "-f", "qcow2"][..], &opts].concat());
    run(&d.0, "qemu-io", &["-c", "write -P 0x33 2k 2k", "-c", "write -z 8k 2k", "top.qcow2"]);
    // Plans of layers written less than 2 s ago are not kept.
    std::thread::sleep(Duration::from_millis(2100));
    with_service(|sock, _| {
        // The mixed page comes from the service's memfd: a writable client's writes
        // stay its own.
        let (writer, _) = attach(sock, &top, true).unwrap();
        // SAFETY: the mapping is writable and 1 MiB long; nothing else references its
        // first 4 KiB.
        unsafe { std::ptr::write_bytes(writer.addr() as *mut u8, 0x99, 4096) };
        let (space, cached) = attach(sock, &top, false).unwrap();
        assert!(cached);
        let mut b = vec![0u8; 16 << 10];
        space.read(advm::image::GuestOffset(0), &mut b).unwrap();
        assert_eq!((b[0], b[2048], b[4096], b[8192], b[10240]), (0x5a, 0x33, 0x5a, 0, 0x5a));
        writer.read(advm::image::GuestOffset(0), &mut b).unwrap();
        assert_eq!((b[0], b[4095], b[4096]), (0x99, 0x99, 0x5a));
    });
    // qemu-io takes its locks when it has opened the image.
    let _writer = qemu::Holder::start(&d.0, "qemu-io", &["-c", "sleep 60000", "top.qcow2"], &top, 101);
    with_service(|sock, _| {
        let e = attach(sock, &top, false).unwrap_err().to_string();
        assert!(e.contains("another process has it open for writing") && e.contains("top.qcow2"), "{e}");
    });
}

/// The service opens files as root for others: what it says about a path a peer may
/// not read must be no more than "may not", whatever the file holds (its format, size,
/// backing file) or whether it exists, and a file the peer may not read is not opened
/// at all (opening a device can have effects of its own). Before, the chain was opened
/// and parsed first: a stranger was told `truncated qcow2 header: file is 50 bytes`
/// about a file in a directory it may not search, and `No such file` about an absent one.
#[test]
fn a_peer_learns_nothing_about_files_it_may_not_read() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dir::new("peerleak");
    let private = d.0.join("private");
    fs::create_dir(&private).unwrap();
    fs::write(private.join("secret.qcow2"), b"QFI\xfb plus 45 more bytes of something secret..").unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let open_dir = d.0.join("open");
    fs::create_dir(&open_dir).unwrap();
    let unreadable = open_dir.join("unreadable.qcow2");
    fs::write(&unreadable, b"QFI\xfb and then too short").unwrap();
    fs::set_permissions(&unreadable, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&open_dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&d.0, fs::Permissions::from_mode(0o755)).unwrap();

    let service = Service::new(MapOptions::default());
    let me = owner_uid(&d.0);
    let stranger = Peer { uid: me + 1, gid: me + 1, pid: 1 };
    let ask = |path: &Path| match service.handle(Some(stranger), &Request::Attach { path: path.to_path_buf() }) {
        (Reply::Error(why), fds) => {
            assert!(fds.is_empty());
            why
        }
        (Reply::Plan(_), _) => panic!("{} was served to a stranger", path.display()),
    };
    for name in ["secret.qcow2", "absent.qcow2"] {
        let why = ask(&private.join(name));
        assert!(why.ends_with(&format!("uid {} may not search {}", me + 1, private.display())), "{why}");
    }
    let why = ask(&unreadable);
    assert!(why.ends_with(&format!("uid {} may not read it (mode 600)", me + 1)), "{why}");
}

/// The uid owning `dir` (the test's own).
fn owner_uid(dir: &Path) -> u32 {
    std::os::unix::fs::MetadataExt::uid(&fs::metadata(dir).unwrap())
}

/// Any user may have plans made (of images of its own, deleted after): the service
/// keeps at most `MAX_CACHED_PLANS`, dropping the least recently served. Each kept plan
/// holds its layers open: unbounded, every image ever attached (deleted or not) stayed
/// open in the daemon until it ran out of descriptors, and then its accept failed for
/// every client.
#[test]
fn the_plans_kept_are_bounded_and_the_least_recently_served_go_first() {
    use advm::image::service::MAX_CACHED_PLANS;
    let d = Dir::new("bounded");
    let n = MAX_CACHED_PLANS + 36;
    let open_fds = || fs::read_dir("/proc/self/fd").unwrap().count();
    let paths: Vec<_> = (0..n).map(|i| d.0.join(format!("img{i}.raw"))).collect();
    for p in &paths {
        fs::write(p, vec![7u8; 4096]).unwrap();
    }
    // Plans of layers written less than 2 s ago are not kept.
    std::thread::sleep(Duration::from_millis(2100));
    let service = Service::new(MapOptions::default());
    let fds_before = open_fds();
    let attach = |p: &Path| match service.handle(None, &Request::Attach { path: p.to_path_buf() }) {
        (Reply::Plan(plan), _) => plan.cached,
        (Reply::Error(e), _) => panic!("{e}"),
    };
    for p in &paths {
        assert!(!attach(p));
        // keep the first one recently served
        assert!(attach(&paths[0]));
        if p != &paths[0] {
            fs::remove_file(p).unwrap();
        }
    }
    // Other tests of this binary open files meanwhile: a margin, well under the 36.
    let held = open_fds().saturating_sub(fds_before);
    assert!(held <= MAX_CACHED_PLANS + 16, "{held} descriptors held after {n} images attached");
    assert_eq!(service.kept(), MAX_CACHED_PLANS);
    assert_eq!(service.computed(), n);
    assert!(attach(&paths[0]), "the most recently served plan was dropped");
}

#[test]
fn a_daemon_that_closes_the_connection_is_named_not_a_broken_pipe() {
    let d = Dir::new("closed");
    let top = d.0.join("top.qcow2");
    // Closed before the request is sent: the send fails with EPIPE.
    let (client, server) = UnixStream::pair().unwrap();
    drop(server);
    let e = advm::image::service::fetch(&Channel::from_stream(client), &top).err().unwrap().to_string();
    assert!(e.contains("advmd closed the connection before replying"), "{e}");
    assert!(!e.contains("Broken pipe"), "{e}");
    // Closed after reading the request, without a reply.
    let (client, server) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let server = Channel::from_stream(server);
        assert!(server.recv().unwrap().is_some());
    });
    let e = advm::image::service::fetch(&Channel::from_stream(client), &top).err().unwrap().to_string();
    h.join().unwrap();
    assert!(e.contains("advmd closed the connection before replying"), "{e}");
}

/// A chain on a block device is planned afresh for every request: the disk can be
/// written through another node (a partition, a loop device's file, a node made with
/// mknod, as here) while the node named keeps its ctime, so the key cannot see the
/// change. Before, the second node's write left the cached plan served (stale: the
/// cluster it allocated read as zeros).
#[test]
fn a_chain_on_a_block_device_written_through_another_node_is_never_served_stale() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !have_qemu() {
        return;
    }
    let d = Dir::new("blockdev-stale");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", "b.qcow2", "1M"]);
    run(&d.0, "qemu-io", &["-c", "write -P 0x11 0 64k", "b.qcow2"]);
    // Room for the clusters qemu allocates later (a device does not grow).
    fs::OpenOptions::new().write(true).open(d.0.join("b.qcow2")).unwrap().set_len(4 << 20).unwrap();
    let Some(lo) = LoopDevice::attach(&d.0.join("b.qcow2"), false) else { return };
    let dev = lo.0.clone();
    let meta = fs::metadata(&dev).unwrap();
    assert!(meta.file_type().is_block_device());
    // A second node of the same device, as mknod makes it.
    let dup = d.0.join("dup");
    let made = std::process::Command::new("mknod")
        .arg(&dup)
        .arg("b")
        .arg((meta.rdev() >> 8 & 0xfff).to_string())
        .arg((meta.rdev() & 0xff | (meta.rdev() >> 12 & 0xfff00)).to_string())
        .status()
        .unwrap();
    assert!(made.success(), "mknod");
    let dev = Path::new(&dev);
    with_service(|sock, service| {
        let mut buf = [0u8; 4];
        let (first, _) = attach(sock, dev, false).unwrap();
        first.read(advm::image::GuestOffset(0), &mut buf).unwrap();
        assert_eq!(buf, [0x11; 4]);
        drop(first);
        let dev_ctime = || fs::metadata(dev).unwrap().ctime_nsec() + fs::metadata(dev).unwrap().ctime() * 1_000_000_000;
        let before = dev_ctime();
        let opts = format!("driver=qcow2,file.driver=host_device,file.filename={}", dup.display());
        run(&d.0, "qemu-io", &["--image-opts", "-c", "write -P 0x22 128k 64k", &opts]);
        assert_eq!(dev_ctime(), before, "{} changed although written through another node", dev.display());
        let (after, cached) = attach(sock, dev, false).unwrap();
        assert!(!cached, "a chain on a block device is planned for every request");
        assert_eq!(service.computed(), 2);
        after.read(advm::image::GuestOffset(128 << 10), &mut buf).unwrap();
        assert_eq!(buf, [0x22; 4], "the cluster written through the other node");
    });
}
