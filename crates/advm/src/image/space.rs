//! [`ImageSpace`]: an image's virtual disk mapped into one contiguous range.
//!
//! The plan is built in pages from the extent map:
//! - a data extent maps its layer file `MAP_PRIVATE` (read-only open, so writes stay
//!   private and every process reading the same layer shares the page cache);
//! - a zero extent maps anonymous memory (reads hit the shared zero page);
//! - compressed clusters, and pages that no single extent covers whole (sub-page
//!   clusters, a file offset not page aligned, the partial last page), are
//!   materialised into one sparse memfd at memfd offset = guest offset, so adjacent
//!   such pages always form one mapping (and a daemon can later share that memfd).
//!
//! Adjacent pieces that continue each other coalesce. The number of pieces is the
//! number of mappings; when it exceeds the VMA budget the map either fails with the
//! counts, or ([`OverBudget::CopySmallRuns`]) reads the smallest runs into the memfd
//! until it fits: the large runs stay shared, the small ones become private copies.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use serde::Serialize;

use super::{ExtentKind, ExtentMap, GuestOffset, Image};
use crate::sys::assembly::Assembly;
use crate::sys::memfd;
use crate::sys::mman::{Backing, Prot, Share};
use crate::{Error, Result};

/// What to do when the image needs more mappings than the budget allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverBudget {
    /// Fail with an error naming the mappings needed and the budget.
    #[default]
    Fail,
    /// Read the smallest runs into memory (private copies) until the rest fits.
    CopySmallRuns,
}

/// How to map.
#[derive(Debug, Clone, Default)]
pub struct MapOptions {
    /// Most mappings to create; default: half of what `vm.max_map_count` leaves this
    /// process (the rest stays for the program itself).
    pub max_mappings: Option<usize>,
    /// Policy beyond the budget.
    pub over_budget: OverBudget,
    /// Map read-write, for callers that write through [`ImageSpace::addr`] (a VMM
    /// handing the range to a guest). `MAP_PRIVATE` over read-only layer files: a
    /// write copies the page into this process and never reaches a layer.
    pub writable: bool,
}

/// What a mapping did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MapStats {
    /// Virtual size of the disk.
    pub size_bytes: u64,
    /// Extents in the extent map.
    pub extents: usize,
    /// Mappings created (coalesced pieces).
    pub mappings: usize,
    /// The budget the plan had to meet.
    pub budget: usize,
    /// Bytes mapped straight from layer files.
    pub file_bytes: u64,
    /// Bytes mapped as anonymous zeros.
    pub zero_bytes: u64,
    /// Bytes materialised in the memfd (compressed, unaligned, or over budget).
    pub memfd_bytes: u64,
    /// Bytes moved to the memfd only to meet the budget.
    pub over_budget_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Layer `depth` at file offset.
    File {
        depth: usize,
        offset: u64,
    },
    Anon,
    /// The memfd, at offset = guest offset.
    Memfd,
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    end: u64,
    source: Source,
}

impl Piece {
    fn continues(&self, next: &Piece) -> bool {
        if self.end != next.start {
            return false;
        }
        match (self.source, next.source) {
            (Source::File { depth: a, offset: o }, Source::File { depth: b, offset: p }) => {
                a == b && o + (self.end - self.start) == p
            }
            (Source::Anon, Source::Anon) | (Source::Memfd, Source::Memfd) => true,
            _ => false,
        }
    }
}

/// Appends `p`, merging with the last piece when they continue each other, and
/// letting memfd pieces that share an edge page overlap (they read the same bytes).
fn push(pieces: &mut Vec<Piece>, p: Piece) {
    if p.start >= p.end {
        return;
    }
    if let Some(last) = pieces.last_mut() {
        if last.source == Source::Memfd && p.source == Source::Memfd && p.start <= last.end {
            last.end = last.end.max(p.end);
            return;
        }
        if last.continues(&p) {
            last.end = p.end;
            return;
        }
    }
    pieces.push(p);
}

