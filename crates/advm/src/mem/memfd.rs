//! An owned memfd: sparse, shareable anonymous memory with a file's interface.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::sys::memfd;
use crate::sys::mman::reservation;
use crate::Result;

/// An anonymous file in memory, closed on drop. Its pages are memory charged to the
/// process's cgroup as shmem whether or not anybody maps them.
#[derive(Debug)]
pub struct Memfd {
    fd: OwnedFd,
}

impl Memfd {
    /// A new, empty, close-on-exec memfd; `name` shows in `/proc/PID/maps`.
    pub fn create(name: &str) -> Result<Self> {
        Ok(Self { fd: memfd::create(name)? })
    }

    /// Takes over a descriptor received from elsewhere (the image service's
    /// decompressed-cluster memfd).
    pub(crate) fn from_owned(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Sets the size (sparse: no pages are allocated).
    pub fn set_len(&self, len: u64) -> Result<()> {
        Ok(memfd::set_len(&self.fd, len)?)
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> Result<()> {
        while !buf.is_empty() {
            let n = memfd::pwrite(&self.fd, buf, offset)?;
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        Ok(memfd::pread(&self.fd, buf, offset)?)
    }

    /// Frees the pages of `[offset, offset+len)` without changing the size.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        Ok(memfd::punch_hole(&self.fd, offset, len)?)
    }

    /// Bytes of memory the file holds (allocated blocks), never faulting anything in.
    pub fn allocated_bytes(&self) -> Result<u64> {
        Ok(reservation::allocated_bytes(&self.fd)?)
    }
}

impl AsFd for Memfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<OwnedFd> for Memfd {
    /// Takes an fd the caller knows to be a memfd (or any shmem file).
    fn from(fd: OwnedFd) -> Self {
        Self { fd }
    }
}

impl From<Memfd> for OwnedFd {
    fn from(m: Memfd) -> Self {
        m.fd
    }
}
