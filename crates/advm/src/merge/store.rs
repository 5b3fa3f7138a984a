//! [`Store`]: a content-addressed page store (a memfd of its own, plus frozen memfds
//! it adopted), and [`PageHasher`], its keyed page hash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use crate::mem::{page_size, Memfd};
use crate::sys::merge::{self as sys, StoreMap};
use crate::{Error, Result};

/// Bytes of an xxh3 secret (the library's default secret size).
pub const SECRET_LEN: usize = 192;

/// xxh3-64 keyed with a random secret: who does not know the secret cannot build
/// pages that collide on purpose, and two stores' hashes of one page are unrelated.
/// Equal hashes are never trusted alone: pages are compared in full before sharing.
#[derive(Clone)]
pub struct PageHasher {
    secret: [u8; SECRET_LEN],
}

impl std::fmt::Debug for PageHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageHasher(<secret>)")
    }
}

impl PageHasher {
    /// A hasher with a fresh random secret.
    pub fn random() -> Result<Self> {
        let mut secret = [0u8; SECRET_LEN];
        sys::random_bytes(&mut secret)?;
        Ok(Self { secret })
    }

    /// A hasher with the secret a store sent (exactly [`SECRET_LEN`] bytes).
    pub fn from_secret(bytes: &[u8]) -> Result<Self> {
        let secret = bytes.try_into().map_err(|_| Error::InvalidArgument {
            what: "hash secret",
            why: format!("{} bytes, expected {SECRET_LEN}", bytes.len()),
        })?;
        Ok(Self { secret })
    }

    /// The secret, to hand to clients of the same store.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The keyed hash of one page.
    pub fn hash(&self, page: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_secret(page, &self.secret)
    }

    /// The indices of the pages of `bytes` that hold a non-zero byte, and their
    /// hashes, in order. Large ranges are split among up to four threads (as many as
    /// there are CPUs), each taking at least 16 MiB of 4 KiB pages.
    pub fn hash_nonzero(&self, bytes: &[u8]) -> (Vec<usize>, Vec<u64>) {
        let ps = page_size();
        let zero = vec![0u8; ps];
        let parts = crate::threads::in_threads(
            "advm-merge-hash",
            &crate::threads::split(bytes.len() / ps, 4096),
            |&(first, n)| {
                let (mut at, mut hashes) = (Vec::new(), Vec::new());
                for i in first..first + n {
                    let p = &bytes[i * ps..(i + 1) * ps];
                    if p != &zero[..] {
                        at.push(i);
                        hashes.push(self.hash(p));
                    }
                }
                (at, hashes)
            },
        );
        parts.into_iter().fold((Vec::new(), Vec::new()), |(mut at, mut hashes), (a, h)| {
            at.extend(a);
            hashes.extend(h);
            (at, hashes)
        })
    }
}

/// How much a store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreUsage {
    /// Pages stored.
    pub pages: u64,
    /// Bytes stored (pages times the page size).
    pub bytes: u64,
    /// The most bytes it may hold.
    pub limit_bytes: u64,
}

/// Pages found by keyed hash and compared in full, each in a slot. A slot holds a page
/// of the store's own memfd, written once before anyone is told of it and never
/// rewritten while referenced (punched out and reused when its references all went),
/// or a page of a frozen memfd the store adopted ([`Store::adopt`]): such a file is
/// shown at its slots in the store's map, and goes (its slots freed) when none of its
/// pages is referenced any more. The own memfd is sized to the limit up front
/// (sparse), so a client maps all of it once and shows adopted files over it.
#[derive(Debug)]
pub struct Store {
    memfd: Memfd,
    /// Shared with [`Adopting`], which hashes adopted pages outside the store's lock.
    map: Arc<StoreMap>,
    hasher: PageHasher,
    limit_pages: u32,
    index: Index,
    /// Per slot: its hash (meaningful while `refs > 0` or just inserted) and references.
    slots: Vec<(u64, u32)>,
    free: Vec<u32>,
    /// Pages held: the own memfd's published slots and every adopted file's pages.
    used: u32,
    id: (u64, u64),
    /// Per slot: the adopted file it lies in (0: the store's own memfd).
    slot_segment: Vec<u64>,
    /// Adopted files by id (from 1).
    segments: HashMap<u64, Segment>,
    next_segment: u64,
}

/// A frozen memfd adopted as part of a store.
#[derive(Debug)]
struct Segment {
    /// The file, reopened read-only.
    file: OwnedFd,
    /// Where its pages lie among the store's slots.
    pieces: Vec<Piece>,
    /// Its pages still referenced (or not yet published); the file goes at zero.
    live: u32,
    pages: u32,
}

/// Pages `page..page+pages` of an adopted file, shown at slots `slot..slot+pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// First slot.
    pub slot: u32,
    /// First page of the file.
    pub page: u32,
    /// Pages.
    pub pages: u32,
}

/// A file as /proc/PID/maps names it: inode, device major and minor.
type FileKey = (u64, u32, u32);

/// A store's files by `(inode, device major, minor)`, each with where its pages lie
/// among the slots (`None`: the store's own memfd, page = slot). From [`Store::files`].
#[derive(Debug, Clone)]
pub struct StoreFiles {
    files: Vec<(FileKey, Option<Vec<Piece>>)>,
    /// Each file's inode as it shows in a maps line (` 1234 `).
    inodes: Vec<String>,
    limit_pages: u32,
}

