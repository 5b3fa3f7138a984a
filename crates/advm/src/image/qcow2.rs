//! qcow2 header and table parsing, and the one-layer ("shallow") driver.
//!
//! Written here rather than taken from the `imago` crate (0.2.6): imago's mapping query
//! is close to what we need, but it is async-first (tokio), it reports compressed
//! clusters only as opaque "special" data (no host offset, which the extent map must
//! name), it does not say which layer file a mapping came from in a form we can mmap,
//! and we must check encryption, unknown incompatible bits and every table offset
//! ourselves anyway so that corrupt input gives a clear error and is fuzzable from a
//! byte slice. The format itself is small: a header, an L1 table, L2 tables.
//!
//! Every value read from the file is checked before use: offsets against the file
//! length, table sizes against fixed limits, so garbage input gives an error naming
//! the field and the limit, never a panic or an unbounded allocation.

use super::ReadAt;

/// Magic at offset 0: "QFI\xfb".
pub(crate) const MAGIC: [u8; 4] = *b"QFI\xfb";

/// Incompatible feature bits (qcow2 spec, "incompatible_features").
const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_EXTERNAL_DATA: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTENDED_L2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_EXTERNAL_DATA | INCOMPAT_COMPRESSION | INCOMPAT_EXTENDED_L2;

/// Header extension types.
const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
/// "DATA": the external data file's name.
const EXT_DATA_FILE: u32 = 0x4441_5441;

/// Autoclear feature bit 1: the external data file reads as a raw image by itself.
const AUTOCLEAR_DATA_FILE_RAW: u64 = 1 << 1;

/// Offset bits of L1 and standard L2 entries (bits 9..=55).
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const L2_COMPRESSED: u64 = 1 << 62;
const L2_ZERO: u64 = 1;
/// Bit 63 ("copied", refcount 1): with an external data file it tells guest cluster 0
/// stored at data-file offset 0 from an unallocated entry (both have offset 0).
const L2_COPIED: u64 = 1 << 63;

/// The largest L1 table we accept (qemu's limit: 32 MiB of entries).
const MAX_L1_BYTES: u64 = 32 << 20;
/// qemu's limit on a backing file name.
const MAX_BACKING_NAME: u32 = 1023;

/// Compression algorithm of compressed clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Compression {
    /// Raw deflate (zlib stream without header), qcow2's default.
    Deflate,
    /// zstd (compression_type = 1).
    Zstd,
}

/// A parsed qcow2 header with its L1 table.
#[derive(Debug, Clone)]
pub(crate) struct Qcow2 {
    pub version: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub crypt_method: u32,
    pub incompatible: u64,
    pub compression: Compression,
    pub extended_l2: bool,
    pub backing: Option<Vec<u8>>,
    pub backing_format: Option<String>,
    pub l1: Vec<u64>,
    pub file_len: u64,
    /// The external data file's name as the header writes it (incompatible bit 2).
    pub data_file: Option<Vec<u8>>,
    /// The data file reads as a raw image by itself (autoclear bit 1).
    pub data_file_raw: bool,
    /// The length of the file data clusters are in: this file's, or the external
    /// data file's once [`set_data_len`](Self::set_data_len) says it.
    data_len: u64,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// What one layer holds for a range starting at a guest offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shallow {
    /// Data in this layer's file at this offset (contiguous for the whole run).
    Data(u64),
    /// Reads as zeros here (zero flag, or a hole in a raw file).
    Zero,
    /// Data in this layer's file up to its end; zeros after (a last cluster only
    /// partly written). The run covers only the part past the end of file.
    PastEof,
    /// Not allocated in this layer: look in the backing file.
    Below,
    /// Beyond this layer's virtual size.
    Eof,
    /// One compressed cluster: stored at this offset, this many bytes at most.
    Compressed { offset: u64, stored_len: u64 },
    /// This layer cannot be served by mapping, with the reason.
    Unsupported(String),
}

/// The last L2 table read, per layer (the map walks clusters in order, so one is
/// enough to read every table once).
#[derive(Debug, Default)]
pub(crate) struct L2Cache {
    offset: u64,
    table: Vec<u8>,
}

