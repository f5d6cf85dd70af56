//! A reference model of the engine, and a runner that applies the same
//! operations to both and reports the first disagreement. Shared by the
//! model-based test and the fuzz target; not part of the library. The model-based
//! test (`tests/model.rs`) feeds it random sequences from proptest; the fuzz
//! target `fuzz/fuzz_targets/engine_model.rs` feeds it sequences decoded from
//! bytes with [`ops_from_bytes`].
//!
//! The model is deliberately plain: a map of jobs, each with its state,
//! attempt count and deadlines, the ordering rules of docs/api.md, "Fetch", and
//! the cap on terminal jobs held (oldest pruned first, discarded ones last),
//! unique policies (one of three keys, each conflict policy, every live
//! state covered), staged jobs with their activation, and workflows
//! (chains, groups, batches with callbacks, cancels), each moved on as its
//! jobs end by the rules of docs/api.md, "Workflows".

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

use svc::backend::Backend;
use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, EngineError, Entropy, FetchRequest, WorkflowState};
use svc::job::{FailureReport, JobDefaults, JobId, JobState, parse_enqueue_body};
use svc::storage::PowerLossFileSystem;

const START: i64 = 1_800_000_000_000;
const VISIBILITY_MS: i64 = 2500;
const QUEUES: [&str; 2] = ["q0", "q1"];
/// The engine under test holds at most this many terminal jobs.
const TERMINAL_JOBS_MAX: usize = 6;

macro_rules! check {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

macro_rules! check_eq {
    ($left:expr, $right:expr) => {
        check_eq!($left, $right, "values differ")
    };
    ($left:expr, $right:expr, $($message:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!("{}: engine {:?}, model {:?}", format!($($message)+), left, right));
        }
    }};
}

/// One step of a sequence. `pick` values choose among the jobs made so far.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `unique`: (key 0..3, policy 0 reject / 1 ignore / 2 replace).
    Enqueue {
        queue: usize,
        priority: i32,
        max_attempts: u32,
        unique: Option<(u8, u8)>,
        staged: bool,
    },
    Activate {
        pick: usize,
    },
    Fetch {
        queues: Vec<usize>,
        count: usize,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
        requeue: bool,
    },
    Cancel {
        pick: usize,
    },
    DeadLetterRetry {
        pick: usize,
    },
    DeadLetterDelete {
        pick: usize,
    },
    Heartbeat {
        picks: Vec<usize>,
    },
    Advance {
        ms: i64,
    },
    Restart {
        clean: bool,
    },
    Pause {
        queue: usize,
        paused: bool,
    },
    /// `kind` 0 chain, 1 group, 2 batch; `callbacks`: a batch's, as bits
    /// (1 on_complete, 2 on_success, 4 on_failure; none means on_complete).
    CreateWorkflow {
        kind: u8,
        size: usize,
        queue: usize,
        callbacks: u8,
    },
    CancelWorkflow {
        pick: usize,
    },
}

/// The model's view of one job.
#[derive(Debug, Clone, PartialEq)]
struct ModelJob {
    queue: usize,
    priority: i32,
    max_attempts: u32,
    state: JobState,
    attempt: u32,
    entered_at: i64,
    retry_at: Option<i64>,
    visibility_deadline: Option<i64>,
    /// When it last became terminal.
    ended_at: i64,
    unique_key: Option<u8>,
    /// A workflow's job: not to be activated by the endpoint.
    owned: bool,
}

/// The model's view of one workflow.
#[derive(Debug, Clone, PartialEq)]
struct ModelWorkflow {
    kind: u8,
    members: Vec<JobId>,
    /// How each member first ended.
    outcomes: Vec<Option<JobState>>,
    /// (which: 0 complete, 1 success, 2 failure; the job id the engine gave
    /// it; fired; how it first ended).
    callbacks: Vec<(u8, JobId, bool, Option<JobState>)>,
    state: WorkflowState,
}

