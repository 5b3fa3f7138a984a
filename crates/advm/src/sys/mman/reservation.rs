//! An owned, reserved address range that an arena fills with file mappings.
//!
//! [`Reservation`] owns `[base, base+len)` for its whole life: every byte of it is
//! always mapped, either `PROT_NONE` (reserved, no memory) or read-write onto a file
//! (a memfd). Because it owns the range, replacing mappings inside it is safe *for
//! Rust memory*: nothing outside the owner holds Rust references into it, only raw
//! pointers whose dereference is the holder's own `unsafe` business (as with `malloc`
//! and `free`). Every method checks that its range lies inside the reservation and is
//! page aligned, and refuses (`EINVAL`) otherwise, so no call can touch memory the
//! reservation does not own.
//!
//! The byte-copying methods (`copy`, `fill`, `write`, `read`, `write_to_file`) are
//! memcpy: the owner must keep the bytes mapped read-write and must not let two
//! threads write the same bytes at once (the arena calls them under its lock).

use std::os::fd::{AsFd, BorrowedFd};

use crate::sys::mman::{self, Advice, Backing, Mapping, Prot, Share};
use crate::sys::{Errno, SysError, SysResult};

/// A reserved address range and the mappings placed inside it.
#[derive(Debug)]
pub struct Reservation {
    map: Mapping,
}

/// Writers of part of a [`Reservation`] wait while this lives
/// ([`Reservation::fence_writes`]); dropping it lets them go on.
#[derive(Debug)]
pub struct Fence<'a> {
    _fence: crate::sys::merge::WriteFence,
    _res: std::marker::PhantomData<&'a Reservation>,
}

impl Reservation {
    /// Reserves `len` bytes (page aligned, nonzero) of address space: one `PROT_NONE`,
    /// `MAP_NORESERVE` VMA that costs no memory.
    pub fn new(len: usize) -> SysResult<Self> {
        if len == 0 || len % crate::sys::page_size() != 0 {
            return Err(SysError::new("mmap(reserve)", Errno::INVAL));
        }
        Ok(Self { map: Mapping::reserve(len)? })
    }

