//! The page operations of the user-level pager (`advm::pager`): memory it owns and
//! registers with userfaultfd, the staging area pages are moved to while they are
//! written out, and its swap file.
//!
//! Every page the pager takes away leaves its region through `UFFDIO_MOVE`, which
//! clears the page-table entry and flushes the TLB before it returns: a write that
//! lands before the move travels with the page, and any access after it faults to the
//! pager. That is what makes eviction race-free without write protection.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU32;

use rustix::io::Errno;

use super::mman::{self, Advice, Mapping};
use super::uffd::{self, Partial, Userfaultfd};
use super::{page_size, SysError, SysResult};

/// The source of zero-filled pages: up to [`ZERO_FILL_PAGES`] 4 KiB pages in one call.
static ZEROS: [u8; ZERO_FILL_PAGES * 4096] = [0; ZERO_FILL_PAGES * 4096];
/// Most 4 KiB pages [`Area::fill_zeros`] fills in one call.
pub const ZERO_FILL_PAGES: usize = 64;

/// Private anonymous memory owned by the pager and registered on its userfaultfd.
#[derive(Debug)]
pub struct Area {
    map: Mapping,
}

impl Area {
    /// Maps `len` bytes and registers them: `missing` for a managed region (every
    /// empty page faults to the pager), write-protect mode only for the staging area
    /// (it is a `UFFDIO_MOVE` destination, and its holes read as zeros).
    /// `clean`: a managed region also registered for write protection, so that pages
    /// read back clean can be installed write-protected ([`Area::fill_copy_clean`]).
    pub fn new(fd: &Userfaultfd, len: usize, missing: bool, clean: bool) -> SysResult<Self> {
        let map = Mapping::anonymous(len)?;
        // SAFETY: the mapping is ours and unused; huge pages are declined so that the
        // pager moves and fills single pages.
        unsafe { mman::madvise(map.as_ptr(), len, Advice::LinuxNoHugepage) }?;
        // Not inherited by a fork's child: a child's copy would share the pages (and
        // `UFFDIO_MOVE` refuses a page not exclusively its process's, even after the
        // child is gone, until the page is written again: no eviction could take it),
        // and a child has no pager to serve its evicted pages anyway.
        // SAFETY: as above; only a future child's view of the range changes.
        unsafe { mman::madvise(map.as_ptr(), len, Advice::LinuxDontFork) }?;
        let mode = match (missing, clean) {
            (true, true) => uffd::mode::MISSING | uffd::mode::WP,
            (true, false) => uffd::mode::MISSING,
            (false, _) => uffd::mode::WP,
        };
        // SAFETY: the range is ours; the pager serves every fault in it for as long as
        // it is registered (the staging area, in WP mode without protection, never faults).
        unsafe { fd.register(map.as_ptr(), len, mode) }?;
        Ok(Self { map })
    }

