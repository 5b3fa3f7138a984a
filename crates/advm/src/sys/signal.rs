//! Signal dispositions for a parent that waits on a child and must clean up after it
//! (e.g. `advm run` restoring KSM settings): interactive signals are left to the
//! child, as `system(3)` does, since the terminal delivers them to the child too;
//! SIGTERM and SIGHUP are forwarded to the child, so the parent lives to clean up;
//! signals that come before the child exists are held for it. And for a long
//! run that stops itself: stopping signals only noted.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use super::{SysError, SysResult};

/// Handlers installed for some signals; the old dispositions come back on drop.
struct Dispositions {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl Dispositions {
    /// Installs `handler` (a function pointer) for each signal that is not ignored now.
    /// A signal ignored on entry stays ignored, so a child exec'd meanwhile inherits
    /// that (`nohup`, or a script's `&` job, which ignores SIGINT): a handler would be
    /// reset to the default at exec, and the child die of a signal meant to pass it by.
    /// Handlers must be async-signal-safe.
    fn install(handlers: impl IntoIterator<Item = (libc::c_int, libc::sighandler_t)>) -> SysResult<Self> {
        let mut guard = Self { old: Vec::new() };
        for (sig, handler) in handlers {
            // SAFETY: zeroed is a valid sigaction to receive the current disposition.
            let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a null new action only reads the disposition into a live struct.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) } < 0 {
                return Err(SysError::last("sigaction"));
            }
            if now.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            // SAFETY: sigaction structs are plain data; zeroed is a valid empty mask.
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = handler;
            new.sa_flags = libc::SA_RESTART;
            // SAFETY: zeroed is a valid sigaction to receive the old disposition.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live sigaction structs; the handlers given
            // here are async-signal-safe (the callers' contract).
            if unsafe { libc::sigaction(sig, &new, &mut old) } < 0 {
                return Err(SysError::last("sigaction"));
            }
            guard.old.push((sig, old));
        }
        Ok(guard)
    }
}

impl Drop for Dispositions {
    fn drop(&mut self) {
        for (sig, old) in &self.old {
            // SAFETY: restores a disposition sigaction gave us.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that came before the child was named, for the child once it is.
static HELD: AtomicI32 = AtomicI32::new(0);
/// The last signal the forwarding handler took, for [`ChildSignals::last_received`].
static FORWARD_GOT: AtomicI32 = AtomicI32::new(0);

/// Gives a held signal, if any, to the child: called by whichever of the naming thread
/// and the handler sees both the child and the held signal; the swap lets only one send.
fn forward_held(pid: i32) {
    let sig = HELD.swap(0, Ordering::SeqCst);
    if sig != 0 {
        // SAFETY: kill(2) is async-signal-safe and takes no pointers.
        unsafe { libc::kill(pid, sig) };
    }
}

extern "C" fn forward(sig: libc::c_int) {
    // A caller's StopSignals around this guard learns the run was asked to stop.
    note_stop(sig);
    FORWARD_GOT.store(sig, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // Interactive signals reach the child from the terminal by themselves.
        if FORWARDED.contains(&sig) {
            // SAFETY: kill(2) is async-signal-safe and takes no pointers.
            unsafe { libc::kill(pid, sig) };
        }
        return;
    }
    // No child yet: hold the signal. If the child was named meanwhile, the naming
    // thread may have looked for a held signal before this store: send it from here.
    HELD.store(sig, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        forward_held(pid);
    }
}

/// Interactive signals: the terminal delivers them to the child as well, so the parent
/// does nothing with them once the child runs (as `system(3)` ignores them).
const INTERACTIVE: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];
const FORWARDED: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGHUP];

/// While alive, SIGTERM and SIGHUP go to the child, SIGINT and SIGQUIT are left to it;
/// any of them arriving before [`ChildSignals::child`] names the child is held and
/// given to it then (a parent killed between spawning and naming its child could not
/// clean up). The old dispositions come back on drop. One at a time per process.
///
/// Handlers, not `SIG_IGN`, even for the interactive signals: a child spawned while
/// they are installed must not inherit ignored signals across `exec` (unless they were
/// ignored before: those are left alone).
pub struct ChildSignals {
    set: Option<Dispositions>,
}

impl ChildSignals {
    /// Installs the dispositions, before the child exists.
    pub fn hold() -> SysResult<Self> {
        CHILD.store(0, Ordering::SeqCst);
        HELD.store(0, Ordering::SeqCst);
        FORWARD_GOT.store(0, Ordering::SeqCst);
        let handler = forward as extern "C" fn(libc::c_int) as libc::sighandler_t;
        let handlers = INTERACTIVE.iter().chain(FORWARDED.iter()).map(|&s| (s, handler));
        Ok(Self { set: Some(Dispositions::install(handlers)?) })
    }

    /// Names the child: signals from now on, and one held until now, go to `child`.
    pub fn child(&self, child: i32) {
        CHILD.store(child, Ordering::SeqCst);
        forward_held(child);
    }

