//! A client cannot learn whether another security domain holds a page: not from the
//! replies, not from how long they take.
//!
//! Why it cannot leak: each domain has a store of its own, with its own hash secret; a
//! session reaches its own domain's store only, so a request about a page another
//! domain holds runs exactly the code, and touches exactly the data, of a request about
//! a page nobody holds (lookup misses in this store's index, add copies the page). The
//! test checks the outcome end to end, so that a change that let domains meet (one
//! index, a shared store, a cross-domain shortcut) fails it: replies must be equal,
//! and the time of a merge of pages another domain holds must match the time of a
//! merge of pages nobody holds.

use std::path::PathBuf;
use std::time::Instant;

use advm::mem::{page_size, Region};
use advm::merge::Client;
mod common;

/// Pages per probe: a merge of 256 KiB, long enough (a few hundred microseconds) for
/// a shortcut that skipped copying to show, short enough for many trials.
const PAGES: usize = 64;
/// Pairs of probes; the first few warm up and are not counted.
const TRIALS: usize = 120;
const WARMUP: usize = 6;

fn start() -> (common::Running, PathBuf) {
    common::start("oracle", |c| c.domain_limit_bytes = 256 << 20)
}

/// `PAGES` pages of xorshift bytes from `seed`: no two seeds share a page.
fn content(seed: u64) -> Region {
    let mut r = Region::new(PAGES * page_size()).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (seed + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    for c in r.bytes_mut().chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    r
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn a_client_cannot_tell_from_replies_or_timing_whether_another_domain_holds_a_page() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let (_d, sock) = start();
    // The other domain holds the "held" contents (seeds 2t); nobody holds the "fresh"
    // ones (seeds 2t+1). Its session stays open, so its pages stay stored.
    let mut other = Client::connect(&sock, "other-tenant").unwrap();
    let held: Vec<Region> = (0..TRIALS as u64).map(|t| content(2 * t)).collect();
    for r in &held {
        assert_eq!(other.merge(r.bytes()).unwrap().added, PAGES as u64);
    }
    let mut me = Client::connect(&sock, "").unwrap();
    // One pair per trial: a probe of held pages and one of fresh pages, back to back,
    // in alternating order. Load from other jobs that lasts longer than a pair falls
    // on both of it alike; which probe comes first cancels out over the pairs.
    let (mut slower, mut ratios) = (0usize, Vec::new());
    for t in 0..TRIALS {
        let (h, f) = (content(2 * t as u64), content(2 * t as u64 + 1));
        let mut probe = |r: &Region, seed: u64| {
            let t0 = Instant::now();
            let s = me.merge(r.bytes()).unwrap();
            let dt = t0.elapsed().as_secs_f64();
            assert_eq!(r.bytes(), content(seed).bytes(), "merged content unchanged");
            ((s.merged, s.added, s.skipped, s.refused, s.refusal), dt)
        };
        let (sh, sf) = (2 * t as u64, 2 * t as u64 + 1);
        let ((rh, dh), (rf, df)) = if t % 2 == 0 {
            let a = probe(&h, sh);
            (a, probe(&f, sf))
        } else {
            let b = probe(&f, sf);
            (probe(&h, sh), b)
        };
        // The reply is the same: every page new to this domain, none shared.
        assert_eq!(rh, rf, "trial {t}: a page another domain holds got a different reply");
        assert_eq!(rh, (0, PAGES as u64, 0, 0, None), "trial {t}");
        if t >= WARMUP {
            slower += (dh > df) as usize;
            ratios.push(dh / df);
        }
    }
    // Without a leak each pair is a coin toss: about half the held probes are the
    // slower of their pair (outside 25%..75% of 114 fair tosses: odds below 1e-7), and
    // the median ratio is near 1. A store that used another domain's pages would skip
    // the copy, or map instead of add, in every held probe: nearly all pairs one way.
    let n = ratios.len();
    let ratio = median(&mut ratios);
    eprintln!("held probe slower in {slower} of {n} pairs; median held/fresh time {ratio:.3}");
    assert!((n / 4..=3 * n / 4).contains(&slower), "held probes slower in {slower} of {n} pairs");
    assert!((1.0 / 1.5..=1.5).contains(&ratio), "median held/fresh time {ratio:.3}");
}
