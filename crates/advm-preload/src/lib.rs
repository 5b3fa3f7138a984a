//! The advm LD_PRELOAD shim, compiled from `csrc/*.c` by `build.rs` and embedded here
//! so that the `advm` binary is self-contained: [`install`] writes it once to a
//! content-named file that `advm run` puts in `LD_PRELOAD`. [`launch`] starts a program
//! under one of the five configurations (shim mode, statistics, KSM settings).
//!
//! The shim is C, not Rust, because it replaces malloc and memcpy: it may not
//! allocate, recurse or depend on a runtime, and must work before `main` and after exit
//! handlers (see `DESIGN.md`).

#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

pub mod launch;

/// The shared object's bytes.
pub const SHIM_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libadvm_preload.so"));

/// Environment variables the shim reads.
pub mod env {
    /// `vcopy`, `alloc` or `ksm` (`off` disables the shim even when preloaded); `cow`
    /// is the deprecated name of `vcopy`, accepted for one release.
    pub const MODE: &str = "ADVM_MODE";
    /// `anon` (default) or `memfd`: how a new block of vcopy mode starts (memfd: shared
    /// memfd pages from the start). `ADVM_COW_FRESH` is its deprecated name, read when
    /// this one is unset.
    pub const VCOPY_FRESH: &str = "ADVM_VCOPY_FRESH";
    /// Allocations and copies of at least this many pages use the arena (default 2).
    pub const THRESHOLD_PAGES: &str = "ADVM_THRESHOLD_PAGES";
    /// Copies of at least this many pages (and at least the threshold) become virtual
    /// (default 16: smaller copies cost more system time than they save memory).
    pub const COPY_MIN_PAGES: &str = "ADVM_COPY_MIN_PAGES";
    /// Directory where each process writes `<pid>.stats` at exit.
    pub const STATS_DIR: &str = "ADVM_STATS_DIR";
}

/// 64-bit FNV-1a: names the installed file after its contents, so different builds
/// never overwrite each other's file while a program has it mapped.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Writes the shim into `dir` (created if needed) as `libadvm-preload-<hash>.so`, unless
/// a file with that name and length is already there, and returns its path.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join(format!("libadvm-preload-{:016x}.so", fnv1a(SHIM_SO)));
    if std::fs::metadata(&path).map(|m| m.len() == SHIM_SO.len() as u64).unwrap_or(false) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    // Write under a temporary name and rename: a concurrent reader never sees half a file.
    let tmp = dir.join(format!(".libadvm-preload-{}.tmp", std::process::id()));
    std::fs::write(&tmp, SHIM_SO)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Where `advm run` keeps the shim: `$XDG_CACHE_HOME/advm`, `~/.cache/advm`, or the
/// temporary directory.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("advm");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache/advm");
    }
    std::env::temp_dir().join("advm")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_object_is_elf() {
        assert_eq!(&SHIM_SO[..4], b"\x7fELF");
    }

    #[test]
    fn install_is_idempotent_and_content_named() {
        let dir = std::env::temp_dir().join(format!("advm-preload-test-{}", std::process::id()));
        let a = install(&dir).unwrap();
        let b = install(&dir).unwrap();
        assert_eq!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), SHIM_SO);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
