//! A session's trim lets go of the pages its process no longer maps: kept while a
//! forked child or another session maps them, freed (adopted files closed, slots
//! reused) once nothing does; a client merges again after its view forgot a file.
//! (Alone in its test binary, so the fork happens with no other test thread running.)

use advm::merge::Client;
use advmd::merge_service::Domain;

mod common;
use common::{distinct, fork, get, pipe, put, wait};

#[test]
fn a_trim_keeps_what_any_process_maps_and_frees_the_rest() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    // Adopted (an add of at least COPY_BELOW_PAGES) and copied pages both.
    for n in [advm::merge::COPY_BELOW_PAGES * 2, 16] {
        let (d, sock) = common::start(&format!("trim{n}"), |c| c.domain_limit_bytes = 64 << 20);
        let dom = Domain { uid: advm::process::euid(), tag: String::new() };
        let pages = || d.services.merge.usage().first().map_or(0, |u| u.1.pages);
        // Files a daemon of an earlier round still holds are not this round's.
        let before = adopted_fds();
        let mut a = Client::connect(&sock, "").unwrap();
        let mut b = Client::connect(&sock, "").unwrap();
        let buf = distinct(n, 5);
        let want = buf.bytes().to_vec();
        assert_eq!(a.merge(buf.bytes()).unwrap().added, n as u64);
        let go = pipe();
        let child = fork(|| {
            get(go[0]);
            i32::from(buf.bytes() != &want[..])
        });
        // A second session holds the same pages.
        let other = distinct(n, 5);
        assert_eq!(b.merge(other.bytes()).unwrap().merged, n as u64);
        drop(buf);
        let t = a.trim().unwrap();
        assert_eq!((t.released, t.kept), (0, n as u64), "the child and the other session map them");
        assert!(put(go[1], 1));
        assert_eq!(wait(child), 0, "the child read other bytes than were merged");
        assert_eq!(a.trim().unwrap().released, 0, "the other session's memory maps them");
        drop(other);
        assert_eq!((b.trim().unwrap().released, pages()), (n as u64, n as u64), "session a holds them still");
        assert_eq!(a.trim().unwrap().released, n as u64);
        assert_eq!((pages(), d.services.merge.references(&dom)), (0, Some(0)));
        assert_eq!(adopted_fds(), before, "the daemon and both views closed the adopted file");
        // Merged again after the views forgot the files: added anew, bytes unchanged.
        let again = distinct(n, 5);
        assert_eq!(a.merge(again.bytes()).unwrap().added, n as u64);
        assert!(again.bytes() == &want[..]);
        let fresh = distinct(n, 6);
        let want6 = fresh.bytes().to_vec();
        assert_eq!(b.merge(fresh.bytes()).unwrap().added, n as u64);
        assert!(fresh.bytes() == &want6[..] && again.bytes() == &want[..]);
        assert_eq!(pages(), 2 * n as u64);
    }
}

/// This process's descriptors of files a merge added (the daemon runs in it too).
fn adopted_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains("advm-merge-add"))
        .count()
}
