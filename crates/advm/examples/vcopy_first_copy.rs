//! The two 1 GiB figures of `advm bench vcopy` that the arena's bookkeeping decides,
//! measured alone (seconds instead of minutes, so before/after runs can alternate
//! in the same time window): the first virtual copy of a just-written block against
//! memcpy into a fresh mapping, and the distinct physical pages of source and copy
//! once every page of the copy is rewritten, against memcpy.
//!
//! `cargo run --release -p advm --example vcopy_first_copy -- [MiB] [runs]`

use std::time::Instant;

use advm::mem::Region;
use advm::stats::{Meter, Options};
use advm::vcopy::{Arena, Config};

fn fill_distinct(p: *mut u8, len: usize, ps: usize) {
    for i in 0..len / ps {
        // SAFETY: p is a writable mapping of len bytes owned by the caller.
        unsafe {
            std::ptr::write_bytes(p.add(i * ps), (i % 251) as u8, ps);
            std::ptr::write_unaligned(p.add(i * ps).cast::<u64>(), i as u64 ^ 0x5eed);
        }
    }
}

fn touch(p: *mut u8, len: usize, ps: usize, write: bool) -> u64 {
    let mut sum = 0u64;
    for i in 0..len / ps {
        // SAFETY: p is a readable and writable mapping of len bytes.
        unsafe {
            if write {
                std::ptr::write_volatile(p.add(i * ps + 8), 0xa5);
            }
            sum = sum.wrapping_add(std::ptr::read_volatile(p.add(i * ps)) as u64);
        }
    }
    sum
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn distinct(m: &mut Meter) -> i64 {
    let s = m.sample().expect("sample");
    s.distinct.map_or((s.pss_bytes / s.page_size_bytes) as i64, |d| d.total as i64)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let len = args.first().copied().unwrap_or(1024) << 20;
    let runs = args.get(1).copied().unwrap_or(7);
    let ps = advm::addr::page_size();
    let mut meter = Meter::for_self(Options::default()).expect("meter");

    // memcpy into a fresh mapping, then every page rewritten
    let src = Region::new(len).expect("mmap");
    fill_distinct(src.addr().as_ptr(), len, ps);
    let mut memcpy = Vec::new();
    let mut memcpy_pages = 0;
    for run in 0..runs.div_ceil(2) {
        let base = distinct(&mut meter) - (len / ps) as i64;
        let mut dst = Region::new(len).expect("mmap");
        let t = Instant::now();
        dst.bytes_mut().copy_from_slice(src.bytes());
        memcpy.push(t.elapsed().as_secs_f64() * 1e3);
        if run == 0 {
            touch(dst.addr().as_ptr(), len, ps, true);
            touch(src.addr().as_ptr(), len, ps, false);
            memcpy_pages = distinct(&mut meter) - base;
        }
    }
    drop(src);

    let arena = Arena::with_config(Config::default().reserve_bytes(4 * len)).expect("arena");
    let mut vcopy = Vec::new();
    let mut vcopy_pages = 0;
    for run in 0..runs {
        let base = distinct(&mut meter);
        let a = arena.alloc(len).expect("alloc");
        fill_distinct(a.as_ptr(), len, ps);
        let t = Instant::now();
        let b = arena.dup(a, len).expect("dup");
        vcopy.push(t.elapsed().as_secs_f64() * 1e3);
        if run == 0 {
            touch(b.as_ptr(), len, ps, true);
            touch(a.as_ptr(), len, ps, false);
            vcopy_pages = distinct(&mut meter) - base;
        }
        arena.free(b).expect("free");
        arena.free(a).expect("free");
        while arena.stats().deferred_pending > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    let (m, v) = (median(memcpy), median(vcopy));
    println!(
        "{} MiB: memcpy {m:.1} ms, first vcopy {v:.2} ms (median of {runs}), {:.0}x = {:.2}% of memcpy",
        len >> 20,
        m / v,
        100.0 * v / m
    );
    println!(
        "every copy page written: memcpy {memcpy_pages} pages, vcopy {vcopy_pages} pages ({:+})",
        vcopy_pages - memcpy_pages
    );
}
