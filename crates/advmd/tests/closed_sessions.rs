//! Closed sessions whose process lives on: their pages are kept, but not a thread, a
//! connection slot or a descriptor each. (A test binary of its own: it counts the
//! daemon's threads, which other tests' daemons would add to.)

use std::time::{Duration, Instant};

use advm::mem::{page_size, Region};
use advm::merge::protocol::{Reply, Request};
use advm::merge::Client;
use advm::wire::Channel;

mod common;
use common::{distinct, get, pipe, put, threads};

/// The tests here run one at a time: one counts this process's threads and
/// descriptors, which the other's daemon and pipes would add to.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Descriptors this process has open.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A process that opens a connection, takes references to stored pages and closes it,
/// over and over, used to keep a thread and a connection slot per closed connection
/// until it exited: with two slots per uid its third connection was refused.
#[test]
fn a_process_closing_many_connections_keeps_no_slot_or_thread_for_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let (d, sock) = common::start("loop", |c| {
        c.domain_limit_bytes = 64 << 20;
        c.max_clients_per_uid = 2;
    });
    let mut buf = Region::new(64 * page_size()).unwrap();
    for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7];
    }
    let want = buf.bytes().to_vec();
    // One client stays connected (a parked session: one slot, one thread).
    // Client threads of daemons other tests stopped may still be winding down.
    let threads_before = threads("advmd-client");
    let mut c = Client::connect(&sock, "").unwrap();
    assert_eq!(c.merge(buf.bytes()).unwrap().added, 64);
    let fds_before = fds();
    for round in 0..40 {
        // The daemon may not have seen the last connection close yet.
        let t = Instant::now();
        let (ch, secret) = loop {
            let ch = Channel::connect(&sock).unwrap();
            let _ = Request::Hello { tag: String::new() }.send(&ch);
            match Reply::recv(&ch) {
                Ok(Reply::Hello { secret, .. }) => break (ch, secret),
                Ok(_) => panic!("no hello"),
                Err(e) => assert!(t.elapsed() < Duration::from_secs(5), "connection {round} refused: {e}"),
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let hasher = advm::merge::PageHasher::from_secret(&secret).unwrap();
        let hashes = buf.bytes().chunks(page_size()).map(|p| hasher.hash(p)).collect();
        Request::Lookup { hashes, window: Some(0) }.send(&ch).unwrap();
        let Reply::Slots { slots, .. } = Reply::recv(&ch).unwrap() else { panic!("no slots") };
        assert!(slots.iter().all(|&s| s != advm::merge::protocol::NO_SLOT), "round {round}: {slots:?}");
    }
    // The closed connections' threads end, and their descriptors close: the daemon
    // keeps one pidfd for this process, whatever the number of its closed sessions.
    let t = Instant::now();
    while threads("advmd-client") > threads_before + 1 || fds() > fds_before + 1 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} client threads and {} more descriptors for 1 open connection and 40 closed",
            threads("advmd-client") - threads_before,
            fds() - fds_before
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The pages stay while this process lives, and its merged bytes with them.
    assert_eq!(d.services.merge.usage()[0].1.pages, 64);
    assert_eq!(buf.bytes(), &want[..]);
}

/// A merging parent forks a child and exits; the child, which maps the parent's merged
/// pages, then closes every descriptor (the connection among them) and lives on. The
/// session's process is gone by then, and its references used to go at once: the
/// pages were punched and handed to the next add under the child. Now the pages some
/// process still maps are kept, and released once it has gone too.
#[test]
fn a_forked_child_closing_the_connection_after_its_merging_parent_exited_keeps_its_pages() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let (d, sock) = common::start("orphan", |c| c.domain_limit_bytes = 64 << 20);
    let (ready, go, result) = (pipe(), pipe(), pipe());
    // SAFETY: the child merges, forks and _exits; its child checks, then _exits.
    let parent = unsafe { libc::fork() };
    if parent == 0 {
        let buf = distinct(64, 7);
        let want = buf.bytes().to_vec();
        let merged =
            Client::connect(&sock, "orphan").and_then(|mut c| c.merge(buf.bytes())).is_ok_and(|s| s.added == 64);
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        // SAFETY: the grandchild only checks bytes and uses its pipes, then _exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: getppid has no preconditions; it changes once the parent is gone.
            while unsafe { libc::getppid() } == me {
                std::thread::sleep(Duration::from_millis(5));
            }
            for fd in 3..1024 {
                if ![ready[1], go[0], result[1]].contains(&fd) {
                    // SAFETY: closing descriptors, as a daemonizing program does.
                    unsafe { libc::close(fd) };
                }
            }
            let code = if !merged {
                2
            } else if !put(ready[1], 1) || get(go[0]).is_none() {
                3
            } else if buf.bytes() != &want[..] {
                1
            } else {
                0
            };
            put(result[1], code);
            // SAFETY: leave without the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: leave without the test's destructors; the connection stays open in
        // the child.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(parent, &mut status, 0) }, parent);
    assert_eq!(get(ready[0]), Some(1), "the grandchild did not get ready");
    std::thread::sleep(Duration::from_millis(100)); // the daemon sees the connection close
    let mut c = Client::connect(&sock, "orphan").unwrap();
    let others: Vec<Region> = (0..4).map(|i| distinct(64, 40 + i)).collect();
    for o in &others {
        assert_eq!(c.merge(o.bytes()).unwrap().added, 64);
    }
    assert!(put(go[1], 1));
    assert_eq!(get(result[0]), Some(0), "1: the child's merged pages changed; 2: the merge failed; 3: no sync");
    // Once the child has exited too, its pages go (the client's 4 x 64 stay).
    let t = Instant::now();
    while d.services.merge.usage().iter().any(|(dom, u)| dom.tag == "orphan" && u.pages != 4 * 64) {
        assert!(t.elapsed() < Duration::from_secs(5), "not reclaimed: {:?}", d.services.merge.usage());
        std::thread::sleep(Duration::from_millis(10));
    }
    for fd in ready.into_iter().chain(go).chain(result) {
        // SAFETY: our pipe fds, closed once.
        unsafe { libc::close(fd) };
    }
}
