//! Virtual copy arena: contents, isolation, sharing, freeing, threads, budget, errors.

use advm::mem::{HostAddr, PageRange};
use advm::vcopy::{Arena, Config, CopyHow};
use proptest::prelude::*;

fn ps() -> usize {
    advm::addr::page_size()
}

fn arena() -> Arena {
    Arena::with_config(Config::default().reserve_bytes(1 << 30)).unwrap()
}

/// `off` bytes past `p`.
fn at(p: HostAddr, off: usize) -> HostAddr {
    p.checked_add(off).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn read(a: &Arena, p: HostAddr, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    a.read(p, &mut v).unwrap();
    v
}

#[test]
fn copy_is_equal_and_isolated_both_ways() {
    let a = arena();
    let len = 16 * ps();
    let src = a.alloc(len).unwrap();
    let data = pattern(len, 1);
    a.write(src, &data).unwrap();
    let dst = a.dup(src, len).unwrap();
    assert_eq!(read(&a, dst, len), data);
    let s = a.stats();
    assert_eq!(s.pages_shared, 16);
    assert_eq!(s.memfd_pages_live, 16, "source and copy share 16 memfd pages");

    // write to the copy: the source does not see it
    a.write(at(dst, 5 * ps() + 7), b"copy").unwrap();
    assert_eq!(read(&a, src, len), data);
    // write to the source: the copy does not see it
    a.write(at(src, 9 * ps()), b"source").unwrap();
    let mut want = data.clone();
    want[5 * ps() + 7..5 * ps() + 11].copy_from_slice(b"copy");
    assert_eq!(read(&a, dst, len), want);
    let mut want_src = data.clone();
    want_src[9 * ps()..9 * ps() + 6].copy_from_slice(b"source");
    assert_eq!(read(&a, src, len), want_src);
    a.free(src).unwrap();
    a.free(dst).unwrap();
    assert_eq!(a.stats().memfd_pages_live, 0);
}

#[test]
fn copy_of_a_modified_copy_shares_its_clean_pages_and_rehomes_written_ones() {
    let a = arena();
    let len = 32 * ps();
    let src = a.alloc(len).unwrap();
    let data = pattern(len, 2);
    a.write(src, &data).unwrap();
    let c1 = a.dup(src, len).unwrap();
    // partial writes to the copy: pages 3 and 4 and 20
    for p in [3, 4, 20] {
        a.write(at(c1, p * ps()), &[0xee; 100]).unwrap();
    }
    let c1_data = read(&a, c1, len);
    let before = a.stats();
    let c2 = a.dup(c1, len).unwrap();
    let after = a.stats();
    assert_eq!(read(&a, c2, len), c1_data);
    assert_eq!(after.pages_rehomed - before.pages_rehomed, 3, "the 3 written pages move into memfd pages once");
    // 32 original pages (still the source's) + 3 re-homed pages, shared by c1 and c2
    assert_eq!(after.memfd_pages_live, 35);
    // copy of the copy is isolated from both
    a.write(c2, b"c2").unwrap();
    a.write(at(c1, 3 * ps()), b"c1").unwrap();
    assert_eq!(read(&a, src, len), data);
    assert_eq!(read(&a, c1, 2), c1_data[..2].to_vec());
    assert_eq!(&read(&a, at(c1, 3 * ps()), 2), b"c1");
    assert_eq!(&read(&a, c2, 2), b"c2");
    assert_eq!(read(&a, at(c2, 3 * ps()), 100), vec![0xee; 100]);
    // copying it a third time re-homes nothing new (c1's page 3 was just rewritten)
    let c3 = a.dup(c2, len).unwrap();
    assert_eq!(a.stats().pages_rehomed - after.pages_rehomed, 1, "only c2's page 0 was written since");
    for p in [src, c1, c2, c3] {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().memfd_pages_live, 0);
}

#[test]
fn free_either_side_first_keeps_the_other_and_frees_pages() {
    for free_source_first in [true, false] {
        let a = arena();
        let len = 8 * ps();
        let src = a.alloc(len).unwrap();
        let data = pattern(len, 3);
        a.write(src, &data).unwrap();
        let dst = a.dup(src, len).unwrap();
        a.write(dst, b"x").unwrap();
        let (first, second) = if free_source_first { (src, dst) } else { (dst, src) };
        a.free(first).unwrap();
        let mut want = data.clone();
        if !free_source_first {
            // dst freed, src left: src never saw the write
        } else {
            want[0] = b'x';
        }
        assert_eq!(read(&a, second, len), want);
        assert_eq!(a.stats().memfd_pages_live, 8, "the survivor still holds all 8 pages");
        a.free(second).unwrap();
        let s = a.stats();
        assert_eq!((s.memfd_pages_live, s.memfd_resident_bytes, s.blocks), (0, 0, 0), "{s:?}");
    }
}

#[test]
fn unaligned_copies_share_congruent_pages_and_copy_the_rest() {
    let a = arena();
    let len = 10 * ps();
    let src = a.alloc(len).unwrap();
    let dst = a.alloc(len).unwrap();
    let data = pattern(len, 4);
    a.write(src, &data).unwrap();
    // same offset in the page: 100 bytes of page 0, pages 1..8 shared, 50 bytes of page 9
    let n = 100 + 8 * ps() + 50;
    let how = a.vcopy(at(dst, ps() - 100), at(src, ps() - 100), n).unwrap();
    assert_eq!(how, CopyHow::Shared { pages: 8, copied_bytes: 150 });
    let got = read(&a, dst, len);
    assert_eq!(&got[ps() - 100..ps() - 100 + n], &data[ps() - 100..ps() - 100 + n]);
    assert_eq!(&got[..ps() - 100], &vec![0; ps() - 100][..], "bytes before the range untouched");
    // different offsets: memcpy, counted
    let how = a.vcopy(at(dst, 1), src, 3 * ps()).unwrap();
    assert_eq!(how, CopyHow::CopiedUnaligned);
    assert_eq!(read(&a, at(dst, 1), 3 * ps()), data[..3 * ps()].to_vec());
    // one page: under the small-block threshold
    assert_eq!(a.vcopy(dst, src, ps()).unwrap(), CopyHow::CopiedSmall);
    let s = a.stats();
    assert_eq!((s.fallback_unaligned, s.fallback_small), (1, 1));
}

#[test]
fn bad_arguments_give_clear_errors() {
    let a = arena();
    let ps = ps();
    let src = a.alloc(4 * ps).unwrap();
    let dst = a.alloc(4 * ps).unwrap();
    let e = PageRange::new("src", src.0, ps + 1).unwrap_err().to_string();
    assert_eq!(e, format!("invalid src: length {} is not a multiple of the {ps}-byte page size", ps + 1));
    let (d, s) = (PageRange::new("dst", dst.0, 2 * ps).unwrap(), PageRange::new("src", src.0, ps).unwrap());
    let e = a.vcopy_pages(d, s).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("invalid dst: {} bytes at {dst} for a source of {ps} bytes: a copy needs equal lengths", 2 * ps)
    );
    let outside = [0u8; 64];
    let e = a.vcopy(dst, HostAddr::of(outside.as_ptr()), 64).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "invalid src: {:#x} is not inside a live block of this arena (advm_alloc/Arena::alloc memory)",
            outside.as_ptr() as usize
        )
    );
    let e = a.vcopy(at(src, ps), src, 2 * ps).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "invalid dst: range {:#x}+{} overlaps src range {:#x}+{}; a copy needs disjoint ranges",
            src.0 + ps,
            2 * ps,
            src.0,
            2 * ps
        )
    );
    let e = a.vcopy(dst, at(src, 2 * ps), 3 * ps).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "invalid src: range {:#x}+{} runs past the end of its block ({:#x}, {} bytes) by {ps} bytes",
            src.0 + 2 * ps,
            3 * ps,
            src.0,
            4 * ps
        )
    );
    let e = a.free(at(src, ps)).unwrap_err().to_string();
    assert_eq!(e, format!("invalid block: {:#x} is inside the block at {:#x}, not at its start", src.0 + ps, src.0));
    assert_eq!(a.alloc(0).unwrap_err().to_string(), "invalid len: 0: a block needs at least one byte");
    a.free(src).unwrap();
    assert!(a.free(src).unwrap_err().to_string().contains("is not inside a live block"), "double free is refused");
}

