//! The merge service: one page store per security domain, and the sessions using them.
//!
//! A domain is the client's uid (from `SO_PEERCRED`, never from the request) plus an
//! optional tag that can only narrow it. A session can reach its own domain's store
//! only, so no reply (and no lock it waits on, beyond the brief domain-table lookup at
//! hello) depends on what another domain holds. Every slot a session was handed holds
//! a reference until the session ends; a slot left with none is reclaimed.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use advm::merge::protocol::{Reply, Request, NO_SLOT};
use advm::merge::Store;
use advm::wire::Peer;

/// A security domain: a uid, narrowed by a tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Domain {
    /// The client's uid.
    pub uid: u32,
    /// The narrower tag (empty: the uid's own).
    pub tag: String,
}

/// Every domain's store.
#[derive(Debug)]
pub struct Stores {
    limit_bytes: u64,
    domains: Mutex<HashMap<Domain, Arc<Mutex<Store>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take every domain down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Stores {
    /// No stores yet; each will hold at most `limit_bytes`.
    pub fn new(limit_bytes: u64) -> Self {
        Self { limit_bytes, domains: Mutex::new(HashMap::new()) }
    }

    fn open(&self, d: &Domain) -> advm::Result<Arc<Mutex<Store>>> {
        let mut map = lock(&self.domains);
        if let Some(s) = map.get(d) {
            return Ok(s.clone());
        }
        let s = Arc::new(Mutex::new(Store::create(&format!("advmd-store-{}", d.uid), self.limit_bytes)?));
        map.insert(d.clone(), s.clone());
        Ok(s)
    }

    /// Domains with a store, and what each holds.
    pub fn usage(&self) -> Vec<(Domain, advm::merge::StoreUsage)> {
        let map = lock(&self.domains);
        let mut v: Vec<_> = map.iter().map(|(d, s)| (d.clone(), lock(s).usage())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Drops a domain's store when nobody uses it any more.
    fn close(&self, d: &Domain) {
        let mut map = lock(&self.domains);
        if let Some(s) = map.get(d) {
            if Arc::strong_count(s) == 1 && lock(s).usage().pages == 0 {
                map.remove(d);
            }
        }
    }
}

/// One client's session.
#[derive(Debug)]
pub struct Session {
    peer: Peer,
    open: Option<(Domain, Arc<Mutex<Store>>)>,
    /// One entry per reference this session holds.
    held: Vec<u32>,
    /// How long an add may wait for the client's pages to arrive.
    timeout: Duration,
}

fn refused(why: impl Into<String>) -> advm::Error {
    advm::Error::InvalidArgument { what: "merge request", why: why.into() }
}

impl Session {
    /// A session for the client `peer`, whose adds may wait `timeout` for pages.
    pub fn new(peer: Peer, timeout: Duration) -> Self {
        Self { peer, open: None, held: Vec::new(), timeout }
    }

    /// Answers one request. An `Err` is turned into an error reply by the caller; the
    /// session goes on.
    pub fn handle(&mut self, stores: &Stores, req: Request) -> advm::Result<Reply> {
        if let Request::Hello { tag } = &req {
            if self.open.is_some() {
                return Err(refused("hello twice on one connection"));
            }
            let domain = Domain { uid: self.peer.uid, tag: tag.clone() };
            let store = stores.open(&domain)?;
            let (fd, secret, limit) = {
                let s = lock(&store);
                (s.read_only_fd()?, s.hasher().secret().to_vec(), s.file_len())
            };
            self.open = Some((domain, store));
            return Ok(Reply::Hello { limit_bytes: limit, secret, store: fd });
        }
        let Some((_, store)) = &self.open else {
            return Err(refused("send hello first"));
        };
        match req {
            Request::Hello { .. } => unreachable!("answered above"),
            Request::Lookup { hashes } => {
                let mut s = lock(store);
                let slots: Vec<u32> = hashes
                    .iter()
                    .map(|&h| {
                        let found = s.find(h);
                        self.held.extend(found);
                        found.unwrap_or(NO_SLOT)
                    })
                    .collect();
                Ok(Reply::Slots(slots))
            }
            Request::Add { pages, staging } => {
                let store = store.clone();
                self.add(&store, pages as usize, staging)
            }
            Request::Usage => Ok(Reply::Usage(lock(store).usage())),
        }
    }

    /// Takes slots for the pages, splices them from the client's pipe into the store
    /// (outside the store's lock: a slow or hostile client stalls its own session
    /// only), then publishes them, sharing any that another session stored meanwhile.
    fn add(&mut self, store: &Mutex<Store>, pages: usize, staging: OwnedFd) -> advm::Result<Reply> {
        let (reserved, full) = lock(store).reserve(pages)?;
        if let Err(e) = reserved.fill_from(staging.as_fd(), pages, self.timeout) {
            lock(store).cancel(reserved)?;
            return Err(e);
        }
        let taken = reserved.len();
        let s = lock(store).commit(reserved, taken)?;
        self.held.extend(&s);
        let mut slots = s;
        slots.resize(pages, NO_SLOT);
        Ok(Reply::Added { slots, refusal: full.map(|f| f.to_string()).unwrap_or_default() })
    }

    /// Releases everything the session held; its domain's store goes when unused.
    pub fn end(self, stores: &Stores) {
        if let Some((domain, store)) = self.open {
            {
                let mut s = lock(&store);
                for slot in self.held {
                    let _ = s.release(slot);
                }
            }
            drop(store);
            stores.close(&domain);
        }
    }
}
