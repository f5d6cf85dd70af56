//! The commit pipeline: what a write waits for between the engine deciding it
//! and the requester hearing of it.
//!
//! After each turn the engine queues a [`Chunk`]: the turn's records, already
//! encoded, with the view changes and replies that wait for them. The sync
//! thread owns the log. Each cycle it takes every queued chunk, writes them as
//! one frame, runs `fdatasync` once, then publishes the chunks' changes to the
//! read view and sends their replies, in queue order. While it syncs, the
//! engine goes on deciding commands and queueing chunks, so a slow disk makes
//! frames bigger instead of leaving the engine idle, and the engine never
//! waits for the disk. A frame is only written after every earlier frame is
//! durable, which the recovery rule relies on.
//!
//! Group commit takes what the engine is about to queue: while the engine is
//! in the middle of a turn, a cycle waits for that turn's chunk (at most a
//! short delay) before it writes, so one sync serves the whole turn instead
//! of the turn waiting a full extra sync. It never waits for requests that
//! have not reached the engine yet: in a closed loop those come back only
//! after a network round trip, and waiting for them leaves the disk idle.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::command::{Cancelled, EngineError, Reply};
use super::cron::CronEntry;
use super::events::Event;
use super::view::{QueueSummary, ReadView};
use super::workers::{WorkerEntry, WorkerSignal};
use crate::job::{Job, JobId};
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use crate::storage::{StorageError, WalWriter};

/// A reply that waits for its commit.
pub(crate) enum Outgoing {
    Jobs(Reply<Vec<Arc<Job>>>, Result<Vec<Arc<Job>>, EngineError>),
    Job(Reply<Arc<Job>>, Result<Arc<Job>, EngineError>),
    Cancelled(Reply<Cancelled>, Result<Cancelled, EngineError>),
    Unit(Reply<()>, Result<(), EngineError>),
    Beat(Reply<(usize, Option<WorkerSignal>)>, Result<(usize, Option<WorkerSignal>), EngineError>),
    Worker(Reply<WorkerEntry>, Result<WorkerEntry, EngineError>),
    CronPut(Reply<(Arc<CronEntry>, bool)>, Result<(Arc<CronEntry>, bool), EngineError>),
    Cron(Reply<Arc<CronEntry>>, Result<Arc<CronEntry>, EngineError>),
}