#[test]
fn vma_budget_falls_back_to_memcpy() {
    // A budget the arena reaches quickly: every other page of a copy is rewritten, so
    // copying it again would need one mapping per page.
    let a = Arena::with_config(Config::default().reserve_bytes(1 << 30).vma_budget(Some(12))).unwrap();
    let len = 16 * ps();
    let src = a.alloc(len).unwrap();
    a.write(src, &pattern(len, 5)).unwrap();
    let c1 = a.dup(src, len).unwrap();
    for p in (0..16).step_by(2) {
        a.write(at(c1, p * ps()), &[p as u8; 8]).unwrap();
    }
    let want = read(&a, c1, len);
    let c2 = a.alloc(len).unwrap();
    let how = a.vcopy(c2, c1, len).unwrap();
    assert_eq!(how, CopyHow::CopiedVmaBudget);
    assert_eq!(read(&a, c2, len), want);
    let s = a.stats();
    assert_eq!(s.fallback_vma_budget, 1);
    assert!(s.vmas <= 12, "{s:?}");
}

#[test]
fn dup_falls_back_to_copying_into_a_fresh_block() {
    // dup builds its block without pages and shares into it; every fallback must
    // still give it real pages: unaligned source, odd length, VMA budget.
    let a = Arena::with_config(Config::default().reserve_bytes(1 << 30).vma_budget(Some(12))).unwrap();
    let len = 16 * ps();
    let src = a.alloc(len).unwrap();
    let data = pattern(len, 7);
    a.write(src, &data).unwrap();
    let d = a.dup(at(src, 3), len - 3).unwrap();
    assert_eq!(read(&a, d, len - 3), data[3..].to_vec());
    let e = a.dup(src, 5 * ps() + 10).unwrap();
    assert_eq!(read(&a, e, 5 * ps() + 10), data[..5 * ps() + 10].to_vec());
    assert_eq!(a.block_len(e).unwrap(), 6 * ps());
    let c1 = a.dup(src, len).unwrap();
    for p in (0..16).step_by(2) {
        a.write(at(c1, p * ps()), &[1]).unwrap();
    }
    let want = read(&a, c1, len);
    let before = a.stats().fallback_vma_budget;
    let c2 = a.dup(c1, len).unwrap();
    assert_eq!(a.stats().fallback_vma_budget, before + 1);
    assert_eq!(read(&a, c2, len), want);
    a.write(c2, b"ok").unwrap();
    for p in [src, d, e, c1, c2] {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().memfd_pages_live, 0);
}

