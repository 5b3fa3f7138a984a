//! How the pager scales with the number of its regions (docs/pager.md, "Many regions"):
//! maps N one-page regions and touches each, then flushes each, reads each back and
//! unmaps each, and prints the time of each phase. With `--budget PAGES` below N,
//! touching evicts as it goes (every other region marked discardable first).
//! `cargo run --release -p advm --example pager_regions -- N [--budget PAGES] [--sigbus]`

use std::time::Instant;

use advm::pager::{Config, FaultMode, Pager};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().ok_or("usage: pager_regions N [--budget PAGES] [--sigbus]")?.parse()?;
    let budget = match args.iter().position(|a| a == "--budget") {
        Some(i) => args.get(i + 1).ok_or("--budget PAGES")?.parse()?,
        None => n + 64,
    };
    let ps = advm::mem::page_size();
    let mut cfg = Config::new(budget * ps);
    if args.iter().any(|a| a == "--sigbus") {
        cfg.fault_mode = FaultMode::Sigbus;
    }
    let pager = Pager::new(cfg)?;
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;

    let t = Instant::now();
    let mut regions = Vec::with_capacity(n);
    for i in 0..n {
        let r = pager.map(ps)?;
        if budget < n && i % 2 == 1 {
            pager.discardable(r.as_ptr() as usize, ps)?;
        }
        r.write(0, &(i as u64).to_le_bytes())?;
        regions.push(r);
    }
    let map_touch = ms(t);

    let t = Instant::now();
    for r in &regions {
        pager.flush(r.as_ptr() as usize, ps)?;
    }
    let flush = ms(t);

    let t = Instant::now();
    let mut lost = 0;
    for (i, r) in regions.iter().enumerate() {
        let mut b = [0u8; 8];
        r.read(0, &mut b)?;
        let discardable = budget < n && i % 2 == 1;
        if !discardable && u64::from_le_bytes(b) != i as u64 {
            lost += 1;
        }
    }
    let read_back = ms(t);

    let t = Instant::now();
    for r in regions {
        pager.unmap(r)?;
    }
    let unmap = ms(t);

    let s = pager.stats();
    println!(
        "{{\"regions\": {n}, \"budget_pages\": {budget}, \"map_touch_ms\": {map_touch:.1}, \"flush_ms\": {flush:.1}, \
         \"read_back_ms\": {read_back:.1}, \"unmap_ms\": {unmap:.1}, \"written\": {}, \"discarded\": {}, \"lost\": {lost}}}",
        s.written_pages, s.discarded_pages
    );
    if lost > 0 {
        return Err(format!("{lost} needed pages read back wrong").into());
    }
    Ok(())
}
