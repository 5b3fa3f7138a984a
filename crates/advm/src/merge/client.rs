//! Where a client's pages go: the domain's store in `advmd`, or a store of this
//! process's own when no daemon answers.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use super::protocol::{Reply, Request, LATER, MAX_PAGES, NO_SLOT};
use super::store::{PageHasher, Store, StoreUsage};
use super::view::StoreView;
use crate::mem::page_size;
use crate::sys::merge::{Locate, StoreMap, Target};
use crate::sys::seal;
use crate::wire::Channel;
use crate::{Error, Result};

/// The store a merge talks to.
pub(crate) trait Backend: Send {
    fn hasher(&self) -> &PageHasher;
    /// The store's pages, mapped read-only.
    fn view(&self) -> &StoreMap;
    /// Where slot `s`'s page maps from: the file, the page's offset, and how many
    /// slots from `s` on follow it there.
    fn locate(&self, s: u32) -> Option<(BorrowedFd<'_>, u64, u32)>;
    /// Whether a file with this inode is one of the store's (a range mapping it was
    /// merged before).
    fn holds_inode(&self, inode: u64) -> bool;
    /// The inodes of the store's files this backend maps (a later client of this
    /// process, or of a forked child, takes memory mapping them as merged memory).
    fn inodes(&self) -> Vec<u64>;
    /// What the store holds for each hash. `window`: most pages of those it lacks that
    /// this session will add now, the rest answered [`Found::Later`] when another
    /// session adds them side by side ([`Request::Lookup`]); `Some(0)` only looks
    /// (claims nothing, waits for nothing); `None` claims all and waits.
    fn lookup(&mut self, hashes: &[u64], window: Option<u32>) -> Result<Vec<Found>>;
    /// Stores the pages `i` in `which` (ascending) of `src.bytes()` (`hashes`: theirs,
    /// in order), in batches; after each batch, and before the next is copied, tells
    /// `src` where its pages landed ([`Landing::landed`]: every page of `which` once).
    /// `None` where the store refused one (full); the store's reason is returned. A
    /// page the store copied or compared in full lands [`Target::Vouched`], one it
    /// only found by hash [`Target::Candidate`].
    fn add(&mut self, src: &mut dyn Landing, which: &[usize], hashes: &[u64]) -> Result<Option<String>>;
    fn usage(&mut self) -> Result<StoreUsage>;
    /// Lets go of the store pages this client holds that no process maps any more
    /// ([`super::Client::trim`]): `(pages let go, pages still held)`.
    fn trim(&mut self) -> Result<(u64, u64)>;
    /// Whether the descriptors it keeps still name their files (the program may have
    /// closed them and got the numbers back for files of its own; then nothing of this
    /// backend may be used or dropped: [`super::with_default`] forgets it).
    fn intact(&self) -> bool {
        true
    }

    /// Looks the pages `want` (with `hashes`) up and, with `add_new`, adds those the
    /// store lacks (landing them through `src`), a window at a time: pages another
    /// session is adding are looked up again after this session's window landed.
    fn resolve(&mut self, src: &mut dyn Landing, want: &[usize], hashes: &[u64], add_new: bool) -> Result<Resolved> {
        let mut r = Resolved { found: vec![None; want.len()], ..Resolved::default() };
        let mut window = if add_new { lookup_window() } else { Some(0) };
        let mut ask: Vec<usize> = (0..want.len()).collect();
        while !ask.is_empty() {
            // A lookup with a window is one request: the next would end its claims.
            let now = if window.is_some() { ask.len().min(MAX_PAGES) } else { ask.len() };
            let t = Instant::now();
            let asked: Vec<u64> = ask[..now].iter().map(|&k| hashes[k]).collect();
            let answers = self.lookup(&asked, window)?;
            r.lookup_s += t.elapsed().as_secs_f64();
            let (mut new_at, mut new_hashes) = (Vec::new(), Vec::new());
            let mut later = ask.split_off(now);
            let carried = later.len();
            for (&k, a) in ask.iter().zip(answers) {
                match a {
                    Found::Slot(s) => r.found[k] = Some(s),
                    Found::Add => {
                        new_at.push(want[k]);
                        new_hashes.push(hashes[k]);
                    }
                    Found::Later => later.push(k),
                }
            }
            if add_new {
                let t = Instant::now();
                if let Some(why) = self.add(src, &new_at, &new_hashes)? {
                    r.refusal = Some(why);
                }
                r.add_s += t.elapsed().as_secs_f64();
            } else {
                r.not_added += new_at.len();
            }
            let progress = later.len() - carried < now;
            later.sort_unstable();
            ask = later;
            // Each window ends in a wait for its last adds to land and a lookup: a
            // window twice the last keeps their number to the log of a large merge's
            // size, while the first windows of merges that start at once stay small.
            // A round that settled nothing (a daemon answering only "later") is not
            // repeated: the next lookup claims all and waits.
            window = window.filter(|_| progress).map(|w| w.saturating_mul(2));
        }
        Ok(r)
    }
}

/// What a lookup found for one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A stored page with the hash (compare it before mapping it).
    Slot(u32),
    /// Not stored: this session adds it (or, looking only, leaves it).
    Add,
    /// Not stored yet: another session is adding it, or it lies past the window.
    Later,
}

