//! The image service: computes each chain's mapping plan once and hands it out, with
//! the layer files and the decompressed-cluster memfd, so a client maps the image in
//! O(extents) without parsing a table or decompressing a cluster.
//!
//! [`Service::handle`] is transport-independent (request in, reply and descriptors
//! out). On the wire it is service [`SERVICE`] of `advmd`'s frames ([`crate::wire`]):
//! an attach request carries the top layer's absolute path, the reply the plan as JSON
//! with the descriptors attached (`SCM_RIGHTS`), or an error text (kind 0).
//! [`serve_connection`] serves one connection without a daemon; [`fetch`] and
//! [`attach`] are the client.
//!
//! A daemon runs as root and opens files for others: a chain is served to a peer only
//! when the peer could read every layer itself (permission bits of each file and search
//! permission on each of its directories, judged by the peer's uid and primary gid;
//! supplementary groups and ACLs are not consulted, so the check errs on refusing),
//! judged before each layer is opened (a refused peer learns nothing of the file) and
//! again on the file opened.
//!
//! A layer whose qcow2 header names an external data file is handed out as that data
//! file (the file its pieces map): the client reads no table.
//!
//! Plans are keyed by every layer's (device, inode, size, ctime), and every external
//! data file's, read when the chain
//! is opened for the request, so a layer rewritten, replaced or touched since is never
//! served from a stale plan, even with its old mtime put back; the plan of the old
//! version is dropped. A layer changed within the last 2 s is not cached at all: a
//! second write within one clock tick would leave its ctime as it was. Nor is a chain
//! with a layer on a block device: written through another node of the same disk, its
//! node's ctime stays as it was.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::space::{layout, LayerFile, Layout, Piece, Source};
use super::{ExtentMap, Image, ImageSpace, MapOptions, MapStats};
use crate::mem::Memfd;
use crate::wire::{Channel, Frame, Peer, Reader, Writer, MAX_FDS, MAX_FRAME};
use crate::{Error, Result};

/// The image service's byte in a frame (the merge service is 1).
pub const SERVICE: u8 = 2;

/// Message kinds of the image service.
pub mod kind {
    /// A reply: the request failed; the body is the reason.
    pub const ERROR: u8 = 0;
    /// A request: attach the chain whose top is the body's path. A reply: its plan.
    pub const ATTACH: u8 = 1;
}

/// Longest path a request may name.
const MAX_PATH: usize = 4096;

/// A request to the service.
#[derive(Debug, Clone)]
pub enum Request {
    /// The plan of the chain whose top is `path` (absolute: the service does not share
    /// the client's working directory).
    Attach {
        /// The top layer.
        path: PathBuf,
    },
}

impl Request {
    /// Reads a request from a frame of this service.
    pub fn decode(frame: &Frame) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument { what: "image service request", why };
        match frame.kind {
            kind::ATTACH => {
                let mut r = Reader::new(&frame.body);
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(r.bytes("path", MAX_PATH)?));
                r.finish("attach request")?;
                if !path.is_absolute() {
                    return Err(bad(format!("{} is not an absolute path", path.display())));
                }
                Ok(Request::Attach { path })
            }
            k => Err(bad(format!("no request of kind {k}"))),
        }
    }

    /// Sends it on `ch`.
    pub fn send(&self, ch: &Channel) -> Result<()> {
        match self {
            Request::Attach { path } => {
                ch.send(SERVICE, kind::ATTACH, &Writer::default().bytes(path.as_os_str().as_bytes()).body, &[])
            }
        }
    }
}

/// One piece of a plan on the wire: guest bytes `[start, end)` and what maps them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct WirePiece {
    start: u64,
    end: u64,
    /// 0 layer file, 1 zeros, 2 memfd at the guest offset, 3 memfd slot.
    kind: u8,
    depth: usize,
    offset: u64,
}