impl Outgoing {
    /// Sends the outcome, or `failure` instead of a success when the commit failed.
    pub fn send(self, failure: Option<&EngineError>) {
        fn pick<T>(result: Result<T, EngineError>, failure: Option<&EngineError>) -> Result<T, EngineError> {
            match (result, failure) {
                (Ok(_), Some(error)) => Err(error.clone()),
                (result, _) => result,
            }
        }
        // A requester that went away (timeout, closed connection) is no error.
        let _ = match self {
            Outgoing::Jobs(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Job(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Cancelled(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Unit(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Beat(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Worker(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::CronPut(reply, result) => reply.send(pick(result, failure)).map_err(drop),
            Outgoing::Cron(reply, result) => reply.send(pick(result, failure)).map_err(drop),
        };
    }
}

/// The error every reply of a failed commit gets.
pub(crate) fn storage_failed() -> EngineError {
    EngineError::Unavailable { reason: "storage_failed" }
}

/// What changed in the read view during one turn, copied out of the state at
/// its end (`None` removes an entry).
#[derive(Default)]
pub(crate) struct ViewDelta {
    pub jobs: Vec<(JobId, Option<Arc<Job>>)>,
    pub workers: Vec<(String, Option<WorkerEntry>)>,
    pub crons: Vec<(String, Option<Arc<CronEntry>>)>,
    pub queues: Option<Vec<QueueSummary>>,
    pub events: Vec<Event>,
}

impl ViewDelta {
    pub fn publish(self, view: &ReadView) {
        if !self.workers.is_empty() {
            view.publish_workers(self.workers.into_iter());
        }
        if !self.crons.is_empty() {
            view.publish_crons(self.crons.into_iter());
        }
        if !self.jobs.is_empty() {
            view.publish_jobs(self.jobs.into_iter());
        }
        if let Some(queues) = self.queues {
            view.publish_queues(queues);
        }
        if !self.events.is_empty() {
            view.publish_events(self.events.into_iter());
        }
    }
}

/// One turn's output: encoded record sequences (none when the turn changed
/// nothing durable), then what to publish and answer once they are synced.
pub(crate) struct Chunk {
    /// Each at most half a frame, so any one fits a frame.
    pub sequences: Vec<Vec<u8>>,
    pub delta: ViewDelta,
    pub replies: Vec<Outgoing>,
}

/// Work for the sync thread, in order.
enum Task {
    Commit(Chunk),
    /// Once everything queued before is durable: start a new segment and
    /// answer with its index (a snapshot boundary).
    Rotate(crossbeam_channel::Sender<Result<u64, StorageError>>),
    /// Answer once everything queued before is durable.
    Barrier(crossbeam_channel::Sender<()>),
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    /// When the oldest task was queued.
    since: Option<Instant>,
    /// The engine is in a turn whose chunk is not queued yet.
    engine_busy: bool,
    /// A rotation or barrier is queued: no waiting for the engine.
    urgent: bool,
    stopping: bool,
}

impl Queue {
    /// Whether the sync thread should take the queued tasks now.
    fn ready(&self, commit_delay: Duration) -> bool {
        let waited = self.since.map_or(Duration::ZERO, |since| since.elapsed());
        self.urgent || self.stopping || !self.engine_busy || waited >= commit_delay
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Set for good when a write or sync fails.
    failed: AtomicBool,
}

/// The sync thread's side of the pipeline, as the engine holds it.
pub(crate) struct Syncer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the sync thread, which takes over the log.
    pub fn start(wal: WalWriter, view: Arc<ReadView>, commit_delay: Duration) -> std::io::Result<Syncer> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            failed: AtomicBool::new(false),
        });
        let mut thread = SyncThread { shared: shared.clone(), wal, view, commit_delay, payload: Vec::new() };
        let handle = std::thread::Builder::new().name("svc-wal-sync".into()).spawn(move || thread.run())?;
        Ok(Syncer { shared, thread: Some(handle) })
    }

    /// Whether a write or sync failed; the log then takes nothing more.
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Tells the sync thread that a turn began: a cycle about to start may
    /// wait for its chunk.
    pub fn turn_started(&self) {
        self.shared.queue.lock().engine_busy = true;
    }

    /// Tells the sync thread that the turn ended without a chunk.
    pub fn turn_ended(&self) {
        let mut queue = self.shared.queue.lock();
        let was_busy = std::mem::replace(&mut queue.engine_busy, false);
        let waiting = !queue.tasks.is_empty();
        drop(queue);
        if was_busy && waiting {
            self.shared.wake.notify_one();
        }
    }

    /// Queues a turn's output; the turn is over.
    pub fn commit(&self, chunk: Chunk) {
        self.push(Task::Commit(chunk), false);
    }

    /// Starts a new segment once everything queued is durable; the new index.
    pub fn rotate(&self) -> Result<u64, StorageError> {
        let (answer, answered) = crossbeam_channel::bounded(1);
        self.push(Task::Rotate(answer), true);
        answered.recv().unwrap_or(Err(StorageError::Poisoned))
    }

    /// Waits until everything queued so far is durable (or failed).
    pub fn barrier(&self) {
        let (answer, answered) = crossbeam_channel::bounded(1);
        self.push(Task::Barrier(answer), true);
        let _ = answered.recv();
    }

    fn push(&self, task: Task, urgent: bool) {
        let mut queue = self.shared.queue.lock();
        queue.tasks.push_back(task);
        queue.urgent |= urgent;
        queue.since.get_or_insert_with(Instant::now);
        if !urgent {
            queue.engine_busy = false;
        }
        drop(queue);
        self.shared.wake.notify_one();
    }

    /// Lets the thread finish what is queued and waits for it.
    pub fn stop(&mut self) {
        self.shared.queue.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct SyncThread {
    shared: Arc<Shared>,
    wal: WalWriter,
    view: Arc<ReadView>,
    commit_delay: Duration,
    payload: Vec<u8>,
}

impl SyncThread {
    fn run(&mut self) {
        while let Some(tasks) = self.next_tasks() {
            let mut chunks = Vec::new();
            for task in tasks {
                match task {
                    Task::Commit(chunk) => chunks.push(chunk),
                    Task::Rotate(answer) => {
                        self.commit(std::mem::take(&mut chunks));
                        let result = if self.failed() { Err(StorageError::Poisoned) } else { self.wal.rotate() };
                        if result.is_err() {
                            self.fail();
                        }
                        let _ = answer.send(result);
                    }
                    Task::Barrier(answer) => {
                        self.commit(std::mem::take(&mut chunks));
                        let _ = answer.send(());
                    }
                }
            }
            self.commit(chunks);
        }
    }

    /// Waits for work, and for company when the last cycle had some; `None`
    /// once stopped with nothing left.
    fn next_tasks(&mut self) -> Option<VecDeque<Task>> {
        let mut queue = self.shared.queue.lock();
        loop {
            if queue.tasks.is_empty() {
                if queue.stopping {
                    return None;
                }
                self.shared.wake.wait(&mut queue);
                continue;
            }
            if queue.ready(self.commit_delay) {
                break;
            }
            let waited = queue.since.map_or(Duration::ZERO, |since| since.elapsed());
            self.shared.wake.wait_for(&mut queue, self.commit_delay.saturating_sub(waited));
        }
        queue.since = None;
        queue.urgent = false;
        Some(std::mem::take(&mut queue.tasks))
    }

    fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    fn fail(&self) {
        self.shared.failed.store(true, Ordering::SeqCst);
        self.view.set_storage_failed();
    }

    /// Writes the chunks' records as frames of at most the frame size, each
    /// synced before the next is written, then publishes and replies.
    fn commit(&mut self, chunks: Vec<Chunk>) {
        if chunks.is_empty() {
            return;
        }
        let mut ok = !self.failed();
        self.payload.clear();
        for sequence in chunks.iter().flat_map(|chunk| &chunk.sequences) {
            if !ok {
                break;
            }
            if !self.payload.is_empty() && self.payload.len() + sequence.len() > FRAME_PAYLOAD_BYTES_MAX {
                ok = self.write_and_sync();
                self.payload.clear();
            }
            self.payload.extend_from_slice(sequence);
        }
        if ok && !self.payload.is_empty() {
            ok = self.write_and_sync();
        }
        if !ok {
            self.fail();
        }
        let failure = (!ok).then(storage_failed);
        for chunk in chunks {
            if ok {
                chunk.delta.publish(&self.view);
            }
            chunk.replies.into_iter().for_each(|reply| reply.send(failure.as_ref()));
        }
    }

    fn write_and_sync(&mut self) -> bool {
        let result = self.wal.append(&self.payload).and_then(|written| written.sync());
        if let Err(error) = &result {
            self.wal.poison();
            crate::logging::error(
                "write-ahead log failed; refusing all writes until restart",
                &[("error", error.to_string().into())],
            );
        }
        result.is_ok()
    }
}