/// For each `(files, want)`: the slots of `want` that some process maps privately
/// ([`StoreFiles::mapped_in`] over every process's maps). Every process is looked at
/// twice, one pass after the other, and a slot counts as mapped when either pass saw
/// it: a pass reads each process's maps a piece at a time and the processes one after
/// another, so a mapping moved (`mremap`) from a part not yet read to one already read,
/// or a process forked after the pass listed /proc whose parent then unmapped its
/// copy, is missed by that pass; the next one sees it where it is now. Only a mapping
/// that moves like that during both passes can be missed.
///
/// With `who`, it fails when it cannot read the maps of a live process among them
/// (the client's own, or one of its uid started since: [`crate::process::Mappers`]):
/// such a process may map the pages, and a trim of a live client's pages must not
/// guess. Processes of other uids are taken to map none (a client's children cannot
/// change their uid unless they are root, and `exec` drops their mappings), and so are
/// processes started before (they never had this session's mappings; only one the
/// program handed a store descriptor to could). Without `who`, an unreadable process
/// counts as mapping nothing (the close-time check of a daemon that cannot read its
/// clients' maps; docs/deploy.md).
pub fn mapped_slots(
    checks: &[(&StoreFiles, &std::collections::HashSet<u32>)],
    who: Option<crate::process::Mappers>,
) -> Result<Vec<std::collections::HashSet<u32>>> {
    let mut found = vec![std::collections::HashSet::new(); checks.len()];
    for _pass in 0..2 {
        let each = |maps: &str| {
            for ((files, want), found) in checks.iter().zip(found.iter_mut()) {
                files.mapped_in(maps, want, found);
            }
        };
        let Some(who) = who else {
            crate::process::each_process_maps(each);
            continue;
        };
        let unread = crate::process::each_process_maps_of(who, each)?;
        if let Some(first) = unread.first() {
            let more = match unread.len() {
                1 => String::new(),
                n => format!(" (nor those of {} more)", n - 1),
            };
            return Err(Error::Unsupported {
                what: "trimming merged pages",
                why: format!(
                    "the maps of process {first} cannot be read here{more}, so which pages it maps cannot be told"
                ),
            });
        }
    }
    Ok(found)
}

impl StoreFiles {
    /// Adds to `found` the slots of `want` that the maps text of one process
    /// (/proc/PID/maps) maps privately: a merged page stays mapped in a forked child
    /// after the process that merged it has exited, so its slot must not be punched
    /// and reused under it. Shared mappings (clients' read-only views of the store,
    /// the daemon's own) are not counted. [`crate::process::each_process_maps`] gives
    /// every process's maps, to check many stores in one pass.
    pub fn mapped_in(
        &self,
        maps: &str,
        want: &std::collections::HashSet<u32>,
        found: &mut std::collections::HashSet<u32>,
    ) {
        let ps = page_size() as u64;
        // Most processes map none of the store's files: a substring search for their
        // inodes skips them without parsing a line.
        if !self.inodes.iter().any(|i| maps.contains(i.as_str())) {
            return;
        }
        for line in maps.lines() {
            let Some((len, offset, pieces)) = self.private_mapping(line) else { continue };
            let first = offset / ps;
            for page in first..first + len as u64 / ps {
                if let Some(slot) = self.slot_at(pieces, page) {
                    if want.contains(&slot) {
                        found.insert(slot);
                    }
                }
            }
        }
    }

    /// A private mapping of one of the store's files in a maps line: its length and
    /// file offset in bytes, and the file's pieces (see [`Self::slot_at`]).
    fn private_mapping(&self, line: &str) -> Option<(usize, u64, Option<&[Piece]>)> {
        let (v, _) = crate::sys::procmap::parse_named(line)?;
        if v.shared {
            return None;
        }
        let key = (v.inode, v.dev.0, v.dev.1);
        let pieces = self.files.iter().find(|(k, _)| *k == key)?.1.as_deref();
        Some((v.end.checked_sub(v.start)?, v.offset, pieces))
    }

    /// The slot of page `page` of a file (`None` pieces: the store's own memfd).
    fn slot_at(&self, pieces: Option<&[Piece]>, page: u64) -> Option<u32> {
        match pieces {
            None => (page < self.limit_pages as u64).then_some(page as u32),
            Some(ps) => ps
                .iter()
                .find(|p| (p.page as u64..p.page as u64 + p.pages as u64).contains(&page))
                .map(|p| p.slot + (page - p.page as u64) as u32),
        }
    }
}

/// An adopted file as a client maps it: the file, read-only, and where its pages lie.
#[derive(Debug)]
pub struct SegmentMap {
    /// The file.
    pub file: OwnedFd,
    /// Where its pages lie among the store's slots.
    pub pieces: Vec<Piece>,
}

