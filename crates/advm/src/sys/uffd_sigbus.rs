//! userfaultfd's SIGBUS mode: a missing-page fault in a range registered on a
//! userfaultfd opened with `UFFD_FEATURE_SIGBUS` raises SIGBUS on the faulting thread,
//! whose handler resolves it itself, with no round trip to a handler thread.
//!
//! One process-wide SIGBUS handler serves every such range through a fixed table of
//! [`Registration`]s (no allocation and no lock in the handler: it scans the table
//! with atomics and calls the range's `serve`). A SIGBUS at an address outside every
//! registered range goes to the handler that was installed before ours (or kills the
//! process, as it would have). The handler is installed once and stays: a program
//! that installs its own SIGBUS handler later must chain to the one it replaces.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::mman::Mapping;
use super::process::ForksHeld;
use super::uffd::{self, Userfaultfd};
use super::{page_size, SysError, SysResult};

/// Resolves a fault at an address of its range (`write`: the access was a write),
/// called in the signal handler: it must be async-signal-safe (no allocation, no lock
/// the faulting thread could hold). On return the access is retried.
pub type Serve = dyn Fn(usize, bool) + Send + Sync;

/// Most ranges registered at once.
const SLOTS: usize = 1024;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    serve: AtomicPtr<Box<Serve>>,
    /// Handlers running `serve` now: removal waits for them.
    busy: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the table's entries
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    serve: AtomicPtr::new(std::ptr::null_mut()),
    busy: AtomicU32::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Slots ever used: the handler scans `TABLE[..USED]`.
static USED: AtomicUsize = AtomicUsize::new(0);
/// Whether the handler is installed; set under [`ForksHeld`], which also makes
/// registration and removal one at a time (never taken by the handler). Not a
/// `Mutex`: a fork while another thread edited would leave the child's held for ever.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The disposition replaced by ours: its handler and its `sa_flags`.
static PREVIOUS: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);

