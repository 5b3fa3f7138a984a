//! The merge service: one page store per security domain, and the sessions using them.
//!
//! A domain is the client's uid (from `SO_PEERCRED`, never from the request) plus an
//! optional tag that can only narrow it. A session can reach its own domain's store
//! only, so no reply (and no lock it waits on, beyond the brief domain-table lookup at
//! hello) depends on what another domain holds. Every slot a session was handed holds
//! a reference until the session ends, or until a trim finds that no process maps the
//! slot's page any more; a slot left with none is reclaimed. The client asks for a
//! trim of its session between merges; the daemon trims all of a domain's sessions
//! before it refuses an add for the limit, and closed sessions on a timer, leaving
//! alone what a session was handed since its own last trim.
//!
//! Workers of one domain that load the same model at once would each send every page
//! (all their lookups miss before anyone has added). So a lookup that misses a hash
//! *claims* it for its session, and an add names its pages' hashes first; a lookup of
//! a hash another session of the domain has claimed or is adding waits (at most the
//! add timeout) for it to land instead of missing: each page is copied about once,
//! whoever looked first. A lookup claims in one pass under the lock and only then
//! waits, and only for claims made before it, so waits never form a cycle. A claim
//! ends when the session's add of that page lands, at the session's next lookup, or
//! when the session ends. The wait depends on the domain's own sessions only.
//!
//! Waiting for the first session leaves its add to one process while the others idle
//! (16 workers on 2 CPUs: the last waited seconds). So a lookup may carry a window: it
//! claims at most that many of its misses and, having claimed some, answers "later"
//! for the rest (pages past its window, and pages others claimed) instead of waiting;
//! the client adds its window and looks the rest up again. Sessions that missed the
//! same pages at once then add a window each, side by side. A lookup that claimed
//! nothing waits as before; it holds no claims then, so waits still form no cycle.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use advm::merge::protocol::{Reply, Request, LATER, NO_SLOT};
use advm::merge::{PageHashMap, SegmentMap, Store};
use advm::wire::Peer;

use crate::slot_set::SlotSet;

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
    domains: Mutex<HashMap<Domain, Arc<Shared>>>,
    /// Per uid with stores under several tags: bytes its adds in flight reserved.
    reserved: Mutex<HashMap<u32, Arc<Mutex<u64>>>>,
}

/// Bytes of a uid's budget held for one add in flight; given back on drop (the add
/// has landed in its store's usage by then, or was refused).
struct Reservation {
    of: Option<(Arc<Mutex<u64>>, u64)>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((m, bytes)) = &self.of {
            *lock(m) -= bytes;
        }
    }
}

/// One domain's store, and the hashes of pages its sessions are adding right now.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when an add lands (or gives up).
    landed: Condvar,
    /// When the last domain-wide trim began (None: none yet), and whether one runs:
    /// at most one per [`DOMAIN_TRIM_EVERY`] per domain.
    trimmed: Mutex<(Option<Instant>, bool)>,
}

/// Least time between two trims of all of one domain's sessions, run before an add
/// is refused for the domain's limit: each reads every process's maps twice.
pub const DOMAIN_TRIM_EVERY: Duration = Duration::from_secs(1);

/// The references one session holds, kept with its domain's store so that a
/// domain-wide trim can let go of the pages no process maps any more whichever
/// session holds them.
#[derive(Debug)]
struct Holder {
    /// One reference per slot, however often it was handed out.
    held: SlotSet,
    /// Slots handed out since the session's own last trim: its client may be in the
    /// middle of a merge that has not mapped them yet (a merge maps the pages it was
    /// handed after its last add has landed), so only its own trim, which the client
    /// sends between merges, lets them go, or the end of its process.
    fresh: SlotSet,
    /// Its process, for the look at the maps.
    who: advm::process::Mappers,
    /// The connection has closed: nothing more is handed out, so its client shows no
    /// store file it could be handed a reused slot through.
    closed: bool,
}

