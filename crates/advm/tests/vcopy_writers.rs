//! A writer of a block while the arena copies it: no write is lost. Copying a block
//! whose pages were written since its last copy re-homes them (their bytes go into
//! fresh memfd pages, which the block then maps); a write landing between the two was
//! dropped with the old page (a NumPy array lost a writer thread's updates while
//! another thread took `advm.vcopy` snapshots of it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::vcopy::Arena;

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
    let t0 = Instant::now();
    let mut copies = 0;
    while t0.elapsed() < Duration::from_millis(700) {
        let c = arena.dup(block, len).unwrap();
        arena.free(c).unwrap();
        copies += 1;
    }
    done.store(true, Ordering::Release);
    let (model, writes) = writer.join().unwrap();
    let mut got = vec![0u8; len];
    arena.read(block, &mut got).unwrap();
    let lost = got.iter().zip(&model).filter(|(g, m)| g != m).count();
    assert_eq!(lost, 0, "{lost} bytes lost of {writes} writes during {copies} copies");
    assert!(copies > 10 && writes > 1000, "{copies} copies, {writes} writes: the two did not overlap");
}