#[derive(Default)]
struct Model {
    now: i64,
    jobs: BTreeMap<JobId, ModelJob>,
    workflows: BTreeMap<svc::job::WorkflowId, ModelWorkflow>,
    /// Every workflow ever made, for picking.
    workflow_ids: Vec<svc::job::WorkflowId>,
    /// Which of `QUEUES` are paused.
    paused: [bool; 2],
    /// Every id ever made, deleted ones included, for picking targets.
    ids: Vec<JobId>,
}

impl Model {
    fn pick(&self, pick: usize) -> Option<JobId> {
        (!self.ids.is_empty()).then(|| self.ids[pick % self.ids.len()])
    }

    /// What the engine must answer for a report on `id` (ack, nack).
    fn expect_active(&self, id: JobId) -> Result<(), &'static str> {
        match self.jobs.get(&id) {
            None => Err("not_found"),
            Some(job) if job.state != JobState::Active => Err("conflict"),
            Some(_) => Ok(()),
        }
    }

    fn make_available(job: &mut ModelJob, now: i64) {
        job.state = JobState::Available;
        job.entered_at = now;
        job.retry_at = None;
        job.visibility_deadline = None;
    }

    /// The jobs a fetch must claim: every available job of the listed queues,
    /// ranked by the first place its queue has in the list, then priority
    /// (high first), then entry time, then id; the first `count` of them.
    fn choose(&self, queues: &[usize], count: usize) -> Vec<JobId> {
        let place = |queue: usize| queues.iter().position(|listed| *listed == queue);
        let mut ranked: Vec<_> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.state == JobState::Available && !self.paused[job.queue])
            .filter_map(|(id, job)| Some(((place(job.queue)?, -job.priority, job.entered_at, *id), *id)))
            .collect();
        ranked.sort();
        ranked.into_iter().take(count).map(|(_, id)| id).collect()
    }

    fn new_job(queue: usize, state: JobState, now: i64, owned: bool) -> ModelJob {
        ModelJob {
            queue,
            priority: 0,
            max_attempts: 1,
            state,
            attempt: 0,
            entered_at: now,
            retry_at: None,
            visibility_deadline: None,
            ended_at: 0,
            unique_key: None,
            owned,
        }
    }

    fn cancel_job(&mut self, id: JobId) {
        let now = self.now;
        if let Some(job) = self.jobs.get_mut(&id).filter(|job| !job.state.is_terminal()) {
            job.state = JobState::Cancelled;
            job.ended_at = now;
            job.visibility_deadline = None;
            job.retry_at = None;
        }
    }

    /// Moves every running workflow on until nothing changes: records how
    /// members and callbacks first ended, starts the next chain step, fires
    /// a batch's callbacks, and ends workflows.
    fn settle(&mut self) {
        let failed = |state: JobState| matches!(state, JobState::Discarded | JobState::Cancelled);
        loop {
            let mut changed = false;
            let ids: Vec<svc::job::WorkflowId> = self.workflows.keys().copied().collect();
            for id in ids {
                let mut flow = self.workflows[&id].clone();
                for (index, member) in flow.members.iter().enumerate() {
                    if flow.outcomes[index].is_none()
                        && let Some(job) = self.jobs.get(member).filter(|job| job.state.is_terminal())
                    {
                        flow.outcomes[index] = Some(job.state);
                        changed = true;
                    }
                }
                for callback in flow.callbacks.iter_mut().filter(|callback| callback.2 && callback.3.is_none()) {
                    if let Some(job) = self.jobs.get(&callback.1).filter(|job| job.state.is_terminal()) {
                        callback.3 = Some(job.state);
                        changed = true;
                    }
                }
                if flow.state == WorkflowState::Running {
                    let any_failed = flow.outcomes.iter().flatten().any(|state| failed(*state));
                    let all_ended = flow.outcomes.iter().all(Option::is_some);
                    let fired_any = flow.callbacks.iter().any(|callback| callback.2);
                    match flow.kind {
                        0 if any_failed => {
                            flow.state = WorkflowState::Failed;
                            for member in &flow.members {
                                if self.jobs.get(member).is_some_and(|job| job.state == JobState::Pending) {
                                    self.cancel_job(*member);
                                }
                            }
                            changed = true;
                        }
                        0 if all_ended => {
                            flow.state = WorkflowState::Completed;
                            changed = true;
                        }
                        0 => {
                            let next = flow.outcomes.iter().position(Option::is_none).expect("not all ended");
                            let now = self.now;
                            let pending =
                                self.jobs.get_mut(&flow.members[next]).filter(|job| job.state == JobState::Pending);
                            if let Some(job) = pending {
                                Self::make_available(job, now);
                                changed = true;
                            }
                        }
                        1 if all_ended => {
                            flow.state = if any_failed { WorkflowState::Failed } else { WorkflowState::Completed };
                            changed = true;
                        }
                        2 if all_ended && !fired_any => {
                            let now = self.now;
                            for callback in flow.callbacks.iter_mut() {
                                let fires = match callback.0 {
                                    0 => true,
                                    1 => !any_failed,
                                    _ => any_failed,
                                };
                                if fires {
                                    callback.2 = true;
                                    self.jobs.insert(callback.1, Self::new_job(0, JobState::Available, now, true));
                                    self.ids.push(callback.1);
                                }
                            }
                            if !flow.callbacks.iter().any(|callback| callback.2) {
                                flow.state = if any_failed { WorkflowState::Failed } else { WorkflowState::Completed };
                            }
                            changed = true;
                        }
                        2 if fired_any
                            && flow
                                .callbacks
                                .iter()
                                .filter(|callback| callback.2)
                                .all(|callback| callback.3.is_some()) =>
                        {
                            let callback_failed = flow.callbacks.iter().filter_map(|callback| callback.3).any(failed);
                            flow.state = if callback_failed { WorkflowState::Failed } else { WorkflowState::Completed };
                            changed = true;
                        }
                        _ => {}
                    }
                }
                self.workflows.insert(id, flow);
            }
            if !changed {
                return;
            }
        }
    }

    /// Terminal jobs past the cap go, oldest first, discarded ones last.
    fn prune_to_cap(&mut self) {
        let mut terminal: Vec<(bool, i64, JobId)> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.state.is_terminal())
            .map(|(id, job)| (job.state == JobState::Discarded, job.ended_at, *id))
            .collect();
        terminal.sort();
        let excess = terminal.len().saturating_sub(TERMINAL_JOBS_MAX);
        for (_, _, id) in terminal.into_iter().take(excess) {
            self.jobs.remove(&id);
        }
    }

    /// Everything that comes due when time reaches `now`.
    fn advance_to(&mut self, now: i64) {
        self.now = now;
        for job in self.jobs.values_mut() {
            match job.state {
                JobState::Retryable if job.retry_at.is_some_and(|at| at <= now) => Self::make_available(job, now),
                JobState::Active if job.visibility_deadline.is_some_and(|at| at <= now) => {
                    if job.attempt < job.max_attempts.max(1) {
                        Self::make_available(job, now);
                    } else {
                        job.state = JobState::Discarded;
                        job.visibility_deadline = None;
                        job.ended_at = now;
                    }
                }
                _ => {}
            }
        }
    }
}

