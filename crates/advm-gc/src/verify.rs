//! The heap verifier: every object's header is sane, the spaces (and the nursery)
//! parse from bottom to top, the recorded object starts are objects, no mark or forwarding word is left, every pointer (slots
//! and roots, weak ones included) is null or the start of an object of this heap,
//! every pinned object is an old object, and every slot outside the nursery that
//! points into it is in the write barrier's remembered set.

use std::collections::HashSet;

use advm::mem::page_size;

use crate::heap::{large_align, nptrs_of, size_of, Alloc, Inner, Roots, ALIGN, HDR, MARK};

/// Checks the heap with the world stopped; the error names the first broken rule.
/// `compacted`: right after a full collection, when large objects lie one after the
/// other (aligned) except that a pinned one may have free space below it. At other
/// times a large object may also follow free space that a pinned object left, unpinned
/// since.
pub(crate) fn check(inner: &Inner, alloc: &Alloc, roots: &Roots, compacted: bool) -> Result<(), String> {
    let mem = &inner.mem;
    let pins = crate::heap::lock(&inner.pins);
    let mut objects: Vec<usize> = Vec::new();
    for (bottom, top) in [(alloc.small_bottom, alloc.small_top), (mem.nursery.base, alloc.nursery_top)] {
        let mut a = bottom;
        while a < top {
            let h0 = mem.load(a);
            let size = size_of(h0);
            if h0 & MARK != 0 || mem.load(a + 8) != 0 {
                return Err(format!(
                    "small object {:#x} of [{:#x}, {top:#x}): mark or forwarding word left ({h0:#x}, {:#x})",
                    a + HDR,
                    bottom,
                    mem.load(a + 8)
                ));
            }
            // A retired allocation buffer's rest (a filler) may pass the large-object
            // size when the threshold lies below the buffer size; objects never do.
            let most =
                if nptrs_of(h0) == 0 { (inner.large_bytes - 1).max(inner.tlab_bytes) } else { inner.large_bytes - 1 };
            if size < HDR || size % ALIGN != 0 || a + size > top || size > most {
                return Err(format!("small object {:#x}: bad size {size}", a + HDR));
            }
            if HDR + 8 * nptrs_of(h0) > size {
                return Err(format!("small object {:#x}: {} pointers do not fit {size} bytes", a + HDR, nptrs_of(h0)));
            }
            objects.push(a);
            a += size;
        }
    }
    let mut end = mem.large.base;
    for &h in &alloc.large {
        let h0 = mem.load(h);
        let size = size_of(h0);
        let gap_allowed = !compacted || pins.contains_key(&(h + HDR));
        if h < end || (h >= end + large_align(size) && !gap_allowed) {
            return Err(format!("large object {:#x} is not next after the previous one ({end:#x})", h + HDR));
        }
        if h % large_align(size) != 0 || size % page_size() != 0 || size < inner.large_bytes {
            return Err(format!("large object {:#x}: not page aligned or too small ({size})", h + HDR));
        }
        if h0 & MARK != 0 || mem.load(h + 8) != 0 || HDR + 8 * nptrs_of(h0) > size {
            return Err(format!("large object {:#x}: bad header {h0:#x}", h + HDR));
        }
        objects.push(h);
        end = h + size;
    }
    if end != alloc.large_top {
        return Err(format!("large objects end at {end:#x}, the space's top is {:#x}", alloc.large_top));
    }
    let set: HashSet<usize> = objects.iter().map(|h| h + HDR).collect();
    // The next collection cuts the small space into units at these.
    for w in alloc.starts.windows(2) {
        if w[0] >= w[1] {
            return Err(format!("recorded object starts not ascending: {:#x}, {:#x}", w[0], w[1]));
        }
    }
    for &a in &alloc.starts {
        if a < alloc.small_bottom || a >= alloc.small_top || !set.contains(&(a + HDR)) {
            return Err(format!(
                "recorded object start {a:#x} is not an object of the small space [{:#x}, {:#x})",
                alloc.small_bottom, alloc.small_top
            ));
        }
    }
    let valid = |p: usize| p == 0 || set.contains(&p);
    for &h in &objects {
        for i in 0..nptrs_of(mem.load(h)) {
            let p = mem.load(h + HDR + 8 * i);
            if !valid(p) {
                return Err(format!("object {:#x} slot {i} holds {p:#x}, not an object", h + HDR));
            }
            let slot = h + HDR + 8 * i;
            if mem.nursery.contains_object(p) && !mem.nursery.contains(slot) && !inner.remembered.holds(slot) {
                return Err(format!("old object {:#x} slot {i} points into the nursery unremembered", h + HDR));
            }
        }
    }
    for s in roots.stacks.iter().chain(&roots.weak_stacks) {
        for &p in crate::heap::lock(s).iter() {
            if !valid(p) {
                return Err(format!(
                    "a root holds {p:#x}, not an object (small space [{:#x}, {:#x}), nursery [{:#x}, {:#x}), {} large)",
                    alloc.small_bottom,
                    alloc.small_top,
                    mem.nursery.base,
                    alloc.nursery_top,
                    alloc.large.len()
                ));
            }
        }
    }
    for s in roots.slots.iter().chain(&roots.weak_slots) {
        if !valid(s.load()) {
            return Err(format!("root or weak slot {:#x} holds {:#x}, not an object", s.0, s.load()));
        }
    }
    for &p in pins.keys() {
        if !set.contains(&p) || mem.nursery.contains_object(p) {
            return Err(format!("pinned {p:#x} is not an old object"));
        }
    }
    Ok(())
}
