//! [`Region`]: an owned private read-write region a capability manages, and
//! [`Grant`]: the right to rewrite the pages of one span.

use super::{HostAddr, PageRange};
use crate::sys::grant;
use crate::Result;

/// Private anonymous read-write memory advm mapped itself and owns until drop: what
/// remap moves pages within, what a pager registers with userfaultfd, what a heap
/// lives in. Empty pages read as zeros.
#[derive(Debug)]
pub struct Region {
    map: grant::RwMapping,
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
        Grant(self.map.grant())
    }

    /// As [`Region::grant`], but operations check the memory with the kernel as they
    /// do for raw addresses (to measure what raw-address callers pay).
    pub fn grant_as_raw(&mut self) -> Grant<'_> {
        Grant(self.map.grant_as_raw())
    }
}

/// The right to rewrite the pages of one span of this process's address space, for
/// the lifetime `'a`. Every operation through it checks that it stays inside.
#[derive(Debug)]
pub struct Grant<'a>(pub(crate) grant::Grant<'a>);

impl Grant<'static> {
    /// A grant over raw addresses.
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
    pub unsafe fn from_raw(range: PageRange) -> Result<Self> {
        // SAFETY: the caller's promise above is the one `sys::grant::Grant::new` needs.
        Ok(Grant(unsafe { grant::Grant::new(range.start().0, range.len()) }?))
    }
}

impl Grant<'_> {
    /// The span this grant covers.
    pub fn range(&self) -> PageRange {
        PageRange::from_parts(HostAddr(self.0.start()), self.0.end() - self.0.start())
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
