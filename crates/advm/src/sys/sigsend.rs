//! Sending a signal to another process.

use super::{SysError, SysResult};

/// Sends signal number `sig` to process `pid`.
pub fn send(pid: i32, sig: i32) -> SysResult<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(SysError::last("kill"));
    }
    Ok(())
}
