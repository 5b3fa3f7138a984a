//! A write fence with a servicing thread, for merging memory the program itself may
//! be using (its heap, its anonymous mmaps) while it runs.
//!
//! [`super::merge::WriteFence`] lets writers wait until the merge ends, which is right
//! for a buffer the caller owns but deadlocks when the merging thread itself writes the
//! fenced range (its own allocations may land in the heap being merged). Here a thread
//! services the fence's faults instead: a write to a fenced page marks the page
//! "written" (never to be merged this time), lifts its protection and wakes the writer
//! at once. mremap and `MADV_DONTNEED` of a fenced page mark it the same way.
//! The mapping step takes a lock that the servicer also takes, and checks the marks
//! under it: a page not marked is still protected and unchanged, so replacing it with
//! an equal store page changes nothing the program can see.
//!
//! Nothing the servicer or the locked step touches may lie in a fenced range, or they
//! would wait on themselves: the lock, the marks and the snapshot of the chunk live in
//! a shared memfd mapping (never a merge candidate), the servicer allocates nothing,
//! and the locked step allocates nothing. The chunk is read with `process_vm_readv`
//! into that snapshot, so a range the program unmaps meanwhile gives an error, not a
//! crash.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::io::Errno;

use super::merge::Marks;
use super::mman::{Backing, Mapping, Prot, Share};
use super::uffd::{feature, mode, Event, Userfaultfd};
use super::{SysError, SysResult};

/// Features: protection of unpopulated and shmem pages (merged ranges map a store
/// memfd), and the events that change a fenced range behind the merge's back. Not
/// unmap events: the mapping step's own `MAP_FIXED` unmaps registered pages, and the
/// kernel would hold it until the servicer, which waits for the step's lock, read the
/// event. A range the program unmaps is caught by the mapping step's check instead.
const FEATURES: u64 =
    feature::WP_UNPOPULATED | feature::WP_HUGETLBFS_SHMEM | feature::EVENT_REMOVE | feature::EVENT_REMAP;

/// Header of the shared scratch mapping (before the marks and the snapshot).
const HEADER: usize = 64;

/// The shared scratch: lock, stop flag, the fenced chunk, marks, snapshot.
#[derive(Debug)]
struct Scratch {
    map: Mapping,
    chunk_pages: usize,
    marks_words: usize,
    snapshot_off: usize,
}

impl Scratch {
    fn new(chunk_bytes: usize) -> SysResult<Self> {
        let ps = super::page_size();
        let chunk_pages = chunk_bytes / ps;
        let marks_words = chunk_pages.div_ceil(64);
        let snapshot_off = (HEADER + marks_words * 8).div_ceil(ps) * ps;
        let len = snapshot_off + chunk_pages * ps;
        let fd = super::memfd::create("advm-merge-scratch")?;
        super::memfd::set_len(&fd, len as u64)?;
        let map =
            Mapping::new(len, Prot::READ | Prot::WRITE, Share::Shared, Backing::File { fd: fd.as_fd(), offset: 0 })?;
        Ok(Self { map, chunk_pages, marks_words, snapshot_off })
    }

