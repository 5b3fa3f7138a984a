//! The paper's three workloads (Cooper, Nettles & Subramanian, LFP 1992), written on
//! advm-gc's mutator API and sized against a memory limit:
//! - compiler-like: units each build a syntax tree and a symbol table, walk the tree
//!   (a checking pass) and keep a digest of it in a growing environment; live data
//!   rises and falls in a saw tooth on a slowly growing base;
//! - growing sort: rounds each add new numbers to a list and merge-sort it (bottom-up
//!   passes, each building a new list): live data only grows, and every pass turns
//!   the previous list into garbage;
//! - primes: trial division against the primes found so far (a list in the heap),
//!   one short-lived box per candidate: CPU-bound, little live data.
//!
//! Each returns a checksum of what it computed, the same in every setting.
//! Objects are valid only until the next allocation: what is kept sits in root slots.

use advm_gc::{Mutator, Obj, Result};

use crate::gc::workloads::table_push;

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Workload {
    /// Live data rising and falling (the paper's compiler).
    CompilerLike,
    /// Live data growing to the maximum (the paper's sort).
    GrowingSort,
    /// Little live data, CPU work per allocation (the paper's primes).
    Primes,
}

impl Workload {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::CompilerLike => "compiler-like",
            Workload::GrowingSort => "growing-sort",
            Workload::Primes => "primes",
        }
    }

    /// Runs it; `mib` scales its peak live data (about that many MiB; primes: its
    /// candidates, in units of 64k).
    pub fn run(self, m: &mut Mutator, mib: usize) -> Result<u64> {
        match self {
            Workload::CompilerLike => compiler_like(m, mib),
            Workload::GrowingSort => growing_sort(m, mib),
            Workload::Primes => primes(m, mib),
        }
    }
}

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x100_0000_01B3).rotate_left(17)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Node: slot 0 the previous node, slot 1 a subtree; raw: 48 bytes (80 with header).
const NODE_RAW: usize = 48;

fn compiler_like(m: &mut Mutator, mib: usize) -> Result<u64> {
    let peak_nodes = (mib << 20) / (16 + 16 + NODE_RAW);
    let units = 16;
    let mut rng = Rng(0xC0FF_EE12_3456_789B);
    let base = m.roots_len();
    let env = m.push_root(None);
    let mut h = 0u64;
    for u in 0..units {
        // saw tooth: four teeth, 30% to 100% of the peak
        let tooth = (u % 4) as f64 / 3.0;
        let n = (peak_nodes as f64 * (0.3 + 0.6 * tooth) * 0.9) as usize + rng.next() as usize % (peak_nodes / 10);
        let ast = m.push_root(None);
        let syms = m.alloc(256, 0)?;
        let sr = m.push_root(Some(syms));
        let mut nsyms = 0;
        for i in 0..n {
            // a token, garbage at once (the lexer's)
            let tok = m.alloc(0, 24)?;
            m.set_word(tok, 0, i as u64);
            let nd = m.alloc(2, NODE_RAW)?;
            m.set_word(nd, 0, rng.next());
            m.set_word(nd, 5, i as u64);
            let prev = m.root(ast);
            m.set(nd, 0, prev);
            if let Some(p) = prev {
                if rng.next() % 4 == 0 {
                    m.set(nd, 1, m.get(p, 0));
                }
            }
            m.set_root(ast, Some(nd));
            if i % 32 == 0 {
                table_push(m, sr, nsyms, ast)?;
                nsyms += 1;
            }
        }
        // the checking pass: every node read, newest first; one in 64 kept in the
        // environment (a digest: 80 bytes)
        let mut cur = m.root(ast);
        let mut sum = 0u64;
        let mut k = 0usize;
        let keep = m.push_root(None);
        while let Some(nd) = cur {
            sum = mix(sum, m.word(nd, 0) ^ m.word(nd, 5));
            if k % 64 == 0 {
                m.set_root(keep, Some(nd));
                let d = m.alloc(1, NODE_RAW)?;
                let nd = m.root(keep).expect("rooted");
                m.set_word(d, 0, m.word(nd, 0));
                m.set(d, 0, m.root(env));
                m.set_root(env, Some(d));
                cur = m.get(nd, 0);
            } else {
                cur = m.get(nd, 0);
            }
            k += 1;
        }
        h = mix(h, sum ^ nsyms as u64);
        m.truncate_roots(ast);
    }
    let mut cur = m.root(env);
    while let Some(d) = cur {
        h = mix(h, m.word(d, 0));
        cur = m.get(d, 0);
    }
    m.truncate_roots(base);
    Ok(h)
}

/// A list cell holding `v`, its next cell null: slot 0 the next cell, raw word 0 the
/// value (32 bytes with header). The caller links it after the allocation: an object
/// read before it may have moved.
fn cell(m: &mut Mutator, v: u64) -> Result<Obj> {
    let c = m.alloc(1, 8)?;
    m.set_word(c, 0, v);
    Ok(c)
}

fn growing_sort(m: &mut Mutator, mib: usize) -> Result<u64> {
    // two lists live during a pass: the sorted one and the one being built
    let max = (mib << 20) / 2 / 32;
    let rounds = 6;
    let step = max / rounds;
    let mut rng = Rng(0x5EED_0F50_47AB_CDEF);
    let base = m.roots_len();
    let list = m.push_root(None);
    let mut n = 0;
    for _ in 0..rounds {
        for _ in 0..step {
            let c = cell(m, rng.next() >> 16)?;
            m.set(c, 0, m.root(list));
            m.set_root(list, Some(c));
        }
        n += step;
        let mut width = 1;
        while width < n {
            merge_pass(m, list, width)?;
            width *= 2;
        }
    }
    let mut h = 0u64;
    let mut last = 0;
    let mut cur = m.root(list);
    let mut count = 0;
    while let Some(c) = cur {
        let v = m.word(c, 0);
        assert!(v >= last, "growing sort: the list is not sorted");
        last = v;
        h = mix(h, v);
        count += 1;
        cur = m.get(c, 0);
    }
    assert_eq!(count, n, "growing sort: cells lost");
    m.truncate_roots(base);
    Ok(h)
}

