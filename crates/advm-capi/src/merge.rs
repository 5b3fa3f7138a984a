//! `advm_merge`: user-guided page merging for C (`advm::merge`, the process-wide client:
//! advmd when it answers, else a store of the process's own).

use std::ffi::c_char;

use crate::guard;

/// `struct advm_merge_stats` in `include/advm.h`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AdvmMergeStats {
    /// Pages now mapping a page the store already held.
    pub merged: u64,
    /// Pages added to the store.
    pub added: u64,
    /// Pages left alone (partial end pages, zero pages, refused, mismatched).
    pub skipped: u64,
    /// Of `skipped`: refused because the store reached its byte limit.
    pub refused: u64,
    /// Wall-clock nanoseconds the merge took.
    pub nanoseconds: u64,
    /// 1 when advmd's store was used, 0 for the process's own store.
    pub via_daemon: u32,
}

/// `int advm_merge(const void *addr, size_t len, struct advm_merge_stats *out)`.
///
/// # Safety
/// `[addr, addr+len)` must be the caller's memory and stay mapped for the call; `out`
/// is NULL or points to writable storage for the struct.
#[no_mangle]
pub unsafe extern "C" fn advm_merge(addr: *const u8, len: usize, out: *mut AdvmMergeStats) -> i32 {
    guard(|| {
        // SAFETY: the caller's promise is merge_raw's contract.
        let s = unsafe { advm::merge::merge_raw(addr as usize, len) }?;
        if !out.is_null() {
            let v = AdvmMergeStats {
                merged: s.merged,
                added: s.added,
                skipped: s.skipped,
                refused: s.refused,
                nanoseconds: (s.seconds * 1e9) as u64,
                via_daemon: matches!(s.via, advm::merge::Via::Daemon { .. }) as u32,
            };
            // SAFETY: non-null and writable by the caller's promise.
            unsafe { out.write(v) };
        }
        Ok(0)
    })
}

/// `struct advm_trim_stats` in `include/advm.h`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AdvmTrimStats {
    /// Store pages let go: no process maps them any more.
    pub released: u64,
    /// Store pages still held: some process maps them.
    pub kept: u64,
    /// Wall-clock nanoseconds the trim took.
    pub nanoseconds: u64,
}

/// `int advm_merge_trim(struct advm_trim_stats *out)`: `advm::merge::trim`.
///
/// # Safety
/// `out` is NULL or points to writable storage for the struct.
#[no_mangle]
pub unsafe extern "C" fn advm_merge_trim(out: *mut AdvmTrimStats) -> i32 {
    guard(|| {
        let t = advm::merge::trim()?;
        if !out.is_null() {
            let v = AdvmTrimStats { released: t.released, kept: t.kept, nanoseconds: (t.seconds * 1e9) as u64 };
            // SAFETY: non-null and writable by the caller's promise.
            unsafe { out.write(v) };
        }
        Ok(0)
    })
}

/// `const char *advm_merge_via(void)`: which store merges use and why, as a
/// NUL-terminated string owned by the library (valid until the next call on the
/// same thread; one buffer per thread, so another thread's call never frees it).
#[no_mangle]
pub extern "C" fn advm_merge_via() -> *const c_char {
    thread_local! {
        // Per thread, not a static Mutex: a fork while another thread held that would
        // leave the child's locked for ever.
        static TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Never unwinds into C (a panic would abort the caller's process).
    // (the first call tries advmd's socket: that errno stays inside)
    let text = crate::keep_errno(|| {
        std::panic::catch_unwind(|| match advm::merge::with_default(|c| Ok(c.via().clone())) {
            Ok(advm::merge::Via::Daemon { socket }) => format!("advmd at {socket}"),
            Ok(advm::merge::Via::Local { reason }) => format!("this process's own store: {reason}"),
            Err(e) => format!("no store: {e}"),
        })
        .unwrap_or_else(|_| "no store: a panic inside advm (a bug)".into())
    });
    TEXT.with(|t| {
        let mut g = t.borrow_mut();
        *g = text.replace('\0', " ").into_bytes();
        g.push(0);
        g.as_ptr().cast()
    })
}
