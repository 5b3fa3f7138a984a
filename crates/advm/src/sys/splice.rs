//! Handing pages to another process through a pipe: the sender `vmsplice`s its pages
//! into the pipe (no copy: the pipe refers to the pages), the receiver `splice`s them
//! into a file (the one copy that puts them there). How a merge adds pages to advmd's
//! store without staging them in a file of its own first.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::pipe::{IoSliceRaw, PipeFlags, SpliceFlags};

use super::{Errno, SysError, SysResult};

/// Bytes a pipe is grown to when the system allows it: fewer round trips between the
/// two processes than the default 64 KiB.
const PIPE_BYTES: usize = 1 << 20;

/// A new close-on-exec pipe `(read end, write end)`, grown to 1 MiB when allowed.
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(|e| SysError::new("pipe2", e))?;
    // Best effort: an unprivileged process may be held to a smaller pipe-max-size.
    let _ = rustix::pipe::fcntl_setpipe_size(&w, PIPE_BYTES);
    Ok((r, w))
}

/// Whether `fd` is a pipe (or FIFO).
pub fn is_pipe(fd: BorrowedFd<'_>) -> SysResult<bool> {
    let st = rustix::fs::fstat(fd).map_err(|e| SysError::new("fstat", e))?;
    Ok(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo)
}

/// How a send through [`send_pages`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Every byte is in the pipe or was taken by the reader.
    All,
    /// `stop` became readable first (the reader answered early); this many bytes went.
    Stopped(usize),
}

/// Puts `runs` (slices of this process's memory) into pipes with `vmsplice`: each
/// `(pipe, runs)` of `parts` in order within its pipe, feeding whichever pipe has
/// room, so that one reader per pipe can copy at once. Gives up when `stop` becomes
/// readable (the reader's answer came before it took everything) or nothing moves for
/// `timeout`. The pipes refer to the pages: the caller must not change them until the
/// reader has answered (a merge holds its range write-protected meanwhile).
pub fn send_pages(parts: &[(BorrowedFd<'_>, &[&[u8]])], stop: BorrowedFd<'_>, timeout: Duration) -> SysResult<Sent> {
    // Per part: (run, offset in it).
    let mut at: Vec<(usize, usize)> = vec![(0, 0); parts.len()];
    let mut sent = 0;
    let mut last = Instant::now();
    loop {
        let mut moved = false;
        let mut waiting = Vec::new();
        for (k, &(w, runs)) in parts.iter().enumerate() {
            let (run, done) = &mut at[k];
            while *run < runs.len() && *done == runs[*run].len() {
                (*run, *done) = (*run + 1, 0);
            }
            if *run == runs.len() {
                continue;
            }
            let piece = [IoSliceRaw::from_slice(&runs[*run][*done..])];
            // SAFETY: the slice is readable for the call; the pipe takes references to
            // its pages (never writes them), which keep the pages alive on their own.
            match unsafe { rustix::pipe::vmsplice(w, &piece, SpliceFlags::NONBLOCK) } {
                Ok(n) => {
                    *done += n;
                    sent += n;
                    moved = true;
                }
                Err(Errno::AGAIN) => waiting.push(w),
                Err(e) => return Err(SysError::new("vmsplice", e)),
            }
        }
        if moved {
            last = Instant::now();
            continue;
        }
        if waiting.is_empty() {
            return Ok(Sent::All);
        }
        let mut polled: Vec<(BorrowedFd<'_>, i16)> = waiting.iter().map(|&w| (w, libc::POLLOUT)).collect();
        polled.push((stop, libc::POLLIN));
        let ready = wait(&polled, timeout)?;
        let (answered, room) = (ready[ready.len() - 1], ready[..ready.len() - 1].iter().any(|&r| r));
        if answered {
            return Ok(Sent::Stopped(sent));
        }
        if !room && last.elapsed() >= timeout {
            return Err(SysError::new("vmsplice (the reader took nothing)", Errno::TIMEDOUT));
        }
    }
}

/// Which fds became ready within `timeout`, each polled for its own events
/// (`POLLIN`/`POLLOUT`); an end closed at the other side counts as ready.
fn wait(fds: &[(BorrowedFd<'_>, i16)], timeout: Duration) -> SysResult<Vec<bool>> {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|(fd, events)| libc::pollfd { fd: fd.as_raw_fd(), events: *events, revents: 0 }).collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: live pollfds in our vector for the duration of the call.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = SysError::last("poll");
        return if e.errno == Errno::INTR { Ok(vec![false; fds.len()]) } else { Err(e) };
    }
    Ok(p.iter().map(|x| x.revents != 0).collect())
}

/// Moves exactly `len` bytes from the pipe `r` into `file` at `offset` (or, with no
/// file, reads and drops them). Fails with `ETIMEDOUT` when nothing arrives for
/// `timeout`, and returns how many bytes came when the writer closed the pipe first.
pub fn receive(
    r: BorrowedFd<'_>,
    file: Option<BorrowedFd<'_>>,
    offset: u64,
    len: usize,
    timeout: Duration,
) -> SysResult<usize> {
    let mut got = 0;
    let mut scratch = Vec::new();
    while got < len {
        let res = match file {
            Some(f) => {
                let mut off = offset + got as u64;
                rustix::pipe::splice(r, None, f, Some(&mut off), len - got, SpliceFlags::NONBLOCK | SpliceFlags::MOVE)
                    .map_err(|e| SysError::new("splice", e))
            }
            None => {
                scratch.resize((len - got).min(PIPE_BYTES), 0);
                rustix::io::read(r, &mut scratch).map_err(|e| SysError::new("read(pipe)", e))
            }
        };
        match res {
            Ok(0) => return Ok(got),
            Ok(n) => got += n,
            Err(e) if e.errno == Errno::AGAIN => {
                if !wait(&[(r, libc::POLLIN)], timeout)?[0] {
                    return Err(SysError::new("splice (nothing came)", Errno::TIMEDOUT));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn pages_sent_through_a_pipe_land_in_the_file_at_the_offset() {
        let (r, w) = pipe().unwrap();
        let (stop_r, _stop_w) = pipe().unwrap();
        let f = super::super::memfd::create("splice-test").unwrap();
        let data: Vec<u8> = (0..3 << 20).map(|i| (i * 7 + 1) as u8).collect();
        let writer = {
            let data = data.clone();
            // The buffer goes back with the result: the pipe refers to its pages.
            std::thread::spawn(move || {
                let sent = send_pages(
                    &[(w.as_fd(), &[&data[..1 << 20], &data[1 << 20..]])],
                    stop_r.as_fd(),
                    Duration::from_secs(5),
                );
                (sent, data)
            })
        };
        let got = receive(r.as_fd(), Some(f.as_fd()), 4096, data.len(), Duration::from_secs(5)).unwrap();
        assert_eq!(writer.join().unwrap().0.unwrap(), Sent::All);
        assert_eq!(got, data.len());
        let mut back = vec![0u8; data.len()];
        assert_eq!(super::super::memfd::pread(&f, &mut back, 4096).unwrap(), data.len());
        assert_eq!(back, data);
        assert!(is_pipe(r.as_fd()).unwrap() && !is_pipe(f.as_fd()).unwrap());
    }
}
