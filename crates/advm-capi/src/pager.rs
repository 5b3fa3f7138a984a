//! C API of `advm::pager` (see `include/advm.h`): a pager, its regions, the
//! discardable marks, flush, and the appendix statistics.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use advm::pager::{Config, FaultMode, NeededPaging, PagedRegion, Pager, SwapIo};

use crate::{guard, set_errno};

/// `advm_pager`: a pager and the regions it mapped for C (unmapped with it).
#[allow(non_camel_case_types)] // the C name
pub struct advm_pager {
    // regions before the pager: fields drop in order, the handler thread stops last
    /// By start address (`advm_pager_unmap` looks them up).
    regions: Mutex<BTreeMap<usize, PagedRegion>>,
    /// Shared with the heaps placed in it (`advm_gc_new_paged`), which keep it alive.
    pub(crate) pager: Arc<Pager>,
}

/// `struct advm_pager_stats`.
#[allow(non_camel_case_types)] // the C name
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct advm_pager_stats {
    /// Page-outs that dropped a discardable page (never written).
    pub discarded_pages: u64,
    /// Page-outs that wrote a needed page to the swap file.
    pub written_pages: u64,
    /// Faults served by reading a page back.
    pub read_pages: u64,
    /// Faults served with zeros (never-used or discarded pages).
    pub zero_fills: u64,
    /// Pages resident now.
    pub resident_pages: u64,
    /// Pages evicted by the pager's own pre-flush.
    pub preflushed_by_pager: u64,
    /// Pages evicted by advm_pager_flush.
    pub preflushed_by_user: u64,
    /// Bytes written to and read from the swap file.
    pub bytes_written: u64,
    /// See `bytes_written`.
    pub bytes_read: u64,
    /// Pages read back with a faulting page (the following slots), ahead of their fault.
    pub read_ahead_pages: u64,
    /// Needed pages zero-filled with a faulting page, ahead of their own fault.
    pub zero_ahead_pages: u64,
    /// Page-outs of pages read back and not written since: dropped, no write.
    pub clean_dropped_pages: u64,
}

/// `advm_pager *advm_pager_new(size_t budget_bytes, const char *swap_path)`: NULL
/// swap_path (or a directory): an unlinked temporary swap file. NULL on error, with
/// errno set.
///
/// # Safety
/// `swap_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_new(budget_bytes: usize, swap_path: *const c_char) -> *mut advm_pager {
    let mut out = std::ptr::null_mut();
    guard(|| {
        let mut cfg = Config::new(budget_bytes);
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        cfg.swap_path = unsafe { path_arg(swap_path) };
        let pager = Arc::new(Pager::new(cfg)?);
        out = Box::into_raw(Box::new(advm_pager { regions: Mutex::new(BTreeMap::new()), pager }));
        Ok(0)
    });
    out
}

/// `struct advm_pager_options`: everything `advm::pager::Config` offers, for
/// `advm_pager_new_with`. `size` first, as Linux's extensible structs (`openat2`,
/// `clone3`) do, so later fields can be added without breaking programs built
/// against this header.
#[allow(non_camel_case_types)] // the C name
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct advm_pager_options {
    /// `sizeof(struct advm_pager_options)` as the caller was built.
    pub size: usize,
    /// Most bytes kept resident (at least one page).
    pub budget_bytes: usize,
    /// As `advm_pager_new`'s `swap_path` (NULL: an unlinked temporary file).
    pub swap_path: *const c_char,
    /// Most bytes the swap file may hold (0: 4 GiB).
    pub swap_capacity_bytes: u64,
    /// Pager-initiated pre-flush headroom in bytes (0: none).
    pub preflush_headroom_bytes: usize,
    /// A memory cgroup directory whose usage against its limit is watched (NULL: none).
    pub cgroup: *const c_char,
    /// `ADVM_PAGER_FAULTS_*`.
    pub fault_mode: c_int,
    /// `ADVM_PAGER_NEEDED_*`.
    pub needed_paging: c_int,
    /// `ADVM_PAGER_SWAP_*`.
    pub swap_io: c_int,
}

/// A C string argument as a path, its bytes as they are (a name that is not UTF-8
/// would otherwise name another file); None for NULL.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn path_arg(s: *const c_char) -> Option<PathBuf> {
    if s.is_null() {
        return None;
    }
    // SAFETY: not NULL, and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(s) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes())))
}