    fn word<T>(&self, off: usize) -> &T {
        // SAFETY: `off` is inside the header or the marks, aligned for T (atomics of
        // 4 or 8 bytes at multiples of 8), in a mapping that lives as long as `self`;
        // atomics may alias across threads.
        unsafe { &*((self.map.addr() + off) as *const T) }
    }
    fn lock_word(&self) -> &AtomicU32 {
        self.word(0)
    }
    fn stop(&self) -> &AtomicU32 {
        self.word(8)
    }
    fn base(&self) -> &AtomicUsize {
        self.word(16)
    }
    fn len(&self) -> &AtomicUsize {
        self.word(24)
    }
    fn servicer_stack(&self) -> &AtomicUsize {
        self.word(32)
    }
    fn mark_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.marks_words);
        self.word(HEADER + i * 8)
    }

    /// A spin lock that yields: held for one run's mapping or one event, never long.
    fn lock(&self) {
        while self.lock_word().compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
    }
    fn unlock(&self) {
        self.lock_word().store(0, Ordering::Release);
    }

    /// Marks the pages of the current chunk that overlap `[start, end)` (lock held).
    fn mark(&self, start: usize, end: usize) {
        let (base, len) = (self.base().load(Ordering::Relaxed), self.len().load(Ordering::Relaxed));
        let ps = super::page_size();
        let (s, e) = (start.max(base), end.min(base + len));
        let mut a = s / ps * ps;
        while a < e {
            let i = (a - base) / ps;
            self.mark_word(i / 64).fetch_or(1 << (i % 64), Ordering::Relaxed);
            a += ps;
        }
    }

    fn marked(&self, i: usize) -> bool {
        self.mark_word(i / 64).load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn snapshot(&self) -> &[u8] {
        // SAFETY: inside the mapping; only the owner of the fence writes it, through
        // process_vm_readv under `&mut ServicedFence`, never while this borrow lives.
        unsafe {
            std::slice::from_raw_parts(
                (self.map.addr() + self.snapshot_off) as *const u8,
                self.chunk_pages * super::page_size(),
            )
        }
    }
}

/// `Ok(false)` when part of `[addr, addr+len)` is no longer mapped (the program
/// unmapped it after its maps were read: the kernel refuses to register or protect
/// a range with a hole), else `e`.
fn gone_or(addr: usize, len: usize, e: SysError) -> SysResult<bool> {
    match super::procmap::covers(addr, len) {
        Ok(false) => Ok(false),
        _ => Err(e),
    }
}

/// A fence over one chunk at a time, serviced by its own thread (see the module doc).
#[derive(Debug)]
pub struct ServicedFence {
    uffd: Arc<Userfaultfd>,
    scratch: Arc<Scratch>,
    servicer: Option<std::thread::JoinHandle<()>>,
}

impl ServicedFence {
    /// Whether this kernel can fence this way, as the reason it cannot.
    pub fn available() -> Result<(), String> {
        let info = Userfaultfd::probe().map_err(|e| e.to_string())?;
        if info.user_mode_only() {
            return Err(super::merge::user_mode_only_refused());
        }
        let missing = FEATURES & !info.features;
        if missing != 0 {
            return Err(format!(
                "userfaultfd lacks features {missing:#x} (WP_UNPOPULATED, WP shmem, remove/remap events)"
            ));
        }
        Ok(())
    }

    /// A fence for chunks of up to `chunk_bytes` (whole pages), and its servicer.
    pub fn new(chunk_bytes: usize) -> SysResult<Self> {
        let uffd = Arc::new(Userfaultfd::new(FEATURES, true)?);
        let scratch = Arc::new(Scratch::new(chunk_bytes)?);
        let (u, s) = (uffd.clone(), scratch.clone());
        let servicer = super::signal::spawn_with_sent_signals_blocked(|| {
            std::thread::Builder::new().name("advm-merge-wp".into()).spawn(move || serve(&u, &s))
        })
        .map_err(|e| SysError::from_io("spawning the merge fence's servicer", &e))?;
        while scratch.servicer_stack().load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        Ok(Self { uffd, scratch, servicer: Some(servicer) })
    }

    /// Largest chunk in bytes.
    pub fn chunk_bytes(&self) -> usize {
        self.scratch.chunk_pages * super::page_size()
    }

    /// Addresses the servicer and the locked step use, whose mappings must never be
    /// fenced: the servicer's stack and the scratch (shared, so never a candidate).
    pub fn own_addresses(&self) -> [usize; 2] {
        [self.scratch.servicer_stack().load(Ordering::Acquire), self.scratch.map.addr()]
    }

