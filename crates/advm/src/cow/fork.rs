//! Fork isolation: a process-wide gate that every arena call holds for reading, and
//! `pthread_atfork` handlers that take it for writing around `fork()`, so no arena is
//! half way through a call when the address space is duplicated.
//!
//! The gate is what makes the arena usable in a forked child: the child has only the
//! forking thread, so a lock another thread held at the fork would stay held forever.
//! Every lock of the arena (its state mutex, the list of arenas, the C API's
//! once-only arena creation) is therefore only taken with the gate held.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, Once, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use super::Shared;
use crate::Result;

static GATE: RwLock<()> = RwLock::new(());
static ARENAS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
static REGISTER: Once = Once::new();

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
    let mut err = None;
    REGISTER.call_once(|| {
        err = crate::sys::process::at_fork(prepare, after, after).err();
    });
    if let Some(e) = err {
        return Err(e.into());
    }
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
