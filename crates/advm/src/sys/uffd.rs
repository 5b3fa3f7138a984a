//! userfaultfd: API handshake, register, COPY, ZEROPAGE, MOVE, WRITEPROTECT, CONTINUE.
//!
//! The ioctl numbers and structs are written here by hand: Debian 12's kernel headers
//! (and the libc crate) predate `UFFDIO_MOVE` (Linux 6.8) and `UFFD_FEATURE_WP_ASYNC`.
//! Values follow `include/uapi/linux/userfaultfd.h`; `_IOC` encoding is
//! `dir << 30 | size << 16 | type << 8 | nr` with `type = 0xAA`.
// The whole userfaultfd family is wrapped here: remap uses UFFDIO_MOVE, the pager
// (src/pager/, through sys/pager.rs) registers, moves, copies, zero-fills, wakes and
// reads events; write-protect and CONTINUE are kept for their coming users rather than
// written twice.
#![allow(dead_code)]

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use rustix::io::Errno;
use rustix::mm::UserfaultfdFlags;

use super::{SysError, SysResult};

const UFFD_API: u64 = 0xAA;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xAA << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_CONTINUE: u64 = iowr(0x07, 32);
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// Feature bits of the API handshake (`UFFD_FEATURE_*`).
pub mod feature {
    /// Write-protect faults are reported (anonymous memory).
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// fork() events.
    pub const EVENT_FORK: u64 = 1 << 1;
    /// mremap() events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// madvise(DONTNEED/REMOVE) events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// Missing faults on hugetlbfs.
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    /// Missing faults on shmem (memfd).
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// munmap() events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Faults raise SIGBUS instead of being reported.
    pub const SIGBUS: u64 = 1 << 7;
    /// The faulting thread id is reported.
    pub const THREAD_ID: u64 = 1 << 8;
    /// Minor faults on hugetlbfs.
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// Minor faults on shmem: page in the page cache, not yet in the page table.
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// The exact fault address is reported.
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    /// Write protection of hugetlbfs and shmem.
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// Write protection of not-yet-populated ptes.
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// UFFDIO_POISON.
    pub const POISON: u64 = 1 << 14;
    /// Write protection resolved by the kernel, for dirty tracking (Linux 6.7).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// UFFDIO_MOVE (Linux 6.8).
    pub const MOVE: u64 = 1 << 16;

    /// Name and bit of every known feature, for reports.
    pub const ALL: &[(&str, u64)] = &[
        ("PAGEFAULT_FLAG_WP", PAGEFAULT_FLAG_WP),
        ("EVENT_FORK", EVENT_FORK),
        ("EVENT_REMAP", EVENT_REMAP),
        ("EVENT_REMOVE", EVENT_REMOVE),
        ("MISSING_HUGETLBFS", MISSING_HUGETLBFS),
        ("MISSING_SHMEM", MISSING_SHMEM),
        ("EVENT_UNMAP", EVENT_UNMAP),
        ("SIGBUS", SIGBUS),
        ("THREAD_ID", THREAD_ID),
        ("MINOR_HUGETLBFS", MINOR_HUGETLBFS),
        ("MINOR_SHMEM", MINOR_SHMEM),
        ("EXACT_ADDRESS", EXACT_ADDRESS),
        ("WP_HUGETLBFS_SHMEM", WP_HUGETLBFS_SHMEM),
        ("WP_UNPOPULATED", WP_UNPOPULATED),
        ("POISON", POISON),
        ("WP_ASYNC", WP_ASYNC),
        ("MOVE", MOVE),
    ];
}

/// Register modes (`UFFDIO_REGISTER_MODE_*`).
pub mod mode {
    /// Report faults on missing pages.
    pub const MISSING: u64 = 1 << 0;
    /// Report writes to write-protected pages.
    pub const WP: u64 = 1 << 1;
    /// Report minor faults (shmem/hugetlbfs).
    pub const MINOR: u64 = 1 << 2;
}

/// Fault flags in a page-fault event (`UFFD_PAGEFAULT_FLAG_*`).
pub mod fault_flag {
    /// The fault was a write.
    pub const WRITE: u64 = 1 << 0;
    /// The fault was a write to a write-protected page.
    pub const WP: u64 = 1 << 1;
    /// The fault was a minor fault.
    pub const MINOR: u64 = 1 << 2;
}

/// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`: holes in the source are skipped, not errors.
pub const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
/// `UFFDIO_*_MODE_DONTWAKE` for COPY/ZEROPAGE/MOVE: do not wake faulting threads.
pub const MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP`: the copied page is installed write-protected.
pub const COPY_MODE_WP: u64 = 1 << 1;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

/// How the userfaultfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The userfaultfd(2) syscall.
    Syscall,
    /// The userfaultfd(2) syscall restricted to user-mode faults (UFFD_USER_MODE_ONLY).
    SyscallUserModeOnly,
    /// The /dev/userfaultfd device (Linux 6.1+).
    Device,
}

/// A work item that stopped part-way: `done` bytes were handled before `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{error} after {done} bytes")]
pub struct Partial {
    /// Bytes handled before the failure.
    pub done: usize,
    /// What stopped the work (`EAGAIN`: retry the rest; `EEXIST`: already mapped).
    pub error: SysError,
}

/// A fault or event read from a userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A thread faulted at `address` (see [`fault_flag`]).
    Pagefault {
        /// Faulting address (page aligned unless EXACT_ADDRESS).
        address: u64,
        /// [`fault_flag`] bits.
        flags: u64,
    },
    /// The process forked; the child's userfaultfd is attached.
    Fork,
    /// A registered range moved with mremap.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length.
        len: u64,
    },
    /// `[start, end)` was zapped by madvise.
    Remove {
        /// Start.
        start: u64,
        /// End.
        end: u64,
    },
    /// `[start, end)` was unmapped.
    Unmap {
        /// Start.
        start: u64,
        /// End.
        end: u64,
    },
    /// An event this code does not know.
    Other(u8),
}

/// What the API handshake granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiInfo {
    /// Granted (or, when probing, supported) feature bits.
    pub features: u64,
    /// Bitmask of ioctls available on the fd (bit n = ioctl nr n).
    pub ioctls: u64,
    /// How the fd was obtained.
    pub source: Source,
}

impl ApiInfo {
    /// Whether the fd is the user-mode-only kind ([`Userfaultfd::new`] refuses it).
    pub fn user_mode_only(&self) -> bool {
        self.source == Source::SyscallUserModeOnly
    }
}

/// An owned userfaultfd after a successful API handshake.
///
/// Whoever holds it decides how faults in registered ranges are resolved, which is
/// why registering and resolving are `unsafe`.
#[derive(Debug)]
pub struct Userfaultfd {
    fd: OwnedFd,
    info: ApiInfo,
}

/// What a user who is refused a full userfaultfd needs for one (the kernel has
/// userfaultfd; the user-mode-only kind does not count).
pub const FULL_NEEDS: &str = "a userfaultfd that sees faults taken inside system calls: root (CAP_SYS_PTRACE), \
                              or sysctl vm.unprivileged_userfaultfd=1, or read-write access to /dev/userfaultfd";

/// Opens a raw userfaultfd, trying the syscall, then /dev/userfaultfd, then (only with
/// `user_mode_only_ok`) the syscall in user-mode-only mode (firecracker and
/// userfaultfd-rs probe in this order). A user-mode-only fd is not handed the faults
/// the kernel takes inside a system call (`read(2)` into a registered range, `write(2)`
/// from it, futexes on it): those fail with EFAULT instead of waiting for the fd.
fn open_raw(nonblocking: bool, user_mode_only_ok: bool) -> SysResult<(OwnedFd, Source)> {
    let mut flags = UserfaultfdFlags::CLOEXEC;
    if nonblocking {
        flags |= UserfaultfdFlags::NONBLOCK;
    }
    // SAFETY: creating a userfaultfd hands out no access until ranges are registered.
    let first = match unsafe { rustix::mm::userfaultfd(flags) } {
        Ok(fd) => return Ok((fd, Source::Syscall)),
        Err(e) => e,
    };
    if first == Errno::NOSYS {
        return Err(SysError::new("userfaultfd", first));
    }
    let dev = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open("/dev/userfaultfd");
    if let Ok(dev) = dev {
        let raw_flags = flags.bits() as libc::c_ulong;
        // SAFETY: USERFAULTFD_IOC_NEW takes the O_* flags by value and returns a new fd.
        let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, raw_flags) };
        if fd >= 0 {
            // SAFETY: the ioctl returned a fresh fd that nobody else owns.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, Source::Device));
        }
    }
    if !user_mode_only_ok {
        return Err(SysError::new("userfaultfd", first));
    }
    // SAFETY: as above; user-mode-only fds only see faults from user space.
    match unsafe {
        rustix::mm::userfaultfd(flags | UserfaultfdFlags::from_bits_retain(1 /* UFFD_USER_MODE_ONLY */))
    } {
        Ok(fd) => Ok((fd, Source::SyscallUserModeOnly)),
        // Out of fds or memory says more than the first attempt's refusal (EPERM for a
        // user without the privilege): it goes when they are freed.
        Err(e) if super::out_of_resources(e.raw_os_error()) => Err(SysError::new("userfaultfd", e)),
        Err(_) => Err(SysError::new("userfaultfd", first)),
    }
}

fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T, call: &'static str) -> SysResult<()> {
    // SAFETY: `arg` is a live, correctly sized #[repr(C)] struct matching `req`'s size
    // field, and the ioctls touch no memory other than that struct (callers of the
    // memory-changing ioctls are themselves unsafe fns).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        Err(SysError::last(call))
    } else {
        Ok(())
    }
}

/// Turns a COPY/ZEROPAGE/MOVE result into bytes done or a [`Partial`].
fn outcome(r: SysResult<()>, count: i64, call: &'static str) -> Result<usize, Partial> {
    match r {
        Ok(()) => Ok(count.max(0) as usize),
        Err(e) => {
            let done = count.max(0) as usize;
            // The kernel stores -errno in the count field when nothing was done.
            let errno = if count < 0 { Errno::from_raw_os_error((-count) as i32) } else { e.errno };
            Err(Partial { done, error: SysError::new(call, errno) })
        }
    }
}

impl Userfaultfd {
    /// Probes what the kernel supports: opens a fd, performs the handshake asking for
    /// nothing, and returns every supported feature and ioctl.
    /// The user-mode-only kind counts ([`ApiInfo::source`] says which kind it was).
    pub fn probe() -> SysResult<ApiInfo> {
        let (fd, source) = open_raw(true, true)?;
        let mut api = UffdioApi { api: UFFD_API, ..Default::default() };
        ioctl(&fd, UFFDIO_API, &mut api, "ioctl(UFFDIO_API)")?;
        Ok(ApiInfo { features: api.features, ioctls: api.ioctls, source })
    }

    /// Opens a userfaultfd and enables `features` (an `EINVAL` handshake means one of
    /// them is not supported: check with [`Userfaultfd::probe`] first).
    /// Never the user-mode-only kind: where only that one is granted, the refusal of
    /// the full kind (EPERM, or EACCES) is returned.
    pub fn new(features: u64, nonblocking: bool) -> SysResult<Self> {
        Self::open(features, nonblocking, false)
    }

    /// [`Userfaultfd::new`], taking the user-mode-only kind where the full one is
    /// refused: only for ranges no system call of the program touches while a fault
    /// there would wait for the fd (such a call would get EFAULT).
    pub fn new_user_mode_only_ok(features: u64, nonblocking: bool) -> SysResult<Self> {
        Self::open(features, nonblocking, true)
    }

    fn open(features: u64, nonblocking: bool, user_mode_only_ok: bool) -> SysResult<Self> {
        let (fd, source) = open_raw(nonblocking, user_mode_only_ok)?;
        let mut api = UffdioApi { api: UFFD_API, features, ioctls: 0 };
        ioctl(&fd, UFFDIO_API, &mut api, "ioctl(UFFDIO_API)")?;
        Ok(Self { fd, info: ApiInfo { features: api.features, ioctls: api.ioctls, source } })
    }

    /// What the handshake granted.
    pub fn info(&self) -> ApiInfo {
        self.info
    }

