//! The garbage-collected heap's C API (`include/advm_gc.h`): one heap per handle, used
//! by any number of C threads one call at a time (each call takes the handle's lock;
//! the heap's one mutator belongs to the handle, so a thread that stops calling never
//! holds up a collection).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use advm_gc::{Config, Error, Generational, Heap, Mutator, Paging, Policy};

use crate::guard;

/// `struct advm_gc`: the heap and the mutator the C calls share.
pub struct AdvmGc {
    heap: Heap,
    m: Mutex<Mutator>,
    /// The pager a paged heap lives in: in a child forked from its process the heap's
    /// memory is not mapped (the pager's regions are not inherited), so every call
    /// there fails with the pager's error instead of faulting on it.
    pager: Option<std::sync::Arc<advm::pager::Pager>>,
}

/// `struct advm_gc_stats`, as declared in the header.
#[repr(C)]
pub struct AdvmGcStats {
    /// Collections run.
    pub collections: u64,
    /// Pause of the last collection, ns.
    pub last_pause_ns: u64,
    /// Longest pause, ns.
    pub max_pause_ns: u64,
    /// Sum of pauses, ns.
    pub total_pause_ns: u64,
    /// Bytes copied by memmove during compaction, all collections.
    pub bytes_moved_memmove: u64,
    /// Bytes moved by page remapping during compaction, all collections.
    pub bytes_moved_remap: u64,
    /// The heap's size limit.
    pub heap_bytes: u64,
    /// Bytes in use now.
    pub used_bytes: u64,
    /// Objects of this many bytes or more (header included) are large.
    pub large_object_bytes: u64,
}

/// `struct advm_gc_policy`, as declared in the header.
#[repr(C)]
pub struct AdvmGcPolicy {
    /// `ADVM_GC_ORIGINAL` (1) or `ADVM_GC_MODIFIED` (2).
    pub kind: c_int,
    /// Original: target ratio of heap size to live size.
    pub ratio: f64,
    /// Original: memory use target, bytes.
    pub mem_limit: usize,
    /// Modified: memory use target, bytes.
    pub mem_lim: usize,
    /// Modified: smallest nursery, bytes.
    pub min_new_size: usize,
    /// Modified: smallest old-generation increment, bytes.
    pub min_old_incr: usize,
    /// Nonzero: copy the old generation back to the start of its reservation after a
    /// major collection.
    pub copy_back: c_int,
}

fn policy_of(p: &AdvmGcPolicy) -> Result<Generational, Error> {
    let policy = match p.kind {
        1 => Policy::Original { ratio: p.ratio, mem_limit: p.mem_limit },
        2 => Policy::Modified { mem_lim: p.mem_lim, min_new_size: p.min_new_size, min_old_incr: p.min_old_incr },
        k => {
            return Err(Error::InvalidArgument {
                what: "policy kind",
                why: format!("{k} is neither ADVM_GC_ORIGINAL (1) nor ADVM_GC_MODIFIED (2)"),
            })
        }
    };
    Ok(Generational { policy, copy_back: p.copy_back != 0 })
}

fn gc_errno(e: &Error) -> i32 {
    -match e {
        Error::HeapExhausted { .. } | Error::ObjectTooLarge { .. } => libc::ENOMEM,
        Error::InvalidArgument { .. } | Error::UnknownEngine(_) => libc::EINVAL,
        Error::Corrupt(_) => libc::ENOTRECOVERABLE,
        Error::BadRoot(_) => libc::EIO,
        Error::Memory(e) => -crate::errno_of(e),
        _ => libc::EIO,
    }
}

/// Runs `f` under `guard`, with the heap's error turned into a negative errno.
fn call(f: impl FnOnce() -> Result<i32, Error>) -> i32 {
    guard(|| Ok(f().unwrap_or_else(|e| gc_errno(&e))))
}

