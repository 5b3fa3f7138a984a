//! Frames between advm clients and `advmd` over a UNIX stream socket, with fds passed
//! alongside (`SCM_RIGHTS`) and the peer's credentials read from the kernel
//! (`SO_PEERCRED`), its process watched through a pidfd the kernel hands out
//! (`SO_PEERPIDFD`).
//!
//! A frame is `len: u32 LE` (of what follows), `service: u8`, `kind: u8`, then `len - 2`
//! body bytes; fds ride on the frame's first bytes. Each service (merge today, image
//! mapping next) defines its kinds and bodies in its own module and reads them with
//! [`Reader`], so a malformed body is an error naming the field, never a panic.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::sys::fdpass as sys;
use crate::{Error, Result};

/// Where `advmd` listens unless `$ADVM_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/advm/advmd.sock";

/// Where clients look for `advmd`: `$ADVM_SOCKET`, else [`DEFAULT_SOCKET`]. An empty
/// `ADVM_SOCKET` counts as unset, as with `PATH`-like variables (it named the path "",
/// which no connect accepts: "Invalid argument").
pub fn socket_path() -> std::path::PathBuf {
    socket_path_from(std::env::var_os("ADVM_SOCKET"))
}

fn socket_path_from(var: Option<std::ffi::OsString>) -> std::path::PathBuf {
    var.filter(|v| !v.is_empty()).map(Into::into).unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// Ends the `accept` a thread is blocked in on `listener` (or on a clone of it): it
/// fails with EINVAL, and so does every later one. A daemon stopping cannot always
/// wake its accept by connecting: its socket's path may be gone (removed by hand, or
/// by whoever started it).
pub fn stop_accepting(listener: &std::os::unix::net::UnixListener) -> Result<()> {
    Ok(sys::shutdown_listener(listener.as_fd())?)
}

/// Largest frame either side accepts (16 MiB: two million page hashes).
pub const MAX_FRAME: usize = 16 << 20;
/// Most fds one frame may carry; more are closed on receipt.
pub const MAX_FDS: usize = 64;

/// One message.
#[derive(Debug, Default)]
pub struct Frame {
    /// Which service it is for.
    pub service: u8,
    /// Which message of that service.
    pub kind: u8,
    /// The message's fields.
    pub body: Vec<u8>,
    /// Files passed with it.
    pub fds: Vec<OwnedFd>,
}

/// The process at the other end of a connection, as the kernel saw it connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Peer {
    /// Its uid: the default security domain.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its pid.
    pub pid: i32,
}

/// A connected stream socket speaking frames.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
    /// How long the rest of a frame may take once its first byte arrived.
    frame_timeout: Option<Duration>,
    /// When it was accepted, in clock ticks since boot ([`Channel::from_stream`]): the
    /// peer started by then ([`Channel::watch_peer`] on a kernel without `SO_PEERPIDFD`).
    accepted_ticks: Option<u64>,
}

/// The socket, to wait on it (a merge sending pages stops when the reply comes).
impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

fn wire_err(what: &'static str, why: impl Into<String>) -> Error {
    Error::InvalidArgument { what, why: why.into() }
}

/// A failed connect, with what it means for a client of advmd and what to do.
fn connect_error(path: &Path, e: std::io::Error) -> std::io::Error {
    use std::io::ErrorKind as K;
    use std::os::unix::fs::FileTypeExt;
    let hint = match e.kind() {
        K::NotFound => {
            "no advmd serves there (start one with `advm daemon --socket PATH`, or set ADVM_SOCKET to its socket)"
        }
        // connect says "refused" for a directory or a regular file too
        K::ConnectionRefused => match std::fs::metadata(path).map(|m| m.file_type()) {
            Ok(t) if !t.is_socket() => {
                let what = if t.is_dir() {
                    "a directory"
                } else if t.is_file() {
                    "a regular file"
                } else {
                    "a special file"
                };
                let hint = format!("{what} is there, not a socket (ADVM_SOCKET or --socket must name advmd's socket)");
                return std::io::Error::new(e.kind(), format!("{e}: {hint}"));
            }
            _ => "a socket is there but no advmd answers (one that died left it; start a new one)",
        },
        K::PermissionDenied => {
            "this user may not connect: advmd makes its socket mode 0666, so a directory above it (or a changed \
             mode) shuts this user out"
        }
        _ => return e,
    };
    std::io::Error::new(e.kind(), format!("{e}: {hint}"))
}

