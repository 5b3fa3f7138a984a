//! The crate's one error type.

use std::path::PathBuf;

pub use crate::sys::{Errno, SysError};

/// Everything advm can fail with. Messages chain their cause so one line tells the
/// whole story.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The process does not exist (or was never visible to us).
    #[error("process {pid} does not exist")]
    NoSuchProcess {
        /// The pid asked for.
        pid: i32,
    },
    /// The process is a kernel thread: it has no user address space (an empty
    /// /proc/PID/maps and no pagemap), so there is nothing of its to measure.
    #[error("process {pid} is a kernel thread: it has no user memory to measure")]
    KernelThread {
        /// The pid.
        pid: i32,
    },
    /// The process has exited and its parent has not reaped it yet: its memory is gone.
    #[error("process {pid} has exited and is not yet reaped by its parent (a zombie): it has no memory to measure")]
    Zombie {
        /// The pid.
        pid: i32,
    },
    /// The process went away while it was being measured.
    #[error("process {pid} exited during measurement")]
    ProcessExited {
        /// The pid.
        pid: i32,
    },
    /// We may not look at the process.
    #[error(
        "process {pid}: permission denied reading {what} (it takes ptrace read access: the process's owner, or root in \
         the process's user namespace; Yama's kernel.yama.ptrace_scope may forbid it even then)"
    )]
    PermissionDenied {
        /// The pid.
        pid: i32,
        /// The file refused.
        what: String,
    },
    /// The operation needs a privilege this process lacks (changing KSM's settings,
    /// enabling swap): the message names it, so that a user sees what to ask for
    /// rather than a bare EPERM or EACCES.
    #[error("{what} needs {needs} (running as uid {uid})")]
    NeedsPrivilege {
        /// What was attempted.
        what: &'static str,
        /// The privilege: root, a capability, a sysctl or a file's permission.
        needs: &'static str,
        /// The effective uid that lacked it.
        uid: u32,
    },
    /// An argument is out of its domain.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it is refused, naming the limit.
        why: String,
    },
    /// A request needs more memory or address space than is left.
    #[error("out of memory: {what}: {why}")]
    OutOfMemory {
        /// What was asked for.
        what: &'static str,
        /// The size and the limit it exceeds.
        why: String,
    },
    /// An earlier call panicked part way through changing this object's state, which
    /// may therefore be inconsistent: it refuses all further work.
    #[error("{what} is unusable: {why}")]
    Unrecoverable {
        /// The object.
        what: &'static str,
        /// What happened to it.
        why: String,
    },
    /// The kernel lacks something this operation needs.
    #[error("{what} is not available on this kernel: {why}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// What the probe saw.
        why: String,
    },
    /// advmd answered a request with an error: the request was malformed or out of
    /// bounds, or a limit of the daemon's was reached (its clients per uid, say); the
    /// text is the daemon's.
    #[error("advmd refused the request: {why}")]
    DaemonRefused {
        /// The daemon's reason.
        why: String,
    },
    /// The daemon a client was connected to went away (stopped or restarted): the
    /// connection cannot be used again.
    #[error(
        "advmd at {socket} closed the connection ({why}): it stopped or restarted; what was merged before keeps \
         its contents; connect a new client to go on"
    )]
    Disconnected {
        /// The daemon's socket.
        socket: String,
        /// How the loss showed.
        why: String,
    },
    /// A disk image (or one layer of its chain) is malformed or unsupported.
    #[error("{}: {why}", path.display())]
    Image {
        /// The image or layer file.
        path: PathBuf,
        /// What is wrong, naming the field and the limit.
        why: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this error says the peer of a connection went away: a send that found
    /// it closed (EPIPE, ECONNRESET) or a reply cut off by its end.
    pub(crate) fn is_disconnect(&self) -> bool {
        match self {
            Error::Sys(s) => matches!(s.raw_errno(), libc::EPIPE | libc::ECONNRESET),
            Error::Disconnected { .. } => true,
            _ => false,
        }
    }

    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
