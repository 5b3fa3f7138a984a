//! mmap, munmap, mremap, madvise, mprotect.
//!
//! [`Mapping`] owns a mapping and unmaps it on drop. Calls that change memory the
//! caller may still reference (`MAP_FIXED`, `munmap`, `mremap`, `madvise(DONTNEED)`)
//! are `unsafe fn`s; [`map_fixed`] is the one audited door for `MAP_FIXED`.

pub mod assembly;
pub mod grant;
pub mod reservation;

use std::ffi::c_void;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

pub use rustix::mm::{Advice, ProtFlags as Prot};
use rustix::mm::{MapFlags, MremapFlags};

use super::{SysError, SysResult};

/// Whether writes through a mapping reach its backing (and other sharers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// `MAP_PRIVATE`: writes copy the page (copy-on-write) and stay in this mapping.
    Private,
    /// `MAP_SHARED`: writes go to the backing, visible to every sharer.
    Shared,
}

/// What a mapping maps.
#[derive(Debug, Clone, Copy)]
pub enum Backing<'fd> {
    /// Zero-filled anonymous memory.
    Anonymous,
    /// `len` bytes of a file from `offset` (page aligned).
    File {
        /// The file (memfd, image layer, ...).
        fd: BorrowedFd<'fd>,
        /// Byte offset into the file, page aligned.
        offset: u64,
    },
}

fn map_flags(share: Share) -> MapFlags {
    match share {
        Share::Private => MapFlags::PRIVATE,
        Share::Shared => MapFlags::SHARED,
    }
}

