//! Compiles every C program in `tests/c/` and runs it under the shim in each of the
//! shim's modes (vcopy, vcopy with memfd-backed fresh blocks, alloc, ksm); a program exits 0
//! when all its checks passed. In vcopy mode the copy test must also have made virtual
//! copies (read from the shim's stats).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)] // the library's half is not used here
#[path = "../../advm-capi/tests/support/fresh_so.rs"]
mod fresh_so;

/// .../target/<profile>/preload-c-tests, or this user's own where that is another's.
fn work_dir() -> PathBuf {
    fresh_so::work_dir("preload-c-tests")
}

fn compile(src: &Path, out_dir: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let exe = out_dir.join(src.file_stem().unwrap());
    // Tests running at once compile the same program: each writes its own file and
    // renames it into place, so that none executes a file another is still writing
    // (ETXTBSY).
    let tmp = out_dir.join(format!(
        "{}.{}-{}.tmp",
        src.file_stem().unwrap().to_string_lossy(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    // -fno-builtin: every memcpy/malloc must be a real call, as in a normal build of a
    // program that copies sizes unknown at compile time.
    let out = Command::new("cc")
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-alloc-size-larger-than",
            "-fno-builtin",
            "-pthread",
        ])
        .arg(src)
        .arg("-o")
        .arg(&tmp)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "compiling {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

fn stats(dir: &Path) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(Ok(v))) = (it.next(), it.next().map(str::parse::<u64>)) {
                *sum.entry(k.to_string()).or_insert(0) += v;
            }
        }
    }
    sum
}

#[test]
fn c_programs_pass_under_the_shim() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let dir = work_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let shim = advm_preload::install(&dir).unwrap();
    let mut sources: Vec<_> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 8, "C tests missing: {sources:?}");
    for src in &sources {
        let exe = compile(src, &dir);
        for variant in ["vcopy", "vcopy-memfd", "alloc", "ksm"] {
            let mode = variant.trim_end_matches("-memfd");
            let fresh = if variant.ends_with("-memfd") { "memfd" } else { "anon" };
            let stats_dir = dir.join(format!("stats-{}-{variant}", src.file_stem().unwrap().to_string_lossy()));
            let _ = std::fs::remove_dir_all(&stats_dir);
            std::fs::create_dir_all(&stats_dir).unwrap();
            let out = Command::new(&exe)
                .env("LD_PRELOAD", &shim)
                .env("ADVM_MODE", mode)
                .env("ADVM_VCOPY_FRESH", fresh)
                // the mechanism is tested at the paper's 2 pages, below the default
                .env("ADVM_COPY_MIN_PAGES", "2")
                .env("ADVM_STATS_DIR", &stats_dir)
                .output()
                .unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{} under mode {variant} failed ({}):\n{text}", src.display(), out.status);
            let s = stats(&stats_dir);
            assert!(
                s.get("blocks_allocated").copied().unwrap_or(0) > 0,
                "{}: no arena block in {variant}: {s:?}",
                src.display()
            );
            if mode == "vcopy" && src.ends_with("copy.c") {
                assert!(s["copies_virtual"] >= 6, "{s:?}");
                assert!(s["pages_shared"] >= 6 * 60, "{s:?}");
                assert!(s["fallback_page_offsets_differ"] >= 1 && s["fallback_overlap"] >= 1, "{s:?}");
            }
            if mode == "alloc" {
                assert_eq!(s.get("copies_virtual").copied().unwrap_or(0), 0, "alloc mode made virtual copies: {s:?}");
            }
            eprintln!("{} [{variant}]: {}", src.display(), text.trim());
        }
    }
}

/// Compiles `tests/<file>` into the work directory; None (reason printed) without cc.
fn compiled(file: &str) -> Option<PathBuf> {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return None;
    }
    let dir = work_dir();
    std::fs::create_dir_all(&dir).unwrap();
    // the stress program is also `advm bench shim-stress`'s workload: it lives in bench/run
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = if file == "stress.c" {
        manifest.join("../../bench/run").join(file)
    } else {
        manifest.join("tests").join(file)
    };
    Some(compile(&src, &dir))
}

/// Runs `exe args` under the shim in vcopy mode with `env`; asserts it succeeded.
fn run_vcopy(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let shim = advm_preload::install(&work_dir()).unwrap();
    let out = Command::new(exe)
        .args(args)
        .env("LD_PRELOAD", &shim)
        .env("ADVM_MODE", "vcopy")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} {env:?} failed ({}): {}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// [`run_vcopy`] with the shim's statistics written to a fresh `stats_dir`; returns the
