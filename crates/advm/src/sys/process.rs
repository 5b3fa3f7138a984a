//! Processes: `pthread_atfork` handlers around every `fork()` of this process, and
//! starting a child that runs something before anything else (a cgroup join before
//! `exec`, or a closure in a forked child).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::{Errno, SysError, SysResult};

/// Makes `cmd`'s child write "0" (itself) to `procs` (an open `cgroup.procs`) after the
/// fork and before `exec`, so every page it ever touches is charged to that group. A
/// failed write fails the spawn with that error.
pub fn join_cgroup_before_exec(cmd: &mut Command, procs: OwnedFd) {
    let hook = move || -> std::io::Result<()> {
        // Only write(2) here: between fork and exec only async-signal-safe calls are allowed.
        match rustix::io::write(procs.as_fd(), b"0") {
            Ok(_) => Ok(()),
            Err(e) => Err(std::io::Error::from_raw_os_error(e.raw_os_error())),
        }
    };
    // SAFETY: the hook makes one write(2) on an fd it owns: no allocation, no locks,
    // which is what the child of a fork of a threaded process may do.
    unsafe { cmd.pre_exec(hook) };
}

/// Forks; the child runs `child` and exits with the status it returns (101 when it
/// panics), never returning here. The parent gets the child's pid.
///
/// The child has only the calling thread: `child` must not wait for locks other threads
/// may have held at the fork (stdio, locks of the caller's own). glibc's malloc is safe.
pub fn fork_run(child: impl FnOnce() -> i32) -> SysResult<i32> {
    // SAFETY: the child runs `child` and leaves by `_exit`, never returning into the
    // caller's frames (whose destructors would run twice); the parent only reads the pid.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SysError::last("fork"));
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: _exit ends the child without running the parent's atexit handlers or
        // flushing stdio buffers that belong to the parent.
        unsafe { libc::_exit(code) };
    }
    Ok(pid)
}

/// For tests of what an unprivileged user sees: runs `child` in a forked child as
/// uid and gid 65534 (nobody) when this process is root, else in a forked child as
/// this user; returns its exit code (100: the switch failed).
#[cfg(test)]
pub fn run_unprivileged(child: impl FnOnce() -> i32) -> SysResult<i32> {
    wait_child(fork_unprivileged(child)?)
}

/// [`run_unprivileged`] without the wait: returns the child's pid.
#[cfg(test)]
pub fn fork_unprivileged(child: impl FnOnce() -> i32) -> SysResult<i32> {
    fork_run(|| {
        let switched = !super::is_root()
            // SAFETY: plain syscalls in the single-threaded child, changing only its ids.
            || unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(65534) == 0 && libc::setuid(65534) == 0 };
        if !switched {
            return 100;
        }
        child()
    })
}

/// Waits for child `pid`; returns its exit code, or 128 + the signal that killed it.
pub fn wait_child(pid: i32) -> SysResult<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes one int through a valid pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = SysError::last("waitpid");
        if e.errno != Errno::INTR {
            return Err(e);
        }
    }
    Ok(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) })
}

/// Handler sets registered through [`at_fork`], run by the one set this module
/// registers with `pthread_atfork` (in slot order; `prepare` in reverse, as glibc does).
const SLOTS: usize = 16;

/// One handler set: the three functions, then `state` (0 free, 1 being written,
/// 2 ready). A slot never becomes free again.
struct Slot {
    prepare: AtomicUsize,
    parent: AtomicUsize,
    child: AtomicUsize,
    state: AtomicU8,
}

#[allow(clippy::declare_interior_mutable_const)] // only as the array's initialiser
const FREE: Slot = Slot {
    prepare: AtomicUsize::new(0),
    parent: AtomicUsize::new(0),
    child: AtomicUsize::new(0),
    state: AtomicU8::new(0),
};
static HANDLERS: [Slot; SLOTS] = [FREE; SLOTS];

impl Slot {
    fn ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == 2
    }

    /// The three functions' addresses (read after [`Slot::ready`]).
    fn fns(&self) -> [usize; 3] {
        [&self.prepare, &self.parent, &self.child].map(|f| f.load(Ordering::Relaxed))
    }
}

