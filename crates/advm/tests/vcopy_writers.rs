//! A writer of a block while the arena copies it: no write is lost. Copying a block
//! whose pages were written since its last copy re-homes them (their bytes go into
//! fresh memfd pages, which the block then maps); a write landing between the two was
//! dropped with the old page (a NumPy array lost a writer thread's updates while
//! another thread took `advm.vcopy` snapshots of it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::vcopy::Arena;

/// Copies `block` (freeing each copy) over and over for `d`; returns how many copies.
fn copy_for(arena: &Arena, block: advm::addr::HostAddr, len: usize, d: Duration) -> usize {
    let t0 = Instant::now();
    let mut copies = 0;
    while t0.elapsed() < d {
        let c = arena.dup(block, len).unwrap();
        arena.free(c).unwrap();
        copies += 1;
    }
    copies
}

#[test]
fn writes_during_copies_of_the_block_are_kept() {
    let ps = advm::addr::page_size();
    let pages = 256;
    let len = pages * ps;
    let arena = Arc::new(Arena::new().unwrap());
    let block = arena.alloc(len).unwrap();
    arena.fill(block, 0, len).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (done, addr) = (done.clone(), block.0);
        std::thread::spawn(move || {
            // the bytes this thread wrote, as it wrote them: the block must end equal
            let mut model = vec![0u8; len];
            let mut k: u64 = 0;
            while !done.load(Ordering::Acquire) {
                k += 1;
                // a pseudo-random byte of a pseudo-random page, a new value each time
                let at = (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize % len;
                let v = (k % 251 + 1) as u8;
                // SAFETY: the block lives until this thread is joined, and only this
                // thread writes it (the main thread reads it after the join).
                unsafe { std::ptr::write_volatile((addr as *mut u8).add(at), v) };
                model[at] = v;
            }
            (model, k)
        })
    };
    let copies = copy_for(&arena, block, len, Duration::from_millis(700));
    done.store(true, Ordering::Release);
    let (model, writes) = writer.join().unwrap();
    let mut got = vec![0u8; len];
    arena.read(block, &mut got).unwrap();
    let lost = got.iter().zip(&model).filter(|(g, m)| g != m).count();
    assert_eq!(lost, 0, "{lost} bytes lost of {writes} writes during {copies} copies");
    assert!(copies > 10 && writes > 1000, "{copies} copies, {writes} writes: the two did not overlap");
}

mod umode;

/// Where the only userfaultfd is the user-mode-only kind, copies of a block another
/// thread fills with `recv` are made by memcpy: every `recv` lands and the block ends
/// as written. The write fence was made of that kind, and a `recv` into a fenced page
/// failed with EFAULT instead of waiting for the copy.
#[test]
fn system_calls_writing_the_block_never_fail_with_a_user_mode_only_userfaultfd() {
    if !umode::body_runs_here("system_calls_writing_the_block_never_fail_with_a_user_mode_only_userfaultfd") {
        return;
    }
    use std::io::{Read, Write};
    let ps = advm::addr::page_size();
    let pages = 256;
    let len = pages * ps;
    let arena = Arc::new(Arena::new().unwrap());
    let block = arena.alloc(len).unwrap();
    arena.fill(block, 0, len).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (done, addr) = (done.clone(), block.0);
        std::thread::spawn(move || {
            let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            let (mut k, mut efaults) = (0u64, 0);
            while !done.load(Ordering::Acquire) {
                k += 1;
                let at = (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize % (len - 8);
                a.write_all(&[(k % 251 + 1) as u8; 8]).unwrap();
                // SAFETY: 8 bytes of the block, which lives until this thread is
                // joined; only the kernel writes them, for this thread.
                let dst = unsafe { std::slice::from_raw_parts_mut((addr as *mut u8).add(at), 8) };
                if let Err(e) = b.read(dst) {
                    assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
                    efaults += 1;
                    b.read_exact(&mut [0; 8]).unwrap();
                }
            }
            (k, efaults)
        })
    };
    let copies = copy_for(&arena, block, len, Duration::from_millis(300));
    done.store(true, Ordering::Release);
    let (writes, efaults) = writer.join().unwrap();
    assert_eq!(efaults, 0, "{efaults} of {writes} recv calls failed with EFAULT during {copies} copies");
    assert!(copies > 10 && writes > 100, "{copies} copies, {writes} writes: the two did not overlap");
}
