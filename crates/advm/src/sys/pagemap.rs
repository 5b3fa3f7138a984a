//! /proc/PID/pagemap: one 64-bit entry per virtual page.
//!
//! Decoded by hand (see Documentation/admin-guide/mm/pagemap.rst): the procfs crate's
//! reader allocates per call, and accounting a 10 GiB process needs chunked reads into
//! one reused buffer, only over mapped ranges.

use std::fs::File;
use std::os::fd::AsFd;

use super::{SysError, SysResult};

/// One pagemap entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry(pub u64);

impl Entry {
    const PFN_MASK: u64 = (1 << 55) - 1;

    /// The page is in memory.
    pub fn present(self) -> bool {
        self.0 >> 63 & 1 == 1
    }
    /// The page is in swap.
    pub fn swapped(self) -> bool {
        self.0 >> 62 & 1 == 1
    }
    /// The page is a file page or shared anonymous (shmem/memfd) page.
    pub fn file_or_shared(self) -> bool {
        self.0 >> 61 & 1 == 1
    }
    /// The page frame number, if present. Reads as 0 without CAP_SYS_ADMIN.
    pub fn pfn(self) -> Option<u64> {
        self.present().then_some(self.0 & Self::PFN_MASK)
    }
}

/// An open pagemap file of one process.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    /// Opens `/proc/<pid>/pagemap` (`pid` may be `"self"`).
    pub fn open(pid: &str) -> SysResult<Self> {
        File::open(format!("/proc/{pid}/pagemap"))
            .map(|file| Self { file })
            .map_err(|e| SysError::from_io("open(/proc/PID/pagemap)", &e))
    }

    /// Wraps an already opened pagemap file (e.g. opened relative to a /proc/PID fd).
    pub fn from_file(file: File) -> Self {
        Self { file }
    }

    /// Reads the entries of the pages starting at virtual page number `first_vpn` into
    /// `out`. Returns how many were read: fewer than `out.len()` only at the end of the
    /// address space, 0 when the process has exited (its mm is gone).
    pub fn read(&self, first_vpn: u64, out: &mut [u64]) -> SysResult<usize> {
        // SAFETY: a [u64] is valid as [u8] of 8x the length (no padding, any bit pattern
        // is a valid u64), and the byte view dies before `out` is used again.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 8) };
        let mut done = 0;
        while done < bytes.len() {
            let offset = first_vpn * 8 + done as u64;
            match rustix::io::pread(self.file.as_fd(), &mut bytes[done..], offset) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(SysError::new("pread(/proc/PID/pagemap)", e)),
            }
        }
        Ok(done / 8)
    }
}

/// The PFN of the shared zero page, found by read-faulting a fresh anonymous page;
/// `None` when PFNs are hidden or the probe fails.
pub fn zero_pfn() -> Option<u64> {
    // Probing twice is harmless: a page of our own, unmapped after.
    static ZERO: super::lazy::Lazy<Option<u64>> = super::lazy::Lazy::new();
    *ZERO.get_or_init(|| {
        let ps = super::page_size();
        let m = super::mman::Mapping::anonymous(ps).ok()?;
        // SAFETY: the mapping is ours and readable; a volatile read forces the fault.
        unsafe { std::ptr::read_volatile(m.as_ptr()) };
        let mut out = [0u64; 1];
        Pagemap::open("self").ok()?.read((m.addr() / ps) as u64, &mut out).ok()?;
        Entry(out[0]).pfn().filter(|&p| p != 0)
    })
}

/// Whether this process can see PFNs in pagemap (needs CAP_SYS_ADMIN): writes a fresh
/// page and reads its entry.
pub fn pfns_visible() -> SysResult<bool> {
    let ps = super::page_size();
    let m = super::mman::Mapping::anonymous(ps)?;
    // SAFETY: the mapping is ours and writable; the volatile write forces a real page.
    unsafe { std::ptr::write_volatile(m.as_ptr(), 1) };
    let mut out = [0u64; 1];
    Pagemap::open("self")?.read((m.addr() / ps) as u64, &mut out)?;
    Ok(Entry(out[0]).pfn().is_some_and(|p| p != 0))
}

/// Whether the kernel has the `PAGEMAP_SCAN` ioctl (Linux 6.7+).
pub fn scan_available() -> bool {
    let Ok(pm) = Pagemap::open("self") else { return false };
    let mut out = [Region::default(); 1];
    pm.scan(0, super::page_size() as u64, category::PRESENT, category::PRESENT, &mut out).is_ok()
}

/// Page categories of the `PAGEMAP_SCAN` ioctl (`PAGE_IS_*`, Linux 6.7+).
pub mod category {
    /// File-backed or shared memory page.
    pub const FILE: u64 = 1 << 2;
    /// In memory.
    pub const PRESENT: u64 = 1 << 3;
    /// In swap.
    pub const SWAPPED: u64 = 1 << 4;
    /// Maps the shared zero page.
    pub const PFNZERO: u64 = 1 << 5;
}

/// One run of pages with the same categories, from [`Pagemap::scan`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Region {
    /// First byte address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// [`category`] bits (masked by the scan's return mask).
    pub categories: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 = (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | (0x66 << 8) | 16;

impl Pagemap {
    /// Finds the runs of pages in `[start, end)` that have any of the `anyof`
    /// categories, reporting `returned` categories per run, into `out`. Returns the
    /// number of runs and the address where the walk stopped (`end` unless `out` filled).
    /// `ENOTTY` means the kernel predates `PAGEMAP_SCAN`.
    pub fn scan(&self, start: u64, end: u64, anyof: u64, returned: u64, out: &mut [Region]) -> SysResult<(usize, u64)> {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start,
            end,
            walk_end: 0,
            vec: out.as_mut_ptr() as u64,
            vec_len: out.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: anyof,
            return_mask: returned,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: `arg` is a live pm_scan_arg of the size the request encodes, and `vec`
        // points at `out`, writable for `vec_len` regions of the kernel's layout.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg as *mut PmScanArg) };
        if r < 0 {
            return Err(SysError::last("ioctl(PAGEMAP_SCAN)"));
        }
        Ok((r as usize, arg.walk_end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_flag_bits_and_pfn() {
        let e = Entry((1 << 63) | (1 << 61) | (1 << 56) | 0x1234);
        assert!(e.present() && e.file_or_shared());
        assert!(!e.swapped());
        assert_eq!(e.pfn(), Some(0x1234));
        let swapped = Entry((1 << 62) | 0x55);
        assert!(swapped.swapped());
        assert_eq!(swapped.pfn(), None, "swap entries carry no pfn");
        assert_eq!(Entry(0).pfn(), None);
        // bits 55..=62 never leak into the pfn
        assert_eq!(Entry(u64::MAX).pfn(), Some((1 << 55) - 1));
    }

    #[test]
    fn reads_own_touched_page_as_present() {
        let ps = crate::sys::page_size();
        let m = crate::sys::mman::Mapping::anonymous(ps).unwrap();
        // SAFETY: the test owns the mapping.
        unsafe { m.as_mut_slice()[0] = 1 };
        let pm = Pagemap::open("self").unwrap();
        let mut out = [0u64; 1];
        assert_eq!(pm.read((m.addr() / ps) as u64, &mut out).unwrap(), 1);
        assert!(Entry(out[0]).present());
    }
}