#[cfg(test)]
thread_local! {
    /// L2 tables read from files by this thread (for tests of the caching).
    pub(crate) static L2_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Qcow2 {
    /// Parses the header, its extensions and the L1 table. Errors say which field is
    /// wrong and the limit it breaks; `convert` is the command that makes a readable
    /// copy, named when qemu-img can make one (qcow version 1).
    pub fn parse(file: &dyn ReadAt, file_len: u64, convert: &str) -> Result<Self, String> {
        if file_len < 72 {
            return Err(format!("truncated qcow2 header: file is {file_len} bytes, a header needs at least 72"));
        }
        let mut h = [0u8; 112];
        let n = (file_len.min(h.len() as u64)) as usize;
        file.read_exact_at(&mut h[..n], 0).map_err(|e| format!("reading the header: {e}"))?;
        if h[..4] != MAGIC {
            return Err("not a qcow2 file (bad magic)".into());
        }
        let version = be32(&h, 4);
        if version == 1 {
            return Err(format!("is a qcow (version 1) image, not qcow2; convert it: {convert}"));
        }
        if version != 2 && version != 3 {
            return Err(format!("unsupported qcow2 version {version} (supported: 2, 3)"));
        }
        let backing_offset = be64(&h, 8);
        let backing_len = be32(&h, 16);
        let cluster_bits = be32(&h, 20);
        if !(9..=21).contains(&cluster_bits) {
            return Err(format!("cluster_bits {cluster_bits} out of range (9..=21: 512 B to 2 MiB clusters)"));
        }
        let cluster_size = 1u64 << cluster_bits;
        if backing_offset > cluster_size {
            return Err(format!(
                "backing file name offset {backing_offset:#x} is past the first cluster ({cluster_size} bytes)"
            ));
        }
        // Header extensions end where the backing file name starts, as QEMU reads them
        // (bytes between the last extension and the name are not extensions).
        let ext_end = if backing_offset != 0 { backing_offset } else { cluster_size };
        // QEMU counts a disk in 512-byte sectors (`total_sectors = size / 512`): a size
        // that is not a multiple of 512 (never written by qemu-img, possible by hand)
        // reads as QEMU reads it, rounded down.
        let size = be64(&h, 24) / 512 * 512;
        let crypt_method = be32(&h, 32);
        if crypt_method > 2 {
            return Err(format!("unknown encryption method {crypt_method} (known: 0 none, 1 AES, 2 LUKS)"));
        }
        let l1_size = u64::from(be32(&h, 36));
        let l1_offset = be64(&h, 40);
        let (mut incompatible, mut header_len, mut compression) = (0u64, 72u64, Compression::Deflate);
        if version == 3 {
            if file_len < 104 {
                return Err(format!("truncated qcow2 v3 header: file is {file_len} bytes, the header needs 104"));
            }
            incompatible = be64(&h, 72);
            header_len = u64::from(be32(&h, 100));
            if header_len < 104 || header_len > cluster_size || header_len > file_len {
                return Err(format!(
                    "header_length {header_len} out of range (104 to the {cluster_size}-byte cluster and the {file_len}-byte file)"
                ));
            }
            let bit = incompatible & INCOMPAT_COMPRESSION != 0;
            if bit && header_len < 105 {
                return Err("compression type bit set but header has no compression_type field".into());
            }
            // The field counts whenever the header has it, and the bit must say whether it
            // is not deflate (QEMU refuses the image otherwise, either way).
            compression = match if header_len >= 105 { h[104] } else { 0 } {
                0 => Compression::Deflate,
                1 => Compression::Zstd,
                t => return Err(format!("unknown compression type {t} (known: 0 deflate, 1 zstd)")),
            };
            if bit != (compression != Compression::Deflate) {
                return Err(format!(
                    "compression type {compression:?} but the compression type bit (incompatible bit 3) is {}",
                    if bit { "set (it must be set only for a type other than deflate)" } else { "clear" }
                ));
            }
        }
        let unknown = incompatible & !INCOMPAT_KNOWN;
        if unknown != 0 {
            let names = feature_names(file, file_len, version, header_len, ext_end).unwrap_or_default();
            let named: Vec<String> = (0..64)
                .filter(|b| unknown & (1u64 << b) != 0)
                .map(|b| match names.iter().find(|(bit, _)| *bit == b) {
                    Some((_, n)) => format!("bit {b} ({n})"),
                    None => format!("bit {b}"),
                })
                .collect();
            return Err(format!("unknown incompatible feature {} (known bits: 0-4)", named.join(", ")));
        }
        if incompatible & INCOMPAT_CORRUPT != 0 {
            return Err("image is marked corrupt (incompatible bit 1); run `qemu-img check -r all` first".into());
        }
        let extended_l2 = incompatible & INCOMPAT_EXTENDED_L2 != 0;
        if extended_l2 && cluster_bits < 14 {
            return Err(format!("extended L2 entries need clusters of at least 16 KiB, not {cluster_size} B"));
        }
        // L1 table: must cover the virtual size, fit in the file, stay under the limit.
        let l2_entries = cluster_size / if extended_l2 { 16 } else { 8 };
        let span = cluster_size.saturating_mul(l2_entries);
        let needed = size.div_ceil(span);
        if l1_size < needed {
            return Err(format!(
                "L1 table of {l1_size} entries is too small for the {size}-byte virtual size ({needed} needed)"
            ));
        }
        if l1_size * 8 > MAX_L1_BYTES {
            return Err(format!("L1 table of {l1_size} entries is larger than the {MAX_L1_BYTES}-byte limit"));
        }
        if l1_size > 0 {
            if l1_offset % cluster_size != 0 {
                return Err(format!(
                    "L1 table offset {l1_offset:#x} is not aligned to the {cluster_size}-byte cluster"
                ));
            }
            if l1_offset.checked_add(l1_size * 8).map_or(true, |end| end > file_len) {
                return Err(format!(
                    "L1 table at {l1_offset:#x} ({l1_size} entries) is past the end of the file ({file_len} bytes)"
                ));
            }
        }
        let mut raw = vec![0u8; (l1_size * 8) as usize];
        file.read_exact_at(&mut raw, l1_offset).map_err(|e| format!("reading the L1 table: {e}"))?;
        let l1: Vec<u64> = raw.chunks_exact(8).map(|c| be64(c, 0)).collect();
        // Two L1 entries naming one L2 table would let a few bytes of file describe
        // the same runs again and again (a table per entry of a 32 MiB L1); qemu never
        // writes that into the active table (it is a refcount error to `qemu-img check`).
        let mut named: Vec<(u64, usize)> =
            l1.iter().enumerate().map(|(i, e)| (e & OFFSET_MASK, i)).filter(|(o, _)| *o != 0).collect();
        named.sort_unstable();
        if let Some(w) = named.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!(
                "L1 entries {} and {} both name the L2 table at {:#x}; an active L1 table names each L2 table once",
                w[0].1, w[1].1, w[0].0
            ));
        }
        // Backing file name.
        let backing = if backing_offset != 0 && backing_len != 0 {
            if backing_len > MAX_BACKING_NAME {
                return Err(format!("backing file name of {backing_len} bytes is longer than {MAX_BACKING_NAME}"));
            }
            if backing_offset.checked_add(u64::from(backing_len)).map_or(true, |end| end > file_len.min(cluster_size)) {
                return Err(format!(
                    "backing file name at {backing_offset:#x} ({backing_len} bytes) lies outside the first cluster"
                ));
            }
            let mut name = vec![0u8; backing_len as usize];
            file.read_exact_at(&mut name, backing_offset).map_err(|e| format!("reading the backing file name: {e}"))?;
            Some(c_string(name)).filter(|n| !n.is_empty())
        } else {
            None
        };
        let (mut backing_format, mut data_file) = (None, None);
        for (ty, data) in extensions(file, file_len, version, header_len, ext_end)? {
            if ty == EXT_BACKING_FORMAT {
                backing_format = Some(String::from_utf8_lossy(&c_string(data)).into_owned()).filter(|f| !f.is_empty());
            } else if ty == EXT_DATA_FILE {
                data_file = Some(c_string(data)).filter(|n| !n.is_empty());
            }
        }
        // Guest data lives in another file; only the header can say which (QEMU
        // otherwise needs it on its command line, `data-file=`).
        let data_file = if incompatible & INCOMPAT_EXTERNAL_DATA != 0 {
            Some(data_file.ok_or_else(|| {
                "keeps its data in an external data file (incompatible bit 2) but names none (no data file \
                 name extension); record its name: qemu-img amend -o data_file=NAME"
                    .to_string()
            })?)
        } else {
            None
        };
        let data_file_raw = data_file.is_some() && version == 3 && be64(&h, 88) & AUTOCLEAR_DATA_FILE_RAW != 0;
        Ok(Self {
            version,
            cluster_bits,
            size,
            crypt_method,
            incompatible,
            compression,
            extended_l2,
            backing,
            backing_format,
            l1,
            file_len,
            data_file,
            data_file_raw,
            data_len: file_len,
        })
    }

    /// The length of the external data file, opened by the layer (data clusters are
    /// checked against it, and read as zeros past its end, as QEMU reads a file).
    pub fn set_data_len(&mut self, len: u64) {
        self.data_len = len;
    }

    /// Cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    fn l2_entries(&self) -> u64 {
        self.cluster_size() / if self.extended_l2 { 16 } else { 8 }
    }

    /// Reads (or reuses) the L2 table at `offset`.
    fn l2<'c>(&self, file: &dyn ReadAt, cache: &'c mut L2Cache, offset: u64) -> Result<&'c [u8], String> {
        if cache.offset != offset || cache.table.is_empty() {
            let cs = self.cluster_size();
            if offset % cs != 0 {
                return Err(format!("L2 table offset {offset:#x} is not aligned to the {cs}-byte cluster"));
            }
            if offset.checked_add(cs).map_or(true, |end| end > self.file_len) {
                return Err(format!("L2 table at {offset:#x} is past the end of the file ({} bytes)", self.file_len));
            }
            cache.table.resize(cs as usize, 0);
            file.read_exact_at(&mut cache.table, offset)
                .map_err(|e| format!("reading the L2 table at {offset:#x}: {e}"))?;
            cache.offset = offset;
            #[cfg(test)]
            L2_READS.with(|n| n.set(n.get() + 1));
        }
        Ok(&cache.table)
    }

    /// What this layer holds at `guest`, and for how many bytes (at least 1, at most
    /// `max`) the answer holds unchanged (data contiguous in the file).
    pub fn shallow(
        &self,
        file: &dyn ReadAt,
        cache: &mut L2Cache,
        guest: u64,
        max: u64,
    ) -> Result<(Shallow, u64), String> {
        if guest >= self.size {
            return Ok((Shallow::Eof, max));
        }
        let max = max.min(self.size - guest);
        let cs = self.cluster_size();
        let cluster = guest >> self.cluster_bits;
        let l2_entries = self.l2_entries();
        let l1_index = cluster / l2_entries;
        let span = cs * l2_entries;
        let table_end = (l1_index + 1).saturating_mul(span);
        let l1e = self.l1[l1_index as usize];
        let l2_offset = l1e & OFFSET_MASK;
        if l2_offset == 0 {
            return Ok((Shallow::Below, max.min(table_end - guest)));
        }
        let table = self.l2(file, cache, l2_offset)?;
        // The unit is a subcluster with extended L2 entries, else a cluster.
        let sub_bits = if self.extended_l2 { self.cluster_bits - 5 } else { self.cluster_bits };
        let unit = 1u64 << sub_bits;
        let classify = |g: u64| -> Result<Shallow, String> {
            let idx = ((g >> self.cluster_bits) % l2_entries) as usize;
            let width = if self.extended_l2 { 16 } else { 8 };
            let e = be64(table, idx * width);
            if e & L2_COMPRESSED != 0 {
                if self.data_file.is_some() {
                    return Err(format!(
                        "compressed cluster for guest {g:#x} in an image with an external data file (QEMU \
                         refuses it: data files hold no compressed clusters)"
                    ));
                }
                if self.extended_l2 && be64(table, idx * width + 8) != 0 {
                    return Err(format!("compressed cluster at guest {g:#x} has a non-zero subcluster bitmap"));
                }
                let x = 62 - (self.cluster_bits - 8);
                let offset = e & ((1u64 << x) - 1);
                let sectors = ((e & !L2_COMPRESSED & ((1u64 << 62) - 1)) >> x) + 1;
                let stored_len = sectors * 512 - (offset & 511);
                if offset >= self.file_len {
                    return Err(format!(
                        "compressed cluster for guest {g:#x} at {offset:#x} is past the end of the file ({} bytes)",
                        self.file_len
                    ));
                }
                return Ok(Shallow::Compressed { offset, stored_len });
            }
            let host = e & OFFSET_MASK;
            // Checked whatever the entry says (zero, unallocated subclusters), as QEMU
            // does: an unaligned host offset means a corrupt table, not zeros.
            if host % cs != 0 {
                return Err(format!("cluster for guest {g:#x} at {host:#x} is not cluster aligned"));
            }
            // With an external data file, entry offset 0 is data-file offset 0 when the
            // copied bit says so (QEMU's reading), and an entry must name its guest
            // cluster's own offset there.
            let external = self.data_file.is_some();
            let allocated = host != 0 || (external && e & L2_COPIED != 0);
            let data = |off: u64| -> Result<Shallow, String> {
                let at = off + (g & (cs - 1));
                if external {
                    let cluster = g & !(cs - 1);
                    if off != cluster {
                        return Err(format!(
                            "cluster for guest {cluster:#x} is at {off:#x} of the external data file; QEMU \
                             requires it at the guest offset (and reads it as corrupt)"
                        ));
                    }
                    // The data file is read as a file: zeros past its end.
                } else if off >= self.file_len {
                    return Err(format!(
                        "data cluster for guest {g:#x} at {off:#x} is past the end of the file ({} bytes)",
                        self.file_len
                    ));
                }
                Ok(if at >= self.data_len { Shallow::PastEof } else { Shallow::Data(at) })
            };
            if !self.extended_l2 {
                return if e & L2_ZERO != 0 {
                    // Bit 0 is reserved before version 3; QEMU fails such a read (EIO)
                    // rather than guess between the host cluster, zeros and below.
                    if self.version < 3 {
                        return Err(format!(
                            "cluster for guest {g:#x}: zero flag in a version 2 image (zero clusters need \
                             version 3); QEMU reads it as corrupt"
                        ));
                    }
                    Ok(Shallow::Zero)
                } else if !allocated {
                    Ok(Shallow::Below)
                } else {
                    data(host)
                };
            }
            let bitmap = be64(table, idx * width + 8);
            let (alloc, zero) = (bitmap as u32, (bitmap >> 32) as u32);
            if alloc & zero != 0 {
                return Err(format!("cluster for guest {g:#x}: subclusters marked both allocated and zero"));
            }
            if alloc != 0 && !allocated {
                return Err(format!("cluster for guest {g:#x}: allocated subclusters but no host cluster"));
            }
            // Subclusters smaller than a page answer one by one like small clusters:
            // the mapping builds the pages they share from the pieces (data of this
            // layer, zeros, the backing chain).
            let i = ((g >> sub_bits) & 31) as u32;
            match (alloc >> i & 1, zero >> i & 1) {
                (1, _) => data(host),
                (_, 1) => Ok(Shallow::Zero),
                _ => Ok(Shallow::Below),
            }
        };
        let first = classify(guest)?;
        let mut end = ((guest >> sub_bits) + 1) << sub_bits;
        if matches!(first, Shallow::Compressed { .. } | Shallow::Unsupported(_)) {
            let end = ((guest >> self.cluster_bits) + 1) << self.cluster_bits;
            return Ok((first, max.min(end - guest)));
        }
        while end < guest + max && end < table_end {
            let next = classify(end)?;
            let same = match (&first, &next) {
                (Shallow::Data(a), Shallow::Data(b)) => *b == a + (end - guest),
                (a, b) => a == b,
            };
            if !same {
                break;
            }
            end += unit;
        }
        let mut len = max.min(end - guest);
        if let Shallow::Data(at) = first {
            // A last cluster written only in part: data up to the end of file.
            len = len.min(self.data_len - at);
        }
        Ok((first, len))
    }
}

