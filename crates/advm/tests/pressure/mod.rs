//! What the remap pressure tests share: a 2 MiB-aligned raw mapping, a swap file and
//! KSM for a test's life, shaping a range into swapped-out, huge, merged and untouched
//! pages, and random operations checked against a byte oracle.
#![allow(dead_code)] // each test binary uses part of it

use advm::mem::{Grant, HostAddr, PageRange};
use advm::remap::{self, Batch, Choice, Engine, Options, PMD_SIZE};

pub const MADV_PAGEOUT: i32 = 21;
pub const MADV_COLLAPSE: i32 = 25;

pub fn ps() -> usize {
    advm::addr::page_size()
}

/// A 2 MiB-aligned private anonymous mapping, unmapped on drop.
pub struct Raw {
    base: usize,
    total: usize,
    pub addr: usize,
    pub len: usize,
}

impl Raw {
    pub fn anon(len: usize) -> Raw {
        let total = len + PMD_SIZE;
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
        Raw { base, total, addr: base.next_multiple_of(PMD_SIZE), len }
    }
    pub fn grant(&self) -> Grant<'static> {
        // SAFETY: the test owns the mapping and reads it only between operations.
        unsafe { Grant::for_caller_memory(PageRange::new("grant", self.addr, self.len).unwrap()) }.unwrap()
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: mapped read-write for the test's life; no operation runs meanwhile.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as above; the test holds one slice at a time.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
    pub fn madvise(&self, off: usize, len: usize, advice: i32) -> i32 {
        // SAFETY: advice on part of our own mapping.
        unsafe { libc::madvise((self.addr + off) as *mut libc::c_void, len, advice) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.total) };
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Swap and KSM for the test's life (both undone on drop), or why not.
pub struct Pressure {
    _swap: advm::pager::KernelSwap,
    _ksm: Option<advm::ksm::Session>,
}

pub fn pressure(tag: &str) -> Option<Pressure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (swapon, KSM settings)");
        return None;
    }
    let path = std::path::PathBuf::from(format!("/tmp/rpress-swap-{tag}-{}", std::process::id()));
    let swap = match advm::pager::KernelSwap::create(&path, 64 << 20) {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            eprintln!("skipped: no swap file: {e}");
            return None;
        }
    };
    let ksm = match advm::ksm::Session::start(20_000, 0) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("KSM not used: {e}");
            None
        }
    };
    Some(Pressure { _swap: swap, _ksm: ksm })
}