/// What [`Backend::resolve`] found and did.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    /// Per page asked about, a stored page with its hash (pages added land through
    /// the [`Landing`] instead).
    pub found: Vec<Option<u32>>,
    /// The store's reason for refusing pages, if it did.
    pub refusal: Option<String>,
    /// Pages the store lacks that were not added (a lookup-only resolve).
    pub not_added: usize,
    /// Seconds in lookups (waits for other sessions' pages included) and in adds.
    pub lookup_s: f64,
    pub add_s: f64,
}

/// Most pages a merge's first lookup claims for this session to add before it looks
/// again (each later window is twice the last): one group of batches ([`copy_threads`]
/// of [`ADD_BATCH`]); `$ADVM_MERGE_WINDOW_PAGES` sets it (0: no window, every page
/// missed is claimed and others' pages are waited for).
fn lookup_window() -> Option<u32> {
    let default = (ADD_BATCH * copy_threads()) as u32;
    match std::env::var("ADVM_MERGE_WINDOW_PAGES").ok().and_then(|v| v.parse::<u32>().ok()) {
        Some(0) => None,
        Some(w) => Some(w),
        None => Some(default),
    }
}

/// The pages an add copies from, and what becomes of them once their batch has landed.
pub(crate) trait Landing {
    /// The bytes the added pages are read from; borrowed only while a batch is copied.
    fn bytes(&self) -> &[u8];
    /// The pages `which` (indices into [`Self::bytes`]'s pages) landed at `targets`
    /// (`None`: refused), in `store` (`locate`: where a slot maps from).
    fn landed(
        &mut self,
        which: &[usize],
        targets: &[Option<Target>],
        store: &StoreMap,
        locate: Locate<'_>,
    ) -> Result<()>;
}

/// Pages added per batch: 16 MiB of 4 KiB pages (64 MiB batches added 1.1-1.6x
/// slower in three side-by-side rounds: each batch in flight takes fresh memory).
/// Through advmd each batch is one adopted file, held by the store until none of its
/// pages is referenced, and lands (waking the domain's lookups waiting for its
/// pages) before the group after the next is written.
const ADD_BATCH: usize = 4096;

/// Batches written at once by one add (see `Daemon::sealed_batches`): as many as there
/// are CPUs for this process, at most four; `$ADVM_MERGE_COPY_THREADS` sets it (1: one
/// thread).
fn copy_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get()).min(4);
    std::env::var("ADVM_MERGE_COPY_THREADS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(cpus).clamp(1, 16)
}

/// A store of this process's own.
pub(crate) struct Local {
    store: Store,
    fd: OwnedFd,
    /// When the store was made, in clock ticks since boot: processes started before
    /// never mapped it ([`crate::process::Mappers`]).
    since: u64,
}

