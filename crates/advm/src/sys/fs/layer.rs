//! Opening image layer files without trusting what the path names, and read leases
//! that tell a reader when someone else starts writing to or truncating a file it maps.
//!
//! A layer's path comes from an image header, so it may name a FIFO (an open blocks
//! until a writer appears) or a device: [`open_read_nonblocking`] opens with
//! `O_NONBLOCK` so that the open itself never waits, and the caller checks the type
//! with `fstat` before reading anything.
//!
//! A read lease (`fcntl(F_SETLEASE, F_RDLCK)`) makes the kernel hold back any other
//! open for writing, and any truncate, for up to `/proc/sys/fs/lease-break-time`
//! seconds or until the holder lets go; meanwhile [`lease_state`] reports the break.
//! The kernel would also send the holder SIGIO (whose default action kills the
//! process); [`take_read_lease`] turns that signal off, so breaks are seen by polling.
//!
//! [`byte_locked_by_other`] tests one byte for an open-file-description lock
//! (`F_OFD_GETLK`), the way QEMU announces which permissions it holds on an image;
//! [`lock_byte_shared`] takes one (`F_OFD_SETLK`), the way QEMU announces which it
//! does not share.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::sys::{SysError, SysResult};

/// Opens `path` read-only, close-on-exec and without blocking (a FIFO with no writer
/// opens at once), then switches the descriptor back to blocking reads.
pub fn open_read_nonblocking(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags.difference(rustix::fs::OFlags::NONBLOCK))?;
    Ok(file)
}

/// Reopens the file behind `file` as a new, independent read-only open file
/// description (through `/proc/self/fd`), so a lease taken on it lives and dies with
/// the returned `File` alone.
pub fn reopen_read(file: &File) -> std::io::Result<File> {
    std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// `F_SETSIG` (include/uapi/asm-generic/fcntl.h), which the libc crate does not export.
const F_SETSIG: libc::c_int = 10;

fn fcntl(file: &File, call: &'static str, cmd: libc::c_int, arg: libc::c_int) -> SysResult<libc::c_int> {
    // SAFETY: these fcntl commands take an int argument and no pointers; the
    // descriptor is open for the duration of the borrow.
    let r = unsafe { libc::fcntl(file.as_fd().as_raw_fd(), cmd, arg) };
    if r < 0 {
        Err(SysError::last(call))
    } else {
        Ok(r)
    }
}

/// Takes a read lease on `file` (opened read-only; the caller must own the file or
/// have CAP_LEASE; `EAGAIN` when someone has it open for writing). No signal is sent
/// to this process when the lease is broken: poll [`lease_state`].
pub fn take_read_lease(file: &File) -> SysResult<()> {
    // A harmless signal first (SIGURG is ignored by default), in case a break comes
    // between taking the lease and turning signals off below.
    fcntl(file, "fcntl(F_SETSIG)", F_SETSIG, libc::SIGURG)?;
    fcntl(file, "fcntl(F_SETLEASE)", libc::F_SETLEASE, libc::F_RDLCK)?;
    // Taking the lease made this process the owner of the file's signals; no owner,
    // no signal.
    if let Err(e) = fcntl(file, "fcntl(F_SETOWN)", libc::F_SETOWN, 0) {
        release_lease(file)?;
        return Err(e);
    }
    Ok(())
}

/// What became of a lease taken with [`take_read_lease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Still held: nobody else has the file open for writing or has truncated it.
    Held,
    /// Being broken (a writer or truncate is waiting) or already removed.
    Broken,
}

/// The state of the lease on `file`.
pub fn lease_state(file: &File) -> SysResult<LeaseState> {
    let t = fcntl(file, "fcntl(F_GETLEASE)", libc::F_GETLEASE, 0)?;
    Ok(if t == libc::F_RDLCK { LeaseState::Held } else { LeaseState::Broken })
}

/// Gives up the lease on `file`, letting a waiting writer go on at once.
pub fn release_lease(file: &File) -> SysResult<()> {
    fcntl(file, "fcntl(F_SETLEASE)", libc::F_SETLEASE, libc::F_UNLCK).map(|_| ())
}

/// Whether an open file description other than `file`'s holds an OFD or POSIX lock on
/// byte `at` of the file: `F_OFD_GETLK` asks whether a write lock could be taken there,
/// which any other lock, shared or not, would block. `Ok(None)` when the filesystem
/// keeps no such locks (the question has no answer there).
pub fn byte_locked_by_other(file: &File, at: i64) -> SysResult<Option<bool>> {
    // SAFETY: `flock` is a plain C struct of integers, for which all zeroes is valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = at;
    lock.l_len = 1;
    // SAFETY: F_OFD_GETLK reads and writes the `flock` we pass, which lives across
    // the call; the descriptor is open for the duration of the borrow.
    let r = unsafe { libc::fcntl(file.as_fd().as_raw_fd(), libc::F_OFD_GETLK, &mut lock as *mut libc::flock) };
    if r < 0 {
        let e = SysError::last("fcntl(F_OFD_GETLK)");
        return match e.raw_errno() {
            libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(lock.l_type != libc::F_UNLCK as libc::c_short))
}

/// Takes a shared OFD lock on byte `at` of `file`, held until the last descriptor of
/// this open file description is closed. `Ok(false)` when it could not be taken: the
/// filesystem keeps no such locks, or another description holds an exclusive one.
pub fn lock_byte_shared(file: &File, at: i64) -> SysResult<bool> {
    // SAFETY: `flock` is a plain C struct of integers, for which all zeroes is valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_RDLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = at;
    lock.l_len = 1;
    // SAFETY: F_OFD_SETLK only reads the `flock` we pass, which lives across the call;
    // the descriptor is open for the duration of the borrow.
    let r = unsafe { libc::fcntl(file.as_fd().as_raw_fd(), libc::F_OFD_SETLK, &lock as *const libc::flock) };
    if r < 0 {
        let e = SysError::last("fcntl(F_OFD_SETLK)");
        return match e.raw_errno() {
            libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS | libc::EAGAIN | libc::EACCES => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

/// Writes back the dirty pages of the block device `file` is open on and waits for
/// them (`sync_file_range`, no flush of the device's cache): bytes written through
/// any node of the device sit in its page cache, where mappings read them at once,
/// while the kernel counts the sectors as written only at writeback (up to
/// `dirty_expire_centisecs` later). A read-only descriptor may ask it.
pub fn write_back_block_device(file: &File) -> SysResult<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: sync_file_range takes no pointers; the descriptor is open for the
    // duration of the borrow.
    let r = unsafe { libc::sync_file_range(file.as_fd().as_raw_fd(), 0, 0, flags) };
    if r < 0 {
        Err(SysError::last("sync_file_range"))
    } else {
        Ok(())
    }
}