/// Page-granular pieces covering `[0, page_align_up(size))`.
fn plan(map: &ExtentMap, page: u64, path: &Path) -> Result<Vec<Piece>> {
    let down = |x: u64| x / page * page;
    let up = |x: u64| x.div_ceil(page) * page;
    let mut pieces = Vec::new();
    for e in &map.extents {
        let (s, t) = (e.start.0, e.end());
        let direct = match &e.kind {
            ExtentKind::Data { offset } => {
                let first = up(s);
                if (offset.0 + (first - s)) % page == 0 {
                    Some(Source::File { depth: e.depth, offset: offset.0 + (first - s) })
                } else {
                    None
                }
            }
            ExtentKind::Zero { .. } => Some(Source::Anon),
            ExtentKind::Compressed { .. } => None,
            ExtentKind::Unsupported { reason } => {
                return Err(Error::Image {
                    path: path.to_path_buf(),
                    why: format!("cannot map guest {}+{} (layer {}): {reason}", e.start, e.len, e.depth),
                })
            }
        };
        // The last page of a disk whose size is not page aligned is materialised, so
        // that nothing past the virtual size shows through.
        let (first, last) = (up(s), down(t));
        match direct {
            Some(source) if first < last => {
                push(&mut pieces, Piece { start: down(s), end: first, source: Source::Memfd });
                push(&mut pieces, Piece { start: first, end: last, source });
                push(&mut pieces, Piece { start: last, end: up(t), source: Source::Memfd });
            }
            _ => push(&mut pieces, Piece { start: down(s), end: up(t), source: Source::Memfd }),
        }
    }
    Ok(pieces)
}

/// How many pieces remain if every non-memfd piece of at most `threshold` bytes
/// becomes memfd.
fn count_with(pieces: &[Piece], threshold: u64) -> usize {
    let mut n = 0;
    let mut last_memfd = false;
    for p in pieces {
        let memfd = p.source == Source::Memfd || p.end - p.start <= threshold;
        if !(memfd && last_memfd) {
            n += 1;
        }
        last_memfd = memfd;
    }
    n
}

/// The default budget: half of what vm.max_map_count leaves this process.
fn default_budget() -> usize {
    let max = crate::probe::facts().max_map_count as usize;
    let used = std::fs::read_to_string("/proc/self/maps").map(|s| s.lines().count()).unwrap_or(0);
    max.saturating_sub(used) / 2
}

/// An image's virtual disk mapped at one contiguous range of this process.
#[derive(Debug)]
pub struct ImageSpace {
    // Field order matters: the mappings go before the memfd and files they map
    // (the kernel keeps its own references anyway).
    assembly: Assembly,
    _memfd: Option<OwnedFd>,
    stats: MapStats,
    map: ExtentMap,
}

impl ImageSpace {
    /// Opens `path` with its backing chain and maps its virtual disk.
    pub fn map(path: impl AsRef<Path>, options: &MapOptions) -> Result<Self> {
        let image = Image::open(path)?;
        Self::map_image(&image, options)
    }

