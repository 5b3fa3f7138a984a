//! Full collections of a heap whose small space is above `Config::parallel_from_bytes`,
//! on 1 or more GC threads: `cargo run --release -p advm-gc --example threads -- THREADS
//! [DEPTH] [ROUNDS]`. A binary tree of 2^DEPTH nodes (default 20: 1 M objects, 48 MiB)
//! stays live; each round allocates as much garbage interleaved with new tree leaves,
//! then collects. Prints each collection's phases and the median pause.

use advm_gc::{Config, Heap, Mutator, Obj};

fn tree(m: &mut Mutator, depth: u32) -> Result<Obj, advm_gc::Error> {
    if depth == 0 {
        return m.alloc(2, 16);
    }
    let l = tree(m, depth - 1)?;
    let r = m.push_root(Some(l));
    let rr = tree(m, depth - 1)?;
    let r2 = m.push_root(Some(rr));
    let n = m.alloc(2, 16)?;
    let (l, rr) = (m.root(r).expect("rooted"), m.root(r2).expect("rooted"));
    m.set(n, 0, Some(l));
    m.set(n, 1, Some(rr));
    m.truncate_roots(r);
    Ok(n)
}

fn main() -> Result<(), advm_gc::Error> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let depth: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(8);
    let mut c = Config::new(512 << 20);
    // the figures come from every collection
    c.history_limit = usize::MAX;
    c.gc_threads = threads;
    let h = Heap::with_config(c)?;
    let mut m = h.attach();
    let t = tree(&mut m, depth)?;
    let root = m.push_root(Some(t));
    for round in 0..rounds {
        // garbage between the tree's objects-to-be: a list of fresh leaves hung off the
        // root's left spine, and as much garbage
        let keep = m.push_root(None);
        for i in 0..(1usize << (depth - 2)) {
            m.alloc(0, 48)?;
            if i % 4 == round % 4 {
                let n = m.alloc(1, 8)?;
                let k = m.root(keep);
                m.set(n, 0, k);
                m.set_root(keep, Some(n));
            }
        }
        m.collect()?;
        m.truncate_roots(keep);
    }
    let _ = m.root(root);
    drop(m);
    let ms = |ns: u64| ns as f64 / 1e6;
    let s = h.stats();
    let mut pauses: Vec<f64> = s.history.iter().map(|c| ms(c.pause_ns)).collect();
    for c in &s.history {
        println!(
            "pause {:7.3} ms  mark {:.3} fwd {:.3} adj {:.3} move {:.3}  live {} objs, {} KiB after",
            ms(c.pause_ns),
            ms(c.mark_ns),
            ms(c.forward_ns),
            ms(c.adjust_ns),
            ms(c.move_ns),
            c.live_objects,
            c.heap_after >> 10
        );
    }
    pauses.sort_by(f64::total_cmp);
    println!("threads {threads}: {} collections, median pause {:.3} ms", pauses.len(), pauses[pauses.len() / 2]);
    Ok(())
}