#[derive(Debug)]
struct State {
    store: Store,
    /// Hash -> adds in flight that carry a page with it.
    adding: PageHashMap<u32>,
    /// Hash -> the session that missed it first and will add it.
    claims: PageHashMap<u64>,
    /// Session id -> the references it holds.
    holders: HashMap<u64, Holder>,
}

impl State {
    /// Records that session `id` holds `slot`, whose reference the store just took:
    /// one reference per session keeps the page for as long as the session needs it,
    /// so one taken again is given back at once.
    fn hold(&mut self, id: u64, slot: u32) {
        let Some(h) = self.holders.get_mut(&id) else {
            // no holder (cannot happen: made at hello): nothing keeps the reference
            let _ = self.store.release(slot);
            return;
        };
        h.fresh.insert(slot);
        if !h.held.insert(slot) {
            // another is held, so this never frees the page
            let _ = self.store.release(slot);
        }
    }

    /// [`State::hold`] for each slot an add handed out.
    fn hold_all(&mut self, id: u64, slots: &[u32]) {
        for &s in slots {
            self.hold(id, s);
        }
    }

    /// Lets go of session `id`'s references in `drop` it still holds (a trim of its
    /// own and a domain-wide one may both have picked a slot); returns how many.
    fn release_held(&mut self, id: u64, drop: &[u32]) -> u64 {
        let Some(h) = self.holders.get_mut(&id) else { return 0 };
        let gone: HashSet<u32> = drop.iter().copied().filter(|&s| h.held.contains(s)).collect();
        if gone.is_empty() {
            return 0;
        }
        let mut kept = SlotSet::default();
        for s in h.held.iter().filter(|s| !gone.contains(s)) {
            kept.insert(s);
        }
        h.held = kept;
        for &s in &gone {
            let _ = self.store.release(s);
        }
        gone.len() as u64
    }

    fn announce(&mut self, hashes: &[u64]) {
        for &h in hashes {
            *self.adding.entry(h).or_default() += 1;
        }
    }

    /// Whether a lookup of `h` by session `me` should wait: another session is adding
    /// it or claimed it.
    fn pending_elsewhere(&self, h: u64, me: u64) -> bool {
        self.adding.contains_key(&h) || self.claims.get(&h).is_some_and(|&s| s != me)
    }

    /// Ends session `me`'s claims among `hashes`.
    fn unclaim(&mut self, me: u64, hashes: &[u64]) {
        for h in hashes {
            if self.claims.get(h) == Some(&me) {
                self.claims.remove(h);
            }
        }
    }

