//! docs/stat.md's example: how much memory do these processes really hold?
//! `cargo run -p advm --example stat -- [PID...]` (no PID: this process).

use std::ops::ControlFlow;
use std::time::Duration;

use advm::stats::{Meter, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut pids = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<Vec<i32>, _>>()?;
    if pids.is_empty() {
        pids.push(std::process::id() as i32);
    }
    let mut meter = Meter::new(&pids, Options::default())?;
    let s = meter.sample()?; // one sample
    match s.distinct {
        Some(d) => println!("{} distinct physical pages mapped", d.total),
        None => println!("page frames hidden (not root): {} bytes by PSS", s.physical_bytes),
    }
    println!("{} shmem pages held but not mapped; {} bytes in all", s.held_pages, s.physical_bytes);
    println!("anon + shmem: {} bytes (against RSS {} bytes)", s.anon_shmem_bytes, s.rss_bytes);
    // Every 100 ms for half a second (None: until the processes exit); the callback
    // sees each sample and returns Break to stop early.
    let run = advm::stats::watch(&mut meter, Some(Duration::from_millis(500)), Duration::from_millis(100), |_| {
        ControlFlow::Continue(())
    })?;
    println!("{} samples, mean {:.0} bytes, max {:.0}", run.samples, run.physical_bytes.mean, run.physical_bytes.max);
    Ok(())
}
