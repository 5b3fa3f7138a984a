//! memfd: anonymous, sparse, shareable files that back advm arenas.

use std::os::fd::{AsFd, OwnedFd};

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
