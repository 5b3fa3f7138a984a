//! `pthread_atfork`: code that must run around every `fork()` of the process.

use super::{Errno, SysError, SysResult};

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
