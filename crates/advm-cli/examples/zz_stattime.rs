fn main() {
    let pid: i32 = std::env::args().nth(1).unwrap().parse().unwrap();
    for (name, o) in [
        ("default", advm::stats::Options::default()),
        ("mapped_only", advm::stats::Options { mapped_only: true, ..Default::default() }),
        ("mincore", advm::stats::Options { no_cachestat: true, ..Default::default() }),
    ] {
        let mut m = advm::stats::Meter::new(&[pid], o).unwrap();
        let mut t: Vec<f64> = Vec::new();
        let mut last = None;
        for _ in 0..5 { let s = m.sample().unwrap(); t.push(s.measure_ms); last = Some(s); }
        t.sort_by(f64::total_cmp);
        let s = last.unwrap();
        println!("{name:12} median {:8.1} ms (min {:.1} max {:.1}) physical {} MiB held {} pages mapped {}", t[2], t[0], t[4], s.physical_bytes >> 20, s.held_pages, s.mapped_pages);
    }
}
