//! [`Grant`]: the right to rewrite the pages of one address span, and the page and byte
//! operations `advm::remap` plans with (memmove, byte swap, UFFDIO_MOVE, mremap, zap,
//! uffd registration).
//!
//! A grant is either borrowed from an owned [`RwMapping`] (safe: `&mut` proves that
//! nothing else looks at the memory) or made from raw addresses with the unsafe
//! [`Grant::new`], whose caller promises the same thing by hand (the C API does this).
//! Every operation checks that the ranges it touches lie inside the grant, so safe code
//! above can plan freely without reaching memory it was not given.

use std::marker::PhantomData;
use std::os::fd::OwnedFd;

use rustix::io::Errno;

use crate::sys::mman::{self, Backing, Mapping, Prot, Share};
use crate::sys::uffd::{self, Partial, Userfaultfd};
use crate::sys::{SysError, SysResult};

/// What is known about the memory of a grant without asking the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Private anonymous read-write memory advm mapped itself ([`RwMapping`]).
    PrivateAnonRw,
    /// Raw addresses from a caller: check with `procmap::query` before use.
    Unchecked,
}

/// Permission to rewrite the pages of `[start, end)` for the lifetime `'a`.
#[derive(Debug)]
pub struct Grant<'a> {
    start: usize,
    end: usize,
    known: Known,
    _mem: PhantomData<&'a mut [u8]>,
}

impl Grant<'static> {
    /// A grant over raw addresses `[start, start+len)`.
    ///
    /// # Safety
    /// For as long as the grant is used, the caller must own the span: no Rust
    /// reference may point into it and no other thread may use it except as the raw-
    /// address operations on it document (page engines change which physical pages
    /// back the addresses). The parts of the span that operations are asked to touch
    /// must be mapped read-write. Page engines may replace the span's mappings, so no
    /// one else may keep records of them: memory of a virtual-copy arena
    /// (`advm::vcopy`) may be granted only to operations that copy bytes (see
    /// `advm::remap`'s *Memory owned by an allocator*). (`advm::remap` checks the
    /// mappings with PROCMAP_QUERY and refuses unmapped or read-only ranges with an
    /// error before it changes anything, but that check is a courtesy: another thread
    /// could unmap memory in between.)
    pub unsafe fn new(start: usize, len: usize) -> SysResult<Self> {
        let end = start.checked_add(len).ok_or(SysError::new("grant", Errno::INVAL))?;
        Ok(Grant { start, end, known: Known::Unchecked, _mem: PhantomData })
    }
}

