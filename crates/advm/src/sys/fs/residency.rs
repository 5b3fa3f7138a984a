//! How many pages of a file are in memory, asked without faulting any in: the
//! `cachestat` syscall (Linux 6.5+), or `mincore` over a fresh read-only shared mapping
//! of the file (a mapping nobody touches has no page tables, so mincore looks each
//! offset up in the file's page cache).

use std::os::fd::{AsFd, AsRawFd};

use crate::sys::mman::{Backing, Mapping, Prot, Share};
use crate::sys::{Errno, SysError, SysResult};

/// `__NR_cachestat`: the same number on every architecture (the generic table and
/// x86-64 agree).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Pages of a file in memory and, for shmem, in swap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    /// Pages in the page cache (for shmem: in memory).
    pub resident: u64,
    /// For shmem, pages swapped out (cachestat's `nr_evicted`); always 0 from mincore,
    /// which cannot tell a swapped page from a hole.
    pub swapped: u64,
}

/// `cachestat` of `len` bytes from `off` (`len` 0: to the end of the file). `ENOSYS`
/// on kernels before 6.5, `EOPNOTSUPP` on hugetlbfs. Costs about one page-cache
/// lookup per page of the range.
pub fn cachestat(fd: impl AsFd, off: u64, len: u64) -> SysResult<Residency> {
    let range = CachestatRange { off, len };
    let mut cs = Cachestat::default();
    // SAFETY: `range` and `cs` are live structs of the kernel's layout for the call; the
    // kernel only reads `range` and writes `cs`.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_fd().as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if r < 0 {
        return Err(SysError::last("cachestat"));
    }
    Ok(Residency { resident: cs.nr_cache, swapped: cs.nr_evicted })
}

/// Bytes of file looked at per mincore call: bounds the residency vector and the
/// address space the temporary mapping needs.
const MINCORE_CHUNK: u64 = 1 << 30;

/// Counts the resident pages of the first `len` bytes of `fd` with `mincore` on a
/// fresh `PROT_READ`, `MAP_SHARED` mapping, one gigabyte at a time. Nothing is read
/// through the mapping, so nothing is faulted in or allocated.
pub fn mincore_resident(fd: impl AsFd, len: u64) -> SysResult<Residency> {
    let ps = crate::sys::page_size() as u64;
    let mut resident = 0;
    let mut vec = Vec::new();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(MINCORE_CHUNK).div_ceil(ps) * ps;
        let m = Mapping::new(n as usize, Prot::READ, Share::Shared, Backing::File { fd: fd.as_fd(), offset: at })?;
        vec.resize((n / ps) as usize, 0u8);
        // SAFETY: mincore only reads page tables and the file's page cache, and writes
        // one byte per page of the live mapping into `vec`, which holds that many.
        let r = unsafe { libc::mincore(m.as_ptr().cast(), n as usize, vec.as_mut_ptr()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return Err(SysError::new("mincore", Errno::from_io_error(&e).unwrap_or(Errno::IO)));
        }
        resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
        at += n;
    }
    Ok(Residency { resident, swapped: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_count_written_pages_and_skip_holes() {
        let ps = crate::sys::page_size();
        let fd = crate::sys::memfd::create("advm-residency-test").unwrap();
        crate::sys::memfd::set_len(&fd, (64 * ps) as u64).unwrap();
        for page in [0usize, 5, 6, 63] {
            crate::sys::memfd::pwrite(&fd, &[1], (page * ps) as u64).unwrap();
        }
        let by_mincore = mincore_resident(&fd, (64 * ps) as u64).unwrap();
        assert_eq!(by_mincore, Residency { resident: 4, swapped: 0 });
        match cachestat(&fd, 0, 0) {
            Ok(r) => {
                assert_eq!(r, Residency { resident: 4, swapped: 0 });
                assert_eq!(cachestat(&fd, (5 * ps) as u64, (58 * ps) as u64).unwrap().resident, 2);
            }
            Err(e) if e.errno == Errno::NOSYS => eprintln!("cachestat: not on this kernel"),
            Err(e) => panic!("{e}"),
        }
        // Asking twice changed nothing: no hole was filled.
        assert_eq!(mincore_resident(&fd, (64 * ps) as u64).unwrap().resident, 4);
    }
}
