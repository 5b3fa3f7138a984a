//! A client's map of its domain's store: the store's own memfd mapped read-only, with
//! the files the store adopted shown over it at their slots as the daemon announces
//! them, and where to map each slot's page from.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::store::{Piece, SegmentMap};
use crate::mem::page_size;
use crate::sys::merge::{self as sys, StoreMap};
use crate::{Error, Result};

/// The store as one client sees it. The daemon announces an adopted file together
/// with the first slots it hands this session in it, and a session holds every slot
/// it was handed until it ends or a trim lets it go; a trim that lets go of the
/// session's last page of a file says so, and the file is no longer shown (the store
/// may let it go and reuse its slots), so a file shown here is the store's.
#[derive(Debug)]
pub struct StoreView {
    map: StoreMap,
    own: OwnedFd,
    /// Inodes of the store's files: ranges mapping them were merged before.
    inodes: Vec<u64>,
    /// Adopted files' pieces by first slot.
    pieces: BTreeMap<u32, (Piece, Arc<OwnedFd>)>,
}

impl StoreView {
    /// Maps the store's own memfd `store` (read-only, `len` bytes).
    pub fn new(store: OwnedFd, len: usize) -> Result<Self> {
        let map = StoreMap::new(store.as_fd(), len)?;
        let inodes = vec![sys::file_id(store.as_fd())?.0];
        Ok(Self { map, own: store, inodes, pieces: BTreeMap::new() })
    }

    /// Shows adopted files at the slots the daemon says they lie at.
    pub fn show(&mut self, segments: Vec<SegmentMap>) -> Result<()> {
        let ps = page_size();
        let slots = self.slots();
        for seg in segments {
            let file = Arc::new(seg.file);
            for p in seg.pieces {
                if p.pages == 0 || !p.slot.checked_add(p.pages).is_some_and(|e| e <= slots) {
                    return Err(Error::InvalidArgument {
                        what: "advmd reply",
                        why: format!("an adopted file's piece {p:?} lies outside the store's {slots} slots"),
                    });
                }
                self.map.map_over(
                    p.slot as usize * ps,
                    p.pages as usize * ps,
                    file.as_fd(),
                    p.page as u64 * ps as u64,
                )?;
                self.pieces.insert(p.slot, (p, file.clone()));
            }
            let ino = sys::file_id(file.as_fd())?.0;
            if !self.inodes.contains(&ino) {
                self.inodes.push(ino);
            }
        }
        Ok(())
    }

    /// Stops showing the adopted files' `pieces` (a trim let go of the session's last
    /// page in each file): the store's own memfd shows at their slots again, as in the
    /// store once it lets such a file go, and a file no piece is left of is closed.
    pub fn forget(&mut self, pieces: &[Piece]) -> Result<()> {
        let ps = page_size();
        for p in pieces {
            if !self.pieces.get(&p.slot).is_some_and(|(mine, _)| mine == p) {
                return Err(Error::InvalidArgument {
                    what: "advmd reply",
                    why: format!("a trim forgets the piece {p:?}, which this client does not show"),
                });
            }
            let (at, len) = (p.slot as usize * ps, p.pages as usize * ps);
            self.map.map_over(at, len, self.own.as_fd(), at as u64)?;
            self.pieces.remove(&p.slot);
        }
        let own = self.inodes[0];
        let mut shown = vec![own];
        for (_, file) in self.pieces.values() {
            let ino = sys::file_id(file.as_fd())?.0;
            if !shown.contains(&ino) {
                shown.push(ino);
            }
        }
        self.inodes = shown;
        Ok(())
    }

    /// Slots the store has room for (its own memfd's pages).
    pub fn slots(&self) -> u32 {
        (self.map.len() / page_size()) as u32
    }

    /// The bytes of `slot`, `None` past the store's end.
    pub fn page(&self, slot: u32) -> Option<&[u8]> {
        let ps = page_size();
        (slot < self.slots()).then(|| self.map.read(slot as usize * ps, ps))
    }

    /// The store's own memfd, read-only.
    pub fn store_fd(&self) -> BorrowedFd<'_> {
        self.own.as_fd()
    }

    /// Whether a file with this inode is one of the store's.
    pub fn holds_inode(&self, inode: u64) -> bool {
        self.inodes.contains(&inode)
    }

    /// The inodes of the store's files: its own memfd and the adopted files shown it.
    pub fn inodes(&self) -> &[u64] {
        &self.inodes
    }

    pub(crate) fn map(&self) -> &StoreMap {
        &self.map
    }

    /// Where slot `s`'s page maps from: an adopted file's page, or the own memfd's.
    pub(crate) fn locate(&self, s: u32) -> Option<(BorrowedFd<'_>, u64, u32)> {
        let ps = page_size() as u64;
        if s >= self.slots() {
            return None;
        }
        if let Some((p, file)) = self.pieces.range(..=s).next_back().map(|(_, v)| v) {
            if s < p.slot + p.pages {
                return Some((file.as_fd(), (p.page + s - p.slot) as u64 * ps, p.slot + p.pages - s));
            }
        }
        let next = self.pieces.range(s..).next().map_or(self.slots(), |(&k, _)| k);
        Some((self.own.as_fd(), s as u64 * ps, next - s))
    }
}
