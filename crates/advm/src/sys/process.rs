//! Processes: `pthread_atfork` handlers around every `fork()` of this process, and
//! starting a child that runs something before anything else (a cgroup join before
//! `exec`, or a closure in a forked child).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

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

/// Registers handlers run by `fork()` (not by `vfork`/`posix_spawn`): `prepare` in the
/// parent before the fork, `parent` in the parent and `child` in the child after it.
/// Handlers stay registered for the life of the process; register once.
///
/// Handlers run with the process in the middle of a fork: in the child only the forking
/// thread exists, so a handler must not wait for locks other threads might have held.
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) -> SysResult<()> {
    // SAFETY: the three are valid `extern "C" fn()` for the life of the process (fn
    // items are never unloaded from a Rust binary's own text).
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(SysError::new("pthread_atfork", Errno::from_raw_os_error(r)));
    }
    Ok(())
}

/// Forks this process went through as the child since advm first asked, counted by a
/// fork handler: a value saved earlier and compared later tells a forked child it is
/// one, at no cost per call where comparing process ids costs a `getpid` each. `None`
/// when the handler could not be registered.
pub fn fork_generation() -> Option<u64> {
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    static HANDLER: OnceLock<bool> = OnceLock::new();
    extern "C" fn nothing() {}
    extern "C" fn child() {
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }
    HANDLER.get_or_init(|| at_fork(nothing, nothing, child).is_ok()).then(|| GENERATION.load(Ordering::Relaxed))
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
/// first use there: the child never uses its parent's, which it leaves alone (leaked:
/// a lock in it may be held for ever by a parent thread that does not exist in the
/// child, and dropping it could act on the parent's state, a session or a file).
#[derive(Debug)]
pub struct PerProcess<T: 'static> {
    current: AtomicPtr<(u32, T)>,
}

impl<T: 'static> PerProcess<T> {
    /// None made yet.
    pub const fn new() -> Self {
        Self { current: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// This process's value, made by `make` on its first use in this process.
    pub fn get(&self, make: impl FnOnce() -> T) -> &'static T {
        let pid = std::process::id();
        let seen = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from Box::into_raw below and is never
        // freed (a value, once published, lives as long as the process).
        if let Some(v) = unsafe { seen.as_ref() }.filter(|v| v.0 == pid) {
            return &v.1;
        }
        let mine = Box::into_raw(Box::new((pid, make())));
        match self.current.compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published, never freed.
            Ok(_) => unsafe { &(*mine).1 },
            Err(other) => {
                // SAFETY: `mine` was never published: ours to free.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: another thread's value, published and never freed; made by
                // this process (a value is published only by a thread of its process).
                unsafe { &(*other).1 }
            }
        }
    }
}

impl<T: 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}
