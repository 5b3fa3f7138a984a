//! userfaultfd's SIGBUS mode: a missing-page fault in a range registered on a
//! userfaultfd opened with `UFFD_FEATURE_SIGBUS` raises SIGBUS on the faulting thread,
//! whose handler resolves it itself, with no round trip to a handler thread.
//!
//! One process-wide SIGBUS handler serves every such range. A SIGBUS at an address
//! outside every registered range goes to the handler that was installed before ours
//! (or kills the process, as it would have). The handler is installed once and stays:
//! a program that installs its own SIGBUS handler later must chain to the one it
//! replaces.
//!
//! Finding the range, in the handler (no allocation, no lock, any number of ranges):
//! each range is a [`Route`] of its own, allocated by [`register`]; an [`Index`] of
//! every route sorted by address is published through one atomic pointer and never
//! changed once published (`register` and removal copy it, with the route added or
//! taken out: O(ranges) each, outside the handler). The handler binary-searches the
//! index it loaded (O(log ranges) a fault) and counts itself on the route's `busy`
//! before it leaves the index. An index replaced is freed after a grace period: the
//! handler counts itself as a reader of the index on one of two counters (by the
//! parity of an epoch), and the writer flips the epoch and waits for each counter to
//! drain in turn, so a stream of faults never starves it and a reader that counted
//! itself late loaded the new index. A route taken out is freed once the grace period
//! is over (no handler can find it any more) and its `busy` is zero (none that found
//! it still uses it). This rather than a fixed table scanned in order (the 1024 slots
//! before): a route is never reused for another range, so the handler needs no second
//! look at the range, and the lookup grows with the logarithm of the number of ranges,
//! not with the number. One index for every pager's ranges rather than one per pager:
//! the handler is process-wide and would have to find the pager by address first.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::mman::Mapping;
use super::process::{ForksHeld, ProcessKey};
use super::uffd::{self, Userfaultfd};
use super::{page_size, SysError, SysResult};

/// Resolves a fault at an address of its range (`write`: the access was a write),
/// called in the signal handler: it must be async-signal-safe (no allocation, no lock
/// the faulting thread could hold). On return the access is retried.
pub type Serve = dyn Fn(usize, bool) + Send + Sync;

/// One registered range. Freed only when no handler can reach it (see the module
/// documentation).
struct Route {
    start: usize,
    end: usize,
    /// Null once retired.
    serve: AtomicPtr<Box<Serve>>,
    /// Handlers that found the route and have not left it: removal waits for them.
    busy: AtomicU32,
}

/// One route as the index holds it: its range beside it, so the search reads no route.
struct Entry {
    start: usize,
    end: usize,
    route: NonNull<Route>,
}

/// Every route, sorted by `start`, the ranges apart. Never changed once published.
struct Index {
    /// The process that published it: in a forked child the parent's routes are
    /// stale (their regions are `MADV_DONTFORK`, so the child's own mappings may take
    /// their addresses) and the child's first edit starts from none.
    key: ProcessKey,
    entries: Vec<Entry>,
}

impl Index {
    /// The route whose range holds `addr`.
    fn find(&self, addr: usize) -> Option<NonNull<Route>> {
        let i = self.entries.partition_point(|e| e.start <= addr).checked_sub(1)?;
        let e = &self.entries[i];
        (addr < e.end).then_some(e.route)
    }
}

/// The index the handler searches (null: no route yet); replaced under [`ForksHeld`].
static INDEX: AtomicPtr<Index> = AtomicPtr::new(std::ptr::null_mut());
/// Which of [`READERS`] a handler counts itself on (its parity).
static EPOCH: AtomicUsize = AtomicUsize::new(0);
/// Handlers searching an index now, by the epoch's parity when they started.
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
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

/// The route holding `addr`, counted busy (the caller gives the count back), found in
/// the published index while counted as its reader.
fn enter(addr: usize) -> Option<&'static Route> {
    let parity = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[parity].fetch_add(1, Ordering::SeqCst);
    let index = INDEX.load(Ordering::SeqCst);
    // SAFETY: a published index is freed only after a grace period that waits for
    // this reader count (see `synchronize`).
    let route = unsafe { index.as_ref() }.and_then(|i| i.find(addr)).map(|r| {
        // SAFETY: a route in a published index lives until a grace period after its
        // removal and then until its `busy` is zero: we are still a reader here.
        let r = unsafe { &*r.as_ptr() };
        r.busy.fetch_add(1, Ordering::SeqCst);
        r
    });
    READERS[parity].fetch_sub(1, Ordering::SeqCst);
    route
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let Some(route) = enter(addr) else {
        return chain(sig, info, ctx);
    };
    // a retired route (null `serve`) is still ours: a fault raised before it was
    // unregistered is retried, and faults normally now
    let f = route.serve.load(Ordering::SeqCst);
    if !f.is_null() {
        // The interrupted code finds errno as it left it: serving makes system calls
        // (an ioctl that says EAGAIN, a read), and the fault may come between a
        // program's failed call and its look at errno.
        // SAFETY: __errno_location has no precondition; it returns this thread's errno.
        let errno = unsafe { libc::__errno_location() };
        // SAFETY: this thread's errno slot, read and written by this thread only.
        let saved = unsafe { *errno };
        // SAFETY: a non-null `serve` stays alive while `busy` counts us (see `retire`).
        unsafe { (**f)(addr, was_write(ctx)) };
        // SAFETY: as above.
        unsafe { *errno = saved };
    }
    route.busy.fetch_sub(1, Ordering::SeqCst);
}

