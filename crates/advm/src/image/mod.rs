//! Layered images (FlexMem, Liu et al.): a qcow2 backing chain resolved to extents of
//! (layer file, offset), and mapped so that every process reading the image shares
//! one page-cache copy.
//!
//! [`Image::open`] opens a qcow2 (or raw) image with its whole backing chain.
//! [`Image::extent_map`] is the paper's Algorithm 1: for every range of the virtual
//! disk, the first layer that holds it decides, and adjacent ranges with the same
//! answer coalesce. Each layer's driver only says what *it* holds for a range (data
//! here, zero, look below, end of this layer, compressed, unsupported); one generic
//! resolver walks the chain (the split imago uses). [`ImageSpace::map`] turns the map
//! into mappings inside one reserved range.
//!
//! Guest offsets (positions on the virtual disk) and layer offsets (positions in a
//! layer file) are distinct newtypes so the two are never mixed up.

mod qcow2;
mod space;

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use qcow2::Compression;
pub use space::{ImageSpace, MapOptions, MapStats, OverBudget, DEFAULT_MAX_MATERIALISED};

use crate::{Error, Result};

/// A position on the virtual disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct GuestOffset(pub u64);

/// A position inside one layer file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct LayerOffset(pub u64);

/// The index of a cluster of a qcow2 layer (guest offset / cluster size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct ClusterIndex(pub u64);

impl GuestOffset {
    /// `self + len`, or `None` on overflow.
    pub fn checked_add(self, len: u64) -> Option<Self> {
        self.0.checked_add(len).map(Self)
    }
    /// The cluster holding this offset, for a layer with `cluster_bits`.
    pub fn cluster(self, cluster_bits: u32) -> ClusterIndex {
        ClusterIndex(self.0 >> cluster_bits)
    }
}

impl LayerOffset {
    /// `self + len`, or `None` on overflow.
    pub fn checked_add(self, len: u64) -> Option<Self> {
        self.0.checked_add(len).map(Self)
    }
}

impl fmt::Display for GuestOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for LayerOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Positional reads: a file, or bytes in memory (for the fuzz target and tests).
pub trait ReadAt {
    /// Fills `buf` from `offset`; an error if the source ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for &[u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).ok().filter(|&s| s <= self.len());
        match start.and_then(|s| self.get(s..s.checked_add(buf.len())?)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// The most layers a chain may have (qemu has no fixed limit; this stops runaway
/// chains built by mistake).
pub const MAX_CHAIN_DEPTH: usize = 64;

/// The most extents a map may hold (a crafted image could otherwise describe
/// billions of one-cluster runs and exhaust memory).
pub const MAX_EXTENTS: usize = 1 << 24;

/// A layer's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerFormat {
    /// qcow2 (version 2 or 3).
    Qcow2,
    /// A raw file: guest offset = file offset.
    Raw,
}

#[derive(Debug)]
enum Driver {
    Qcow2(qcow2::Qcow2),
    Raw,
}

/// What [`Image::open_with`] may follow. The defaults are what a careful VMM does with
/// an image it did not write itself: a header names files, and advm often runs as root.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImageOptions {
    /// Follow backing files outside the directory tree of the image opened (an
    /// absolute name, `..`, or a symlink leading out). Default: refused.
    pub allow_backing_outside: bool,
    /// Read a backing file that has no backing-format extension and no qcow2 magic as
    /// raw. Default: refused (qemu requires the format for the same reason: probing
    /// turns any file a header names into disk contents).
    pub allow_probed_raw: bool,
}

/// One layer of a chain: its file, opened read-only, and what its header says.
#[derive(Debug)]
pub struct Layer {
    path: PathBuf,
    file: File,
    file_len: u64,
    driver: Driver,
}

