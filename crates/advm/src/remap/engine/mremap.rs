//! The mremap engine's state: the VMA budget it keeps under, and exchanges through
//! the process's mremap scratch area.

use super::*;

/// Estimated VMA count of this process, refreshed every few mremap moves.
pub(crate) static VMA_ESTIMATE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static MREMAPS_SINCE_COUNT: AtomicUsize = AtomicUsize::new(usize::MAX / 2);

pub(crate) fn mremap_budget_ok() -> bool {
    if MREMAPS_SINCE_COUNT.load(Ordering::Relaxed) >= 32 {
        if let Ok(n) = procmap::vma_count() {
            VMA_ESTIMATE.store(n, Ordering::Relaxed);
        }
        MREMAPS_SINCE_COUNT.store(0, Ordering::Relaxed);
    }
    // A move is up to three remaps (an exchange), each of which can split the VMA it
    // lands in.
    let worst = VMA_ESTIMATE.load(Ordering::Relaxed) + 6 * (MREMAPS_SINCE_COUNT.load(Ordering::Relaxed) + 1);
    worst < vma_budget()
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
