//! Moves and swaps by offset within a [`Region`], and regions made ready for them.

use super::{execute, Batch, Kind, Op, Options, Outcome, PMD_SIZE, PUD_SIZE};
use crate::mem::{page_align_up, HostAddr, Region};
use crate::sys::Errno;
use crate::{Error, Result};

impl Region {
    /// A region for moving pages within (a heap, an arena): `len` bytes rounded up to
    /// pages, 2 MiB aligned (1 GiB aligned from 1 GiB, so aligned moves can move whole
    /// PUD entries), registered for UFFDIO_MOVE where available.
    pub fn for_remap(len: usize) -> Result<Self> {
        Self::build_for_remap(len, false)
    }

    /// As [`Region::for_remap`], with `MADV_HUGEPAGE` (transparent huge pages where the
    /// THP mode allows).
    pub fn for_remap_with_huge_pages(len: usize) -> Result<Self> {
        Self::build_for_remap(len, true)
    }

    fn build_for_remap(len: usize, huge: bool) -> Result<Self> {
        let len = page_align_up(len)
            .filter(|&l| l > 0)
            .ok_or_else(|| Error::InvalidArgument { what: "len", why: format!("{len} is zero or too large") })?;
        let align = if len >= PUD_SIZE { PUD_SIZE } else { PMD_SIZE };
        let mut r = Region::aligned(len, align, huge)?;
        if let Some(k) = super::uffd() {
            let (s, l) = (r.map.addr(), r.map.len());
            // Registering now, whole, keeps later moves from splitting the VMA.
            if let Err(e) = r.map.grant().register_for_move(k, s, l) {
                if !matches!(e.errno, Errno::PERM | Errno::NOSYS | Errno::INVAL | Errno::BUSY) {
                    return Err(e.into());
                }
            }
        }
        Ok(r)
    }

    fn at(&self, what: &'static str, off: usize, len: usize) -> Result<HostAddr> {
        match off.checked_add(len) {
            Some(e) if e <= self.len() => Ok(HostAddr(self.addr().0 + off)),
            _ => Err(Error::InvalidArgument {
                what,
                why: format!("offset {off:#x}+{len:#x} is outside the {:#x}-byte region", self.len()),
            }),
        }
    }

    /// Moves `len` bytes from offset `src` to offset `dst` (see [`super::move_pages`]).
    pub fn move_pages(&mut self, dst: usize, src: usize, len: usize) -> Result<Outcome> {
        self.move_pages_with(dst, src, len, &Options::default())
    }

    /// [`Region::move_pages`] with explicit options.
    pub fn move_pages_with(&mut self, dst: usize, src: usize, len: usize, opts: &Options) -> Result<Outcome> {
        let (d, s) = (self.at("dst", dst, len)?, self.at("src", src, len)?);
        let op = Op { kind: Kind::Move, x: d.0, y: s.0, len, copy: false };
        execute(&mut self.grant(), &[op], opts).map_err(|i| i.error)
    }

    /// Swaps `len` bytes at offsets `a` and `b`.
    pub fn swap_pages(&mut self, a: usize, b: usize, len: usize) -> Result<Outcome> {
        self.swap_pages_with(a, b, len, &Options::default())
    }

    /// [`Region::swap_pages`] with explicit options.
    pub fn swap_pages_with(&mut self, a: usize, b: usize, len: usize, opts: &Options) -> Result<Outcome> {
        let (x, y) = (self.at("a", a, len)?, self.at("b", b, len)?);
        let op = Op { kind: Kind::Swap, x: x.0, y: y.0, len, copy: false };
        execute(&mut self.grant(), &[op], opts).map_err(|i| i.error)
    }

    /// Runs a batch whose addresses lie in this region.
    pub fn run(&mut self, batch: &Batch) -> Result<Outcome> {
        batch.execute(&mut self.grant())
    }
}
