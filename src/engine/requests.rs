//! Every command the engine takes, one type each, and the one way they travel.
//!
//! A request is a plain struct implementing [`Request`]: what it carries,
//! what it answers (`Output`), and `run`, which decides it against the state
//! and applies the decided record within the engine's turn. Front ends send
//! any request with [`EngineHandle::submit`](super::EngineHandle::submit); the
//! engine runs it in a turn and answers after the turn's commit, through one
//! generic responder. A command's struct and its `run` live in its feature's
//! folder (`jobs/`, `queues/`, `cron/`, ...); here are the trait, the turn,
//! and the two commands of the engine itself (`BeginDrain`, `Probe`).

use std::sync::Arc;
use tokio::sync::oneshot;

use super::api::EngineError;
use super::events::EventSink;
use super::jobs::decide::Entropy;
use super::record::Logged;
use super::state::State;
use super::workers::entry::Contacts;
use super::workers::registry;
use crate::clock::Millis;
use crate::job::{Job, JobId};

pub(crate) mod sealed {
    /// Only this crate's requests can be sent to the engine.
    pub trait Sealed {}
}

/// A command for the engine: what it answers, and how it runs in a turn.
pub trait Request: sealed::Sealed + Send + 'static {
    type Output: Send + 'static;

    /// Decides the request against the state and applies what it decided.
    #[doc(hidden)]
    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError>;

    /// With the disk full: the most log bytes the request's records may
    /// take, or `None` for new work, which is refused then.
    #[doc(hidden)]
    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES)
    }

    /// About how many bytes the request carries, for the inbox's bound.
    #[doc(hidden)]
    fn held_bytes(&self) -> u64 {
        0
    }

    /// Runs the request, or, for one that may wait for work and found none,
    /// hands it back to be parked until `until` (see [`Parked`]).
    #[doc(hidden)]
    fn run_or_wait(self, turn: &mut Turn<'_>) -> RunOutcome<Self>
    where
        Self: Sized,
    {
        RunOutcome::Done(self.run(turn))
    }

    /// The answer of a parked request given up on (its time ran out, the
    /// engine drains, its worker was told to stop).
    #[doc(hidden)]
    fn released(&self) -> Result<Self::Output, EngineError> {
        Err(EngineError::Unavailable { reason: super::api::Unavailable::EngineStopped })
    }

    /// Whether a parked request is to be given up on now.
    #[doc(hidden)]
    fn give_up(&self, _turn: &Turn<'_>) -> bool {
        false
    }

    /// The queues whose work a parked request waits for.
    #[doc(hidden)]
    fn waits_on(&self) -> &[String] {
        &[]
    }
}

/// What running a request that may wait came to.
#[doc(hidden)]
pub enum RunOutcome<R: Request> {
    Done(Result<R::Output, EngineError>),
    /// Nothing to answer yet: park `request` until `until` at the latest.
    Wait {
        request: R,
        until: Millis,
    },
}

/// A request waiting in the engine for work to appear (a long-poll fetch).
/// It costs nothing while it waits but a look at its queues at the end of
/// each turn; parked requests are served first come, first served.
pub(crate) trait Parked: Send {
    fn until(&self) -> Millis;
    fn queues(&self) -> &[String];
    fn give_up(&self, turn: &Turn<'_>) -> bool;
    /// Runs again: an answer, or itself to wait on.
    fn retry(self: Box<Self>, turn: &mut Turn<'_>) -> Result<Responder, Box<dyn Parked>>;
    /// Answers as given up on.
    fn release(self: Box<Self>) -> Responder;
    /// Answers with an error (the log failed).
    fn refuse(self: Box<Self>, error: EngineError);
}

/// What running a queued request came to.
pub(crate) enum Ran {
    Answer(Responder),
    Park(Box<dyn Parked>),
}

struct ParkedEnvelope<R: Request> {
    request: R,
    reply: Reply<R::Output>,
    until: Millis,
}

/// The responder that sends `outcome`, or the commit's failure in place of a success.
fn responder<T: Send + 'static>(reply: Reply<T>, outcome: Result<T, EngineError>) -> Responder {
    Box::new(move |failure| {
        let outcome = match (outcome, failure) {
            (Ok(_), Some(error)) => Err(error.clone()),
            (outcome, _) => outcome,
        };
        // A requester that went away (timeout, closed connection) is no error.
        let _ = reply.send(outcome);
    })
}

impl<R: Request> Parked for ParkedEnvelope<R> {
    fn until(&self) -> Millis {
        self.until
    }

    fn queues(&self) -> &[String] {
        self.request.waits_on()
    }

    fn give_up(&self, turn: &Turn<'_>) -> bool {
        turn.now >= self.until || self.request.give_up(turn) || self.reply.is_closed()
    }

    fn retry(self: Box<Self>, turn: &mut Turn<'_>) -> Result<Responder, Box<dyn Parked>> {
        let ParkedEnvelope { request, reply, until } = *self;
        match request.run_or_wait(turn) {
            RunOutcome::Done(outcome) => Ok(responder(reply, outcome)),
            // Still nothing: wait on, to the first deadline.
            RunOutcome::Wait { request, .. } => Err(Box::new(ParkedEnvelope { request, reply, until })),
        }
    }

