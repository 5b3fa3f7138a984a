//! File descriptors handed to other processes: inherited across exec, or sent over a
//! UNIX socket (`SCM_RIGHTS`) whose peer the kernel names (`SO_PEERCRED`,
//! `SO_PEERPIDFD`).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

use super::{SysError, SysResult};

/// Shuts a listening socket for reading: a thread blocked in `accept` on it (or on a
/// descriptor of the same open file) returns at once with EINVAL, whether or not its
/// path still names it.
pub fn shutdown_listener(fd: BorrowedFd<'_>) -> SysResult<()> {
    rustix::net::shutdown(fd, rustix::net::Shutdown::Read).map_err(|e| SysError::new("shutdown(SHUT_RD)", e))
}

/// A duplicate of `fd` without close-on-exec, so a program started next inherits it.
pub fn dup_inheritable(fd: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    // dup(2) never sets FD_CLOEXEC on the new descriptor.
    rustix::io::dup(fd).map_err(|e| SysError::new("dup", e))
}

/// The uid, gid and pid of the process at the other end of a UNIX socket, as the
/// kernel recorded them at connect time (`SO_PEERCRED`). The pid is 0 when the peer's
/// process is in a pid namespace this process cannot see (a daemon in a container
/// without the host's pids). Not rustix's `socket_peercred`: its pid type cannot be 0,
/// and such a peer's connection was refused.
pub fn peer_credentials(sock: &UnixStream) -> SysResult<(u32, u32, i32)> {
    use std::os::fd::AsRawFd;
    let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one ucred) to `c` and the length to
    // `len`, both alive for the call; the socket is borrowed for it.
    let r = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut c).cast(), &mut len)
    };
    if r != 0 {
        return Err(SysError::last("getsockopt(SO_PEERCRED)"));
    }
    Ok((c.uid, c.gid, c.pid))
}

/// `SO_PEERPIDFD` (Linux 6.5; the libc crate does not export it): 77, but 0x56 on SPARC.
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_PEERPIDFD: libc::c_int = 77;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_PEERPIDFD: libc::c_int = 0x56;

/// A pidfd of the process at the other end of a UNIX socket, the one the kernel
/// recorded at connect time (`SO_PEERPIDFD`, Linux 6.5): unlike `SO_PEERCRED`'s pid, it
/// cannot name a later process that got the same pid. Since Linux 6.16 the kernel gives
/// one for a peer already reaped too (it reads as exited); before, that fails with
/// EINVAL (ESRCH on some versions). ENOPROTOOPT: the kernel predates it.
pub fn peer_pidfd(sock: &UnixStream) -> SysResult<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one int) to `fd` and the length
    // to `len`, both alive for the call; the socket is borrowed for it.
    let r =
        unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, SO_PEERPIDFD, (&raw mut fd).cast(), &mut len) };
    if r != 0 {
        return Err(SysError::last("getsockopt(SO_PEERPIDFD)"));
    }
    // SAFETY: on success the kernel installed a new descriptor (close-on-exec, as
    // every pidfd) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends all of `data` with `fds` attached to its first byte (`SCM_RIGHTS`).
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> SysResult<()> {
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(SysError::new("sendmsg(SCM_RIGHTS)", Errno::NOBUFS));
    }
    let mut sent = 0;
    while sent < data.len() {
        let iov = [std::io::IoSlice::new(&data[sent..])];
        let n = if sent == 0 {
            rustix::net::sendmsg(sock, &iov, &mut anc, SendFlags::NOSIGNAL)
        } else {
            rustix::net::sendmsg(sock, &iov, &mut SendAncillaryBuffer::default(), SendFlags::NOSIGNAL)
        };
        match n {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(SysError::new("sendmsg", e)),
        }
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any fds that came with them (at most
/// `max_fds` kept; extra ones are closed). Returns bytes read (0 at end of stream).
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], max_fds: usize, fds: &mut Vec<OwnedFd>) -> SysResult<usize> {
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let r = loop {
        match rustix::net::recvmsg(sock, &mut iov, &mut anc, RecvFlags::CMSG_CLOEXEC) {
            Err(Errno::INTR) => continue,
            r => break r,
        }
    };
    // Errno AGAIN/WOULDBLOCK is what a socket read timeout gives.
    let msg = r.map_err(|e| SysError::new("recvmsg", e))?;
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            for fd in rights {
                if fds.len() < max_fds {
                    fds.push(fd);
                }
            }
        }
    }
    Ok(msg.bytes)
}
