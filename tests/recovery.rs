//! Crash and recovery: a server process killed with SIGKILL under load loses
//! no acknowledged write; torn tails are cut off; damage elsewhere refuses to
//! start; a failed fsync poisons the log; snapshot + replay equals live state.

mod common;

use common::{TestServer, config_for, spawn_server_with_env};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use svc::engine::{Engine, EngineConfig, FetchRequest};
use svc::job::JobDefaults;
use svc::storage::{FaultyFileSystem, SEGMENT_HEADER_BYTES, list_segments};

#[test]
fn sigkill_under_load_loses_no_acknowledged_write() {
    sigkill_under_load(&[]);
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_write_through_the_page_cache() {
    sigkill_under_load(&[("SVC_DIRECT_WRITES", "0")]);
}

/// Clients enqueue, fetch and ack until the server is killed; after a
/// restart every acknowledged write is there and no completed job comes back.
fn sigkill_under_load(env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = spawn_server_with_env(dir.path(), env);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let base = base.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let http = common::http_client_builder().timeout(Duration::from_secs(5)).build().unwrap();
                // Until the server dies: a request that gets no answer ends the loop.
                let post = |path: &str, body: Value| {
                    let sent = http
                        .post(format!("{base}{path}"))
                        .header("content-type", "application/svc+json")
                        .body(body.to_string())
                        .send();
                    sent.ok()
                        .filter(|response| response.status().is_success())
                        .and_then(|response| response.json::<Value>().ok())
                };
                let (mut enqueued, mut acked) = (Vec::new(), Vec::new());
                let queue = format!("crash-{client}");
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let Some(created) =
                        post("/svc/v1/jobs", json!({"type": "t", "args": [n], "options": {"queue": queue}}))
                    else {
                        break;
                    };
                    enqueued.push(created["job"]["id"].as_str().unwrap().to_string());
                    if n % 2 == 0 {
                        let Some(jobs) = post("/svc/v1/workers/fetch", json!({"queues": [queue], "count": 1})) else {
                            break;
                        };
                        let Some(id) = jobs["jobs"][0]["id"].as_str().map(str::to_string) else { continue };
                        if post("/svc/v1/workers/ack", json!({"job_id": id})).is_none() {
                            break;
                        }
                        acked.push(id);
                    }
                }
                (enqueued, acked)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().expect("SIGKILL sent");
    child.wait().unwrap();
    stop.store(true, Ordering::SeqCst);
    let (mut enqueued, mut acked) = (Vec::new(), Vec::new());
    for client in clients {
        let (e, a) = client.join().unwrap();
        enqueued.extend(e);
        acked.extend(a);
    }
    assert!(
        enqueued.len() > 50 && !acked.is_empty(),
        "the load ran: {} enqueued, {} acked",
        enqueued.len(),
        acked.len()
    );

    let (mut child, base) = spawn_server_with_env(dir.path(), env);
    let http = common::http_client();
    let acked_set: HashSet<&String> = acked.iter().collect();
    for id in &enqueued {
        let response = http.get(format!("{base}/svc/v1/jobs/{id}")).send().unwrap();
        assert_eq!(response.status(), 200, "acknowledged enqueue {id} survived");
        let state = response.json::<Value>().unwrap()["job"]["state"].as_str().unwrap().to_string();
        if acked_set.contains(id) {
            assert_eq!(state, "completed", "acknowledged ack of {id} survived");
        }
    }
    let queues: Vec<String> = (0..4).map(|client| format!("crash-{client}")).collect();
    loop {
        let fetch = json!({"queues": queues, "count": 100});
        let jobs = http
            .post(format!("{base}/svc/v1/workers/fetch"))
            .header("content-type", "application/svc+json")
            .body(fetch.to_string())
            .send()
            .unwrap()
            .json::<Value>()
            .unwrap();
        let jobs = jobs["jobs"].as_array().unwrap().clone();
        if jobs.is_empty() {
            break;
        }
        for job in jobs {
            assert!(
                !acked_set.contains(&job["id"].as_str().unwrap().to_string()),
                "a completed job was handed out again"
            );
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// An engine on a manual clock: no timer fires unless a test moves time, so
/// the state a test compares cannot change behind its back.
fn engine_config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.clock = Arc::new(svc::clock::ManualClock::new(1_800_000_000_000));
    config.wiring.check_invariants = true;
    config
}

fn new_job(n: usize) -> svc::job::NewJob {
    svc::job::parse_enqueue_body(json!({"type": "t", "args": [n]}).to_string().as_bytes(), &JobDefaults::default())
        .unwrap()
}

fn last_segment(dir: &Path) -> std::path::PathBuf {
    list_segments(dir).unwrap().last().unwrap().1.clone()
}

/// Where the last frame of a segment starts, and where the frames end (the
/// rest is zeroed space).
fn last_frame(segment: &Path) -> (usize, usize) {
    let index = list_segments(segment.parent().unwrap()).unwrap().last().unwrap().0;
    let mut start = 0;
    let scan = svc::storage::scan_segment(segment, index, true, &mut |_, offset, _| {
        start = offset as usize;
        Ok(())
    });
    (start, scan.unwrap().valid_bytes as usize)
}

#[test]
fn a_torn_tail_is_cut_off_and_earlier_writes_survive() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(engine.handle().enqueue(vec![new_job(n)]).wait().unwrap()[0].job.id);
    }
    engine.close_without_snapshot();
    let segment = last_segment(dir.path());
    // The end of the last frame never reached the disk, as in a crash mid-write.
    let (start, end) = last_frame(&segment);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[(start + end) / 2..end].fill(0);
    std::fs::write(&segment, bytes).unwrap();

    let engine = Engine::open(engine_config(dir.path())).unwrap();
    for id in &ids[..4] {
        assert!(engine.handle().job(*id).is_some());
    }
    assert!(engine.handle().job(ids[4]).is_none(), "the torn frame is gone");
    let after = engine.handle().enqueue(vec![new_job(9)]).wait().unwrap()[0].job.id;
    engine.close_without_snapshot();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert!(engine.handle().job(after).is_some(), "writes after the cut replay too");
    engine.close();
}