#[test]
fn large_copies_move_old_page_tables_aside_and_reap_them() {
    // 4 MiB blocks: the source's old shared mapping is moved aside (page tables
    // only) and unmapped by the reaper thread; contents and isolation are unchanged.
    // A fork by a test running beside this one makes the arena's pages private (its
    // prepare handler), and copies after it re-home pages instead of moving mappings
    // aside: such a round is run again.
    for _round in 0..5 {
        let a = arena();
        let len = 4 << 20;
        let src = a.alloc(len).unwrap();
        assert_eq!(src.0 % (2 << 20), 0, "large blocks start on 2 MiB");
        let data = pattern(len, 8);
        a.write(src, &data).unwrap();
        let copies: Vec<HostAddr> = (0..3).map(|_| a.dup(src, len).unwrap()).collect();
        a.write(src, b"src").unwrap();
        a.write(copies[1], b"one").unwrap();
        assert_eq!(read(&a, copies[0], len), data);
        assert_eq!(&read(&a, copies[1], 3), b"one");
        assert_eq!(read(&a, copies[2], len), data);
        assert_eq!(&read(&a, src, 3), b"src");
        let t = std::time::Instant::now();
        while a.stats().deferred_pending > 0 && t.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let s = a.stats();
        assert_eq!(s.deferred_pending, 0, "the reaper unmapped every moved-aside mapping: {s:?}");
        for p in copies.into_iter().chain([src]) {
            a.free(p).unwrap();
        }
        assert_eq!(a.stats().memfd_pages_live, 0);
        if s.forks > 0 {
            continue;
        }
        assert!(s.deferred_unmap_ms > 0.0, "the source's old mapping went through the reaper: {s:?}");
        return;
    }
    panic!("a fork beside every round");
}

