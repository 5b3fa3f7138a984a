//! How the pager scales with the number of its regions (docs/pager.md, "Many regions"):
//! maps N one-page regions and touches each, then flushes each, reads each back and
//! unmaps each, and prints the time of each phase. With `--budget PAGES` below N,
//! touching evicts as it goes (every other region marked discardable first).
//! With `--rss PAGES`: the pager's own memory instead, for N regions of PAGES pages
//! (anonymous RSS grown by mapping them, then by touching every page, less the pages).
//! With `--fault-cost ROUNDS`: the time of one fault with N regions mapped: each
//! region's page is dropped (discardable) and touched again, ROUNDS times, and the
//! touches are timed (zero-fill faults: little besides finding the region).
//! `cargo run --release -p advm --example pager_regions -- N [--budget PAGES] [--sigbus] [--rss PAGES] [--fault-cost ROUNDS]`

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
    if let Some(i) = args.iter().position(|a| a == "--rss") {
        let pages: usize = args.get(i + 1).ok_or("--rss PAGES")?.parse()?;
        return rss(n, pages);
    }
    if let Some(i) = args.iter().position(|a| a == "--fault-cost") {
        let rounds: usize = args.get(i + 1).ok_or("--fault-cost ROUNDS")?.parse()?;
        return fault_cost(n, rounds, cfg);
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

/// Nanoseconds a fault with `n` one-page regions mapped, each marked discardable and
/// dropped, then touched (a zero-fill fault), `rounds` times; the median round.
fn fault_cost(n: usize, rounds: usize, cfg: Config) -> Result<(), Box<dyn std::error::Error>> {
    let ps = advm::mem::page_size();
    let pager = Pager::new(cfg)?;
    let regions = (0..n).map(|_| pager.map(ps)).collect::<Result<Vec<_>, _>>()?;
    for r in &regions {
        pager.discardable(r.as_ptr() as usize, ps)?;
    }
    let mut per_fault = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        for r in &regions {
            pager.flush_discardable(r.as_ptr() as usize, ps)?;
        }
        let before = pager.stats().faults();
        let t = Instant::now();
        for r in &regions {
            // SAFETY: the first byte of a live region of the pager.
            unsafe { std::ptr::write_volatile(r.as_ptr(), 1) };
        }
        let ns = t.elapsed().as_nanos() as f64;
        let faults = pager.stats().faults() - before;
        if faults < n as u64 {
            return Err(format!("{faults} faults for {n} touches of dropped pages").into());
        }
        per_fault.push(ns / faults as f64);
    }
    per_fault.sort_by(f64::total_cmp);
    println!(
        "{{\"regions\": {n}, \"fault_mode\": \"{:?}\", \"rounds\": {}, \"ns_per_fault_median\": {:.0}, \
         \"ns_per_fault_min\": {:.0}, \"ns_per_fault_max\": {:.0}}}",
        pager.fault_mode(),
        per_fault.len(),
        per_fault[per_fault.len() / 2],
        per_fault[0],
        per_fault[per_fault.len() - 1]
    );
    regions.into_iter().try_for_each(|r| pager.unmap(r))?;
    Ok(())
}

/// This process's anonymous resident memory, bytes.
fn rss_anon() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).ok_or("no RssAnon")?;
    Ok(line.split_whitespace().nth(1).ok_or("RssAnon")?.parse::<u64>()? * 1024)
}

/// The pager's own memory for `n` regions of `pages` pages: per region when mapped,
/// per page once every page was touched (the touched pages themselves not counted).
fn rss(n: usize, pages: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ps = advm::mem::page_size();
    let pager = Pager::new(Config::new((n * pages + 64) * ps))?;
    let start = rss_anon()?;
    let regions = (0..n).map(|_| pager.map(pages * ps)).collect::<Result<Vec<_>, _>>()?;
    let mapped = rss_anon()?;
    for r in &regions {
        for p in 0..pages {
            r.write(p * ps, &[1])?;
        }
    }
    let touched = rss_anon()?;
    let per_region = (mapped - start) as f64 / n as f64;
    let per_page = (touched - mapped).saturating_sub((n * pages * ps) as u64) as f64 / (n * pages) as f64;
    println!(
        "{{\"regions\": {n}, \"pages_each\": {pages}, \"bytes_per_region_mapped\": {per_region:.0}, \
         \"bytes_per_page_touched\": {per_page:.1}}}"
    );
    regions.into_iter().try_for_each(|r| pager.unmap(r))?;
    Ok(())
}
