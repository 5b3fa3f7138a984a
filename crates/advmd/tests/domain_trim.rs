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