impl Grant<'_> {
    /// First address.
    pub fn start(&self) -> usize {
        self.start
    }
    /// One past the last address.
    pub fn end(&self) -> usize {
        self.end
    }
    /// What is known about the memory.
    pub fn known(&self) -> Known {
        self.known
    }

    fn check(&self, call: &'static str, addr: usize, len: usize) -> SysResult<()> {
        match addr.checked_add(len) {
            Some(end) if addr >= self.start && end <= self.end => Ok(()),
            _ => Err(SysError::new(call, Errno::FAULT)),
        }
    }

    /// `memmove(dst, src, len)`: overlapping ranges are fine.
    pub fn memmove(&mut self, dst: usize, src: usize, len: usize) -> SysResult<()> {
        self.check("memmove", dst, len)?;
        self.check("memmove", src, len)?;
        // SAFETY: both ranges lie in the grant, whose owner guarantees they are ours and
        // unreferenced; `copy` is memmove and allows overlap. Mappedness and write
        // permission were checked by the planner (or are known for RwMapping).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    /// Swaps the bytes of two non-overlapping ranges.
    pub fn swap_bytes(&mut self, a: usize, b: usize, len: usize) -> SysResult<()> {
        self.check("swap", a, len)?;
        self.check("swap", b, len)?;
        if a < b.saturating_add(len) && b < a.saturating_add(len) {
            return Err(SysError::new("swap", Errno::INVAL));
        }
        // SAFETY: both ranges lie in the grant and do not overlap (checked above).
        unsafe { std::ptr::swap_nonoverlapping(a as *mut u8, b as *mut u8, len) };
        Ok(())
    }

    /// Fills `[addr, addr+len)` with `byte`.
    pub fn fill(&mut self, addr: usize, len: usize, byte: u8) -> SysResult<()> {
        self.check("fill", addr, len)?;
        // SAFETY: the range lies in the grant.
        unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len) };
        Ok(())
    }

    /// Reads one byte of each page of `[addr, addr+len)` (faults pages in; used to make
    /// a source cache-hot or to observe it). Returns their wrapping sum.
    pub fn touch(&self, addr: usize, len: usize, step: usize) -> SysResult<u64> {
        self.check("touch", addr, len)?;
        let mut sum = 0u64;
        let mut p = addr;
        while p < addr + len {
            // SAFETY: inside the grant; a volatile read so the touch is not optimised out.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(p as *const u8) } as u64);
            p += step.max(1);
        }
        Ok(sum)
    }

    /// `UFFDIO_MOVE` of `[src, src+len)` to `[dst, dst+len)` (dst must be empty and in a
    /// range registered on `uffd`). With `allow_src_holes`, holes in the source are
    /// skipped (the destination page there is left as it is, so it must be empty);
    /// without, a hole stops the move with `ENOENT`. Returns bytes moved, or how far
    /// it got.
    pub fn uffd_move(
        &mut self,
        uffd: &Userfaultfd,
        dst: usize,
        src: usize,
        len: usize,
        allow_src_holes: bool,
    ) -> Result<usize, Partial> {
        let bad = |e: SysError| Partial { done: 0, error: e };
        self.check("ioctl(UFFDIO_MOVE)", dst, len).map_err(bad)?;
        self.check("ioctl(UFFDIO_MOVE)", src, len).map_err(bad)?;
        // SAFETY: both ranges are the grant's; the page-table entries move within our
        // own address space, and holes in the source stay holes.
        unsafe { uffd.move_pages(dst as *mut u8, src as *mut u8, len, holes_mode(allow_src_holes)) }
    }

    /// Registers `[addr, addr+len)` on `uffd` in write-protect mode only: UFFDIO_MOVE
    /// may then target it, and since advm never write-protects a page, no fault is ever
    /// reported to the fd (missing pages fault in as zeros as usual). The range may
    /// extend past the grant (to a whole VMA, so registering does not split it): it
    /// changes VMA flags, never contents. (The kernel refuses with `EBUSY` a range that
    /// another userfaultfd already registered.)
    pub fn register_for_move(&mut self, uffd: &Userfaultfd, addr: usize, len: usize) -> SysResult<()> {
        if addr.checked_add(len).is_none() {
            return Err(SysError::new("ioctl(UFFDIO_REGISTER)", Errno::INVAL));
        }
        // SAFETY: WP mode without UFFDIO_WRITEPROTECT never blocks a fault and changes
        // no memory contents, so registering memory beyond the grant is harmless.
        unsafe { uffd.register(addr as *mut u8, len, uffd::mode::WP) }.map(|_| ())
    }

    /// Moves the mapping of `[src, src+len)` to `[dst, dst+len)` with
    /// `mremap(MREMAP_MAYMOVE|MREMAP_FIXED)` (whole page tables when both are 2 MiB
    /// aligned; the destination's old pages are freed), leaving the source mapped with
    /// the same protection:
    ///
    /// - where the kernel allows `MREMAP_DONTUNMAP` with `MREMAP_FIXED`: one call, and
    ///   the source keeps its mapping with empty page tables (private anonymous memory
    ///   reads as zeros; a private file view shows the file again, so with
    ///   `fresh_source` fresh anonymous memory is then mapped over it, best effort: if
    ///   that second call fails the source stays mapped, showing the file);
    /// - else a plain remap and fresh private anonymous memory with `prot` at `src` (two
    ///   calls; if the second fails the source is left unmapped: `Err`, call `mmap`).
    ///
    /// Returns the number of syscalls made. An `Err` whose call is `mremap` means
    /// nothing changed.
    pub fn mremap_move(
        &mut self,
        dst: usize,
        src: usize,
        len: usize,
        prot: Prot,
        fresh_source: bool,
    ) -> SysResult<u32> {
        self.check("mremap", dst, len)?;
        self.check("mremap", src, len)?;
        if dst < src + len && src < dst + len {
            return Err(SysError::new("mremap", Errno::INVAL));
        }
        let dont_unmap = mman::dontunmap_fixed_available();
        injected_failure("mremap")?;
        // SAFETY: both ranges are the grant's and do not overlap; the old contents of
        // dst are replaced, which is what a move asks for.
        unsafe { mman::mremap_fixed(src as *mut u8, len, dst as *mut u8, dont_unmap) }?;
        if dont_unmap && !fresh_source {
            return Ok(1);
        }
        let fresh = match injected_failure("mmap") {
            // SAFETY: `src` is inside the grant, now a hole or a range whose old contents
            // moved away; nothing else can have mapped it (the grant owner owns the span).
            Ok(()) => unsafe { mman::map_fixed(src as *mut u8, len, prot, Share::Private, Backing::Anonymous) },
            Err(e) => Err(e),
        };
        match fresh {
            // With DONTUNMAP the source is still mapped (it shows the file): a move's
            // vacated bytes are unspecified, so that is a completed move too.
            Err(_) if dont_unmap => Ok(2),
            Err(e) => Err(e),
            Ok(()) => Ok(2),
        }
    }

    /// One plain `mremap(MREMAP_MAYMOVE|MREMAP_FIXED)` of `[src, src+len)` to
    /// `[dst, dst+len)`, leaving the source unmapped: the kernel's bare move, for
    /// measuring what a move costs at least. Map the source again with
    /// [`Grant::map_fresh`] before using it.
    pub fn mremap_unmapping_source(&mut self, dst: usize, src: usize, len: usize) -> SysResult<()> {
        self.check("mremap", dst, len)?;
        self.check("mremap", src, len)?;
        if dst < src + len && src < dst + len {
            return Err(SysError::new("mremap", Errno::INVAL));
        }
        // SAFETY: both ranges are the grant's and do not overlap; dst's old contents are
        // replaced and src becomes a hole inside the grant, which only its owner maps.
        unsafe { mman::mremap_fixed(src as *mut u8, len, dst as *mut u8, false) }
    }

    /// Maps fresh private anonymous read-write memory over `[addr, addr+len)`
    /// (`MAP_FIXED`): its old contents are gone, and it reads as zeros.
    pub fn map_fresh(&mut self, addr: usize, len: usize) -> SysResult<()> {
        self.check("mmap", addr, len)?;
        // SAFETY: the range is the grant's (a hole or memory whose contents the caller
        // gives up); nothing else maps into a grant.
        unsafe { mman::map_fixed(addr as *mut u8, len, Prot::READ | Prot::WRITE, Share::Private, Backing::Anonymous) }
    }

    /// True when the page at `addr` is resident (`mincore` of one page): a constant-cost
    /// sample of whether a range holds pages.
    pub fn page_resident(&self, addr: usize) -> SysResult<bool> {
        self.check("mincore", addr, crate::sys::page_size())?;
        mman::page_resident(addr as *const u8)
    }

    /// Drops the pages of `ranges` (`MADV_DONTNEED`): afterwards they are empty and read
    /// as zeros. One `process_madvise` per 1024 ranges when the kernel allows it on
    /// ourselves (one TLB flush per call), else one `madvise` each. A single range is one
    /// `madvise`: `process_madvise` first looks the process up through its pidfd, which
    /// costs ~0.4 µs more per call here. Returns syscalls made.
    pub fn zap(&mut self, ranges: &[(usize, usize)]) -> SysResult<u32> {
        for &(a, l) in ranges {
            self.check("madvise(DONTNEED)", a, l)?;
        }
        injected_failure("madvise(DONTNEED)")?;
        let mut calls = 0;
        if let Some(pidfd) = self_pidfd().filter(|_| ranges.len() > 1) {
            let mut ok = true;
            for chunk in ranges.chunks(1024) {
                let iov: Vec<libc::iovec> =
                    chunk.iter().map(|&(a, l)| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: l }).collect();
                let want: usize = chunk.iter().map(|r| r.1).sum();
                // SAFETY: every range lies in the grant; DONTNEED empties them, which the
                // caller asked for. The iovec array is live for the call.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        pidfd_raw(pidfd),
                        iov.as_ptr(),
                        iov.len(),
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                calls += 1;
                if r < 0 || r as usize != want {
                    ok = false;
                    break;
                }
            }
            if ok {
                return Ok(calls);
            }
        }
        for &(a, l) in ranges {
            // SAFETY: the range lies in the grant and the caller wants it emptied.
            match unsafe { mman::madvise(a as *mut u8, l, mman::Advice::LinuxDontNeed) } {
                // DONTNEED refuses mlocked ranges (EINVAL); DONTNEED_LOCKED (5.18+)
                // empties them, and they stay locked.
                Err(e) if e.errno == Errno::INVAL => {
                    calls += 1;
                    // SAFETY: as above.
                    unsafe { mman::madvise(a as *mut u8, l, mman::Advice::LinuxDontneedLocked) }?;
                }
                r => r?,
            }
            calls += 1;
        }
        Ok(calls)
    }

    /// Lets the kernel free the pages of `[addr, addr+len)` when it needs memory
    /// (`MADV_FREE`): until then they stay mapped and a write cancels the free for
    /// its page (which keeps the write and its other old bytes); a page freed first
    /// reads as zeros. Private anonymous memory only (the kernel refuses the rest).
    pub fn free_lazily(&mut self, addr: usize, len: usize) -> SysResult<()> {
        self.check("madvise(FREE)", addr, len)?;
        // SAFETY: the range lies in the grant; the caller gives up its contents (each
        // page keeps them or reads zeros), which no Rust reference relies on.
        unsafe { mman::madvise(addr as *mut u8, len, mman::Advice::LinuxFree) }
    }
}

