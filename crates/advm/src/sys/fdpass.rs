//! File descriptors handed to other processes: inherited across exec, or sent over a
//! UNIX socket (`SCM_RIGHTS`).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use super::SysError;

/// A duplicate of `fd` without close-on-exec, so a program started next inherits it.
pub fn dup_inheritable(fd: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    // dup(2) never sets FD_CLOEXEC on the new descriptor.
    rustix::io::dup(fd).map_err(|e| SysError::new("dup", e))
}

/// Most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

/// Sends `bytes` with `fds` attached; all of `bytes` or an error.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), SysError> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(SysError::new("sendmsg(SCM_RIGHTS)", rustix::io::Errno::NOBUFS));
    }
    let sent = sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)
        .map_err(|e| SysError::new("sendmsg", e))?;
    if sent != bytes.len() {
        return Err(SysError::new("sendmsg (short)", rustix::io::Errno::MSGSIZE));
    }
    Ok(())
}

/// Receives one message into `buf` with up to `max_fds` descriptors (close-on-exec);
/// returns the bytes read and the descriptors.
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize) -> Result<(usize, Vec<OwnedFd>), SysError> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|e| SysError::new("recvmsg", e))?;
    if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(SysError::new("recvmsg (descriptors truncated)", rustix::io::Errno::MSGSIZE));
    }
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    Ok((msg.bytes, fds))
}