/// Lays out `len` bytes at `off`: never-touched pages, pages with unique bytes, runs of
/// identical pages (KSM merges them), THP-collapsed 2 MiB blocks; then pages some out.
pub fn shape(m: &Raw, model: &mut [u8], off: usize, len: usize, rng: &mut Rng) {
    let ps = ps();
    let mut p = off;
    while p < off + len {
        let kind = rng.below(4);
        let run = (1 + rng.below(24)).min((off + len - p) / ps) * ps;
        match kind {
            0 => {
                // never touched: drop what is there
                m.madvise(p, run, libc::MADV_DONTNEED);
                model[p..p + run].fill(0);
            }
            1 => {
                let seed = rng.next();
                for (i, b) in m.bytes_mut()[p..p + run].iter_mut().enumerate() {
                    *b = (seed.wrapping_add((i / 8) as u64 * 0x9e37_79b9) >> 24) as u8 | 1;
                }
                model[p..p + run].copy_from_slice(&m.bytes()[p..p + run]);
            }
            _ => {
                let v = 0x40 + (kind as u8);
                m.bytes_mut()[p..p + run].fill(v);
                model[p..p + run].fill(v);
            }
        }
        p += run;
    }
    // Collapse some aligned 2 MiB blocks into THPs, then page out random pieces.
    let mut b = off.next_multiple_of(PMD_SIZE);
    let mut keep = Vec::new();
    while b + PMD_SIZE <= off + len {
        if rng.below(2) == 0 {
            // unique bytes in every page (no KSM, no holes, nothing swapped), then collapse
            let seed = rng.next();
            for (i, w) in m.bytes_mut()[b..b + PMD_SIZE].chunks_mut(8).enumerate() {
                w.copy_from_slice(&(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
            }
            model[b..b + PMD_SIZE].copy_from_slice(&m.bytes()[b..b + PMD_SIZE]);
            if m.madvise(b, PMD_SIZE, MADV_COLLAPSE) != 0 {
                eprintln!("collapse at {b:#x}: {}", std::io::Error::last_os_error());
            } else if rng.below(2) == 0 {
                keep.push(b); // stays huge: not paged out
            }
        }
        b += PMD_SIZE;
    }
    for _ in 0..16 {
        let s = off + rng.below(len / ps) * ps;
        let n = ((1 + rng.below(64)) * ps).min(off + len - s);
        if keep.iter().any(|&k| s < k + PMD_SIZE && k < s + n) {
            continue;
        }
        m.madvise(s, n, MADV_PAGEOUT);
    }
}

pub fn check(m: &Raw, model: &[u8], what: &str) {
    check_range(m, model, 0, model.len(), what);
}

/// [`check`] of `n` bytes at `off` only.
pub fn check_range(m: &Raw, model: &[u8], off: usize, n: usize, what: &str) {
    let ps = ps();
    let got = m.bytes();
    if let Some(p) =
        (off / ps..(off + n).div_ceil(ps)).find(|&p| got[p * ps..(p + 1) * ps] != model[p * ps..(p + 1) * ps])
    {
        panic!(
            "{what}: page {p} differs: got {:?}.., want {:?}..",
            &got[p * ps..p * ps + 8],
            &model[p * ps..p * ps + 8]
        );
    }
}

pub fn opts(rng: &mut Rng) -> Options {
    let engine = match rng.below(3) {
        // not in a forked child of a process that used it (the cgroup test's)
        0 if remap::uffd_move_available() => Choice::Only(Engine::UffdMove),
        1 => Choice::Only(Engine::Mremap),
        _ => Choice::Auto,
    };
    let break_even_pages = Some([0, 1, 4, 64][rng.below(4)]);
    Options { engine, break_even_pages, ..Options::default() }
}

/// The model's bytes in the ranges one round touches, taken before it: a copy of the
/// whole model each round would churn `len` bytes of fresh memory a round, and in the
/// cgroup test that churn pushed the child from swapping into thrashing (OOM-killed).
pub struct Before(Vec<(usize, Vec<u8>)>);

impl Before {
    pub fn take(model: &[u8], ranges: &[(usize, usize)]) -> Self {
        Before(ranges.iter().map(|&(off, n)| (off, model[off..off + n].to_vec())).collect())
    }

    /// `len` bytes at `off`, which lie inside one taken range.
    pub fn at(&self, off: usize, len: usize) -> &[u8] {
        let (start, bytes) = self
            .0
            .iter()
            .find(|(start, bytes)| off >= *start && off + len <= start + bytes.len())
            .unwrap_or_else(|| panic!("{off:#x}+{len:#x} was not taken"));
        &bytes[off - start..off - start + len]
    }
}

/// After a move, the source's uncovered pages are unspecified but must be zero, the
/// old source or the old destination: take them into the model.
pub fn settle_source(m: &Raw, model: &mut [u8], before: &Before, dst: usize, src: usize, n: usize, what: &str) {
    let ps = ps();
    let got = m.bytes();
    for p in (src..src + n).step_by(ps) {
        if p >= dst && p < dst + n {
            continue;
        }
        let page = &got[p..p + ps];
        let old_dst = dst + (p - src);
        let ok = page.iter().all(|&b| b == 0) || page == before.at(p, ps) || page == before.at(old_dst, ps);
        assert!(ok, "{what}: source page at {p:#x}: {:?}", &page[..8]);
        model[p..p + ps].copy_from_slice(page);
    }
}

/// `rounds` random moves, swaps and batches over `m`, each checked against `model`;
/// with `reshape`, every 10th round reshapes part of the range.
pub fn fuzz(m: &Raw, model: &mut [u8], rng: &mut Rng, rounds: usize, reshape: bool) -> remap::Outcome {
    let ps = ps();
    let len = m.len;
    let mut total = remap::Outcome::default();
    let mut add = |o: remap::Outcome| {
        total.uffd_move_bytes += o.uffd_move_bytes;
        total.mremap_bytes += o.mremap_bytes;
        total.memmove_bytes += o.memmove_bytes;
        total.fallback_bytes += o.fallback_bytes;
    };
    let pages = len / ps;
    for round in 0..rounds {
        let o = opts(rng);
        let big = rng.below(3) == 0;
        let n = if big { (1 + rng.below(2)) * PMD_SIZE } else { (1 + rng.below(80)) * ps };
        let align = |x: usize| if big || rng_aligned(x) { x / PMD_SIZE * PMD_SIZE } else { x };
        let a = align(rng.below(pages - n / ps) * ps);
        let b = align(rng.below(pages - n / ps) * ps);
        let kind = rng.below(3);
        let what = format!("round {round}: kind {kind} a {a:#x} b {b:#x} n {n:#x} {o:?}");
        let disjoint = a + n <= b || b + n <= a;
        let mut o2 = o;
        // the ranges this round touches: checked after it, every byte every 10th round
        let mut touched = vec![(a, n), (b, n)];
        match kind {
            0 => {
                // move b <- a
                let before = Before::take(model, &touched);
                if o.engine == Choice::Only(Engine::Mremap) && !disjoint {
                    o2.engine = Choice::Auto;
                }
                let res = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + b), HostAddr(m.addr + a), n, &o2);
                if let Err(e) = &res {
                    if matches!(o2.engine, Choice::Only(Engine::Mremap | Engine::UffdMove)) {
                        // a page engine cannot do every move (UFFDIO_MOVE: anonymous
                        // memory only): an error, nothing changed
                        eprintln!("{what}: {e}");
                        check(m, model, &what);
                        continue;
                    }
                }
                add(res.unwrap_or_else(|e| panic!("{what}: {e}")));
                model[b..b + n].copy_from_slice(before.at(a, n));
                settle_source(m, model, &before, b, a, n, &what);
            }
            1 if disjoint => {
                let before = Before::take(model, &touched);
                if o.engine == Choice::Only(Engine::Mremap) {
                    o2.engine = Choice::Auto;
                }
                let res = remap::swap_pages_with(&mut m.grant(), HostAddr(m.addr + a), HostAddr(m.addr + b), n, &o2);
                if let (Err(e), Choice::Only(Engine::UffdMove)) = (&res, o2.engine) {
                    eprintln!("{what}: {e}");
                    check(m, model, &what);
                    continue;
                }
                add(res.unwrap_or_else(|e| panic!("{what}: {e}")));
                model[a..a + n].copy_from_slice(before.at(b, n));
                model[b..b + n].copy_from_slice(before.at(a, n));
            }
            _ => {
                // a batch of small swaps between disjoint page pairs
                let mut batch = Batch::with_options(Options { engine: Choice::Auto, ..o });
                let mut used = vec![false; pages];
                let mut pairs = Vec::new();
                for _ in 0..8 {
                    let k = 1 + rng.below(16);
                    let x = rng.below(pages - k);
                    let y = rng.below(pages - k);
                    if (x..x + k).chain(y..y + k).any(|p| used[p]) || x.abs_diff(y) < k {
                        continue;
                    }
                    (x..x + k).chain(y..y + k).for_each(|p| used[p] = true);
                    batch.push_swap(HostAddr(m.addr + x * ps), HostAddr(m.addr + y * ps), k * ps);
                    pairs.push((x * ps, y * ps, k * ps));
                }
                touched = pairs.iter().flat_map(|&(x, y, k)| [(x, k), (y, k)]).collect();
                let before = Before::take(model, &touched);
                add(batch.execute(&mut m.grant()).unwrap_or_else(|e| panic!("{what}: batch: {e}")));
                for (x, y, k) in pairs {
                    model[x..x + k].copy_from_slice(before.at(y, k));
                    model[y..y + k].copy_from_slice(before.at(x, k));
                }
            }
        }
        if round % 10 == 9 || round + 1 == rounds {
            check(m, model, &what);
        } else {
            touched.iter().for_each(|&(off, n)| check_range(m, model, off, n, &what));
        }
        if reshape && round % 10 == 9 {
            let off = rng.below(pages / 2) * ps;
            shape(m, model, off, (len - off).min(4 << 20), rng);
            check(m, model, &format!("{what}: reshaped"));
        }
    }
    total
}

pub fn rng_aligned(x: usize) -> bool {
    x % 3 == 0
}

/// A field of /proc/self/status (or smaps_rollup) in KiB.
pub fn status_kib(field: &str) -> u64 {
    let f = if field == "AnonHugePages:" { "/proc/self/smaps_rollup" } else { "/proc/self/status" };
    let text = std::fs::read_to_string(f).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's KSM-merged pages, after waiting (up to 3 s) for ksmd to merge some.
pub fn wait_merged() -> u64 {
    let read = || {
        std::fs::read_to_string("/proc/self/ksm_merging_pages")
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let t = std::time::Instant::now();
    while read() == 0 && t.elapsed() < std::time::Duration::from_secs(3) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    read()
}