impl Local {
    pub(crate) fn new(limit_bytes: u64) -> Result<Self> {
        let store = Store::create("advm-merge-local", limit_bytes)?;
        let fd = store.read_only_fd()?;
        Ok(Self { store, fd, since: crate::process::boot_ticks()? })
    }
}

impl Backend for Local {
    fn intact(&self) -> bool {
        self.store.intact() && crate::sys::merge::file_id(self.fd.as_fd()).is_ok_and(|id| id == self.store.file_id())
    }
    fn hasher(&self) -> &PageHasher {
        self.store.hasher()
    }
    fn view(&self) -> &StoreMap {
        self.store.view()
    }
    fn locate(&self, s: u32) -> Option<(BorrowedFd<'_>, u64, u32)> {
        let slots = (self.store.file_len() / page_size() as u64) as u32;
        (s < slots).then(|| (self.fd.as_fd(), s as u64 * page_size() as u64, slots - s))
    }
    fn holds_inode(&self, inode: u64) -> bool {
        inode == self.store.file_id().0
    }
    fn inodes(&self) -> Vec<u64> {
        vec![self.store.file_id().0]
    }
    fn lookup(&mut self, hashes: &[u64], _window: Option<u32>) -> Result<Vec<Found>> {
        // One process: nobody else adds to this store.
        Ok(hashes.iter().map(|&h| self.store.find(h).map_or(Found::Add, Found::Slot)).collect())
    }
    fn add(&mut self, src: &mut dyn Landing, which: &[usize], hashes: &[u64]) -> Result<Option<String>> {
        let mut refusal = None;
        for (which, hashes) in which.chunks(ADD_BATCH).zip(hashes.chunks(ADD_BATCH)) {
            // insert_pages compares every page it shares in full and writes the others.
            let (slots, full) = self.store.insert_pages(src.bytes(), which, hashes)?;
            if let Some(f) = full {
                refusal = Some(f.to_string());
            }
            let targets: Vec<Option<Target>> = slots.into_iter().map(|s| s.map(Target::Vouched)).collect();
            src.landed(which, &targets, self.store.view(), &|s| self.locate(s))?;
        }
        Ok(refusal)
    }
    fn usage(&mut self) -> Result<StoreUsage> {
        Ok(self.store.usage())
    }
    fn trim(&mut self) -> Result<(u64, u64)> {
        // Every reference is this process's: a page no process maps goes whole.
        let held: std::collections::HashSet<u32> = self.store.referenced_slots().into_iter().collect();
        let files = self.store.files()?;
        let who = crate::process::Mappers { pid: std::process::id(), uid: crate::sys::euid(), since_ticks: self.since };
        let mapped = super::store::mapped_slots(&[(&files, &held)], Some(who))?.remove(0);
        let mut released = 0;
        for &slot in held.iter().filter(|s| !mapped.contains(s)) {
            self.store.release_all(slot)?;
            released += 1;
        }
        Ok((released, mapped.len() as u64))
    }
}

/// A session with `advmd`: the domain's store mapped read-only. New pages go to the
/// daemon in a memfd this process writes them into (`pwrite`: the one copy) and then
/// seals; the daemon adopts the file into its store as it is.
pub(crate) struct Daemon {
    /// Always `Some` until drop parks it.
    ch: Option<Channel>,
    hasher: PageHasher,
    view: StoreView,
    /// Whether the daemon takes lookups with a window (false after one refused it).
    windows: bool,
    /// The connection's and the store's file identities when connected ([`Backend::intact`]).
    ids: [(u64, u64); 2],
}

