//! [`PmemBacking`]: an image's mapping plan handed to an unmodified VMM, which maps it
//! as the memory of a virtual persistent-memory device (FlexMem's DAX disk).
//!
//! A VMM such as QEMU maps a memory backend from a file it opens itself. The plan is
//! written into a memfd that doubles as that file (`/proc/self/fd/N`, sized to the
//! disk); the layer files and the materialised-pages memfd are inherited by the VMM.
//! The preload shim (crates/advm-preload, `csrc/pmem.c`), told the plan's descriptor in
//! [`PLAN_ENV`], sees the VMM map that file and maps the plan there instead: layer files
//! `MAP_PRIVATE` (guest writes stay in the VM, reads share the host's page cache), zeros
//! anonymous, materialised pages from the memfd.
//!
//! The plan's format (little-endian u64 words): `ADVMPMEM` magic, version 1, disk size,
//! piece count, then per piece: guest offset, length, descriptor (`u64::MAX` for
//! anonymous zeros), offset in that descriptor.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::service;
use super::space::{layout, LayerFile, Layout, Piece, Source};
use super::{hold_off_writers, Image, ImageOptions, MapOptions, MapStats};
use crate::mem::Memfd;
use crate::sys::fdpass;
use crate::{Error, Result};

/// The variable naming the plan's descriptor to the shim.
pub const PLAN_ENV: &str = "ADVM_PMEM_PLAN_FD";

/// The variable naming the directory where the shim writes a dump of the device.
pub const DUMP_DIR_ENV: &str = "ADVM_PMEM_DUMP_DIR";

/// The signal that asks the shim for a dump (SIGRTMAX - 3; `csrc/pmem.c` agrees).
pub const DUMP_SIGNAL: i32 = 61;

/// Asks the VMM `pid`, started with a [`PmemBacking`] and [`DUMP_DIR_ENV`], to dump the
/// pages its guest wrote (see `advm vm dump`).
pub fn request_dump(pid: u32) -> Result<()> {
    let p =
        i32::try_from(pid).map_err(|_| Error::InvalidArgument { what: "pid", why: format!("{pid} out of range") })?;
    Ok(crate::sys::sigsend::send(p, DUMP_SIGNAL)?)
}

/// The plan's first word.
pub const PLAN_MAGIC: &[u8; 8] = b"ADVMPMEM";

/// An image's mapping plan plus the descriptors it names, all inheritable by the next
/// program this process starts.
#[derive(Debug)]
pub struct PmemBacking {
    plan: Memfd,
    plan_fd: OwnedFd,
    /// Inheritable duplicates of the layer files and the memfd the plan names.
    _fds: Vec<OwnedFd>,
    _memfd: Option<Memfd>,
    stats: MapStats,
    size: u64,
}

impl PmemBacking {
    /// Plans the mapping of `image` (as [`ImageSpace::map_image`](super::ImageSpace::map_image)
    /// would, materialising its memfd) and writes the plan. The device's size is the
    /// virtual size rounded up to `align` (a power of two, e.g. 2 MiB for a DAX device);
    /// the padding reads as zeros.
    pub fn new(image: &Image, options: &MapOptions, align: u64) -> Result<Self> {
        let files: Vec<LayerFile<'_>> = image.layers().iter().map(LayerFile::data_of).collect();
        Self::build(layout(image, options)?, &files, align, options.image.force_share)
    }

    /// As [`PmemBacking::new`], from the plan an image service handed out
    /// ([`service::fetch`]): no table is read and no cluster decompressed here.
    /// `options.force_share` as for [`PmemBacking::new`]; the service decided the rest.
    pub fn from_service(fetched: service::Fetched, align: u64, options: &ImageOptions) -> Result<Self> {
        let service::Fetched { layout, layers, .. } = fetched;
        Self::build(layout, &service::layer_files(&layers), align, options.force_share)
    }