#[test]
fn garbage_after_the_last_frame_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let id = engine.handle().enqueue(vec![new_job(1)]).wait().unwrap()[0].job.id;
    engine.close_without_snapshot();
    let segment = last_segment(dir.path());
    let (_, end) = last_frame(&segment);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[end..end + 300].fill(0xab);
    std::fs::write(&segment, bytes).unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert!(engine.handle().job(id).is_some());
    let after = std::fs::read(&segment).unwrap();
    assert!(after[end..end + 300].iter().all(|byte| *byte == 0), "the garbage is zeroed");
    engine.close();
}

#[test]
fn damage_before_the_tail_refuses_to_start_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    for n in 0..3 {
        engine.handle().enqueue(vec![new_job(n)]).wait().unwrap();
    }
    engine.close_without_snapshot();
    let segment = last_segment(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    let first_payload = SEGMENT_HEADER_BYTES + 8;
    bytes[first_payload + 3] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();
    let error = Engine::open(engine_config(dir.path())).err().expect("recovery refuses").to_string();
    assert!(error.contains(&segment.file_name().unwrap().to_string_lossy().to_string()), "{error}");
    assert!(error.contains(&format!("offset {SEGMENT_HEADER_BYTES}")), "{error}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "nothing was truncated");

    let output = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("byte offset"), "the server names the damage");
    let inspect = Command::new(env!("CARGO_BIN_EXE_svc")).arg("inspect").arg(dir.path()).output().unwrap();
    assert!(!inspect.status.success());
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("checksum mismatch"));
}

#[test]
fn a_failed_fsync_poisons_the_log_and_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = FaultyFileSystem::failing_after(1_000);
    let config = config_for(dir.path());
    let mut engine = svc::__private::server::engine_config(&config);
    engine.file_system = Arc::new(faulty.clone());
    let mut server = TestServer::start_with(&config, engine);
    let kept = server.enqueue(json!({"type": "t", "args": []}));

    faulty.set_syncs_left(0);
    let lost = "019539a4-aaaa-7000-8000-333333333333";
    let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "id": lost}));
    assert_eq!((answer.status, answer.error_code()), (503, "backend_error"));
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{lost}")).status, 404, "an unsynced write is never visible");
    faulty.set_syncs_left(1_000);
    let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": []}));
    assert_eq!(answer.status, 503, "the log stays poisoned even if the disk recovers");
    let health = server.get("/svc/v1/health");
    assert_eq!((health.status, health.body["backend"]["error"].as_str()), (503, Some("sync_failed")));
    assert_eq!(server.job(&kept)["state"], "available", "reads of durable state still work");
    let outcome = server.server.take().unwrap().join();
    assert!(
        matches!(outcome, Err(svc::__private::server::ServerError::StorageFailed)),
        "the server stops with an error"
    );

    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&kept)["state"], "available", "recovery brings back what was acknowledged");
    assert_eq!(server.get(&format!("/svc/v1/jobs/{lost}")).status, 404);
}

