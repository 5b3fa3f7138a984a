//! Layered images (FlexMem, Liu et al.): a qcow2 backing chain resolved to extents of
//! (layer file, offset), and mapped so that every process reading the image shares
//! one page-cache copy.
//!
//! [`Image::open`] opens a qcow2 (or raw) image with its whole backing chain.
//! [`Image::extent_map`] is the paper's Algorithm 1: for every range of the virtual
//! disk, the first layer that holds it decides, and adjacent ranges with the same
//! answer coalesce. Each layer's driver only says what *it* holds for a range (data
//! here, zero, look below, end of this layer, compressed, unsupported); one generic
//! resolver walks the chain (the split imago uses). [`ImageSpace::map`] turns the map
//! into mappings inside one reserved range.
//!
//! Guest offsets (positions on the virtual disk) and layer offsets (positions in a
//! layer file) are distinct newtypes so the two are never mixed up.
//!
//! Files: `types` (offsets, extents, the extent map), `layer` (opening a layer file
//! and the backing-file policy), `resolve` (the resolver over per-layer drivers),
//! `qcow2` (the qcow2 driver), `decompress` (compressed clusters), `space` (the
//! mapping), `fuzz` (the parser's in-memory entry point), `pmem` (the plan handed to a
//! VMM as its virtio-pmem memory, docs/vm.md), `dump` (written pages to a qcow2
//! overlay while the writer runs), `service` (plans computed once, handed out with
//! their descriptors).

mod decompress;
pub mod dump;
mod fuzz;
mod layer;
mod pmem;
mod qcow2;
mod resolve;
pub mod service;
mod space;
mod types;

pub use fuzz::parse_layer_bytes;
pub(crate) use layer::{current_len, hold_off_writers};
pub use layer::{Image, ImageOptions, Layer, LayerInfo, LayerStamp, MAX_CHAIN_DEPTH};
pub use pmem::{request_dump, PmemBacking, DUMP_DIR_ENV, DUMP_SIGNAL, PLAN_ENV, PLAN_MAGIC};
pub use qcow2::Compression;
pub use resolve::MAX_EXTENTS;
pub use space::{ImageSpace, MapOptions, MapStats, OverBudget, DEFAULT_MAX_MATERIALISED};
pub use types::{
    ClusterIndex, Extent, ExtentKind, ExtentMap, GuestOffset, LayerFormat, LayerOffset, ReadAt, ZeroReason,
};
