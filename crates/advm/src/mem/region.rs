//! [`Region`]: an owned private read-write region a capability manages, and
//! [`Grant`]: the right to rewrite the pages of one span.

use super::{HostAddr, PageRange};
use crate::sys::mman::grant;
use crate::sys::procmap::{self, Vma};
use crate::Result;

/// Private anonymous read-write memory advm mapped itself and owns until drop: what
/// remap moves pages within, what a pager registers with userfaultfd, what a heap
/// lives in. Empty pages read as zeros.
#[derive(Debug)]
pub struct Region {
    pub(crate) map: grant::RwMapping,
}

impl Region {
    /// `len` bytes (a non-zero multiple of the page size) at a page-aligned address.
    pub fn new(len: usize) -> Result<Self> {
        Self::aligned(len, super::page_size(), false)
    }

    /// `len` bytes aligned to `align` (a power of two, at least the page size), with
    /// transparent huge pages requested when `huge` (`MADV_HUGEPAGE`).
    pub fn aligned(len: usize, align: usize, huge: bool) -> Result<Self> {
        Ok(Self { map: grant::RwMapping::new(len, align, huge)? })
    }

    /// The region's addresses.
    pub fn range(&self) -> PageRange {
        PageRange::from_parts(HostAddr(self.map.addr()), self.map.len())
    }

    /// First address.
    pub fn addr(&self) -> HostAddr {
        HostAddr(self.map.addr())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.bytes_mut()
    }

    /// The right to rewrite this region's pages, for as long as it is borrowed.
    pub fn grant(&mut self) -> Grant<'_> {
        Grant::wrap(self.map.grant())
    }

    /// As [`Region::grant`], but operations check the memory with the kernel as they
    /// do for raw addresses (to measure what raw-address callers pay).
    pub fn grant_as_raw(&mut self) -> Grant<'_> {
        Grant::wrap(self.map.grant_as_raw())
    }
}

/// The right to rewrite the pages of one span of this process's address space, for
/// the lifetime `'a`. Every operation through it checks that it stays inside.
#[derive(Debug)]
pub struct Grant<'a> {
    pub(crate) inner: grant::Grant<'a>,
    /// Mappings looked up through [`Grant::mapping_at`] and not changed since: an
    /// operation that checks its ranges reuses them instead of asking the kernel again.
    pub(crate) seen: Vec<Vma>,
}

/// One mapping (VMA) of this process, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingInfo {
    /// First address.
    pub start: HostAddr,
    /// One past the last address.
    pub end: HostAddr,
    /// Readable.
    pub readable: bool,
    /// Writable.
    pub writable: bool,
    /// `MAP_SHARED`: writes reach the backing and other sharers.
    pub shared: bool,
    /// Backed by a file (memfd, image, library); false for anonymous memory.
    pub file_backed: bool,
}

impl Grant<'static> {
    /// A grant over memory the caller owns (the C API's raw addresses).
    ///
    /// # Safety
    /// For as long as the grant is used, the caller must own the span: no Rust
    /// reference may point into it and no other thread may use it except to read it
    /// (page operations change which physical pages back the addresses). The parts an
    /// operation touches must be mapped read-write; advm checks that before it changes
    /// anything, but another thread could unmap memory in between. Memory that another
    /// advm capability manages (a virtual-copy arena's blocks) is not the caller's to
    /// grant: its pages belong to that capability's records.
    #[allow(unsafe_code)] // forwards the raw-address contract to the caller; no unsafe op here
    pub unsafe fn for_caller_memory(range: PageRange) -> Result<Self> {
        // SAFETY: the caller's promise above is the one `sys::mman::grant::Grant::new` needs.
        Ok(Grant::wrap(unsafe { grant::Grant::new(range.start().0, range.len()) }?))
    }
}

impl<'a> Grant<'a> {
    pub(crate) fn wrap(inner: grant::Grant<'a>) -> Self {
        Grant { inner, seen: Vec::new() }
    }

    /// The span this grant covers.
    pub fn range(&self) -> PageRange {
        PageRange::from_parts(HostAddr(self.inner.start()), self.inner.end() - self.inner.start())
    }

    /// The mapping that contains `addr` (`None` when unmapped), asked of the kernel
    /// once per mapping for as long as this grant makes no change.
    pub fn mapping_at(&mut self, addr: HostAddr) -> Result<Option<MappingInfo>> {
        let v = match self.seen.iter().find(|v| v.start <= addr.0 && addr.0 < v.end) {
            Some(v) => *v,
            None => match procmap::query(addr.0)? {
                Some(v) => {
                    self.seen.push(v);
                    v
                }
                None => return Ok(None),
            },
        };
        Ok(Some(MappingInfo {
            start: HostAddr(v.start),
            end: HostAddr(v.end),
            readable: v.readable,
            writable: v.writable,
            shared: v.shared,
            file_backed: v.file_backed,
        }))
    }

    /// Drops the pages of `ranges` (`MADV_DONTNEED`): afterwards they read as zeros.
    /// Returns the system calls made.
    pub fn discard(&mut self, ranges: &[PageRange]) -> Result<u32> {
        let r: Vec<_> = ranges.iter().map(|r| (r.start().0, r.len())).collect();
        self.seen.clear();
        Ok(self.inner.zap(&r)?)
    }

    /// Lets the kernel free the pages of `range` (private anonymous memory) when it
    /// needs memory (`MADV_FREE`), with no write to swap: until then they stay mapped
    /// and cost nothing to use again. Each page afterwards reads as its old bytes or
    /// as zeros, and a write to it cancels the free for that page (it keeps the write
    /// and its other old bytes). For contents the owner overwrites before it reads
    /// them (a collector's freed space); [`Grant::discard`] when zeros are needed.
    pub fn free_lazily(&mut self, range: PageRange) -> Result<()> {
        Ok(self.inner.free_lazily(range.start().0, range.len())?)
    }

    /// The kernel's bare move, for measuring what a move costs at least: one plain
    /// `mremap(MREMAP_MAYMOVE|MREMAP_FIXED)` of `[src, src+len)` to `[dst, dst+len)`,
    /// which leaves the source unmapped (a hole in the grant): map it again with
    /// [`Grant::map_fresh`] before using it.
    pub fn mremap_unmapping_source(&mut self, dst: HostAddr, src: HostAddr, len: usize) -> Result<()> {
        self.seen.clear();
        Ok(self.inner.mremap_unmapping_source(dst.0, src.0, len)?)
    }

    /// Maps fresh private anonymous read-write memory over `range` (its old contents
    /// are gone; it reads as zeros).
    pub fn map_fresh(&mut self, range: PageRange) -> Result<()> {
        self.seen.clear();
        Ok(self.inner.map_fresh(range.start().0, range.len())?)
    }
}

impl Region {
    /// Lets KSM merge this region's pages with identical ones (`MADV_MERGEABLE`).
    pub fn set_mergeable(&self, on: bool) -> Result<()> {
        Ok(self.map.set_mergeable(on)?)
    }

    /// Faults every page in, for writing (own zeroed pages) or reading.
    pub fn populate(&self, write: bool) -> Result<()> {
        Ok(self.map.populate(write)?)
    }
}
