//! The benchmarks' one error type.

/// What a benchmark or a demo row can fail with. Messages name what failed, so
/// `advm: <message>` is the whole story.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// From the library.
    #[error(transparent)]
    Advm(#[from] advm::Error),
    /// A system call the library passed through (e.g. a grant's zap).
    #[error(transparent)]
    Sys(#[from] advm::error::SysError),
    /// Starting a program under the preload shim.
    #[error(transparent)]
    Launch(#[from] advm_preload::launch::Error),
    /// A tool, workload or measurement did not do what the benchmark needs, or the
    /// benchmark was asked for something it does not have.
    #[error("{0}")]
    Usage(String),
    /// The measured program was stopped by a signal sent to the benchmark (Ctrl-C,
    /// kill): the whole benchmark stops, after its sessions restored what they changed.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// I/O on something named.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}
