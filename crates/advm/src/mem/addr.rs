//! Shared notions every capability plans with: page size, host addresses, page ranges.
//!
//! Arithmetic is checked: a range that would wrap the address space is an error, not
//! a silently wrong plan.

use std::fmt;

use crate::{Error, Result};

/// The base page size of this machine.
pub fn page_size() -> usize {
    crate::sys::page_size()
}

/// True when `x` is a multiple of the page size.
pub fn is_page_aligned(x: usize) -> bool {
    x % page_size() == 0
}

/// `x` rounded up to the page size, or `None` on overflow.
pub fn page_align_up(x: usize) -> Option<usize> {
    let ps = page_size();
    x.checked_add(ps - 1).map(|v| v & !(ps - 1))
}

/// A virtual address in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct HostAddr(pub usize);

impl HostAddr {
    /// The address of a pointer.
    pub fn of<T>(p: *const T) -> Self {
        Self(p as usize)
    }
    /// `self + off`, or `None` on overflow.
    pub fn checked_add(self, off: usize) -> Option<Self> {
        self.0.checked_add(off).map(Self)
    }
    /// As a pointer.
    pub fn as_ptr(self) -> *mut u8 {
        self.0 as *mut u8
    }
}

/// `addr + offset`, for computing addresses inside a range the caller holds (overflow
/// is a bug there, as for any `usize` sum; use [`HostAddr::checked_add`] on input).
impl std::ops::Add<usize> for HostAddr {
    type Output = HostAddr;
    fn add(self, off: usize) -> HostAddr {
        HostAddr(self.0 + off)
    }
}

impl fmt::Display for HostAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A page-aligned, non-wrapping range of host addresses `[start, start+len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct PageRange {
    start: HostAddr,
    len: usize,
}

impl PageRange {
    /// Checks alignment and overflow; `what` names the argument in the error.
    pub fn new(what: &'static str, start: usize, len: usize) -> Result<Self> {
        let ps = page_size();
        if start % ps != 0 {
            return Err(Error::InvalidArgument {
                what,
                why: format!("address {start:#x} is not aligned to the {ps}-byte page size"),
            });
        }
        if len % ps != 0 {
            return Err(Error::InvalidArgument {
                what,
                why: format!("length {len} is not a multiple of the {ps}-byte page size"),
            });
        }
        if start.checked_add(len).is_none() {
            return Err(Error::InvalidArgument {
                what,
                why: format!("range {start:#x}+{len} wraps the address space"),
            });
        }
        Ok(Self { start: HostAddr(start), len })
    }
    /// A range the caller knows to be page aligned and non-wrapping (it came from the
    /// kernel or from another range).
    pub(crate) fn from_parts(start: HostAddr, len: usize) -> Self {
        debug_assert!(start.0 % page_size() == 0 && len % page_size() == 0 && start.0.checked_add(len).is_some());
        Self { start, len }
    }

    /// First address.
    pub fn start(&self) -> HostAddr {
        self.start
    }
    /// One past the last address.
    pub fn end(&self) -> HostAddr {
        HostAddr(self.start.0 + self.len)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.len / page_size()
    }
    /// True when the two ranges share an address.
    pub fn overlaps(&self, other: &PageRange) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_range_checks_alignment_and_overflow() {
        let ps = page_size();
        assert!(PageRange::new("src", ps, 2 * ps).is_ok());
        let e = PageRange::new("src", 1, ps).unwrap_err().to_string();
        assert_eq!(e, format!("invalid src: address 0x1 is not aligned to the {ps}-byte page size"));
        assert!(PageRange::new("dst", 0, 3).is_err());
        assert!(PageRange::new("dst", usize::MAX - ps + 1, 2 * ps).is_err());
    }

    #[test]
    fn overlap() {
        let ps = page_size();
        let a = PageRange::new("a", 0, 2 * ps).unwrap();
        let b = PageRange::new("b", ps, 2 * ps).unwrap();
        let c = PageRange::new("c", 2 * ps, ps).unwrap();
        assert!(a.overlaps(&b) && !a.overlaps(&c));
        assert_eq!(page_align_up(1), Some(ps));
        assert_eq!(page_align_up(usize::MAX), None);
    }
}
