//! Virtual copy for C: `advm_alloc`, `advm_free`, `advm_dup`, `advm_vcopy` and
//! `advm_vcopy_get_stats` over one process-wide arena, made on first use. Pointers
//! become [`HostAddr`] here, at the boundary.

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use advm::mem::HostAddr;
use advm::vcopy::{Arena, Config, ForkGate};

use crate::guard;

/// The process-wide arena, once made. A failure to make it is not kept: the call
/// reports it (its own errno) and the next call tries again.
static ARENA: OnceLock<Arena> = OnceLock::new();

/// Held while the arena is made, so two first calls do not both reserve its range.
/// Taken under the fork gate only: a fork never finds it held.
static MAKING: Mutex<()> = Mutex::new(());

/// The address space the arena reserves first, and the least it settles for when an
/// address-space limit (RLIMIT_AS: ENOMEM) or a tool's address-space manager
/// (valgrind: EINVAL) refuses more: halved from the first until it fits.
const RESERVE_BYTES: usize = 256 << 30;
const RESERVE_MIN_BYTES: usize = 64 << 20;

fn arena() -> Result<&'static Arena, advm::Error> {
    if let Some(a) = ARENA.get() {
        return Ok(a);
    }
    // Made under the fork gate: a fork during the first call would leave the child's
    // copy of MAKING held for ever.
    let _gate = ForkGate::hold();
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = ARENA.get() {
        return Ok(a);
    }
    let made = make_arena()?;
    Ok(ARENA.get_or_init(|| made))
}

fn make_arena() -> Result<Arena, advm::Error> {
    let mut reserve = RESERVE_BYTES;
    loop {
        match Arena::with_config(Config::default().reserve_bytes(reserve)) {
            Err(e)
                if [-libc::ENOMEM, -libc::EINVAL].contains(&crate::errno_of(&e))
                    && reserve / 2 >= RESERVE_MIN_BYTES =>
            {
                reserve /= 2
            }
            made => return made,
        }
    }
}

/// True when some byte of `[addr, addr+len)` lies in a live block of the C API's
/// arena (`advm_alloc`/`advm_dup` memory). One lookup in the arena's block table, no
/// read of /proc; false when the arena was never made (it is not made here), for
/// an empty or wrapping range, and after a panic inside the arena.
pub fn arena_touches(addr: usize, len: usize) -> bool {
    ARENA.get().is_some_and(|a| a.touches(HostAddr(addr), len))
}

/// `void *advm_alloc(size_t len)`: a zeroed, page-aligned block of `len` bytes, or NULL
/// with errno set (ENOMEM when it does not fit). `len` 0 gives a unique one-page block,
/// as glibc's `malloc(0)` gives a unique pointer that `free` takes.
#[no_mangle]
pub extern "C" fn advm_alloc(len: usize) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    guard(|| {
        out = arena()?.alloc(len.max(1))?.as_ptr().cast();
        Ok(0)
    });
    out
}

/// `void advm_free(void *p)`: frees a block from `advm_alloc`/`advm_dup` (NULL: no-op).
/// A pointer that is not a block start is left alone, with errno set to EINVAL.
#[no_mangle]
pub extern "C" fn advm_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    guard(|| arena()?.free(HostAddr::of(p)).map(|_| 0));
}

/// `void *advm_dup(const void *p, size_t len)`: a new block, a virtual copy of
/// `[p, p+len)` (which must lie in one block), or NULL with errno set.
#[no_mangle]
pub extern "C" fn advm_dup(p: *const c_void, len: usize) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    guard(|| {
        out = arena()?.dup(HostAddr::of(p), len)?.as_ptr().cast();
        Ok(0)
    });
    out
}

/// `int advm_vcopy(void *dst, const void *src, size_t len)`: memcpy semantics through
/// page sharing; 0 or -errno (-EINVAL: outside the arena, past a block, overlapping).
#[no_mangle]
pub extern "C" fn advm_vcopy(dst: *mut c_void, src: *const c_void, len: usize) -> i32 {
    guard(|| arena()?.vcopy(HostAddr::of(dst), HostAddr::of(src), len).map(|_| 0))
}