/// What `advm image info` shows about a layer.
#[derive(Debug, Clone, Serialize)]
pub struct LayerInfo {
    /// Depth in the chain (0 = the image opened).
    pub depth: usize,
    /// The layer file.
    pub path: PathBuf,
    /// Its format.
    pub format: LayerFormat,
    /// Its virtual size in bytes.
    pub virtual_size_bytes: u64,
    /// Its file size in bytes.
    pub file_size_bytes: u64,
    /// qcow2 cluster size in bytes.
    pub cluster_size_bytes: Option<u64>,
    /// qcow2 version.
    pub version: Option<u32>,
    /// The backing file name as written in the header.
    pub backing_name: Option<String>,
    /// The backing format extension, when present.
    pub backing_format: Option<String>,
    /// Encryption method (0 none, 1 AES, 2 LUKS).
    pub crypt_method: u32,
    /// Compression of compressed clusters.
    pub compression: Option<Compression>,
    /// Extended L2 entries (subclusters).
    pub extended_l2: bool,
    /// Incompatible feature bits.
    pub incompatible_features: u64,
}

impl Layer {
    /// The layer file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The layer's format.
    pub fn format(&self) -> LayerFormat {
        match self.driver {
            Driver::Qcow2(_) => LayerFormat::Qcow2,
            Driver::Raw => LayerFormat::Raw,
        }
    }

    /// Its virtual size.
    pub fn virtual_size(&self) -> u64 {
        match &self.driver {
            Driver::Qcow2(q) => q.size,
            Driver::Raw => self.file_len,
        }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The file's length when it was opened.
    pub(crate) fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The qcow2 cluster size, `None` for raw.
    pub(crate) fn cluster_size(&self) -> Option<u64> {
        match &self.driver {
            Driver::Qcow2(q) => Some(q.cluster_size()),
            Driver::Raw => None,
        }
    }

    /// `pread` of exactly `buf.len()` bytes; a file that got shorter since it was
    /// opened is named as such rather than as a bare short read.
    fn read_exact_at(&self, buf: &mut [u8], offset: LayerOffset) -> Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset.0).map_err(|e| match current_len(&self.file) {
            Ok(now) if now < self.file_len => {
                self.err(format!("shrank from {} to {now} bytes since it was opened", self.file_len))
            }
            _ => self.err(format!("reading {offset}: {e}")),
        })
    }

    fn info(&self, depth: usize) -> LayerInfo {
        let q = match &self.driver {
            Driver::Qcow2(q) => Some(q),
            Driver::Raw => None,
        };
        LayerInfo {
            depth,
            path: self.path.clone(),
            format: self.format(),
            virtual_size_bytes: self.virtual_size(),
            file_size_bytes: self.file_len,
            cluster_size_bytes: q.map(|q| q.cluster_size()),
            version: q.map(|q| q.version),
            backing_name: q.and_then(|q| q.backing.as_ref()).map(|b| String::from_utf8_lossy(b).into_owned()),
            backing_format: q.and_then(|q| q.backing_format.clone()),
            crypt_method: q.map_or(0, |q| q.crypt_method),
            compression: q.map(|q| q.compression),
            extended_l2: q.is_some_and(|q| q.extended_l2),
            incompatible_features: q.map_or(0, |q| q.incompatible),
        }
    }

    fn err(&self, why: impl Into<String>) -> Error {
        Error::Image { path: self.path.clone(), why: why.into() }
    }

    /// What this layer alone holds at `guest`, for how many bytes.
    fn shallow(&self, cache: &mut qcow2::L2Cache, guest: u64, max: u64) -> Result<(qcow2::Shallow, u64)> {
        use qcow2::Shallow;
        let (answer, len) = match &self.driver {
            Driver::Qcow2(q) => {
                let (a, len) = q.shallow(&self.file, cache, guest, max).map_err(|why| self.err(why))?;
                let a = match a {
                    Shallow::Data(_) | Shallow::Compressed { .. } if q.crypt_method != 0 => {
                        Shallow::Unsupported(format!(
                            "layer is encrypted ({}); decryption is not supported",
                            match q.crypt_method {
                                1 => "AES",
                                2 => "LUKS",
                                _ => "unknown method",
                            }
                        ))
                    }
                    a => a,
                };
                (a, len)
            }
            Driver::Raw => {
                if guest >= self.file_len {
                    (Shallow::Eof, max)
                } else {
                    let max = max.min(self.file_len - guest);
                    // Holes in a sparse raw file read as zeros and need no page cache.
                    let data = crate::sys::seek::next_data(&self.file, guest).map_err(|e| self.err(e.to_string()))?;
                    match data {
                        Some(d) if d <= guest => {
                            let hole =
                                crate::sys::seek::next_hole(&self.file, guest).map_err(|e| self.err(e.to_string()))?;
                            (Shallow::Data(guest), max.min(hole.saturating_sub(guest).max(1)))
                        }
                        Some(d) => (Shallow::Zero, max.min(d - guest)),
                        None => (Shallow::Zero, max),
                    }
                }
            }
        };
        if len == 0 || len > max {
            return Err(
                self.err(format!("internal: driver answered {len} bytes for a {max}-byte request at {guest:#x}"))
            );
        }
        Ok((answer, len))
    }
}