#[test]
fn threads_copy_and_free_concurrently() {
    let a = arena();
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                for round in 0..25u8 {
                    let len = (2 + (round as usize % 5)) * ps() + 17;
                    let p = a.alloc(len).unwrap();
                    let data = pattern(len, t ^ round);
                    a.write(p, &data).unwrap();
                    let c = a.dup(p, len).unwrap();
                    a.write(c, &[t]).unwrap();
                    let c2 = a.dup(c, len).unwrap();
                    if round % 2 == 0 {
                        a.free(p).unwrap();
                    }
                    let mut want = data.clone();
                    want[0] = t;
                    assert_eq!(read(&a, c2, len), want);
                    a.free(c).unwrap();
                    a.free(c2).unwrap();
                    if round % 2 == 1 {
                        assert_eq!(read(&a, p, len), data);
                        a.free(p).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = a.stats();
    assert_eq!((s.blocks, s.memfd_pages_live, s.memfd_resident_bytes), (0, 0, 0), "{s:?}");
}

#[test]
fn trim_releases_pages_every_sharer_rewrote() {
    let a = arena();
    let len = 16 * ps();
    let src = a.alloc(len).unwrap();
    a.fill(src, 1, len).unwrap();
    let dst = a.dup(src, len).unwrap();
    a.prepare_write(src, len).unwrap();
    a.prepare_write(dst, 8 * ps()).unwrap(); // dst rewrites only its first half
    let before = a.stats().memfd_resident_bytes;
    assert_eq!(before, len as u64, "the shared pages are still held");
    assert_eq!(a.trim().unwrap(), 8, "pages 0..8 are rewritten by both sides");
    assert_eq!(a.stats().memfd_resident_bytes, 8 * ps() as u64);
    assert_eq!(read(&a, dst, len), vec![1; len]);
    assert_eq!(read(&a, src, len), vec![1; len]);
    // a later copy of the trimmed block still works (its written pages are re-homed)
    let c = a.dup(dst, len).unwrap();
    assert_eq!(read(&a, c, len), vec![1; len]);
    for p in [src, dst, c] {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().memfd_resident_bytes, 0);
}

#[test]
fn prepare_write_breaks_sharing_without_changing_contents() {
    let a = arena();
    let len = 8 * ps();
    let src = a.alloc(len).unwrap();
    let data = pattern(len, 6);
    a.write(src, &data).unwrap();
    let c = a.dup(src, len).unwrap();
    a.prepare_write(c, len).unwrap();
    assert_eq!(read(&a, c, len), data);
    a.write(c, b"z").unwrap();
    assert_eq!(read(&a, src, len), data);
}

#[test]
fn calibration_reports_a_crossover() {
    let a = arena();
    let c = a.calibrate(256).unwrap();
    assert!(c.memcpy_ns_per_page > 0.0 && c.cow_write_ns_per_page > 0.0, "{c:?}");
    assert_eq!(a.stats().crossover_write_fraction, Some(c.crossover_write_fraction));
    assert_eq!(a.stats().blocks, 0);
}

#[derive(Debug, Clone)]
enum Op {
    Write { block: usize, page: usize, byte: u8 },
    Copy { dst: usize, src: usize, page: usize, pages: usize, shift: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..6usize, any::<u8>()).prop_map(|(block, page, byte)| Op::Write { block, page, byte }),
        (0..3usize, 0..3usize, 0..6usize, 0..7usize, 0..3usize).prop_map(|(dst, src, page, pages, shift)| Op::Copy {
            dst,
            src,
            page,
            pages,
            shift
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Against byte-array models: any sequence of writes and (partial, offset) copies
    /// leaves every block equal to its model, and freeing everything frees all pages.
    #[test]
    fn matches_byte_array_model(ops in proptest::collection::vec(op(), 1..25)) {
        let a = arena();
        let ps = ps();
        let len = 6 * ps;
        let blocks: Vec<HostAddr> = (0..3).map(|_| a.alloc(len).unwrap()).collect();
        let mut model = vec![vec![0u8; len]; 3];
        for op in ops {
            match op {
                Op::Write { block, page, byte } => {
                    a.fill(at(blocks[block], page * ps + 3), byte, 9).unwrap();
                    model[block][page * ps + 3..page * ps + 12].fill(byte);
                }
                Op::Copy { dst, src, page, pages, shift } => {
                    if dst == src { continue; }
                    let off = page * ps + shift * 1000;
                    let n = (pages * ps).min(len - off);
                    a.vcopy(at(blocks[dst], off), at(blocks[src], off), n).unwrap();
                    let from = model[src][off..off + n].to_vec();
                    model[dst][off..off + n].copy_from_slice(&from);
                }
            }
        }
        for b in 0..3 {
            prop_assert_eq!(read(&a, blocks[b], len), model[b].clone());
        }
        for b in blocks { a.free(b).unwrap(); }
        let s = a.stats();
        prop_assert_eq!((s.memfd_pages_live, s.memfd_resident_bytes), (0, 0));
    }
}

/// Sizes that cannot fit are out of memory (ENOMEM in C), naming the limit; before,
/// they were invalid arguments (EINVAL).
#[test]
fn alloc_sizes_that_cannot_fit_are_out_of_memory() {
    let a = arena(); // 1 GiB reservation
    for len in [usize::MAX, usize::MAX - 4095, usize::MAX - ps() + 1, (1 << 30) + 1, 1 << 40] {
        match a.alloc(len) {
            Err(advm::Error::OutOfMemory { why, .. }) => {
                assert!(why.contains(&len.to_string()), "{len}: the message names the size: {why}")
            }
            other => panic!("alloc({len}): {other:?}, want OutOfMemory"),
        }
    }
    let e = a.alloc(2 << 30).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "out of memory: an arena block: {} bytes do not fit in the free space of the arena's {}-byte reservation",
            2u64 << 30,
            1u64 << 30
        )
    );
    // the whole reservation still fits
    let all = a.alloc(1 << 30).unwrap();
    a.free(all).unwrap();
}

/// A panic inside the arena (a bug, injected here) leaves its state possibly half
/// updated: every later call refuses with `Error::Unrecoverable` instead of running on
/// it. Before, the poisoned lock was ignored and later calls went on.
#[test]
fn a_panic_inside_the_arena_makes_it_refuse_further_work() {
    let a = arena();
    let len = 8 * ps();
    let src = a.alloc(len).unwrap();
    a.fill(src, 7, len).unwrap();
    let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.test_inject_panic()));
    assert!(hit.is_err(), "the hook panics");
    let unrecoverable = |r: advm::Result<()>, call: &str| match r {
        Err(e @ advm::Error::Unrecoverable { .. }) => {
            assert!(e.to_string().starts_with("the advm arena is unusable: an earlier call panicked"), "{e}")
        }
        other => panic!("{call} after a panic: {other:?}, want Unrecoverable"),
    };
    unrecoverable(a.alloc(len).map(drop), "alloc");
    unrecoverable(a.dup(src, len).map(drop), "dup");
    unrecoverable(a.vcopy(at(src, 4 * ps()), src, 4 * ps()).map(drop), "vcopy");
    unrecoverable(a.fill(src, 1, 1), "fill");
    unrecoverable(a.read(src, &mut [0u8; 4]), "read");
    unrecoverable(a.free(src), "free");
    unrecoverable(a.trim().map(drop), "trim");
    unrecoverable(a.try_stats().map(drop), "try_stats");
    assert!(!a.contains(src));
    // the counters stay readable, and the block's bytes stay mapped
    assert_eq!(a.stats().blocks, 1);
    // SAFETY: the block is still mapped (the arena never freed it).
    assert_eq!(unsafe { *src.as_ptr().add(len - 1) }, 7);
}