    /// The fd, for poll/epoll.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Registers `[addr, addr+len)` with [`mode`] bits; returns the ioctls allowed on it.
    ///
    /// # Safety
    /// Afterwards, faults in the range block (or SIGBUS) until this fd resolves them:
    /// the caller must service them or guarantee that nothing touches the range.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, mode_bits: u64) -> SysResult<u64> {
        let mut reg =
            UffdioRegister { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: mode_bits, ioctls: 0 };
        ioctl(&self.fd, UFFDIO_REGISTER, &mut reg, "ioctl(UFFDIO_REGISTER)")?;
        Ok(reg.ioctls)
    }

    /// Unregisters `[addr, addr+len)`; blocked faulting threads are woken.
    pub fn unregister(&self, addr: *mut u8, len: usize) -> SysResult<()> {
        let mut range = UffdioRange { start: addr as u64, len: len as u64 };
        ioctl(&self.fd, UFFDIO_UNREGISTER, &mut range, "ioctl(UFFDIO_UNREGISTER)")
    }

    /// Wakes threads waiting on faults in `[addr, addr+len)`.
    pub fn wake(&self, addr: *mut u8, len: usize) -> SysResult<()> {
        let mut range = UffdioRange { start: addr as u64, len: len as u64 };
        ioctl(&self.fd, UFFDIO_WAKE, &mut range, "ioctl(UFFDIO_WAKE)")
    }

    /// Atomically fills the missing pages of `[dst, dst+len)` with a copy of `src`.
    ///
    /// # Safety
    /// `dst` must be a registered range of the caller's; `src` must be readable for `len`.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize, mode_bits: u64) -> Result<usize, Partial> {
        let mut c = UffdioCopy { dst: dst as u64, src: src as u64, len: len as u64, mode: mode_bits, copy: 0 };
        let r = ioctl(&self.fd, UFFDIO_COPY, &mut c, "ioctl(UFFDIO_COPY)");
        outcome(r, c.copy, "ioctl(UFFDIO_COPY)")
    }

    /// Maps the zero page at the missing pages of `[dst, dst+len)`.
    ///
    /// # Safety
    /// `dst` must be a registered range of the caller's.
    pub unsafe fn zeropage(&self, dst: *mut u8, len: usize, mode_bits: u64) -> Result<usize, Partial> {
        let mut z =
            UffdioZeropage { range: UffdioRange { start: dst as u64, len: len as u64 }, mode: mode_bits, zeropage: 0 };
        let r = ioctl(&self.fd, UFFDIO_ZEROPAGE, &mut z, "ioctl(UFFDIO_ZEROPAGE)");
        outcome(r, z.zeropage, "ioctl(UFFDIO_ZEROPAGE)")
    }

    /// Moves the page-table entries of `[src, src+len)` to the empty range
    /// `[dst, dst+len)` (Linux 6.8+). The source becomes unpopulated.
    ///
    /// # Safety
    /// Both ranges must belong to the caller; `dst` must lie in a range registered on
    /// this fd. Contents move: nothing may hold references into `src`.
    pub unsafe fn move_pages(&self, dst: *mut u8, src: *mut u8, len: usize, mode_bits: u64) -> Result<usize, Partial> {
        let mut m = UffdioCopy { dst: dst as u64, src: src as u64, len: len as u64, mode: mode_bits, copy: 0 };
        let r = ioctl(&self.fd, UFFDIO_MOVE, &mut m, "ioctl(UFFDIO_MOVE)");
        outcome(r, m.copy, "ioctl(UFFDIO_MOVE)")
    }

    /// Sets (`protect`) or clears write protection on `[addr, addr+len)`.
    ///
    /// # Safety
    /// The range must be registered with [`mode::WP`]; setting protection makes writes
    /// fault to this fd (unless WP_ASYNC), which the caller must then service.
    pub unsafe fn write_protect(&self, addr: *mut u8, len: usize, protect: bool, wake: bool) -> SysResult<()> {
        let mut mode_bits = if protect { 1 } else { 0 };
        if !wake {
            mode_bits |= 1 << 1;
        }
        let mut wp = UffdioWriteprotect { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: mode_bits };
        ioctl(&self.fd, UFFDIO_WRITEPROTECT, &mut wp, "ioctl(UFFDIO_WRITEPROTECT)")
    }

    /// Maps the page-cache pages already present behind `[addr, addr+len)` (minor faults).
    ///
    /// # Safety
    /// The range must be registered with [`mode::MINOR`] by the caller.
    pub unsafe fn continue_range(&self, addr: *mut u8, len: usize) -> Result<usize, Partial> {
        let mut c = UffdioContinue { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: 0, mapped: 0 };
        let r = ioctl(&self.fd, UFFDIO_CONTINUE, &mut c, "ioctl(UFFDIO_CONTINUE)");
        outcome(r, c.mapped, "ioctl(UFFDIO_CONTINUE)")
    }

    /// Reads one event; `Ok(None)` when none is pending on a non-blocking fd.
    pub fn read_event(&self) -> SysResult<Option<Event>> {
        let mut msg = [0u8; 32];
        match rustix::io::read(&self.fd, &mut msg) {
            Ok(32) => Ok(Some(decode_msg(&msg))),
            Ok(_) => Err(SysError::new("read(userfaultfd)", Errno::IO)),
            Err(Errno::AGAIN) => Ok(None),
            Err(e) => Err(SysError::new("read(userfaultfd)", e)),
        }
    }
}

