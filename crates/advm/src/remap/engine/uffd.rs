//! The UFFDIO_MOVE engine: entry moves that finish by copying what the kernel refuses,
//! and swaps and upward slides through the process's scratch area.

use super::*;

/// Registers the mapping around `dst` for UFFDIO_MOVE (whole VMA, so it is not split).
pub(crate) fn register_around(k: &Userfaultfd, mem: &mut Grant<'_>, dst: usize, len: usize, out: &mut Outcome) -> bool {
    let (s, e) = if mem.known() == Known::PrivateAnonRw {
        (mem.start(), mem.end())
    } else {
        match procmap::query(dst) {
            Ok(Some(v)) => (v.start, v.end.max(dst + len)),
            _ => return false,
        }
    };
    out.syscalls += 1;
    mem.register_for_move(k, s, e - s).is_ok()
}

/// The parts of `ranges` (start, end) in private anonymous mappings, as (start, len):
/// the only ones emptying makes read as zeros (a private file view would show the
/// file's bytes again, which are neither the old bytes nor zeros).
fn anonymous_parts(ranges: Vec<(usize, usize)>, known: Known) -> Vec<(usize, usize)> {
    if known == Known::PrivateAnonRw {
        return ranges.into_iter().map(|(a, e)| (a, e - a)).collect();
    }
    let mut out = Vec::new();
    for (mut at, e) in ranges {
        while at < e {
            let Ok(Some(v)) = procmap::query(at) else { break };
            let end = v.end.min(e);
            if class_of(&v) == Class::AnonPrivate {
                out.push((at, end - at));
            }
            at = end;
        }
    }
    out
}