/// The answer to [`Request::Attach`]; the descriptors travel beside it: one per layer
/// (by depth), then the memfd when `memfd` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// Per layer (by depth), the file its pieces map, with its length at planning:
    /// the layer file, or its external data file when it keeps its data in one.
    layers: Vec<(PathBuf, u64)>,
    memfd: bool,
    total: usize,
    stats: MapStats,
    map: ExtentMap,
    pieces: Vec<WirePiece>,
    /// The plan came from the cache (computed for an earlier request).
    pub cached: bool,
}

/// A reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The plan.
    Plan(Plan),
    /// The request failed; the message names the input and the limit.
    Error(String),
}

impl Reply {
    /// Sends it on `ch` with the descriptors the plan names.
    pub fn send(&self, ch: &Channel, fds: &[OwnedFd]) -> Result<()> {
        let fds: Vec<&dyn AsFd> = fds.iter().map(|f| f as &dyn AsFd).collect();
        match self {
            Reply::Plan(plan) => {
                let body = serde_json::to_vec(plan)
                    .map_err(|e| Error::InvalidArgument { what: "image service reply", why: e.to_string() })?;
                if body.len() + 2 > MAX_FRAME {
                    let why = format!("the plan is {} bytes, over the {MAX_FRAME}-byte frame limit", body.len());
                    return Reply::Error(why).send(ch, &[]);
                }
                ch.send(SERVICE, kind::ATTACH, &body, &fds)
            }
            Reply::Error(msg) => ch.send(SERVICE, kind::ERROR, &Writer::default().bytes(msg.as_bytes()).body, &[]),
        }
    }
}

/// A layer's identity: a change of any field means a different layer. Device, inode,
/// size, and the ctime (seconds, nanoseconds): every write, truncate or attribute
/// change sets it to now, and nobody can set it back, where the mtime can be put back
/// (`touch -d`, `cp -p`, `tar -x`) over changed contents.
type LayerKey = (u64, u64, u64, i64, i64);

struct Served {
    image: Image,
    layout: Layout,
}

/// Most plans kept at once. Each keeps its layers open and its decompressed clusters
/// in memory, and any user may have plans made (of images of its own, then deleted):
/// unbounded, they ran the daemon out of descriptors (every client's accept failing)
/// or memory. The least recently served go first; their clients keep what they mapped.
pub const MAX_CACHED_PLANS: usize = 64;
/// Most decompressed bytes (memfds) the kept plans may hold together.
pub const MAX_CACHED_MEMFD_BYTES: u64 = 1 << 30;

/// Kept plans by chain version, each with when it was last served.
#[derive(Default)]
struct Plans {
    by_key: HashMap<Vec<LayerKey>, (Arc<Served>, u64)>,
    clock: u64,
}

impl Plans {
    fn get(&mut self, key: &[LayerKey]) -> Option<Arc<Served>> {
        self.clock += 1;
        let now = self.clock;
        self.by_key.get_mut(key).map(|(s, used)| {
            *used = now;
            s.clone()
        })
    }

    /// Keeps `s` under `key`, dropping the older versions of its chain (same top file)
    /// and then the least recently served plans over the bounds.
    fn keep(&mut self, key: Vec<LayerKey>, s: Arc<Served>) {
        self.by_key.retain(|k, _| (k[0].0, k[0].1) != (key[0].0, key[0].1));
        self.clock += 1;
        self.by_key.insert(key, (s, self.clock));
        let memfd_bytes =
            |p: &HashMap<_, (Arc<Served>, u64)>| -> u64 { p.values().map(|(s, _)| s.layout.stats.memfd_bytes).sum() };
        while self.by_key.len() > MAX_CACHED_PLANS
            || (self.by_key.len() > 1 && memfd_bytes(&self.by_key) > MAX_CACHED_MEMFD_BYTES)
        {
            let Some(oldest) = self.by_key.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) else {
                break;
            };
            self.by_key.remove(&oldest);
        }
    }
}

/// The service's state: one plan per chain version, the most recently served kept.
pub struct Service {
    options: MapOptions,
    plans: Mutex<Plans>,
    computed: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("computed", &self.computed()).finish()
    }
}

/// Every file of the chain: each layer's, and after it its external data file's.
fn files_of(image: &Image) -> impl Iterator<Item = (&Path, &File)> {
    image.layers().iter().flat_map(|l| {
        let data = l.data_file().map(|p| (p, l.data_source().1));
        std::iter::once((l.path(), l.file())).chain(data)
    })
}

