//! Sealed memfds: a file its creator fills and then freezes for good, so that whoever
//! it is handed to can trust its bytes never change. The merge client hands its new
//! pages to `advmd` this way, and the daemon adopts the file into its store.

use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FileType, MemfdFlags, SealFlags};

use super::{SysError, SysResult};

/// The seals a frozen file carries: no write (and no shared writable mapping, no hole
/// punched), no shrinking (a reader's mapping could lose pages), no growing, and no
/// further change to the seals.
const FROZEN: SealFlags = SealFlags::WRITE.union(SealFlags::SHRINK).union(SealFlags::GROW).union(SealFlags::SEAL);

/// Creates a close-on-exec memfd that can be sealed.
pub fn create(name: &str) -> SysResult<OwnedFd> {
    rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| SysError::new("memfd_create(ALLOW_SEALING)", e))
}

/// Writes `bufs` one after another from `offset`, all of them (`pwritev`, repeated
/// when short).
pub fn write_all_at(fd: impl AsFd, bufs: &[&[u8]], mut offset: u64) -> SysResult<()> {
    let mut rest: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < rest.len() {
        // At most IOV_MAX (1024) slices per call.
        let slices: Vec<IoSlice<'_>> = rest[first..].iter().take(1024).map(|b| IoSlice::new(b)).collect();
        let mut n = rustix::io::pwritev(fd.as_fd(), &slices, offset).map_err(|e| SysError::new("pwritev", e))?;
        if n == 0 {
            return Err(SysError::new("pwritev", rustix::io::Errno::NOSPC));
        }
        offset += n as u64;
        while n > 0 {
            let b = rest[first];
            if n >= b.len() {
                n -= b.len();
                first += 1;
            } else {
                rest[first] = &b[n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// Freezes a memfd made by [`create`]. Fails with `EBUSY` while anyone maps it shared
/// and writable (or holds its pages pinned for writing): that is what makes the seal
/// a promise.
pub fn freeze(fd: impl AsFd) -> SysResult<()> {
    rustix::fs::fcntl_add_seals(fd, FROZEN).map_err(|e| SysError::new("fcntl(F_ADD_SEALS)", e))
}

/// Why `fd` is not a frozen regular file of `len` bytes, or `Ok`.
pub fn check_frozen(fd: impl AsFd, len: u64) -> SysResult<Result<(), String>> {
    let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| SysError::new("fstat", e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(Err("it is not a regular file (a sealed memfd is expected)".into()));
    }
    let seals = match rustix::fs::fcntl_get_seals(fd.as_fd()) {
        Ok(s) => s,
        Err(rustix::io::Errno::INVAL) => return Ok(Err("it cannot be sealed (not a memfd)".into())),
        Err(e) => return Err(SysError::new("fcntl(F_GET_SEALS)", e)),
    };
    let names = [
        (SealFlags::WRITE, "F_SEAL_WRITE"),
        (SealFlags::SHRINK, "F_SEAL_SHRINK"),
        (SealFlags::GROW, "F_SEAL_GROW"),
        (SealFlags::SEAL, "F_SEAL_SEAL"),
    ];
    let missing: Vec<&str> = names.iter().filter(|(f, _)| !seals.contains(*f)).map(|&(_, n)| n).collect();
    if !missing.is_empty() {
        return Ok(Err(format!(
            "it lacks {} (F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL are required)",
            missing.join(", ")
        )));
    }
    if st.st_size as u64 != len {
        return Ok(Err(format!("it holds {} bytes, the request names {len}", st.st_size)));
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_memfd_refuses_writes_and_only_frozen_memfds_pass_the_check() {
        let ps = crate::sys::page_size();
        let fd = create("seal-test").unwrap();
        let page = vec![3u8; ps];
        write_all_at(&fd, &[&page, &page], 0).unwrap();
        assert!(check_frozen(&fd, 2 * ps as u64).unwrap().unwrap_err().contains("lacks F_SEAL_WRITE, F_SEAL_SHRINK"));
        freeze(&fd).unwrap();
        assert_eq!(check_frozen(&fd, 2 * ps as u64).unwrap(), Ok(()));
        assert!(check_frozen(&fd, ps as u64).unwrap().unwrap_err().contains("holds"));
        assert_eq!(rustix::io::pwrite(&fd, &[1], 0).unwrap_err(), rustix::io::Errno::PERM);
        assert!(crate::sys::memfd::punch_hole(&fd, 0, ps as u64).is_err(), "no hole in a frozen file");
        let plain = crate::sys::memfd::create("plain").unwrap();
        crate::sys::memfd::set_len(&plain, ps as u64).unwrap();
        assert!(check_frozen(&plain, ps as u64).unwrap().is_err());
    }
}