struct FixedEntropy(u128);

impl Entropy for FixedEntropy {
    fn next_u128(&mut self) -> u128 {
        self.0 += 1;
        self.0 << 20
    }

    fn next_unit(&mut self) -> f64 {
        0.5
    }
}

/// The disk the engine runs on.
enum Disk {
    Real,
    /// Loses what was not synced at every crash (a `Restart` that is not clean).
    LosingPower {
        file_system: PowerLossFileSystem,
        seed: u64,
    },
}

fn open(dir: &std::path::Path, clock: &ManualClock, disk: &Disk) -> Result<Engine, String> {
    let mut config = EngineConfig::new(dir);
    if let Disk::LosingPower { file_system, .. } = disk {
        config.file_system = Arc::new(file_system.clone());
    }
    config.clock = Arc::new(clock.clone());
    config.wiring.entropy = Box::new(FixedEntropy(0));
    config.wiring.check_invariants = true;
    // Small bounds, so rotation and background snapshots happen too.
    config.segment_bytes = 8 * 1024;
    config.snapshot_log_bytes = 16 * 1024;
    config.retention.max_terminal_jobs = TERMINAL_JOBS_MAX;
    Engine::open(config).map_err(|error| format!("the engine does not open its own data dir: {error}"))
}

fn error_kind(error: &EngineError) -> &'static str {
    match error {
        EngineError::NotFound { .. } | EngineError::NotInDeadLetter { .. } => "not_found",
        EngineError::Conflict { .. } => "conflict",
        EngineError::UniqueConflict { .. } => "duplicate",
        EngineError::WorkflowNotFound { .. } => "not_found",
        EngineError::WorkflowConflict { .. } => "conflict",
        other => panic!("unexpected engine error {other:?}"),
    }
}