impl Channel {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Self> {
        let sock = UnixStream::connect(path).map_err(|e| Error::io(path, connect_error(path, e)))?;
        Ok(Self { sock, frame_timeout: None, accepted_ticks: None })
    }

    /// Wraps an accepted connection (just accepted: [`Channel::watch_peer`] relies on it
    /// on kernels without `SO_PEERPIDFD`).
    pub fn from_stream(sock: UnixStream) -> Self {
        Self { sock, frame_timeout: None, accepted_ticks: crate::sys::process::boot_ticks().ok() }
    }

    /// Bounds how long a frame may take to arrive once it has begun, and how long a
    /// send may wait: a peer that stalls mid-frame or stops reading is cut off, while
    /// an idle peer (between frames) may wait forever.
    pub fn set_frame_timeout(&mut self, t: Duration) -> Result<()> {
        self.frame_timeout = Some(t);
        self.sock.set_write_timeout(Some(t)).map_err(|e| Error::io("socket", e))
    }

    /// Who is at the other end.
    pub fn peer(&self) -> Result<Peer> {
        let (uid, gid, pid) = sys::peer_credentials(&self.sock)?;
        Ok(Peer { uid, gid, pid })
    }

    /// Watches the process at the other end: the one that connected, never a later
    /// process given its pid. `None` when it has exited already and the kernel has
    /// nothing of it left to watch (it was reaped, on kernels before 6.16).
    ///
    /// The kernel hands out a pidfd of the peer it recorded at connect time
    /// (`SO_PEERPIDFD`, Linux 6.5). Before 6.5 the pid from `SO_PEERCRED` is opened
    /// instead, and a process there that started after the connection was accepted is
    /// known not to be the peer (`None`); a pid reused between the peer's connect and
    /// the accept is not told apart there.
    pub fn watch_peer(&self) -> Result<Option<crate::process::ProcessWatch>> {
        use crate::process::ProcessWatch;
        use crate::sys::Errno;
        match sys::peer_pidfd(&self.sock) {
            Ok(fd) => return Ok(Some(ProcessWatch::from_pidfd(fd))),
            // reaped before this call (6.5 to 6.15)
            Err(e) if matches!(e.errno, Errno::INVAL | Errno::SRCH) => return Ok(None),
            Err(e) if e.errno == Errno::NOPROTOOPT => {}
            Err(e) => return Err(e.into()),
        }
        let (_, _, pid) = sys::peer_credentials(&self.sock)?;
        match self.accepted_ticks {
            Some(by) if pid > 0 => ProcessWatch::open_started_by(pid, by),
            _ => Err(wire_err("peer", format!("its process (pid {pid}) cannot be told apart from a later one"))),
        }
    }

    /// Sends one frame.
    pub fn send(&self, service: u8, kind: u8, body: &[u8], fds: &[&dyn AsFd]) -> Result<()> {
        let len = body.len() + 2;
        if len > MAX_FRAME {
            return Err(wire_err("frame", format!("{len} bytes exceeds the {MAX_FRAME}-byte limit")));
        }
        let mut out = Vec::with_capacity(4 + len);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.push(service);
        out.push(kind);
        out.extend_from_slice(body);
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        Ok(sys::send_with_fds(&self.sock, &out, &borrowed)?)
    }

