//! The worker's loop. One dispatcher task owns fetching and acking; each
//! job runs in a task of its own; a heartbeat task keeps the claims alive
//! and reads svc's signals.
//!
//! - A finished job's ack goes out with the next claim (`acks` with
//!   `fetch`): a busy worker makes one round trip per job, fewer when jobs
//!   finish together (up to 100 acks a request).
//! - Acks never wait for work; a plain fetch long-polls, and only a plain
//!   fetch is ever dropped (on quiet, terminate or shutdown).
//! - Jobs being acked or nacked stay in the heartbeats until svc answered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::context::{CancelReason, Cancellation, ContextInner, HandlerFn, JobContext, JobError, Middleware, Next};
use super::{Worker, WorkerBuilder};
use crate::error::{Error, Result};
use crate::http::backoff;
use crate::source::{Acks, AcksAnswer, Failure, Fetch, Heartbeat, WorkSource};
use crate::types::{Job, JobState, WorkerState};

const LOG: &str = "svc_client::worker";
/// The most acks one request carries.
const ACKS_PER_REQUEST: usize = 100;
/// The most result bytes one ack request carries (svc takes 2 MiB a request).
const ACK_BYTES_PER_REQUEST: usize = 1 << 20;
/// The largest result svc takes.
const RESULT_BYTES_MAX: usize = 1 << 20;

/// What a job came to.
enum Outcome {
    Ack(Value),
    Fail(Failure),
    Release(Failure),
    Drop(CancelReason),
}

enum Event {
    Done { seq: u64, outcome: Outcome },
    Settled,
    Signal(WorkerState),
}

/// A claim this worker holds: running, or being acked or nacked.
struct Held {
    job_id: String,
    started_at: Option<String>,
    visibility: Duration,
    extended_at: Instant,
    lease_until: Instant,
    cancellation: Arc<Cancellation>,
}

/// What the dispatcher, the heartbeats and the jobs share.
pub(crate) struct Shared {
    pub source: Arc<dyn WorkSource>,
    pub worker_id: String,
    config: WorkerBuilder,
    held: Mutex<HashMap<u64, Held>>,
    events: mpsc::UnboundedSender<Event>,
    beat_now: Notify,
    /// Claims or the quiet state changed: the heartbeat schedule is recomputed.
    reschedule: Notify,
    quiet: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn visibility_of(&self, job: &Job) -> Duration {
        self.config.visibility_timeout.unwrap_or(Duration::from_millis(job.visibility_timeout_ms.max(1)))
    }

    fn interval(&self, visibility: Duration) -> Duration {
        self.config.heartbeat_interval.unwrap_or(visibility / 3).max(Duration::from_millis(50))
    }

    fn lease_until(&self, seq: u64) -> Option<Instant> {
        self.held().get(&seq).map(|held| held.lease_until)
    }

    /// A heartbeat now, for [`JobContext::extend_lease`].
    pub async fn extend_now(&self, _seq: u64) -> Result<()> {
        self.heartbeat().await.map(drop)
    }

    /// Sends one heartbeat for the claims in hand and passes its answer on.
    async fn heartbeat(&self) -> Result<WorkerState> {
        let listed: Vec<(u64, String)> = self.held().iter().map(|(seq, held)| (*seq, held.job_id.clone())).collect();
        let ids: Vec<String> = listed.iter().map(|(_, id)| id.clone()).collect::<HashSet<_>>().into_iter().collect();
        let sent = Instant::now();
        let request =
            Heartbeat::new(self.worker_id.clone(), ids.clone()).visibility_timeout(self.config.visibility_timeout);
        let answer = self.source.heartbeat(request).await?;
        {
            let mut held = self.held();
            for (seq, _) in &listed {
                if let Some(held) = held.get_mut(seq) {
                    held.extended_at = sent;
                    held.lease_until = held.lease_until.max(sent + held.visibility);
                }
            }
        }
        if answer.jobs_extended < ids.len() {
            self.check_claims(listed).await;
        }
        let _ = self.events.send(Event::Signal(answer.state));
        Ok(answer.state)
    }

