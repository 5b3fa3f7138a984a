//! [`Assembly`]: a reservation filled with extents, then read.

use super::{Access, Extent, HostAddr, PageRange, Share};
use crate::sys::mman::assembly;
use crate::Result;

/// Address space assembled extent by extent (image layers, zeros, memfd pieces), then
/// read. It lends no slice: bytes are copied out, because a shared file under an
/// extent may change them at any time.
#[derive(Debug)]
pub struct Assembly {
    inner: assembly::Assembly,
}

impl Assembly {
    /// Reserves `len` bytes (page aligned, non-zero) of address space.
    pub fn reserve(len: usize) -> Result<Self> {
        Ok(Self { inner: assembly::Assembly::reserve(len)? })
    }

    /// Maps `extent` with `access` and `share`, replacing what was there. Offsets and
    /// lengths must be page aligned and inside.
    pub fn place(&mut self, extent: Extent<'_>, access: Access, share: Share) -> Result<()> {
        Ok(self.inner.place(extent.offset, extent.len, access.sys(), share.sys(), extent.backing.sys())?)
    }

    /// Extents placed so far (each one VMA at most).
    pub fn placed(&self) -> usize {
        self.inner.placed()
    }

    /// The assembly's addresses (for reports and `/proc/PID/maps`; not a pointer).
    pub fn range(&self) -> PageRange {
        PageRange::from_parts(HostAddr(self.inner.addr()), self.inner.len())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Faults `[offset, offset+len)` in for reading.
    pub fn populate_read(&self, offset: usize, len: usize) -> Result<()> {
        Ok(self.inner.populate_read(offset, len)?)
    }

    /// Copies `buf.len()` bytes at `offset` out.
    pub fn copy_out(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        Ok(self.inner.copy_out(offset, buf)?)
    }
}
