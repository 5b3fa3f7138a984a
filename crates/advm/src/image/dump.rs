//! Fast dump (FlexMem 4.2): the pages a process wrote through an [`ImageSpace`] go to a
//! new qcow2 overlay whose backing file is the chain's top layer, while the process
//! keeps running.
//!
//! Written pages are the private copies the mapping holds: present, anonymous, and not
//! the shared zero page (pagemap). Each 64 KiB cluster holding one becomes a data
//! cluster of the overlay, copied whole from the mapping (the unwritten rest of a cluster
//! reads what the layers hold). The overlay's header, tables and refcounts are written
//! first; then the process forks and the child copies the clusters out of its
//! copy-on-write view of memory while the parent goes on: a page the parent writes after
//! the fork is copied by the kernel before the write, so the overlay is the image as it
//! was at the fork. The parent pauses only for the fork, and the fork copies and
//! write-protects only the image space and the little the child touches: the process's
//! other big private mappings are left out of it (`sys::lean_fork`), so they cost the
//! fork nothing and their writes no copy-on-write fault.
//!
//! Why not userfaultfd write-protection: synchronous uffd-wp (the hook copy-before-write
//! needs) registers only anonymous, shmem and hugetlb ranges, and an image space is
//! private *file* mappings; `WP_ASYNC` registers any range but resolves faults in the
//! kernel, with no chance to copy first.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{ImageSpace, LayerFormat};
use crate::sys::{lean_fork, pagemap, process};
use crate::{Error, Result};

/// The overlay's cluster size.
pub const DUMP_CLUSTER: u64 = 64 << 10;
const CLUSTER_BITS: u32 = 16;
const L2_ENTRIES: u64 = DUMP_CLUSTER / 8;
/// 16-bit refcounts: entries per refcount block.
const REFCOUNTS_PER_BLOCK: u64 = DUMP_CLUSTER / 2;
const COPIED: u64 = 1 << 63;

/// What a dump did.
#[derive(Debug, Clone, Serialize)]
pub struct DumpReport {
    /// Pages found written.
    pub written_pages: u64,
    /// Clusters written to the overlay.
    pub clusters: u64,
    /// The overlay's file size.
    pub file_bytes: u64,
    /// Finding the written pages and writing the tables (the process runs on).
    pub scan: Duration,
    /// The pause: the scan of /proc/self/smaps, the marks and the fork (the scan is
    /// no pause for the process's other threads).
    pub pause: Duration,
    /// Copying in the child, until it exited.
    pub copy: Duration,
    /// The fork alone (part of `pause`): what the process's other threads wait for.
    pub fork: Duration,
    /// Ranges of this process's memory left out of the fork (marked `MADV_DONTFORK` for
    /// it): the child neither has them nor makes the process copy them on write.
    pub left_out_ranges: u64,
    /// Their resident bytes.
    pub left_out_bytes: u64,
}

/// A dump under way: the child copying. [`wait`](Self::wait) for it.
#[derive(Debug)]
pub struct Dump {
    pid: i32,
    report: DumpReport,
    started: Instant,
    out: std::path::PathBuf,
}

/// The 64 KiB clusters of `space` holding pages written through it, in order, and how
/// many pages were written.
pub fn written_clusters(space: &ImageSpace) -> Result<(Vec<u64>, u64)> {
    let ps = crate::mem::page_size() as u64;
    let map = pagemap::Pagemap::open("self")?;
    if let Some(found) = written_by_scan(&map, space)? {
        return Ok(found);
    }
    let zero = pagemap::zero_pfn();
    let first = space.addr() as u64 / ps;
    let pages = space.range().len() as u64 / ps;
    let mut buf = vec![0u64; 8192];
    let (mut clusters, mut written) = (Vec::new(), 0u64);
    let mut at = 0;
    while at < pages {
        let n = (pages - at).min(buf.len() as u64) as usize;
        let got = map.read(first + at, &mut buf[..n])?;
        for (i, &raw) in buf[..got].iter().enumerate() {
            let e = pagemap::Entry(raw);
            let private =
                (e.present() && !e.file_or_shared() && e.pfn() != zero) || (e.swapped() && !e.file_or_shared());
            if private {
                written += 1;
                let c = (at + i as u64) * ps / DUMP_CLUSTER;
                if clusters.last() != Some(&c) {
                    clusters.push(c);
                }
            }
        }
        if got < n {
            break;
        }
        at += n as u64;
    }
    Ok((clusters, written))
}