    /// The last signal that came (held or passed on) since the last
    /// [`ChildSignals::hold`], also after that guard is dropped.
    pub fn last_received() -> Option<i32> {
        Some(FORWARD_GOT.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }
}

impl Drop for ChildSignals {
    fn drop(&mut self) {
        // Old dispositions first, then forget the child: in the other order a SIGTERM
        // arriving in between would be neither forwarded nor acted on. A signal held
        // for a child never named is dropped: the caller failed to spawn and returns.
        drop(self.set.take());
        CHILD.store(0, Ordering::SeqCst);
        HELD.store(0, Ordering::SeqCst);
    }
}

static STOP: AtomicI32 = AtomicI32::new(0);
/// Live [`StopSignals`]: only the outermost one starts from "nothing received", so a
/// signal noted before an inner one is installed is not forgotten.
static STOP_GUARDS: AtomicUsize = AtomicUsize::new(0);

/// Notes a stopping signal for [`StopSignals::received`]; also called by the other
/// handlers here and in `swap`, which take the signal over while they are installed.
pub(crate) extern "C" fn note_stop(sig: libc::c_int) {
    if STOPPING.contains(&sig) {
        STOP.store(sig, Ordering::Relaxed);
    }
}

const STOPPING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// While alive, SIGTERM, SIGINT and SIGHUP do not kill the process but are noted
/// ([`StopSignals::received`]), so a long-running caller can stop its work and clean
/// up; the old dispositions come back on drop. May nest (a benchmark inside a run that
/// noted signals already): an inner one still reports a signal the outer one noted.
/// Signals taken over meanwhile by [`ChildSignals`] or the swap `Interrupts` are noted
/// too.
pub struct StopSignals {
    set: Option<Dispositions>,
}

impl StopSignals {
    /// Installs the noting handler.
    pub fn install() -> SysResult<Self> {
        if STOP_GUARDS.fetch_add(1, Ordering::SeqCst) == 0 {
            STOP.store(0, Ordering::Relaxed);
        }
        let handlers = STOPPING.iter().map(|&s| (s, note_stop as extern "C" fn(libc::c_int) as libc::sighandler_t));
        match Dispositions::install(handlers) {
            Ok(set) => Ok(Self { set: Some(set) }),
            Err(e) => {
                STOP_GUARDS.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// The last stopping signal received since [`StopSignals::install`], if any.
    pub fn received(&self) -> Option<i32> {
        Some(STOP.load(Ordering::Relaxed)).filter(|&s| s != 0)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        drop(self.set.take());
        STOP_GUARDS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// SIGTERM, SIGINT and SIGHUP blocked in the calling thread and in every thread it
/// starts afterwards (they inherit the mask), so that none of them runs a handler or
/// dies of one: the thread that blocked them takes them one by one with
/// [`Awaited::wait`]. They stay blocked when it is dropped: one that arrives while
/// the caller cleans up waits instead of ending the process half-way.
pub struct Awaited {
    set: libc::sigset_t,
}

impl Awaited {
    /// Blocks the signals in the calling thread.
    pub fn block() -> SysResult<Self> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it below.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a live sigset_t; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            for s in STOPPING {
                libc::sigaddset(&mut set, s);
            }
        }
        // SAFETY: `set` is initialised; the old mask is not asked for.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if r != 0 {
            return Err(SysError::new("pthread_sigmask", rustix::io::Errno::from_raw_os_error(r)));
        }
        Ok(Self { set })
    }

    /// Waits for one of the signals and returns its number.
    pub fn wait(&self) -> SysResult<i32> {
        let mut sig = 0;
        // SAFETY: both pointers are to live values; sigwait only writes `sig`.
        let r = unsafe { libc::sigwait(&self.set, &mut sig) };
        if r != 0 {
            return Err(SysError::new("sigwait", rustix::io::Errno::from_raw_os_error(r)));
        }
        Ok(sig)
    }
}

/// Every signal but those a fault raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP):
/// the ones a program or another process sends, which need not be taken at once.
pub fn sent_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset initialises it below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live sigset_t and the signal numbers are valid.
    unsafe {
        libc::sigfillset(&mut set);
        for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP] {
            libc::sigdelset(&mut set, s);
        }
    }
    set
}

/// Runs `spawn` (which starts one of advm's own threads) with [`sent_signals`]
/// blocked, so the thread starts with them blocked and keeps them so; the caller's
/// mask is as before afterwards. The kernel then gives a signal sent to the process
/// to one of the program's threads, whose handler never runs on ours. (A program's
/// handler that ran on the pager's thread and touched paged memory waited for that
/// very thread to serve the fault: a deadlock.)
pub fn spawn_with_sent_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    let set = sent_signals();
    // SAFETY: sigset_t is plain data, filled by pthread_sigmask below.
    let mut was: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both sets are live; the mask is this thread's own (glibc leaves its
    // internal signals unblocked), and these arguments cannot fail.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut was) };
    let r = spawn();
    // SAFETY: as above: the caller's mask back.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &was, std::ptr::null_mut()) };
    r
}

/// Ends this process by `sig` with its default action, as a child that died of it did,
/// so that whoever waits on us (a shell running a loop, `subprocess`) sees the signal and
/// not an exit code; no core file of our own. Returns if `sig`'s default action does
/// not end a process (the caller then exits).
pub fn die_by(sig: libc::c_int) {
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads a live struct; a failure only means a core file may be written.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    // SAFETY: zeroed is a valid sigaction (SIG_DFL, empty mask) and a valid sigset.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: as above.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointers are to live structs; the calls only change this process's
    // disposition and mask of `sig`, then send it to this thread.
    unsafe {
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}
