//! [`Store`]: a content-addressed page store in one memfd, and [`PageHasher`], its
//! keyed page hash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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

/// Pages in one memfd, found by keyed hash and compared in full. Slots are written
/// once, before anyone is told of them, and never rewritten while referenced; a slot
/// whose references all went is punched out of the memfd and reused. The memfd is
/// sized to the limit up front (sparse), so clients can map all of it once.
#[derive(Debug)]
pub struct Store {
    memfd: Memfd,
    /// Shared with [`Reserved`], which reads its pages outside the store's lock.
    map: Arc<StoreMap>,
    hasher: PageHasher,
    limit_pages: u32,
    index: Index,
    /// Per slot: its hash (meaningful while `refs > 0` or just inserted) and references.
    slots: Vec<(u64, u32)>,
    free: Vec<u32>,
    used: u32,
    id: (u64, u64),
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
        let mut pending: HashMap<u64, Vec<(usize, u32)>, BuildHasherDefault<KeyAsHash>> = HashMap::default();
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

    /// Takes up to `n` free slots for pages that will arrive from a pipe (see
    /// [`Reserved`]); fewer, and the [`StoreFull`], when the limit comes first. The
    /// slots are nobody's until [`Store::commit`] publishes them or
    /// [`Store::cancel`] gives them back.
    pub fn reserve(&mut self, n: usize) -> Result<(Reserved, Option<StoreFull>)> {
        let mut slots = Vec::with_capacity(n.min(self.limit_pages as usize));
        while slots.len() < n {
            match self.allocate() {
                Some(s) => slots.push(s),
                None => break,
            }
        }
        let full = (slots.len() < n).then(|| self.full());
        match self.memfd.as_fd().try_clone_to_owned() {
            Ok(file) => Ok((
                Reserved { slots, file, view: self.map.clone(), hasher: self.hasher.clone(), hashes: Vec::new() },
                full,
            )),
            Err(e) => {
                self.free.extend(slots);
                Err(Error::Sys(crate::sys::SysError::from_io("dup(store)", &e)))
            }
        }
    }

    /// Publishes the first `filled` reserved slots, each with a reference taken: a
    /// page equal to one stored already (or published earlier in this call) gets that
    /// page's slot instead, and its reserved slot is freed again. Frees the rest.
    /// Returns one slot per filled page. The pages' hashes come from
    /// [`Reserved::fill_from`], which computed them from the store's bytes outside the
    /// store's lock; only pages it did not hash are hashed here.
    pub fn commit(&mut self, r: Reserved, filled: usize) -> Result<Vec<u32>> {
        let ps = page_size();
        let filled = filled.min(r.slots.len());
        let unhashed = &r.slots[r.hashes.len().min(filled)..filled];
        for run in runs(unhashed) {
            // One fault-in per run instead of one per page.
            self.map.populate(run.0 as usize * ps, run.1 * ps)?;
        }
        let mut out = Vec::with_capacity(filled);
        let mut drop_slots = Vec::new();
        for (k, &slot) in r.slots[..filled].iter().enumerate() {
            let p = self.page(slot);
            let hash = r.hashes.get(k).copied().unwrap_or_else(|| self.hasher.hash(p));
            let same = self.index.get(&hash).and_then(|l| l.slots().iter().copied().find(|&s| self.page(s) == p));
            let s = match same {
                Some(s) => {
                    drop_slots.push(slot);
                    s
                }
                None => {
                    self.slots[slot as usize] = (hash, 0);
                    file(&mut self.index, hash, slot);
                    self.used += 1;
                    slot
                }
            };
            self.slots[s as usize].1 += 1;
            out.push(s);
        }
        drop_slots.extend_from_slice(&r.slots[filled..]);
        self.give_back(&drop_slots)?;
        Ok(out)
    }

    /// Gives reserved slots back unused (the pages never came).
    pub fn cancel(&mut self, r: Reserved) -> Result<()> {
        self.give_back(&r.slots)
    }

