//! Adds `MIB` MiB of new pages (seeded random bytes) through the advmd at `SOCKET`,
//! `RUNS` times, and prints each add's throughput and phases: the add path alone,
//! without the bench around it. `cargo run --release --example add_rate -- SOCKET [MIB] [RUNS]`
//! (start the daemon first: `advm daemon --socket SOCKET`).

fn main() -> advm::Result<()> {
    let mut args = std::env::args().skip(1);
    let sock = args.next().expect("usage: add_rate SOCKET [MIB] [RUNS]");
    let mib: usize = args.next().map_or(1024, |a| a.parse().expect("MIB"));
    let runs: usize = args.next().map_or(3, |a| a.parse().expect("RUNS"));
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
        let s = client.merge(r.bytes())?;
        let gb = s.bytes as f64 / 1e9;
        let p = s.phases;
        println!(
            "run {run}: {:.2} GB/s added {} (s/GB: hash {:.3} lookup {:.3} add {:.3} map {:.3})",
            s.throughput() / 1e9,
            s.added,
            p.hash_s / gb,
            p.lookup_s / gb,
            p.add_s / gb,
            p.map_s / gb
        );
    }
    Ok(())
}
