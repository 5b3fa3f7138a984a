//! The kernel calls behind page merging: a write fence over a range (userfaultfd
//! write protection), reading the fenced pages, mapping store pages copy-on-write over
//! them, and store files that clients can only read.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::mman::{self, Backing, Mapping, Prot, Share};
use super::uffd::{feature, mode, Userfaultfd};
use super::{SysError, SysResult};

/// Write protection of `[addr, addr+len)` through a private userfaultfd: while it
/// lives, a thread that writes the range waits in the kernel; when it is dropped the
/// range is unregistered and every waiter is woken, and the write is retried against
/// whatever is mapped then. Nobody reads the fd's events: waiting is the point.
#[derive(Debug)]
pub struct WriteFence {
    uffd: Userfaultfd,
    addr: usize,
    len: usize,
}

/// Features a fence needs: unpopulated pages and shmem (an already merged range maps
/// a store memfd) can be write-protected too.
const FENCE_FEATURES: u64 = feature::WP_UNPOPULATED | feature::WP_HUGETLBFS_SHMEM;

/// Why a fence is refused where the userfaultfd is user-mode only.
pub(crate) fn user_mode_only_refused() -> String {
    format!(
        "userfaultfd is user-mode only here: another thread's system call (read(2) into the range, recv, \
         getrandom) would fail with EFAULT at the fence instead of waiting; needs {}",
        super::uffd::FULL_NEEDS
    )
}

impl WriteFence {
    /// Whether this kernel can fence (uffd-wp on anonymous and shmem memory, including
    /// unpopulated pages), as the reason it cannot.
    pub fn available() -> Result<(), String> {
        let info = Userfaultfd::probe().map_err(|e| e.to_string())?;
        if info.user_mode_only() {
            return Err(user_mode_only_refused());
        }
        let missing = FENCE_FEATURES & !info.features;
        if missing != 0 {
            return Err(format!("userfaultfd lacks features {missing:#x} (WP_UNPOPULATED, WP_HUGETLBFS_SHMEM)"));
        }
        Ok(())
    }

    /// Registers the range for write-protect faults and protects it.
    ///
    /// # Safety
    /// The range must be the caller's memory, mapped (anonymous or shmem), and must stay
    /// mapped until the fence is dropped; the calling thread must not write it meanwhile
    /// (it would wait forever).
    pub unsafe fn new(addr: usize, len: usize) -> SysResult<Self> {
        let uffd = Userfaultfd::new(FENCE_FEATURES, true)?;
        // SAFETY: the caller owns the mapped range; faults wait until drop, which wakes them.
        unsafe { uffd.register(addr as *mut u8, len, mode::WP) }?;
        let fence = Self { uffd, addr, len };
        // SAFETY: registered above with mode WP on this fd.
        unsafe { fence.uffd.write_protect(addr as *mut u8, len, true, true) }?;
        Ok(fence)
    }

