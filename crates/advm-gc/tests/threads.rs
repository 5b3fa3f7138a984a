//! Mutator threads as a language runtime has them: a thread that blocks (on a channel,
//! a lock, I/O) while another one needs a collection, threads attaching and detaching
//! while collections run, and a generational heap whose threads store young objects
//! into old ones through the write barrier all along. Every heap runs the verifier.

use std::sync::mpsc;
use std::time::Duration;

use advm_gc::{Config, Generational, Heap, Policy};

fn heap(generational: bool) -> Heap {
    let mut c = Config::new(8 << 20);
    c.verify = true;
    c.gc_threads = 2;
    c.large_object_bytes = Some(64 << 10);
    if generational {
        let policy = Policy::Modified { mem_lim: 1 << 20, min_new_size: 128 << 10, min_old_incr: 256 << 10 };
        c.generational = Some(Generational { policy, copy_back: false });
    }
    Heap::with_config(c).unwrap()
}

/// Runs `f` on a thread and fails the test when it has not finished in 30 s (a
/// collection waiting for a mutator that never reaches a safepoint waits for ever).
fn within_30s(name: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(30)) {
        Ok(()) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => t.join().unwrap(), // its panic
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name}: still running after 30 s (a collection waits for ever)")
        }
    }
}

/// A thread waits for a message from a thread that allocates enough to need
/// collections first: inside `Mutator::blocking` the waiting thread counts as
/// stopped, so the collections run, and its rooted list has moved and is intact.
#[test]
fn a_mutator_blocked_inside_blocking_does_not_hold_up_collections() {
    for generational in [false, true] {
        within_30s("blocked mutator", move || {
            let h = heap(generational);
            let (tx, rx) = mpsc::channel::<u64>();
            let (ready, is_ready) = mpsc::channel::<()>();
            let waiter = {
                let h = h.clone();
                std::thread::spawn(move || {
                    let mut m = h.attach();
                    let r = m.push_root(None);
                    m.alloc(0, 1000).unwrap(); // garbage below the list: it moves down
                    for i in 0..100 {
                        let o = m.alloc(1, 8).unwrap();
                        m.set_word(o, 0, i);
                        m.set(o, 0, m.root(r));
                        m.set_root(r, Some(o));
                    }
                    let before = m.root(r).unwrap().addr();
                    ready.send(()).unwrap();
                    let got = m.blocking(|| rx.recv().unwrap());
                    let head = m.root(r).unwrap();
                    assert_ne!(head.addr(), before, "the collections moved the list");
                    let (mut o, mut n) = (Some(head), 100);
                    while let Some(x) = o {
                        n -= 1;
                        assert_eq!(m.word(x, 0), n);
                        o = m.get(x, 0);
                    }
                    assert_eq!(n, 0);
                    got
                })
            };
            is_ready.recv().unwrap();
            let mut m = h.attach();
            for _ in 0..100_000 {
                m.alloc(2, 100).unwrap(); // garbage: 14 MiB, collections on the way
            }
            m.collect().unwrap();
            assert!(h.stats().collections >= 2);
            tx.send(7).unwrap();
            assert_eq!(waiter.join().unwrap(), 7);
        });
    }
}

/// Four threads attach, build lists whose old cells get young ones (old-to-young
/// stores through the barrier in generational mode), collect, detach and attach again,
/// some leaving by dropping their mutator while others collect; a fifth thread that
/// is not a mutator collects all along through `Heap::collect`.
#[test]
fn threads_attaching_detaching_and_storing_young_into_old_keep_their_data() {
    for generational in [false, true] {
        within_30s("attach/detach", move || {
            let h = heap(generational);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let collector = {
                let (h, stop) = (h.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        h.collect().unwrap();
                        n += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    n
                })
            };
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let h = h.clone();
                    std::thread::spawn(move || {
                        for round in 0..5u64 {
                            let mut m = h.attach();
                            let r = m.push_root(None);
                            // an old spine: cells that survive collections
                            for i in 0..200u64 {
                                let o = m.alloc(2, 8).unwrap();
                                m.set_word(o, 0, i);
                                m.set(o, 0, m.root(r));
                                m.set_root(r, Some(o));
                            }
                            m.collect().unwrap();
                            // young leaves hung from every old cell, with garbage between
                            let mut i = 0u64;
                            let mut cur = m.root(r);
                            let leaf_of = |t: u64, round: u64, i: u64| t << 40 | round << 20 | i;
                            while let Some(cell) = cur {
                                let tmp = m.push_root(Some(cell));
                                m.alloc(0, 200).unwrap();
                                let leaf = m.alloc(0, 8).unwrap();
                                m.set_word(leaf, 0, leaf_of(t, round, i));
                                let cell = m.root(tmp).unwrap();
                                m.set(cell, 1, Some(leaf));
                                m.truncate_roots(tmp);
                                cur = m.get(cell, 0);
                                i += 1;
                            }
                            m.alloc(0, 64).unwrap();
                            let (mut cur, mut n) = (m.root(r), 200u64);
                            while let Some(cell) = cur {
                                n -= 1;
                                assert_eq!(m.word(cell, 0), n);
                                let leaf = m.get(cell, 1).expect("a leaf on every cell");
                                assert_eq!(m.word(leaf, 0), leaf_of(t, round, 199 - n));
                                cur = m.get(cell, 0);
                            }
                            assert_eq!(n, 0);
                            drop(m); // detach, with collections going on
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(collector.join().unwrap() > 0);
        });
    }
}

/// Two threads ask for a collection at once on a fresh heap: the one that waits for
/// the other's collection gets that collection's record. It read the record before
/// the collecting thread wrote it (the world restarted first): on a heap's first
/// collection that was `Corrupt("no collection recorded")`, which an allocation or
/// a pin passed on as its own failure; later, the collection before.
#[test]
fn a_thread_that_waits_for_another_threads_collection_gets_its_record() {
    within_30s("simultaneous collections", || {
        for _ in 0..300 {
            let h = heap(false);
            let go = std::sync::Arc::new(std::sync::Barrier::new(2));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (h, go) = (h.clone(), go.clone());
                    std::thread::spawn(move || {
                        let mut m = h.attach();
                        go.wait();
                        m.collect().map(|c| c.index)
                    })
                })
                .collect();
            let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let total = h.stats().collections;
            for g in got {
                let index = g.expect("a collection's record");
                assert!(index >= 1 && index <= total, "record {index} of {total} collections");
            }
        }
    });
}