/// `UFFDIO_MOVE` from one grant to another (e.g. into a scratch area); as
/// [`Grant::uffd_move`].
pub fn uffd_move_across(
    uffd: &Userfaultfd,
    dst_g: &mut Grant<'_>,
    dst: usize,
    src_g: &mut Grant<'_>,
    src: usize,
    len: usize,
    allow_src_holes: bool,
) -> Result<usize, Partial> {
    let bad = |e: SysError| Partial { done: 0, error: e };
    dst_g.check("ioctl(UFFDIO_MOVE)", dst, len).map_err(bad)?;
    src_g.check("ioctl(UFFDIO_MOVE)", src, len).map_err(bad)?;
    // SAFETY: each range lies in a grant we hold mutably; entries move within our own
    // address space.
    unsafe { uffd.move_pages(dst as *mut u8, src as *mut u8, len, holes_mode(allow_src_holes)) }
}

/// Exchanges mappings so that `[dst, dst+len)` gets the pages of `[src, src+len)`
/// and `src` gets the destination's old pages, with three
/// `mremap(MREMAP_MAYMOVE|MREMAP_FIXED|MREMAP_DONTUNMAP)` calls through `[scratch,
/// scratch+len)`: dst -> scratch, src -> dst, scratch -> src. Nothing is freed and no
/// range is ever unmapped (DONTUNMAP leaves each vacated range mapped and empty), and
/// with 2 MiB-aligned addresses each call moves whole page tables. On failure the
/// mappings are put back as they were. Returns the number of syscalls made.
pub fn mremap_exchange(
    mem: &mut Grant<'_>,
    dst: usize,
    src: usize,
    scratch_g: &mut Grant<'_>,
    scratch: usize,
    len: usize,
) -> SysResult<u32> {
    mem.check("mremap", dst, len)?;
    mem.check("mremap", src, len)?;
    scratch_g.check("mremap", scratch, len)?;
    if dst < src + len && src < dst + len {
        return Err(SysError::new("mremap", Errno::INVAL));
    }
    let mv = |from: usize, to: usize| {
        // SAFETY: every range is inside a grant held mutably (the two user ranges and
        // the scratch area are disjoint); DONTUNMAP leaves `from` mapped and empty.
        unsafe { mman::mremap_fixed(from as *mut u8, len, to as *mut u8, true) }
    };
    injected_failure("mremap")?;
    mv(dst, scratch)?;
    if let Err(e) = mv(src, dst) {
        // Put the destination's pages back where they were.
        mv(scratch, dst)?;
        return Err(e);
    }
    // The move is done; if the last leg fails the source is simply left empty.
    Ok(if mv(scratch, src).is_ok() { 3 } else { 2 })
}

