//! Readers of a block while the arena remaps it: a block's bytes never change under a
//! reader because another block is copied from it, and a reader never sees another
//! block's bytes (or a memfd page's earlier content) while the block's view switches.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::mem::HostAddr;
use advm::vcopy::{Arena, Config};

/// A thread reading one byte of every page of the block `target` names, and
/// counting those that are not `want`.
struct Reader {
    target: Arc<AtomicUsize>,
    want: Arc<AtomicUsize>,
    passes: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(len: usize) -> Self {
        let ps = advm::addr::page_size();
        let (target, want) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (passes, wrong, done) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (target, want, passes, wrong, done) =
                (target.clone(), want.clone(), passes.clone(), wrong.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    let p = target.load(Ordering::Acquire);
                    let w = want.load(Ordering::Acquire) as u8;
                    for i in (0..len / ps).filter(|_| p != 0) {
                        // SAFETY: `read_during` keeps the block at `p` alive and
                        // unwritten while `target` names it, and until the pass that
                        // may still read it has ended.
                        let v = unsafe { std::ptr::read_volatile((p as *const u8).add(i * ps + 64)) };
                        if v != w {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    passes.fetch_add(1, Ordering::AcqRel);
                }
            })
        };
        Self { target, want, passes, wrong, done, thread: Some(thread) }
    }

    /// Runs `f` while the thread reads every page of `p` (all bytes `want`) over and
    /// over: it has read all of `p` once before `f` starts, and stops reading `p`
    /// before this returns.
    fn read_during<T>(&self, p: HostAddr, want: u8, f: impl FnOnce() -> T) -> T {
        let wait = |n| {
            let seen = self.passes.load(Ordering::Acquire);
            while self.passes.load(Ordering::Acquire) < seen + n {
                std::hint::spin_loop();
            }
        };
        self.want.store(want as usize, Ordering::Release);
        self.target.store(p.0, Ordering::Release);
        wait(2);
        let out = f();
        self.target.store(0, Ordering::Release);
        wait(2);
        out
    }

    fn wrong(&self) -> u64 {
        self.wrong.load(Ordering::Relaxed)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        let _ = self.thread.take().map(|t| t.join());
    }
}

/// a freshly written (its pages shared with no one); b = dup(a) while a reader reads
/// a; every page of b rewritten; c = dup(b) while the reader reads b. In the second
/// copy b's written pages are re-homed into fresh memfd pages and b's view switches
/// to them. Before the fix, b's view was first emptied (its page tables moved aside)
/// and a read in that window faulted in the memfd page b's old view named: a's bytes
/// (1 to 5 copies of 4 MiB sufficed).
#[test]
fn readers_of_a_copied_source_never_see_stale_bytes() {
    let len = 4 << 20; // over the 2 MiB from which old page tables are moved aside
    let arena = Arena::with_config(Config::default().reserve_bytes(1 << 30)).unwrap();
    let reader = Reader::start(len);
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(2) && reader.wrong() == 0 {
        let a = arena.alloc(len).unwrap();
        arena.fill(a, 0xaa, len).unwrap();
        let b = reader.read_during(a, 0xaa, || arena.dup(a, len).unwrap());
        // SAFETY: b is a live block of len bytes; only this thread writes it.
        unsafe { std::ptr::write_bytes(b.as_ptr(), 0xbb, len) };
        let c = reader.read_during(b, 0xbb, || arena.dup(b, len).unwrap());
        for p in [a, b, c] {
            arena.free(p).unwrap();
        }
        rounds += 1;
    }
    let wrong = reader.wrong();
    assert_eq!(wrong, 0, "a reader saw bytes its block does not hold ({wrong} page reads, {rounds} rounds)");
    eprintln!("{rounds} rounds (first copy of a, copy of re-homed b) under a reader, no stale read");
}