    /// Writes the plan. Each layer goes to the VMM as a description of its own that
    /// locks QEMU writers out for as long as the VMM holds it (unless `force_share`):
    /// the VMM's mapping has no read lease to tell it of a writer.
    fn build(layout: Layout, layers: &[LayerFile<'_>], align: u64, force_share: bool) -> Result<Self> {
        let path = layers[0].path.to_path_buf();
        let err = |why: String| Error::Image { path: path.clone(), why };
        if !align.is_power_of_two() {
            return Err(Error::InvalidArgument {
                what: "pmem alignment",
                why: format!("{align} is not a power of two"),
            });
        }
        let Layout { pieces, memfd, stats, total, .. } = layout;
        let size = (total as u64).div_ceil(align) * align;
        let inherit = |fd: std::os::fd::BorrowedFd<'_>, what: &str| {
            fdpass::dup_inheritable(fd).map_err(|e| err(format!("handing {what} to the VMM: {e}")))
        };
        let mut fds = Vec::new();
        let mut layer_fd: Vec<Option<u64>> = vec![None; layers.len()];
        let memfd_fd = match &memfd {
            Some(m) => {
                fds.push(inherit(m.as_fd(), "the materialised pages")?);
                Some(fds.last().expect("pushed").as_raw_fd() as u64)
            }
            None => None,
        };
        let mut words: Vec<u64> = Vec::with_capacity(4 + 4 * (pieces.len() + 1));
        let mut push_piece = |words: &mut Vec<u64>, p: &Piece| -> Result<()> {
            let (fd, offset) = match p.source {
                Source::File { depth, offset } => {
                    let fd = match layer_fd[depth] {
                        Some(fd) => fd,
                        None => {
                            let l = &layers[depth];
                            let own = hold_off_writers(l.path, l.file, force_share)?;
                            let file = own.as_ref().unwrap_or(l.file);
                            fds.push(inherit(file.as_fd(), &l.path.display().to_string())?);
                            let fd = fds.last().expect("pushed").as_raw_fd() as u64;
                            layer_fd[depth] = Some(fd);
                            fd
                        }
                    };
                    (fd, offset)
                }
                Source::Anon => (u64::MAX, 0),
                Source::Memfd => (memfd_fd.expect("memfd pieces come with a memfd"), p.start),
                Source::Slot { offset } => (memfd_fd.expect("memfd pieces come with a memfd"), offset),
            };
            words.extend([p.start, p.end - p.start, fd, offset]);
            Ok(())
        };
        words.extend([u64::from_le_bytes(*PLAN_MAGIC), 1, size, 0]);
        for p in &pieces {
            push_piece(&mut words, p)?;
        }
        if size > total as u64 {
            push_piece(&mut words, &Piece { start: total as u64, end: size, source: Source::Anon })?;
        }
        words[3] = ((words.len() - 4) / 4) as u64;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let plan = Memfd::create("advm-pmem-plan").map_err(|e| err(format!("writing the pmem plan: {e}")))?;
        plan.set_len(size.max(bytes.len() as u64)).map_err(|e| err(format!("writing the pmem plan: {e}")))?;
        plan.write_all_at(&bytes, 0).map_err(|e| err(format!("writing the pmem plan: {e}")))?;
        let plan_fd = inherit(plan.as_fd(), "the pmem plan")?;
        Ok(Self { plan, plan_fd, _fds: fds, _memfd: memfd, stats, size })
    }

    /// The device size in bytes (the VMM's backend `size`).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file the VMM's memory backend opens (the plan memfd, reopened).
    pub fn backing_path(&self) -> String {
        format!("/proc/self/fd/{}", self.plan_fd.as_raw_fd())
    }

    /// The environment variable the shim reads: ([`PLAN_ENV`], descriptor number).
    pub fn env(&self) -> (&'static str, String) {
        (PLAN_ENV, self.plan_fd.as_raw_fd().to_string())
    }

    /// What the plan maps.
    pub fn stats(&self) -> &MapStats {
        &self.stats
    }

    /// The plan memfd (for tests that read the plan back).
    pub fn plan(&self) -> &Memfd {
        &self.plan
    }
}
