//! The merge service's messages on the [`wire`](crate::wire): what a client asks of
//! `advmd`'s page store for its security domain, and what the daemon answers.

use std::os::fd::OwnedFd;

use super::store::{StoreUsage, SECRET_LEN};
use crate::wire::{Channel, Frame, Reader, Writer};
use crate::{Error, Result};

/// The merge service's id in a frame.
pub const SERVICE: u8 = 1;
/// Most pages one lookup or add may name (4 GiB of 4 KiB pages).
pub const MAX_PAGES: usize = 1 << 20;
/// Longest domain tag.
pub const MAX_TAG: usize = 64;
/// Most pipes one add may carry its pages in.
pub const MAX_STAGING: usize = 2;
/// A slot number meaning "not stored" (or "refused: the store is full").
pub const NO_SLOT: u32 = u32::MAX;

mod kind {
    pub const ERROR: u8 = 0;
    pub const HELLO: u8 = 1;
    pub const LOOKUP: u8 = 2;
    pub const ADD: u8 = 3;
    pub const USAGE: u8 = 4;
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
    Lookup {
        /// One hash per page.
        hashes: Vec<u64>,
    },
    /// Stores the pages that the client writes into the pipes `staging` after sending
    /// this (the daemon splices them into its store, one thread per pipe); answers one
    /// slot per page. With `n` pipes, pipe `k` carries pages `k*per..(k+1)*per` (the
    /// last fewer), `per` being the page count divided by `n`, rounded up.
    Add {
        /// The pages' keyed hashes, in order (one per page): the domain's lookups of
        /// these wait for this add instead of missing.
        hashes: Vec<u64>,
        /// The read ends of 1 to [`MAX_STAGING`] pipes carrying them.
        staging: Vec<OwnedFd>,
    },
    /// How much the domain's store holds.
    Usage,
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
    Slots(Vec<u32>),
    /// One slot per page added ([`NO_SLOT`]: refused), and why any were refused
    /// (empty when none was).
    Added {
        /// The slots.
        slots: Vec<u32>,
        /// The store's refusal, e.g. that it reached its byte limit.
        refusal: String,
    },
    /// The store's usage.
    Usage(StoreUsage),
}

fn bad(why: String) -> Error {
    Error::InvalidArgument { what: "merge request", why }
}

impl Request {
    /// Sends the request.
    pub fn send(&self, ch: &Channel) -> Result<()> {
        match self {
            Request::Hello { tag } => ch.send(SERVICE, kind::HELLO, &Writer::default().bytes(tag.as_bytes()).body, &[]),
            Request::Lookup { hashes } => ch.send(SERVICE, kind::LOOKUP, &Writer::default().u64s(hashes).body, &[]),
            Request::Add { hashes, staging } => {
                let fds: Vec<&dyn std::os::fd::AsFd> = staging.iter().map(|f| f as &dyn std::os::fd::AsFd).collect();
                ch.send(SERVICE, kind::ADD, &Writer::default().u64s(hashes).body, &fds)
            }
            Request::Usage => ch.send(SERVICE, kind::USAGE, &[], &[]),
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
            kind::LOOKUP => Request::Lookup { hashes: r.u64s("hashes", MAX_PAGES)? },
            kind::ADD => {
                if frame.fds.is_empty() {
                    return Err(bad("add without a staging pipe".into()));
                }
                if frame.fds.len() > MAX_STAGING {
                    return Err(bad(format!("an add with {} pipes; at most {MAX_STAGING}", frame.fds.len())));
                }
                Request::Add { hashes: r.u64s("hashes", MAX_PAGES)?, staging: std::mem::take(&mut frame.fds) }
            }
            kind::USAGE => Request::Usage,
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
            Reply::Slots(s) => ch.send(SERVICE, kind::LOOKUP, &Writer::default().u32s(s).body, &[]),
            Reply::Added { slots, refusal } => {
                ch.send(SERVICE, kind::ADD, &Writer::default().u32s(slots).bytes(refusal.as_bytes()).body, &[])
            }
            Reply::Usage(u) => {
                ch.send(SERVICE, kind::USAGE, &Writer::default().u64(u.pages).u64(u.bytes).u64(u.limit_bytes).body, &[])
            }
        }
    }

    /// Receives a reply; a daemon's error reply becomes an `Err` carrying its text.
    pub fn recv(ch: &Channel) -> Result<Self> {
        let Some(mut frame) = ch.recv()? else {
            return Err(bad("advmd closed the connection".into()));
        };
        if frame.service != SERVICE {
            return Err(bad(format!("reply for service {} on the merge service", frame.service)));
        }
        let mut r = Reader::new(&frame.body);
        let reply = match frame.kind {
            kind::ERROR => {
                let msg = String::from_utf8_lossy(r.bytes("error", crate::wire::MAX_FRAME)?).into_owned();
                return Err(Error::InvalidArgument { what: "merge request (advmd refused it)", why: msg });
            }
            kind::HELLO => {
                let limit_bytes = r.u64("limit")?;
                let secret = r.bytes("secret", SECRET_LEN)?.to_vec();
                if frame.fds.is_empty() {
                    return Err(bad("hello reply without the store".into()));
                }
                Reply::Hello { limit_bytes, secret, store: frame.fds.remove(0) }
            }
            kind::LOOKUP => Reply::Slots(r.u32s("slots", MAX_PAGES)?),
            kind::ADD => Reply::Added {
                slots: r.u32s("slots", MAX_PAGES)?,
                refusal: String::from_utf8_lossy(r.bytes("refusal", 4096)?).into_owned(),
            },
            kind::USAGE => Reply::Usage(StoreUsage {
                pages: r.u64("pages")?,
                bytes: r.u64("bytes")?,
                limit_bytes: r.u64("limit")?,
            }),
            k => return Err(bad(format!("unknown reply kind {k}"))),
        };
        r.finish("merge reply")?;
        Ok(reply)
    }
}
