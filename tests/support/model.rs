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
//! state covered) and staged jobs with their activation.

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, EngineError, Entropy, FetchRequest};
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
}

#[derive(Default)]
struct Model {
    now: i64,
    jobs: BTreeMap<JobId, ModelJob>,
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
    config.entropy = Box::new(FixedEntropy(0));
    config.check_invariants = true;
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
                let expected = match model.jobs.get(&id).map(|job| job.state) {
                    None => Err("not_found"),
                    Some(JobState::Pending) => Ok(()),
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
        model.prune_to_cap();
        let handle = engine.as_ref().unwrap().handle();
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
                        check_eq!(stored.enqueued_at, Some(expected.entered_at), "entry time of {}", id);
                    }
                    check_eq!(stored.retry_at, expected.retry_at, "retry time of {}", id);
                    check_eq!(stored.visibility_deadline, expected.visibility_deadline, "claim deadline of {}", id);
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
            let (kind, value) = (pair[0] % 12, pair[1] as usize);
            match kind {
                0 | 1 => Op::Enqueue {
                    queue: value % 2,
                    priority: (value % 5) as i32 - 2,
                    max_attempts: (value % 3) as u32 + 1,
                    unique: (pair[0] % 3 == 0).then_some(((value / 7 % 3) as u8, (value / 21 % 3) as u8)),
                    staged: value % 11 == 0,
                },
                10 => Op::Activate { pick: value },
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