/// Forks this process went through as the child, counted by [`child_all`].
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Whether the handlers below are registered with `pthread_atfork`: [`UNREGISTERED`],
/// [`REGISTERED`], [`FAILED`], or (pid << 2 | [`CLAIMED`]) while a thread of process
/// `pid` registers them.
static MASTER: AtomicU64 = AtomicU64::new(UNREGISTERED);
const UNREGISTERED: u64 = 0;
const REGISTERED: u64 = 1;
const FAILED: u64 = 2;
const CLAIMED: u64 = 3;

/// Whether slot `i` holds a ready handler set that no earlier slot holds too (two
/// threads that register the same set at once may both take a slot).
fn runs(i: usize) -> bool {
    let s = &HANDLERS[i];
    s.ready() && !HANDLERS[..i].iter().any(|e| e.ready() && e.fns() == s.fns())
}

fn call(f: &AtomicUsize) {
    let p = f.load(Ordering::Relaxed);
    // SAFETY: a slot's fields hold `extern "C" fn()`s written by `at_fork` before the
    // slot was marked ready (Release, read with Acquire by `runs`).
    let f: extern "C" fn() = unsafe { std::mem::transmute::<usize, extern "C" fn()>(p) };
    f();
}

extern "C" fn prepare_all() {
    (0..SLOTS).rev().filter(|&i| runs(i)).for_each(|i| call(&HANDLERS[i].prepare));
}

extern "C" fn parent_all() {
    (0..SLOTS).filter(|&i| runs(i)).for_each(|i| call(&HANDLERS[i].parent));
}

extern "C" fn child_all() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    // These handlers ran in this child, so they are registered here, whatever state a
    // parent thread that was registering them at the fork left behind.
    MASTER.store(REGISTERED, Ordering::Release);
    (0..SLOTS).filter(|&i| runs(i)).for_each(|i| call(&HANDLERS[i].child));
}

/// Registers this module's handlers with `pthread_atfork` exactly once per process,
/// without a lock a forked child could find held: a thread of this process that finds
/// another registering waits for it (microseconds); a forked child that finds its
/// parent's claim (the parent was registering at the fork, and the handlers, which
/// would have said so, did not run) registers them itself.
fn register_master() -> bool {
    loop {
        let s = MASTER.load(Ordering::Acquire);
        match s {
            REGISTERED => return true,
            FAILED => return false,
            _ => {
                let me = u64::from(std::process::id()) << 2 | CLAIMED;
                if s != UNREGISTERED && s == me {
                    // another thread of this process is registering them
                    std::thread::yield_now();
                    continue;
                }
                if MASTER.compare_exchange(s, me, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    continue;
                }
                // SAFETY: the three are `extern "C" fn()`s of this crate, valid for the
                // life of the code that registers them.
                let r = unsafe { libc::pthread_atfork(Some(prepare_all), Some(parent_all), Some(child_all)) };
                let _ = MASTER.compare_exchange(
                    me,
                    if r == 0 { REGISTERED } else { FAILED },
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                return r == 0;
            }
        }
    }
}

/// Registers handlers run by `fork()` (not by `vfork`/`posix_spawn`): `prepare` in the
/// parent before the fork, `parent` in the parent and `child` in the child after it.
/// Handlers stay registered for the life of the process. Idempotent: registering the
/// same three again does nothing, so a caller may call it on every use instead of
/// guarding it with a once-cell (a forked child could find such a cell "running").
///
/// Handlers run with the process in the middle of a fork: in the child only the forking
/// thread exists, so a handler must not wait for locks other threads might have held.
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) -> SysResult<()> {
    if !register_master() {
        return Err(SysError::new("pthread_atfork", Errno::NOMEM));
    }
    let want = [prepare as usize, parent as usize, child as usize];
    if HANDLERS.iter().any(|s| s.ready() && s.fns() == want) {
        return Ok(());
    }
    for s in &HANDLERS {
        if s.state.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            for (f, w) in [&s.prepare, &s.parent, &s.child].into_iter().zip(want) {
                f.store(w, Ordering::Relaxed);
            }
            s.state.store(2, Ordering::Release);
            return Ok(());
        }
    }
    Err(SysError::new("pthread_atfork (advm's handler slots are full)", Errno::NOMEM))
}

