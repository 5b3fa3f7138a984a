//! The mremap engine's state: the VMA budget it keeps under, and exchanges through
//! the process's mremap scratch area.

use super::*;

/// Estimated VMA count of this process, refreshed by counting (a read of
/// /proc/self/maps) when the worst case since the last count nears the budget, and at
/// least every [`RECOUNT_EVERY`] mremap moves (other code maps and unmaps too).
pub(crate) static VMA_ESTIMATE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static MREMAPS_SINCE_COUNT: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

/// Counting costs ~100 µs in a small process, more than two 1 GiB moves, so it is not
/// done every few moves (it was every 32: ~3 µs a move).
const RECOUNT_EVERY: usize = 1024;

/// A move is up to three remaps (an exchange), each of which can split the VMA it lands
/// in: at most this many VMAs more per move.
const VMAS_PER_MOVE: usize = 6;

pub(crate) fn mremap_budget_ok() -> bool {
    let worst = |since: usize| VMA_ESTIMATE.load(Ordering::Relaxed) + VMAS_PER_MOVE * (since + 1);
    let since = MREMAPS_SINCE_COUNT.load(Ordering::Relaxed);
    if since >= RECOUNT_EVERY || worst(since) >= vma_budget() / 2 {
        if let Ok(n) = procmap::vma_count() {
            VMA_ESTIMATE.store(n, Ordering::Relaxed);
        }
        MREMAPS_SINCE_COUNT.store(0, Ordering::Relaxed);
    }
    worst(MREMAPS_SINCE_COUNT.load(Ordering::Relaxed)) < vma_budget()
}

/// [`grant::mremap_exchange`] through the process's mremap scratch area.
pub(crate) fn mremap_exchange_via_scratch(mem: &mut Grant<'_>, dst: usize, src: usize, len: usize) -> Result<u32> {
    let mut guard = kernel().remap_scratch.lock().unwrap_or_else(|p| p.into_inner());
    if !guard.as_ref().is_some_and(|m| m.len() >= len) {
        *guard = None; // unmap the smaller one first
                       // Aligned like the moves it serves, so its legs move PUDs where theirs can.
        let align = if len >= PUD_SIZE { PUD_SIZE } else { PMD_SIZE };
        *guard = Some(RwMapping::new(len.div_ceil(align) * align, align, false)?);
    }
    let scratch = guard.as_mut().expect("just created");
    let s = scratch.addr();
    Ok(grant::mremap_exchange(mem, dst, src, &mut scratch.grant(), s, len)?)
}