    /// The fenced bytes: no thread can change them while the fence lives, and the
    /// fence's creator promised they stay mapped.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: readable and mapped by `new`'s contract; writers wait at the fence, and
        // mappings are replaced only through `&mut self` (`map_equal`).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Maps store pages over the fenced pages whose bytes equal them, copy-on-write:
    /// `targets[k]` names the store page proposed for fenced page `first + k`, and
    /// `writable(i)` whether fenced page `i`'s mapping is writable. A [`Target::Candidate`]
    /// is compared in full here; a [`Target::Vouched`] page was compared or copied by
    /// the store itself, so what the process reads never changes either way. Runs
    /// consecutive in both places (and in one file, as `locate` says) are mapped
    /// with one `mmap`. Each `mmap` may add two mappings (VMAs) to the process (it
    /// splits the one it lands in; one when it follows a page mapped just before): it
    /// is made only while `vmas_left` allows that, and takes them from it; pages past
    /// the allowance are left alone. Returns which pages were mapped.
    pub fn map_equal(
        &mut self,
        first: usize,
        targets: &[Option<Target>],
        writable: &dyn Fn(usize) -> bool,
        store: &StoreMap,
        locate: Locate<'_>,
        vmas_left: &mut usize,
    ) -> SysResult<Vec<bool>> {
        let ps = super::page_size();
        let n_pages = targets.len();
        assert!(first + n_pages <= self.len / ps, "targets past the fenced pages");
        let bytes = &self.bytes()[first * ps..(first + n_pages) * ps];
        let store_pages = store.len() / ps;
        // Faulting the store's pages in and comparing them cost about as much as the
        // rest of a merge of stored pages: split over threads when there are CPUs.
        let parts = crate::threads::split(n_pages, 4096);
        let equal: Vec<Option<u32>> = crate::threads::in_threads("advm-merge-compare", &parts, |&(lo, n)| {
            let targets = &targets[lo..lo + n];
            store.populate_slots(targets.iter().map(|t| match t {
                Some(Target::Candidate(s)) => Some(*s),
                _ => None,
            }))?;
            Ok(targets
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    let i = lo + k;
                    match *t {
                        Some(Target::Candidate(s)) => Some(s)
                            .filter(|&s| (s as usize) < store_pages)
                            .filter(|&s| bytes[i * ps..(i + 1) * ps] == *store.read(s as usize * ps, ps)),
                        Some(Target::Vouched(s)) => Some(s).filter(|&s| (s as usize) < store_pages),
                        None => None,
                    }
                })
                .collect::<Vec<_>>())
        })
        .into_iter()
        .collect::<SysResult<Vec<_>>>()?
        .concat();
        let mut mapped = vec![false; n_pages];
        let mut i = 0;
        while i < n_pages {
            let Some(s) = equal[i] else {
                i += 1;
                continue;
            };
            let w = writable(first + i);
            let Some((fd, offset, left)) = locate(s) else {
                i += 1;
                continue;
            };
            let mut n = 1;
            while i + n < n_pages
                && n < left as usize
                && equal[i + n] == Some(s + n as u32)
                && writable(first + i + n) == w
            {
                n += 1;
            }
            // Right after a page mapped here, the mmap only shortens the mapping it
            // lands in: one more VMA; elsewhere it may split it in two.
            let cost = if i > 0 && mapped[i - 1] { 1 } else { 2 };
            if *vmas_left < cost {
                break;
            }
            *vmas_left -= cost;
            // SAFETY: the range is the fence creator's (`new`'s contract), writers wait
            // at the fence, nothing borrows the bytes now (`&mut self`), and the store
            // holds exactly these bytes at this offset (compared above, or by the store,
            // which could rewrite any page it maps here anyway): the process reads the
            // same content through the new mapping.
            unsafe { map_private_over(self.addr + (first + i) * ps, n * ps, w, fd, offset) }?;
            mapped[i..i + n].fill(true);
            i += n;
        }
        Ok(mapped)
    }
}

/// Where store slot `s` can be mapped from: the file, the offset of its page, and how
/// many slots from `s` on follow it in that file (`None`: nowhere).
pub type Locate<'a> = &'a dyn Fn(u32) -> Option<(BorrowedFd<'a>, u64, u32)>;

/// A store page (by index) proposed for a fenced page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Found by hash only: mapped when its bytes compare equal.
    Candidate(u32),
    /// The store compared it in full with this page, or copied it from this page
    /// while it was fenced: mapped without comparing again. The store is trusted as
    /// far as its mapping is (its owner can rewrite any page it maps anyway).
    Vouched(u32),
}

impl Drop for WriteFence {
    fn drop(&mut self) {
        // Unregistering clears the protection of what is still registered; parts that
        // were replaced by store mappings are no longer registered, so their waiters
        // are woken by address, and closing the fd wakes any left.
        let _ = self.uffd.unregister(self.addr as *mut u8, self.len);
        let _ = self.uffd.wake(self.addr as *mut u8, self.len);
    }
}