/// Why a range reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ZeroReason {
    /// No layer of the chain allocates it.
    Unallocated,
    /// A qcow2 zero cluster (written as zeros or discarded).
    ZeroFlag,
    /// A hole in a raw layer file.
    Hole,
    /// Beyond the virtual size of a shorter backing file.
    BeyondBacking,
    /// The tail of a data cluster past the end of its layer file.
    PastEndOfFile,
}

impl fmt::Display for ZeroReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unallocated => "unallocated",
            Self::ZeroFlag => "zero-flag",
            Self::Hole => "hole",
            Self::BeyondBacking => "beyond-backing",
            Self::PastEndOfFile => "past-end-of-file",
        })
    }
}

/// What a range of the virtual disk is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum ExtentKind {
    /// Bytes stored uncompressed in the layer file at `offset`.
    Data {
        /// Where in the layer file.
        offset: LayerOffset,
    },
    /// Reads as zeros.
    Zero {
        /// Why.
        reason: ZeroReason,
    },
    /// One compressed cluster stored at `offset` in the layer file.
    Compressed {
        /// Where the compressed bytes start.
        offset: LayerOffset,
        /// At most this many stored bytes.
        stored_len: u64,
    },
    /// Cannot be served by a mapping.
    Unsupported {
        /// Why.
        reason: String,
    },
}

/// One run of the virtual disk with one answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Extent {
    /// First byte.
    pub start: GuestOffset,
    /// Length in bytes (`length` in JSON, as `qemu-img map` says).
    #[serde(rename = "length")]
    pub len: u64,
    /// The layer that answered (0 = top). For unallocated zeros, the lowest layer
    /// that covers the range, as `qemu-img map` reports it.
    pub depth: usize,
    /// The answer.
    #[serde(flatten)]
    pub kind: ExtentKind,
}

impl Extent {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start.0 + self.len
    }

    /// Appends `next` to `self` when they are adjacent and continue each other.
    fn absorb(&mut self, next: &Extent) -> bool {
        if self.end() != next.start.0 || self.depth != next.depth {
            return false;
        }
        let joins = match (&self.kind, &next.kind) {
            (ExtentKind::Data { offset: a }, ExtentKind::Data { offset: b }) => a.0.checked_add(self.len) == Some(b.0),
            (ExtentKind::Zero { reason: a }, ExtentKind::Zero { reason: b }) => a == b,
            (ExtentKind::Unsupported { reason: a }, ExtentKind::Unsupported { reason: b }) => a == b,
            _ => false,
        };
        if joins {
            self.len += next.len;
        }
        joins
    }
}

/// The whole virtual disk as sorted, non-overlapping, coalesced extents.
#[derive(Debug, Clone, Serialize)]
pub struct ExtentMap {
    /// Virtual size in bytes.
    pub size: u64,
    /// The extents, covering `[0, size)` in order.
    pub extents: Vec<Extent>,
}

