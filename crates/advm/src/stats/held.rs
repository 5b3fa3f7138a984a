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

use std::collections::HashMap;
use std::os::fd::BorrowedFd;

use crate::sys::procfd;
use crate::sys::residency::{self, Residency};
use crate::sys::{Errno, SysResult};

/// Low bits of an `offsets` entry: the page offset in the object.
const OFFSET_BITS: u32 = 40;
const MAX_OBJECTS: usize = 1 << (64 - OFFSET_BITS);

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

/// The shmem objects of one sample, and which of their pages are mapped.
#[derive(Default)]
pub(super) struct Objects {
    ids: HashMap<(u64, u64), u32>,
    list: Vec<Object>,
    /// `object << OFFSET_BITS | page offset` of every mapped page of an object.
    offsets: Vec<u64>,
    /// `(target, object)` for each object a target opened or mapped.
    held_by: Vec<(usize, u32)>,
    /// `st_dev` -> on tmpfs/shmem, kept across samples (a device's filesystem does not
    /// change while it is mounted).
    shmem_devs: HashMap<u64, bool>,
    /// Resident pages per object, filled by [`Objects::measure`].
    residency: Vec<Option<Residency>>,
}

impl Objects {
    /// Forgets the previous sample's objects (not the device cache).
    pub fn clear(&mut self) {
        self.ids.clear();
        self.list.clear();
        self.offsets.clear();
        self.held_by.clear();
        self.residency.clear();
    }

    /// Whether device `dev` is tmpfs/shmem, asking the file behind `link` the first
    /// time; `None` when that cannot be asked (no permission for map_files).
    pub fn is_shmem_dev(&mut self, dir: BorrowedFd<'_>, dev: u64, link: &str) -> Option<bool> {
        if let Some(&known) = self.shmem_devs.get(&dev) {
            return Some(known);
        }
        let on = procfd::on_shmem(dir, link).ok()?;
        self.shmem_devs.insert(dev, on);
        Some(on)
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

    /// Asks how many pages of each object are resident, reopening it through the
    /// /proc/PID directory `dirs[target]` of the target that reached it.
    pub fn measure(&mut self, dirs: &[BorrowedFd<'_>], use_cachestat: &mut bool) {
        self.residency = self
            .list
            .iter()
            .map(|o| {
                let fd = procfd::open_link(dirs[o.target], &o.link).ok()?;
                if *use_cachestat {
                    match residency::cachestat(&fd) {
                        Ok(r) => return Some(r),
                        Err(e) if e.errno == Errno::NOSYS => *use_cachestat = false,
                        Err(_) => {}
                    }
                }
                residency::mincore_resident(&fd, o.size).ok()
            })
            .collect();
    }

    /// Pages held but not mapped, by all targets together (sorts `offsets`).
    pub fn totals(&mut self) -> HeldTotals {
        self.offsets.sort_unstable();
        let mapped = distinct_per_object(&self.offsets, self.list.len());
        let mut t = HeldTotals { objects: self.list.len() as u64, ..Default::default() };
        for (id, r) in self.residency.iter().enumerate() {
            match r {
                Some(r) => {
                    t.held += r.resident.saturating_sub(mapped[id]);
                    t.swapped += r.swapped;
                }
                None => t.unread += 1,
            }
        }
        t
    }

    /// Pages held but not mapped by target `target` alone, whose mapped pages are
    /// `offsets[from..to]` (sorts that slice).
    pub fn target_held(&mut self, target: usize, from: usize, to: usize) -> u64 {
        let own = &mut self.offsets[from..to];
        own.sort_unstable();
        let mapped = distinct_per_object(own, self.list.len());
        let mut ids: Vec<u32> = self.held_by.iter().filter(|(t, _)| *t == target).map(|&(_, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.iter()
            .filter_map(|&id| self.residency[id as usize].map(|r| r.resident.saturating_sub(mapped[id as usize])))
            .sum()
    }
}

/// Distinct page offsets per object in a sorted `offsets` slice.
fn distinct_per_object(sorted: &[u64], objects: usize) -> Vec<u64> {
    let mut counts = vec![0u64; objects];
    let mut last = None;
    for &v in sorted {
        if last != Some(v) {
            counts[(v >> OFFSET_BITS) as usize] += 1;
            last = Some(v);
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_offsets_count_once_per_object() {
        let mut v = vec![1 << OFFSET_BITS | 7, 5, 1 << OFFSET_BITS | 7, 5, 6];
        v.sort_unstable();
        assert_eq!(distinct_per_object(&v, 3), vec![2, 1, 0]);
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
