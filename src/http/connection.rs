//! What a connection may cost the server: at most `max_connections` are
//! served at once, at most `max_connections_per_address` from one client
//! address (more get a plain 503 and are closed), and a client that stops
//! reading its answers is cut off after a write timeout instead of holding
//! its buffers for ever.
//!
//! Every connection is a file descriptor, and so are the log's segments, its
//! snapshots and the webhook sockets: the cap is kept below the process's
//! open-file limit, with room for those (docs/api.md, "Limits"), so that no
//! number of clients can leave the log without a descriptor.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Sleep;

/// Descriptors kept out of the connection cap for the server's own files:
/// the log's segments (three handles each, two at a rotation), snapshots
/// written and read, directory syncs, the data dir's lock and the runtime's.
pub const DESCRIPTORS_RESERVED: u64 = 48;
/// Connections over a cap that are answered 503 at once; past this many
/// answers in progress, another such connection is closed unanswered.
pub const REFUSALS_MAX: usize = 16;
/// The fewest connections a server takes, whatever its limit says.
const CONNECTIONS_MIN: usize = 4;

/// Raises the soft open-file limit to the hard one (the default soft limit
/// of 1 024 is far below what a server with many clients needs); returns
/// the limit in force afterwards, or `None` where it cannot be read.
#[allow(unsafe_code)]
pub fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    // An unlimited hard limit is taken as the most a process is given in practice.
    let wanted = if limit.rlim_max == libc::RLIM_INFINITY { 1 << 20 } else { limit.rlim_max };
    if wanted > limit.rlim_cur {
        let raised = libc::rlimit { rlim_cur: wanted, rlim_max: limit.rlim_max };
        // SAFETY: a valid rlimit with the soft limit at most the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = wanted;
        }
    }
    Some(limit.rlim_cur)
}

/// Descriptors the process has open now.
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count() as u64)
}

/// The connection cap that fits an open-file limit: `configured` at most,
/// leaving room for what is open already, the server's own files, the
/// webhook sockets and the refusals in progress.
pub fn connection_cap(configured: usize, open_file_limit: u64, open_now: u64, webhook_sockets: usize) -> usize {
    let reserved = open_now + DESCRIPTORS_RESERVED + webhook_sockets as u64 + REFUSALS_MAX as u64;
    let room = open_file_limit.saturating_sub(reserved);
    (configured as u64).min(room.max(CONNECTIONS_MIN as u64)) as usize
}

/// Counts open connections against a cap, overall and per client address.
#[derive(Debug)]
pub struct ConnectionSlots {
    open: AtomicUsize,
    max: usize,
    per_address_max: usize,
    per_address: parking_lot::Mutex<HashMap<IpAddr, usize>>,
    /// 503 answers being written to connections over a cap.
    refusing: AtomicUsize,
}

/// One taken slot; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<ConnectionSlots>, IpAddr);

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The server holds `max` connections.
    Full,
    /// The client's address holds `per_address_max` connections.
    AddressFull,
}

impl ConnectionSlots {
    pub fn new(max: usize, per_address_max: usize) -> Arc<ConnectionSlots> {
        Arc::new(ConnectionSlots {
            open: AtomicUsize::new(0),
            max,
            per_address_max: per_address_max.min(max),
            per_address: parking_lot::Mutex::new(HashMap::new()),
            refusing: AtomicUsize::new(0),
        })
    }

    /// A slot for a connection from `peer`, or why there is none.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Result<ConnectionSlot, Refused> {
        let mut per_address = self.per_address.lock();
        if self.open.load(Ordering::Acquire) >= self.max {
            return Err(Refused::Full);
        }
        let held = per_address.get(&peer).copied().unwrap_or(0);
        if held >= self.per_address_max {
            return Err(Refused::AddressFull);
        }
        self.open.fetch_add(1, Ordering::AcqRel);
        per_address.insert(peer, held + 1);
        Ok(ConnectionSlot(self.clone(), peer))
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn per_address_max(&self) -> usize {
        self.per_address_max
    }

