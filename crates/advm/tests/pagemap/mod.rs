//! What /proc/self/pagemap says of this process's pages, for the merge tests.

use std::io::{Read, Seek, SeekFrom};

use advm::mem::page_size;

/// Per page from `addr`: "absent", "anon" (present, anonymous: a private copy) or
/// "file" (present, a page of a file: the store's).
pub fn page_kinds(addr: usize, n: usize) -> Vec<&'static str> {
    let ps = page_size();
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.seek(SeekFrom::Start((addr / ps * 8) as u64)).unwrap();
    let mut b = vec![0u8; n * 8];
    f.read_exact(&mut b).unwrap();
    b.chunks_exact(8)
        .map(|e| {
            let e = u64::from_le_bytes(e.try_into().unwrap());
            match (e >> 63 & 1, e >> 61 & 1) {
                (0, _) => "absent",
                (_, 0) => "anon",
                _ => "file",
            }
        })
        .collect()
}
