//! Cron inside the engine, on a manual clock: firing at each slot, overlap
//! policies, misfire after downtime, disable and delete, and restarts (clean,
//! without a snapshot, and a child process killed with SIGKILL right after a
//! firing): a slot never fires twice and downtime gives at most one catch-up.

mod common;

use common::{FixedEntropy, spawn_server};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use svc::clock::ManualClock;
use svc::cron::{parse_cron_body, patch_cron_body};
use svc::engine::{CronEntry, Engine, EngineConfig, FetchRequest};
use svc::job::{Job, JobDefaults, JobId, JobState};

fn ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>().expect("timestamp").as_millisecond()
}

fn iso(at: i64) -> String {
    svc::job::time::format_timestamp(at)
}

struct Harness {
    engine: Option<Engine>,
    clock: ManualClock,
    dir: tempfile::TempDir,
}

impl Harness {
    fn new(start: &str) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(ms(start));
        let engine = Some(open(dir.path(), &clock));
        Harness { engine, clock, dir }
    }

    fn handle(&self) -> &svc::engine::EngineHandle {
        self.engine.as_ref().expect("engine open").handle()
    }

    fn register(&self, body: Value) -> Arc<CronEntry> {
        let definition = parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).expect("valid");
        self.handle().cron_put(definition).wait().expect("registered").0
    }

    fn patch(&self, name: &str, body: Value) -> Arc<CronEntry> {
        let current = self.handle().cron(name).expect("registered");
        let definition =
            patch_cron_body(&current.definition, body.to_string().as_bytes(), &JobDefaults::default()).expect("valid");
        self.handle().cron_patch(definition, current.revision).wait().expect("patched").0
    }

    fn cron(&self, name: &str) -> Arc<CronEntry> {
        self.handle().cron(name).expect("registered")
    }

    /// Sets the clock and lets the engine handle what became due.
    fn at(&self, time: &str) {
        self.clock.set_ms(ms(time));
        self.handle().tick().wait().unwrap();
    }

    /// Every job in the state, oldest first.
    fn jobs(&self) -> Vec<Arc<Job>> {
        let mut jobs = self.handle().image().wait().unwrap().jobs;
        jobs.sort_by_key(|job| job.created_at);
        jobs
    }

    fn job(&self, id: JobId) -> Arc<Job> {
        self.handle().job(id).expect("job stored")
    }

    fn fetch(&self, queue: &str) -> Vec<Arc<Job>> {
        let request = FetchRequest {
            queues: vec![queue.into()],
            count: 10,
            worker_id: Some("w".into()),
            visibility_timeout_ms: None,
        };
        self.handle().fetch(request).wait().unwrap()
    }

    /// Types of the buffered events, with their `data.reason` for skips.
    fn event_types(&self) -> Vec<String> {
        let page = self.handle().events_page(None, 1000, |_| true);
        page.events
            .iter()
            .map(|event| {
                let rendered = serde_json::from_str::<serde_json::Value>(&svc::engine::render_event(event)).unwrap();
                match rendered["data"]["reason"].as_str() {
                    Some(reason) if event.kind.type_name().starts_with("cron.") => {
                        format!("{}:{reason}", event.kind.type_name())
                    }
                    _ => event.kind.type_name().to_string(),
                }
            })
            .collect()
    }

    /// Drops the engine without a final snapshot (as a crash after the last commit would).
    fn crash_and_reopen(&mut self) {
        self.engine.take().expect("engine open").close_without_snapshot();
        self.engine = Some(open(self.dir.path(), &self.clock));
    }

    fn close_and_reopen(&mut self) {
        self.engine.take().expect("engine open").close();
        self.engine = Some(open(self.dir.path(), &self.clock));
    }
}

fn open(dir: &Path, clock: &ManualClock) -> Engine {
    let mut config = EngineConfig::new(dir);
    config.clock = Arc::new(clock.clone());
    config.wiring.entropy = Box::new(FixedEntropy(0));
    config.wiring.check_invariants = true;
    Engine::open(config).unwrap()
}

fn every_five(name: &str, overlap: &str) -> Value {
    json!({"name": name, "type": "report.build", "args": [1], "schedule": "*/5 * * * *", "queue": "reports",
           "meta": {"team": "ops"}, "overlap_policy": overlap,
           // Claims outlast the gaps between slots, so a run stays active across them.
           "options": {"timeout_ms": 3_600_000, "visibility_timeout_ms": 3_600_000}})
}

