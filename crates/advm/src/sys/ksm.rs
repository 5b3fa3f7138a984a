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

/// Whether this process may write the KSM knobs: they are root's, mode 0644, so
/// writing takes uid 0 or CAP_DAC_OVERRIDE (checked with the effective ids, as the
/// write will be).
pub fn writable() -> bool {
    let run = Path::new(SYSFS_DIR).join("run");
    rustix::fs::accessat(rustix::fs::CWD, &run, rustix::fs::Access::WRITE_OK, rustix::fs::AtFlags::EACCESS).is_ok()
}

/// Writes one KSM knob (root only).
pub fn write(name: &str, value: &str) -> SysResult<()> {
    std::fs::write(Path::new(SYSFS_DIR).join(name), value)
        .map_err(|e| SysError::from_io("write(/sys/kernel/mm/ksm)", &e))
}