fn handle<'a>(gc: *mut AdvmGc) -> Result<&'a AdvmGc, Error> {
    // SAFETY: the header's contract: `gc` is NULL or a live handle from advm_gc_new.
    let h = unsafe { gc.as_ref() }.ok_or(Error::InvalidArgument { what: "gc", why: "NULL handle".into() })?;
    if let Some(p) = &h.pager {
        p.usable()?;
    }
    Ok(h)
}

fn lock(gc: &AdvmGc) -> std::sync::MutexGuard<'_, Mutator> {
    gc.m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live handles, by address: a `fork` waits until no call is inside any of them.
/// Without that, a thread in a call at the fork left the handle's lock held in the
/// child, where no thread would ever release it: the child's next call on that heap
/// waited for ever.
static HANDLES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

thread_local! {
    /// What the forking thread holds from `before_fork` until the fork is done: the
    /// registry and every handle's lock.
    static HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
}

struct Held {
    _handles: Vec<std::sync::MutexGuard<'static, Mutator>>,
    _registry: std::sync::MutexGuard<'static, Vec<usize>>,
}

extern "C" fn before_fork() {
    let registry = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    let handles = registry
        .iter()
        .map(|&a| {
            // SAFETY: a registered address is a live handle: advm_gc_destroy removes it
            // under the registry lock, held here until after the fork.
            let gc: &'static AdvmGc = unsafe { &*(a as *const AdvmGc) };
            lock(gc)
        })
        .collect();
    HELD.with(|h| *h.borrow_mut() = Some(Held { _handles: handles, _registry: registry }));
}

extern "C" fn after_fork() {
    // In the parent and in the child (whose only thread is the one that forked):
    // the locks taken before the fork are released.
    HELD.with(|h| h.borrow_mut().take());
}

/// Registers the fork handlers (once), and `gc` as a live handle.
fn register(gc: *mut AdvmGc) {
    // On every handle: registering them again is a no-op. Not behind a `Once`, which a
    // child forked while another thread ran it would find "running" for ever. The
    // handlers are `extern "C" fn`s of this library, which is never unloaded while
    // handles live (a dlclose with live handles is the caller's bug).
    let _ = advm::process::at_fork(before_fork, after_fork, after_fork);
    HANDLES.lock().unwrap_or_else(|e| e.into_inner()).push(gc as usize);
}

/// `advm_gc *advm_gc_new(size_t heap_bytes)`: NULL with errno set on failure.
#[no_mangle]
pub extern "C" fn advm_gc_new(heap_bytes: usize) -> *mut AdvmGc {
    // SAFETY: a NULL policy is always allowed.
    unsafe { advm_gc_new_with(heap_bytes, std::ptr::null()) }
}

/// `advm_gc *advm_gc_new_with(size_t heap_bytes, const struct advm_gc_policy *)`: a
/// generational heap (NULL policy: a non-generational one, as `advm_gc_new`).
///
/// # Safety
/// `policy` is NULL or points to a readable `struct advm_gc_policy`.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_new_with(heap_bytes: usize, policy: *const AdvmGcPolicy) -> *mut AdvmGc {
    // SAFETY: NULL or a readable struct (the header's contract).
    new_handle(|| config(heap_bytes, unsafe { policy.as_ref() }))
}

/// The settings of a heap of `heap_bytes`, generational when `policy` is given.
fn config(heap_bytes: usize, policy: Option<&AdvmGcPolicy>) -> Result<Config, Error> {
    if heap_bytes > advm_gc::MAX_HEAP_BYTES {
        // More than fits, as malloc(SIZE_MAX) says: ENOMEM (below a page stays EINVAL).
        return Err(Error::Memory(advm::Error::OutOfMemory {
            what: "heap",
            why: format!("{heap_bytes} bytes: at most {} (1 TiB)", advm_gc::MAX_HEAP_BYTES),
        }));
    }
    let mut cfg = Config::new(heap_bytes);
    // C reads totals only: the last collection is all the heap needs to keep.
    cfg.history_limit = 1;
    cfg.generational = policy.map(policy_of).transpose()?;
    Ok(cfg)
}

