//! advmd serving merges: sharing within a domain, never across, a store clients cannot
//! write, reclaim, the byte limit, and hostile or many clients.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use advm::mem::{page_size, Region};
use advm::merge::protocol::{Reply, Request};
use advm::merge::{Client, Via};
use advm::stats::page_frames;
use advm::wire::Channel;
use advmd::{Config, Daemon};

mod common;

fn fence_ok() -> bool {
    let ok = advm::probe::facts().uffd_features.is_some();
    if !ok {
        eprintln!("skipped: userfaultfd not available here");
    }
    ok
}

/// A daemon with a 64 MiB limit per domain unless `tweak` says otherwise.
fn start(name: &str, tweak: impl FnOnce(&mut Config)) -> (common::Running, PathBuf) {
    common::start(name, |c| {
        c.domain_limit_bytes = 64 << 20;
        tweak(c)
    })
}

fn filled(pages: usize, seed: u8) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(2654435761).wrapping_add(seed as u64).to_le_bytes()[3];
    }
    r
}

/// The seals advmd requires on the memfd an add passes.
const FROZEN: i32 = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A memfd holding `bytes`, sealed with `seals`.
fn sealed(bytes: &[u8], seals: i32) -> std::os::fd::OwnedFd {
    // SAFETY: a NUL-terminated name; the fd returned is new and ours.
    let fd = unsafe { libc::memfd_create(c"advm-test-add".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::os::unix::fs::FileExt::write_all_at(&std::fs::File::from(fd.try_clone().unwrap()), bytes, 0).unwrap();
    // SAFETY: fcntl on our fd.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    fd
}

/// Opens a session at `ch` and returns the store's hasher and view.
fn hello(ch: &Channel) -> (advm::merge::PageHasher, advm::merge::StoreView) {
    Request::Hello { tag: String::new() }.send(ch).unwrap();
    let Reply::Hello { secret, store, limit_bytes } = Reply::recv(ch).unwrap() else { panic!("no hello") };
    let view = advm::merge::StoreView::new(store, limit_bytes as usize).unwrap();
    (advm::merge::PageHasher::from_secret(&secret).unwrap(), view)
}

/// Adds `pages` (keyed hashes `hashes`) in a frozen memfd and shows the files the reply
/// announces in `view`; returns the slots.
fn add(ch: &Channel, view: &mut advm::merge::StoreView, pages: &[u8], hashes: Vec<u64>) -> Vec<u32> {
    Request::Add { hashes, pages: sealed(pages, FROZEN) }.send(ch).unwrap();
    let Reply::Added { slots, segments, .. } = Reply::recv(ch).unwrap() else { panic!("the add failed") };
    view.show(segments).unwrap();
    slots
}

/// Whether this test may act as other uids (it runs as root); says it is skipped if not.
fn can_switch_uid() -> bool {
    if advm::process::is_root() {
        return true;
    }
    eprintln!("skipped: needs root to run a client as another uid");
    false
}

/// Runs `f` in a forked child as `uid` (`None`: this process's own uid); its return
/// value is the exit code.
/// vm.unprivileged_userfaultfd at 1 while any test of this binary runs a client as
/// another uid: with it at 0 (the kernel's default) such a user gets only the
/// user-mode-only kind, which merging refuses (docs/merge.md), and these tests are about
/// domains, not that refusal. The value found is put back when the last one ends.
struct FullUffdForUsers;

static FULL_UFFD_USERS: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));
const UNPRIVILEGED_UFFD: &str = "/proc/sys/vm/unprivileged_userfaultfd";

impl FullUffdForUsers {
    fn new() -> Self {
        let mut g = FULL_UFFD_USERS.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 == 0 {
            g.1 = std::fs::read_to_string(UNPRIVILEGED_UFFD).ok();
            if g.1.as_deref().is_some_and(|v| v.trim() != "1") {
                let _ = std::fs::write(UNPRIVILEGED_UFFD, "1");
            }
        }
        g.0 += 1;
        Self
    }
}

impl Drop for FullUffdForUsers {
    fn drop(&mut self) {
        let mut g = FULL_UFFD_USERS.lock().unwrap_or_else(|p| p.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            if let Some(v) = g.1.take() {
                let _ = std::fs::write(UNPRIVILEGED_UFFD, v);
            }
        }
    }
}

fn as_uid(uid: Option<u32>, f: impl FnOnce() -> i32) -> i32 {
    let _uffd = uid.map(|_| FullUffdForUsers::new());
    // SAFETY: the child runs `f` and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let switched = match uid {
            // SAFETY: plain syscalls in the child.
            Some(u) => unsafe { libc::setgid(u) == 0 && libc::setuid(u) == 0 },
            None => true,
        };
        let code = if switched { f() } else { 100 };
        // SAFETY: leave without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn clients_of_one_domain_share_pages_and_pages_are_reclaimed_when_their_holders_exit() {
    if !fence_ok() {
        return;
    }
    let (d, sock) = start("share", |_| {});
    let (a, b) = (filled(32, 1), filled(32, 1));
    let orig = a.bytes().to_vec();
    let mut c1 = Client::connect(&sock, "").unwrap();
    let mut c2 = Client::connect(&sock, "").unwrap();
    assert!(matches!(c1.via(), Via::Daemon { .. }));
    let s1 = c1.merge(a.bytes()).unwrap();
    let s2 = c2.merge(b.bytes()).unwrap();
    assert_eq!((s1.added, s2.merged, s2.added), (32, 32, 0), "{s1:?} {s2:?}");
    assert_eq!(b.bytes(), &orig[..]);
    assert_eq!(a.bytes(), &orig[..]);
    assert_eq!(page_frames(a.range()).unwrap(), page_frames(b.range()).unwrap(), "one physical copy");
    assert_eq!(c2.usage().unwrap().pages, 32);
    // Dropping the clients does not end their sessions: the pages are still mapped.
    drop((c1, c2));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(a.bytes(), &orig[..], "mappings outlive the clients");
    assert_eq!(d.services.merge.usage()[0].1.pages, 32);
    // A process that merges other pages and exits leaves nothing behind.
    let s = sock.clone();
    let code = as_uid(None, move || {
        let c = filled(8, 9);
        match Client::connect(&s, "child").and_then(|mut cl| cl.merge(c.bytes())) {
            Ok(st) if st.added == 8 => 0,
            _ => 1,
        }
    });
    assert_eq!(code, 0);
    let t = Instant::now();
    while d.services.merge.usage().iter().any(|(dom, _)| dom.tag == "child") {
        assert!(t.elapsed() < Duration::from_secs(5), "store not reclaimed: {:?}", d.services.merge.usage());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_cannot_write_the_store_and_its_writes_stay_private() {
    if !can_switch_uid() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let (_d, sock) = start("readonly", |_| {});
    let mut c1 = Client::connect(&sock, "").unwrap();
    let mut a = filled(8, 2);
    let orig = a.bytes().to_vec();
    c1.merge(a.bytes()).unwrap();
    a.bytes_mut()[..ps].fill(0x55);
    // The store still holds the original: another client merges all of it.
    let b = filled(8, 2);
    let s = Client::connect(&sock, "").unwrap().merge(b.bytes()).unwrap();
    assert_eq!(s.merged, 8);
    assert_eq!(b.bytes(), &orig[..]);
    // The fd a client gets is read-only, and a non-root client cannot reopen it writable.
    let ch = Channel::connect(&sock).unwrap();
    Request::Hello { tag: String::new() }.send(&ch).unwrap();
    let Reply::Hello { store, .. } = Reply::recv(&ch).unwrap() else { panic!("no hello") };
    // SAFETY: pwrite of 1 byte from a live buffer.
    let w = unsafe { libc::pwrite(store.as_raw_fd(), [1u8].as_ptr().cast(), 1, 0) };
    assert_eq!(w, -1, "the store fd is not writable");
    let path = format!("/proc/self/fd/{}", store.as_raw_fd());
    let code = as_uid(Some(65534), move || match std::fs::OpenOptions::new().write(true).open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => 0,
        Err(_) => 2,
        Ok(_) => 1,
    });
    assert_eq!(code, 0, "a non-root client reopened the store writable (1) or failed otherwise (2)");
}