/// An owned mapping of `len` bytes, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an owned address range; moving the owner between threads
// does not touch the memory.
unsafe impl Send for Mapping {}
// SAFETY: &Mapping only hands out the address; access through it is the caller's
// unsafe business.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `backing` at an address the kernel picks.
    pub fn new(len: usize, prot: Prot, share: Share, backing: Backing<'_>) -> SysResult<Self> {
        if len == 0 {
            return Err(SysError::new("mmap", rustix::io::Errno::INVAL));
        }
        // SAFETY: with a null hint and no MAP_FIXED the kernel picks a free range, so
        // no existing memory is replaced.
        let ptr = unsafe {
            match backing {
                Backing::Anonymous => rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, prot, map_flags(share)),
                Backing::File { fd, offset } => {
                    rustix::mm::mmap(std::ptr::null_mut(), len, prot, map_flags(share), fd, offset)
                }
            }
        }
        .map_err(|e| SysError::new("mmap", e))?;
        Ok(Self { ptr: NonNull::new(ptr.cast()).expect("mmap returned NULL"), len })
    }

    /// Maps `len` bytes of private anonymous read-write memory.
    pub fn anonymous(len: usize) -> SysResult<Self> {
        Self::new(len, Prot::READ | Prot::WRITE, Share::Private, Backing::Anonymous)
    }

    /// Reserves `len` bytes of address space (`PROT_NONE`, `MAP_NORESERVE`): no memory,
    /// one VMA, a place to put [`map_fixed`] mappings.
    pub fn reserve(len: usize) -> SysResult<Self> {
        // SAFETY: no MAP_FIXED, the kernel picks a free range.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                Prot::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| SysError::new("mmap(reserve)", e))?;
        Ok(Self { ptr: NonNull::new(ptr.cast()).expect("mmap returned NULL"), len })
    }

    /// Takes ownership of an existing mapping.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be a mapping nobody else will unmap.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Self {
        Self { ptr, len }
    }

    /// Gives up ownership: the range is no longer unmapped on drop.
    pub fn into_raw(self) -> (NonNull<u8>, usize) {
        let parts = (self.ptr, self.len);
        std::mem::forget(self);
        parts
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start address as an integer.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Faults every page of the mapping in (`MADV_POPULATE_READ`/`WRITE`, Linux 5.14+).
    /// Contents do not change: a write populate of anonymous memory allocates zeroed
    /// pages instead of mapping the shared zero page.
    pub fn populate(&self, write: bool) -> SysResult<()> {
        let advice = if write { Advice::LinuxPopulateWrite } else { Advice::LinuxPopulateRead };
        // SAFETY: populating faults pages in without changing what they read as.
        unsafe { madvise(self.as_ptr(), self.len, advice) }
    }

    /// The mapping's bytes.
    ///
    /// # Safety
    /// The range must be readable, and nothing may write it while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees readability and no concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapping's bytes, writable.
    ///
    /// # Safety
    /// The range must be writable, and nothing else may access it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the caller guarantees writability and exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the range; nobody may use it after the owner is dropped.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Maps `backing` over `[addr, addr+len)`, replacing whatever was there (`MAP_FIXED`).
///
/// # Safety
/// The range must belong to the caller (e.g. inside its own [`Mapping::reserve`]), and
/// no live reference may point into it: its old contents are gone.
pub unsafe fn map_fixed(addr: *mut u8, len: usize, prot: Prot, share: Share, backing: Backing<'_>) -> SysResult<()> {
    let flags = map_flags(share) | MapFlags::FIXED;
    // SAFETY: the caller owns the range and holds no references into it.
    let r = unsafe {
        match backing {
            Backing::Anonymous => rustix::mm::mmap_anonymous(addr.cast(), len, prot, flags),
            Backing::File { fd, offset } => rustix::mm::mmap(addr.cast(), len, prot, flags, fd, offset),
        }
    };
    r.map(|_| ()).map_err(|e| SysError::new("mmap(MAP_FIXED)", e))
}

/// Maps fresh private anonymous memory read-write over `[addr, addr+len)`, in pieces
/// of at most a GiB. Pages are charged when touched, but in the kernel's default
/// overcommit mode one mmap larger than RAM + swap is refused outright as an "obvious
/// overcommit" (a heap's spaces, mapped whole up front, made a 12 GiB heap fail on a
/// 24 GiB machine); the pieces pass, and merge into one VMA.
///
/// # Safety
/// As [`map_fixed`].
pub unsafe fn map_fixed_rw_anonymous(addr: *mut u8, len: usize) -> SysResult<()> {
    const PIECE: usize = 1 << 30;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PIECE);
        // SAFETY: forwarded caller guarantee, for a part of the range.
        unsafe { map_fixed(addr.add(off), n, Prot::READ | Prot::WRITE, Share::Private, Backing::Anonymous) }?;
        off += n;
    }
    Ok(())
}

/// Unmaps `[addr, addr+len)`.
///
/// # Safety
/// The range must belong to the caller and no live reference may point into it.
pub unsafe fn munmap(addr: *mut u8, len: usize) -> SysResult<()> {
    // SAFETY: forwarded caller guarantee.
    unsafe { rustix::mm::munmap(addr.cast(), len) }.map_err(|e| SysError::new("munmap", e))
}

/// Moves the pages of `[old, old+len)` to `[new, new+len)` (`MREMAP_MAYMOVE|MREMAP_FIXED`),
/// replacing any mapping at `new`. With `dont_unmap` the old range stays mapped and
/// reads as empty (anonymous: zero pages; `MREMAP_DONTUNMAP`).
///
/// # Safety
/// Both ranges must belong to the caller, must not overlap, and no live reference may
/// point into either.
pub unsafe fn mremap_fixed(old: *mut u8, len: usize, new: *mut u8, dont_unmap: bool) -> SysResult<()> {
    let mut flags = MremapFlags::MAYMOVE;
    if dont_unmap {
        flags |= MremapFlags::DONTUNMAP;
    }
    // SAFETY: forwarded caller guarantee.
    unsafe { rustix::mm::mremap_fixed(old.cast(), len, len, flags, new.cast()) }
        .map(|_| ())
        .map_err(|e| SysError::new("mremap", e))
}