/// A handle on a heap made with the settings `make` returns; NULL with errno set when
/// either fails.
fn new_handle(make: impl FnOnce() -> Result<Config, Error>) -> *mut AdvmGc {
    let mut out = std::ptr::null_mut();
    call(|| {
        let cfg = make()?;
        let pager = cfg.paging.as_ref().map(|p| p.pager.clone());
        let heap = Heap::with_config(cfg)?;
        let m = Mutex::new(heap.attach());
        out = Box::into_raw(Box::new(AdvmGc { heap, m, pager }));
        register(out);
        Ok(0)
    });
    out
}

/// `advm_gc *advm_gc_new_paged(size_t heap_bytes, const struct advm_gc_policy *,
/// advm_pager *, int flush_after_major)`: as `advm_gc_new_with`, with the heap's
/// spaces in regions of `pager` (freed ranges marked discardable; nonzero
/// `flush_after_major`: the discardable pages dropped after each full or major
/// collection). The heap keeps the pager alive.
///
/// # Safety
/// `policy` is NULL or points to a readable `struct advm_gc_policy`; `pager` is NULL
/// or a live pager from `advm_pager_new`.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_new_paged(
    heap_bytes: usize,
    policy: *const AdvmGcPolicy,
    pager: *mut crate::pager::advm_pager,
    flush_after_major: c_int,
) -> *mut AdvmGc {
    new_handle(|| {
        // SAFETY: NULL or a live pager (the header's contract).
        let pager = unsafe { pager.as_ref() }
            .ok_or(Error::InvalidArgument { what: "pager", why: "NULL handle".into() })?
            .pager
            .clone();
        // SAFETY: NULL or a readable struct (the header's contract).
        let mut cfg = config(heap_bytes, unsafe { policy.as_ref() })?;
        cfg.paging = Some(Paging { pager, flush_after_major: flush_after_major != 0 });
        Ok(cfg)
    })
}

/// `struct advm_gc_options`, as declared in the header: every setting of a heap,
/// `size` first so that later versions can add fields (as `struct advm_pager_options`).
#[repr(C)]
pub struct AdvmGcOptions {
    /// `sizeof(struct advm_gc_options)` as the caller was built.
    pub size: usize,
    /// As `advm_gc_new`'s `heap_bytes`.
    pub heap_bytes: usize,
    /// Generational sizing (NULL: a non-generational heap).
    pub policy: *const AdvmGcPolicy,
    /// A pager to place the heap in (NULL: plain memory).
    pub pager: *mut crate::pager::advm_pager,
    /// "remap" or "memmove" (NULL: "remap").
    pub engine: *const c_char,
    /// Objects of this many bytes or more (header included) are large (0: the
    /// measured compaction break-even).
    pub large_object_bytes: usize,
    /// GC threads (0: one per CPU).
    pub gc_threads: usize,
    /// With a pager: drop the discardable pages after each full or major collection
    /// (the ints last: no padding between fields).
    pub flush_after_major: c_int,
    /// Nonzero: the heap verifier runs after every collection.
    pub verify: c_int,
    /// Nonzero: freed ranges are advised `MADV_FREE` (plain memory only).
    pub free_lazily: c_int,
}