#[test]
fn a_cron_entry_fires_at_each_slot_with_its_name_and_time_in_meta() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    let entry = harness.register(every_five("reports", "allow"));
    assert_eq!(entry.next_run_at.map(iso).as_deref(), Some("2027-01-15T10:05:00Z"));
    assert_eq!(entry.run_count, 0);

    harness.at("2027-01-15T10:04:59.900Z");
    assert!(harness.jobs().is_empty(), "nothing before the slot");
    harness.at("2027-01-15T10:05:00Z");
    let jobs = harness.jobs();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        (job.state, job.queue.as_str(), job.payload.job_type()),
        (JobState::Available, "reports", "report.build")
    );
    let meta: Value = serde_json::from_str(job.payload.meta()).unwrap();
    assert_eq!(meta, json!({"team": "ops", "cron_name": "reports", "cron_triggered_at": "2027-01-15T10:05:00Z"}));
    let entry = harness.cron("reports");
    assert_eq!(entry.run_count, 1);
    assert_eq!(entry.last_run_at.map(iso).as_deref(), Some("2027-01-15T10:05:00Z"));
    assert_eq!(entry.last_job_id, Some(job.id));
    assert_eq!(entry.next_run_at.map(iso).as_deref(), Some("2027-01-15T10:10:00Z"));

    harness.at("2027-01-15T10:09:59Z");
    assert_eq!(harness.jobs().len(), 1);
    harness.at("2027-01-15T10:10:00Z");
    assert_eq!(harness.jobs().len(), 2, "allow: a second run while the first waits");
    let events = harness.event_types();
    assert_eq!(events.iter().filter(|kind| *kind == "cron.triggered").count(), 2);
    assert_eq!(events.iter().filter(|kind| *kind == "job.enqueued").count(), 2);
}

#[test]
fn runs_of_one_entry_share_its_retry_policy_after_a_restart_too() {
    let mut harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("reports", "allow"));
    harness.at("2027-01-15T10:05:00Z");
    harness.at("2027-01-15T10:10:00Z");
    let shared = |harness: &Harness| {
        let jobs = harness.jobs();
        assert_eq!(jobs.len(), 2);
        assert!(Arc::ptr_eq(&jobs[0].retry, &jobs[1].retry), "runs of one entry share one policy");
    };
    shared(&harness);
    // Replayed from the log (no snapshot), each run's policy is decoded on its own.
    harness.crash_and_reopen();
    shared(&harness);
}

#[test]
fn skip_enqueues_nothing_while_the_previous_run_is_going() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("nightly", "skip"));
    harness.at("2027-01-15T10:05:00Z");
    let first = harness.jobs()[0].id;
    harness.at("2027-01-15T10:10:00Z");
    assert_eq!(harness.jobs().len(), 1, "first run still available: skipped");
    assert!(harness.event_types().contains(&"cron.skipped:overlap_skip".to_string()));
    let entry = harness.cron("nightly");
    assert_eq!((entry.run_count, entry.next_run_at.map(iso)), (1, Some("2027-01-15T10:15:00Z".to_string())));

    let claimed = harness.fetch("reports");
    assert_eq!(claimed[0].id, first);
    harness.at("2027-01-15T10:15:00Z");
    assert_eq!(harness.jobs().len(), 1, "an active run also counts as going");
    harness.handle().ack(first, None, None).wait().unwrap();
    harness.at("2027-01-15T10:20:00Z");
    assert_eq!(harness.jobs().len(), 2, "the previous run ended: fires");
}

#[test]
fn cancel_previous_cancels_the_running_job_then_enqueues() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("sync", "cancel"));
    assert_eq!(harness.cron("sync").definition.overlap.as_str(), "cancel_previous");
    harness.at("2027-01-15T10:05:00Z");
    let first = harness.fetch("reports")[0].id;
    harness.at("2027-01-15T10:10:00Z");
    assert_eq!(harness.job(first).state, JobState::Cancelled);
    let jobs = harness.jobs();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[1].state, JobState::Available);
    let page = harness.handle().events_page(None, 1000, |event| event.kind.type_name() == "job.cancelled");
    let cancelled = serde_json::from_str::<serde_json::Value>(&svc::engine::render_event(&page.events[0])).unwrap();
    assert_eq!(cancelled["data"]["reason"], "cron_cancel_previous");
    assert_eq!(cancelled["data"]["previous_state"], "active");
}

