//! A bounded lock-free queue of fill records (Vyukov's bounded MPMC queue, used with
//! one consumer): faulting threads push from their SIGBUS handlers, where no lock
//! and no allocation is allowed; the pager drains it under its queue lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

struct Cell {
    seq: AtomicUsize,
    words: [AtomicU64; 3],
}

pub(crate) struct Ring {
    cells: Box<[Cell]>,
    mask: usize,
    head: AtomicUsize,
    tail: AtomicUsize,
}

impl Ring {
    /// Room for `capacity` records, rounded up to a power of two.
    pub(crate) fn new(capacity: usize) -> Self {
        let n = capacity.max(2).next_power_of_two();
        let cells = (0..n)
            .map(|i| Cell {
                seq: AtomicUsize::new(i),
                words: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            })
            .collect();
        Self { cells, mask: n - 1, head: AtomicUsize::new(0), tail: AtomicUsize::new(0) }
    }

    /// Appends a record; false when full. Async-signal-safe.
    pub(crate) fn push(&self, w: [u64; 3]) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            match (seq as isize).wrapping_sub(pos as isize) {
                0 => match self.tail.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        for (c, v) in cell.words.iter().zip(w) {
                            c.store(v, Ordering::Relaxed);
                        }
                        cell.seq.store(pos + 1, Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                },
                d if d < 0 => return false,
                _ => pos = self.tail.load(Ordering::Relaxed),
            }
        }
    }

    /// Takes the oldest complete record. One consumer at a time (the caller holds a lock).
    pub(crate) fn pop(&self) -> Option<[u64; 3]> {
        let pos = self.head.load(Ordering::Relaxed);
        let cell = &self.cells[pos & self.mask];
        if cell.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        let w = [0, 1, 2].map(|i| cell.words[i].load(Ordering::Relaxed));
        cell.seq.store(pos + self.mask + 1, Ordering::Release);
        self.head.store(pos + 1, Ordering::Relaxed);
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_out_in_order_and_a_full_ring_refuses() {
        let r = Ring::new(4);
        for i in 0..4 {
            assert!(r.push([i, i + 1, i + 2]));
        }
        assert!(!r.push([9, 9, 9]));
        assert_eq!(r.pop(), Some([0, 1, 2]));
        assert!(r.push([4, 5, 6]));
        let rest: Vec<u64> = std::iter::from_fn(|| r.pop()).map(|w| w[0]).collect();
        assert_eq!(rest, [1, 2, 3, 4]);
    }

    #[test]
    fn concurrent_pushers_lose_nothing() {
        let r = std::sync::Arc::new(Ring::new(1 << 14));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || (0..2000u64).for_each(|i| assert!(r.push([t, i, 0]))))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let mut next = [0u64; 4];
        while let Some([t, i, _]) = r.pop() {
            assert_eq!(next[t as usize], i, "thread {t} out of order");
            next[t as usize] += 1;
        }
        assert_eq!(next, [2000; 4]);
    }
}
