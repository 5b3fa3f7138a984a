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
        // What survives of the first and last overlapped intervals (no allocation).
        let head = (self.v[i].0 < s).then(|| (self.v[i].0, s));
        let tail = (self.v[j - 1].1 > e).then(|| (e, self.v[j - 1].1));
        self.v.splice(i..j, head.into_iter().chain(tail));
    }

    /// The parts of `[s, e)` inside the set, in order, without allocating.
    pub(crate) fn inside(&self, s: usize, e: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.v[self.first_ending_after(s)..]
            .iter()
            .take_while(move |&&(is, _)| is < e)
            .map(move |&(is, ie)| (is.max(s), ie.min(e)))
            .filter(|&(a, b)| a < b)
    }

    /// The parts of `[s, e)` outside the set, in order, without allocating.
    pub(crate) fn outside(&self, s: usize, e: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut cur = s;
        let mut inner = self.inside(s, e);
        std::iter::from_fn(move || {
            while cur < e {
                match inner.next() {
                    Some((is, ie)) => {
                        let gap = (cur < is).then_some((cur, is));
                        cur = ie;
                        if gap.is_some() {
                            return gap;
                        }
                    }
                    None => {
                        let gap = (cur, e);
                        cur = e;
                        return Some(gap);
                    }
                }
            }
            None
        })
    }

    /// The parts of `[s, e)` outside the set.
    pub(crate) fn subtract_from(&self, s: usize, e: usize) -> Vec<(usize, usize)> {
        self.outside(s, e).collect()
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
            for (a, b) in set.inside(s, e) {
                prop_assert!(s <= a && a < b && b <= e && bits[a..b].iter().all(|&x| x));
            }
            for (a, b) in set.outside(s, e) {
                prop_assert!(s <= a && a < b && b <= e && bits[a..b].iter().all(|&x| !x));
            }
            let inside: usize = set.inside(s, e).map(|r| r.1 - r.0).sum();
            let outside: usize = set.outside(s, e).map(|r| r.1 - r.0).sum();
            prop_assert_eq!(set.subtract_from(s, e), set.outside(s, e).collect::<Vec<_>>());
            prop_assert_eq!(inside, bits[s..e].iter().filter(|&&b| b).count());
            prop_assert_eq!(inside + outside, e - s);
        }
    }
}
