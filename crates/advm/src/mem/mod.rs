//! The public memory vocabulary: the safe types every capability and every front end
//! speaks, so that none of them needs a raw syscall.
//!
//! - [`HostAddr`], [`PageRange`]: addresses and page-aligned ranges, checked arithmetic.
//! - [`Backing`], [`Extent`], [`Share`], [`Access`]: what a piece of address space maps.
//! - [`Memfd`]: an owned anonymous file (the arena's and the image's page home).
//! - [`Region`]: an owned private read-write region that a capability manages (remap
//!   moves within it; the pager and the GC heap will live in one). [`Grant`] is the
//!   right to rewrite the pages of a span: borrowed from a region (safe) or made from
//!   raw addresses (unsafe, for the C API); [`MappingInfo`] is what a grant reports
//!   about the mappings under it.
//! - [`Reservation`]: address space reserved as a whole, filled with mappings by its
//!   owner (the virtual-copy arena).
//! - [`Assembly`]: a reservation filled with extents, then read (image mapping).
//!
//! Every `unsafe` behind these types lives in the private `sys` layer.

mod addr;
mod assembly;
mod extent;
mod memfd;
mod region;
mod reservation;

pub use addr::{is_page_aligned, page_align_up, page_size, HostAddr, PageRange};
pub use assembly::Assembly;
pub use extent::{Access, Backing, Extent, Share};
pub use memfd::Memfd;
pub use region::{Grant, MappingInfo, Region};
pub use reservation::Reservation;
