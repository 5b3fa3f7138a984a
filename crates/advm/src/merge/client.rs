//! Where a client's pages go: the domain's store in `advmd`, or a store of this
//! process's own when no daemon answers.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::protocol::{Reply, Request, NO_SLOT};
use super::store::{PageHasher, Store, StoreUsage};
use crate::mem::page_size;
use crate::sys::merge::{self as sys, StoreMap, Target};
use crate::sys::splice;
use crate::wire::Channel;
use crate::{Error, Result};

/// The store a merge talks to.
pub(crate) trait Backend: Send {
    fn hasher(&self) -> &PageHasher;
    /// The store's pages, mapped read-only.
    fn view(&self) -> &StoreMap;
    /// The store's memfd, to map slots from.
    fn store_fd(&self) -> BorrowedFd<'_>;
    /// The store memfd's inode, to recognise ranges already merged.
    fn store_inode(&self) -> u64;
    /// A candidate slot per hash (`None`: not stored).
    fn lookup(&mut self, hashes: &[u64]) -> Result<Vec<Option<u32>>>;
    /// Stores the pages `bytes[i*ps..(i+1)*ps]` for `i` in `which` (`hashes`: theirs,
    /// in order); `None` where the store refused one (full), with the store's reason.
    /// A page the store copied or compared in full comes back [`Target::Vouched`],
    /// one it only found by hash [`Target::Candidate`].
    fn add(&mut self, bytes: &[u8], which: &[usize], hashes: &[u64]) -> Result<(Vec<Option<Target>>, Option<String>)>;
    fn usage(&mut self) -> Result<StoreUsage>;
}

/// A store of this process's own.
pub(crate) struct Local {
    store: Store,
    fd: OwnedFd,
}

impl Local {
    pub(crate) fn new(limit_bytes: u64) -> Result<Self> {
        let store = Store::create("advm-merge-local", limit_bytes)?;
        let fd = store.read_only_fd()?;
        Ok(Self { store, fd })
    }
}

impl Backend for Local {
    fn hasher(&self) -> &PageHasher {
        self.store.hasher()
    }
    fn view(&self) -> &StoreMap {
        self.store.view()
    }
    fn store_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    fn store_inode(&self) -> u64 {
        self.store.file_id().0
    }
    fn lookup(&mut self, hashes: &[u64]) -> Result<Vec<Option<u32>>> {
        Ok(hashes.iter().map(|&h| self.store.find(h)).collect())
    }
    fn add(&mut self, bytes: &[u8], which: &[usize], hashes: &[u64]) -> Result<(Vec<Option<Target>>, Option<String>)> {
        // insert_pages compares every page it shares in full and writes the others.
        let (slots, full) = self.store.insert_pages(bytes, which, hashes)?;
        Ok((slots.into_iter().map(|s| s.map(Target::Vouched)).collect(), full.map(|f| f.to_string())))
    }
    fn usage(&mut self) -> Result<StoreUsage> {
        Ok(self.store.usage())
    }
}

/// A session with `advmd`: the domain's store mapped read-only. New pages travel to
/// the daemon through a pipe (`vmsplice` here, `splice` into the store there: one
/// copy in all).
pub(crate) struct Daemon {
    /// Always `Some` until drop parks it.
    ch: Option<Channel>,
    hasher: PageHasher,
    fd: OwnedFd,
    view: StoreMap,
    inode: u64,
}

impl Daemon {
    pub(crate) fn connect(path: &Path, tag: &str) -> Result<Self> {
        let ch = Channel::connect(path)?;
        Request::Hello { tag: tag.to_string() }.send(&ch)?;
        let Reply::Hello { limit_bytes, secret, store } = Reply::recv(&ch)? else {
            return Err(Error::InvalidArgument { what: "advmd reply", why: "expected the store after hello".into() });
        };
        let view = StoreMap::new(store.as_fd(), limit_bytes as usize)?;
        let inode = sys::file_id(store.as_fd())?.0;
        Ok(Self { ch: Some(ch), hasher: PageHasher::from_secret(&secret)?, fd: store, view, inode })
    }

    /// The slots of a reply about `n` pages; slots outside the store read as none.
    fn check_slots(&self, s: Vec<u32>, n: usize) -> Result<Vec<Option<u32>>> {
        if s.len() != n {
            return Err(Error::InvalidArgument {
                what: "advmd reply",
                why: format!("{} slots for {n} pages", s.len()),
            });
        }
        let max = self.view.len() / page_size();
        Ok(s.into_iter().map(|x| (x != NO_SLOT && (x as usize) < max).then_some(x)).collect())
    }
}

/// Sessions whose clients were dropped. The daemon keeps a session's pages until the
/// connection closes, and this process may still map them (a merged page reads from
/// the store until it is written), so the connection stays open until the process
/// exits (or execs: it is close-on-exec, and exec drops the mappings too).
static PARKED: std::sync::Mutex<Vec<Channel>> = std::sync::Mutex::new(Vec::new());

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(ch) = self.ch.take() {
            PARKED.lock().unwrap_or_else(|p| p.into_inner()).push(ch);
        }
    }
}