impl ExtentMap {
    /// The extent holding `guest`, by binary search.
    pub fn find(&self, guest: GuestOffset) -> Option<&Extent> {
        let i = self.extents.partition_point(|e| e.end() <= guest.0);
        self.extents.get(i).filter(|e| e.start <= guest)
    }
}

/// A qcow2 or raw image with its whole backing chain, every layer open read-only.
#[derive(Debug)]
pub struct Image {
    layers: Vec<Layer>,
}

fn sniff(file: &File, path: &Path) -> Result<bool> {
    let mut magic = [0u8; 4];
    let n = file.take(4).read(&mut magic).map_err(|e| Error::io(path, e))?;
    Ok(n == 4 && magic == qcow2::MAGIC)
}

/// The length of a regular file or block device (whose `st_size` is 0).
pub(crate) fn current_len(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        // `&File` seeks the open file description; layers are read with pread only.
        let mut f = file;
        f.seek(SeekFrom::End(0))
    } else {
        Ok(meta.len())
    }
}

/// Why a file of this type cannot be a layer, or `None` if it can.
fn unfit_type(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() || t.is_block_device() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

fn open_layer(path: &Path, format: Option<&str>) -> Result<Layer> {
    let err = |why: String| Error::Image { path: path.to_path_buf(), why };
    let unfit = |what: &str| err(format!("is {what}; image layers must be regular files or block devices"));
    // The type is checked before opening (opening a device can have effects of its
    // own), and again on the descriptor, in case the path changed in between; the
    // open does not block, so a FIFO cannot hang it.
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if let Some(what) = unfit_type(meta.file_type()) {
        return Err(unfit(what));
    }
    let file = crate::sys::layerfile::open_read_nonblocking(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if let Some(what) = unfit_type(meta.file_type()) {
        return Err(unfit(what));
    }
    let file_len = current_len(&file).map_err(|e| Error::io(path, e))?;
    let is_qcow2 = sniff(&file, path)?;
    let driver = match format {
        Some("qcow2") | None if is_qcow2 => Driver::Qcow2(qcow2::Qcow2::parse(&file, file_len).map_err(err)?),
        Some("qcow2") => return Err(err("backing format says qcow2 but the file has no qcow2 magic".into())),
        Some("raw") | None => Driver::Raw,
        Some(other) => return Err(err(format!("unsupported layer format {other:?} (supported: qcow2, raw)"))),
    };
    Ok(Layer { path: path.to_path_buf(), file, file_len, driver })
}

impl Image {
    /// Opens `path` and every backing file below it, with the default (strict)
    /// [`ImageOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &ImageOptions::default())
    }

    /// Opens `path` and every backing file below it. Backing names are resolved
    /// relative to the directory of the file that names them, as qemu does, and must
    /// stay inside the directory tree of `path` (after symlinks) unless
    /// `allow_backing_outside`. The backing-format extension is honoured; without it
    /// a qcow2 backing file is recognised by its magic, and anything else is refused
    /// unless `allow_probed_raw`. Every layer must be a regular file or block device.
    pub fn open_with(path: impl AsRef<Path>, options: &ImageOptions) -> Result<Self> {
        let path = path.as_ref();
        let mut layers = vec![open_layer(path, None)?];
        let mut seen = vec![std::fs::canonicalize(path).map_err(|e| Error::io(path, e))?];
        let top_dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tree = std::fs::canonicalize(top_dir).map_err(|e| Error::io(top_dir, e))?;
        loop {
            let last = layers.last().expect("at least the top layer");
            let Driver::Qcow2(q) = &last.driver else { break };
            let Some(name) = &q.backing else { break };
            let name_path = Path::new(std::ffi::OsStr::from_bytes(name));
            let text = name_path.display().to_string();
            if text.contains(':') && !name_path.exists() && text.split(':').next().is_some_and(|p| !p.contains('/')) {
                return Err(
                    last.err(format!("backing file {text:?} uses a protocol prefix; only local files are supported"))
                );
            }
            let resolved = if name_path.is_absolute() {
                name_path.to_path_buf()
            } else {
                last.path.parent().unwrap_or(Path::new(".")).join(name_path)
            };
            let canon = std::fs::canonicalize(&resolved)
                .map_err(|e| last.err(format!("backing file {text:?} (resolved to {}): {e}", resolved.display())))?;
            if let Some(i) = seen.iter().position(|s| *s == canon) {
                let chain: Vec<String> = layers.iter().map(|l| l.path.display().to_string()).collect();
                return Err(last.err(format!(
                    "backing loop: {} -> {} (already layer {i})",
                    chain.join(" -> "),
                    resolved.display()
                )));
            }
            if !options.allow_backing_outside && !canon.starts_with(&tree) {
                return Err(last.err(format!(
                    "backing file {text:?} resolves to {}, outside {}, the directory of the image opened; \
                     refusing to follow it (allow with --allow-backing-outside, ImageOptions::allow_backing_outside)",
                    canon.display(),
                    tree.display()
                )));
            }
            if layers.len() >= MAX_CHAIN_DEPTH {
                return Err(last.err(format!("backing chain deeper than {MAX_CHAIN_DEPTH} layers")));
            }
            let format = q.backing_format.clone();
            let layer = open_layer(&resolved, format.as_deref())?;
            if format.is_none() && layer.format() == LayerFormat::Raw && !options.allow_probed_raw {
                return Err(last.err(format!(
                    "backing file {text:?} ({}) has no backing format and is not qcow2; refusing to probe it as raw \
                     (allow with --allow-probed-raw, ImageOptions::allow_probed_raw, or record the format: \
                     qemu-img rebase -u -b {text} -F raw)",
                    canon.display()
                )));
            }
            seen.push(canon);
            layers.push(layer);
        }
        Ok(Self { layers })
    }

    /// The layers, top (the opened file) first.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Per-layer facts for `advm image info`.
    pub fn info(&self) -> Vec<LayerInfo> {
        self.layers.iter().enumerate().map(|(i, l)| l.info(i)).collect()
    }

    /// The virtual disk size (the top layer's).
    pub fn virtual_size(&self) -> u64 {
        self.layers[0].virtual_size()
    }

    /// The extent map of the whole disk (the paper's Algorithm 1, run by ranges).
    pub fn extent_map(&self) -> Result<ExtentMap> {
        let extents = self.extents(0, self.virtual_size())?;
        Ok(ExtentMap { size: self.virtual_size(), extents })
    }

    /// The extents of `[start, end)`, coalesced.
    fn extents(&self, start: u64, end: u64) -> Result<Vec<Extent>> {
        let mut caches: Vec<qcow2::L2Cache> = self.layers.iter().map(|_| Default::default()).collect();
        let mut out: Vec<Extent> = Vec::new();
        let mut at = start;
        while at < end {
            let mut max = end - at;
            let mut depth = 0;
            let (kind, answered) = loop {
                if depth == self.layers.len() {
                    break (ExtentKind::Zero { reason: ZeroReason::Unallocated }, depth - 1);
                }
                let (answer, len) = self.layers[depth].shallow(&mut caches[depth], at, max)?;
                max = len;
                use qcow2::Shallow;
                match answer {
                    Shallow::Below => depth += 1,
                    Shallow::Eof => {
                        break (ExtentKind::Zero { reason: ZeroReason::BeyondBacking }, depth.saturating_sub(1))
                    }
                    Shallow::Zero => {
                        let reason = match self.layers[depth].driver {
                            Driver::Raw => ZeroReason::Hole,
                            Driver::Qcow2(_) => ZeroReason::ZeroFlag,
                        };
                        break (ExtentKind::Zero { reason }, depth);
                    }
                    Shallow::PastEof => break (ExtentKind::Zero { reason: ZeroReason::PastEndOfFile }, depth),
                    Shallow::Data(off) => break (ExtentKind::Data { offset: LayerOffset(off) }, depth),
                    Shallow::Compressed { offset, stored_len } => {
                        break (ExtentKind::Compressed { offset: LayerOffset(offset), stored_len }, depth)
                    }
                    Shallow::Unsupported(reason) => break (ExtentKind::Unsupported { reason }, depth),
                }
            };
            let e = Extent { start: GuestOffset(at), len: max, depth: answered, kind };
            if !out.last_mut().is_some_and(|last| last.absorb(&e)) {
                if out.len() == MAX_EXTENTS {
                    return Err(self.layers[0].err(format!(
                        "more than {MAX_EXTENTS} extents before guest {at:#x}; refusing to map so fragmented an image"
                    )));
                }
                out.push(e);
            }
            at += max;
        }
        Ok(out)
    }

    /// Reads `buf.len()` bytes of the virtual disk from `guest` through the layers
    /// (no mapping): data by `pread`, compressed clusters decompressed, zeros filled.
    pub fn read_at(&self, guest: GuestOffset, buf: &mut [u8]) -> Result<()> {
        let end = guest.checked_add(buf.len() as u64).filter(|e| e.0 <= self.virtual_size()).ok_or_else(|| {
            Error::InvalidArgument {
                what: "image read",
                why: format!("{} bytes at {guest} run past the {}-byte virtual size", buf.len(), self.virtual_size()),
            }
        })?;
        // A raw layer cut short would otherwise read as a hole (zeros); a cut during
        // the read shows as a short pread, named the same way.
        for l in &self.layers {
            match current_len(&l.file) {
                Ok(now) if now < l.file_len => {
                    return Err(l.err(format!("shrank from {} to {now} bytes since it was opened", l.file_len)))
                }
                Ok(_) => {}
                Err(e) => return Err(Error::io(&l.path, e)),
            }
        }
        let mut cluster: Option<(usize, u64, Vec<u8>)> = None;
        for e in self.extents(guest.0, end.0)? {
            let dst = &mut buf[(e.start.0 - guest.0) as usize..(e.end() - guest.0) as usize];
            let layer = &self.layers[e.depth];
            match &e.kind {
                ExtentKind::Data { offset } => layer.read_exact_at(dst, *offset)?,
                ExtentKind::Zero { .. } => dst.fill(0),
                ExtentKind::Compressed { offset, stored_len } => {
                    let Driver::Qcow2(q) = &layer.driver else { unreachable!("only qcow2 compresses") };
                    let cs = q.cluster_size();
                    if cluster.as_ref().map_or(true, |(d, o, _)| (*d, *o) != (e.depth, offset.0)) {
                        cluster = Some((e.depth, offset.0, layer.decompress(q, *offset, *stored_len)?));
                    }
                    let data = &cluster.as_ref().expect("just filled").2;
                    let within = (e.start.0 & (cs - 1)) as usize;
                    dst.copy_from_slice(&data[within..within + dst.len()]);
                }
                ExtentKind::Unsupported { reason } => {
                    return Err(layer.err(format!("cannot read guest {}+{}: {reason}", e.start, e.len)))
                }
            }
        }
        Ok(())
    }
}

impl Layer {
    /// Decompresses one cluster of this qcow2 layer stored at `offset` (at most
    /// `stored_len` bytes).
    pub(crate) fn decompressed(&self, offset: LayerOffset, stored_len: u64) -> Result<Vec<u8>> {
        match &self.driver {
            Driver::Qcow2(q) => self.decompress(q, offset, stored_len),
            Driver::Raw => Err(self.err(format!("internal: a compressed cluster at {offset} of a raw layer"))),
        }
    }

    /// Decompresses one cluster stored at `offset` (at most `stored_len` bytes).
    fn decompress(&self, q: &qcow2::Qcow2, offset: LayerOffset, stored_len: u64) -> Result<Vec<u8>> {
        let avail = stored_len.min(self.file_len.saturating_sub(offset.0));
        let mut input = vec![0u8; avail as usize];
        self.read_exact_at(&mut input, offset)?;
        decompress_cluster(q.compression, &input, q.cluster_size() as usize)
            .map_err(|why| self.err(format!("compressed cluster at {offset}: {why}")))
    }
}

/// Decompresses one qcow2 cluster of `cluster_size` bytes. qemu requires the output
/// to fill the cluster exactly; trailing input (sector padding) is ignored.
fn decompress_cluster(c: Compression, input: &[u8], cluster_size: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; cluster_size];
    match c {
        Compression::Deflate => {
            let mut d = flate2::Decompress::new(false);
            let status =
                d.decompress(input, &mut out, flate2::FlushDecompress::Finish).map_err(|e| format!("deflate: {e}"))?;
            if d.total_out() as usize != cluster_size {
                return Err(format!(
                    "deflate stream gave {} bytes, not the {cluster_size}-byte cluster ({status:?})",
                    d.total_out()
                ));
            }
        }
        Compression::Zstd => {
            // One frame; the sector padding after it is not a second frame.
            let mut dec =
                zstd::stream::read::Decoder::with_buffer(input).map_err(|e| format!("zstd: {e}"))?.single_frame();
            dec.read_exact(&mut out)
                .map_err(|e| format!("zstd stream shorter than the {cluster_size}-byte cluster: {e}"))?;
        }
    }
    Ok(out)
}