#[test]
fn two_uids_or_two_tags_never_share_a_page() {
    if !can_switch_uid() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("domains", |_| {});
    let a = filled(16, 3);
    let mut root = Client::connect(&sock, "").unwrap();
    assert_eq!(root.merge(a.bytes()).unwrap().added, 16);
    let s2 = sock.clone();
    // uid 1000 holding the same content: its store does not have it, whatever root's holds.
    let code = as_uid(Some(1000), move || {
        let b = filled(16, 3);
        let Ok(mut c) = Client::connect(&s2, "") else { return 3 };
        let Ok(first) = c.merge(b.bytes()) else { return 4 };
        let c2 = filled(16, 3);
        let Ok(second) = Client::connect(&s2, "").and_then(|mut c| c.merge(c2.bytes())) else { return 5 };
        match (first.merged, first.added, second.merged) {
            (0, 16, 16) => 0,
            _ => 6,
        }
    });
    assert_eq!(code, 0, "uid 1000's first merge shared nothing and its second shared all");
    // A narrower tag of the same uid is a domain of its own.
    let b = filled(16, 3);
    let s = Client::connect(&sock, "tenant-b").unwrap().merge(b.bytes()).unwrap();
    assert_eq!((s.merged, s.added), (0, 16));
}

#[test]
fn a_domain_over_its_limit_refuses_new_pages_with_a_clear_reply() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let (_d, sock) = start("limit", |c| c.domain_limit_bytes = 4 * ps as u64);
    let a = filled(8, 4);
    let orig = a.bytes().to_vec();
    let s = Client::connect(&sock, "").unwrap().merge(a.bytes()).unwrap();
    assert_eq!((s.added, s.refused), (4, 4), "{s:?}");
    let why = s.refusal.unwrap();
    assert!(why.contains("full") && why.contains(&format!("limit is {} bytes", 4 * ps)), "{why}");
    assert_eq!(a.bytes(), &orig[..]);
}

/// A merge larger than the domain's room: the add refused whole, the part that fits
/// sent again and added. The refusal said "it holds 0 bytes", what the store held
/// before that part; it now says what it holds after.
#[test]
fn a_refusal_after_the_part_that_fits_was_added_says_what_the_store_holds_now() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("limit-now", |c| c.domain_limit_bytes = 1 << 20);
    let a = common::distinct(512, 41);
    let s = Client::connect(&sock, "").unwrap().merge(a.bytes()).unwrap();
    assert_eq!((s.added, s.refused), (256, 256), "{s:?}");
    let why = s.refusal.unwrap();
    assert!(
        why.starts_with("the page store is full: it holds 0 bytes")
            && why.ends_with(
                "(then 1048576 bytes of this merge fit and were added: the store holds 1048576 bytes now, its \
                 limit is 1048576 bytes)"
            ),
        "{why}"
    );
}

/// A request whose reply must be an error naming `expect`.
fn refused_with(ch: &Channel, expect: &str) {
    match Reply::recv(ch) {
        Err(e) => assert!(e.to_string().contains(expect), "{e} (expected {expect:?})"),
        Ok(r) => panic!("expected an error about {expect:?}, got {r:?}"),
    }
}

#[test]
fn hostile_requests_get_error_replies_and_never_stall_other_clients() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("hostile", |c| c.frame_timeout = Duration::from_millis(300));
    // Out of order: lookup before hello.
    let ch = Channel::connect(&sock).unwrap();
    Request::Lookup { hashes: vec![1, 2], window: None }.send(&ch).unwrap();
    refused_with(&ch, "send hello first");
    // Unknown kind and unknown service: an error, and the connection goes on.
    ch.send(1, 77, &[], &[]).unwrap();
    refused_with(&ch, "unknown kind 77");
    ch.send(9, 1, &[], &[]).unwrap();
    assert!(ch.recv().unwrap().is_some_and(|f| f.service == 9 && f.kind == 0));
    Request::Hello { tag: String::new() }.send(&ch).unwrap();
    assert!(matches!(Reply::recv(&ch).unwrap(), Reply::Hello { .. }));
    // A truncated body, an add without a file, an add announcing more than it holds,
    // a tag that is too long.
    ch.send(1, 2, &[5, 0, 0, 0, 1, 2], &[]).unwrap();
    refused_with(&ch, "needs 40 bytes");
    let add = |pages: usize| advm::wire::Writer::default().u64s(&vec![7; pages]).body;
    ch.send(1, 3, &add(1), &[]).unwrap();
    refused_with(&ch, "an add passes one sealed memfd, this one 0");
    // Pages must come in a sealed memfd: a pipe, an unsealed memfd, one sealed only
    // partly, and one of another size than announced are refused, keeping no slot.
    let (r, _w) = std::io::pipe().unwrap();
    ch.send(1, 3, &add(1), &[&r]).unwrap();
    refused_with(&ch, "not a regular file");
    let page = vec![1u8; page_size()];
    ch.send(1, 3, &add(1), &[&sealed(&page, 0)]).unwrap();
    refused_with(&ch, "lacks F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL");
    ch.send(1, 3, &add(1), &[&sealed(&page, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)]).unwrap();
    refused_with(&ch, "lacks F_SEAL_WRITE (");
    ch.send(1, 3, &add(2), &[&sealed(&page, FROZEN)]).unwrap();
    refused_with(&ch, "the request names");
    let two = sealed(&page, FROZEN);
    ch.send(1, 3, &add(1), &[&two, &two]).unwrap();
    refused_with(&ch, "this one 2");
    Request::Usage.send(&ch).unwrap();
    assert!(matches!(Reply::recv(&ch).unwrap(), Reply::Usage(u) if u.pages == 0), "refused adds keep no page");
    ch.send(1, 1, &advm::wire::Writer::default().bytes(&[b'x'; 65]).body, &[]).unwrap();
    refused_with(&ch, "exceeds the limit of 64");
    // Oversized: the length alone is refused, then the connection is closed.
    let big = Channel::connect(&sock).unwrap();
    big.send_raw(&(64u32 << 20).to_le_bytes()).unwrap();
    refused_with(&big, "outside 2..=");
    assert!(big.recv().is_err_and(|e| e.to_string().contains("closed")) || big.recv().unwrap().is_none());
    // Garbage, a frame cut short by a client that dies, and one that stalls mid-frame.
    Channel::connect(&sock).unwrap().send_raw(b"\xff\xff\xff\xffgarbage").unwrap();
    Channel::connect(&sock).unwrap().send_raw(&[20, 0, 0, 0, 1, 2, 3]).unwrap();
    let stalled = Channel::connect(&sock).unwrap();
    stalled.send_raw(&[100, 0, 0, 0, 1, 2]).unwrap();
    // Meanwhile a well-behaved client is served at once.
    let t = Instant::now();
    let a = filled(4, 5);
    let s = Client::connect(&sock, "").unwrap().merge(a.bytes()).unwrap();
    assert_eq!(s.added + s.merged, 4);
    assert!(t.elapsed() < Duration::from_millis(250), "served in {:?} beside a stalled client", t.elapsed());
    // The stalled one is cut off after the frame timeout.
    refused_with(&stalled, "reading");
}