    /// First address.
    pub fn addr(&self) -> usize {
        self.map.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn page_ptr(&self, page: usize, n: usize) -> SysResult<*mut u8> {
        let ps = page_size();
        match page.checked_add(n) {
            Some(end) if end * ps <= self.map.len() => Ok(self.map.as_ptr().wrapping_add(page * ps)),
            _ => Err(SysError::new("pager page", Errno::INVAL)),
        }
    }

    /// Fills the empty page `page` with zeros: the shared zero page for a read fault,
    /// a fresh page for a write fault (saves the copy-on-write fault that follows).
    /// `Ok(false)`: the page was already there.
    /// The faulting thread is not woken: see [`Area::wake`].
    pub fn fill_zero(&self, fd: &Userfaultfd, page: usize, write: bool) -> SysResult<bool> {
        let dst = self.page_ptr(page, 1)?;
        let r = if write {
            let ps = page_size();
            let src =
                if ps <= ZEROS.len() { ZEROS.as_ptr() } else { return Err(SysError::new("pager", Errno::INVAL)) };
            // SAFETY: `dst` is one page of this registered area; `src` is readable for a page.
            unsafe { fd.copy(dst, src, ps, uffd::MODE_DONTWAKE) }
        } else {
            // SAFETY: `dst` is one page of this registered area.
            unsafe { fd.zeropage(dst, page_size(), uffd::MODE_DONTWAKE) }
        };
        settled(r)
    }

    /// Fills the empty pages `[page, page+n)` with fresh zero pages, writable, in one
    /// `UFFDIO_COPY`, without waking anyone. Returns how many were filled from `page`
    /// on: fewer when one was already there (or the copy failed part way).
    pub fn fill_zeros(&self, fd: &Userfaultfd, page: usize, n: usize) -> SysResult<usize> {
        let ps = page_size();
        if n * ps > ZEROS.len() {
            return Err(SysError::new("ioctl(UFFDIO_COPY)", Errno::INVAL));
        }
        let dst = self.page_ptr(page, n)?;
        // SAFETY: `dst` is `n` pages of this registered area; `ZEROS` is readable for
        // `n * ps` bytes (checked above).
        match unsafe { fd.copy(dst, ZEROS.as_ptr(), n * ps, uffd::MODE_DONTWAKE) } {
            Ok(bytes) => Ok(bytes / ps),
            Err(p) if p.done > 0 || p.error.errno == Errno::EXIST => Ok(p.done / ps),
            Err(p) => Err(p.error),
        }
    }

    /// Fills the empty page `page` with `data` (one page), without waking the
    /// faulting thread. `Ok(false)`: already there.
    pub fn fill_copy(&self, fd: &Userfaultfd, page: usize, data: &[u8]) -> SysResult<bool> {
        let ps = page_size();
        if data.len() != ps {
            return Err(SysError::new("ioctl(UFFDIO_COPY)", Errno::INVAL));
        }
        let dst = self.page_ptr(page, 1)?;
        // SAFETY: `dst` is one page of this registered area; `data` is a live page.
        settled(unsafe { fd.copy(dst, data.as_ptr(), ps, uffd::MODE_DONTWAKE) })
    }

    /// As [`Area::fill_copy`], write-protected: the first write to the page faults to
    /// the pager (a write-protect fault) before it lands. Needs a `clean` area.
    pub fn fill_copy_clean(&self, fd: &Userfaultfd, page: usize, data: &[u8]) -> SysResult<bool> {
        let ps = page_size();
        if data.len() != ps {
            return Err(SysError::new("ioctl(UFFDIO_COPY)", Errno::INVAL));
        }
        let dst = self.page_ptr(page, 1)?;
        // SAFETY: `dst` is one page of this area, registered for write protection
        // too; `data` is a live page. The pager serves the write-protect faults.
        settled(unsafe { fd.copy(dst, data.as_ptr(), ps, uffd::MODE_DONTWAKE | uffd::COPY_MODE_WP) })
    }

    /// Lifts write protection from `page` and wakes the threads waiting to write it
    /// (a page no longer mapped: they are woken and fault again as missing).
    pub fn unprotect(&self, fd: &Userfaultfd, page: usize) -> SysResult<()> {
        let p = self.page_ptr(page, 1)?;
        // SAFETY: one page of this area; clearing protection only lets writes proceed.
        match unsafe { fd.write_protect(p, page_size(), false, true) } {
            Ok(()) => Ok(()),
            Err(_) => fd.wake(p, page_size()),
        }
    }

    /// Whether `page` has a page-table entry, present or swapped (read from
    /// `/proc/self/pagemap`, opened for the call so that a fork's child reads its own
    /// page tables): never faults. False if pagemap cannot be read.
    pub fn mapped(&self, page: usize) -> bool {
        self.mapped_pages(page, 1) == [true]
    }

    /// Whether each page of `[page, page+n)` has a page-table entry (present or
    /// swapped), in one pagemap read (opened for the call, as [`Self::mapped`]).
    /// Empty if pagemap cannot be read.
    pub fn mapped_pages(&self, page: usize, n: usize) -> Vec<bool> {
        let Ok(p) = self.page_ptr(page, n) else { return Vec::new() };
        let mut e = vec![0u64; n];
        let read =
            super::pagemap::Pagemap::open("self").and_then(|pm| pm.read((p as usize / page_size()) as u64, &mut e));
        match read {
            Ok(k) if k == n => e
                .into_iter()
                .map(|v| {
                    let entry = super::pagemap::Entry(v);
                    entry.present() || entry.swapped()
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Wakes threads blocked on faults at `page`, once the pager has recorded the fill.
    pub fn wake(&self, fd: &Userfaultfd, page: usize) -> SysResult<()> {
        fd.wake(self.page_ptr(page, 1)?, page_size())
    }

    /// The bytes of pages `[page, page+n)`, read by the pager only: staging pages
    /// that nothing else maps.
    pub fn staged(&self, page: usize, n: usize) -> SysResult<&[u8]> {
        let p = self.page_ptr(page, n)?;
        // SAFETY: inside the mapping; staging pages are written only by UFFDIO_MOVE
        // under the pager's eviction lock, which its caller holds while it reads.
        Ok(unsafe { std::slice::from_raw_parts(p, n * page_size()) })
    }

    /// Drops pages `[page, page+n)` (`MADV_DONTNEED`): used on staging pages only,
    /// whose contents the pager has written out or found discardable.
    pub fn drop_pages(&self, page: usize, n: usize) -> SysResult<()> {
        let p = self.page_ptr(page, n)?;
        // SAFETY: staging pages hold nothing anyone still needs (see above).
        unsafe { mman::madvise(p, n * page_size(), Advice::LinuxDontNeed) }
    }

    /// Hands pages `[page, page+n)` to the kernel's own reclaim now (`MADV_PAGEOUT`):
    /// written to the kernel's swap, contents kept; an access later is a kernel
    /// swap-in, not a fault to the pager.
    pub fn page_out(&self, page: usize, n: usize) -> SysResult<()> {
        let p = self.page_ptr(page, n)?;
        // SAFETY: inside the mapping; MADV_PAGEOUT keeps every page's contents.
        unsafe { mman::madvise(p, n * page_size(), Advice::LinuxPageOut) }
    }

    /// Copies `out.len()` bytes from offset `off` (faults on evicted pages are served
    /// by the pager as for any access).
    pub fn read(&self, off: usize, out: &mut [u8]) -> SysResult<()> {
        self.check_bytes(off, out.len())?;
        // SAFETY: in bounds; a plain byte copy from memory the pager keeps mapped.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> SysResult<()> {
        self.check_bytes(off, data.len())?;
        // SAFETY: in bounds; a plain byte copy into memory the pager keeps mapped.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_ptr().add(off), data.len()) };
        Ok(())
    }

    fn check_bytes(&self, off: usize, len: usize) -> SysResult<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok(()),
            _ => Err(SysError::new("pager bytes", Errno::INVAL)),
        }
    }

    /// Unregisters the area (before it is unmapped on drop).
    pub fn unregister(&self, fd: &Userfaultfd) -> SysResult<()> {
        fd.unregister(self.map.as_ptr(), self.map.len())
    }
}

/// A fill that found the page already mapped (`EEXIST`) is not an error: another
/// fault on the same page won.
fn settled(r: Result<usize, Partial>) -> SysResult<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(p) if p.error.errno == Errno::EXIST => Ok(false),
        Err(p) => Err(p.error),
    }
}

/// Moves `n` pages from `src` at `src_page` to the empty pages of `dst` at `dst_page`
/// (`UFFDIO_MOVE`). Returns how many moved before a failure (`ENOENT`: a hole in the
/// source; `EBUSY`: a page shared or pinned).
pub fn move_pages(
    fd: &Userfaultfd,
    dst: &Area,
    dst_page: usize,
    src: &Area,
    src_page: usize,
    n: usize,
) -> Result<usize, Partial> {
    let err = |e: SysError| Partial { done: 0, error: e };
    let d = dst.page_ptr(dst_page, n).map_err(err)?;
    let s = src.page_ptr(src_page, n).map_err(err)?;
    // SAFETY: both ranges are pager areas registered on `fd`; the destination pages
    // are empty staging (or evicted region) pages; pages leave the source whole, and
    // an access there afterwards faults to the pager.
    match unsafe { fd.move_pages(d, s, n * page_size(), 0) } {
        Ok(bytes) => Ok(bytes),
        Err(mut partial) => {
            // Linux 6.18 (measured here, tests/pager.rs `a_move_racing_write_protection_
            // is_counted_where_the_page_went`): a move racing UFFDIO_WRITEPROTECT on a
            // source page can move that page (and the present pages after it, moved as
            // one batch), retry it internally and report EEXIST with those pages not
            // counted. Where the pages went is read from the page tables, so the caller
            // never takes a page sitting at the destination for one still in place.
            let mut next = partial.done / page_size();
            while next < n && !src.mapped(src_page + next) && dst.mapped(dst_page + next) {
                partial.done += page_size();
                next += 1;
            }
            if next == n {
                return Ok(partial.done);
            }
            Err(partial)
        }
    }
}

/// A page-aligned buffer of pages for reading the swap file back.
#[derive(Debug)]
pub struct PageBuf {
    map: Mapping,
}

impl PageBuf {
    /// `pages` pages of anonymous memory.
    pub fn new(pages: usize) -> SysResult<Self> {
        Ok(Self { map: Mapping::anonymous(pages.max(1) * page_size())? })
    }

