//! The engines behind a plan's steps: process-wide kernel resources (the userfaultfd,
//! scratch areas), what kind of memory a range is, and [`run_step`], which hands a
//! step to UFFDIO_MOVE ([`uffd`]), mremap ([`mremap`]) or memmove.

use super::*;

mod mremap;
mod uffd;

pub(crate) use mremap::*;
pub(crate) use uffd::*;

/// Process-wide kernel resources: one userfaultfd for UFFDIO_MOVE and a registered
/// scratch area for swaps.
pub(crate) struct Kernel {
    pub(crate) uffd: Option<Userfaultfd>,
    /// The fork generation of the process that opened `uffd`.
    pub(crate) fork_generation: u64,
    pub(crate) scratch: Mutex<Option<RwMapping>>,
    /// 2 MiB-aligned scratch address space for mremap exchanges (grown on demand).
    pub(crate) remap_scratch: Mutex<Option<RwMapping>>,
}

/// Bytes of scratch used per swap step (swaps of more are done in steps).
pub(crate) const SCRATCH_LEN: usize = 16 << 20;

/// The process's kernel resources, once made with the userfaultfd the kernel offers.
static KERNEL: Lazy<Kernel> = Lazy::new();

pub(crate) fn kernel() -> &'static Kernel {
    // Made twice when threads race on the first use: the loser's userfaultfd is closed
    // with it, nothing else changes. Made while the process is out of fds or memory
    // (EMFILE, ENFILE, ENOMEM opening the userfaultfd), it is not kept: those calls get
    // one without a userfaultfd and the next call tries again; kept, the process would
    // have done without UFFDIO_MOVE for its life after one moment without fds.
    static OUT_OF_FDS: Lazy<Kernel> = Lazy::new();
    if let Some(k) = KERNEL.get() {
        return k;
    }
    match make_kernel() {
        Ok(k) => KERNEL.get_or_init(|| k),
        Err(without) => OUT_OF_FDS.get_or_init(|| without),
    }
}

/// Whether [`kernel`] is the settled one (not a stand-in made while out of fds).
pub(crate) fn kernel_settled() -> bool {
    kernel();
    KERNEL.get().is_some()
}

/// The kernel resources, or (`Err`) ones without a userfaultfd when opening it failed
/// for want of fds or memory.
fn make_kernel() -> std::result::Result<Kernel, Kernel> {
    let want = feature::MOVE | feature::PAGEFAULT_FLAG_WP;
    // Without the fork handler a child could not tell it is one: no userfaultfd.
    let generation = crate::sys::process::fork_generation();
    let uffd = match Userfaultfd::probe() {
        // The user-mode-only kind serves: ranges are registered for UFFDIO_MOVE only and
        // never write-protected (`Grant::register_for_move`), so no fault ever waits for it.
        Ok(i) if i.features & want == want && generation.is_some() => {
            Userfaultfd::new_user_mode_only_ok(want, true).map(Some)
        }
        Ok(_) => Ok(None),
        Err(e) => Err(e),
    };
    let (uffd, settled) = match uffd {
        Ok(u) => (u, true),
        Err(e) => (None, !e.is_out_of_resources()),
    };
    let k = Kernel {
        uffd,
        fork_generation: generation.unwrap_or(0),
        scratch: Mutex::new(None),
        remap_scratch: Mutex::new(None),
    };
    if settled {
        Ok(k)
    } else {
        Err(k)
    }
}

/// The process's userfaultfd, unless this is a forked child of the process that
/// opened it: the child inherits the fd, but its ioctls would act on the parent's
/// memory.
pub(crate) fn uffd() -> Option<&'static Userfaultfd> {
    let k = kernel();
    k.uffd.as_ref().filter(|_| crate::sys::process::fork_generation() == Some(k.fork_generation))
}

/// What kind of memory a range is, as far as engines care (ordered: a range of mixed
/// kinds is treated as its most restrictive part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    AnonPrivate,
    FilePrivate,
    Shared,
}

pub(crate) fn class_of(v: &Vma) -> Class {
    if v.shared {
        Class::Shared
    } else if v.file_backed {
        Class::FilePrivate
    } else {
        Class::AnonPrivate
    }
}

/// Checks that `[s, s+len)` is mapped read-write and returns its class.
pub(crate) fn check_mapped(
    what: &'static str,
    s: usize,
    len: usize,
    known: Known,
    seen: &mut Vec<Vma>,
) -> Result<Class> {
    if known == Known::PrivateAnonRw {
        return Ok(Class::AnonPrivate);
    }
    let e = s + len;
    let mut at = s;
    let mut class = Class::AnonPrivate;
    while at < e {
        let v = match seen.iter().find(|v| v.start <= at && at < v.end) {
            Some(v) => *v,
            None => {
                let v = procmap::query(at)?.ok_or_else(|| Error::InvalidArgument {
                    what,
                    why: format!("range {s:#x}+{len:#x}: address {at:#x} is not mapped"),
                })?;
                seen.push(v);
                v
            }
        };
        if !v.readable || !v.writable {
            return Err(Error::InvalidArgument {
                what,
                why: format!(
                    "range {s:#x}+{len:#x}: mapping {:#x}-{:#x} is {}, not read-write",
                    v.start,
                    v.end,
                    v.perms()
                ),
            });
        }
        class = class.max(class_of(&v));
        at = v.end;
    }
    Ok(class)
}