/// One bottom-up merge pass over the list in root `list`: runs of `width` merged
/// pairwise into a new list, which replaces it.
fn merge_pass(m: &mut Mutator, list: usize, width: usize) -> Result<()> {
    let head = m.push_root(None);
    let tail = m.push_root(None);
    let a = m.push_root(m.root(list));
    let b = m.push_root(None);
    while m.root(a).is_some() {
        // b: the run after a's
        let mut cur = m.root(a);
        for _ in 0..width {
            cur = cur.and_then(|c| m.get(c, 0));
        }
        m.set_root(b, cur);
        let (mut na, mut nb) = (width, width);
        loop {
            let (ra, rb) = (m.root(a).filter(|_| na > 0), m.root(b).filter(|_| nb > 0));
            let take_a = match (ra, rb) {
                (None, None) => break,
                (Some(x), Some(y)) => m.word(x, 0) <= m.word(y, 0),
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            let from = if take_a { ra } else { rb }.expect("a run with cells");
            let c = cell(m, m.word(from, 0))?;
            // the allocation may have moved everything: read through the roots again
            let (slot, left) = if take_a { (a, &mut na) } else { (b, &mut nb) };
            let from = m.root(slot).expect("rooted");
            m.set_root(slot, m.get(from, 0));
            *left -= 1;
            match m.root(tail) {
                Some(t) => m.set(t, 0, Some(c)),
                None => m.set_root(head, Some(c)),
            }
            m.set_root(tail, Some(c));
        }
        // a continues after b's run
        m.set_root(a, m.root(b));
    }
    m.set_root(list, m.root(head));
    m.truncate_roots(head);
    Ok(())
}

fn primes(m: &mut Mutator, units: usize) -> Result<u64> {
    let limit = (units as u64) << 16;
    let base = m.roots_len();
    let first = m.push_root(None);
    let last = m.push_root(None);
    let mut h = 0u64;
    let mut found = 0u64;
    for c in 2..limit {
        // the candidate, boxed (garbage once tested)
        let b = m.alloc(0, 8)?;
        m.set_word(b, 0, c);
        let mut prime = true;
        let mut cur = m.root(first);
        while let Some(p) = cur {
            let v = m.word(p, 0);
            if v * v > c {
                break;
            }
            if c % v == 0 {
                prime = false;
                break;
            }
            cur = m.get(p, 0);
        }
        if prime {
            let nc = cell(m, c)?;
            match m.root(last) {
                Some(t) => m.set(t, 0, Some(nc)),
                None => m.set_root(first, Some(nc)),
            }
            m.set_root(last, Some(nc));
            found += 1;
            h = mix(h, c);
        }
    }
    m.truncate_roots(base);
    Ok(mix(h, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use advm_gc::{Config, Generational, Heap, Policy};

    fn run(w: Workload, size: usize, g: Option<Generational>) -> u64 {
        let mut c = Config::new(64 << 20);
        // the figures come from every collection
        c.history_limit = usize::MAX;
        c.generational = g;
        c.gc_threads = 1;
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        w.run(&mut m, size).unwrap()
    }

    #[test]
    fn workloads_compute_the_same_result_generational_or_not() {
        let g = Generational {
            policy: Policy::Modified { mem_lim: 2 << 20, min_new_size: 512 << 10, min_old_incr: 1 << 20 },
            copy_back: false,
        };
        for (w, size) in [(Workload::CompilerLike, 2), (Workload::GrowingSort, 1), (Workload::Primes, 1)] {
            assert_eq!(run(w, size, None), run(w, size, Some(g)), "{}", w.name());
        }
    }

    #[test]
    fn growing_sort_keeps_its_list_through_minor_collections_while_it_adds_cells() {
        // A nursery smaller than a round's new cells: minor collections run while the
        // list grows, and each moves the list's young head. The sort checks order and
        // count itself.
        let mut c = Config::new(16 << 20);
        // the figures come from every collection
        c.history_limit = usize::MAX;
        c.gc_threads = 1;
        c.generational = Some(Generational {
            policy: Policy::Modified { mem_lim: 128 << 10, min_new_size: 64 << 10, min_old_incr: 256 << 10 },
            copy_back: false,
        });
        let h = Heap::with_config(c).unwrap();
        let mut m = h.attach();
        let got = Workload::GrowingSort.run(&mut m, 1).unwrap();
        assert!(h.stats().history.iter().filter(|c| c.kind == "minor").count() >= 12);
        assert_eq!(got, run(Workload::GrowingSort, 1, None));
    }

    #[test]
    fn the_sort_sorts_and_primes_counts_the_primes() {
        // 6542 primes below 65536: the checksum folds the count in last
        let h = run(Workload::Primes, 1, None);
        let mut want = 0;
        let mut n = 0;
        for c in 2u64..65536 {
            if (2..).take_while(|d| d * d <= c).all(|d| c % d != 0) {
                want = mix(want, c);
                n += 1;
            }
        }
        assert_eq!(n, 6542);
        assert_eq!(h, mix(want, n));
        run(Workload::GrowingSort, 1, None); // asserts sortedness and count itself
    }
}