/// The store had no room for some pages: it holds `used` of `limit` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the page store is full: it holds {used} bytes, its limit is {limit} bytes; new pages were refused")]
pub struct StoreFull {
    /// Bytes held.
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

impl Store {
    /// An empty store of at most `limit_bytes` (rounded down to pages, at least one).
    pub fn create(name: &str, limit_bytes: u64) -> Result<Self> {
        let ps = page_size() as u64;
        let pages = limit_bytes / ps;
        if pages == 0 || pages >= u32::MAX as u64 {
            return Err(Error::InvalidArgument {
                what: "store limit",
                why: format!("{limit_bytes} bytes; it must hold 1 to {} pages of {ps} bytes", u32::MAX - 1),
            });
        }
        let memfd = Memfd::create(name)?;
        memfd.set_len(pages * ps)?;
        sys::owner_read_only(memfd.as_fd())?;
        let map = Arc::new(StoreMap::new(memfd.as_fd(), (pages * ps) as usize)?);
        let id = sys::file_id(memfd.as_fd())?;
        Ok(Self {
            memfd,
            map,
            hasher: PageHasher::random()?,
            limit_pages: pages as u32,
            index: Index::default(),
            slots: Vec::new(),
            free: Vec::new(),
            used: 0,
            id,
            slot_segment: Vec::new(),
            segments: HashMap::new(),
            next_segment: 1,
        })
    }

    /// The store's hash key.
    pub fn hasher(&self) -> &PageHasher {
        &self.hasher
    }

    /// A read-only fd of the store's memfd, to map its pages copy-on-write.
    pub fn read_only_fd(&self) -> Result<OwnedFd> {
        Ok(sys::reopen_read_only(self.memfd.as_fd())?)
    }

    /// The memfd's `(inode, device)`, to recognise mappings of it.
    pub fn file_id(&self) -> (u64, u64) {
        self.id
    }

    /// Whether the store's memfd descriptor still names its file: a program may close
    /// descriptors it did not open and get the number back for a file of its own.
    pub fn intact(&self) -> bool {
        sys::file_id(self.memfd.as_fd()).is_ok_and(|id| id == self.id)
    }

    /// Size of the memfd in bytes (the limit).
    pub fn file_len(&self) -> u64 {
        self.limit_pages as u64 * page_size() as u64
    }

    pub(crate) fn view(&self) -> &StoreMap {
        &self.map
    }

    /// The bytes of `slot`.
    pub fn page(&self, slot: u32) -> &[u8] {
        let ps = page_size();
        self.map.read(slot as usize * ps, ps)
    }

    /// A slot holding a page whose hash is `hash`, taking a reference on it; the
    /// caller compares the bytes before use.
    pub fn find(&mut self, hash: u64) -> Option<u32> {
        let slot = *self.index.get(&hash)?.slots().first()?;
        self.slots[slot as usize].1 += 1;
        Some(slot)
    }

    /// Stores the pages `bytes[i*ps..(i+1)*ps]` for each `i` in `which`, each with a
    /// reference taken: one slot per page, `None` where the store is full (and then
    /// the [`StoreFull`] that says so). Pages equal
    /// to stored ones (or to one earlier in the batch) share its slot; new pages are
    /// written with one `pwrite` per run consecutive in both `bytes` and the store.
    ///
    /// `hashes[k]` is this store's hash of page `which[k]` (the caller hashed it
    /// already; a wrong hash only costs sharing, as pages are compared before use).
    /// `which` must name whole pages inside `bytes`. A failed write (the memory for
    /// the store ran out) undoes the whole batch.
    pub fn insert_pages(
        &mut self,
        bytes: &[u8],
        which: &[usize],
        hashes: &[u64],
    ) -> Result<(Vec<Option<u32>>, Option<StoreFull>)> {
        let ps = page_size();
        if let Some(&bad) = which.iter().find(|&&i| (i + 1) * ps > bytes.len()) {
            return Err(Error::InvalidArgument {
                what: "store pages",
                why: format!("page {bad} lies past the {} bytes given", bytes.len()),
            });
        }
        if hashes.len() != which.len() {
            return Err(Error::InvalidArgument {
                what: "store pages",
                why: format!("{} hashes for {} pages", hashes.len(), which.len()),
            });
        }
        let page = |i: usize| &bytes[i * ps..(i + 1) * ps];
        let mut out = Vec::with_capacity(which.len());
        // (source page, slot) of the pages new to the store, in order.
        let mut fresh: Vec<(usize, u32)> = Vec::new();
        let mut pending: PageHashMap<Vec<(usize, u32)>> = HashMap::default();
        for (&i, &hash) in which.iter().zip(hashes) {
            let p = page(i);
            let stored = self.index.get(&hash).and_then(|l| l.slots().iter().copied().find(|&s| self.page(s) == p));
            let slot = stored
                .or_else(|| pending.get(&hash).and_then(|l| l.iter().find(|&&(j, _)| page(j) == p)).map(|&(_, s)| s));
            let slot = match slot {
                Some(s) => Some(s),
                None => self.allocate().inspect(|&s| {
                    self.slots[s as usize] = (hash, 0);
                    pending.entry(hash).or_default().push((i, s));
                    fresh.push((i, s));
                }),
            };
            if let Some(s) = slot {
                self.slots[s as usize].1 += 1;
            }
            out.push(slot);
        }
        let mut k = 0;
        while k < fresh.len() {
            let (i, s) = fresh[k];
            let mut n = 1;
            while k + n < fresh.len() && fresh[k + n] == (i + n, s + n as u32) {
                n += 1;
            }
            if let Err(e) = self.memfd.write_all_at(&bytes[i * ps..(i + n) * ps], s as u64 * ps as u64) {
                // Nothing was published yet: drop the batch's references and new slots.
                for slot in out.iter().flatten() {
                    self.slots[*slot as usize].1 -= 1;
                }
                for &(_, slot) in &fresh {
                    self.slots[slot as usize] = (0, 0);
                    self.free.push(slot);
                }
                return Err(e);
            }
            k += n;
        }
        for &(_, slot) in &fresh {
            let hash = self.slots[slot as usize].0;
            file(&mut self.index, hash, slot);
            self.used += 1;
        }
        let full = out.iter().any(Option::is_none).then(|| self.full());
        Ok((out, full))
    }