/// Forks this process went through as the child since advm first asked, counted by a
/// fork handler: a value saved earlier and compared later tells a forked child it is
/// one, at no cost per call where comparing process ids costs a `getpid` each. `None`
/// when the handler could not be registered.
pub fn fork_generation() -> Option<u64> {
    register_master().then(|| GENERATION.load(Ordering::Relaxed))
}

/// Which process this is, for values that must be made anew in a forked child: the
/// fork generation, and the process id when the fork handler was not registered yet
/// (or could not be) when the key was taken. Two keys are equal only in one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessKey {
    generation: u64,
    /// `Some` when forks may have gone uncounted: the generation alone cannot tell.
    pid: Option<u32>,
}

impl ProcessKey {
    /// This process's key.
    pub fn current() -> Self {
        match fork_generation() {
            Some(generation) => Self { generation, pid: None },
            None => Self { generation: GENERATION.load(Ordering::Relaxed), pid: Some(std::process::id()) },
        }
    }

    /// True only if `self` was taken in this process, with no system call and no
    /// function call: false where [`ProcessKey::is_this_process`] needs the pid (no
    /// fork handler when the key was taken) or says no.
    #[inline]
    pub fn is_this_process_at_a_glance(&self) -> bool {
        self.pid.is_none() && self.generation == GENERATION.load(Ordering::Relaxed)
    }

    /// Whether a key taken earlier (`self`) was taken in this process.
    pub fn is_this_process(&self) -> bool {
        self.generation == GENERATION.load(Ordering::Relaxed) && self.pid.map_or(true, |p| p == std::process::id())
    }
}

/// Held by every `fork()` of the process (a `pthread_atfork` prepare handler takes it,
/// the parent and child handlers give it back) and by [`ForksHeld`]: so no fork copies
/// it held, and work done under it is never cut in half in a child (a lean fork's
/// marks, which it holds while they are on; the SIGBUS route table's edits). A pthread
/// mutex: it is taken in one handler and given back in another.
struct ForkLock(std::cell::UnsafeCell<libc::pthread_mutex_t>);

// SAFETY: a pthread mutex is made to be used from several threads at once.
unsafe impl Sync for ForkLock {}

static FORKS: ForkLock = ForkLock(std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));

extern "C" fn lock_forks() {
    // SAFETY: FORKS is a static, initialized mutex (a normal one: no owner checks).
    unsafe { libc::pthread_mutex_lock(FORKS.0.get()) };
}

extern "C" fn unlock_forks() {
    // SAFETY: as above; called only where this thread (or, in a fork's child, the
    // thread it is a copy of) locked it.
    unsafe { libc::pthread_mutex_unlock(FORKS.0.get()) };
}

/// [`FORKS`], held until dropped: no `fork()` of this process runs meanwhile (a raw
/// clone, as a lean fork's, runs no handler). Not reentrant: a thread takes it once.
pub struct ForksHeld;

impl ForksHeld {
    /// Waits for a fork under way, then holds forks back until dropped.
    pub fn take() -> Self {
        // Without the handlers (registration failed) a fork() meanwhile is not held
        // back. Registered on first use (again is a no-op).
        let _ = super::process::at_fork(lock_forks, unlock_forks, unlock_forks);
        lock_forks();
        Self
    }
}

impl Drop for ForksHeld {
    fn drop(&mut self) {
        unlock_forks();
    }
}

/// A pidfd of process `pid` (`pidfd_open`): it names that process even once its pid is
/// reused.
pub fn pidfd_open(pid: i32) -> SysResult<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(SysError::last("pidfd_open"));
    }
    // SAFETY: a new fd, ours alone.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// The time since boot (`CLOCK_BOOTTIME`, which counts suspended time as process