/// `touches` answers "does this range reach a live block" from the block table: the
/// C API's remap asks it instead of scanning /proc/self/maps.
#[test]
fn touches_is_true_exactly_for_ranges_reaching_a_live_block() {
    let a = arena();
    let ps = ps();
    let gap = a.alloc(ps).unwrap(); // keeps a free page before `b` once freed
    let b = a.alloc(3 * ps).unwrap();
    let after = a.alloc(ps).unwrap();
    a.free(gap).unwrap();
    a.free(after).unwrap();
    assert!(a.touches(b, 1) && a.touches(at(b, 3 * ps - 1), 1));
    assert!(a.touches(HostAddr(b.0 - ps), ps + 1), "a range ending in the block's first byte");
    assert!(a.touches(HostAddr(b.0 - ps), 10 * ps), "a range covering the whole block");
    assert!(!a.touches(HostAddr(b.0 - ps), ps), "the free page before the block");
    assert!(!a.touches(at(b, 3 * ps), ps), "the free page after the block");
    assert!(!a.touches(b, 0), "an empty range");
    assert!(!a.touches(HostAddr(usize::MAX - 8), 100), "a wrapping range");
    let outside = [0u8; 64];
    assert!(!a.touches(HostAddr::of(outside.as_ptr()), 64));
    a.free(b).unwrap();
    assert!(!a.touches(b, 3 * ps), "a freed block");
}

/// Bytes of private (copied-on-write) pages mapped in `[start, start+len)`, from
/// /proc/self/smaps: a block's own copies, which the memfd does not hold.
fn anonymous_bytes(start: HostAddr, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut inside, mut total) = (false, 0);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = head.split_once('-').filter(|_| !head.ends_with(':')) {
            let (s, e) = (usize::from_str_radix(s, 16).unwrap(), usize::from_str_radix(e, 16).unwrap());
            assert!(
                e <= start.0 || s >= start.0 + len || (s >= start.0 && e <= start.0 + len),
                "blocks are whole VMAs"
            );
            inside = s >= start.0 && e <= start.0 + len;
        } else if let Some(kb) = line.strip_prefix("Anonymous:").filter(|_| inside) {
            total += kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024;
        }
    }
    total
}

