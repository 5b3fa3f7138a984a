//! The cgroup meter (`advm::stats::cgroup`): what it sees of a measured program, and
//! that its group never outlives the run. Needs root and a memory cgroup; skips with the
//! reason otherwise.

use std::process::Command;
use std::time::Duration;

use advm::mem::{Access, Assembly, Backing, Extent, Memfd, Region, Share};
use advm::stats::cgroup::{Group, DEFAULT_INTERVAL};

const MIB: u64 = 1 << 20;

fn group(name: &str) -> Option<Group> {
    match Group::create(name) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn within_5_percent(seen: u64, want: u64) -> bool {
    seen.abs_diff(want) * 20 <= want
}

#[test]
fn meter_sees_64_mib_of_anon_touched_by_a_child() {
    let Some(g) = group("test-anon") else { return };
    let sampler = g.sample_every(DEFAULT_INTERVAL);
    let reply = g
        .run_in_child(|| {
            let r = Region::new(64 << 20).map_err(|e| e.to_string())?;
            r.populate(true).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(300));
            Ok(Vec::new())
        })
        .unwrap();
    reply.unwrap();
    let s = sampler.stop().unwrap();
    let peak = s.anon_shmem_bytes.max as u64;
    assert!(within_5_percent(peak, 64 * MIB), "peak anon+shmem {peak} bytes, want 64 MiB +-5%");
    assert!(s.samples >= 3, "{} samples in 300 ms at 50 ms", s.samples);
    g.remove().unwrap();
}

#[test]
fn meter_sees_memfd_pages_written_then_unmapped_with_the_fd_kept() {
    let Some(g) = group("test-memfd") else { return };
    let path = g.path().to_path_buf();
    // The figure is read by the child itself while it still holds the fd: once it
    // exits, the memfd and its pages are gone.
    let reply = g
        .run_in_child(move || {
            let err = |e: advm::Error| e.to_string();
            let fd = Memfd::create("test-held").map_err(err)?;
            fd.set_len(64 * MIB).map_err(err)?;
            let chunk = vec![0x5au8; MIB as usize];
            for i in 0..64 {
                fd.write_all_at(&chunk, i * MIB).map_err(err)?;
            }
            let len = (64 * MIB) as usize;
            let mut view = Assembly::reserve(len).map_err(err)?;
            let backing = Backing::Memfd { memfd: &fd, offset: 0 };
            view.place(Extent { offset: 0, len, backing }, Access::Read, Share::Shared).map_err(err)?;
            view.populate_read(0, len).map_err(err)?;
            drop(view);
            let mapped = advm::stats::measure_self().map_err(err)?.distinct.map_or(0, |d| d.shmem);
            let held = Group::open(&path).and_then(|g| g.usage()).map_err(err)?.shmem_bytes;
            drop(fd);
            Ok([held, mapped].iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .unwrap()
        .unwrap();
    let held = u64::from_le_bytes(reply[..8].try_into().unwrap());
    let mapped_pages = u64::from_le_bytes(reply[8..].try_into().unwrap());
    assert!(within_5_percent(held, 64 * MIB), "shmem charged {held} bytes, want 64 MiB +-5%");
    // what the distinct-page meter (mapped frames only) saw of them, for the record
    eprintln!("held memfd: cgroup {held} bytes, distinct mapped shmem pages {mapped_pages}");
    g.remove().unwrap();
}

#[test]
fn page_cache_of_a_file_written_is_reported_apart_from_anon_and_shmem() {
    let Some(g) = group("test-cache") else { return };
    let dir = std::env::temp_dir().join(format!("advm-cgroup-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data");
    let mut cmd = Command::new("dd");
    cmd.arg("if=/dev/zero").arg(format!("of={}", file.display())).args(["bs=1M", "count=32", "status=none"]);
    g.join_at_exec(&mut cmd).unwrap();
    assert!(cmd.status().unwrap().success());
    let u = g.usage().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(u.page_cache_bytes >= 31 * MIB, "page cache {} bytes after writing 32 MiB", u.page_cache_bytes);
    assert!(
        u.anon_shmem_bytes() < 8 * MIB,
        "anon+shmem {} bytes: page cache counted as anon/shmem?",
        u.anon_shmem_bytes()
    );
    g.remove().unwrap();
}

#[test]
fn group_is_removed_after_a_program_that_fails() {
    let Some(g) = group("test-fail") else { return };
    let path = g.path().to_path_buf();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exit 3"]);
    g.join_at_exec(&mut cmd).unwrap();
    assert_eq!(cmd.status().unwrap().code(), Some(3));
    g.remove().unwrap();
    assert!(!path.exists(), "{} left behind", path.display());
}

#[test]
fn group_is_removed_on_drop_even_with_a_process_left_in_it() {
    let Some(g) = group("test-linger") else { return };
    let path = g.path().to_path_buf();
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    g.join_at_exec(&mut cmd).unwrap();
    let mut child = cmd.spawn().unwrap();
    assert_eq!(g.pids().unwrap(), vec![child.id() as i32]);
    drop(g);
    assert!(!path.exists(), "{} left behind", path.display());
    // the group's leftover was killed so the group could go
    assert!(!child.wait().unwrap().success());
}

#[test]
fn a_child_in_the_group_is_charged_there_from_its_first_page() {
    let Some(g) = group("test-join") else { return };
    let mut cmd = Command::new("cat");
    cmd.arg("/proc/self/cgroup");
    g.join_at_exec(&mut cmd).unwrap();
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let name = g.path().file_name().unwrap().to_string_lossy().into_owned();
    assert!(text.lines().any(|l| l.contains("memory") || l.starts_with("0::")), "{text}");
    assert!(text.contains(&name), "cat ran outside {name}: {text}");
}

#[test]
fn opening_a_directory_without_memory_stat_says_so() {
    let e = Group::open(std::path::Path::new("/proc/self")).unwrap_err().to_string();
    assert!(e.contains("memory.stat"), "{e}");
}

#[test]
fn a_child_killed_for_memory_under_the_limit_is_counted_as_an_oom_kill() {
    let Some(g) = group("test-oom") else { return };
    assert_eq!(g.oom_kills().unwrap(), 0);
    g.set_limit_bytes(16 * MIB).unwrap();
    let reply = g
        .run_in_child(|| {
            // locked pages cannot be swapped: past the limit the kernel must kill
            // SAFETY: mlockall has no memory-safety preconditions.
            unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
            let r = Region::new(64 << 20).map_err(|e| e.to_string())?;
            r.populate(true).map_err(|e| e.to_string())?;
            Ok(Vec::new())
        })
        .unwrap();
    let e = reply.unwrap_err();
    assert!(e.contains("status 137"), "{e}");
    assert_eq!(g.oom_kills().unwrap(), 1);
    g.remove().unwrap();
}
