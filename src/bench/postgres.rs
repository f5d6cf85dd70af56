//! `svc bench --target postgres --address URL`: a plain job queue on
//! PostgreSQL, driven like svc, for the side-by-side figure of svc's
//! PostgreSQL backend (docs/postgres.md, "Speed").
//!
//! The queue is what a team would write by hand: one `bench_jobs` table
//! (bigserial id, queue, priority, state, attempt, jsonb args, times) with a
//! partial index on `(queue, priority DESC, id) WHERE state = 'available'`;
//! every statement its own transaction, with `synchronous_commit = on`.
//!
//! - `enqueue`: one `INSERT` per job;
//! - `fill`: `--jobs` jobs, 100 to an `INSERT ... SELECT FROM unnest(...)`;
//! - `drain`: `--jobs` jobs loaded 100 to a statement, then every connection
//!   claims one job at a time (`UPDATE ... WHERE id = (SELECT ... FOR UPDATE
//!   SKIP LOCKED LIMIT 1) RETURNING`) and acks it (`UPDATE`) until none is left.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio_postgres::{Client, NoTls};

use super::{BenchOptions, BenchReport, LoopResult, Workload, gather_report, micros};

const SCHEMA: &str = "
DROP TABLE IF EXISTS bench_jobs;
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'available',
    attempt integer NOT NULL DEFAULT 0,
    args jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX bench_jobs_available ON bench_jobs (queue, priority DESC, id) WHERE state = 'available';
";

const INSERT_ONE: &str = "INSERT INTO bench_jobs (queue, args) VALUES ('bench', $1::text::jsonb)";
const INSERT_MANY: &str = "INSERT INTO bench_jobs (queue, args) SELECT 'bench', a::jsonb FROM unnest($1::text[]) AS a";
const CLAIM: &str = "UPDATE bench_jobs SET state = 'active', attempt = attempt + 1, started_at = now() \
     WHERE id = (SELECT id FROM bench_jobs WHERE queue = 'bench' AND state = 'available' \
       ORDER BY priority DESC, id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, args";
const ACK: &str = "UPDATE bench_jobs SET state = 'completed', finished_at = now() WHERE id = $1";

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|error| format!("{url}: {error}"))?;
    tokio::spawn(connection);
    client.batch_execute("SET synchronous_commit = on").await.map_err(|error| error.to_string())?;
    Ok(client)
}

fn args(n: u64) -> String {
    format!(r#"[{n},"bench"]"#)
}

/// Runs `enqueue`, `fill` or `drain` against the plain queue at `options.address` (a URL).
pub async fn run(options: &BenchOptions) -> Result<BenchReport, String> {
    let setup = connect(&options.address).await?;
    setup.batch_execute(SCHEMA).await.map_err(|error| error.to_string())?;
    if options.workload == Workload::Drain {
        load(&setup, options.jobs).await?;
    }
    let mut clients = Vec::new();
    for _ in 0..options.connections {
        clients.push(connect(&options.address).await?);
    }
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let (counter, jobs, workload) = (counter.clone(), options.jobs, options.workload);
        tasks.push(tokio::spawn(async move {
            match workload {
                Workload::Enqueue => enqueue(&client, &counter, jobs, 1).await,
                Workload::Fill => enqueue(&client, &counter, jobs, 100).await,
                _ => drain(&client).await,
            }
        }));
    }
    let none = std::sync::Mutex::new(Vec::new());
    gather_report(options.workload, options.connections, tasks, started, &none).await
}

/// Loads `jobs` jobs, 100 to a statement.
async fn load(client: &Client, jobs: u64) -> Result<(), String> {
    let mut loaded = 0;
    while loaded < jobs {
        let batch: Vec<String> = (loaded..jobs.min(loaded + 100)).map(args).collect();
        client.execute(INSERT_MANY, &[&batch]).await.map_err(|error| error.to_string())?;
        loaded += batch.len() as u64;
    }
    Ok(())
}

/// Inserts jobs `per_statement` at a time until `jobs` are in.
async fn enqueue(client: &Client, counter: &AtomicU64, jobs: u64, per_statement: u64) -> LoopResult {
    let (mut latencies, mut inserted) = (Vec::new(), 0);
    loop {
        let first = counter.fetch_add(per_statement, Ordering::Relaxed);
        if first >= jobs {
            return Ok((inserted, latencies));
        }
        let last = jobs.min(first + per_statement);
        let sent = Instant::now();
        if per_statement == 1 {
            client.execute(INSERT_ONE, &[&args(first)]).await.map_err(|error| error.to_string())?;
        } else {
            let batch: Vec<String> = (first..last).map(args).collect();
            client.execute(INSERT_MANY, &[&batch]).await.map_err(|error| error.to_string())?;
        }
        latencies.push(micros(sent.elapsed()));
        inserted += last - first;
    }
}

/// Claims and acks one job at a time until none is left.
async fn drain(client: &Client) -> LoopResult {
    let (mut latencies, mut jobs) = (Vec::new(), 0);
    let claim = client.prepare(CLAIM).await.map_err(|error| error.to_string())?;
    let ack = client.prepare(ACK).await.map_err(|error| error.to_string())?;
    loop {
        let sent = Instant::now();
        let row = client.query_opt(&claim, &[]).await.map_err(|error| error.to_string())?;
        latencies.push(micros(sent.elapsed()));
        let Some(row) = row else { return Ok((jobs, latencies)) };
        let id: i64 = row.get(0);
        let sent = Instant::now();
        client.execute(&ack, &[&id]).await.map_err(|error| error.to_string())?;
        latencies.push(micros(sent.elapsed()));
        jobs += 1;
    }
}
