//! Adds `MIB` MiB of new pages (seeded random bytes) through the advmd at `SOCKET`,
//! `RUNS` times, and prints each add's throughput and phases: the add path alone,
//! without the bench around it; with `PIECE_MIB`, one merge call per piece of that
//! size, as the Python binding merges (so Ctrl-C is seen between pieces).
//! `cargo run --release --example add_rate -- SOCKET [MIB] [RUNS] [PIECE_MIB]`
//! (start the daemon first: `advm daemon --socket SOCKET`).

fn main() -> advm::Result<()> {
    let mut args = std::env::args().skip(1);
    let sock = args.next().expect("usage: add_rate SOCKET [MIB] [RUNS]");
    let mib: usize = args.next().map_or(1024, |a| a.parse().expect("MIB"));
    let runs: usize = args.next().map_or(3, |a| a.parse().expect("RUNS"));
    let piece: usize = args.next().map_or(mib, |a| a.parse().expect("PIECE_MIB")).max(1) << 20;
    for run in 0..runs {
        let mut client = advm::merge::Client::connect(std::path::Path::new(&sock), "")?;
        let mut r = advm::mem::Region::new(mib << 20)?;
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (run as u64 + std::process::id() as u64) << 32;
        for w in r.bytes_mut().chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let t = std::time::Instant::now();
        let mut pieces = r.bytes().chunks(piece);
        let mut s = client.merge(pieces.next().expect("MIB > 0"))?;
        for chunk in pieces {
            s.add(client.merge(chunk)?);
        }
        let (gb, p) = (s.bytes as f64 / 1e9, s.phases);
        println!(
            "run {run}: {:.2} GB/s added {} in pieces of {} MiB (s/GB: hash {:.3} lookup {:.3} add {:.3} map {:.3})",
            gb / t.elapsed().as_secs_f64(),
            s.added,
            piece >> 20,
            p.hash_s / gb,
            p.lookup_s / gb,
            p.add_s / gb,
            p.map_s / gb
        );
    }
    Ok(())
}
