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

/// A value that labels a run of pages: what page `k` of a run labelled `self` is
/// labelled.
pub(crate) trait Run: Copy + Eq + std::fmt::Debug {
    /// The label of the page `k` pages further into the same run.
    fn advance(self, k: usize) -> Self;
    /// True when extents with this label count as a run (a VMA) in [`RunMap::runs`].
    fn counted(&self) -> bool {
        true
    }
}

/// Per-extent labels of page indices: a sorted map of non-overlapping extents
/// `start -> (len, label)`, where page `start + k` is labelled `label.advance(k)`.
/// Pages in no extent are unlabelled. Extents are kept maximal: an extent never
/// directly continues its left neighbour (`prev.advance(prev_len) == label`), so the
/// map holds one entry per run, however many pages. Operations cost
/// O((extents touched + 1) · log extents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunMap<V: Run> {
    map: BTreeMap<usize, (usize, V)>,
    counted: usize,
}

impl<V: Run> Default for RunMap<V> {
    fn default() -> Self {
        Self { map: BTreeMap::new(), counted: 0 }
    }
}

impl<V: Run> RunMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Extents whose label is [`Run::counted`].
    pub fn runs(&self) -> usize {
        self.counted
    }

    /// Number of extents.
    #[cfg(test)]
    pub fn extents(&self) -> usize {
        self.map.len()
    }

    fn put(&mut self, start: usize, len: usize, v: V) {
        debug_assert!(len > 0);
        self.counted += usize::from(v.counted());
        let old = self.map.insert(start, (len, v));
        debug_assert!(old.is_none());
    }

    fn take(&mut self, start: usize) -> Option<(usize, V)> {
        let e = self.map.remove(&start)?;
        self.counted -= usize::from(e.1.counted());
        Some(e)
    }

    /// Makes `at` an extent boundary (splits the extent strictly containing it).
    fn split(&mut self, at: usize) {
        let Some((&s, &(l, v))) = self.map.range(..at).next_back() else { return };
        if s + l <= at {
            return;
        }
        self.take(s);
        self.put(s, at - s, v);
        self.put(at, s + l - at, v.advance(at - s));
    }

    /// Merges the extent ending at `at` with the one starting there, when the second
    /// continues the first.
    fn join(&mut self, at: usize) {
        let Some(&(rl, rv)) = self.map.get(&at) else { return };
        let Some((&s, &(l, v))) = self.map.range(..at).next_back() else { return };
        if s + l == at && v.advance(l) == rv {
            self.take(at);
            self.take(s);
            self.put(s, l + rl, v);
        }
    }

    /// The label of page `i`.
    #[cfg(test)]
    pub fn get(&self, i: usize) -> Option<V> {
        let (&s, &(l, v)) = self.map.range(..=i).next_back()?;
        (i < s + l).then(|| v.advance(i - s))
    }

    /// The labelled pieces of `[from, to)`: `(start, len, label)`, clipped to the range,
    /// in order.
    pub fn pieces(&self, from: usize, to: usize) -> Vec<(usize, usize, V)> {
        let mut out = Vec::new();
        if from >= to {
            return out;
        }
        if let Some((&s, &(l, v))) = self.map.range(..from).next_back() {
            if s + l > from {
                out.push((from, (s + l).min(to) - from, v.advance(from - s)));
            }
        }
        for (&s, &(l, v)) in self.map.range(from..to) {
            out.push((s, l.min(to - s), v));
        }
        out
    }

    /// Every extent, in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize, V)> + '_ {
        self.map.iter().map(|(&s, &(l, v))| (s, l, v))
    }

    /// Unlabels `[start, start+len)`.
    pub fn clear(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.split(start);
        self.split(start + len);
        let keys: Vec<usize> = self.map.range(start..start + len).map(|(&s, _)| s).collect();
        for s in keys {
            self.take(s);
        }
    }

    /// Labels `[start, start+len)` with `v` (page `start + k` gets `v.advance(k)`).
    pub fn set(&mut self, start: usize, len: usize, v: V) {
        if len == 0 {
            return;
        }
        self.clear(start, len);
        self.put(start, len, v);
        self.join(start + len);
        self.join(start);
    }

    /// Applies `f` to the label of every page of `[start, start+len)` (unlabelled
    /// pages get `f(None)`); `f` returning `None` unlabels. `f` is called once per
    /// piece and must map a run to a run (`f(v).advance(k) == f(v.advance(k))`).
    pub fn update(&mut self, start: usize, len: usize, mut f: impl FnMut(usize, usize, Option<V>) -> Option<V>) {
        if len == 0 {
            return;
        }
        let end = start + len;
        let mut pieces = Vec::new();
        let mut at = start;
        for (s, l, v) in self.pieces(start, end) {
            if s > at {
                pieces.push((at, s - at, None));
            }
            pieces.push((s, l, Some(v)));
            at = s + l;
        }
        if at < end {
            pieces.push((at, end - at, None));
        }
        self.clear(start, len);
        for (s, l, v) in pieces {
            if let Some(nv) = f(s, l, v) {
                self.put(s, l, nv);
            }
        }
        // re-establish maximal extents inside and at both ends
        let keys: Vec<usize> = self.map.range(start..=end).map(|(&s, _)| s).collect();
        for s in keys.into_iter().rev() {
            self.join(s);
        }
    }
}

