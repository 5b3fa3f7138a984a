//! The merge service's messages on the [`wire`](crate::wire): what a client asks of
//! `advmd`'s page store for its security domain, and what the daemon answers.

use std::os::fd::OwnedFd;

use super::store::{Piece, SegmentMap, StoreUsage, SECRET_LEN};
use crate::wire::{Channel, Frame, Reader, Writer};
use crate::{Error, Result};

/// The merge service's id in a frame.
pub const SERVICE: u8 = 1;
/// Most pages one lookup or add may name (4 GiB of 4 KiB pages).
pub const MAX_PAGES: usize = 1 << 20;
/// Longest domain tag.
pub const MAX_TAG: usize = 64;
/// Most adopted files one frame announces (the rest go in frames before it).
const SEGMENTS_PER_FRAME: usize = 32;
/// A slot number meaning "not stored" (or "refused: the store is full"): in a lookup's
/// answer, "add it".
pub const NO_SLOT: u32 = u32::MAX;
/// In the answer to a lookup with a window: "not stored, and another session is adding
/// it or it lies past your window: add your window first, then look it up again".
pub const LATER: u32 = u32::MAX - 1;

mod kind {
    pub const ERROR: u8 = 0;
    pub const HELLO: u8 = 1;
    pub const LOOKUP: u8 = 2;
    pub const ADD: u8 = 3;
    pub const USAGE: u8 = 4;
    /// Adopted files announced ahead of a reply that names their slots.
    pub const SEGMENTS: u8 = 5;
    /// A lookup with a window (answered as [`LOOKUP`]).
    pub const LOOKUP_WINDOW: u8 = 6;
    /// A trim, and its answer.
    pub const TRIM: u8 = 7;
}

/// What a client asks.
#[derive(Debug)]
pub enum Request {
    /// Opens the session: the store of the client's uid, or of a narrower `tag` within
    /// it. Must come first.
    Hello {
        /// Narrower domain inside the uid (empty: the uid's own).
        tag: String,
    },
    /// Slots holding pages with these keyed hashes ([`NO_SLOT`] where none); the
    /// client compares the bytes before it maps a slot.
    ///
    /// Without a window, the lookup claims every page it misses (the session will add
    /// them) and waits for pages other sessions of the domain claimed or are adding.
    /// With one, it claims at most `window` of the pages it misses and, when it claimed
    /// any, answers [`LATER`] for the rest instead of waiting: sessions that missed the
    /// same pages at once then add them a window each, side by side, rather than all
    /// waiting for the first. Only a lookup that claimed nothing waits. A window of 0
    /// only looks: it claims nothing, waits for nothing, and answers [`NO_SLOT`] for
    /// every page not stored.
    Lookup {
        /// One hash per page.
        hashes: Vec<u64>,
        /// Most pages the lookup may claim (`None`: all it misses).
        window: Option<u32>,
    },
    /// Stores the pages of `pages`, a memfd the client wrote them into and then sealed
    /// against writing, shrinking, growing and resealing (one page per hash, in
    /// order): the daemon adopts the file into its store without copying it, hashes
    /// the pages itself, and answers one slot per page. An unsealed file is refused.
    Add {
        /// The pages' keyed hashes, in order (one per page): the domain's lookups of
        /// these wait for this add instead of missing. Only that: the daemon files the
        /// pages under the hashes of their bytes.
        hashes: Vec<u64>,
        /// The sealed memfd.
        pages: OwnedFd,
    },
    /// How much the domain's store holds.
    Usage,
    /// Lets go of the session's pages that no process maps any more (its process
    /// unmapped or moved the memory merged onto them, or merged it again onto other
    /// pages). Only between merges: a page handed to a merge that has not mapped it
    /// yet would be let go.
    Trim,
}

/// What the daemon answers.
#[derive(Debug)]
pub enum Reply {
    /// The request was refused; the text says why.
    Error(String),
    /// The session is open on this store.
    Hello {
        /// The store's size and byte limit.
        limit_bytes: u64,
        /// Its hash secret.
        secret: Vec<u8>,
        /// Its memfd, read-only.
        store: OwnedFd,
    },
    /// One slot per page looked up ([`NO_SLOT`]: not stored).
    Slots {
        /// The slots.
        slots: Vec<u32>,
        /// Adopted files holding some of them that the session was not shown yet.
        segments: Vec<SegmentMap>,
    },
    /// One slot per page added ([`NO_SLOT`]: refused), and why any were refused
    /// (empty when none was). An add that does not fit is refused whole.
    Added {
        /// The slots.
        slots: Vec<u32>,
        /// The store's refusal, e.g. that it reached its byte limit.
        refusal: String,
        /// Pages the store has room for now: an add of at most that many would fit.
        room: u64,
        /// Adopted files holding some of the slots that the session was not shown yet
        /// (the add's own file among them).
        segments: Vec<SegmentMap>,
    },
    /// The store's usage.
    Usage(StoreUsage),
    /// What a trim did.
    Trimmed {
        /// Pages the session let go.
        released: u64,
        /// Pages it still holds (some process maps them).
        kept: u64,
        /// Adopted files' pieces the session holds no page of any more: the client
        /// stops showing them (the store may let them go, and reuse their slots); a
        /// later reply that hands out one of their slots announces the file again.
        forget: Vec<Piece>,
    },
}