/// The socket path may name any file, and the daemon runs as root: only a socket left
/// behind by a daemon that died is replaced. A regular file, a directory or a symbolic
/// link there is refused and left as it was (`advm daemon --socket /etc/passwd`
/// deleted /etc/passwd and put its socket there).
#[test]
fn binding_replaces_only_a_stale_socket_never_another_file() {
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-bindpath", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("precious.txt");
    std::fs::write(&file, b"keep me").unwrap();
    let link = dir.join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for (path, what) in [(&file, "a regular file"), (&link, "a symbolic link"), (&sub, "a directory")] {
        let e = match Daemon::bind(Config::at(path)) {
            Ok(_) => panic!("{} was replaced by the socket", path.display()),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            e,
            format!(
                "{}: is {what}, not a socket; refusing to replace it (name a free path with --socket or ADVM_SOCKET)",
                path.display()
            )
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    assert!(!dir.join("precious.txt.lock").exists(), "a lock file was made beside a path refused");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink() && sub.is_dir());
    // A socket nobody answers on (a daemon killed with SIGKILL leaves one) is replaced.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let h = Daemon::bind(Config::at(&stale)).unwrap().spawn();
    assert!(Channel::connect(&stale).is_ok());
    h.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_thousand_concurrent_clients_are_all_served() {
    if !fence_ok() {
        return;
    }
    let (d, sock) = start("many", |_| {});
    let t = Instant::now();
    let chans: Vec<Channel> = (0..1000).map(|_| Channel::connect(&sock).unwrap()).collect();
    for (i, ch) in chans.iter().enumerate() {
        Request::Hello { tag: if i % 2 == 0 { String::new() } else { format!("t{}", i % 10) } }.send(ch).unwrap();
    }
    for ch in &chans {
        assert!(matches!(Reply::recv(ch).unwrap(), Reply::Hello { .. }));
        Request::Usage.send(ch).unwrap();
    }
    for ch in &chans {
        assert!(matches!(Reply::recv(ch).unwrap(), Reply::Usage(_)));
    }
    eprintln!("1000 clients served in {:?}", t.elapsed());
    drop(chans);
    // And the daemon still merges for the next one.
    let a = filled(4, 6);
    assert_eq!(Client::connect(&sock, "").unwrap().merge(a.bytes()).unwrap().added, 4);
    assert!(!d.services.merge.usage().is_empty());
}

/// A qcow2 chain in a directory of its own, removed on drop: `base.qcow2` (16 MiB,
/// 128 KiB of 7s at 1 MiB) under `top.qcow2`.
struct Chain {
    dir: PathBuf,
}

impl Chain {
    /// `None` (said on stderr) without qemu-img.
    fn new(name: &str) -> Option<Self> {
        if !std::process::Command::new("qemu-img").arg("--version").output().is_ok_and(|o| o.status.success()) {
            eprintln!("skipping: qemu-img not found (Debian package qemu-utils)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("advmd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let chain = Self { dir };
        chain.run(&["qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", "16M"]);
        chain.run(&["qemu-io", "-f", "qcow2", "-c", "write -P 7 1M 128k", "base.qcow2"]);
        chain.run(&["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2"]);
        Some(chain)
    }

    /// Runs `args` in the chain's directory; it must succeed.
    fn run(&self, args: &[&str]) {
        let out = std::process::Command::new(args[0]).args(&args[1..]).current_dir(&self.dir).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_image_service_hands_out_a_chain_that_maps_to_the_same_bytes() {
    let Some(chain) = Chain::new("image") else { return };
    chain.run(&["qemu-io", "-f", "qcow2", "-c", "write -P 9 3M 64k", "top.qcow2"]);
    // Plans of layers written in the last 2 s are not kept (docs/vm.md).
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let (dir, top) = (&chain.dir, chain.dir.join("top.qcow2"));
    let (handle, sock) = start("image", |_| {});
    let ch = Channel::connect(&sock).unwrap();
    let (space, cached) = advm::image::service::attach(&ch, &top, false).unwrap();
    assert!(!cached);
    let own = advm::image::ImageSpace::map(&top, &advm::image::MapOptions::default()).unwrap();
    assert_eq!(space.read_all().unwrap(), own.read_all().unwrap());
    let (_, cached) = advm::image::service::attach(&ch, &top, false).unwrap();
    assert!(cached, "the second attach is served from the plan computed once");
    assert_eq!(handle.services.image.computed(), 1);
    // A missing chain is an error naming it, and the connection goes on.
    let e = advm::image::service::attach(&ch, &dir.join("missing.qcow2"), false).unwrap_err().to_string();
    assert!(e.contains("missing.qcow2"), "{e}");
    assert!(advm::image::service::attach(&ch, &top, false).is_ok());
    drop(ch);
    handle.stop();
}

/// A layer changed in place whose old mtime was put back (`touch -d`, `cp -p`,
/// `rsync --inplace -t`, `tar -x` restore it; the size stays when a cluster is zeroed)
/// is planned again, never served from the plan of its old contents: the key holds the
/// ctime, which nobody can set. (Keyed by mtime, the second attach was served the old
/// plan and read the zeroed cluster's old bytes.)
#[test]
fn a_layer_changed_in_place_with_its_mtime_put_back_is_planned_again() {
    let Some(chain) = Chain::new("image-mtime") else { return };
    let run = |args: &[&str]| chain.run(args);
    let (base, top) = (chain.dir.join("base.qcow2"), chain.dir.join("top.qcow2"));
    let (handle, sock) = start("image-mtime", |_| {});
    let ch = Channel::connect(&sock).unwrap();
    let byte = |space: &advm::image::ImageSpace| {
        let mut b = [0u8; 1];
        space.read(advm::image::GuestOffset(1 << 20), &mut b).unwrap();
        b[0]
    };
    let (space, _) = advm::image::service::attach(&ch, &top, false).unwrap();
    assert_eq!(byte(&space), 7);
    drop(space);
    let before = std::fs::metadata(&base).unwrap();
    run(&["qemu-io", "-f", "qcow2", "-c", "write -z 1M 128k", "base.qcow2"]);
    let when = format!("@{}.{:09}", before.mtime(), before.mtime_nsec());
    run(&["touch", "-m", "-d", &when, "base.qcow2"]);
    let after = std::fs::metadata(&base).unwrap();
    assert_eq!((after.len(), after.mtime(), after.mtime_nsec()), (before.len(), before.mtime(), before.mtime_nsec()));
    let (space, cached) = advm::image::service::attach(&ch, &top, false).unwrap();
    let b = byte(&space);
    assert!(!cached && b == 0, "served from the old plan: cached {cached}, byte {b} where zeros were written");
    drop((space, ch));
    handle.stop();
}

/// With every page hashed by the daemon (`hash_check_one_in` 1), an add is filed
/// under the hashes of its bytes, never under the hashes the client named.
#[test]
fn hashing_every_page_files_an_add_under_the_hash_of_its_pages_not_the_hash_the_client_named() {
    let (_d, sock) = start("claimed-hash", |c| c.hash_check_one_in = 1);
    let ch = Channel::connect(&sock).unwrap();
    let (hasher, mut view) = hello(&ch);
    // A small add (copied into the store's memfd) and one adopted as a file.
    for (n, seed) in [(6, 4), (advm::merge::COPY_BELOW_PAGES, 5)] {
        let pages = filled(n, seed);
        let truth: Vec<u64> = pages.bytes().chunks_exact(page_size()).map(|p| hasher.hash(p)).collect();
        let claimed: Vec<u64> = truth.iter().map(|h| h ^ 0x5a5a).collect();
        let slots = add(&ch, &mut view, pages.bytes(), claimed.clone());
        let lookup = |hashes: Vec<u64>| {
            Request::Lookup { hashes, window: None }.send(&ch).unwrap();
            let Reply::Slots { slots, .. } = Reply::recv(&ch).unwrap() else { panic!("the lookup failed") };
            slots
        };
        assert_eq!(lookup(truth), slots, "{n} pages: found under the hashes of their bytes");
        assert!(
            lookup(claimed).iter().all(|&s| s == advm::merge::protocol::NO_SLOT),
            "{n}: not under the claimed ones"
        );
    }
}

/// By default the daemon checks an add's hashes on a random sample of its pages: an
/// add whose hashes are not its pages' is refused with a reply saying so, nothing of
/// it is stored, and the session goes on (a correct add then lands).
#[test]
fn an_add_whose_hashes_are_not_the_hashes_of_its_pages_is_refused_and_the_session_goes_on() {
    let (_d, sock) = start("false-hashes", |_| {});
    let ch = Channel::connect(&sock).unwrap();
    let (hasher, mut view) = hello(&ch);
    // A small add (copied into the store's memfd) and one adopted as a file.
    let mut stored = 0;
    for (n, seed) in [(200, 9), (advm::merge::COPY_BELOW_PAGES + 1, 10)] {
        let pages = filled(n, seed);
        let truth: Vec<u64> = pages.bytes().chunks_exact(page_size()).map(|p| hasher.hash(p)).collect();
        let claimed: Vec<u64> = truth.iter().map(|h| h ^ 0x5a5a).collect();
        Request::Add { hashes: claimed, pages: sealed(pages.bytes(), FROZEN) }.send(&ch).unwrap();
        let e = Reply::recv(&ch).unwrap_err().to_string();
        assert!(e.contains("the add's hashes do not match its pages"), "{n} pages: {e}");
        Request::Usage.send(&ch).unwrap();
        let Reply::Usage(u) = Reply::recv(&ch).unwrap() else { panic!("no usage") };
        assert_eq!(u.pages, stored, "{n} pages: nothing of the refused add is stored");
        let slots = add(&ch, &mut view, pages.bytes(), truth);
        assert!(slots.iter().all(|&s| s != advm::merge::protocol::NO_SLOT), "{n} pages: a correct add lands");
        stored += n as u64;
    }
}

/// An add's pages are adopted as they are: the slots show the bytes byte for byte,
/// in page order, and the client that wrote the file can no longer change them
/// (write, shrink, grow, punch a hole, map it shared and writable): all refused, and
/// the store's bytes stay what the daemon hashed.
#[test]
fn a_client_cannot_change_the_pages_it_handed_over() {
    let (_d, sock) = start("adopted", |_| {});
    let ch = Channel::connect(&sock).unwrap();
    let (hasher, mut view) = hello(&ch);
    let ps = page_size();
    // Large enough to be adopted rather than copied (`COPY_BELOW_PAGES`).
    let pages = filled(advm::merge::COPY_BELOW_PAGES, 6);
    let hashes: Vec<u64> = pages.bytes().chunks_exact(ps).map(|p| hasher.hash(p)).collect();
    let file = sealed(pages.bytes(), FROZEN);
    Request::Add { hashes: hashes.clone(), pages: file.try_clone().unwrap() }.send(&ch).unwrap();
    let Reply::Added { slots, segments, refusal, .. } = Reply::recv(&ch).unwrap() else { panic!("the add failed") };
    assert_eq!((segments.len(), refusal.as_str()), (1, ""), "the add's own file is announced");
    view.show(segments).unwrap();
    let check = |view: &advm::merge::StoreView| {
        for (k, &s) in slots.iter().enumerate() {
            assert_eq!(view.page(s).unwrap(), &pages.bytes()[k * ps..(k + 1) * ps], "page {k} in slot {s}");
        }
    };
    check(&view);
    let fd = file.as_raw_fd();
    // SAFETY: plain syscalls on our own fd and a live buffer; a mapping that succeeded
    // would be unmapped below.
    unsafe {
        assert_eq!(libc::pwrite(fd, [0x55u8].as_ptr().cast(), 1, 0), -1, "write");
        assert_eq!(libc::ftruncate(fd, ps as i64), -1, "shrink");
        assert_eq!(libc::ftruncate(fd, (80 * ps) as i64), -1, "grow");
        assert_eq!(
            libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, ps as i64),
            -1,
            "punch"
        );
        let m = libc::mmap(std::ptr::null_mut(), ps, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        assert_eq!(m, libc::MAP_FAILED, "map shared writable");
        assert_eq!(libc::fcntl(fd, libc::F_GET_SEALS) & FROZEN, FROZEN);
    }
    check(&view);
    // A second session sees the same bytes.
    let other = Channel::connect(&sock).unwrap();
    let (_, mut view2) = hello(&other);
    Request::Lookup { hashes, window: None }.send(&other).unwrap();
    let Reply::Slots { slots: found, segments } = Reply::recv(&other).unwrap() else { panic!("the lookup failed") };
    assert_eq!(found, slots);
    view2.show(segments).unwrap();
    check(&view2);
}

/// A merge through advmd maps the pages from the file the client handed over (no
/// copy made by the daemon), every page lands with its content unchanged, and a
/// second client shares them all.
#[test]
fn a_merge_adds_pages_by_handing_over_a_sealed_file_and_a_second_client_shares_them() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("adopt-merge", |_| {});
    let (a, b) = (filled(1024, 3), filled(1024, 3));
    let orig = a.bytes().to_vec();
    let (mut c1, mut c2) = (Client::connect(&sock, "").unwrap(), Client::connect(&sock, "").unwrap());
    let s1 = c1.merge(a.bytes()).unwrap();
    let s2 = c2.merge(b.bytes()).unwrap();
    assert_eq!((s1.added, s1.skipped, s2.merged, s2.added), (1024, 0, 1024, 0), "{s1:?} {s2:?}");
    assert_eq!(a.bytes(), &orig[..]);
    assert_eq!(b.bytes(), &orig[..]);
    assert_eq!(page_frames(a.range()).unwrap(), page_frames(b.range()).unwrap(), "one physical copy");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let start = format!("{:x}-", a.range().start().0);
    let line = maps.lines().find(|l| l.starts_with(&start)).expect("the merged range is mapped");
    assert!(line.contains("advm-merge-add"), "mapped from the handed-over file: {line}");
}

/// A merge larger than one add (4,096 pages) hands its pages over in several, written
/// a group at a time (one per CPU) while the daemon takes the last group; past the
/// domain's limit the rest are refused whole, and the part that fits is sent again:
/// every page that fits is added, the rest refused, nothing changes what the process
/// reads. The limit falls after the last add, and inside the third one (the second
/// group on two CPUs, whose second add is sent before the first's refusal is known).
#[test]
fn a_merge_of_several_adds_fills_the_store_to_its_limit_and_refuses_the_rest() {
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    for fits in [16384 + 50, 8192 + 50] {
        let (_d, sock) = start(&format!("several-adds-{fits}"), |c| c.domain_limit_bytes = fits * ps as u64);
        let a = filled(16384 + 100, 8);
        let orig = a.bytes().to_vec();
        let s = Client::connect(&sock, "").unwrap().merge(a.bytes()).unwrap();
        assert_eq!((s.added, s.refused), (fits, 16384 + 100 - fits), "{s:?}");
        assert!(s.refusal.unwrap().contains("full"));
        assert_eq!(a.bytes(), &orig[..]);
        let b = filled(16384 + 100, 8);
        let s = Client::connect(&sock, "").unwrap().merge(b.bytes()).unwrap();
        assert_eq!((s.merged, s.added), (fits, 0), "{s:?}");
        assert_eq!(b.bytes(), &orig[..]);
    }
}

/// While a large add lands one group of batches, its copying threads read the next
/// groups from the same range, and so may any thread of the process: a thread reading
/// the range throughout a merge of several groups sees the original bytes on every
/// pass, never a hole or another page.
#[test]
fn a_thread_reading_the_range_throughout_a_large_add_always_sees_the_same_bytes() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("reader", |c| c.domain_limit_bytes = 256 << 20);
    let ps = page_size();
    let a = filled(8 * 4096 + 7, 11);
    let orig = a.bytes().to_vec();
    let done = std::sync::atomic::AtomicBool::new(false);
    let bytes = a.bytes();
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut passes = 0u32;
            loop {
                let last = done.load(std::sync::atomic::Ordering::Acquire);
                for (i, (p, q)) in bytes.chunks(ps).zip(orig.chunks(ps)).enumerate() {
                    assert!(p == q, "page {i} read differently on pass {passes}");
                }
                passes += 1;
                if last {
                    return passes;
                }
            }
        });
        let s = Client::connect(&sock, "").unwrap().merge(bytes).unwrap();
        done.store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(s.added, 8 * 4096 + 7, "{s:?}");
        assert!(reader.join().unwrap() >= 2, "the reader ran during the merge");
    });
    assert_eq!(a.bytes(), &orig[..]);
}

