//! Which mapping covers an address: `PROCMAP_QUERY` on `/proc/self/maps` (Linux 6.11+),
//! with a text parse of the same file as the fallback.
//!
//! One ioctl answers in about a microsecond, which is what lets raw-address operations
//! check their arguments (mapped, writable, anonymous or file, shared or private)
//! before they change anything.

use std::fs::File;
use std::os::fd::AsRawFd;

use rustix::io::Errno;

use super::lazy::Lazy;
use super::process::PerProcess;
use super::{SysError, SysResult};

/// One mapping (VMA) of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// `PROT_READ`.
    pub readable: bool,
    /// `PROT_WRITE`.
    pub writable: bool,
    /// `PROT_EXEC`.
    pub executable: bool,
    /// `MAP_SHARED` (writes reach the backing and other sharers).
    pub shared: bool,
    /// Backed by a file (memfd, image, library); false for anonymous memory.
    pub file_backed: bool,
    /// The backing file's inode number (0 for anonymous memory).
    pub inode: u64,
    /// The backing file's device, major and minor (0, 0 for anonymous memory).
    pub dev: (u32, u32),
    /// Offset into the backing file, in bytes.
    pub offset: u64,
}

impl Vma {
    /// `rwxp`/`rw-s` as in /proc/PID/maps.
    pub fn perms(&self) -> String {
        let b = |on: bool, c: char| if on { c } else { '-' };
        format!(
            "{}{}{}{}",
            b(self.readable, 'r'),
            b(self.writable, 'w'),
            b(self.executable, 'x'),
            if self.shared { 's' } else { 'p' }
        )
    }
}

#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as u64) << 16) | ((b'f' as u64) << 8) | 17;
const VMA_READABLE: u64 = 0x01;
const VMA_WRITABLE: u64 = 0x02;
const VMA_EXECUTABLE: u64 = 0x04;
const VMA_SHARED: u64 = 0x08;

/// This process's maps file, opened once per process: `/proc/self` is resolved at
/// open time, so a forked child must open its own (the parent's would describe the
/// parent's address space). Opening it twice is harmless (the loser's file is closed).
/// A failed open (EMFILE while the process is out of fds) is reported with its errno
/// and tried again on the next call, never kept.
fn maps_file() -> SysResult<&'static File> {
    static MAPS: PerProcess<File> = PerProcess::new();
    MAPS.try_get(open_maps)
}

fn open_maps() -> SysResult<File> {
    File::open("/proc/self/maps").map_err(|e| SysError::from_io("open(/proc/self/maps)", &e))
}

/// The mapping that contains `addr`, or `None` when `addr` is not mapped.
pub fn query(addr: usize) -> SysResult<Option<Vma>> {
    // The probe is a read-only query: running it twice is harmless.
    static IOCTL_WORKS: Lazy<bool> = Lazy::new();
    let file = maps_file()?;
    if *IOCTL_WORKS.get_or_init(|| query_ioctl(file, 0).is_ok() || query_ioctl(file, 0) == Err(Errno::NOENT)) {
        let answer = match query_ioctl(file, addr) {
            // The program closed the cached maps file (it may have got the number back
            // for a file of its own, never closed here): this query opens its own.
            Err(Errno::BADF | Errno::NOTTY) => query_ioctl(&open_maps()?, addr),
            other => other,
        };
        return match answer {
            Ok(v) => Ok(Some(v)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(SysError::new("ioctl(PROCMAP_QUERY)", e)),
        };
    }
    query_text(addr)
}

/// Whether every page of `[addr, addr+len)` is mapped (by one mapping or several).
pub fn covers(addr: usize, len: usize) -> SysResult<bool> {
    let end = addr.saturating_add(len);
    let mut a = addr;
    while a < end {
        match query(a)? {
            Some(v) => a = v.end,
            None => return Ok(false),
        }
    }
    Ok(true)
}

fn query_ioctl(file: &File, addr: usize) -> Result<Vma, Errno> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: `q` is a live, correctly sized procmap_query; the kernel writes only into
    // it (name and build-id buffers are not requested: their sizes are 0).
    let r = unsafe { libc::ioctl(file.as_raw_fd(), PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if r < 0 {
        return Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO));
    }
    Ok(Vma {
        start: q.vma_start as usize,
        end: q.vma_end as usize,
        readable: q.vma_flags & VMA_READABLE != 0,
        writable: q.vma_flags & VMA_WRITABLE != 0,
        executable: q.vma_flags & VMA_EXECUTABLE != 0,
        shared: q.vma_flags & VMA_SHARED != 0,
        file_backed: q.inode != 0 || q.dev_major != 0 || q.dev_minor != 0,
        inode: q.inode,
        dev: (q.dev_major, q.dev_minor),
        offset: q.vma_offset,
    })
}

