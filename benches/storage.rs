//! Frame codec, durable log commits at batch sizes 1, 64 and 1024 (both as
//! direct writes and through the page cache with `fdatasync`), and a
//! snapshot of a million jobs encoded and decoded in memory.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use svc::engine::record::{Logged, encode_batch};
use svc::engine::{Entropy, IMAGE_VERSION, Retention, State, SystemEntropy, decode_image};
use svc::job::{JobDefaults, parse_enqueue_body};
use svc::storage::frame::{decode_frame, encode_frame};
use svc::storage::{FileSystem, PageCacheFileSystem, RealFileSystem, WalWriter};

/// The records of `count` single-job enqueues, as the engine logs them.
fn enqueue_records(count: usize) -> Vec<Logged> {
    let mut state = State::new(Retention::default());
    let mut entropy: Box<dyn Entropy> = Box::new(SystemEntropy);
    (0..count)
        .map(|n| {
            let body = json!({"type": "email.send", "args": ["user@example.com", n], "meta": {"trace_id": "abc"}});
            let job = parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).expect("valid body");
            state.decide_enqueue(1_800_000_000_000, vec![job], entropy.as_mut()).expect("accepted").0.expect("a record")
        })
        .collect()
}

fn frame_codec(c: &mut Criterion) {
    let mut payload = Vec::new();
    encode_batch(&enqueue_records(64), &mut payload);
    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Bytes(payload.len() as u64));
    group.bench_function("encode", |b| {
        let mut out = Vec::with_capacity(payload.len() + 8);
        b.iter(|| {
            out.clear();
            encode_frame(black_box(&payload), &mut out);
        })
    });
    let mut framed = Vec::new();
    encode_frame(&payload, &mut framed);
    group.bench_function("decode", |b| b.iter(|| decode_frame(black_box(&framed))));
    group.finish();
}

fn log_append_and_sync(c: &mut Criterion) {
    let mut group = c.benchmark_group("wal_commit");
    group.sample_size(20);
    let file_systems: [(&str, Arc<dyn FileSystem>); 2] =
        [("direct", Arc::new(RealFileSystem)), ("page_cache", Arc::new(PageCacheFileSystem))];
    for (name, file_system) in file_systems {
        for batch in [1usize, 64, 1024] {
            let mut payload = Vec::new();
            encode_batch(&enqueue_records(batch), &mut payload);
            let dir = tempfile::tempdir().expect("temp dir");
            let mut wal = WalWriter::create(file_system.clone(), dir.path(), 0, 64 * 1024 * 1024).expect("log opens");
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(BenchmarkId::new(name, batch), &payload, |b, payload| {
                b.iter(|| wal.commit(black_box(payload)).expect("commit"))
            });
        }
    }
    group.finish();
}

/// A snapshot of a backlog of a million jobs of about 200 bytes (as `svc
/// bench --workload fill` sends them), taken from the state as the engine
/// takes it: encoded (sorted by id, in chunks) without the file, and
/// decoded on one thread.
fn snapshot_codec(c: &mut Criterion) {
    const JOBS: usize = 1_000_000;
    let mut state = State::new(Retention::default());
    let mut entropy = SystemEntropy;
    for batch in 0..JOBS / 1000 {
        let jobs = (0..1000)
            .map(|n| {
                let head = format!(r#"{{"type":"bench.fill","args":[{},""#, batch * 1000 + n);
                let body = format!("{head}{}\"]}}", "x".repeat(200 - head.len() - 3));
                parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).expect("valid body")
            })
            .collect();
        let record =
            state.decide_enqueue(1_800_000_000_000, jobs, &mut entropy).expect("accepted").0.expect("a record");
        state.apply(&record, &mut svc::engine::EventSink::disabled()).expect("applies");
    }
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10).throughput(Throughput::Elements(JOBS as u64));
    group.bench_function("encode_1m", |b| {
        b.iter_batched(
            || state.image(),
            |mut image| image.encode_to(&mut std::io::sink()).expect("encodes"),
            criterion::BatchSize::PerIteration,
        )
    });
    let encoded = state.image().encode();
    group
        .bench_function("decode_1m", |b| b.iter(|| decode_image(IMAGE_VERSION, black_box(&encoded)).expect("decodes")));
    group.finish();
}

criterion_group!(benches, frame_codec, log_append_and_sync, snapshot_codec);
criterion_main!(benches);