/// Runs a mixed workload against an engine.
fn churn(engine: &Engine, rounds: usize) {
    let handle = engine.handle();
    for round in 0..rounds {
        let jobs: Vec<_> = (0..3).map(|n| new_job(round * 3 + n)).collect();
        handle.enqueue(jobs).wait().unwrap();
        let request = FetchRequest {
            queues: vec!["default".into()],
            count: 2,
            worker_id: Some("w".into()),
            visibility_timeout_ms: None,
        };
        let claimed = handle.fetch(request).wait().unwrap();
        if let Some(job) = claimed.first() {
            handle.ack(job.id, Some(format!("{{\"round\":{round}}}")), None).wait().unwrap();
        }
        if let Some(job) = claimed.get(1) {
            let report = svc::job::FailureReport::server("E", "failed on purpose");
            handle.fail(job.id, report, round % 2 == 0, None).wait().unwrap();
        }
    }
}

/// Discards three jobs, sends one back from the dead letter listing and deletes another.
fn dead_letter_churn(engine: &Engine) {
    let handle = engine.handle();
    let body = json!({"type": "t", "args": ["dlq"], "options": {"queue": "dlq", "retry": {"max_attempts": 1}}});
    let jobs = (0..3)
        .map(|_| svc::job::parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap())
        .collect();
    handle.enqueue(jobs).wait().unwrap();
    let request = FetchRequest { queues: vec!["dlq".into()], count: 3, worker_id: None, visibility_timeout_ms: None };
    let claimed = handle.fetch(request).wait().unwrap();
    for job in &claimed {
        handle.fail(job.id, svc::job::FailureReport::server("E", "gone"), false, None).wait().unwrap();
    }
    handle.dead_letter_retry(claimed[0].id).wait().unwrap();
    handle.dead_letter_delete(claimed[1].id).wait().unwrap();
    // `churn` fetches as worker "w"; a durable signal is part of the state.
    handle.signal_worker("w".into(), svc::engine::workers::WorkerSignal::Quiet).wait().unwrap();
}

#[test]
fn replayed_state_equals_live_state() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    churn(&engine, 40);
    dead_letter_churn(&engine);
    let live = engine.handle().image().wait().unwrap();
    engine.close_without_snapshot();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live, "log replay rebuilds the live state");
    engine.handle().snapshot().wait().unwrap();
    churn(&engine, 10);
    let live = engine.handle().image().wait().unwrap();
    engine.close_without_snapshot();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live, "snapshot + tail replay rebuilds the live state");
    engine.close();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live, "a clean close keeps it too");
    engine.close();
}

#[test]
fn snapshots_bound_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = engine_config(dir.path());
    config.snapshot_log_bytes = 8 * 1024;
    config.segment_bytes = 16 * 1024;
    let engine = Engine::open(config).unwrap();
    churn(&engine, 300);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Background snapshots delete the segments they cover.
    while list_segments(dir.path()).unwrap().len() > 4 {
        assert!(Instant::now() < deadline, "old segments were not removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let live = engine.handle().image().wait().unwrap();
    engine.close_without_snapshot();
    let total: u64 = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().metadata().unwrap().len()).sum();
    assert!(total < 400 * 1024, "disk use stays bounded: {total} bytes");
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live);
    engine.close();
}

#[test]
fn a_second_process_cannot_open_the_same_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let error = Engine::open(engine_config(dir.path())).err().expect("second open refused").to_string();
    assert!(error.contains("in use"), "{error}");
    engine.close();
}

#[test]
fn inspect_summarises_a_healthy_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    churn(&engine, 5);
    engine.handle().snapshot().wait().unwrap();
    churn(&engine, 2);
    engine.close_without_snapshot();
    let output = Command::new(env!("CARGO_BIN_EXE_svc")).arg("inspect").arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("snapshots: 1") && text.contains("checksums: all valid"), "{text}");
    // Until a second snapshot, the log it covers stays as well (a fallback).
    assert!(text.contains("segments: 2") && text.contains("records: 28"), "{text}");
    assert!(text.contains("enqueue: 7") && text.contains("claim: 7") && text.contains("ack: 7"), "{text}");
}

