//! Pages a process holds without mapping them: resident pages of the shmem objects
//! (memfds, tmpfs files, shared anonymous memory, SysV segments) it has open
//! (`/proc/PID/fd`) or mapped (`/proc/PID/map_files`).
//!
//! An object is named by `(st_dev, st_ino)`, so one memfd open in two measured
//! processes is one object. Its pages are split by offset: a page some measured
//! process maps is counted by its frame with the mapped pages (pagemap says it is
//! still the object's page, not a private copy, by its file/shared bit), every other
//! resident page is *held*. The number of resident pages comes from `cachestat`
//! (`mincore` on a fresh mapping before Linux 6.5): neither faults a page in.
//!
//! cachestat costs about one page-cache lookup per page it covers, so it is asked only
//! about the gaps between long runs of mapped pages: a fully mapped 10 GiB memfd costs
//! one call over nothing instead of a walk of 2.6 million pages.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};

use crate::sys::fs::procfd;
use crate::sys::fs::residency::{self, Residency};
use crate::sys::{Errno, SysResult};

/// Low bits of an `offsets` entry: the page offset in the object.
const OFFSET_BITS: u32 = 40;
const MAX_OBJECTS: usize = 1 << (64 - OFFSET_BITS);
/// Runs of at least this many mapped pages are left out of the cachestat ranges; a
/// shorter run costs less to walk than the extra call would.
const SKIP_RUN_PAGES: u64 = 64;

/// Where an object can be reopened: a link under target `target`'s /proc/PID.
#[derive(Debug, Clone)]
struct Object {
    target: usize,
    link: String,
    size: u64,
    /// Reached through an fd (reopening needs no CAP_SYS_ADMIN, unlike map_files).
    via_fd: bool,
}

/// What the objects of one sample came to.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HeldTotals {
    /// Resident pages not mapped by any measured process.
    pub held: u64,
    /// Pages of the objects in swap (0 where only mincore was available).
    pub swapped: u64,
    /// Distinct objects.
    pub objects: u64,
    /// Objects that could not be reopened (no permission, or gone mid-sample).
    pub unread: u64,
}

/// One object's pages, as [`Objects::measure`] found them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counted {
    /// Resident pages no measured process maps.
    held: u64,
    /// Distinct pages some measured process maps.
    mapped: u64,
    /// Pages in swap.
    swapped: u64,
}

/// The shmem objects of one sample, and which of their pages are mapped.
#[derive(Default)]
pub(super) struct Objects {
    ids: HashMap<(u64, u64), u32>,
    list: Vec<Object>,
    /// `object << OFFSET_BITS | page offset` of every mapped page of an object.
    offsets: Vec<u64>,
    /// `(target, object)` for each object a target opened or mapped.
    held_by: Vec<(usize, u32)>,
    /// `(target, object, distinct pages the target maps)`, from [`Objects::end_target`].
    own_mapped: Vec<(usize, u32, u64)>,
    /// `st_dev` -> on tmpfs/shmem (None: not ours to ask), kept across samples (a
    /// device's filesystem does not change while it is mounted).
    shmem_devs: HashMap<u64, Option<bool>>,
    /// Per object, filled by [`Objects::measure`]; None when it could not be read.
    counted: Vec<Option<Counted>>,
}

impl Objects {
    /// Forgets the previous sample's objects (not the device cache).
    pub fn clear(&mut self) {
        self.ids.clear();
        self.list.clear();
        self.offsets.clear();
        self.held_by.clear();
        self.own_mapped.clear();
        self.counted.clear();
    }

    /// Whether device `dev` is tmpfs/shmem, asking the file behind `link` the first
    /// time; `None` when that cannot be asked (no permission for map_files).
    pub fn is_shmem_dev(&mut self, dir: BorrowedFd<'_>, dev: u64, link: &str) -> Option<bool> {
        match self.shmem_devs.get(&dev) {
            Some(&Some(known)) => return Some(known),
            // Refused through map_files; an fd link may still be asked.
            Some(None) if !link.starts_with("fd/") => return None,
            _ => {}
        }
        let on = match procfd::on_shmem(dir, link) {
            Ok(on) => Some(on),
            // Refused (map_files without CAP_SYS_ADMIN): do not ask again.
            Err(e) if e.errno == Errno::PERM || e.errno == Errno::ACCESS => None,
            // Gone since the listing: ask again next time.
            Err(_) => return None,
        };
        self.shmem_devs.insert(dev, on);
        on
    }

