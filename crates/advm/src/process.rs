//! Process-level helpers front ends need around a child they run.

use crate::sys::signal;
use crate::Result;

/// While alive, SIGINT and SIGQUIT are left to the child (the terminal delivers them
/// to the child too, as `system(3)` does) and SIGTERM and SIGHUP are forwarded to it,
/// so the parent lives to clean up after it; the old dispositions come back on drop.
/// One at a time per process. A signal ignored when it is installed stays ignored, and
/// the child inherits that, as it would without the parent in between (`nohup`, a
/// script's `&` job).
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

/// Exits as a child that ended with `status` did: with its exit code, or, when a signal
/// killed it, by the same signal (default action, no core file of our own), so that a
/// shell script looping over a front end stops at Ctrl-C as it would for the child
/// itself. A signal whose default does not end a process exits with 128 + its number.
pub fn exit_like(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        signal::die_by(sig);
        std::process::exit(128 + sig);
    }
    std::process::exit(status.code().unwrap_or(1))
}

/// While alive, SIGTERM, SIGINT and SIGHUP are noted instead of ending the process,
/// so a long run (a benchmark with VMs and cgroups) can stop and clean up; the old
/// dispositions come back on drop. One ignored when it is installed stays ignored.
/// May nest, and a signal that comes while a [`ForwardSignals`] (or the pager's
/// `Interrupts`) is installed inside it is noted as well.
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

/// This process's effective uid: whose files it may trust, and what an error names
/// when a privilege is missing.
pub fn euid() -> u32 {
    crate::sys::euid()
}

/// Raises this process's soft limit of open files to its hard limit (a daemon holds
/// a descriptor per client and per store file); returns the limit now in force.
pub fn raise_open_files_limit() -> Result<u64> {
    Ok(crate::sys::process::raise_open_files_limit()?)
}

/// Lets this process's heap (glibc's malloc) use at most `n` arenas. glibc makes up to
/// eight per CPU for threads that allocate at once, and keeps each one's freed memory:
/// a daemon with a thread per client otherwise keeps the heap of its busiest moment.
/// False when malloc refused (not glibc's).
pub fn limit_heap_arenas(n: u16) -> bool {
    crate::sys::process::limit_malloc_arenas(i32::from(n.max(1)))
}

/// Gives the heap's free memory back to the kernel, in every arena (a long-lived
/// process after a burst of work: freed memory otherwise stays resident).
pub fn release_free_heap() {
    crate::sys::process::trim_malloc()
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

    /// Watches a process whose pidfd the kernel handed out (`SO_PEERPIDFD`).
    pub(crate) fn from_pidfd(fd: std::os::fd::OwnedFd) -> Self {
        Self(fd)
    }

    /// Watches process `pid`, which must have started by `by` (clock ticks since boot,
    /// [`crate::sys::process::boot_ticks`]): `None` when it has exited, or when the
    /// process with that pid now started later (so the one meant has exited, and its
    /// pid was reused). A pid reused before `by` is not told apart.
    pub(crate) fn open_started_by(pid: i32, by: u64) -> Result<Option<Self>> {
        let w = match crate::sys::process::pidfd_open(pid) {
            Ok(fd) => Self(fd),
            Err(e) if e.errno == crate::sys::Errno::SRCH => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let started = procfs::process::Process::new(pid)
            .and_then(|p| p.stat())
            .map(|s| s.starttime)
            .map_err(|e| crate::Error::io(format!("/proc/{pid}/stat"), std::io::Error::other(e)));
        // Read after the pidfd was opened: while its process runs, no other has its pid,
        // so the start time read was its own. One that has exited since is watched as it
        // is (exited), whichever it was.
        if w.has_exited()? {
            return Ok(Some(w));
        }
        Ok((started? <= by).then_some(w))
    }

    /// Whether the process has exited, without waiting.
    pub fn has_exited(&self) -> Result<bool> {
        use std::os::fd::AsFd;
        Ok(!crate::sys::process::poll_pidfds(&[self.0.as_fd()], None, 0)?.is_empty())
    }

    /// Waits until one of `watches` has exited, `wake` reads ready (another thread
    /// has more to watch) or `timeout` (`None`: no limit) has passed; returns the
    /// indices of those that have exited, none when only `wake` or the time woke it.
    /// One thread can so watch any number of processes.
    pub fn wait_any(
        watches: &[&ProcessWatch],
        wake: std::os::fd::BorrowedFd<'_>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Vec<usize>> {
        use std::os::fd::AsFd;
        let fds: Vec<_> = watches.iter().map(|w| w.0.as_fd()).collect();
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        Ok(crate::sys::process::poll_pidfds(&fds, Some(wake), ms)?)
    }
}

/// Gives the text of /proc/PID/maps of every process this one may read to `each`
/// (a process that exits meanwhile, or whose maps are not readable, is left out).
pub fn each_process_maps(each: impl FnMut(&str)) {
    let _ = each_maps(each, |_| {});
}

/// Who may map a store's pages, for [`each_process_maps_of`]: the client's process,
/// and the processes of its uid started since it was handed its first page (a
/// process started before cannot have inherited a mapping made later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mappers {
    /// The client's process (0: unknown, which fails the look).
    pub pid: u32,
    /// Its uid.
    pub uid: u32,
    /// Since when, in clock ticks since boot ([`boot_ticks`]).
    pub since_ticks: u64,
}