    fn withdraw(&mut self, hashes: &[u64]) {
        for h in hashes {
            if let Some(n) = self.adding.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    self.adding.remove(h);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take every domain down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Stores {
    /// No stores yet; each will hold at most `limit_bytes`.
    pub fn new(limit_bytes: u64) -> Self {
        Self { limit_bytes, domains: Mutex::new(HashMap::new()), reserved: Mutex::new(HashMap::new()) }
    }

    fn open(&self, d: &Domain) -> advm::Result<Arc<Shared>> {
        let mut map = lock(&self.domains);
        if let Some(s) = map.get(d) {
            return Ok(s.clone());
        }
        let store = Store::create(&format!("advmd-store-{}", d.uid), self.limit_bytes)?;
        let s = Arc::new(Shared {
            state: Mutex::new(State {
                store,
                adding: PageHashMap::default(),
                claims: PageHashMap::default(),
                holders: HashMap::new(),
            }),
            landed: Condvar::new(),
            trimmed: Mutex::new((None, false)),
        });
        map.insert(d.clone(), s.clone());
        Ok(s)
    }

    /// Reserves `bytes` for an add to domain `d` within its uid's budget: a tag
    /// narrows the uid's domain and must not widen its budget (with a full limit per
    /// tag, one uid made the daemon hold the limit once per tag it named, its small
    /// adds in the daemon's own memory). A uid with one store is bounded by that
    /// store's limit alone. `Err(bytes held)` when the add does not fit.
    fn reserve(&self, d: &Domain, bytes: u64) -> Result<Reservation, u64> {
        let mine: Vec<Arc<Shared>> =
            lock(&self.domains).iter().filter(|(k, _)| k.uid == d.uid && *k != d).map(|(_, s)| s.clone()).collect();
        if mine.is_empty() {
            return Ok(Reservation { of: None });
        }
        let cell = lock(&self.reserved).entry(d.uid).or_default().clone();
        let mut reserved = lock(&cell);
        let this = lock(&self.domains).get(d).cloned();
        let held: u64 = mine.iter().chain(this.as_ref()).map(|s| lock(&s.state).store.usage().bytes).sum();
        if held + *reserved + bytes > self.limit_bytes {
            return Err(held + *reserved);
        }
        *reserved += bytes;
        drop(reserved);
        Ok(Reservation { of: Some((cell, bytes)) })
    }

    /// Domains with a store, and what each holds.
    pub fn usage(&self) -> Vec<(Domain, advm::merge::StoreUsage)> {
        let map = lock(&self.domains);
        let mut v: Vec<_> = map.iter().map(|(d, s)| (d.clone(), lock(&s.state).store.usage())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// References the sessions of domain `d` hold on its store's pages (`None`: it has
    /// no store).
    pub fn references(&self, d: &Domain) -> Option<u64> {
        let s = lock(&self.domains).get(d).cloned()?;
        let refs = lock(&s.state).store.references();
        Some(refs)
    }

    /// Lets go of the references the sessions of `shared`'s domain hold on pages no
    /// process maps any more, as a session's own trim does, with the same look at the
    /// maps (every process, twice, outside the store's lock). Pages a session was
    /// handed since its own last trim are kept (its merge may not have mapped them
    /// yet), and so are a live session's pages in adopted files (only its own trim can
    /// tell its client to stop showing a file before the file goes); a session whose
    /// process's maps cannot be read keeps all. `closed_only`: only sessions whose
    /// connection has closed. Returns the references let go.
    fn trim_domain(shared: &Shared, closed_only: bool) -> advm::Result<u64> {
        let (files, checks, who) = {
            let g = lock(&shared.state);
            let files = g.store.files()?;
            let mut checks = Vec::new();
            let mut who: Option<advm::process::Mappers> = None;
            for (&id, h) in &g.holders {
                if closed_only && !h.closed {
                    continue;
                }
                let want: HashSet<u32> = h
                    .held
                    .iter()
                    .filter(|&s| !h.fresh.contains(s) && (h.closed || g.store.segment_of(s) == 0))
                    .collect();
                if want.is_empty() || !maps_readable(h.who.pid) {
                    continue;
                }
                // One uid per domain: its processes started since the earliest of the
                // sessions began must all be readable, as for each session's own trim.
                who = Some(match who {
                    None => h.who,
                    Some(w) => advm::process::Mappers { since_ticks: w.since_ticks.min(h.who.since_ticks), ..w },
                });
                checks.push((id, want));
            }
            (files, checks, who)
        };
        let Some(who) = who else { return Ok(0) };
        let mapped =
            advm::merge::mapped_slots(&checks.iter().map(|(_, w)| (&files, w)).collect::<Vec<_>>(), Some(who))?;
        let mut released = 0;
        {
            let mut g = lock(&shared.state);
            for ((id, want), mapped) in checks.iter().zip(mapped) {
                let Some(h) = g.holders.get(id) else { continue };
                // handed out again since the look began: fresh, kept
                let drop: Vec<u32> =
                    want.iter().copied().filter(|&s| !mapped.contains(&s) && !h.fresh.contains(s)).collect();
                released += g.release_held(*id, &drop);
            }
        }
        shared.landed.notify_all();
        Ok(released)
    }

    /// [`Stores::trim_domain`] for an add that would not fit, unless one ran less than
    /// [`DOMAIN_TRIM_EVERY`] ago or runs now (the add then goes on without it).
    fn trim_if_due(shared: &Shared) {
        {
            let mut t = lock(&shared.trimmed);
            if t.1 || t.0.is_some_and(|at| at.elapsed() < DOMAIN_TRIM_EVERY) {
                return;
            }
            *t = (Some(Instant::now()), true);
        }
        /// Ends the running mark however the trim ends (a panic must not stop the
        /// domain's trims for good).
        struct Done<'a>(&'a Mutex<(Option<Instant>, bool)>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                lock(self.0).1 = false;
            }
        }
        let _done = Done(&shared.trimmed);
        // A failed look releases nothing: the add is refused as before.
        let _ = Self::trim_domain(shared, false);
    }

    /// Trims the sessions whose connections have closed while their processes live on,
    /// in every domain, as a client's own trim does (two looks at every process's
    /// maps), but keeping the pages a session was handed since its own last trim;
    /// returns the references let go.
    pub fn trim_closed(&self) -> u64 {
        let all: Vec<Arc<Shared>> = lock(&self.domains).values().cloned().collect();
        all.iter()
            .filter(|s| lock(&s.state).holders.values().any(|h| h.closed && !h.held.is_empty()))
            .map(|s| Self::trim_domain(s, true).unwrap_or(0))
            .sum()
    }

    /// Drops a domain's store when nobody uses it any more.
    fn close(&self, d: &Domain) {
        let mut map = lock(&self.domains);
        if let Some(s) = map.get(d) {
            if Arc::strong_count(s) == 1 && lock(&s.state).store.usage().pages == 0 {
                map.remove(d);
            }
        }
    }
}

/// Whether process `pid`'s maps can be read (or it has gone, mapping nothing).
fn maps_readable(pid: u32) -> bool {
    pid != 0
        && match std::fs::File::open(format!("/proc/{pid}/maps")) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
}

/// One client's session.
#[derive(Debug)]
pub struct Session {
    peer: Peer,
    open: Option<(Domain, Arc<Shared>)>,
    /// This session's id, and the hashes it claimed (some may have ended since).
    id: u64,
    claimed: Vec<u64>,
    /// Adopted files this session was shown (it holds slots in each until it ends).
    shown: HashSet<u64>,
    /// How long a lookup may wait for pages another session is adding.
    timeout: Duration,
    /// An add's pages whose hashes the daemon computes itself: one in this many,
    /// picked at random (1: every page, and the client's hashes are not used).
    hash_check_one_in: usize,
    /// When the session opened, in clock ticks since boot (0: unknown): a process
    /// started before cannot map what it was handed ([`advm::process::Mappers`]).
    started_ticks: u64,
}

fn refused(why: impl Into<String>) -> advm::Error {
    advm::Error::InvalidArgument { what: "merge request", why: why.into() }
}

impl Session {
    /// A session for the client `peer`, whose lookups may wait `timeout` for pages
    /// other sessions are adding, and whose adds' hashes are checked on one page in
    /// `hash_check_one_in` (1: every page hashed by the daemon).
    pub fn new(peer: Peer, timeout: Duration, hash_check_one_in: usize) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            peer,
            open: None,
            id,
            claimed: Vec::new(),
            shown: HashSet::new(),
            timeout,
            hash_check_one_in,
            started_ticks: advm::process::boot_ticks().unwrap_or(0),
        }
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
                let g = lock(&store.state);
                (g.store.read_only_fd()?, g.store.hasher().secret().to_vec(), g.store.file_len())
            };
            let who = self.who();
            let holder = Holder { held: SlotSet::default(), fresh: SlotSet::default(), who, closed: false };
            lock(&store.state).holders.insert(self.id, holder);
            self.open = Some((domain, store));
            return Ok(Reply::Hello { limit_bytes: limit, secret, store: fd });
        }
        let Some((domain, store)) = &self.open else {
            return Err(refused("send hello first"));
        };
        match req {
            Request::Hello { .. } => unreachable!("answered above"),
            Request::Lookup { hashes, window } => {
                let deadline = Instant::now() + self.timeout;
                let mut g = lock(&store.state);
                // A new lookup starts a new merge (or its next window): the last one's
                // claims are over.
                g.unclaim(self.id, &std::mem::take(&mut self.claimed));
                store.landed.notify_all();
                // One pass: stored pages, pages to wait for, and claims on the rest (at
                // most `window` of them).
                let mut slots = vec![NO_SLOT; hashes.len()];
                let mut waits = Vec::new();
                let most = window.map_or(usize::MAX, |w| w as usize);
                let looking_only = most == 0;
                // At once rather than doubling through a large lookup's misses.
                g.claims.reserve(hashes.len().min(most));
                for (k, &h) in hashes.iter().enumerate() {
                    if !looking_only && self.claimed.len() >= most {
                        // The window is full: the rest are looked up next time (a large
                        // merge asks again for what is left after each window).
                        slots[k..].fill(LATER);
                        break;
                    }
                    if let Some(s) = g.store.find(h) {
                        g.hold(self.id, s);
                        slots[k] = s;
                    } else if looking_only {
                        // Not stored: NO_SLOT.
                    } else if g.pending_elsewhere(h, self.id) {
                        waits.push(k);
                    } else if g.claims.insert(h, self.id).is_none() {
                        self.claimed.push(h);
                    }
                }
                if window.is_some() && !self.claimed.is_empty() {
                    // Pages to add now: the others' pages can wait for the next look.
                    for k in waits.drain(..) {
                        slots[k] = LATER;
                    }
                }
                // Then wait for the pages other sessions claimed or are adding.
                for k in waits {
                    let h = hashes[k];
                    loop {
                        if let Some(s) = g.store.find(h) {
                            g.hold(self.id, s);
                            slots[k] = s;
                            break;
                        }
                        let left = deadline.saturating_duration_since(Instant::now());
                        if !g.pending_elsewhere(h, self.id) || left.is_zero() {
                            break;
                        }
                        g = store.landed.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
                    }
                }
                let segments = announce(&mut self.shown, &g.store, &slots)?;
                Ok(Reply::Slots { slots, segments })
            }
            Request::Add { hashes, pages } => {
                let (domain, store) = (domain.clone(), store.clone());
                let bytes = hashes.len() as u64 * advm::mem::page_size() as u64;
                let usage = lock(&store.state).store.usage();
                if usage.bytes + bytes > usage.limit_bytes {
                    // Pages held only by sessions whose processes unmapped them may
                    // make room; refused as before when they do not.
                    Stores::trim_if_due(&store);
                }
                let _reserved = match stores.reserve(&domain, bytes) {
                    Ok(r) => r,
                    Err(held) => {
                        // The session will not add what it claimed: nobody waits for it.
                        lock(&store.state).unclaim(self.id, &std::mem::take(&mut self.claimed));
                        store.landed.notify_all();
                        let limit = stores.limit_bytes;
                        let refusal = format!(
                            "uid {}'s stores hold {held} bytes over all its tags, and {bytes} more would pass the \
                             limit of {limit} bytes, which covers all of a uid's tags",
                            domain.uid
                        );
                        let room = limit.saturating_sub(held) / advm::mem::page_size() as u64;
                        return Ok(Reply::Added {
                            slots: vec![NO_SLOT; hashes.len()],
                            refusal,
                            room,
                            segments: vec![],
                        });
                    }
                };
                self.add(&store, &hashes, pages)
            }
            Request::Usage => Ok(Reply::Usage(lock(&store.state).store.usage())),
            Request::Trim => self.trim(),
        }
    }

    /// Lets go of the slots this session holds that no process maps privately any
    /// more ([`advm::merge::mapped_slots`], outside the store's lock, as for a closed
    /// session), and tells the client which adopted files it no longer needs to show.
    /// Its own requests come one at a time, so no merge of this session is between a
    /// lookup and its mapping now; other sessions hold references of their own.
    fn trim(&mut self) -> advm::Result<Reply> {
        let Some((_, store)) = &self.open else { return Err(refused("send hello first")) };
        let (files, want) = {
            let g = lock(&store.state);
            let want: HashSet<u32> = g.holders.get(&self.id).map(|h| h.held.iter().collect()).unwrap_or_default();
            (g.store.files()?, want)
        };
        let mapped = advm::merge::mapped_slots(&[(&files, &want)], Some(self.who()))?.remove(0);
        let mut forget = Vec::new();
        let (released, kept) = {
            let mut g = lock(&store.state);
            let drop: Vec<u32> = want.iter().copied().filter(|s| !mapped.contains(s)).collect();
            let gone: HashSet<u32> = drop.iter().copied().collect();
            let held: Vec<u32> = match g.holders.get_mut(&self.id) {
                Some(h) => {
                    // Between merges: what it was handed is mapped by now, or never will be.
                    h.fresh = SlotSet::default();
                    h.held.iter().filter(|s| !gone.contains(s)).collect()
                }
                None => Vec::new(),
            };
            let still_shown: HashSet<u64> = held.iter().map(|&s| g.store.segment_of(s)).collect();
            // Files this session holds no page of: the client stops showing them before
            // the store may let them go (their slots then show other pages); told
            // before the release below, which may drop them.
            self.shown.retain(|id| {
                still_shown.contains(id) || {
                    forget.extend_from_slice(g.store.segment_pieces(*id).unwrap_or_default());
                    false
                }
            });
            (g.release_held(self.id, &drop), held.len() as u64)
        };
        store.landed.notify_all();
        Ok(Reply::Trimmed { released, kept, forget })
    }

    /// Who may map what this session was handed.
    fn who(&self) -> advm::process::Mappers {
        advm::process::Mappers {
            pid: u32::try_from(self.peer.pid).unwrap_or(0),
            uid: self.peer.uid,
            since_ticks: self.started_ticks,
        }
    }

    /// Adopts the client's sealed memfd into the store (no copy), checks the client's
    /// hashes on a sample of its pages (or hashes them all) outside the store's lock
    /// (a large add stalls its own session only), then publishes them, sharing any
    /// that are stored already (compared in full).
    fn add(&mut self, shared: &Shared, hashes: &[u64], pages: OwnedFd) -> advm::Result<Reply> {
        let n = hashes.len();
        if n < advm::merge::COPY_BELOW_PAGES {
            return self.add_copied(shared, hashes, pages);
        }
        let adopted = {
            let mut g = lock(&shared.state);
            let a = g.store.adopt(pages, n)?;
            match &a {
                Ok(_) => g.announce(hashes),
                // The session will not add what it claimed: nobody waits for it.
                Err(_) => g.unclaim(self.id, &std::mem::take(&mut self.claimed)),
            }
            a
        };
        let adopting = match adopted {
            Ok(a) => a,
            Err(full) => {
                shared.landed.notify_all();
                let room = (full.limit - full.used) / advm::mem::page_size() as u64;
                return Ok(Reply::Added { slots: vec![NO_SLOT; n], refusal: full.to_string(), room, segments: vec![] });
            }
        };
        // Every page hashed here (one in 1), or the client's hashes checked on a
        // sample and trusted to file the pages: sharing is decided by full compares
        // either way (`Store::commit_adopted`), and the domain's clients hold its key.
        let hashed = if self.hash_check_one_in <= 1 {
            adopting.hashes()
        } else {
            adopting.check_sample(hashes, self.hash_check_one_in).and_then(|checked| {
                checked
                    .map(|()| hashes.to_vec())
                    .map_err(|why| refused(format!("the add's hashes do not match its pages: {why}")))
            })
        };
        let mut g = lock(&shared.state);
        g.withdraw(hashes);
        g.unclaim(self.id, hashes);
        let result = match hashed {
            Ok(h) => g.store.commit_adopted(adopting, &h),
            Err(e) => g.store.cancel_adopted(adopting).and(Err(e)),
        };
        let room = room_pages(&g.store);
        let reply = result.and_then(|slots| {
            g.hold_all(self.id, &slots);
            let segments = announce(&mut self.shown, &g.store, &slots)?;
            Ok(Reply::Added { slots, refusal: String::new(), room, segments })
        });
        drop(g);
        shared.landed.notify_all();
        reply
    }

    /// A small add (see [`advm::merge::COPY_BELOW_PAGES`]): the pages are read from
    /// the client's frozen memfd and hashed here, outside the store's lock, then
    /// copied into the store's own memfd, which every client maps already: no file
    /// for the clients to hold.
    fn add_copied(&mut self, shared: &Shared, hashes: &[u64], pages: OwnedFd) -> advm::Result<Reply> {
        let n = hashes.len();
        let read = advm::merge::read_frozen(pages, n);
        let hasher = lock(&shared.state).store.hasher().clone();
        // Every page is hashed here (cheap at this size): filed under those hashes, and
        // the client's checked against them unless the daemon uses none of them
        // (`hash_check_one_in` 1), as a sampled check of an adopted file would.
        let checked = read.and_then(|bytes| {
            let own: Vec<u64> = bytes.chunks_exact(advm::mem::page_size()).map(|p| hasher.hash(p)).collect();
            match own.iter().zip(hashes).position(|(a, b)| a != b).filter(|_| self.hash_check_one_in > 1) {
                Some(k) => Err(refused(format!(
                    "the add's hashes do not match its pages: page {k}'s hash is not the store's hash of its bytes"
                ))),
                None => Ok((bytes, own)),
            }
        });
        let mut g = lock(&shared.state);
        let inserted = checked.and_then(|(bytes, own)| g.store.insert_copied(&bytes, &own));
        match &inserted {
            // The session will not add what it claimed: nobody waits for it.
            Ok(Err(_)) => g.unclaim(self.id, &std::mem::take(&mut self.claimed)),
            _ => g.unclaim(self.id, hashes),
        }
        let room = room_pages(&g.store);
        let reply = inserted.map(|r| match r {
            Ok(slots) => {
                g.hold_all(self.id, &slots);
                Reply::Added { slots, refusal: String::new(), room, segments: vec![] }
            }
            Err(full) => Reply::Added { slots: vec![NO_SLOT; n], refusal: full.to_string(), room, segments: vec![] },
        });
        drop(g);
        shared.landed.notify_all();
        reply
    }

    /// Whether the session holds references to stored pages.
    pub fn holds_pages(&self) -> bool {
        self.open
            .as_ref()
            .is_some_and(|(_, store)| lock(&store.state).holders.get(&self.id).is_some_and(|h| !h.held.is_empty()))
    }

    /// Ends the session's claims (its connection is gone: it adds nothing more), and
    /// keeps its references.
    pub fn end_claims(&mut self) {
        if let Some((_, store)) = &self.open {
            let mut g = lock(&store.state);
            g.unclaim(self.id, &std::mem::take(&mut self.claimed));
            if let Some(h) = g.holders.get_mut(&self.id) {
                h.closed = true;
            }
            drop(g);
            store.landed.notify_all();
        }
    }

    /// Takes over the references of `other`, a closed session of the same process:
    /// one reference per page keeps the process's mappings valid, so a page both hold
    /// is released once here (a process opening and closing connections in a loop
    /// holds at most one reference per page of its domains). Sessions of different
    /// domains are handed back.
    pub fn absorb(&mut self, mut other: Session, stores: &Stores) -> Option<Session> {
        let same = matches!((&self.open, &other.open), (Some((a, _)), Some((b, _))) if a == b);
        if !same {
            return Some(other);
        }
        if let Some((_, store)) = &self.open {
            let mut g = lock(&store.state);
            if let Some(theirs) = g.holders.remove(&other.id) {
                for s in theirs.held.iter() {
                    let taken = g.holders.get_mut(&self.id).is_some_and(|mine| {
                        if theirs.fresh.contains(s) {
                            mine.fresh.insert(s);
                        }
                        mine.held.insert(s)
                    });
                    if !taken {
                        // held by both: one reference is enough
                        let _ = g.store.release(s);
                    }
                }
            }
        }
        self.shown.extend(other.shown.drain());
        other.end(stores);
        None
    }

    /// Sessions whose processes have exited: releases the references no process maps
    /// any more, and keeps one on each page some process still maps privately (a child
    /// such a process forked lives on with its merged pages: punched and reused, they
    /// would change under it). One look over /proc per uid
    /// ([`advm::merge::mapped_slots`] with the sessions' [`advm::process::Mappers`]),
    /// outside the stores' locks: a process that may map the pages but whose maps
    /// cannot be read here (another user's while the daemon is not root, one that made
    /// itself undumpable) keeps them all, and so does a session whose process was in
    /// another pid namespace (its pid is 0 here: its children cannot be seen at all).
    /// Returns the sessions that still hold pages, to be tried again later; the others
    /// are ended.
    pub fn release_unmapped(sessions: Vec<Session>, stores: &Stores) -> Vec<Session> {
        let mut checks: HashMap<u32, Vec<(Session, advm::merge::StoreFiles, HashSet<u32>)>> = HashMap::new();
        let mut left = Vec::new();
        for s in sessions {
            let looked = match &s.open {
                Some((_, store)) => {
                    let g = lock(&store.state);
                    let want: HashSet<u32> = g.holders.get(&s.id).map(|h| h.held.iter().collect()).unwrap_or_default();
                    (!want.is_empty()).then(|| g.store.files().map(|f| (f, want)))
                }
                None => None,
            };
            match looked {
                None => s.end(stores),
                // unseen processes may map them: keep everything, without a look
                Some(Ok(_)) if s.who().pid == 0 => left.push(s),
                Some(Ok((f, want))) => checks.entry(s.peer.uid).or_default().push((s, f, want)),
                // the files cannot be told: keep everything, try again later
                Some(Err(_)) => left.push(s),
            }
        }
        for group in checks.into_values() {
            let who = group
                .iter()
                .map(|(s, _, _)| s.who())
                .reduce(|a, b| advm::process::Mappers { since_ticks: a.since_ticks.min(b.since_ticks), ..a });
            let Some(who) = who else { continue };
            let found =
                match advm::merge::mapped_slots(&group.iter().map(|(_, f, w)| (f, w)).collect::<Vec<_>>(), Some(who)) {
                    Ok(f) => f,
                    Err(_) => {
                        // /proc cannot be listed, or a possible mapper's maps cannot be
                        // read: keep everything, try again later
                        left.extend(group.into_iter().map(|(s, _, _)| s));
                        continue;
                    }
                };
            for ((s, _, want), mapped) in group.into_iter().zip(found) {
                let Some((_, store)) = &s.open else { continue };
                let empty = {
                    let mut g = lock(&store.state);
                    let drop: Vec<u32> = want.iter().copied().filter(|x| !mapped.contains(x)).collect();
                    g.release_held(s.id, &drop);
                    !g.holders.get(&s.id).is_some_and(|h| !h.held.is_empty())
                };
                store.landed.notify_all();
                if empty {
                    s.end(stores);
                } else {
                    left.push(s);
                }
            }
        }
        left
    }

    /// Releases everything the session held; its domain's store goes when unused.
    pub fn end(self, stores: &Stores) {
        if let Some((domain, store)) = self.open {
            {
                let mut g = lock(&store.state);
                g.unclaim(self.id, &self.claimed);
                if let Some(h) = g.holders.remove(&self.id) {
                    for slot in h.held.iter() {
                        let _ = g.store.release(slot);
                    }
                }
            }
            store.landed.notify_all();
            drop(store);
            stores.close(&domain);
        }
    }
}

/// Pages the store has room for (an add's reply says so, for a retry of what fits).
fn room_pages(store: &Store) -> u64 {
    let u = store.usage();
    (u.limit_bytes - u.bytes) / advm::mem::page_size() as u64
}

/// The adopted files holding `slots` that this session was not shown yet.
fn announce(shown: &mut HashSet<u64>, store: &Store, slots: &[u32]) -> advm::Result<Vec<SegmentMap>> {
    let mut out = Vec::new();
    for &s in slots.iter().filter(|&&s| s != NO_SLOT) {
        let id = store.segment_of(s);
        if id != 0 && !shown.contains(&id) {
            out.push(store.segment_map(id)?);
            shown.insert(id);
        }
    }
    Ok(out)
}