    /// Receives one frame; `Ok(None)` when the peer closed the connection between
    /// frames. A frame cut short, or longer than [`MAX_FRAME`], is an error.
    pub fn recv(&self) -> Result<Option<Frame>> {
        let mut fds = Vec::new();
        let mut head = [0u8; 1];
        self.read_timeout(None)?;
        if !self.fill(&mut head, &mut fds, true)? {
            return Ok(None);
        }
        let mut rest = [0u8; 3];
        self.read_timeout(self.frame_timeout)?;
        self.fill(&mut rest, &mut fds, false)?;
        let head = [head[0], rest[0], rest[1], rest[2]];
        let len = u32::from_le_bytes(head) as usize;
        if !(2..=MAX_FRAME).contains(&len) {
            return Err(wire_err("frame", format!("length {len} is outside 2..={MAX_FRAME}")));
        }
        let mut body = vec![0u8; len];
        self.fill(&mut body, &mut fds, false)?;
        let (service, kind) = (body[0], body[1]);
        body.drain(..2);
        Ok(Some(Frame { service, kind, body, fds }))
    }

    fn read_timeout(&self, t: Option<Duration>) -> Result<()> {
        if self.frame_timeout.is_some() {
            self.sock.set_read_timeout(t).map_err(|e| Error::io("socket", e))?;
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes; false at a clean end of stream before any.
    fn fill(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>, eof_ok: bool) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            let n = sys::recv_with_fds(&self.sock, &mut buf[got..], MAX_FDS - fds.len().min(MAX_FDS), fds)
                .map_err(|e| wire_err("frame", format!("reading: {e}")))?;
            if n == 0 {
                if got == 0 && eof_ok {
                    return Ok(false);
                }
                return Err(wire_err("frame", format!("connection closed after {got} of {} bytes", buf.len())));
            }
            got += n;
        }
        Ok(true)
    }

    /// Sends raw bytes (for tests of hostile clients).
    pub fn send_raw(&self, bytes: &[u8]) -> Result<()> {
        (&self.sock).write_all(bytes).map_err(|e| Error::io("socket", e))
    }
}

/// Reads the fields of a frame body in order; every read checks what is left.
#[derive(Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `body`.
    pub fn new(body: &'a [u8]) -> Self {
        Self { rest: body }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(wire_err(what, format!("needs {n} bytes, the message has {} left", self.rest.len())));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }

    /// A `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    /// A `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// `u32` length, then that many bytes (at most `max`).
    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8]> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(wire_err(what, format!("{n} bytes exceeds the limit of {max}")));
        }
        self.take(n, what)
    }

    /// `u32` count, then that many `u64`s (at most `max`).
    pub fn u64s(&mut self, what: &'static str, max: usize) -> Result<Vec<u64>> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(wire_err(what, format!("{n} entries exceeds the limit of {max}")));
        }
        let raw = self.take(n * 8, what)?;
        Ok(raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// `u32` count, then that many `u32`s (at most `max`).
    pub fn u32s(&mut self, what: &'static str, max: usize) -> Result<Vec<u32>> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(wire_err(what, format!("{n} entries exceeds the limit of {max}")));
        }
        let raw = self.take(n * 4, what)?;
        Ok(raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }

    /// Fails unless every byte was read.
    pub fn finish(self, what: &'static str) -> Result<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(wire_err(what, format!("{} unexpected trailing bytes", self.rest.len())))
        }
    }
}

/// Builds a frame body field by field, in the order a [`Reader`] reads it.
#[derive(Debug, Default)]
pub struct Writer {
    /// The body so far.
    pub body: Vec<u8>,
}