#[test]
fn enqueue_stages_one_run_behind_the_previous_and_starts_it_when_that_ends() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("chain", "enqueue"));
    harness.at("2027-01-15T10:05:00Z");
    let first = harness.fetch("reports")[0].id;
    harness.at("2027-01-15T10:10:00Z");
    let second = harness.cron("chain").last_job_id.expect("a second run");
    assert_eq!(harness.job(second).state, JobState::Pending);
    assert!(harness.fetch("reports").is_empty(), "a pending run is not handed out");
    harness.at("2027-01-15T10:15:00Z");
    assert_eq!(harness.jobs().len(), 2, "at most one run waits; later ones are skipped");

    harness.clock.set_ms(ms("2027-01-15T10:16:00Z"));
    harness.handle().ack(first, None, None).wait().unwrap();
    let started = harness.job(second);
    assert_eq!(started.state, JobState::Available);
    assert_eq!(started.enqueued_at().map(iso).as_deref(), Some("2027-01-15T10:16:00Z"));
    assert_eq!(harness.fetch("reports")[0].id, second);
}

#[test]
fn after_downtime_one_catch_up_run_fires_for_the_latest_missed_slot() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("reports", "allow"));
    // Seven slots pass at once (10:05 … 10:35).
    harness.at("2027-01-15T10:37:00Z");
    let jobs = harness.jobs();
    assert_eq!(jobs.len(), 1, "one catch-up run, not a burst");
    let meta: Value = serde_json::from_str(jobs[0].payload.meta()).unwrap();
    assert_eq!(meta["cron_triggered_at"], "2027-01-15T10:35:00Z");
    let entry = harness.cron("reports");
    assert_eq!(entry.next_run_at.map(iso).as_deref(), Some("2027-01-15T10:40:00Z"));
    let page = harness.handle().events_page(None, 100, |event| event.kind.type_name() == "cron.skipped");
    let misfire = serde_json::from_str::<serde_json::Value>(&svc::engine::render_event(&page.events[0])).unwrap();
    assert_eq!(
        (misfire["data"]["reason"].as_str(), misfire["data"]["missed_count"].as_u64()),
        (Some("misfire"), Some(6))
    );
    assert_eq!(misfire["subject"], "reports");
    assert_eq!(misfire["source"], "svc://svc/cron");
}

#[test]
fn disabled_entries_do_not_fire_or_catch_up_and_deleted_ones_stop() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("reports", "allow"));
    let disabled = harness.patch("reports", json!({"enabled": false}));
    assert_eq!(disabled.next_run_at, None);
    harness.at("2027-01-15T10:30:00Z");
    assert!(harness.jobs().is_empty());
    let enabled = harness.patch("reports", json!({"enabled": true}));
    assert_eq!(enabled.next_run_at.map(iso).as_deref(), Some("2027-01-15T10:35:00Z"), "no catch-up on re-enable");
    assert_eq!(enabled.revision, 3);
    harness.at("2027-01-15T10:35:00Z");
    assert_eq!(harness.jobs().len(), 1);

    let deleted = harness.handle().cron_delete("reports".into()).wait().unwrap();
    assert_eq!(deleted.run_count, 1);
    harness.at("2027-01-15T11:00:00Z");
    assert_eq!(harness.jobs().len(), 1, "no run after delete; the enqueued job is untouched");
    assert_eq!(harness.jobs()[0].state, JobState::Available);
    assert!(harness.handle().cron("reports").is_none());
}

#[test]
fn registering_again_keeps_history_and_recomputes_the_next_run() {
    let harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("reports", "allow"));
    harness.at("2027-01-15T10:05:00Z");
    let mut body = every_five("reports", "allow");
    body["schedule"] = json!("0 * * * *");
    let replaced = harness.register(body);
    assert_eq!((replaced.run_count, replaced.revision), (1, 2));
    assert_eq!(replaced.created_at, ms("2027-01-15T10:02:00Z"));
    assert_eq!(replaced.next_run_at.map(iso).as_deref(), Some("2027-01-15T11:00:00Z"));
}

