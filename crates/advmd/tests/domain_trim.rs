//! A domain at its limit trims its sessions before it refuses an add: pages that no
//! process maps any more make room, pages still mapped (by another session) stay and
//! the refusal is as before; a closed session whose process lives on is trimmed too.

use std::time::Duration;

use advm::mem::page_size;
use advm::merge::protocol::{Reply, Request};
use advm::merge::Client;
use advm::wire::Channel;
use advmd::merge_service::Domain;

mod common;
use common::distinct;

#[test]
fn a_full_domain_trims_its_sessions_before_it_refuses() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let n = 16;
    let (d, sock) = common::start("full", |c| c.domain_limit_bytes = (n * page_size()) as u64);
    let mut a = Client::connect(&sock, "").unwrap();
    let buf = distinct(n, 1);
    assert_eq!(a.merge(buf.bytes()).unwrap().added, n as u64);
    // Between merges: what a was handed is settled (mapped), and kept.
    assert_eq!(a.trim().unwrap().released, 0);
    drop(buf);
    // a's process no longer maps its pages: the full domain lets them go for b's.
    let mut b = Client::connect(&sock, "").unwrap();
    let other = distinct(n, 2);
    let want = other.bytes().to_vec();
    let s = b.merge(other.bytes()).unwrap();
    assert_eq!((s.added, s.refused), (n as u64, 0), "{s:?}");
    // b's pages are mapped (and fresh): nothing can be freed, refused as before.
    std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
    let third = distinct(n, 3);
    let s = Client::connect(&sock, "").unwrap().merge(third.bytes()).unwrap();
    assert_eq!((s.added, s.refused), (0, n as u64), "{s:?}");
    assert!(s.refusal.unwrap().contains("full"));
    assert!(other.bytes() == &want[..], "a page still mapped was let go");
    // b settles its pages, a second session maps them too: still kept.
    assert_eq!(b.trim().unwrap().released, 0);
    let mut c = Client::connect(&sock, "").unwrap();
    let twin = distinct(n, 2);
    assert_eq!(c.merge(twin.bytes()).unwrap().merged, n as u64);
    drop(other);
    std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
    let s = Client::connect(&sock, "").unwrap().merge(third.bytes()).unwrap();
    assert_eq!(s.added, 0, "c's memory maps b's pages: {s:?}");
    assert!(twin.bytes() == &want[..]);
    // A narrower domain of the same uid shares its budget: served, refused as well.
    let s = Client::connect(&sock, "elsewhere").unwrap().merge(distinct(4, 9).bytes()).unwrap();
    assert_eq!((s.added, s.refused), (0, 4), "{s:?}");
    drop(d);
}

#[test]
fn a_closed_session_whose_process_lives_is_trimmed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let n = 16;
    let (d, sock) = common::start("closed", |c| c.domain_limit_bytes = (4 * n * page_size()) as u64);
    let dom = Domain { uid: advm::process::euid(), tag: String::new() };
    let refs = || d.services.merge.references(&dom).unwrap_or(0);
    let mut c = Client::connect(&sock, "").unwrap();
    let buf = distinct(n, 4);
    assert_eq!(c.merge(buf.bytes()).unwrap().added, n as u64);
    // A second connection of this process takes references to the same pages, trims
    // (nothing to let go: mapped) and closes; the process lives on.
    {
        let ch = Channel::connect(&sock).unwrap();
        Request::Hello { tag: String::new() }.send(&ch).unwrap();
        let Ok(Reply::Hello { secret, .. }) = Reply::recv(&ch) else { panic!("no hello") };
        let hasher = advm::merge::PageHasher::from_secret(&secret).unwrap();
        let hashes = buf.bytes().chunks(page_size()).map(|p| hasher.hash(p)).collect();
        Request::Lookup { hashes, window: Some(0) }.send(&ch).unwrap();
        let Ok(Reply::Slots { .. }) = Reply::recv(&ch) else { panic!("no slots") };
        Request::Trim.send(&ch).unwrap();
        let Ok(Reply::Trimmed { released: 0, kept, .. }) = Reply::recv(&ch) else { panic!("no trim") };
        assert_eq!(kept, n as u64);
    }
    assert_eq!(refs(), 2 * n as u64);
    // Still mapped: kept.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!((d.services.merge.trim_closed(), refs()), (0, 2 * n as u64));
    drop(buf);
    // Unmapped: the closed session's references go; the live one's stay (it was
    // handed them since its last trim).
    assert_eq!((d.services.merge.trim_closed(), refs()), (n as u64, n as u64));
    assert_eq!(c.trim().unwrap().released, n as u64);
    assert_eq!(refs(), 0);
}

/// Forks only while no other test of this binary runs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn pages_a_moved_range_or_a_forked_child_maps_are_never_let_go() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let (n, ps) = (16, page_size());
    let (_d, sock) = common::start("moved", |c| c.domain_limit_bytes = (n * ps) as u64);
    let mut a = Client::connect(&sock, "").unwrap();
    let mut other = Client::connect(&sock, "").unwrap();
    // A merged range moved with mremap maps the same pages at its new address.
    let mut r = advm::mem::Region::new(2 * n * ps).unwrap();
    r.bytes_mut()[..n * ps].copy_from_slice(distinct(n, 11).bytes());
    let want = r.bytes()[..n * ps].to_vec();
    assert_eq!(a.merge(&r.bytes()[..n * ps]).unwrap().added, n as u64);
    assert_eq!(a.trim().unwrap().released, 0);
    let base = r.addr();
    r.grant().mremap_unmapping_source(base + n * ps, base, n * ps).unwrap();
    let s = other.merge(distinct(n, 12).bytes()).unwrap();
    assert_eq!((s.added, s.refused), (0, n as u64), "the moved range maps them: {s:?}");
    assert!(r.bytes()[n * ps..] == want[..]);
    drop(r);
    // Nothing maps them now: room for the next add.
    std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
    let buf = distinct(n, 13);
    let want = buf.bytes().to_vec();
    assert_eq!(a.merge(buf.bytes()).unwrap().added, n as u64);
    assert_eq!(a.trim().unwrap().released, 0);
    // A forked child maps them after the parent let its copy go.
    let go = common::pipe();
    let child = common::fork(|| {
        common::get(go[0]);
        i32::from(buf.bytes() != &want[..])
    });
    drop(buf);
    std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
    let s = other.merge(distinct(n, 14).bytes()).unwrap();
    assert_eq!((s.added, s.refused), (0, n as u64), "the child maps them: {s:?}");
    assert!(common::put(go[1], 1));
    assert_eq!(common::wait(child), 0, "the child read other bytes than were merged");
    std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
    assert_eq!(other.merge(distinct(n, 14).bytes()).unwrap().added, n as u64);
}