/// The time since boot in clock ticks, as process start times in /proc/PID/stat count.
pub fn boot_ticks() -> Result<u64> {
    Ok(crate::sys::process::boot_ticks()?)
}

/// [`each_process_maps`], and the pids of the processes left out although they may be
/// among `who`: `who.pid` itself, or a process with `who.uid` among its real,
/// effective, saved and filesystem uids (`/proc/PID/status`, which anyone may read)
/// that started at or after `who.since_ticks` (or whose start cannot be told): a
/// process of another user, or one that made itself undumpable, is unreadable to a
/// reader that is not root. Fails when /proc cannot be listed or `who.pid` is 0.
pub fn each_process_maps_of(who: Mappers, each: impl FnMut(&str)) -> Result<Vec<u32>> {
    let refused = |why: &str| crate::Error::Unsupported { what: "reading processes' maps", why: why.into() };
    if who.pid == 0 {
        return Err(refused("the client's process is not visible here (another pid namespace)"));
    }
    let mut unread = Vec::new();
    each_maps(each, |pid| {
        let process = procfs::process::Process::new(pid as i32).ok();
        let uids = process.as_ref().and_then(|p| p.status().ok()).map(|s| [s.ruid, s.euid, s.suid, s.fuid]);
        let started = process.as_ref().and_then(|p| p.stat().ok()).map(|s| s.starttime);
        let may = uids.is_some_and(|u| u.contains(&who.uid)) && started.map_or(true, |t| t >= who.since_ticks);
        if pid == who.pid || may {
            unread.push(pid);
        }
    })
    .map_err(|(path, e)| match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM) => crate::Error::io(path, e),
        _ => refused("/proc cannot be listed"),
    })?;
    Ok(unread)
}

/// Runs `each` on every readable /proc/PID/maps and `unreadable` on the pid of every
/// other. Err (the path and why) when /proc cannot be listed, or when a maps file
/// cannot be opened for want of this process's own resources (out of fds or memory:
/// that says nothing of the process whose maps it is).
fn each_maps(
    mut each: impl FnMut(&str),
    mut unreadable: impl FnMut(u32),
) -> std::result::Result<(), (std::path::PathBuf, std::io::Error)> {
    let dir = std::fs::read_dir("/proc").map_err(|e| ("/proc".into(), e))?;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let path = e.path().join("maps");
        match std::fs::read_to_string(&path) {
            Ok(maps) => each(&maps),
            // exited meanwhile
            Err(err) if err.kind() == std::io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH) => {}
            Err(err) if matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)) => {
                return Err((path, err))
            }
            Err(_) => unreadable(pid),
        }
    }
    Ok(())
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

/// Runs `spawn`, which starts a library's own long-lived threads, with every signal
/// but the fault signals blocked, so the threads start with them blocked: a signal
/// sent to the process is then handled on one of the program's threads, never on
/// the library's (the caller's mask is as before afterwards).
pub fn spawn_with_sent_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    signal::spawn_with_sent_signals_blocked(spawn)
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

/// A directory for one run's files under the temporary directory, named
/// `<prefix>-<pid>-<n>` and removed on drop. Its owner holds an `flock` on it for its
/// life, so a run killed outright (SIGKILL, no drop) leaves a directory whose lock is
/// free: [`ScratchDir::new`] removes those first. The lock, not the pid, tells a dead
/// run from a live one, also a live one in another PID namespace. Its marker file
/// ([`ScratchDir::MARKER`], hidden) keeps the sweep away from directories it did not
/// make.
#[derive(Debug)]
pub struct ScratchDir {
    path: std::path::PathBuf,
    _lock: std::fs::File,
}

