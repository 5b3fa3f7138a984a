//! Fork isolation: a process-wide gate that every arena call holds for reading, and
//! `pthread_atfork` handlers that take it for writing around `fork()`, so no arena is
//! half way through a call when the address space is duplicated.
//!
//! The gate is what makes the arena usable in a forked child: the child has only the
//! forking thread, so a lock another thread held at the fork would stay held forever.
//! Every lock of the arena (its state mutex, the list of arenas, the C API's
//! once-only arena creation) is therefore only taken with the gate held.
//!
//! The `prepare` handler freezes every arena (`Inner::freeze_for_fork`): no page
//! stays shared (`MAP_SHARED`) across the fork, and the memfds are retired.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use super::arena::{Inner, Shared};
use super::frames::{Frame, Piece};
use crate::sys::mman::Share;
use crate::Result;

static GATE: RwLock<()> = RwLock::new(());
static ARENAS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

thread_local! {
    /// The write side of the gate, held by the forking thread from `prepare` until
    /// the parent/child handler (the same thread runs all three).
    static HELD: RefCell<Option<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(None) };
    /// Gates this thread holds: only the outermost takes the read lock. A nested read
    /// of the lock would wait behind a forking thread waiting for the outer one.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// The read side of the fork gate: no `fork()` runs while it is held. Held by every
/// arena call around its use of the arena's lock; may be nested on one thread. Code
/// that keeps its own lock around arenas (the C API's once-only arena) holds it too,
/// so a forked child never finds that lock held either.
#[must_use]
pub struct ForkGate {
    _read: Option<RwLockReadGuard<'static, ()>>,
}

impl ForkGate {
    /// Waits for a fork in progress, then keeps forks out until dropped.
    pub fn hold() -> Self {
        let outer = DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get() == 1
        });
        Self { _read: outer.then(|| GATE.read().unwrap_or_else(|e| e.into_inner())) }
    }
}

impl Drop for ForkGate {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Registers an arena for freezing at fork (and the handlers, once per process).
pub(super) fn register(shared: &Arc<Shared>) -> Result<()> {
    // On every registration: registering the handlers again is a no-op (and no
    // once-cell that a child forked during the first registration would find running).
    crate::sys::process::at_fork(prepare, after, after)?;
    let _gate = ForkGate::hold();
    let mut list = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(shared));
    Ok(())
}

extern "C" fn prepare() {
    let guard = GATE.write().unwrap_or_else(|e| e.into_inner());
    let arenas: Vec<Arc<Shared>> = {
        let list = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(Weak::upgrade).collect()
    };
    for a in &arenas {
        // A handler cannot return an error and must not unwind into C: a panic while
        // freezing poisons that arena (its later calls refuse) and the fork goes on.
        // An arena already poisoned is still frozen as well as its state allows.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.inner.lock().unwrap_or_else(|e| e.into_inner()).freeze_for_fork();
        }));
    }
    // Arenas dropped here would run their Drop with the gate held: keep them alive
    // until the handler after the fork.
    HELD.with(|h| *h.borrow_mut() = Some(guard));
    KEEP.with(|k| *k.borrow_mut() = arenas);
}

thread_local! {
    static KEEP: RefCell<Vec<Arc<Shared>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn after() {
    let guard = HELD.with(|h| h.borrow_mut().take());
    drop(guard);
    let arenas = KEEP.with(|k| std::mem::take(&mut *k.borrow_mut()));
    drop(arenas);
}

impl Inner {
    /// Before a fork: every shared frame becomes private (neighbouring blocks with
    /// contiguous pages in one `mmap`), and the memfds are retired.
    pub(super) fn freeze_for_fork(&mut self) {
        // the child would have no reaper thread: unmap moved-aside mappings now
        self.reap_all();
        let ps = self.ps;
        // (first reservation page, file, first file page, pages)
        let mut runs: Vec<(usize, u16, u32, usize)> = Vec::new();
        for (&key, block) in &self.blocks {
            for (i, l, fr) in block.frames.iter() {
                if fr.private || fr.unbacked() {
                    continue;
                }
                match runs.last_mut() {
                    Some((va, file, page, len))
                        if *va + *len == key + i && *file == fr.file && *page as usize + *len == fr.page as usize =>
                    {
                        *len += l
                    }
                    _ => runs.push((key + i, fr.file, fr.page, l)),
                }
            }
        }
        for (va, file, page, len) in runs {
            let f = self.files[file as usize].as_ref().expect("open");
            // A failure here would leave a page shared across the fork; there is no
            // way to report from a fork handler, so stop sharing by other means: the
            // page stays shared only in that (unlikely, ENOMEM) case.
            if let Ok(fd) = f.fd.get(super::frames::CLOSED) {
                let _ = self.res.map_file(va * ps, len * ps, Share::Private, fd, page as u64 * ps as u64);
            }
        }
        let keys: Vec<usize> = self.blocks.keys().copied().collect();
        for key in keys {
            let now: Vec<Piece> = self.blocks[&key]
                .frames
                .iter()
                .filter(|p| !p.2.private && !p.2.unbacked())
                .map(|(i, l, f)| (i, l, Frame { private: true, ..f }))
                .collect();
            self.set_frames(key, &now);
        }
        for f in self.files.iter_mut().flatten() {
            f.retired = true;
        }
        self.files.iter_mut().for_each(|slot| {
            if slot.as_ref().is_some_and(|f| f.live == 0) {
                *slot = None;
            }
        });
        self.active = None;
        self.stats.forks += 1;
    }
}
