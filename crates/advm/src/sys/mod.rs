//! The only home of raw syscalls and `unsafe` in advm.
//!
//! One submodule per kernel call family, each a thin typed wrapper. Every wrapper
//! returns [`SysError`], which names the call and keeps the raw errno (unknown kernel
//! values stay representable through [`Errno`]).
#![allow(unsafe_code)]

pub mod fdpass;
pub mod fs;
pub mod ksm;
pub mod lazy;
pub mod lean_fork;
pub mod memfd;
pub mod merge;
pub mod merge_serviced;
pub mod mman;
pub mod pagemap;
pub mod pager;
pub mod process;
pub mod procmap;
pub mod seal;
pub mod signal;
pub mod sigsend;
pub mod swap;
pub mod thp;
pub mod uffd;
pub mod uffd_sigbus;
pub mod zeroed;

use std::fmt;

pub use rustix::io::Errno;

/// A failed system call: which call, and the errno the kernel returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {}", describe(*.errno))]
pub struct SysError {
    /// The call, e.g. `"mremap"` or `"ioctl(UFFDIO_MOVE)"`.
    pub call: &'static str,
    /// The errno the kernel returned.
    pub errno: Errno,
}

impl SysError {
    /// Builds an error for `call` from `errno`.
    pub fn new(call: &'static str, errno: Errno) -> Self {
        Self { call, errno }
    }

    /// Builds an error for `call` from the calling thread's current `errno`.
    pub fn last(call: &'static str) -> Self {
        Self::new(call, Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    }

    /// Builds an error for `call` from a std I/O error (errno `EIO` if it carries none).
    pub fn from_io(call: &'static str, e: &std::io::Error) -> Self {
        Self::new(call, Errno::from_io_error(e).unwrap_or(Errno::IO))
    }

    /// The raw errno number.
    pub fn raw_errno(&self) -> i32 {
        self.errno.raw_os_error()
    }

    /// Whether the call failed for want of descriptors or memory (`out_of_resources`).
    pub fn is_out_of_resources(&self) -> bool {
        out_of_resources(self.raw_errno())
    }
}

/// Whether `errno` says the process or the system was out of descriptors or memory
/// (EMFILE, ENFILE, ENOMEM): a failure that goes when they are freed, so it is reported
/// and tried again later, never kept as the answer for the process's life.
pub fn out_of_resources(errno: i32) -> bool {
    matches!(errno, libc::EMFILE | libc::ENFILE | libc::ENOMEM)
}

/// The kernel's description of an errno, e.g. "Cannot allocate memory (os error 12)".
fn describe(errno: Errno) -> impl fmt::Display {
    std::io::Error::from_raw_os_error(errno.raw_os_error())
}

/// Result of a raw call.
pub type SysResult<T> = Result<T, SysError>;

/// The base page size of this machine, read once.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// Kernel release string (`uname -r`).
pub fn kernel_release() -> String {
    rustix::system::uname().release().to_string_lossy().into_owned()
}

/// True when the process has an effective uid of 0.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}