/// output and the statistics summed.
fn run_vcopy_stats(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stats_dir: &Path,
) -> (std::process::Output, BTreeMap<String, u64>) {
    let _ = std::fs::remove_dir_all(stats_dir);
    std::fs::create_dir_all(stats_dir).unwrap();
    let dir = stats_dir.to_str().unwrap();
    let out = run_vcopy(exe, args, &[env, &[("ADVM_STATS_DIR", dir)]].concat());
    (out, stats(stats_dir))
}

/// [`run_vcopy_stats`], the statistics only.
fn vcopy_stats(exe: &Path, args: &[&str], env: &[(&str, &str)], stats_dir: &Path) -> BTreeMap<String, u64> {
    run_vcopy_stats(exe, args, env, stats_dir).1
}

/// Transparent huge pages off: blocks of 2 MiB and more then keep their pages at free
/// like smaller ones (with huge pages they give them back at once:
/// [`freed_huge_blocks_give_their_pages_back_at_once`]).
const NO_THP: (&str, &str) = ("ADVM_THP_MIN_KIB", "0");

/// The defaults `advm run` relies on: copies below 16 pages stay plain copies, bigger
/// ones become virtual; freed blocks keep their pages up to the peak live arena size
/// (ADVM_DIRTY_CACHE_PCT=100), and only the 4 MiB floor when that is turned off.
#[test]
fn copy_threshold_and_retention_defaults() {
    let Some(exe) = compiled("retention.c") else { return };
    let sd = work_dir().join("stats-retention");
    let small = vcopy_stats(&exe, &["8", "1", "1"], &[], &sd);
    assert_eq!(small.get("copies_virtual").copied().unwrap_or(0), 0, "8-page copy made virtual: {small:?}");
    let big = vcopy_stats(&exe, &["32", "1", "1"], &[], &sd);
    assert_eq!(big["copies_virtual"], 1, "32-page copy not virtual: {big:?}");
    assert_eq!(big["pages_shared"], 32, "{big:?}");
    // 64 MiB live, 32 blocks of 8 MiB in turn: each reuses the last one's pages
    let kept = vcopy_stats(&exe, &["8", "64", "8"], &[NO_THP], &sd);
    assert!(kept["blocks_reused_with_pages"] >= 31, "{kept:?}");
    let floor = vcopy_stats(&exe, &["8", "64", "8"], &[NO_THP, ("ADVM_DIRTY_CACHE_PCT", "0")], &sd);
    assert!(floor["blocks_reused_from_free_cache"] >= 31, "{floor:?}");
    assert!(floor.get("blocks_reused_with_pages").copied().unwrap_or(0) <= 1, "{floor:?}");
}

/// A freed block big enough to ask for transparent huge pages (2 MiB by default) gives
/// its pages back at free instead of keeping them (kept, they were most of what vcopy
/// held above untouched R), and a copy over such a block does not keep the pages it maps
/// over; its mapping is still reused. Smaller blocks, and any block with huge pages
/// turned off, keep theirs.
#[test]
fn freed_huge_blocks_give_their_pages_back_at_once() {
    let Some(exe) = compiled("retention.c") else { return };
    let sd = work_dir().join("stats-huge-give-back");
    // a 1024-page (4 MiB) copy, then 32 rounds of an 8 MiB block with 64 MiB live
    let huge = vcopy_stats(&exe, &["1024", "64", "8"], &[], &sd);
    assert!(huge["blocks_reused_from_free_cache"] >= 31, "{huge:?}");
    assert_eq!(huge.get("blocks_reused_with_pages").copied().unwrap_or(0), 0, "{huge:?}");
    assert_eq!(huge.get("pages_kept_from_copied_over").copied().unwrap_or(0), 0, "{huge:?}");
    let small = vcopy_stats(&exe, &["256", "64", "1"], &[], &sd);
    assert!(small["blocks_reused_with_pages"] >= 31, "1 MiB blocks: {small:?}");
    assert!(small["pages_kept_from_copied_over"] >= 255, "256-page copy: {small:?}");
    let no_thp = vcopy_stats(&exe, &["1024", "64", "8"], &[NO_THP], &sd);
    assert!(no_thp["blocks_reused_with_pages"] >= 31, "{no_thp:?}");
    assert!(no_thp["pages_kept_from_copied_over"] >= 1023, "{no_thp:?}");
}

