//! `advm bench vcopy`: virtual copy (the mmapcopy paper) against memcpy and against
//! memcpy + KSM merging, for block sizes 64 KiB .. 1 GiB and 0/1/10/100 % of the copy
//! written afterwards.
//!
//! Each (size, write fraction) point is its own trial: a filled source (every page
//! different, so only a page and its copy can merge), the copy (timed), the writes
//! (one store into each written page, page faults included, timed), then every page of
//! source and copy is read and the process's distinct physical pages are counted
//! (advm::stats, the paper's measure) above the baseline taken before the source
//! existed. "page fault (reference)" is the same stores into fresh anonymous memory:
//! the plain page-fault cost the write-cost target is relative to.

use std::time::{Duration, Instant};

use super::{fmt_bytes, median, Bench, BenchOpts, DemoRow, Figure, Report, Row};
use crate::meters::{self, in_group, Both};
use crate::BenchError;
use advm::mem::Region;
use advm::stats::cgroup::Group;
use advm::stats::{Meter, Options};
use advm::vcopy::{Arena, Config};

/// See the module doc.
pub struct VcopyBench;

/// (label, store into every n-th page; 0 = none).
const FRACTIONS: [(&str, usize); 4] = [("0%", 0), ("1%", 100), ("10%", 10), ("100%", 1)];

fn ps() -> usize {
    advm::addr::page_size()
}

/// Fills every page of `[p, p+len)` with bytes that differ from every other page.
fn fill_distinct(p: *mut u8, len: usize) {
    let ps = ps();
    for i in 0..len / ps {
        // SAFETY: the caller passes a writable range of `len` bytes it owns.
        unsafe {
            std::ptr::write_bytes(p.add(i * ps), (i % 251) as u8, ps);
            std::ptr::write_unaligned(p.add(i * ps).cast::<u64>(), i as u64 ^ 0x5eed);
        }
    }
}

/// One store into every `step`-th page (none when `step` is 0).
fn store_pages(p: *mut u8, len: usize, step: usize) {
    if step == 0 {
        return;
    }
    let ps = ps();
    for i in (0..len / ps).step_by(step) {
        // SAFETY: the caller passes a writable range of `len` bytes it owns.
        unsafe { std::ptr::write_volatile(p.add(i * ps + 8), 0xa5) };
    }
}