    /// Copies the pages of a small add into the store's own memfd, all or none (the
    /// [`StoreFull`] when they do not fit), each with a reference taken: a page equal
    /// to a stored one (compared in full) shares its slot. `bytes` are whole pages,
    /// `hashes` this store's hash of each (checked by the caller: a wrong one only
    /// costs sharing). What [`Store::adopt`] does without a copy, for adds below
    /// [`COPY_BELOW_PAGES`]: every adopted file costs each client shown it a
    /// descriptor and a mapping for the session's life, so a process merging
    /// thousands of small buffers ran out of descriptors.
    pub fn insert_copied(&mut self, bytes: &[u8], hashes: &[u64]) -> Result<std::result::Result<Vec<u32>, StoreFull>> {
        let pages = bytes.len() / page_size();
        if pages == 0 || bytes.len() % page_size() != 0 {
            return Err(Error::InvalidArgument {
                what: "added pages",
                why: format!("{} bytes are not whole pages (an add of none is refused too)", bytes.len()),
            });
        }
        if pages > (self.limit_pages - self.used) as usize {
            return Ok(Err(self.full()));
        }
        let which: Vec<usize> = (0..pages).collect();
        let (slots, full) = self.insert_pages(bytes, &which, hashes)?;
        debug_assert!(full.is_none(), "room was checked for every page");
        Ok(slots.into_iter().collect::<Option<Vec<u32>>>().ok_or_else(|| self.full()))
    }

    /// Takes over a frozen memfd (see [`crate::merge`]'s adds) of `pages` pages as a
    /// part of the store, without copying them: the file's pages get slots (shown in
    /// the store's map at those slots) and count against the limit, all or none; the
    /// [`StoreFull`] when they do not fit. A file that is not a memfd sealed against
    /// writing, shrinking, growing and resealing, or not exactly `pages` pages long,
    /// is refused. The slots are nobody's until [`Store::commit_adopted`] publishes
    /// them (after [`Adopting::hashes`] hashed them, outside the store's lock) or
    /// [`Store::cancel_adopted`] gives the file back.
    pub fn adopt(&mut self, file: OwnedFd, pages: usize) -> Result<std::result::Result<Adopting, StoreFull>> {
        let ps = page_size();
        check_added(&file, pages)?;
        if pages > (self.limit_pages - self.used) as usize {
            return Ok(Err(self.full()));
        }
        let file = sys::reopen_read_only(file.as_fd())?;
        let mut slots: Vec<u32> = (0..pages).map_while(|_| self.allocate()).collect();
        debug_assert_eq!(slots.len(), pages, "fewer free slots than the limit leaves");
        slots.sort_unstable();
        let mut pieces = Vec::new();
        let mut page = 0u32;
        for (slot, n) in runs(&slots) {
            pieces.push(Piece { slot, page, pages: n as u32 });
            page += n as u32;
        }
        let id = self.next_segment;
        self.next_segment += 1;
        for &s in &slots {
            self.slot_segment[s as usize] = id;
        }
        self.used += pages as u32;
        self.segments.insert(id, Segment { file, pieces, live: pages as u32, pages: pages as u32 });
        let seg = &self.segments[&id];
        let shown = seg.pieces.iter().try_for_each(|p| {
            self.map.map_over(p.slot as usize * ps, p.pages as usize * ps, seg.file.as_fd(), p.page as u64 * ps as u64)
        });
        if let Err(e) = shown {
            self.drop_segment(id)?;
            return Err(e.into());
        }
        let file = match seg.file.try_clone() {
            Ok(f) => f,
            Err(e) => {
                self.drop_segment(id)?;
                return Err(Error::Sys(crate::sys::SysError::from_io("dup(segment)", &e)));
            }
        };
        Ok(Ok(Adopting { id, slots, file, hasher: self.hasher.clone() }))
    }

    /// Publishes the pages of an adopted file, each with a reference taken, under
    /// `hashes` (one per page, in order): a page equal to one stored already (or
    /// earlier in the file) gets that page's slot instead, and its own stays unused
    /// until the whole file goes. Returns one slot per page.
    ///
    /// The hashes may be the sender's ([`Adopting::check_sample`] checked some of
    /// them): they only say where a page is filed. Sharing is decided by comparing
    /// the bytes in full, here and in the client that maps a slot it looked up. When
    /// a hash is filed already but no page under it is equal (distinct pages under
    /// one hash, which honest clients meet once in 2^64), the store hashes the page
    /// and the pages filed there itself and files each under its own hash: a page
    /// filed under a false hash cannot keep an honest page of that hash from being
    /// shared once the honest page is added.
    pub fn commit_adopted(&mut self, a: Adopting, hashes: &[u64]) -> Result<Vec<u32>> {
        if hashes.len() != a.slots.len() {
            self.drop_segment(a.id)?;
            return Err(Error::InvalidArgument {
                what: "adopted pages",
                why: format!("{} hashes for {} pages", hashes.len(), a.slots.len()),
            });
        }
        let mut out = Vec::with_capacity(a.slots.len());
        let mut unused = 0;
        for (&slot, &named) in a.slots.iter().zip(hashes) {
            let p = self.page(slot);
            let mut hash = named;
            let mut equal = self.equal_under(hash, p);
            if equal.is_none() && self.index.contains_key(&hash) {
                self.refile_misfiled(hash);
                hash = self.hasher.hash(self.page(slot));
                equal = self.equal_under(hash, self.page(slot));
            }
            let s = match equal {
                Some(s) => {
                    unused += 1;
                    s
                }
                None => {
                    self.slots[slot as usize] = (hash, 0);
                    file(&mut self.index, hash, slot);
                    slot
                }
            };
            self.slots[s as usize].1 += 1;
            out.push(s);
        }
        self.unreference(a.id, unused)?;
        Ok(out)
    }