/// Moves `[old, old+len)` to a range the kernel picks, leaving the old range mapped
/// and empty (`MREMAP_MAYMOVE|MREMAP_DONTUNMAP`). Returns the new address.
///
/// # Safety
/// The range must belong to the caller; its contents move away.
pub unsafe fn mremap_dontunmap(old: *mut u8, len: usize) -> SysResult<*mut u8> {
    // SAFETY: forwarded caller guarantee.
    unsafe { rustix::mm::mremap(old.cast(), len, len, MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP) }
        .map(|p: *mut c_void| p.cast())
        .map_err(|e| SysError::new("mremap(DONTUNMAP)", e))
}

/// Whether the page at `addr` (page aligned, mapped) is resident (`mincore`).
pub fn page_resident(addr: *const u8) -> SysResult<bool> {
    let mut v = 0u8;
    // SAFETY: mincore only reads page tables and writes one byte into `v`, which is
    // live for the call.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, super::page_size(), &mut v) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(SysError::new("mincore", super::Errno::from_io_error(&e).unwrap_or(super::Errno::IO)));
    }
    Ok(v & 1 != 0)
}

/// Gives the kernel advice about `[addr, addr+len)`.
///
/// # Safety
/// Some advice drops contents (`LinuxDontNeed`, `LinuxFree`, `LinuxRemove`): the range
/// must belong to the caller and hold nothing it still needs.
pub unsafe fn madvise(addr: *mut u8, len: usize, advice: Advice) -> SysResult<()> {
    // SAFETY: forwarded caller guarantee.
    unsafe { rustix::mm::madvise(addr.cast(), len, advice) }.map_err(|e| SysError::new("madvise", e))
}

/// Whether `mremap(MREMAP_MAYMOVE|MREMAP_DONTUNMAP)` to an address the kernel picks
/// works here (Linux 5.7+, any mapping since 5.13). Some kernels (6.18 here) refuse this
/// form with EINVAL yet accept it with `MREMAP_FIXED`: see [`dontunmap_fixed_available`].
pub fn dontunmap_available() -> SysResult<()> {
    let m = Mapping::anonymous(super::page_size())?;
    // SAFETY: the mapping is ours and unused; the moved-to range is unmapped right away.
    unsafe {
        let new = mremap_dontunmap(m.as_ptr(), m.len())?;
        munmap(new, m.len())
    }
}

/// Whether `mremap(MREMAP_MAYMOVE|MREMAP_FIXED|MREMAP_DONTUNMAP)` works here, probed
/// once on two pages of our own.
pub fn dontunmap_fixed_available() -> bool {
    // Probing twice is harmless: two pages of our own, unmapped after.
    static OK: crate::sys::lazy::Lazy<bool> = crate::sys::lazy::Lazy::new();
    *OK.get_or_init(|| {
        let ps = super::page_size();
        let (Ok(a), Ok(b)) = (Mapping::anonymous(ps), Mapping::anonymous(ps)) else { return false };
        // SAFETY: both one-page mappings are ours and unused; b is replaced by a's
        // (empty) page and a stays mapped.
        unsafe { mremap_fixed(a.as_ptr(), ps, b.as_ptr(), true) }.is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_length_is_einval() {
        let e = Mapping::anonymous(0).unwrap_err();
        assert_eq!(e.errno, rustix::io::Errno::INVAL);
        assert!(e.to_string().starts_with("mmap: Invalid argument"), "{e}");
    }

    #[test]
    fn mremap_moves_contents_and_dontunmap_leaves_zeros() {
        let ps = super::super::page_size();
        let a = Mapping::anonymous(ps).unwrap();
        let b = Mapping::anonymous(ps).unwrap();
        // SAFETY: test owns both mappings exclusively.
        unsafe {
            a.as_mut_slice()[..4].copy_from_slice(b"advm");
            mremap_fixed(a.as_ptr(), ps, b.as_ptr(), true).unwrap();
            assert_eq!(&b.as_slice()[..4], b"advm");
            assert_eq!(&a.as_slice()[..4], &[0, 0, 0, 0]);
        }
    }
}
