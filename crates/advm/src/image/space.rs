//! [`ImageSpace`]: an image's virtual disk mapped into one contiguous range.
//!
//! The plan is built in pages from the extent map:
//! - a data extent maps its layer file `MAP_PRIVATE` (read-only open, so writes stay
//!   private and every process reading the same layer shares the page cache);
//! - a zero extent maps anonymous memory (reads hit the shared zero page);
//! - a compressed cluster of at least a page is decompressed once into a slot of a
//!   memfd, however many L2 entries name it (slots follow the guest order of first
//!   use, so clusters compressed one after the other still form one mapping);
//! - pages that no single extent covers whole (sub-page clusters, a file offset not
//!   page aligned, the partial last page) are materialised into the same sparse memfd
//!   at memfd offset = guest offset, so adjacent such pages always form one mapping
//!   (and a daemon can later share that memfd).
//!
//! Materialising is bounded by [`MapOptions::max_materialised_bytes`], checked on the
//! plan before any byte is decompressed.
//!
//! Adjacent pieces that continue each other coalesce. The number of pieces is the
//! number of mappings; when it exceeds the VMA budget the map either fails with the
//! counts, or ([`OverBudget::CopySmallRuns`]) reads the smallest runs into the memfd
//! until it fits: the large runs stay shared, the small ones become private copies.
//!
//! Reads through [`ImageSpace::read`] first check that no mapped layer file shrank
//! and that the read lease on it (when one could be taken) still holds, so a layer
//! truncated by someone else gives an error instead of SIGBUS.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::resolve::ChainReader;
use super::{current_len, hold_off_writers, ExtentKind, ExtentMap, GuestOffset, Image, ImageOptions, LayerOffset};
use crate::mem::{self, Access, Assembly, Backing, Memfd, PageRange, Share};
use crate::sys::fs::layer::{self, LeaseState};
use crate::{Error, Result};

/// What to do when the image needs more mappings than the budget allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OverBudget {
    /// Fail with an error naming the mappings needed and the budget.
    #[default]
    Fail,
    /// Read the smallest runs into memory (private copies) until the rest fits.
    CopySmallRuns,
}

/// The default of [`MapOptions::max_materialised_bytes`]: 256 MiB.
pub const DEFAULT_MAX_MATERIALISED: u64 = 256 << 20;

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
    /// Most bytes to materialise in memory (decompressed clusters, partial pages, runs
    /// copied over the budget); default [`DEFAULT_MAX_MATERIALISED`]. A few KiB of
    /// compressed clusters can stand for gigabytes of disk.
    pub max_materialised_bytes: Option<u64>,
    /// What [`ImageSpace::map`] may follow when it opens the chain.
    pub image: ImageOptions,
}

/// What a mapping did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// Bytes of the disk mapped from the memfd (compressed, unaligned, or over budget).
    pub memfd_bytes: u64,
    /// Bytes materialised into the memfd: each compressed cluster once, however often
    /// it is mapped, plus the pages materialised at their guest offset.
    pub materialised_bytes: u64,
    /// Bytes moved to the memfd only to meet the budget.
    pub over_budget_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// Layer `depth` at file offset.
    File {
        depth: usize,
        offset: u64,
    },
    Anon,
    /// The memfd, at offset = guest offset.
    Memfd,
    /// The memfd's compressed-cluster slots, at this memfd offset.
    Slot {
        offset: u64,
    },
}

/// One decompressed cluster in the memfd.
#[derive(Debug, Clone, Copy)]
struct Slot {
    depth: usize,
    offset: LayerOffset,
    stored_len: u64,
    /// Where in the memfd, and how long (the layer's cluster size).
    at: u64,
    len: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) source: Source,
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
            (Source::Slot { offset: o }, Source::Slot { offset: p }) => o + (self.end - self.start) == p,
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