/// With ADVM_HUGE_DECAY_MS, a freed block that asks for huge pages keeps them until the
/// next allocation of such a block, which reuses them instead of zeroing fresh huge
/// pages, and at most that long: then, on the next arena call, they go back to the
/// system; so do the pages that allocation did not take.
#[test]
fn freed_huge_blocks_keep_their_pages_until_the_next_huge_allocation() {
    let Some(exe) = compiled("retention.c") else { return };
    let sd = work_dir().join("stats-huge-decay");
    let kept = vcopy_stats(&exe, &["1024", "64", "8"], &[("ADVM_HUGE_DECAY_MS", "5000")], &sd);
    assert!(kept["blocks_reused_with_pages"] >= 31, "{kept:?}");
    // two freed 16 MiB blocks, one allocated: the other one's pages go back at once
    let Some(exe) = compiled("huge_keep.c") else { return };
    let (out, s) = run_vcopy_stats(&exe, &[], &[("ADVM_HUGE_DECAY_MS", "5000")], &sd);
    let returned: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(returned >= 15 * 1024, "the untaken block kept after the next huge allocation: {returned} KiB returned");
    assert!(s["blocks_reused_with_pages"] >= 1, "{s:?}");
    let Some(exe) = compiled("decay.c") else { return };
    let returned_kib = |huge_decay_ms: &str, wait_ms: &str| -> i64 {
        let out = run_vcopy(&exe, &[wait_ms], &[("ADVM_HUGE_DECAY_MS", huge_decay_ms)]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let decayed = returned_kib("200", "600");
    assert!(decayed >= 15 * 1024, "16 MiB kept after 600 ms with a 200 ms huge decay: {decayed} KiB returned");
    let fresh = returned_kib("5000", "0");
    assert!(fresh < 1024, "huge pages returned before their decay time: {fresh} KiB");
}

/// Freed memory kept for reuse goes back to the system once it stays unused for
/// ADVM_DIRTY_DECAY_MS (default 250), on the next arena call; with the decay off it
/// stays. (A 16 MiB block is kept only with huge pages off: [`NO_THP`].)
#[test]
fn kept_memory_decays() {
    let Some(exe) = compiled("decay.c") else { return };
    let returned_kib = |decay_ms: Option<&str>, wait_ms: &str| -> i64 {
        let env: Vec<(&str, &str)> =
            [Some(NO_THP), decay_ms.map(|d| ("ADVM_DIRTY_DECAY_MS", d))].into_iter().flatten().collect();
        let out = run_vcopy(&exe, &[wait_ms], &env);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let decayed = returned_kib(Some("200"), "600");
    assert!(decayed >= 15 * 1024, "16 MiB kept after 600 ms with a 200 ms decay: {decayed} KiB returned");
    let default = returned_kib(None, "600");
    assert!(default >= 15 * 1024, "16 MiB kept after 600 ms with the default decay: {default} KiB returned");
    let fresh = returned_kib(Some("5000"), "0");
    assert!(fresh < 1024, "memory returned before its decay time: {fresh} KiB");
    let off = returned_kib(Some("0"), "600");
    assert!(off < 1024, "memory returned with the decay off: {off} KiB");
}

/// Freed neighbours merge in the free table, and the pages a virtual copy maps over at
/// its destination are kept for the next block of that size: neither allocation grows resident memory, and
/// no write to one of the three blocks shows in another (also when blocks start as
/// shared memfd mappings, where the copy keeps using the source's own pages).
#[test]
fn freed_neighbours_and_copied_over_pages_are_reused() {
    let Some(exe) = compiled("reuse.c") else { return };
    for fresh in ["anon", "memfd"] {
        let sd = work_dir().join(format!("stats-reuse-{fresh}"));
        let (out, s) = run_vcopy_stats(&exe, &[], &[("ADVM_VCOPY_FRESH", fresh)], &sd);
        let text = String::from_utf8_lossy(&out.stdout);
        let growth: Vec<i64> = text.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(s["copies_virtual"], 1, "{fresh}: {s:?}");
        // shared memfd blocks (ADVM_VCOPY_FRESH=memfd) are not merged: only isolation there
        if fresh == "anon" {
            assert!(growth[0] <= 4, "a 64-page block after 16 freed 4-page ones grew RSS by {} pages", growth[0]);
            // the destination's 62 whole pages (the source's stay mapped: see copy_reader.c)
            assert!(s["pages_kept_from_copied_over"] >= 62, "{fresh}: {s:?}");
            assert!(growth[1] <= 4, "{fresh}: a block after the copy grew RSS by {} pages: {s:?}", growth[1]);
        }
    }
}

/// The shim's variants a program is run under: (name, ADVM_MODE, ADVM_VCOPY_FRESH);
/// "off" runs without the shim.
const VARIANTS: [(&str, &str, &str); 5] = [
    ("vcopy", "vcopy", "anon"),
    ("vcopy-memfd", "vcopy", "memfd"),
    ("alloc", "alloc", "anon"),
    ("ksm", "ksm", "anon"),
    ("off", "", ""),
];

/// Runs `exe args` under `variant` (one of [`VARIANTS`]), killing it after `limit`;
/// returns whether it exited 0, and its stdout and stderr (with the reason it failed).
fn run_variant(exe: &Path, args: &[&str], variant: &str, limit: std::time::Duration) -> (bool, String) {
    let (_, mode, fresh) = VARIANTS.iter().find(|v| v.0 == variant).expect("known variant");
    let dir = work_dir();
    let name = exe.file_name().unwrap().to_string_lossy().to_string();
    let (out_path, err_path) = (dir.join(format!("{name}-{variant}.out")), dir.join(format!("{name}-{variant}.err")));
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(std::fs::File::create(&out_path).unwrap()).stderr(std::fs::File::create(&err_path).unwrap());
    if !mode.is_empty() {
        cmd.env("LD_PRELOAD", advm_preload::install(&dir).unwrap())
            .env("ADVM_MODE", mode)
            .env("ADVM_VCOPY_FRESH", fresh)
            .env("ADVM_COPY_MIN_PAGES", "2");
    }
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&out_path).unwrap_or_default(),
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    match status {
        Some(st) if st.success() => (true, text),
        Some(st) => (false, format!("{name} under {variant} failed ({st}):\n{text}")),
        None => (false, format!("{name} under {variant} still running after {limit:?} (hung):\n{text}")),
    }
}

/// Runs `file` with `args` under every variant; panics with every failure's reason.
fn passes_in_every_variant(file: &str, args: &[&str], limit_s: u64) {
    let Some(exe) = compiled(file) else { return };
    let mut failed = Vec::new();
    for (variant, _, _) in VARIANTS {
        let (ok, text) = run_variant(&exe, args, variant, std::time::Duration::from_secs(limit_s));
        eprintln!("{file} [{variant}]: {}", text.trim());
        if !ok {
            failed.push(text);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A virtual copy never makes its source unreadable or wrong for a thread reading it
/// meanwhile (the source used to be moved away with mremap before the memfd mapping
/// replaced it: SIGSEGV in the reader on every run).
#[test]
fn copy_source_stays_readable_by_other_threads() {
    passes_in_every_variant("copy_reader.c", &["100"], 60);
}

/// Sizes whose page count overflows fail with NULL and ENOMEM in every allocation entry
/// point, as in glibc (realloc(p, SIZE_MAX) used to return p, taken for a shrink to 0).
#[test]
fn huge_sizes_fail_with_enomem_in_every_entry_point() {
    passes_in_every_variant("huge_sizes.c", &[], 30);
}

/// A signal handler's large memcpy while its thread is inside a large copy holding the
/// shim's lock completes (it used to wait for that lock forever).
#[test]
fn memcpy_in_a_signal_handler_during_a_large_copy_does_not_deadlock() {
    passes_in_every_variant("signal_copy.c", &["400"], 30);
}

/// A program's MADV_DONTNEED on its blocks leaves zeros and its MADV_FREE succeeds, as on
/// glibc's anonymous memory, also on a copy's pages (memfd views: DONTNEED read the
/// copy's bytes back and MADV_FREE failed with EINVAL), its source's, a block that
/// adopted its pages, after fork; MADV_REMOVE fails with EINVAL.
#[test]
fn madvise_dontneed_and_free_on_copies_act_as_on_glibc_memory() {
    passes_in_every_variant("madvise.c", &[], 30);
}

/// A program's MADV_WIPEONFORK and MADV_DONTFORK on its blocks act as on glibc's memory
/// in a forked child (zeros; no mapping), also on a copy's pages (WIPEONFORK failed with
/// EINVAL there) and after copies into and out of the marked block (a copy's remapping
/// lost the mark: the child had the range); MADV_KEEPONFORK and MADV_DOFORK undo them.
#[test]
fn madvise_wipeonfork_and_dontfork_on_copies_act_as_on_glibc_memory() {
    passes_in_every_variant("fork_marks.c", &[], 30);
}

/// A program holding all but 100 of vm.max_map_count itself gets every malloc and copy
/// right, as under glibc (virtual copies took the last mappings and glibc's mmap then
/// failed: malloc returned NULL); once it has given its mappings back and waited (the
/// shim reads /proc/self/maps again after 100 times the last reading's time, so that
/// readings cost at most 1%: the program waits 200 times its own reading's), the shim
/// makes virtual copies again, having read the maps only a few times.
#[test]
fn a_program_near_the_mapping_limit_gets_every_malloc() {
    passes_in_every_variant("map_count.c", &[], 30);
    let Some(exe) = compiled("map_count.c") else { return };
    let s = vcopy_stats(&exe, &["wait"], &[("ADVM_COPY_MIN_PAGES", "2")], &work_dir().join("stats-map-count"));
    assert!(s["copies_virtual"] >= 400, "no virtual copies once the mappings were gone: {s:?}");
    assert!(s["maps_readings"] <= 10, "{s:?}");
}

/// A signal handler's fork while its thread is inside a large copy holding the shim's
/// lock completes, and the child reads the right bytes (the fork handlers used to wait
/// for that lock forever).
#[test]
fn fork_in_a_signal_handler_during_a_large_copy_does_not_deadlock() {
    passes_in_every_variant("signal_fork.c", &["100"], 30);
}

/// Threads copying, reading sources during copies, writing, reallocating and forking at
/// once, every read checked against shadow copies, for a few seconds in each variant.
#[test]
fn stress_threads_copy_read_write_realloc_fork_in_every_variant() {
    passes_in_every_variant("stress.c", &["2", "4"], 60);
}

/// The knobs' current names and their deprecated ones: `ADVM_MODE=vcopy` or `cow`
/// selects virtual copies, and `ADVM_VCOPY_FRESH=memfd` (or, when it is unset,
/// `ADVM_COW_FRESH=memfd`) starts new blocks on the arena's memfd; the current name
/// wins when both are set.
#[test]
fn vcopy_knobs_and_their_deprecated_names_select_the_same_behaviour() {
    let Some(exe) = compiled("fresh_backing.c") else { return };
    let shim = advm_preload::install(&work_dir()).unwrap();
    let memfd_mappings = |env: &[(&str, &str)]| -> u32 {
        let out = Command::new(&exe)
            .env("LD_PRELOAD", &shim)
            .env_remove("ADVM_VCOPY_FRESH")
            .env_remove("ADVM_COW_FRESH")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{env:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let fresh = advm_preload::env::VCOPY_FRESH;
    assert_eq!(memfd_mappings(&[("ADVM_MODE", "vcopy"), (fresh, "anon")]), 0);
    assert!(memfd_mappings(&[("ADVM_MODE", "vcopy"), (fresh, "memfd")]) >= 1);
    assert!(memfd_mappings(&[("ADVM_MODE", "cow"), ("ADVM_COW_FRESH", "memfd")]) >= 1, "deprecated names");
    assert!(memfd_mappings(&[("ADVM_MODE", "vcopy"), ("ADVM_COW_FRESH", "memfd")]) >= 1, "deprecated fresh name");
    assert_eq!(memfd_mappings(&[("ADVM_MODE", "vcopy"), (fresh, "anon"), ("ADVM_COW_FRESH", "memfd")]), 0);
    // memfd blocks exist only in vcopy mode
    assert_eq!(memfd_mappings(&[("ADVM_MODE", "alloc"), (fresh, "memfd")]), 0);
}

/// A copy written on both sides gives its memfd pages back (trim): `trim.c` checks what
/// the shim's memfds hold after malloc_trim (down by exactly the pages every view of
/// which was written: partial writes, one-sided writes, a read-only stretch and a third,
/// unwritten view keep theirs; none while a child lives) and every byte of every block
/// after each step, MADV_DONTNEED and fork, also after two forks turned the memfd
/// generations over (a freed detached view of an old generation whose slot the newest
/// one reused released offsets still kept: a dropped page then read another block's
/// bytes). Its bytes are checked in every variant.
#[test]
fn pages_written_by_every_view_leave_the_memfd_and_reads_stay_right() {
    let Some(exe) = compiled("trim.c") else { return };
    let sd = work_dir().join("stats-trim");
    for fresh in ["anon", "memfd"] {
        let env = [("TRIM_EXPECT", "1"), ("ADVM_VCOPY_FRESH", fresh)];
        let (out, st) = run_vcopy_stats(&exe, &[], &env, &sd);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.ends_with("ok\n"), "{fresh}: {text}");
        // 2 x 256 in slot_reuse; 64 + 128 pages, 4 rounds of 256 after the MADV_DONTNEED,
        // 156 after the forks
        let want = 2 * 256 + 64 + 128 + 4 * 256 + 156;
        assert_eq!(st["memfd_pages_trimmed_under_written_views"], want, "{fresh}: {st:?}\n{text}");
    }
    for (variant, _, _) in VARIANTS {
        let (ok, text) = run_variant(&exe, &[], variant, std::time::Duration::from_secs(30));
        assert!(ok, "{text}");
    }
}

/// Without malloc_trim, allocations trim every ADVM_TRIM_KIB: 16 MiB copied and both
/// sides written, then 16 MiB allocated with ADVM_TRIM_KIB=4096 gives the 4096 memfd
/// pages back; ADVM_TRIM_KIB=0 keeps them.
#[test]
fn allocations_trim_every_advm_trim_kib() {
    let Some(exe) = compiled("trim_alloc.c") else { return };
    let sd = work_dir().join("stats-trim-alloc");
    let on = vcopy_stats(&exe, &[], &[("ADVM_TRIM_KIB", "4096")], &sd);
    assert_eq!(on["memfd_pages_trimmed_under_written_views"], 4096, "{on:?}");
    let off = vcopy_stats(&exe, &[], &[("ADVM_TRIM_KIB", "0")], &sd);
    assert_eq!(off.get("memfd_pages_trimmed_under_written_views").copied().unwrap_or(0), 0, "{off:?}");
}

/// Writes to a block while it is copied again and again are all kept: by another thread
/// (into a fresh block, into one that is itself a copy's destination, into the margins
/// of a destination) and by a signal handler on the copying thread, beside another
/// thread or alone. A copy re-homes the block's written pages (their bytes written into
/// fresh memfd pages, which the block then maps), and a write landing between the two
/// was lost: 30-10,000 words of an 8 MiB block in 1 s, 300-600 by the signal handler of
/// a 4 MiB one. Where userfaultfd is refused (a seccomp filter), such copies are plain.
#[test]
fn writes_to_a_block_during_its_copies_are_kept() {
    let Some(exe) = compiled("copy_writer.c") else { return };
    let sd = work_dir().join("stats-copy-writer");
    let facts = advm::probe::facts();
    // UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED; root's userfaultfd
    // also waits on the kernel's writes, as the shim needs (it takes no other)
    const WP: u64 = 3 << 12;
    let fence = facts.root && facts.uffd_features.is_some_and(|f| f & WP == WP);
    if !fence {
        eprintln!("skipped the fence counts: no userfaultfd write protection for this user");
    }
    let count = |st: &BTreeMap<String, u64>, k: &str| st.get(k).copied().unwrap_or(0);
    for (mib, mode) in [("8", "src"), ("8", "view"), ("8", "dst"), ("4", "signal"), ("4", "signal1")] {
        let (out, st) = run_vcopy_stats(&exe, &[mib, "1000", mode], &[], &sd);
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
        let fenced = count(&st, "copies_fenced_for_writers");
        if mode == "signal1" {
            assert_eq!(fenced, 0, "one thread, yet copies were fenced: {st:?}");
        } else if fence {
            assert!(fenced > 0, "{mode}: no copy fenced the writer: {st:?}");
        }
    }
    let (out, st) = run_vcopy_stats(&exe, &["8", "600", "src", "noufd"], &[], &sd);
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    assert!(count(&st, "fallback_writers_unfenced") > 0, "{st:?}");
    assert_eq!(count(&st, "copies_fenced_for_writers"), 0, "{st:?}");
}
