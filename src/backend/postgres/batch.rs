//! Merged statements (docs/postgres.md, "Merged statements"): concurrent
//! requests of one kind on a node are gathered and run as one transaction,
//! so that a busy node sends the database a few statements for many
//! requests, not a few for each.
//!
//! A [`Batcher`] takes the requests that are waiting when a batch can start
//! (at most `max`, and at most [`BATCH_BYTES_MAX`] but for the first), with
//! no delay added: while the batches under way (at most `in_flight`) run,
//! new requests queue up and make the next batch. A lone request therefore
//! runs at once, alone, and requests merge exactly when the node is busy.
//! Each request gets its own outcome; a failure of the transaction itself
//! answers every request of the batch with it.
//!
//! The requests waiting on a node, in all its batchers together, are bounded
//! as the local engine's inbox is: by count ([`ENGINE_INBOX_MAX`]) and by
//! the bytes they carry ([`ENGINE_INBOX_BYTES_MAX`]). Past either, a request
//! is refused at once as overloaded (503, retryable) instead of waiting in
//! memory while producers outpace the database.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::acks::PendingAck;
use super::claims::PendingClaim;
use super::enqueues::PendingEnqueue;
use super::jobs::PgJobs;
use crate::engine::{EngineError, Enqueued, Unavailable};
use crate::job::Job;
use crate::limits::{ENGINE_INBOX_BYTES_MAX, ENGINE_INBOX_MAX};

/// Acks merged into one transaction at most.
const ACK_BATCH_MAX: usize = 100;
/// Enqueue requests merged into one transaction at most.
const ENQUEUE_BATCH_MAX: usize = 64;
/// Claims (fetches) merged into one transaction at most.
const CLAIM_BATCH_MAX: usize = 64;
/// Merged transactions of one kind under way at once on a node.
const BATCHES_IN_FLIGHT: usize = 2;
/// The bytes a batch gathers before it starts; the request that crosses it
/// is the last one in. So one statement carries at most this and one
/// request's bytes, far below the 1 GiB a PostgreSQL message may hold.
pub(super) const BATCH_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The requests merged into shared transactions.
pub(super) struct Batches {
    pub acks: Batcher<PendingAck, Arc<Job>>,
    pub claims: Batcher<PendingClaim, Vec<Arc<Job>>>,
    pub enqueues: Batcher<PendingEnqueue, Vec<Enqueued>>,
}

impl PgJobs {
    /// The merged requests, started on the current runtime at first use.
    pub(super) fn batches(&self) -> &Batches {
        self.batches.get_or_init(|| {
            let waiting = Arc::new(Waiting::default());
            let (acks_store, claims_store, enqueues_store) = (self.clone(), self.clone(), self.clone());
            let acks = Batcher::start(ACK_BATCH_MAX, BATCHES_IN_FLIGHT, waiting.clone(), move |batch| {
                let store = acks_store.clone();
                async move { store.ack_batch(batch).await }
            });
            let claims = Batcher::start(CLAIM_BATCH_MAX, BATCHES_IN_FLIGHT, waiting.clone(), move |batch| {
                let store = claims_store.clone();
                async move { store.claim_batch(batch).await }
            });
            let enqueues = Batcher::start(ENQUEUE_BATCH_MAX, BATCHES_IN_FLIGHT, waiting, move |batch| {
                let store = enqueues_store.clone();
                async move { store.enqueue_batch(batch).await }
            });
            Batches { acks, claims, enqueues }
        })
    }
}

/// About how many bytes a request holds in memory while it waits.
pub(super) trait Weighed {
    fn bytes(&self) -> u64;
}

impl Weighed for PendingEnqueue {
    fn bytes(&self) -> u64 {
        self.jobs.iter().map(Job::held_bytes).sum()
    }
}

impl Weighed for PendingAck {
    fn bytes(&self) -> u64 {
        (std::mem::size_of::<Self>() + self.result.as_ref().map_or(0, String::len)) as u64
    }
}

impl Weighed for PendingClaim {
    fn bytes(&self) -> u64 {
        std::mem::size_of::<Self>() as u64
    }
}

/// The requests waiting in a node's batchers, by count and by bytes.
#[derive(Default)]
pub(super) struct Waiting {
    count: AtomicU64,
    bytes: AtomicU64,
}

impl Waiting {
    /// Counts a request of `bytes` in, unless the bounds are reached; it is
    /// counted out when the answer drops. One request alone is always let
    /// in (its size was bounded when it was read), so no request is
    /// refused on an idle node.
    fn admit(self: &Arc<Self>, bytes: u64) -> Option<Admitted> {
        let count = self.count.fetch_add(1, Ordering::AcqRel);
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        let admitted = Admitted { waiting: self.clone(), bytes };
        let over = count >= ENGINE_INBOX_MAX as u64 || (count > 0 && before + bytes > ENGINE_INBOX_BYTES_MAX);
        (!over).then_some(admitted)
    }
}

