use super::*;
use crate::mem::Region;
use proptest::prelude::*;

fn ps() -> usize {
    page_size()
}

/// Fills page i of the region with tag(i) and returns the oracle (one tag per page).
fn tag_pages(r: &mut Region) -> Vec<Option<u8>> {
    let ps = ps();
    let n = r.len() / ps;
    let b = r.bytes_mut();
    let mut model = Vec::with_capacity(n);
    for i in 0..n {
        let t = (i % 251) as u8 + 1;
        b[i * ps..(i + 1) * ps].fill(t);
        model.push(Some(t));
    }
    model
}

/// Every page the oracle knows holds its tag in every byte.
fn check(r: &Region, model: &[Option<u8>]) -> std::result::Result<(), String> {
    let ps = ps();
    for (i, want) in model.iter().enumerate() {
        if let Some(t) = want {
            let page = &r.bytes()[i * ps..(i + 1) * ps];
            if let Some(pos) = page.iter().position(|b| b != t) {
                return Err(format!("page {i} byte {pos}: {} != {t}", page[pos]));
            }
        }
    }
    Ok(())
}

fn oracle_move(model: &mut [Option<u8>], dst: usize, src: usize, n: usize) {
    let moved: Vec<_> = model[src..src + n].to_vec();
    // Vacated bytes are unspecified.
    model[src..src + n].fill(None);
    model[dst..dst + n].copy_from_slice(&moved);
}

fn oracle_swap(model: &mut [Option<u8>], a: usize, b: usize, n: usize) {
    for i in 0..n {
        model.swap(a + i, b + i);
    }
}

fn engine_options(sel: u8, be: usize) -> Options {
    let engine = match sel % 4 {
        0 => Choice::Auto,
        1 => Choice::Only(Engine::UffdMove),
        2 => Choice::Only(Engine::Memmove),
        _ => Choice::Only(Engine::Mremap),
    };
    Options { engine, break_even_pages: Some(be), coalesce: true }
}

const PAGES: usize = 48;

#[derive(Debug, Clone)]
enum TOp {
    Move { dst: usize, src: usize, n: usize },
    Swap { a: usize, b: usize, n: usize },
}

fn op_strategy() -> impl Strategy<Value = TOp> {
    prop_oneof![
        (1usize..20, 0usize..PAGES, 0usize..PAGES).prop_map(|(n, d, s)| {
            let n = n.min(PAGES);
            TOp::Move { dst: d.min(PAGES - n), src: s.min(PAGES - n), n }
        }),
        // Slides: overlapping moves by a small delta, either way.
        (2usize..30, 0usize..PAGES, 1usize..4, any::<bool>()).prop_map(|(n, at, delta, up)| {
            let n = n.min(PAGES - delta);
            let lo = at.min(PAGES - n - delta);
            if up {
                TOp::Move { dst: lo + delta, src: lo, n }
            } else {
                TOp::Move { dst: lo, src: lo + delta, n }
            }
        }),
        (1usize..16, 0usize..PAGES, 0usize..PAGES).prop_map(|(n, a, b)| {
            let n = n.min(PAGES / 2);
            let a = a.min(PAGES - 2 * n);
            // b in [a+n, PAGES-n] keeps them disjoint.
            let b = (a + n + b % (PAGES - 2 * n - a + 1)).min(PAGES - n);
            TOp::Swap { a, b, n }
        }),
    ]
}

