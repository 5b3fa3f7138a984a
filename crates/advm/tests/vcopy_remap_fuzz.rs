//! Randomized sequences of virtual copies (`advm::vcopy`) and page moves/swaps
//! (`advm::remap`), each mirrored on a plain byte-vector oracle; every live byte is
//! compared after every step. Also: several threads at once on separate regions, and
//! a fork in the middle (the child checks and writes its own view, the parent's view
//! stays as it was). Short by default; `ADVM_RVFUZZ_CASES=N` runs N sequences per test
//! (`ADVM_RVFUZZ_SEED` picks the first seed), and the leak check compares
//! `/proc/self/maps` and open fds before and after.

use advm::mem::{Grant, HostAddr, PageRange, Region};
use advm::remap::{self, Batch, Choice, Engine, Options, PMD_SIZE};
use advm::vcopy::{Arena, Config};

/// The tests of this file run one at a time, so the leak check counts only its own.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn ps() -> usize {
    advm::addr::page_size()
}

fn cases(default: u64) -> u64 {
    std::env::var("ADVM_RVFUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn first_seed() -> u64 {
    std::env::var("ADVM_RVFUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let seed = self.next();
        (0..len).map(|i| (seed.wrapping_add(i as u64).wrapping_mul(0x9E37_79B9) >> 13) as u8).collect()
    }
}

// ---------------------------------------------------------------- virtual copy

/// One arena block and what it must hold.
struct Block {
    addr: HostAddr,
    want: Vec<u8>,
}

struct ArenaFuzz {
    arena: Arena,
    blocks: Vec<Block>,
    rng: Rng,
    seed: u64,
    step: usize,
}

impl ArenaFuzz {
    fn new(seed: u64) -> ArenaFuzz {
        // Three arenas in eight are unusual: a tiny VMA budget (copies fall back to memcpy
        // part way), no reaper, or a higher small-block threshold.
        let config = Config::default().reserve_bytes(1 << 30);
        let config = match seed % 8 {
            1 => config.vma_budget(Some(24)),
            3 => config.background_unmap(false),
            5 => config.small_block_pages(8),
            _ => config,
        };
        let arena = Arena::with_config(config).unwrap();
        ArenaFuzz { arena, blocks: Vec::new(), rng: Rng::new(seed), seed, step: 0 }
    }

    fn ctx(&self, what: &str) -> String {
        format!("vcopy seed {} step {}: {what}", self.seed, self.step)
    }

    /// A block length: mostly small, sometimes across a 2 MiB boundary, sometimes
    /// not a whole number of pages.
    fn block_len(&mut self) -> usize {
        let ps = ps();
        let pages = match self.rng.below(10) {
            0 => PMD_SIZE / ps + self.rng.below(64),
            1 => 1,
            _ => 1 + self.rng.below(48),
        };
        if self.rng.chance(20) {
            pages * ps - self.rng.below(ps - 1) - 1
        } else {
            pages * ps
        }
    }

    fn alloc(&mut self) {
        let len = self.block_len();
        let addr = self.arena.alloc(len).unwrap();
        let rounded = len.div_ceil(ps()) * ps();
        assert_eq!(self.arena.block_len(addr).unwrap(), rounded);
        self.blocks.push(Block { addr, want: vec![0; rounded] });
    }

    fn pick(&mut self) -> usize {
        self.rng.below(self.blocks.len())
    }

    /// A sub-range `(offset, len)` of block `i`, len > 0.
    fn span(&mut self, i: usize, max: usize) -> (usize, usize) {
        let size = self.blocks[i].want.len();
        let len = 1 + self.rng.below(size.min(max));
        (self.rng.below(size - len + 1), len)
    }

    fn write(&mut self) {
        let i = self.pick();
        let (off, len) = self.span(i, 3 * ps());
        let data = self.rng.bytes(len);
        let b = &mut self.blocks[i];
        self.arena.write(HostAddr(b.addr.0 + off), &data).unwrap();
        b.want[off..off + len].copy_from_slice(&data);
    }

    fn dup(&mut self) {
        let i = self.pick();
        let (off, len) = if self.rng.chance(40) { (0, self.blocks[i].want.len()) } else { self.span(i, usize::MAX) };
        let src = HostAddr(self.blocks[i].addr.0 + off);
        let addr = self.arena.dup(src, len).unwrap_or_else(|e| panic!("{}: {e}", self.ctx("dup")));
        let mut want = vec![0; len.div_ceil(ps()) * ps()];
        want[..len].copy_from_slice(&self.blocks[i].want[off..off + len]);
        self.blocks.push(Block { addr, want });
    }

    /// A copy between two blocks (or within one, disjoint), congruent or not.
    fn vcopy(&mut self) {
        let ps = ps();
        let (s, d) = (self.pick(), self.pick());
        let (soff, len) = self.span(s, usize::MAX);
        let dsize = self.blocks[d].want.len();
        if len > dsize {
            return;
        }
        let doff = if self.rng.chance(70) {
            // Same offset within a page as the source: pages can be shared.
            let slots: Vec<usize> = (0..=(dsize - len)).filter(|o| o % ps == soff % ps).collect();
            if slots.is_empty() {
                return;
            }
            slots[self.rng.below(slots.len())]
        } else {
            self.rng.below(dsize - len + 1)
        };
        let (src, dst) = (self.blocks[s].addr.0 + soff, self.blocks[d].addr.0 + doff);
        let overlap = s == d && src < dst + len && dst < src + len;
        let before = self.snapshot();
        let r = self.arena.vcopy(HostAddr(dst), HostAddr(src), len);
        if overlap {
            let e = r.expect_err(&self.ctx("an overlapping vcopy must fail"));
            assert!(matches!(e, advm::Error::InvalidArgument { .. }), "{}: {e}", self.ctx("overlap error"));
            assert_eq!(self.snapshot(), before, "{}", self.ctx("memory changed by a refused vcopy"));
            return;
        }
        r.unwrap_or_else(|e| panic!("{}: {e}", self.ctx("vcopy")));
        let data = self.blocks[s].want[soff..soff + len].to_vec();
        self.blocks[d].want[doff..doff + len].copy_from_slice(&data);
    }

    fn free(&mut self) {
        let i = self.pick();
        let b = self.blocks.swap_remove(i);
        self.arena.free(b.addr).unwrap();
        // A freed block is no longer a valid argument.
        let e = self.arena.free(b.addr).expect_err("double free");
        assert!(matches!(e, advm::Error::InvalidArgument { .. }), "{e}");
    }

    fn snapshot(&self) -> Vec<Vec<u8>> {
        self.blocks
            .iter()
            .map(|b| {
                let mut v = vec![0; b.want.len()];
                self.arena.read(b.addr, &mut v).unwrap();
                v
            })
            .collect()
    }

    fn check(&self) {
        for (k, b) in self.blocks.iter().enumerate() {
            let mut got = vec![0; b.want.len()];
            self.arena.read(b.addr, &mut got).unwrap();
            if got != b.want {
                let at = got.iter().zip(&b.want).position(|(g, w)| g != w).unwrap();
                panic!(
                    "{}: block {k} at {} ({} bytes) differs at offset {at:#x} (page {}): got {} want {}",
                    self.ctx("check"),
                    b.addr,
                    b.want.len(),
                    at / ps(),
                    got[at],
                    b.want[at]
                );
            }
        }
    }

    fn step(&mut self) {
        self.step += 1;
        if self.blocks.len() < 2 {
            self.alloc();
            return;
        }
        match self.rng.below(100) {
            0..=9 if self.blocks.len() < 12 => self.alloc(),
            0..=29 => self.write(),
            30..=44 if self.blocks.len() < 12 => self.dup(),
            30..=79 => self.vcopy(),
            80..=89 => self.free(),
            90..=94 => {
                self.arena.trim().unwrap();
            }
            _ => {
                let i = self.pick();
                let (off, len) = self.span(i, usize::MAX);
                self.arena.prepare_write(HostAddr(self.blocks[i].addr.0 + off), len).unwrap();
            }
        }
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
            self.check();
        }
    }

    fn free_all(&mut self) {
        for b in self.blocks.drain(..) {
            self.arena.free(b.addr).unwrap();
        }
        let s = self.arena.stats();
        assert_eq!(s.blocks, 0, "{}", self.ctx("blocks left"));
        assert_eq!(s.memfd_pages_live, 0, "{}", self.ctx("memfd pages left"));
    }
}