/// What a program set on a private anonymous mapping with `madvise` or `mlock` (its
/// `VmFlags` in /proc/PID/smaps: `wf`, `dc`, `dd`, `lo`, `hg`, `nh`, `mg`), which the
/// mappings a merge puts over its pages (store mappings, or fresh anonymous memory for
/// all-zero pages) do not inherit. [`crate::merge::Client::merge`] and the merge agent
/// both read it, skip or refuse what cannot be kept, and set the rest again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// `MADV_WIPEONFORK`: a file mapping cannot have it, so such a range is not merged.
    pub wipe_on_fork: bool,
    /// `MADV_DONTFORK`.
    pub dont_fork: bool,
    /// `MADV_DONTDUMP`.
    pub dont_dump: bool,
    /// `mlock`ed.
    pub locked: bool,
    /// `MADV_HUGEPAGE`.
    pub hugepage: bool,
    /// `MADV_NOHUGEPAGE`.
    pub no_hugepage: bool,
    /// `MADV_MERGEABLE` (KSM).
    pub mergeable: bool,
}

impl Marks {
    /// From the `VmFlags:` line's two-letter flags.
    pub fn from_vm_flags(flags: &str) -> Self {
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        Self {
            wipe_on_fork: has("wf"),
            dont_fork: has("dc"),
            dont_dump: has("dd"),
            locked: has("lo"),
            hugepage: has("hg"),
            no_hugepage: has("nh"),
            mergeable: has("mg"),
        }
    }

    /// What of them a store mapping (private, of a memfd) that replaces part of the
    /// mapping keeps: `MADV_DONTFORK`, `MADV_DONTDUMP` and the lock, the program's say
    /// over its memory (QEMU marks guest RAM so: without the mark a fork of the merged
    /// program copied the page tables of thousands of store mappings). Huge pages and
    /// KSM are the anonymous memory's; wipe-on-fork no file mapping can have.
    pub fn for_file(self) -> Self {
        Self { dont_fork: self.dont_fork, dont_dump: self.dont_dump, locked: self.locked, ..Self::default() }
    }

    /// Sets them (all but `wipe_on_fork`) on `[addr, addr+len)`: flags and residency
    /// only, no content change, no userfaultfd event, nothing allocated in the process.
    ///
    /// The lock is `MADV_POPULATE_READ` then `mlock2(MLOCK_ONFAULT)`: the pages are
    /// mapped and locked as they are. A plain `mlock` faults a writable private mapping
    /// in for writing, which copies every page of a store mapping: the merged range
    /// kept its lock but held private copies again, besides the store's.
    pub fn apply(self, addr: usize, len: usize) -> SysResult<()> {
        use super::mman::Advice;
        let all = [
            (self.hugepage, Advice::LinuxHugepage),
            (self.no_hugepage, Advice::LinuxNoHugepage),
            (self.dont_fork, Advice::LinuxDontFork),
            (self.dont_dump, Advice::LinuxDontDump),
            (self.mergeable, Advice::LinuxMergeable),
        ];
        for (on, advice) in all {
            if on {
                // SAFETY: these advices change a mapping's flags, never its content.
                unsafe { mman::madvise(addr as *mut u8, len, advice) }?;
            }
        }
        if self.locked {
            // SAFETY: read faults map the pages' current content; no content changes.
            unsafe { mman::madvise(addr as *mut u8, len, Advice::LinuxPopulateRead) }?;
            // SAFETY: locks the pages present and those faulted later; no content changes.
            unsafe { rustix::mm::mlock_with(addr as *mut std::ffi::c_void, len, rustix::mm::MlockFlags::ONFAULT) }
                .map_err(|e| SysError::new("mlock2(MLOCK_ONFAULT)", e))?;
        }
        Ok(())
    }
}

