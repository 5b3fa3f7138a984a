//! User-guided page merging: a process says "these pages may be shared with others"
//! and advm merges them at once, with no background scan.
//!
//! Each full page of the range is hashed with its store's keyed hash; a page whose
//! bytes equal a stored page's (compared in full) becomes a copy-on-write private
//! mapping of that page, and a page the store lacks is added to it and mapped the same
//! way, so the next process shares it. Partial pages at the ends and all-zero pages are
//! left alone. Runs of consecutive store pages are mapped with one `mmap` each.
//!
//! The content the process sees never changes: the range is write-protected with
//! userfaultfd while it is merged, so a thread that writes meanwhile waits, and its
//! write lands after the merge, in its own private copy.
//!
//! Stores belong to a security domain. With `advmd` running (found at
//! `$ADVM_SOCKET`, else [`DEFAULT_SOCKET`]) the store is the daemon's one for the
//! caller's uid (or a narrower tag), shared by every process of the domain; without
//! it, [`Client::default_for_process`] falls back to a store of this process's own, and
//! [`MergeStats::via`] says so and why.
//!
//! After a merge, `MADV_DONTNEED` on a merged page brings back the merged content
//! rather than zeros (the range is now a private file mapping); memory that relies on
//! that idiom must not be merged.

pub mod agent;
mod client;
pub mod protocol;
pub mod store;
mod view;

use std::sync::Mutex;
use std::time::Instant;

pub use crate::wire::{socket_path, DEFAULT_SOCKET};
use client::{Backend, Daemon, Landing, Local};
pub use store::{
    mapped_slots, read_frozen, Adopting, KeyAsHash, PageHashMap, PageHasher, Piece, SegmentMap, Store, StoreFiles,
    StoreFull, StoreUsage, COPY_BELOW_PAGES,
};
pub use view::StoreView;

use crate::mem::{page_size, PageRange};
use crate::sys::merge::{Locate, Marks, StoreMap, Target, WriteFence};
use crate::sys::process::PerProcess;
use crate::sys::procmap;
use crate::{Error, Result};

/// Byte limit of a process's own store (the fallback).
pub const LOCAL_LIMIT: u64 = 64 << 30;

/// Which store a merge used.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The domain's store in `advmd` at this socket.
    Daemon {
        /// The socket.
        socket: String,
    },
    /// A store of this process's own, shared by no other process.
    Local {
        /// Why not the daemon (or "asked for").
        reason: String,
    },
}

/// What one merge did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MergeStats {
    /// Pages now mapping a page the store already held, or one an earlier page of the
    /// same range added (pages equal to each other).
    pub merged: u64,
    /// Pages added to the store (and now mapping it): one per distinct new page.
    pub added: u64,
    /// Pages left as they were: partial pages at the ends, all-zero pages, pages the
    /// full store refused, pages whose hash matched but bytes did not.
    pub skipped: u64,
    /// Of `skipped`: pages refused because the store reached its byte limit.
    pub refused: u64,
    /// Why the store refused pages, when it did (e.g. its byte limit).
    pub refusal: Option<String>,
    /// Bytes of the range asked for.
    pub bytes: u64,
    /// Wall-clock seconds the merge took.
    pub seconds: f64,
    /// Where those seconds went.
    pub phases: Phases,
    /// The store used.
    pub via: Via,
}

/// Wall-clock seconds of each step of a merge (summed over the calls of a
/// process-wide merge): where a merge's time goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Phases {
    /// Checking the range's mappings and write-protecting it.
    pub fence_s: f64,
    /// Finding the non-zero pages and hashing them (this process).
    pub hash_s: f64,
    /// Asking the store which pages it holds, including waits for pages other
    /// sessions are adding.
    pub lookup_s: f64,
    /// Handing new pages to the store (the copy) and waiting for it to take them.
    pub add_s: f64,
    /// Comparing candidates and mapping store pages over the range, then lifting the
    /// write protection.
    pub map_s: f64,
}

