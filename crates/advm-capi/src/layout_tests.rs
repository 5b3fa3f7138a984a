//! The structs of `include/advm.h` and `include/advm_gc.h` have the layout of their
//! `#[repr(C)]` twins here: a C program built against the headers prints each
//! struct's size and alignment and each field's offset and size, and they are compared
//! with Rust's. A field added, retyped or reordered on one side only fails here.

use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use crate::gc::{AdvmGcOptions, AdvmGcPolicy, AdvmGcStats};
use crate::merge::{AdvmMergeStats, AdvmTrimStats};
use crate::pager::{advm_pager_options, advm_pager_stats};
use crate::remap::advm_remap_stats;
use crate::vcopy::AdvmVcopyStats;

/// A C struct's name, Rust size and alignment, and its fields' (name, offset, size).
type Layout = (&'static str, usize, usize, Vec<(&'static str, usize, usize)>);

fn size_of_field<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `(C struct, Rust size, Rust align, [(field, offset, size)])` for every struct.
macro_rules! layouts {
    ($(($c:literal, $t:ty, [$($f:ident),* $(,)?])),* $(,)?) => {
        vec![$(
            ($c, size_of::<$t>(), align_of::<$t>(), vec![$((stringify!($f), offset_of!($t, $f), size_of_field::<$t, _>(|s| &s.$f))),*])
        ),*]
    };
}

#[test]
fn header_structs_have_the_layout_of_their_rust_twins() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on PATH");
        return;
    }
    let all: Vec<Layout> = layouts![
        (
            "advm_vcopy_stats",
            AdvmVcopyStats,
            [
                blocks,
                memfd_pages_live,
                memfd_resident_bytes,
                pages_shared,
                bytes_copied,
                pages_rehomed,
                fallback_unaligned,
                fallback_small,
                fallback_vma_budget,
                vmas,
            ]
        ),
        (
            "advm_remap_stats",
            advm_remap_stats,
            [
                uffd_move_bytes,
                mremap_bytes,
                memmove_bytes,
                fallback_bytes,
                syscalls,
                arena_vcopy_bytes,
                completed_ops,
                memory_changed,
            ]
        ),
        (
            "advm_pager_stats",
            advm_pager_stats,
            [
                discarded_pages,
                written_pages,
                read_pages,
                zero_fills,
                resident_pages,
                preflushed_by_pager,
                preflushed_by_user,
                bytes_written,
                bytes_read,
                read_ahead_pages,
                zero_ahead_pages,
                clean_dropped_pages,
            ]
        ),
        (
            "advm_pager_options",
            advm_pager_options,
            [
                size,
                budget_bytes,
                swap_path,
                swap_capacity_bytes,
                preflush_headroom_bytes,
                cgroup,
                fault_mode,
                needed_paging,
                swap_io,
            ]
        ),
        ("advm_merge_stats", AdvmMergeStats, [merged, added, skipped, refused, nanoseconds, via_daemon]),
        ("advm_trim_stats", AdvmTrimStats, [released, kept, nanoseconds]),
        (
            "advm_gc_stats",
            AdvmGcStats,
            [
                collections,
                last_pause_ns,
                max_pause_ns,
                total_pause_ns,
                bytes_moved_memmove,
                bytes_moved_remap,
                heap_bytes,
                used_bytes,
                large_object_bytes,
            ]
        ),
        ("advm_gc_policy", AdvmGcPolicy, [kind, ratio, mem_limit, mem_lim, min_new_size, min_old_incr, copy_back]),
        (
            "advm_gc_options",
            AdvmGcOptions,
            [
                size,
                heap_bytes,
                policy,
                pager,
                engine,
                large_object_bytes,
                gc_threads,
                flush_after_major,
                verify,
                free_lazily,
            ]
        ),
    ];
    let mut src = String::from(
        "#include <advm.h>\n#include <advm_gc.h>\n#include <stdalign.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    let mut want = String::new();
    for (c, size, align, fields) in &all {
        writeln!(src, "    printf(\"{c} %zu %zu\\n\", sizeof(struct {c}), alignof(struct {c}));").unwrap();
        writeln!(want, "{c} {size} {align}").unwrap();
        for (f, off, fsize) in fields {
            writeln!(
                src,
                "    printf(\"{c}.{f} %zu %zu\\n\", offsetof(struct {c}, {f}), sizeof(((struct {c} *)0)->{f}));"
            )
            .unwrap();
            writeln!(want, "{c}.{f} {off} {fsize}").unwrap();
        }
    }
    src.push_str("    return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("advm-capi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c_file, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&c_file, &src).unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
    let built = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&include)
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    let out = built.status.success().then(|| Command::new(&exe).output().expect("run the layout program"));
    std::fs::remove_dir_all(&dir).ok();
    assert!(built.status.success(), "compiling the layout program failed:\n{}", String::from_utf8_lossy(&built.stderr));
    let got = String::from_utf8(out.unwrap().stdout).unwrap();
    for (g, w) in got.lines().zip(want.lines()) {
        assert_eq!(g, w, "C (left) and Rust (right) disagree");
    }
    assert_eq!(got.lines().count(), want.lines().count());
}
