//! Engine apply (decide + apply, no I/O) of enqueue, fetch and ack, the
//! ready order's push/pop, parsing an enqueue body, and the whole batch path
//! without I/O (parse + decide + apply + encode + render of 100 jobs).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use std::hint::black_box;
use svc::__private::schedule::{ReadyKey, ReadyQueue};
use svc::engine::record::Logged;
use svc::engine::{Entropy, FetchRequest, Retention, State, SystemEntropy};
use svc::job::{JobDefaults, JobId, NewJob, parse_enqueue_body};

const NOW: i64 = 1_800_000_000_000;

fn new_job(n: usize) -> NewJob {
    let body = json!({"type": "email.send", "args": ["user@example.com", n]});
    parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).expect("valid body")
}

/// Applies a record the way the engine does, with events off.
fn apply(state: &mut State, record: &Logged) {
    state.apply(record, &mut svc::engine::EventSink::disabled()).expect("applies");
}

fn state_with(available: usize) -> State {
    let mut state = State::new(Retention::default());
    let mut entropy = SystemEntropy;
    let record = state
        .decide_enqueue(NOW, (0..available).map(new_job).collect(), &mut entropy)
        .expect("accepted")
        .0
        .expect("a record");
    apply(&mut state, &record);
    state
}

fn engine_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_apply");
    group.throughput(Throughput::Elements(1));
    let mut entropy: Box<dyn Entropy> = Box::new(SystemEntropy);
    group.bench_function("enqueue", |b| {
        let mut state = state_with(0);
        let mut n = 0;
        b.iter_batched(
            || {
                n += 1;
                new_job(n)
            },
            |job| {
                let record =
                    state.decide_enqueue(NOW, vec![job], entropy.as_mut()).expect("accepted").0.expect("a record");
                apply(&mut state, &record);
            },
            BatchSize::SmallInput,
        )
    });
    let request =
        FetchRequest { queues: vec!["default".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    // Each iteration below claims (and acks) 1000 jobs.
    group.throughput(Throughput::Elements(1000));
    group.bench_function("fetch", |b| {
        b.iter_batched_ref(
            || state_with(1000),
            |state| {
                for _ in 0..1000 {
                    let (record, _) = state.decide_fetch(NOW, &request).expect("a job is ready");
                    apply(state, black_box(&record));
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("fetch_then_ack", |b| {
        b.iter_batched_ref(
            || state_with(1000),
            |state| {
                for _ in 0..1000 {
                    let (claim, ids) = state.decide_fetch(NOW, &request).expect("a job is ready");
                    apply(state, &claim);
                    let ack = state.decide_ack(NOW, ids[0], None, None).expect("active");
                    apply(state, &ack);
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn ready_queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("ready_queue");
    for size in [1_000u64, 1_000_000] {
        let mut queue = ReadyQueue::default();
        for n in 0..size {
            queue.push(ReadyKey::new((n % 7) as i32, n as i64, JobId(u128::from(n))));
        }
        let mut seq = size;
        group.bench_function(format!("push_pop_at_{size}"), |b| {
            b.iter(|| {
                seq += 1;
                queue.push(ReadyKey::new(3, seq as i64, JobId(u128::from(seq))));
                black_box(queue.pop())
            })
        });
    }
    group.finish();
}

/// Parsing and validating one enqueue body: a minimal job, and one with
/// options and a retry policy as `svc bench` sends.
fn parse_enqueue(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_enqueue");
    group.throughput(Throughput::Elements(1));
    let defaults = JobDefaults::default();
    let minimal = br#"{"type":"email.send","args":["user@example.com",7]}"#;
    let with_options = br#"{"type":"bench.job","args":[7],"options":{"queue":"bench","retry":{"initial_interval":"PT0.001S","jitter":false}}}"#;
    for (name, body) in [("minimal", &minimal[..]), ("with_options", &with_options[..])] {
        group.bench_function(name, |b| b.iter(|| parse_enqueue_body(black_box(body), &defaults).expect("valid body")));
    }
    group.finish();
}

/// A batch enqueue of 100 jobs of 200 bytes each, as `svc bench --workload
/// fill` sends it, from body to answer: parse, decide and apply, encode the
/// record, render the answer. Measured on a store of 100 000 jobs, which
/// keeps growing by 100 jobs an iteration; and the parse alone (`parse_100`).
fn batch_path(c: &mut Criterion) {
    use svc::engine::{EnqueueSlot, Enqueued};
    let mut group = c.benchmark_group("batch_path");
    group.throughput(Throughput::Elements(100));
    let items: Vec<String> = (0..100)
        .map(|n| {
            let head = format!(r#"{{"type":"bench.fill","args":[{n},""#);
            format!("{head}{}\"]}}", "x".repeat(200 - head.len() - 3))
        })
        .collect();
    let body = format!(r#"{{"jobs":[{}]}}"#, items.join(","));
    let defaults = JobDefaults::default();
    // The request side alone: the body read into 100 validated jobs.
    group.bench_function("parse_100", |b| {
        b.iter(|| svc::__private::http::jobs::parse_batch(black_box(body.as_bytes()), &defaults).expect("valid batch"))
    });
    let mut entropy = SystemEntropy;
    let mut state = state_with(100_000);
    let mut encoded = Vec::new();
    // The state grows by 100 jobs an iteration; it starts over (untimed)
    // before it nears the engine's bound on live jobs.
    group.bench_function("parse_decide_encode_render_100", |b| {
        b.iter_custom(|iterations| {
            let mut timed = std::time::Duration::ZERO;
            for _ in 0..iterations {
                if state.live_jobs() >= 2_000_000 {
                    state = state_with(100_000);
                }
                let started = std::time::Instant::now();
                let jobs = svc::__private::http::jobs::parse_batch(black_box(body.as_bytes()), &defaults)
                    .expect("valid batch");
                let (record, slots) = state.decide_enqueue(NOW, jobs, &mut entropy).expect("accepted");
                let record = record.expect("a record");
                apply(&mut state, &record);
                svc::engine::record::encode_batch(std::slice::from_ref(&record), &mut encoded);
                let enqueued: Vec<Enqueued> = slots
                    .iter()
                    .map(|slot| {
                        let EnqueueSlot::New(id) = slot else { unreachable!("no unique policies here") };
                        Enqueued { job: state.job_handle(*id).expect("stored"), deduplicated: false, pressure: None }
                    })
                    .collect();
                black_box(svc::__private::http::jobs::render_batch(&enqueued).len() + encoded.len());
                timed += started.elapsed();
            }
            timed
        })
    });
}

criterion_group!(benches, engine_apply, ready_queue, parse_enqueue, batch_path);
criterion_main!(benches);