    /// Some claims were not extended: find which, and cancel their handlers.
    async fn check_claims(&self, listed: Vec<(u64, String)>) {
        for (seq, id) in listed {
            let (started_at, cancellation) = match self.held().get(&seq) {
                Some(held) if !held.cancellation.token.is_cancelled() => {
                    (held.started_at.clone(), held.cancellation.clone())
                }
                _ => continue,
            };
            let Ok(job) = self.source.job(id.clone()).await else { continue };
            let ours = job.as_ref().is_some_and(|job| {
                job.state == JobState::Active
                    && job.worker_id.as_deref() == Some(self.worker_id.as_str())
                    && job.started_at == started_at
            });
            if !ours {
                let state = job.map(|job| job.state);
                let reason =
                    if state == Some(JobState::Cancelled) { CancelReason::Cancelled } else { CancelReason::LeaseLost };
                tracing::warn!(target: LOG, job = %id, state = ?state, "the claim is no longer this worker's; cancelling its handler");
                cancellation.cancel(reason);
            }
        }
    }
}

/// Heartbeats while claims are held (and, quiet and idle, to learn when
/// the signal is lifted); woken early by `beat_now`.
async fn heartbeats(shared: Arc<Shared>, finished: CancellationToken) {
    let mut failures = 0u32;
    loop {
        let due = {
            let held = shared.held();
            held.values().map(|held| held.extended_at + shared.interval(held.visibility)).min()
        };
        let quiet = shared.quiet.load(std::sync::atomic::Ordering::Relaxed);
        let wait = match due {
            Some(due) => due.saturating_duration_since(Instant::now()),
            None if quiet => shared.config.quiet_poll,
            None => Duration::from_secs(3600),
        };
        let woken = tokio::select! {
            () = finished.cancelled() => return,
            () = shared.reschedule.notified() => continue,
            () = shared.beat_now.notified() => true,
            () = tokio::time::sleep(wait) => false,
        };
        if !woken && due.is_none() && !quiet {
            continue;
        }
        match shared.heartbeat().await {
            Ok(_) => {
                if failures > 0 {
                    tracing::info!(target: LOG, failures, "heartbeats work again");
                }
                failures = 0;
            }
            Err(error) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(target: LOG, %error, "heartbeat failed");
                } else {
                    tracing::debug!(target: LOG, %error, failures, "heartbeat failed");
                }
                let pause = backoff(failures.min(5), Duration::from_millis(125), Duration::from_secs(2));
                tokio::select! {
                    () = finished.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Running,
    /// Told to terminate: releasing the jobs in hand.
    Terminating,
    /// Waiting to see whether svc is draining for a restart.
    Deciding,
    /// svc drains for a restart: waiting for it to come back.
    Recovering,
    Stopping,
}

struct PendingAck {
    seq: u64,
    job_id: String,
    result: Option<Value>,
    bytes: usize,
    /// An earlier attempt may have acked it already.
    maybe_applied: bool,
}

struct AckRound {
    batch: Vec<PendingAck>,
    fetched: usize,
    sent: Instant,
    outcome: Result<AcksAnswer>,
}

struct Dispatcher {
    shared: Arc<Shared>,
    handlers: Arc<HashMap<String, Arc<HandlerFn>>>,
    middleware: Arc<[Arc<dyn Middleware>]>,
    events: mpsc::UnboundedReceiver<Event>,
    until_idle: bool,
    mode: Mode,
    quiet: bool,
    next_seq: u64,
    running: HashSet<u64>,
    settling: usize,
    pending_claims: usize,
    to_ack: VecDeque<PendingAck>,
    ack_task: Option<(JoinHandle<AckRound>, bool)>,
    ack_failures: u32,
    ack_not_before: Instant,
    fetch_task: Option<FetchTask>,
    fetch_failures: u32,
    fetch_not_before: Instant,
    decide_task: Option<JoinHandle<bool>>,
    grace_until: Option<Instant>,
    idle_seen: bool,
    fatal: Option<Error>,
}

pub(super) async fn run(worker: Worker, until_idle: bool) -> Result<()> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        source: worker.source,
        worker_id: worker.worker_id,
        config: worker.config,
        held: Mutex::new(HashMap::new()),
        events: sender,
        beat_now: Notify::new(),
        reschedule: Notify::new(),
        quiet: std::sync::atomic::AtomicBool::new(false),
    });
    let finished = CancellationToken::new();
    let beats = tokio::spawn(heartbeats(shared.clone(), finished.clone()));
    let now = Instant::now();
    let mut dispatcher = Dispatcher {
        shared: shared.clone(),
        handlers: Arc::new(worker.handlers),
        middleware: worker.middleware.into(),
        events: receiver,
        until_idle,
        mode: Mode::Running,
        quiet: false,
        next_seq: 0,
        running: HashSet::new(),
        settling: 0,
        pending_claims: 0,
        to_ack: VecDeque::new(),
        ack_task: None,
        ack_failures: 0,
        ack_not_before: now,
        fetch_task: None,
        fetch_failures: 0,
        fetch_not_before: now,
        decide_task: None,
        grace_until: None,
        idle_seen: false,
        fatal: None,
    };
    tracing::info!(target: LOG, worker = %shared.worker_id, queues = ?shared.config.queues, concurrency = shared.config.concurrency, "worker started");
    dispatcher.run(worker.stop.graceful, worker.stop.now).await;
    finished.cancel();
    let _ = beats.await;
    tracing::info!(target: LOG, worker = %shared.worker_id, "worker stopped");
    let fatal = dispatcher.fatal.take();
    drop(dispatcher);
    // The worker may hold the last handle on an embedded svc, whose drop
    // waits for the engine's thread: that must not happen on a runtime
    // thread. Handler tasks just aborted may still hold a reference.
    let _ = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Arc::strong_count(&shared) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(shared);
    })
    .await;
    match fatal {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A plain fetch under way: its task, how many jobs it asks for, when it was sent.
type FetchTask = (JoinHandle<Result<Vec<Job>>>, usize, Instant);

/// Why the dispatcher woke up.
enum Wake {
    Event(Option<Event>),
    Acked(Option<AckRound>),
    Fetched((usize, Instant, Option<Result<Vec<Job>>>)),
    Decided(bool),
    Timer,
    GraceOver,
    Stop,
    StopNow,
}

/// Awaits an optional task, clearing it once done; pending forever when
/// there is none.
async fn join<T>(task: &mut Option<JoinHandle<T>>) -> Option<T> {
    let Some(handle) = task.as_mut() else { return std::future::pending().await };
    let outcome = handle.await.ok();
    *task = None;
    outcome
}

async fn join_ack(task: &mut Option<(JoinHandle<AckRound>, bool)>) -> Option<AckRound> {
    let Some((handle, _)) = task.as_mut() else { return std::future::pending().await };
    let outcome = handle.await.ok();
    *task = None;
    outcome
}

async fn join_fetch(task: &mut Option<FetchTask>) -> (usize, Instant, Option<Result<Vec<Job>>>) {
    let Some((handle, count, sent)) = task.as_mut() else { return std::future::pending().await };
    let (count, sent) = (*count, *sent);
    let outcome = handle.await.ok();
    *task = None;
    (count, sent, outcome)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

impl Dispatcher {
    fn config(&self) -> &WorkerBuilder {
        &self.shared.config
    }

    fn free_slots(&self) -> usize {
        self.config().concurrency.saturating_sub(self.running.len() + self.pending_claims)
    }

    fn fetching_allowed(&self) -> bool {
        self.mode == Mode::Running && !self.quiet && self.fatal.is_none()
    }

    fn fetch_outstanding(&self) -> bool {
        self.fetch_task.is_some() || self.ack_task.as_ref().is_some_and(|(_, fetches)| *fetches)
    }

    fn busy(&self) -> bool {
        !self.running.is_empty()
            || self.settling > 0
            || !self.to_ack.is_empty()
            || self.ack_task.is_some()
            || self.fetch_task.is_some()
    }

    async fn run(&mut self, graceful: CancellationToken, now: CancellationToken) {
        let mut stop_seen = false;
        let mut stop_now_seen = false;
        loop {
            self.start_work();
            if self.done() {
                return;
            }
            let ack_wait = (!self.to_ack.is_empty() && self.ack_task.is_none())
                .then_some(self.ack_not_before)
                .filter(|at| *at > Instant::now());
            let fetch_wait = (self.fetching_allowed() && !self.fetch_outstanding() && self.free_slots() > 0)
                .then_some(self.fetch_not_before)
                .filter(|at| *at > Instant::now());
            let grace = if self.mode == Mode::Stopping { self.grace_until } else { None };
            let (acking, fetching, deciding) =
                (self.ack_task.is_some(), self.fetch_task.is_some(), self.decide_task.is_some());
            let events = &mut self.events;
            let ack_task = &mut self.ack_task;
            let fetch_task = &mut self.fetch_task;
            let decide_task = &mut self.decide_task;
            let wake = tokio::select! {
                event = events.recv() => Wake::Event(event),
                round = join_ack(ack_task), if acking => Wake::Acked(round),
                fetched = join_fetch(fetch_task), if fetching => Wake::Fetched(fetched),
                decided = join(decide_task), if deciding => Wake::Decided(decided.unwrap_or(false)),
                () = sleep_until_opt(ack_wait), if ack_wait.is_some() => Wake::Timer,
                () = sleep_until_opt(fetch_wait), if fetch_wait.is_some() => Wake::Timer,
                () = sleep_until_opt(grace), if grace.is_some() => Wake::GraceOver,
                () = graceful.cancelled(), if !stop_seen => Wake::Stop,
                () = now.cancelled(), if !stop_now_seen => Wake::StopNow,
            };
            match wake {
                Wake::Event(Some(event)) => self.on_event(event),
                Wake::Event(None) | Wake::Timer => {}
                Wake::Acked(Some(round)) => self.on_acked(round),
                Wake::Acked(None) => tracing::error!(target: LOG, "an ack round stopped unexpectedly"),
                Wake::Fetched((count, sent, jobs)) => {
                    self.pending_claims -= count;
                    self.on_fetched(jobs, sent);
                }
                Wake::Decided(draining) => self.on_decided(draining),
                Wake::GraceOver => {
                    self.grace_until = None;
                    self.release_all(CancelReason::Shutdown);
                }
                Wake::Stop => {
                    stop_seen = true;
                    self.begin_stop(self.config().shutdown_grace);
                }
                Wake::StopNow => {
                    stop_now_seen = true;
                    self.begin_stop(Duration::ZERO);
                }
            }
        }
    }

    fn done(&self) -> bool {
        match self.mode {
            Mode::Stopping => !self.busy(),
            Mode::Running if self.until_idle => self.idle_seen && !self.busy(),
            Mode::Running => self.fatal.is_some() && !self.busy(),
            _ => false,
        }
    }

    /// Sends acks and fetches as the state allows.
    fn start_work(&mut self) {
        let now = Instant::now();
        if !self.to_ack.is_empty() && self.ack_task.is_none() && now >= self.ack_not_before {
            self.send_acks();
        }
        if self.fetching_allowed()
            && !self.fetch_outstanding()
            && self.to_ack.is_empty()
            && now >= self.fetch_not_before
            && !(self.until_idle && self.idle_seen)
        {
            let free = self.free_slots();
            if free > 0 {
                self.send_fetch(free);
            }
        }
        if self.mode == Mode::Terminating
            && self.running.is_empty()
            && self.settling == 0
            && self.to_ack.is_empty()
            && self.ack_task.is_none()
        {
            self.mode = Mode::Deciding;
            let source = self.shared.source.clone();
            self.decide_task = Some(tokio::spawn(async move { source.draining().await }));
        }
    }

    fn fetch_request(&self, count: usize, wait: Duration) -> Fetch {
        let mut fetch =
            Fetch::new(self.config().queues.clone()).count(count.min(100)).worker_id(&self.shared.worker_id).wait(wait);
        fetch.visibility_timeout = self.config().visibility_timeout;
        fetch
    }

    fn send_fetch(&mut self, free: usize) {
        let count = free.min(100);
        let wait = if self.until_idle { Duration::ZERO } else { self.config().poll_wait };
        let request = self.fetch_request(count, wait);
        let source = self.shared.source.clone();
        self.pending_claims += count;
        self.fetch_task = Some((tokio::spawn(async move { source.fetch(request).await }), count, Instant::now()));
    }

    fn send_acks(&mut self) {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = self.to_ack.front() {
            if !batch.is_empty() && (batch.len() >= ACKS_PER_REQUEST || bytes + next.bytes > ACK_BYTES_PER_REQUEST) {
                break;
            }
            bytes += next.bytes;
            batch.push(self.to_ack.pop_front().expect("an ack is queued"));
        }
        // The next claim rides along: only as many jobs as slots are free.
        let free = self.free_slots();
        let fetched = if self.fetching_allowed() && !self.fetch_outstanding() && free > 0 && !self.until_idle {
            free.min(100)
        } else {
            0
        };
        let mut acks = Acks::many(batch.iter().map(|ack| (ack.job_id.clone(), ack.result.clone())).collect())
            .worker_id(&self.shared.worker_id);
        if fetched > 0 {
            acks = acks.then_fetch(self.fetch_request(fetched, Duration::ZERO));
        }
        self.pending_claims += fetched;
        let source = self.shared.source.clone();
        let sent = Instant::now();
        let task = tokio::spawn(async move {
            let outcome = source.ack(acks).await;
            AckRound { batch, fetched, sent, outcome }
        });
        self.ack_task = Some((task, fetched > 0));
    }

    fn on_acked(&mut self, round: AckRound) {
        self.pending_claims -= round.fetched;
        match round.outcome {
            Ok(answer) => {
                self.ack_failures = 0;
                for (pending, outcome) in round.batch.iter().zip(answer.acks.iter()) {
                    if let Err(error) = &outcome.outcome
                        && !(pending.maybe_applied && error.current_state() == Some("completed"))
                    {
                        tracing::warn!(target: LOG, job = %pending.job_id, %error, "ack refused");
                    }
                    self.shared.held().remove(&pending.seq);
                }
                for job in answer.jobs {
                    self.start_job(job, round.sent);
                }
            }
            Err(error) if !error.retryable() => {
                tracing::error!(target: LOG, %error, jobs = round.batch.len(), "acks refused; failing the jobs");
                for pending in round.batch {
                    let failure = Failure::new("ack_refused", format!("svc refused the ack: {error}"));
                    self.spawn_settle(pending.seq, failure, false);
                }
            }
            Err(error) => {
                self.ack_failures += 1;
                let maybe_applied = error.maybe_applied();
                let now = Instant::now();
                tracing::warn!(target: LOG, %error, jobs = round.batch.len(), "acks failed; trying again");
                for mut pending in round.batch.into_iter().rev() {
                    if self.shared.lease_until(pending.seq).is_some_and(|until| until <= now) {
                        tracing::error!(target: LOG, job = %pending.job_id, "the claim ran out before its ack got through");
                        self.shared.held().remove(&pending.seq);
                        continue;
                    }
                    pending.maybe_applied |= maybe_applied;
                    self.to_ack.push_front(pending);
                }
                let config = self.config();
                self.ack_not_before = now + backoff(self.ack_failures - 1, config.reconnect_base, config.reconnect_max);
            }
        }
    }

    fn on_fetched(&mut self, jobs: Option<Result<Vec<Job>>>, sent: Instant) {
        match jobs {
            None => {}
            Some(Ok(jobs)) => {
                if self.fetch_failures > 0 {
                    tracing::info!(target: LOG, failures = self.fetch_failures, "fetch works again");
                }
                self.fetch_failures = 0;
                let wait = if self.until_idle { Duration::ZERO } else { self.config().poll_wait };
                if jobs.is_empty() {
                    if self.until_idle {
                        self.idle_seen = self.running.is_empty();
                    } else if sent.elapsed() + Duration::from_secs(1) < wait {
                        // A long poll answered early with nothing: told to be
                        // quiet or to terminate, or svc drains. A heartbeat says which.
                        self.fetch_not_before = Instant::now() + Duration::from_secs(1);
                        self.shared.beat_now.notify_one();
                    }
                }
                for job in jobs {
                    self.start_job(job, sent);
                }
            }
            Some(Err(error)) => {
                if error.is_auth() || matches!(error.code(), "invalid_request" | "invalid_argument" | "not_found") {
                    tracing::error!(target: LOG, %error, "fetch refused: the worker cannot work");
                    self.fatal = Some(error);
                    self.begin_stop(self.config().shutdown_grace);
                    return;
                }
                self.fetch_failures += 1;
                let config = self.config();
                let delay = backoff(self.fetch_failures - 1, config.reconnect_base, config.reconnect_max);
                tracing::warn!(target: LOG, %error, failures = self.fetch_failures, ?delay, "fetch failed; trying again");
                self.fetch_not_before = Instant::now() + delay;
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Done { seq, outcome } => {
                self.running.remove(&seq);
                match outcome {
                    Outcome::Ack(result) => {
                        let Some(job_id) = self.shared.held().get(&seq).map(|held| held.job_id.clone()) else { return };
                        let result = (!result.is_null()).then_some(result);
                        let bytes = result.as_ref().map_or(0, |result| result.to_string().len());
                        if bytes > RESULT_BYTES_MAX {
                            let failure = Failure::new(
                                "invalid_result",
                                format!("the result is {bytes} bytes of JSON; svc takes at most {RESULT_BYTES_MAX}"),
                            );
                            self.spawn_settle(seq, failure, false);
                            return;
                        }
                        self.to_ack.push_back(PendingAck { seq, job_id, result, bytes, maybe_applied: false });
                    }
                    Outcome::Fail(failure) => self.spawn_settle(seq, failure, false),
                    Outcome::Release(failure) => self.spawn_settle(seq, failure, true),
                    Outcome::Drop(reason) => {
                        if let Some(held) = self.shared.held().remove(&seq) {
                            tracing::info!(target: LOG, job = %held.job_id, reason = reason.as_str(), "the job is no longer this worker's; its outcome is dropped");
                        }
                    }
                }
            }
            Event::Settled => self.settling -= 1,
            Event::Signal(state) => self.on_signal(state),
        }
    }

    fn on_signal(&mut self, state: WorkerState) {
        match state {
            WorkerState::Quiet => {
                if !self.quiet {
                    tracing::info!(target: LOG, "told to be quiet: finishing the jobs in hand, taking nothing new");
                    self.quiet = true;
                    self.shared.quiet.store(true, std::sync::atomic::Ordering::Relaxed);
                    self.shared.reschedule.notify_one();
                    self.drop_fetch();
                }
            }
            WorkerState::Terminate => {
                if self.mode == Mode::Running {
                    tracing::warn!(target: LOG, jobs = self.running.len(), "told to terminate: releasing the jobs in hand");
                    self.mode = Mode::Terminating;
                    self.drop_fetch();
                    self.cancel_running(CancelReason::Terminate);
                }
            }
            _ => {
                if self.quiet {
                    tracing::info!(target: LOG, "the signal was lifted: fetching again");
                    self.quiet = false;
                    self.shared.quiet.store(false, std::sync::atomic::Ordering::Relaxed);
                    self.shared.reschedule.notify_one();
                }
            }
        }
    }

    /// What the check after a terminate found (`draining`: svc drains for a
    /// restart), or, while recovering, that svc is back.
    fn on_decided(&mut self, outcome: bool) {
        match self.mode {
            Mode::Recovering if outcome => {
                tracing::info!(target: LOG, "svc is back: fetching again");
                self.mode = Mode::Running;
                self.fetch_not_before = Instant::now();
            }
            Mode::Deciding if outcome => {
                tracing::info!(target: LOG, "svc is shutting down; waiting for it to come back");
                self.mode = Mode::Recovering;
                let source = self.shared.source.clone();
                let shared = self.shared.clone();
                let config = self.config().clone();
                self.decide_task = Some(tokio::spawn(async move {
                    for attempt in 0.. {
                        tokio::time::sleep(backoff(attempt, config.reconnect_base, config.reconnect_max)).await;
                        if !source.draining().await
                            && let Ok(state) = shared.heartbeat().await
                            && state != WorkerState::Terminate
                        {
                            return true;
                        }
                    }
                    false
                }));
            }
            Mode::Deciding => {
                tracing::info!(target: LOG, "told to terminate: stopping");
                self.mode = Mode::Stopping;
            }
            _ => {}
        }
    }

    fn begin_stop(&mut self, grace: Duration) {
        if let Some(task) = self.decide_task.take() {
            task.abort();
        }
        if self.mode != Mode::Stopping {
            tracing::info!(target: LOG, jobs = self.running.len(), ?grace, "stopping: taking no new work");
        }
        self.mode = Mode::Stopping;
        self.drop_fetch();
        let until = Instant::now() + grace;
        self.grace_until = Some(self.grace_until.map_or(until, |current| current.min(until)));
        if grace.is_zero() {
            self.release_all(CancelReason::Shutdown);
        }
    }

    fn release_all(&mut self, reason: CancelReason) {
        if !self.running.is_empty() {
            tracing::warn!(target: LOG, jobs = self.running.len(), "grace period over: releasing the jobs in hand");
        }
        self.cancel_running(reason);
    }

    fn cancel_running(&self, reason: CancelReason) {
        let held = self.shared.held();
        for seq in &self.running {
            if let Some(held) = held.get(seq) {
                held.cancellation.cancel(reason);
            }
        }
    }

    /// Drops a waiting fetch (jobs it may have claimed as it was dropped
    /// come back after their visibility timeout).
    fn drop_fetch(&mut self) {
        if let Some((handle, count, _)) = self.fetch_task.take() {
            handle.abort();
            self.pending_claims -= count;
        }
    }

    fn start_job(&mut self, job: Job, sent: Instant) {
        self.idle_seen = false;
        let seq = self.next_seq;
        self.next_seq += 1;
        let visibility = self.shared.visibility_of(&job);
        let cancellation = Arc::new(Cancellation::default());
        self.shared.held().insert(
            seq,
            Held {
                job_id: job.id.clone(),
                started_at: job.started_at.clone(),
                visibility,
                extended_at: sent,
                lease_until: sent + visibility,
                cancellation: cancellation.clone(),
            },
        );
        self.running.insert(seq);
        self.shared.reschedule.notify_one();
        let deadline = sent + Duration::from_millis(job.timeout_ms.max(1));
        let handler = self.handlers.get(&job.job_type).cloned();
        let known = || {
            let mut types: Vec<&String> = self.handlers.keys().collect();
            types.sort();
            types.into_iter().cloned().collect::<Vec<_>>()
        };
        let unknown = handler.is_none().then(known);
        let context = JobContext {
            inner: Arc::new(ContextInner { job, deadline, cancellation, shared: self.shared.clone(), seq }),
        };
        let middleware = self.middleware.clone();
        let shared = self.shared.clone();
        if matches!(self.mode, Mode::Stopping | Mode::Terminating) {
            context.inner.cancellation.cancel(CancelReason::Shutdown);
        }
        tokio::spawn(async move {
            let outcome = match (handler, unknown) {
                (Some(handler), _) => execute(context, handler, middleware, shared.config.abort_grace).await,
                (None, known) => unknown_type(&context, known.unwrap_or_default()),
            };
            let _ = shared.events.send(Event::Done { seq, outcome });
        });
    }

    /// Nacks (or releases) a job in a task of its own, trying again through
    /// failures until its claim runs out.
    fn spawn_settle(&mut self, seq: u64, failure: Failure, requeue: bool) {
        let Some((job_id, started_at)) =
            self.shared.held().get(&seq).map(|held| (held.job_id.clone(), held.started_at.clone()))
        else {
            return;
        };
        self.settling += 1;
        let shared = self.shared.clone();
        tokio::spawn(async move {
            settle(&shared, seq, job_id, started_at, failure, requeue).await;
            shared.held().remove(&seq);
            let _ = shared.events.send(Event::Settled);
        });
    }
}

async fn settle(
    shared: &Shared,
    seq: u64,
    job_id: String,
    started_at: Option<String>,
    failure: Failure,
    requeue: bool,
) {
    let config = &shared.config;
    let mut maybe_applied = false;
    for attempt in 0u32.. {
        if maybe_applied && !still_held(shared, seq, &job_id, &started_at).await {
            return;
        }
        let nack = shared.source.nack(job_id.clone(), failure.clone(), requeue, Some(shared.worker_id.clone()));
        match nack.await {
            Ok(_) => return,
            Err(error) if error.is_conflict() || error.is_not_found() => {
                if !maybe_applied {
                    tracing::warn!(target: LOG, job = %job_id, %error, "nack refused");
                }
                return;
            }
            Err(error) if !error.retryable() => {
                tracing::error!(target: LOG, job = %job_id, %error, "nack refused");
                return;
            }
            Err(error) => {
                maybe_applied |= error.maybe_applied() && shared.source.answers_can_be_lost();
                if shared.lease_until(seq).is_none_or(|until| until <= Instant::now()) {
                    tracing::error!(target: LOG, job = %job_id, %error, "the claim ran out before the nack got through");
                    return;
                }
                tracing::warn!(target: LOG, job = %job_id, %error, "nack failed; trying again");
                tokio::time::sleep(backoff(attempt, config.reconnect_base, config.reconnect_max)).await;
            }
        }
    }
}

/// Whether svc still shows this very claim as ours (before a nack whose
/// earlier attempt may have been applied is sent again).
async fn still_held(shared: &Shared, seq: u64, job_id: &str, started_at: &Option<String>) -> bool {
    loop {
        match shared.source.job(job_id.to_string()).await {
            Ok(Some(job)) => {
                return job.state == JobState::Active
                    && job.worker_id.as_deref() == Some(shared.worker_id.as_str())
                    && &job.started_at == started_at;
            }
            Ok(None) => return false,
            Err(_) if shared.lease_until(seq).is_none_or(|until| until <= Instant::now()) => return false,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn unknown_type(context: &JobContext, known: Vec<String>) -> Outcome {
    let job = context.job();
    tracing::warn!(target: LOG, job = %job.id, job_type = %job.job_type, "no handler for this job type");
    let mut details = Map::new();
    details.insert("job_type".into(), json!(job.job_type));
    details.insert("worker_id".into(), json!(context.worker_id()));
    details.insert("handled_types".into(), json!(known));
    let handled = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    Outcome::Fail(
        Failure::new(
            "unknown_job_type",
            format!(
                "worker {} has no handler for job type {:?} (it handles: {handled})",
                context.worker_id(),
                job.job_type
            ),
        )
        .details(details),
    )
}

fn release_failure(reason: CancelReason, worker_id: &str) -> Failure {
    match reason {
        CancelReason::Terminate => {
            Failure::new("worker_terminated", format!("released by worker {worker_id}: told to terminate"))
        }
        _ => Failure::new("worker_shutdown", format!("released by worker {worker_id}: shutting down")),
    }
}

/// Runs the handler (through the middleware) in a task of its own, so that
/// a timeout or a release can drop it and a panic fails only its job.
async fn execute(
    context: JobContext,
    handler: Arc<HandlerFn>,
    middleware: Arc<[Arc<dyn Middleware>]>,
    abort_grace: Duration,
) -> Outcome {
    let cancellation = context.inner.cancellation.clone();
    let deadline = context.deadline();
    let worker_id = context.worker_id().to_string();
    let job_id = context.job_id().to_string();
    let timeout_ms = context.job().timeout_ms;
    let next = Next { chain: middleware, index: 0, handler, args: context.job().args.clone() };
    let mut task = tokio::spawn(next.run(context));
    // A handler that fails because it was cancelled (it noticed the token
    // and returned an error) is judged by why it was cancelled.
    let finished = |joined: std::result::Result<std::result::Result<Value, JobError>, tokio::task::JoinError>| {
        let failed = match joined {
            Ok(Ok(result)) => return Outcome::Ack(result),
            Ok(Err(error)) => error.into_failure(),
            Err(error) => panic_failure(error),
        };
        match cancellation.reason() {
            Some(reason @ (CancelReason::Shutdown | CancelReason::Terminate)) => {
                Outcome::Release(release_failure(reason, &worker_id))
            }
            Some(reason @ (CancelReason::Cancelled | CancelReason::LeaseLost)) => Outcome::Drop(reason),
            _ => Outcome::Fail(failed),
        }
    };
    tokio::select! {
        biased;
        joined = &mut task => finished(joined),
        () = tokio::time::sleep_until(deadline.into()) => {
            cancellation.cancel(CancelReason::Timeout);
            task.abort();
            tracing::warn!(target: LOG, job = %job_id, timeout_ms, "the job ran past its timeout");
            let mut details = Map::new();
            details.insert("limit_ms".into(), json!(timeout_ms));
            Outcome::Fail(Failure::new("timeout", format!("the job ran past its timeout of {timeout_ms} ms")).details(details))
        }
        () = cancellation.token.cancelled() => {
            let reason = cancellation.reason().unwrap_or(CancelReason::Shutdown);
            match reason {
                CancelReason::Cancelled | CancelReason::LeaseLost => {
                    task.abort();
                    Outcome::Drop(reason)
                }
                CancelReason::Timeout => {
                    task.abort();
                    Outcome::Fail(Failure::new("timeout", format!("the job ran past its timeout of {timeout_ms} ms")))
                }
                _ => {
                    // Released: a handler that finishes within the abort
                    // grace is still acked.
                    let late = tokio::time::timeout(abort_grace, &mut task).await;
                    match late {
                        Ok(Ok(Ok(result))) => Outcome::Ack(result),
                        _ => {
                            task.abort();
                            Outcome::Release(release_failure(reason, &worker_id))
                        }
                    }
                }
            }
        }
    }
}

fn panic_failure(error: tokio::task::JoinError) -> Failure {
    if !error.is_panic() {
        return Failure::new("cancelled", "the handler's task was cancelled");
    }
    let payload = error.into_panic();
    let message = payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the handler panicked".to_string());
    Failure::new("panic", message)
}