fn invalid(what: &'static str, why: impl Into<String>) -> advm::Error {
    advm::Error::InvalidArgument { what, why: why.into() }
}

/// The `Config` that `o` describes.
///
/// # Safety
/// `o` is readable for `o.size` bytes and its strings are NULL or NUL-terminated.
unsafe fn config_of(o: *const advm_pager_options) -> Result<Config, advm::Error> {
    // SAFETY: the caller's contract: readable for the size its first field gives.
    let o = unsafe { crate::versioned_options(o, "advm_pager_options") }?;
    let mut cfg = Config::new(o.budget_bytes);
    // SAFETY: the caller's contract for both strings.
    (cfg.swap_path, cfg.cgroup) = unsafe { (path_arg(o.swap_path), path_arg(o.cgroup)) };
    if o.swap_capacity_bytes != 0 {
        cfg.swap_capacity_bytes = o.swap_capacity_bytes;
    }
    cfg.preflush_headroom_bytes = (o.preflush_headroom_bytes != 0).then_some(o.preflush_headroom_bytes);
    cfg.fault_mode = match o.fault_mode {
        0 => FaultMode::Thread,
        1 => FaultMode::Sigbus,
        2 => FaultMode::Auto,
        m => return Err(invalid("advm_pager_options.fault_mode", format!("{m}, not an ADVM_PAGER_FAULTS_* value"))),
    };
    cfg.needed_paging = match o.needed_paging {
        0 => NeededPaging::SwapFile,
        1 => NeededPaging::Kernel,
        m => return Err(invalid("advm_pager_options.needed_paging", format!("{m}, not an ADVM_PAGER_NEEDED_* value"))),
    };
    cfg.swap_io = match o.swap_io {
        0 => SwapIo::Direct,
        1 => SwapIo::PageCache,
        m => return Err(invalid("advm_pager_options.swap_io", format!("{m}, not an ADVM_PAGER_SWAP_* value"))),
    };
    Ok(cfg)
}

/// `advm_pager *advm_pager_new_with(const struct advm_pager_options *)`: a pager
/// with every setting of `advm::pager::Config`. NULL on error, errno set (EINVAL: a
/// NULL or short struct, an unknown mode; ENOSYS: SIGBUS mode or a newer header's
/// fields this library lacks; as `advm_pager_new` otherwise).
///
/// # Safety
/// `opts` is NULL or readable for `opts->size` bytes, with NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_new_with(opts: *const advm_pager_options) -> *mut advm_pager {
    let mut out = std::ptr::null_mut();
    guard(|| {
        if opts.is_null() {
            return Err(invalid("advm_pager_options", "NULL"));
        }
        // SAFETY: the caller's contract.
        let pager = Arc::new(Pager::new(unsafe { config_of(opts) }?)?);
        out = Box::into_raw(Box::new(advm_pager { regions: Mutex::new(BTreeMap::new()), pager }));
        Ok(0)
    });
    out
}

/// `int advm_pager_fault_mode(advm_pager *)`: where this pager serves faults,
/// `ADVM_PAGER_FAULTS_THREAD` or `_SIGBUS` (what `_AUTO` chose); -EINVAL for NULL,
/// -ENOTRECOVERABLE in a forked child (no fault is served there).
///
/// # Safety
/// `p` is NULL or a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_fault_mode(p: *mut advm_pager) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        with(p, |p| {
            p.pager.usable()?;
            Ok(i32::from(p.pager.fault_mode() == FaultMode::Sigbus))
        })
    }
}

