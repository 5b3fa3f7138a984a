//! Compressed qcow2 clusters: reading one and inflating it to exactly a cluster.

use std::io::Read;

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
            // One frame; the sector padding after it is not a second frame.
            let mut dec =
                zstd::stream::read::Decoder::with_buffer(input).map_err(|e| format!("zstd: {e}"))?.single_frame();
            dec.read_exact(&mut out)
                .map_err(|e| format!("zstd stream shorter than the {cluster_size}-byte cluster: {e}"))?;
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
}