/// A lookup that misses claims the pages for its session: a second session's lookup of
/// them waits for the first one's add (instead of missing and sending them again), and
/// gets its slots. A session that ends without adding leaves no claim behind: the next
/// lookup misses at once.
#[test]
fn a_lookup_that_misses_claims_the_pages_and_other_lookups_wait_for_their_add() {
    let (_d, sock) = start("claims", |_| {});
    let lookup = |ch: &Channel, hashes: &[u64]| {
        Request::Lookup { hashes: hashes.to_vec(), window: None }.send(ch).unwrap();
        let Reply::Slots { slots, .. } = Reply::recv(ch).unwrap() else { panic!("the lookup failed") };
        slots
    };
    let (a, b) = (Channel::connect(&sock).unwrap(), Channel::connect(&sock).unwrap());
    let (hasher, mut view) = hello(&a);
    hello(&b);
    let pages = filled(8, 5);
    let hashes: Vec<u64> = pages.bytes().chunks_exact(page_size()).map(|p| hasher.hash(p)).collect();
    let none = advm::merge::protocol::NO_SLOT;
    assert!(lookup(&a, &hashes).iter().all(|&s| s == none), "A misses, and claims");
    let t = Instant::now();
    let h = hashes.clone();
    let looker = std::thread::spawn(move || (lookup(&b, &h), t.elapsed(), b));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!looker.is_finished(), "B's lookup answered before A added the pages it claimed");
    let added = add(&a, &mut view, pages.bytes(), hashes.clone());
    let (found, waited, _b) = looker.join().unwrap();
    assert_eq!(found, added, "B gets the slots A's pages landed in");
    assert!(waited >= Duration::from_millis(200), "B waited for A ({waited:?})");
    // C claims other pages and leaves without adding them: D does not wait for C.
    let other_hashes: Vec<u64> = (0..4u8).map(|k| hasher.hash(&vec![200 + k; page_size()])).collect();
    let c = Channel::connect(&sock).unwrap();
    hello(&c);
    assert!(lookup(&c, &other_hashes).iter().all(|&s| s == none));
    drop(c);
    let d = Channel::connect(&sock).unwrap();
    hello(&d);
    let t = Instant::now();
    assert!(lookup(&d, &other_hashes).iter().all(|&s| s == none));
    assert!(t.elapsed() < Duration::from_secs(3), "D waited {:?} for a claim whose session ended", t.elapsed());
}