/// Page-granular pieces covering `[0, page_align_up(size))`, and the compressed
/// clusters they use, with slots from memfd offset `slot_base` on.
fn plan(map: &ExtentMap, page: u64, image: &Image, slot_base: u64) -> Result<(Vec<Piece>, Vec<Slot>)> {
    let path = image.layers()[0].path();
    let down = |x: u64| x / page * page;
    let up = |x: u64| x.div_ceil(page) * page;
    let mut pieces = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut slot_of: HashMap<(usize, u64), usize> = HashMap::new();
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
            ExtentKind::Compressed { offset, stored_len } => match image.layers()[e.depth].cluster_size() {
                Some(cs) if cs >= page => {
                    let i = *slot_of.entry((e.depth, offset.0)).or_insert_with(|| {
                        let at = slots.last().map_or(slot_base, |s| s.at + s.len);
                        slots.push(Slot { depth: e.depth, offset: *offset, stored_len: *stored_len, at, len: cs });
                        slots.len() - 1
                    });
                    // The extent may start inside its cluster (below a layer with
                    // smaller clusters); `first` is page aligned and so is the slot.
                    Some(Source::Slot { offset: slots[i].at + (up(s) - s / cs * cs) })
                }
                _ => None,
            },
            ExtentKind::Unsupported { reason } => {
                // A layer below the image opened is named: the reason is about it.
                let layer = match e.depth {
                    0 => "layer 0".to_string(),
                    n => format!("layer {n}, {}", image.layers()[n].path().display()),
                };
                return Err(Error::Image {
                    path: path.to_path_buf(),
                    why: format!("cannot map guest {}+{} ({layer}): {reason}", e.start, e.len),
                });
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
    Ok((pieces, slots))
}

/// Marks the slots that pieces still map (some may have been copied over budget).
fn slots_in_use(pieces: &[Piece], slots: &[Slot]) -> Vec<bool> {
    let mut used = vec![false; slots.len()];
    for p in pieces {
        if let Source::Slot { offset } = p.source {
            let end = offset + (p.end - p.start);
            let mut i = slots.partition_point(|s| s.at + s.len <= offset);
            while i < slots.len() && slots[i].at < end {
                used[i] = true;
                i += 1;
            }
        }
    }
    used
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

/// A layer file some mapping reads from, watched for truncation.
#[derive(Debug)]
struct Watch {
    path: PathBuf,
    /// An open file description of our own (so the lease ends with this `Watch`).
    file: File,
    /// The length when the image was opened.
    len: u64,
    /// A read lease was taken on `file`.
    leased: bool,
    /// The lease was seen broken: reads stay refused.
    broken: AtomicBool,
}

impl Watch {
    fn new(path: &Path, layer_file: &File, len: u64, force_share: bool) -> Result<Self> {
        // Our own description (when the file can be reopened), holding QEMU's
        // no-writers lock while mapped (see `hold_off_writers`).
        let (file, leased) = match hold_off_writers(path, layer_file, force_share)? {
            // No lease when we may not take one (not the owner, or a writer has the
            // file open, or the filesystem has no leases): the size check remains.
            Some(f) => {
                let leased = layer::take_read_lease(&f).is_ok();
                (f, leased)
            }
            None => (layer_file.try_clone().map_err(|e| crate::Error::io(path, e))?, false),
        };
        Ok(Self { path: path.to_path_buf(), file, len, leased, broken: AtomicBool::new(false) })
    }

    fn check(&self) -> Result<()> {
        let err = |why: String| Error::Image { path: self.path.clone(), why };
        let broken = || {
            err("opened for writing or truncated by another process while mapped (read lease broken); \
                 refusing to read through the mapping"
                .into())
        };
        if self.broken.load(Ordering::Relaxed) {
            return Err(broken());
        }
        let now = current_len(&self.file).map_err(|e| crate::Error::io(&self.path, e))?;
        if now < self.len {
            return Err(err(format!(
                "shrank from {} to {now} bytes while mapped; refusing to read through the mapping",
                self.len
            )));
        }
        if self.leased && layer::lease_state(&self.file)? == LeaseState::Broken {
            self.broken.store(true, Ordering::Relaxed);
            // The writer need not wait out lease-break-time: we stop reading. A writer
            // that did wait it out has removed the lease already (releasing it then
            // fails with EAGAIN): the refusal below is the answer either way.
            let _ = layer::release_lease(&self.file);
            return Err(broken());
        }
        Ok(())
    }
}

/// An image's virtual disk mapped at one contiguous range of this process.
#[derive(Debug)]
pub struct ImageSpace {
    // Field order matters: the mappings go before the memfd and files they map
    // (the kernel keeps its own references anyway).
    assembly: Assembly,
    _memfd: Option<Memfd>,
    watches: Vec<Watch>,
    stats: MapStats,
    map: ExtentMap,
}

impl ImageSpace {
    /// Opens `path` with its backing chain (under `options.image`) and maps its
    /// virtual disk.
    pub fn map(path: impl AsRef<Path>, options: &MapOptions) -> Result<Self> {
        let image = Image::open_with(path, &options.image)?;
        Self::map_image(&image, options)
    }

    /// Maps an opened image's virtual disk.
    pub fn map_image(image: &Image, options: &MapOptions) -> Result<Self> {
        let layers: Vec<LayerFile<'_>> = image.layers().iter().map(LayerFile::data_of).collect();
        Self::place(layout(image, options)?, &layers, options.writable, options.image.force_share)
    }

    /// Maps a planned layout whose layer `depth` is `layers[depth]`; unless
    /// `force_share`, QEMU writers are locked out of the mapped layers meanwhile.
    pub(super) fn place(layout: Layout, layers: &[LayerFile<'_>], writable: bool, force_share: bool) -> Result<Self> {
        let Layout { pieces, memfd, mut stats, map, total } = layout;
        let path = layers[0].path.to_path_buf();
        let err = |why: String| Error::Image { path: path.clone(), why };
        let access = if writable { Access::ReadWrite } else { Access::Read };
        let mut assembly = Assembly::reserve(total)
            .map_err(|e| err(format!("reserving {total} bytes of address space for the virtual disk: {e}")))?;
        let mut watched = vec![false; layers.len()];
        for p in &pieces {
            let len = (p.end - p.start) as usize;
            let backing = match p.source {
                Source::File { depth, offset } => {
                    watched[depth] = true;
                    Backing::File { fd: layers[depth].file.as_fd(), offset }
                }
                Source::Anon => Backing::Anonymous,
                Source::Memfd | Source::Slot { .. } => {
                    let offset = if let Source::Slot { offset } = p.source { offset } else { p.start };
                    Backing::Memfd { memfd: memfd.as_ref().expect("created above"), offset }
                }
            };
            assembly.place(mem::Extent { offset: p.start as usize, len, backing }, access, Share::Private).map_err(
                |e| {
                    let what = match p.source {
                        Source::File { depth, .. } => format!("layer {}", layers[depth].path.display()),
                        Source::Anon => "zeros".into(),
                        Source::Memfd | Source::Slot { .. } => "materialised pages".into(),
                    };
                    err(format!("mapping {what} at guest {:#x}+{len}: {e}", p.start))
                },
            )?;
        }
        stats.mappings = assembly.placed();
        let watches = layers
            .iter()
            .zip(&watched)
            .filter(|(_, w)| **w)
            .map(|(l, _)| Watch::new(l.path, l.file, l.len, force_share))
            .collect::<Result<Vec<_>>>()?;
        let space = Self { assembly, _memfd: memfd, watches, stats, map };
        // A layer truncated between opening and leasing is caught here.
        space.check()?;
        Ok(space)
    }

    /// Fails if a layer file this mapping reads from shrank, or if another process
    /// opened it for writing or truncated it (seen when a read lease could be taken).
    /// [`read`](Self::read) checks first; a caller touching the range through
    /// [`addr`](Self::addr) itself must check, or guarantee no layer changes.
    pub fn check(&self) -> Result<()> {
        self.watches.iter().try_for_each(Watch::check)
    }

    /// The virtual disk size in bytes.
    pub fn size(&self) -> u64 {
        self.stats.size_bytes
    }

    /// Start address of the mapping (the virtual disk's byte 0).
    pub fn addr(&self) -> usize {
        self.assembly.range().start().0
    }

    /// The addresses of the mapping (for reports and `/proc/PID/maps`).
    pub fn range(&self) -> PageRange {
        self.assembly.range()
    }

    /// What the mapping did.
    pub fn stats(&self) -> &MapStats {
        &self.stats
    }

    /// The extent map it was built from.
    pub fn extent_map(&self) -> &ExtentMap {
        &self.map
    }

    /// Copies `buf.len()` bytes at `guest` out of the mapping, after [`check`](Self::check).
    /// With the read lease held, a writer or truncate waits for the lease to be let go,
    /// so the copy cannot fault on a truncated file.
    pub fn read(&self, guest: GuestOffset, buf: &mut [u8]) -> Result<()> {
        let end = guest.0.checked_add(buf.len() as u64);
        if end.map_or(true, |e| e > self.size()) {
            return Err(Error::InvalidArgument {
                what: "image read",
                why: format!("{} bytes at {guest} run past the {}-byte virtual size", buf.len(), self.size()),
            });
        }
        self.check()?;
        self.assembly.copy_out(guest.0 as usize, buf)
    }

    /// Reads every byte of the disk through the mapping (faulting every page in, as a
    /// VM reading its whole disk would); returns a checksum of the bytes.
    pub fn read_all(&self) -> Result<u64> {
        let mut buf = vec![0u8; 1 << 20];
        let mut sum = 0u64;
        let mut at = 0;
        while at < self.size() {
            let n = buf.len().min((self.size() - at) as usize);
            self.read(GuestOffset(at), &mut buf[..n])?;
            // The sum keeps the reads from being optimised out.
            sum = buf[..n].iter().fold(sum, |s, &b| s.wrapping_add(u64::from(b)));
            at += n as u64;
        }
        Ok(sum)
    }
}

/// A layer file as the mapping needs it: its name (for errors), the open file, and its
/// length when opened (a shorter file later means truncation).
pub(super) struct LayerFile<'a> {
    pub(super) path: &'a Path,
    pub(super) file: &'a File,
    pub(super) len: u64,
}

impl<'a> LayerFile<'a> {
    /// The file `layer`'s data pieces map: its external data file, or itself.
    pub(super) fn data_of(layer: &'a super::Layer) -> Self {
        let (path, file, len) = layer.data_source();
        Self { path, file, len }
    }
}

/// The plan of a mapping, with its memfd filled: what [`ImageSpace::map_image`] places,
/// and what a VMM or a client of the image service maps by itself (see `super::layout`).
pub(super) struct Layout {
    pub(super) pieces: Vec<Piece>,
    pub(super) memfd: Option<Memfd>,
    /// Sizes and counts; `mappings` is the number of pieces.
    pub(super) stats: MapStats,
    pub(super) map: ExtentMap,
    /// The virtual size rounded up to a page.
    pub(super) total: usize,
}

/// Plans the mapping of `image` under `options` and materialises its memfd.
pub(super) fn layout(image: &Image, options: &MapOptions) -> Result<Layout> {
    let path = image.layers()[0].path().to_path_buf();
    let err = |why: String| Error::Image { path: path.clone(), why };
    let page = mem::page_size() as u64;
    let map = image.extent_map()?;
    if map.size == 0 {
        return Err(err("cannot map an image of virtual size 0".into()));
    }
    let total = usize::try_from(map.size.div_ceil(page) * page)
        .map_err(|_| err(format!("virtual size {} does not fit in the address space", map.size)))?;
    let (mut pieces, slots) = plan(&map, page, image, total as u64)?;
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
    // What materialising costs, checked before any of it is done.
    let used = slots_in_use(&pieces, &slots);
    let materialised = pieces.iter().filter(|p| p.source == Source::Memfd).map(|p| p.end - p.start).sum::<u64>()
        + slots.iter().zip(&used).filter(|(_, u)| **u).map(|(s, _)| s.len).sum::<u64>();
    let limit = options.max_materialised_bytes.unwrap_or(DEFAULT_MAX_MATERIALISED);
    if materialised > limit {
        return Err(err(format!(
            "mapping it would materialise {materialised} bytes in memory (decompressed clusters, partial pages, \
                 runs copied over the budget), over the {limit}-byte limit; raise it with --max-materialised \
                 (MapOptions::max_materialised_bytes)"
        )));
    }
    let memfd = if materialised > 0 {
        let fd = Memfd::create("advm-image").map_err(|e| err(format!("materialising pages: {e}")))?;
        let len = slots.last().map_or(total as u64, |s| s.at + s.len);
        fd.set_len(len).map_err(|e| err(format!("materialising pages: {e}")))?;
        // One reader for every piece: materialised pages are often single pages one
        // L2 table apart from the next (mixed extended-L2 clusters), and each read
        // would otherwise read its tables again.
        let mut reader = ChainReader::new(image);
        for p in pieces.iter().filter(|p| p.source == Source::Memfd) {
            fill(&mut reader, image, &fd, p.start, p.end.min(map.size))?;
        }
        for s in slots.iter().zip(&used).filter(|(_, u)| **u).map(|(s, _)| s) {
            let data = image.layers()[s.depth].decompressed(s.offset, s.stored_len)?;
            write_nonzero(image, &fd, &data, s.at)?;
        }
        Some(fd)
    } else {
        None
    };
    let mut stats = MapStats {
        size_bytes: map.size,
        extents: map.extents.len(),
        mappings: pieces.len(),
        budget,
        over_budget_bytes,
        materialised_bytes: materialised,
        ..Default::default()
    };
    for p in &pieces {
        let len = p.end - p.start;
        match p.source {
            Source::File { .. } => stats.file_bytes += len,
            Source::Anon => stats.zero_bytes += len,
            Source::Memfd | Source::Slot { .. } => stats.memfd_bytes += len,
        }
    }
    Ok(Layout { pieces, memfd, stats, map, total })
}

/// Writes the disk's bytes `[start, end)` into the memfd at the same offsets,
/// skipping all-zero chunks so the memfd stays sparse.
fn fill(reader: &mut ChainReader<'_>, image: &Image, fd: &Memfd, start: u64, end: u64) -> Result<()> {
    // 2 MiB chunks aligned to 2 MiB never split a cluster (clusters are at most 2 MiB
    // and aligned to their size), so each compressed cluster is decompressed once.
    const CHUNK: u64 = 2 << 20;
    // As large as the piece needs: most are a page.
    let mut buf = vec![0u8; CHUNK.min(end.saturating_sub(start)) as usize];
    let mut at = start;
    while at < end {
        let next = ((at / CHUNK) + 1) * CHUNK;
        let n = (next.min(end) - at) as usize;
        reader.read_at(GuestOffset(at), &mut buf[..n])?;
        write_nonzero(image, fd, &buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Writes `buf` at memfd offset `at` (page aligned), skipping all-zero pages so the
/// memfd stays sparse.
fn write_nonzero(image: &Image, fd: &Memfd, buf: &[u8], at: u64) -> Result<()> {
    let page = mem::page_size();
    for (i, chunk) in buf.chunks(page).enumerate() {
        if chunk.iter().all(|&b| b == 0) {
            continue;
        }
        let start = at + (i * page) as u64;
        fd.write_all_at(chunk, start).map_err(|e| Error::Image {
            path: image.layers()[0].path().to_path_buf(),
            why: format!("materialising memfd offset {start:#x}: {e}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::qcow2::L2_READS;

    fn have(program: &str) -> bool {
        std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
    }

    /// 256 pages each mixing a written 2 KiB subcluster with an unallocated one
    /// (extended L2, 64 KiB clusters), one per cluster: every page is materialised on
    /// its own, and each read its L2 table again (257 table reads for one table; 1.8 s
    /// of a debug build for 4,096 such pages). Now the table is read once for the map
    /// and once for the pages.
    #[test]
    fn materialising_mixed_extended_l2_pages_reads_each_l2_table_once() {
        if !have("qemu-img") || !have("qemu-io") {
            eprintln!("skipping: qemu-img/qemu-io not installed");
            return;
        }
        let dir = std::env::temp_dir().join(format!("advm-space-l2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("mixed.qcow2");
        let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-o", "extended_l2=on,cluster_size=64k"])
            .arg(&img)
            .arg("16M"));
        let mut io = std::process::Command::new("qemu-io");
        for c in 0..256 {
            io.args(["-c", &format!("write -P 0x5a {}k 1k", c * 64)]);
        }
        ok(io.arg(&img).stdout(std::process::Stdio::null()));
        let image = Image::open(&img).unwrap();
        L2_READS.with(|n| n.set(0));
        let l = layout(&image, &MapOptions::default()).unwrap();
        let reads = L2_READS.with(|n| n.get());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(l.stats.materialised_bytes, 256 * mem::page_size() as u64, "{:?}", l.stats);
        assert!(reads <= 2, "{reads} L2 table reads for one table");
        // And the pages hold the written bytes and zeros.
        let memfd = l.memfd.unwrap();
        let mut page = vec![0u8; mem::page_size()];
        assert_eq!(memfd.read_at(&mut page, 255 * (64 << 10)).unwrap(), page.len());
        assert!(page[..1024].iter().all(|&b| b == 0x5a) && page[1024..].iter().all(|&b| b == 0));
    }
}