fn decode_msg(msg: &[u8; 32]) -> Event {
    let word = |i: usize| u64::from_ne_bytes(msg[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
    match msg[0] {
        0x12 => Event::Pagefault { flags: word(0), address: word(1) },
        0x13 => Event::Fork,
        0x14 => Event::Remap { from: word(0), to: word(1), len: word(2) },
        0x15 => Event::Remove { start: word(0), end: word(1) },
        0x16 => Event::Unmap { start: word(0), end: word(1) },
        other => Event::Other(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user who gets only a user-mode-only userfaultfd, out of fds, is told EMFILE
    /// (the pager says so and a later try works), not the first attempt's EPERM, which
    /// the pager took for "no userfaultfd on this kernel" (ENOSYS from the C API).
    #[test]
    fn out_of_fds_is_reported_as_such_to_an_unprivileged_user() {
        let code = super::super::process::run_unprivileged(|| {
            if !matches!(open_raw(true, true), Ok((_, Source::SyscallUserModeOnly))) {
                eprintln!("skipped: this user gets a full userfaultfd here, or none");
                return 0;
            }
            let mut low = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            low.current = Some(64);
            if rustix::process::setrlimit(rustix::process::Resource::Nofile, low).is_err() {
                return 3;
            }
            let held: Vec<_> = (0..64).map_while(|_| std::fs::File::open("/dev/null").ok()).collect();
            let got = Userfaultfd::probe().map(|_| ()).map_err(|e| e.errno);
            drop(held);
            if got == Err(Errno::MFILE) {
                0
            } else {
                eprintln!("got {got:?}");
                1
            }
        })
        .unwrap();
        assert_eq!(code, 0);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xC020_AA04);
        assert_eq!(UFFDIO_MOVE, 0xC028_AA05);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
    }

    #[test]
    fn decodes_pagefault_message() {
        let mut msg = [0u8; 32];
        msg[0] = 0x12;
        msg[8..16].copy_from_slice(&1u64.to_ne_bytes());
        msg[16..24].copy_from_slice(&0x7000u64.to_ne_bytes());
        assert_eq!(decode_msg(&msg), Event::Pagefault { address: 0x7000, flags: fault_flag::WRITE });
    }

    #[test]
    fn zeropage_fills_a_registered_range() {
        let ps = crate::sys::page_size();
        let uffd = match Userfaultfd::new(0, true) {
            Ok(u) => u,
            Err(e) if matches!(e.errno, Errno::PERM | Errno::NOSYS | Errno::ACCESS) => {
                eprintln!("skipped: userfaultfd not available here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let m = crate::sys::mman::Mapping::anonymous(2 * ps).unwrap();
        // SAFETY: the range is ours, and we fill it before any access.
        unsafe {
            uffd.register(m.as_ptr(), 2 * ps, mode::MISSING).unwrap();
            assert_eq!(uffd.zeropage(m.as_ptr(), 2 * ps, 0).unwrap(), 2 * ps);
            let again = uffd.zeropage(m.as_ptr(), ps, 0).unwrap_err();
            assert_eq!(again.error.errno, Errno::EXIST);
            uffd.unregister(m.as_ptr(), 2 * ps).unwrap();
            assert!(m.as_slice().iter().all(|&b| b == 0));
        }
    }
}
