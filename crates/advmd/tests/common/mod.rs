//! What the daemon tests share: a daemon on a socket in a directory of its own, which
//! goes when the test ends (each run left a dozen directories in /tmp before).

use std::ops::Deref;
use std::path::PathBuf;

use advmd::{Config, Daemon, Handle};

/// A daemon serving at `dir/advmd.sock`; dropping it stops the daemon, then removes
/// `dir`.
pub struct Running {
    handle: Option<Handle>,
    dir: PathBuf,
}

impl Running {
    /// Stops the daemon now (the directory goes with the value).
    #[allow(dead_code)] // not every test binary stops a daemon early
    pub fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
        }
    }
}

impl Deref for Running {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        self.handle.as_ref().expect("running until dropped or stopped")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.handle.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A daemon bound at `dir/advmd.sock` that serves nobody yet: connections wait in the
/// socket's backlog until [`Bound::spawn`].
pub struct Bound {
    daemon: Daemon,
    dir: PathBuf,
}

impl Bound {
    /// Starts serving.
    #[allow(dead_code)] // not every test binary binds before it serves
    pub fn spawn(self) -> Running {
        Running { handle: Some(self.daemon.spawn()), dir: self.dir }
    }
}

/// A daemon for test `name` (unique within the test binary), `tweak` applied to its
/// configuration, bound but not serving yet, and its socket's path.
pub fn bind(name: &str, tweak: impl FnOnce(&mut Config)) -> (Bound, PathBuf) {
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sock = dir.join("advmd.sock");
    let mut cfg = Config::at(&sock);
    tweak(&mut cfg);
    (Bound { daemon: Daemon::bind(cfg).unwrap(), dir }, sock)
}

/// A daemon for test `name` (unique within the test binary), `tweak` applied to its
/// configuration, and its socket's path.
pub fn start(name: &str, tweak: impl FnOnce(&mut Config)) -> (Running, PathBuf) {
    let (bound, sock) = bind(name, tweak);
    (bound.spawn(), sock)
}

/// This process's threads named `name`.
#[allow(dead_code)] // used by the tests that count the daemon's threads
pub fn threads(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end() == name)
        .count()
}

/// `pages` of bytes that differ from those of every other `seed`.
#[allow(dead_code)] // used by the tests that merge distinct buffers
pub fn distinct(pages: usize, seed: u64) -> advm::mem::Region {
    let mut r = advm::mem::Region::new(pages * advm::mem::page_size()).unwrap();
    for (i, x) in r.bytes_mut().iter_mut().enumerate() {
        *x = ((i as u64 ^ seed << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
    }
    r
}

/// A pipe: `[read end, write end]`.
#[allow(dead_code)] // used by the tests that pace a forked client
pub fn pipe() -> [i32; 2] {
    let mut p = [0; 2];
    // SAFETY: a pipe; its fds are ours.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    p
}

/// Writes one byte to pipe end `fd`.
#[allow(dead_code)] // used by the tests that pace a forked client
pub fn put(fd: i32, b: u8) -> bool {
    // SAFETY: a byte from our stack to our pipe end.
    unsafe { libc::write(fd, [b].as_ptr().cast(), 1) == 1 }
}

/// Reads one byte from pipe end `fd` (`None` at its end).
#[allow(dead_code)] // used by the tests that pace a forked client
pub fn get(fd: i32) -> Option<u8> {
    let mut b = [0u8];
    // SAFETY: a byte from our pipe end into our stack.
    (unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) } == 1).then_some(b[0])
}

/// Runs `f` in a forked child, whose exit code it returns; gives the child's pid.
#[allow(dead_code)] // used by the tests with clients of their own process
pub fn fork(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `f` and leaves with _exit, never returning into the test.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leave without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for child `pid`; its exit code (128 + the signal that ended it).
#[allow(dead_code)] // used by the tests with clients of their own process
pub fn wait(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: our child; waitpid writes one int.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// A child of this process given pid `pid`, asleep until killed: `ns_last_pid` set
/// just below it, then a fork (another process may fork in between: a few tries).
/// `None` where the pid cannot be chosen (not root in the pid namespace's owner).
#[allow(dead_code)] // used by the tests of a pid reused
pub fn take_pid(pid: i32) -> Option<i32> {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let got = fork(|| {
            // killed by the test; a test that fails first leaves it this long
            std::thread::sleep(std::time::Duration::from_secs(20));
            0
        });
        if got == pid {
            return Some(got);
        }
        kill(got);
    }
    None
}

/// Kills child `pid` and waits for it.
#[allow(dead_code)] // used by the tests of a pid reused
pub fn kill(pid: i32) {
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait(pid);
}