pub use mman::dontunmap_fixed_available;

/// Fault injection for tests: [`fail_call`] makes the `n`th call (from 1) that changes
/// memory (`mremap`, the `mmap` after it, `madvise`) on this thread fail with `ENOMEM`
/// before it does anything, as a kernel out of VMAs or memory would.
#[cfg(test)]
mod inject {
    use std::cell::Cell;

    thread_local! {
        pub(super) static COUNTDOWN: Cell<u32> = const { Cell::new(0) };
    }
}

/// See [`mod@inject`]: `0` turns injection off.
#[cfg(test)]
pub fn fail_call(n: u32) {
    inject::COUNTDOWN.with(|c| c.set(n));
}

#[cfg(test)]
fn injected_failure(call: &'static str) -> SysResult<()> {
    inject::COUNTDOWN.with(|c| match c.get() {
        0 => Ok(()),
        1 => {
            c.set(0);
            Err(SysError::new(call, Errno::NOMEM))
        }
        n => {
            c.set(n - 1);
            Ok(())
        }
    })
}

#[cfg(not(test))]
#[inline(always)]
fn injected_failure(_call: &'static str) -> SysResult<()> {
    Ok(())
}

fn holes_mode(allow: bool) -> u64 {
    if allow {
        uffd::MOVE_MODE_ALLOW_SRC_HOLES
    } else {
        0
    }
}

