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

/// A daemon for test `name` (unique within the test binary), `tweak` applied to its
/// configuration, and its socket's path.
pub fn start(name: &str, tweak: impl FnOnce(&mut Config)) -> (Running, PathBuf) {
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sock = dir.join("advmd.sock");
    let mut cfg = Config::at(&sock);
    tweak(&mut cfg);
    (Running { handle: Some(Daemon::bind(cfg).unwrap().spawn()), dir }, sock)
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
