//! swapon/swapoff, and catching the interrupting signals of a process that must undo
//! a swapon before it exits (the pager benchmark).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::io::Errno;

use super::{SysError, SysResult};

fn cpath(path: &Path) -> SysResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::new("swapon", Errno::INVAL))
}

/// Enables the swap file at `path` (made by mkswap) with priority `prio`.
pub fn swapon(path: &Path, prio: i32) -> SysResult<()> {
    let c = cpath(path)?;
    // SWAP_FLAG_PREFER | (prio & SWAP_FLAG_PRIO_MASK), from <sys/swap.h>
    let flags = 0x8000 | (prio & 0x7fff);
    // SAFETY: a NUL-terminated path and integer flags.
    if unsafe { libc::swapon(c.as_ptr(), flags) } < 0 {
        return Err(SysError::last("swapon"));
    }
    Ok(())
}

/// Disables the swap file at `path` (its pages are read back into memory first).
pub fn swapoff(path: &Path) -> SysResult<()> {
    let c = cpath(path)?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::swapoff(c.as_ptr()) } < 0 {
        return Err(SysError::last("swapoff"));
    }
    Ok(())
}

static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(sig: libc::c_int) {
    CAUGHT.store(sig, Ordering::Relaxed);
    super::signal::note_stop(sig);
}

const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

fn set_all(handler: libc::sighandler_t, old: Option<&mut Vec<(libc::c_int, libc::sigaction)>>) -> SysResult<()> {
    let mut saved = Vec::new();
    for sig in SIGNALS {
        // SAFETY: sigaction structs are plain data; zeroed is an empty mask.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = handler;
        new.sa_flags = libc::SA_RESTART;
        // SAFETY: as above.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: live structs; the handler only stores to an atomic.
        if unsafe { libc::sigaction(sig, &new, &mut prev) } < 0 {
            return Err(SysError::last("sigaction"));
        }
        saved.push((sig, prev));
    }
    if let Some(old) = old {
        *old = saved;
    }
    Ok(())
}

/// The signal recorded since [`Interrupts::catch`], if any.
pub fn caught() -> Option<i32> {
    Some(CAUGHT.load(Ordering::Relaxed)).filter(|&s| s != 0)
}

/// While alive, SIGINT, SIGTERM, SIGHUP and SIGQUIT are recorded instead of ending
/// the process; the old dispositions come back on drop.
pub struct Interrupts {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl Interrupts {
    /// Starts recording.
    pub fn catch() -> SysResult<Self> {
        CAUGHT.store(0, Ordering::Relaxed);
        let mut old = Vec::new();
        set_all(note as extern "C" fn(libc::c_int) as libc::sighandler_t, Some(&mut old))?;
        Ok(Self { old })
    }

    /// In a forked child: the default dispositions again (the child dies of them).
    pub fn default_in_child() -> SysResult<()> {
        set_all(libc::SIG_DFL, None)
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        for (sig, old) in &self.old {
            // SAFETY: restores a disposition sigaction gave us.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}
