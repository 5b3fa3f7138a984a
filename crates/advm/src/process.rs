//! Process-level helpers front ends need around a child they run.

use crate::sys::signal;
use crate::Result;

/// While alive, SIGINT and SIGQUIT are left to the child (the terminal delivers them
/// to the child too, as `system(3)` does) and SIGTERM and SIGHUP are forwarded to it,
/// so the parent lives to clean up after it; the old dispositions come back on drop.
/// One at a time per process.
///
/// Install it with [`ForwardSignals::hold`] *before* spawning the child and name the
/// child with [`ForwardSignals::child`]: a signal that arrives in between is held and
/// given to the child when it is named, instead of killing the parent before it can
/// clean up. A signal held for a child never named is dropped with the guard.
pub struct ForwardSignals {
    inner: signal::ChildSignals,
}

impl ForwardSignals {
    /// Installs the dispositions before the child exists; signals are held until
    /// [`ForwardSignals::child`].
    pub fn hold() -> Result<Self> {
        Ok(Self { inner: signal::ChildSignals::hold()? })
    }

    /// Names the child (its pid): a signal held until now is forwarded to it at once.
    pub fn child(&self, child: u32) -> Result<()> {
        let pid = i32::try_from(child)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| crate::Error::InvalidArgument { what: "child", why: format!("pid {child} out of range") })?;
        self.inner.child(pid);
        Ok(())
    }

    /// The last of these signals that came since the last [`ForwardSignals::hold`]
    /// (also after that guard is gone), if any: the child's end was asked for, it is
    /// not a failure of its own.
    pub fn last_received() -> Option<i32> {
        signal::ChildSignals::last_received()
    }
}

/// While alive, SIGTERM, SIGINT and SIGHUP are noted instead of ending the process,
/// so a long run (a benchmark with VMs and cgroups) can stop and clean up; the old
/// dispositions come back on drop. May nest, and a signal that comes while a
/// [`ForwardSignals`] (or the pager's `Interrupts`) is installed inside it is noted
/// as well.
pub struct StopSignals {
    inner: signal::StopSignals,
}

impl StopSignals {
    /// Installs the handler.
    pub fn install() -> Result<Self> {
        Ok(Self { inner: signal::StopSignals::install()? })
    }

    /// The signal number received since installed, if any.
    pub fn received(&self) -> Option<i32> {
        self.inner.received()
    }
}

/// SIGTERM, SIGINT and SIGHUP taken one at a time by a thread that waits for them
/// (a daemon's main thread), instead of handled or fatal. Block them before starting
/// any thread: threads inherit the mask, so every thread started afterwards leaves
/// them to [`AwaitedSignals::wait`]. They stay blocked after drop.
pub struct AwaitedSignals {
    inner: signal::Awaited,
}

impl AwaitedSignals {
    /// Blocks the signals in the calling thread (and the threads it starts later).
    pub fn block() -> Result<Self> {
        Ok(Self { inner: signal::Awaited::block()? })
    }

    /// Waits for one of them.
    pub fn wait(&self) -> Result<Awaited> {
        Ok(match self.inner.wait()? {
            libc::SIGINT => Awaited::Interrupt,
            libc::SIGHUP => Awaited::Hangup,
            _ => Awaited::Terminate,
        })
    }
}

/// A signal [`AwaitedSignals::wait`] took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// SIGTERM.
    Terminate,
    /// SIGINT.
    Interrupt,
    /// SIGHUP.
    Hangup,
}

/// Takes an exclusive advisory lock (`flock`) on `file` without waiting: false when
/// another holder has it. Held until every descriptor of this open file is closed (a
/// daemon's lock on its socket's path, for its life).
pub fn try_lock_file(file: &std::fs::File) -> Result<bool> {
    Ok(crate::sys::fs::try_lock_exclusive(file)?)
}

/// True when this process runs with effective uid 0.
pub fn is_root() -> bool {
    crate::sys::is_root()
}

/// Raises this process's soft limit of open files to its hard limit (a daemon holds
/// a descriptor per client and per store file); returns the limit now in force.
pub fn raise_open_files_limit() -> Result<u64> {
    Ok(crate::sys::process::raise_open_files_limit()?)
}

/// A process watched for its exit, through a pidfd: it names that process even once
/// its pid is reused.
#[derive(Debug)]
pub struct ProcessWatch(std::os::fd::OwnedFd);

impl ProcessWatch {
    /// Watches process `pid` (fails when it does not exist, or the kernel has no pidfds).
    pub fn open(pid: i32) -> Result<Self> {
        Ok(Self(crate::sys::process::pidfd_open(pid)?))
    }

    /// Waits until the process has exited (at once when it has).
    pub fn wait_exit(&self) -> Result<()> {
        Ok(crate::sys::process::wait_pidfd(&self.0)?)
    }
}

/// Sends SIGTERM to process `pid` (a program asked to stop cleanly).
pub fn terminate(pid: u32) -> Result<()> {
    let p = i32::try_from(pid)
        .map_err(|_| crate::Error::InvalidArgument { what: "pid", why: format!("{pid} out of range") })?;
    Ok(crate::sys::sigsend::send(p, libc::SIGTERM)?)
}

/// Turns transparent huge pages off for this process and every program it starts from
/// now on (their `MADV_HUGEPAGE` is ignored), so memory is backed, and counted, in base
/// pages.
pub fn disable_thp() -> Result<()> {
    Ok(crate::sys::thp::disable()?)
}

/// Registers handlers run by `fork()`: `prepare` in the parent before the fork, `parent`
/// in the parent and `child` in the child after it (in registration order, `prepare`
/// in reverse). Idempotent: registering the same three again does nothing, so call it
/// on every use that needs them rather than behind a `std::sync::Once`, which a child
/// forked while another thread ran it would find "running" for ever.
///
/// In the child only the forking thread exists: a handler must not wait for locks
/// other threads might have held. The functions must stay loaded as long as the process
/// may fork.
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) -> Result<()> {
    Ok(crate::sys::process::at_fork(prepare, parent, child)?)
}
