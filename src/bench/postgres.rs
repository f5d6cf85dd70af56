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
//!
//! `--target postgres-merged` is the floor of merging on the same table: the
//! connections' requests go through one merger per kind, as svc's PostgreSQL
//! backend merges them (no delay added, at most two statements of a kind
//! under way, each on a connection of its own). Enqueues become one `INSERT
//! ... unnest`, claims one `UPDATE` of a `MATERIALIZED` `SKIP LOCKED` pick,
//! acks one `UPDATE ... WHERE id = ANY(...)`. `fill` there writes each
//! request's 100 jobs with a binary `COPY` instead, unmerged, for the figure
//! of `COPY` against `unnest` at that batch size.
//!
//! Two more floors add, one at a time, the least of the work svc's
//! PostgreSQL layout does for every job (docs/postgres.md, "Tables"), still
//! merged and with none of svc's own work. `--target
//! postgres-merged-history` moves each acked job out of the hot table into a
//! history table partitioned by day (`DELETE ... RETURNING` into an
//! `INSERT`, one statement). `--target postgres-merged-outbox` also writes
//! an event row beside each enqueue, claim and ack, in the same statement
//! (the outbox webhooks and the event listing read). In both, `fill` sends
//! each request's 100 jobs through the enqueue merger, as svc does.
//!
//! With `--shared`, a run uses the tables an earlier run on the same
//! database made and loads nothing, so that two load generators can stand
//! for two svc nodes on one database, each merging only its own requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
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

/// The statements' shared pieces, spelled once: a merged insert, a merged
/// claim's pick and its `UPDATE`, an ack's `DELETE` and the history insert
/// fed by it (named `done`).
macro_rules! insert_many {
    () => {
        "INSERT INTO bench_jobs (queue, args) SELECT 'bench', a::jsonb FROM unnest($1::text[]) AS a"
    };
}
macro_rules! pick_many {
    () => {
        "WITH picked AS MATERIALIZED (SELECT id FROM bench_jobs \
           WHERE queue = 'bench' AND state = 'available' ORDER BY priority DESC, id LIMIT $1 FOR UPDATE SKIP LOCKED)"
    };
}
macro_rules! claim_picked {
    () => {
        "UPDATE bench_jobs j SET state = 'active', attempt = attempt + 1, started_at = now() \
         FROM picked WHERE j.id = picked.id RETURNING j.id, j.args"
    };
}
macro_rules! delete_acked {
    () => {
        "DELETE FROM bench_jobs WHERE id = ANY($1) RETURNING id, queue, attempt, args, created_at, started_at"
    };
}
macro_rules! insert_history {
    () => {
        "INSERT INTO bench_history (id, queue, attempt, args, created_at, started_at, finished_at) \
         SELECT id, queue, attempt, args, created_at, started_at, now() FROM done"
    };
}

const INSERT_ONE: &str = "INSERT INTO bench_jobs (queue, args) VALUES ('bench', $1::text::jsonb)";
const INSERT_MANY: &str = insert_many!();
const CLAIM: &str = "UPDATE bench_jobs SET state = 'active', attempt = attempt + 1, started_at = now() \
     WHERE id = (SELECT id FROM bench_jobs WHERE queue = 'bench' AND state = 'available' \
       ORDER BY priority DESC, id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, args";
const ACK: &str = "UPDATE bench_jobs SET state = 'completed', finished_at = now() WHERE id = $1";
const CLAIM_MANY: &str = concat!(pick_many!(), " ", claim_picked!());
const ACK_MANY: &str = "UPDATE bench_jobs SET state = 'completed', finished_at = now() WHERE id = ANY($1)";
/// The history and outbox tables of the [`Layout::History`] and
/// [`Layout::Outbox`] floors: the least of svc's layout (fewer indexes than
/// svc's own tables; docs/perf-log.md, "PostgreSQL: floors that write svc's
/// layout"). History is keyed by (finished time, id) with an index on id;
/// its one partition holds today and tomorrow, so that a run across
/// midnight still has one.
const LAYOUT_SCHEMA: &str = "
DROP TABLE IF EXISTS bench_history;
DROP TABLE IF EXISTS bench_events;
CREATE TABLE bench_history (
    id bigint NOT NULL,
    queue text NOT NULL,
    attempt integer NOT NULL,
    args jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (finished_at, id)
) PARTITION BY RANGE (finished_at);
CREATE INDEX bench_history_id ON bench_history (id);
DO $$ BEGIN
    EXECUTE format('CREATE TABLE bench_history_now PARTITION OF bench_history FOR VALUES FROM (%L) TO (%L)',
        date_trunc('day', now()), date_trunc('day', now()) + interval '2 days');
