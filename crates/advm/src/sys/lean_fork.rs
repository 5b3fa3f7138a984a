//! A fork whose child gets only the memory it needs.
//!
//! `fork` copies the page tables of every private mapping that holds pages and
//! write-protects them in both processes: the parent waits for that (its pause grows
//! with all its memory), and afterwards each page it writes is a copy-on-write fault
//! until the child exits. [`fork_run_lean`] marks the big private mappings the child
//! does not need `MADV_DONTFORK` for the instant of the fork, and lifts the mark right
//! after, in the parent, whatever the fork did (a guard: an early return or a panic
//! lifts it too). A mapping that carried `MADV_DONTFORK` already (`dc` in
//! /proc/self/smaps) is never touched.
//!
//! Left out of the child: private mappings, anonymous (`[heap]` too) or of a memfd,
//! holding at least [`LEAVE_MIN_BYTES`], except within [`KEEP_MARGIN`] of the caller's
//! `keep` ranges, the calling thread's stack pointer, thread block (`%fs`: errno, the
//! stack guard) and errno. Kept: every mapping of a file (program and library text and data),
//! `[stack]`, `[vdso]` and the like, and small mappings. The child must touch nothing
//! else: what it does touch in a left-out mapping kills it with SIGSEGV (its parent
//! sees a signal, never wrong data).
//!
//! Another thread's `fork()` waits while the marks are on (a fork handler takes the
//! lock a lean fork holds from mark to unmark), so its child is never short of memory;
//! two lean forks of one process take turns. `vfork`/`posix_spawn` and raw `clone`
//! calls are not held back (the first two share the parent's memory, so a mark does
//! not matter to them).
//!
//! Races with the program's other threads, between the scan of smaps and the unmark:
//! a mapping made meanwhile is forked as usual; one unmapped meanwhile is skipped by the
//! kernel (ENOMEM, ignored); one mapped again in a marked range is marked and unmarked,
//! which loses a `MADV_DONTFORK` its owner gave it in that instant; one moved by
//! `mremap` meanwhile keeps the mark at its new place. All need another thread to change
//! its mappings within the few milliseconds of a dump.

use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::mm::Advice;

use super::{SysError, SysResult};

/// A private mapping holding fewer bytes than this stays in the child (not worth a call).
pub const LEAVE_MIN_BYTES: u64 = 64 << 10;

/// What [`fork_run_lean`] left out of the child.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeftOut {
    /// Address ranges marked (adjacent mappings joined).
    pub ranges: usize,
    /// Their resident bytes (Rss) at the scan.
    pub bytes: u64,
    /// The fork itself (the marks, the scan before them and the unmarks not counted).
    pub fork: std::time::Duration,
}

/// One mapping as /proc/self/smaps describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Smap {
    start: usize,
    end: usize,
    private: bool,
    /// Anonymous (no file; `[heap]`, `[anon:NAME]` too) or a memfd's.
    leavable: bool,
    rss_bytes: u64,
    dont_fork: bool,
}

/// Parses /proc/self/smaps text.
fn parse(text: &str) -> Vec<Smap> {
    let mut out: Vec<Smap> = Vec::new();
    for line in text.lines() {
        if let Some((v, path)) = super::procmap::parse_named(line) {
            let anonymous = !v.file_backed && (path.is_empty() || path == "[heap]" || path.starts_with("[anon"));
            out.push(Smap {
                start: v.start,
                end: v.end,
                private: !v.shared,
                leavable: anonymous || path.starts_with("/memfd:"),
                ..Smap::default()
            });
        } else if let (Some(m), Some(rest)) = (out.last_mut(), line.strip_prefix("Rss:")) {
            let kb = rest.trim().trim_end_matches("kB").trim();
            m.rss_bytes = kb.parse::<u64>().unwrap_or(0) * 1024;
        } else if let (Some(m), Some(rest)) = (out.last_mut(), line.strip_prefix("VmFlags:")) {
            m.dont_fork = rest.split_whitespace().any(|x| x == "dc");
        }
    }
    out
}

/// Around each kept range this much more stays in the child: a kept stack pointer
/// needs the caller's frames above it (what the child's closure captured) and the
/// child's own below it. A big mapping holding a kept range (a thread's stack joined
/// with the heap allocation beside it) is left out apart from that window.
const KEEP_MARGIN: usize = 1 << 20;