/// [`written_clusters`] by `PAGEMAP_SCAN` (Linux 6.7+; `None` before), whose kernel
/// tells zero-page mappings apart itself (`PAGE_IS_PFNZERO`). Pagemap entries cannot
/// for a user without CAP_SYS_ADMIN: every PFN reads 0, so each page read through a
/// hole (mapping the zero page) looked written, and dumps grew by those clusters.
fn written_by_scan(map: &pagemap::Pagemap, space: &ImageSpace) -> Result<Option<(Vec<u64>, u64)>> {
    use pagemap::category::{FILE, PFNZERO, PRESENT, SWAPPED};
    let ps = crate::mem::page_size() as u64;
    let start = space.addr() as u64;
    let end = start + space.range().len() as u64;
    let mut regions = vec![pagemap::Region::default(); 1024];
    let (mut clusters, mut written) = (Vec::new(), 0u64);
    let mut at = start;
    while at < end {
        let (n, walk_end) = match map.scan(at, end, PRESENT | SWAPPED, PRESENT | SWAPPED | FILE | PFNZERO, &mut regions)
        {
            Ok(r) => r,
            Err(e) if e.errno == crate::sys::Errno::NOTTY => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        for r in regions[..n].iter().filter(|r| r.categories & (FILE | PFNZERO) == 0) {
            written += (r.end - r.start) / ps;
            for c in (r.start - start) / DUMP_CLUSTER..=(r.end - 1 - start) / DUMP_CLUSTER {
                if clusters.last() != Some(&c) {
                    clusters.push(c);
                }
            }
        }
        if walk_end <= at {
            break;
        }
        at = walk_end;
    }
    Ok(Some((clusters, written)))
}

fn be64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// The overlay's metadata: header, L1, refcount table and block, L2 tables; and where
/// each dumped cluster's data goes.
struct Layout {
    meta: Vec<(u64, Vec<u8>)>,
    data: Vec<(u64, u64)>,
    file_bytes: u64,
}

fn layout(size: u64, clusters: &[u64], backing: &str, backing_format: LayerFormat) -> Result<Layout> {
    let c = DUMP_CLUSTER;
    let l1_size = size.div_ceil(c * L2_ENTRIES);
    if l1_size * 8 > c {
        return Err(Error::InvalidArgument {
            what: "dump",
            why: format!("a {size}-byte disk needs an L1 table over one cluster"),
        });
    }
    let mut l2_of: Vec<u64> = clusters.iter().map(|&k| k / L2_ENTRIES).collect();
    l2_of.dedup();
    // Clusters: 0 header, 1 L1, 2 refcount table, 3 refcount block, L2 tables, data.
    let l2_base = 4;
    let data_base = l2_base + l2_of.len() as u64;
    let total = data_base + clusters.len() as u64;
    if total > REFCOUNTS_PER_BLOCK {
        return Err(Error::InvalidArgument {
            what: "dump",
            why: format!("{} clusters to write; one refcount block covers {REFCOUNTS_PER_BLOCK}", clusters.len()),
        });
    }
    let mut header = vec![0u8; c as usize];
    header[0..4].copy_from_slice(b"QFI\xfb");
    be32(&mut header, 4, 3);
    be32(&mut header, 20, CLUSTER_BITS);
    be64(&mut header, 24, size);
    be32(&mut header, 36, l1_size as u32);
    be64(&mut header, 40, c);
    be64(&mut header, 48, 2 * c);
    be32(&mut header, 56, 1);
    be32(&mut header, 96, 4); // refcount_order: 16-bit
    be32(&mut header, 100, 104); // header_length
                                 // Extensions: the backing format (padded to 8 bytes), then the end; the backing
                                 // name after them.
    let format: &[u8] = match backing_format {
        LayerFormat::Qcow2 => b"qcow2",
        LayerFormat::Raw => b"raw",
    };
    be32(&mut header, 104, 0xE279_2ACA);
    be32(&mut header, 108, format.len() as u32);
    header[112..112 + format.len()].copy_from_slice(format);
    let name_at = 112 + 8 + 8;
    if backing.len() > 1023 || name_at + backing.len() > c as usize {
        return Err(Error::InvalidArgument { what: "dump backing file", why: format!("{backing:?} is too long") });
    }
    header[name_at..name_at + backing.len()].copy_from_slice(backing.as_bytes());
    be64(&mut header, 8, name_at as u64);
    be32(&mut header, 16, backing.len() as u32);
    let mut l1 = vec![0u8; c as usize];
    let mut l2s = vec![vec![0u8; c as usize]; l2_of.len()];
    let mut data = Vec::with_capacity(clusters.len());
    for (i, &t) in l2_of.iter().enumerate() {
        be64(&mut l1, t as usize * 8, ((l2_base + i as u64) * c) | COPIED);
    }
    for (j, &k) in clusters.iter().enumerate() {
        let table = l2_of.binary_search(&(k / L2_ENTRIES)).expect("every cluster's table is listed");
        let at = (data_base + j as u64) * c;
        be64(&mut l2s[table], (k % L2_ENTRIES) as usize * 8, at | COPIED);
        data.push((k * c, at));
    }
    let mut rtable = vec![0u8; c as usize];
    be64(&mut rtable, 0, 3 * c);
    let mut rblock = vec![0u8; c as usize];
    for i in 0..total as usize {
        rblock[2 * i..2 * i + 2].copy_from_slice(&1u16.to_be_bytes());
    }
    let mut meta = vec![(0, header), (c, l1), (2 * c, rtable), (3 * c, rblock)];
    meta.extend(l2s.into_iter().enumerate().map(|(i, t)| ((l2_base + i as u64) * c, t)));
    Ok(Layout { meta, data, file_bytes: total * c })
}

/// Writes a qcow2 overlay at `out` (a new file) over `backing`, a layer of
/// `backing_format`, for a disk of `size` bytes holding `clusters` (64 KiB cluster
/// indices, ascending), each filled by `read` (guest offset, buffer); returns the
/// file's size. For dumps taken elsewhere (the shim's, of a running VM).
pub fn write_overlay(
    out: &Path,
    size: u64,
    clusters: &[u64],
    backing: &str,
    backing_format: LayerFormat,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<u64> {
    let io = |e: std::io::Error| Error::io(out, e);
    if clusters.windows(2).any(|w| w[0] >= w[1]) || clusters.last().is_some_and(|&c| c * DUMP_CLUSTER >= size) {
        return Err(Error::InvalidArgument {
            what: "dump clusters",
            why: format!("not ascending, or past the {size}-byte disk"),
        });
    }
    let l = layout(size, clusters, backing, backing_format)?;
    let file: File = OpenOptions::new().write(true).create_new(true).open(out).map_err(io)?;
    file.set_len(l.file_bytes).map_err(io)?;
    for (at, bytes) in &l.meta {
        file.write_all_at(bytes, *at).map_err(io)?;
    }
    let mut buf = vec![0u8; DUMP_CLUSTER as usize];
    for &(guest, at) in &l.data {
        let n = DUMP_CLUSTER.min(size - guest) as usize;
        buf.fill(0);
        read(guest, &mut buf[..n])?;
        file.write_all_at(&buf, at).map_err(io)?;
    }
    file.sync_data().map_err(io)?;
    Ok(l.file_bytes)
}

/// Starts dumping what was written through `space` into a new qcow2 at `out` whose
/// backing file is `backing` (the chain's top, as the overlay names it: a path relative
/// to `out`'s directory, or absolute), a layer of `backing_format`. Returns once the
/// child copies; the caller runs on.
pub fn start(space: &ImageSpace, out: &Path, backing: &str, backing_format: LayerFormat) -> Result<Dump> {
    let t0 = Instant::now();
    let io = |e: std::io::Error| Error::io(out, e);
    let (clusters, written_pages) = written_clusters(space)?;
    let l = layout(space.size(), &clusters, backing, backing_format)?;
    let file: File = OpenOptions::new().write(true).create_new(true).open(out).map_err(io)?;
    file.set_len(l.file_bytes).map_err(io)?;
    for (at, bytes) in &l.meta {
        file.write_all_at(bytes, *at).map_err(io)?;
    }
    space.check()?;
    let scan = t0.elapsed();
    let size = space.size();
    let base = space.addr();
    // The child's jobs: (address in the mapping, bytes, overlay offset). The file is
    // sized already, so the short last cluster's tail reads as zeros.
    let jobs: Vec<(usize, usize, u64)> = l
        .data
        .iter()
        .map(|&(guest, at)| (base + guest as usize, DUMP_CLUSTER.min(size - guest) as usize, at))
        .collect();
    let keep = [(base, space.range().len()), (jobs.as_ptr() as usize, std::mem::size_of_val(&jobs[..]).max(1))];
    let t1 = Instant::now();
    // The child copies from its view, frozen at the fork, and touches nothing but the
    // mapping, the job list, its stack and the file: the rest of this process's big
    // mappings are left out of the fork (not copied, not write-protected).
    let fd = file.as_fd();
    let (pid, left) = lean_fork::fork_run_lean(&keep, || {
        for &(addr, n, at) in &jobs {
            if lean_fork::pwrite_from(fd, addr, n, at).is_err() {
                return 2;
            }
        }
        if file.sync_data().is_err() {
            return 3;
        }
        0
    })?;
    let pause = t1.elapsed();
    let report = DumpReport {
        written_pages,
        clusters: clusters.len() as u64,
        file_bytes: l.file_bytes,
        scan,
        pause,
        copy: Duration::ZERO,
        fork: left.fork,
        left_out_ranges: left.ranges as u64,
        left_out_bytes: left.bytes,
    };
    Ok(Dump { pid, report, started: Instant::now(), out: out.to_path_buf() })
}

impl Dump {
    /// Waits for the copy to finish.
    pub fn wait(mut self) -> Result<DumpReport> {
        let code = process::wait_child(self.pid)?;
        self.report.copy = self.started.elapsed();
        if code != 0 {
            let why = match code {
                2 => "copying from the mapping to the overlay failed (a layer cut short?)".to_string(),
                3 => "writing the overlay failed".to_string(),
                c => format!("the copying child exited with {c}"),
            };
            return Err(Error::Image { path: self.out, why });
        }
        Ok(self.report)
    }
}
