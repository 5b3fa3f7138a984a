//! A value computed on first use that a forked child can always use.
//!
//! std's `OnceLock`, `Once` and `LazyLock` mark themselves "running" while one thread
//! computes the value and make every other thread wait for it. A `fork()` by another
//! thread in that window copies the mark into a child where no thread will ever clear
//! it: the child's first use waits for ever. [`Lazy`] holds no lock: each thread that
//! finds it empty computes a value, and the first to publish it (a compare-exchange on
//! a pointer) wins; a loser drops its own value and uses the winner's. So the value
//! may be computed more than once, concurrently: every use of a `Lazy` must have an
//! initialiser that is idempotent and has no effect outside the value it returns (or
//! one that dropping the losing value undoes), and says so where it is used.
//!
//! A value that must be made anew in a forked child (a session, an fd of the parent's
//! `/proc/self`) is a [`super::process::PerProcess`] instead.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value computed on first use, without a lock (see the module comment).
#[derive(Debug)]
pub struct Lazy<T> {
    value: AtomicPtr<T>,
    /// Owns a `T` (for the drop check and auto traits).
    _owns: PhantomData<Box<T>>,
}

// SAFETY: shared use hands out `&T` to any thread (needs `T: Sync`) and may publish a
// value made on one thread that the cell's owner later drops on another (`T: Send`),
// the same bounds as `std::sync::OnceLock`.
unsafe impl<T: Send + Sync> Sync for Lazy<T> {}
// SAFETY: moving the cell moves the one `T` it owns.
unsafe impl<T: Send> Send for Lazy<T> {}

impl<T> Lazy<T> {
    /// Empty.
    pub const fn new() -> Self {
        Self { value: AtomicPtr::new(std::ptr::null_mut()), _owns: PhantomData }
    }

    /// The value, if one was published.
    pub fn get(&self) -> Option<&T> {
        // SAFETY: a non-null pointer here came from `Box::into_raw` in `publish`, and is
        // freed only by `drop`, which needs `&mut self`: it outlives this borrow.
        unsafe { self.value.load(Ordering::Acquire).as_ref() }
    }

    /// The value, computed by `init` when none was published yet. `init` may run on
    /// several threads at once; all but one result are dropped (see the module comment).
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        match self.get() {
            Some(v) => v,
            None => self.publish(init()),
        }
    }

    /// Publishes `v` unless a value is there already; returns the value there.
    fn publish(&self, v: T) -> &T {
        let mine = Box::into_raw(Box::new(v));
        match self.value.compare_exchange(std::ptr::null_mut(), mine, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published; freed only by `drop` (needs `&mut self`).
            Ok(_) => unsafe { &*mine },
            Err(other) => {
                // SAFETY: `mine` was never published: ours to free.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: another thread's published value, freed only by `drop`.
                unsafe { &*other }
            }
        }
    }
}

impl<T> Default for Lazy<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for Lazy<T> {
    fn drop(&mut self) {
        let p = *self.value.get_mut();
        if !p.is_null() {
            // SAFETY: published by `publish` from `Box::into_raw`, and no borrow of it
            // outlives `&mut self`.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier, OnceLock};
    use std::time::{Duration, Instant};

    /// How a child forked while another thread initialises the cell fares: `Ok(code)`
    /// when it used the cell and exited, `Err` when it had not exited within `limit`
    /// (then it is killed).
    fn child_uses_cell_while_a_thread_initialises(
        start_init: impl FnOnce(Arc<Barrier>, Arc<Barrier>) + Send + 'static,
        use_in_child: fn() -> u64,
        limit: Duration,
    ) -> Result<i32, String> {
        // `inside`: the thread is in the initialiser; `release`: it may finish.
        let (inside, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (i, r) = (inside.clone(), release.clone());
        let t = std::thread::spawn(move || start_init(i, r));
        inside.wait();
        let pid = crate::sys::process::fork_run(|| if use_in_child() == 42 { 0 } else { 1 }).expect("fork");
        release.wait();
        t.join().expect("initialising thread");
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes one int through a valid pointer; WNOHANG never blocks.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return Ok(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                });
            }
            if Instant::now() > deadline {
                // SAFETY: the child is ours and not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let _ = crate::sys::process::wait_child(pid);
                return Err(format!("the child had not exited after {limit:?}: killed"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_child_forked_while_a_thread_initialises_uses_the_cell() {
        static CELL: Lazy<u64> = Lazy::new();
        let got = child_uses_cell_while_a_thread_initialises(
            |inside, release| {
                CELL.get_or_init(|| {
                    inside.wait();
                    release.wait();
                    42
                });
            },
            || *CELL.get_or_init(|| 42),
            Duration::from_secs(5),
        );
        assert_eq!(got, Ok(0));
        assert_eq!(CELL.get(), Some(&42));
    }

    /// The same with std's `OnceLock`: the child waits for ever (the reason for
    /// [`Lazy`]); shows the test above can fail.
    #[test]
    fn with_a_once_lock_the_child_waits_for_ever() {
        static CELL: OnceLock<u64> = OnceLock::new();
        let got = child_uses_cell_while_a_thread_initialises(
            |inside, release| {
                CELL.get_or_init(|| {
                    inside.wait();
                    release.wait();
                    42
                });
            },
            || *CELL.get_or_init(|| 42),
            Duration::from_millis(500),
        );
        assert!(got.is_err(), "{got:?}");
    }

    #[test]
    fn racing_threads_all_see_the_one_published_value() {
        let cell = Arc::new(Lazy::<Box<usize>>::new());
        let go = Arc::new(Barrier::new(4));
        let seen: Vec<usize> = (0..4)
            .map(|i| {
                let (cell, go) = (cell.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    **cell.get_or_init(|| Box::new(i))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        let first = seen[0];
        assert!(seen.iter().all(|&s| s == first), "{seen:?}");
        assert_eq!(**cell.get().expect("published"), first);
    }
}