impl Phases {
    /// Adds another merge's phases to these.
    pub fn add(&mut self, o: &Phases) {
        self.fence_s += o.fence_s;
        self.hash_s += o.hash_s;
        self.lookup_s += o.lookup_s;
        self.add_s += o.add_s;
        self.map_s += o.map_s;
    }
}

impl MergeStats {
    /// Adds the merge of a range's next piece (a range merged in pieces, e.g. so that
    /// Ctrl-C is seen between them): counts, bytes, seconds and phases summed; the later
    /// piece's store, and its refusal reason, else the earlier one's.
    pub fn add(&mut self, o: MergeStats) {
        self.merged += o.merged;
        self.added += o.added;
        self.skipped += o.skipped;
        self.refused += o.refused;
        self.refusal = o.refusal.or(self.refusal.take());
        self.bytes += o.bytes;
        self.seconds += o.seconds;
        self.phases.add(&o.phases);
        self.via = o.via;
    }

    /// Bytes merged per second (the range's bytes over the time taken).
    pub fn throughput(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// What one trim did ([`Client::trim`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TrimStats {
    /// Store pages the client let go: no process maps them any more (the store frees
    /// those no other session holds).
    pub released: u64,
    /// Store pages it still holds: some process maps them.
    pub kept: u64,
    /// Wall-clock seconds the trim took (mostly reading every process's maps).
    pub seconds: f64,
}

/// A connection to one store: the daemon's for this domain, or this process's own.
///
/// Before each call it checks that its descriptors still name its files: a program
/// may close every descriptor it did not open (a daemon closing all above stderr,
/// `os.closerange`) and get the numbers back for files of its own. Such a client fails
/// every call with [`Error::Unrecoverable`] and, dropped, closes nothing (its merged
/// pages stay as they are, mapping the store's files by themselves): make a new one.
pub struct Client {
    backend: Kept,
    via: Via,
    /// Inodes of the store files of this process's earlier clients (one forgotten when
    /// the program closed its descriptors) or of its parent's (a forked child): memory
    /// they merged maps those files, and merges again like this client's own.
    earlier: Vec<u64>,
    /// When a process-wide client that fell back to a store of its own looks for advmd
    /// again ([`with_default`]).
    retry_daemon_at: Option<Instant>,
}

/// How often a process-wide client that fell back to its own store looks for advmd.
pub const RETRY_DAEMON: std::time::Duration = std::time::Duration::from_secs(1);

/// A client's backend, dropped only while its descriptors name its files: once the
/// program has closed them, dropping it would close the program's own files.
struct Kept(Option<Box<dyn Backend>>);

impl std::ops::Deref for Kept {
    type Target = dyn Backend;
    fn deref(&self) -> &Self::Target {
        self.0.as_deref().expect("taken only on drop")
    }
}

impl std::ops::DerefMut for Kept {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_deref_mut().expect("taken only on drop")
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(b) = self.0.take().filter(|b| !b.intact()) {
            std::mem::forget(b);
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("via", &self.via).finish()
    }
}

impl Client {
    /// A store of this process's own, of at most `limit_bytes`.
    pub fn local(limit_bytes: u64, reason: &str) -> Result<Self> {
        Ok(Self {
            backend: Kept(Some(Box::new(Local::new(limit_bytes)?))),
            via: Via::Local { reason: reason.to_string() },
            earlier: Vec::new(),
            retry_daemon_at: None,
        })
    }

    /// The store of this process's uid in the `advmd` at `socket`, or of the
    /// narrower domain `tag` (empty: the uid's own).
    pub fn connect(socket: &std::path::Path, tag: &str) -> Result<Self> {
        let via = Via::Daemon { socket: socket.display().to_string() };
        match Daemon::connect(socket, tag) {
            Ok(d) => Ok(Self { backend: Kept(Some(Box::new(d))), via, earlier: Vec::new(), retry_daemon_at: None }),
            Err(e) => Err(lost(&via, e)),
        }
    }