/// A request counted in [`Waiting`]: counted out when dropped, so a batch
/// that fails or panics releases its requests too.
struct Admitted {
    waiting: Arc<Waiting>,
    bytes: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.waiting.count.fetch_sub(1, Ordering::AcqRel);
        self.waiting.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

type Answer<A> = oneshot::Sender<Result<A, EngineError>>;

/// Gathers requests of type `R` into batches answered with `A` each.
pub(super) struct Batcher<R, A> {
    sender: mpsc::UnboundedSender<(R, Admitted, Answer<A>)>,
    waiting: Arc<Waiting>,
}

impl<R: Weighed + Send + 'static, A: Send + 'static> Batcher<R, A> {
    /// Starts gathering on the current runtime: `run` gets each batch's
    /// requests and answers one outcome for each, in order. `waiting`
    /// bounds the requests waiting here and in the node's other batchers.
    fn start<F, Fut>(max: usize, in_flight: usize, waiting: Arc<Waiting>, run: F) -> Batcher<R, A>
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<A, EngineError>>, EngineError>> + Send + 'static,
    {
        let (sender, mut receiver) = mpsc::unbounded_channel::<(R, Admitted, Answer<A>)>();
        let run = Arc::new(run);
        let slots = Arc::new(Semaphore::new(in_flight));
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                // Wait for a slot first: meanwhile the next requests gather.
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let mut bytes = first.1.bytes;
                let mut batch = vec![first];
                while batch.len() < max && bytes < BATCH_BYTES_MAX {
                    match receiver.try_recv() {
                        Ok(next) => {
                            bytes += next.1.bytes;
                            batch.push(next);
                        }
                        Err(_) => break,
                    }
                }
                let run = run.clone();
                tokio::spawn(async move {
                    let mut requests = Vec::with_capacity(batch.len());
                    let mut answers = Vec::with_capacity(batch.len());
                    for (request, admitted, answer) in batch {
                        requests.push(request);
                        answers.push((admitted, answer));
                    }
                    // Each request is counted out as it is answered (its
                    // `Admitted` dropped): until then it is still held.
                    match run(requests).await {
                        Ok(outcomes) => {
                            let mut outcomes = outcomes.into_iter();
                            for (admitted, answer) in answers {
                                drop(admitted);
                                let _ = answer.send(outcomes.next().unwrap_or_else(|| Err(stopped())));
                            }
                        }
                        Err(error) => {
                            for (admitted, answer) in answers {
                                drop(admitted);
                                let _ = answer.send(Err(error.clone()));
                            }
                        }
                    }
                    drop(slot);
                });
            }
        });
        Batcher { sender, waiting }
    }

    /// Runs `request` with the others waiting; answers its own outcome, or
    /// that the node is overloaded when too many requests wait already.
    pub(super) async fn submit(&self, request: R) -> Result<A, EngineError> {
        let Some(admitted) = self.waiting.admit(request.bytes()) else {
            return Err(EngineError::Unavailable { reason: Unavailable::Overloaded });
        };
        let (answer, outcome) = oneshot::channel();
        if self.sender.send((request, admitted, answer)).is_err() {
            return Err(stopped());
        }
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> EngineError {
    EngineError::Unavailable { reason: Unavailable::EngineStopped }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that says how many bytes it carries.
    struct Sized(u64);

    impl Weighed for Sized {
        fn bytes(&self) -> u64 {
            self.0
        }
    }

    #[tokio::test]
    async fn requests_past_the_waiting_bytes_are_refused_until_the_batch_ahead_is_answered() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let opened = gate.clone();
        let waiting = Arc::new(Waiting::default());
        let batcher = Arc::new(Batcher::start(64, 1, waiting.clone(), move |batch: Vec<Sized>| {
            let gate = opened.clone();
            async move {
                gate.notified().await;
                Ok(batch.into_iter().map(|request| Ok(request.0)).collect())
            }
        }));
        // A lone request larger than the bound is let in: it was bounded
        // when it was read, and nothing else waits.
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(Sized(ENGINE_INBOX_BYTES_MAX + 1)).await }
        });
        while waiting.count.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = batcher.submit(Sized(1)).await;
        assert!(matches!(refused, Err(EngineError::Unavailable { reason: Unavailable::Overloaded })), "{refused:?}");
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), ENGINE_INBOX_BYTES_MAX + 1);
        // Answered, it no longer counts.
        assert_eq!(waiting.bytes.load(Ordering::Acquire), 0);
        let second = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(Sized(7)).await }
        });
        while waiting.count.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(second.await.unwrap().unwrap(), 7);
    }

    #[test]
    fn the_count_is_bounded_as_well_as_the_bytes() {
        let waiting = Arc::new(Waiting::default());
        let mut admitted: Vec<Admitted> = (0..ENGINE_INBOX_MAX).map(|_| waiting.admit(0).unwrap()).collect();
        assert!(waiting.admit(0).is_none(), "one past the count is refused");
        admitted.pop();
        assert!(waiting.admit(0).is_some(), "and let in once one has left");
        drop(admitted);
        assert_eq!(waiting.count.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_batch_that_panics_still_counts_its_requests_out() {
        let waiting = Arc::new(Waiting::default());
        fn fails() -> Result<Vec<Result<u64, EngineError>>, EngineError> {
            panic!("a batch that fails in an unforeseen way")
        }
        let batcher = Batcher::start(64, 1, waiting.clone(), |_: Vec<Sized>| async { fails() });
        let answer = batcher.submit(Sized(1_000)).await;
        assert!(matches!(answer, Err(EngineError::Unavailable { reason: Unavailable::EngineStopped })), "{answer:?}");
        assert_eq!((waiting.count.load(Ordering::Acquire), waiting.bytes.load(Ordering::Acquire)), (0, 0));
    }
}
