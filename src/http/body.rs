//! Response bodies: whole (JSON), or an event stream sent as it comes
//! (`stream.rs`), and the bound on open streams.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

/// Most event streams open at once.
pub const STREAMS_MAX: usize = 256;

/// A response body: whole, or an event stream.
pub type ResponseBody = http_body_util::Either<Full<Bytes>, EventStream>;

/// Open streams, counted against [`STREAMS_MAX`].
#[derive(Debug, Default)]
pub struct StreamSlots(AtomicUsize);

/// One stream's place; dropping it frees it.
#[derive(Debug)]
pub(super) struct StreamSlot(Arc<StreamSlots>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamSlots {
    pub(super) fn take(self: &Arc<Self>) -> Option<StreamSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < STREAMS_MAX).then_some(open + 1))
            .ok()?;
        Some(StreamSlot(self.clone()))
    }
}

/// The body of an event stream: what its task sends, as it is sent.
#[derive(Debug)]
pub struct EventStream {
    receiver: tokio::sync::mpsc::Receiver<Bytes>,
}

impl EventStream {
    pub(super) fn new(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> EventStream {
        EventStream { receiver }
    }
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver.poll_recv(context).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}
