//! Merged statements (docs/postgres.md, "Merged statements"): concurrent
//! requests of one kind on a node are gathered and run as one transaction,
//! so that a busy node sends the database a few statements for many
//! requests, not a few for each.
//!
//! A [`Batcher`] takes the requests that are waiting when a batch can start
//! (at most `max`), with no delay added: while the batches under way (at
//! most `in_flight`) run, new requests queue up and make the next batch. A
//! lone request therefore runs at once, alone, and requests merge exactly
//! when the node is busy. Each request gets its own outcome; a failure of
//! the transaction itself answers every request of the batch with it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::engine::{EngineError, Unavailable};

type Answer<A> = oneshot::Sender<Result<A, EngineError>>;

/// Gathers requests of type `R` into batches answered with `A` each.
pub(super) struct Batcher<R, A> {
    sender: mpsc::UnboundedSender<(R, Answer<A>)>,
}

impl<R: Send + 'static, A: Send + 'static> Batcher<R, A> {
    /// Starts gathering on the current runtime: `run` gets each batch's
    /// requests and answers one outcome for each, in order.
    pub(super) fn start<F, Fut>(max: usize, in_flight: usize, run: F) -> (Batcher<R, A>, tokio::task::JoinHandle<()>)
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<A, EngineError>>, EngineError>> + Send + 'static,
    {
        let (sender, mut receiver) = mpsc::unbounded_channel::<(R, Answer<A>)>();
        let run = Arc::new(run);
        let slots = Arc::new(Semaphore::new(in_flight));
        let task = tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                // Wait for a slot first: meanwhile the next requests gather.
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let mut batch = vec![first];
                while batch.len() < max {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let run = run.clone();
                tokio::spawn(async move {
                    let (requests, answers): (Vec<R>, Vec<Answer<A>>) = batch.into_iter().unzip();
                    match run(requests).await {
                        Ok(outcomes) => {
                            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                                let _ = answer.send(outcome);
                            }
                        }
                        Err(error) => {
                            for answer in answers {
                                let _ = answer.send(Err(error.clone()));
                            }
                        }
                    }
                    drop(slot);
                });
            }
        });
        (Batcher { sender }, task)
    }

    /// Runs `request` with the others waiting; answers its own outcome.
    pub(super) async fn submit(&self, request: R) -> Result<A, EngineError> {
        let stopped = || EngineError::Unavailable { reason: Unavailable::EngineStopped };
        let (answer, outcome) = oneshot::channel();
        self.sender.send((request, answer)).map_err(|_| stopped())?;
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }
}