    /// The daemon at [`socket_path`] when one answers, else a store of this process's
    /// own, with the reason in [`Via::Local`]. `$ADVM_MERGE_TAG` names a narrower domain.
    pub fn default_for_process() -> Result<Self> {
        let path = socket_path();
        match Self::connect_default(&path) {
            Ok(c) => Ok(c),
            Err(e) => {
                let mut c = Self::local_within(
                    LOCAL_LIMIT,
                    &format!(
                        "advmd is not reachable at {} ({e}); pages are shared within this process only",
                        path.display()
                    ),
                )?;
                c.retry_daemon_at = Some(Instant::now() + RETRY_DAEMON);
                Ok(c)
            }
        }
    }

    /// [`Client::local`] of `limit_bytes`, or, where the kernel refuses a view that large
    /// (valgrind refuses 64 GiB; so may a tight `ulimit -v`), of half as many, down to
    /// 1 GiB: a smaller store beats none. The first refusal is the error when all fail.
    fn local_within(limit_bytes: u64, reason: &str) -> Result<Self> {
        let first = match Self::local(limit_bytes, reason) {
            Err(Error::Sys(s)) if matches!(s.raw_errno(), libc::EINVAL | libc::ENOMEM) => Error::Sys(s),
            other => return other,
        };
        let mut limit = limit_bytes / 2;
        while limit >= 1 << 30 {
            if let Ok(c) = Self::local(limit, reason) {
                return Ok(c);
            }
            limit /= 2;
        }
        Err(first)
    }

    fn connect_default(path: &std::path::Path) -> Result<Self> {
        Self::connect(path, &std::env::var("ADVM_MERGE_TAG").unwrap_or_default())
    }

    /// Which store this client uses.
    pub fn via(&self) -> &Via {
        &self.via
    }

    /// What the store holds.
    pub fn usage(&mut self) -> Result<StoreUsage> {
        self.check_intact()?;
        self.backend.usage().map_err(|e| lost(&self.via, e))
    }

    /// Lets go of the store pages this client was handed that no process maps any more:
    /// memory merged onto them that the program has since unmapped, or moved and
    /// unmapped, or that a later merge mapped onto other pages. A page some mapping
    /// still covers is kept, also when the program wrote it (the mapping holds a
    /// private copy then, but `MADV_DONTNEED` would read the store's page again), and
    /// so is a page a forked child maps. Pages no other session holds are freed. It
    /// reads every process's maps ([`mapped_slots`]): call it now and then, not per
    /// merge of a small buffer.
    pub fn trim(&mut self) -> Result<TrimStats> {
        let t = Instant::now();
        self.check_intact()?;
        let (released, kept) = self.backend.trim().map_err(|e| lost(&self.via, e))?;
        Ok(TrimStats { released, kept, seconds: t.elapsed().as_secs_f64() })
    }

    /// Whether a file with this inode is a store file of this client or of an earlier
    /// one (a range mapping it was merged before).
    fn holds_inode(&self, inode: u64) -> bool {
        self.backend.holds_inode(inode) || self.earlier.contains(&inode)
    }

    /// The inodes of the store files of this client and of the earlier ones.
    fn store_inodes(&self) -> Vec<u64> {
        let mut all = self.backend.inodes();
        all.extend(&self.earlier);
        all
    }

    /// Fails when the program closed this client's descriptors ([`Client`]).
    fn check_intact(&self) -> Result<()> {
        if self.backend.intact() {
            return Ok(());
        }
        Err(Error::Unrecoverable {
            what: "merge client",
            why: "the program closed its descriptors (their numbers may name the program's own files now); it \
                  touches and closes nothing more: make a new client"
                .into(),
        })
    }

    /// Merges the full pages of `buf` (see the module documentation).
    ///
    /// `buf` must lie in private anonymous memory (or memory merged before); a part
    /// that is unmapped, shared or file-backed is refused before anything changes.
    #[allow(unsafe_code)] // a borrowed slice meets merge_raw's contract; no unsafe op here
    pub fn merge(&mut self, buf: &[u8]) -> Result<MergeStats> {
        // SAFETY: the slice keeps its memory mapped for the call, and merging never
        // changes the bytes it reads.
        unsafe { self.merge_raw(buf.as_ptr() as usize, buf.len()) }
    }