END $$;
CREATE TABLE bench_events (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    kind text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    body jsonb NOT NULL
);
";
const ACK_MOVE: &str = concat!("WITH done AS (", delete_acked!(), ") ", insert_history!());
const INSERT_MANY_EVENTS: &str = concat!(
    "WITH added AS (",
    insert_many!(),
    " RETURNING id, args) INSERT INTO bench_events (job_id, kind, body) SELECT id, 'enqueued', args FROM added"
);
const CLAIM_MANY_EVENTS: &str = concat!(
    pick_many!(),
    ", claimed AS (",
    claim_picked!(),
    "), told AS (INSERT INTO bench_events (job_id, kind, body) SELECT id, 'started', args FROM claimed) \
     SELECT id, args FROM claimed"
);
const ACK_MOVE_EVENTS: &str = concat!(
    "WITH done AS (",
    delete_acked!(),
    "), moved AS (",
    insert_history!(),
    " RETURNING id, args) INSERT INTO bench_events (job_id, kind, body) SELECT id, 'completed', args FROM moved"
);
const COPY_IN: &str = "COPY bench_jobs (queue, args) FROM STDIN (FORMAT binary)";
/// Requests merged into one statement at most, and merged statements of one
/// kind under way at once: svc's PostgreSQL backend's figures.
const MERGED_MAX: usize = 64;
const MERGED_IN_FLIGHT: usize = 2;

/// What a merged floor writes for each job.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// The plain queue's one table: an ack is an `UPDATE`.
    Plain,
    /// An ack moves the job into the history table.
    History,
    /// As `History`, and every enqueue, claim and ack writes an event row.
    Outbox,
}

impl Layout {
    fn statements(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Layout::Plain => (INSERT_MANY, CLAIM_MANY, ACK_MANY),
            Layout::History => (INSERT_MANY, CLAIM_MANY, ACK_MOVE),
            Layout::Outbox => (INSERT_MANY_EVENTS, CLAIM_MANY_EVENTS, ACK_MOVE_EVENTS),
        }
    }
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|error| format!("{url}: {error}"))?;
    tokio::spawn(connection);
    client.batch_execute("SET synchronous_commit = on").await.map_err(|error| error.to_string())?;
    Ok(client)
}