/// The key of the chain's version: the top layer's first, then every other file's
/// (layers and external data files: a data file rewritten is a new version too).
fn key_of(image: &Image) -> Result<Vec<LayerKey>> {
    files_of(image)
        .map(|(path, file)| {
            let m = file.metadata().map_err(|e| Error::io(path, e))?;
            Ok((m.dev(), m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
        })
        .collect()
}

/// How recent a layer's ctime may be for its plan to be kept. A ctime is taken from
/// the kernel's coarse clock (one tick, up to 10 ms, behind) and cut to the file
/// system's granularity (1 ns on ext4, xfs, btrfs, tmpfs; 2 s on FAT), so a write
/// just after the key was read can leave the key as it was: the plan of a layer
/// changed this recently is computed for each request until the layer is older.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether every layer's ctime in `key` is at least [`SETTLE`] older than `read_at`,
/// when the key was read: no later write can then leave it unchanged.
fn settled(key: &[LayerKey], read_at: std::time::SystemTime) -> bool {
    let Ok(now) = read_at.duration_since(std::time::UNIX_EPOCH) else { return false };
    let limit = now.saturating_sub(SETTLE);
    key.iter().all(|&(.., sec, nsec)| {
        u64::try_from(sec).is_ok_and(|s| std::time::Duration::new(s, nsec.clamp(0, 999_999_999) as u32) < limit)
    })
}

fn on_block_device(file: &File) -> bool {
    use std::os::unix::fs::FileTypeExt;
    file.metadata().is_ok_and(|m| m.file_type().is_block_device())
}

impl Service {
    /// A service that maps chains under `options` (their `image` part decides which
    /// backing files may be followed).
    pub fn new(options: MapOptions) -> Self {
        Self { options, plans: Mutex::new(Plans::default()), computed: 0.into() }
    }

    /// How many plans were computed (not served from the cache).
    pub fn computed(&self) -> usize {
        self.computed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many plans are kept now (at most [`MAX_CACHED_PLANS`]).
    pub fn kept(&self) -> usize {
        self.plans.lock().expect("no panics under the lock").by_key.len()
    }

    /// Answers one request from `peer` (`None`: a caller of this process, trusted):
    /// the reply and the descriptors to send with it.
    pub fn handle(&self, peer: Option<Peer>, request: &Request) -> (Reply, Vec<OwnedFd>) {
        match request {
            Request::Attach { path } => match self.plan(peer, path) {
                Ok(r) => r,
                Err(e) => (Reply::Error(e.to_string()), Vec::new()),
            },
        }
    }

    fn plan(&self, peer: Option<Peer>, path: &Path) -> Result<(Reply, Vec<OwnedFd>)> {
        let stranger = peer.filter(|p| p.uid != 0);
        let image = match stranger {
            Some(peer) => Image::open_checked(path, &self.options.image, &|p| peer_may_open(peer, p))?,
            None => Image::open_with(path, &self.options.image)?,
        };
        if let Some(peer) = stranger {
            for (path, file) in files_of(&image) {
                peer_may_read(peer, path, file)?;
            }
        }
        let read_at = std::time::SystemTime::now();
        let key = key_of(&image)?;
        // A block device's node keeps its ctime while the disk is written through
        // another node (a partition, a node made with mknod, a loop device's file):
        // its key cannot see a change, so its plan is computed for every request.
        let settled = settled(&key, read_at) && !files_of(&image).any(|(_, f)| on_block_device(f));
        let found = self.plans.lock().expect("no panics under the lock").get(&key);
        let cached = found.is_some();
        let served = match found {
            Some(s) => s,
            None => {
                let layout = layout(&image, &self.options)?;
                self.computed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let s = Arc::new(Served { image, layout });
                if settled {
                    self.plans.lock().expect("no panics under the lock").keep(key, s.clone());
                }
                s
            }
        };
        if served.image.layers().len() + 1 > MAX_FDS {
            return Err(Error::InvalidArgument {
                what: "image service",
                why: format!(
                    "{} layers: one message carries at most {MAX_FDS} descriptors",
                    served.image.layers().len()
                ),
            });
        }
        let l = &served.layout;
        // Per layer, the file its pieces map: the client reads no table, so a layer
        // with an external data file is sent as its data file.
        let mut fds = Vec::new();
        for layer in served.image.layers() {
            let (path, file, _) = layer.data_source();
            fds.push(file.as_fd().try_clone_to_owned().map_err(|e| Error::io(path, e))?);
        }
        if let Some(m) = &l.memfd {
            fds.push(m.as_fd().try_clone_to_owned().map_err(|e| Error::io(path, e))?);
        }
        let pieces = l
            .pieces
            .iter()
            .map(|p| {
                let (kind, depth, offset) = match p.source {
                    Source::File { depth, offset } => (0, depth, offset),
                    Source::Anon => (1, 0, 0),
                    Source::Memfd => (2, 0, 0),
                    Source::Slot { offset } => (3, 0, offset),
                };
                WirePiece { start: p.start, end: p.end, kind, depth, offset }
            })
            .collect();
        let plan = Plan {
            layers: served
                .image
                .layers()
                .iter()
                .map(|x| {
                    let (path, _, len) = x.data_source();
                    (path.to_path_buf(), len)
                })
                .collect(),
            memfd: l.memfd.is_some(),
            total: l.total,
            stats: l.stats.clone(),
            map: l.map.clone(),
            pieces,
            cached,
        };
        Ok((Reply::Plan(plan), fds))
    }
}

/// True when `mode`'s bits for the peer (owner, group or other) include `bit` (4 read,
/// 1 search).
fn allows(peer: Peer, meta: &std::fs::Metadata, bit: u32) -> bool {
    let shift = if meta.uid() == peer.uid {
        6
    } else if meta.gid() == peer.gid {
        3
    } else {
        0
    };
    meta.mode() >> shift & bit != 0
}

/// Refuses unless `peer` may reach `path` (search on each directory as the path names
/// them) and read it, by mode bits: asked before the service looks at or opens the
/// file, so that a peer learns nothing of a file it may not read (its format, size,
/// backing file, or whether it exists) and no device is opened for it.
fn peer_may_open(peer: Peer, path: &Path) -> Result<()> {
    let refuse = |why: String| Error::Image { path: path.to_path_buf(), why };
    let parts: Vec<_> = path.components().collect();
    let mut dir = PathBuf::new();
    for part in &parts[..parts.len().saturating_sub(1)] {
        dir.push(part);
        let m = std::fs::metadata(&dir).map_err(|e| Error::io(&dir, e))?;
        if !allows(peer, &m, 1) {
            return Err(refuse(format!("uid {} may not search {}", peer.uid, dir.display())));
        }
    }
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !allows(peer, &meta, 4) {
        return Err(refuse(format!("uid {} may not read it (mode {:o})", peer.uid, meta.mode() & 0o7777)));
    }
    Ok(())
}

/// Refuses unless `peer` could open `path` (the file the service opened, `file`) for
/// reading itself.
fn peer_may_read(peer: Peer, path: &Path, file: &File) -> Result<()> {
    let refuse = |why: String| Error::Image { path: path.to_path_buf(), why };
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !allows(peer, &meta, 4) {
        return Err(refuse(format!("uid {} may not read it (mode {:o})", peer.uid, meta.mode() & 0o7777)));
    }
    let full = path.canonicalize().map_err(|e| Error::io(path, e))?;
    for dir in full.ancestors().skip(1) {
        let m = std::fs::metadata(dir).map_err(|e| Error::io(dir, e))?;
        if !allows(peer, &m, 1) {
            return Err(refuse(format!("uid {} may not search {}", peer.uid, dir.display())));
        }
    }
    Ok(())
}

/// Serves requests on `ch` until the peer closes it (without a daemon: the peer is this
/// process's, trusted).
pub fn serve_connection(service: &Service, ch: &Channel) -> Result<()> {
    while let Some(frame) = ch.recv()? {
        let (reply, fds) = match Request::decode(&frame) {
            Ok(request) => service.handle(None, &request),
            Err(e) => (Reply::Error(e.to_string()), Vec::new()),
        };
        reply.send(ch, &fds)?;
    }
    Ok(())
}

/// A plan received from the service, with the files it names: what a client maps
/// ([`attach`]) or hands to a VMM ([`PmemBacking::from_service`](super::PmemBacking::from_service)).
pub struct Fetched {
    pub(super) layout: Layout,
    /// Path, file and length at planning, by depth.
    pub(super) layers: Vec<(PathBuf, File, u64)>,
    /// The plan came from the service's cache (computed for an earlier request).
    pub cached: bool,
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched").field("layers", &self.layers).field("cached", &self.cached).finish()
    }
}

/// The layer files as the mapper takes them.
pub(super) fn layer_files(layers: &[(PathBuf, File, u64)]) -> Vec<LayerFile<'_>> {
    layers.iter().map(|(path, file, len)| LayerFile { path, file, len: *len }).collect()
}

/// Asks the service on `ch` for the plan of the chain whose top is `path` (made
/// absolute here) and receives it with its files.
pub fn fetch(ch: &Channel, path: &Path) -> Result<Fetched> {
    let bad = |why: String| Error::Image { path: path.to_path_buf(), why: format!("image service: {why}") };
    let abs = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    // A daemon that stopped, or refused this client (its per-user limit), closes the
    // connection: say that, not the send's "Broken pipe".
    let closed = || {
        bad("advmd closed the connection before replying (it stopped, or refused this client: its log says why)".into())
    };
    let gone = |e: Error| if e.is_disconnect() { closed() } else { e };
    Request::Attach { path: abs }.send(ch).map_err(gone)?;
    let frame = ch.recv().map_err(gone)?.ok_or_else(closed)?;
    if frame.service != SERVICE {
        return Err(bad(format!("a reply for service {}", frame.service)));
    }
    let plan: Plan = match frame.kind {
        kind::ATTACH => {
            serde_json::from_slice(&frame.body).map_err(|e| bad(format!("a plan that does not parse: {e}")))?
        }
        kind::ERROR => {
            let mut r = Reader::new(&frame.body);
            return Err(bad(String::from_utf8_lossy(r.bytes("error", MAX_FRAME)?).into_owned()));
        }
        k => return Err(bad(format!("a reply of kind {k}"))),
    };
    let mut fds = frame.fds;
    let want = plan.layers.len() + usize::from(plan.memfd);
    if fds.len() != want {
        return Err(bad(format!("sent {} descriptors for {want}", fds.len())));
    }
    let memfd = if plan.memfd { fds.pop().map(Memfd::from_owned) } else { None };
    let layers: Vec<(PathBuf, File, u64)> =
        plan.layers.into_iter().zip(fds).map(|((p, len), fd)| (p, File::from(fd), len)).collect();
    let mut pieces = Vec::with_capacity(plan.pieces.len());
    for w in &plan.pieces {
        let source = match w.kind {
            0 if w.depth < layers.len() => Source::File { depth: w.depth, offset: w.offset },
            1 => Source::Anon,
            2 if memfd.is_some() => Source::Memfd,
            3 if memfd.is_some() => Source::Slot { offset: w.offset },
            k => return Err(bad(format!("a piece of kind {k} (layer {}) that the plan cannot have", w.depth))),
        };
        pieces.push(Piece { start: w.start, end: w.end, source });
    }
    let layout = Layout { pieces, memfd, stats: plan.stats, map: plan.map, total: plan.total };
    Ok(Fetched { layout, layers, cached: plan.cached })
}

/// Asks the service on `ch` for the plan of the chain whose top is `path` and maps it
/// (read-write and private when `writable`). Returns the space and whether the plan
/// came from the service's cache.
pub fn attach(ch: &Channel, path: &Path, writable: bool) -> Result<(ImageSpace, bool)> {
    let Fetched { layout, layers, cached } = fetch(ch, path)?;
    Ok((ImageSpace::place(layout, &layer_files(&layers), writable, false)?, cached))
}