    /// [`Client::merge`] for raw addresses (the C API, the preload shim).
    ///
    /// # Safety
    /// `[addr, addr+len)` must be this process's memory and stay mapped for the call
    /// (no thread may unmap or remap it meanwhile); the calling thread must not write it.
    #[allow(unsafe_code)] // forwards the raw-address contract to WriteFence::new
    pub unsafe fn merge_raw(&mut self, addr: usize, len: usize) -> Result<MergeStats> {
        let t0 = Instant::now();
        let ps = page_size();
        let end = addr.checked_add(len).ok_or_else(|| Error::InvalidArgument {
            what: "merge range",
            why: format!("{addr:#x}+{len} wraps the address space"),
        })?;
        let start = addr.div_ceil(ps) * ps;
        let stop = end / ps * ps;
        let mut stats = MergeStats {
            merged: 0,
            added: 0,
            skipped: 0,
            refused: 0,
            refusal: None,
            bytes: len as u64,
            seconds: 0.0,
            phases: Phases::default(),
            via: self.via.clone(),
        };
        if start >= stop {
            stats.skipped = (len > 0) as u64 + (len > 0 && (end - 1) / ps != addr / ps) as u64;
            stats.seconds = t0.elapsed().as_secs_f64();
            return Ok(stats);
        }
        stats.skipped = ((start - addr).div_ceil(ps) + (end - stop).div_ceil(ps)) as u64;
        self.check_intact()?;
        let range = PageRange::new("merge range", start, stop - start)?;
        let (writable, marks) = self.check(range)?;
        // SAFETY: the caller keeps the range mapped and does not write it; checked above
        // to be anonymous or store memory, which userfaultfd can protect.
        let mut fence = unsafe { WriteFence::new(start, stop - start) }.map_err(|e| fence_error(range, e))?;
        stats.phases.fence_s = t0.elapsed().as_secs_f64();
        let merged = self.merge_fenced(&mut fence, &writable, &mut stats).map_err(|e| lost(&self.via, e));
        // The store mappings now over the pages have none of the program's marks: they
        // get them again (whatever part was mapped before a failure too).
        let marked = marks.iter().try_for_each(|&(a, e, m)| m.apply(a, e - a));
        drop(fence);
        merged?;
        marked.map_err(Error::Sys)?;
        stats.seconds = t0.elapsed().as_secs_f64();
        stats.phases.map_s =
            stats.seconds - stats.phases.fence_s - stats.phases.hash_s - stats.phases.lookup_s - stats.phases.add_s;
        Ok(stats)
    }

    /// Checks every mapping under `range`: mapped, readable, private, anonymous or
    /// this store's, and not wiped on fork. Returns the mappings as `(start, end,
    /// writable)`, and those with marks to set again after the merge as `(start, end,
    /// marks)`.
    #[allow(clippy::type_complexity)]
    fn check(&self, range: PageRange) -> Result<(Vec<(usize, usize, bool)>, Vec<(usize, usize, Marks)>)> {
        // madvise/mlock marks are only in smaps (1-5 ms for a process holding 1 GiB)
        let flags = std::fs::read_to_string("/proc/self/smaps").map(|t| agent::vm_flags(&t)).unwrap_or_default();
        let mut marked = Vec::new();
        let mut out = Vec::new();
        let mut a = range.start().0;
        while a < range.end().0 {
            let refuse = |why: String| Error::InvalidArgument { what: "merge range", why };
            let v = procmap::query(a)?
                .filter(|v| v.start <= a)
                .ok_or_else(|| refuse(format!("{a:#x} (inside {range:?}) is not mapped")))?;
            if v.shared {
                return Err(refuse(format!(
                    "{:#x}..{:#x} is a shared mapping; only private memory can be merged",
                    v.start, v.end
                )));
            }
            if v.file_backed && !self.holds_inode(v.inode) {
                return Err(refuse(format!(
                    "{:#x}..{:#x} is file-backed (inode {}); only anonymous memory can be merged",
                    v.start, v.end, v.inode
                )));
            }
            if !v.readable {
                return Err(refuse(format!("{:#x}..{:#x} is not readable", v.start, v.end)));
            }
            let e = v.end.min(range.end().0);
            let marks = flags.get(&v.start).map_or_else(Marks::default, |f| Marks::from_vm_flags(f));
            if marks.wipe_on_fork {
                return Err(refuse(format!(
                    "{:#x}..{:#x} is marked MADV_WIPEONFORK, which a merged page (a store mapping) cannot \
                     keep: a forked child would read its bytes instead of zeros",
                    v.start, v.end
                )));
            }
            if marks.for_file() != Marks::default() {
                marked.push((a, e, marks.for_file()));
            }
            out.push((a, e, v.writable));
            a = e;
        }
        Ok((out, marked))
    }

