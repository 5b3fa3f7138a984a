//! What a session holds in advmd: one reference per page however often it is handed
//! the page, released once its process has gone, and the process watched is the one
//! that connected, never a later one given its pid.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use advm::mem::page_size;
use advm::merge::protocol::{Reply, Request};
use advm::merge::Client;
use advm::wire::Channel;
use advmd::merge_service::Domain;

mod common;
use common::{distinct, fork, get, kill, pipe, put, take_pid, wait};

fn fence_ok() -> bool {
    let ok = advm::probe::facts().uffd_features.is_some();
    if !ok {
        eprintln!("skipped: userfaultfd not available here");
    }
    ok
}

/// The tests here run one at a time: a child one forks would inherit the descriptors
/// another holds (a connection it means to close).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This process's domain under `tag`.
fn domain(tag: &str) -> Domain {
    Domain { uid: advm::process::euid(), tag: tag.into() }
}

/// Waits up to 5 s for `done`, then fails saying `what`.
fn until(what: impl Fn() -> String, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", what());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A memfd holding `bytes`, sealed as an add requires.
fn frozen(bytes: &[u8]) -> std::os::fd::OwnedFd {
    // SAFETY: a NUL-terminated name; the fd returned is new and ours.
    let fd = unsafe { libc::memfd_create(c"advm-test-add".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::os::unix::fs::FileExt::write_all_at(&std::fs::File::from(fd.try_clone().unwrap()), bytes, 0).unwrap();
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on our fd.
    assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }, 0);
    fd
}

/// A long-lived client merging the same buffer again and again: each merge looks its
/// pages up, and each lookup took a reference and an entry in the session's list, so
/// the daemon's memory grew with every merge (10,000 merges of 1 MiB: 2.56 million
/// entries) and the pages' counts with it. Now its session holds one reference per
/// page; once its process exits, the store has none left and lets its pages go.
#[test]
fn a_client_merging_the_same_pages_again_and_again_holds_one_reference_per_page() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if !fence_ok() {
        return;
    }
    const PAGES: usize = 64;
    const TIMES: usize = 200;
    let (d, sock) = common::start("again", |c| c.domain_limit_bytes = 64 << 20);
    let (ready, go) = (pipe(), pipe());
    let child = fork(|| {
        // Only the parent writes `go`: a parent that fails ends the wait.
        for fd in [go[1], ready[0]] {
            // SAFETY: closing this child's copies of the ends it does not use.
            unsafe { libc::close(fd) };
        }
        let buf = distinct(PAGES, 11);
        let want = buf.bytes().to_vec();
        let Ok(mut c) = Client::connect(&sock, "again") else { return 2 };
        for _ in 0..TIMES {
            match c.merge(buf.bytes()) {
                Ok(s) if s.added + s.merged == PAGES as u64 => {}
                _ => return 3,
            }
        }
        if buf.bytes() != &want[..] {
            return 1;
        }
        if !put(ready[1], 1) || get(go[0]).is_none() {
            return 4;
        }
        0
    });
    assert_eq!(get(ready[0]), Some(1), "the client's merges failed");
    let dom = domain("again");
    assert_eq!(
        d.services.merge.references(&dom),
        Some(PAGES as u64),
        "{TIMES} merges of {PAGES} pages: one reference per page"
    );
    assert_eq!(d.services.merge.usage()[0].1.pages, PAGES as u64);
    assert!(put(go[1], 1));
    assert_eq!(wait(child), 0, "1: merged bytes changed; 2: no connection; 3: a merge failed; 4: no sync");
    // Its process has gone: no reference, no page, and the domain's store with them.
    until(|| format!("kept: {:?}", d.services.merge.usage()), || d.services.merge.references(&dom).is_none());
    for fd in ready.into_iter().chain(go) {
        // SAFETY: our pipe fds, closed once.
        unsafe { libc::close(fd) };
    }
}

