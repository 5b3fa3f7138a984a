//! docs/gc.md's example: a list in a moving heap, collected with large objects moved
//! as pages. `cargo run -p advm-gc --example gc`

use advm_gc::{Engine, Heap};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let heap = Heap::new(256 << 20)?; // objects may take 256 MiB
    let mut m = heap.attach(); // this thread's mutator
    let list = m.push_root(None); // a root slot
    for i in 0..1000 {
        let cell = m.alloc(1, 8)?; // 1 pointer slot, 8 raw bytes
        m.set_word(cell, 0, i);
        m.set(cell, 0, m.root(list)); // objects move at each allocation:
        m.set_root(list, Some(cell)); // keep them in roots, read them back
    }
    m.alloc(0, 4 << 20)?; // 4 MiB unreachable at once: garbage
    let big = m.alloc(0, 8 << 20)?; // 8 MiB of raw bytes: slid over the garbage as pages
    let big_root = m.push_root(Some(big));
    let c = m.collect()?; // a full collection
    println!("{:.2} ms, {} B as pages, {} B copied", c.pause_ns as f64 / 1e6, c.bytes_remap, c.bytes_memmove);
    let (mut n, mut sum, mut cell) = (0, 0, m.root(list));
    while let Some(o) = cell {
        sum += m.word(o, 0);
        n += 1;
        cell = m.get(o, 0);
    }
    assert_eq!((n, sum), (1000, 999 * 1000 / 2));
    m.set_root(big_root, None);
    heap.set_engine(Engine::Memmove); // the baseline: copy everything
    Ok(())
}
