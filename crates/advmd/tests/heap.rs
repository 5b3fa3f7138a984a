//! The daemon's memory does not grow with the clients it served before. (A test binary
//! of its own: it reads this process's memory, which other tests would add to.)

use std::time::{Duration, Instant};

use advm::merge::Client;

mod common;
use common::{distinct, threads};

/// This process's anonymous memory, in KiB.
fn anon_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let line = s.lines().find(|l| l.starts_with("Anonymous:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 200 clients at once, each merging 1 MiB of its own and 4 MiB all have, then all gone: the daemon kept the heap
/// its threads had used at once (glibc's per-thread arenas, never trimmed), tens of
/// MiB after such a run (22 MiB here).
#[test]
fn the_daemons_heap_after_many_clients_have_gone_is_near_its_start() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    const CLIENTS: usize = 200;
    let (d, sock) = common::start("heap", |c| c.domain_limit_bytes = 1 << 30);
    let before = anon_kib();
    let (mut ready, mut go) = ([0; 2], [0; 2]);
    // SAFETY: two pipes, their fds ours.
    assert!(unsafe { libc::pipe(ready.as_mut_ptr()) } == 0 && unsafe { libc::pipe(go.as_mut_ptr()) } == 0);
    let mut pids = Vec::new();
    for i in 0..CLIENTS {
        // SAFETY: the child merges, says so, waits for the pipe to close, and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // Its own pages (an add under 256 pages: copied by the daemon), and pages
            // every client has (an add of a file, or a lookup).
            let (own, all) = (distinct(255, i as u64), distinct(1024, 1 << 20));
            let ok =
                Client::connect(&sock, "").and_then(|mut c| c.merge(own.bytes()).and(c.merge(all.bytes()))).is_ok();
            let mut b = [u8::from(ok)];
            // SAFETY: our pipe ends; the read returns at the pipe's end.
            unsafe {
                libc::write(ready[1], b.as_ptr().cast(), 1);
                libc::close(go[1]);
                libc::read(go[0], b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        pids.push(pid);
    }
    let mut merged = 0;
    for _ in 0..CLIENTS {
        let mut b = [0u8];
        // SAFETY: our pipe end.
        assert_eq!(unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) }, 1);
        merged += usize::from(b[0]);
    }
    // SAFETY: our pipe end: the clients leave.
    unsafe { libc::close(go[1]) };
    for pid in pids {
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    }
    assert_eq!(merged, CLIENTS, "some clients' merges failed");
    let t = Instant::now();
    while threads("advmd-client") > 0 || !d.services.merge.usage().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the clients' sessions did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = anon_kib();
    let grown = after.saturating_sub(before) / 1024;
    eprintln!("anonymous memory {} MiB before the clients, {} MiB after", before / 1024, after / 1024);
    // 22 MiB before 2026-11-29 (trimmed, 5-7 MiB: glibc's cache of exited threads'
    // stacks, among others)
    assert!(grown <= 12, "the daemon kept {grown} MiB more anonymous memory after {CLIENTS} clients had gone");
    for fd in [ready[0], ready[1], go[0]] {
        // SAFETY: our pipe fds, closed once.
        unsafe { libc::close(fd) };
    }
}