/// start times do) in clock ticks, rounded down as `/proc/PID/stat` rounds them.
pub fn boot_ticks() -> SysResult<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to `ts`, alive for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return Err(SysError::last("clock_gettime(CLOCK_BOOTTIME)"));
    }
    let hz = rustix::param::clock_ticks_per_second();
    let ns = ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128;
    Ok((ns * hz as u128 / 1_000_000_000) as u64)
}

/// Waits up to `timeout_ms` (-1: for ever) until the process of one of `pidfds` has
/// exited or `wake` reads ready; returns the indices of the pidfds whose processes have
/// exited (none when only `wake` woke it, or the time ran out).
pub fn poll_pidfds(pidfds: &[BorrowedFd<'_>], wake: Option<BorrowedFd<'_>>, timeout_ms: i32) -> SysResult<Vec<usize>> {
    use std::os::fd::AsRawFd;
    let mut pfds: Vec<libc::pollfd> = pidfds
        .iter()
        .chain(wake.as_ref())
        .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    loop {
        // SAFETY: `pfds.len()` valid pollfds, alive for the call; poll writes only revents.
        if unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) } >= 0 {
            break;
        }
        let e = SysError::last("poll(pidfds)");
        if e.errno != Errno::INTR {
            return Err(e);
        }
    }
    Ok((0..pidfds.len()).filter(|&i| pfds[i].revents != 0).collect())
}

/// Raises this process's soft limit of open files to its hard limit; returns the limit
/// now in force.
pub fn raise_open_files_limit() -> SysResult<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    if r.current == r.maximum {
        return Ok(r.current.unwrap_or(u64::MAX));
    }
    setrlimit(Resource::Nofile, Rlimit { current: r.maximum, maximum: r.maximum })
        .map_err(|e| SysError::new("setrlimit(RLIMIT_NOFILE)", e))?;
    Ok(r.maximum.unwrap_or(u64::MAX))
}

/// A value of this process, made on first use, and made again in a forked child on its
/// first use there (also in a grandchild that got its grandparent's pid back: the key is
/// the fork generation): the child never uses its parent's, which it leaves alone
/// (leaked: a lock in it may be held for ever by a parent thread that does not exist in
/// the child, and dropping it could act on the parent's state, a session or a file).
/// No lock: threads that find no value make one each and the first to publish wins (a
/// loser drops its own), so `make` must be idempotent, as for [`super::lazy::Lazy`].
#[derive(Debug)]
pub struct PerProcess<T: 'static> {
    current: AtomicPtr<(ProcessKey, T)>,
}

impl<T: 'static> PerProcess<T> {
    /// None made yet.
    pub const fn new() -> Self {
        Self { current: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// This process's value, made by `make` on its first use in this process.
    pub fn get(&self, make: impl FnOnce() -> T) -> &'static T {
        let seen = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from Box::into_raw below and is never
        // freed (a value, once published, lives as long as the process).
        if let Some(v) = unsafe { seen.as_ref() }.filter(|v| v.0.is_this_process()) {
            return &v.1;
        }
        let mine = Box::into_raw(Box::new((ProcessKey::current(), make())));
        match self.current.compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published, never freed.
            Ok(_) => unsafe { &(*mine).1 },
            Err(other) => {
                // SAFETY: `mine` was never published: ours to free.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: another thread's value, published and never freed; made by
                // this process (a value is published only by a thread of its process,
                // over the one it saw, and a child starts from what its parent saw).
                unsafe { &(*other).1 }
            }
        }
    }

    /// In a forked child that has not made its own value yet, the one its parent (or an
    /// earlier ancestor) made, to read what it knew; `None` once this process made one.
    pub fn inherited(&self) -> Option<&'static T> {
        // SAFETY: as in `get`: a published value is never freed.
        unsafe { self.current.load(Ordering::Acquire).as_ref() }.filter(|v| !v.0.is_this_process()).map(|v| &v.1)
    }

    /// As [`PerProcess::get`] for a value whose making may fail: only a success is
    /// kept, so a failure (an fd limit reached, say) is the caller's to report and the
    /// next call tries again, instead of finding that failure for the process's life.
    pub fn try_get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<&'static T, E> {
        let seen = self.current.load(Ordering::Acquire);
        // SAFETY: as in `get`: a published value is never freed.
        if let Some(v) = unsafe { seen.as_ref() }.filter(|v| v.0.is_this_process()) {
            return Ok(&v.1);
        }
        let made = make()?;
        Ok(self.get(|| made))
    }
}

