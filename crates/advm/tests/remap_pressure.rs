//! advm::remap under real memory pressure: ranges partly swapped out (MADV_PAGEOUT to a
//! swap file this test enables), partly transparent huge pages (collapsed with
//! MADV_COLLAPSE, split by unaligned moves), partly KSM-merged (ksmd scanning while
//! operations run), partly never touched, checked against a byte oracle. Needs root
//! and swap: skips with the reason otherwise.

use advm::mem::{Grant, HostAddr, PageRange};
use advm::remap::{self, Batch, Choice, Engine, Options, PMD_SIZE};

const MADV_PAGEOUT: i32 = 21;
const MADV_COLLAPSE: i32 = 25;

fn ps() -> usize {
    advm::addr::page_size()
}

/// A 2 MiB-aligned private anonymous mapping, unmapped on drop.
struct Raw {
    base: usize,
    total: usize,
    addr: usize,
    len: usize,
}

impl Raw {
    fn anon(len: usize) -> Raw {
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
    fn grant(&self) -> Grant<'static> {
        // SAFETY: the test owns the mapping and reads it only between operations.
        unsafe { Grant::for_caller_memory(PageRange::new("grant", self.addr, self.len).unwrap()) }.unwrap()
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped read-write for the test's life; no operation runs meanwhile.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as above; the test holds one slice at a time.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
    fn madvise(&self, off: usize, len: usize, advice: i32) -> i32 {
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

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Swap and KSM for the test's life (both undone on drop), or why not.
struct Pressure {
    _swap: advm::pager::KernelSwap,
    _ksm: Option<advm::ksm::Session>,
}

fn pressure(tag: &str) -> Option<Pressure> {
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
fn shape(m: &Raw, model: &mut [u8], off: usize, len: usize, rng: &mut Rng) {
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

fn check(m: &Raw, model: &[u8], what: &str) {
    let ps = ps();
    let got = m.bytes();
    if let Some(p) = (0..model.len() / ps).find(|&p| got[p * ps..(p + 1) * ps] != model[p * ps..(p + 1) * ps]) {
        panic!(
            "{what}: page {p} differs: got {:?}.., want {:?}..",
            &got[p * ps..p * ps + 8],
            &model[p * ps..p * ps + 8]
        );
    }
}

fn opts(rng: &mut Rng) -> Options {
    let engine = match rng.below(3) {
        // not in a forked child of a process that used it (the cgroup test's)
        0 if remap::uffd_move_available() => Choice::Only(Engine::UffdMove),
        1 => Choice::Only(Engine::Mremap),
        _ => Choice::Auto,
    };
    let break_even_pages = Some([0, 1, 4, 64][rng.below(4)]);
    Options { engine, break_even_pages, ..Options::default() }
}

/// After a move, the source's uncovered pages are unspecified but must be zero, the
/// old source or the old destination: take them into the model.
fn settle_source(m: &Raw, model: &mut [u8], before: &[u8], dst: usize, src: usize, n: usize, what: &str) {
    let ps = ps();
    let got = m.bytes();
    for p in (src..src + n).step_by(ps) {
        if p >= dst && p < dst + n {
            continue;
        }
        let page = &got[p..p + ps];
        let old_dst = dst + (p - src);
        let ok = page.iter().all(|&b| b == 0) || page == &before[p..p + ps] || page == &before[old_dst..old_dst + ps];
        assert!(ok, "{what}: source page at {p:#x}: {:?}", &page[..8]);
        model[p..p + ps].copy_from_slice(page);
    }
}

#[test]
fn moves_and_swaps_of_swapped_out_huge_and_merged_pages_keep_every_byte() {
    let Some(_pressure) = pressure("ops") else { return };
    let len = 16 << 20;
    let m = Raw::anon(len);
    // Whole-mapping advice: per-run advice would split it into VMAs too small to collapse.
    assert_eq!(m.madvise(0, len, libc::MADV_MERGEABLE), 0);
    assert_eq!(m.madvise(0, len, libc::MADV_HUGEPAGE), 0);
    let mut model = vec![0u8; len];
    let seed = std::env::var("RPRESS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_1234_abcd_0001);
    let mut rng = Rng(seed);
    shape(&m, &mut model, 0, len, &mut rng);
    let (swapped, merged) = (status_kib("VmSwap:"), wait_merged());
    eprintln!("swapped out {swapped} KiB, KSM-merged {merged} pages, THP {} KiB", status_kib("AnonHugePages:"));
    assert!(swapped > 0, "MADV_PAGEOUT swapped nothing out");
    check(&m, &model, "after shaping");
    let rounds = std::env::var("RPRESS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    let total = fuzz(&m, &mut model, &mut rng, rounds, true);
    eprintln!("{total:?}");
    assert!(total.uffd_move_bytes + total.mremap_bytes > 0, "no page engine ran: {total:?}");
}

/// `rounds` random moves, swaps and batches over `m`, each checked against `model`;
/// with `reshape`, every 10th round reshapes part of the range.
fn fuzz(m: &Raw, model: &mut [u8], rng: &mut Rng, rounds: usize, reshape: bool) -> remap::Outcome {
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
        let before = model.to_vec();
        let what = format!("round {round}: kind {kind} a {a:#x} b {b:#x} n {n:#x} {o:?}");
        let disjoint = a + n <= b || b + n <= a;
        let mut o2 = o;
        match kind {
            0 => {
                // move b <- a
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
                let moved = before[a..a + n].to_vec();
                model[b..b + n].copy_from_slice(&moved);
                settle_source(m, model, &before, b, a, n, &what);
            }
            1 if disjoint => {
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
                model[a..a + n].copy_from_slice(&before[b..b + n]);
                model[b..b + n].copy_from_slice(&before[a..a + n]);
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
                add(batch.execute(&mut m.grant()).unwrap_or_else(|e| panic!("{what}: batch: {e}")));
                for (x, y, k) in pairs {
                    model[x..x + k].copy_from_slice(&before[y..y + k]);
                    model[y..y + k].copy_from_slice(&before[x..x + k]);
                }
            }
        }
        check(m, model, &what);
        if reshape && round % 10 == 9 {
            let off = rng.below(pages / 2) * ps;
            shape(m, model, off, (len - off).min(4 << 20), rng);
            check(m, model, &format!("{what}: reshaped"));
        }
    }
    total
}

fn rng_aligned(x: usize) -> bool {
    x % 3 == 0
}

/// A field of /proc/self/status (or smaps_rollup) in KiB.
fn status_kib(field: &str) -> u64 {
    let f = if field == "AnonHugePages:" { "/proc/self/smaps_rollup" } else { "/proc/self/status" };
    let text = std::fs::read_to_string(f).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's KSM-merged pages, after waiting (up to 3 s) for ksmd to merge some.
fn wait_merged() -> u64 {
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

#[test]
fn a_move_of_swapped_out_pages_moves_their_swap_entries() {
    let Some(_pressure) = pressure("probe") else { return };
    if !remap::uffd_move_available() {
        eprintln!("skipped: no UFFDIO_MOVE here");
        return;
    }
    let ps = ps();
    let len = 8 << 20;
    let m = Raw::anon(len);
    let o = Options { engine: Choice::Only(Engine::UffdMove), break_even_pages: Some(0), ..Options::default() };
    // swapped out
    for (i, b) in m.bytes_mut()[..512 * ps].iter_mut().enumerate() {
        *b = (i / 7) as u8 | 1;
    }
    let want = m.bytes()[..512 * ps].to_vec();
    assert_eq!(m.madvise(0, 512 * ps, MADV_PAGEOUT), 0);
    assert!(status_kib("VmSwap:") >= 512 * ps as u64 / 1024 / 2, "pageout left pages in memory");
    let out = remap::move_pages_with(
        &mut m.grant(),
        HostAddr(m.addr + 4 * PMD_SIZE - 600 * ps),
        HostAddr(m.addr),
        512 * ps,
        &o,
    )
    .unwrap();
    assert_eq!(out.fallback_bytes, 0, "{out:?}");
    assert_eq!(&m.bytes()[4 * PMD_SIZE - 600 * ps..][..512 * ps], &want[..]);
}

fn filled(len: usize, seed: u8) -> Raw {
    let m = Raw::anon(len);
    for (i, w) in m.bytes_mut().chunks_mut(8).enumerate() {
        w.copy_from_slice(&((i as u64) << 8 | seed as u64).to_le_bytes());
    }
    m
}

#[test]
fn moves_into_swapped_out_mlocked_and_foreign_userfaultfd_destinations_and_from_mlocked_sources_complete() {
    let Some(_pressure) = pressure("probed") else { return };
    let ps = ps();
    for engine in [Choice::Only(Engine::UffdMove), Choice::Only(Engine::Memmove), Choice::Auto] {
        if engine == Choice::Only(Engine::UffdMove) && !remap::uffd_move_available() {
            continue;
        }
        for n in [4 * ps, 64 * ps, PMD_SIZE] {
            let o = Options { engine, break_even_pages: Some(8), ..Options::default() };
            // swapped-out destination
            let m = filled(4 * PMD_SIZE, 1);
            let want = m.bytes()[..n].to_vec();
            m.madvise(2 * PMD_SIZE, PMD_SIZE, MADV_PAGEOUT);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} swapped-out dst: {e}"));
            assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            // mlocked destination
            let m = filled(4 * PMD_SIZE, 2);
            let want = m.bytes()[..n].to_vec();
            // SAFETY: locks part of our own mapping.
            assert_eq!(unsafe { libc::mlock((m.addr + 2 * PMD_SIZE) as *const libc::c_void, PMD_SIZE) }, 0);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            let out = r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} mlocked dst: {e}"));
            // UFFDIO_MOVE refuses a locked destination: copied after one registration
            // and one retry, not after 16 (34 calls)
            assert!(out.syscalls <= 6, "{engine:?} {n:#x} mlocked dst: {out:?}");
            {
                assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            }
            // mlocked source
            let m = filled(4 * PMD_SIZE, 3);
            let want = m.bytes()[..n].to_vec();
            // SAFETY: locks part of our own mapping.
            assert_eq!(unsafe { libc::mlock(m.addr as *const libc::c_void, PMD_SIZE) }, 0);
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            let out = r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} mlocked src: {e}"));
            assert!(out.syscalls <= 8, "{engine:?} {n:#x} mlocked src: {out:?}");
            {
                assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            }
            // destination registered (missing mode) on someone else's userfaultfd
            let m = filled(4 * PMD_SIZE, 4);
            let want = m.bytes()[..n].to_vec();
            m.madvise(2 * PMD_SIZE, PMD_SIZE, libc::MADV_DONTNEED);
            let fd = foreign_uffd(m.addr + 2 * PMD_SIZE, PMD_SIZE);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let server = serve_zero_pages(fd, stop.clone());
            let r = remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + 2 * PMD_SIZE), HostAddr(m.addr), n, &o);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let served = server.join().unwrap();
            r.unwrap_or_else(|e| panic!("{engine:?} {n:#x} foreign-uffd dst ({served} faults served): {e}"));
            assert_eq!(&m.bytes()[2 * PMD_SIZE..][..n], &want[..]);
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
        }
    }
}

/// Serves missing faults on `fd` with zero pages until `stop`; returns how many.
fn serve_zero_pages(fd: i32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut served = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let mut msg = [0u64; 4];
            // SAFETY: reads one 32-byte uffd_msg into our buffer.
            let r = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), 32) };
            if r != 32 {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            if msg[0] & 0xff == 0x12 {
                let page = msg[2] & !(ps() as u64 - 1);
                let mut zp = [page, ps() as u64, 0, 0];
                // SAFETY: UFFDIO_ZEROPAGE with a correctly sized struct.
                unsafe { libc::ioctl(fd, 0xc020aa04, zp.as_mut_ptr()) };
                served += 1;
            }
        }
        served
    })
}