/// Moves page-table entries `dst <- src`, finishing by copying whatever the kernel
/// refuses, and emptying the copied source so it reads like a moved one.
// The one planner primitive: every argument is a separate fact about the move.
#[allow(clippy::too_many_arguments)]
pub(crate) fn move_or_copy_from(
    k: &Userfaultfd,
    dst_g: &mut Grant<'_>,
    mut src: Src<'_, '_>,
    dst: usize,
    s: usize,
    n: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let mut done = 0;
    let mut retries = 0;
    // Holes in the source may be skipped only over an empty destination.
    let mut holes = state == DstState::Empty;
    let same = matches!(src, Src::Same);
    // The not-yet-moved destination minus the not-yet-moved source (a slide's overlap
    // must not be emptied), as (start, len) for zap.
    let dst_rest = |done: usize| -> Vec<(usize, usize)> {
        let mut own = IntervalSet::default();
        if same {
            own.insert(s + done, s + n);
        }
        own.subtract_from(dst + done, dst + n).into_iter().map(|(a, e)| (a, e - a)).collect()
    };
    // UFFDIO_MOVE wants each range inside one VMA; after mremap moves split a region,
    // a move may have to be cut at VMA boundaries.
    let mut split = false;
    let mut registered_at = None;
    while done < n {
        let step =
            if split { vma_room(dst + done).min(vma_room(s + done)).min(n - done).max(page_size()) } else { n - done };
        out.syscalls += 1;
        match uffd_once(k, dst_g, &mut src, dst + done, s + done, step, holes) {
            Ok(m) => {
                out.uffd_move_bytes += m.min(step);
                done += step;
            }
            Err(Partial { done: d, error }) => {
                out.uffd_move_bytes += d;
                done += d;
                match error.errno {
                    Errno::AGAIN if retries < 16 => retries += 1,
                    // The destination holds pages. Untouched and short: copying is
                    // cheaper than freeing them. Otherwise (or when a concurrent reader
                    // faulted a page back in) empty it and retry.
                    Errno::EXIST | Errno::NOENT if retries < 16 => {
                        if let DstState::Unknown { copy_below } = state {
                            if done == 0 && error.errno == Errno::EXIST && n / page_size() < copy_below {
                                match &mut src {
                                    Src::Same => dst_g.memmove(dst, s, n)?,
                                    Src::Other(g) => grant::copy_across(dst_g, dst, g, s, n)?,
                                }
                                out.memmove_bytes += n;
                                return Ok(());
                            }
                        }
                        retries += 1;
                        let rest = dst_rest(done);
                        if !rest.is_empty() {
                            out.syscalls += dst_g.zap(&rest)?;
                        }
                        holes = true;
                    }
                    // The move spans several VMAs (cut it at their boundaries), or the
                    // destination's mapping is not registered yet (register it): retry.
                    // Refused again right after registering there, it is a mapping
                    // UFFDIO_MOVE refuses (one end mlocked, the other not): copy, not
                    // 15 more registrations and retries.
                    Errno::INVAL
                        if retries < 16
                            && if !split && crosses_vmas(dst + done, s + done, n - done) {
                                split = true;
                                true
                            } else if registered_at != Some(done) {
                                registered_at = Some(done);
                                register_around(k, dst_g, dst + done, n - done, out)
                            } else {
                                false
                            } =>
                    {
                        retries += 1
                    }
                    _ => {
                        let rest = n - done;
                        match &mut src {
                            Src::Same => dst_g.memmove(dst + done, s + done, rest)?,
                            Src::Other(g) => grant::copy_across(dst_g, dst + done, g, s + done, rest)?,
                        }
                        out.memmove_bytes += rest;
                        out.fallback_bytes += rest;
                        // Empty the copied source (not where it overlaps the destination).
                        let mut d = IntervalSet::default();
                        d.insert(dst, dst + n);
                        let (zap, known) = match &src {
                            Src::Same => (d.subtract_from(s + done, s + n), dst_g.known()),
                            Src::Other(g) => (vec![(s + done, s + n)], g.known()),
                        };
                        let zap = anonymous_parts(zap, known);
                        if !zap.is_empty() {
                            out.syscalls += match &mut src {
                                Src::Same => dst_g.zap(&zap)?,
                                Src::Other(g) => g.zap(&zap)?,
                            };
                        }
                        done = n;
                    }
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn move_or_copy(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    dst: usize,
    src: usize,
    n: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    move_or_copy_from(k, mem, Src::Same, dst, src, n, state, out)
}

/// Moves `dst <- src` where dst is in the scratch grant.
pub(crate) fn move_into_scratch(
    k: &Userfaultfd,
    sg: &mut Grant<'_>,
    sdst: usize,
    mem: &mut Grant<'_>,
    src: usize,
    n: usize,
    out: &mut Outcome,
) -> Result<()> {
    move_or_copy_from(k, sg, Src::Other(mem), sdst, src, n, DstState::Empty, out)
}

/// A new scratch area for UFFDIO_MOVE, registered.
pub(crate) fn make_uffd_scratch(k: &Userfaultfd, out: &mut Outcome) -> Result<RwMapping> {
    let mut m = RwMapping::new(SCRATCH_LEN, PMD_SIZE, false)?;
    let (s, l) = (m.addr(), m.len());
    m.grant().register_for_move(k, s, l)?;
    out.syscalls += 1;
    Ok(m)
}

/// Makes the process's UFFDIO_MOVE scratch area now (it is kept for the process's
/// life), so that a batch needing it cannot fail for want of it after changing memory.
pub(crate) fn uffd_scratch_ready(k: &Userfaultfd, out: &mut Outcome) -> Result<()> {
    let mut guard = kernel().scratch.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Some(make_uffd_scratch(k, out)?);
    }
    Ok(())
}

/// Runs `f` with the process's UFFDIO_MOVE scratch area (empty, registered).
pub(crate) fn with_uffd_scratch<T>(
    k: &Userfaultfd,
    out: &mut Outcome,
    f: impl FnOnce(&mut Grant<'_>, usize, &mut Outcome) -> Result<T>,
) -> Result<T> {
    let mut guard = kernel().scratch.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Some(make_uffd_scratch(k, out)?);
    }
    let scratch = guard.as_mut().expect("just created");
    let sbase = scratch.addr();
    let before = out.fallback_bytes;
    let r = f(&mut scratch.grant(), sbase, out);
    if out.fallback_bytes != before {
        // A copy left pages in the scratch area: empty it for the next user.
        out.syscalls += scratch.grant().zap(&[(sbase, SCRATCH_LEN)])?;
    }
    r
}

/// Swap with three entry moves through the scratch area: a -> scratch, b -> a,
/// scratch -> b.
pub(crate) fn swap_via_scratch(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    a: usize,
    b: usize,
    len: usize,
    out: &mut Outcome,
) -> Result<()> {
    let (u0, c0, f0) = (out.uffd_move_bytes, out.memmove_bytes, out.fallback_bytes);
    with_uffd_scratch(k, out, |sg, sbase, out| {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(SCRATCH_LEN);
            move_into_scratch(k, sg, sbase, mem, a + off, n, out)?;
            move_or_copy(k, mem, a + off, b + off, n, DstState::Empty, out)?;
            move_or_copy_from(k, mem, Src::Other(sg), b + off, sbase, n, DstState::Empty, out)?;
            off += n;
        }
        Ok(())
    })?;
    // Each swapped byte took three entry moves (or copies); report bytes swapped.
    out.uffd_move_bytes = u0 + (out.uffd_move_bytes - u0) / 3;
    out.memmove_bytes = c0 + (out.memmove_bytes - c0) / 3;
    out.fallback_bytes = f0 + (out.fallback_bytes - f0) / 3;
    Ok(())
}

/// Slides `[src, src+len)` up by δ = dst - src (< len) through the scratch area, top
/// chunk first: each chunk moves to scratch, then to its destination, whose lowest part
/// it just vacated and whose top δ pages the previous chunk vacated (or were emptied).
/// Two calls per 16 MiB and 2n entry moves, instead of n/δ calls.
pub(crate) fn slide_up_via_scratch(
    k: &Userfaultfd,
    mem: &mut Grant<'_>,
    dst: usize,
    src: usize,
    len: usize,
    state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let (u0, c0, f0) = (out.uffd_move_bytes, out.memmove_bytes, out.fallback_bytes);
    let delta = dst - src;
    // The part of the destination above the source: empty it first, unless known empty.
    if state != DstState::Empty {
        out.syscalls += mem.zap(&[(src + len, delta)])?;
    }
    with_uffd_scratch(k, out, |sg, sbase, out| {
        let mut end = len;
        while end > 0 {
            let start = end.saturating_sub(SCRATCH_LEN);
            let n = end - start;
            move_into_scratch(k, sg, sbase, mem, src + start, n, out)?;
            move_or_copy_from(k, mem, Src::Other(sg), dst + start, sbase, n, DstState::Empty, out)?;
            end = start;
        }
        Ok(())
    })?;
    // Each byte took two entry moves (or copies).
    out.uffd_move_bytes = u0 + (out.uffd_move_bytes - u0) / 2;
    out.memmove_bytes = c0 + (out.memmove_bytes - c0) / 2;
    out.fallback_bytes = f0 + (out.fallback_bytes - f0) / 2;
    Ok(())
}
