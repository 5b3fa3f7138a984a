//! Free-extent lists: which page indices of a range are free, first fit, coalesced.

use std::collections::BTreeMap;

/// Free runs of page indices `[start, start+len)`, sorted, non-overlapping and never
/// adjacent (adjacent runs are merged when freed).
#[derive(Debug, Clone)]
pub(crate) struct Extents {
    free: BTreeMap<usize, usize>,
}

impl Extents {
    /// Everything in `[0, total)` free.
    pub fn new(total: usize) -> Self {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        Self { free }
    }

    /// First run of `n` contiguous free pages.
    pub fn alloc_contig(&mut self, n: usize) -> Option<usize> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= n)?;
        self.free.remove(&start);
        if len > n {
            self.free.insert(start + n, len - n);
        }
        Some(start)
    }

    /// First run of `n` free pages starting at an index `s` with `s % align == phase`.
    pub fn alloc_aligned(&mut self, n: usize, align: usize, phase: usize) -> Option<usize> {
        let (start, len, s) = self.free.iter().find_map(|(&start, &len)| {
            let s = start + (phase + align - start % align) % align;
            (s + n <= start + len).then_some((start, len, s))
        })?;
        self.free.remove(&start);
        if s > start {
            self.free.insert(start, s - start);
        }
        if start + len > s + n {
            self.free.insert(s + n, start + len - s - n);
        }
        Some(s)
    }

    /// `n` pages in as few runs as first fit gives: one run when one fits, else
    /// pieces in address order. `None` (nothing taken) when fewer than `n` are free.
    pub fn alloc_any(&mut self, n: usize) -> Option<Vec<(usize, usize)>> {
        if let Some(s) = self.alloc_contig(n) {
            return Some(vec![(s, n)]);
        }
        if self.free.values().sum::<usize>() < n {
            return None;
        }
        let mut out = Vec::new();
        let mut need = n;
        while need > 0 {
            let (&start, &len) = self.free.iter().next()?;
            self.free.remove(&start);
            let take = len.min(need);
            if len > take {
                self.free.insert(start + take, len - take);
            }
            out.push((start, take));
            need -= take;
        }
        Some(out)
    }

    /// Returns `[start, start+n)` to the free list, merging with neighbours.
    pub fn free(&mut self, start: usize, n: usize) {
        if n == 0 {
            return;
        }
        let (mut s, mut len) = (start, n);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free of pages {start}..{}", start + n);
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + n)) {
            self.free.remove(&(start + n));
            len += nl;
        }
        self.free.insert(s, len);
    }

    /// Total free pages.
    #[cfg(test)]
    pub fn free_pages(&self) -> usize {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_and_coalesce() {
        let mut e = Extents::new(10);
        assert_eq!(e.alloc_contig(4), Some(0));
        assert_eq!(e.alloc_contig(4), Some(4));
        assert_eq!(e.alloc_contig(4), None);
        e.free(0, 4);
        assert_eq!(e.alloc_any(5), Some(vec![(0, 4), (8, 1)]));
        e.free(8, 1);
        e.free(0, 4);
        e.free(4, 4);
        assert_eq!(e.free_pages(), 10);
        assert_eq!(e.alloc_contig(10), Some(0));
        e.free(0, 10);
        assert_eq!(e.alloc_aligned(3, 4, 1), Some(1));
        assert_eq!(e.alloc_aligned(3, 4, 1), Some(5));
        assert_eq!(e.alloc_contig(1), Some(0));
        assert_eq!(e.alloc_aligned(2, 4, 0), Some(8));
        assert_eq!(e.free_pages(), 1);
    }

    proptest! {
        /// Against an oracle of a bool per page: allocations never overlap and frees
        /// restore exactly what was taken.
        #[test]
        fn matches_bitmap_oracle(ops in proptest::collection::vec((1usize..6, any::<bool>()), 1..60)) {
            let total = 32;
            let mut e = Extents::new(total);
            let mut used = vec![false; total];
            let mut held: Vec<Vec<(usize, usize)>> = Vec::new();
            for (n, free_one) in ops {
                if free_one && !held.is_empty() {
                    for (s, l) in held.remove(0) {
                        for u in &mut used[s..s + l] { prop_assert!(*u); *u = false; }
                        e.free(s, l);
                    }
                } else if let Some(runs) = e.alloc_any(n) {
                    prop_assert_eq!(runs.iter().map(|r| r.1).sum::<usize>(), n);
                    for &(s, l) in &runs {
                        for u in &mut used[s..s + l] { prop_assert!(!*u); *u = true; }
                    }
                    held.push(runs);
                } else {
                    prop_assert!(used.iter().filter(|u| !**u).count() < n);
                }
                prop_assert_eq!(e.free_pages(), used.iter().filter(|u| !**u).count());
            }
        }
    }
}