    /// Protects `[addr, addr+len)` (page aligned, at most [`Self::chunk_bytes`], one
    /// private anonymous or store mapping) and reads it into the snapshot. Returns
    /// true, or false when part of the range is no longer mapped (the fence is
    /// lifted again). [`Self::snapshot`] then holds the bytes.
    ///
    /// # Safety
    /// The range must be this process's memory; the calling thread must not write it
    /// before [`Self::lift`] (its writes would only be serviced, but then not merged).
    pub unsafe fn protect(&mut self, addr: usize, len: usize) -> SysResult<bool> {
        assert!(len <= self.chunk_bytes(), "a chunk fits the snapshot");
        let s = &self.scratch;
        s.lock();
        for i in 0..s.marks_words {
            s.mark_word(i).store(0, Ordering::Relaxed);
        }
        s.base().store(addr, Ordering::Relaxed);
        s.len().store(len, Ordering::Relaxed);
        s.unlock();
        // SAFETY: the caller's memory; faults are serviced by our thread from here on.
        if let Err(e) = unsafe { self.uffd.register(addr as *mut u8, len, mode::WP) } {
            self.lift();
            return gone_or(addr, len, e);
        }
        // SAFETY: registered just above with mode WP on this fd.
        if let Err(e) = unsafe { self.uffd.write_protect(addr as *mut u8, len, true, true) } {
            self.lift();
            return gone_or(addr, len, e);
        }
        let iov_local = libc::iovec { iov_base: (s.map.addr() + s.snapshot_off) as *mut libc::c_void, iov_len: len };
        let iov_remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        // SAFETY: reads this process's memory into the snapshot, which nothing borrows
        // now (`&mut self`); an unmapped source gives EFAULT or a short count.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &iov_local, 1, &iov_remote, 1, 0) };
        if n != len as isize {
            self.lift();
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if n >= 0 || errno == libc::EFAULT || errno == libc::ENOMEM {
                return Ok(false);
            }
            return Err(SysError::new("process_vm_readv", Errno::from_raw_os_error(errno)));
        }
        Ok(true)
    }

    /// The snapshot of the protected chunk.
    pub fn snapshot(&self) -> &[u8] {
        &self.scratch.snapshot()[..self.scratch.len().load(Ordering::Relaxed)]
    }

    /// Maps `pages` pages of `fd` from `offset` over the chunk's pages from `first`,
    /// private (copy-on-write), except pages written, remapped or zapped since
    /// [`Self::protect`]; each stretch of the others is mapped when the mapping there
    /// is still `check`ed good (still mapped, as it was). The caller compared the
    /// snapshot with the file's bytes. Sets `mapped[j]` for each page `first + j` mapped.
    /// The new mappings get `marks` (the replaced mapping's) as [`Marks::for_file`]
    /// keeps them (a locked range's pages are mapped and locked again).
    #[allow(clippy::too_many_arguments)]
    pub fn map_unwritten(
        &mut self,
        first: usize,
        pages: usize,
        writable: bool,
        fd: BorrowedFd<'_>,
        offset: u64,
        marks: Marks,
        check: &dyn Fn(usize, usize) -> bool,
        mapped: &mut [bool],
    ) -> SysResult<()> {
        let ps = super::page_size();
        // The file holds the pages' bytes there (the caller compared), so the program
        // reads the same content through the new mapping.
        let backing = |j: usize| Backing::File { fd, offset: offset + (j * ps) as u64 };
        self.replace_unwritten(first, pages, writable, &backing, marks.for_file(), check, mapped)
    }

