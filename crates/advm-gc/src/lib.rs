//! advm-gc: a precise, moving garbage-collected heap for Rust and C whose full
//! collection is a parallel LISP2 mark-compact that moves large objects by remapping
//! their pages (SVAGC, Ataie & Yu) through [`advm::remap`], and small ones by memmove.
//!
//! - Objects: a two-word header (size, number of pointer slots; mark bit and forwarding
//!   word during a collection), then `nptrs` pointer slots (null or objects of the same
//!   heap), then raw bytes. An [`Obj`] is the address of the first pointer slot.
//! - Two spaces: small objects are bump-allocated in per-thread buffers; objects at or
//!   above the large-object size (the compaction break-even measured by `advm::remap`,
//!   read at heap creation, or [`Config::large_object_bytes`]) start on a page and live in their own
//!   region, so compaction moves them whole, all in one [`advm::remap::Batch`].
//! - Roots: each [`Mutator`] has a stack of root slots; C registers its own slots
//!   ([`Heap::add_root_slot`]).
//! - Threads: mutators [`Heap::attach`]; a collection stops the world at safepoints
//!   (every allocation, and [`Mutator::safepoint`]).
//!
//! See DESIGN.md for the algorithm and its invariants.

mod barrier;
mod collect;
mod error;
mod heap;
mod nursery;
mod paged;
mod policy;
mod pool;
mod raw;
mod stats;
mod verify;

pub use error::{Error, Result};
pub use heap::{Config, Engine, FreeHook, Heap, Mutator, Obj, MAX_HEAP_BYTES, MAX_NPTRS};
pub use paged::Paging;
pub use policy::{Generational, Policy, MIN_NURSERY_BYTES};
pub use stats::{Collection, Stats};
