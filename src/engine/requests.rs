//! Every command the engine takes, one type each, and the one way they travel.
//!
//! A request is a plain struct implementing [`Request`]: what it carries,
//! what it answers (`Output`), and `run`, which decides it against the state
//! and applies the decided record within the engine's turn. Front ends send
//! any request with [`EngineHandle::submit`](super::EngineHandle::submit); the
//! engine runs it in a turn and answers after the turn's commit, through one
//! generic responder. Adding a command adds a struct and its `run` here (and
//! its decision and record), and nothing else in the engine.

use std::sync::Arc;
use tokio::sync::oneshot;

use super::api::{Cancelled, EngineError, Enqueued, FetchRequest, HeartbeatOutcome};
use super::decide::{EnqueueSlot, Entropy};
use super::events::EventSink;
use super::record::Record;
use super::state::State;
use super::workers::entry::{Contacts, WorkerSignal};
use super::workers::registry;
use crate::clock::Millis;
use crate::job::{FailureReport, Job, JobId, NewJob};

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
/// With the disk full, claims stop while this much log space is left, so
/// that the jobs already claimed can still be acked.
const FULL_DISK_ACK_RESERVE_BYTES: u64 = 1024 * 1024;

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
    pub(crate) records: &'a mut Vec<Record>,
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
    pub(crate) fn apply(&mut self, record: Record) {
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

macro_rules! sealed {
    ($($request:ty),* $(,)?) => {
        $(impl sealed::Sealed for $request {})*
    };
}

sealed!(Enqueue, Fetch, Ack, Fail, Cancel, Heartbeat, DeadLetterRetry, DeadLetterDelete, BeginDrain, Probe, Activate,);

/// Activates a staged (`pending`) job: `available`, or `scheduled` until its time.
pub struct Activate {
    pub id: JobId,
}

impl Request for Activate {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_activate(turn.now, self.id)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }
}

/// Enqueues jobs atomically: all of them or none.
pub struct Enqueue {
    pub jobs: Vec<NewJob>,
}

impl Request for Enqueue {
    type Output = Vec<Enqueued>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let (state, entropy) = turn.state_and_entropy();
        let (record, slots) = state.decide_enqueue(now, self.jobs, entropy)?;
        if let Some(record) = record {
            turn.apply(record);
        }
        Ok(slots
            .into_iter()
            .map(|slot| match slot {
                EnqueueSlot::New(id) => Enqueued { job: turn.current(id), deduplicated: false },
                EnqueueSlot::Existing(id) => Enqueued { job: turn.current(id), deduplicated: true },
            })
            .collect())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }

    fn held_bytes(&self) -> u64 {
        self.jobs
            .iter()
            .map(|job| {
                let payload = &job.payload;
                std::mem::size_of::<NewJob>()
                    + job.queue.len()
                    + payload.job_type().len()
                    + payload.args().len()
                    + payload.meta().len()
                    + payload.tags().iter().map(String::len).sum::<usize>()
                    + payload.extra().iter().map(|(key, value)| key.len() + value.len()).sum::<usize>()
            })
            .sum::<usize>() as u64
    }
}

/// Claims up to `count` available jobs from the listed queues. A draining
/// engine, or a worker told to go quiet or terminate, gets none. With
/// `wait_ms`, a fetch that finds nothing waits up to that long for a job to
/// appear in one of its queues (long polling).
pub struct Fetch {
    pub request: FetchRequest,
    pub wait_ms: u64,
}

impl Fetch {
    /// Told to stop: the engine drains, or the worker was signalled.
    fn stopped(&self, turn: &Turn<'_>) -> bool {
        *turn.draining
            || self.request.worker_id.as_deref().is_some_and(|worker| turn.state().worker_signal(worker).is_some())
    }
}