/// Maps `len` bytes of `fd` from `offset` over `[addr, addr+len)`, private
/// (copy-on-write), readable and, when `writable`, writable.
///
/// # Safety
/// The range must be the caller's and no reference may point into it, except that
/// its bytes may be read when the file holds the same bytes at `offset` (the content
/// seen does not change).
unsafe fn map_private_over(addr: usize, len: usize, writable: bool, fd: BorrowedFd<'_>, offset: u64) -> SysResult<()> {
    let prot = if writable { Prot::READ | Prot::WRITE } else { Prot::READ };
    // SAFETY: forwarded caller guarantee.
    unsafe { mman::map_fixed(addr as *mut u8, len, prot, Share::Private, Backing::File { fd, offset }) }
}

/// A store file mapped shared and read-only: how its owner and its clients read it
/// (its owner writes it with `pwrite`).
#[derive(Debug)]
pub struct StoreMap {
    map: Mapping,
}

impl StoreMap {
    /// Maps all `len` bytes of `fd` shared, read-only.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> SysResult<Self> {
        Ok(Self { map: Mapping::new(len, Prot::READ, Share::Shared, Backing::File { fd, offset: 0 })? })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Faults `[off, off+len)` in for reading (`MADV_POPULATE_READ`) ahead of reading
    /// it: one call instead of a fault per page. Only for slots that hold pages (a
    /// hole read through a shared mapping gets a page allocated).
    pub fn populate(&self, off: usize, len: usize) -> SysResult<()> {
        if !off.checked_add(len).is_some_and(|e| e <= self.map.len()) {
            return Err(SysError::new("madvise(POPULATE_READ)", rustix::io::Errno::INVAL));
        }
        // SAFETY: inside our mapping (checked above); populating changes no content.
        unsafe { mman::madvise(self.map.as_ptr().add(off), len, mman::Advice::LinuxPopulateRead) }
    }

    /// [`StoreMap::populate`] for the pages `slots` names (by index; `None` and slots
    /// past the end are passed over), one call per run of consecutive slots: a
    /// compare of a range with store pages then takes no fault per page.
    pub fn populate_slots(&self, slots: impl IntoIterator<Item = Option<u32>>) -> SysResult<()> {
        let ps = super::page_size();
        let max = self.map.len() / ps;
        let mut run: Option<(usize, usize)> = None;
        for s in slots.into_iter().chain([None]) {
            let s = s.map(|s| s as usize).filter(|&s| s < max);
            match (run, s) {
                (Some((first, n)), Some(s)) if first + n == s => run = Some((first, n + 1)),
                _ => {
                    if let Some((first, n)) = run {
                        self.populate(first * ps, n * ps)?;
                    }
                    run = s.map(|s| (s, 1));
                }
            }
        }
        Ok(())
    }

    /// Maps `len` bytes of `fd` from `file_off` shared and read-only over
    /// `[off, off+len)` of this map: how a store shows a file it adopted (or its own
    /// memfd again, once the adopted file is gone) at the slots it gave it. The caller
    /// replaces only slots nobody reads meanwhile (not published, or no longer).
    pub fn map_over(&self, off: usize, len: usize, fd: BorrowedFd<'_>, file_off: u64) -> SysResult<()> {
        if len == 0 || !off.checked_add(len).is_some_and(|e| e <= self.map.len()) {
            return Err(SysError::new("mmap(MAP_FIXED, store)", rustix::io::Errno::INVAL));
        }
        // SAFETY: inside our own mapping (checked above); the caller's contract says no
        // reference reads these bytes while they are replaced.
        unsafe {
            mman::map_fixed(
                self.map.as_ptr().add(off),
                len,
                Prot::READ,
                Share::Shared,
                Backing::File { fd, offset: file_off },
            )
        }
    }

    /// The bytes at `[off, off+len)`, which the caller checked lie inside.
    pub fn read(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.map.len()), "store read outside the map");
        // SAFETY: inside a readable mapping we own. A store slot is written once before
        // anyone is told about it and never rewritten while referenced.
        unsafe { &self.map.as_slice()[off..off + len] }
    }
}

/// A new fd for the same file, opened read-only: what a store hands to clients. A
/// read-only fd can be mapped privately (copy-on-write) or shared read-only, never
/// written, truncated or hole-punched.
pub fn reopen_read_only(fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a path we built");
    rustix::fs::open(
        path.as_c_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| SysError::new("open(/proc/self/fd, O_RDONLY)", e))
}