    fn release(self: Box<Self>) -> Responder {
        let outcome = self.request.released();
        responder(self.reply, outcome)
    }

    fn refuse(self: Box<Self>, error: EngineError) {
        let _ = self.reply.send(Err(error));
    }
}

/// A record's fixed part (its kind, times and ids), generously.
pub(crate) const RECORD_FIXED_BYTES: u64 = 96;
/// The most log bytes one job's share of a record takes (a claim, a
/// promotion, a heartbeat's extension).
pub(crate) const RECORD_BYTES_PER_JOB: u64 = 64;

/// What a request may use of the engine during its turn.
pub struct Turn<'a> {
    pub(crate) state: &'a mut State,
    pub(crate) entropy: &'a mut dyn Entropy,
    /// When each worker was last seen (soft state beside the state).
    pub(crate) contacts: &'a mut Contacts,
    /// A graceful shutdown has begun.
    pub(crate) draining: &'a mut bool,
    pub(crate) cron_entries_max: usize,
    /// Delivery attempts handed to the pool and not yet reported back.
    pub(crate) in_flight: &'a mut super::webhooks::outbox::InFlight,
    pub(crate) webhook_limits: &'a super::webhooks::outbox::WebhookLimits,
    /// Dropped and abandoned deliveries, logged as counts.
    pub(crate) delivery_log: &'a mut super::webhooks::outbox::DeliveryLog,
    pub(crate) max_schemas: usize,
    pub(crate) now: Millis,
    pub(crate) records: &'a mut Vec<Logged>,
    pub(crate) events: &'a mut EventSink,
}

impl Turn<'_> {
    pub(crate) fn state(&self) -> &State {
        self.state
    }

    /// The state with the entropy decisions draw on.
    pub(crate) fn state_and_entropy(&mut self) -> (&mut State, &mut dyn Entropy) {
        (&mut *self.state, &mut *self.entropy)
    }

    /// Applies a decided record and keeps it for the turn's commit.
    pub(crate) fn apply(&mut self, record: Logged) {
        self.state.apply(&record, self.events).expect("a record decided against this state applies to it");
        self.records.push(record);
    }

    /// A job as it is now (after what was applied).
    pub(crate) fn current(&self, id: JobId) -> Arc<Job> {
        self.state.job_handle(id).expect("a job just decided on is stored")
    }

    /// Records contact with a worker.
    pub(crate) fn touch_worker(&mut self, worker_id: &str, heartbeat: bool) {
        registry::touch(self.state, self.contacts, worker_id, self.now, heartbeat, self.events);
    }

    /// Notes the queues a worker fetches from (soft state, as its contact).
    pub(crate) fn note_worker_queues(&mut self, worker_id: &str, queues: &[String]) {
        self.contacts.set_queues(worker_id, queues);
    }
}

/// Where the engine sends one request's outcome.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Sends a request's answer once its turn is committed: the outcome, or the
/// commit's failure in place of a success.
pub(crate) type Responder = Box<dyn FnOnce(Option<&EngineError>) + Send>;

/// A request with its reply channel, as it waits in the inbox.
pub(crate) trait Queued: Send {
    fn run(self: Box<Self>, turn: &mut Turn<'_>) -> Ran;
    fn refuse(self: Box<Self>, error: EngineError);
    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64>;
    fn held_bytes(&self) -> u64;
}

pub(crate) struct Envelope<R: Request> {
    pub request: R,
    pub reply: Reply<R::Output>,
}

impl<R: Request> Queued for Envelope<R> {
    fn run(self: Box<Self>, turn: &mut Turn<'_>) -> Ran {
        let Envelope { request, reply } = *self;
        match request.run_or_wait(turn) {
            RunOutcome::Done(outcome) => Ran::Answer(responder(reply, outcome)),
            RunOutcome::Wait { request, until } => Ran::Park(Box::new(ParkedEnvelope { request, reply, until })),
        }
    }

    fn refuse(self: Box<Self>, error: EngineError) {
        let _ = self.reply.send(Err(error));
    }

    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64> {
        self.request.full_disk_bytes(turn)
    }

    fn held_bytes(&self) -> u64 {
        (std::mem::size_of::<Self>() as u64).saturating_add(self.request.held_bytes())
    }
}

impl sealed::Sealed for BeginDrain {}
impl sealed::Sealed for Probe {}

/// A graceful shutdown begins: fetches hand out nothing, heartbeats answer
/// `terminate`, cron entries stop firing, and workers seen lately get a
/// `worker.terminate` event.
pub struct BeginDrain;

impl Request for BeginDrain {
    type Output = ();

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        *turn.draining = true;
        registry::farewell(turn.state, turn.contacts, turn.now, turn.events);
        Ok(())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(0)
    }
}

/// A round trip through the engine: a health probe, or with a manual clock
/// a tick that makes the engine handle what is due.
pub struct Probe;

impl Request for Probe {
    type Output = ();

    fn run(self, _turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        Ok(())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(0)
    }
}
