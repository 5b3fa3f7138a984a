//! The copy engine: a copy's plan (whole pages shared, partial pages and fallbacks
//! copied), finding a source's written pages in pagemap and re-homing them into
//! fresh memfd pages, and remapping source and destination run by run.

use super::arena::Inner;
use super::extent::Run;
use super::frames::{intersect, lay_out, push_run, Frame, Piece};
use super::{invalid, CopyHow};
use crate::sys::mman::Share;
use crate::sys::pagemap::{Entry, Pagemap};
use crate::Result;

/// Source runs of at least this many pages (2 MiB) have their old page tables moved
/// aside and unmapped in the background when a copy turns them private; shorter runs
/// are unmapped in place. Blocks this large start on a 2 MiB boundary so whole page
/// tables move.
pub(super) const DEFER_MIN_PAGES: usize = 512;

impl Inner {
    /// Maps `n` pages at reservation page `page` onto `file` from `file_page`. With
    /// `move_aside`, a long run's old page tables are first moved to a scratch range
    /// (cheap, nothing unmapped) that the reaper thread unmaps later: a copy does not
    /// wait for a GiB of page-table entries to be torn down.
    ///
    /// Between the move and the new mapping the old mapping stays in place with
    /// empty page tables, and a reader faults its pages in again from the old
    /// mapping's file pages. So `move_aside` is only for a run whose old view is a
    /// shared (`MAP_SHARED`) view of the same memfd pages as the new one: the file
    /// pages are then the bytes the block holds. Any other run (one with private
    /// written pages, whose file pages are stale) is replaced by one `MAP_FIXED`
    /// mmap, which readers see switch at once.
    pub(super) fn remap(
        &mut self,
        page: usize,
        n: usize,
        share: Share,
        file: u16,
        file_page: u32,
        move_aside: bool,
    ) -> Result<()> {
        let ps = self.ps;
        if move_aside && self.move_aside && n >= DEFER_MIN_PAGES {
            if let Some(scratch) = self.va.alloc_aligned(n, DEFER_MIN_PAGES, page % DEFER_MIN_PAGES) {
                match self.res.move_tables(page * ps, scratch * ps, n * ps) {
                    Ok(()) => {
                        self.pending.push((scratch, n));
                        self.wake_reaper();
                    }
                    Err(e) => {
                        self.va.free(scratch, n);
                        // EINVAL: the kernel refuses the move here at all; other errors
                        // (a run spanning two VMAs) only this time
                        if e.errno == crate::sys::Errno::INVAL {
                            self.move_aside = false;
                        }
                    }
                }
            }
        }
        let fd = self.files[file as usize].as_ref().expect("open file").fd.get(super::frames::CLOSED)?;
        Ok(self.res.map_file(page * ps, n * ps, share, fd, file_page as u64 * ps as u64)?)
    }

    pub(super) fn memcpy(&mut self, dst: usize, src: usize, len: usize) -> Result<()> {
        self.back(dst, len)?;
        let base = self.res.base();
        self.res.copy(src - base, dst - base, len)?;
        self.stats.bytes_copied += len as u64;
        Ok(())
    }