// ---------------------------------------------------------------- move / swap

/// Private anonymous memory with `PROT_NONE` guard pages either side.
struct Guarded {
    base: usize,
    total: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        let ps = ps();
        let total = len + 2 * ps;
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let base = p as usize;
        // SAFETY: our own mapping's first and last pages.
        unsafe {
            assert_eq!(libc::mprotect(p, ps, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect((base + ps + len) as *mut libc::c_void, ps, libc::PROT_NONE), 0);
        }
        Guarded { base, total }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.total) };
    }
}

enum Mem {
    Region(Region),
    Guarded(Guarded),
}

struct RemapFuzz {
    mem: Mem,
    len: usize,
    want: Vec<u8>,
    /// Per page: false where the API leaves the bytes unspecified (a move's vacated
    /// source).
    known: Vec<bool>,
    rng: Rng,
    seed: u64,
    step: usize,
    opts: Options,
}

impl RemapFuzz {
    fn new(seed: u64, kind: usize) -> RemapFuzz {
        let len = 8 << 20;
        let mem = match kind % 3 {
            0 => Mem::Region(Region::for_remap(len).unwrap()),
            1 => Mem::Region(Region::for_remap_with_huge_pages(len).unwrap()),
            _ => Mem::Guarded(Guarded::new(len)),
        };
        let mut f = RemapFuzz {
            mem,
            len,
            want: vec![0; len],
            known: vec![true; len / ps()],
            rng: Rng::new(seed ^ 0x5EED),
            seed,
            step: 0,
            opts: Options::default(),
        };
        // Start with contents everywhere, so every move carries bytes.
        let data = f.rng.bytes(len);
        f.bytes_mut().copy_from_slice(&data);
        f.want = data;
        f
    }