/// `void *advm_pager_map(advm_pager *, size_t len)`: a new region (NULL on error, errno set).
///
/// # Safety
/// `p` is a pager from advm_pager_new, not destroyed.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_map(p: *mut advm_pager, len: usize) -> *mut c_void {
    // SAFETY: the caller passes a live pager.
    let Some(p) = (unsafe { p.as_ref() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let mut out = std::ptr::null_mut();
    guard(|| {
        let region = p.pager.map(len)?;
        out = region.as_ptr().cast();
        p.regions.lock().unwrap_or_else(|e| e.into_inner()).insert(region.as_ptr() as usize, region);
        Ok(0)
    });
    out
}

/// `int advm_pager_unmap(advm_pager *, void *addr, size_t len)`: gives back a whole
/// region that `advm_pager_map` of this pager returned (`len`: the length mapped, or it
/// rounded up to pages); its pages and swap slots are freed and the memory unmapped.
/// -EINVAL for an address that is not such a region's start (a part of a region, one
/// unmapped already, another pager's) or a length other than the region's.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_unmap(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe {
        with(p, |p| {
            p.pager.usable()?;
            let start = addr as usize;
            let mut regions = p.regions.lock().unwrap_or_else(|e| e.into_inner());
            let Some(r) = regions.get(&start) else {
                return Err(invalid(
                    "address",
                    format!("{start:#x} is not the start of a region this pager's advm_pager_map returned"),
                ));
            };
            if len == 0 || advm::mem::page_align_up(len) != Some(r.len()) {
                return Err(invalid(
                    "length",
                    format!("{len} bytes: a region is unmapped whole, and the one at {start:#x} has {} bytes", r.len()),
                ));
            }
            let r = regions.remove(&start).expect("looked up above");
            drop(regions);
            p.pager.unmap(r).map(|()| 0)
        })
    }
}

/// Runs `f` on a live pager, or -EINVAL for NULL.
unsafe fn with(p: *mut advm_pager, f: impl FnOnce(&advm_pager) -> Result<i32, advm::Error>) -> i32 {
    // SAFETY: the caller passes a live pager or NULL.
    match unsafe { p.as_ref() } {
        Some(p) => guard(|| f(p)),
        None => crate::einval(),
    }
}

/// `int advm_pager_discardable(advm_pager *, void *, size_t)`.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_discardable(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe { with(p, |p| p.pager.discardable(addr as usize, len).map(|()| 0)) }
}

/// `int advm_pager_needed(advm_pager *, void *, size_t)`.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_needed(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe { with(p, |p| p.pager.needed(addr as usize, len).map(|()| 0)) }
}

/// `int advm_pager_flush(advm_pager *, void *, size_t)`: pages evicted, or -errno.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_flush(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe { with(p, |p| p.pager.flush(addr as usize, len).map(|n| n.min(i32::MAX as usize) as i32)) }
}

/// `int advm_pager_lock(advm_pager *, void *, size_t)`: 1 when the contents
/// survived, 0 when a page was discarded while unlocked, -errno on error.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_lock(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe { with(p, |p| p.pager.lock(addr as usize, len).map(i32::from)) }
}

/// `int advm_pager_unlock(advm_pager *, void *, size_t)`.
///
/// # Safety
/// `p` is a live pager.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_unlock(p: *mut advm_pager, addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded.
    unsafe { with(p, |p| p.pager.unlock(addr as usize, len).map(|()| 0)) }
}

/// `int advm_pager_stats(advm_pager *, struct advm_pager_stats *)`.
///
/// # Safety
/// `p` is a live pager; `out` points to writable memory for the struct.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_stats(p: *mut advm_pager, out: *mut advm_pager_stats) -> i32 {
    if out.is_null() {
        return crate::einval();
    }
    // SAFETY: forwarded.
    unsafe {
        with(p, |p| {
            p.pager.usable()?;
            let s = p.pager.stats();
            let v = advm_pager_stats {
                discarded_pages: s.discarded_pages,
                written_pages: s.written_pages,
                read_pages: s.read_pages(),
                zero_fills: s.zero_fills(),
                resident_pages: s.resident_pages,
                preflushed_by_pager: s.preflushed_by_pager,
                preflushed_by_user: s.preflushed_by_user,
                bytes_written: s.bytes_written,
                bytes_read: s.bytes_read,
                read_ahead_pages: s.read_ahead_pages,
                zero_ahead_pages: s.zero_ahead_pages,
                clean_dropped_pages: s.clean_dropped_pages,
            };
            // SAFETY: the caller passes writable memory for the struct.
            out.write(v);
            Ok(0)
        })
    }
}

/// `void advm_pager_destroy(advm_pager *)`: unmaps its regions and stops the pager
/// (once no heap placed in it by `advm_gc_new_paged` is left).
///
/// # Safety
/// `p` is NULL or a pager from advm_pager_new, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn advm_pager_destroy(p: *mut advm_pager) {
    if !p.is_null() {
        // SAFETY: the caller hands back a pager from advm_pager_new.
        let b = unsafe { Box::from_raw(p) };
        crate::quietly(move || drop(b));
    }
}
