//! userfaultfd's SIGBUS mode, measured: a missing-page fault raises SIGBUS on the
//! faulting thread, whose handler resolves it with `UFFDIO_ZEROPAGE` itself, with no
//! round trip to a handler thread. Used to price the pager's handler-thread design.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::mman::Mapping;
use super::uffd::{self, Userfaultfd};
use super::{page_size, SysError, SysResult};

static FD: AtomicI32 = AtomicI32::new(-1);
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
static PS: AtomicUsize = AtomicUsize::new(4096);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[repr(C)]
struct Zeropage {
    start: u64,
    len: u64,
    mode: u64,
    zeropage: i64,
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let ps = PS.load(Ordering::Relaxed);
    let page = addr & !(ps - 1);
    if page < START.load(Ordering::Relaxed) || page >= END.load(Ordering::Relaxed) {
        // not ours: the default action, when the access is retried
        // SAFETY: signal() is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        return;
    }
    let mut z = Zeropage { start: page as u64, len: ps as u64, mode: 0, zeropage: 0 };
    // SAFETY: ioctl is async-signal-safe; the struct lives for the call and the range
    // is a page of the registered measuring mapping;
    // UFFDIO_ZEROPAGE, whose number sys::uffd checks against the kernel header
    if unsafe { libc::ioctl(FD.load(Ordering::Relaxed), 0xC020_AA04u64 as _, &mut z) } < 0
        && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
    {
        // unresolvable: die of the retried fault rather than loop on it
        // SAFETY: signal() is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
    }
}

/// Time per fault when `pages` missing-page faults are each resolved on the faulting
/// thread from its SIGBUS handler; `Ok(None)` when the kernel lacks the SIGBUS feature.
pub fn zero_fill_cost(pages: usize) -> SysResult<Option<Duration>> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let info = Userfaultfd::probe()?;
    if info.features & uffd::feature::SIGBUS == 0 {
        return Ok(None);
    }
    let fd = Userfaultfd::new(uffd::feature::SIGBUS, true)?;
    let ps = page_size();
    let map = Mapping::anonymous(pages.max(1) * ps)?;
    // SAFETY: the mapping is ours; every fault in it is resolved by the handler below.
    unsafe { fd.register(map.as_ptr(), map.len(), uffd::mode::MISSING) }?;
    use std::os::fd::AsRawFd;
    FD.store(fd.as_fd().as_raw_fd(), Ordering::Relaxed);
    PS.store(ps, Ordering::Relaxed);
    START.store(map.addr(), Ordering::Relaxed);
    END.store(map.addr() + map.len(), Ordering::Relaxed);
    // SAFETY: sigaction structs are plain data; zeroed is an empty mask.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    new.sa_flags = libc::SA_SIGINFO;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: live structs; the handler uses only atomics and ioctl.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } < 0 {
        return Err(SysError::last("sigaction"));
    }
    let t = Instant::now();
    for i in 0..pages {
        // SAFETY: inside the mapping; the fault is resolved by the handler.
        unsafe { std::ptr::write_volatile(map.as_ptr().add(i * ps), 1) };
    }
    let spent = t.elapsed();
    // SAFETY: restores the disposition sigaction gave us.
    unsafe { libc::sigaction(libc::SIGBUS, &old, std::ptr::null_mut()) };
    START.store(0, Ordering::Relaxed);
    END.store(0, Ordering::Relaxed);
    let _ = fd.unregister(map.as_ptr(), map.len());
    Ok(Some(spent / pages.max(1) as u32))
}
