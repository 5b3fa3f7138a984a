//! [`Reservation`]: address space reserved as a whole and filled by its owner.

use super::{Backing, HostAddr, PageRange, Share};
use crate::sys::mman::reservation;
use crate::Result;

/// A reserved range that is always mapped: `PROT_NONE` (no memory) where nothing is
/// placed, read-write mappings where its owner placed them. Offsets are from the
/// start; every call checks that its range lies inside and is page aligned, so no
/// call reaches memory the reservation does not own. Byte operations (`copy`, `fill`,
/// `write`, `read`) need their bytes mapped read-write; the owner serialises writers.
#[derive(Debug)]
pub struct Reservation {
    inner: reservation::Reservation,
}

impl Reservation {
    /// Reserves `len` bytes (page aligned, non-zero): one VMA, no memory.
    pub fn new(len: usize) -> Result<Self> {
        Ok(Self { inner: reservation::Reservation::new(len)? })
    }

    /// The reserved addresses.
    pub fn range(&self) -> PageRange {
        PageRange::from_parts(HostAddr(self.inner.base()), self.inner.len())
    }

    /// First address.
    pub fn base(&self) -> HostAddr {
        HostAddr(self.inner.base())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Maps `len` bytes of a file or memfd read-write at `off`, replacing what was
    /// there. Anonymous memory is [`Reservation::commit`]'s job.
    pub fn map(&self, off: usize, len: usize, share: Share, backing: Backing<'_>) -> Result<()> {
        match backing.sys() {
            crate::sys::mman::Backing::File { fd, offset } => {
                Ok(self.inner.map_file(off, len, share.sys(), fd, offset)?)
            }
            crate::sys::mman::Backing::Anonymous => Err(crate::Error::InvalidArgument {
                what: "backing",
                why: "a reservation maps files; use commit() for anonymous memory, release() for empty space".into(),
            }),
        }
    }

    /// Moves the page tables of `[from, from+len)` to `to` (disjoint, inside): `to`
    /// maps what `from` mapped with its pages present; `from` stays mapped, empty.
    pub fn move_tables(&self, from: usize, to: usize, len: usize) -> Result<()> {
        Ok(self.inner.move_tables(from, to, len)?)
    }

    /// Drops the page-table entries of a range (file pages stay in their file).
    pub fn discard(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.discard(off, len)?)
    }

    /// Lets the kernel free the committed pages of a range when it needs memory, as
    /// [`crate::mem::Grant::free_lazily`] (`MADV_FREE`).
    pub fn free_lazily(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.free_lazily(off, len)?)
    }

    /// Maps zero-filled private anonymous memory read-write over a range, replacing
    /// what was there: space its owner will write, with memory only where it does.
    pub fn commit(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.commit(off, len)?)
    }

    /// Returns a range to the reserved state (no memory).
    pub fn release(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.release(off, len)?)
    }

    /// memmove inside the reservation (offsets need not be aligned).
    pub fn copy(&self, src_off: usize, dst_off: usize, len: usize) -> Result<()> {
        Ok(self.inner.copy(src_off, dst_off, len)?)
    }

    /// memset inside the reservation.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<()> {
        Ok(self.inner.fill(off, len, byte)?)
    }

    /// Copies `data` to `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        Ok(self.inner.write(off, data)?)
    }

    /// Copies the bytes at `off` into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        Ok(self.inner.read(off, buf)?)
    }

    /// Faults every page of a range in for writing (breaks copy-on-write now).
    pub fn populate_write(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.populate_write(off, len)?)
    }

    /// Faults every page of a range in for reading.
    pub fn populate_read(&self, off: usize, len: usize) -> Result<()> {
        Ok(self.inner.populate_read(off, len)?)
    }
}
