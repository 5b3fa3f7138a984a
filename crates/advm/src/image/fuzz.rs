//! The parser's fuzz entry: one qcow2 layer held in memory, walked without a chain.

use std::path::PathBuf;

use super::decompress::decompress_cluster;
use super::qcow2;
use crate::{Error, Result};

/// Parses a qcow2 image held in memory (header, extensions, L1 and L2 tables) and
/// lists what this single layer holds, at most `max_runs` runs: the entry point of
/// the parser fuzz target and the garbage-input tests. Never panics.
pub fn parse_layer_bytes(bytes: &[u8], max_runs: usize) -> Result<Vec<(u64, u64, String)>> {
    let err = |why: String| Error::Image { path: PathBuf::from("<memory>"), why };
    let q = qcow2::Qcow2::parse(&bytes, bytes.len() as u64, "qemu-img convert -O qcow2 IN OUT").map_err(err)?;
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
        // A compression type the header names must agree with incompatible bit 3, as
        // QEMU requires: zstd without the bit, or the bit with deflate, is refused.
        let mut f = tiny_qcow2();
        f[100..104].copy_from_slice(&112u32.to_be_bytes());
        f[104] = 1;
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: compression type Zstd but the compression type bit (incompatible bit 3) is clear"
        );
        f[104] = 0;
        f[79] = 1 << 3;
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: compression type Deflate but the compression type bit (incompatible bit 3) is set (it must \
             be set only for a type other than deflate)"
        );
        // An encryption method QEMU does not know is refused, as QEMU refuses it.
        let mut f = tiny_qcow2();
        f[32..36].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: unknown encryption method 3 (known: 0 none, 1 AES, 2 LUKS)"
        );
        // A zero entry whose host offset is not cluster aligned is a corrupt table (QEMU
        // refuses to read it), not zeros.
        let mut f = tiny_qcow2();
        f[2 * 4096 + 8..2 * 4096 + 16].copy_from_slice(&(0x1234_5600u64 | 1).to_be_bytes());
        assert_eq!(
            parse_layer_bytes(&f, 10).unwrap_err().to_string(),
            "<memory>: cluster for guest 0x1000 at 0x12345600 is not cluster aligned"
        );
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
