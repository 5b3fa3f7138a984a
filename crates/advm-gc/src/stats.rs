//! Statistics per collection and totals.

use serde::Serialize;

use crate::Engine;

/// What one collection did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Collection {
    /// 1 for the first collection of the heap.
    pub index: u64,
    /// `"full"` (non-generational), `"minor"` or `"major"` (generational mode).
    pub kind: &'static str,
    /// When it started, from the heap's creation.
    pub at_ns: u64,
    /// Bytes the mutators had allocated when it started (the paper's pseudo-time).
    pub allocated_before: u64,
    /// Compaction engine for large objects.
    pub engine: Engine,
    /// The whole pause: from the stop request to the world's restart.
    pub pause_ns: u64,
    /// Waiting for mutators to reach a safepoint.
    pub stop_ns: u64,
    /// Marking from the roots.
    pub mark_ns: u64,
    /// Computing forwarding addresses.
    pub forward_ns: u64,
    /// Rewriting pointers: roots and large objects' slots (a full collection adjusts
    /// the small objects' slots as it moves them, in `move_ns`).
    pub adjust_ns: u64,
    /// Moving objects (adjusting and memmoving small ones run by run, the batch of
    /// large ones).
    pub move_ns: u64,
    /// Of `move_ns`, the large objects' batch.
    pub move_large_ns: u64,
    /// Objects copied by memmove.
    pub objects_memmove: u64,
    /// Bytes copied by memmove.
    pub bytes_memmove: u64,
    /// Large objects moved by page remapping.
    pub objects_remap: u64,
    /// Bytes of objects moved by page remapping.
    pub bytes_remap: u64,
    /// Dead pages' bytes that page moves parked out of their objects' way and put back
    /// into the freed tail (two page moves each; not in `bytes_remap`).
    pub bytes_parked: u64,
    /// Heap bytes in use before.
    pub heap_before: usize,
    /// Heap bytes in use after (live data, compacted).
    pub heap_after: usize,
    /// Generational mode: old-generation bytes after it (small and large objects).
    pub old_bytes: usize,
    /// Generational mode: the nursery's capacity the policy set after it.
    pub nursery_bytes: usize,
    /// Of `bytes_memmove`, the copy-back of the old generation (copy-back on).
    pub bytes_copied_back: u64,
    /// Time of the copy-back (after `move_ns`).
    pub copy_back_ns: u64,
    /// Live objects.
    pub live_objects: u64,
    /// Weak slots this collection set to null (their objects died): a runtime that
    /// watches weak slots for dead objects (finalization) looks at them only when
    /// this is not 0.
    pub weak_cleared: u64,
    /// Bytes of the small space's dense prefix: the live objects below the first
    /// gap, which kept their place and were neither forwarded nor moved.
    pub bytes_in_place: u64,
    /// Bytes of whole pages freed at the spaces' tops (handed to the free hook).
    pub bytes_freed_pages: usize,
    /// Why this collection ran and what the policy decided.
    pub decision: String,
}

/// Totals over the heap's life, and every collection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Collections run.
    pub collections: u64,
    /// Pause of the last one.
    pub last_pause_ns: u64,
    /// Longest pause.
    pub max_pause_ns: u64,
    /// Sum of pauses.
    pub total_pause_ns: u64,
    /// Bytes copied by memmove, all collections.
    pub bytes_moved_memmove: u64,
    /// Bytes moved by page remapping, all collections.
    pub bytes_moved_remap: u64,
    /// Bytes handed out by the shared allocator: whole allocation buffers, direct
    /// and large objects (headers and padding included).
    pub bytes_allocated: u64,
    /// The most recent collections, oldest first: the last
    /// [`Config::history_limit`](crate::Config::history_limit) of them (empty from
    /// [`Heap::totals`](crate::Heap::totals)).
    pub history: Vec<Collection>,
}

/// The totals and the most recent collections, kept by the heap.
#[derive(Debug)]
pub(crate) struct Record {
    /// Totals over every collection (`history` unused).
    pub(crate) totals: Stats,
    recent: std::collections::VecDeque<Collection>,
    /// Most collections kept in `recent` (at least the last one).
    limit: usize,
}

impl Record {
    pub(crate) fn new(limit: usize) -> Self {
        Record { totals: Stats::default(), recent: Default::default(), limit: limit.max(1) }
    }

    pub(crate) fn record(&mut self, c: Collection) {
        let t = &mut self.totals;
        t.collections += 1;
        t.last_pause_ns = c.pause_ns;
        t.max_pause_ns = t.max_pause_ns.max(c.pause_ns);
        t.total_pause_ns += c.pause_ns;
        t.bytes_moved_memmove += c.bytes_memmove;
        t.bytes_moved_remap += c.bytes_remap;
        if self.recent.len() == self.limit {
            self.recent.pop_front();
        }
        self.recent.push_back(c);
    }

    /// The last collection recorded.
    pub(crate) fn last(&self) -> Option<&Collection> {
        self.recent.back()
    }

    /// The totals, with the recent collections when `history`.
    pub(crate) fn stats(&self, history: bool) -> Stats {
        let mut s = self.totals.clone();
        if history {
            s.history = self.recent.iter().cloned().collect();
        }
        s
    }
}
