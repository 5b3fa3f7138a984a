//! Prints every collection of a Sigverify-shaped run (objects of SIZE MiB, a window
//! of two live) under both engines: `cargo run --release -p advm-gc --example pauses -- 10`.

use advm_gc::{Config, Engine, Heap};

fn main() -> Result<(), advm_gc::Error> {
    let mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    for engine in [Engine::Remap, Engine::Memmove, Engine::Remap, Engine::Memmove] {
        let mut c = Config::new((4 * mib) << 20);
        // the figures come from every collection
        c.history_limit = usize::MAX;
        c.engine = engine;
        let h = Heap::with_config(c)?;
        let mut m = h.attach();
        let win = m.alloc(2, 0)?;
        let wr = m.push_root(Some(win));
        for r in 0..12 {
            let msg = m.alloc(0, mib << 20)?;
            for off in (0..mib << 20).step_by(4096) {
                m.write_bytes(msg, off, &[r as u8; 8]);
            }
            let w = m.root(wr).expect("rooted");
            m.set(w, r % 2, Some(msg));
        }
        for c in h.stats().history {
            println!(
                "{:8} pause {:8.3} ms  mark {:.3} fwd {:.3} adj {:.3} move {:.3} (large {:.3})  remap {} B memmove {} B",
                engine.name(),
                c.pause_ns as f64 / 1e6,
                c.mark_ns as f64 / 1e6,
                c.forward_ns as f64 / 1e6,
                c.adjust_ns as f64 / 1e6,
                c.move_ns as f64 / 1e6,
                c.move_large_ns as f64 / 1e6,
                c.bytes_remap,
                c.bytes_memmove
            );
        }
    }
    Ok(())
}