/// Makes a file readable by its owner only (`fchmod 0400`), so that a client cannot
/// reopen a store it was given read-only through `/proc/self/fd` for writing.
pub fn owner_read_only(fd: BorrowedFd<'_>) -> SysResult<()> {
    rustix::fs::fchmod(fd, rustix::fs::Mode::RUSR).map_err(|e| SysError::new("fchmod", e))
}

/// `(inode, device)` of an open file, to recognise its mappings.
pub fn file_id(fd: BorrowedFd<'_>) -> SysResult<(u64, u64)> {
    let st = rustix::fs::fstat(fd).map_err(|e| SysError::new("fstat", e))?;
    Ok((st.st_ino, st.st_dev))
}

/// `st_dev`'s major and minor numbers, as /proc/PID/maps shows them.
pub fn dev_numbers(dev: u64) -> (u32, u32) {
    (rustix::fs::major(dev as _), rustix::fs::minor(dev as _))
}

/// Fills `buf` with random bytes from the kernel.
pub fn random_bytes(buf: &mut [u8]) -> SysResult<()> {
    let mut done = 0;
    while done < buf.len() {
        done += rustix::rand::getrandom(&mut buf[done..], rustix::rand::GetRandomFlags::empty())
            .map_err(|e| SysError::new("getrandom", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Duration;

    /// A write to a fenced page waits until the store page is mapped and the fence is
    /// gone, then lands in the writer's private copy of the store page.
    #[test]
    fn a_write_to_a_fenced_page_waits_and_then_lands_on_the_merged_page() {
        if WriteFence::available().is_err() {
            eprintln!("skipped: {}", WriteFence::available().unwrap_err());
            return;
        }
        let ps = crate::sys::page_size();
        let fd = crate::sys::memfd::create("fence-test").unwrap();
        crate::sys::memfd::set_len(&fd, ps as u64).unwrap();
        crate::sys::memfd::pwrite(&fd, &vec![7u8; ps], 0).unwrap();
        let store = StoreMap::new(fd.as_fd(), ps).unwrap();
        let m = Mapping::anonymous(ps).unwrap();
        // SAFETY: our fresh mapping, no other user yet.
        unsafe { m.as_mut_slice().fill(7) };
        let addr = m.addr();
        // SAFETY: the mapping is ours and outlives the fence; this thread does not write it.
        let mut fence = unsafe { WriteFence::new(addr, ps) }.unwrap();
        let writer = std::thread::spawn(move || {
            // SAFETY: the mapping outlives the thread (joined below).
            unsafe { std::ptr::write_volatile((addr + 8) as *mut u8, 99) };
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(fence.bytes()[8], 7, "the writer waits at the fence");
        let mapped = fence
            .map_equal(
                0,
                &[Some(Target::Candidate(0))],
                &|_| true,
                &store,
                &|s| Some((fd.as_fd(), s as u64 * ps as u64, 1)),
                &mut { usize::MAX },
            )
            .unwrap();
        assert_eq!(mapped, vec![true]);
        drop(fence);
        writer.join().unwrap();
        // SAFETY: the writer is done.
        let now = unsafe { m.as_slice() };
        assert_eq!(now[8], 99, "the write landed");
        assert!(now.iter().enumerate().all(|(i, &b)| i == 8 || b == 7));
        assert!(store.read(0, ps).iter().all(|&b| b == 7), "in a private copy: the store is unchanged");
    }

    /// A page found by hash only is compared before it is mapped (unequal bytes are
    /// left alone); a page the store vouches for is mapped without comparing again,
    /// which is what spares a merge a second pass over the pages it just added.
    #[test]
    fn a_candidate_is_compared_before_it_is_mapped_and_a_vouched_page_is_not_compared_again() {
        if WriteFence::available().is_err() {
            eprintln!("skipped: {}", WriteFence::available().unwrap_err());
            return;
        }
        let ps = crate::sys::page_size();
        let fd = crate::sys::memfd::create("vouch-test").unwrap();
        crate::sys::memfd::set_len(&fd, 2 * ps as u64).unwrap();
        crate::sys::memfd::pwrite(&fd, &vec![7u8; ps], 0).unwrap();
        crate::sys::memfd::pwrite(&fd, &vec![8u8; ps], ps as u64).unwrap();
        let store = StoreMap::new(fd.as_fd(), 2 * ps).unwrap();
        let m = Mapping::anonymous(3 * ps).unwrap();
        // SAFETY: our fresh mapping, no other user yet.
        unsafe { m.as_mut_slice().fill(7) };
        // SAFETY: the mapping is ours and outlives the fence; nobody writes it.
        let mut fence = unsafe { WriteFence::new(m.addr(), 3 * ps) }.unwrap();
        let targets = [Some(Target::Candidate(0)), Some(Target::Candidate(1)), Some(Target::Vouched(1))];
        let mapped = fence
            .map_equal(0, &targets, &|_| true, &store, &|s| Some((fd.as_fd(), s as u64 * ps as u64, 2 - s)), &mut {
                usize::MAX
            })
            .unwrap();
        drop(fence);
        assert_eq!(mapped, vec![true, false, true]);
        // SAFETY: the fence is gone and nobody writes the mapping.
        let now = unsafe { m.as_slice() };
        assert!(now[ps..2 * ps].iter().all(|&b| b == 7), "the unequal candidate was left alone");
        assert!(now[2 * ps..].iter().all(|&b| b == 8), "the vouched page was mapped as it is");
    }

    /// A range large enough to be compared in parts on several threads: every part
    /// compares its own candidates (an unequal page in a later part is left alone) and
    /// the answer comes back in order.
    #[test]
    fn a_large_range_is_compared_in_parts_and_answered_in_order() {
        if WriteFence::available().is_err() {
            eprintln!("skipped: {}", WriteFence::available().unwrap_err());
            return;
        }
        let ps = crate::sys::page_size();
        let n = 9000;
        let page = |i: usize| vec![(i % 251) as u8 + 1; ps];
        let fd = crate::sys::memfd::create("parts-test").unwrap();
        crate::sys::memfd::set_len(&fd, (n * ps) as u64).unwrap();
        for i in 0..n {
            crate::sys::memfd::pwrite(&fd, &page(i), (i * ps) as u64).unwrap();
        }
        let store = StoreMap::new(fd.as_fd(), n * ps).unwrap();
        let m = Mapping::anonymous(n * ps).unwrap();
        let unequal = [5, 4096, 4097, 8999];
        // SAFETY: our fresh mapping, no other user yet.
        let bytes = unsafe { m.as_mut_slice() };
        for i in 0..n {
            bytes[i * ps..(i + 1) * ps].copy_from_slice(&page(i));
        }
        for &i in &unequal {
            bytes[i * ps + 9] ^= 0xff;
        }
        // SAFETY: the mapping is ours and outlives the fence; nobody writes it.
        let mut fence = unsafe { WriteFence::new(m.addr(), n * ps) }.unwrap();
        let targets: Vec<_> = (0..n as u32).map(|s| Some(Target::Candidate(s))).collect();
        let mapped = fence
            .map_equal(
                0,
                &targets,
                &|_| true,
                &store,
                &|s| Some((fd.as_fd(), s as u64 * ps as u64, n as u32 - s)),
                &mut { usize::MAX },
            )
            .unwrap();
        drop(fence);
        let expected: Vec<bool> = (0..n).map(|i| !unequal.contains(&i)).collect();
        assert_eq!(mapped, expected);
        // SAFETY: the fence is gone and nobody writes the mapping.
        let now = unsafe { m.as_slice() };
        for i in 0..n {
            let mut want = page(i);
            if unequal.contains(&i) {
                want[9] ^= 0xff;
            }
            assert!(now[i * ps..(i + 1) * ps] == want[..], "page {i} changed");
        }
    }
}