/// `bytes` up to the first NUL: QEMU reads the backing file name and format as C
/// strings, so a name padded with NULs is the name, and an all-NUL one is none.
fn c_string(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.truncate(bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len()));
    bytes
}

/// Header extensions as (type, data), from the end of the header to `ext_end`.
fn extensions(
    file: &dyn ReadAt,
    file_len: u64,
    version: u32,
    header_len: u64,
    ext_end: u64,
) -> Result<Vec<(u32, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let limit = ext_end.min(file_len);
    let mut at = if version == 2 { 72 } else { header_len };
    while at + 8 <= limit {
        let mut h = [0u8; 8];
        file.read_exact_at(&mut h, at).map_err(|e| format!("reading a header extension: {e}"))?;
        let (ty, len) = (be32(&h, 0), u64::from(be32(&h, 4)));
        if ty == EXT_END {
            break;
        }
        if at + 8 + len > limit {
            return Err(format!(
                "header extension {ty:#x} at {at:#x} ({len} bytes) runs past the end of the extensions at \
                 {limit:#x} (the backing file name, the first cluster's end or the file's)"
            ));
        }
        let mut data = vec![0u8; len as usize];
        file.read_exact_at(&mut data, at + 8).map_err(|e| format!("reading header extension {ty:#x}: {e}"))?;
        out.push((ty, data));
        at += 8 + len.div_ceil(8) * 8;
    }
    Ok(out)
}

/// Names of incompatible features from the feature name table, for error messages.
fn feature_names(
    file: &dyn ReadAt,
    file_len: u64,
    version: u32,
    header_len: u64,
    ext_end: u64,
) -> Option<Vec<(u32, String)>> {
    let exts = extensions(file, file_len, version, header_len, ext_end).ok()?;
    let (_, table) = exts.into_iter().find(|(t, _)| *t == EXT_FEATURE_NAMES)?;
    Some(
        table
            .chunks_exact(48)
            .filter(|e| e[0] == 0)
            .map(|e| {
                let name = &e[2..48];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                (u32::from(e[1]), String::from_utf8_lossy(&name[..end]).into_owned())
            })
            .collect(),
    )
}