/// Waits until no handler can still hold an index replaced before the call: for each
/// reader counter in turn, moves new readers to the other one and waits for it to drain.
fn synchronize() {
    for _ in 0..2 {
        let parity = EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
        while READERS[parity].load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// Publishes `entries` as the index and frees the one it replaces once no handler
/// can hold it (the caller holds [`ForksHeld`]).
fn publish(entries: Vec<Entry>) {
    let index = Index { key: ProcessKey::current(), entries };
    let old = INDEX.swap(Box::into_raw(Box::new(index)), Ordering::SeqCst);
    synchronize();
    if !old.is_null() {
        // SAFETY: made by Box::into_raw here; after the grace period no handler holds it.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// The published index's entries, copied, none if a parent process published it
/// (its routes stay allocated: their registrations are never dropped in a child,
/// which cannot unmap its parent's regions); the caller holds [`ForksHeld`].
fn entries_now(extra: usize) -> Vec<Entry> {
    // SAFETY: only the holder of ForksHeld replaces (and frees) the index.
    let now = unsafe { INDEX.load(Ordering::SeqCst).as_ref() };
    let now = now.filter(|i| i.key.is_this_process()).map_or(&[][..], |i| &i.entries[..]);
    let mut v = Vec::with_capacity(now.len() + extra);
    v.extend(now.iter().map(|e| Entry { start: e.start, end: e.end, route: e.route }));
    v
}

/// In a forked child: only the forking thread is left, so no handler is reading, and
/// the counts of the parent's other threads would make every grace period wait for ever.
extern "C" fn forget_readers() {
    READERS.iter().for_each(|r| r.store(0, Ordering::SeqCst));
}

extern "C" fn nothing() {}

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
    super::process::at_fork(nothing, nothing, forget_readers)?;
    // SAFETY: sigaction structs are plain data; zeroed is an empty mask.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    // not SA_ONSTACK: the small alternate stacks Rust gives threads cannot hold a page buffer
    new.sa_flags = libc::SA_SIGINFO;
    // Sent signals wait until the fault is served: a program's handler run in the
    // middle that touched paged memory faulted with SIGBUS blocked, and the kernel
    // killed the process.
    new.sa_mask = super::signal::sent_signals();
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: live structs; the handler uses atomics, the index and the registered `serve`s only.
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
    route: NonNull<Route>,
}

// SAFETY: the route is shared with the handler through atomics only, and freed by the
// registration's drop alone.
unsafe impl Send for Registration {}
// SAFETY: as above; `retire` may run on several threads (it swaps `serve` out once).
unsafe impl Sync for Registration {}

impl Registration {
    fn route(&self) -> &Route {
        // SAFETY: the route lives until this registration's drop frees it.
        unsafe { self.route.as_ref() }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.route();
        write!(f, "Registration({:#x}..{:#x})", r.start, r.end)
    }
}

/// Routes SIGBUS faults in `[start, start+len)` to `serve` (installing the handler on
/// first use). Fails (`EEXIST`) when the range overlaps one registered.
pub fn register(start: usize, len: usize, serve: Box<Serve>) -> SysResult<Registration> {
    let end = start.checked_add(len).filter(|_| len > 0).ok_or_else(|| SysError::new("SIGBUS range", Errno::INVAL))?;
    let _edit = ForksHeld::take();
    install()?;
    let mut entries = entries_now(1);
    let at = entries.partition_point(|e| e.start < start);
    let clear =
        at.checked_sub(1).map_or(true, |i| entries[i].end <= start) && entries.get(at).map_or(true, |e| end <= e.start);
    if !clear {
        return Err(SysError::new("SIGBUS range (overlaps a registered one)", Errno::EXIST));
    }
    let route = Route { start, end, serve: AtomicPtr::new(Box::into_raw(Box::new(serve))), busy: AtomicU32::new(0) };
    let route = NonNull::from(Box::leak(Box::new(route)));
    entries.insert(at, Entry { start, end, route });
    publish(entries);
    Ok(Registration { route })
}

impl Registration {
    /// Stops serving faults (the range must be unregistered from its userfaultfd
    /// first): waits for the handlers running `serve`, then drops it. Faults raised
    /// before are retried from now on.
    pub fn retire(&self) {
        let r = self.route();
        let f = r.serve.swap(std::ptr::null_mut(), Ordering::SeqCst);
        while r.busy.load(Ordering::SeqCst) != 0 {
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
        {
            let _edit = ForksHeld::take();
            let mut entries = entries_now(0);
            entries.retain(|e| e.route != self.route);
            // after this no handler holds the old index, so none can find the route
            publish(entries);
        }
        // and those that found it before have left it (`serve` is gone: they return at once)
        while self.route().busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: made by Box::leak in `register`; out of the index and unused (above).
        drop(unsafe { Box::from_raw(self.route.as_ptr()) });
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
    // The user-mode-only kind serves: only this function's own stores touch the range.
    let fd = std::sync::Arc::new(Userfaultfd::new_user_mode_only_ok(uffd::feature::SIGBUS, true)?);
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
        for (mode, ok) in [(crate::pager::FaultMode::Thread, true), (crate::pager::FaultMode::Sigbus, false)] {
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
