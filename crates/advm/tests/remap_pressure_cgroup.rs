//! advm::remap in a child limited by a memory cgroup to less than it touches (root:
//! swap file, cgroup; skips otherwise). Its own process: a fork of a test process
//! running other tests at the same time was OOM-killed in the group now and then.

mod pressure;
use pressure::*;

/// The same random operations in a child limited by a memory cgroup to less than it
/// touches, so the kernel swaps anonymous pages and reclaims page-cache pages of a
/// file-backed private part (the range's middle 4 MiB) while pages move.
#[test]
fn moves_and_swaps_under_a_cgroup_limit_while_the_kernel_swaps_and_reclaims_keep_every_byte() {
    let Some(_pressure) = pressure("cg") else { return };
    let len = 12 << 20;
    let file = std::path::PathBuf::from(format!("/tmp/rpress-file-{}", std::process::id()));
    let pattern: Vec<u8> = (0..4 << 20).map(|i: usize| (i / 4096 * 13 + i % 251) as u8 | 1).collect();
    std::fs::write(&file, &pattern).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let m = Raw::anon(len);
    use std::os::fd::AsRawFd;
    // SAFETY: replaces the middle of our own mapping with a private view of the file.
    let p = unsafe {
        libc::mmap(
            (m.addr + (4 << 20)) as *mut libc::c_void,
            4 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    drop(f);
    let _ = std::fs::remove_file(&file); // the mapping keeps the file's pages
                                         // The child (range and oracle, 24 MiB, and the touched ranges' copies) swaps a few
                                         // MiB at 28 MiB. Every byte is read every 10th round, so the whole set is hot then:
                                         // v1 reclaim sometimes gives up on such a thrashing group and the kernel kills it
                                         // (seen at 24 to 36 MiB, about one run in ten on a loaded machine). That is the
                                         // kernel's choice, not lost data: such a run is tried again with 4 MiB more.
    let mut limit = 28 << 20;
    for attempt in 1.. {
        let group = match advm::stats::cgroup::Group::create("rpress") {
            Ok(g) => g,
            Err(e) => return eprintln!("skipped: {e}"),
        };
        group.set_limit_bytes(limit).unwrap();
        let r = group.run_in_child(|| {
            // no default panic message: another test thread may have held stderr at the fork
            std::panic::set_hook(Box::new(|_| {}));
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut model = vec![0u8; len];
                let mut rng = Rng(0x5eed_0000_c6c6_0001);
                shape(&m, &mut model, 0, 4 << 20, &mut rng);
                model[4 << 20..8 << 20].copy_from_slice(&pattern);
                shape(&m, &mut model, 8 << 20, 4 << 20, &mut rng);
                check(&m, &model, "after shaping");
                let total = fuzz(&m, &mut model, &mut rng, 60, false);
                let swapped = status_kib("VmSwap:");
                format!("{total:?}, {swapped} KiB swapped out at the end").into_bytes()
            }))
            .map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
        });
        let oom_killed = group.oom_kills().unwrap() > 0;
        group.remove().unwrap();
        match r.unwrap() {
            Err(e) if oom_killed && attempt < 3 => {
                eprintln!("attempt {attempt} at {} MiB: OOM-killed while thrashing ({e}); again", limit >> 20);
                limit += 4 << 20;
            }
            r => {
                let out = r
                    .unwrap_or_else(|e| panic!("in the cgroup at {} MiB (OOM-killed: {oom_killed}): {e}", limit >> 20));
                return eprintln!("at {} MiB: {}", limit >> 20, String::from_utf8_lossy(&out));
            }
        }
    }
}