/// Copies bytes from one grant to another (`memmove`).
pub fn copy_across(dst_g: &mut Grant<'_>, dst: usize, src_g: &Grant<'_>, src: usize, len: usize) -> SysResult<()> {
    dst_g.check("memmove", dst, len)?;
    src_g.check("memmove", src, len)?;
    // SAFETY: both ranges lie in grants (the destination held mutably); memmove allows
    // overlap should the grants share addresses.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

fn pidfd_raw(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

/// A pidfd of this process, when `process_madvise(MADV_DONTNEED)` on ourselves works
/// (Linux 6.13+ accepts any advice for the calling process). Per process: a forked
/// child's would otherwise name its parent. Made twice, the loser's fd is closed.
/// Out of fds or memory (EMFILE, ENFILE, ENOMEM) nothing is kept: the next call asks
/// again, so a moment without fds does not cost the process this path for good.
fn self_pidfd() -> Option<&'static OwnedFd> {
    static FD: crate::sys::process::PerProcess<Option<OwnedFd>> = crate::sys::process::PerProcess::new();
    FD.try_get(|| {
        let fd = match crate::sys::process::pidfd_open(std::process::id() as i32) {
            Ok(fd) => fd,
            Err(e) => return if crate::sys::out_of_resources(e.raw_errno()) { Err(()) } else { Ok(None) },
        };
        // Probe on an empty page of our own.
        let m = Mapping::anonymous(crate::sys::page_size()).map_err(|_| ())?;
        let iov = libc::iovec { iov_base: m.as_ptr().cast(), iov_len: m.len() };
        // SAFETY: the page is ours and holds nothing.
        let r = unsafe { libc::syscall(libc::SYS_process_madvise, pidfd_raw(&fd), &iov, 1, libc::MADV_DONTNEED, 0) };
        Ok((r == m.len() as i64).then_some(fd))
    })
    .ok()
    .and_then(|fd| fd.as_ref())
}

/// An owned private anonymous read-write mapping: the safe home of a [`Grant`].
#[derive(Debug)]
pub struct RwMapping {
    map: Mapping,
}

impl RwMapping {
    /// Maps `len` bytes (a multiple of the page size) aligned to `align` (a power of two
    /// no smaller than the page size), with `MADV_HUGEPAGE` when `huge`.
    pub fn new(len: usize, align: usize, huge: bool) -> SysResult<Self> {
        let ps = crate::sys::page_size();
        if len == 0 || len % ps != 0 || !align.is_power_of_two() || align < ps {
            return Err(SysError::new("mmap", Errno::INVAL));
        }
        // Reserve len + align, then map the aligned part over it and give back the rest.
        let span = len.checked_add(align).ok_or(SysError::new("mmap", Errno::NOMEM))?;
        let res = Mapping::reserve(span)?;
        let base = (res.addr() + align - 1) & !(align - 1);
        let (ptr, _) = res.into_raw();
        let head = base - ptr.as_ptr() as usize;
        let tail = span - head - len;
        // SAFETY: the whole span is our fresh reservation; nothing references it.
        unsafe {
            if let Err(e) = mman::map_fixed_rw_anonymous(base as *mut u8, len) {
                let _ = mman::munmap(ptr.as_ptr(), span);
                return Err(e);
            }
            if head > 0 {
                mman::munmap(ptr.as_ptr(), head)?;
            }
            if tail > 0 {
                mman::munmap((base + len) as *mut u8, tail)?;
            }
            if huge {
                let _ = mman::madvise(base as *mut u8, len, mman::Advice::LinuxHugepage);
            }
        }
        // SAFETY: [base, base+len) is a mapping we own and nobody else unmaps.
        let map = unsafe { Mapping::from_raw(std::ptr::NonNull::new(base as *mut u8).expect("non-null"), len) };
        Ok(Self { map })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.map.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The bytes (empty pages read as zeros).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is ours, read-write for its whole life (no API changes its
        // protection), and `&self` excludes writers through this type.
        unsafe { self.map.as_slice() }
    }
    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { self.map.as_mut_slice() }
    }
    /// `MADV_MERGEABLE` (or `UNMERGEABLE`) over the whole mapping.
    pub fn set_mergeable(&self, on: bool) -> SysResult<()> {
        let advice = if on { mman::Advice::LinuxMergeable } else { mman::Advice::LinuxUnmergeable };
        // SAFETY: KSM advice never changes what the pages read as.
        unsafe { mman::madvise(self.map.as_ptr(), self.map.len(), advice) }
    }
    /// Faults every page in (contents unchanged).
    pub fn populate(&self, write: bool) -> SysResult<()> {
        self.map.populate(write)
    }
    /// A grant over the whole mapping, for as long as `self` is borrowed.
    pub fn grant(&mut self) -> Grant<'_> {
        Grant { start: self.addr(), end: self.addr() + self.len(), known: Known::PrivateAnonRw, _mem: PhantomData }
    }
    /// As [`RwMapping::grant`], but the operations check the memory with the kernel as
    /// they do for raw addresses (to measure what raw-address callers pay).
    pub fn grant_as_raw(&mut self) -> Grant<'_> {
        Grant { known: Known::Unchecked, ..self.grant() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_refuses_ranges_outside_it() {
        let ps = crate::sys::page_size();
        let mut m = RwMapping::new(4 * ps, ps, false).unwrap();
        let base = m.addr();
        let mut g = m.grant();
        assert_eq!(g.memmove(base, base + 3 * ps, 2 * ps).unwrap_err().errno, Errno::FAULT);
        assert_eq!(g.swap_bytes(base, base + ps, 2 * ps).unwrap_err().errno, Errno::INVAL);
        g.fill(base, ps, 7).unwrap();
        g.memmove(base + ps, base, ps).unwrap();
        assert!(m.bytes()[ps..2 * ps].iter().all(|&b| b == 7));
    }

    #[test]
    fn aligned_mapping_and_vectored_zap() {
        let ps = crate::sys::page_size();
        let mut m = RwMapping::new(8 * ps, 2 << 20, false).unwrap();
        assert_eq!(m.addr() % (2 << 20), 0);
        m.bytes_mut().fill(9);
        let base = m.addr();
        let calls = m.grant().zap(&[(base, ps), (base + 4 * ps, 2 * ps)]).unwrap();
        assert!(calls >= 1);
        let b = m.bytes();
        assert!(b[..ps].iter().all(|&x| x == 0) && b[ps..4 * ps].iter().all(|&x| x == 9));
        assert!(b[4 * ps..6 * ps].iter().all(|&x| x == 0) && b[6 * ps..].iter().all(|&x| x == 9));
    }

    /// A mapping larger than RAM and swap together is made (pages are charged when
    /// touched), as one VMA: one mmap of it was refused as an obvious overcommit.
    #[test]
    fn a_mapping_larger_than_ram_and_swap_is_one_vma() {
        let kib = |key: &str| -> usize {
            let text = std::fs::read_to_string("/proc/meminfo").unwrap();
            let line = text.lines().find(|l| l.starts_with(key)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap().trim() == "2" {
            return eprintln!("skipped: strict overcommit (mode 2) refuses it, as it should");
        }
        let len = ((kib("MemTotal:") + kib("SwapTotal:")) * 1024 * 2).next_multiple_of(1 << 30);
        let mut m = RwMapping::new(len, 2 << 20, false).unwrap();
        let vma = crate::sys::procmap::query(m.addr()).unwrap().unwrap();
        // (a neighbour of the same kind may have merged into it)
        assert!(vma.start <= m.addr() && vma.end >= m.addr() + len, "{vma:?}");
        let last = m.len() - 1;
        m.bytes_mut()[last] = 1;
        assert_eq!(m.bytes()[last], 1);
    }
}
