//! The heap's error type.

/// What a heap operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A full collection could not make room for an allocation.
    #[error(
        "heap exhausted: {requested} bytes asked for, {live} bytes live after a full collection of a {heap}-byte heap"
    )]
    HeapExhausted {
        /// Bytes the allocation needs (header and padding included).
        requested: usize,
        /// Bytes live after the collection.
        live: usize,
        /// The heap's size limit.
        heap: usize,
    },
    /// An object larger than the whole heap (header included), or whose size
    /// overflows: refused without a collection.
    #[error("object too large: {nptrs} pointers and {nbytes} bytes do not fit in a {heap}-byte heap")]
    ObjectTooLarge {
        /// Pointer slots asked for.
        nptrs: usize,
        /// Raw bytes asked for.
        nbytes: usize,
        /// The heap's size limit.
        heap: usize,
    },
    /// An argument is out of its domain.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why, naming the limit.
        why: String,
    },
    /// An engine name other than `remap` or `memmove`.
    #[error("unknown engine {0:?}: expected \"remap\" or \"memmove\"")]
    UnknownEngine(String),
    /// The heap verifier found a broken invariant (a bug, or a mutator that stored a
    /// pointer that is not an object of this heap).
    #[error("heap verification failed: {0}")]
    Corrupt(String),
    /// A root holds something that is not an object of this heap: the collection was
    /// refused before anything moved.
    #[error("bad root: {0}")]
    BadRoot(String),
    /// The memory under the heap (address space, mappings, page moves).
    #[error("heap memory: {0}")]
    Memory(#[from] advm::Error),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
