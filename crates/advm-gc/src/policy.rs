//! Generational heap sizing: SML/NJ's original policy (Appel: `ratio`, `mem_limit`) and
//! the modified one of Cooper, Nettles & Subramanian (`mem_lim`, `min_new_size`,
//! `min_old_incr`). Sizes count the old generation as its small objects plus the large
//! objects (all large objects are old: they are allocated there).

use serde::Serialize;

/// The smallest nursery the original policy gives (its formula gives 0 before any data
/// lives): a few allocation buffers, so minor collections do not run back to back.
pub const MIN_NURSERY_BYTES: usize = 256 << 10;

/// How a generational heap sizes its nursery and when it runs a major collection.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum Policy {
    /// Appel's policy as SML/NJ shipped it. After a major collection with `live` bytes:
    /// `heap = ratio*live` when that is below `mem_limit`, else `mem_limit` when
    /// `3*live` is below it, else `3*live`; the free region (the nursery) is
    /// `(heap - old)/2`, recomputed after every minor collection; a major collection
    /// runs when the old generation reaches half the heap.
    Original {
        /// Target ratio of heap size to live size (a number, at least 1).
        ratio: f64,
        /// Memory use target in bytes.
        mem_limit: usize,
    },
    /// The paper's modified policy. After a major collection with `live` bytes:
    /// `new = max(mem_lim - live, min_new_size)`, `old limit = max(mem_lim/2, live +
    /// min_old_incr)`; after a minor collection the nursery shrinks by what the old
    /// generation grew, not below `min_new_size`; a major collection runs when the old
    /// generation passes its limit.
    Modified {
        /// Memory use target in bytes.
        mem_lim: usize,
        /// Smallest nursery in bytes: at least one allocation buffer
        /// ([`crate::Config::tlab_bytes`], 32 KiB by default).
        min_new_size: usize,
        /// Smallest room for old-generation growth after a major collection, in bytes.
        min_old_incr: usize,
    },
}

impl Policy {
    /// `"original"` or `"modified"`.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Original { .. } => "original",
            Policy::Modified { .. } => "modified",
        }
    }

    /// Refuses settings the heap cannot run well with: a ratio that is not a number of
    /// at least 1, a smallest nursery below one allocation buffer (`tlab_bytes`), with
    /// which every allocation ran a minor collection (98,304 collections for as many
    /// cells under `min_new_size` 0), and one larger than the heap (`heap_bytes`),
    /// which no nursery can be (it was accepted and silently capped at the heap).
    pub(crate) fn check(&self, tlab_bytes: usize, heap_bytes: usize) -> crate::Result<()> {
        match *self {
            Policy::Original { ratio, .. } if !(ratio.is_finite() && ratio >= 1.0) => {
                Err(crate::Error::InvalidArgument { what: "ratio", why: format!("{ratio} is not a number >= 1") })
            }
            Policy::Modified { min_new_size, .. } if min_new_size < tlab_bytes => Err(crate::Error::InvalidArgument {
                what: "min_new_size",
                why: format!(
                    "{min_new_size} is below one allocation buffer ({tlab_bytes} bytes): every allocation would run \
                     a minor collection"
                ),
            }),
            Policy::Modified { min_new_size, .. } if min_new_size > heap_bytes => Err(crate::Error::InvalidArgument {
                what: "min_new_size",
                why: format!(
                    "{min_new_size} is larger than the heap ({heap_bytes} bytes): no nursery can be that large"
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// Generational mode's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Generational {
    /// Heap sizing.
    pub policy: Policy,
    /// After a major collection, block-copy the old generation back to the start of its
    /// reservation (SML/NJ's original scheme); off, it stays where the collection put
    /// it and drifts through the reservation (the paper's change).
    pub copy_back: bool,
}

/// The policy's current decisions.
#[derive(Debug, Clone)]
pub(crate) struct Sizing {
    policy: Policy,
    /// Original: the heap size; Modified: the old generation's limit.
    target: usize,
    /// Nursery capacity in bytes.
    pub(crate) nursery: usize,
    /// Old-generation bytes at the last decision.
    old: usize,
}

impl Sizing {
    /// The sizes before any collection (nothing lives yet).
    pub(crate) fn new(policy: Policy) -> Self {
        let mut s = Sizing { policy, target: 0, nursery: 0, old: 0 };
        s.after_major(0);
        s
    }

    /// Decides after a major collection that left `live` old bytes.
    pub(crate) fn after_major(&mut self, live: usize) -> String {
        self.old = live;
        match self.policy {
            Policy::Original { ratio, mem_limit } => {
                let by_ratio = (ratio * live as f64) as usize;
                self.target = if by_ratio < mem_limit {
                    by_ratio
                } else if live.saturating_mul(3) < mem_limit {
                    mem_limit
                } else {
                    live.saturating_mul(3)
                };
                self.nursery = (self.target.saturating_sub(live) / 2).max(MIN_NURSERY_BYTES);
                format!("original: live {live}, heap {}, nursery {}", self.target, self.nursery)
            }
            Policy::Modified { mem_lim, min_new_size, min_old_incr } => {
                self.nursery = mem_lim.saturating_sub(live).max(min_new_size);
                self.target = (mem_lim / 2).max(live.saturating_add(min_old_incr));
                format!("modified: live {live}, nursery {}, old limit {}", self.nursery, self.target)
            }
        }
    }

    /// Whether an old generation of `old` bytes calls for a major collection.
    pub(crate) fn over(&self, old: usize) -> bool {
        match self.policy {
            Policy::Original { .. } => old.saturating_mul(2) >= self.target,
            Policy::Modified { .. } => old > self.target,
        }
    }

    /// Decides after a minor collection that left `old` old bytes; true when a major
    /// collection is due.
    pub(crate) fn after_minor(&mut self, old: usize) -> (bool, String) {
        let grew = old.saturating_sub(self.old);
        self.old = old;
        match self.policy {
            Policy::Original { .. } => {
                self.nursery = (self.target.saturating_sub(old) / 2).max(MIN_NURSERY_BYTES);
                (self.over(old), format!("original: old {old} of heap {}, nursery {}", self.target, self.nursery))
            }
            Policy::Modified { min_new_size, .. } => {
                self.nursery = self.nursery.saturating_sub(grew).max(min_new_size);
                (self.over(old), format!("modified: old {old} of limit {}, nursery {}", self.target, self.nursery))
            }
        }
    }
}