    pub(super) fn vcopy(&mut self, dst: usize, src: usize, len: usize) -> Result<CopyHow> {
        if len == 0 {
            return Ok(CopyHow::Shared { pages: 0, copied_bytes: 0 });
        }
        let (skey, _) = self.find("src", src, len)?;
        let (dkey, _) = self.find("dst", dst, len)?;
        if src < dst + len && dst < src + len {
            return Err(invalid(
                "dst",
                format!("range {dst:#x}+{len} overlaps src range {src:#x}+{len}; a copy needs disjoint ranges"),
            ));
        }
        self.stats.vcopies += 1;
        let ps = self.ps;
        if (dst.wrapping_sub(src)) % ps != 0 {
            self.memcpy(dst, src, len)?;
            self.stats.fallback_unaligned += 1;
            return Ok(CopyHow::CopiedUnaligned);
        }
        let head = (ps - src % ps) % ps;
        let head = head.min(len);
        let pages = (len - head) / ps;
        let tail = len - head - pages * ps;
        if pages < self.small {
            self.memcpy(dst, src, len)?;
            self.stats.fallback_small += 1;
            return Ok(CopyHow::CopiedSmall);
        }
        let base = self.res.base();
        let sidx = (src + head - base) / ps - skey;
        let didx = (dst + head - base) / ps - dkey;
        let shared = self.share_pages(dkey, didx, skey, sidx, pages)?;
        self.memcpy(dst, src, head)?;
        self.memcpy(dst + head + pages * ps, src + head + pages * ps, tail)?;
        if shared < pages {
            self.stats.fallback_vma_budget += 1;
            if shared == 0 {
                return Ok(CopyHow::CopiedVmaBudget);
            }
        }
        Ok(CopyHow::Shared { pages: shared, copied_bytes: head + tail })
    }

