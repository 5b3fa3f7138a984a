//! docs/remap.md's example: move and swap page ranges instead of copying bytes.
//! `cargo run -p advm --example remap`

use advm::mem::Region;
use advm::remap::Batch;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut heap = Region::for_remap(64 << 20)?; // private, 2 MiB aligned, ready for UFFDIO_MOVE
    heap.bytes_mut()[4096 * 100..4096 * 140].fill(7);
    let out = heap.move_pages(0, 4096 * 100, 4096 * 40)?; // 40 pages to offset 0
                                                          // Which engine did it: UffdMove, or Memmove when 40 pages are below the break-even.
    println!("{:?} in {} syscalls", out.engine(), out.syscalls);
    assert!(heap.bytes()[..4096 * 40].iter().all(|&b| b == 7));
    heap.swap_pages(0, 8 << 20, 2 << 20)?; // exchange two 2 MiB blocks
    assert_eq!(heap.bytes()[8 << 20], 7);

    // A compaction: many objects, one batch (run in order, as if one after another).
    let base = heap.addr(); // a HostAddr
    let mut b = Batch::new();
    b.push_move(base, base + (2 << 20), 40960).push_move(base + 40960, base + (3 << 20), 40960);
    heap.run(&b)?;
    Ok(())
}