    /// A slot filed under `hash` whose page equals `p`.
    fn equal_under(&self, hash: u64, p: &[u8]) -> Option<u32> {
        self.index.get(&hash).and_then(|l| l.slots().iter().copied().find(|&s| self.page(s) == p))
    }

    /// Files every page filed under `hash` whose bytes hash otherwise under its own hash.
    fn refile_misfiled(&mut self, hash: u64) {
        let Some(listed) = self.index.remove(&hash) else { return };
        for s in listed.slots().to_vec() {
            let own = self.hasher.hash(self.page(s));
            self.slots[s as usize].0 = own;
            file(&mut self.index, own, s);
        }
    }

    /// Gives an adopted file back unpublished.
    pub fn cancel_adopted(&mut self, a: Adopting) -> Result<()> {
        self.drop_segment(a.id)
    }

    /// The store's files as private mappings of them show in /proc/PID/maps, to find
    /// which slots some process still maps (see [`StoreFiles::mapped_in`]).
    /// Taken under the store's lock; the scan runs without it.
    pub fn files(&self) -> Result<StoreFiles> {
        let key = |id: (u64, u64)| {
            let (major, minor) = sys::dev_numbers(id.1);
            (id.0, major, minor)
        };
        let mut files = vec![(key(self.id), None)];
        for seg in self.segments.values() {
            files.push((key(sys::file_id(seg.file.as_fd())?), Some(seg.pieces.clone())));
        }
        let inodes = files.iter().map(|((ino, _, _), _)| format!(" {ino} ")).collect();
        Ok(StoreFiles { files, inodes, limit_pages: self.limit_pages })
    }

    /// Where adopted file `id`'s pages lie among the slots (`None`: no such file).
    pub fn segment_pieces(&self, id: u64) -> Option<&[Piece]> {
        self.segments.get(&id).map(|s| &s.pieces[..])
    }

    /// The slots that hold a reference, ascending.
    pub fn referenced_slots(&self) -> Vec<u32> {
        (0..self.slots.len() as u32).filter(|&s| self.slots[s as usize].1 > 0).collect()
    }

    /// Drops every reference to `slot` (a store whose references are all its owner's:
    /// the in-process one); the page is punched out and reused as [`Store::release`]
    /// does at the last reference.
    pub fn release_all(&mut self, slot: u32) -> Result<()> {
        if let Some(refs) = self.slots.get_mut(slot as usize).map(|s| &mut s.1).filter(|r| **r > 1) {
            *refs = 1;
        }
        self.release(slot)
    }

    /// The adopted file `slot` lies in (0: the store's own memfd).
    pub fn segment_of(&self, slot: u32) -> u64 {
        self.slot_segment.get(slot as usize).copied().unwrap_or(0)
    }

    /// What a client needs to show adopted file `id` in its map of the store: the file
    /// (read-only) and where its pages lie.
    pub fn segment_map(&self, id: u64) -> Result<SegmentMap> {
        let seg = self
            .segments
            .get(&id)
            .ok_or_else(|| Error::InvalidArgument { what: "store segment", why: format!("no adopted file {id}") })?;
        let file = seg.file.try_clone().map_err(|e| Error::Sys(crate::sys::SysError::from_io("dup(segment)", &e)))?;
        Ok(SegmentMap { file, pieces: seg.pieces.clone() })
    }

    /// `n` pages of adopted file `id` lost their last reference: the file goes with
    /// its last one.
    fn unreference(&mut self, id: u64, n: u32) -> Result<()> {
        let Some(seg) = self.segments.get_mut(&id) else { return Ok(()) };
        seg.live -= n;
        if seg.live == 0 {
            self.drop_segment(id)?;
        }
        Ok(())
    }

    /// Lets an adopted file go: the store's own (empty) memfd shows at its slots
    /// again, and they are free.
    fn drop_segment(&mut self, id: u64) -> Result<()> {
        let Some(seg) = self.segments.remove(&id) else { return Ok(()) };
        let ps = page_size();
        let mut result = Ok(());
        for p in &seg.pieces {
            let (at, len) = (p.slot as usize * ps, p.pages as usize * ps);
            if let Err(e) = self.map.map_over(at, len, self.memfd.as_fd(), at as u64) {
                result = Err(e.into());
            }
            for s in p.slot..p.slot + p.pages {
                self.slots[s as usize] = (0, 0);
                self.slot_segment[s as usize] = 0;
                self.free.push(s);
            }
        }
        self.used -= seg.pages;
        result
    }

