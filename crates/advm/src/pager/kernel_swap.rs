//! What the pager benchmark needs around the kernel's own paging (the paper's NP
//! setting): a swap file it enables and always removes, interrupting signals caught
//! so that removal happens, and the process's CPU times and major faults.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sys::swap;
use crate::{Error, Result};

/// A swap file made, enabled for the kernel, and on drop disabled and removed.
#[derive(Debug)]
pub struct KernelSwap {
    path: PathBuf,
    on: bool,
    /// The file, flock'ed for the swap's life: how [`KernelSwap::remove_left`] tells a
    /// live user (in any PID namespace) from a dead one.
    _lock: Option<std::fs::File>,
}

impl KernelSwap {
    /// Writes `bytes` of zeros at `path` (a swap file must have no holes), runs
    /// `mkswap` on it and enables it. Needs root: without it this fails at once,
    /// having written nothing.
    pub fn create(path: &Path, bytes: u64) -> Result<Self> {
        if !crate::sys::is_root() {
            // swapon(2) takes CAP_SYS_ADMIN; without it the file would be written for nothing
            return Err(Error::NeedsPrivilege {
                what: "enabling a swap file (swapon)",
                needs: "root (CAP_SYS_ADMIN)",
                uid: crate::sys::euid(),
            });
        }
        // Locked before its name appears: a sweep of dead runs' files never takes it.
        let mut f = crate::sys::fs::create_locked(path).map_err(|e| Error::io(path, e))?;
        let lock = f.try_clone().map_err(|e| Error::io(path, e))?;
        let mut me = Self { path: path.to_path_buf(), on: false, _lock: Some(lock) };
        let chunk = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n]).map_err(|e| Error::io(path, e))?;
            left -= n as u64;
        }
        f.sync_all().map_err(|e| Error::io(path, e))?;
        drop(f);
        let out = Command::new("mkswap").arg(path).output().map_err(|e| Error::io("mkswap", e))?;
        if !out.status.success() {
            return Err(Error::Unsupported {
                what: "swap file",
                why: format!("mkswap {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        swap::swapon(path, 10)?;
        me.on = true;
        Ok(me)
    }

    /// Disables (when the kernel still swaps to it) and removes a swap file made by a
    /// process that died before it could remove it (killed outright). Needs root.
    /// Returns false, touching nothing, when a live [`KernelSwap`] still holds it.
    pub fn remove_left(path: &Path) -> Result<bool> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        if !crate::sys::fs::try_lock_exclusive(&file).unwrap_or(false) {
            return Ok(false);
        }
        let swaps = std::fs::read_to_string("/proc/swaps").map_err(|e| Error::io("/proc/swaps", e))?;
        // /proc/swaps escapes blanks in names (as \040): compare the unescaped name
        let on = swaps
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .any(|name| Path::new(&name.replace("\\040", " ")) == path);
        Self { path: path.to_path_buf(), on, _lock: Some(file) }.remove()?;
        Ok(true)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Disables and removes the file now, reporting errors (drop does it silently).
    pub fn remove(mut self) -> Result<()> {
        self.remove_now()
    }

    fn remove_now(&mut self) -> Result<()> {
        if self.on {
            swap::swapoff(&self.path)?;
            self.on = false;
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&self.path, e)),
            _ => Ok(()),
        }
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        let _ = self.remove_now();
    }
}

/// While alive, SIGINT, SIGTERM, SIGHUP and SIGQUIT are recorded instead of ending
/// the process, so that it lives to disable its swap file and remove its cgroup.
pub struct Interrupts {
    _inner: swap::Interrupts,
}

impl Interrupts {
    /// Starts recording (one at a time per process).
    pub fn catch() -> Result<Self> {
        Ok(Self { _inner: swap::Interrupts::catch()? })
    }

    /// The signal received so far, if any.
    pub fn caught(&self) -> Option<i32> {
        swap::caught()
    }

    /// In a forked child: back to the default dispositions, so the child dies of them.
    pub fn default_in_child() -> Result<()> {
        Ok(swap::Interrupts::default_in_child()?)
    }
}

/// CPU times and major faults of the calling process so far (`/proc/self/stat`).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessTimes {
    /// User time, seconds.
    pub user_s: f64,
    /// System time, seconds.
    pub sys_s: f64,
    /// Major faults (pages read from swap or files by the kernel).
    pub major_faults: u64,
}

impl ProcessTimes {
    /// Reads them now.
    pub fn now() -> Result<Self> {
        let stat = procfs::process::Process::myself()
            .and_then(|p| p.stat())
            .map_err(|e| Error::io("/proc/self/stat", std::io::Error::other(e)))?;
        let tick = procfs::ticks_per_second() as f64;
        Ok(Self { user_s: stat.utime as f64 / tick, sys_s: stat.stime as f64 / tick, major_faults: stat.majflt })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without root, creating the swap file says that root (CAP_SYS_ADMIN) is needed
    /// and leaves no file: it used to write and mkswap the whole file, then fail with
    /// a bare EPERM from swapon.
    #[test]
    fn without_root_it_says_root_is_needed_and_writes_nothing() {
        let path = std::env::temp_dir().join(format!("advm-test-kswap-unprivileged-{}", std::process::id()));
        let code = crate::sys::process::run_unprivileged(|| match KernelSwap::create(&path, 1 << 20) {
            Err(Error::NeedsPrivilege { needs, .. }) if needs.contains("CAP_SYS_ADMIN") && !path.exists() => 0,
            Err(e) => {
                eprintln!("wrong error or a file left: {e}");
                1
            }
            Ok(_) => 2,
        })
        .unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(code, 0);
    }
}
