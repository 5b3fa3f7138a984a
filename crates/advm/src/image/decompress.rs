//! Compressed qcow2 clusters: reading one and inflating it to exactly a cluster.

use super::layer::{Driver, Layer};
use super::{qcow2, Compression, LayerOffset};
use crate::Result;

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
    pub(super) fn decompress(&self, q: &qcow2::Qcow2, offset: LayerOffset, stored_len: u64) -> Result<Vec<u8>> {
        let avail = stored_len.min(self.file_len.saturating_sub(offset.0));
        let mut input = vec![0u8; avail as usize];
        self.read_exact_at(&mut input, offset)?;
        decompress_cluster(q.compression, &input, q.cluster_size() as usize)
            .map_err(|why| self.err(format!("compressed cluster at {offset}: {why}")))
    }
}

/// Decompresses one qcow2 cluster of `cluster_size` bytes. qemu requires the output
/// to fill the cluster exactly; trailing input (sector padding) is ignored.
pub(super) fn decompress_cluster(c: Compression, input: &[u8], cluster_size: usize) -> Result<Vec<u8>, String> {
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
            // As QEMU decodes: frames until the cluster is full (the sector padding after
            // them is never reached), and the last frame must end there: one that goes
            // on past the cluster is a damaged cluster, not a longer one.
            use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
            let mut dec = Decoder::new().map_err(|e| format!("zstd: {e}"))?;
            let mut src = InBuffer::around(input);
            let mut dst = OutBuffer::around(&mut out[..]);
            let mut frame_left = 0;
            while dst.pos() < cluster_size {
                let (read, written) = (src.pos, dst.pos());
                frame_left = dec.run(&mut src, &mut dst).map_err(|e| format!("zstd: {e}"))?;
                if src.pos == read && dst.pos() == written {
                    return Err(format!(
                        "zstd stream gave {written} bytes, shorter than the {cluster_size}-byte cluster"
                    ));
                }
            }
            if frame_left != 0 {
                return Err(format!("zstd frame runs past the end of the {cluster_size}-byte cluster"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_zstd_cluster_is_whole_frames_that_end_with_the_cluster() {
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 / 13) as u8).collect();
        let frame = |d: &[u8]| zstd::bulk::compress(d, 3).unwrap();
        let mut padded = frame(&data[..4096]);
        padded.extend([0u8; 300]);
        assert_eq!(decompress_cluster(Compression::Zstd, &padded, 4096).unwrap(), data[..4096]);
        // Two frames filling the cluster, as QEMU accepts.
        let two = [frame(&data[..1000]), frame(&data[1000..4096])].concat();
        assert_eq!(decompress_cluster(Compression::Zstd, &two, 4096).unwrap(), data[..4096]);
        // A frame of 8 KiB is not a 4 KiB cluster (QEMU: EIO), nor is a short one.
        let e = decompress_cluster(Compression::Zstd, &frame(&data), 4096).unwrap_err();
        assert_eq!(e, "zstd frame runs past the end of the 4096-byte cluster");
        let e = decompress_cluster(Compression::Zstd, &frame(&data[..1000]), 4096).unwrap_err();
        assert!(e.starts_with("zstd"), "{e}");
    }
}