/// Pages sent per add batch (8 MiB of 4 KiB pages).
const ADD_BATCH: usize = 2048;
/// Fewest pages per pipe worth a second pipe (and a second copying thread in the
/// daemon): 1 MiB of 4 KiB pages, a pipe's worth.
const PAGES_PER_PIPE: usize = 256;

/// How many pipes an add of `pages` pages goes through: two (the daemon copies with
/// two threads) when there are pages enough and more than one CPU, else one.
fn staging_pipes(pages: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 && pages >= 2 * PAGES_PER_PIPE {
        super::protocol::MAX_STAGING
    } else {
        1
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
/// How long sending pages may wait for the daemon to take some.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Daemon {
    /// Asks the daemon to store the pages `which` and hands them over through pipes
    /// (`vmsplice`): the daemon splices them into its store, a thread per pipe.
    fn send_and_add(
        &mut self,
        bytes: &[u8],
        which: &[usize],
        hashes: Vec<u64>,
        refusal: &mut Option<String>,
    ) -> Result<Vec<Option<u32>>> {
        let ps = page_size();
        if let Some(&last) = which.iter().max().filter(|&&i| (i + 1) * ps > bytes.len()) {
            return Err(Error::InvalidArgument {
                what: "pages to add",
                why: format!("page {last} lies past the {} bytes given", bytes.len()),
            });
        }
        let n_pipes = staging_pipes(which.len());
        // Pipe k carries pages k*per.. of `which` (the split Request::Add documents),
        // as runs consecutive in `bytes`.
        let per = which.len().div_ceil(n_pipes).max(1);
        let parts: Vec<Vec<&[u8]>> = which.chunks(per).map(|part| page_runs(bytes, part)).collect();
        // A pipe per add: whatever an interrupted add left in it goes with it. This end
        // keeps the read sides open too, so a daemon that stops reading never raises
        // SIGPIPE in the client.
        let pipes = (0..parts.len()).map(|_| splice::pipe()).collect::<std::result::Result<Vec<_>, _>>()?;
        let staging =
            pipes.iter().map(|(r, _)| r.try_clone().map_err(|e| Error::io("pipe", e))).collect::<Result<Vec<_>>>()?;
        Request::Add { hashes, staging }.send(self.ch())?;
        let sending: Vec<(BorrowedFd<'_>, &[&[u8]])> =
            pipes.iter().zip(&parts).map(|((_, w), runs)| (w.as_fd(), runs.as_slice())).collect();
        // A daemon that answers before it took every page (an error) ends the sending.
        splice::send_pages(&sending, self.ch().as_fd(), SEND_TIMEOUT)?;
        let Reply::Added { slots, refusal: why } = Reply::recv(self.ch())? else {
            return Err(Error::InvalidArgument { what: "advmd reply", why: "expected added slots".into() });
        };
        drop(pipes);
        let out = self.check_slots(slots, which.len())?;
        if !why.is_empty() {
            *refusal = Some(why);
        }
        Ok(out)
    }

    fn ch(&self) -> &Channel {
        self.ch.as_ref().expect("the channel is parked only on drop")
    }
}

impl Backend for Daemon {
    fn hasher(&self) -> &PageHasher {
        &self.hasher
    }
    fn view(&self) -> &StoreMap {
        &self.view
    }
    fn store_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    fn store_inode(&self) -> u64 {
        self.inode
    }
    fn lookup(&mut self, hashes: &[u64]) -> Result<Vec<Option<u32>>> {
        let mut out = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(super::protocol::MAX_PAGES) {
            Request::Lookup { hashes: chunk.to_vec() }.send(self.ch())?;
            let Reply::Slots(s) = Reply::recv(self.ch())? else {
                return Err(Error::InvalidArgument { what: "advmd reply", why: "expected slots".into() });
            };
            out.extend(self.check_slots(s, chunk.len())?);
        }
        Ok(out)
    }
    fn add(&mut self, bytes: &[u8], which: &[usize], hashes: &[u64]) -> Result<(Vec<Option<Target>>, Option<String>)> {
        let mut out = Vec::with_capacity(which.len());
        let mut refusal = None;
        // In batches: each lands (and wakes the domain's lookups waiting for its
        // pages, which this session's lookup claimed) before the next is sent.
        for (chunk, hashes) in which.chunks(ADD_BATCH).zip(hashes.chunks(ADD_BATCH)) {
            let added = self.send_and_add(bytes, chunk, hashes.to_vec(), &mut refusal)?;
            // The daemon copied each added page from the pipe, or compared it in full
            // with the equal page it shares instead.
            out.extend(added.into_iter().map(|s| s.map(Target::Vouched)));
        }
        Ok((out, refusal))
    }
    fn usage(&mut self) -> Result<StoreUsage> {
        Request::Usage.send(self.ch())?;
        match Reply::recv(self.ch())? {
            Reply::Usage(u) => Ok(u),
            _ => Err(Error::InvalidArgument { what: "advmd reply", why: "expected usage".into() }),
        }
    }
}