/// Counters of `struct advm_vcopy_stats` (see include/advm.h).
#[repr(C)]
#[derive(Default)]
pub struct AdvmVcopyStats {
    /// Live blocks.
    pub blocks: u64,
    /// Distinct memfd pages in use.
    pub memfd_pages_live: u64,
    /// Bytes the arena's memfds hold.
    pub memfd_resident_bytes: u64,
    /// Pages shared by copies (cumulative).
    pub pages_shared: u64,
    /// Bytes copied by memcpy (cumulative).
    pub bytes_copied: u64,
    /// Written pages re-homed (cumulative).
    pub pages_rehomed: u64,
    /// memcpy fallbacks: unaligned, small, VMA budget.
    pub fallback_unaligned: u64,
    /// See above.
    pub fallback_small: u64,
    /// See above.
    pub fallback_vma_budget: u64,
    /// VMAs the arena's mappings make (upper bound).
    pub vmas: u64,
}

/// `int advm_vcopy_get_stats(struct advm_vcopy_stats *out)`: 0 or -errno.
///
/// # Safety
/// `out` must be NULL (-EINVAL) or point to a writable `struct advm_vcopy_stats`.
#[no_mangle]
pub unsafe extern "C" fn advm_vcopy_get_stats(out: *mut AdvmVcopyStats) -> i32 {
    if out.is_null() {
        return crate::einval();
    }
    guard(|| {
        // No arena yet: nothing was copied, and making one (256 GiB of address space;
        // -ENOMEM under RLIMIT_AS) only to say so helps nobody.
        let Some(arena) = ARENA.get() else {
            // SAFETY: the caller guarantees `out` is writable.
            unsafe { out.write(AdvmVcopyStats::default()) };
            return Ok(0);
        };
        let s = arena.try_stats()?;
        let v = AdvmVcopyStats {
            blocks: s.blocks,
            memfd_pages_live: s.memfd_pages_live,
            memfd_resident_bytes: s.memfd_resident_bytes,
            pages_shared: s.pages_shared,
            bytes_copied: s.bytes_copied,
            pages_rehomed: s.pages_rehomed,
            fallback_unaligned: s.fallback_unaligned,
            fallback_small: s.fallback_small,
            fallback_vma_budget: s.fallback_vma_budget,
            vmas: s.vmas,
        };
        // SAFETY: the caller guarantees `out` is writable.
        unsafe { out.write(v) };
        Ok(0)
    })
}

/// `int advm_vcopy_stats(struct advm_vcopy_stats *out)`: the deprecated name of
/// [`advm_vcopy_get_stats`] (it shared its name with the struct), kept for one release.
///
/// # Safety
/// As [`advm_vcopy_get_stats`].
#[no_mangle]
pub unsafe extern "C" fn advm_vcopy_stats(out: *mut AdvmVcopyStats) -> i32 {
    // SAFETY: the caller's promise on `out` is the one advm_vcopy_get_stats needs.
    unsafe { advm_vcopy_get_stats(out) }
}

/// `int advm_vcopy_test_inject_panic(void)`: testing only (fault injection, not in
/// advm.h, never for use): the arena panics while holding its lock, as a bug would;
/// returns -EIO, and every later call fails with ENOTRECOVERABLE.
#[doc(hidden)]
#[no_mangle]
pub extern "C" fn advm_vcopy_test_inject_panic() -> i32 {
    guard(|| {
        arena()?.test_inject_panic();
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_touches_follows_the_c_arenas_live_blocks() {
        let ps = advm::mem::page_size();
        assert!(!arena_touches(0x10000, ps), "no arena yet: nothing is arena memory, and none is made");
        assert!(ARENA.get().is_none());
        let p = advm_alloc(3 * ps) as usize;
        assert_ne!(p, 0);
        assert!(arena_touches(p, 1) && arena_touches(p + 3 * ps - 1, 1) && arena_touches(p - ps, ps + 1));
        assert!(!arena_touches(p + 3 * ps, 0) && !arena_touches(p, 0));
        let local = [0u8; 16];
        assert!(!arena_touches(local.as_ptr() as usize, local.len()));
        advm_free(p as *mut c_void);
        assert!(!arena_touches(p, 3 * ps), "a freed block");
    }
}
