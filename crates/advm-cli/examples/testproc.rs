//! `testproc`: a small process with a known memory layout, for the tests of `advm stat`.
//! It prints `ready` on stdout once its memory is in place, then waits until its stdin
//! closes (or it is killed). A test binary, not part of the `advm` command: `cargo test`
//! builds it into `target/<profile>/examples/`.

use std::io::{BufRead, Write};

use advm::mem::{Access, Assembly, Backing, Extent, Memfd, Region, Reservation, Share};
use clap::Parser;

/// The layouts.
#[derive(Debug, Clone, Parser)]
enum TestProc {
    /// One memfd of PAGES pages, filled with distinct bytes, mapped shared at TIMES
    /// addresses and faulted in: RSS counts it TIMES times, distinct pages once.
    SharedPages {
        /// Pages in the memfd.
        #[arg(long, default_value_t = 1)]
        pages: usize,
        /// Number of mappings of it.
        #[arg(long, default_value_t = 2)]
        times: usize,
    },
    /// MIB mebibytes of private anonymous memory, written (distinct pages).
    Anon {
        /// Size in MiB.
        #[arg(long)]
        mib: usize,
        /// Also reserve this many GiB of empty address space (PROT_NONE), as arenas do.
        #[arg(long, default_value_t = 0)]
        reserve_gib: usize,
    },
}

/// Builds the layout; what it returns holds the memory until dropped.
fn build(which: TestProc) -> advm::Result<Box<dyn std::any::Any>> {
    let ps = advm::mem::page_size();
    Ok(match which {
        TestProc::SharedPages { pages, times } => {
            let memfd = Memfd::create("advm-testproc")?;
            memfd.set_len((pages * ps) as u64)?;
            // Every page gets different bytes, so nothing could merge them by content.
            let chunk_pages = 256;
            let mut buf = vec![0u8; chunk_pages * ps];
            for first in (0..pages).step_by(chunk_pages) {
                let n = chunk_pages.min(pages - first);
                for (i, b) in buf[..n * ps].iter_mut().enumerate() {
                    *b = ((first * ps + i) / ps * 31 + i) as u8;
                }
                memfd.write_all_at(&buf[..n * ps], (first * ps) as u64)?;
            }
            let mut maps = Vec::with_capacity(times);
            for _ in 0..times {
                let mut m = Assembly::reserve(pages * ps)?;
                let whole = Extent { offset: 0, len: pages * ps, backing: Backing::Memfd { memfd: &memfd, offset: 0 } };
                m.place(whole, Access::Read, Share::Shared)?;
                m.populate_read(0, pages * ps)?;
                maps.push(m);
            }
            Box::new(maps)
        }
        TestProc::Anon { mib, reserve_gib } => {
            let region = Region::new(mib << 20)?;
            region.populate(true)?;
            let reserved = if reserve_gib > 0 { Some(Reservation::new(reserve_gib << 30)?) } else { None };
            Box::new((region, reserved))
        }
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keep = build(TestProc::parse())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        line.clear();
    }
    drop(keep);
    Ok(())
}
