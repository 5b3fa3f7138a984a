//! What a trim costs ([`advm::merge::Client::trim`]): merges `PAGES` distinct pages
//! with the in-process store (or through the advmd at `SOCKET`) one page at a time,
//! last page first, so that each page maps a store page below its left neighbour's:
//! one mapping per page. Then it times `RUNS`
//! trims that keep everything, then one that releases it all; beside them, the read
//! of this process's maps that the merge agent does every second to decide whether
//! to trim. Prints the number of processes and of this process's mappings.
//! `cargo run --release --example trim_cost -- [PAGES] [RUNS] [SOCKET]`

use std::time::Instant;

fn main() -> advm::Result<()> {
    let mut args = std::env::args().skip(1);
    let pages: usize = args.next().map_or(16384, |a| a.parse().expect("PAGES"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("RUNS"));
    let mut client = match args.next() {
        Some(sock) => advm::merge::Client::connect(std::path::Path::new(&sock), "")?,
        None => advm::merge::Client::local(16 << 30, "asked for")?,
    };
    let ps = advm::mem::page_size();
    let mut r = advm::mem::Region::new(pages * ps)?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (std::process::id() as u64) << 32;
    for w in r.bytes_mut().chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    let mut added = 0;
    for page in r.bytes().chunks(ps).rev() {
        added += client.merge(page)?.added;
    }
    println!("added {added} pages via {:?}", client.via());
    let maps = || std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let procs = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
                .count()
        })
        .unwrap_or(0);
    println!("{} mappings in this process, {procs} processes", maps().lines().count());
    let mut secs = Vec::new();
    for _ in 0..runs {
        let t = client.trim()?;
        assert_eq!(t.released, 0, "everything is mapped");
        secs.push(t.seconds);
    }
    secs.sort_by(f64::total_cmp);
    let mut look = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let n = maps().lines().count();
        look.push(t.elapsed().as_secs_f64());
        assert!(n > 0);
    }
    look.sort_by(f64::total_cmp);
    drop(r);
    let t = client.trim()?;
    println!(
        "trim keeping all: median {:.1} ms (min {:.1}, max {:.1}); releasing {} pages: {:.1} ms; \
         reading this process's maps: median {:.2} ms",
        secs[runs / 2] * 1e3,
        secs[0] * 1e3,
        secs[runs - 1] * 1e3,
        t.released,
        t.seconds * 1e3,
        look[runs / 2] * 1e3
    );
    Ok(())
}
