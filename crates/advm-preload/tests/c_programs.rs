//! Compiles every C program in `tests/c/` and runs it under the shim in each of the
//! shim's modes (cow, cow with memfd-backed fresh blocks, alloc, ksm); a program exits 0
//! when all its checks passed. In cow mode the copy test must also have made virtual
//! copies (read from the shim's stats).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn work_dir() -> PathBuf {
    // .../target/<profile>/deps/c_programs-HASH -> .../target/<profile>/preload-c-tests
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("preload-c-tests")
}

fn compile(src: &Path, out_dir: &Path) -> PathBuf {
    let exe = out_dir.join(src.file_stem().unwrap());
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
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "compiling {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
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
    assert!(sources.len() >= 7, "C tests missing: {sources:?}");
    for src in &sources {
        let exe = compile(src, &dir);
        for variant in ["cow", "cow-memfd", "alloc", "ksm"] {
            let mode = variant.trim_end_matches("-memfd");
            let fresh = if variant.ends_with("-memfd") { "memfd" } else { "anon" };
            let stats_dir = dir.join(format!("stats-{}-{variant}", src.file_stem().unwrap().to_string_lossy()));
            let _ = std::fs::remove_dir_all(&stats_dir);
            std::fs::create_dir_all(&stats_dir).unwrap();
            let out = Command::new(&exe)
                .env("LD_PRELOAD", &shim)
                .env("ADVM_MODE", mode)
                .env("ADVM_COW_FRESH", fresh)
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
            if mode == "cow" && src.ends_with("copy.c") {
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
    Some(compile(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(file), &dir))
}

/// Runs `exe args` under the shim in cow mode with `env`; asserts it succeeded.
fn run_cow(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let shim = advm_preload::install(&work_dir()).unwrap();
    let out = Command::new(exe)
        .args(args)
        .env("LD_PRELOAD", &shim)
        .env("ADVM_MODE", "cow")
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

/// [`run_cow`] with the shim's statistics written to a fresh `stats_dir`; returns the
/// output and the statistics summed.
fn run_cow_stats(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stats_dir: &Path,
) -> (std::process::Output, BTreeMap<String, u64>) {
    let _ = std::fs::remove_dir_all(stats_dir);
    std::fs::create_dir_all(stats_dir).unwrap();
    let dir = stats_dir.to_str().unwrap();
    let out = run_cow(exe, args, &[env, &[("ADVM_STATS_DIR", dir)]].concat());
    (out, stats(stats_dir))
}

/// [`run_cow_stats`], the statistics only.
fn cow_stats(exe: &Path, args: &[&str], env: &[(&str, &str)], stats_dir: &Path) -> BTreeMap<String, u64> {
    run_cow_stats(exe, args, env, stats_dir).1
}

/// The defaults `advm run` relies on: copies below 16 pages stay plain copies, bigger
/// ones become virtual; freed blocks keep their pages up to the peak live arena size
/// (ADVM_DIRTY_CACHE_PCT=100), and only the 4 MiB floor when that is turned off.
#[test]
fn copy_threshold_and_retention_defaults() {
    let Some(exe) = compiled("retention.c") else { return };
    let sd = work_dir().join("stats-retention");
    let small = cow_stats(&exe, &["8", "1", "1"], &[], &sd);
    assert_eq!(small.get("copies_virtual").copied().unwrap_or(0), 0, "8-page copy made virtual: {small:?}");
    let big = cow_stats(&exe, &["32", "1", "1"], &[], &sd);
    assert_eq!(big["copies_virtual"], 1, "32-page copy not virtual: {big:?}");
    assert_eq!(big["pages_shared"], 32, "{big:?}");
    // 64 MiB live, 32 blocks of 8 MiB in turn: each reuses the last one's pages
    let kept = cow_stats(&exe, &["8", "64", "8"], &[], &sd);
    assert!(kept["blocks_reused_with_pages"] >= 31, "{kept:?}");
    let floor = cow_stats(&exe, &["8", "64", "8"], &[("ADVM_DIRTY_CACHE_PCT", "0")], &sd);
    assert!(floor["blocks_reused_from_free_cache"] >= 31, "{floor:?}");
    assert!(floor.get("blocks_reused_with_pages").copied().unwrap_or(0) <= 1, "{floor:?}");
}

/// Freed memory kept for reuse goes back to the system once it stays unused for
/// ADVM_DIRTY_DECAY_MS, on the next arena call; with the decay off it stays.
#[test]
fn kept_memory_decays() {
    let Some(exe) = compiled("decay.c") else { return };
    let returned_kib = |decay_ms: &str, wait_ms: &str| -> i64 {
        let out = run_cow(&exe, &[wait_ms], &[("ADVM_DIRTY_DECAY_MS", decay_ms)]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let decayed = returned_kib("200", "600");
    assert!(decayed >= 15 * 1024, "16 MiB kept after 600 ms with a 200 ms decay: {decayed} KiB returned");
    let fresh = returned_kib("5000", "0");
    assert!(fresh < 1024, "memory returned before its decay time: {fresh} KiB");
    let off = returned_kib("0", "600");
    assert!(off < 1024, "memory returned with the decay off: {off} KiB");
}

/// Freed neighbours merge in the free table, and the pages a virtual copy maps over are
/// kept for the next block of that size: neither allocation grows resident memory, and
/// no write to one of the three blocks shows in another (also when blocks start as
/// shared memfd mappings, where the copy keeps using the source's own pages).
#[test]
fn freed_neighbours_and_copied_over_pages_are_reused() {
    let Some(exe) = compiled("reuse.c") else { return };
    for fresh in ["anon", "memfd"] {
        let sd = work_dir().join(format!("stats-reuse-{fresh}"));
        let (out, s) = run_cow_stats(&exe, &[], &[("ADVM_COW_FRESH", fresh)], &sd);
        let text = String::from_utf8_lossy(&out.stdout);
        let growth: Vec<i64> = text.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(s["copies_virtual"], 1, "{fresh}: {s:?}");
        // shared memfd blocks (ADVM_COW_FRESH=memfd) are not merged: only isolation there
        if fresh == "anon" {
            assert!(growth[0] <= 4, "a 64-page block after 16 freed 4-page ones grew RSS by {} pages", growth[0]);
            assert!(s["pages_kept_from_copied_over"] >= 63, "{fresh}: {s:?}");
            assert!(growth[1] <= 4, "{fresh}: a block after the copy grew RSS by {} pages: {s:?}", growth[1]);
        }
    }
}
