//! What a pager is doing, in words, for a report when a thread waits on it for too
//! long: the pagers alive in the process, each page's state, who holds the locks,
//! whether the handler thread still runs. [`run_bounded`] turns a wait that never
//! ends (a fault nobody serves blocks its thread for good, and no thread can be
//! stopped from outside) into a panic carrying that account.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::Duration;

use crate::sys::process::PerProcess;

use super::{Managed, Shared, DISCARDED, EMPTY, EVICTING, GONE, RESIDENT, SWAPPED};

/// Every pager made in this process, with the name of the thread that made it. Per
/// process: a child forked while a parent thread held the list gets its own.
static LIVE: PerProcess<Mutex<Live>> = PerProcess::new();

/// Pagers and the names of the threads that made them.
type Live = Vec<(Weak<Shared>, String)>;

fn live() -> &'static Mutex<Live> {
    LIVE.get(|| Mutex::new(Vec::new()))
}

/// Notes a new pager (made on the current thread).
pub(super) fn enlist(shared: &Arc<Shared>) {
    let name = std::thread::current().name().unwrap_or("unnamed").to_string();
    let mut live = live().lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(w, _)| w.strong_count() > 0);
    live.push((Arc::downgrade(shared), name));
}

/// The state of every pager alive in the process that a thread named `thread` made
/// (every pager: `None`), one paragraph each.
pub fn report(thread: Option<&str>) -> String {
    let live: Vec<(Arc<Shared>, String)> = live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, name)| thread.map_or(true, |t| t == name))
        .filter_map(|(w, name)| Some((w.upgrade()?, name.clone())))
        .collect();
    if live.is_empty() {
        return format!("no pager alive made by thread {thread:?}\n");
    }
    let mut out = String::new();
    for (s, name) in live {
        let _ = writeln!(out, "pager made by thread {name:?}:");
        s.describe(&mut out);
    }
    out
}

/// Runs `body` on a thread of its own named `name` and returns what it returns. If it
/// has not returned within `limit`, panics with the state of the pagers that thread
/// made ([`report`]); the thread itself is left behind (a thread waiting on a fault
/// cannot be stopped), so this is for tests and watchdogs, whose process ends soon.
/// A panic in `body` is passed on as it is.
pub fn run_bounded<T: Send + 'static>(name: &str, limit: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let _ = tx.send(r);
        })
        .expect("spawn a bounded thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => {
            let _ = thread.join();
            v
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!(
            "{name}: not done in {limit:?}; a thread waits for ever (a fault the pager never serves?). \
             The pagers it made:\n{}",
            report(Some(name))
        ),
    }
}

impl Shared {
    /// Appends this pager's state to `out`.
    fn describe(&self, out: &mut String) {
        let evicting = match self.evicting.try_lock() {
            Ok(_) => "free",
            Err(TryLockError::WouldBlock) => "held",
            Err(TryLockError::Poisoned(_)) => "POISONED (a thread panicked holding it)",
        };
        let queue = self.queue.try_lock().map(|q| q.len());
        let slots = self.slots.try_lock().map(|s| (s.used(), s.free.len(), s.next));
        let handler = match self.handler_state.load(Ordering::Acquire) {
            0 => "running",
            1 => "ended",
            _ => "ENDED BY A PANIC",
        };
        let _ = writeln!(
            out,
            "  budget {} pages, resident counter {}, mode {}, handler thread {handler}, stop {}, eviction lock {evicting}",
            self.budget,
            self.resident.load(Ordering::Acquire),
            if self.sigbus { "SIGBUS" } else { "handler thread" },
            self.stop.load(Ordering::Acquire),
        );
        let _ = writeln!(
            out,
            "  queue {:?}, swap slots (used, free, next) {:?}, room asked {}, answers {}, faults waiting for a swap read {}",
            queue.map_err(|_| "locked"),
            slots.map_err(|_| "locked"),
            self.room_asked.load(Ordering::Acquire),
            self.answered.load(Ordering::Acquire),
            self.unread.lock().map(|u| u.len()).unwrap_or(usize::MAX),
        );
        let regions: Vec<Arc<Managed>> = match self.regions.try_read() {
            Ok(r) => r.by_id.values().cloned().collect(),
            Err(_) => {
                let _ = writeln!(out, "  regions: lock held");
                return;
            }
        };
        for m in regions {
            let mut count = [0usize; 6];
            let mut mid = Vec::new();
            for p in 0..m.pages() {
                let st = m.state[p].load(Ordering::Acquire);
                count[usize::from(st).min(5)] += 1;
                if st == EVICTING && mid.len() < 16 {
                    mid.push(p);
                }
            }
            // resident by its state, no page-table entry: every access faults for ever
            // (SIGBUS mode and the kernel path; on the handler thread a resident page
            // with an empty entry is the same livelock)
            let mapped = m.area.mapped_pages(0, m.pages());
            let lost: Vec<usize> =
                (0..mapped.len()).filter(|&p| !mapped[p] && m.state[p].load(Ordering::Acquire) == RESIDENT).collect();
            let clean = (0..m.pages()).filter(|&p| m.clean.get(p)).count();
            let discardable = (0..m.pages()).filter(|&p| m.discardable.get(p)).count();
            let _ = writeln!(
                out,
                "  region {} at {:#x}, {} pages: empty {}, resident {}, EVICTING {} (first: {mid:?}), discarded {}, \
                 swapped {}, gone {}; clean {clean}, discardable {discardable}",
                m.id,
                m.area.addr(),
                m.pages(),
                count[usize::from(EMPTY)],
                count[usize::from(RESIDENT)],
                count[usize::from(EVICTING)],
                count[usize::from(DISCARDED)],
                count[usize::from(SWAPPED)],
                count[usize::from(GONE)],
            );
            if !lost.is_empty() {
                let _ = writeln!(
                    out,
                    "  region {}: {} RESIDENT pages have no page-table entry (first: {:?})",
                    m.id,
                    lost.len(),
                    &lost[..lost.len().min(16)]
                );
            }
            let last = self.last_fault.load(Ordering::Relaxed);
            if last >= m.area.addr() && last < m.area.addr() + m.area.len() {
                let page = (last - m.area.addr()) / crate::mem::page_size();
                let from = page.saturating_sub(8);
                let to = (page + 9).min(m.pages());
                let around: Vec<String> = (from..to)
                    .map(|p| {
                        format!(
                            "{p}:{}{}{}",
                            ["empty", "resident", "EVICTING", "discarded", "swapped", "gone"]
                                [usize::from(m.state[p].load(Ordering::Acquire)).min(5)],
                            if m.discardable.get(p) { "/disc" } else { "" },
                            match mapped.get(p) {
                                Some(true) => "/mapped",
                                Some(false) => "/unmapped",
                                None => "",
                            }
                        )
                    })
                    .collect();
                let _ = writeln!(out, "  last fault at {last:#x}, page {page} of region {}: {around:?}", m.id);
            }
        }
    }
}