/// A client that sends its requests and exits before the daemon gets to its
/// connection (which lives on in another process), while the kernel gives its pid to
/// another process: the daemon watched whatever process had the pid when it started
/// serving the connection, and kept the dead client's pages as long as that one lived.
/// It watches the client the kernel recorded at connect time now (`SO_PEERPIDFD`).
#[test]
fn a_client_gone_before_it_was_served_is_not_taken_for_the_process_given_its_pid() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    const PAGES: usize = 16;
    let (bound, sock) = common::bind("reused", |c| {
        c.domain_limit_bytes = 64 << 20;
        // The client never sees the store's key: its adds are filed under the
        // daemon's hashes.
        c.hash_check_one_in = 1;
    });
    let (mine, theirs) = UnixStream::pair().unwrap();
    let client = fork(|| {
        let Ok(ch) = Channel::connect(&sock) else { return 2 };
        let pages = distinct(PAGES, 21);
        let hashes = (1..=PAGES as u64).collect();
        let sent = Request::Hello { tag: "reused".into() }
            .send(&ch)
            .and_then(|()| Request::Add { hashes, pages: frozen(pages.bytes()) }.send(&ch));
        // The connection outlives its process, in the test's hands.
        match sent.and_then(|()| Channel::from_stream(theirs).send(0, 0, &[], &[&ch])) {
            Ok(()) => 0,
            Err(_) => 3,
        }
    });
    assert_eq!(wait(client), 0, "2: no connection; 3: the requests were not sent");
    // Before the connection is taken: a forked process keeps the descriptors it inherits.
    let reused = take_pid(client);
    if reused.is_none() {
        eprintln!("pid reuse not tried: /proc/sys/kernel/ns_last_pid is not writable here");
    }
    let connection = Channel::from_stream(mine).recv().unwrap().unwrap().fds;
    assert_eq!(connection.len(), 1);
    let d = bound.spawn();
    let dom = domain("reused");
    let usage = || format!("{:?}", d.services.merge.usage());
    until(usage, || d.services.merge.references(&dom) == Some(PAGES as u64));
    // The connection closes; its client exited long ago.
    drop(connection);
    until(|| format!("kept while pid {client} lives on: {}", usage()), || d.services.merge.references(&dom).is_none());
    if let Some(p) = reused {
        kill(p);
    }
}

/// A client that sends a thousand lookups without reading a reply: the daemon reads
/// requests only as fast as the client takes its replies, so what it buffers is bounded
/// by the socket's buffers; it hangs up once a reply waits longer than the frame
/// timeout, and the session holds one reference per page however many lookups it
/// answered. Meanwhile other clients are served.
#[test]
fn a_client_pipelining_lookups_without_reading_replies_is_cut_off_and_holds_one_reference_per_page() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if !fence_ok() {
        return;
    }
    const PAGES: usize = 64;
    let (d, sock) = common::start("pipelined", |c| {
        c.domain_limit_bytes = 64 << 20;
        c.frame_timeout = Duration::from_millis(300);
    });
    let ch = Channel::connect(&sock).unwrap();
    Request::Hello { tag: "pipelined".into() }.send(&ch).unwrap();
    let Reply::Hello { secret, .. } = Reply::recv(&ch).unwrap() else { panic!("no hello") };
    let hasher = advm::merge::PageHasher::from_secret(&secret).unwrap();
    let pages = distinct(PAGES, 31);
    let hashes: Vec<u64> = pages.bytes().chunks(page_size()).map(|p| hasher.hash(p)).collect();
    Request::Add { hashes: hashes.clone(), pages: frozen(pages.bytes()) }.send(&ch).unwrap();
    assert!(matches!(Reply::recv(&ch).unwrap(), Reply::Added { ref refusal, .. } if refusal.is_empty()));
    // Each lookup names every page 8 times: 4 KiB asked, 2 KiB answered.
    let asked: Vec<u64> = hashes.iter().copied().cycle().take(8 * PAGES).collect();
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut sent = 0;
        for _ in 0..1000 {
            if let Err(e) = (Request::Lookup { hashes: asked.clone(), window: Some(0) }).send(&ch) {
                return (sent, Some(e));
            }
            sent += 1;
        }
        (sent, None)
    });
    // Served meanwhile.
    let other = distinct(4, 32);
    assert_eq!(Client::connect(&sock, "").unwrap().merge(other.bytes()).unwrap().added, 4);
    let (sent, err) = writer.join().unwrap();
    assert!(sent < 1000, "the daemon read all 1000 lookups with no reply taken");
    let err = err.expect("less sent than asked, so a send failed");
    let hung_up = matches!(&err, advm::Error::Sys(s) if matches!(s.raw_errno(), libc::EPIPE | libc::ECONNRESET));
    assert!(hung_up, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "hung up after {:?}", t.elapsed());
    // This process lives on, so its session's pages are kept: once each.
    let dom = domain("pipelined");
    until(
        || format!("{:?}", d.services.merge.references(&dom)),
        || d.services.merge.references(&dom) == Some(PAGES as u64),
    );
}
