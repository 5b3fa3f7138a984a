//! docs/pager.md's example: a region twice its budget, half of it marked discardable.
//! Any user: userfaultfd for user-mode faults suffices (docs/pager.md, "Without root").
//! `cargo run -p advm --example pager`

use advm::pager::{Config, Pager};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib = 1 << 20;
    // At most 4 MiB resident; needed pages beyond it go to an unlinked temporary swap file.
    let pager = Pager::new(Config::new(4 * mib))?;
    let region = pager.map(8 * mib)?;
    let base = region.as_ptr() as usize;
    region.write(0, &vec![7u8; 4 * mib])?; // live data
    region.write(4 * mib, &vec![9u8; 4 * mib])?; // garbage, e.g. a collector's from-space
    pager.discardable(base + 4 * mib, 4 * mib)?; // a bit flip in a shared bitmap, no system call
    pager.flush(base, 8 * mib)?; // evict now: garbage dropped unwritten, live data written

    let mut back = vec![0u8; 4 * mib];
    region.read(0, &mut back)?; // faults read the live data back
    assert!(back.iter().all(|&b| b == 7));
    region.read(4 * mib, &mut back)?; // dropped pages read as zeros
    assert!(back.iter().all(|&b| b == 0));

    // Purgeable memory: unlocked, a range may be dropped; lock says whether it was.
    pager.needed(base + 4 * mib, 4 * mib)?;
    region.write(4 * mib, &vec![5u8; 4 * mib])?; // a cache entry
    pager.unlock(base + 4 * mib, 4 * mib)?;
    let kept = pager.lock(base + 4 * mib, 4 * mib)?; // nothing dropped in between: true
    pager.unlock(base + 4 * mib, 4 * mib)?;
    pager.flush(base + 4 * mib, 4 * mib)?; // memory pressure
    let kept_after_flush = pager.lock(base + 4 * mib, 4 * mib)?; // dropped: false, rebuild it
    assert!(kept && !kept_after_flush);

    let s = pager.stats();
    println!(
        "discarded {} pages unwritten, wrote {}, read back {}, zero-filled {}",
        s.discarded_pages,
        s.written_pages,
        s.read_pages(),
        s.zero_fills()
    );
    Ok(())
}