/// A reference count, constant along a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count(pub u32);

impl Run for Count {
    fn advance(self, _k: usize) -> Self {
        self
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

    /// A run label for tests: page `k` further is `base + k`; `flat` labels stay
    /// the same along a run (like a reference count).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Lab {
        base: u32,
        flat: bool,
    }

    impl Run for Lab {
        fn advance(self, k: usize) -> Self {
            if self.flat {
                self
            } else {
                Lab { base: self.base + k as u32, ..self }
            }
        }
        fn counted(&self) -> bool {
            self.base % 5 != 0
        }
    }

    fn lab() -> impl Strategy<Value = Lab> {
        (0u32..12, any::<bool>()).prop_map(|(base, flat)| Lab { base, flat })
    }

    #[derive(Debug, Clone)]
    enum Op {
        Set(usize, usize, Lab),
        Clear(usize, usize),
        /// +1 / -1 on a flat label's base, unlabelled when it reaches 0 (refcounts).
        Count(usize, usize, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..40, 0usize..12, lab()).prop_map(|(s, l, v)| Op::Set(s, l, v)),
            (0usize..40, 0usize..12).prop_map(|(s, l)| Op::Clear(s, l)),
            (0usize..40, 0usize..12, any::<bool>()).prop_map(|(s, l, up)| Op::Count(s, l, up)),
        ]
    }

    proptest! {
        /// Against a per-page model (one label per page): same label on every page,
        /// one extent per maximal run, counted runs as the model counts them.
        #[test]
        fn runmap_matches_per_page_model(ops in proptest::collection::vec(op(), 1..40)) {
            let total = 52;
            let mut m: RunMap<Lab> = RunMap::new();
            let mut model: Vec<Option<Lab>> = vec![None; total];
            for op in ops {
                match op {
                    Op::Set(s, l, v) => {
                        m.set(s, l, v);
                        for k in 0..l { model[s + k] = Some(v.advance(k)); }
                    }
                    Op::Clear(s, l) => {
                        m.clear(s, l);
                        for p in &mut model[s..s + l] { *p = None; }
                    }
                    Op::Count(s, l, up) => {
                        let step = |v: Option<Lab>| match (v, up) {
                            (None, true) => Some(Lab { base: 1, flat: true }),
                            (None, false) => None,
                            (Some(x), true) => Some(Lab { base: x.base + 1, flat: true }),
                            (Some(x), false) if x.base > 1 => Some(Lab { base: x.base - 1, flat: true }),
                            (Some(_), false) => None,
                        };
                        // counts only make sense on flat labels: make the range flat first
                        for (ps, pl, v) in m.pieces(s, s + l) {
                            if !v.flat {
                                m.set(ps, pl, Lab { base: 1, flat: true });
                                for p in &mut model[ps..ps + pl] { *p = Some(Lab { base: 1, flat: true }); }
                            }
                        }
                        m.update(s, l, |_, _, v| step(v));
                        for p in &mut model[s..s + l] { *p = step(*p); }
                    }
                }
                for (i, want) in model.iter().enumerate() {
                    prop_assert_eq!(m.get(i), *want, "page {}", i);
                }
                // maximal runs of the model
                let mut runs = 0;
                let mut counted = 0;
                for i in 0..total {
                    let Some(v) = model[i] else { continue };
                    let continues = i > 0 && model[i - 1].is_some_and(|p| p.advance(1) == v);
                    if !continues {
                        runs += 1;
                        counted += usize::from(v.counted());
                    }
                }
                prop_assert_eq!(m.extents(), runs);
                prop_assert_eq!(m.runs(), counted);
                // pieces cover exactly the labelled pages of any window
                let (a, b) = (7, 31);
                let covered: usize = m.pieces(a, b).iter().map(|p| p.1).sum();
                prop_assert_eq!(covered, model[a..b].iter().filter(|p| p.is_some()).count());
            }
        }
    }
}
