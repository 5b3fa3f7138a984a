//! docs/vcopy.md's example: virtual copies inside an arena.
//! `cargo run -p advm --example vcopy`

use advm::mem::HostAddr;
use advm::vcopy::Arena;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arena = Arena::new()?; // reserves address space, no memory
    let len = 64 << 20;
    let a: HostAddr = arena.alloc(len)?; // zeroed, page aligned
    arena.fill(a, 7, len)?; // or write through a.as_ptr(), as any memory
    let b = arena.dup(a, len)?; // b is a copy of a: no page copied
    arena.write(HostAddr(b.0 + 4096), &[1])?; // only this page is duplicated
    arena.vcopy(b, a, len)?; // memcpy semantics, by sharing
    arena.prepare_write(b, len)?; // about to rewrite b: one call, not a fault per page
    let mut byte = [0u8];
    arena.read(HostAddr(b.0 + 4096), &mut byte)?;
    assert_eq!(byte[0], 7, "b is a copy of a again");
    println!("{:?}", arena.stats()); // pages shared, copied, re-homed, fallbacks, VMAs
    arena.free(a)?; // b keeps its contents
    arena.free(b)?; // every memfd page is punched: memory back to the kernel
    Ok(())
}