    /// Punches out and frees slots that were never published.
    fn give_back(&mut self, slots: &[u32]) -> Result<()> {
        let ps = page_size() as u64;
        let mut result = Ok(());
        for run in runs(slots) {
            if let Err(e) = self.memfd.punch_hole(run.0 as u64 * ps, run.1 as u64 * ps) {
                result = Err(e);
            }
        }
        for &s in slots {
            self.slots[s as usize] = (0, 0);
            self.free.push(s);
        }
        result
    }

    fn allocate(&mut self) -> Option<u32> {
        self.free.pop().or_else(|| {
            ((self.slots.len() as u32) < self.limit_pages).then(|| {
                self.slots.push((0, 0));
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
            let ps = page_size() as u64;
            self.memfd.punch_hole(slot as u64 * ps, ps)?;
            self.free.push(slot);
            self.used -= 1;
        }
        Ok(())
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
type Index = HashMap<u64, Filed, BuildHasherDefault<KeyAsHash>>;

/// A u64 key used as its own table hash.
#[derive(Default)]
struct KeyAsHash(u64);

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

/// Slots taken by [`Store::reserve`], to be filled from a pipe outside the store's
/// lock (a slow sender stalls its own session only) and then committed or cancelled.
#[derive(Debug)]
pub struct Reserved {
    slots: Vec<u32>,
    /// The store's memfd, writable: what the pages are spliced into.
    file: OwnedFd,
    /// The store's pages, to hash what arrived while it is still in the cache.
    view: Arc<StoreMap>,
    hasher: PageHasher,
    /// The store's hash of each slot filled so far, in order.
    hashes: Vec<u64>,
}

impl Reserved {
    /// Slots taken.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether none were (the store is full).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Moves `pages` pages from the pipes `pipes` into the reserved slots, in order
    /// (one copy, by `splice`), one thread per pipe: with `n` pipes, pipe `k` carries
    /// pages `k*per..(k+1)*per`, `per` being `pages / n` rounded up (as
    /// [`Request::Add`](super::protocol::Request::Add) says). Each run is hashed as it
    /// lands (the store's own hash of its own bytes: what the sender claimed is not
    /// trusted); pages past the reserved slots are read and dropped. Fails when a pipe
    /// ends early or nothing comes for `timeout`; the caller then cancels.
    pub fn fill_from(&mut self, pipes: &[BorrowedFd<'_>], pages: usize, timeout: std::time::Duration) -> Result<()> {
        if pipes.is_empty() {
            return Err(Error::InvalidArgument { what: "staged pages", why: "no staging pipe".into() });
        }
        for &pipe in pipes {
            if !crate::sys::splice::is_pipe(pipe)? {
                return Err(Error::InvalidArgument {
                    what: "staged pages",
                    why: "the staging descriptor is not a pipe".into(),
                });
            }
        }
        let per = pages.div_ceil(pipes.len());
        let mine = pages.min(self.slots.len());
        let this = &*self;
        let parts: Vec<(BorrowedFd<'_>, &[u32], usize)> = pipes
            .iter()
            .enumerate()
            .map(|(k, &pipe)| {
                let (lo, hi) = ((k * per).min(pages), ((k + 1) * per).min(pages));
                (pipe, &this.slots[lo.min(mine)..hi.min(mine)], hi - lo)
            })
            .collect();
        let hashes = std::thread::scope(|scope| -> Result<Vec<u64>> {
            // The other parts on threads of their own; one that cannot be started is
            // filled here, in its turn.
            let mut spawned: Vec<_> = parts[1..]
                .iter()
                .map(|&part| {
                    std::thread::Builder::new()
                        .name("advm-store-fill".into())
                        .stack_size(64 << 10)
                        .spawn_scoped(scope, move || this.fill_part(part, timeout))
                        .ok()
                })
                .collect();
            let mut out = Vec::with_capacity(mine);
            let mut result = Ok(());
            for (k, &part) in parts.iter().enumerate() {
                let r = match k.checked_sub(1).and_then(|j| spawned[j].take()) {
                    Some(t) => t.join().unwrap_or_else(|_| {
                        Err(Error::InvalidArgument { what: "staged pages", why: "a filling thread panicked".into() })
                    }),
                    None if result.is_ok() => this.fill_part(part, timeout),
                    None => Ok(Vec::new()),
                };
                match r {
                    Ok(h) => out.extend(h),
                    Err(e) => result = result.and(Err(e)),
                }
            }
            result.map(|()| out)
        })?;
        self.hashes = hashes;
        Ok(())
    }

    /// One pipe's share of [`Reserved::fill_from`]: `count` pages, the first into
    /// `slots`, the rest read and dropped. Returns the hashes of the slots filled.
    fn fill_part(
        &self,
        (pipe, slots, count): (BorrowedFd<'_>, &[u32], usize),
        timeout: std::time::Duration,
    ) -> Result<Vec<u64>> {
        let ps = page_size();
        let mut done = 0usize;
        let mut take = |file: Option<BorrowedFd<'_>>, off: u64, n: usize| -> Result<()> {
            let got = crate::sys::splice::receive(pipe, file, off, n * ps, timeout)?;
            if got < n * ps {
                return Err(Error::InvalidArgument {
                    what: "staged pages",
                    why: format!(
                        "the staging pipe ended after {} bytes, {count} pages were announced",
                        done * ps + got
                    ),
                });
            }
            done += n;
            Ok(())
        };
        let mut hashes = Vec::with_capacity(slots.len());
        for (first, n) in runs(slots) {
            take(Some(self.file.as_fd()), first as u64 * ps as u64, n)?;
            let at = first as usize * ps;
            self.view.populate(at, n * ps)?;
            hashes.extend(self.view.read(at, n * ps).chunks_exact(ps).map(|p| self.hasher.hash(p)));
        }
        if count > slots.len() {
            take(None, 0, count - slots.len())?;
        }
        Ok(hashes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Two sessions sending the same pages at once both get slots from reserve; the
    /// second to commit shares the first one's pages and its own slots are freed.
    #[test]
    fn pages_committed_twice_share_one_slot_and_the_spare_slots_are_freed() {
        let ps = page_size();
        let mut store = Store::create("commit-test", 64 * ps as u64).unwrap();
        let pages: Vec<u8> = (0..4 * ps).map(|i| (i / ps + 1) as u8).collect();
        let send = |r: &mut Reserved| {
            let (rd, wr) = crate::sys::splice::pipe().unwrap();
            let (stop, _keep) = crate::sys::splice::pipe().unwrap();
            let data = pages.clone();
            // The pipe refers to the sender's pages: they must outlive the receiving,
            // so the thread hands its buffer back only once it is joined.
            let t = std::thread::spawn(move || {
                crate::sys::splice::send_pages(&[(wr.as_fd(), &[&data])], stop.as_fd(), Duration::from_secs(5))
                    .unwrap();
                data
            });
            r.fill_from(&[rd.as_fd()], 4, Duration::from_secs(5)).unwrap();
            drop(t.join().unwrap());
        };
        let (mut a, _) = store.reserve(4).unwrap();
        let (mut b, _) = store.reserve(4).unwrap();
        send(&mut a);
        send(&mut b);
        let sa = store.commit(a, 4).unwrap();
        let sb = store.commit(b, 4).unwrap();
        assert_eq!(sa, sb, "the second commit shares the first one's slots");
        assert_eq!(store.usage().pages, 4);
        for (k, &s) in sa.iter().enumerate() {
            assert_eq!(store.page(s), &pages[k * ps..(k + 1) * ps]);
        }
        assert_eq!(store.allocated_bytes().unwrap(), 4 * ps as u64, "the spare slots were punched out");
        // A reservation given back leaves nothing behind either.
        let (c, _) = store.reserve(3).unwrap();
        store.cancel(c).unwrap();
        assert_eq!((store.usage().pages, store.allocated_bytes().unwrap()), (4, 4 * ps as u64));
    }
}