#[test]
fn a_damaged_newest_snapshot_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let handle = engine.handle();
    let first = handle.enqueue(vec![new_job(1)]).wait().unwrap()[0].job.id;
    handle.snapshot().wait().unwrap();
    let second = handle.enqueue(vec![new_job(2)]).wait().unwrap()[0].job.id;
    handle.snapshot().wait().unwrap();
    let third = handle.enqueue(vec![new_job(3)]).wait().unwrap()[0].job.id;
    let live = handle.image().wait().unwrap();
    engine.close_without_snapshot();

    let snapshots = svc::storage::list_snapshots(dir.path()).unwrap();
    assert_eq!(snapshots.len(), 2, "the snapshot before the newest is kept");
    let newest = &snapshots[1].1;
    let mut bytes = std::fs::read(newest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(newest, &bytes).unwrap();

    let engine = Engine::open(engine_config(dir.path())).expect("recovery falls back to the older snapshot");
    assert_eq!(engine.handle().image().wait().unwrap(), live);
    for id in [first, second, third] {
        assert!(engine.handle().job(id).is_some());
    }
    engine.close_without_snapshot();

    // With both damaged and the start of the log gone, recovery refuses,
    // naming the newest snapshot.
    let older = &snapshots[0].1;
    let mut bytes = std::fs::read(older).unwrap();
    bytes[41] ^= 0xff;
    std::fs::write(older, &bytes).unwrap();
    assert!(list_segments(dir.path()).unwrap()[0].0 > 0);
    let error = Engine::open(engine_config(dir.path())).err().expect("nothing to recover from").to_string();
    assert!(error.contains(&newest.file_name().unwrap().to_string_lossy().to_string()), "{error}");
}

/// The indexes of the snapshots in a data dir (each names the first log
/// segment it does not cover, so a new snapshot has a new index).
fn snapshot_indexes(dir: &Path) -> Vec<u64> {
    svc::storage::list_snapshots(dir).unwrap().into_iter().map(|(index, _)| index).collect()
}

#[test]
fn a_clean_stop_writes_no_snapshot_when_nothing_changed_since_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let first = engine.handle().enqueue(vec![new_job(1)]).wait().unwrap()[0].job.id;
    engine.close();
    let after_first_stop = snapshot_indexes(dir.path());
    assert_eq!(after_first_stop.len(), 1, "a stop after a change writes a snapshot");

    // Started and stopped again with nothing written in between: the
    // snapshot on disk already holds the state.
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let live = engine.handle().image().wait().unwrap();
    engine.close();
    assert_eq!(snapshot_indexes(dir.path()), after_first_stop);
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live);
    assert!(engine.handle().job(first).is_some());

    // A change since: the next stop writes a newer snapshot.
    let second = engine.handle().enqueue(vec![new_job(2)]).wait().unwrap()[0].job.id;
    let live = engine.handle().image().wait().unwrap();
    engine.close();
    let after_change = snapshot_indexes(dir.path());
    assert!(after_change.last() > after_first_stop.last(), "{after_change:?} after {after_first_stop:?}");
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), live);
    assert!(engine.handle().job(second).is_some());
    engine.close_without_snapshot();
}

#[test]
fn a_clean_stop_replaces_a_damaged_newest_snapshot_even_with_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    let id = engine.handle().enqueue(vec![new_job(1)]).wait().unwrap()[0].job.id;
    engine.handle().snapshot().wait().unwrap();
    // A second snapshot of the same state, then damaged on disk.
    engine.handle().snapshot().wait().unwrap();
    engine.close_without_snapshot();
    let snapshots = svc::storage::list_snapshots(dir.path()).unwrap();
    let (damaged_index, newest) = snapshots.last().unwrap().clone();
    let mut bytes = std::fs::read(&newest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&newest, &bytes).unwrap();

    // Recovery passes over it and replays nothing; the stop must still
    // write a snapshot, or every start would pass over the damaged one again.
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    engine.close();
    let after = snapshot_indexes(dir.path());
    assert!(*after.last().unwrap() > damaged_index, "{after:?}");
    let engine = Engine::open(engine_config(dir.path())).unwrap();
    assert!(engine.handle().job(id).is_some());
    engine.close_without_snapshot();
}