    fn allocate(&mut self) -> Option<u32> {
        self.free.pop().or_else(|| {
            ((self.slots.len() as u32) < self.limit_pages).then(|| {
                self.slots.push((0, 0));
                self.slot_segment.push(0);
                self.slots.len() as u32 - 1
            })
        })
    }

    fn full(&self) -> StoreFull {
        let ps = page_size() as u64;
        StoreFull { used: self.used as u64 * ps, limit: self.limit_pages as u64 * ps }
    }

    /// Drops one reference to `slot`; a slot left without any is punched out and reused.
    pub fn release(&mut self, slot: u32) -> Result<()> {
        let Some(&mut (hash, ref mut refs)) = self.slots.get_mut(slot as usize) else {
            return Err(Error::InvalidArgument { what: "store slot", why: format!("{slot} was never used") });
        };
        if *refs == 0 {
            return Err(Error::InvalidArgument { what: "store slot", why: format!("{slot} holds no reference") });
        }
        *refs -= 1;
        if *refs == 0 {
            let left = match self.index.get_mut(&hash) {
                Some(Filed::More(list)) => {
                    list.retain(|&s| s != slot);
                    list.len()
                }
                Some(Filed::One(s)) if *s != slot => 1,
                _ => 0,
            };
            if left == 0 {
                self.index.remove(&hash);
            }
            match self.slot_segment[slot as usize] {
                0 => {
                    let ps = page_size() as u64;
                    self.memfd.punch_hole(slot as u64 * ps, ps)?;
                    self.free.push(slot);
                    self.used -= 1;
                }
                id => self.unreference(id, 1)?,
            }
        }
        Ok(())
    }

    /// References taken on its pages and not yet released, over all its slots.
    pub fn references(&self) -> u64 {
        self.slots.iter().map(|&(_, refs)| u64::from(refs)).sum()
    }

    /// What the store holds.
    pub fn usage(&self) -> StoreUsage {
        let ps = page_size() as u64;
        StoreUsage { pages: self.used as u64, bytes: self.used as u64 * ps, limit_bytes: self.limit_pages as u64 * ps }
    }

    /// Bytes of memory the memfd actually holds (for tests of reclaim).
    pub fn allocated_bytes(&self) -> Result<u64> {
        self.memfd.allocated_bytes()
    }
}

/// The store's slots by keyed hash. The keys are already uniform (keyed xxh3 of
/// content, computed by the store's owner before filing), so they index the table as
/// they are, without hashing them again; a client only ever names keys to look up.
type Index = PageHashMap<Filed>;

/// A map keyed by a store's page hashes, which index the table as they are (the keys
/// are keyed xxh3 of content, already uniform): for the daemon's tables of hashes in
/// flight, as for the store's own slot index.
/// Every key comes from the domain's own clients, so crafted keys can slow down only
/// their own domain's tables.
pub type PageHashMap<V> = HashMap<u64, V, BuildHasherDefault<KeyAsHash>>;

/// A u64 key used as its own table hash.
#[derive(Default)]
pub struct KeyAsHash(u64);

impl Hasher for KeyAsHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed (write_u64); fold anything else in so it still works.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The slots filed under one hash: one, unless distinct pages share a hash.
#[derive(Debug)]
enum Filed {
    One(u32),
    More(Vec<u32>),
}

impl Filed {
    fn slots(&self) -> &[u32] {
        match self {
            Filed::One(s) => std::slice::from_ref(s),
            Filed::More(v) => v,
        }
    }
}

/// Files `slot` under `hash`, beside any slot filed there already.
fn file(index: &mut Index, hash: u64, slot: u32) {
    match index.get_mut(&hash) {
        None => {
            index.insert(hash, Filed::One(slot));
        }
        Some(Filed::One(s)) => {
            let first = *s;
            index.insert(hash, Filed::More(vec![first, slot]));
        }
        Some(Filed::More(v)) => v.push(slot),
    }
}

/// Adds of fewer pages than this (1 MiB) are copied into the store's own memfd
/// ([`Store::insert_copied`]) rather than adopted ([`Store::adopt`]): the copy costs
/// about 0.1 ms per MiB, and each adopted file costs every client shown it a
/// descriptor and a mapping until its session ends. So adopted files, at least 1 MiB
/// each, cost a client at most 1,024 descriptors per GiB held (64 with full 16 MiB
/// batches), whatever the number of merges.
pub const COPY_BELOW_PAGES: usize = 256;

/// The bytes of a frozen memfd of `pages` pages, refused as [`Store::adopt`] refuses
/// one (not a memfd sealed against writing, shrinking, growing and resealing, or not
/// exactly `pages` pages long). Read with `pread`; no store lock is needed.
pub fn read_frozen(file: OwnedFd, pages: usize) -> Result<Vec<u8>> {
    check_added(&file, pages)?;
    let mut bytes = vec![0u8; pages * page_size()];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::from(file), &mut bytes, 0)
        .map_err(|e| Error::io("the added pages' memfd", e))?;
    Ok(bytes)
}

/// Refuses an add's file unless it holds `pages` pages (at least one) and is a memfd
/// sealed against writing, shrinking, growing and resealing.
fn check_added(file: &OwnedFd, pages: usize) -> Result<()> {
    let refuse = |why: String| Error::InvalidArgument { what: "added pages", why };
    if pages == 0 {
        return Err(refuse("an add of no pages".into()));
    }
    match crate::sys::seal::check_frozen(file, (pages * page_size()) as u64)? {
        Ok(()) => Ok(()),
        Err(why) => Err(refuse(format!("the file passed is refused: {why}"))),
    }
}

