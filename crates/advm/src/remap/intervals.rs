//! A set of disjoint half-open address intervals, kept sorted and merged; the batch
//! planner's memory of which pages earlier operations touched or emptied.

/// Sorted, disjoint, non-adjacent `[start, end)` intervals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IntervalSet {
    v: Vec<(usize, usize)>,
}

impl IntervalSet {
    /// Index of the first interval whose end is after `x`.
    fn first_ending_after(&self, x: usize) -> usize {
        self.v.partition_point(|&(_, e)| e <= x)
    }

    /// Adds `[s, e)`.
    pub(crate) fn insert(&mut self, s: usize, e: usize) {
        if s >= e {
            return;
        }
        // Intervals touching or overlapping [s, e) merge into one.
        let i = self.v.partition_point(|&(_, ie)| ie < s);
        let j = self.v.partition_point(|&(is, _)| is <= e);
        let (mut ns, mut ne) = (s, e);
        if i < j {
            ns = ns.min(self.v[i].0);
            ne = ne.max(self.v[j - 1].1);
        }
        self.v.splice(i..j, std::iter::once((ns, ne)));
    }

    /// Removes `[s, e)`.
    pub(crate) fn remove(&mut self, s: usize, e: usize) {
        if s >= e {
            return;
        }
        let i = self.first_ending_after(s);
        let j = self.v.partition_point(|&(is, _)| is < e);
        if i >= j {
            return;
        }
        let mut keep = Vec::with_capacity(2);
        if self.v[i].0 < s {
            keep.push((self.v[i].0, s));
        }
        if self.v[j - 1].1 > e {
            keep.push((e, self.v[j - 1].1));
        }
        self.v.splice(i..j, keep);
    }

    /// The parts of `[s, e)` inside the set.
    pub(crate) fn intersect(&self, s: usize, e: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = self.first_ending_after(s);
        while i < self.v.len() && self.v[i].0 < e {
            out.push((self.v[i].0.max(s), self.v[i].1.min(e)));
            i += 1;
        }
        out
    }

    /// The parts of `[s, e)` outside the set.
    pub(crate) fn subtract_from(&self, s: usize, e: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut cur = s;
        for (is, ie) in self.intersect(s, e) {
            if is > cur {
                out.push((cur, is));
            }
            cur = ie;
        }
        if cur < e {
            out.push((cur, e));
        }
        out
    }

    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &[(usize, usize)] {
        &self.v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0usize..64, 0usize..64), 0..40),
                            q in (0usize..64, 0usize..64)) {
            let mut set = IntervalSet::default();
            let mut bits = [false; 64];
            for (add, a, b) in ops {
                let (s, e) = (a.min(b), a.max(b));
                if add { set.insert(s, e) } else { set.remove(s, e) }
                for x in bits.iter_mut().take(e).skip(s) { *x = add; }
            }
            let w = set.as_slice();
            for p in w.windows(2) { prop_assert!(p[0].1 < p[1].0); }
            for (x, &bit) in bits.iter().enumerate() {
                prop_assert_eq!(w.iter().any(|&(s, e)| s <= x && x < e), bit);
            }
            let (s, e) = (q.0.min(q.1), q.0.max(q.1));
            let inside: usize = set.intersect(s, e).iter().map(|r| r.1 - r.0).sum();
            let outside: usize = set.subtract_from(s, e).iter().map(|r| r.1 - r.0).sum();
            prop_assert_eq!(inside, bits[s..e].iter().filter(|&&b| b).count());
            prop_assert_eq!(inside + outside, e - s);
        }
    }
}