    /// Gives back the chunk's pages from `first` on, which the snapshot holds as all
    /// zeros, except pages written, remapped or zapped since [`Self::protect`]: each
    /// stretch of the others that is still `check`ed good becomes a fresh private
    /// anonymous mapping (marked as `marks` says, like the mapping it replaces), so
    /// it reads as zeros as before and holds no memory until written. Not for a locked
    /// range (`marks.locked`), whose pages the program asked to stay resident. Sets `dropped[j]`
    /// for each page `first + j` given back.
    ///
    /// Not `MADV_DONTNEED`: on a registered range it raises a remove event that the
    /// servicer must read before the call returns, and the servicer may be waiting for
    /// the lock held here. Replacing the mapping raises no event this fence asks for.
    pub fn drop_unwritten_zeros(
        &mut self,
        first: usize,
        pages: usize,
        writable: bool,
        marks: Marks,
        check: &dyn Fn(usize, usize) -> bool,
        dropped: &mut [bool],
    ) -> SysResult<()> {
        // The pages read as zeros, and so does fresh anonymous memory.
        let backing = |_: usize| Backing::Anonymous;
        self.replace_unwritten(first, pages, writable, &backing, marks, check, dropped)
    }

    /// Replaces each stretch of unmarked pages from `first` (page `first + j` from
    /// `backing(j)`) whose mapping is still `check`ed good, under the lock. The
    /// callers say why the new backing reads as the snapshot does.
    #[allow(clippy::too_many_arguments)]
    fn replace_unwritten<'fd>(
        &mut self,
        first: usize,
        pages: usize,
        writable: bool,
        backing: &dyn Fn(usize) -> Backing<'fd>,
        marks: Marks,
        check: &dyn Fn(usize, usize) -> bool,
        replaced: &mut [bool],
    ) -> SysResult<()> {
        assert_eq!(replaced.len(), pages, "one flag per page");
        let ps = super::page_size();
        let s = &self.scratch;
        let base = s.base().load(Ordering::Relaxed);
        let prot = if writable { Prot::READ | Prot::WRITE } else { Prot::READ };
        // Nothing below allocates or writes the chunk: the servicer needs the lock too.
        s.lock();
        let mut r = Ok(());
        let mut j = 0;
        while j < pages && r.is_ok() {
            if s.marked(first + j) {
                j += 1;
                continue;
            }
            let mut k = 1;
            while j + k < pages && !s.marked(first + j + k) {
                k += 1;
            }
            let addr = base + (first + j) * ps;
            if check(addr, k * ps) {
                // SAFETY: the pages are this process's (protect's contract), still
                // protected and unchanged (not marked, under the lock that marking
                // takes), and the new backing reads as the snapshot (the callers): the
                // program reads the same content through the new mapping, and its
                // writes wait for the lock.
                r = unsafe { super::mman::map_fixed(addr as *mut u8, k * ps, prot, Share::Private, backing(j)) };
                if r.is_ok() {
                    replaced[j..j + k].fill(true);
                    // Flags and residency only: no content change, no userfaultfd
                    // event (the new mapping is not registered), nothing allocated.
                    r = marks.apply(addr, k * ps);
                }
            }
            j += k;
        }
        s.unlock();
        r
    }

    /// Lifts the protection of the current chunk and wakes its waiters.
    pub fn lift(&mut self) {
        let s = &self.scratch;
        let (addr, len) = (s.base().load(Ordering::Relaxed), s.len().load(Ordering::Relaxed));
        let _ = self.uffd.unregister(addr as *mut u8, len);
        let _ = self.uffd.wake(addr as *mut u8, len);
        s.lock();
        s.len().store(0, Ordering::Relaxed);
        s.unlock();
    }
}

impl Drop for ServicedFence {
    fn drop(&mut self) {
        self.lift();
        self.scratch.stop().store(1, Ordering::Release);
        if let Some(t) = self.servicer.take() {
            let _ = t.join();
        }
    }
}

