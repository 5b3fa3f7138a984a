//! Another process's files, through its `/proc/PID` directory: the open files under
//! `fd/` and the mapped files under `map_files/`, identified by `(st_dev, st_ino)` and
//! reopened read-only so the accounting can ask which of their pages are in memory.
//!
//! `map_files/` needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE); `fd/` only the right
//! to ptrace-read the process.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::sys::{SysError, SysResult};

/// `statfs.f_type` of tmpfs and of the kernel's internal shmem mount (memfd, shared
/// anonymous memory, SysV segments).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// What `stat` says about the file behind a `/proc/PID` link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev` (encoded as the kernel's `new_encode_dev`, as glibc's `makedev`).
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_size` in bytes.
    pub size: u64,
    /// A regular file (memfd, tmpfs file, ...), not a socket, pipe or device.
    pub regular: bool,
}

/// `st_dev` of a `major:minor` pair as /proc/PID/maps prints it.
pub fn dev_of(major: u32, minor: u32) -> u64 {
    rustix::fs::makedev(major, minor)
}

/// Stats the file the link `path` (relative to the `/proc/PID` directory `dir`, e.g.
/// `fd/3`) points at.
pub fn stat_link(dir: BorrowedFd<'_>, path: &str) -> SysResult<FileId> {
    let st = rustix::fs::statat(dir, path, AtFlags::empty()).map_err(|e| SysError::new("stat(/proc/PID link)", e))?;
    Ok(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size.max(0) as u64,
        regular: FileType::from_raw_mode(st.st_mode) == FileType::RegularFile,
    })
}

/// Whether the file behind the link `path` lives on tmpfs / shmem.
pub fn on_shmem(dir: BorrowedFd<'_>, path: &str) -> SysResult<bool> {
    let fd = open_path(dir, path)?;
    let fs = rustix::fs::fstatfs(&fd).map_err(|e| SysError::new("fstatfs(/proc/PID link)", e))?;
    Ok(fs.f_type as i64 == TMPFS_MAGIC)
}

/// An `O_PATH` handle on the link's target: enough for `fstatfs`, opens nothing.
fn open_path(dir: BorrowedFd<'_>, path: &str) -> SysResult<OwnedFd> {
    rustix::fs::openat(dir, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SysError::new("open(/proc/PID link, O_PATH)", e))
}

/// Opens the regular file behind the link `path` read-only. Non-blocking, so a FIFO
/// that slipped through could not hang the caller.
pub fn open_link(dir: BorrowedFd<'_>, path: &str) -> SysResult<OwnedFd> {
    rustix::fs::openat(dir, path, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK, Mode::empty())
        .map_err(|e| SysError::new("open(/proc/PID link)", e))
}

/// The entries of `fd/` under the `/proc/PID` directory `dir` (descriptor numbers as
/// names). A descriptor closed between the listing and a later stat is the caller's
/// race to tolerate.
pub fn fd_names(dir: BorrowedFd<'_>) -> SysResult<Vec<String>> {
    let fds = rustix::fs::openat(dir, "fd", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SysError::new("open(/proc/PID/fd)", e))?;
    let mut names = Vec::new();
    let mut it = rustix::fs::Dir::read_from(fds.as_fd()).map_err(|e| SysError::new("opendir(/proc/PID/fd)", e))?;
    for entry in &mut it {
        let entry = entry.map_err(|e| SysError::new("readdir(/proc/PID/fd)", e))?;
        let name = entry.file_name().to_string_lossy();
        if name != "." && name != ".." {
            names.push(format!("fd/{name}"));
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memfd_is_on_shmem_and_a_regular_file_is_not() {
        let dir = rustix::fs::open("/proc/self", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let memfd = crate::sys::memfd::create("advm-procfd-test").unwrap();
        crate::sys::memfd::set_len(&memfd, 8192).unwrap();
        // A procfs file: a regular file that is certainly not on tmpfs.
        let exe = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let (m, f) = (format!("fd/{}", memfd.as_raw_fd()), format!("fd/{}", exe.as_raw_fd()));
        let names = fd_names(dir.as_fd()).unwrap();
        assert!(names.contains(&m) && names.contains(&f), "{names:?}");
        let id = stat_link(dir.as_fd(), &m).unwrap();
        assert!(id.regular && id.size == 8192);
        let own = rustix::fs::fstat(&memfd).unwrap();
        assert_eq!((id.dev, id.ino), (own.st_dev, own.st_ino));
        assert!(on_shmem(dir.as_fd(), &m).unwrap());
        assert!(!on_shmem(dir.as_fd(), &f).unwrap());
        let again = open_link(dir.as_fd(), &m).unwrap();
        assert_eq!(rustix::fs::fstat(&again).unwrap().st_ino, own.st_ino);
        assert_eq!(dev_of(rustix::fs::major(own.st_dev), rustix::fs::minor(own.st_dev)), own.st_dev);
    }
}