impl ScratchDir {
    /// The empty file every scratch directory holds: what the sweep looks for.
    pub const MARKER: &'static str = ".advm-scratch";

    /// Removes dead runs' scratch directories, then makes a new one.
    pub fn new(prefix: &str) -> Result<Self> {
        Self::remove_dead();
        Self::create(prefix)
    }

    /// Makes a new one without sweeping first: for a caller that has just called
    /// [`ScratchDir::remove_dead`] (one sweep of the temporary directory per run).
    pub fn create(prefix: &str) -> Result<Self> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let tmp = std::env::temp_dir();
        let io = |p: &std::path::Path, e| crate::Error::io(p, e);
        for _ in 0..1000 {
            let name = format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
            let path = tmp.join(&name);
            // Made and locked under a hidden name, then renamed: the sweep never sees
            // it named and unlocked.
            let making = tmp.join(format!(".{name}.new"));
            // Private to this user: /tmp is shared and the name guessable (one made by
            // someone else is skipped, never used).
            match std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&making) {
                Ok(()) => {}
                // a run with this pid in another PID namespace: the next number
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io(&making, e)),
            }
            let made = (|| {
                let lock = std::fs::File::open(&making).map_err(|e| io(&making, e))?;
                crate::sys::fs::lock_exclusive(&lock)?;
                std::fs::File::create(making.join(Self::MARKER)).map_err(|e| io(&making, e))?;
                Ok::<_, crate::Error>(lock)
            })();
            let lock = match made {
                Ok(lock) => lock,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&making);
                    return Err(e);
                }
            };
            match crate::sys::fs::rename_noreplace(&making, &path) {
                Ok(()) => return Ok(Self { path, _lock: lock }),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&making);
                    if e.errno != rustix::io::Errno::EXIST && e.errno != rustix::io::Errno::NOTEMPTY {
                        return Err(e.into());
                    }
                }
            }
        }
        Err(crate::Error::InvalidArgument {
            what: "scratch directory",
            why: format!("1000 names {prefix}-{}-N taken in {}", std::process::id(), tmp.display()),
        })
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Removes the scratch directories in the temporary directory whose owners died
    /// without removing them; returns how many. Directories without the marker, and
    /// those whose lock is held, are left alone.
    pub fn remove_dead() -> usize {
        let tmp = std::env::temp_dir();
        let Ok(entries) = std::fs::read_dir(&tmp) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.')
                || !entry.file_type().is_ok_and(|t| t.is_dir())
                || !path.join(Self::MARKER).is_file()
            {
                continue;
            }
            let Ok(dir) = std::fs::File::open(&path) else { continue };
            // Held while removing, so a second sweep leaves it to this one.
            if crate::sys::fs::try_lock_exclusive(&dir).unwrap_or(false) && std::fs::remove_dir_all(&path).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::ScratchDir;

    #[test]
    fn dead_runs_scratch_directories_are_removed_and_live_or_foreign_ones_kept() {
        let tmp = std::env::temp_dir();
        let live = ScratchDir::new("advm-test-scratch-live").unwrap();
        let name = live.path().file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with(&format!("advm-test-scratch-live-{}-", std::process::id())), "{name}");
        assert!(live.path().join(ScratchDir::MARKER).is_file());
        // What a run killed outright leaves: the marker, and no lock (the kernel drops
        // a dead process's flocks).
        let dead = tmp.join(format!("advm-test-scratch-dead-{}", std::process::id()));
        std::fs::create_dir_all(dead.join("sub")).unwrap();
        std::fs::write(dead.join(ScratchDir::MARKER), b"").unwrap();
        std::fs::write(dead.join("sub/output"), b"x").unwrap();
        // Not made by ScratchDir: no marker.
        let foreign = tmp.join(format!("advm-test-scratch-foreign-{}", std::process::id()));
        std::fs::create_dir_all(&foreign).unwrap();
        let next = ScratchDir::new("advm-test-scratch-next").unwrap();
        assert!(!dead.exists(), "a dead run's directory was kept");
        assert!(live.path().is_dir() && next.path().is_dir(), "a live run's directory was removed");
        assert!(foreign.is_dir(), "a directory without the marker was removed");
        assert_ne!(live.path(), next.path());
        let path = live.path().to_path_buf();
        drop(live);
        assert!(!path.exists(), "not removed on drop");
        std::fs::remove_dir(&foreign).unwrap();
    }
}
