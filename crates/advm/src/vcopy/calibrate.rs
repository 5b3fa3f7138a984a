//! Calibration: what a virtual copy and the writes after it cost against memcpy on
//! this machine, measured on the arena's own blocks ([`Arena::calibrate`]).

use std::time::Instant;

use serde::Serialize;

use super::arena::lock;
use super::Arena;
use crate::mem::HostAddr;
use crate::Result;

/// Calibration of this machine: what a virtual copy and its later writes cost
/// against memcpy, per page.
#[derive(Debug, Clone, Copy, Serialize)]
#[non_exhaustive]
pub struct Calibration {
    /// Pages per measured block.
    pub pages: usize,
    /// memcpy into a fresh block, per page (faults of the destination included).
    pub memcpy_ns_per_page: f64,
    /// Virtual copy into a fresh block, per page.
    pub vcopy_ns_per_page: f64,
    /// Writing one byte to each page of a plain, already-owned page (no fault).
    pub plain_write_ns_per_page: f64,
    /// Writing one byte to each page of a virtual copy (one copy-on-write fault each).
    pub cow_write_ns_per_page: f64,
    /// The fraction of pages written after the copy at which memcpy and virtual copy
    /// cost the same; above it memcpy wins. 1.0 or more: virtual copy always wins.
    pub crossover_write_fraction: f64,
}

impl Arena {
    /// Measures memcpy, virtual copy and first-write costs on blocks of `pages`
    /// pages of this arena, stores the crossover write fraction in [`Stats`](super::Stats) and
    /// returns the calibration. Takes a few milliseconds per 1000 pages.
    pub fn calibrate(&self, pages: usize) -> Result<Calibration> {
        let ps = crate::addr::page_size();
        let pages = pages.max(self.stats().small_block_pages as usize);
        let len = pages * ps;
        let src = self.alloc(len)?;
        let result = (|| -> Result<Calibration> {
            self.fill(src, 0x5a, len)?;
            let mut memcpy = Vec::new();
            let mut vcopy = Vec::new();
            let mut plain = Vec::new();
            let mut cow = Vec::new();
            for _ in 0..3 {
                // memcpy into a fresh block (its pages fault in as memcpy writes them).
                let dst = self.alloc(len)?;
                let t = Instant::now();
                {
                    let g = lock(&self.shared)?;
                    let base = g.res.base();
                    g.res.copy(src.0 - base, dst.0 - base, len)?;
                }
                memcpy.push(t.elapsed().as_nanos() as f64);
                let t = Instant::now();
                self.touch_pages(dst, pages)?;
                plain.push(t.elapsed().as_nanos() as f64);
                self.free(dst)?;
                let t = Instant::now();
                let copy = self.dup(src, len)?;
                vcopy.push(t.elapsed().as_nanos() as f64);
                let t = Instant::now();
                self.touch_pages(copy, pages)?;
                cow.push(t.elapsed().as_nanos() as f64);
                self.free(copy)?;
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2] / pages as f64
            };
            let (m, v, p, c) = (med(&mut memcpy), med(&mut vcopy), med(&mut plain), med(&mut cow));
            // vcopy + f*(cow) = memcpy + f*(plain)  =>  f = (memcpy - vcopy) / (cow - plain)
            let crossover = if c > p { ((m - v) / (c - p)).max(0.0) } else { f64::INFINITY };
            Ok(Calibration {
                pages,
                memcpy_ns_per_page: m,
                vcopy_ns_per_page: v,
                plain_write_ns_per_page: p,
                cow_write_ns_per_page: c,
                crossover_write_fraction: crossover,
            })
        })();
        self.free(src)?;
        let cal = result?;
        lock(&self.shared)?.stats.crossover_write_fraction = Some(cal.crossover_write_fraction);
        Ok(cal)
    }

    /// Writes one byte in each of the first `pages` pages at `block`.
    fn touch_pages(&self, block: HostAddr, pages: usize) -> Result<()> {
        let g = lock(&self.shared)?;
        let off = block.0 - g.res.base();
        for i in 0..pages {
            g.res.fill(off + i * g.ps, 1, 0xa5)?;
        }
        Ok(())
    }
}