fn args(n: u64) -> String {
    format!(r#"[{n},"bench"]"#)
}

/// Runs `enqueue`, `fill` or `drain` against the plain queue at
/// `options.address` (a URL), each connection on its own or, with a
/// `merged` layout, through mergers.
pub async fn run(options: &BenchOptions, merged: Option<Layout>) -> Result<BenchReport, String> {
    if let Some(layout) = merged {
        return run_merged(options, layout).await;
    }
    if !options.shared {
        let setup = connect(&options.address).await?;
        setup.batch_execute(SCHEMA).await.map_err(|error| error.to_string())?;
        if options.workload == Workload::Drain {
            load(&setup, options.jobs).await?;
        }
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

/// One merger's requests: what each asks, and where its answer goes.
type Asked<R, A> = (R, oneshot::Sender<Result<A, String>>);

/// Gathers requests of one kind into one statement, with no delay added:
/// while [`MERGED_IN_FLIGHT`] statements run, new requests queue up. The
/// rule of svc's own batcher (`backend/postgres/batch.rs`), kept apart since
/// the load generator is a client and does not link the library; each
/// statement here has a connection of its own, as a floor should.
struct Merger<R, A> {
    sender: mpsc::UnboundedSender<Asked<R, A>>,
}

impl<R: Send + 'static, A: Send + 'static> Merger<R, A> {
    async fn start<F, Fut>(url: &str, run: F) -> Result<Merger<R, A>, String>
    where
        F: Fn(Arc<Client>, Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<A>, String>> + Send + 'static,
    {
        let (free, mut idle) = mpsc::unbounded_channel();
        for _ in 0..MERGED_IN_FLIGHT {
            let _ = free.send(Arc::new(connect(url).await?));
        }
        let (sender, mut receiver) = mpsc::unbounded_channel::<Asked<R, A>>();
        let run = Arc::new(run);
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let Some(client) = idle.recv().await else { return };
                let mut batch = vec![first];
                while batch.len() < MERGED_MAX {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (run, free) = (run.clone(), free.clone());
                tokio::spawn(async move {
                    let (requests, answers): (Vec<R>, Vec<_>) = batch.into_iter().unzip();
                    match run(client.clone(), requests).await {
                        Ok(outcomes) => {
                            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                                let _ = answer.send(Ok(outcome));
                            }
                        }
                        Err(error) => {
                            for answer in answers {
                                let _ = answer.send(Err(error.clone()));
                            }
                        }
                    }
                    let _ = free.send(client);
                });
            }
        });
        Ok(Merger { sender })
    }

    async fn submit(&self, request: R) -> Result<A, String> {
        let (answer, outcome) = oneshot::channel();
        self.sender.send((request, answer)).map_err(|_| "the merger stopped".to_string())?;
        outcome.await.map_err(|_| "the merger stopped".to_string())?
    }
}

/// The mergers of one run.
struct Mergers {
    enqueue: Merger<Vec<String>, ()>,
    claim: Merger<(), Option<i64>>,
    ack: Merger<i64, ()>,
}

async fn mergers(url: &str, layout: Layout) -> Result<Mergers, String> {
    let (insert_many, claim_many, ack_many) = layout.statements();
    let enqueue = Merger::start(url, move |client: Arc<Client>, batches: Vec<Vec<String>>| async move {
        let count = batches.len();
        let all: Vec<String> = batches.into_iter().flatten().collect();
        client.execute(insert_many, &[&all]).await.map_err(|error| error.to_string())?;
        Ok(vec![(); count])
    })
    .await?;
    let claim = Merger::start(url, move |client: Arc<Client>, asked: Vec<()>| async move {
        let rows = client.query(claim_many, &[&(asked.len() as i64)]).await.map_err(|error| error.to_string())?;
        let mut ids: Vec<Option<i64>> = rows.iter().map(|row| Some(row.get(0))).collect();
        ids.resize(asked.len(), None);
        Ok(ids)
    })
    .await?;
    let ack = Merger::start(url, move |client: Arc<Client>, ids: Vec<i64>| async move {
        let count = ids.len();
        client.execute(ack_many, &[&ids]).await.map_err(|error| error.to_string())?;
        Ok(vec![(); count])
    })
    .await?;
    Ok(Mergers { enqueue, claim, ack })
}

async fn run_merged(options: &BenchOptions, layout: Layout) -> Result<BenchReport, String> {
    if !options.shared {
        let setup = connect(&options.address).await?;
        setup.batch_execute(SCHEMA).await.map_err(|error| error.to_string())?;
        if layout != Layout::Plain {
            setup.batch_execute(LAYOUT_SCHEMA).await.map_err(|error| error.to_string())?;
        }
        if options.workload == Workload::Drain {
            load(&setup, options.jobs).await?;
        }
    }
    let mergers = Arc::new(mergers(&options.address, layout).await?);
    let mut copy_clients = Vec::new();
    if options.workload == Workload::Fill && layout == Layout::Plain {
        for _ in 0..options.connections {
            copy_clients.push(Some(connect(&options.address).await?));
        }
    }
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..options.connections {
        let (counter, jobs, workload, mergers) = (counter.clone(), options.jobs, options.workload, mergers.clone());
        let copy_client = copy_clients.get_mut(task).and_then(Option::take);
        tasks.push(tokio::spawn(async move {
            match (workload, copy_client) {
                (Workload::Fill, Some(client)) => copy_fill(&client, &counter, jobs).await,
                (Workload::Enqueue, _) => merged_enqueue(&mergers, &counter, jobs, 1).await,
                (Workload::Fill, None) => merged_enqueue(&mergers, &counter, jobs, 100).await,
                _ => merged_drain(&mergers).await,
            }
        }));
    }
    let none = std::sync::Mutex::new(Vec::new());
    gather_report(options.workload, options.connections, tasks, started, &none).await
}

/// Enqueues `per_request` jobs a request through the enqueue merger until
/// `jobs` are in.
async fn merged_enqueue(mergers: &Mergers, counter: &AtomicU64, jobs: u64, per_request: u64) -> LoopResult {
    let (mut latencies, mut inserted) = (Vec::new(), 0);
    loop {
        let first = counter.fetch_add(per_request, Ordering::Relaxed);
        if first >= jobs {
            return Ok((inserted, latencies));
        }
        let last = jobs.min(first + per_request);
        let sent = Instant::now();
        mergers.enqueue.submit((first..last).map(args).collect()).await?;
        latencies.push(micros(sent.elapsed()));
        inserted += last - first;
    }
}

async fn merged_drain(mergers: &Mergers) -> LoopResult {
    let (mut latencies, mut jobs) = (Vec::new(), 0);
    loop {
        let sent = Instant::now();
        let claimed = mergers.claim.submit(()).await?;
        latencies.push(micros(sent.elapsed()));
        let Some(id) = claimed else { return Ok((jobs, latencies)) };
        let sent = Instant::now();
        mergers.ack.submit(id).await?;
        latencies.push(micros(sent.elapsed()));
        jobs += 1;
    }
}

/// A `jsonb` value from JSON text, as `COPY`'s binary format writes it.
#[derive(Debug)]
struct JsonbText(String);

impl ToSql for JsonbText {
    fn to_sql(&self, _: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // The binary form of jsonb: a version byte, then the text.
        out.extend_from_slice(&[1]);
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    to_sql_checked!();
}

/// Writes jobs 100 to a binary `COPY` until `jobs` are in.
async fn copy_fill(client: &Client, counter: &AtomicU64, jobs: u64) -> LoopResult {
    let (mut latencies, mut inserted) = (Vec::new(), 0);
    loop {
        let first = counter.fetch_add(100, Ordering::Relaxed);
        if first >= jobs {
            return Ok((inserted, latencies));
        }
        let last = jobs.min(first + 100);
        let sent = Instant::now();
        let sink = client.copy_in(COPY_IN).await.map_err(|error| error.to_string())?;
        let writer = BinaryCopyInWriter::new(sink, &[Type::TEXT, Type::JSONB]);
        let mut writer = std::pin::pin!(writer);
        for n in first..last {
            writer.as_mut().write(&[&"bench", &JsonbText(args(n))]).await.map_err(|error| error.to_string())?;
        }
        writer.finish().await.map_err(|error| error.to_string())?;
        latencies.push(micros(sent.elapsed()));
        inserted += last - first;
    }
}