/// Runs of consecutive slots: `(first, length)`.
fn runs(slots: &[u32]) -> Vec<(u32, usize)> {
    let mut out: Vec<(u32, usize)> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some((first, n)) if *first as usize + *n == s as usize => *n += 1,
            _ => out.push((s, 1)),
        }
    }
    out
}

/// An adopted file's slots between [`Store::adopt`] and their commit.
#[derive(Debug)]
pub struct Adopting {
    id: u64,
    /// The slots of the file's pages, in page order.
    slots: Vec<u32>,
    /// The file, read-only: hashed by reading it, which maps nothing in the store.
    file: OwnedFd,
    hasher: PageHasher,
}

impl Adopting {
    /// Pages adopted.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are none (never, for an adoption that succeeded).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The store's hash of each page, in order: computed here from the file's own
    /// (frozen) bytes, never taken from whoever sent them. The file is read with
    /// `pread` into a small buffer rather than mapped (no page table entries to set
    /// up and tear down: 40% faster here); several threads share the work when there
    /// are CPUs and pages enough. The store's lock is not needed.
    pub fn hashes(&self) -> Result<Vec<u64>> {
        let parts = crate::threads::split(self.slots.len(), 4096);
        let hashed = crate::threads::in_threads("advm-store-hash", &parts, |&(first, n)| self.hash_pages(first, n));
        Ok(hashed.into_iter().collect::<Result<Vec<_>>>()?.concat())
    }

