//! A reserved address range assembled piece by piece with `MAP_FIXED`, then handed out
//! read-only.
//!
//! [`Assembly`] owns its whole range from the start (one `PROT_NONE` reservation), so
//! every `MAP_FIXED` it issues lands inside memory nobody else references: that is what
//! makes [`Assembly::place`] safe. Nothing hands out a pointer into the range until the
//! caller asks for one, and [`Assembly::copy_out`] copies bytes out instead of lending a
//! slice that another process could change through a shared file.

use crate::sys::mman::{self, Backing, Mapping, Prot, Share};
use crate::sys::{SysError, SysResult};

/// A reservation being filled with mappings; unmapped as a whole on drop.
#[derive(Debug)]
pub struct Assembly {
    range: Mapping,
    placed: usize,
}

impl Assembly {
    /// Reserves `len` bytes (page aligned, non-zero) of address space.
    pub fn reserve(len: usize) -> SysResult<Self> {
        if len == 0 || len % crate::sys::page_size() != 0 {
            return Err(SysError::new("mmap(reserve)", rustix::io::Errno::INVAL));
        }
        Ok(Self { range: Mapping::reserve(len)?, placed: 0 })
    }

    /// Maps `backing` over `[offset, offset+len)` of the reservation (`MAP_FIXED`),
    /// replacing what was there. Offsets and lengths must be page aligned and inside
    /// the reservation (`EINVAL` otherwise, before any call).
    pub fn place(
        &mut self,
        offset: usize,
        len: usize,
        prot: Prot,
        share: Share,
        backing: Backing<'_>,
    ) -> SysResult<()> {
        let ps = crate::sys::page_size();
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.range.len());
        if len == 0 || offset % ps != 0 || len % ps != 0 || !inside {
            return Err(SysError::new("mmap(MAP_FIXED)", rustix::io::Errno::INVAL));
        }
        // SAFETY: the range lies inside our own reservation (checked above), and no
        // reference into it has been handed out (only `copy_out` and `addr` exist, and
        // neither lends memory), so replacing its contents cannot invalidate anything.
        unsafe { mman::map_fixed(self.range.as_ptr().add(offset), len, prot, share, backing) }?;
        self.placed += 1;
        Ok(())
    }

    /// Number of `place` calls that succeeded.
    pub fn placed(&self) -> usize {
        self.placed
    }

    /// Start address (for reports and `/proc/PID/maps` lookups; not for dereferencing).
    pub fn addr(&self) -> usize {
        self.range.addr()
    }

    /// Length of the whole range.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Always false: the reservation is never empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Faults in `[offset, offset+len)` for reading (`MADV_POPULATE_READ`).
    pub fn populate_read(&self, offset: usize, len: usize) -> SysResult<()> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.range.len());
        if !inside {
            return Err(SysError::new("madvise", rustix::io::Errno::INVAL));
        }
        // SAFETY: populating faults pages in without changing what they read as; the
        // range is ours (checked above).
        unsafe { mman::madvise(self.range.as_ptr().add(offset), len, mman::Advice::LinuxPopulateRead) }
    }

    /// Copies `buf.len()` bytes starting at `offset` out of the range. Every byte must
    /// lie in a readable piece (`EFAULT`-like `EINVAL` when outside the range).
    ///
    /// A piece mapped from a file reads what the file holds; if the file was truncated
    /// below the piece the kernel raises SIGBUS, as for any file mapping: the caller
    /// must make sure it was not (`advm::image::ImageSpace::read` checks sizes and
    /// holds a read lease first).
    pub fn copy_out(&self, offset: usize, buf: &mut [u8]) -> SysResult<()> {
        let inside = offset.checked_add(buf.len()).is_some_and(|end| end <= self.range.len());
        if !inside {
            return Err(SysError::new("copy_out", rustix::io::Errno::INVAL));
        }
        // SAFETY: the source lies inside our reservation (checked above); the caller
        // placed readable mappings over it; `buf` is a distinct, exclusively borrowed
        // buffer. Bytes copied are plain `u8`, so a concurrent change through a shared
        // file can only give torn contents, never an invalid value.
        unsafe { std::ptr::copy_nonoverlapping(self.range.as_ptr().add(offset), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
}