/// `advm_gc *advm_gc_new_opts(const struct advm_gc_options *)`: a heap with every
/// setting the struct names; NULL with errno (EINVAL: NULL, a size below this
/// library's struct or above 4096, a bad setting; ENOSYS: fields of a newer header
/// set; as `advm_gc_new_with` / `advm_gc_new_paged` otherwise).
///
/// # Safety
/// `opts` is NULL or readable for `opts->size` bytes; its pointers are NULL or valid
/// (a readable policy, a live pager, a NUL-terminated engine name).
#[no_mangle]
pub unsafe extern "C" fn advm_gc_new_opts(opts: *const AdvmGcOptions) -> *mut AdvmGc {
    new_handle(|| {
        if opts.is_null() {
            return Err(Error::InvalidArgument { what: "advm_gc_options", why: "NULL".into() });
        }
        // SAFETY: the caller's contract: readable for the size its first field gives.
        let o = unsafe { crate::versioned_options(opts, "advm_gc_options") }.map_err(Error::Memory)?;
        // SAFETY: NULL or a readable struct (the header's contract).
        let mut cfg = config(o.heap_bytes, unsafe { o.policy.as_ref() })?;
        // SAFETY: NULL or a live pager (the header's contract).
        match unsafe { o.pager.as_ref() } {
            Some(p) => {
                cfg.paging = Some(Paging { pager: p.pager.clone(), flush_after_major: o.flush_after_major != 0 })
            }
            None if o.flush_after_major != 0 => {
                return Err(Error::InvalidArgument { what: "flush_after_major", why: "set without a pager".into() })
            }
            None => {}
        }
        if !o.engine.is_null() {
            // SAFETY: a NUL-terminated string (the header's contract).
            cfg.engine = unsafe { CStr::from_ptr(o.engine) }.to_string_lossy().parse()?;
        }
        if o.large_object_bytes != 0 {
            cfg.large_object_bytes = Some(o.large_object_bytes);
        }
        if o.gc_threads != 0 {
            cfg.gc_threads = o.gc_threads;
        }
        cfg.verify = o.verify != 0;
        cfg.free_lazily = o.free_lazily != 0;
        Ok(cfg)
    })
}

/// `int advm_gc_store(advm_gc *, void *obj, size_t i, void *value)`: pointer slot `i`
/// of `obj` := `value`, through the heap's write barrier.
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_store(gc: *mut AdvmGc, obj: *mut c_void, i: usize, value: *mut c_void) -> c_int {
    call(|| {
        lock(handle(gc)?).set_at(obj as usize, i, value as usize)?;
        Ok(0)
    })
}

/// `void advm_gc_destroy(advm_gc *)`: frees the heap (NULL: no-op).
///
/// # Safety
/// `gc` is NULL or a live handle from `advm_gc_new`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_destroy(gc: *mut AdvmGc) {
    if !gc.is_null() {
        let mut registry = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|&a| a != gc as usize);
        drop(registry);
        // SAFETY: a handle from advm_gc_new, destroyed once (the header's contract).
        let b = unsafe { Box::from_raw(gc) };
        if b.pager.as_ref().is_some_and(|p| p.usable().is_err()) {
            // A forked child: the heap's memory is the parent's, not mapped here.
            std::mem::forget(b);
            return;
        }
        // Never unwinds into C (a panic would abort the caller's process).
        crate::quietly(move || drop(b));
    }
}

/// `void *advm_gc_alloc(advm_gc *, size_t nptrs, size_t nbytes)`: the new object's
/// first pointer slot, or NULL with errno (ENOMEM when a full collection cannot make
/// room).
///
/// # Safety
/// `gc` is NULL or a live handle from `advm_gc_new`.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_alloc(gc: *mut AdvmGc, nptrs: usize, nbytes: usize) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    call(|| {
        let o = lock(handle(gc)?).alloc(nptrs, nbytes)?;
        out = o.addr() as *mut c_void;
        Ok(0)
    });
    out
}

/// `int advm_gc_root(advm_gc *, void **slot)`.
///
/// # Safety
/// `gc` is NULL or a live handle; `slot` stays valid until unrooted and holds NULL or an object of this heap whenever a call on the heap runs.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_root(gc: *mut AdvmGc, slot: *mut *mut c_void) -> c_int {
    call(|| {
        let g = handle(gc)?;
        // SAFETY: the header's contract for root slots is the one add_root_slot states.
        unsafe { g.heap.add_root_slot(slot) }?;
        Ok(0)
    })
}

/// `int advm_gc_unroot(advm_gc *, void **slot)`.
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_unroot(gc: *mut AdvmGc, slot: *mut *mut c_void) -> c_int {
    call(|| {
        handle(gc)?.heap.remove_root_slot(slot)?;
        Ok(0)
    })
}