/// A lookup with a window claims at most that many of the pages it misses and answers
/// "later" for the rest and for pages another session claimed, instead of waiting: two
/// sessions that miss the same pages at once add a window each. A lookup that claimed
/// nothing waits as before, and a window of 0 only looks (claims nothing, so nobody
/// waits for it, and waits for nobody).
#[test]
fn a_lookup_with_a_window_claims_that_many_and_answers_later_for_the_rest() {
    use advm::merge::protocol::{LATER, NO_SLOT};
    let (_d, sock) = start("windows", |_| {});
    let lookup = |ch: &Channel, hashes: &[u64], window: u32| {
        Request::Lookup { hashes: hashes.to_vec(), window: Some(window) }.send(ch).unwrap();
        let Reply::Slots { slots, .. } = Reply::recv(ch).unwrap() else { panic!("the lookup failed") };
        slots
    };
    let (a, b, c) =
        (Channel::connect(&sock).unwrap(), Channel::connect(&sock).unwrap(), Channel::connect(&sock).unwrap());
    let (hasher, mut view) = hello(&a);
    hello(&b);
    hello(&c);
    let pages = filled(6, 9);
    let ps = page_size();
    let hashes: Vec<u64> = pages.bytes().chunks_exact(ps).map(|p| hasher.hash(p)).collect();
    // C only looks: it claims nothing, so A's window below is the first two pages.
    assert_eq!(lookup(&c, &hashes, 0), vec![NO_SLOT; 6], "looking only: not stored");
    assert_eq!(lookup(&a, &hashes, 2), [NO_SLOT, NO_SLOT, LATER, LATER, LATER, LATER], "A claims two");
    let t = Instant::now();
    assert_eq!(lookup(&b, &hashes, 2), [LATER, LATER, NO_SLOT, NO_SLOT, LATER, LATER], "B claims the next two");
    assert!(t.elapsed() < Duration::from_secs(1), "B waited {:?} though it had pages to add", t.elapsed());
    // Looking only waits for nobody, though A and B hold claims.
    let t = Instant::now();
    assert_eq!(lookup(&c, &hashes, 0), vec![NO_SLOT; 6]);
    assert!(t.elapsed() < Duration::from_secs(1), "a look-only lookup waited {:?}", t.elapsed());
    let a_slots = add(&a, &mut view, &pages.bytes()[..2 * ps], hashes[..2].to_vec());
    let b_slots = add(&b, &mut view, &pages.bytes()[2 * ps..4 * ps], hashes[2..4].to_vec());
    // A looks again: the first four are stored, A claims the last two.
    let again = lookup(&a, &hashes, 2);
    assert_eq!(&again[..2], &a_slots[..]);
    assert_eq!(&again[2..4], &b_slots[..]);
    assert_eq!(&again[4..], [NO_SLOT, NO_SLOT]);
    // B has nothing left to claim: its lookup waits for A's add of the last two.
    let h = hashes.clone();
    let t = Instant::now();
    let looker = std::thread::spawn(move || (lookup(&b, &h[4..], 2), t.elapsed(), b));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!looker.is_finished(), "B answered before A added the pages it claimed");
    let last = add(&a, &mut view, &pages.bytes()[4 * ps..], hashes[4..].to_vec());
    let (found, waited, _b) = looker.join().unwrap();
    assert_eq!(found, last, "B gets the slots A's last pages landed in");
    assert!(waited >= Duration::from_millis(200), "B waited for A ({waited:?})");
}

