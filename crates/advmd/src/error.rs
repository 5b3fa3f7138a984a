//! The daemon's one error type.

use std::path::{Path, PathBuf};

/// What can stop advmd from serving.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// From the library (a store, the wire).
    #[error(transparent)]
    Advm(#[from] advm::Error),
    /// A file or socket could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another daemon answers on the socket.
    #[error("{}: another advmd is already serving on this socket", .0.display())]
    Busy(PathBuf),
    /// The socket path does not fit a UNIX socket address.
    #[error("{}: {len} bytes long; a UNIX socket path holds at most 107 bytes (name a shorter path with --socket or ADVM_SOCKET)", path.display())]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// A socket is there, and whether a daemon serves on it cannot be told.
    #[error("{}: a socket is there and connecting to it failed ({source}); not replacing it in case a daemon serves there", path.display())]
    Unknown {
        /// The path.
        path: PathBuf,
        /// Why connecting failed.
        #[source]
        source: std::io::Error,
    },
    /// The thread that keeps closed sessions' pages could not be started.
    #[error("starting the thread that keeps closed sessions' pages: {0}")]
    Keeper(#[source] std::io::Error),
    /// Something other than a socket is where the socket should go.
    #[error("{}: is {what}, not a socket; refusing to replace it (name a free path with --socket or ADVM_SOCKET)", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there ("a regular file", "a directory", "a symbolic link", ...).
        what: &'static str,
    },
}

impl DaemonError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), source }
    }
}