    /// The buffer.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is private to this buffer and `&mut self` is exclusive.
        unsafe { self.map.as_mut_slice() }
    }
}

/// The pager's own swap file: pages written at `slot * page_size`.
#[derive(Debug)]
pub struct SwapFile {
    file: File,
    direct: bool,
    /// The path of a file this pager created, removed with it: its pages are lost with
    /// the pager anyway, and a second run naming the same path would meet `EEXIST`.
    created: Option<std::path::PathBuf>,
}

impl SwapFile {
    /// Opens `path` (a new file: an existing one is refused with `EEXIST`, never
    /// overwritten, and the new one is removed on drop; a block device is used as it
    /// is) or, with `temporary`, an unlinked file in the directory `path`
    /// (`O_TMPFILE`). `direct`: `O_DIRECT`, no page cache.
    pub fn open(path: &Path, temporary: bool, direct: bool) -> std::io::Result<Self> {
        let mut flags = libc::O_CLOEXEC;
        if direct {
            flags |= libc::O_DIRECT;
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        let mut created = None;
        if temporary {
            opts.custom_flags(flags | libc::O_TMPFILE);
        } else {
            let device =
                std::fs::metadata(path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
            if !device {
                opts.create_new(true);
                created = Some(path.to_path_buf());
            }
            opts.custom_flags(flags);
        }
        let file = opts.open(path)?;
        Ok(Self { file, direct, created })
    }

    /// Whether the file bypasses the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Writes one page from `data` (page aligned for `O_DIRECT`) to `slot`.
    pub fn write_page(&self, slot: usize, data: &[u8]) -> SysResult<()> {
        self.file
            .write_all_at(data, (slot * page_size()) as u64)
            .map_err(|e| SysError::from_io("pwrite(pager swap)", &e))
    }

    /// Reads `slot` into `out` (one page, page aligned).
    pub fn read_page(&self, slot: usize, out: &mut [u8]) -> SysResult<()> {
        self.file
            .read_exact_at(out, (slot * page_size()) as u64)
            .map_err(|e| SysError::from_io("pread(pager swap)", &e))
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let Some(path) = &self.created else { return };
        // Only the file we made: something put at the path since is not ours to remove.
        let (Ok(ours), Ok(there)) = (self.file.metadata(), std::fs::symlink_metadata(path)) else { return };
        if (ours.dev(), ours.ino()) == (there.dev(), there.ino()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Waits up to `timeout_ms` for an event on `fd` or a ring of `bell`; true when one is ready.
pub fn wait_event(fd: &Userfaultfd, bell: &Doorbell, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = [
        libc::pollfd { fd: fd.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: bell.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: two live pollfds for the duration of the call.
    unsafe { libc::poll(p.as_mut_ptr(), 2, timeout_ms) > 0 }
}

/// An eventfd that a faulting thread's SIGBUS handler rings to wake the pager's
/// handler thread (`write(2)` is async-signal-safe).
#[derive(Debug)]
pub struct Doorbell {
    fd: std::os::fd::OwnedFd,
}

impl Doorbell {
    /// A fresh, non-blocking eventfd.
    pub fn new() -> SysResult<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: no pointers; the fd returned is ours alone.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(SysError::last("eventfd"));
        }
        // SAFETY: a fresh fd nothing else owns.
        Ok(Self { fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) } })
    }

    /// Rings (async-signal-safe).
    pub fn ring(&self) {
        use std::os::fd::AsRawFd;
        let one = 1u64;
        // SAFETY: an 8-byte write from a live u64 to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the rings so far.
    pub fn clear(&self) {
        use std::os::fd::AsRawFd;
        let mut n = 0u64;
        // SAFETY: an 8-byte read into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// Sleeps while `word` holds `seen`, up to `timeout` (a futex wait; async-signal-safe).
pub fn wait_while(word: &AtomicU32, seen: u32, timeout: std::time::Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: a private futex on a live u32; the kernel only reads it and `ts`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every thread waiting on `word` in [`wait_while`].
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: a private futex wake on a live u32.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}