    fn merge_fenced(
        &mut self,
        fence: &mut WriteFence,
        mappings: &[(usize, usize, bool)],
        stats: &mut MergeStats,
    ) -> Result<()> {
        let ps = page_size();
        let n_pages = fence.bytes().len() / ps;
        // Non-zero pages and their hashes.
        let t = Instant::now();
        let (want, hashes) = self.backend.hasher().hash_nonzero(fence.bytes());
        stats.phases.hash_s = t.elapsed().as_secs_f64();
        let first = mappings[0].0;
        let writable = |i: usize| {
            let a = first + i * ps;
            mappings.iter().find(|m| m.0 <= a && a < m.1).is_some_and(|m| m.2)
        };
        // Equal pages map one store page each (offsets do not advance), one mapping
        // apiece: a merge never takes the process past half of vm.max_map_count (as
        // remap and vcopy keep under it); pages past that are left alone.
        let half = crate::probe::facts().max_map_count as usize / 2;
        let mut vmas_left = half.saturating_sub(procmap::vma_count()?);
        let mut landing = MapOnLanding {
            fence: &mut *fence,
            writable: &writable,
            stats: &mut *stats,
            vmas_left: &mut vmas_left,
            brought: Default::default(),
        };
        let resolved = self.backend.resolve(&mut landing, &want, &hashes, true)?;
        let mut target: Vec<Option<Target>> = vec![None; n_pages];
        for (&i, slot) in want.iter().zip(&resolved.found) {
            target[i] = slot.map(Target::Candidate);
        }
        stats.phases.lookup_s = resolved.lookup_s;
        stats.phases.add_s = resolved.add_s;
        stats.refusal = resolved.refusal;
        let backend = &*self.backend;
        let mapped = fence.map_equal(0, &target, &writable, backend.view(), &|s| backend.locate(s), &mut vmas_left)?;
        for (m, t) in mapped.into_iter().zip(&target) {
            match (m, t) {
                (true, _) => stats.merged += 1,
                (false, Some(_)) => stats.skipped += 1,
                // New pages were counted as they landed, zero pages are not mapped.
                (false, None) => {}
            }
        }
        stats.skipped += (n_pages - want.len()) as u64;
        Ok(())
    }
}

/// Maps each batch of new pages over the fenced range as soon as the store has them,
/// before the next batch is copied. Their own pages are then freed while the copy goes
/// on, so the copy writes into memory just freed rather than taking as much again: a
/// merge never holds its range twice, and where fresh memory is dear (a VM whose host
/// backs freed memory lazily: 0.2 GB/s to first touch here, against 1.4-1.7 GB/s
/// reusing it) the add is five to seven times faster (docs/merge.md).
struct MapOnLanding<'a> {
    fence: &'a mut WriteFence,
    writable: &'a dyn Fn(usize) -> bool,
    stats: &'a mut MergeStats,
    /// Mappings this merge may still add (see `map_equal`).
    vmas_left: &'a mut usize,
    /// Store pages this merge's adds brought in: a later page of the range mapped to
    /// one of them (a page equal to an earlier one) is merged, not added again.
    brought: std::collections::HashSet<u32>,
}

