//! Files: where a sparse file holds data (`lseek(SEEK_DATA / SEEK_HOLE)`, here), opening
//! untrusted layer files with read leases (`layer`), which pages of a file are in
//! memory (`residency`), and another process's files through `/proc/PID` (`procfd`).

pub mod layer;
pub mod procfd;
pub mod residency;

use std::os::fd::AsFd;

use rustix::fs::SeekFrom;

use super::{SysError, SysResult};

/// The first offset at or after `from` that holds data, or `None` when only a hole
/// follows up to the end of the file (`ENXIO`).
pub fn next_data(fd: impl AsFd, from: u64) -> SysResult<Option<u64>> {
    match rustix::fs::seek(fd, SeekFrom::Data(from)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(SysError::new("lseek(SEEK_DATA)", e)),
    }
}

/// The first offset at or after `from` in a hole (the end of the file counts as one).
pub fn next_hole(fd: impl AsFd, from: u64) -> SysResult<u64> {
    rustix::fs::seek(fd, SeekFrom::Hole(from)).map_err(|e| SysError::new("lseek(SEEK_HOLE)", e))
}

/// Takes an exclusive `flock` on `fd`, waiting for other holders to let go.
pub fn lock_exclusive(fd: impl AsFd) -> SysResult<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::LockExclusive).map_err(|e| SysError::new("flock", e))
}

/// Takes an exclusive `flock` on `fd` without waiting; false when another open file
/// description holds it.
pub fn try_lock_exclusive(fd: impl AsFd) -> SysResult<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(SysError::new("flock(LOCK_EX|LOCK_NB)", e)),
    }
}