/// Reads one byte of every page so every page is mapped when pages are counted.
fn read_pages(p: *const u8, len: usize) -> u64 {
    let ps = ps();
    let mut sum = 0u64;
    for i in 0..len / ps {
        // SAFETY: the caller passes a readable range of `len` bytes.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(p.add(i * ps)) } as u64);
    }
    sum
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Both meters on this process: distinct anon+shmem frames (PSS when PFNs are
/// hidden) and, in a measured child, its cgroup's anon+shmem.
struct Pages<'g> {
    meter: Meter,
    group: Option<&'g Group>,
}

impl<'g> Pages<'g> {
    fn new(group: Option<&'g Group>) -> Result<Self, BenchError> {
        Ok(Self { meter: Meter::for_self(Options::default())?, group })
    }
    fn now(&mut self) -> Result<Both, BenchError> {
        Both::read(&self.meter.sample()?, self.group)
    }
}

/// Pages in `bytes`.
fn pages_in(bytes: u64) -> f64 {
    (bytes / ps() as u64) as f64
}

/// The row's memory figures from what a trial added: the paper's distinct pages and,
/// with a group, the cgroup's pages; a disagreement between them goes to `report`.
fn with_memory(row: Row, added: &Both, n: f64, what: String, report: &mut Report) -> Row {
    let distinct = pages_in(added.distinct);
    meters::check(&mut report.meter_disagreements, &what, added.distinct as f64, added.cgroup.map(|c| c as f64));
    row.figure(Figure::single("distinct pages", "pages", distinct))
        .figure(Figure::single("memory / source", "x", distinct / n))
        .figure_if(added.cgroup.is_some(), Figure::single("cgroup pages", "pages", pages_in(added.cgroup.unwrap_or(0))))
}

/// Waits (up to 10 s) until the arena's reaper has unmapped every moved-aside
/// mapping, so its work does not spill into the next measurement; returns the
/// reaper's time since `since` (ms).
fn settle(arena: &Arena, since: f64) -> f64 {
    let t = Instant::now();
    while arena.stats().deferred_pending > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    arena.stats().deferred_unmap_ms - since
}

/// The baseline: a fresh anonymous mapping and a memcpy of `src` into it, timed (ms;
/// the destination's page faults included, as a program's copy pays them).
fn timed_memcpy(src: &Region) -> Result<(Region, f64), BenchError> {
    let mut dst = Region::new(src.len())?;
    let t = Instant::now();
    dst.bytes_mut().copy_from_slice(src.bytes());
    Ok((dst, ms(t.elapsed())))
}

/// Fraction of the pages of `dst` that share their physical page with the same page
/// of `src` (KSM merged them): PFNs from pagemap (KSM needs root, so they are visible).
fn merged_fraction(src: &Region, dst: &Region) -> Result<f64, BenchError> {
    let (a, b) = (advm::stats::page_frames(src.range())?, advm::stats::page_frames(dst.range())?);
    let same = a.iter().zip(&b).filter(|(x, y)| x.is_some() && x == y).count();
    Ok(same as f64 / a.len() as f64)
}

/// The configuration of a run.
struct Plan {
    sizes: Vec<usize>,
    ksm_timeout: Duration,
    threshold_ops: usize,
}

impl VcopyBench {
    fn plan(opts: &BenchOpts) -> Plan {
        if opts.quick {
            Plan { sizes: vec![64 << 10, 1 << 20, 4 << 20], ksm_timeout: Duration::from_secs(2), threshold_ops: 200 }
        } else {
            Plan {
                sizes: vec![64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30],
                ksm_timeout: Duration::from_secs(30),
                threshold_ops: 2000,
            }
        }
    }

    /// memcpy into fresh anonymous memory, and the plain page-fault reference.
    fn memcpy_rows(
        &self,
        len: usize,
        runs: usize,
        pages: &mut Pages,
        report: &mut Report,
    ) -> Result<Vec<(f64, f64)>, BenchError> {
        let n = (len / ps()) as f64;
        let size = fmt_bytes(len as u64);
        let mut out = Vec::new();
        for (label, step) in FRACTIONS {
            let base = pages.now()?;
            let mut src = Region::new(len)?;
            fill_distinct(src.bytes_mut().as_mut_ptr(), len);
            let (mut copy, mut write, mut fault) = (Vec::new(), Vec::new(), Vec::new());
            let mut added = Both::default();
            for run in 0..runs {
                let (mut dst, copy_ms) = timed_memcpy(&src)?;
                copy.push(copy_ms);
                let t = Instant::now();
                store_pages(dst.bytes_mut().as_mut_ptr(), len, step);
                write.push(ms(t.elapsed()));
                if run == runs - 1 {
                    read_pages(src.bytes().as_ptr(), len);
                    read_pages(dst.bytes().as_ptr(), len);
                    added = pages.now()?.since(&base);
                }
                let mut fresh = Region::new(len)?;
                let t = Instant::now();
                store_pages(fresh.bytes_mut().as_mut_ptr(), len, step);
                fault.push(ms(t.elapsed()));
            }
            let row = Row::new()
                .with("size", &size)
                .with("written", label)
                .with("method", "memcpy")
                .figure(Figure::new("copy time", "ms", copy.clone()))
                .figure(Figure::new("write time", "ms", write.clone()));
            let row = with_memory(row, &added, n, format!("vcopy {size} {label} memcpy"), report);
            report.rows.push(row);
            if step != 0 {
                report.rows.push(
                    Row::new()
                        .with("size", &size)
                        .with("written", label)
                        .with("method", "page fault (reference)")
                        .figure(Figure::new("write time", "ms", fault.clone())),
                );
            }
            out.push((median(&copy), median(&fault)));
        }
        Ok(out)
    }

    /// advm virtual copy (`Arena::dup`), and at 100 % also with `prepare_write`.
    #[allow(clippy::too_many_arguments)]
    fn advm_rows(
        &self,
        arena: &Arena,
        name: &str,
        len: usize,
        runs: usize,
        pages: &mut Pages,
        reference: &[(f64, f64)],
        report: &mut Report,
    ) -> Result<Vec<(f64, f64)>, BenchError> {
        let n = (len / ps()) as f64;
        let size = fmt_bytes(len as u64);
        let mut out = Vec::new();
        for (k, (label, step)) in FRACTIONS.iter().enumerate() {
            let modes: &[bool] = if *step == 1 { &[false, true] } else { &[false] };
            for &prepare in modes {
                let base = pages.now()?;
                let unmap0 = arena.stats().deferred_unmap_ms;
                let (mut copy, mut write) = (Vec::new(), Vec::new());
                let mut added = Both::default();
                for run in 0..runs {
                    // a freshly written source each run: its first copy is the one that
                    // pays for turning its pages private
                    let src = arena.alloc(len)?;
                    fill_distinct(src.as_ptr(), len);
                    let t = Instant::now();
                    let dst = arena.dup(src, len)?;
                    copy.push(ms(t.elapsed()));
                    let t = Instant::now();
                    if prepare {
                        arena.prepare_write(dst, len)?;
                    }
                    store_pages(dst.as_ptr(), len, *step);
                    write.push(ms(t.elapsed()));
                    if run == runs - 1 {
                        read_pages(src.as_ptr(), len);
                        read_pages(dst.as_ptr(), len);
                        added = pages.now()?.since(&base);
                    }
                    arena.free(dst)?;
                    arena.free(src)?;
                }
                let background = settle(arena, unmap0) / runs as f64;
                let method = if prepare { format!("{name} + prepare_write") } else { name.to_string() };
                let row = Row::new()
                    .with("size", &size)
                    .with("written", label)
                    .with("method", &method)
                    .figure(Figure::new("copy time", "ms", copy.clone()))
                    .figure(Figure::new("write time", "ms", write.clone()));
                let mut row = with_memory(row, &added, n, format!("vcopy {size} {label} {method}"), report)
                    .figure(Figure::single("speedup vs memcpy", "x", reference[k].0 / median(&copy)))
                    .figure(Figure::single("background unmap", "ms", background));
                if *step != 0 {
                    row = row.figure(Figure::single("write / page fault", "x", median(&write) / reference[k].1));
                }
                report.rows.push(row);
                if !prepare {
                    out.push((median(&copy), median(&write)));
                }
            }
        }
        if name != "advm vcopy" {
            return Ok(out);
        }
        // Copying a source again (already private from an earlier copy): no pages to
        // unmap from it, only the copy's own mappings.
        let src = arena.alloc(len)?;
        fill_distinct(src.as_ptr(), len);
        arena.free(arena.dup(src, len)?)?;
        settle(arena, 0.0);
        let mut again = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let d = arena.dup(src, len)?;
            again.push(ms(t.elapsed()));
            arena.free(d)?;
        }
        arena.free(src)?;
        report.rows.push(
            Row::new()
                .with("size", &size)
                .with("written", "0%")
                .with("method", "advm vcopy, source copied before")
                .figure(Figure::single("speedup vs memcpy", "x", reference[0].0 / median(&again)))
                .figure(Figure::new("copy time", "ms", again)),
        );
        // Copy of a modified copy: 10% of a copy's pages written, then that copy copied.
        // Its written pages are re-homed once into fresh memfd pages (so the new copy
        // shares them too); its clean pages are shared as they are.
        let src = arena.alloc(len)?;
        fill_distinct(src.as_ptr(), len);
        let (mut rehome, mut rehomed_pages, mut over_budget) = (Vec::new(), 0, false);
        for _ in 0..runs {
            let copy = arena.dup(src, len)?;
            store_pages(copy.as_ptr(), len, 10);
            let before = arena.stats();
            let t = Instant::now();
            let again = arena.dup(copy, len)?;
            rehome.push(ms(t.elapsed()));
            let after = arena.stats();
            rehomed_pages = after.pages_rehomed - before.pages_rehomed;
            over_budget |= after.fallback_vma_budget > before.fallback_vma_budget;
            arena.free(again)?;
            arena.free(copy)?;
        }
        arena.free(src)?;
        settle(arena, 0.0);
        // Every 10th page written makes one run per written page: large blocks exceed
        // the VMA budget, and the copy is then a memcpy (as designed), not a re-homing.
        let method = if over_budget {
            "advm vcopy of a modified copy (over the VMA budget: memcpy)"
        } else {
            "advm vcopy of a modified copy (re-homing)"
        };
        let mut row = Row::new()
            .with("size", &size)
            .with("written", "10% of the source")
            .with("method", method)
            .figure(Figure::single("speedup vs memcpy", "x", reference[0].0 / median(&rehome)))
            .figure(Figure::single("re-homed pages", "pages", rehomed_pages as f64));
        if rehomed_pages > 0 {
            row = row.figure(Figure::single("re-homing per page", "us", median(&rehome) * 1e3 / rehomed_pages as f64));
        }
        report.rows.push(row.figure(Figure::new("copy time", "ms", rehome)));
        Ok(out)
    }

    /// memcpy, then KSM merging at `pages_to_scan` pages every 20 ms until the copy is
    /// merged (or the timeout), then the writes in growing, disjoint steps.
    fn ksm_rows(
        &self,
        len: usize,
        pages_to_scan: u32,
        timeout: Duration,
        pages: &mut Pages,
        report: &mut Report,
    ) -> Result<(), BenchError> {
        let n = len / ps();
        let size = fmt_bytes(len as u64);
        let method = format!("memcpy + KSM {pages_to_scan}/20ms");
        let base = pages.now()?;
        let mut src = Region::new(len)?;
        fill_distinct(src.bytes_mut().as_mut_ptr(), len);
        let (mut dst, copy_ms) = timed_memcpy(&src)?;
        for m in [&src, &dst] {
            m.set_mergeable(true)?;
        }
        let cpu0 = advm::ksm::ksmd_cpu_seconds().unwrap_or(0.0);
        let session = advm::ksm::Session::start(pages_to_scan, 20)?;
        let t = Instant::now();
        let mut merged = 0.0;
        while t.elapsed() < timeout {
            merged = merged_fraction(&src, &dst)?;
            if merged >= 0.99 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let merge_s = t.elapsed().as_secs_f64();
        // stop scanning (merged pages stay merged) so the writes are timed alone
        session.set_scanning(false)?;
        let cpu = advm::ksm::ksmd_cpu_seconds().unwrap_or(0.0) - cpu0;
        let mut written_ms = 0.0;
        let mut done_step = 0usize;
        for (label, step) in FRACTIONS {
            if step != 0 {
                // pages of this fraction not written by a smaller one
                let t = Instant::now();
                let d = dst.bytes_mut().as_mut_ptr();
                for i in (0..n).step_by(step) {
                    if done_step != 0 && i % done_step == 0 {
                        continue;
                    }
                    // SAFETY: inside the live region `dst`, borrowed mutably for the loop.
                    unsafe { std::ptr::write_volatile(d.add(i * ps() + 8), 0xa5) };
                }
                written_ms += ms(t.elapsed());
                done_step = step;
            }
            read_pages(src.bytes().as_ptr(), len);
            read_pages(dst.bytes().as_ptr(), len);
            let added = pages.now()?.since(&base);
            let row = Row::new()
                .with("size", &size)
                .with("written", label)
                .with("method", &method)
                .figure(Figure::single("copy time", "ms", copy_ms));
            let mut row = with_memory(row, &added, n as f64, format!("vcopy {size} {label} {method}"), report)
                .figure(Figure::single("merge time", "s", merge_s))
                .figure(Figure::single("merged", "%", merged * 100.0))
                .figure(Figure::single("ksmd CPU", "s", cpu));
            if step != 0 {
                row = row.figure(Figure::single("write time", "ms", written_ms));
            }
            report.rows.push(row);
        }
        Ok(())
    }

    /// Small blocks, two ways: duplicating (new block + copy + free) and copying into
    /// an existing, already written block; each by memcpy and by sharing. Returns the
    /// smallest page count where sharing wins, for each way.
    fn threshold_rows(&self, ops: usize, report: &mut Report) -> Result<[Option<usize>; 2], BenchError> {
        let share = Arena::with_config(Config::default().reserve_bytes(1 << 30).small_block_pages(1))?;
        let copy = Arena::with_config(Config::default().reserve_bytes(1 << 30).small_block_pages(usize::MAX))?;
        let mut threshold = [None, None];
        for (w, way) in ["dup+free", "copy into a written block"].iter().enumerate() {
            for pages in [1usize, 2, 4, 8, 16, 64, 256] {
                let len = pages * ps();
                let ops = (ops / pages).max(20);
                let mut per_op = Vec::new();
                for arena in [&copy, &share] {
                    let src = arena.alloc(len)?;
                    fill_distinct(src.as_ptr(), len);
                    let dst = arena.alloc(len)?;
                    fill_distinct(dst.as_ptr(), len);
                    let mut v = Vec::new();
                    for _ in 0..3 {
                        let t = Instant::now();
                        for _ in 0..ops {
                            if w == 0 {
                                let d = arena.dup(src, len)?;
                                arena.free(d)?;
                            } else {
                                arena.vcopy(dst, src, len)?;
                            }
                        }
                        v.push(t.elapsed().as_secs_f64() * 1e6 / ops as f64);
                    }
                    arena.free(src)?;
                    arena.free(dst)?;
                    per_op.push(v);
                }
                let (m, s) = (median(&per_op[0]), median(&per_op[1]));
                if threshold[w].is_none() && s < m {
                    threshold[w] = Some(pages);
                }
                report.rows.push(
                    Row::new()
                        .with("size", format!("{pages} page{}", if pages == 1 { "" } else { "s" }))
                        .with("written", "-")
                        .with("method", format!("small block, {way}"))
                        .figure(Figure::new("memcpy per op", "us", per_op[0].clone()))
                        .figure(Figure::new("share per op", "us", per_op[1].clone())),
                );
            }
        }
        Ok(threshold)
    }
}

impl Bench for VcopyBench {
    fn name(&self) -> &'static str {
        "vcopy"
    }

    fn description(&self) -> &'static str {
        "virtual copy (advm arena) vs memcpy vs memcpy+KSM (100 and 1000 pages/20ms): copy time, distinct pages, write cost at 0/1/10/100% written"
    }

    fn run(&self, opts: &BenchOpts, report: &mut Report) -> Result<(), BenchError> {
        // Measured in a child in its own memory cgroup: the cgroup meter sees the
        // trials alone, next to the distinct-page meter on the same child.
        let template = report.clone();
        let mut unavailable = None;
        let part = in_group("bench-vcopy", &mut unavailable, |group| {
            let mut r = template;
            self.run_measured(opts, &mut r, group)?;
            Ok(r.into_part())
        })?;
        report.merge(part);
        report.notes.extend(unavailable);
        report.notes.push(
            "memory: \"distinct pages\" is the mmapcopy paper's meter (distinct anon+shmem frames mapped by the \
             measuring process), \"cgroup pages\" the anon+shmem charged to its memory cgroup; both are what the \
             trial added above the baseline taken before its source existed"
                .into(),
        );
        Ok(())
    }

    fn demo(&self) -> Result<Vec<DemoRow>, BenchError> {
        // The whole cost of a copy, not only the call: the source's old page tables
        // torn down later by the reaper thread, and the faults both sides take when
        // they are next read. memcpy pays its whole cost in the call; its reads after
        // are counted the same way for a fair sum.
        let mut unavailable = None;
        let (row, disagreements) = in_group("demo-vcopy", &mut unavailable, Self::demo_measured)?;
        if !disagreements.is_empty() {
            return Err(BenchError::Usage(format!("vcopy demo: {}", disagreements.join("; "))));
        }
        Ok(vec![row])
    }
}

