//! Fork while other threads are inside arena calls (read, fill, stats, contains) and
//! the reaper thread is unmapping: the child, which has only the forking thread,
//! must never find a lock of the arena held. Its own binary: it forks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::mem::HostAddr;
use advm::vcopy::{Arena, Config};

#[test]
fn a_forked_child_never_finds_the_arena_locked() {
    let ps = advm::addr::page_size();
    let a = Arena::with_config(Config::default().reserve_bytes(1 << 30)).unwrap();
    let len = 4 * ps;
    let src = a.alloc(len).unwrap();
    a.fill(src, 0x3c, len).unwrap();
    let big_len = 4 << 20; // large copies leave work for the reaper thread
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|k| {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    let p = src;
                    if k == 0 {
                        a.read(p, &mut buf).unwrap();
                        a.fill(HostAddr(p.0 + ps), 0x3c, 64).unwrap();
                        assert!(a.contains(p));
                        let _ = a.stats();
                    } else {
                        let big = a.alloc(big_len).unwrap();
                        a.fill(big, 1, big_len).unwrap();
                        let copy = a.dup(big, big_len).unwrap();
                        a.free(copy).unwrap();
                        a.free(big).unwrap();
                    }
                }
            })
        })
        .collect();
    let (mut forks, mut hung, mut failed) = (0, 0, 0);
    while forks < 200 && hung == 0 {
        forks += 1;
        // SAFETY: fork; the child only uses the arena and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = a.dup(src, len).is_ok_and(|c| a.read(c, &mut [0u8; 8]).is_ok() && a.stats().blocks >= 2);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut status = 0;
        loop {
            // SAFETY: polling our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                failed += usize::from(!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0));
                break;
            }
            if Instant::now() > deadline {
                // SAFETY: killing and reaping our own hung child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                hung += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!((hung, failed), (0, 0), "{forks} forks: {hung} children hung (deadlocked), {failed} failed");
    a.free(src).unwrap();
}