fn apply(r: &mut Region, model: &mut [Option<u8>], op: &TOp, opts: &Options) -> Result<Outcome> {
    let ps = ps();
    match *op {
        TOp::Move { dst, src, n } => {
            let mut o = *opts;
            let overlap = dst < src + n && src < dst + n;
            if o.engine == Choice::Only(Engine::Mremap) && overlap {
                o.engine = Choice::Auto;
            }
            let out = r.move_pages_with(dst * ps, src * ps, n * ps, &o)?;
            oracle_move(model, dst, src, n);
            Ok(out)
        }
        TOp::Swap { a, b, n } => {
            let mut o = *opts;
            if o.engine == Choice::Only(Engine::Mremap) {
                o.engine = Choice::Auto;
            }
            let out = r.swap_pages_with(a * ps, b * ps, n * ps, &o)?;
            oracle_swap(model, a, b, n);
            Ok(out)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn single_ops_match_a_byte_array_oracle(ops in proptest::collection::vec((op_strategy(), any::<u8>(), 0usize..6), 1..12)) {
        let mut r = Region::for_remap(PAGES * ps()).unwrap();
        let mut model = tag_pages(&mut r);
        for (op, sel, be) in &ops {
            let out = apply(&mut r, &mut model, op, &engine_options(*sel, *be)).unwrap();
            // a move onto itself does nothing
            let onto_itself = matches!(op, TOp::Move { dst, src, .. } if dst == src);
            prop_assert!(onto_itself || out.uffd_move_bytes + out.mremap_bytes + out.memmove_bytes > 0, "{out:?}");
            check(&r, &model).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        }
    }

    #[test]
    fn batches_match_running_the_ops_in_order(ops in proptest::collection::vec(op_strategy(), 1..16), be in 0usize..6) {
        let ps = ps();
        let mut r = Region::for_remap(PAGES * ps).unwrap();
        let mut model = tag_pages(&mut r);
        let base = r.addr();
        let mut batch = Batch::with_options(Options { break_even_pages: Some(be), ..Options::default() });
        for op in &ops {
            match *op {
                TOp::Move { dst, src, n } => {
                    batch.push_move(base + dst * ps, base + src * ps, n * ps);
                    oracle_move(&mut model, dst, src, n);
                }
                TOp::Swap { a, b, n } => {
                    batch.push_swap(base + a * ps, base + b * ps, n * ps);
                    oracle_swap(&mut model, a, b, n);
                }
            }
        }
        let out = r.run(&batch).unwrap();
        prop_assert_eq!(out.ops, ops.len());
        check(&r, &model).map_err(|e| TestCaseError::fail(format!("{ops:?}: {e}")))?;
    }
}

#[test]
fn adjacent_objects_coalesce_and_vacated_destinations_are_not_emptied_again() {
    if !uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = ps();
    let mut r = Region::for_remap(256 * ps).unwrap();
    let mut model = tag_pages(&mut r);
    let base = r.addr();
    // A compaction: 10 objects of 10 pages with 2-page gaps slide down to 0, in order.
    let mut batch = Batch::with_options(Options { break_even_pages: Some(1), ..Options::default() });
    let mut to = 0;
    for i in 0..10 {
        let from = 2 + i * 12;
        batch.push_move(base + to * ps, base + from * ps, 10 * ps);
        oracle_move(&mut model, to, from, 10);
        to += 10;
    }
    let out = r.run(&batch).unwrap();
    check(&r, &model).unwrap();
    assert_eq!(out.merged_ops, 10);
    assert_eq!(out.uffd_move_bytes, 100 * ps, "{out:?}");
    // One vectored zap for the first destination, then one move per object (the later
    // destinations are space earlier objects vacated).
    assert_eq!(out.syscalls, 11, "{out:?}");

    // Contiguous objects merge into one operation: a move attempt that finds the
    // destination populated, one zap, the move.
    let mut batch = Batch::with_options(Options { break_even_pages: Some(1), ..Options::default() });
    for i in 0..10 {
        batch.push_move(base + (150 + i * 10) * ps, base + (i * 10) * ps, 10 * ps);
        oracle_move(&mut model, 150 + i * 10, i * 10, 10);
    }
    let out = r.run(&batch).unwrap();
    check(&r, &model).unwrap();
    assert_eq!((out.ops, out.merged_ops, out.syscalls), (10, 1, 3), "{out:?}");
}

#[test]
fn engines_are_chosen_by_size_and_alignment_and_reported() {
    let ps = ps();
    let mut r = Region::for_remap(8 * PMD_SIZE).unwrap();
    r.bytes_mut().fill(3);
    let opts = Options { break_even_pages: Some(8), ..Options::default() };
    let small = r.move_pages_with(0, 100 * ps, 2 * ps, &opts).unwrap();
    assert_eq!(small.engine(), Some(Engine::Memmove));
    let large = r.move_pages_with(4 * PMD_SIZE, 0, 2 * PMD_SIZE, &opts).unwrap();
    assert_eq!(large.engine(), Some(Engine::Mremap));
    // Into a populated destination, with MREMAP_DONTUNMAP: an exchange in three remaps;
    // without: a remap and a map.
    assert_eq!(large.syscalls, if grant::dontunmap_fixed_available() { 3 } else { 2 });
    if uffd_move_available() {
        let mid = r.move_pages_with(ps, PMD_SIZE + 3 * ps, 64 * ps, &opts).unwrap();
        assert_eq!(mid.engine(), Some(Engine::UffdMove));
        assert_eq!(mid.fallback_bytes, 0);
    }
}

#[test]
fn what_a_move_leaves_at_the_source() {
    let ps = ps();
    let mut r = Region::for_remap(64 * ps).unwrap();
    r.bytes_mut().fill(7);
    // memmove: the source keeps its bytes.
    r.move_pages_with(32 * ps, 0, 4 * ps, &Options { engine: Choice::Only(Engine::Memmove), ..Options::default() })
        .unwrap();
    assert!(r.bytes()[..4 * ps].iter().all(|&b| b == 7));
    // UFFDIO_MOVE: the source stays mapped and reads as zeros. mremap into this
    // populated destination: an exchange (with MREMAP_DONTUNMAP) leaves the
    // destination's old bytes there, a plain remap leaves zeros.
    for engine in [Engine::UffdMove, Engine::Mremap] {
        if engine == Engine::UffdMove && !uffd_move_available() {
            continue;
        }
        r.bytes_mut().fill(7);
        r.bytes_mut()[32 * ps..40 * ps].fill(9);
        let out = r
            .move_pages_with(32 * ps, 8 * ps, 8 * ps, &Options { engine: Choice::Only(engine), ..Options::default() })
            .unwrap();
        assert_eq!(out.engine(), Some(engine));
        let left = if engine == Engine::Mremap && grant::dontunmap_fixed_available() { 9 } else { 0 };
        assert!(r.bytes()[8 * ps..16 * ps].iter().all(|&b| b == left), "{engine}");
        assert!(r.bytes()[32 * ps..40 * ps].iter().all(|&b| b == 7), "{engine}");
        r.bytes_mut()[8 * ps] = 1; // still mapped and writable
    }
}

#[test]
fn misuse_gives_clear_errors_and_changes_nothing() {
    let ps = ps();
    let mut r = Region::for_remap(16 * ps).unwrap();
    let model = tag_pages(&mut r);
    let base = r.addr().0;
    let err = |e: Error| e.to_string();
    assert_eq!(
        err(r.move_pages(0, 1, ps).unwrap_err()),
        format!("invalid src: address {:#x} is not aligned to the {ps}-byte page size", base + 1)
    );
    assert_eq!(
        err(r.move_pages(0, ps, 100).unwrap_err()),
        format!("invalid dst: length 100 is not a multiple of the {ps}-byte page size")
    );
    assert_eq!(
        err(r.swap_pages(0, 2 * ps, 4 * ps).unwrap_err()),
        format!(
            "invalid b: swap of {:#x}+{:#x} with {:#x}+{:#x}: the ranges overlap (swap needs disjoint ranges; \
             to slide a block within a region, move it)",
            base,
            4 * ps,
            base + 2 * ps,
            4 * ps
        )
    );
    assert_eq!(
        err(r.move_pages(0, 15 * ps, 2 * ps).unwrap_err()),
        format!("invalid src: offset {:#x}+{:#x} is outside the {:#x}-byte region", 15 * ps, 2 * ps, 16 * ps)
    );
    // Raw addresses through the region's grant: outside it, and wrapping around.
    let mut g = r.grant();
    assert_eq!(
        err(move_pages(&mut g, HostAddr(base), HostAddr(base + 16 * ps), ps).unwrap_err()),
        format!(
            "invalid src: range {:#x}+{ps:#x} is outside the granted memory {base:#x}-{:#x}",
            base + 16 * ps,
            base + 16 * ps
        )
    );
    let top = usize::MAX - ps + 1;
    assert_eq!(
        err(move_pages(&mut g, HostAddr(base), HostAddr(top), 2 * ps).unwrap_err()),
        format!("invalid src: range {top:#x}+{} wraps the address space", 2 * ps)
    );
    // A batch with one bad operation does nothing at all.
    let mut batch = Batch::new();
    batch.push_move(HostAddr(base), HostAddr(base + 8 * ps), 4 * ps).push_swap(
        HostAddr(base),
        HostAddr(base + ps),
        2 * ps,
    );
    // The error says which operation of the batch is bad.
    assert_eq!(
        err(batch.execute(&mut g).unwrap_err()),
        format!(
            "invalid b: operation 1 of a batch of 2: swap of {base:#x}+{:#x} with {:#x}+{:#x}: the ranges \
             overlap (swap needs disjoint ranges; to slide a block within a region, move it)",
            2 * ps,
            base + ps,
            2 * ps
        )
    );
    check(&r, &model).unwrap();
}

#[test]
fn vma_count_stays_flat_over_100000_random_object_moves() {
    // Objects of 1..=8 pages moved between random slots of a 16 MiB region, the
    // break-even forced to 2 pages so most moves use UFFDIO_MOVE. The region stays
    // one VMA (registering for UFFDIO_MOVE covers whole mappings). Counted inside the
    // region: the process's total also moves with the tests running beside this one.
    let ps = ps();
    let pages = 4096;
    let mut r = Region::for_remap(pages * ps).unwrap();
    r.bytes_mut().fill(1);
    let vmas_in_region = |r: &Region| {
        let (start, end) = (r.addr().0, r.addr().0 + r.len());
        let (mut n, mut at) = (0, start);
        while let Ok(Some(v)) = procmap::query(at) {
            if v.start >= end {
                break;
            }
            n += 1;
            at = v.end;
        }
        n
    };
    let before = vmas_in_region(&r);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let opts = Options { break_even_pages: Some(2), ..Options::default() };
    let (mut uffd, mut swaps) = (0, 0);
    for i in 0..100_000 {
        let n = 1 + rnd(8);
        let (d, s) = (rnd(pages - n), rnd(pages - n));
        if i % 10 == 0 && (d + n <= s || s + n <= d) {
            r.swap_pages_with(d * ps, s * ps, n * ps, &opts).unwrap();
            swaps += 1;
        } else {
            let out = r.move_pages_with(d * ps, s * ps, n * ps, &opts).unwrap();
            uffd += (out.engine() == Some(Engine::UffdMove)) as usize;
        }
    }
    let after = vmas_in_region(&r);
    eprintln!("VMAs in the region {before} -> {after} after 100000 moves ({uffd} by UFFDIO_MOVE, {swaps} swaps)");
    assert_eq!((before, after), (1, 1), "VMAs in the region {before} -> {after}");
    if uffd_move_available() {
        assert!(uffd > 50_000, "{uffd}");
    }
}

#[test]
fn mremap_engine_vma_growth_is_bounded_by_the_aligned_blocks() {
    // 200 random 2 MiB-aligned moves in a 32 MiB region: each mremap can split off its
    // destination block, so the count is bounded by blocks + 2, not by moves.
    let blocks = 16;
    let mut r = Region::for_remap(blocks * PMD_SIZE).unwrap();
    let before = procmap::vma_count().unwrap();
    let mut x = 7usize;
    for _ in 0..200 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (d, s) = ((x >> 33) % blocks, (x >> 13) % blocks);
        if d == s {
            continue;
        }
        let out = r.move_pages(d * PMD_SIZE, s * PMD_SIZE, PMD_SIZE).unwrap();
        assert_eq!(out.engine(), Some(Engine::Mremap));
    }
    let after = procmap::vma_count().unwrap();
    eprintln!("mremap engine: VMAs {before} -> {after} after 200 aligned moves");
    assert!(after <= before + 2 * blocks + 2, "{before} -> {after}");
}

#[test]
fn break_even_crossing_and_overrides() {
    let c = [(1, 1.0, 3.0), (2, 2.0, 3.0), (4, 4.0, 3.5), (8, 8.0, 9.0), (16, 16.0, 5.0), (32, 32.0, 6.0)];
    assert_eq!(breakeven::crossing(&c), 16);
    assert_eq!(breakeven::crossing(&c[..2]), 3);
    set_break_even_pages(Some(5));
    assert_eq!((break_even().pages, break_even().source), (5, BreakEvenSource::Api));
    assert_eq!((break_even().pages_populated, break_even().pages_compaction), (5, 5));
    set_break_even_pages(None);
    assert_ne!(break_even().source, BreakEvenSource::Api);
}

#[test]
fn compaction_break_even_is_where_its_measured_batch_curve_crosses_memmove() {
    if !uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let b = measure_break_even(true, 1).unwrap();
    let pages: Vec<usize> = b.compaction.iter().map(|c| c.pages).collect();
    assert_eq!(pages, [8, 16, 32, 64, 128, 256, 511]);
    assert!(b.compaction.iter().all(|c| c.memmove_us > 0.0 && c.batch_us > 0.0), "{:?}", b.compaction);
    let curve: Vec<_> = b.compaction.iter().map(|c| (c.pages, c.memmove_us, c.batch_us)).collect();
    assert_eq!(b.pages_compaction, breakeven::crossing(&curve));
}

#[test]
fn moves_across_vmas_split_by_mremap_are_cut_at_the_boundaries() {
    if !uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = ps();
    let mut r = Region::for_remap(8 * PMD_SIZE).unwrap();
    let mut model = tag_pages(&mut r);
    let opts = Options { break_even_pages: Some(1), ..Options::default() };
    // Aligned 2 MiB moves go through mremap and leave the region in several VMAs.
    r.move_pages_with(4 * PMD_SIZE, 0, PMD_SIZE, &opts).unwrap();
    oracle_move(&mut model, 4 * PMD_SIZE / ps, 0, PMD_SIZE / ps);
    r.move_pages_with(PMD_SIZE, 6 * PMD_SIZE, PMD_SIZE, &opts).unwrap();
    oracle_move(&mut model, PMD_SIZE / ps, 6 * PMD_SIZE / ps, PMD_SIZE / ps);
    // An unaligned move spanning those pieces still moves entries, chunk by chunk.
    let (d, s, n) = (PMD_SIZE / 2, 4 * PMD_SIZE - PMD_SIZE / 2, PMD_SIZE + 3 * ps);
    let out = r.move_pages_with(d, s, n, &opts).unwrap();
    oracle_move(&mut model, d / ps, s / ps, n / ps);
    check(&r, &model).unwrap();
    assert_eq!((out.uffd_move_bytes, out.fallback_bytes), (n, 0), "{out:?}");
    assert!(out.syscalls >= 3, "one call per VMA piece: {out:?}");
}

#[test]
fn a_large_aligned_move_into_an_empty_destination_is_one_remap_and_leaves_the_source_mapped_and_zero() {
    if !grant::dontunmap_fixed_available() {
        eprintln!("skipped: MREMAP_DONTUNMAP with MREMAP_FIXED refused here (a move is a remap and a map)");
        return;
    }
    let mut r = Region::for_remap(8 * PMD_SIZE).unwrap();
    r.bytes_mut()[..2 * PMD_SIZE].fill(6);
    // An empty destination (mapped, never written): one remap.
    let out = r.move_pages_with(4 * PMD_SIZE, 0, 2 * PMD_SIZE, &Options::default()).unwrap();
    assert_eq!((out.engine(), out.syscalls, out.mremap_bytes), (Some(Engine::Mremap), 1, 2 * PMD_SIZE), "{out:?}");
    assert!(r.bytes()[4 * PMD_SIZE..6 * PMD_SIZE].iter().all(|&b| b == 6));
    assert!(r.bytes()[..2 * PMD_SIZE].iter().all(|&b| b == 0));
    r.bytes_mut()[..2 * PMD_SIZE].fill(1); // still mapped and writable
}

#[test]
fn a_batch_stopped_by_a_kernel_call_reports_exactly_how_far_it_got() {
    if !uffd_move_available() {
        eprintln!("skipped: UFFDIO_MOVE not available here");
        return;
    }
    let ps = ps();
    // Each swap writes both ranges, so the move after it must empty its destination
    // just before its turn: one madvise per move, which is the call made to fail.
    let ops = [
        TOp::Swap { a: 0, b: 4, n: 2 },
        TOp::Move { dst: 0, src: 8, n: 2 },
        TOp::Swap { a: 16, b: 20, n: 2 },
        TOp::Move { dst: 16, src: 24, n: 2 },
    ];
    let opts = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), coalesce: true };
    for (fail_at, completed) in [(1, 1), (2, 3)] {
        let mut r = Region::for_remap(PAGES * ps).unwrap();
        let mut model = tag_pages(&mut r);
        let mut batch = Batch::with_options(opts);
        for op in &ops {
            match *op {
                TOp::Move { dst, src, n } => batch.push_move(r.addr() + dst * ps, r.addr() + src * ps, n * ps),
                TOp::Swap { a, b, n } => batch.push_swap(r.addr() + a * ps, r.addr() + b * ps, n * ps),
            };
        }
        grant::fail_call(fail_at);
        let e = batch.execute_with_progress(&mut r.grant()).unwrap_err();
        grant::fail_call(0);
        assert_eq!((e.completed_ops, e.memory_changed), (completed, true), "{e}");
        assert!(e.to_string().contains(&format!("after {completed} of 4 operations")), "{e}");
        for op in &ops[..completed] {
            match *op {
                TOp::Move { dst, src, n } => oracle_move(&mut model, dst, src, n),
                TOp::Swap { a, b, n } => oracle_swap(&mut model, a, b, n),
            }
        }
        // The failed call changed nothing, so the rest did not run at all.
        check(&r, &model).unwrap();
    }
    // A failure before any change: memory as it was.
    let mut r = Region::for_remap(PAGES * ps).unwrap();
    let model = tag_pages(&mut r);
    let mut batch = Batch::with_options(opts);
    batch.push_move(r.addr(), r.addr() + 8 * ps, 2 * ps).push_move(r.addr() + 16 * ps, r.addr() + 24 * ps, 2 * ps);
    grant::fail_call(1); // the up-front vectored empty of both destinations
    let e = batch.execute_with_progress(&mut r.grant()).unwrap_err();
    grant::fail_call(0);
    assert_eq!(e.completed_ops, 0, "{e}");
    check(&r, &model).unwrap();
}

#[test]
fn an_mremap_move_into_a_destination_of_several_vmas_is_one_remap() {
    // A plain move replaces whatever maps its destination, so only the source must be
    // one VMA: a destination that an earlier move split still moves by page table.
    let mut r = Region::for_remap(12 * PMD_SIZE).unwrap();
    r.bytes_mut().fill(3);
    let opts = Options { engine: Choice::Only(Engine::Mremap), ..Options::default() };
    r.move_pages_with(PMD_SIZE, 3 * PMD_SIZE, PMD_SIZE, &opts).unwrap();
    // Empty, so the move is a plain remap (a populated one is exchanged, which moves
    // the destination too and so needs it in one VMA).
    let dst = PageRange::new("dst", r.addr().0, 2 * PMD_SIZE).unwrap();
    r.grant().discard(&[dst]).unwrap();
    let out = r.move_pages_with(0, 8 * PMD_SIZE, 2 * PMD_SIZE, &opts).unwrap();
    assert_eq!((out.mremap_bytes, out.uffd_move_bytes, out.memmove_bytes), (2 * PMD_SIZE, 0, 0), "{out:?}");
    assert!(r.bytes()[..2 * PMD_SIZE].iter().all(|&b| b == 3));
}