impl Daemon {
    pub(crate) fn connect(path: &Path, tag: &str) -> Result<Self> {
        let ch = Channel::connect(path)?;
        let sent = Request::Hello { tag: tag.to_string() }.send(&ch);
        // A daemon refusing the connection (too many clients) answers and hangs up at
        // once: the hello may then find the socket closed, and the reason is waiting.
        let reply = Reply::recv(&ch);
        if let Err(e) = sent {
            return Err(reply.err().unwrap_or(e));
        }
        let Reply::Hello { limit_bytes, secret, store } = reply? else {
            return Err(Error::InvalidArgument { what: "advmd reply", why: "expected the store after hello".into() });
        };
        let view = StoreView::new(store, limit_bytes as usize)?;
        let ids = [crate::sys::merge::file_id(ch.as_fd())?, crate::sys::merge::file_id(view.store_fd())?];
        Ok(Self { ch: Some(ch), hasher: PageHasher::from_secret(&secret)?, view, windows: true, ids })
    }

    /// The slots of a reply about `n` pages; slots outside the store read as none.
    fn check_slots(&self, s: Vec<u32>, n: usize) -> Result<Vec<Option<u32>>> {
        count_slots(&s, n)?;
        let max = self.view.slots();
        Ok(s.into_iter().map(|x| (x != NO_SLOT && x < max).then_some(x)).collect())
    }
}

/// A reply about `n` pages has one slot each.
fn count_slots(s: &[u32], n: usize) -> Result<()> {
    if s.len() != n {
        return Err(Error::InvalidArgument { what: "advmd reply", why: format!("{} slots for {n} pages", s.len()) });
    }
    Ok(())
}

/// Sessions whose clients were dropped. The daemon keeps a session's pages until the
/// connection closes, and this process may still map them (a merged page reads from
/// the store until it is written), so the connection stays open until the process
/// exits (or execs: it is close-on-exec, and exec drops the mappings too).
/// Per process: a child forked while a parent thread held the list gets a list of its
/// own (the parent's channels stay open in it, left alone, as before).
static PARKED: crate::sys::process::PerProcess<std::sync::Mutex<Vec<Channel>>> = crate::sys::process::PerProcess::new();

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(ch) = self.ch.take() {
            PARKED.get(|| std::sync::Mutex::new(Vec::new())).lock().unwrap_or_else(|p| p.into_inner()).push(ch);
        }
    }
}

/// The pages `which` (ascending indices) of `bytes`, as runs of consecutive pages.
fn page_runs<'a>(bytes: &'a [u8], which: &[usize]) -> Vec<&'a [u8]> {
    let ps = page_size();
    let mut runs = Vec::new();
    let mut k = 0;
    while k < which.len() {
        let mut n = 1;
        while k + n < which.len() && which[k + n] == which[k] + n {
            n += 1;
        }
        runs.push(&bytes[which[k] * ps..(which[k] + n) * ps]);
        k += n;
    }
    runs
}

/// What the daemon made of one add.
struct Handed {
    slots: Vec<Option<u32>>,
    refusal: Option<String>,
    room: u64,
}

/// The adds of one merge: which batches the store refused whole (`(first, count)`
/// in the merge's new pages), and what it said last.
struct Adds {
    refused: Vec<(usize, usize)>,
    refusal: Option<String>,
    room: u64,
}

impl Adds {
    /// Notes the daemon's answer about a batch; its slots when it took the batch.
    fn settle(&mut self, (first, n): (usize, usize), h: Handed) -> Option<Vec<Option<u32>>> {
        self.room = h.room;
        match h.refusal {
            Some(why) => {
                self.refused.push((first, n));
                self.refusal = Some(why);
                None
            }
            None => Some(h.slots),
        }
    }
}

impl Daemon {
    /// Writes the pages `which` of `bytes` into a new memfd and seals it.
    fn sealed_pages(bytes: &[u8], which: &[usize]) -> Result<OwnedFd> {
        let ps = page_size();
        if let Some(&last) = which.iter().max().filter(|&&i| (i + 1) * ps > bytes.len()) {
            return Err(Error::InvalidArgument {
                what: "pages to add",
                why: format!("page {last} lies past the {} bytes given", bytes.len()),
            });
        }
        let file = seal::create("advm-merge-add")?;
        seal::write_all_at(&file, &page_runs(bytes, which), 0)?;
        seal::freeze(&file)?;
        Ok(file)
    }