impl VcopyBench {
    /// The demo row, measured in this process (`group` is its memory cgroup), and the
    /// figures on which the meters disagree.
    fn demo_measured(group: Option<&Group>) -> Result<(DemoRow, Vec<String>), BenchError> {
        let len = 256 << 20;
        let n = (len / ps()) as f64;
        let mut pages = Pages::new(group)?;
        let base = pages.now()?;
        let mut src = Region::new(len)?;
        fill_distinct(src.bytes_mut().as_mut_ptr(), len);
        let (dst, memcpy_ms) = timed_memcpy(&src)?;
        let t = Instant::now();
        read_pages(src.bytes().as_ptr(), len);
        read_pages(dst.bytes().as_ptr(), len);
        let memcpy_total_ms = memcpy_ms + ms(t.elapsed());
        let memcpy_added = pages.now()?.since(&base);
        drop((src, dst));
        let base = pages.now()?;
        let arena = Arena::with_config(Config::default().reserve_bytes(1 << 30))?;
        let a = arena.alloc(len)?;
        fill_distinct(a.as_ptr(), len);
        let unmap_before = arena.stats().deferred_unmap_ms;
        let t = Instant::now();
        let b = arena.dup(a, len)?;
        let vcopy_ms = ms(t.elapsed());
        let teardown_ms = settle(&arena, unmap_before);
        let t = Instant::now();
        read_pages(a.as_ptr(), len);
        read_pages(b.as_ptr(), len);
        let refault_ms = ms(t.elapsed());
        let advm_total_ms = vcopy_ms + teardown_ms + refault_ms;
        let advm_added = pages.now()?.since(&base);
        arena.free(b)?;
        arena.free(a)?;
        // extra pages over the source's, each meter
        let extra = |b: u64| 100.0 * (pages_in(b) - n) / n;
        let cgroup = |added: &Both| added.cgroup.map_or(String::new(), |c| format!(" (cgroup +{:.1}%)", extra(c)));
        let mut disagreements = Vec::new();
        for (what, added) in [("vcopy demo, advm", &advm_added), ("vcopy demo, memcpy", &memcpy_added)] {
            meters::check(&mut disagreements, what, added.distinct as f64, added.cgroup.map(|c| c as f64));
        }
        let memory_gain = match (memcpy_added.cgroup, advm_added.cgroup) {
            (Some(m), Some(a)) => format!(" (cgroup {:.1}x)", m as f64 / a.max(1) as f64),
            _ => String::new(),
        };
        let row = DemoRow {
            capability: "vcopy".into(),
            workload: format!(
                "first copy of a just-written {} block, then both sides read (whole cost)",
                fmt_bytes(len as u64)
            ),
            advm: format!(
                "{advm_total_ms:.1} ms (call {vcopy_ms:.2} + deferred unmap {teardown_ms:.1} + refaults {refault_ms:.1}), \
                 +{:.1}% pages{}",
                extra(advm_added.distinct),
                cgroup(&advm_added)
            ),
            baseline: format!(
                "{memcpy_total_ms:.0} ms (memcpy {memcpy_ms:.0} + reads), +{:.0}% pages{}",
                extra(memcpy_added.distinct),
                cgroup(&memcpy_added)
            ),
            gain: format!(
                "{:.1}x faster, {:.1}x less memory{memory_gain}",
                memcpy_total_ms / advm_total_ms,
                memcpy_added.distinct as f64 / advm_added.distinct.max(1) as f64
            ),
        };
        Ok((row, disagreements))
    }
}

