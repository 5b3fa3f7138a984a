//! What a domain-wide trim costs, and how long it holds up other clients: a daemon in
//! this process, SESSIONS live sessions of one domain holding PAGES pages each (copied
//! into the store's memfd; half of them no longer mapped), the domain at its limit;
//! an add then trims the domain before it lands. Meanwhile a client of another domain
//! (a tag) and one of the same domain send usage requests in a loop: their longest
//! wait while the trim runs, beside their longest wait without one. Then the same
//! sessions closed (their process lives on): the keeper's periodic trim, timed.
//!
//! `cargo run --release -p advmd --example domain_trim_pause [SESSIONS] [PAGES] [ROUNDS]`
//! (socket under /tmp/dlimit-*; prints one JSON line per round).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::mem::{page_size, Region};
use advm::merge::protocol::{Reply, Request};
use advm::merge::Client;
use advm::wire::Channel;
use advmd::{Config, Daemon};

fn distinct(pages: usize, seed: u64) -> Region {
    let mut r = Region::new(pages * page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i as u64 ^ seed << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
    }
    r
}

/// Sends usage requests on `sock` (domain `tag`) until `stop`; the longest wait seen
/// between `from` and `to` (set by the caller while it runs), and outside.
fn pinger(
    sock: std::path::PathBuf,
    tag: &str,
    stop: Arc<AtomicBool>,
    window: Arc<std::sync::Mutex<Option<(Instant, Instant)>>>,
) -> std::thread::JoinHandle<(f64, f64, u64)> {
    let tag = tag.to_string();
    std::thread::spawn(move || {
        let ch = Channel::connect(&sock).unwrap();
        Request::Hello { tag }.send(&ch).unwrap();
        let _ = Reply::recv(&ch).unwrap();
        let (mut inside, mut outside, mut n) = (0f64, 0f64, 0u64);
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            Request::Usage.send(&ch).unwrap();
            let _ = Reply::recv(&ch).unwrap();
            samples.push((t, t.elapsed()));
            n += 1;
        }
        let w = *window.lock().unwrap();
        for (t, d) in samples {
            let during = w.is_some_and(|(a, b)| t + d >= a && t <= b);
            let s = d.as_secs_f64();
            if during {
                inside = inside.max(s);
            } else {
                outside = outside.max(s);
            }
        }
        (inside, outside, n)
    })
}

fn main() {
    let arg = |k: usize, d: usize| std::env::args().nth(k).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (sessions, pages, rounds) = (arg(1, 50), arg(2, 128), arg(3, 3));
    let ps = page_size();
    let dir = std::path::PathBuf::from(format!("/tmp/dlimit-pause-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A daemon per part and round: a client's connection stays open until its process
    // exits (dropped clients park theirs), and a uid's tags share its budget.
    let daemon = |name: String, limit: usize| {
        let sock = dir.join(name);
        let mut cfg = Config::at(&sock);
        cfg.domain_limit_bytes = limit as u64;
        (Daemon::bind(cfg).unwrap().spawn(), sock)
    };
    let procs = std::fs::read_dir("/proc")
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok()))
        .count();
    for round in 0..rounds {
        let seed = round as u64 * 1000;
        let (d, sock) = daemon(format!("full{round}.sock"), sessions * pages * ps);
        // SESSIONS live sessions fill the domain; each settles with a trim; half drop
        // their buffers (the pages no process maps any more).
        let mut clients: Vec<(Client, Option<Region>)> = (0..sessions)
            .map(|k| {
                let mut c = Client::connect(&sock, "").unwrap();
                let buf = distinct(pages, seed + k as u64);
                let m = c.merge(buf.bytes()).unwrap();
                assert_eq!(m.added + m.merged, pages as u64, "{m:?}");
                c.trim().unwrap();
                (c, Some(buf))
            })
            .collect();
        for (_, b) in clients.iter_mut().step_by(2) {
            *b = None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let window = Arc::new(std::sync::Mutex::new(None));
        let other = pinger(sock.clone(), "other", stop.clone(), window.clone());
        let same = pinger(sock.clone(), "", stop.clone(), window.clone());
        std::thread::sleep(Duration::from_millis(300));
        // An add with room (none: the domain is full, but a trim less than a second
        // ago would be skipped, so wait it out first) that trims first.
        std::thread::sleep(advmd::merge_service::DOMAIN_TRIM_EVERY);
        let mut adder = Client::connect(&sock, "").unwrap();
        let buf = distinct(pages, seed + 999);
        let t0 = Instant::now();
        let s = adder.merge(buf.bytes()).unwrap();
        let t1 = Instant::now();
        *window.lock().unwrap() = Some((t0, t1));
        let trimmed_add_s = (t1 - t0).as_secs_f64();
        // The same add again with room left (no trim: the last was < 1 s ago and the
        // store is not full), for comparison.
        let buf2 = distinct(pages, seed + 998);
        let t = Instant::now();
        let s2 = adder.merge(buf2.bytes()).unwrap();
        let plain_add_s = t.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let (o_in, o_out, o_n) = other.join().unwrap();
        let (s_in, s_out, s_n) = same.join().unwrap();
        // The keeper's periodic trim: the same sessions' pages held by closed
        // connections of this (live) process, half unmapped.
        d.stop();
        let (d, sock) = daemon(format!("closed{round}.sock"), 4 * sessions * pages * ps);
        let kept: Vec<Region> = (0..sessions).map(|k| distinct(pages, seed + 500 + k as u64)).collect();
        let mut closer = Client::connect(&sock, "closed").unwrap();
        for r in &kept {
            closer.merge(r.bytes()).unwrap();
        }
        for r in &kept {
            let ch = Channel::connect(&sock).unwrap();
            Request::Hello { tag: "closed".into() }.send(&ch).unwrap();
            let Ok(Reply::Hello { secret, .. }) = Reply::recv(&ch) else { panic!("no hello") };
            let h = advm::merge::PageHasher::from_secret(&secret).unwrap();
            let hashes = r.bytes().chunks(ps).map(|p| h.hash(p)).collect();
            Request::Lookup { hashes, window: Some(0) }.send(&ch).unwrap();
            let _ = Reply::recv(&ch).unwrap();
            Request::Trim.send(&ch).unwrap();
            let _ = Reply::recv(&ch).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        drop(kept);
        let t = Instant::now();
        let released = d.services.merge.trim_closed();
        let closed_s = t.elapsed().as_secs_f64();
        println!(
            "{{\"round\":{round},\"sessions\":{sessions},\"pages_each\":{pages},\"processes\":{procs},\
             \"trimmed_add\":{{\"added\":{},\"refused\":{},\"seconds\":{trimmed_add_s:.6}}},\
             \"plain_add\":{{\"added\":{},\"seconds\":{plain_add_s:.6}}},\
             \"other_domain_longest_wait_s\":{{\"during\":{o_in:.6},\"outside\":{o_out:.6},\"requests\":{o_n}}},\
             \"same_domain_longest_wait_s\":{{\"during\":{s_in:.6},\"outside\":{s_out:.6},\"requests\":{s_n}}},\
             \"closed_trim\":{{\"released\":{released},\"seconds\":{closed_s:.6}}}}}",
            s.added, s.refused, s2.added
        );
        drop(closer);
        drop(clients);
        d.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