/// Memory release (issue 13): the memfd pages under a copy are punched as soon as
/// both views are freed, whichever goes first; and a copy whose source is freed
/// right after holds its pages once (the memfd pages, no private copy besides).
#[test]
fn memfd_pages_under_a_copy_are_released_with_its_last_view() {
    let len = 64 * ps();
    for free_source_first in [true, false] {
        let a = arena();
        let src = a.alloc(len).unwrap();
        a.fill(src, 0x11, len).unwrap();
        let dst = a.dup(src, len).unwrap();
        assert_eq!(a.stats().memfd_resident_bytes, len as u64, "one copy in the memfd, shared by both");
        let (first, second) = if free_source_first { (src, dst) } else { (dst, src) };
        a.free(first).unwrap();
        let held = a.stats().memfd_resident_bytes + anonymous_bytes(second, len);
        assert_eq!(held, len as u64, "the survivor holds one copy (free source first: {free_source_first})");
        assert_eq!(read(&a, second, len), vec![0x11; len]);
        a.free(second).unwrap();
        assert_eq!(a.stats().memfd_resident_bytes, 0, "no view left: the memfd holds nothing");
    }
}

/// `b = dup(a); free(a)`, then every byte of `b` rewritten: returns the bytes held
/// (memfd plus `b`'s private pages), whether `b` reads back right, whether a second
/// copy of `b` is isolated from it both ways, and the pages `free(a)` adopted.
fn rewrite_survivor(a: &Arena, len: usize) -> (u64, bool, bool, u64) {
    let src = a.alloc(len).unwrap();
    a.fill(src, 0x11, len).unwrap();
    let b = a.dup(src, len).unwrap();
    a.free(src).unwrap();
    let adopted = a.stats().pages_adopted;
    let want = pattern(len, 3);
    a.write(b, &want).unwrap();
    let held = a.stats().memfd_resident_bytes + anonymous_bytes(b, len);
    let right = read(a, b, len) == want;
    let c = a.dup(b, len).unwrap();
    a.fill(c, 0x22, ps()).unwrap();
    a.fill(at(b, len - ps()), 0x33, ps()).unwrap();
    let (rb, rc) = (read(a, b, len), read(a, c, len));
    let isolated = rb[..ps()] == want[..ps()]
        && rb[len - ps()..].iter().all(|&x| x == 0x33)
        && rc[..ps()].iter().all(|&x| x == 0x22)
        && rc[ps()..] == want[ps()..];
    a.free(c).unwrap();
    a.free(b).unwrap();
    (held, right, isolated, adopted)
}

/// Issue 13: a copy whose source is freed right after becomes its pages' one home
/// (remapped shared), so rewriting it all holds one copy, not memfd plus private
/// pages. Only while no other thread could write it (see `adopt`): in a forked
/// child (one thread); beside a live thread it stays private, still correct.
#[test]
fn survivor_of_a_freed_source_holds_its_pages_once_when_rewritten() {
    let len = 4 << 20;
    // SAFETY: fork; the child only uses its own arena and leaves by _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let a = arena();
            let (held, right, isolated, adopted) = rewrite_survivor(&a, len);
            match (held == len as u64, right, isolated, adopted == (len / ps()) as u64) {
                (true, true, true, true) => 0,
                (false, ..) => 2,
                (_, false, ..) => 3,
                (_, _, false, _) => 4,
                _ => 5,
            }
        })
        .unwrap_or(1);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status}");
    let why = ["", "panicked", "held two copies", "wrong contents", "copies not isolated", "pages not adopted"];
    assert_eq!(libc::WEXITSTATUS(status), 0, "child: {}", why[libc::WEXITSTATUS(status).min(5) as usize]);

    // another thread alive: left private, contents and isolation still right
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || stop_rx.recv());
    let a = arena();
    let (_, right, isolated, adopted) = rewrite_survivor(&a, len);
    stop_tx.send(()).unwrap();
    other.join().unwrap().unwrap();
    assert!(right && isolated);
    assert_eq!(adopted, 0, "another thread could have written the survivor");
}