pub(crate) fn run_step(
    k: Option<&Userfaultfd>,
    mem: &mut Grant<'_>,
    st: &Step,
    dst_state: DstState,
    out: &mut Outcome,
) -> Result<()> {
    let Op { kind, x, y, len, .. } = st.op;
    let need = || k.expect("uffd engine chosen only when available");
    match (kind, st.engine) {
        (Kind::Move, Engine::Memmove) => {
            mem.memmove(x, y, len)?;
            out.memmove_bytes += len;
        }
        (Kind::Swap, Engine::Memmove) => {
            mem.swap_bytes(x, y, len)?;
            out.memmove_bytes += len;
        }
        (Kind::Move, Engine::Mremap) => {
            // Into a destination holding pages (sampled: its first page resident),
            // private anonymous memory is exchanged: freeing a populated range costs
            // about as much as copying it. Else one remap; a file-backed view's vacated
            // source gets fresh anonymous memory (else it would show the file's bytes
            // again).
            let anon = st.class == Class::AnonPrivate && grant::dontunmap_fixed_available();
            let populated = anon && mem.page_resident(x)?;
            // Only ranges inside one VMA each. Kernels from 6.17 move a range that spans
            // several VMAs one VMA at a time, and a DONTUNMAP remap out of such a range
            // lost the pages of its first VMA here (the property test's saved case: a
            // move out of a range that an earlier move had made a VMA of its own). A
            // plain move replaces whatever maps the destination, so only its source
            // must be one VMA; an exchange also moves the destination away.
            let one_vma = match st.one_vma_each {
                Some(one) => one,
                None if populated => !crosses_vmas(x, y, len),
                None => vma_room(y) >= len,
            };
            let refused = if !one_vma {
                true
            } else {
                let r = match populated.then(|| mremap_exchange_via_scratch(mem, x, y, len)) {
                    // No scratch area (out of address space; the exchange's own calls
                    // are `mremap`): a plain move still works.
                    Some(Err(Error::Sys(e))) if e.call != "mremap" => mem
                        .mremap_move(x, y, len, Prot::READ | Prot::WRITE, st.class != Class::AnonPrivate)
                        .map_err(Error::from),
                    None => mem
                        .mremap_move(x, y, len, Prot::READ | Prot::WRITE, st.class != Class::AnonPrivate)
                        .map_err(Error::from),
                    Some(r) => r,
                };
                match r {
                    Ok(calls) => {
                        out.syscalls += calls;
                        out.mremap_bytes += len;
                        MREMAPS_SINCE_COUNT.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                    Err(Error::Sys(e)) if e.call == "mremap" => {
                        out.syscalls += 1;
                        true
                    }
                    Err(e) => return Err(e),
                }
            };
            if refused {
                // Refused before anything moved: fall back to moving entries, or copying.
                if let Some(k) = k {
                    move_or_copy(k, mem, x, y, len, DstState::Unknown { copy_below: 0 }, out)?;
                } else {
                    mem.memmove(x, y, len)?;
                    out.memmove_bytes += len;
                    out.fallback_bytes += len;
                }
            }
        }
        (Kind::Move, Engine::UffdMove) => {
            if slides_up_via_scratch(&st.op) {
                // Sliding up by a small δ: through the scratch area.
                slide_up_via_scratch(need(), mem, x, y, len, dst_state, out)?;
            } else if x > y && x < y + len {
                // Sliding up by δ: chunks of δ from the end, each into the space the
                // previous chunk vacated.
                let delta = x - y;
                let mut end = len;
                while end > 0 {
                    let start = end.saturating_sub(delta);
                    move_or_copy(need(), mem, x + start, y + start, end - start, dst_state, out)?;
                    end = start;
                }
            } else {
                // Disjoint, or sliding down: one forward pass; each destination page
                // is empty by the time the pass reaches it.
                move_or_copy(need(), mem, x, y, len, dst_state, out)?;
            }
        }
        (Kind::Swap, Engine::UffdMove) => swap_via_scratch(need(), mem, x, y, len, out)?,
        (Kind::Swap, Engine::Mremap) => unreachable!("choose() never picks mremap for a swap"),
    }
    Ok(())
}

/// Where the source of a move lies.
pub(crate) enum Src<'s, 'a> {
    /// In the same grant as the destination.
    Same,
    /// In another grant (the scratch area).
    Other(&'s mut Grant<'a>),
}

pub(crate) fn uffd_once(
    k: &Userfaultfd,
    dst_g: &mut Grant<'_>,
    src: &mut Src<'_, '_>,
    dst: usize,
    s: usize,
    n: usize,
    holes: bool,
) -> Result<usize, Partial> {
    match src {
        Src::Same => dst_g.uffd_move(k, dst, s, n, holes),
        Src::Other(g) => grant::uffd_move_across(k, dst_g, dst, g, s, n, holes),
    }
}

/// What is known about a move's destination before the first UFFDIO_MOVE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DstState {
    /// Emptied (or vacated) by the planner.
    Empty,
    /// Not known: try moving without emptying it (free when it is empty, as when it was
    /// vacated by an earlier move); if it holds pages, copy instead when the move is
    /// shorter than `copy_below` pages, else empty it and move.
    Unknown { copy_below: usize },
}

/// Bytes from `addr` to the end of its VMA (0 when unmapped).
pub(crate) fn vma_room(addr: usize) -> usize {
    match procmap::query(addr) {
        Ok(Some(v)) => v.end - addr,
        _ => 0,
    }
}

/// True when `[dst, dst+n)` or `[src, src+n)` spans more than one VMA.
pub(crate) fn crosses_vmas(dst: usize, src: usize, n: usize) -> bool {
    let (a, b) = (vma_room(dst), vma_room(src));
    a > 0 && b > 0 && (a < n || b < n)
}