fn bad(why: String) -> Error {
    Error::InvalidArgument { what: "merge request", why }
}

impl Request {
    /// Sends the request.
    pub fn send(&self, ch: &Channel) -> Result<()> {
        match self {
            Request::Hello { tag } => ch.send(SERVICE, kind::HELLO, &Writer::default().bytes(tag.as_bytes()).body, &[]),
            Request::Lookup { hashes, window: None } => {
                ch.send(SERVICE, kind::LOOKUP, &Writer::default().u64s(hashes).body, &[])
            }
            Request::Lookup { hashes, window: Some(w) } => {
                ch.send(SERVICE, kind::LOOKUP_WINDOW, &Writer::default().u32(*w).u64s(hashes).body, &[])
            }
            Request::Add { hashes, pages } => {
                ch.send(SERVICE, kind::ADD, &Writer::default().u64s(hashes).body, &[pages])
            }
            Request::Usage => ch.send(SERVICE, kind::USAGE, &[], &[]),
            Request::Trim => ch.send(SERVICE, kind::TRIM, &[], &[]),
        }
    }

    /// Decodes a frame of the merge service.
    pub fn decode(mut frame: Frame) -> Result<Self> {
        let mut r = Reader::new(&frame.body);
        let req = match frame.kind {
            kind::HELLO => {
                let tag = r.bytes("tag", MAX_TAG)?;
                let tag = std::str::from_utf8(tag).map_err(|_| bad("the tag is not UTF-8".into()))?;
                Request::Hello { tag: tag.to_string() }
            }
            kind::LOOKUP => Request::Lookup { hashes: r.u64s("hashes", MAX_PAGES)?, window: None },
            kind::LOOKUP_WINDOW => {
                let window = r.u32("window")?;
                Request::Lookup { window: Some(window), hashes: r.u64s("hashes", MAX_PAGES)? }
            }
            kind::ADD => {
                if frame.fds.len() != 1 {
                    return Err(bad(format!("an add passes one sealed memfd, this one {}", frame.fds.len())));
                }
                Request::Add { hashes: r.u64s("hashes", MAX_PAGES)?, pages: frame.fds.remove(0) }
            }
            kind::USAGE => Request::Usage,
            kind::TRIM => Request::Trim,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        r.finish("merge request")?;
        Ok(req)
    }
}

impl Reply {
    /// Sends the reply.
    pub fn send(&self, ch: &Channel) -> Result<()> {
        match self {
            Reply::Error(msg) => ch.send(SERVICE, kind::ERROR, &Writer::default().bytes(msg.as_bytes()).body, &[]),
            Reply::Hello { limit_bytes, secret, store } => {
                ch.send(SERVICE, kind::HELLO, &Writer::default().u64(*limit_bytes).bytes(secret).body, &[store])
            }
            Reply::Slots { slots, segments } => {
                let last = send_segments(ch, segments)?;
                let (w, fds) = with_segments(Writer::default().u32s(slots), last);
                ch.send(SERVICE, kind::LOOKUP, &w.body, &fds)
            }
            Reply::Added { slots, refusal, room, segments } => {
                let last = send_segments(ch, segments)?;
                let w = Writer::default().u32s(slots).bytes(refusal.as_bytes()).u64(*room);
                let (w, fds) = with_segments(w, last);
                ch.send(SERVICE, kind::ADD, &w.body, &fds)
            }
            Reply::Usage(u) => {
                ch.send(SERVICE, kind::USAGE, &Writer::default().u64(u.pages).u64(u.bytes).u64(u.limit_bytes).body, &[])
            }
            Reply::Trimmed { released, kept, forget } => {
                let mut w = Writer::default().u64(*released).u64(*kept).u32(forget.len() as u32);
                for p in forget {
                    w = w.u32(p.slot).u32(p.page).u32(p.pages);
                }
                ch.send(SERVICE, kind::TRIM, &w.body, &[])
            }
        }
    }

