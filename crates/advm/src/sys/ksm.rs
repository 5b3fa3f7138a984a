//! Kernel Samepage Merging: the sysfs knobs and counters, and the per-process prctl.

use std::path::Path;

use super::{SysError, SysResult};

/// Where the KSM knobs live.
pub const SYSFS_DIR: &str = "/sys/kernel/mm/ksm";

/// True when this kernel has KSM.
pub fn available() -> bool {
    Path::new(SYSFS_DIR).join("run").exists()
}

/// Reads one numeric KSM file (`pages_shared`, `run`, ...); `None` if absent.
pub fn read(name: &str) -> Option<i64> {
    std::fs::read_to_string(Path::new(SYSFS_DIR).join(name)).ok()?.trim().parse().ok()
}

/// Reads one textual KSM file (`advisor_mode`); `None` if absent.
pub fn read_text(name: &str) -> Option<String> {
    Some(std::fs::read_to_string(Path::new(SYSFS_DIR).join(name)).ok()?.trim().to_string())
}

/// Writes one KSM knob (root only).
pub fn write(name: &str, value: &str) -> SysResult<()> {
    std::fs::write(Path::new(SYSFS_DIR).join(name), value)
        .map_err(|e| SysError::from_io("write(/sys/kernel/mm/ksm)", &e))
}

const PR_SET_MEMORY_MERGE: i32 = 67;
const PR_GET_MEMORY_MERGE: i32 = 68;

/// Marks every current and future anonymous mapping of this process mergeable
/// (`prctl(PR_SET_MEMORY_MERGE)`, Linux 6.4+; root only).
pub fn set_process_merge(enable: bool) -> SysResult<()> {
    // SAFETY: PR_SET_MEMORY_MERGE takes an integer flag and touches no user memory.
    let r = unsafe { libc::prctl(PR_SET_MEMORY_MERGE, enable as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        Err(SysError::last("prctl(PR_SET_MEMORY_MERGE)"))
    } else {
        Ok(())
    }
}

/// Whether this process has whole-process merging enabled (`EINVAL` before Linux 6.4).
pub fn process_merge() -> SysResult<bool> {
    // SAFETY: PR_GET_MEMORY_MERGE takes no pointers.
    let r = unsafe { libc::prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) };
    if r < 0 {
        Err(SysError::last("prctl(PR_GET_MEMORY_MERGE)"))
    } else {
        Ok(r == 1)
    }
}