/// A userfaultfd of the test's own with `[addr, addr+len)` registered in missing mode.
fn foreign_uffd(addr: usize, len: usize) -> i32 {
    // SAFETY: plain syscalls and ioctls on a fresh fd with correctly sized structs.
    unsafe {
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32;
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        let mut api = [0xAAu64, 0, 0];
        assert_eq!(libc::ioctl(fd, 0xc018aa3f, api.as_mut_ptr()), 0);
        let mut reg = [addr as u64, len as u64, 1, 0];
        assert_eq!(libc::ioctl(fd, 0xc020aa00, reg.as_mut_ptr()), 0, "{}", std::io::Error::last_os_error());
        fd
    }
}

/// The same random operations in a child limited by a memory cgroup to less than it
/// touches, so the kernel swaps anonymous pages and reclaims page-cache pages of a
/// file-backed private part (the range's middle 4 MiB) while pages move.
#[test]
fn moves_and_swaps_under_a_cgroup_limit_while_the_kernel_swaps_and_reclaims_keep_every_byte() {
    let Some(_pressure) = pressure("cg") else { return };
    let group = match advm::stats::cgroup::Group::create("rpress") {
        Ok(g) => g,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    let len = 12 << 20;
    group.set_limit_bytes(32 << 20).unwrap();
    let file = std::path::PathBuf::from(format!("/tmp/rpress-file-{}", std::process::id()));
    let pattern: Vec<u8> = (0..4 << 20).map(|i: usize| (i / 4096 * 13 + i % 251) as u8 | 1).collect();
    std::fs::write(&file, &pattern).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let m = Raw::anon(len);
    use std::os::fd::AsRawFd;
    // SAFETY: replaces the middle of our own mapping with a private view of the file.
    let p = unsafe {
        libc::mmap(
            (m.addr + (4 << 20)) as *mut libc::c_void,
            4 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    drop(f);
    let _ = std::fs::remove_file(&file); // the mapping keeps the file's pages
    let r = group.run_in_child(|| {
        // no default panic message: another test thread may have held stderr at the fork
        std::panic::set_hook(Box::new(|_| {}));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut model = vec![0u8; len];
            let mut rng = Rng(0x5eed_0000_c6c6_0001);
            shape(&m, &mut model, 0, 4 << 20, &mut rng);
            model[4 << 20..8 << 20].copy_from_slice(&pattern);
            shape(&m, &mut model, 8 << 20, 4 << 20, &mut rng);
            check(&m, &model, "after shaping");
            let total = fuzz(&m, &mut model, &mut rng, 60, false);
            let swapped = status_kib("VmSwap:");
            format!("{total:?}, {swapped} KiB swapped out at the end").into_bytes()
        }))
        .map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    group.remove().unwrap();
    let out = r.unwrap().unwrap_or_else(|e| panic!("in the cgroup: {e}"));
    eprintln!("{}", String::from_utf8_lossy(&out));
}

/// A move out of a range spanning a private file view and anonymous memory is copied
/// (neither page engine takes it whole); the copied source must then read as zeros or
/// its old bytes, never as the file's bytes again (it did: the copied source was emptied
/// with MADV_DONTNEED, which makes a private file view show the file).
#[test]
fn a_copied_move_out_of_a_private_file_view_never_shows_the_file_again() {
    let ps = ps();
    let file = std::path::PathBuf::from(format!("/tmp/rpress-file2-{}", std::process::id()));
    std::fs::write(&file, vec![0x77u8; 8 << 20]).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let _ = std::fs::remove_file(&file); // mappings keep the file's pages
    let engines = [Choice::Auto, Choice::Only(Engine::Mremap), Choice::Only(Engine::UffdMove)];
    for engine in engines {
        for (from, n) in [(6 << 20, 4 << 20), ((8 << 20) - 4 * ps, 8 * ps), (14 << 20, 4 << 20)] {
            let m = Raw::anon(24 << 20);
            use std::os::fd::AsRawFd;
            // SAFETY: replaces the middle of our own mapping with a private view of the file.
            let p = unsafe {
                libc::mmap(
                    (m.addr + (8 << 20)) as *mut libc::c_void,
                    8 << 20,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            m.bytes_mut()[from..from + n].fill(5); // private copies of the file's pages
            let o = Options { engine, break_even_pages: Some(0), ..Options::default() };
            let what = format!("{engine:?} move of {n:#x} from {from:#x}");
            match remap::move_pages_with(&mut m.grant(), HostAddr(m.addr + (20 << 20)), HostAddr(m.addr + from), n, &o)
            {
                Ok(_) => {}
                Err(e) if engine == Choice::Only(Engine::UffdMove) => {
                    // the engine's refusal names the memory, not the kernel
                    assert!(matches!(e, advm::Error::InvalidArgument { what: "engine", .. }), "{what}: {e}");
                    assert!(e.to_string().contains("file-backed"), "{what}: {e}");
                    continue;
                }
                Err(e) => panic!("{what}: {e}"),
            }
            assert!(m.bytes()[20 << 20..][..n].iter().all(|&b| b == 5), "{what}: destination");
            if let Some(i) = m.bytes()[from..from + n].iter().position(|&b| b != 0 && b != 5) {
                panic!("{what}: source byte {:#x} reads {:#x} (the file's)", from + i, m.bytes()[from + i]);
            }
        }
    }
}