/// Parses a qcow2 image held in memory (header, extensions, L1 and L2 tables) and
/// lists what this single layer holds, at most `max_runs` runs: the entry point of
/// the parser fuzz target and the garbage-input tests. Never panics.
pub fn parse_layer_bytes(bytes: &[u8], max_runs: usize) -> Result<Vec<(u64, u64, String)>> {
    let err = |why: String| Error::Image { path: PathBuf::from("<memory>"), why };
    let q = qcow2::Qcow2::parse(&bytes, bytes.len() as u64).map_err(err)?;
    let mut cache = qcow2::L2Cache::default();
    let mut out = Vec::new();
    let mut at = 0;
    while at < q.size && out.len() < max_runs {
        let (a, len) = q.shallow(&bytes, &mut cache, at, q.size - at).map_err(err)?;
        if len == 0 || len > q.size - at {
            return Err(err(format!("internal: driver answered {len} bytes at {at:#x}")));
        }
        if let qcow2::Shallow::Compressed { offset, stored_len } = a {
            let avail = stored_len.min(bytes.len() as u64 - offset);
            let input = &bytes[offset as usize..(offset + avail) as usize];
            let _ = decompress_cluster(q.compression, input, q.cluster_size() as usize);
        }
        out.push((at, len, format!("{a:?}")));
        at += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A small valid qcow2 v3 image in memory: 4 KiB clusters, 64 KiB virtual, one
    /// data cluster, one zero cluster, one compressed cluster (garbage payload).
    fn tiny_qcow2() -> Vec<u8> {
        let cs = 4096usize;
        let mut f = vec![0u8; 6 * cs];
        f[0..4].copy_from_slice(&qcow2::MAGIC);
        f[4..8].copy_from_slice(&3u32.to_be_bytes());
        f[20..24].copy_from_slice(&12u32.to_be_bytes());
        f[24..32].copy_from_slice(&(64u64 * 1024).to_be_bytes());
        f[36..40].copy_from_slice(&1u32.to_be_bytes());
        f[40..48].copy_from_slice(&(cs as u64).to_be_bytes());
        f[96..100].copy_from_slice(&4u32.to_be_bytes());
        f[100..104].copy_from_slice(&104u32.to_be_bytes());
        // L1 -> L2 at cluster 2.
        f[cs..cs + 8].copy_from_slice(&((2 * cs) as u64 | 1 << 63).to_be_bytes());
        let l2 = 2 * cs;
        f[l2..l2 + 8].copy_from_slice(&((3 * cs) as u64).to_be_bytes());
        f[l2 + 8..l2 + 16].copy_from_slice(&1u64.to_be_bytes());
        let x = 62 - (12 - 8);
        let compressed = (1u64 << 62) | (1u64 << x) | (4 * cs) as u64;
        f[l2 + 16..l2 + 24].copy_from_slice(&compressed.to_be_bytes());
        f[3 * cs..4 * cs].fill(0xa5);
        f
    }

    #[test]
    fn tiny_image_parses() {
        let runs = parse_layer_bytes(&tiny_qcow2(), 100).unwrap();
        let kinds: Vec<&str> = runs.iter().map(|r| r.2.as_str()).collect();
        assert_eq!(kinds[..3], ["Data(12288)", "Zero", "Compressed { offset: 16384, stored_len: 1024 }"]);
        assert_eq!(runs[3], (12288, 53248, "Below".into()));
    }

    #[test]
    fn garbage_header_fields_are_named() {
        let mut f = tiny_qcow2();
        f[20..24].copy_from_slice(&30u32.to_be_bytes());
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: cluster_bits 30 out of range (9..=21: 512 B to 2 MiB clusters)"
        );
        let mut f = tiny_qcow2();
        f[36..40].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: L1 table of 0 entries is too small for the 65536-byte virtual size (1 needed)"
        );
        assert_eq!(
            parse_layer_bytes(b"QFI", 10).unwrap_err().to_string(),
            "<memory>: truncated qcow2 header: file is 3 bytes, a header needs at least 72"
        );
        let mut f = tiny_qcow2();
        f[4096..4104].copy_from_slice(&((1u64 << 20) | 1 << 63).to_be_bytes());
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: L2 table at 0x100000 is past the end of the file (24576 bytes)"
        );
    }

    #[test]
    fn decompression_rejects_short_and_garbage_streams() {
        let e = decompress_cluster(Compression::Deflate, &[0xa5; 100], 4096).unwrap_err();
        assert!(e.starts_with("deflate"), "{e}");
        assert!(decompress_cluster(Compression::Zstd, &[0xa5; 100], 4096).unwrap_err().starts_with("zstd"));
        // A valid deflate stream of the wrong length is refused too.
        let mut c = flate2::Compress::new(flate2::Compression::fast(), false);
        let mut out = vec![0u8; 256];
        c.compress(&[7u8; 100], &mut out, flate2::FlushCompress::Finish).unwrap();
        let n = c.total_out() as usize;
        let e = decompress_cluster(Compression::Deflate, &out[..n], 4096).unwrap_err();
        assert!(e.contains("gave 100 bytes, not the 4096-byte cluster"), "{e}");
        let mut c = flate2::Compress::new(flate2::Compression::fast(), false);
        c.compress(&[7u8; 4096], &mut out, flate2::FlushCompress::Finish).unwrap();
        let n = c.total_out() as usize;
        assert_eq!(decompress_cluster(Compression::Deflate, &out[..n], 4096).unwrap(), vec![7u8; 4096]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Random bytes never panic the parser.
        #[test]
        fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..2048), magic in any::<bool>()) {
            if magic && bytes.len() >= 8 {
                // Past the magic check, so the header fields themselves are garbage.
                bytes[..8].copy_from_slice(b"QFI\xfb\0\0\0\x03");
            }
            let _ = parse_layer_bytes(&bytes, 1000);
        }

        /// A valid image with random bytes overwritten (header, L1, L2, payloads)
        /// either parses to runs that tile the disk, or fails with an error.
        #[test]
        fn mutated_images_never_panic(edits in proptest::collection::vec((0usize..5 * 4096, any::<u8>()), 1..16)) {
            let mut f = tiny_qcow2();
            for (at, b) in edits {
                f[at] = b;
            }
            if let Ok(runs) = parse_layer_bytes(&f, 100_000) {
                let mut at = 0;
                for (start, len, _) in &runs {
                    prop_assert_eq!(*start, at);
                    prop_assert!(*len > 0);
                    at += len;
                }
            }
        }
    }
}
