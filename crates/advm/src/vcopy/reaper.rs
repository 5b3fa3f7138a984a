//! The reaper: a thread per process that unmaps the old source mappings whose page
//! tables a copy moved aside, outside the arena lock, so a large copy does not wait
//! for their teardown.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::arena::{lock, Inner, Shared};
use super::fork::ForkGate;
use crate::sys::mman::reservation::Reservation;

impl Inner {
    /// Makes sure this process's reaper thread runs, and wakes it. Waking is an
    /// unpark, which takes no lock a forked child could find held.
    pub(super) fn wake_reaper(&mut self) {
        let pid = std::process::id();
        match &self.reaper {
            Some((p, thread)) if *p == pid => thread.unpark(),
            _ => {
                let me = self.me.clone();
                let res = Arc::clone(&self.res);
                let spawned = crate::sys::signal::spawn_with_sent_signals_blocked(|| {
                    std::thread::Builder::new().name("advm-reaper".into()).spawn(move || reaper(me, res))
                });
                match spawned {
                    Ok(h) => self.reaper = Some((pid, h.thread().clone())),
                    // no thread: unmap now
                    Err(_) => self.reap_all(),
                }
            }
        }
    }

    /// Unmaps every moved-aside mapping now (before a fork, or without a thread).
    pub(super) fn reap_all(&mut self) {
        for (page, n) in std::mem::take(&mut self.pending) {
            let t = Instant::now();
            if self.res.release(page * self.ps, n * self.ps).is_ok() {
                self.va.free(page, n);
            }
            self.stats.deferred_unmap_ms += t.elapsed().as_secs_f64() * 1e3;
        }
    }
}

/// The reaper thread: unmaps the old mappings copies moved aside, outside the arena
/// lock. Holds the arena weakly (exits once it is gone) and the reservation strongly
/// (the ranges it unmaps stay the arena's while it works).
fn reaper(me: Weak<Shared>, res: Arc<Reservation>) {
    let ps = crate::addr::page_size();
    loop {
        let Some(shared) = me.upgrade() else { return };
        // The fork gate, held from picking a range to unmapping it, keeps a fork
        // (whose prepare handler unmaps pending ranges itself) out meanwhile; taken
        // with every lock of the arena state, so a fork never copies that lock held.
        let gate = ForkGate::hold();
        // a poisoned arena takes no further work, the reaper's included
        let Ok(g) = lock(&shared) else { return };
        let Some((page, n)) = g.pending.last().copied() else {
            drop(g);
            drop(gate);
            drop(shared); // the arena may go meanwhile
            std::thread::park_timeout(Duration::from_millis(200));
            continue;
        };
        drop(g);
        let t = Instant::now();
        // Tear the page tables down under the shared mmap lock, 16 MiB at a time, so
        // a copy waiting to map (exclusive lock) waits for one chunk at most; then
        // re-reserve the empty range.
        const CHUNK: usize = 4096;
        for at in (page..page + n).step_by(CHUNK) {
            let _ = res.discard(at * ps, CHUNK.min(page + n - at) * ps);
        }
        let ok = res.release(page * ps, n * ps).is_ok();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let Ok(mut g) = lock(&shared) else { return };
        if let Some(i) = g.pending.iter().position(|&j| j == (page, n)) {
            g.pending.swap_remove(i);
            if ok {
                g.va.free(page, n);
            }
        }
        g.stats.deferred_unmap_ms += ms;
        drop((g, gate));
    }
}