/// `int advm_gc_weak(advm_gc *, void **slot)`: registers a weak slot.
///
/// # Safety
/// `gc` is NULL or a live handle; `slot` stays valid until unweak'd and holds NULL or an object of this heap whenever a call on the heap runs.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_weak(gc: *mut AdvmGc, slot: *mut *mut c_void) -> c_int {
    call(|| {
        let g = handle(gc)?;
        // SAFETY: the header's contract for weak slots is the one add_weak_slot states.
        unsafe { g.heap.add_weak_slot(slot) }?;
        Ok(0)
    })
}

/// `int advm_gc_unweak(advm_gc *, void **slot)`.
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_unweak(gc: *mut AdvmGc, slot: *mut *mut c_void) -> c_int {
    call(|| {
        handle(gc)?.heap.remove_weak_slot(slot)?;
        Ok(0)
    })
}

/// `void *advm_gc_pin(advm_gc *, void *obj)`: pins `obj`; returns its address, which
/// stays until it is unpinned (a young object's is new: pinning promotes it), or NULL
/// with errno.
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_pin(gc: *mut AdvmGc, obj: *mut c_void) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    call(|| {
        let mut m = lock(handle(gc)?);
        let o = m.object_at(obj as usize)?;
        out = m.pin(o)?.addr() as *mut c_void;
        Ok(0)
    });
    out
}

/// `int advm_gc_unpin(advm_gc *, void *obj)`: undoes one `advm_gc_pin`.
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_unpin(gc: *mut AdvmGc, obj: *mut c_void) -> c_int {
    call(|| {
        let mut m = lock(handle(gc)?);
        let o = m.object_at(obj as usize)?;
        m.unpin(o)?;
        Ok(0)
    })
}

/// `int advm_gc_collect(advm_gc *, int full)`: a full (major) collection, or with
/// `full` 0 a minor one (full on a non-generational heap).
///
/// # Safety
/// `gc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_collect(gc: *mut AdvmGc, full: c_int) -> c_int {
    call(|| {
        let mut m = lock(handle(gc)?);
        if full != 0 {
            m.collect()?;
        } else {
            m.collect_minor()?;
        }
        Ok(0)
    })
}

/// `int advm_gc_set_engine(advm_gc *, const char *engine)`: "remap" or "memmove".
///
/// # Safety
/// `gc` is NULL or a live handle; `engine` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_set_engine(gc: *mut AdvmGc, engine: *const c_char) -> c_int {
    call(|| {
        let g = handle(gc)?;
        if engine.is_null() {
            return Err(Error::InvalidArgument { what: "engine", why: "NULL name".into() });
        }
        // SAFETY: a NUL-terminated string (the header's contract).
        let name = unsafe { CStr::from_ptr(engine) }.to_string_lossy();
        g.heap.set_engine(name.parse()?);
        Ok(0)
    })
}

/// `int advm_gc_stats(advm_gc *, struct advm_gc_stats *out)`.
///
/// # Safety
/// `gc` is NULL or a live handle; `out` is NULL or points to a writable `struct advm_gc_stats`.
#[no_mangle]
pub unsafe extern "C" fn advm_gc_stats(gc: *mut AdvmGc, out: *mut AdvmGcStats) -> c_int {
    call(|| {
        let g = handle(gc)?;
        // SAFETY: `out` is NULL or points to a writable struct advm_gc_stats.
        let out =
            unsafe { out.as_mut() }.ok_or(Error::InvalidArgument { what: "out", why: "NULL stats pointer".into() })?;
        let s = g.heap.totals();
        *out = AdvmGcStats {
            collections: s.collections,
            last_pause_ns: s.last_pause_ns,
            max_pause_ns: s.max_pause_ns,
            total_pause_ns: s.total_pause_ns,
            bytes_moved_memmove: s.bytes_moved_memmove,
            bytes_moved_remap: s.bytes_moved_remap,
            heap_bytes: g.heap.heap_bytes() as u64,
            used_bytes: g.heap.used_bytes() as u64,
            large_object_bytes: g.heap.large_object_bytes() as u64,
        };
        Ok(0)
    })
}