    /// Receives a reply; a daemon's error reply becomes an `Err` carrying its text.
    pub fn recv(ch: &Channel) -> Result<Self> {
        let mut segments = Vec::new();
        let mut frame = loop {
            let Some(mut frame) = ch.recv()? else {
                return Err(Error::Disconnected { socket: String::new(), why: "end of stream before a reply".into() });
            };
            if frame.service != SERVICE {
                return Err(bad(format!("reply for service {} on the merge service", frame.service)));
            }
            if frame.kind != kind::SEGMENTS {
                break frame;
            }
            let mut r = Reader::new(&frame.body);
            segments.extend(read_segments(&mut r, &mut frame.fds)?);
            r.finish("segments")?;
        };
        let mut r = Reader::new(&frame.body);
        let reply = match frame.kind {
            kind::ERROR => {
                let msg = String::from_utf8_lossy(r.bytes("error", crate::wire::MAX_FRAME)?).into_owned();
                return Err(Error::DaemonRefused { why: msg });
            }
            kind::HELLO => {
                let limit_bytes = r.u64("limit")?;
                let secret = r.bytes("secret", SECRET_LEN)?.to_vec();
                if frame.fds.is_empty() {
                    return Err(bad("hello reply without the store".into()));
                }
                Reply::Hello { limit_bytes, secret, store: frame.fds.remove(0) }
            }
            kind::LOOKUP => {
                let slots = r.u32s("slots", MAX_PAGES)?;
                segments.extend(read_segments(&mut r, &mut frame.fds)?);
                Reply::Slots { slots, segments }
            }
            kind::ADD => {
                let slots = r.u32s("slots", MAX_PAGES)?;
                let refusal = String::from_utf8_lossy(r.bytes("refusal", 4096)?).into_owned();
                let room = r.u64("room")?;
                segments.extend(read_segments(&mut r, &mut frame.fds)?);
                Reply::Added { slots, refusal, room, segments }
            }
            kind::USAGE => Reply::Usage(StoreUsage {
                pages: r.u64("pages")?,
                bytes: r.u64("bytes")?,
                limit_bytes: r.u64("limit")?,
            }),
            kind::TRIM => {
                let (released, kept) = (r.u64("released")?, r.u64("kept")?);
                let count = r.u32("pieces")? as usize;
                if count > MAX_PAGES {
                    return Err(bad(format!("{count} pieces to forget; at most {MAX_PAGES}")));
                }
                let mut forget = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    forget.push(Piece { slot: r.u32("slot")?, page: r.u32("page")?, pages: r.u32("pages")? });
                }
                Reply::Trimmed { released, kept, forget }
            }
            k => return Err(bad(format!("unknown reply kind {k}"))),
        };
        r.finish("merge reply")?;
        Ok(reply)
    }
}

/// Sends all but the last [`SEGMENTS_PER_FRAME`] of `segments` in frames of their own
/// (a frame carries at most [`crate::wire::MAX_FDS`] fds); returns the rest.
fn send_segments<'a>(ch: &Channel, segments: &'a [SegmentMap]) -> Result<&'a [SegmentMap]> {
    let mut rest = segments;
    while rest.len() > SEGMENTS_PER_FRAME {
        let (now, later) = rest.split_at(SEGMENTS_PER_FRAME);
        let (w, fds) = with_segments(Writer::default(), now);
        ch.send(SERVICE, kind::SEGMENTS, &w.body, &fds)?;
        rest = later;
    }
    Ok(rest)
}

/// Appends `segments` to a body: their count, then per file its pieces as
/// `(slot, page, pages)`; the files ride along as fds, in order.
fn with_segments(mut w: Writer, segments: &[SegmentMap]) -> (Writer, Vec<&dyn std::os::fd::AsFd>) {
    w = w.u32(segments.len() as u32);
    for seg in segments {
        w = w.u32(seg.pieces.len() as u32);
        for p in &seg.pieces {
            w = w.u32(p.slot).u32(p.page).u32(p.pages);
        }
    }
    (w, segments.iter().map(|s| &s.file as &dyn std::os::fd::AsFd).collect())
}

fn read_segments(r: &mut Reader<'_>, fds: &mut Vec<OwnedFd>) -> Result<Vec<SegmentMap>> {
    let n = r.u32("segments")? as usize;
    if n != fds.len() {
        return Err(bad(format!("{n} adopted files announced, {} passed", fds.len())));
    }
    let mut out = Vec::with_capacity(n);
    for file in fds.drain(..) {
        let count = r.u32("pieces")? as usize;
        if count > MAX_PAGES {
            return Err(bad(format!("{count} pieces in one adopted file; at most {MAX_PAGES}")));
        }
        let mut pieces = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            pieces.push(Piece { slot: r.u32("slot")?, page: r.u32("page")?, pages: r.u32("pages")? });
        }
        out.push(SegmentMap { file, pieces });
    }
    Ok(out)
}