    /// Checks the sender's hashes of the file's pages (one per page, in order) on a
    /// random sample of one page in each run of `one_in` (1: every page), hashing those pages
    /// itself: `Err` names a page whose hash is not the hash of its bytes. The sender
    /// cannot tell which pages are checked. This catches a client with another key
    /// or a bug, at a small part of the cost of hashing every page; it is not what
    /// keeps sharing safe (see [`Store::commit_adopted`]).
    pub fn check_sample(&self, hashes: &[u64], one_in: usize) -> Result<std::result::Result<(), String>> {
        let n = self.slots.len();
        if hashes.len() != n {
            return Ok(Err(format!("{} hashes for {n} pages", hashes.len())));
        }
        let ps = page_size();
        let mut seed = [0u8; 8];
        sys::random_bytes(&mut seed)?;
        let mut x = u64::from_le_bytes(seed) | 1;
        let mut buf = vec![0u8; ps];
        // One page picked at random in each run of `one_in` pages.
        let one_in = one_in.max(1);
        for first in (0..n).step_by(one_in) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let page = first + (x % one_in.min(n - first) as u64) as usize;
            self.read_pages(page, &mut buf)?;
            if self.hasher.hash(&buf) != hashes[page] {
                return Ok(Err(format!("page {page}'s hash is not the store's hash of its bytes")));
            }
        }
        Ok(Ok(()))
    }

    /// Hashes pages `first..first+count` of the file.
    fn hash_pages(&self, first: usize, count: usize) -> Result<Vec<u64>> {
        const CHUNK: usize = 64;
        let ps = page_size();
        let mut buf = vec![0u8; CHUNK * ps];
        let mut out = Vec::with_capacity(count);
        let mut page = first;
        while page < first + count {
            let n = CHUNK.min(first + count - page);
            self.read_pages(page, &mut buf[..n * ps])?;
            out.extend(buf[..n * ps].chunks_exact(ps).map(|p| self.hasher.hash(p)));
            page += n;
        }
        Ok(out)
    }

    /// Fills `buf` with the file's pages from `first` on.
    fn read_pages(&self, first: usize, buf: &mut [u8]) -> Result<()> {
        let at = (first * page_size()) as u64;
        let mut got = 0;
        while got < buf.len() {
            let r = crate::sys::memfd::pread(&self.file, &mut buf[got..], at + got as u64)?;
            if r == 0 {
                return Err(Error::InvalidArgument {
                    what: "adopted pages",
                    why: format!("the file ended at {} bytes", at + got as u64),
                });
            }
            got += r;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frozen(pages: &[&[u8]]) -> OwnedFd {
        let fd = crate::sys::seal::create("adopt-test").unwrap();
        crate::sys::seal::write_all_at(&fd, pages, 0).unwrap();
        crate::sys::seal::freeze(&fd).unwrap();
        fd
    }

    fn adopt(store: &mut Store, pages: &[&[u8]]) -> Vec<u32> {
        let a = store.adopt(frozen(pages), pages.len()).unwrap().unwrap();
        let h = a.hashes().unwrap();
        store.commit_adopted(a, &h).unwrap()
    }

    /// Hashing split among threads gives what one pass gives: the non-zero pages, in
    /// order, across the parts' borders.
    #[test]
    fn hashing_in_parts_finds_the_same_nonzero_pages_and_hashes_as_one_pass() {
        let ps = page_size();
        let n = 9000;
        let mut bytes = vec![0u8; n * ps];
        for i in (0..n).filter(|i| i % 3 != 0 || *i == 4095 || *i == 4096) {
            bytes[i * ps + i % ps] = (i % 251) as u8 + 1;
        }
        let h = PageHasher::random().unwrap();
        let (at, hashes) = h.hash_nonzero(&bytes);
        let expect: Vec<usize> = (0..n).filter(|i| bytes[i * ps..(i + 1) * ps].iter().any(|&b| b != 0)).collect();
        assert_eq!(at, expect);
        assert_eq!(hashes, expect.iter().map(|&i| h.hash(&bytes[i * ps..(i + 1) * ps])).collect::<Vec<_>>());
    }

    /// Two files holding the same pages: the second one's pages share the first one's
    /// slots, and the second file, referenced by nobody, is let go at once.
    #[test]
    fn pages_adopted_twice_share_one_slot_and_the_unused_file_is_let_go() {
        let ps = page_size();
        let mut store = Store::create("adopt-test", 64 * ps as u64).unwrap();
        let pages: Vec<Vec<u8>> = (0..4).map(|k| vec![k as u8 + 1; ps]).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
        let sa = adopt(&mut store, &refs);
        let sb = adopt(&mut store, &refs);
        assert_eq!(sa, sb, "the second file's pages share the first one's slots");
        assert_eq!((store.usage().pages, store.segments.len()), (4, 1));
        for (k, &s) in sa.iter().enumerate() {
            assert_eq!(store.page(s), &pages[k][..]);
            assert_eq!(store.find(store.hasher().hash(&pages[k])), Some(s));
        }
        // Every reference released (two per page: the adds, one find each): the file goes.
        for &s in sa.iter().chain(&sb).chain(&sa) {
            store.release(s).unwrap();
        }
        assert_eq!((store.usage().pages, store.segments.len()), (0, 0));
        assert!(store.page(sa[0]).iter().all(|&b| b == 0), "the store's own empty memfd shows again");
    }

    /// A page filed under a false hash (a client's hashes are trusted to file pages)
    /// is never shared with a page of other bytes, and once a page whose bytes do
    /// hash so is added, the collision makes the store hash both: each is then filed
    /// under its own hash, and lookups of the true hash find the true page.
    #[test]
    fn a_page_filed_under_a_false_hash_is_refiled_when_the_true_page_comes() {
        let ps = page_size();
        let mut store = Store::create("misfiled", 64 * ps as u64).unwrap();
        let (p, q) = (vec![1u8; ps], vec![2u8; ps]);
        let (hp, hq) = (store.hasher().hash(&p), store.hasher().hash(&q));
        let a = store.adopt(frozen(&[&p]), 1).unwrap().unwrap();
        let liar = store.commit_adopted(a, &[hq]).unwrap()[0];
        assert_eq!(store.find(hq), Some(liar), "filed where the client said");
        let a = store.adopt(frozen(&[&q]), 1).unwrap().unwrap();
        let honest = store.commit_adopted(a, &[hq]).unwrap()[0];
        assert_ne!(honest, liar, "unequal bytes are never shared");
        assert_eq!(store.page(honest), &q[..]);
        assert_eq!(store.find(hq), Some(honest), "the true hash finds the true page");
        assert_eq!(store.find(hp), Some(liar), "the false page is filed under its own hash");
    }

    /// The sampled check passes the sender's true hashes and, checking every page,
    /// names a page whose hash is false.
    #[test]
    fn the_sampled_check_passes_true_hashes_and_names_a_false_one() {
        let ps = page_size();
        let mut store = Store::create("sampled", 64 * ps as u64).unwrap();
        let pages: Vec<Vec<u8>> = (0..8).map(|k| vec![k as u8 + 1; ps]).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
        let mut hashes: Vec<u64> = pages.iter().map(|p| store.hasher().hash(p)).collect();
        let a = store.adopt(frozen(&refs), 8).unwrap().unwrap();
        assert_eq!(a.check_sample(&hashes, 1).unwrap(), Ok(()));
        assert_eq!(a.check_sample(&hashes, 64).unwrap(), Ok(()));
        hashes[5] ^= 1;
        let e = a.check_sample(&hashes, 1).unwrap().unwrap_err();
        assert!(e.contains("page 5"), "{e}");
        assert!(a.check_sample(&hashes[..7], 1).unwrap().is_err(), "one hash short");
        store.cancel_adopted(a).unwrap();
    }

    /// A file that does not fit is refused whole; an unsealed one, or one whose size
    /// is not what the add names, is an error saying why.
    #[test]
    fn adoption_refuses_unsealed_or_missized_files_and_files_past_the_limit() {
        let ps = page_size();
        let mut store = Store::create("adopt-limit", 3 * ps as u64).unwrap();
        let page = vec![9u8; ps];
        let open = crate::sys::seal::create("unsealed").unwrap();
        crate::sys::seal::write_all_at(&open, &[&page], 0).unwrap();
        let e = store.adopt(open, 1).unwrap_err().to_string();
        assert!(e.contains("lacks F_SEAL_WRITE"), "{e}");
        let e = store.adopt(frozen(&[&page, &page]), 1).unwrap_err().to_string();
        assert!(e.contains("holds"), "{e}");
        let other = vec![8u8; ps];
        assert!(
            store.adopt(frozen(&[&page, &other, &page, &other]), 4).unwrap().is_err(),
            "4 pages past a 3-page limit"
        );
        assert_eq!(adopt(&mut store, &[&page, &other]).len(), 2);
        let full = store.adopt(frozen(&[&page, &other]), 2).unwrap().unwrap_err();
        assert_eq!((full.used, full.limit), (2 * ps as u64, 3 * ps as u64));
    }
}