    /// Notes that target `target` opened or mapped object `(dev, ino)`, reachable via
    /// `link`; returns its id (None past the id space, which no real process reaches).
    /// `size` is asked only the first time the object is seen, or when an fd replaces a
    /// map_files link as the way to reopen it.
    pub fn note(
        &mut self,
        target: usize,
        dev: u64,
        ino: u64,
        link: &str,
        via_fd: bool,
        size: impl FnOnce() -> u64,
    ) -> Option<u32> {
        let id = match self.ids.get(&(dev, ino)) {
            Some(&id) => {
                let o = &mut self.list[id as usize];
                if via_fd && !o.via_fd {
                    *o = Object { target, link: link.to_string(), size: size(), via_fd };
                }
                id
            }
            None if self.list.len() < MAX_OBJECTS => {
                let id = self.list.len() as u32;
                self.list.push(Object { target, link: link.to_string(), size: size(), via_fd });
                self.ids.insert((dev, ino), id);
                id
            }
            None => return None,
        };
        self.held_by.push((target, id));
        Some(id)
    }

    /// Records that page `page` of object `id` is mapped.
    pub fn mapped(&mut self, id: u32, page: u64) {
        if page < 1 << OFFSET_BITS {
            self.offsets.push((id as u64) << OFFSET_BITS | page);
        }
    }

    /// Mark in `offsets` where the current target's pages begin.
    pub fn mark(&self) -> usize {
        self.offsets.len()
    }

    /// Drops what a target recorded since `mark` (its walk is redone).
    pub fn truncate(&mut self, mark: usize, held_mark: usize) {
        self.offsets.truncate(mark);
        self.held_by.truncate(held_mark);
    }

    /// Mark in the held-by list.
    pub fn held_mark(&self) -> usize {
        self.held_by.len()
    }

    /// Notes every shmem regular file target `target` has open.
    pub fn scan_fds(&mut self, target: usize, dir: BorrowedFd<'_>) -> SysResult<()> {
        for link in procfd::fd_names(dir)? {
            // A descriptor closed since the listing is simply no longer held.
            let Ok(id) = procfd::stat_link(dir, &link) else { continue };
            if id.regular && self.is_shmem_dev(dir, id.dev, &link) == Some(true) {
                self.note(target, id.dev, id.ino, &link, true, || id.size);
            }
        }
        Ok(())
    }

    /// Closes target `target`'s share of the sample: its mapped pages are
    /// `offsets[from..]`, its objects the `held_by` entries from `held_from`.
    pub fn end_target(&mut self, target: usize, from: usize, held_from: usize) {
        let own = &mut self.offsets[from..];
        own.sort_unstable();
        let mut ids: Vec<u32> = self.held_by[held_from..].iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut counts: HashMap<u32, u64> = ids.iter().map(|&id| (id, 0)).collect();
        for_each_distinct(own, |id, _| *counts.entry(id).or_default() += 1);
        self.own_mapped.extend(ids.iter().map(|&id| (target, id, counts[&id])));
    }

    /// Counts the resident pages of each object that no target maps, reopening it
    /// through the /proc/PID directory `dirs[target]` of the target that reached it.
    pub fn measure(&mut self, dirs: &[BorrowedFd<'_>], use_cachestat: &mut bool) {
        self.offsets.sort_unstable();
        let mut mapped: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.list.len()];
        let mut totals = vec![0u64; self.list.len()];
        for_each_distinct(&self.offsets, |id, page| {
            totals[id as usize] += 1;
            let runs = &mut mapped[id as usize];
            match runs.last_mut() {
                Some((start, len)) if *start + *len == page => *len += 1,
                _ => runs.push((page, 1)),
            }
        });
        let ps = crate::sys::page_size() as u64;
        self.counted = self
            .list
            .iter()
            .zip(mapped.iter().zip(&totals))
            .map(|(o, (runs, &total))| {
                let fd = procfd::open_link(dirs[o.target], &o.link).ok()?;
                if *use_cachestat {
                    match gaps_cachestat(fd.as_fd(), runs, ps) {
                        Ok((r, skipped)) => {
                            let held = r.resident.saturating_sub(total - skipped);
                            return Some(Counted { held, mapped: total, swapped: r.swapped });
                        }
                        Err(e) if e.errno == Errno::NOSYS => *use_cachestat = false,
                        Err(_) => {}
                    }
                }
                let r = residency::mincore_resident(&fd, o.size).ok()?;
                Some(Counted { held: r.resident.saturating_sub(total), mapped: total, swapped: r.swapped })
            })
            .collect();
    }