/// The servicer: marks, unprotects and wakes. Allocates nothing and writes only its
/// stack and the scratch.
fn serve(uffd: &Userfaultfd, s: &Scratch) {
    let here = 0u8;
    s.servicer_stack().store(&here as *const u8 as usize, Ordering::Release);
    let ps = super::page_size();
    while s.stop().load(Ordering::Acquire) == 0 {
        let mut pfd =
            libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&uffd.as_fd()), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd on our stack; poll writes only its revents.
        let _ = unsafe { libc::poll(&mut pfd, 1, 50) };
        while let Ok(Some(ev)) = uffd.read_event() {
            s.lock();
            match ev {
                Event::Pagefault { address, .. } => {
                    let a = address as usize / ps * ps;
                    s.mark(a, a + ps);
                    // SAFETY: the page lies in a range this fd registered for WP (or no
                    // longer, and the ioctl fails harmlessly); lifting protection only
                    // lets the waiting writer proceed.
                    let _ = unsafe { uffd.write_protect(a as *mut u8, ps, false, true) };
                    let _ = uffd.wake(a as *mut u8, ps);
                }
                Event::Remove { start, end } => s.mark(start as usize, end as usize),
                Event::Remap { from, len, .. } => s.mark(from as usize, (from + len) as usize),
                _ => {}
            }
            s.unlock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Marks, ServicedFence};

    /// The merge agent reads the process's maps, then fences chunk by chunk: a chunk
    /// the program unmapped in between (wholly or in part) is skipped, and the agent
    /// goes on with the next one instead of abandoning the whole merge.
    #[test]
    fn a_chunk_unmapped_after_the_maps_were_read_is_skipped_not_an_error() {
        if let Err(why) = ServicedFence::available() {
            eprintln!("skipped: {why}");
            return;
        }
        let ps = super::super::page_size();
        let mut fence = ServicedFence::new(16 * ps).unwrap();
        let anon = |len: usize| {
            // SAFETY: a fresh private anonymous mapping, unmapped below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the mapping just made, `len` bytes.
            unsafe { std::ptr::write_bytes(p as *mut u8, 7, len) };
            p as usize
        };
        let unmap = |a: usize, len: usize| {
            // SAFETY: pages of a mapping this test made and no longer uses.
            assert_eq!(unsafe { libc::munmap(a as *mut libc::c_void, len) }, 0);
        };

        // Control: a whole mapping is protected and read.
        let a = anon(8 * ps);
        // SAFETY: this test's own mapping; this thread does not write it while fenced.
        assert!(unsafe { fence.protect(a, 8 * ps) }.unwrap());
        assert!(fence.snapshot().iter().all(|&b| b == 7));
        fence.lift();

        // A hole in the middle, then the tail gone, then all of it gone.
        unmap(a + 3 * ps, 2 * ps);
        // SAFETY: as above; the unmapped pages are what the test is about.
        assert!(!unsafe { fence.protect(a, 8 * ps) }.unwrap(), "a chunk with a hole");
        unmap(a + 5 * ps, 3 * ps);
        // SAFETY: as above.
        assert!(!unsafe { fence.protect(a, 8 * ps) }.unwrap(), "a chunk whose tail is gone");
        unmap(a, 3 * ps);
        // SAFETY: as above.
        assert!(!unsafe { fence.protect(a, 8 * ps) }.unwrap(), "a chunk wholly gone");

        // The fence still works afterwards.
        let b = anon(4 * ps);
        // SAFETY: this test's own mapping.
        assert!(unsafe { fence.protect(b, 4 * ps) }.unwrap());
        fence.lift();
        unmap(b, 4 * ps);
    }

    #[test]
    fn a_store_mapping_keeps_the_programs_dont_fork_dont_dump_and_lock_only() {
        let a = Marks::from_vm_flags("rd wr mr mw me ac dc dd hg mg");
        assert_eq!(a.for_file(), Marks { dont_fork: true, dont_dump: true, ..Marks::default() });
        let l = Marks::from_vm_flags("rd wr mr mw me lo ac wf nh");
        assert_eq!((l.wipe_on_fork, l.no_hugepage), (true, true));
        assert_eq!(l.for_file(), Marks { locked: true, ..Marks::default() });
        assert_eq!(Marks::from_vm_flags("rd wr hg").for_file(), Marks::default());
    }
}