    /// Reads the daemon's answer to an add of `n` pages, and shows the files it names.
    fn added(&mut self, n: usize) -> Result<Handed> {
        let Reply::Added { slots, refusal, room, segments } = Reply::recv(self.ch())? else {
            return Err(Error::InvalidArgument { what: "advmd reply", why: "expected added slots".into() });
        };
        self.view.show(segments)?;
        let slots = self.check_slots(slots, n)?;
        Ok(Handed { slots, refusal: (!refusal.is_empty()).then_some(refusal), room })
    }

    /// Writes the batches `group` (each `(first, n)` in `which`) into sealed files, one
    /// thread per batch: the copy into new shmem pages costs mostly the kernel's page
    /// allocation and charging, per page and per CPU, so two threads copy faster where
    /// a CPU is free. A thread that cannot be started: its batch is written here.
    fn sealed_batches(bytes: &[u8], which: &[usize], group: &[(usize, usize)]) -> Result<Vec<OwnedFd>> {
        crate::threads::in_threads("advm-merge-copy", group, |&(first, n)| {
            Self::sealed_pages(bytes, &which[first..first + n])
        })
        .into_iter()
        .collect()
    }

    /// Hands the pages `which` of `src.bytes()` over in batches, one add each, and
    /// tells `src` where each batch landed as its answer comes. Batches are written
    /// [`copy_threads`] at a time (a group), and the next group is written while the
    /// daemon takes the last one; a group lands once the next is sent, so at most two
    /// groups of fresh pages are in flight before the range's own pages are freed. A
    /// batch the store refused whole for want of room is sent again afterwards, as
    /// much of it as fits.
    fn add_batches(&mut self, src: &mut dyn Landing, which: &[usize], hashes: &[u64]) -> Result<Adds> {
        let mut adds = Adds { refused: Vec::new(), refusal: None, room: u64::MAX };
        let batches: Vec<(usize, usize)> =
            (0..which.len()).step_by(ADD_BATCH).map(|first| (first, ADD_BATCH.min(which.len() - first))).collect();
        let mut in_flight: Vec<(usize, usize)> = Vec::new();
        for group in batches.chunks(copy_threads()) {
            if adds.refusal.is_some() {
                // The store was full a moment ago: kept for the retry below.
                adds.refused.extend_from_slice(group);
                continue;
            }
            let files = Self::sealed_batches(src.bytes(), which, group)?;
            let mut sent = Vec::with_capacity(group.len());
            for (&(first, n), file) in group.iter().zip(files) {
                let req = Request::Add { hashes: hashes[first..first + n].to_vec(), pages: file }.send(self.ch());
                if let Err(e) = req {
                    self.drain(in_flight.len() + sent.len());
                    return Err(e);
                }
                sent.push((first, n));
            }
            let landing = std::mem::replace(&mut in_flight, sent);
            self.land_all(src, which, &landing, &mut adds, in_flight.len())?;
        }
        let landing = std::mem::take(&mut in_flight);
        self.land_all(src, which, &landing, &mut adds, 0)?;
        let mut retry = std::mem::take(&mut adds.refused);
        retry.sort_unstable();
        let mut added_after = 0;
        for (first, n) in retry {
            let fits = (adds.room as usize).min(n);
            let mut slots = vec![None; n];
            if fits > 0 {
                let file = Self::sealed_pages(src.bytes(), &which[first..first + fits])?;
                Request::Add { hashes: hashes[first..first + fits].to_vec(), pages: file }.send(self.ch())?;
                let h = self.added(fits)?;
                if let Some(s) = adds.settle((first, fits), h) {
                    slots[..fits].copy_from_slice(&s);
                    added_after += fits;
                }
            }
            self.land(src, which, (first, n), Some(slots))?;
        }
        if let Some(why) = adds.refusal.take_if(|_| added_after > 0) {
            // The refusal told what the store held before the pages that fit were sent
            // again: "it holds 0 bytes" right after this merge filled it.
            let now = self.usage()?;
            adds.refusal = Some(format!(
                "{why} (then {} bytes of this merge fit and were added: the store holds {} bytes now, its limit is \
                 {} bytes)",
                added_after * page_size(),
                now.bytes,
                now.limit_bytes
            ));
        }
        Ok(adds)
    }