    fn base(&self) -> usize {
        match &self.mem {
            Mem::Region(r) => r.addr().0,
            Mem::Guarded(g) => g.base + ps(),
        }
    }

    fn grant(&mut self) -> Grant<'_> {
        match &mut self.mem {
            Mem::Region(r) => r.grant(),
            Mem::Guarded(g) => {
                let range = PageRange::new("grant", g.base + ps(), g.total - 2 * ps()).unwrap();
                // SAFETY: the test owns the mapping and holds no reference into it while
                // an operation runs.
                unsafe { Grant::for_caller_memory(range) }.unwrap()
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.mem {
            Mem::Region(r) => r.bytes(),
            // SAFETY: mapped read-write while `self` lives; no operation runs meanwhile.
            Mem::Guarded(g) => unsafe { std::slice::from_raw_parts((g.base + ps()) as *const u8, self.len) },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Mem::Region(r) => r.bytes_mut(),
            // SAFETY: as in `bytes`, borrowed mutably through `self`.
            Mem::Guarded(g) => unsafe {
                std::slice::from_raw_parts_mut((g.base + ps()) as *mut u8, g.total - 2 * ps())
            },
        }
    }

    fn ctx(&self, what: &str) -> String {
        format!("remap seed {} step {}: {what} (opts {:?})", self.seed, self.step, self.opts)
    }

    /// A length in bytes: around the break-even, whole 2 MiB blocks, or a few pages.
    fn op_len(&mut self) -> usize {
        let ps = ps();
        match self.rng.below(10) {
            0 => PMD_SIZE * (1 + self.rng.below(2)),
            1 => PMD_SIZE + ps * self.rng.below(3),
            2 => ps * (1 + self.rng.below(512)),
            _ => ps * (1 + self.rng.below(40)),
        }
    }

    /// A page-aligned start for `len` bytes: sometimes 2 MiB aligned, sometimes
    /// straddling a 2 MiB boundary.
    fn start(&mut self, len: usize) -> usize {
        let ps = ps();
        let max = self.len - len;
        match self.rng.below(4) {
            0 => (self.rng.below(max / PMD_SIZE + 1) * PMD_SIZE).min(max / ps * ps),
            1 => {
                let b = PMD_SIZE * (1 + self.rng.below(self.len / PMD_SIZE - 1));
                b.saturating_sub(ps * (1 + self.rng.below(len / ps))).min(max) / ps * ps
            }
            _ => self.rng.below(max / ps + 1) * ps,
        }
    }

    /// A move `(dst, src, len)`: anywhere, or a slide overlapping its source, or
    /// adjacent to it.
    fn pick_move(&mut self) -> (usize, usize, usize) {
        let ps = ps();
        let len = self.op_len();
        let src = self.start(len);
        let dst = match self.rng.below(4) {
            0 => {
                let delta = ps * (1 + self.rng.below(len / ps + 1));
                if self.rng.chance(50) && src + len + delta <= self.len {
                    src + delta
                } else {
                    src.saturating_sub(delta)
                }
            }
            1 if src + 2 * len <= self.len => src + len,
            _ => self.start(len),
        };
        (dst, src, len)
    }

    /// Disjoint ranges `(a, b, len)`, or None when none fit.
    fn pick_swap(&mut self) -> Option<(usize, usize, usize)> {
        let len = self.op_len();
        if 2 * len > self.len {
            return None;
        }
        for _ in 0..8 {
            let a = self.start(len);
            let b = if self.rng.chance(30) && a + 2 * len <= self.len { a + len } else { self.start(len) };
            if a + len <= b || b + len <= a {
                return Some((a, b, len));
            }
        }
        None
    }

    fn apply_move(&mut self, dst: usize, src: usize, len: usize) {
        let ps = ps();
        let k = self.known[src / ps..(src + len) / ps].to_vec();
        self.known[src / ps..(src + len) / ps].iter_mut().for_each(|k| *k = false);
        self.known[dst / ps..(dst + len) / ps].copy_from_slice(&k);
        self.want.copy_within(src..src + len, dst);
    }

    fn apply_swap(&mut self, a: usize, b: usize, len: usize) {
        let ps = ps();
        let (lo, hi) = (a.min(b), a.max(b));
        let (x, y) = self.want.split_at_mut(hi);
        x[lo..lo + len].swap_with_slice(&mut y[..len]);
        let (x, y) = self.known.split_at_mut(hi / ps);
        x[lo / ps..(lo + len) / ps].swap_with_slice(&mut y[..len / ps]);
    }

    /// Writes bytes; a write touching a page whose bytes are unspecified rewrites
    /// that page whole, so `known` stays per page.
    fn write(&mut self) {
        let ps = ps();
        let len = 1 + self.rng.below(3 * ps);
        let mut off = self.rng.below(self.len - len + 1);
        let mut end = off + len;
        if self.known[off / ps..end.div_ceil(ps)].iter().any(|k| !k) {
            (off, end) = (off / ps * ps, end.div_ceil(ps) * ps);
        }
        let data = self.rng.bytes(end - off);
        self.bytes_mut()[off..end].copy_from_slice(&data);
        self.want[off..end].copy_from_slice(&data);
        self.known[off / ps..end.div_ceil(ps)].iter_mut().for_each(|k| *k = true);
    }

    fn pick_opts(&mut self) {
        self.opts = match self.rng.below(6) {
            0 => Options { break_even_pages: Some(0), ..Options::default() },
            1 => Options { break_even_pages: Some(1 << 20), ..Options::default() },
            2 => Options { break_even_pages: Some(1 + self.rng.below(32)), coalesce: false, ..Options::default() },
            3 => Options { engine: Choice::Only(Engine::Memmove), ..Options::default() },
            _ => Options::default(),
        };
    }

    fn one_move(&mut self) {
        let (dst, src, len) = self.pick_move();
        let (b, opts) = (self.base(), self.opts);
        let r = remap::move_pages_with(&mut self.grant(), HostAddr(b + dst), HostAddr(b + src), len, &opts);
        r.unwrap_or_else(|e| panic!("{}: move {dst:#x} <- {src:#x} +{len:#x}: {e}", self.ctx("move")));
        self.apply_move(dst, src, len);
    }

    fn one_swap(&mut self) {
        let Some((a, c, len)) = self.pick_swap() else { return };
        let (b, opts) = (self.base(), self.opts);
        let r = remap::swap_pages_with(&mut self.grant(), HostAddr(b + a), HostAddr(b + c), len, &opts);
        r.unwrap_or_else(|e| panic!("{}: swap {a:#x} <-> {c:#x} +{len:#x}: {e}", self.ctx("swap")));
        self.apply_swap(a, c, len);
    }

    fn batch(&mut self) {
        let mut batch = Batch::with_options(self.opts);
        let mut ops = Vec::new();
        let b = self.base();
        for _ in 0..1 + self.rng.below(6) {
            if self.rng.chance(60) {
                let (d, s, l) = if self.rng.chance(30) && !ops.is_empty() {
                    // Continue the previous move: what a compaction of adjacent objects does.
                    let (pd, ps_, pl, _) = ops[ops.len() - 1];
                    let l = ps() * (1 + self.rng.below(8));
                    if pd + pl + l > self.len || ps_ + pl + l > self.len {
                        continue;
                    }
                    (pd + pl, ps_ + pl, l)
                } else if self.rng.chance(30) && !ops.is_empty() {
                    // Into (or out of) a range an earlier operation of the batch reads
                    // or writes: the batch must run them in order.
                    let (x, y, l, _) = ops[self.rng.below(ops.len())];
                    let other = self.start(l);
                    let mine = if self.rng.chance(50) { x } else { y };
                    if self.rng.chance(50) {
                        (mine, other, l)
                    } else {
                        (other, mine, l)
                    }
                } else {
                    self.pick_move()
                };
                batch.push_move(HostAddr(b + d), HostAddr(b + s), l);
                ops.push((d, s, l, false));
            } else if let Some((x, y, l)) = self.pick_swap() {
                batch.push_swap(HostAddr(b + x), HostAddr(b + y), l);
                ops.push((x, y, l, true));
            }
        }
        let r = batch.execute(&mut self.grant());
        r.unwrap_or_else(|e| panic!("{}: batch {ops:x?}: {e}", self.ctx("batch")));
        for (x, y, l, swap) in ops {
            if swap {
                self.apply_swap(x, y, l);
            } else {
                self.apply_move(x, y, l);
            }
        }
    }

    /// Bad input is refused with an error naming it, and memory is left as it was.
    fn refused(&mut self) {
        let ps = ps();
        let b = self.base();
        let end = b + self.len;
        let before = self.bytes().to_vec();
        let (what, r) = match self.rng.below(4) {
            0 => ("unaligned src", remap::move_pages(&mut self.grant(), HostAddr(b), HostAddr(b + ps + 1), ps)),
            1 => ("unaligned len", remap::move_pages(&mut self.grant(), HostAddr(b), HostAddr(b + ps), ps + 7)),
            2 => {
                let len = ps * (2 + self.rng.below(16));
                let a = self.start(len + ps);
                ("overlapping swap", remap::swap_pages(&mut self.grant(), HostAddr(b + a), HostAddr(b + a + ps), len))
            }
            _ => (
                "range into a PROT_NONE neighbour or past the grant",
                remap::move_pages(&mut self.grant(), HostAddr(end - ps), HostAddr(b), 2 * ps),
            ),
        };
        let e = r.expect_err(&self.ctx(what));
        assert!(matches!(e, advm::Error::InvalidArgument { .. }), "{}: {e:?}", self.ctx(what));
        assert!(self.bytes() == &before[..], "{}", self.ctx("memory changed by a refused operation"));
    }

    fn check(&self) {
        let (ps, got) = (ps(), self.bytes());
        for (p, _) in self.known.iter().enumerate().filter(|(_, k)| **k) {
            let (g, w) = (&got[p * ps..(p + 1) * ps], &self.want[p * ps..(p + 1) * ps]);
            if g != w {
                let at = p * ps + g.iter().zip(w).position(|(a, b)| a != b).unwrap();
                panic!("{}: offset {at:#x} (page {p}) got {} want {}", self.ctx("check"), got[at], self.want[at]);
            }
        }
    }

    fn step(&mut self) {
        self.step += 1;
        self.pick_opts();
        match self.rng.below(100) {
            0..=14 => self.write(),
            15..=44 => self.one_move(),
            45..=64 => self.one_swap(),
            65..=94 => self.batch(),
            _ => self.refused(),
        }
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
            self.check();
        }
    }
}

