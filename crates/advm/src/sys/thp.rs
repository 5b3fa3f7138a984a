//! Transparent huge pages per process (prctl).

use super::{SysError, SysResult};

/// Turns transparent huge pages off for this process and the programs it starts
/// (`PR_SET_THP_DISABLE`, inherited across fork and exec; `MADV_HUGEPAGE` is then
/// ignored).
pub fn disable() -> SysResult<()> {
    // SAFETY: prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        return Err(SysError::last("prctl(PR_SET_THP_DISABLE)"));
    }
    Ok(())
}
