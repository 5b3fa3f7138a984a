//! The C API of advm (`include/advm.h`): `libadvm.so` and `libadvm.a`.
//!
//! This crate is an FFI boundary: its `unsafe` is limited to taking raw pointers from C
//! and handing them to the library's raw-address APIs (no syscalls here; those stay in
//! the library, behind its safe `advm::mem` vocabulary and capability modules). Functions return 0 or a negative errno, as the header documents, and
//! never unwind into C.
#![allow(unsafe_code)]

use std::ffi::c_char;

pub mod agent;
pub mod gc;
#[cfg(test)]
mod layout_tests;
pub mod merge;
pub mod pager;
pub mod remap;
pub mod vcopy;

/// Converts an advm error into a negative errno for C.
pub fn errno_of(e: &advm::Error) -> i32 {
    let raw = match e {
        advm::Error::Sys(s) => s.raw_errno(),
        advm::Error::InvalidArgument { .. } | advm::Error::DaemonRefused { .. } => libc::EINVAL,
        advm::Error::OutOfMemory { .. } => libc::ENOMEM,
        advm::Error::Unrecoverable { .. } => libc::ENOTRECOVERABLE,
        advm::Error::Unsupported { .. } => libc::ENOSYS,
        advm::Error::NoSuchProcess { .. } | advm::Error::ProcessExited { .. } | advm::Error::Zombie { .. } => {
            libc::ESRCH
        }
        advm::Error::PermissionDenied { .. } | advm::Error::NeedsPrivilege { .. } => libc::EPERM,
        advm::Error::KernelThread { .. } => libc::EINVAL,
        advm::Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        advm::Error::Disconnected { .. } => libc::EPIPE,
        _ => libc::EIO,
    };
    -raw.abs()
}

/// The most bytes of a size-versioned options struct a caller may pass: a page, as
/// openat2 allows (a larger size is a field left unset, not a struct).
const MAX_OPTIONS_BYTES: usize = 4096;

/// A size-versioned options struct (`size` its first field, as openat2's): readable as
/// this library's `T` when `size` is from `size_of::<T>()` to a page and every byte a
/// newer header added beyond ours is zero (a setting this library cannot honour is
/// refused, ENOSYS, never ignored). `what` names the struct in errors.
///
/// # Safety
/// `opts` is non-NULL and readable for the `size` bytes its first field gives.
pub unsafe fn versioned_options<'a, T>(opts: *const T, what: &'static str) -> Result<&'a T, advm::Error> {
    // SAFETY: the caller's contract; `size` is the first field.
    let size = unsafe { std::ptr::read_unaligned(opts as *const usize) };
    let ours = std::mem::size_of::<T>();
    if size < ours || size > MAX_OPTIONS_BYTES {
        return Err(advm::Error::InvalidArgument {
            what,
            why: format!("size {size}, not from {ours} to {MAX_OPTIONS_BYTES}"),
        });
    }
    // SAFETY: the caller's contract: `size` bytes are readable.
    let tail = unsafe { std::slice::from_raw_parts((opts as *const u8).add(ours), size - ours) };
    if tail.iter().any(|&b| b != 0) {
        return Err(advm::Error::Unsupported {
            what,
            why: format!("fields beyond this library's {ours} bytes are set (a newer header)"),
        });
    }
    // SAFETY: readable for `ours` bytes, checked above.
    Ok(unsafe { &*opts })
}

/// Runs `f`, turning a panic into `-EIO` so it never unwinds across the C boundary
/// (an arena that panicked then refuses every later call: `-ENOTRECOVERABLE`). A
/// negative result is also left in `errno`, for callers that check it instead; on
/// success `errno` is as the caller left it (the system calls made on the way, such
/// as a failed connect to advmd, do not leak their errno into a call that worked).
pub fn guard(f: impl FnOnce() -> Result<i32, advm::Error>) -> i32 {
    let saved = errno();
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => errno_of(&e),
        Err(_) => -libc::EIO,
    };
    set_errno(if r < 0 { r } else { saved });
    r
}

/// Runs `f` (a destroy function: nothing to report) with `errno` kept as the caller
/// left it, and never unwinds into C.
pub fn quietly(f: impl FnOnce()) {
    keep_errno(|| {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    })
}

/// Runs `f` (a call that cannot fail, or reports failure in its value) with `errno`
/// kept as the caller left it.
pub fn keep_errno<T>(f: impl FnOnce() -> T) -> T {
    let saved = errno();
    let v = f();
    set_errno(saved);
    v
}

/// This thread's `errno`.
fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// `-EINVAL`, with errno set: a NULL handle or output pointer.
pub fn einval() -> i32 {
    set_errno(libc::EINVAL);
    -libc::EINVAL
}

/// Sets this thread's `errno` to the error `e` (given either as `-errno` or `errno`).
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e.abs() };
}

/// `const char *advm_version(void)`: the library version, a static string.
#[no_mangle]
pub extern "C" fn advm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
