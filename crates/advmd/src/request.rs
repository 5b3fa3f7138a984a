//! Requests by service: decoding a frame into the right service's request, and the
//! error reply every service shares (kind 0, a text).

use advm::image::service as image;
use advm::merge::protocol as merge;
use advm::wire::{Channel, Frame, Writer};

/// A decoded request, one variant per service. A new service adds a variant here, its
/// decoding in [`Request::decode`], and its handler module beside `merge_service`.
#[derive(Debug)]
pub enum Request {
    /// For the page stores.
    Merge(merge::Request),
    /// For the image service: a chain's mapping plan and its files.
    Image(image::Request),
}

impl Request {
    /// Decodes a frame by its service byte.
    pub fn decode(frame: Frame) -> advm::Result<Self> {
        match frame.service {
            merge::SERVICE => Ok(Request::Merge(merge::Request::decode(frame)?)),
            image::SERVICE => Ok(Request::Image(image::Request::decode(&frame)?)),
            s => Err(advm::Error::InvalidArgument { what: "request", why: format!("no service {s} in this advmd") }),
        }
    }
}

/// Sends an error reply for `service`.
pub(crate) fn refuse_service(ch: &Channel, service: u8, why: &str) -> advm::Result<()> {
    ch.send(service, 0, &Writer::default().bytes(why.as_bytes()).body, &[])
}

/// Sends an error reply when the service is not known (the merge service's, which
/// every client today speaks).
pub(crate) fn refuse(ch: &Channel, why: &str) -> advm::Result<()> {
    refuse_service(ch, merge::SERVICE, why)
}
