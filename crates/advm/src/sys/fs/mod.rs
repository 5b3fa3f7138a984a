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
/// follows up to the end of the file (`ENXIO`). A file that cannot tell holes from data
/// (a block device: `EINVAL`) holds data throughout: `from`.
pub fn next_data(fd: impl AsFd, from: u64) -> SysResult<Option<u64>> {
    match rustix::fs::seek(fd, SeekFrom::Data(from)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(rustix::io::Errno::INVAL) => Ok(Some(from)),
        Err(e) => Err(SysError::new("lseek(SEEK_DATA)", e)),
    }
}

/// The first offset at or after `from` in a hole (the end of the file counts as one);
/// `u64::MAX` for a file that cannot tell holes from data (a block device: `EINVAL`),
/// which holds data up to its end.
pub fn next_hole(fd: impl AsFd, from: u64) -> SysResult<u64> {
    match rustix::fs::seek(fd, SeekFrom::Hole(from)) {
        Ok(at) => Ok(at),
        Err(rustix::io::Errno::INVAL) => Ok(u64::MAX),
        Err(e) => Err(SysError::new("lseek(SEEK_HOLE)", e)),
    }
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

/// Creates the file `path` (failing with `EEXIST` when it exists), writable and
/// already holding an exclusive `flock` when its name appears: a sweep that takes a
/// free lock to mean "its owner died" can never catch it between creation and locking.
/// The file is made unnamed (`O_TMPFILE`), locked, then linked into place; where the
/// file system has no `O_TMPFILE`, it is created and then locked (the window reopens).
pub fn create_locked(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use rustix::fs::{AtFlags, Mode, OFlags, CWD};
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC, Mode::from_raw_mode(0o600)) {
        Ok(fd) => {
            let file = std::fs::File::from(fd);
            lock_exclusive(&file).map_err(|e| std::io::Error::from_raw_os_error(e.raw_errno()))?;
            // The unnamed file is reached through its /proc link (linkat with
            // AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
            let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
            rustix::fs::linkat(CWD, link.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW)?;
            Ok(file)
        }
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => {
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
            lock_exclusive(&file).map_err(|e| std::io::Error::from_raw_os_error(e.raw_errno()))?;
            Ok(file)
        }
        Err(e) => Err(e.into()),
    }
}

/// Renames `from` to `to`, failing with `EEXIST` instead of replacing what is at `to`
/// (an empty directory would be replaced by a plain `rename`).
pub fn rename_noreplace(from: &std::path::Path, to: &std::path::Path) -> SysResult<()> {
    use rustix::fs::{RenameFlags, CWD};
    rustix::fs::renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE)
        .map_err(|e| SysError::new("renameat2(RENAME_NOREPLACE)", e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_created_locked_is_held_from_its_first_name_and_never_replaces_one() {
        let path = std::env::temp_dir().join(format!("advm-create-locked-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let held = super::create_locked(&path).unwrap();
        let other = std::fs::File::open(&path).unwrap();
        assert!(!super::try_lock_exclusive(&other).unwrap(), "a second open took the lock");
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&other.metadata().unwrap().permissions()) & 0o777, 0o600);
        let e = super::create_locked(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        drop(held);
        assert!(super::try_lock_exclusive(&other).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}