/// Clients that merge the same large range at once split its adds a window each (each
/// page is still added once), and every range keeps its bytes.
#[test]
fn clients_merging_the_same_pages_at_once_add_them_once_between_them() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("at-once", |c| c.domain_limit_bytes = 512 << 20);
    // Several windows of the default size (at most 4 copy threads x 4096 pages).
    let pages = 4 * 4 * 4096 + 5;
    let ranges: Vec<Region> = (0..3).map(|_| filled(pages, 21)).collect();
    let orig = ranges[0].bytes().to_vec();
    let barrier = std::sync::Barrier::new(ranges.len());
    let stats: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = ranges
            .iter()
            .map(|r| {
                let (sock, barrier) = (&sock, &barrier);
                scope.spawn(move || {
                    let mut c = Client::connect(sock, "").unwrap();
                    barrier.wait();
                    (c.merge(r.bytes()).unwrap(), c)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let added: u64 = stats.iter().map(|(s, _)| s.added).sum();
    let merged: u64 = stats.iter().map(|(s, _)| s.merged).sum();
    assert_eq!(
        added,
        pages as u64,
        "each page added once between them: {:?}",
        stats.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    assert_eq!(merged, 2 * pages as u64, "the others merged every page");
    for r in &ranges {
        assert!(r.bytes() == &orig[..], "a merged range changed");
    }
}

#[test]
fn many_small_merges_hold_no_descriptor_each_and_their_pages_are_shared() {
    if !fence_ok() {
        return;
    }
    let (_d, sock) = start("smalladds", |_| {});
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    // 2-page buffers of distinct content, merged one call each (a program merging each
    // of a model's small tensors): before small adds were copied into the store's own
    // memfd, each call's pages came back as an adopted file this session held a
    // descriptor and a mapping for until it ended (EMFILE after ~1,000 calls).
    let bufs: Vec<Region> = (0..300).map(|i| filled(2, i as u8).tap_seed(i)).collect();
    let copies: Vec<Vec<u8>> = bufs.iter().map(|b| b.bytes().to_vec()).collect();
    let mut c = Client::connect(&sock, "").unwrap();
    c.merge(bufs[0].bytes()).unwrap();
    let before = fds();
    for b in &bufs[1..] {
        assert_eq!(c.merge(b.bytes()).unwrap().added, 2);
    }
    let grown = fds().saturating_sub(before);
    // Other tests of this binary open descriptors meanwhile; 299 adds held 299 before.
    assert!(grown < 100, "{grown} more descriptors after 299 small merges");
    for (b, copy) in bufs.iter().zip(&copies) {
        assert_eq!(b.bytes(), &copy[..], "a merged buffer changed");
    }
    // A second process's equal buffers map the same physical pages.
    let mut c2 = Client::connect(&sock, "").unwrap();
    let again = filled(2, 7).tap_seed(7);
    let s = c2.merge(again.bytes()).unwrap();
    assert_eq!((s.merged, s.added), (2, 0), "{s:?}");
    assert_eq!(again.bytes(), &copies[7][..]);
    assert_eq!(page_frames(again.range()).unwrap(), page_frames(bufs[7].range()).unwrap());
}

/// Makes `filled`'s content depend on a seed wider than its u8.
trait TapSeed {
    fn tap_seed(self, seed: usize) -> Self;
}

impl TapSeed for Region {
    fn tap_seed(mut self, seed: usize) -> Self {
        let ps = page_size();
        for (p, page) in self.bytes_mut().chunks_exact_mut(ps).enumerate() {
            page[..16].copy_from_slice(&[(seed as u64).to_le_bytes(), (p as u64).to_le_bytes()].concat());
        }
        self
    }
}

/// A second daemon on a live socket is refused and leaves it serving; a relative path
/// is made absolute (clients name it from other directories); a path longer than a
/// socket address holds is refused saying so; a socket whose state cannot be told (no
/// permission to connect) is not replaced.
#[test]
fn binding_refuses_a_live_socket_and_names_odd_paths_clearly() {
    let (d, sock) = start("bindodd", |_| {});
    let e = Daemon::bind(Config::at(&sock)).unwrap_err().to_string();
    assert_eq!(e, format!("{}: another advmd is already serving on this socket", sock.display()));
    assert!(Channel::connect(&sock).is_ok(), "the refused daemon took the socket");

    let dir = sock.parent().unwrap().to_path_buf();
    let long = dir.join("x".repeat(120));
    let e = Daemon::bind(Config::at(&long)).unwrap_err().to_string();
    let n = long.as_os_str().len();
    assert_eq!(
        e,
        format!(
            "{}: {n} bytes long; a UNIX socket path holds at most 107 bytes (name a shorter path with --socket or \
             ADVM_SOCKET)",
            long.display()
        )
    );

    let rel = std::path::Path::new("advmd-test-relative.sock");
    if rustix::fs::access(".", rustix::fs::Access::WRITE_OK).is_err() {
        // a user running the tests of a checkout it may not write (another's, read-only)
        eprintln!("relative path not checked: the working directory is not writable");
        d.stop();
        return;
    }
    let _ = std::fs::remove_file(rel);
    let b = Daemon::bind(Config::at(rel)).unwrap();
    assert_eq!(b.socket(), std::env::current_dir().unwrap().join(rel));
    drop(b);
    let _ = std::fs::remove_file(rel);
    let _ = std::fs::remove_file("advmd-test-relative.sock.lock");
    d.stop();
}

/// A socket this process may not connect to (mode 0) may have a daemon behind it: it
/// is left alone, not replaced. Root connects regardless of the mode: skipped as root.
#[test]
fn binding_leaves_a_socket_it_cannot_probe() {
    if advm::process::is_root() {
        eprintln!("skipping: root connects to a mode-0 socket (the probe cannot be refused)");
        return;
    }
    // A listener without a daemon's lock beside it: a daemon's lock is seen first (the
    // test used one, so reached the lock's refusal, never the probe).
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-bindnoperm", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("advmd.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o0)).unwrap();
    let e = Daemon::bind(Config::at(&sock)).unwrap_err().to_string();
    assert!(e.contains("not replacing it in case a daemon serves there"), "{e}");
    assert!(sock.exists());
    drop(listener);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A client that cannot reach the daemon is told why and what to do: nothing at the
/// path, a socket nobody answers on, a socket this user may not reach (as uid 65534,
/// behind a directory of mode 0700; root only).
#[test]
fn a_client_that_cannot_connect_is_told_why() {
    let (d, sock) = start("connerr", |_| {});
    let dir = sock.parent().unwrap().to_path_buf();
    let e = Client::connect(&dir.join("absent.sock"), "").unwrap_err().to_string();
    assert!(e.ends_with("No such file or directory (os error 2): no advmd serves there (start one with `advm daemon --socket PATH`, or set ADVM_SOCKET to its socket)"), "{e}");
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let e = Client::connect(&stale, "").unwrap_err().to_string();
    assert!(e.contains("no advmd answers (one that died left it"), "{e}");
    if advm::process::is_root() {
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let s = sock.clone();
        let code = as_uid(Some(65534), move || match Client::connect(&s, "") {
            Err(e) if e.to_string().contains("Permission denied (os error 13): this user may not connect") => 0,
            Err(_) => 2,
            Ok(_) => 1,
        });
        assert_eq!(code, 0, "uid 65534 connected through a 0700 directory (1) or was not told why (2)");
    } else {
        eprintln!("skipping the uid 65534 part: not root");
    }
    d.stop();
}

/// A tag narrows a uid's domain and must not widen its budget: the limit covers all of
/// a uid's tags (with a full limit per tag, one uid made the daemon hold the limit once
/// per tag it named, and small adds are copied into the daemon's own memory).
#[test]
fn a_uids_tags_share_one_limit() {
    if !can_switch_uid() {
        return;
    }
    if !fence_ok() {
        return;
    }
    let ps = page_size();
    let (_d, sock) = start("taglimit", |c| c.domain_limit_bytes = 64 * ps as u64);
    let a = filled(48, 31);
    let mut ca = Client::connect(&sock, "tenant-a").unwrap();
    let s = ca.merge(a.bytes()).unwrap();
    assert_eq!((s.added, s.refused), (48, 0), "{s:?}");
    let b = filled(32, 32);
    let orig = b.bytes().to_vec();
    let mut cb = Client::connect(&sock, "tenant-b").unwrap();
    let s = cb.merge(b.bytes()).unwrap();
    assert!(s.added <= 16 && s.refused >= 16, "{s:?}");
    let why = s.refusal.unwrap_or_default();
    assert!(why.contains("covers all of a uid's tags"), "{why}");
    assert_eq!(b.bytes(), &orig[..]);
    // Another uid is not bounded by this one's pages.
    let s2 = sock.clone();
    let code = as_uid(Some(1000), move || {
        let c = filled(32, 33);
        match Client::connect(&s2, "tenant-b").and_then(|mut k| k.merge(c.bytes())) {
            Ok(s) if (s.added, s.refused) == (32, 0) => 0,
            _ => 1,
        }
    });
    assert_eq!(code, 0, "uid 1000's add was refused for uid 0's pages");
    drop(ca);
}

/// Two daemons started at once on one path: the socket's lock file lets one bind and
/// refuses the other, so the second cannot remove the first's new socket as stale.
/// The lock is held for the daemon's life and not through a symbolic link.
#[test]
fn a_daemon_starting_while_another_holds_the_sockets_lock_is_refused() {
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-bindlock", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    // a stale socket, and another daemon starting on it (holding the lock)
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let other =
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(dir.join("s.sock.lock")).unwrap();
    assert!(advm::process::try_lock_file(&other).unwrap());
    let e = Daemon::bind(Config::at(&sock)).unwrap_err().to_string();
    assert_eq!(e, format!("{}: another advmd is already serving on this socket", sock.display()));
    let kind = std::fs::symlink_metadata(&sock).unwrap().file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&kind), "the stale socket was touched");
    drop(other);
    let h = Daemon::bind(Config::at(&sock)).unwrap().spawn();
    assert!(Channel::connect(&sock).is_ok());
    assert!(Daemon::bind(Config::at(&sock)).is_err());
    // A lock opened before the daemon stops and taken after is not at its path any more.
    let late = std::fs::OpenOptions::new().write(true).open(dir.join("s.sock.lock")).unwrap();
    h.stop();
    assert!(!sock.exists() && !dir.join("s.sock.lock").exists(), "the stopped daemon left its socket or lock");
    // A child another test thread forked while the daemon held its lock holds a copy of
    // the lock's descriptor until it execs or exits: wait for that, not for ever.
    let t = std::time::Instant::now();
    while !advm::process::try_lock_file(&late).unwrap() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the stopped daemon's lock is still held");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(late);
    // A link where the lock file goes is not followed.
    let target = dir.join("precious");
    std::fs::write(&target, b"keep").unwrap();
    std::os::unix::fs::symlink(&target, dir.join("s.sock.lock")).unwrap();
    assert!(Daemon::bind(Config::at(&sock)).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One uid's connections, idle as long as they like, cannot take every slot: past
/// `max_clients_per_uid` its next one is refused saying so, and another uid is served.
#[test]
fn one_uid_cannot_take_every_client_slot() {
    if !can_switch_uid() {
        return;
    }
    let (_d, sock) = start("peruid", |c| c.max_clients_per_uid = 2);
    let held: Vec<Channel> = (0..2).map(|_| Channel::connect(&sock).unwrap()).collect();
    // The accept loop counts a connection once it has taken it.
    for ch in &held {
        Request::Usage.send(ch).unwrap();
        let _ = Reply::recv(ch);
    }
    let e = Client::connect(&sock, "").unwrap_err().to_string();
    assert!(e.contains("advmd serves at most 2 clients of one uid at once"), "{e}");
    let s = sock.clone();
    let code = as_uid(Some(1000), move || match Client::connect(&s, "") {
        Ok(_) => 0,
        Err(_) => 1,
    });
    assert_eq!(code, 0, "another uid was refused");
    drop(held);
    let t0 = std::time::Instant::now();
    while Client::connect(&sock, "").is_err() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the slots were not given back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_closes_its_connection_and_lives_on_keeps_its_merged_pages() {
    // A program that closes every descriptor above stderr (a daemon, `os.closerange`)
    // after a merge ended its session: advmd released its slots, punched them and gave
    // them to the next add, and the program's merged buffer changed under it.
    if !fence_ok() {
        return;
    }
    let (d, sock) = start("closed", |_| {});
    let (mut ready, mut go) = ([0; 2], [0; 2]);
    // SAFETY: two pipes, their fds ours.
    assert!(unsafe { libc::pipe(ready.as_mut_ptr()) } == 0 && unsafe { libc::pipe(go.as_mut_ptr()) } == 0);
    // SAFETY: the child merges, closes its descriptors, waits and checks, then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let buf = distinct(64, 21); // under 256 pages: copied into the store's own memfd
        let want = buf.bytes().to_vec();
        let merged =
            Client::connect(&sock, "closed").and_then(|mut c| c.merge(buf.bytes())).is_ok_and(|s| s.added == 64);
        for fd in 3..1024 {
            if fd != ready[1] && fd != go[0] {
                // SAFETY: closing descriptors, as the program does; nothing here uses them.
                unsafe { libc::close(fd) };
            }
        }
        let mut b = [0u8];
        // SAFETY: our pipe ends.
        let synced = unsafe { libc::write(ready[1], b.as_ptr().cast(), 1) } == 1
            && unsafe { libc::read(go[0], b.as_mut_ptr().cast(), 1) } == 1;
        let code = if !merged || !synced {
            2
        } else if buf.bytes() != &want[..] {
            1
        } else {
            0
        };
        // SAFETY: leave without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut b = [0u8];
    // SAFETY: our pipe ends.
    assert_eq!(unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) }, 1);
    std::thread::sleep(Duration::from_millis(100)); // the daemon sees the connection close
    let mut c = Client::connect(&sock, "closed").unwrap();
    let others: Vec<Region> = (0..4).map(|i| distinct(64, 40 + i)).collect();
    for o in &others {
        assert_eq!(c.merge(o.bytes()).unwrap().added, 64);
    }
    // SAFETY: our pipe end.
    assert_eq!(unsafe { libc::write(go[1], b.as_ptr().cast(), 1) }, 1);
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "1: the child's merged buffer changed; 2: its merge failed");
    // Once it has exited, its pages go (the client's 4 x 64 stay).
    let t = Instant::now();
    while d.services.merge.usage().iter().any(|(dom, u)| dom.tag == "closed" && u.pages != 4 * 64) {
        assert!(t.elapsed() < Duration::from_secs(5), "not reclaimed: {:?}", d.services.merge.usage());
        std::thread::sleep(Duration::from_millis(10));
    }
    for fd in ready.into_iter().chain(go) {
        // SAFETY: our pipe fds, closed once.
        unsafe { libc::close(fd) };
    }
}

/// `pages` of bytes that differ from those of every other `seed` (`filled`'s differ
/// only in a few bytes, so they share most pages).
fn distinct(pages: usize, seed: u64) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i as u64 ^ seed << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
    }
    r
}

