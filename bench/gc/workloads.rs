//! The GC benchmark's workloads, written against advm-gc's Rust API (the Java versions
//! beside this file do the same work). Each returns a checksum of what it computed, so
//! runs under different engines and heap sizes can be compared for equal results.
//!
//! Objects are only valid until the next allocation (which may collect): everything a
//! workload keeps across an allocation sits in a root slot or in an object reachable
//! from one, and is read back from there.

use advm_gc::{Mutator, Obj, Result};

/// Size parameters: `quick` for tests and `--quick`, else the full size.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Small sizes.
    pub quick: bool,
}

impl Scale {
    fn pick(self, quick: usize, full: usize) -> usize {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

/// Every workload: name and function.
pub type Workload = fn(&mut Mutator, Scale) -> Result<u64>;

/// The workloads in report order.
pub const ALL: [(&str, Workload); 11] = [
    ("gcbench", gcbench),
    ("binary-trees", binary_trees),
    ("sparse-large", sparse_large),
    ("fft-large", fft_large),
    ("sigverify-1m", |m, s| sigverify(m, s, 1 << 20)),
    ("sigverify-10m", |m, s| sigverify(m, s, 10 << 20)),
    ("sigverify-100m", |m, s| sigverify(m, s, 100 << 20)),
    ("lru-cache", lru_cache),
    ("growing-sort", growing_sort),
    ("compiler-sawtooth", compiler_sawtooth),
    ("primes", primes),
];

/// xorshift64*: the workloads' deterministic random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x0100_0000_01b3).rotate_left(5)
}

// ---- trees (GCBench, binary-trees) ----

/// A tree node: two pointer slots, two raw words.
fn node(m: &mut Mutator) -> Result<Obj> {
    m.alloc(2, 16)
}

/// Bottom-up tree of `depth`; the result is valid until the next allocation.
fn make_tree(m: &mut Mutator, depth: u32) -> Result<Obj> {
    if depth == 0 {
        return node(m);
    }
    let base = m.roots_len();
    let l = make_tree(m, depth - 1)?;
    m.push_root(Some(l));
    let r = make_tree(m, depth - 1)?;
    m.push_root(Some(r));
    let n = node(m)?;
    m.set(n, 0, m.root(base));
    m.set(n, 1, m.root(base + 1));
    m.truncate_roots(base);
    Ok(n)
}

/// Fills the tree rooted in root slot `r` top-down to `depth`.
fn populate(m: &mut Mutator, depth: u32, r: usize) -> Result<()> {
    if depth == 0 {
        return Ok(());
    }
    for side in 0..2 {
        let c = node(m)?;
        let n = m.root(r).expect("rooted node");
        m.set(n, side, Some(c));
        let ci = m.push_root(Some(c));
        populate(m, depth - 1, ci)?;
        m.truncate_roots(ci);
    }
    Ok(())
}

fn count(m: &Mutator, o: Option<Obj>) -> u64 {
    match o {
        None => 0,
        Some(o) => 1 + count(m, m.get(o, 0)) + count(m, m.get(o, 1)),
    }
}

/// Boehm's GCBench: a long-lived tree and array, then short-lived trees of growing
/// depth built top-down and bottom-up.
fn gcbench(m: &mut Mutator, s: Scale) -> Result<u64> {
    let (stretch, long, array, maxd) = if s.quick { (12, 10, 50_000, 10) } else { (16, 14, 500_000, 14) };
    let tree_size = |d: u32| (1u64 << (d + 1)) - 1;
    let base = m.roots_len();
    make_tree(m, stretch)?;
    let lt = node(m)?;
    let lr = m.push_root(Some(lt));
    populate(m, long, lr)?;
    let arr = m.alloc(0, 8 * array)?;
    let ar = m.push_root(Some(arr));
    for i in 0..array / 2 {
        let a = m.root(ar).expect("rooted");
        m.set_word(a, i, (1.0f64 / i.max(1) as f64).to_bits());
    }
    let mut sum = 0u64;
    let mut d = 4;
    while d <= maxd {
        let iters = 2 * tree_size(stretch) / tree_size(d);
        for _ in 0..iters {
            let t = node(m)?;
            let tr = m.push_root(Some(t));
            populate(m, d, tr)?;
            m.truncate_roots(tr);
            let t = make_tree(m, d)?;
            sum += u64::from(m.nptrs(t) == 2);
        }
        d += 2;
    }
    let a = m.root(ar).expect("rooted");
    let check = f64::from_bits(m.word(a, 1000)) == 1.0 / 1000.0;
    let n = count(m, m.root(lr));
    m.truncate_roots(base);
    Ok(mix(mix(sum, n), check as u64))
}

/// The benchmarks game's binary-trees.
fn binary_trees(m: &mut Mutator, s: Scale) -> Result<u64> {
    let n = s.pick(10, 15) as u32;
    let base = m.roots_len();
    let t = make_tree(m, n + 1)?;
    let mut h = count(m, Some(t));
    let long = make_tree(m, n)?;
    let lr = m.push_root(Some(long));
    let mut d = 4;
    while d <= n {
        let iters = 1u64 << (n - d + 4);
        let mut c = 0;
        for _ in 0..iters {
            let t = make_tree(m, d)?;
            c += count(m, Some(t));
        }
        h = mix(h, c);
        d += 2;
    }
    h = mix(h, count(m, m.root(lr)));
    m.truncate_roots(base);
    Ok(h)
}

// ---- arrays of about the size SPECjvm2008's kernels use ----

/// Allocates a raw array of `n` f64 words filled by `f`.
fn f64_array(m: &mut Mutator, n: usize, f: impl Fn(usize) -> f64) -> Result<Obj> {
    let a = m.alloc(0, 8 * n)?;
    let bytes: Vec<u8> = (0..n).flat_map(|i| f(i).to_le_bytes()).collect();
    m.write_bytes(a, 0, &bytes);
    Ok(a)
}

fn read_f64s(m: &Mutator, a: Obj, n: usize) -> Vec<f64> {
    let mut b = vec![0u8; 8 * n];
    m.read_bytes(a, 0, &mut b);
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Sparse.large-shaped: a sparse matrix held as chunks of about 50 KiB (values and
/// column indices), rebuilt every iteration (the old one becomes garbage, with small
/// temporaries between), multiplied with a dense vector several times.
fn sparse_large(m: &mut Mutator, s: Scale) -> Result<u64> {
    const CHUNK: usize = 6400; // 6400 f64 = 50 KiB
    let (chunks, iters) = if s.quick { (24, 8) } else { (160, 24) };
    let n = chunks * CHUNK / 8; // matrix order
    let mut rng = Rng(42);
    let base = m.roots_len();
    let x = f64_array(m, n, |i| (i % 7) as f64 + 0.5)?;
    let xr = m.push_root(Some(x));
    let mr = m.push_root(None);
    let mut h = 0u64;
    for it in 0..iters {
        let mat = m.alloc(chunks, 0)?;
        m.set_root(mr, Some(mat));
        for c in 0..chunks {
            let seed = rng.next();
            // Alternate value/column pairs: column index stored as f64.
            let chunk = f64_array(m, CHUNK, |i| {
                if i % 2 == 0 {
                    ((seed >> (i % 32)) & 0xff) as f64 / 16.0
                } else {
                    ((seed as usize).wrapping_add(i * 2654435761) % n) as f64
                }
            })?;
            let mat = m.root(mr).expect("rooted");
            m.set(mat, c, Some(chunk));
            for _ in 0..8 {
                m.alloc(1, 24)?; // temporaries of the row loop
            }
        }
        let xv = read_f64s(m, m.root(xr).expect("rooted"), n);
        let mat = m.root(mr).expect("rooted");
        let mut y = 0.0;
        for _ in 0..4 {
            for c in 0..chunks {
                let v = read_f64s(m, m.get(mat, c).expect("chunk"), CHUNK);
                for p in v.chunks_exact(2) {
                    y += p[0] * xv[p[1] as usize];
                }
            }
        }
        h = mix(h, (y as u64).wrapping_add(it));
    }
    m.truncate_roots(base);
    Ok(h)
}

fn fft(re: &mut [f64], im: &mut [f64]) {
    let n = re.len();
    let mut j = 0;
    for i in 1..n {
        let mut bit = n >> 1;
        while j & bit != 0 {
            j ^= bit;
            bit >>= 1;
        }
        j |= bit;
        if i < j {
            re.swap(i, j);
            im.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= n {
        let ang = -2.0 * std::f64::consts::PI / len as f64;
        for s in (0..n).step_by(len) {
            for k in 0..len / 2 {
                let (wr, wi) = ((ang * k as f64).cos(), (ang * k as f64).sin());
                let (a, b) = (s + k, s + k + len / 2);
                let (tr, ti) = (re[b] * wr - im[b] * wi, re[b] * wi + im[b] * wr);
                re[b] = re[a] - tr;
                im[b] = im[a] - ti;
                re[a] += tr;
                im[a] += ti;
            }
        }
        len <<= 1;
    }
}

/// FFT.large-shaped: complex arrays of 64 KiB (4096 points, re/im interleaved),
/// transformed in place; a window of the latest ones stays live.
fn fft_large(m: &mut Mutator, s: Scale) -> Result<u64> {
    const POINTS: usize = 4096;
    let (window, iters) = if s.quick { (16, 120) } else { (64, 1200) };
    let base = m.roots_len();
    let win = m.alloc(window, 0)?;
    let wr = m.push_root(Some(win));
    let mut h = 0u64;
    for it in 0..iters {
        let a = f64_array(m, 2 * POINTS, |i| ((i * 31 + it) % 17) as f64)?;
        let v = read_f64s(m, a, 2 * POINTS);
        let (mut re, mut im): (Vec<f64>, Vec<f64>) =
            (v.iter().step_by(2).copied().collect(), v.iter().skip(1).step_by(2).copied().collect());
        fft(&mut re, &mut im);
        let bytes: Vec<u8> =
            re.iter().zip(&im).flat_map(|(r, i)| [r.to_le_bytes(), i.to_le_bytes()]).flatten().collect();
        m.write_bytes(a, 0, &bytes);
        h = mix(h, re[1].to_bits() >> 20);
        let win = m.root(wr).expect("rooted");
        m.set(win, it % window, Some(a));
        m.alloc(0, 200)?; // a small temporary per transform
    }
    m.truncate_roots(base);
    Ok(h)
}

/// Sigverify-shaped: messages of `size` bytes (1, 10 or 100 MiB; a quarter of that in
/// quick runs) are written, hashed ("verified") and kept in a window of two.
fn sigverify(m: &mut Mutator, s: Scale, size: usize) -> Result<u64> {
    let size = if s.quick { size / 4 } else { size };
    let rounds = s.pick(6, 10);
    let base = m.roots_len();
    let win = m.alloc(2, 0)?;
    let wr = m.push_root(Some(win));
    let mut h = 0u64;
    let block: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let mut buf = vec![0u8; 65536];
    for r in 0..rounds {
        let msg = m.alloc(0, size)?;
        for off in (0..size).step_by(65536) {
            let n = 65536.min(size - off);
            m.write_bytes(msg, off, &block[..n]);
        }
        m.set_word(msg, 0, r as u64);
        let mut d = 0u64;
        for off in (0..size).step_by(65536) {
            let n = 65536.min(size - off);
            m.read_bytes(msg, off, &mut buf[..n]);
            d = buf[..n].chunks(8).fold(d, |d, c| mix(d, c[0] as u64));
        }
        h = mix(h, d);
        for _ in 0..16 {
            m.alloc(1, 64)?; // signature and key objects
        }
        let win = m.root(wr).expect("rooted");
        m.set(win, r % 2, Some(msg));
    }
    m.truncate_roots(base);
    Ok(h)
}

/// An LRU cache of values from 1 B to 2 MiB (log-uniform sizes), keys drawn with a
/// skew; entries (prev, next, value; key) in a doubly linked list, a key table.
fn lru_cache(m: &mut Mutator, s: Scale) -> Result<u64> {
    let (keys, cap, ops) = if s.quick { (512, 6 << 20, 3000) } else { (4096, 48 << 20, 30000) };
    let mut rng = Rng(7);
    let base = m.roots_len();
    let table = m.alloc(keys, 0)?;
    let tr = m.push_root(Some(table));
    let head = m.push_root(None); // most recent
    let tail = m.push_root(None); // least recent
    let mut bytes = 0usize;
    let mut sizes = vec![0usize; keys];
    let (mut hits, mut h) = (0u64, 0u64);
    const PREV: usize = 0;
    const NEXT: usize = 1;
    const VAL: usize = 2;
    // Unlinks entry `e` (valid: no allocation happens inside).
    fn unlink(m: &mut Mutator, e: Obj, head: usize, tail: usize) {
        let (p, n) = (m.get(e, PREV), m.get(e, NEXT));
        match p {
            Some(p) => m.set(p, NEXT, n),
            None => m.set_root(head, n),
        }
        match n {
            Some(n) => m.set(n, PREV, p),
            None => m.set_root(tail, p),
        }
    }
    fn push_front(m: &mut Mutator, e: Obj, head: usize, tail: usize) {
        let old = m.root(head);
        m.set(e, PREV, None);
        m.set(e, NEXT, old);
        match old {
            Some(o) => m.set(o, PREV, Some(e)),
            None => m.set_root(tail, Some(e)),
        }
        m.set_root(head, Some(e));
    }
    for _ in 0..ops {
        let k = (rng.below(keys) * rng.below(keys)) / keys; // skewed towards small keys
        let t = m.root(tr).expect("rooted");
        if let Some(e) = m.get(t, k) {
            hits += 1;
            unlink(m, e, head, tail);
            push_front(m, e, head, tail);
            let v = m.get(e, VAL).expect("value");
            h = mix(h, m.word(v, 0));
            continue;
        }
        let size = ((rng.next() % 1_000_000) as f64 / 1e6 * (21.0f64 * std::f64::consts::LN_2)).exp() as usize;
        let size = size.clamp(1, 2 << 20);
        let v = m.alloc(0, size.max(8))?;
        m.set_word(v, 0, k as u64 ^ size as u64);
        let vr = m.push_root(Some(v));
        let e = m.alloc(3, 8)?;
        let v = m.root(vr).expect("rooted");
        m.truncate_roots(vr);
        m.set(e, VAL, Some(v));
        m.set_word(e, 0, k as u64);
        push_front(m, e, head, tail);
        let t = m.root(tr).expect("rooted");
        m.set(t, k, Some(e));
        bytes += size;
        sizes[k] = size;
        while bytes > cap {
            let last = m.root(tail).expect("non-empty");
            let key = m.word(last, 0) as usize;
            unlink(m, last, head, tail);
            let t = m.root(tr).expect("rooted");
            m.set(t, key, None);
            bytes -= sizes[key];
        }
    }
    m.truncate_roots(base);
    Ok(mix(h, hits))
}

/// A sort whose live data grows: each round adds boxed numbers to a larger pointer
/// array (the old array becomes garbage) and sorts it.
fn growing_sort(m: &mut Mutator, s: Scale) -> Result<u64> {
    let (rounds, step) = if s.quick { (8, 3000) } else { (24, 12000) };
    let mut rng = Rng(99);
    let base = m.roots_len();
    let ar = m.push_root(None);
    let mut n = 0;
    for _ in 0..rounds {
        let new = m.alloc(n + step, 0)?;
        let old = m.root(ar);
        for i in 0..n {
            let v = m.get(old.expect("previous array"), i);
            m.set(new, i, v);
        }
        m.set_root(ar, Some(new));
        for i in n..n + step {
            let b = m.alloc(0, 8)?;
            m.set_word(b, 0, rng.next() >> 16);
            let a = m.root(ar).expect("rooted");
            m.set(a, i, Some(b));
        }
        n += step;
        let a = m.root(ar).expect("rooted");
        let mut pairs: Vec<(u64, Obj)> = (0..n)
            .map(|i| {
                let b = m.get(a, i).expect("box");
                (m.word(b, 0), b)
            })
            .collect();
        pairs.sort_unstable_by_key(|p| p.0);
        for (i, (_, b)) in pairs.into_iter().enumerate() {
            m.set(a, i, Some(b));
        }
    }
    let a = m.root(ar).expect("rooted");
    let mut h = 0;
    let mut last = 0;
    for i in 0..n {
        let v = m.word(m.get(a, i).expect("box"), 0);
        assert!(v >= last, "sorted");
        last = v;
        h = mix(h, v);
    }
    m.truncate_roots(base);
    Ok(h)
}

/// Appends the object in root slot `value` to the pointer table in root slot `table`,
/// which holds `n` entries, first doubling the table (a new object; the old one becomes
/// garbage) when it is full. Slots, not objects, because the doubling may collect.
pub(crate) fn table_push(m: &mut Mutator, table: usize, n: usize, value: usize) -> Result<()> {
    let st = m.root(table).expect("rooted");
    let cap = m.nptrs(st);
    if n == cap {
        let bigger = m.alloc(2 * cap, 0)?;
        let st = m.root(table).expect("rooted");
        for k in 0..cap {
            let v = m.get(st, k);
            m.set(bigger, k, v);
        }
        m.set_root(table, Some(bigger));
    }
    let st = m.root(table).expect("rooted");
    m.set(st, n, m.root(value));
    Ok(())
}

/// A compiler-like saw-tooth: each unit builds a syntax tree and a growing symbol table
/// (live until the unit ends, then all garbage); a small result per unit stays.
fn compiler_sawtooth(m: &mut Mutator, s: Scale) -> Result<u64> {
    let (units, nodes) = if s.quick { (12, 12_000) } else { (60, 60_000) };
    let mut rng = Rng(5);
    let base = m.roots_len();
    let results = m.push_root(None);
    for u in 0..units {
        let ast = m.push_root(None);
        let syms = m.alloc(64, 0)?;
        let sr = m.push_root(Some(syms));
        let mut nsyms = 0;
        let n = nodes / 2 + rng.below(nodes);
        for i in 0..n {
            // A node with a child (the previous subtree) and a sibling.
            let nd = m.alloc(2, 24)?;
            m.set_word(nd, 0, i as u64);
            let prev = m.root(ast);
            m.set(nd, 0, prev);
            if rng.below(4) == 0 {
                if let Some(p) = prev {
                    m.set(nd, 1, m.get(p, 0));
                }
            }
            m.set_root(ast, Some(nd));
            if i % 16 == 0 {
                table_push(m, sr, nsyms, ast)?;
                nsyms += 1;
            }
        }
        let r = m.alloc(1, 16)?;
        m.set_word(r, 0, (u * 1000 + nsyms) as u64);
        m.set(r, 0, m.root(results));
        m.set_root(results, Some(r));
        m.truncate_roots(ast);
    }
    let mut h = 0;
    let mut cur = m.root(results);
    while let Some(r) = cur {
        h = mix(h, m.word(r, 0));
        cur = m.get(r, 0);
    }
    m.truncate_roots(base);
    Ok(h)
}

/// CPU-bound: primes by trial division against the primes found so far (boxed in a
/// linked list), little allocation; the loop calls the safepoint.
fn primes(m: &mut Mutator, s: Scale) -> Result<u64> {
    let limit = s.pick(60_000, 400_000) as u64;
    let base = m.roots_len();
    let list = m.push_root(None);
    let mut found: Vec<u64> = Vec::new();
    let mut h = 0;
    for c in 2..limit {
        m.safepoint();
        if found.iter().take_while(|&&p| p * p <= c).all(|&p| c % p != 0) {
            found.push(c);
            let b = m.alloc(1, 8)?;
            m.set_word(b, 0, c);
            m.set(b, 0, m.root(list));
            m.set_root(list, Some(b));
            h = mix(h, c);
        }
    }
    m.truncate_roots(base);
    Ok(mix(h, found.len() as u64))
}
