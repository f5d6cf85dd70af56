//! What a connection may cost the server: at most `max_connections` are
//! served at once (more get a plain 503 and are closed), and a client that
//! stops reading its answers is cut off after a write timeout instead of
//! holding its buffers for ever.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Sleep;

/// Counts open connections against a cap.
#[derive(Debug)]
pub struct ConnectionSlots {
    open: AtomicUsize,
    max: usize,
}

/// One taken slot; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<ConnectionSlots>);

impl ConnectionSlots {
    pub fn new(max: usize) -> Arc<ConnectionSlots> {
        Arc::new(ConnectionSlots { open: AtomicUsize::new(0), max })
    }

    /// A slot, or `None` when `max` connections are open.
    pub fn take(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < self.max).then_some(open + 1));
        taken.ok().map(|_| ConnectionSlot(self.clone()))
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The whole answer a connection over the cap gets before it is closed.
fn refusal() -> Vec<u8> {
    let body = r#"{"error":{"code":"backend_error","message":"the server has as many connections open as it may","retryable":true,"details":{"reason":"connections"},"request_id":null}}"#;
    let head =
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/svc+json\r\nretry-after: 1\r\nconnection: close";
    format!("{head}\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Answers a connection over the cap with 503 and closes it; a client that
/// does not take the answer within a second is dropped.
pub async fn refuse<S: AsyncWrite + Unpin>(mut stream: S) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&refusal()).await?;
        stream.shutdown().await
    })
    .await;
}

/// A stream whose writes fail with `TimedOut` once one has waited `timeout`
/// for the peer to make room.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout { inner, timeout, waiting: None }
    }

    /// `Ready(Err)` once the current wait has lasted `timeout`.
    fn check_wait(&mut self, context: &mut Context<'_>) -> Poll<io::Error> {
        let timeout = self.timeout;
        let waiting = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(waiting.as_mut().poll(context));
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "the client did not read its answer in time"))
    }

    fn finish<T>(&mut self, polled: Poll<io::Result<T>>, context: &mut Context<'_>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                self.waiting = None;
                Poll::Ready(result)
            }
            Poll::Pending => match self.check_wait(context) {
                Poll::Ready(error) => Poll::Ready(Err(error)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

use std::future::Future;

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, context: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(context, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(context, buf);
        self.finish(polled, context)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(context, bufs);
        self.finish(polled, context)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(context);
        self.finish(polled, context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(context);
        self.finish(polled, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_states_its_body_length_exactly() {
        let refusal = refusal();
        let text = std::str::from_utf8(&refusal).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(parsed["error"]["code"], "backend_error");
    }

    #[test]
    fn slots_are_counted_and_freed() {
        let slots = ConnectionSlots::new(2);
        let first = slots.take().unwrap();
        let _second = slots.take().unwrap();
        assert!(slots.take().is_none());
        drop(first);
        assert_eq!(slots.open(), 1);
        assert!(slots.take().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_times_out() {
        let (client, server) = tokio::io::duplex(64);
        let mut timed = WriteTimeout::new(server, Duration::from_secs(30));
        let error = timed.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(client);
    }
}