// ---------------------------------------------------------------- tests

#[test]
fn random_virtual_copies_match_the_oracle() {
    let _serial = serial();
    let n = cases(6);
    for seed in first_seed()..first_seed() + n {
        let mut f = ArenaFuzz::new(seed);
        f.run(60);
        f.free_all();
    }
}

#[test]
fn random_moves_and_swaps_match_the_oracle() {
    let _serial = serial();
    let n = cases(3);
    for seed in first_seed()..first_seed() + n {
        let mut f = RemapFuzz::new(seed, seed as usize);
        f.run(40);
    }
}

/// Threads run independent sequences on separate arenas and regions at once.
#[test]
fn threads_run_independent_sequences_at_once() {
    let _serial = serial();
    let n = cases(1);
    for seed in first_seed()..first_seed() + n {
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let s = seed * 16 + t;
                    let mut a = ArenaFuzz::new(s);
                    let mut r = RemapFuzz::new(s, t as usize);
                    for _ in 0..25 {
                        a.step();
                        a.check();
                        r.step();
                        r.check();
                    }
                    a.free_all();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

fn wait_ok(child: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: status {status:#x}");
}

/// A fork in the middle of a sequence (with another thread running its own): the
/// child checks its view against the oracle, writes and keeps going; the parent's
/// view is as before.
#[test]
fn a_fork_in_the_middle_gives_the_child_its_own_view() {
    let _serial = serial();
    let n = cases(1);
    for seed in first_seed()..first_seed() + n {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bg = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut a = ArenaFuzz::new(seed + 1000);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    a.step();
                    a.check();
                }
            })
        };
        let mut a = ArenaFuzz::new(seed);
        let mut r = RemapFuzz::new(seed, seed as usize);
        a.run(20);
        r.run(10);
        // SAFETY: the child only runs this test's code and exits with _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                a.check();
                r.check();
                a.seed += 1 << 32; // a different sequence from here on
                a.rng = Rng::new(a.seed);
                r.rng = Rng::new(a.seed);
                a.run(20);
                r.run(10);
                for b in &a.blocks {
                    a.arena.fill(b.addr, 0xEE, b.want.len()).unwrap();
                }
                r.bytes_mut().fill(0xEE);
            }));
            // SAFETY: leaves the child without running the parent's atexit handlers.
            unsafe { libc::_exit(if ok.is_ok() { 0 } else { 1 }) };
        }
        wait_ok(child);
        a.check();
        r.check();
        a.run(20);
        r.run(10);
        a.free_all();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        bg.join().unwrap();
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Open fds, as `fd -> target`.
fn fds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| format!("{:?} -> {:?}", e.file_name(), std::fs::read_link(e.path()).ok()))
        .collect();
    v.sort();
    v
}

