//! The generic resolver: each layer's driver says only what it holds for a range,
//! and one walk down the chain picks the first layer that answers (the paper's
//! Algorithm 1), coalescing adjacent ranges with the same answer.

use super::layer::{current_len, Driver, Layer};
use super::qcow2;
use super::{Extent, ExtentKind, ExtentMap, GuestOffset, Image, LayerOffset, ZeroReason};
use crate::{Error, Result};

/// The most extents a map may hold (a crafted image could otherwise describe
/// billions of one-cluster runs and exhaust memory).
pub const MAX_EXTENTS: usize = 1 << 24;

impl Layer {
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
                            // The header check lets only 1 and 2 through.
                            if q.crypt_method == 1 { "AES" } else { "LUKS" }
                        ))
                    }
                    a => a,
                };
                (a, len)
            }
            Driver::Raw => {
                let end = self.virtual_size();
                if guest >= end {
                    (Shallow::Eof, max)
                } else if guest >= self.file_len {
                    // The rest of the last sector: zeros of this layer.
                    (Shallow::PastEof, max.min(end - guest))
                } else {
                    let max = max.min(self.file_len - guest);
                    // Holes in a sparse raw file read as zeros and need no page cache.
                    let data = crate::sys::fs::next_data(&self.file, guest).map_err(|e| self.err(e.to_string()))?;
                    match data {
                        Some(d) if d <= guest => {
                            let hole =
                                crate::sys::fs::next_hole(&self.file, guest).map_err(|e| self.err(e.to_string()))?;
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

impl Extent {
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

impl Image {
    /// The extent map of the whole disk (the paper's Algorithm 1, run by ranges).
    pub fn extent_map(&self) -> Result<ExtentMap> {
        let extents = self.extents(0, self.virtual_size())?;
        Ok(ExtentMap { size: self.virtual_size(), extents })
    }

    /// The extents of `[start, end)`, coalesced.
    fn extents(&self, start: u64, end: u64) -> Result<Vec<Extent>> {
        self.extents_with(&mut self.l2_caches(), start, end)
    }

    fn l2_caches(&self) -> Vec<qcow2::L2Cache> {
        self.layers.iter().map(|_| Default::default()).collect()
    }

    /// [`extents`](Self::extents) with each layer's last L2 table kept in `caches`
    /// across calls.
    fn extents_with(&self, caches: &mut [qcow2::L2Cache], start: u64, end: u64) -> Result<Vec<Extent>> {
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
        ChainReader::new(self).read_at(guest, buf)
    }
}

/// Reads of an image's virtual disk that keep, between reads, each layer's last L2
/// table and the last decompressed cluster: many small reads in one region (the
/// pages a mapping materialises one by one) read each table once, not once a read.
pub(crate) struct ChainReader<'a> {
    image: &'a Image,
    caches: Vec<qcow2::L2Cache>,
    /// (depth, stored offset, bytes) of the last compressed cluster read.
    cluster: Option<(usize, u64, Vec<u8>)>,
}

impl<'a> ChainReader<'a> {
    pub(crate) fn new(image: &'a Image) -> Self {
        Self { image, caches: image.l2_caches(), cluster: None }
    }

    /// As [`Image::read_at`].
    pub(crate) fn read_at(&mut self, guest: GuestOffset, buf: &mut [u8]) -> Result<()> {
        let image = self.image;
        let end = guest.checked_add(buf.len() as u64).filter(|e| e.0 <= image.virtual_size()).ok_or_else(|| {
            Error::InvalidArgument {
                what: "image read",
                why: format!("{} bytes at {guest} run past the {}-byte virtual size", buf.len(), image.virtual_size()),
            }
        })?;
        // A raw layer cut short would otherwise read as a hole (zeros); a cut during
        // the read shows as a short pread, named the same way.
        let files = image.layers.iter().flat_map(|l| {
            [(&l.path, &l.file, l.file_len)].into_iter().chain(l.data.as_ref().map(|d| (&d.path, &d.file, d.len)))
        });
        for (path, file, len) in files {
            match current_len(file) {
                Ok(now) if now < len => {
                    return Err(Error::Image {
                        path: path.clone(),
                        why: format!("shrank from {len} to {now} bytes since it was opened"),
                    })
                }
                Ok(_) => {}
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        for e in image.extents_with(&mut self.caches, guest.0, end.0)? {
            let dst = &mut buf[(e.start.0 - guest.0) as usize..(e.end() - guest.0) as usize];
            let layer = &image.layers[e.depth];
            match &e.kind {
                ExtentKind::Data { offset } => layer.read_data_at(dst, *offset)?,
                ExtentKind::Zero { .. } => dst.fill(0),
                ExtentKind::Compressed { offset, stored_len } => {
                    let Driver::Qcow2(q) = &layer.driver else { unreachable!("only qcow2 compresses") };
                    let cs = q.cluster_size();
                    if self.cluster.as_ref().map_or(true, |(d, o, _)| (*d, *o) != (e.depth, offset.0)) {
                        self.cluster = Some((e.depth, offset.0, layer.decompress(q, *offset, *stored_len)?));
                    }
                    let data = &self.cluster.as_ref().expect("just filled").2;
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