/// The ranges to leave out of a fork, given the mappings and the ranges to keep, and
/// their resident bytes (a mapping left out in part counted in proportion).
fn plan(maps: &[Smap], keep: &[(usize, usize)]) -> (Vec<(usize, usize)>, u64) {
    let ps = super::page_size();
    let windows: Vec<(usize, usize)> = keep
        .iter()
        .map(|&(a, len)| {
            let lo = a.saturating_sub(KEEP_MARGIN) / ps * ps;
            let hi = a.saturating_add(len.max(1)).saturating_add(KEEP_MARGIN).div_ceil(ps).saturating_mul(ps);
            (lo, hi)
        })
        .collect();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut bytes = 0;
    for m in maps {
        if !m.private || !m.leavable || m.dont_fork || m.rss_bytes < LEAVE_MIN_BYTES {
            continue;
        }
        let mut pieces = vec![(m.start, m.end)];
        for &(lo, hi) in &windows {
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| if hi <= s || lo >= e { [(s, e), (0, 0)] } else { [(s, lo.max(s)), (hi.min(e), e)] })
                .filter(|&(s, e)| s < e)
                .collect();
        }
        let len = (m.end - m.start) as u64;
        for (s, e) in pieces {
            bytes += m.rss_bytes * (e - s) as u64 / len;
            match ranges.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => ranges.push((s, e)),
            }
        }
    }
    (ranges, bytes)
}

/// The calling thread's thread pointer (its thread block), 0 where unknown.
fn thread_pointer() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let mut fs: libc::c_ulong = 0;
        // SAFETY: ARCH_GET_FS writes one unsigned long through a valid pointer.
        let r = unsafe {
            libc::syscall(libc::SYS_arch_prctl, 0x1003 /* ARCH_GET_FS */, &mut fs as *mut libc::c_ulong)
        };
        if r == 0 {
            return fs as usize;
        }
    }
    0
}

/// Marks on a set of ranges, lifted when dropped.
struct Marks(Vec<(usize, usize)>);

impl Marks {
    fn advise(&self, advice: Advice) {
        for &(a, b) in &self.0 {
            // SAFETY: MADV_DONTFORK/DOFORK change a mapping's flags, never its content;
            // a range unmapped since the scan only makes the call fail (ENOMEM).
            let _ = unsafe { super::mman::madvise(a as *mut u8, b - a, advice) };
        }
    }
}

impl Drop for Marks {
    fn drop(&mut self) {
        self.advise(Advice::LinuxDoFork);
    }
}

/// Runs `child` in a forked child process, with the big private mappings it needs not
/// (see the module comment) left out of the fork; `keep` lists (address, length) ranges
/// the child reads or writes. The fork is a raw `clone` (no `pthread_atfork` handler
/// runs): `child` must not allocate or take locks. Wait for it with
/// [`super::process::wait_child`]. Returns the child's
/// pid and what was left out. Without /proc/self/smaps nothing is left out.
pub fn fork_run_lean(keep: &[(usize, usize)], child: impl FnOnce() -> i32) -> SysResult<(i32, LeftOut)> {
    let here = 0u8;
    let mut keep = keep.to_vec();
    keep.push((&here as *const u8 as usize, 1));
    let tp = thread_pointer();
    if tp != 0 {
        keep.push((tp, 1));
    }
    // SAFETY: __errno_location has no precondition; it returns this thread's errno.
    keep.push((unsafe { libc::__errno_location() } as usize, 1));
    let (ranges, bytes) = match std::fs::read_to_string("/proc/self/smaps") {
        Ok(text) => plan(&parse(&text), &keep),
        Err(_) => (Vec::new(), 0),
    };
    let mut left = LeftOut { ranges: ranges.len(), bytes, ..LeftOut::default() };
    // While the marks are on, another thread's fork() would give its child none of the
    // marked memory (a thread's stack among it): it waits, as does another lean fork.
    let _forks_held = super::process::ForksHeld::take();
    let marks = Marks(ranges);
    marks.advise(Advice::LinuxDontFork);
    let t = std::time::Instant::now();
    let pid = clone_run(child)?;
    left.fork = t.elapsed();
    drop(marks);
    Ok((pid, left))
}