    /// Pages held but not mapped, by all targets together.
    pub fn totals(&self) -> HeldTotals {
        let mut t = HeldTotals { objects: self.list.len() as u64, ..Default::default() };
        for c in &self.counted {
            match c {
                Some(c) => {
                    t.held += c.held;
                    t.swapped += c.swapped;
                }
                None => t.unread += 1,
            }
        }
        t
    }

    /// Pages held but not mapped by target `target` alone: the resident pages of its
    /// objects that it does not map itself.
    pub fn target_held(&self, target: usize) -> u64 {
        self.own_mapped
            .iter()
            .filter(|(t, _, _)| *t == target)
            .filter_map(|&(_, id, own)| self.counted[id as usize].map(|c| (c.held + c.mapped).saturating_sub(own)))
            .sum()
    }
}

/// Calls `f(object, page)` once for each distinct entry of sorted `offsets`.
fn for_each_distinct(sorted: &[u64], mut f: impl FnMut(u32, u64)) {
    let mut last = None;
    for &v in sorted {
        if last != Some(v) {
            f((v >> OFFSET_BITS) as u32, v & ((1 << OFFSET_BITS) - 1));
            last = Some(v);
        }
    }
}

/// The byte ranges `(offset, len)` of an object outside its runs of at least
/// [`SKIP_RUN_PAGES`] mapped pages (`len` 0: to the end of the file), and the number
/// of pages those runs hold.
fn gaps(runs: &[(u64, u64)], ps: u64) -> (Vec<(u64, u64)>, u64) {
    let mut out = Vec::new();
    let (mut at, mut skipped) = (0, 0);
    for &(start, len) in runs.iter().filter(|(_, len)| *len >= SKIP_RUN_PAGES) {
        if start > at {
            out.push((at * ps, (start - at) * ps));
        }
        at = start + len;
        skipped += len;
    }
    out.push((at * ps, 0));
    (out, skipped)
}

/// cachestat over the [`gaps`] of an object whose mapped pages form `runs`; also
/// returns the mapped pages left out.
fn gaps_cachestat(fd: BorrowedFd<'_>, runs: &[(u64, u64)], ps: u64) -> SysResult<(Residency, u64)> {
    let (ranges, skipped) = gaps(runs, ps);
    let mut sum = Residency::default();
    for (off, len) in ranges {
        let r = residency::cachestat(fd, off, len)?;
        sum.resident += r.resident;
        sum.swapped += r.swapped;
    }
    Ok((sum, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_offsets_count_once_per_object() {
        let mut v = vec![1 << OFFSET_BITS | 7, 5, 1 << OFFSET_BITS | 7, 5, 6];
        v.sort_unstable();
        let mut seen = Vec::new();
        for_each_distinct(&v, |id, page| seen.push((id, page)));
        assert_eq!(seen, [(0, 5), (0, 6), (1, 7)]);
    }

    #[test]
    fn gaps_skip_long_mapped_runs_only() {
        let n = SKIP_RUN_PAGES;
        let (ranges, skipped) = gaps(&[(0, 3), (10, n), (10 + n + 5, n + 1)], 1);
        assert_eq!(ranges, [(0, 10), (10 + n, 5), (10 + 2 * n + 6, 0)]);
        assert_eq!(skipped, 2 * n + 1);
        assert_eq!(gaps(&[], 4096), (vec![(0, 0)], 0));
    }

    #[test]
    fn one_object_noted_twice_is_one_id_and_prefers_its_fd() {
        let mut o = Objects::default();
        let a = o.note(0, 1, 2, "map_files/1-2", false, || 4096).unwrap();
        let b = o.note(1, 1, 2, "fd/3", true, || 8192).unwrap();
        let c = o.note(1, 1, 3, "fd/4", true, || 4096).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!((o.list[a as usize].target, o.list[a as usize].link.as_str()), (1, "fd/3"));
        assert_eq!(o.list[a as usize].size, 8192);
        assert_eq!(o.held_by, vec![(0, a), (1, a), (1, c)]);
    }
}