    /// First address of the range.
    pub fn base(&self) -> usize {
        self.map.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The address of `[off, off+len)` when it lies inside and is page aligned.
    fn range(&self, call: &'static str, off: usize, len: usize) -> SysResult<*mut u8> {
        let ps = crate::sys::page_size();
        let inside = off.checked_add(len).is_some_and(|end| end <= self.len());
        if !inside || off % ps != 0 || len % ps != 0 || len == 0 {
            return Err(SysError::new(call, Errno::INVAL));
        }
        Ok(self.map.as_ptr().wrapping_add(off))
    }

    /// Maps `len` bytes of `fd` from `file_off` read-write at `off`, shared (writes reach
    /// the file) or private (writes copy the page), replacing what was mapped there.
    pub fn map_file(&self, off: usize, len: usize, share: Share, fd: BorrowedFd<'_>, file_off: u64) -> SysResult<()> {
        let addr = self.range("mmap(MAP_FIXED)", off, len)?;
        // SAFETY: the range is inside the reservation this value owns; holders of raw
        // pointers into it are told by the owner (the arena) that it is being replaced.
        unsafe { mman::map_fixed(addr, len, Prot::READ | Prot::WRITE, share, Backing::File { fd, offset: file_off }) }
    }

    /// Moves the page tables of `[from, from+len)` to `[to, to+len)` inside the
    /// reservation (`mremap` with `MREMAP_DONTUNMAP | MREMAP_FIXED`): `to` then maps what
    /// `from` mapped, with its pages present, and `from` keeps its mapping but empty
    /// (pages fault in again from the backing). No page is unmapped, and no moment
    /// leaves a hole another thread's `mmap` could take. Whole page tables move when
    /// both ranges are 2 MiB aligned.
    pub fn move_tables(&self, from: usize, to: usize, len: usize) -> SysResult<()> {
        let a = self.range("mremap(DONTUNMAP)", from, len)?;
        let b = self.range("mremap(DONTUNMAP)", to, len)?;
        if from < to + len && to < from + len {
            return Err(SysError::new("mremap(DONTUNMAP)", Errno::INVAL));
        }
        // SAFETY: both ranges lie inside the reservation and do not overlap; `to` is
        // replaced (the owner reserved it for this), `from` stays mapped.
        unsafe { mman::mremap_fixed(a, len, b, true) }
    }

    /// Drops the page-table entries of `[off, off+len)` (`MADV_DONTNEED`): file pages
    /// stay in their file, private copies are freed, the mapping stays. Runs under the
    /// kernel's shared mmap lock, so other threads' faults and mappings go on meanwhile.
    pub fn discard(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("madvise(DONTNEED)", off, len)?;
        // SAFETY: the range is the owner's; it holds nothing the owner still needs.
        unsafe { mman::madvise(addr, len, Advice::LinuxDontNeed) }
    }

    /// Lets the kernel free the private pages of `[off, off+len)` when it needs memory
    /// (`MADV_FREE`); a write before that cancels the free for its page.
    pub fn free_lazily(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("madvise(FREE)", off, len)?;
        // SAFETY: the range is the owner's; it holds nothing the owner still needs
        // (each page keeps its bytes or reads zeros).
        unsafe { mman::madvise(addr, len, Advice::LinuxFree) }
    }

    /// Maps zero-filled private anonymous memory read-write at `[off, off+len)`,
    /// replacing what was there (pages come as they are first touched).
    pub fn commit(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("mmap(MAP_FIXED)", off, len)?;
        // SAFETY: as in map_fixed above: the range is ours.
        unsafe { mman::map_fixed_rw_anonymous(addr, len) }
    }

    /// Returns `[off, off+len)` to the reserved state (`PROT_NONE`, no memory); any
    /// private copies of pages mapped there are freed.
    pub fn release(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("mmap(MAP_FIXED)", off, len)?;
        // SAFETY: as in map_fixed above: the range is ours.
        unsafe { mman::map_fixed(addr, len, Prot::empty(), Share::Private, Backing::Anonymous) }
    }

    /// Copies `len` bytes from `src_off` to `dst_off` inside the reservation (memmove
    /// semantics: the ranges may overlap). Offsets need not be page aligned.
    ///
    /// Both ranges must be mapped read-write by the owner; a byte still `PROT_NONE`
    /// faults (SIGSEGV) rather than corrupting anything.
    pub fn copy(&self, src_off: usize, dst_off: usize, len: usize) -> SysResult<()> {
        let fits = |o: usize| o.checked_add(len).is_some_and(|e| e <= self.len());
        if !fits(src_off) || !fits(dst_off) {
            return Err(SysError::new("memcpy", Errno::INVAL));
        }
        if len == 0 {
            return Ok(());
        }
        let base = self.map.as_ptr();
        // SAFETY: both ranges lie inside the reservation (checked above), which stays
        // mapped for the life of `self`; ptr::copy allows overlap.
        unsafe { std::ptr::copy(base.add(src_off), base.add(dst_off), len) };
        Ok(())
    }

    /// Fills `len` bytes at `off` with `byte` (offsets need not be aligned). Same
    /// mapping rule as [`Reservation::copy`].
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> SysResult<()> {
        if off.checked_add(len).map_or(true, |e| e > self.len()) {
            return Err(SysError::new("memset", Errno::INVAL));
        }
        // SAFETY: the range lies inside the reservation (checked), mapped by the owner.
        unsafe { std::ptr::write_bytes(self.map.as_ptr().add(off), byte, len) };
        Ok(())
    }

    /// Copies `data` to `off`. Same mapping rule as [`Reservation::copy`].
    pub fn write(&self, off: usize, data: &[u8]) -> SysResult<()> {
        if off.checked_add(data.len()).map_or(true, |e| e > self.len()) {
            return Err(SysError::new("memcpy", Errno::INVAL));
        }
        // SAFETY: the range lies inside the reservation (checked), mapped by the owner;
        // `data` is a Rust slice and cannot alias the reservation mutably.
        unsafe { std::ptr::copy(data.as_ptr(), self.map.as_ptr().add(off), data.len()) };
        Ok(())
    }

    /// Copies the bytes at `off` into `buf`. Same mapping rule as [`Reservation::copy`].
    pub fn read(&self, off: usize, buf: &mut [u8]) -> SysResult<()> {
        if off.checked_add(buf.len()).map_or(true, |e| e > self.len()) {
            return Err(SysError::new("memcpy", Errno::INVAL));
        }
        // SAFETY: the range lies inside the reservation (checked), mapped by the owner.
        unsafe { std::ptr::copy(self.map.as_ptr().add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Makes every thread that writes `[off, off+len)` wait until the returned fence is
    /// dropped (userfaultfd write protection, as a merge's fence), so the owner can read
    /// the bytes and replace their mappings while nobody changes them; a waiting write is
    /// retried, once the fence goes, against whatever is mapped then. The calling thread
    /// must not write the range while the fence lives: it would wait for ever.
    pub fn fence_writes(&self, off: usize, len: usize) -> SysResult<Fence<'_>> {
        let addr = self.range("userfaultfd(WP)", off, len)?;
        // SAFETY: the range lies inside the reservation, which keeps every byte of it
        // mapped (a memfd or PROT_NONE) for as long as it lives, and the fence borrows
        // the reservation; not writing it meanwhile is this method's documented rule
        // (breaking it hangs the thread, no memory is misused).
        let fence = unsafe { crate::sys::merge::WriteFence::new(addr as usize, len) }?;
        Ok(Fence { _fence: fence, _res: std::marker::PhantomData })
    }

    /// Writes the `len` bytes mapped at `off` into `fd` at `file_off` (`pwrite` loop):
    /// moves a private page's contents into a file page.
    pub fn write_to_file(&self, off: usize, len: usize, fd: BorrowedFd<'_>, file_off: u64) -> SysResult<()> {
        let addr = self.range("pwrite", off, len)?;
        // SAFETY: the range lies inside the reservation and is mapped by the owner; the
        // slice only lives for this call and is only read (by the kernel).
        let bytes = unsafe { std::slice::from_raw_parts(addr, len) };
        let mut done = 0;
        while done < len {
            match rustix::io::pwrite(fd, &bytes[done..], file_off + done as u64) {
                Ok(0) => return Err(SysError::new("pwrite", Errno::IO)),
                Ok(n) => done += n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(SysError::new("pwrite", e)),
            }
        }
        Ok(())
    }

    /// Breaks copy-on-write for every page of `[off, off+len)` in one call
    /// (`MADV_POPULATE_WRITE`): private pages get their own copy now instead of one
    /// fault per page later. Contents do not change.
    pub fn populate_write(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("madvise(POPULATE_WRITE)", off, len)?;
        // SAFETY: populating does not change what the pages read as.
        unsafe { mman::madvise(addr, len, Advice::LinuxPopulateWrite) }
    }

    /// Maps every page of `[off, off+len)` readable in one call (`MADV_POPULATE_READ`).
    pub fn populate_read(&self, off: usize, len: usize) -> SysResult<()> {
        let addr = self.range("madvise(POPULATE_READ)", off, len)?;
        // SAFETY: populating does not change what the pages read as.
        unsafe { mman::madvise(addr, len, Advice::LinuxPopulateRead) }
    }
}

/// Bytes of memory a file really holds (`st_blocks * 512`): for a memfd, its resident
/// (or swapped) pages.
pub fn allocated_bytes(fd: impl AsFd) -> SysResult<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| SysError::new("fstat", e))?;
    Ok(st.st_blocks as u64 * 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_ranges_outside_or_unaligned() {
        let ps = crate::sys::page_size();
        let r = Reservation::new(4 * ps).unwrap();
        let fd = crate::sys::memfd::create("t").unwrap();
        crate::sys::memfd::set_len(&fd, 4 * ps as u64).unwrap();
        assert_eq!(r.map_file(4 * ps, ps, Share::Shared, fd.as_fd(), 0).unwrap_err().errno, Errno::INVAL);
        assert_eq!(r.map_file(1, ps, Share::Shared, fd.as_fd(), 0).unwrap_err().errno, Errno::INVAL);
        assert_eq!(r.copy(0, 3 * ps + 1, ps).unwrap_err().errno, Errno::INVAL);
        r.map_file(0, 2 * ps, Share::Shared, fd.as_fd(), 0).unwrap();
        r.copy(0, ps, 16).unwrap();
        r.release(0, 2 * ps).unwrap();
    }
}