/// A client refused for a daemon's limit is told so, not that its request was invalid
/// (until 2026-11-29 every error reply read "invalid merge request (advmd refused
/// it): ...", which sent a platform engineer looking for a bad request).
#[test]
fn a_refusal_for_a_limit_does_not_read_as_an_invalid_request() {
    let (_d, sock) = start("refusal", |c| c.max_clients_per_uid = 1);
    let held = Channel::connect(&sock).unwrap();
    Request::Usage.send(&held).unwrap();
    let _ = Reply::recv(&held);
    let e = Client::connect(&sock, "").unwrap_err();
    assert!(matches!(e, advm::Error::DaemonRefused { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.starts_with("advmd refused the request: advmd serves at most 1 clients of one uid"), "{e}");
    assert!(!e.contains("invalid"), "{e}");
}

/// The socket's path appears only once the daemon listens there, open to every uid:
/// a client that connects the moment the path exists is never refused (it took that
/// for no daemon and used a store of its own: a rare failure of a Python test under
/// load) and never finds a mode other than 0666; nothing staged is left beside it.
#[test]
fn the_socket_appears_listening_and_open_to_every_uid_and_nothing_else_is_left() {
    // removed however the test ends
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Gone(std::env::temp_dir().join(format!("advmd-test-{}-appears", std::process::id())));
    let dir = &dir.0;
    std::fs::create_dir_all(dir).unwrap();
    for round in 0..40 {
        let sock = dir.join(format!("advmd-{round}.sock"));
        let cfg = Config::at(&sock);
        let binder = std::thread::spawn(move || Daemon::bind(cfg).unwrap());
        let t = Instant::now();
        while std::fs::symlink_metadata(&sock).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "no socket at {}", sock.display());
            std::hint::spin_loop();
        }
        let mode = std::fs::symlink_metadata(&sock).unwrap().mode() & 0o777;
        let connected = std::os::unix::net::UnixStream::connect(&sock);
        let daemon = binder.join().unwrap();
        assert_eq!(mode, 0o666, "round {round}: the socket appeared with mode {mode:o}");
        assert!(connected.is_ok(), "round {round}: a connect as the socket appeared: {connected:?}");
        drop(daemon);
        let _ = std::fs::remove_file(&sock);
    }
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !n.to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "left beside the sockets: {left:?}");
}