impl Request for Fetch {
    type Output = Vec<Arc<Job>>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let request = self.request;
        let signalled = request.worker_id.as_deref().is_some_and(|worker| {
            turn.touch_worker(worker, false);
            turn.state().worker_signal(worker).is_some()
        });
        if signalled || *turn.draining {
            return Ok(Vec::new());
        }
        let Some((record, ids)) = turn.state().decide_fetch(now, &request) else { return Ok(Vec::new()) };
        turn.apply(record);
        Ok(ids.into_iter().map(|id| turn.current(id)).collect())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        let claims = self.request.count as u64 * RECORD_BYTES_PER_JOB;
        let worker = self.request.worker_id.as_ref().map_or(0, |id| id.len() as u64);
        // Claims also set aside room for the acks they will need (for the
        // rest of the turn; the next turn measures the space again).
        Some(RECORD_FIXED_BYTES + claims + worker + FULL_DISK_ACK_RESERVE_BYTES)
    }

    fn held_bytes(&self) -> u64 {
        self.request.queues.iter().map(String::len).sum::<usize>() as u64
    }

    fn run_or_wait(self, turn: &mut Turn<'_>) -> RunOutcome<Self> {
        if self.wait_ms == 0 {
            return RunOutcome::Done(self.run(turn));
        }
        let wait_ms = self.wait_ms;
        let again = Fetch { request: self.request.clone(), wait_ms };
        match self.run(turn) {
            Ok(jobs) if jobs.is_empty() && !again.stopped(turn) => {
                RunOutcome::Wait { request: again, until: turn.now.saturating_add(wait_ms as i64) }
            }
            outcome => RunOutcome::Done(outcome),
        }
    }

    fn released(&self) -> Result<Self::Output, EngineError> {
        Ok(Vec::new())
    }

    fn give_up(&self, turn: &Turn<'_>) -> bool {
        self.stopped(turn)
    }

    fn waits_on(&self) -> &[String] {
        &self.request.queues
    }
}

/// Completes an active job; `result` is compact JSON text.
pub struct Ack {
    pub id: JobId,
    pub result: Option<String>,
    pub worker_id: Option<String>,
}

impl Request for Ack {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_ack(turn.now, self.id, self.result, self.worker_id.as_deref())?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES + self.held_bytes())
    }

    fn held_bytes(&self) -> u64 {
        self.result.as_ref().map_or(0, String::len) as u64
    }
}

/// Reports a failed attempt; the retry policy decides what follows (or,
/// with `requeue`, the job goes back at once and the attempt does not count).
pub struct Fail {
    pub id: JobId,
    pub report: FailureReport,
    pub requeue: bool,
    pub worker_id: Option<String>,
}

impl Request for Fail {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let worker = self.worker_id.as_deref();
        let (state, entropy) = turn.state_and_entropy();
        let record = state.decide_fail(now, self.id, self.report, self.requeue, worker, entropy)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES + self.held_bytes())
    }

    fn held_bytes(&self) -> u64 {
        self.report.held_bytes() as u64
    }
}

/// Cancels a job that has not ended (again: no change, same answer).
pub struct Cancel {
    pub id: JobId,
}

impl Request for Cancel {
    type Output = Cancelled;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_cancel(turn.now, self.id)?;
        let previous_state = turn.current(self.id).state;
        if let Some(record) = record {
            turn.apply(record);
        }
        Ok(Cancelled { job: turn.current(self.id), previous_state })
    }
}

/// Extends the claims of a worker's active jobs (the listed ones, or all).
pub struct Heartbeat {
    pub worker_id: String,
    pub active_jobs: Option<Vec<JobId>>,
    pub visibility_timeout_ms: Option<u64>,
}

impl Request for Heartbeat {
    type Output = HeartbeatOutcome;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        turn.touch_worker(&self.worker_id, true);
        let signal = turn.state().worker_signal(&self.worker_id).map(|(signal, _)| signal);
        let listed = self.active_jobs.as_deref();
        let (record, not_extended) =
            turn.state().decide_heartbeat(now, &self.worker_id, listed, self.visibility_timeout_ms);
        let extended = match &record {
            Some((_, extended)) => *extended,
            None => 0,
        };
        if let Some((record, _)) = record {
            turn.apply(record);
        }
        let signal = if *turn.draining { Some(WorkerSignal::Terminate) } else { signal };
        Ok(HeartbeatOutcome { extended, not_extended, signal })
    }

    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64> {
        let listed = match &self.active_jobs {
            Some(ids) => ids.len(),
            None => turn.state().active_of_worker(&self.worker_id).len(),
        };
        Some(RECORD_FIXED_BYTES + listed as u64 * RECORD_BYTES_PER_JOB)
    }

    fn held_bytes(&self) -> u64 {
        self.active_jobs.as_ref().map_or(0, |ids| ids.len() * std::mem::size_of::<JobId>()) as u64
    }
}

/// Sends a discarded job back to `available` with its attempts reset.
pub struct DeadLetterRetry {
    pub id: JobId,
}

impl Request for DeadLetterRetry {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_dead_letter_retry(turn.now, self.id)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }
}

/// Removes a discarded job for good.
pub struct DeadLetterDelete {
    pub id: JobId,
}

impl Request for DeadLetterDelete {
    type Output = ();

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_dead_letter_delete(turn.now, self.id)?;
        turn.apply(record);
        Ok(())
    }
}

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
