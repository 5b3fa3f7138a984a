//! memfd: anonymous, sparse, shareable files that back advm arenas.

use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};

use rustix::fs::{FallocateFlags, MemfdFlags};

use super::{SysError, SysResult};

/// Creates a close-on-exec memfd named `name` (the name shows in /proc/PID/maps).
pub fn create(name: &str) -> SysResult<OwnedFd> {
    rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC).map_err(|e| SysError::new("memfd_create", e))
}

/// Sets the size of a memfd (sparse: no pages are allocated).
pub fn set_len(fd: impl AsFd, len: u64) -> SysResult<()> {
    rustix::fs::ftruncate(fd, len).map_err(|e| SysError::new("ftruncate", e))
}

/// Frees the pages of `[offset, offset+len)` of a file without changing its size
/// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`); reads of the range then return zeros.
pub fn punch_hole(fd: impl AsFd, offset: u64, len: u64) -> SysResult<()> {
    rustix::fs::fallocate(fd, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len)
        .map_err(|e| SysError::new("fallocate(PUNCH_HOLE)", e))
}

/// Reads up to `buf.len()` bytes at `offset` of a file (one `pread`).
pub fn pread(fd: impl AsFd, buf: &mut [u8], offset: u64) -> SysResult<usize> {
    rustix::io::pread(fd, buf, offset).map_err(|e| SysError::new("pread", e))
}

/// Writes `buf` at `offset` of a file (one `pwrite`, may be short).
pub fn pwrite(fd: impl AsFd, buf: &[u8], offset: u64) -> SysResult<usize> {
    rustix::io::pwrite(fd, buf, offset).map_err(|e| SysError::new("pwrite", e))
}

/// A descriptor kept for the life of something long-lived (an arena's memfd), with the
/// identity (inode, device) of the file it named when it was made. A program may close
/// descriptors it did not open (a daemon closing every one above stderr, `closefrom`,
/// Python's `os.closerange`) and get the number back for a file of its own: using the
/// number then wrote into, punched or mapped the program's file (a Python program died
/// of SIGBUS in `advm.vcopy`). [`Held::get`] checks the identity first (one `fstat`)
/// and gives the descriptor only while it still names its file; dropping a `Held`
/// whose number is someone else's now forgets the number instead of closing it.
#[derive(Debug)]
pub struct Held {
    fd: Option<OwnedFd>,
    id: (u64, u64),
}

impl Held {
    /// Keeps `fd`, remembering the file it names now.
    pub fn new(fd: OwnedFd) -> SysResult<Self> {
        Ok(Self { id: super::merge::file_id(fd.as_fd())?, fd: Some(fd) })
    }

    /// The descriptor, or an `EBADF` error naming `what` when the program closed it
    /// (the number may name another file now: it is never used again).
    pub fn get(&self, what: &'static str) -> SysResult<BorrowedFd<'_>> {
        match &self.fd {
            Some(fd) if super::merge::file_id(fd.as_fd()).is_ok_and(|id| id == self.id) => Ok(fd.as_fd()),
            _ => Err(SysError::new(what, rustix::io::Errno::BADF)),
        }
    }

    /// Whether the descriptor still names its file.
    pub fn intact(&self) -> bool {
        self.get("fstat").is_ok()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.intact() {
            // the number is the program's now (or closed): never close it
            let _forgotten = self.fd.take().map(IntoRawFd::into_raw_fd);
        }
    }
}