/// A fork without glibc's fork handlers: those run in the child too, and glibc's own
/// resets every malloc arena's lock there, touching the thread arenas left out of it.
/// `child` runs alone in the child; it must not allocate or take a lock (another thread
/// may have held it at the fork) and leaves by `_exit`.
fn clone_run(child: impl FnOnce() -> i32) -> SysResult<i32> {
    // SAFETY: clone(SIGCHLD) with no other flag and no new stack is a fork: the child
    // gets a copy-on-write copy of this thread's stack and runs on from here.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(SysError::last("clone"));
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: _exit ends the child without running the parent's atexit handlers or
        // returning into the caller's frames (whose destructors would run twice).
        unsafe { libc::_exit(code) };
    }
    i32::try_from(pid).map_err(|_| SysError::new("clone", super::Errno::RANGE))
}

/// Writes `len` bytes of this process's memory at `addr` to `fd` at `offset`, the kernel
/// reading the memory (an address not mapped is an `EFAULT` error, never a crash).
pub fn pwrite_from(fd: BorrowedFd<'_>, addr: usize, len: usize, offset: u64) -> SysResult<()> {
    let (mut done, fd) = (0usize, fd.as_raw_fd());
    while done < len {
        let at =
            libc::off_t::try_from(offset + done as u64).map_err(|_| SysError::new("pwrite", super::Errno::INVAL))?;
        // SAFETY: the kernel reads [addr+done, addr+len) itself (copy_from_user) and
        // fails with EFAULT where nothing is mapped; no Rust reference to it is made.
        let r = unsafe { libc::pwrite(fd, (addr + done) as *const libc::c_void, len - done, at) };
        if r < 0 {
            let e = SysError::last("pwrite");
            if e.errno == super::Errno::INTR {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(SysError::new("pwrite", super::Errno::IO));
        }
        done += r as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    const SMAPS: &str = "\
55d0c0a00000-55d0c0c00000 rw-p 00000000 00:00 0                          [heap]
Rss:                2048 kB
VmFlags: rd wr mr mw me ac
7f0000000000-7f0000800000 rw-p 00000000 00:00 0 
Rss:                8192 kB
VmFlags: rd wr mr mw me dc ac
7f0000800000-7f0001000000 rw-p 00000000 00:00 0 
Rss:                4096 kB
VmFlags: rd wr mr mw me ac
7f0001000000-7f0001400000 rw-p 00000000 00:00 0 
Rss:                  60 kB
VmFlags: rd wr mr mw me ac
7f0002000000-7f0002200000 rw-p 00000000 00:1a 4242                       /memfd:advm-store (deleted)
Rss:                1024 kB
VmFlags: rd wr mr mw me ac
7f0002200000-7f0002400000 rw-p 00000000 00:1a 4243                       /memfd:other (deleted)
Rss:                1024 kB
VmFlags: rd wr mr mw me ac
7f0003000000-7f0003200000 rw-p 00001000 08:01 1234                       /usr/lib/libc.so.6
Rss:                1024 kB
VmFlags: rd wr mr mw me ac
7f0004000000-7f0004200000 rw-s 00000000 00:01 77                         /dev/zero (deleted)
Rss:                1024 kB
VmFlags: rd wr sh mr mw me ms
7f0005000000-7f0005200000 rw-p 00000000 00:00 0 
Rss:                1024 kB
VmFlags: rd wr mr mw me ac
7ffd00000000-7ffd00200000 rw-p 00000000 00:00 0                          [stack]
Rss:                 132 kB
VmFlags: rd wr mr mw me gd ac
";

    #[test]
    fn leaves_out_big_private_anonymous_and_memfd_mappings_not_marked_files_small_or_kept_ones() {
        let maps = parse(SMAPS);
        assert_eq!(maps.len(), 10);
        assert!(maps[1].dont_fork && !maps[2].dont_fork);
        assert_eq!(maps[2].rss_bytes, 4096 << 10);
        // The heap, the anonymous mapping after the marked one, both memfd mappings
        // (joined); not: the marked one, the 60 kB one, libc's data, the shared one, the
        // [stack], and the one holding a kept address.
        let (ranges, bytes) = plan(&maps, &[(0x7f00_0510_0000, 8)]);
        assert_eq!(
            ranges,
            vec![
                (0x55d0_c0a0_0000, 0x55d0_c0c0_0000),
                (0x7f00_0080_0000, 0x7f00_0100_0000),
                (0x7f00_0200_0000, 0x7f00_0240_0000)
            ]
        );
        assert_eq!(bytes, (2048 + 4096 + 1024 + 1024) << 10);
        // A kept range near a big mapping's end: the mapping is left out but for the
        // window around the range, here its last 1 MiB + 4 KiB.
        let (ranges, bytes) = plan(&maps, &[(0x7f00_00ff_f000, 0x2000)]);
        assert!(ranges.contains(&(0x7f00_0080_0000, 0x7f00_00ef_f000)), "{ranges:x?}");
        assert!(!ranges.iter().any(|r| r.0 < 0x7f00_0110_1000 && r.1 > 0x7f00_00ef_f000), "{ranges:x?}");
        assert_eq!(bytes, (2048 + 1024 + 1024 + 1024) * 1024 + 4096 * 1024 * 0x6f_f000 / 0x80_0000);
    }

    #[test]
    fn the_child_lacks_what_was_left_out_and_the_parent_keeps_its_flags() {
        use super::super::mman::Mapping;
        let ps = super::super::page_size();
        // 4 MiB: its middle lies beyond the window kept around `kept` wherever it lands.
        let big = Mapping::anonymous(1024 * ps).unwrap();
        let marked = Mapping::anonymous(256 * ps).unwrap();
        let kept = Mapping::anonymous(256 * ps).unwrap();
        for m in [&big, &marked, &kept] {
            // SAFETY: the mappings are ours, writable and 256 pages long.
            unsafe { std::ptr::write_bytes(m.as_ptr(), 1, m.len()) };
        }
        // SAFETY: flags only. Distinct flags keep the three from joining into one mapping.
        unsafe { super::super::mman::madvise(marked.as_ptr(), marked.len(), Advice::LinuxDontFork) }.unwrap();
        // SAFETY: as above.
        unsafe { super::super::mman::madvise(kept.as_ptr(), kept.len(), Advice::LinuxNoHugepage) }.unwrap();
        // Whether the mapping holding m carries MADV_DONTFORK.
        let flags = |m: &Mapping| {
            let a = m.as_ptr() as usize;
            let maps = parse(&std::fs::read_to_string("/proc/self/smaps").unwrap());
            maps.iter().find(|s| s.start <= a && a < s.end).unwrap().dont_fork
        };
        let probe = |m: &Mapping| m.as_ptr() as usize;
        let (b, k) = (probe(&big) + big.len() / 2, probe(&kept));
        // A file the kernel copies into (it reads what pwrite names; /dev/null would not).
        let fd = super::super::memfd::create("advm-lean-fork-test").unwrap();
        let (pid, left) = fork_run_lean(&[(k, 1)], || {
            // The kept mapping reads; the big one is gone (EFAULT), not a crash.
            let got_kept = pwrite_from(fd.as_fd(), k, 4096, 0).is_ok();
            let got_big = pwrite_from(fd.as_fd(), b, 4096, 0);
            match (got_kept, got_big) {
                (true, Err(e)) if e.errno == super::super::Errno::FAULT => 0,
                (true, Ok(())) => 10,
                _ => 11,
            }
        })
        .unwrap();
        assert_eq!(super::super::process::wait_child(pid).unwrap(), 0, "0: big left out; 10: big forked");
        assert!(left.ranges >= 1 && left.bytes >= (256 * ps) as u64, "{left:?}");
        assert!(!flags(&big) && flags(&marked) && !flags(&kept));
    }

    #[test]
    fn a_fork_of_another_thread_waits_while_a_lean_fork_holds_its_marks() {
        let held = crate::sys::process::ForksHeld::take();
        let forked = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let t = scope.spawn(|| {
                let pid = super::super::process::fork_run(|| 0).unwrap();
                forked.store(true, std::sync::atomic::Ordering::SeqCst);
                super::super::process::wait_child(pid).unwrap()
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(!forked.load(std::sync::atomic::Ordering::SeqCst), "fork() went ahead while the marks were on");
            drop(held);
            assert_eq!(t.join().unwrap(), 0);
        });
        assert!(forked.load(std::sync::atomic::Ordering::SeqCst));
    }
}
