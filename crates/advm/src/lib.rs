//! advm: application-directed virtual memory for stock Linux.
//!
//! Programs that know their own memory tell advm, and advm turns that knowledge into
//! page operations. All raw syscalls and `unsafe` live in [`sys`]; capability modules
//! plan in terms of page ranges ([`addr`]) and hand the plan to `sys`; [`stats`]
//! observes from the outside.
#![deny(unsafe_code)]

pub mod addr;
pub mod cow;
pub mod error;
pub mod image;
pub mod ksm;
pub mod probe;
pub mod remap;
pub mod stats;
pub mod sys;

pub use error::{Error, Result};