    /// Tells `src` where the batch `(first, n)` of `which` landed (`slots`: `None` while
    /// it waits for a retry).
    fn land(
        &self,
        src: &mut dyn Landing,
        which: &[usize],
        (first, n): (usize, usize),
        slots: Option<Vec<Option<u32>>>,
    ) -> Result<()> {
        let Some(slots) = slots else { return Ok(()) };
        // The daemon adopted each page from a file this process wrote from the fenced
        // range, or compared it in full with the equal page it shares.
        let targets: Vec<Option<Target>> = slots.into_iter().map(|s| s.map(Target::Vouched)).collect();
        src.landed(&which[first..first + n], &targets, self.view.map(), &|s| self.view.locate(s))
    }

    /// Reads the answers to the batches `sent` (in order) and lands each; `behind`:
    /// requests sent after them, whose answers are read and dropped if one fails, so
    /// that the next request's answer is its own.
    fn land_all(
        &mut self,
        src: &mut dyn Landing,
        which: &[usize],
        sent: &[(usize, usize)],
        adds: &mut Adds,
        behind: usize,
    ) -> Result<()> {
        for (k, &batch) in sent.iter().enumerate() {
            let landed = self.added(batch.1).and_then(|h| self.land(src, which, batch, adds.settle(batch, h)));
            if let Err(e) = landed {
                self.drain(sent.len() - k - 1 + behind);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reads and drops the answers to `n` requests sent.
    fn drain(&self, n: usize) {
        for _ in 0..n {
            let _ = Reply::recv(self.ch());
        }
    }

    fn ch(&self) -> &Channel {
        self.ch.as_ref().expect("the channel is parked only on drop")
    }
}

impl Backend for Daemon {
    fn intact(&self) -> bool {
        let now = |fd: BorrowedFd<'_>| crate::sys::merge::file_id(fd).ok();
        self.ch.as_ref().is_some_and(|ch| now(ch.as_fd()) == Some(self.ids[0]))
            && now(self.view.store_fd()) == Some(self.ids[1])
    }
    fn hasher(&self) -> &PageHasher {
        &self.hasher
    }
    fn view(&self) -> &StoreMap {
        self.view.map()
    }
    fn locate(&self, s: u32) -> Option<(BorrowedFd<'_>, u64, u32)> {
        self.view.locate(s)
    }
    fn holds_inode(&self, inode: u64) -> bool {
        self.view.holds_inode(inode)
    }
    fn inodes(&self) -> Vec<u64> {
        self.view.inodes().to_vec()
    }
    fn lookup(&mut self, hashes: &[u64], window: Option<u32>) -> Result<Vec<Found>> {
        let window = window.filter(|_| self.windows);
        let mut out = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(MAX_PAGES) {
            Request::Lookup { hashes: chunk.to_vec(), window }.send(self.ch())?;
            let slots = match Reply::recv(self.ch()) {
                Ok(Reply::Slots { slots, segments }) => {
                    self.view.show(segments)?;
                    slots
                }
                Ok(_) => return Err(Error::InvalidArgument { what: "advmd reply", why: "expected slots".into() }),
                Err(e) if window.is_some() && e.to_string().contains("unknown kind") => {
                    // A daemon from before lookup windows: claim all and wait, as it does.
                    self.windows = false;
                    return self.lookup(hashes, None);
                }
                Err(e) => return Err(e),
            };
            count_slots(&slots, chunk.len())?;
            let max = self.view.slots();
            // Slots outside the store read as not stored.
            out.extend(slots.into_iter().map(|x| match x {
                LATER if window.is_some() => Found::Later,
                x if x != NO_SLOT && x < max => Found::Slot(x),
                _ => Found::Add,
            }));
        }
        Ok(out)
    }
    fn add(&mut self, src: &mut dyn Landing, which: &[usize], hashes: &[u64]) -> Result<Option<String>> {
        Ok(self.add_batches(src, which, hashes)?.refusal)
    }
    fn usage(&mut self) -> Result<StoreUsage> {
        Request::Usage.send(self.ch())?;
        match Reply::recv(self.ch())? {
            Reply::Usage(u) => Ok(u),
            _ => Err(Error::InvalidArgument { what: "advmd reply", why: "expected usage".into() }),
        }
    }
    fn trim(&mut self) -> Result<(u64, u64)> {
        Request::Trim.send(self.ch())?;
        match Reply::recv(self.ch()) {
            Ok(Reply::Trimmed { released, kept, forget }) => {
                self.view.forget(&forget)?;
                Ok((released, kept))
            }
            Ok(_) => Err(Error::InvalidArgument { what: "advmd reply", why: "expected a trim's answer".into() }),
            Err(e) if e.to_string().contains("unknown kind") => Err(Error::Unsupported {
                what: "trimming a session's pages",
                why: "this advmd predates trims: it keeps a session's pages until the session ends".into(),
            }),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that answers "later" to every lookup with a window: a daemon that never
    /// lets a merge claim anything.
    struct AlwaysLater {
        store: Local,
        lookups: Vec<Option<u32>>,
    }

    impl Backend for AlwaysLater {
        fn hasher(&self) -> &PageHasher {
            self.store.hasher()
        }
        fn view(&self) -> &StoreMap {
            self.store.view()
        }
        fn locate(&self, s: u32) -> Option<(BorrowedFd<'_>, u64, u32)> {
            self.store.locate(s)
        }
        fn holds_inode(&self, inode: u64) -> bool {
            self.store.holds_inode(inode)
        }
        fn inodes(&self) -> Vec<u64> {
            self.store.inodes()
        }
        fn lookup(&mut self, hashes: &[u64], window: Option<u32>) -> Result<Vec<Found>> {
            self.lookups.push(window);
            match window {
                Some(w) if w > 0 => Ok(vec![Found::Later; hashes.len()]),
                _ => self.store.lookup(hashes, window),
            }
        }
        fn add(&mut self, src: &mut dyn Landing, which: &[usize], hashes: &[u64]) -> Result<Option<String>> {
            self.store.add(src, which, hashes)
        }
        fn usage(&mut self) -> Result<StoreUsage> {
            self.store.usage()
        }
        fn trim(&mut self) -> Result<(u64, u64)> {
            self.store.trim()
        }
    }

    struct Landed {
        bytes: Vec<u8>,
        pages: Vec<usize>,
    }

    impl Landing for Landed {
        fn bytes(&self) -> &[u8] {
            &self.bytes
        }
        fn landed(&mut self, which: &[usize], _: &[Option<Target>], _: &StoreMap, _: Locate<'_>) -> Result<()> {
            self.pages.extend_from_slice(which);
            Ok(())
        }
    }

    #[test]
    fn a_round_that_settles_nothing_is_not_repeated() {
        let mut b = AlwaysLater { store: Local::new(16 << 20).unwrap(), lookups: Vec::new() };
        let ps = page_size();
        let bytes: Vec<u8> = (0..4 * ps).map(|i| (i / ps + 1) as u8).collect();
        let hashes: Vec<u64> = bytes.chunks(ps).map(|p| b.hasher().hash(p)).collect();
        let mut src = Landed { bytes, pages: Vec::new() };
        let r = b.resolve(&mut src, &[0, 1, 2, 3], &hashes, true).unwrap();
        assert_eq!(src.pages, [0, 1, 2, 3], "every page added once the windows gave up");
        assert!(r.found.iter().all(Option::is_none));
        assert_eq!(b.lookups.len(), 2, "one windowed round, then one that claims all: {:?}", b.lookups);
        assert_eq!(b.lookups[1], None);
    }
}