pub fn run(ops: &[Op]) -> Result<(), String> {
    run_on(ops, Disk::Real)
}

/// Like [`run`], but each crash (`Restart { clean: false }`) also loses
/// power: what was written and not synced is lost, or a random prefix of it
/// kept, chosen by `seed`. Every acknowledged change must survive, and the
/// engine must open every data dir it left behind.
pub fn run_losing_power(ops: &[Op], seed: u64) -> Result<(), String> {
    run_on(ops, Disk::LosingPower { file_system: PowerLossFileSystem::new(), seed })
}

fn run_on(ops: &[Op], mut disk: Disk) -> Result<(), String> {
    let dir = TempDir::new();
    let clock = ManualClock::new(START);
    let mut engine = Some(open(&dir.0, &clock, &disk)?);
    let mut model = Model { now: START, ..Model::default() };
    for op in ops.iter().cloned() {
        let handle = engine.as_ref().expect("engine open").handle().clone();
        match op {
            Op::Enqueue { queue, priority, max_attempts, unique, staged } => {
                let mut body = json!({"type": "t", "args": [], "options": {
                    "queue": QUEUES[queue], "priority": priority, "visibility_timeout_ms": VISIBILITY_MS, "timeout_ms": 600_000,
                    "retry": {"max_attempts": max_attempts, "initial_interval": "PT1S", "backoff_coefficient": 2.0, "jitter": false},
                    "pending": staged}});
                if let Some((key, policy)) = unique {
                    body["args"] = json!([key]);
                    let on_conflict = ["reject", "ignore", "replace"][policy as usize % 3];
                    body["options"]["unique"] = json!({ "on_conflict": on_conflict });
                }
                let job = parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
                let outcome = handle.enqueue(vec![job]).wait();
                if model.paused[queue] {
                    check!(matches!(outcome, Err(EngineError::QueuePaused { .. })), "enqueue into a paused queue");
                    continue;
                }
                // Live holders of the same key, oldest first.
                let holders: Vec<JobId> = match unique {
                    Some((key, _)) => model
                        .jobs
                        .iter()
                        .filter(|(_, job)| job.unique_key == Some(key) && !job.state.is_terminal())
                        .map(|(id, _)| *id)
                        .collect(),
                    None => Vec::new(),
                };
                match (unique.map(|(_, policy)| policy % 3), holders.first()) {
                    (Some(0), Some(holder)) => {
                        let rejected =
                            matches!(&outcome, Err(EngineError::UniqueConflict { existing, .. }) if existing == holder);
                        check!(rejected, "a unique reject answers with the holder {holder}: {outcome:?}");
                        continue;
                    }
                    (Some(1), Some(holder)) => {
                        let answer = outcome.map_err(|error| format!("enqueue: {error}"))?;
                        check_eq!((answer[0].job.id, answer[0].deduplicated), (*holder, true), "a unique ignore");
                        continue;
                    }
                    (Some(_), Some(_)) => {
                        let now = model.now;
                        for holder in &holders {
                            let job = model.jobs.get_mut(holder).unwrap();
                            job.state = JobState::Cancelled;
                            job.ended_at = now;
                            job.visibility_deadline = None;
                            job.retry_at = None;
                        }
                    }
                    _ => {}
                }
                let answer = outcome.map_err(|error| format!("enqueue: {error}"))?;
                check!(!answer[0].deduplicated, "a new job is not deduplicated");
                let id = answer[0].job.id;
                let model_job = ModelJob {
                    queue,
                    priority,
                    max_attempts,
                    state: if staged { JobState::Pending } else { JobState::Available },
                    attempt: 0,
                    entered_at: model.now,
                    retry_at: None,
                    visibility_deadline: None,
                    ended_at: 0,
                    unique_key: unique.map(|(key, _)| key),
                    owned: false,
                };
                model.jobs.insert(id, model_job);
                model.ids.push(id);
            }
            Op::Fetch { queues, count } => {
                let expected = model.choose(&queues, count);
                let request = FetchRequest {
                    queues: queues.iter().map(|q| QUEUES[*q].to_string()).collect(),
                    count,
                    worker_id: None,
                    visibility_timeout_ms: None,
                };
                let claimed: Vec<JobId> = handle.fetch(request).wait().unwrap().iter().map(|job| job.id).collect();
                check_eq!(&claimed, &expected, "fetch claims what the model picks");
                for id in claimed {
                    let job = model.jobs.get_mut(&id).unwrap();
                    job.state = JobState::Active;
                    job.attempt += 1;
                    job.visibility_deadline = Some(model.now + VISIBILITY_MS);
                }
            }
            Op::Ack { pick } => {
                let Some(id) = model.pick(pick) else { continue };
                let expected = model.expect_active(id);
                let outcome = handle.ack(id, None, None).wait();
                check_eq!(outcome.as_ref().map(|_| ()).map_err(error_kind), expected);
                if expected.is_ok() {
                    let now = model.now;
                    let job = model.jobs.get_mut(&id).unwrap();
                    job.state = JobState::Completed;
                    job.visibility_deadline = None;
                    job.ended_at = now;
                }
            }
            Op::Nack { pick, requeue } => {
                let Some(id) = model.pick(pick) else { continue };
                let expected = model.expect_active(id);
                let outcome = handle.fail(id, FailureReport::server("E", "m"), requeue, None).wait();
                check_eq!(outcome.as_ref().map(|_| ()).map_err(error_kind), expected);
                if expected.is_ok() {
                    let now = model.now;
                    let job = model.jobs.get_mut(&id).unwrap();
                    job.visibility_deadline = None;
                    if requeue {
                        job.attempt -= 1;
                        Model::make_available(job, now);
                    } else if job.attempt >= job.max_attempts.max(1) {
                        job.state = JobState::Discarded;
                        job.ended_at = now;
                    } else {
                        job.state = JobState::Retryable;
                        job.retry_at = Some(now + 1000 * (1 << (job.attempt - 1)));
                    }
                }
            }
            Op::Cancel { pick } => {
                let Some(id) = model.pick(pick) else { continue };
                let expected = match model.jobs.get(&id).map(|job| job.state) {
                    None => Err("not_found"),
                    Some(JobState::Completed | JobState::Discarded) => Err("conflict"),
                    Some(_) => Ok(()),
                };
                let outcome = handle.cancel(id).wait();
                check_eq!(outcome.as_ref().map(|_| ()).map_err(error_kind), expected);
                // Cancelling a cancelled job again changes nothing.
                let job = model.jobs.get_mut(&id);
                if let Some(job) = job.filter(|job| expected.is_ok() && job.state != JobState::Cancelled) {
                    job.state = JobState::Cancelled;
                    job.ended_at = model.now;
                    job.visibility_deadline = None;
                    job.retry_at = None;
                }
            }
            Op::Activate { pick } => {
                let Some(id) = model.pick(pick) else { continue };
                let expected = match model.jobs.get(&id).map(|job| (job.state, job.owned)) {
                    None => Err("not_found"),
                    Some((JobState::Pending, false)) => Ok(()),
                    Some(_) => Err("conflict"),
                };
                let outcome = handle.activate(id).wait();
                check_eq!(outcome.as_ref().map(|_| ()).map_err(error_kind), expected);
                if expected.is_ok() {
                    let now = model.now;
                    Model::make_available(model.jobs.get_mut(&id).unwrap(), now);
                }
            }
            Op::DeadLetterRetry { pick } => {
                let Some(id) = model.pick(pick) else { continue };
                let discarded = model.jobs.get(&id).is_some_and(|job| job.state == JobState::Discarded);
                let outcome = handle.dead_letter_retry(id).wait();
                check_eq!(outcome.is_ok(), discarded);
                if discarded {
                    let now = model.now;
                    let job = model.jobs.get_mut(&id).unwrap();
                    job.attempt = 0;
                    Model::make_available(job, now);
                }
            }
            Op::DeadLetterDelete { pick } => {
                let Some(id) = model.pick(pick) else { continue };
                let discarded = model.jobs.get(&id).is_some_and(|job| job.state == JobState::Discarded);
                check_eq!(handle.dead_letter_delete(id).wait().is_ok(), discarded);
                if discarded {
                    model.jobs.remove(&id);
                }
            }
            Op::Heartbeat { picks } => {
                let listed: Vec<JobId> = picks.iter().filter_map(|pick| model.pick(*pick)).collect();
                let extended = handle.heartbeat("w".into(), Some(listed.clone()), None).wait().unwrap();
                let mut expected: Vec<JobId> = listed
                    .into_iter()
                    .filter(|id| model.jobs.get(id).is_some_and(|job| job.state == JobState::Active))
                    .collect();
                expected.sort();
                expected.dedup();
                check_eq!((extended.extended, extended.signal), (expected.len(), None));
                let now = model.now;
                for id in expected {
                    model.jobs.get_mut(&id).unwrap().visibility_deadline = Some(now + VISIBILITY_MS);
                }
            }
            Op::Pause { queue, paused } => {
                let summary = handle.pause_queue(QUEUES[queue].to_string(), paused).wait().unwrap();
                check_eq!(summary.paused, paused, "queue {} paused", QUEUES[queue]);
                model.paused[queue] = paused;
            }
            Op::CreateWorkflow { kind, size, queue, callbacks } => {
                let kind = kind % 3;
                let items: Vec<serde_json::Value> = (0..size)
                    .map(|n| {
                        json!({"type": "w", "args": [n], "options": {"queue": QUEUES[(queue + n) % 2],
                        "visibility_timeout_ms": VISIBILITY_MS, "timeout_ms": 600_000, "retry": {"max_attempts": 1}}})
                    })
                    .collect();
                let kind_name = ["chain", "group", "batch"][kind as usize];
                let mut body = json!({ "type": kind_name, "steps": items });
                let mut wanted: Vec<u8> = (0..3).filter(|bit| callbacks & (1 << bit) != 0).collect();
                if wanted.is_empty() {
                    wanted.push(0);
                }
                if kind != 2 {
                    wanted.clear();
                }
                for which in &wanted {
                    let name = ["on_complete", "on_success", "on_failure"][*which as usize];
                    if body.get("callbacks").is_none() {
                        body["callbacks"] = json!({});
                    }
                    body["callbacks"][name] = json!({"type": "cb", "options": {"queue": QUEUES[0],
                        "visibility_timeout_ms": VISIBILITY_MS, "timeout_ms": 600_000, "retry": {"max_attempts": 1}}});
                }
                let definition =
                    svc::workflow::parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default())
                        .map_err(|error| format!("workflow body: {error}"))?;
                let outcome = handle.create_workflow(definition).wait();
                let starts_now: Vec<usize> = if kind == 0 { vec![0] } else { (0..size).collect() };
                if starts_now.iter().any(|n| model.paused[(queue + n) % 2]) {
                    check!(
                        matches!(outcome, Err(EngineError::QueuePaused { .. })),
                        "a workflow into a paused queue: {outcome:?}"
                    );
                    continue;
                }
                let id = outcome.map_err(|error| format!("create workflow: {error}"))?;
                let flow = handle.workflow(id).ok_or("a created workflow is readable")?;
                let now = model.now;
                let mut members = Vec::new();
                for (n, member) in flow.members.iter().enumerate() {
                    let state = if kind == 0 && n > 0 { JobState::Pending } else { JobState::Available };
                    model.jobs.insert(member.job_id, Model::new_job((queue + n) % 2, state, now, true));
                    model.ids.push(member.job_id);
                    members.push(member.job_id);
                }
                let callbacks = flow
                    .callbacks
                    .iter()
                    .zip(&wanted)
                    .map(|(callback, which)| (*which, callback.job.id, false, None))
                    .collect();
                let outcomes = vec![None; members.len()];
                model
                    .workflows
                    .insert(id, ModelWorkflow { kind, members, outcomes, callbacks, state: WorkflowState::Running });
                model.workflow_ids.push(id);
            }
            Op::CancelWorkflow { pick } => {
                if model.workflow_ids.is_empty() {
                    continue;
                }
                let id = model.workflow_ids[pick % model.workflow_ids.len()];
                let running = model.workflows.get(&id).is_some_and(|flow| flow.state == WorkflowState::Running);
                let outcome = handle.cancel_workflow(id).wait();
                check_eq!(outcome.map_err(|error| error_kind(&error)), if running { Ok(()) } else { Err("conflict") });
                if running {
                    let flow = model.workflows.get_mut(&id).unwrap();
                    flow.state = WorkflowState::Cancelled;
                    // A job whose end the workflow recorded is no longer its to
                    // cancel (one retried from the dead letter listing runs on).
                    let live: Vec<JobId> = flow
                        .members
                        .iter()
                        .zip(&flow.outcomes)
                        .filter(|(_, outcome)| outcome.is_none())
                        .map(|(member, _)| *member)
                        .chain(
                            flow.callbacks
                                .iter()
                                .filter(|callback| callback.2 && callback.3.is_none())
                                .map(|callback| callback.1),
                        )
                        .collect();
                    for job in live {
                        model.cancel_job(job);
                    }
                }
            }
            Op::Advance { ms } => {
                clock.advance_ms(ms);
                handle.tick().wait().unwrap();
                model.advance_to(model.now + ms);
            }
            Op::Restart { clean } => {
                let running = engine.take().expect("engine open");
                if clean {
                    running.close()
                } else {
                    running.close_without_snapshot();
                    if let Disk::LosingPower { file_system, seed } = &mut disk {
                        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        file_system.crash(*seed).map_err(|error| format!("crash: {error}"))?;
                    }
                }
                engine = Some(open(&dir.0, &clock, &disk)?);
                // Overdue deadlines are handled at once after a restart.
                engine.as_ref().unwrap().handle().tick().wait().unwrap();
            }
        }
        model.settle();
        model.prune_to_cap();
        let handle = engine.as_ref().unwrap().handle();
        for (id, flow) in &model.workflows {
            let stored = handle.workflow(*id).ok_or_else(|| format!("workflow {id} is readable"))?;
            check_eq!(stored.state, flow.state, "workflow {id}");
            let fired: Vec<bool> = stored.callbacks.iter().map(|callback| callback.fired).collect();
            let expected: Vec<bool> = flow.callbacks.iter().map(|callback| callback.2).collect();
            check_eq!(fired, expected, "callbacks fired of workflow {id}");
        }
        // A queue's figures count its jobs by state, as the model holds them.
        for (index, name) in QUEUES.iter().enumerate() {
            let mut expected = [0u64; 8];
            for job in model.jobs.values().filter(|job| job.queue == index) {
                expected[job.state.index()] += 1;
            }
            let stats = handle.queue_stats(name);
            let counts = stats.as_ref().map_or([0; 8], |stats| stats.summary.counts);
            check_eq!(counts, expected, "queue {name} counts by state");
            check_eq!(stats.is_some_and(|stats| stats.summary.paused), model.paused[index], "queue {name} paused");
        }
        for id in &model.ids {
            let stored = handle.job(*id);
            match model.jobs.get(id) {
                None => check!(stored.is_none(), "job {} was deleted", id),
                Some(expected) => {
                    let stored = stored.expect("job stored");
                    check_eq!((stored.state, stored.attempt), (expected.state, expected.attempt), "job {}", id);
                    if expected.state == JobState::Available {
                        check_eq!(stored.enqueued_at(), Some(expected.entered_at), "entry time of {}", id);
                    }
                    check_eq!(stored.run().retry_at, expected.retry_at, "retry time of {}", id);
                    check_eq!(
                        stored.run().visibility_deadline,
                        expected.visibility_deadline,
                        "claim deadline of {}",
                        id
                    );
                }
            }
        }
    }
    engine.take().unwrap().close();
    Ok(())
}