    /// Which pages of the private `pieces` (`(index from reservation page first, len,
    /// frame)`, in order) hold their own (written, anonymous) copy rather than the
    /// memfd page: sorted, disjoint `(index, len)` runs.
    pub(super) fn written_runs(&mut self, first: usize, pieces: &[Piece]) -> Result<Vec<(usize, usize)>> {
        let private: Vec<(usize, usize)> = pieces.iter().filter(|p| p.2.private).map(|&(i, l, _)| (i, l)).collect();
        let Some(&(li, ll)) = private.last() else { return Ok(Vec::new()) };
        let n = li + ll;
        // Kept open (opening costs more than a small copy), but reopened after a fork:
        // an inherited fd reads the parent's page tables.
        let pid = std::process::id();
        if self.pagemap.as_ref().map_or(true, |(p, _)| *p != pid) {
            self.pagemap = Some((pid, Pagemap::open("self")?));
        }
        let pm = &self.pagemap.as_ref().expect("opened above").1;
        let ps = self.ps as u64;
        let start = self.res.base() as u64 + first as u64 * ps;
        let end = start + n as u64 * ps;
        let mut anon: Vec<(usize, usize)> = Vec::new();
        let push = |anon: &mut Vec<(usize, usize)>, i: usize, l: usize| match anon.last_mut() {
            Some((s, sl)) if *s + *sl == i => *sl += l,
            _ => anon.push((i, l)),
        };
        // PAGEMAP_SCAN (Linux 6.7+) reports runs, so a source nobody wrote costs
        // almost nothing; written pages are present and not file pages, or swapped.
        if self.scan_works {
            use crate::sys::pagemap::{category, Region};
            let mut regions = [Region::default(); 512];
            let mut at = start;
            let mut ok = true;
            while at < end {
                match pm.scan(
                    at,
                    end,
                    category::PRESENT | category::SWAPPED,
                    category::PRESENT | category::SWAPPED | category::FILE | category::PFNZERO,
                    &mut regions,
                ) {
                    Ok((k, walk_end)) => {
                        for r in &regions[..k] {
                            let c = r.categories;
                            // the shared zero page is nobody's write
                            let is_anon = (c & category::SWAPPED != 0)
                                || (c & category::PRESENT != 0 && c & (category::FILE | category::PFNZERO) == 0);
                            let (a, b) = (r.start.max(start), r.end.min(end));
                            if is_anon && b > a {
                                push(&mut anon, ((a - start) / ps) as usize, ((b - a) / ps) as usize);
                            }
                        }
                        if walk_end <= at {
                            break;
                        }
                        at = walk_end;
                    }
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Ok(intersect(&anon, &private));
            }
            self.scan_works = false;
            anon.clear();
        }
        let pm = &self.pagemap.as_ref().expect("opened above").1;
        let vpn0 = start / ps;
        let mut buf = vec![0u64; n.min(64 * 1024)];
        let mut done = 0;
        while done < n {
            let want = (n - done).min(buf.len());
            let got = pm.read(vpn0 + done as u64, &mut buf[..want])?;
            if got == 0 {
                break;
            }
            for (k, &e) in buf[..got].iter().enumerate() {
                let e = Entry(e);
                if (e.present() && !e.file_or_shared()) || e.swapped() {
                    push(&mut anon, done + k, 1);
                }
            }
            done += got;
        }
        Ok(intersect(&anon, &private))
    }

    /// Shares `n` pages of block `skey` from page `sidx` into block `dkey` from page
    /// `didx`. Returns how many were shared; the rest were copied (VMA budget or a
    /// failed mmap). Either way the destination ends up a copy of the source.
    pub(super) fn share_pages(
        &mut self,
        dkey: usize,
        didx: usize,
        skey: usize,
        sidx: usize,
        n: usize,
    ) -> Result<usize> {
        let ps = self.ps;
        let base = self.res.base();
        let old: Vec<Piece> =
            self.blocks[&skey].frames.pieces(sidx, sidx + n).into_iter().map(|(i, l, f)| (i - sidx, l, f)).collect();
        let written = self.written_runs(skey + sidx, &old)?;
        let n_written: usize = written.iter().map(|w| w.1).sum();

        // Plan, per piece: the source's frames become private; written ones move to
        // fresh pages. parts: (index, len, old frame, new frame, written).
        let fresh = if n_written > 0 { self.new_frames(n_written)? } else { Vec::new() };
        let rehomed_at = lay_out(&written, &fresh);
        let mut parts: Vec<(usize, usize, Frame, Frame, bool)> = Vec::new();
        let mut w = rehomed_at.iter().peekable();
        for &(i, l, f) in &old {
            let mut at = i;
            while at < i + l {
                while w.peek().is_some_and(|r| r.0 + r.1 <= at) {
                    w.next();
                }
                let oldf = f.advance(at - i);
                match w.peek() {
                    Some(&&(ws, wl, wf)) if ws <= at => {
                        let upto = (ws + wl).min(i + l);
                        parts.push((at, upto - at, oldf, Frame { private: true, ..wf.advance(at - ws) }, true));
                        at = upto;
                    }
                    next => {
                        let upto = next.map_or(i + l, |r| r.0.min(i + l));
                        parts.push((at, upto - at, oldf, Frame { private: true, ..oldf }, false));
                        at = upto;
                    }
                }
            }
        }
        let mut all_runs = Vec::new();
        // The source runs whose frames change: shared pages turning private (same
        // memfd page, same bytes) and re-homed ones (a new memfd page). Kept apart:
        // only the first may have their old view emptied before the new one is
        // mapped (see `remap`).
        let mut src_runs: Vec<(Piece, bool)> = Vec::new();
        let mut rehome = Vec::new();
        for &(i, l, o, nf, wr) in &parts {
            push_run(&mut all_runs, (i, l, nf));
            if nf != o {
                match src_runs.last_mut() {
                    Some(((s, sl, f), k)) if *k == wr && *s + *sl == i && f.advance(*sl) == nf => *sl += l,
                    _ => src_runs.push(((i, l, nf), wr)),
                }
            }
            if wr {
                push_run(&mut rehome, (i, l, nf));
            }
        }

        // VMA budget: the runs both blocks would have afterwards. Each block gains at
        // most the copy's runs plus two splits; only near the budget are they counted
        // exactly (on copies of the blocks' extent maps).
        let est = self.vma_estimate();
        let after = if est + 2 * all_runs.len() + 4 <= self.budget {
            0
        } else {
            let src_map = &self.blocks[&skey].frames;
            let mut s = src_map.clone();
            for &(i, l, f) in &all_runs {
                s.set(sidx + i, l, f);
            }
            if dkey != skey {
                let dst_map = &self.blocks[&dkey].frames;
                let mut d = dst_map.clone();
                for &(i, l, f) in &all_runs {
                    d.set(didx + i, l, f);
                }
                est - src_map.runs() - dst_map.runs() + s.runs() + d.runs()
            } else {
                for &(i, l, f) in &all_runs {
                    s.set(didx + i, l, f);
                }
                est - src_map.runs() + s.runs()
            }
        };
        if after > self.budget {
            self.decref(&fresh)?;
            self.memcpy(base + (dkey + didx) * ps, base + (skey + sidx) * ps, n * ps)?;
            return Ok(0);
        }

        // Another thread may write the source meanwhile: a write landing between a
        // run's re-home (its bytes read into fresh pages) and its remap would be lost
        // with the old page. Such writers wait at a fence until the source is remapped
        // (then their write lands in the new view); where there is no fence
        // (userfaultfd refused), the copy is made by memcpy.
        let res = std::sync::Arc::clone(&self.res);
        let fence = match (rehome.first(), rehome.last()) {
            (Some(&(first, _, _)), Some(&(last, len, _))) if !self.no_other_writer() => {
                match res.fence_writes((skey + sidx + first) * ps, (last + len - first) * ps) {
                    Ok(fence) => Some(fence),
                    Err(_) => {
                        self.decref(&fresh)?;
                        self.memcpy(base + (dkey + didx) * ps, base + (skey + sidx) * ps, n * ps)?;
                        return Ok(0);
                    }
                }
            }
            _ => None,
        };

        // Re-home written pages: their bytes go into the fresh memfd pages.
        for &(i, len, fr) in &rehome {
            let written =
                self.files[fr.file as usize].as_ref().expect("open").fd.get(super::frames::CLOSED).and_then(|fd| {
                    self.res.write_to_file((skey + sidx + i) * ps, len * ps, fd, fr.page as u64 * ps as u64)
                });
            if let Err(e) = written {
                self.decref(&fresh)?;
                return Err(e.into());
            }
        }

        // Remap the source where its frames change (content is the same before and
        // after, so a failure part way leaves the source intact). A re-homed run
        // switches in one mmap: its old view reads other bytes than it holds.
        let mut src_done = 0;
        for &((i, l, f), rehomed) in &src_runs {
            if self.remap(skey + sidx + i, l, Share::Private, f.file, f.page, !rehomed).is_err() {
                break;
            }
            src_done += 1;
        }
        // Apply what was mapped: frames of remapped runs take their new value.
        let done_end = src_runs.get(src_done).map_or(usize::MAX, |r| r.0 .0);
        let mut dropped = Vec::new();
        let mut unused = Vec::new();
        for &(i, l, o, nf, _) in parts.iter().filter(|p| p.4) {
            if i < done_end {
                dropped.push((o, l));
            } else {
                unused.push((nf, l));
            }
        }
        let applied: Vec<Piece> = src_runs[..src_done].iter().map(|&((i, l, f), _)| (sidx + i, l, f)).collect();
        self.set_frames(skey, &applied);
        self.decref(&dropped)?;
        self.decref(&unused)?;
        drop(fence);
        if src_done < src_runs.len() {
            self.memcpy(base + (dkey + didx) * ps, base + (skey + sidx) * ps, n * ps)?;
            return Ok(0);
        }

        // Map the destination as private views of the source's pages, run by run.
        let mut shared = 0;
        for &(i, l, f) in &all_runs {
            match self.map_frames(dkey + didx, &[(i, l, f)]) {
                Ok(()) => {
                    self.incref(&[(f, l)]);
                    let old_dst: Vec<(Frame, usize)> = self.blocks[&dkey]
                        .frames
                        .pieces(didx + i, didx + i + l)
                        .into_iter()
                        .map(|(_, l, f)| (f, l))
                        .collect();
                    self.set_frames(dkey, &[(didx + i, l, f)]);
                    self.decref(&old_dst)?;
                    shared += l;
                }
                Err(_) => {
                    self.memcpy(base + (dkey + didx + i) * ps, base + (skey + sidx + i) * ps, l * ps)?;
                }
            }
        }
        self.stats.pages_shared += shared as u64;
        self.stats.pages_rehomed += n_written as u64;
        Ok(shared)
    }
}