    /// Leave to answer one more refused connection, or `None` when
    /// [`REFUSALS_MAX`] answers are being written already (then the
    /// connection is closed unanswered: each answer holds a descriptor).
    pub fn refusal(self: &Arc<Self>) -> Option<RefusalSlot> {
        let taken = self
            .refusing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < REFUSALS_MAX).then_some(open + 1));
        taken.ok().map(|_| RefusalSlot(self.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut per_address = self.0.per_address.lock();
        if let Some(held) = per_address.get_mut(&self.1) {
            *held -= 1;
            if *held == 0 {
                per_address.remove(&self.1);
            }
        }
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One refusal being written; dropping it frees its place.
#[derive(Debug)]
pub struct RefusalSlot(Arc<ConnectionSlots>);

impl Drop for RefusalSlot {
    fn drop(&mut self) {
        self.0.refusing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The whole answer a connection over a cap gets before it is closed.
fn refusal(reason: Refused) -> Vec<u8> {
    let (message, reason) = match reason {
        Refused::Full => ("the server has as many connections open as it may", "connections"),
        Refused::AddressFull => {
            ("this client address has as many connections open as one address may", "connections_per_address")
        }
    };
    let body = format!(
        r#"{{"error":{{"code":"backend_error","message":"{message}","retryable":true,"details":{{"reason":"{reason}"}},"request_id":null}}}}"#
    );
    let head =
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/svc+json\r\nretry-after: 1\r\nconnection: close";
    format!("{head}\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Answers a connection over a cap with 503 and closes it; a client that
/// does not take the answer within a second is dropped.
pub async fn refuse<S: AsyncWrite + Unpin>(mut stream: S, reason: Refused, slot: RefusalSlot) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&refusal(reason)).await?;
        stream.shutdown().await
    })
    .await;
    drop(slot);
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
        for reason in [Refused::Full, Refused::AddressFull] {
            let refusal = refusal(reason);
            let text = std::str::from_utf8(&refusal).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
            let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(parsed["error"]["code"], "backend_error");
        }
    }

    #[test]
    fn slots_are_counted_and_freed() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let slots = ConnectionSlots::new(2, 2);
        let first = slots.take(peer).unwrap();
        let _second = slots.take(peer).unwrap();
        assert!(slots.take(peer).is_err());
        drop(first);
        assert_eq!(slots.open(), 1);
        assert!(slots.take(peer).is_ok());
    }

    #[test]
    fn one_address_cannot_take_every_slot() {
        let (one, other): (IpAddr, IpAddr) = ("10.1.1.1".parse().unwrap(), "10.1.1.2".parse().unwrap());
        let slots = ConnectionSlots::new(3, 2);
        let held: Vec<_> = (0..2).map(|_| slots.take(one).unwrap()).collect();
        assert_eq!(slots.take(one).unwrap_err(), Refused::AddressFull);
        let third = slots.take(other).unwrap();
        assert_eq!(slots.take(other).unwrap_err(), Refused::Full);
        drop(held);
        drop(third);
        assert_eq!(slots.open(), 0);
        assert!(slots.per_address.lock().is_empty(), "an address with no connection is forgotten");
    }

    #[test]
    fn refusals_in_progress_are_bounded() {
        let slots = ConnectionSlots::new(1, 1);
        let taken: Vec<_> = (0..REFUSALS_MAX).map(|_| slots.refusal().unwrap()).collect();
        assert!(slots.refusal().is_none());
        drop(taken);
        assert!(slots.refusal().is_some());
    }

    #[test]
    fn the_cap_leaves_room_for_the_servers_own_descriptors() {
        // The default limit of a systemd service or a login shell.
        let cap = connection_cap(10_000, 1024, 20, 64);
        assert_eq!(cap as u64, 1024 - 20 - DESCRIPTORS_RESERVED - 64 - REFUSALS_MAX as u64);
        assert_eq!(connection_cap(10_000, 1 << 20, 20, 64), 10_000);
        assert_eq!(connection_cap(10_000, 64, 20, 64), CONNECTIONS_MIN);
        assert_eq!(connection_cap(2, 64, 20, 64), 2, "a cap set lower stays");
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