#[test]
fn time_zones_set_the_local_wall_clock_time() {
    let harness = Harness::new("2027-03-13T12:00:00Z");
    let entry = harness.register(json!({"name": "ny", "type": "t", "schedule": "30 2 * * *",
                                        "timezone": "America/New_York"}));
    // 2027-03-14 is the spring-forward day in New York: 02:30 does not exist.
    assert_eq!(entry.next_run_at.map(iso).as_deref(), Some("2027-03-15T06:30:00Z"));
    harness.at("2027-03-15T06:30:00Z");
    assert_eq!(harness.jobs().len(), 1);
}

#[test]
fn a_crash_after_a_firing_neither_repeats_the_slot_nor_bursts_afterwards() {
    let mut harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("reports", "allow"));
    harness.at("2027-01-15T10:05:00Z");
    let live = harness.handle().image().wait().unwrap();
    harness.crash_and_reopen();
    assert_eq!(harness.handle().image().wait().unwrap(), live, "replay rebuilds registrations and firings");
    harness.at("2027-01-15T10:05:30Z");
    assert_eq!(harness.jobs().len(), 1, "the 10:05 slot does not fire again");

    harness.crash_and_reopen();
    harness.at("2027-01-15T10:31:00Z");
    let jobs = harness.jobs();
    assert_eq!(jobs.len(), 2, "five missed slots: one catch-up run");
    let meta: Value = serde_json::from_str(jobs[1].payload.meta()).unwrap();
    assert_eq!(meta["cron_triggered_at"], "2027-01-15T10:30:00Z");
    harness.crash_and_reopen();
    harness.at("2027-01-15T10:34:59Z");
    assert_eq!(harness.jobs().len(), 2);
    harness.close_and_reopen();
    harness.at("2027-01-15T10:35:00Z");
    assert_eq!(harness.jobs().len(), 3, "the schedule goes on after a clean restart");
    assert_eq!(harness.cron("reports").run_count, 3);
}

#[test]
fn staged_runs_survive_a_restart_through_the_snapshot() {
    let mut harness = Harness::new("2027-01-15T10:02:00Z");
    harness.register(every_five("chain", "enqueue"));
    harness.at("2027-01-15T10:05:00Z");
    let first = harness.fetch("reports")[0].id;
    harness.at("2027-01-15T10:10:00Z");
    let second = harness.cron("chain").last_job_id.unwrap();
    harness.handle().snapshot().wait().unwrap();
    harness.crash_and_reopen();
    harness.handle().ack(first, None, None).wait().unwrap();
    assert_eq!(harness.job(second).state, JobState::Available, "the waiting run starts after a restart too");
}

#[test]
fn a_server_killed_right_after_a_catch_up_firing_does_not_fire_it_again() {
    // Register a yearly entry a year back, so a server on the real clock
    // owes exactly one catch-up run the moment it starts.
    let dir = tempfile::tempdir().unwrap();
    let year_ago = jiff::Timestamp::now().as_millisecond() - 366 * 86_400_000;
    let clock = ManualClock::new(year_ago);
    let engine = open(dir.path(), &clock);
    let body = json!({"name": "yearly", "type": "archive.rotate", "schedule": "@yearly", "queue": "archive"});
    let definition = parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().cron_put(definition).wait().unwrap();
    engine.close_without_snapshot();

    let client = common::http_client();
    let cron = |base: &str| -> Value {
        client.get(format!("{base}/svc/v1/cron/yearly")).send().unwrap().json::<Value>().unwrap()["cron"].clone()
    };
    let (mut child, base) = spawn_server(dir.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cron(&base)["run_count"] != 1 {
        assert!(std::time::Instant::now() < deadline, "the catch-up run fires at start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL sent");
    child.wait().unwrap();

    let (mut child, base) = spawn_server(dir.path());
    let after = cron(&base);
    assert_eq!(after["run_count"], 1, "the slot fired before the kill is not fired again");
    let queues: Value = client.get(format!("{base}/svc/v1/queues")).send().unwrap().json().unwrap();
    let archive = queues["queues"].as_array().unwrap().iter().find(|queue| queue["name"] == "archive").cloned();
    assert_eq!(archive.expect("archive queue")["size"], 1, "exactly one job from the catch-up");
    let next: i64 = ms(after["next_run_at"].as_str().unwrap());
    assert!(next > jiff::Timestamp::now().as_millisecond(), "the next run is in the future");
    child.kill().unwrap();
    child.wait().unwrap();
}
