//! `testproc`: a small process with a known memory layout, for the tests of `advm stat`.
//! It prints `ready` on stdout once its memory is in place, then waits until its stdin
//! closes (or it is killed). A test binary, not part of the `advm` command: `cargo test`
//! builds it into `target/<profile>/examples/`.

use std::io::{BufRead, Write};

use std::os::fd::AsFd;

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
    /// A memfd of SIZE_MIB, mapped shared, its first WRITTEN_MIB written through the
    /// mapping; then all but the first MAPPED_MIB is unmapped. The fd stays open, so
    /// the written pages past MAPPED_MIB are held but not mapped.
    Memfd {
        /// Size of the memfd in MiB.
        #[arg(long)]
        size_mib: usize,
        /// MiB written from the start (default: all of it).
        #[arg(long)]
        written_mib: Option<usize>,
        /// MiB left mapped from the start.
        #[arg(long, default_value_t = 0)]
        mapped_mib: usize,
    },
    /// Opens PATH read-only and keeps it open (e.g. /proc/PID/fd/N of another
    /// process's memfd: the same object, held by two processes).
    Hold {
        /// The file to open.
        #[arg(long)]
        path: std::path::PathBuf,
    },
    /// Writes MIB mebibytes to the regular file PATH, maps it shared read-only and
    /// reads every page: page cache, mapped and open, that is not shmem.
    FileCache {
        /// The file to create (replaced if it exists).
        #[arg(long)]
        path: std::path::PathBuf,
        /// Size in MiB.
        #[arg(long)]
        mib: usize,
    },
    /// An advm arena block of MIB mebibytes, written, then duplicated by virtual copy;
    /// neither view is touched again, so its pages live only in the arena's memfd.
    Vcopy {
        /// Size in MiB.
        #[arg(long)]
        mib: usize,
    },
}

/// Builds the layout; what it returns holds the memory until dropped.
fn build(which: TestProc) -> Result<Box<dyn std::any::Any>, Box<dyn std::error::Error>> {
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
        TestProc::Memfd { size_mib, written_mib, mapped_mib } => {
            let (size, written, mapped) = (size_mib << 20, written_mib.unwrap_or(size_mib) << 20, mapped_mib << 20);
            let memfd = Memfd::create("advm-testproc")?;
            memfd.set_len(size as u64)?;
            let view = Reservation::new(size)?;
            view.map(0, size, Share::Shared, Backing::Memfd { memfd: &memfd, offset: 0 })?;
            view.populate_write(0, written)?;
            if mapped < size {
                view.release(mapped, size - mapped)?;
            }
            Box::new((memfd, view))
        }
        TestProc::Hold { path } => Box::new(std::fs::File::open(path)?),
        TestProc::FileCache { path, mib } => {
            let len = mib << 20;
            let bytes: Vec<u8> = (0..len).map(|i| (i / ps * 7 + i) as u8).collect();
            std::fs::write(&path, bytes)?;
            let file = std::fs::File::open(&path)?;
            let mut m = Assembly::reserve(len)?;
            let whole = Extent { offset: 0, len, backing: Backing::File { fd: file.as_fd(), offset: 0 } };
            m.place(whole, Access::Read, Share::Shared)?;
            m.populate_read(0, len)?;
            Box::new((file, m))
        }
        TestProc::Vcopy { mib } => {
            // Unmap the source's old page tables before `ready`, not in the background.
            let config = advm::vcopy::Config::default().background_unmap(false);
            let arena = advm::vcopy::Arena::with_config(config)?;
            let block = arena.alloc(mib << 20)?;
            arena.fill(block, 0x5a, mib << 20)?;
            let copy = arena.dup(block, mib << 20)?;
            Box::new((arena, block, copy))
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
