//! The heap's GC threads: started once, by the heap's first parallel phase, parked
//! between collections, woken for each parallel phase, joined when the heap goes.
//!
//! Not at heap creation: a heap small enough to collect on one thread never starts
//! them, and threads starting (and spinning for work) beside its first collections
//! made the quick demo's largest pause 0.05 ms longer (0.17 -> 0.22-0.25 ms).
//!
//! Starting threads inside every collection cost more than a second thread saved on
//! small heaps (tens of microseconds each, and on a busy machine a new thread may wait
//! milliseconds for a CPU). The pool is a `rayon_core::ThreadPool` (its `scope` runs
//! jobs that borrow the caller's data on the pool's threads, which steal them from
//! each other; its threads sleep on a condition variable between jobs) whose threads the
//! heap starts itself, so that dropping the heap joins them: no thread outlives it.
//!
//! Fork: only the forking thread exists in a child. A pool made before a `fork` is
//! never used in the child (the process id differs from the one it was made in): the
//! child's collections run on the calling thread alone, and dropping the heap there
//! leaves the pool's bookkeeping unreleased instead of waiting for threads that do not
//! exist.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::heap::lock;
use crate::{Error, Result};

/// Pools made in this process: names each pool's threads apart (`gc<pool>w<index>`).
static POOLS: AtomicUsize = AtomicUsize::new(0);

/// A heap's GC threads (none until a phase runs on more than one).
pub(crate) struct Pool {
    /// Threads a parallel phase runs on (1: no pool).
    want: usize,
    /// Started by the first parallel phase; `None` inside if they could not be.
    pool: OnceLock<Option<rayon_core::ThreadPool>>,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The process the heap was made in.
    pid: u32,
    /// `gc<pool>w`: the threads' names start with it (the tests find them by it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) prefix: String,
}