impl VcopyBench {
    /// The benchmark proper, in the measured process; `group` is its memory cgroup.
    fn run_measured(&self, opts: &BenchOpts, report: &mut Report, group: Option<&Group>) -> Result<(), BenchError> {
        let plan = Self::plan(opts);
        report.configuration.insert("sizes_bytes".into(), serde_json::json!(plan.sizes));
        report.configuration.insert("write_fractions".into(), serde_json::json!(["0%", "1%", "10%", "100%"]));
        report.configuration.insert("ksm_timeout_s".into(), serde_json::json!(plan.ksm_timeout.as_secs()));
        let ksm_ok = advm::ksm::available() && advm::process::is_root();
        if !ksm_ok {
            report.notes.push("KSM rows skipped: KSM needs root and /sys/kernel/mm/ksm".into());
        }
        let arena = Arena::with_config(Config::default().reserve_bytes(8 << 30))?;
        // the same without the reaper thread: the source's old page tables are torn
        // down during the copy (no background work to disturb the writes after it)
        let inline = Arena::with_config(Config::default().reserve_bytes(8 << 30).background_unmap(false))?;
        let mut pages = Pages::new(group)?;
        if !advm::probe::facts().pfn_visible {
            report.notes.push("PFNs hidden: memory is PSS, not distinct pages".into());
        }
        let steps = plan.sizes.len() as u64 * if ksm_ok { 4 } else { 2 } + 1;
        let bar = opts.progress_bar(steps, "vcopy");
        let mut last = None;
        for &len in &plan.sizes {
            // 1 GiB points take seconds each on a shared 2-core machine: fewer runs
            let runs = if len >= 256 << 20 { opts.runs.min(3) } else { opts.runs }.max(1);
            let reference = self.memcpy_rows(len, runs, &mut pages, report)?;
            bar.inc(1);
            let advm = self.advm_rows(&arena, "advm vcopy", len, runs, &mut pages, &reference, report)?;
            self.advm_rows(&inline, "advm vcopy, inline unmap", len, runs, &mut pages, &reference, report)?;
            bar.inc(1);
            if ksm_ok {
                for scan in [100, 1000] {
                    self.ksm_rows(len, scan, plan.ksm_timeout, &mut pages, report)?;
                    bar.inc(1);
                }
            }
            last = Some((len, reference, advm));
        }
        let threshold = self.threshold_rows(plan.threshold_ops, report)?;
        bar.inc(1);
        bar.finish_and_clear();
        report.configuration.insert("small_block_threshold_pages_measured".into(), serde_json::json!(threshold));
        let say = |t: Option<usize>| t.map_or("never up to 256 pages".to_string(), |t| format!("from {t} page(s) on"));
        report.notes.push(format!(
            "small blocks: sharing beats memcpy for dup+free {}, for a copy into a written block {} \
             (library default threshold {} pages)",
            say(threshold[0]),
            say(threshold[1]),
            advm::vcopy::DEFAULT_SMALL_BLOCK_PAGES
        ));
        if let Some((len, reference, advm)) = last {
            // vcopy + f*W_cow(100%) = memcpy + f*W_own(100%), with W the 100 % write times
            let memcpy_copy = reference[0].0;
            let advm_copy = advm[0].0;
            let memcpy_write_all = report
                .rows
                .iter()
                .find(|r| {
                    r.config.iter().any(|(k, v)| k == "size" && *v == fmt_bytes(len as u64))
                        && r.config.iter().any(|(k, v)| k == "written" && v == "100%")
                        && r.config.iter().any(|(k, v)| k == "method" && v == "memcpy")
                })
                .and_then(|r| r.figures.iter().find(|f| f.name == "write time"))
                .map_or(0.0, |f| f.median);
            let advm_write_all = advm[3].1;
            let crossover = (memcpy_copy - advm_copy) / (advm_write_all - memcpy_write_all);
            report.configuration.insert("crossover_write_fraction".into(), serde_json::json!(crossover));
            let until = if crossover >= 1.0 {
                "at every write fraction, even 100%".to_string()
            } else {
                format!("until {:.0}% of its pages are written afterwards", crossover * 100.0)
            };
            report.notes.push(format!(
                "crossover at {}: a virtual copy costs less than memcpy {until} \
                 (copy {:.2} ms vs {:.2} ms; writing every page {:.1} ms vs {:.1} ms)",
                fmt_bytes(len as u64),
                advm_copy,
                memcpy_copy,
                advm_write_all,
                memcpy_write_all
            ));
        }
        let cal = arena.calibrate(if opts.quick { 256 } else { 4096 })?;
        report.configuration.insert("arena_calibration".into(), serde_json::to_value(cal).unwrap_or_default());
        let s = arena.stats();
        report.notes.push(format!(
            "arena: {} pages shared, {} re-homed, fallbacks unaligned/small/vma = {}/{}/{}",
            s.pages_shared, s.pages_rehomed, s.fallback_unaligned, s.fallback_small, s.fallback_vma_budget
        ));
        Ok(())
    }
}