/// Parses `/proc/self/maps` for kernels without PROCMAP_QUERY.
fn query_text(addr: usize) -> SysResult<Option<Vma>> {
    let text =
        std::fs::read_to_string("/proc/self/maps").map_err(|e| SysError::from_io("read(/proc/self/maps)", &e))?;
    Ok(text.lines().find_map(|l| parse_line(l).filter(|v| v.start <= addr && addr < v.end)))
}

fn parse_line(line: &str) -> Option<Vma> {
    parse_named(line).map(|(v, _)| v)
}

/// One line of /proc/PID/maps (or a mapping's first line in smaps): the mapping and its
/// name (a path, `[heap]`, `[anon:NAME]`, or empty); None for any other line.
pub fn parse_named(line: &str) -> Option<(Vma, &str)> {
    let mut f = line.split_whitespace();
    let (s, e) = f.next()?.split_once('-')?;
    let perms = f.next()?.as_bytes();
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let dev = f.next()?;
    let (major, minor) = dev.split_once(':')?;
    let dev_numbers = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let inode_field = f.next()?;
    let inode: u64 = inode_field.parse().ok()?;
    // The name is the rest of the line after the inode, spaces inside it kept.
    let at = inode_field.as_ptr() as usize - line.as_ptr() as usize + inode_field.len();
    let name = line[at..].trim();
    let vma = Vma {
        start: usize::from_str_radix(s, 16).ok()?,
        end: usize::from_str_radix(e, 16).ok()?,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        shared: perms.get(3) == Some(&b's'),
        file_backed: inode != 0 || dev_numbers != (0, 0),
        inode,
        dev: dev_numbers,
        offset,
    };
    Some((vma, name))
}

/// Number of mappings (VMAs) of this process: lines of /proc/self/maps.
pub fn vma_count() -> SysResult<usize> {
    let text = std::fs::read("/proc/self/maps").map_err(|e| SysError::from_io("read(/proc/self/maps)", &e))?;
    Ok(text.iter().filter(|&&b| b == b'\n').count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_sees_an_anonymous_mapping_and_a_hole() {
        let ps = crate::sys::page_size();
        let m = crate::sys::mman::Mapping::anonymous(4 * ps).unwrap();
        let v = query(m.addr() + ps).unwrap().unwrap();
        assert!(v.start <= m.addr() && v.end >= m.addr() + 4 * ps, "{v:?}");
        assert_eq!(v.perms(), "rw-p");
        assert!(!v.file_backed);
        assert_eq!(query_text(m.addr()).unwrap().map(|t| (t.start <= m.addr(), t.writable)), Some((true, true)));
        let hole = crate::sys::mman::Mapping::reserve(ps).unwrap();
        let addr = hole.addr();
        drop(hole);
        assert_eq!(query(addr).unwrap().filter(|v| v.start <= addr), None);
        assert_eq!(std::mem::size_of::<ProcmapQuery>(), 104);
    }

    #[test]
    fn parses_a_maps_line() {
        let v = parse_line("7f00-7f10 r--s 00000000 00:01 1234 /memfd:x (deleted)").unwrap();
        assert_eq!((v.start, v.end, v.perms(), v.file_backed), (0x7f00, 0x7f10, "r--s".to_string(), true));
        let (v, name) = parse_named("7f00-7f10 rw-p 00000000 00:00 0          [heap]").unwrap();
        assert_eq!((v.file_backed, name), (false, "[heap]"));
        assert_eq!(parse_named("7f00-7f10 rw-p 00000000 00:00 0 ").unwrap().1, "");
        assert!(parse_named("Rss:                 132 kB").is_none());
        let v = parse_line("7f00-7f10 r--p 0002a000 fd:1a 99 /memfd:advm-store (deleted)").unwrap();
        assert_eq!((v.offset, v.dev, v.inode, v.shared), (0x2a000, (0xfd, 0x1a), 99, false));
    }

    #[test]
    fn a_forked_child_queries_its_own_address_space() {
        let ps = crate::sys::page_size();
        query(0).unwrap(); // the parent's file is open
        let m = crate::sys::mman::Mapping::anonymous(ps).unwrap();
        let addr = m.addr();
        let pid = crate::sys::process::fork_run(|| {
            // The child unmaps the page; the parent's file would still show it.
            drop(m);
            i32::from(query(addr).unwrap().is_some_and(|v| v.start <= addr))
        })
        .unwrap();
        assert_eq!(crate::sys::process::wait_child(pid).unwrap(), 0, "the child saw the parent's mapping");
    }
}