impl Landing for MapOnLanding<'_> {
    fn bytes(&self) -> &[u8] {
        self.fence.bytes()
    }

    fn landed(
        &mut self,
        which: &[usize],
        targets: &[Option<Target>],
        store: &StoreMap,
        locate: Locate<'_>,
    ) -> Result<()> {
        let (Some(&lo), Some(&hi)) = (which.first(), which.last()) else {
            return Ok(());
        };
        let mut span = vec![None; hi + 1 - lo];
        for (&i, &t) in which.iter().zip(targets) {
            span[i - lo] = t;
        }
        let mapped = self.fence.map_equal(lo, &span, self.writable, store, locate, self.vmas_left)?;
        for (&i, t) in which.iter().zip(targets) {
            match (t, mapped[i - lo]) {
                (None, _) => {
                    self.stats.refused += 1;
                    self.stats.skipped += 1;
                }
                (Some(Target::Candidate(slot) | Target::Vouched(slot)), true) => match self.brought.insert(*slot) {
                    true => self.stats.added += 1,
                    false => self.stats.merged += 1,
                },
                (Some(_), false) => self.stats.skipped += 1,
            }
        }
        Ok(())
    }
}

fn fence_error(range: PageRange, e: crate::sys::SysError) -> Error {
    if e.errno == crate::sys::Errno::BUSY {
        return Error::InvalidArgument {
            what: "merge range",
            why: format!("{range:?} is already registered with another userfaultfd (a pager?); it cannot be fenced"),
        };
    }
    // Out of fds or memory: the probe below would fail the same way and read as a
    // kernel without write protection (ENOSYS), which the caller would take for good.
    if matches!(e.errno, crate::sys::Errno::MFILE | crate::sys::Errno::NFILE | crate::sys::Errno::NOMEM) {
        return Error::Sys(e);
    }
    // Refused, not missing: a seccomp filter (containers' default profiles, systemd's
    // SystemCallFilter) or vm.unprivileged_userfaultfd=0. It read "not available on
    // this kernel", which sent readers looking for a newer kernel.
    if e.call == "userfaultfd" && matches!(e.errno, crate::sys::Errno::PERM | crate::sys::Errno::ACCESS) {
        macro_rules! refused {
            ($errno:literal) => {
                concat!(
                    "userfaultfd, which was refused with ",
                    $errno,
                    ": a seccomp filter (a container's or a service's) forbids it, or vm.unprivileged_userfaultfd is \
                     0 and this process has neither CAP_SYS_PTRACE nor access to /dev/userfaultfd (the kernel has \
                     userfaultfd)"
                )
            };
        }
        return Error::NeedsPrivilege {
            what: "merging (a userfaultfd write-protects the range meanwhile)",
            needs: if e.errno == crate::sys::Errno::PERM { refused!("EPERM") } else { refused!("EACCES") },
            uid: crate::sys::euid(),
        };
    }
    if let Err(why) = WriteFence::available() {
        // ENOSYS: no userfaultfd here, or a filter that answers so.
        let why = if e.errno == crate::sys::Errno::NOSYS {
            format!("{why} (ENOSYS: the kernel has no userfaultfd, or a seccomp filter answers ENOSYS for it)")
        } else {
            why
        };
        return Error::Unsupported { what: "write-protecting a range while it is merged", why };
    }
    Error::Sys(e)
}

/// A daemon that went away named as such, with its socket; other errors as they are.
fn lost(via: &Via, e: Error) -> Error {
    match via {
        Via::Daemon { socket } if e.is_disconnect() => {
            let why = match e {
                Error::Disconnected { why, .. } => why,
                e => e.to_string(),
            };
            Error::Disconnected { socket: socket.clone(), why }
        }
        _ => e,
    }
}

/// The process-wide client, made on first use, and again in a forked child, which
/// must not share its parent's session, under a lock of its own: a parent thread
/// merging at the fork held the parent's, and no thread of the child would release it.
static DEFAULT: PerProcess<Mutex<Option<Client>>> = PerProcess::new();

