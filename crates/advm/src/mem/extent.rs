//! What a piece of address space maps, and how.

use std::os::fd::{AsFd, BorrowedFd};

use super::Memfd;
use crate::sys::mman;

/// Whether writes through a mapping reach its backing (and other sharers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Share {
    /// Writes copy the page and stay in this mapping (`MAP_PRIVATE`).
    Private,
    /// Writes go to the backing, visible to every sharer (`MAP_SHARED`).
    Shared,
}

/// What a mapping lets its owner do with the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Reserved: any access faults.
    None,
    /// Reads only.
    Read,
    /// Reads and writes.
    ReadWrite,
}

/// The backing of an extent.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Backing<'a> {
    /// Zero-filled anonymous memory (private; writable or not as the access says).
    Anonymous,
    /// A memfd from a page-aligned byte offset.
    Memfd {
        /// The memfd.
        memfd: &'a Memfd,
        /// Byte offset into it, page aligned.
        offset: u64,
    },
    /// Any other file (an image layer, ...) from a page-aligned byte offset.
    File {
        /// The open file.
        fd: BorrowedFd<'a>,
        /// Byte offset into it, page aligned.
        offset: u64,
    },
}

/// `len` bytes at byte `offset` of an assembly or reservation, and what they map.
#[derive(Debug, Clone, Copy)]
pub struct Extent<'a> {
    /// Where the extent starts, from the start of its container (page aligned).
    pub offset: usize,
    /// Length in bytes (page aligned, non-zero).
    pub len: usize,
    /// What the bytes are.
    pub backing: Backing<'a>,
}

impl Share {
    pub(crate) fn sys(self) -> mman::Share {
        match self {
            Share::Private => mman::Share::Private,
            Share::Shared => mman::Share::Shared,
        }
    }
}

impl Access {
    pub(crate) fn sys(self) -> mman::Prot {
        match self {
            Access::None => mman::Prot::empty(),
            Access::Read => mman::Prot::READ,
            Access::ReadWrite => mman::Prot::READ | mman::Prot::WRITE,
        }
    }
}

impl<'a> Backing<'a> {
    pub(crate) fn sys(self) -> mman::Backing<'a> {
        match self {
            Backing::Anonymous => mman::Backing::Anonymous,
            Backing::Memfd { memfd, offset } => mman::Backing::File { fd: memfd.as_fd(), offset },
            Backing::File { fd, offset } => mman::Backing::File { fd, offset },
        }
    }
}
