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
/// a file with that name and these bytes is already there, and returns its path.
///
/// Programs preload the file, so whoever may replace it runs code as every user of
/// it: `dir` must be this user's alone (owned by the effective uid, writable by no
/// one else), or this fails with `PermissionDenied` saying so. A shared directory
/// such as /tmp/advm, made first by another user, used to serve that user's library
/// to root's `advm run`.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    check_private(dir)?;
    let path = dir.join(format!("libadvm-preload-{:016x}.so", fnv1a(SHIM_SO)));
    if std::fs::read(&path).is_ok_and(|b| b == SHIM_SO) {
        return Ok(path);
    }
    // Write under a temporary name and rename: a concurrent reader never sees half a file.
    let tmp = dir.join(format!(".libadvm-preload-{}.tmp", std::process::id()));
    std::fs::write(&tmp, SHIM_SO)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Refuses a directory that someone other than this user could write to.
fn check_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)?;
    let me = advm::process::euid();
    if meta.uid() == me && meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{} is owned by uid {} with mode {:o}, not private to uid {me}: another user could replace the shim \
             that programs preload from it (set XDG_CACHE_HOME to a directory of uid {me}'s only)",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ),
    ))
}

/// Where `advm run` keeps the shim: `$XDG_CACHE_HOME/advm`, `~/.cache/advm`, or
/// `advm-<euid>` in the temporary directory (one per user: [`install`] accepts no
/// directory another user could write). The temporary one also when the first that
/// applies cannot be created: service accounts' homes (`/nonexistent`, a read-only
/// `/var/www`) made `advm run` fail with "Permission denied" before.
pub fn default_cache_dir() -> PathBuf {
    let home = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("advm"))
        .or_else(|| std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache/advm")));
    match home {
        Some(d) if std::fs::create_dir_all(&d).is_ok() => d,
        _ => std::env::temp_dir().join(format!("advm-{}", advm::process::euid())),
    }
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

    /// A file of the right name and length but other bytes (planted, or torn) is
    /// replaced, not preloaded.
    #[test]
    fn install_replaces_a_file_with_other_bytes() {
        let dir = std::env::temp_dir().join(format!("advm-preload-test-other-{}", std::process::id()));
        let path = install(&dir).unwrap();
        std::fs::write(&path, vec![0u8; SHIM_SO.len()]).unwrap();
        assert_eq!(install(&dir).unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), SHIM_SO);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A directory others may write to, or another user's, is refused: its files could
    /// be swapped for a library that then runs as this user (as root, for root).
    #[test]
    fn install_refuses_a_directory_others_could_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("advm-preload-test-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = install(&dir).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("another user could replace the shim"), "{e}");
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "nothing written into it");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        if advm::process::is_root() {
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            let e = install(&dir).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        } else {
            eprintln!("not checked: a directory of another uid (needs root to make one)");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
