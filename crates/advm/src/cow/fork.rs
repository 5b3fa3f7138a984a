//! Fork isolation: a process-wide gate that every arena call holds for reading, and
//! `pthread_atfork` handlers that take it for writing around `fork()`, so no arena is
//! half way through a call when the address space is duplicated.

use std::cell::RefCell;
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
}

/// Held for the duration of every arena call that maps or reads arena state.
pub(super) fn gate() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|e| e.into_inner())
}

/// Registers an arena for freezing at fork (and the handlers, once per process).
pub(super) fn register(shared: &Arc<Shared>) -> Result<()> {
    let mut err = None;
    REGISTER.call_once(|| {
        err = crate::sys::fork::at_fork(prepare, after, after).err();
    });
    if let Some(e) = err {
        return Err(e.into());
    }
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
        super::lock(a).freeze_for_fork();
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
