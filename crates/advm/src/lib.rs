//! advm: application-directed virtual memory for stock Linux.
//!
//! Programs that know their own memory tell advm, and advm turns that knowledge into
//! page operations. All raw syscalls and `unsafe` live in the private `sys` module; capability modules
//! plan in terms of page ranges ([`addr`]) and hand the plan to `sys`; [`stats`]
//! observes from the outside.
#![deny(unsafe_code)]

pub mod error;
pub mod image;
pub mod ksm;
pub mod mem;
pub mod merge;
pub mod pager;
pub mod probe;
pub mod process;
pub mod remap;
pub mod stats;
pub(crate) mod sys;
mod threads;
pub mod vcopy;
pub mod wire;

pub use error::{Error, Result};

/// A hash of this library's source files: equal in two programs built from the same
/// sources, different otherwise (a stale build of one of them).
pub const SOURCE_ID: &str = env!("ADVM_SOURCE_ID");

/// Addresses and page ranges; moved to [`mem`] (the memory vocabulary).
pub mod addr {
    pub use crate::mem::{is_page_aligned, page_align_up, page_size, HostAddr, PageRange};
}
