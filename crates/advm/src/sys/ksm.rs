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