/// Runs `f` with the process-wide client ([`Client::default_for_process`]).
pub fn with_default<T>(f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
    // In a forked child, before its own client replaces it: the parent's, whose merged
    // memory the child maps. Not waited for: a parent thread that held its lock at the
    // fork does not exist here (then the child merges that memory no more than before).
    let parents =
        DEFAULT.inherited().and_then(|m| m.try_lock().ok()).and_then(|c| c.as_ref().map(Client::store_inodes));
    let mut g = DEFAULT.get(|| Mutex::new(None)).lock().unwrap_or_else(|p| p.into_inner());
    let mut earlier = parents.unwrap_or_default();
    if g.as_ref().is_some_and(|c| !c.backend.intact()) {
        // The program closed the client's descriptors (a daemon closing every one above
        // stderr, `os.closerange`) and may have got the numbers back for its own files:
        // a new client replaces it (dropping it closes none of them, [`Client`]).
        earlier.extend(g.take().map(|c| c.store_inodes()).unwrap_or_default());
    }
    if g.is_none() {
        let mut c = Client::default_for_process()?;
        c.earlier = earlier;
        *g = Some(c);
    }
    let c = g.as_mut().expect("set above");
    if c.retry_daemon_at.is_some_and(|at| Instant::now() >= at) {
        // advmd did not answer when this client was made (a worker started before the
        // daemon, or while it restarted): look again, at most once a RETRY_DAEMON, so
        // that once it serves, this process shares pages with the others (the client
        // kept its own store for good, and a worker never merged through advmd). Memory
        // merged into the process's own store keeps mapping it, and merges again.
        match Client::connect_default(&socket_path()) {
            Ok(mut d) => {
                d.earlier = c.store_inodes();
                *c = d;
            }
            Err(_) => c.retry_daemon_at = Some(Instant::now() + RETRY_DAEMON),
        }
    }
    let r = f(c);
    if let Err(Error::Disconnected { .. }) = &r {
        // advmd stopped or restarted: this call says so, and the next connects anew (to
        // a restarted daemon, else a store of this process's own) as a new process
        // would; memory merged before maps the old store's files and merges again like
        // the new client's own. Kept, the client failed every later call: a worker
        // outliving a daemon restart could never merge through advmd again.
        let earlier = g.take().map(|c| c.store_inodes()).unwrap_or_default();
        if let Ok(mut c) = Client::default_for_process() {
            c.earlier = earlier;
            *g = Some(c);
        }
    }
    r
}

/// Trims the process-wide client ([`Client::trim`]), made if there is none yet.
pub fn trim() -> Result<TrimStats> {
    with_default(|c| c.trim())
}

/// Merges the full pages of `buf` with the process-wide client.
pub fn merge(buf: &[u8]) -> Result<MergeStats> {
    with_default(|c| c.merge(buf))
}

/// [`merge`] for raw addresses.
///
/// # Safety
/// As [`Client::merge_raw`].
#[allow(unsafe_code)] // forwards the raw-address contract
pub unsafe fn merge_raw(addr: usize, len: usize) -> Result<MergeStats> {
    // SAFETY: forwarded caller guarantee.
    with_default(|c| unsafe { c.merge_raw(addr, len) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{Errno, SysError};

    /// A userfaultfd refused by a seccomp filter or for want of privilege said
    /// "write-protecting a range while it is merged is not available on this kernel".
    #[test]
    fn a_refused_userfaultfd_is_told_from_a_missing_one() {
        let range = PageRange::new("merge range", page_size(), page_size()).unwrap();
        for (errno, name) in [(Errno::PERM, "EPERM"), (Errno::ACCESS, "EACCES")] {
            let e = fence_error(range, SysError::new("userfaultfd", errno));
            assert!(matches!(e, Error::NeedsPrivilege { .. }), "{e:?}");
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("merging (a userfaultfd write-protects the range meanwhile) needs userfaultfd, which was refused with {name}: a seccomp filter"))
                    && !e.contains("not available on this kernel"),
                "{e}"
            );
        }
        // A missing one is named as such where the probe fails too (not here, where
        // this test can only see that the probe passes).
        if WriteFence::available().is_ok() {
            let e = fence_error(range, SysError::new("userfaultfd", Errno::NOSYS));
            assert!(matches!(e, Error::Sys(_)), "{e:?}");
        }
    }
}
