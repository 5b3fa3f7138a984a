//! The image vocabulary: guest and layer offsets, layer formats, and the extent map
//! the resolver answers with.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

/// A position on the virtual disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GuestOffset(pub u64);

/// A position inside one layer file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LayerOffset(pub u64);

/// The index of a cluster of a qcow2 layer (guest offset / cluster size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
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

/// A layer's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum LayerFormat {
    /// qcow2 (version 2 or 3).
    Qcow2,
    /// A raw file: guest offset = file offset.
    Raw,
}

/// Why a range reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// The whole virtual disk as sorted, non-overlapping, coalesced extents.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