impl<T: 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Lets glibc's malloc make at most `n` arenas (`mallopt(M_ARENA_MAX)`); false when it
/// refused.
pub fn limit_malloc_arenas(n: i32) -> bool {
    // SAFETY: mallopt takes two ints and touches only malloc's own settings.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
}

/// Gives the free pages of every malloc arena back to the kernel (`malloc_trim(0)`).
pub fn trim_malloc() {
    // SAFETY: malloc_trim takes a size and releases only memory malloc holds free.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    static CHILD_RUNS: AtomicU64 = AtomicU64::new(0);
    extern "C" fn nothing() {}
    extern "C" fn count_child() {
        CHILD_RUNS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn registering_the_same_handlers_twice_runs_them_once_per_fork() {
        at_fork(nothing, nothing, count_child).expect("at_fork");
        at_fork(nothing, nothing, count_child).expect("at_fork again");
        let before = CHILD_RUNS.load(Ordering::Relaxed);
        let pid = fork_run(|| (CHILD_RUNS.load(Ordering::Relaxed) - before) as i32).expect("fork");
        assert_eq!(wait_child(pid).expect("wait"), 1);
    }

    #[test]
    fn a_key_passes_at_a_glance_only_in_its_process_and_without_a_pid() {
        let key = ProcessKey::current();
        assert!(fork_generation().is_some(), "the fork handler registers here");
        assert!(key.is_this_process_at_a_glance() && key.is_this_process());
        // taken where the handler was missing: only the closer look, with the pid, says yes
        let with_pid = ProcessKey { generation: GENERATION.load(Ordering::Relaxed), pid: Some(std::process::id()) };
        assert!(!with_pid.is_this_process_at_a_glance() && with_pid.is_this_process());
        let pid = fork_run(|| {
            i32::from(!key.is_this_process_at_a_glance() && !key.is_this_process() && !with_pid.is_this_process())
        })
        .expect("fork");
        assert_eq!(wait_child(pid).expect("wait"), 1, "a forked child is not the key's process");
    }

    #[test]
    fn a_failure_to_make_a_per_process_value_is_not_kept() {
        static VALUE: PerProcess<u64> = PerProcess::new();
        assert_eq!(VALUE.try_get(|| Err::<u64, &str>("EMFILE")), Err("EMFILE"));
        assert_eq!(VALUE.try_get(|| Ok::<u64, &str>(7)), Ok(&7), "made on the next call");
        assert_eq!(VALUE.try_get(|| Err::<u64, &str>("EMFILE")), Ok(&7), "kept once made");
    }

    #[test]
    fn a_per_process_value_is_made_anew_in_a_child_and_a_grandchild() {
        static MADE: AtomicU64 = AtomicU64::new(0);
        static VALUE: PerProcess<u64> = PerProcess::new();
        let mine = *VALUE.get(|| MADE.fetch_add(1, Ordering::Relaxed) + 1);
        assert_eq!(*VALUE.get(|| 0), mine, "made once in this process");
        let pid = fork_run(|| {
            let child = *VALUE.get(|| 100);
            let grandchild = fork_run(|| i32::from(*VALUE.get(|| 200) == 200)).expect("fork");
            i32::from(child == 100 && *VALUE.get(|| 0) == 100) + 2 * wait_child(grandchild).unwrap_or(0)
        })
        .expect("fork");
        assert_eq!(wait_child(pid).expect("wait"), 3);
        assert_eq!(*VALUE.get(|| 0), mine, "the parent keeps its own");
    }
}