impl Pool {
    /// A pool of `threads` GC threads, started when first needed; none for one (the
    /// collecting thread does it all).
    pub(crate) fn new(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::InvalidArgument { what: "gc_threads", why: "at least one GC thread".into() });
        }
        let prefix = format!("gc{}w", POOLS.fetch_add(1, Ordering::Relaxed));
        Ok(Pool { want: threads, pool: OnceLock::new(), handles: Arc::default(), pid: std::process::id(), prefix })
    }

    /// The threads, started on first use. A pool that cannot start them (out of
    /// threads) runs its phases on the calling thread instead.
    fn started(&self) -> Option<&rayon_core::ThreadPool> {
        self.pool
            .get_or_init(|| {
                let (h, name) = (self.handles.clone(), self.prefix.clone());
                // a program's signal handler never runs on a GC thread
                advm::process::spawn_with_sent_signals_blocked(|| {
                    rayon_core::ThreadPoolBuilder::new()
                        .num_threads(self.want)
                        .spawn_handler(move |t| {
                            let handle = std::thread::Builder::new()
                                .name(format!("{name}{}", t.index()))
                                .spawn(move || t.run())?;
                            lock(&h).push(handle);
                            Ok(())
                        })
                        .build()
                        .ok()
                })
            })
            .as_ref()
    }

    /// Threads a phase can run on: the pool's, or 1 (one wanted, or in a forked child).
    pub(crate) fn threads(&self) -> usize {
        if self.pid == std::process::id() {
            self.want
        } else {
            1
        }
    }

    /// Runs `f(i)` once for every `i < threads` (as jobs of the pool when `threads` >
    /// 1, which must then be [`Pool::threads`]); results in order of `i`. The jobs are
    /// spawned into the pool, not broadcast to every thread: a thread that is awake
    /// takes the jobs of one that has not woken yet, so `f` must not wait for another
    /// job to start (two may run one after the other on one thread).
    pub(crate) fn run<T: Send, F: Fn(usize) -> T + Sync>(&self, threads: usize, f: F) -> Vec<T> {
        if threads <= 1 {
            return vec![f(0)];
        }
        assert_eq!(threads, self.threads(), "a phase runs on every GC thread or on one");
        let Some(p) = self.started() else { return (0..threads).map(f).collect() };
        let out: Vec<Mutex<Option<T>>> = (0..threads).map(|_| Mutex::new(None)).collect();
        p.scope(|s| {
            for (i, o) in out.iter().enumerate() {
                let f = &f;
                s.spawn(move |_| *lock(o) = Some(f(i)));
            }
        });
        out.into_iter().map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every job ran")).collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take().flatten() else { return };
        if self.pid != std::process::id() {
            // a forked child: the threads do not exist here; nothing to wait for
            std::mem::forget(pool);
            return;
        }
        // Ends the threads once they finish (they are idle: no collection runs).
        drop(pool);
        for h in std::mem::take(&mut *lock(&self.handles)) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thread ids of this process's threads whose name starts with `prefix`.
    pub(crate) fn named(prefix: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end().starts_with(prefix) {
                out.push(t.file_name().to_string_lossy().parse().unwrap());
            }
        }
        out.sort_unstable();
        out
    }

    /// [`named`] once it has `n` threads (a new thread names itself when it starts; an
    /// exited one stays listed a moment after it was joined), or after 2 s.
    fn settled(prefix: &str, n: usize) -> Vec<u32> {
        let t = std::time::Instant::now();
        loop {
            let v = named(prefix);
            if v.len() == n || t.elapsed().as_secs() >= 2 {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_pool_runs_every_index_once_on_its_threads_and_joins_them_when_dropped() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(pool.threads(), 3);
        assert!(named(&pool.prefix).is_empty(), "no thread before the first parallel phase");
        pool.run(3, |i| i);
        let tids = settled(&pool.prefix, 3);
        assert_eq!(tids.len(), 3, "{tids:?}");
        for _ in 0..20 {
            let out = pool.run(3, |i| (i, std::thread::current().name().map(String::from)));
            assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1, 2]);
            assert!(out.iter().all(|o| o.1.as_ref().is_some_and(|n| n.starts_with(&pool.prefix))), "{out:?}");
        }
        assert_eq!(named(&pool.prefix), tids, "the same threads serve every job");
        let prefix = pool.prefix.clone();
        drop(pool);
        assert!(settled(&prefix, 0).is_empty(), "threads left after the pool was dropped");
    }

    /// A heap starts its GC threads once, at its first parallel collection: every
    /// collection (parallel here, from the first byte) runs on the same threads, and
    /// they are gone when the heap is.
    #[test]
    fn a_heaps_gc_threads_serve_every_collection_and_go_away_with_the_heap() {
        let mut c = crate::Config::new(16 << 20);
        c.gc_threads = 2;
        c.parallel_from_bytes = 0;
        c.verify = true;
        let heap = crate::Heap::with_config(c).unwrap();
        let prefix = heap.inner.pool.prefix.clone();
        assert!(named(&prefix).is_empty(), "no GC thread before the first collection");
        let mut tids = Vec::new();
        {
            let mut m = heap.attach();
            let root = m.push_root(None);
            for round in 0..5 {
                // a list of 2000 cells with garbage between them
                for i in 0..2000usize {
                    let next = m.root(root);
                    let o = m.alloc(1, 8 * (i % 4)).unwrap();
                    m.set(o, 0, next);
                    m.set_root(root, Some(o));
                    let _garbage = m.alloc(0, 24).unwrap();
                }
                let c = m.collect().unwrap();
                assert_eq!(c.live_objects, 2000 * (round + 1) as u64, "{c:?}");
                if round == 0 {
                    tids = settled(&prefix, 2);
                    assert_eq!(tids.len(), 2, "{tids:?}");
                }
                assert_eq!(named(&prefix), tids, "round {round}: the same GC threads");
            }
        }
        drop(heap);
        assert!(settled(&prefix, 0).is_empty(), "GC threads left after the heap was dropped");
    }

    #[test]
    fn one_thread_needs_no_pool() {
        let pool = Pool::new(1).unwrap();
        assert_eq!(pool.threads(), 1);
        assert_eq!(pool.run(1, |i| i + 7), [7]);
        assert!(named(&pool.prefix).is_empty());
    }
}