/// A data dir for one run, removed afterwards.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("svc-model-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Decodes operations from arbitrary bytes, two bytes each (fuzzing).
pub fn ops_from_bytes(bytes: &[u8]) -> Vec<Op> {
    bytes
        .chunks_exact(2)
        .take(200)
        .map(|pair| {
            let (kind, value) = (pair[0] % 14, pair[1] as usize);
            match kind {
                0 | 1 => Op::Enqueue {
                    queue: value % 2,
                    priority: (value % 5) as i32 - 2,
                    max_attempts: (value % 3) as u32 + 1,
                    unique: (pair[0] % 3 == 0).then_some(((value / 7 % 3) as u8, (value / 21 % 3) as u8)),
                    staged: value % 11 == 0,
                },
                10 => Op::Activate { pick: value },
                11 => Op::CreateWorkflow {
                    kind: (value % 3) as u8,
                    size: value / 3 % 3 + 1,
                    queue: value / 9 % 2,
                    callbacks: (value / 18 % 7 + 1) as u8,
                },
                12 => Op::CancelWorkflow { pick: value },
                2 => Op::Fetch {
                    queues: [vec![0], vec![1], vec![0, 1], vec![1, 0], vec![0, 0], vec![1, 0, 1]][value % 6].clone(),
                    count: value % 3 + 1,
                },
                3 => Op::Ack { pick: value },
                4 => Op::Nack { pick: value, requeue: value % 2 == 0 },
                5 => Op::Cancel { pick: value },
                6 if value % 2 == 0 => Op::DeadLetterRetry { pick: value / 2 },
                6 => Op::DeadLetterDelete { pick: value / 2 },
                7 => Op::Heartbeat { picks: vec![value, value / 3] },
                8 => Op::Advance { ms: (value as i64) * 16 },
                9 => Op::Pause { queue: value % 2, paused: value % 3 != 0 },
                _ => Op::Restart { clean: value % 2 == 0 },
            }
        })
        .collect()
}