impl Writer {
    /// A `u32`.
    pub fn u32(mut self, v: u32) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(mut self, v: u64) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Length-prefixed bytes.
    pub fn bytes(self, b: &[u8]) -> Self {
        let mut s = self.u32(b.len() as u32);
        s.body.extend_from_slice(b);
        s
    }
    /// Count-prefixed `u64`s.
    pub fn u64s(self, v: &[u64]) -> Self {
        let mut s = self.u32(v.len() as u32);
        for x in v {
            s.body.extend_from_slice(&x.to_le_bytes());
        }
        s
    }
    /// Count-prefixed `u32`s.
    pub fn u32s(self, v: &[u32]) -> Self {
        let mut s = self.u32(v.len() as u32);
        for x in v {
            s.body.extend_from_slice(&x.to_le_bytes());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{ProcessWatch, ScratchDir};
    use crate::sys::process::{fork_run, wait_child};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::time::Duration;

    #[test]
    fn an_empty_advm_socket_counts_as_unset() {
        assert_eq!(socket_path_from(Some("".into())), Path::new(DEFAULT_SOCKET));
        assert_eq!(socket_path_from(None), Path::new(DEFAULT_SOCKET));
        assert_eq!(socket_path_from(Some("/tmp/s".into())), Path::new("/tmp/s"));
    }

    /// connect to a directory or a file fails with ECONNREFUSED, which read as a dead
    /// daemon's socket.
    #[test]
    fn a_path_that_is_no_socket_is_named_as_such() {
        let dir = std::env::temp_dir();
        let err = Channel::connect(&dir).expect_err("a directory").to_string();
        assert!(
            err.ends_with("a directory is there, not a socket (ADVM_SOCKET or --socket must name advmd's socket)"),
            "{err}"
        );
    }

    /// A process given pid `pid`, asleep until killed: `ns_last_pid` set just below it,
    /// then a fork (another process may fork in between: a few tries). `None` where the
    /// pid cannot be chosen (not root in the pid namespace's owner).
    fn take_pid(pid: i32) -> Option<i32> {
        for _ in 0..50 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
            let got = fork_run(|| {
                std::thread::sleep(Duration::from_secs(60));
                0
            })
            .ok()?;
            if got == pid {
                return Some(got);
            }
            let _ = crate::sys::sigsend::send(got, libc::SIGKILL);
            let _ = wait_child(got);
        }
        None
    }

    /// A client that connects and exits before it is accepted, and a pid the kernel
    /// gave to another process since: the watch is of the client, which has exited,
    /// never of the process now holding its pid (what opening `SO_PEERCRED`'s pid
    /// watched: a daemon kept a dead client's pages while that process lived).
    #[test]
    fn a_peer_that_exited_before_it_was_watched_is_never_the_process_given_its_pid() {
        let dir = ScratchDir::new("advm-wire-peer").unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let client = fork_run(|| UnixStream::connect(&path).map_or(1, |_| 0)).unwrap();
        assert_eq!(wait_child(client).unwrap(), 0, "the client could not connect");
        let gone = Channel::from_stream(listener.accept().unwrap().0);
        // A process that starts now starts after the accept, clock ticks apart.
        std::thread::sleep(Duration::from_millis(30));
        let reused = take_pid(client);
        let watch = gone.watch_peer().unwrap();
        assert!(watch.map_or(true, |w| w.has_exited().unwrap()), "a client that exited is watched as living");
        match reused {
            Some(p) => {
                let by_pid = ProcessWatch::open(p).unwrap();
                assert!(!by_pid.has_exited().unwrap(), "the pid names a living process");
                // Without SO_PEERPIDFD: the pid's process started after the accept.
                let by = gone.accepted_ticks.unwrap();
                assert!(
                    ProcessWatch::open_started_by(p, by).unwrap().is_none(),
                    "the later process taken for the peer"
                );
                crate::sys::sigsend::send(p, libc::SIGKILL).unwrap();
                wait_child(p).unwrap();
            }
            None => eprintln!("pid reuse not tried: /proc/sys/kernel/ns_last_pid is not writable here"),
        }
        // A peer that lives is watched as living, either way.
        let _me = UnixStream::connect(&path).unwrap();
        let live = Channel::from_stream(listener.accept().unwrap().0);
        assert!(!live.watch_peer().unwrap().unwrap().has_exited().unwrap());
        let me = std::process::id() as i32;
        let by = live.accepted_ticks.unwrap();
        assert!(!ProcessWatch::open_started_by(me, by).unwrap().unwrap().has_exited().unwrap());
    }
}