/// Whether the faulting access was a write (x86-64: bit 1 of the page-fault error
/// code); elsewhere faults count as reads (a write then takes a copy-on-write fault).
fn was_write(ctx: *mut libc::c_void) -> bool {
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    {
        // SAFETY: the kernel passes its ucontext to an SA_SIGINFO handler.
        let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
        uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0
    }
    #[cfg(not(all(target_arch = "x86_64", target_env = "gnu")))]
    {
        let _ = ctx;
        false
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE[..USED.load(Ordering::Acquire)] {
        if addr < s.start.load(Ordering::Acquire) || addr >= s.end.load(Ordering::Acquire) {
            continue;
        }
        s.busy.fetch_add(1, Ordering::SeqCst);
        let f = s.serve.load(Ordering::SeqCst);
        // read again: the range changes only while `serve` is null
        let ours = addr >= s.start.load(Ordering::Acquire) && addr < s.end.load(Ordering::Acquire);
        // a retired range (null `serve`) is still ours: a fault raised before it was
        // unregistered is retried, and faults normally now
        if ours && !f.is_null() {
            // SAFETY: a non-null `serve` stays alive while `busy` counts us (see `retire`).
            unsafe { (**f)(addr, was_write(ctx)) };
        }
        s.busy.fetch_sub(1, Ordering::SeqCst);
        if ours {
            return;
        }
    }
    chain(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the disposition we replaced.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let h = PREVIOUS.load(Ordering::Acquire);
    if h == libc::SIG_IGN {
        return;
    }
    if h == libc::SIG_DFL {
        // die of it: the default again, and the signal pending for when we return
        // SAFETY: signal() and raise() are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return;
    }
    if PREVIOUS_FLAGS.load(Ordering::Acquire) & libc::SA_SIGINFO != 0 {
        // SAFETY: sigaction gave us this handler with SA_SIGINFO: its signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler, as sigaction gave it to us.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Installs the handler once (the caller holds [`ForksHeld`]).
fn install() -> SysResult<()> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: sigaction structs are plain data; zeroed is an empty mask.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    // not SA_ONSTACK: the small alternate stacks Rust gives threads cannot hold a page buffer
    new.sa_flags = libc::SA_SIGINFO;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: live structs; the handler uses atomics and the registered `serve`s only.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } < 0 {
        return Err(SysError::last("sigaction(SIGBUS)"));
    }
    PREVIOUS_FLAGS.store(old.sa_flags, Ordering::Release);
    PREVIOUS.store(old.sa_sigaction, Ordering::Release);
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// A range whose SIGBUS faults `serve` resolves, until retired; known as ours until
/// dropped (drop it only when nothing can fault there any more, i.e. at munmap).
pub struct Registration {
    slot: usize,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registration(slot {})", self.slot)
    }
}

/// Routes SIGBUS faults in `[start, start+len)` to `serve` (installing the handler on
/// first use). Fails when all slots are taken.
pub fn register(start: usize, len: usize, serve: Box<Serve>) -> SysResult<Registration> {
    let _edit = ForksHeld::take();
    install()?;
    let used = USED.load(Ordering::Acquire);
    let slot = match TABLE[..used].iter().position(|s| s.end.load(Ordering::Acquire) == 0) {
        Some(i) => i,
        None if used < SLOTS => used,
        None => return Err(SysError::new("SIGBUS ranges (at most 1024)", Errno::NOSPC)),
    };
    let s = &TABLE[slot];
    s.start.store(start, Ordering::Release);
    s.end.store(start + len, Ordering::Release);
    s.serve.store(Box::into_raw(Box::new(serve)), Ordering::SeqCst);
    if slot == used {
        USED.store(used + 1, Ordering::Release);
    }
    Ok(Registration { slot })
}

impl Registration {
    /// Stops serving faults (the range must be unregistered from its userfaultfd
    /// first): waits for the handlers running `serve`, then drops it. Faults raised
    /// before are retried from now on.
    pub fn retire(&self) {
        let s = &TABLE[self.slot];
        let f = s.serve.swap(std::ptr::null_mut(), Ordering::SeqCst);
        while s.busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        if !f.is_null() {
            // SAFETY: made by Box::into_raw in `register`; no handler uses it any more.
            drop(unsafe { Box::from_raw(f) });
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.retire();
        let _edit = ForksHeld::take();
        let s = &TABLE[self.slot];
        s.start.store(0, Ordering::Release);
        s.end.store(0, Ordering::Release);
    }
}

/// Time per fault when `pages` missing-page faults are each resolved on the faulting
/// thread with `UFFDIO_ZEROPAGE` from the SIGBUS handler; `Ok(None)` when the kernel
/// lacks the SIGBUS feature.
pub fn zero_fill_cost(pages: usize) -> SysResult<Option<Duration>> {
    let info = Userfaultfd::probe()?;
    if info.features & uffd::feature::SIGBUS == 0 {
        return Ok(None);
    }
    let fd = std::sync::Arc::new(Userfaultfd::new(uffd::feature::SIGBUS, true)?);
    let ps = page_size();
    let map = Mapping::anonymous(pages.max(1) * ps)?;
    // SAFETY: the mapping is ours; every fault in it is resolved by the handler below.
    unsafe { fd.register(map.as_ptr(), map.len(), uffd::mode::MISSING) }?;
    let f = fd.clone();
    let reg = register(
        map.addr(),
        map.len(),
        Box::new(move |addr, _| {
            // SAFETY: a page of the registered measuring mapping; EEXIST (filled) is fine.
            let _ = unsafe { f.zeropage((addr & !(ps - 1)) as *mut u8, ps, 0) };
        }),
    )?;
    let t = Instant::now();
    for i in 0..pages {
        // SAFETY: inside the mapping; the fault is resolved by the handler.
        unsafe { std::ptr::write_volatile(map.as_ptr().add(i * ps), 1) };
    }
    let spent = t.elapsed();
    let _ = fd.unregister(map.as_ptr(), map.len());
    drop(reg);
    Ok(Some(spent / pages.max(1) as u32))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    const CHILD: &str = "ADVM_SIGBUS_CHAIN_CHILD";
    static PREVIOUS_RAN: AtomicBool = AtomicBool::new(false);
    static MEMFD: AtomicI32 = AtomicI32::new(-1);

    /// The program's own SIGBUS handler: makes the faulting file page exist.
    extern "C" fn programs_handler(_sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        PREVIOUS_RAN.store(true, Ordering::SeqCst);
        // SAFETY: ftruncate is async-signal-safe.
        unsafe { libc::ftruncate(MEMFD.load(Ordering::SeqCst), 4096 * 4) };
    }

    /// Run in a child process of its own (the SIGBUS disposition is process-wide and
    /// other tests share this one): a program handler installed before a SIGBUS-mode
    /// pager still gets a SIGBUS outside the pager's regions, while the pager's own
    /// faults are served.
    #[test]
    fn sigbus_outside_pager_regions_reaches_the_previous_handler() {
        if std::env::var_os(CHILD).is_none() {
            if crate::pager::available().is_err() || crate::pager::sigbus_zero_fill_cost(1).ok().flatten().is_none() {
                eprintln!("skipped: no userfaultfd SIGBUS mode");
                return;
            }
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "sys::uffd_sigbus::tests::sigbus_outside_pager_regions_reaches_the_previous_handler"])
                .args(["--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "child: {:?}\n{text}", out.status);
            return;
        }
        // SAFETY: plain data, then a handler that only stores and calls ftruncate.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = programs_handler as extern "C" fn(_, _, _) as usize;
            act.sa_flags = libc::SA_SIGINFO;
            assert_eq!(libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()), 0);
        }
        let mut cfg = crate::pager::Config::new(64 * 4096);
        cfg.fault_mode = crate::pager::FaultMode::Sigbus;
        let p = crate::pager::Pager::new(cfg).unwrap();
        let r = p.map(8 * 4096).unwrap();
        r.write(0, b"served").unwrap();
        // a file mapping past the end of its (empty) file: a genuine SIGBUS
        let fd = rustix::fs::memfd_create("chain", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        use std::os::fd::AsRawFd;
        MEMFD.store(fd.as_raw_fd(), Ordering::SeqCst);
        // SAFETY: a fresh shared mapping of our memfd, read once and unmapped.
        unsafe {
            let m = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0);
            assert_ne!(m, libc::MAP_FAILED);
            let v = std::ptr::read_volatile(m as *const u8);
            assert_eq!(v, 0);
            libc::munmap(m, 4096);
        }
        assert!(PREVIOUS_RAN.load(Ordering::SeqCst), "the program's handler never ran");
        let mut back = [0u8; 6];
        r.read(0, &mut back).unwrap();
        assert_eq!(&back, b"served");
        assert_eq!(p.fault_mode(), crate::pager::FaultMode::Sigbus);
        assert!(p.stats().faults() >= 1);
    }

    /// The price of SIGBUS mode: a system call that touches a pager page that is not
    /// resident gets EFAULT (the kernel cannot take a signal for it), where the
    /// handler thread would have served the fault.
    #[test]
    fn system_calls_on_pages_not_resident_fail_with_efault_in_sigbus_mode_only() {
        use std::io::{Read, Write};
        if crate::pager::available().is_err() || !crate::pager::sigbus_available() {
            eprintln!("skipped: no userfaultfd SIGBUS mode");
            return;
        }
        // A user-mode-only userfaultfd (a user without CAP_SYS_PTRACE while
        // vm.unprivileged_userfaultfd=0) never sees the kernel's faults: system calls get
        // EFAULT in thread mode too (docs/pager.md, `advm doctor`).
        let user_mode_only =
            super::uffd::Userfaultfd::probe().is_ok_and(|i| i.source == super::uffd::Source::SyscallUserModeOnly);
        if user_mode_only {
            eprintln!("user-mode-only userfaultfd: thread mode is checked to fail with EFAULT too");
        }
        for (mode, ok) in [(crate::pager::FaultMode::Thread, !user_mode_only), (crate::pager::FaultMode::Sigbus, false)]
        {
            let mut cfg = crate::pager::Config::new(64 * 4096);
            cfg.fault_mode = mode;
            let p = crate::pager::Pager::new(cfg).unwrap();
            let r = p.map(2 * 4096).unwrap();
            // page 1 discardable, so the first fault does not zero-fill it ahead
            r.mark_discardable(1, 1).unwrap();
            r.write(0, &[5; 4096]).unwrap();
            p.flush(r.as_ptr() as usize, 4096).unwrap();
            let memfd = rustix::fs::memfd_create("efault", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
            let mut out = std::fs::File::from(memfd);
            // SAFETY: pages of the live region, read (page 0, written out) and written
            // (page 1, never touched) by the kernel only.
            let (evicted, untouched) = unsafe {
                (
                    std::slice::from_raw_parts(r.as_ptr(), 4096),
                    std::slice::from_raw_parts_mut(r.as_ptr().add(4096), 4096),
                )
            };
            let wrote = out.write(evicted);
            let read = std::fs::File::open("/dev/zero").unwrap().read(untouched);
            let efault = |r: &std::io::Result<usize>| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EFAULT));
            if ok {
                assert_eq!((wrote.unwrap(), read.unwrap()), (4096, 4096), "{mode:?}");
            } else {
                assert!(efault(&wrote) && efault(&read), "{mode:?}: {wrote:?} {read:?}");
            }
        }
    }
}
