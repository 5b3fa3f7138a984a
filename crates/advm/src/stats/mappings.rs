//! The distinct-page meter by mapping: which physical pages each mapping of a process
//! holds, so a caller can tell what part of a process its memory is in (a VMM's guest
//! RAM, its code buffer, its device mappings, its own heap) and count each page once
//! across mappings and processes. Also the page cache a file holds on the host, mapped
//! or not (a VMM reading an image with `pread` maps none of it).

use std::path::Path;

use procfs::process::{MMapPath, Process};

use crate::sys::fs::residency;
use crate::sys::pagemap::{zero_pfn, Entry, Pagemap};
use crate::{Error, Result};

/// One mapping of a process and the frames of its present pages.
#[derive(Debug, Clone)]
pub struct MappingFrames {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `rwxp`-style permissions, as in /proc/PID/maps.
    pub perms: String,
    /// The mapped file's path, `[heap]`-style names, or empty for anonymous memory.
    pub path: String,
    /// Frames of the process's own (anonymous or private-copy) pages.
    pub anon: Vec<u64>,
    /// Frames of file or shared-memory pages.
    pub file: Vec<u64>,
}

impl MappingFrames {
    /// The mapping's length, bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the mapping is empty (never, for a mapping the kernel lists).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Pages read from pagemap per call.
const CHUNK_PAGES: usize = 4096;

/// Every mapping of `pid` with the frames of its present pages (the shared zero page
/// left out: it holds no memory). Needs CAP_SYS_ADMIN for frames; without it every
/// frame reads as 0 and the result says nothing about sharing.
pub fn mapping_frames(pid: i32) -> Result<Vec<MappingFrames>> {
    let process = Process::new(pid).map_err(|_| Error::NoSuchProcess { pid })?;
    if let Some(e) = super::without_memory(pid, &process) {
        return Err(e);
    }
    let gone = |what: &str, e: procfs::ProcError| {
        if process.is_alive() {
            Error::io(format!("/proc/{pid}/{what}"), std::io::Error::other(e.to_string()))
        } else {
            Error::ProcessExited { pid }
        }
    };
    let maps = process.maps().map_err(|e| gone("maps", e))?;
    let pagemap = Pagemap::from_file(process.open_relative("pagemap").map_err(|e| gone("pagemap", e))?);
    let ps = crate::sys::page_size() as u64;
    let zero = zero_pfn();
    let mut entries = vec![0u64; CHUNK_PAGES];
    let mut out = Vec::new();
    for vma in maps.iter() {
        if matches!(vma.pathname, MMapPath::Vsyscall) {
            continue;
        }
        let (start, end) = vma.address;
        let path = match &vma.pathname {
            MMapPath::Path(p) => p.display().to_string(),
            MMapPath::Anonymous => String::new(),
            other => format!("{other:?}"),
        };
        let mut m = MappingFrames {
            start,
            end,
            perms: vma.perms.as_str().to_string(),
            path,
            anon: Vec::new(),
            file: Vec::new(),
        };
        let mut vpn = start / ps;
        while vpn < end / ps {
            let want = ((end / ps - vpn) as usize).min(CHUNK_PAGES);
            let got = pagemap.read(vpn, &mut entries[..want])?;
            if got == 0 {
                return Err(Error::ProcessExited { pid });
            }
            for &raw in &entries[..got] {
                let e = Entry(raw);
                let Some(pfn) = e.pfn() else { continue };
                if zero.is_some_and(|z| z == pfn) {
                    continue;
                }
                if e.file_or_shared() {
                    m.file.push(pfn);
                } else {
                    m.anon.push(pfn);
                }
            }
            vpn += got as u64;
        }
        out.push(m);
    }
    Ok(out)
}

/// Pages of the file at `path` in the host's page cache now, mapped by anyone or not
/// (`cachestat`, or `mincore` on older kernels). Faults nothing in.
pub fn file_cached_pages(path: &Path) -> Result<u64> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let r = match residency::cachestat(&f, 0, 0) {
        Ok(r) => r,
        Err(_) => residency::mincore_resident(&f, len)?,
    };
    Ok(r.resident)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_written_in_a_mapping_show_as_its_anonymous_frames_and_untouched_ones_not_at_all() {
        let ps = crate::mem::page_size();
        let mut region = crate::mem::Region::new(8 * ps).unwrap();
        let bytes = region.bytes_mut();
        for p in [0, 3, 5] {
            bytes[p * ps] = 1;
        }
        let start = region.addr().0 as u64;
        let maps = mapping_frames(std::process::id() as i32).unwrap();
        let m = maps.iter().find(|m| m.start <= start && start < m.end).expect("the region is mapped");
        assert!(m.perms.starts_with("rw"), "{}", m.perms);
        // Other pages of the same VMA (a neighbouring allocation) may be present too,
        // but never fewer than the three written here.
        assert!(m.anon.len() >= 3, "{} anonymous frames", m.anon.len());
        if !crate::sys::pagemap::pfns_visible().unwrap_or(false) {
            eprintln!("frames not checked: PFNs are hidden (needs CAP_SYS_ADMIN)");
            return;
        }
        let own: Vec<u64> = crate::stats::page_frames(region.range()).unwrap().into_iter().flatten().collect();
        assert_eq!(own.len(), 3, "only the written pages are present");
        assert!(own.iter().all(|f| m.anon.contains(f)), "the written pages' frames are the mapping's");
    }

    #[test]
    fn a_file_read_with_pread_is_in_the_page_cache_without_being_mapped() {
        let dir = std::env::temp_dir().join(format!("advm-mappings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let cached = file_cached_pages(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // Written just now, so its 16 pages are in the page cache.
        assert_eq!(cached, (64 << 10) / crate::mem::page_size() as u64);
        assert!(file_cached_pages(Path::new("/nonexistent/advm")).is_err());
    }
}
