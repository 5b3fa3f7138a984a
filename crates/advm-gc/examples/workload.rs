//! Runs one workload of `bench/gc/` on a heap of HEAP MiB and prints every collection's
//! phases, for profiling: `cargo run --release -p advm-gc --example workload -- gcbench 8.4 [quick] [threads]
//! [gen|gen-copy-back]` (THREADS: that many GC threads whatever the heap's size; the last:
//! generational, the modified policy with `mem_lim` the heap, as `advm bench gc` runs it,
//! drifting or with copy-back). `ADVM_GC_ENGINE=memmove` picks the engine.

use advm_gc::{Config, Generational, Heap, Policy};

#[allow(missing_docs, dead_code)]
#[path = "../../../bench/gc/workloads.rs"]
mod workloads;

fn main() -> Result<(), advm_gc::Error> {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("gcbench", |s| s.as_str());
    let mib: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(16.0);
    let quick = args.get(3).is_some_and(|a| a == "quick");
    let (_, w) = workloads::ALL.iter().find(|(n, _)| *n == name).expect("a workload of bench/gc/workloads.rs");
    let mut c = Config::new((mib * (1 << 20) as f64) as usize / 4096 * 4096);
    // the figures come from every collection
    c.history_limit = usize::MAX;
    if let Some(t) = args.get(4).and_then(|a| a.parse().ok()) {
        c.gc_threads = t;
        c.parallel_from_bytes = 0; // as many threads as asked, whatever the heap
    }
    if let Some(g) = args.get(5).filter(|a| a.starts_with("gen")) {
        let heap = c.heap_bytes;
        let policy = Policy::Modified { mem_lim: heap, min_new_size: heap / 8, min_old_incr: heap / 4 };
        c.generational = Some(Generational { policy, copy_back: g == "gen-copy-back" });
    }
    if let Ok(e) = std::env::var("ADVM_GC_ENGINE") {
        c.engine = e.parse()?;
    }
    let h = Heap::with_config(c)?;
    let mut m = h.attach();
    let t = std::time::Instant::now();
    let sum = w(&mut m, workloads::Scale { quick })?;
    let total = t.elapsed();
    drop(m);
    let ms = |ns: u64| ns as f64 / 1e6;
    let s = h.stats();
    for c in &s.history {
        println!(
            "{:5} pause {:7.3} ms  stop {:.3} mark {:.3} fwd {:.3} adj {:.3} move {:.3} (large {:.3})  live {} objs, {} KiB after, {} KiB in place, {} KiB as pages, {} KiB parked",
            c.kind,
            ms(c.pause_ns),
            ms(c.stop_ns),
            ms(c.mark_ns),
            ms(c.forward_ns),
            ms(c.adjust_ns),
            ms(c.move_ns),
            ms(c.move_large_ns),
            c.live_objects,
            c.heap_after >> 10,
            c.bytes_in_place >> 10,
            c.bytes_remap >> 10,
            c.bytes_parked >> 10
        );
    }
    let max = s.history.iter().map(|c| c.pause_ns).max().unwrap_or(0);
    println!(
        "{name}: {} collections, max {:.3} ms, total {:.3} s, checksum {sum:#x}",
        s.history.len(),
        ms(max),
        total.as_secs_f64()
    );
    Ok(())
}