    /// Maps an opened image's virtual disk.
    pub fn map_image(image: &Image, options: &MapOptions) -> Result<Self> {
        let path = image.layers()[0].path().to_path_buf();
        let err = |why: String| Error::Image { path: path.clone(), why };
        let page = crate::addr::page_size() as u64;
        let map = image.extent_map()?;
        if map.size == 0 {
            return Err(err("cannot map an image of virtual size 0".into()));
        }
        let total = usize::try_from(map.size.div_ceil(page) * page)
            .map_err(|_| err(format!("virtual size {} does not fit in the address space", map.size)))?;
        let mut pieces = plan(&map, page, &path)?;
        let budget = options.max_mappings.unwrap_or_else(default_budget).max(1);
        let mut over_budget_bytes = 0;
        if pieces.len() > budget {
            match options.over_budget {
                OverBudget::Fail => {
                    return Err(err(format!(
                        "needs {} mappings ({} extents after coalescing) but the budget is {budget} \
                         (vm.max_map_count {}); map with OverBudget::CopySmallRuns to read small runs into memory",
                        pieces.len(),
                        map.extents.len(),
                        crate::probe::facts().max_map_count
                    )))
                }
                OverBudget::CopySmallRuns => {
                    // The smallest length threshold that fits, by binary search.
                    let mut lens: Vec<u64> =
                        pieces.iter().filter(|p| p.source != Source::Memfd).map(|p| p.end - p.start).collect();
                    lens.sort_unstable();
                    lens.dedup();
                    let i = lens.partition_point(|&t| count_with(&pieces, t) > budget);
                    let threshold = lens.get(i).copied().unwrap_or(u64::MAX);
                    let mut merged = Vec::new();
                    for p in &pieces {
                        let mut p = *p;
                        if p.source != Source::Memfd && p.end - p.start <= threshold {
                            over_budget_bytes += p.end - p.start;
                            p.source = Source::Memfd;
                        }
                        push(&mut merged, p);
                    }
                    pieces = merged;
                }
            }
        }
        // Materialise the memfd pieces.
        let needs_memfd = pieces.iter().any(|p| p.source == Source::Memfd);
        let memfd = if needs_memfd {
            let fd = memfd::create("advm-image").map_err(|e| err(format!("materialising pages: {e}")))?;
            memfd::set_len(&fd, total as u64).map_err(|e| err(format!("materialising pages: {e}")))?;
            for p in pieces.iter().filter(|p| p.source == Source::Memfd) {
                fill(image, &fd, p.start, p.end.min(map.size))?;
            }
            Some(fd)
        } else {
            None
        };
        let prot = if options.writable { Prot::READ | Prot::WRITE } else { Prot::READ };
        let mut assembly = Assembly::reserve(total)
            .map_err(|e| err(format!("reserving {total} bytes of address space for the virtual disk: {e}")))?;
        let mut stats = MapStats {
            size_bytes: map.size,
            extents: map.extents.len(),
            budget,
            over_budget_bytes,
            ..Default::default()
        };
        for p in &pieces {
            let len = (p.end - p.start) as usize;
            let backing = match p.source {
                Source::File { depth, offset } => {
                    stats.file_bytes += len as u64;
                    Backing::File { fd: image.layers()[depth].file().as_fd(), offset }
                }
                Source::Anon => {
                    stats.zero_bytes += len as u64;
                    Backing::Anonymous
                }
                Source::Memfd => {
                    stats.memfd_bytes += len as u64;
                    Backing::File { fd: memfd.as_ref().expect("created above").as_fd(), offset: p.start }
                }
            };
            assembly.place(p.start as usize, len, prot, Share::Private, backing).map_err(|e| {
                let what = match p.source {
                    Source::File { depth, .. } => format!("layer {}", image.layers()[depth].path().display()),
                    Source::Anon => "zeros".into(),
                    Source::Memfd => "materialised pages".into(),
                };
                err(format!("mapping {what} at guest {:#x}+{len}: {e}", p.start))
            })?;
        }
        stats.mappings = assembly.placed();
        Ok(Self { assembly, _memfd: memfd, stats, map })
    }

    /// The virtual disk size in bytes.
    pub fn size(&self) -> u64 {
        self.stats.size_bytes
    }

    /// Start address of the mapping (the virtual disk's byte 0).
    pub fn addr(&self) -> usize {
        self.assembly.addr()
    }

    /// What the mapping did.
    pub fn stats(&self) -> &MapStats {
        &self.stats
    }

    /// The extent map it was built from.
    pub fn extent_map(&self) -> &ExtentMap {
        &self.map
    }

    /// Copies `buf.len()` bytes at `guest` out of the mapping.
    pub fn read(&self, guest: GuestOffset, buf: &mut [u8]) -> Result<()> {
        let end = guest.0.checked_add(buf.len() as u64);
        if end.map_or(true, |e| e > self.size()) {
            return Err(Error::InvalidArgument {
                what: "image read",
                why: format!("{} bytes at {guest} run past the {}-byte virtual size", buf.len(), self.size()),
            });
        }
        Ok(self.assembly.copy_out(guest.0 as usize, buf)?)
    }

    /// Reads every byte of the disk through the mapping (faulting every page in, as a
    /// VM reading its whole disk would); returns a checksum of the bytes.
    pub fn read_all(&self) -> Result<u64> {
        Ok(self.assembly.read_all(0, self.size() as usize)?)
    }
}

/// Writes the disk's bytes `[start, end)` into the memfd at the same offsets,
/// skipping all-zero chunks so the memfd stays sparse.
fn fill(image: &Image, fd: &OwnedFd, start: u64, end: u64) -> Result<()> {
    // 2 MiB chunks aligned to 2 MiB never split a cluster (clusters are at most 2 MiB
    // and aligned to their size), so each compressed cluster is decompressed once.
    const CHUNK: u64 = 2 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = start;
    while at < end {
        let next = ((at / CHUNK) + 1) * CHUNK;
        let n = (next.min(end) - at) as usize;
        image.read_at(GuestOffset(at), &mut buf[..n])?;
        if buf[..n].iter().any(|&b| b != 0) {
            let mut done = 0;
            while done < n {
                done += memfd::pwrite(fd, &buf[done..n], at + done as u64).map_err(|e| Error::Image {
                    path: image.layers()[0].path().to_path_buf(),
                    why: format!("materialising guest {:#x}: {e}", at + done as u64),
                })?;
            }
        }
        at += n as u64;
    }
    Ok(())
}
