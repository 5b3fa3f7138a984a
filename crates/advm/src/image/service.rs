//! The image service: computes each chain's mapping plan once and hands it out, with
//! the layer files and the decompressed-cluster memfd, so a client maps the image in
//! O(extents) without parsing a table or decompressing a cluster.
//!
//! [`Service::handle`] is transport-independent (request in, reply and descriptors
//! out); [`serve_connection`] and [`attach`] speak it over a UNIX stream socket: a
//! frame is an 8-byte little-endian length with the descriptors attached
//! (`SCM_RIGHTS`), then that many bytes of JSON.
//!
//! Plans are keyed by every layer's (device, inode, size, mtime), read when the chain
//! is opened for the request, so a layer rewritten, replaced or touched since is never
//! served from a stale plan; the plan of the old version is dropped.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::space::{layout, LayerFile, Layout, Piece, Source};
use super::{ExtentMap, Image, ImageSpace, MapOptions, MapStats};
use crate::mem::Memfd;
use crate::sys::fdpass;
use crate::{Error, Result};

/// A request to the service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// The plan of the chain whose top is `path`.
    Attach {
        /// The top layer.
        path: PathBuf,
    },
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// The plan.
    Plan(Plan),
    /// The request failed; the message names the input and the limit.
    Error(String),
}

/// A layer's identity: a change of any field means a different layer.
type LayerKey = (u64, u64, u64, i64, i64);

struct Served {
    image: Image,
    layout: Layout,
}

/// The service's state: one plan per chain version.
pub struct Service {
    options: MapOptions,
    plans: Mutex<HashMap<Vec<LayerKey>, Arc<Served>>>,
    computed: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("computed", &self.computed()).finish()
    }
}

fn key_of(image: &Image) -> Result<Vec<LayerKey>> {
    image
        .layers()
        .iter()
        .map(|l| {
            let m = l.file().metadata().map_err(|e| Error::io(l.path(), e))?;
            Ok((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

impl Service {
    /// A service that maps chains under `options` (their `image` part decides which
    /// backing files may be followed).
    pub fn new(options: MapOptions) -> Self {
        Self { options, plans: Mutex::new(HashMap::new()), computed: 0.into() }
    }

    /// How many plans were computed (not served from the cache).
    pub fn computed(&self) -> usize {
        self.computed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Answers one request: the reply and the descriptors to send with it.
    pub fn handle(&self, request: &Request) -> (Reply, Vec<OwnedFd>) {
        match request {
            Request::Attach { path } => match self.plan(path) {
                Ok(r) => r,
                Err(e) => (Reply::Error(e.to_string()), Vec::new()),
            },
        }
    }

    fn plan(&self, path: &Path) -> Result<(Reply, Vec<OwnedFd>)> {
        let image = Image::open_with(path, &self.options.image)?;
        let key = key_of(&image)?;
        let found = self.plans.lock().expect("no panics under the lock").get(&key).cloned();
        let cached = found.is_some();
        let served = match found {
            Some(s) => s,
            None => {
                let layout = layout(&image, &self.options)?;
                self.computed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let s = Arc::new(Served { image, layout });
                let mut plans = self.plans.lock().expect("no panics under the lock");
                // An older version of this chain (same top file) is dropped.
                plans.retain(|k, _| (k[0].0, k[0].1) != (key[0].0, key[0].1));
                plans.insert(key, s.clone());
                s
            }
        };
        if served.image.layers().len() + 1 > fdpass::MAX_FDS {
            return Err(Error::InvalidArgument {
                what: "image service",
                why: format!(
                    "{} layers: one message carries at most {} descriptors",
                    served.image.layers().len(),
                    fdpass::MAX_FDS
                ),
            });
        }
        let l = &served.layout;
        let mut fds = Vec::new();
        for layer in served.image.layers() {
            fds.push(layer.file().as_fd().try_clone_to_owned().map_err(|e| Error::io(layer.path(), e))?);
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
            layers: served.image.layers().iter().map(|x| (x.path().to_path_buf(), x.file_len())).collect(),
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

fn send_frame(sock: &UnixStream, value: &impl Serialize, fds: &[OwnedFd]) -> Result<()> {
    let body =
        serde_json::to_vec(value).map_err(|e| Error::InvalidArgument { what: "image service", why: e.to_string() })?;
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    fdpass::send_with_fds(sock.as_fd(), &(body.len() as u64).to_le_bytes(), &borrowed)?;
    let mut w = sock;
    w.write_all(&body).map_err(|e| Error::io("image service socket", e))
}

/// Most bytes of one frame (a plan of MAX_EXTENTS extents fits).
const MAX_FRAME: u64 = 1 << 30;

fn recv_frame<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> Result<Option<(T, Vec<OwnedFd>)>> {
    let io = |e: std::io::Error| Error::io("image service socket", e);
    let mut len = [0u8; 8];
    let (n, fds) = fdpass::recv_with_fds(sock.as_fd(), &mut len, fdpass::MAX_FDS)?;
    if n == 0 {
        return Ok(None);
    }
    let mut r = sock;
    r.read_exact(&mut len[n..]).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(Error::InvalidArgument {
            what: "image service frame",
            why: format!("{len} bytes, over {MAX_FRAME}"),
        });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(io)?;
    let value = serde_json::from_slice(&body)
        .map_err(|e| Error::InvalidArgument { what: "image service frame", why: e.to_string() })?;
    Ok(Some((value, fds)))
}

/// Serves requests on `sock` until the peer closes it.
pub fn serve_connection(service: &Service, sock: &UnixStream) -> Result<()> {
    while let Some((request, _)) = recv_frame::<Request>(sock)? {
        let (reply, fds) = service.handle(&request);
        send_frame(sock, &reply, &fds)?;
    }
    Ok(())
}

/// Asks the service on `sock` for the plan of the chain whose top is `path` and maps
/// it (read-write and private when `writable`). Returns the space and whether the plan
/// came from the service's cache.
pub fn attach(sock: &UnixStream, path: &Path, writable: bool) -> Result<(ImageSpace, bool)> {
    send_frame(sock, &Request::Attach { path: path.to_path_buf() }, &[])?;
    let bad = |why: String| Error::Image { path: path.to_path_buf(), why: format!("image service: {why}") };
    let (reply, mut fds) = recv_frame::<Reply>(sock)?.ok_or_else(|| bad("closed the connection".into()))?;
    let plan = match reply {
        Reply::Plan(p) => p,
        Reply::Error(e) => return Err(bad(e)),
    };
    let want = plan.layers.len() + usize::from(plan.memfd);
    if fds.len() != want {
        return Err(bad(format!("sent {} descriptors for {want}", fds.len())));
    }
    let memfd = if plan.memfd { fds.pop().map(Memfd::from_owned) } else { None };
    let files: Vec<File> = fds.into_iter().map(File::from).collect();
    let layers: Vec<LayerFile<'_>> =
        plan.layers.iter().zip(&files).map(|((p, len), file)| LayerFile { path: p, file, len: *len }).collect();
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
    Ok((ImageSpace::place(layout, &layers, writable)?, plan.cached))
}
