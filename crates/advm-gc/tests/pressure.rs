//! Full collections compacting a heap whose objects are partly swapped out (MADV_PAGEOUT
//! to a swap file this test enables) and partly KSM-merged (ksmd scanning the whole
//! process while the collector runs), with several mutator threads, both engines, and
//! the heap verifier after each collection; every live object's bytes are checked
//! against its checksum after each collection. Needs root and swap: skips otherwise.
//! Its own process: it lowers the remap break-even process wide.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use advm_gc::{Config, Engine, Heap, Mutator, Obj};

const MADV_PAGEOUT: i32 = 21;
const PR_SET_MEMORY_MERGE: i32 = 67;

struct Pressure {
    _swap: advm::pager::KernelSwap,
    _ksm: Option<advm::ksm::Session>,
}

fn pressure() -> Option<Pressure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (swapon, KSM settings)");
        return None;
    }
    let path = std::path::PathBuf::from(format!("/tmp/rpress-gcswap-{}", std::process::id()));
    let swap = match advm::pager::KernelSwap::create(&path, 96 << 20) {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            eprintln!("skipped: no swap file: {e}");
            return None;
        }
    };
    let ksm = advm::ksm::Session::start(20_000, 0)
        .inspect_err(|e| eprintln!("KSM not used: {e}"))
        .ok()
        // SAFETY: prctl with integer arguments: every mapping of this process mergeable.
        .filter(|_| unsafe { libc::prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) } == 0);
    Some(Pressure { _swap: swap, _ksm: ksm })
}

fn page_out(addr: usize, len: usize) {
    let ps = advm::mem::page_size();
    let (s, e) = (addr / ps * ps, (addr + len).next_multiple_of(ps));
    // SAFETY: PAGEOUT keeps contents (they are read back from swap); the heap is ours.
    unsafe { libc::madvise(s as *mut libc::c_void, e - s, MADV_PAGEOUT) };
}

/// The most of this process seen swapped out just before a collection.
static MOST_SWAPPED_KIB: AtomicU64 = AtomicU64::new(0);

fn swapped_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmSwap:")?.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One mutator: keeps up to 24 rooted objects (with their checksums), allocates
/// garbage between them, pages objects out, and after each collection it asks for
/// checks every object.
fn mutate(m: &mut Mutator, id: usize, rounds: usize, start: &Barrier) {
    let mut rng = Rng(0x9e37_79b9 + id as u64 * 7919);
    let mut live: Vec<(usize, usize, u64)> = Vec::new(); // (root index, bytes written, checksum)
    let check = |m: &Mutator, live: &[(usize, usize, u64)], when: &str| {
        for &(r, n, sum) in live {
            let o: Obj = m.root(r).unwrap();
            let mut buf = vec![0u8; n];
            m.read_bytes(o, 0, &mut buf);
            assert_eq!(checksum(&buf), sum, "thread {id}: object at root {r} changed {when}");
        }
    };
    start.wait();
    for round in 0..rounds {
        for _ in 0..6 {
            let n = [64, 5000, 20_000, 70_000, 300_000][rng.below(5)];
            let o = m.alloc(0, n).unwrap();
            let mut bytes = vec![0u8; n];
            match rng.below(3) {
                0 => {}                // never written: zero pages
                1 => bytes.fill(0x33), // identical pages: KSM merges them
                _ => bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 31 + id * 7 + round) as u8),
            }
            m.write_bytes(o, 0, &bytes);
            let sum = checksum(&bytes);
            if live.len() < 24 && rng.below(2) == 0 {
                let r = m.push_root(Some(o));
                live.push((r, n, sum));
            } else if !live.is_empty() && rng.below(3) == 0 {
                // replace a live object: the old one becomes garbage below the others
                let k = rng.below(live.len());
                m.set_root(live[k].0, Some(o));
                (live[k].1, live[k].2) = (n, sum);
            }
            let _ = m.alloc(0, [100, 30_000, 200_000][rng.below(3)]).unwrap(); // garbage
        }
        for &(r, _, _) in &live {
            if rng.below(2) == 0 {
                let o = m.root(r).unwrap();
                page_out(o.addr(), m.nbytes(o) + 64);
            }
        }
        if id == 0 && round % 3 == 0 {
            MOST_SWAPPED_KIB.fetch_max(swapped_kib(), Ordering::Relaxed);
            m.collect().unwrap();
        } else {
            m.safepoint();
        }
        check(m, &live, &format!("after round {round}"));
    }
    m.collect().unwrap();
    check(m, &live, "after the last collection");
}

#[test]
fn full_collections_keep_swapped_out_and_merged_objects_intact_with_several_mutators() {
    let Some(_pressure) = pressure() else { return };
    for break_even in [None, Some(1)] {
        advm::remap::set_break_even_pages(break_even);
        for engine in [Engine::Remap, Engine::Memmove] {
            let mut c = Config::new(48 << 20);
            c.verify = true;
            c.gc_threads = 2;
            c.engine = engine;
            c.large_object_bytes = Some(16 << 10);
            let h = Heap::with_config(c).unwrap();
            let threads = 3;
            let rounds = std::env::var("RPRESS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
            let start = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|id| {
                    let h: Heap = h.clone();
                    let start = start.clone();
                    std::thread::spawn(move || {
                        let mut m = h.attach();
                        mutate(&mut m, id, rounds, &start);
                    })
                })
                .collect();
            for t in handles {
                t.join().unwrap();
            }
            let s = h.totals();
            let swap = MOST_SWAPPED_KIB.swap(0, Ordering::Relaxed);
            assert!(swap > 0, "nothing was swapped out before a collection");
            let merged = std::fs::read_to_string("/proc/self/ksm_merging_pages").unwrap_or_default();
            eprintln!(
                "{engine:?} break-even {break_even:?}: {} collections, {} B remapped, {} B copied; up to {swap} KiB swapped out, KSM-merged {}",
                s.collections,
                s.bytes_moved_remap,
                s.bytes_moved_memmove,
                merged.trim()
            );
        }
    }
    advm::remap::set_break_even_pages(None);
}