fn maps() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().map(str::to_string).collect()
}

/// Many sequences on one arena and one region leave no mappings or fds behind.
#[test]
fn long_runs_leak_no_mappings_or_fds() {
    let _serial = serial();
    // Warm up: what advm makes once per process (the reaper thread, the userfaultfd,
    // the /proc/self/maps fd that mapping queries keep, the swap scratch area).
    let mut f = ArenaFuzz::new(7);
    f.run(30);
    f.free_all();
    drop(f);
    for kind in 0..3 {
        RemapFuzz::new(7, kind).run(20);
    }
    std::thread::sleep(std::time::Duration::from_millis(300)); // the warm-up's reaper ends
    let (fd0, maps0, threads0) = (fds(), maps(), threads());
    let n = cases(2);
    for seed in first_seed()..first_seed() + n {
        let mut f = ArenaFuzz::new(seed + 500);
        f.run(40);
        f.free_all();
        drop(f);
        RemapFuzz::new(seed + 500, seed as usize).run(10);
    }
    let (fd1, maps1) = (fds(), maps());
    assert!(fd1.len() <= fd0.len(), "fds grew over {n} sequences: from {fd0:#?} to {fd1:#?}");
    // glibc keeps per-thread malloc arenas and cached thread stacks (each arena's
    // reaper thread leaves them): a bounded number, whatever the count of sequences.
    // A leak per sequence would grow with ADVM_RVFUZZ_CASES.
    let new: Vec<_> = maps1.iter().filter(|l| !maps0.contains(l)).collect();
    assert!(
        maps1.len() <= maps0.len() + 24,
        "mappings grew from {} to {} over {n} sequences; new or changed:\n{new:#?}",
        maps0.len(),
        maps1.len()
    );
    // Every arena's reaper thread ends once its arena is gone (it polls every 200 ms).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while threads() > threads0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(threads() <= threads0, "threads left running after {n} sequences");
}
