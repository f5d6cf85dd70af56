//! The database schema and its migrations (docs/postgres.md, "Tables").
//!
//! Every node runs [`migrate`] when it starts. It takes a transaction-level
//! advisory lock first, so nodes starting together apply each migration
//! once, one after the other; reads the version recorded in `svc_schema`;
//! refuses a database newer than this binary; and applies what is missing,
//! all in one transaction, so a migration is applied whole or not at all.
//! A migration, once released, never changes: the next change is the next
//! entry of [`MIGRATIONS`].

use deadpool_postgres::GenericClient;

/// The schema version this binary runs on.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory lock key migrations hold (`svc_migr` as eight bytes), so
/// that other programs' advisory locks on the same database do not collide.
const MIGRATION_LOCK: i64 = i64::from_be_bytes(*b"svc_migr");

/// Where the applied version is recorded; made before any migration runs.
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS svc_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL
)";

/// Each migration's statements; migration N is `MIGRATIONS[N - 1]`.
const MIGRATIONS: &[&str] = &[
    V1_JOBS_QUEUES_LEADER,
    V2_EVENTS,
    V3_CRON,
    V4_QUEUE_INDEXES,
    V5_WORKERS,
    V6_SCHEMAS,
    V7_WORKFLOWS,
    V8_UNIQUE,
    V9_DISPATCH,
    V10_EXPIRY,
    V11_CRON_WAITERS,
    V12_WEBHOOKS,
    V13_CLAIM_ORDER,
    V14_PRUNE_INDEXES,
    V15_QUEUE_DEPTHS,
    V16_CLAIM_COLUMNS,
    V17_EVENT_RUNS,
];

/// Version 1: jobs in flight, finished jobs by day, queue settings and the
/// leader lease.
const V1_JOBS_QUEUES_LEADER: &str = "
-- Jobs not yet finished: the hot table, kept small so that its indexes stay
-- in memory and vacuum keeps up. `body` is the whole job in svc's stored form;
-- the columns are what claims, timers and listings select on.
CREATE TABLE svc_jobs (
    id uuid PRIMARY KEY,
    queue text NOT NULL,
    type text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'scheduled', 'available', 'active', 'retryable')),
    priority smallint NOT NULL,
    -- When the job became (or becomes) available: the order within a priority.
    ready_at timestamptz NOT NULL,
    attempt integer NOT NULL,
    -- Set by every claim; an ack, nack or heartbeat must name the claim it holds.
    claim bigint,
    lease_until timestamptz,
    worker_id text,
    created_at timestamptz NOT NULL,
    body bytea NOT NULL
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
-- The claim order: a queue's available jobs by priority, then time, then id.
CREATE INDEX svc_jobs_available ON svc_jobs (queue, priority DESC, ready_at, id) WHERE state = 'available';
-- Scheduled and retryable jobs by the time they come due.
CREATE INDEX svc_jobs_due ON svc_jobs (ready_at) WHERE state IN ('scheduled', 'retryable');
-- Claims by the time their lease runs out.
CREATE INDEX svc_jobs_leases ON svc_jobs (lease_until) WHERE state = 'active';

-- Finished jobs, partitioned by the day they finished: pruning drops whole
-- partitions. The leader makes each day's partition ahead of time; the
-- default partition only catches what arrives before one exists.
CREATE TABLE svc_job_history (
    id uuid NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    state text NOT NULL CHECK (state IN ('completed', 'discarded', 'cancelled')),
    finished_at timestamptz NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (finished_at, id)
) PARTITION BY RANGE (finished_at);
CREATE TABLE svc_job_history_default PARTITION OF svc_job_history DEFAULT;
CREATE INDEX svc_job_history_id ON svc_job_history (id);

-- Queues with settings of their own: paused, or bounded (backpressure).
CREATE TABLE svc_queues (
    name text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    max_depth bigint CHECK (max_depth > 0),
    warning_threshold double precision CHECK (warning_threshold > 0 AND warning_threshold <= 1),
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- Who runs the timers and housekeeping: one row per role, held by one node
-- until `expires_at` unless it renews.
CREATE TABLE svc_leader (
    role text PRIMARY KEY,
    node text NOT NULL,
    expires_at timestamptz NOT NULL
);
";

/// Version 2: the events of job changes, written in the transaction of the
/// change.
const V2_EVENTS: &str = "
-- The newest events, for the event listing: written with the change they
-- tell of, pruned by the leader to the newest ones. `id` (a UUIDv7, ordered
-- by time) is the listing's order and cursor; `body` holds the event's kind
-- and the job as it was right after the change, in svc's stored form.
CREATE TABLE svc_events (
    id uuid PRIMARY KEY,
    at timestamptz NOT NULL,
    type text NOT NULL,
    queue text,
    job_type text,
    body bytea NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
";

/// Version 3: cron entries, and each firing recorded once.
const V3_CRON: &str = "
-- Registered cron entries. `body` is the whole entry in svc's stored form
-- (definition, counts, last run); `next_run_at` is what the leader selects
-- on, null while disabled or when the expression never fires again. Names
-- sort bytewise (`C`), as the listing pages by them.
CREATE TABLE svc_crons (
    name text COLLATE \"C\" PRIMARY KEY,
    enabled boolean NOT NULL,
    next_run_at timestamptz,
    body bytea NOT NULL
);
CREATE INDEX svc_crons_due ON svc_crons (next_run_at) WHERE next_run_at IS NOT NULL;

-- Each firing of an entry, one row per nominal time: the primary key is
-- what keeps a firing from being made twice, whichever node fires it.
CREATE TABLE svc_cron_firings (
    name text NOT NULL,
    scheduled_at timestamptz NOT NULL,
    fired_at timestamptz NOT NULL,
    outcome text NOT NULL,
    job_id uuid,
    PRIMARY KEY (name, scheduled_at)
);
";

/// Version 4: jobs by queue and state, for the queues' figures and
/// listing; every queue jobs were enqueued to gets its `svc_queues` row.
const V4_QUEUE_INDEXES: &str = "
CREATE INDEX svc_jobs_queue_state ON svc_jobs (queue, state);
CREATE INDEX svc_job_history_queue_state ON svc_job_history (queue, state);
INSERT INTO svc_queues (name) SELECT DISTINCT queue FROM svc_jobs ON CONFLICT DO NOTHING;
INSERT INTO svc_queues (name) SELECT DISTINCT queue FROM svc_job_history ON CONFLICT DO NOTHING;
";

/// Version 5: the worker registry, the active jobs of a worker, and
/// finished jobs by time for the throughput history.
const V5_WORKERS: &str = "
-- Workers seen on any node, and the signals operators gave them. Times are
-- as coarse as a second: a fetch writes a known worker's row at most once
-- a second.
CREATE TABLE svc_workers (
    worker_id text COLLATE \"C\" PRIMARY KEY,
    first_seen_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    queues text[] NOT NULL DEFAULT '{}',
    signal text CHECK (signal IN ('quiet', 'terminate')),
    signalled_at timestamptz
);
CREATE INDEX svc_jobs_worker ON svc_jobs (worker_id) WHERE state = 'active';
CREATE INDEX svc_job_history_finished ON svc_job_history (state, finished_at);
";

/// Version 6: the schema registry.
const V6_SCHEMAS: &str = "
-- Registered JSON Schemas, by URI (sorted bytewise, as the listing pages
-- by it). `body` is the whole entry in svc's stored form: the document,
-- its metadata and the registered documents its `$ref`s reached.
CREATE TABLE svc_schemas (
    uri text COLLATE \"C\" PRIMARY KEY,
    created_at timestamptz NOT NULL,
    body bytea NOT NULL
);
";

/// Version 7: workflows.
const V7_WORKFLOWS: &str = "
-- Chains, groups and batches. `body` is the whole workflow in svc's stored
-- form (members with how they ended, a batch's callbacks, the failure);
-- `state` and `ended_at` are what pruning selects on.
CREATE TABLE svc_workflows (
    id uuid PRIMARY KEY,
    state text NOT NULL CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
    created_at timestamptz NOT NULL,
    ended_at timestamptz,
    body bytea NOT NULL
);
CREATE INDEX svc_workflows_ended ON svc_workflows (ended_at) WHERE ended_at IS NOT NULL;
";

/// Version 8: the fingerprints of unique jobs.
const V8_UNIQUE: &str = "
-- A job in flight with a unique policy holds its fingerprint (SHA-256) in
-- `unique_key`; an enqueue looks its holders up by it. (A policy covers
-- unfinished states only: finished jobs hold nothing.)
ALTER TABLE svc_jobs ADD COLUMN unique_key bytea;
CREATE INDEX svc_jobs_unique ON svc_jobs (unique_key) WHERE unique_key IS NOT NULL;
";

/// Version 9: dispatch limits.
const V9_DISPATCH: &str = "
-- A job with a dispatch limit keeps its limit key in `dispatch_key`: the
-- jobs active under a key are counted through the index.
ALTER TABLE svc_jobs ADD COLUMN dispatch_key text;
CREATE INDEX svc_jobs_dispatch_active ON svc_jobs (dispatch_key) WHERE state = 'active' AND dispatch_key IS NOT NULL;
-- The claims of jobs with a rate, as milliseconds since the epoch; kept as
-- long as the longest window.
CREATE TABLE svc_dispatch_claims (
    key text NOT NULL,
    claimed_at bigint NOT NULL
);
CREATE INDEX svc_dispatch_claims_key ON svc_dispatch_claims (key, claimed_at);
-- The `default` queue is always listed, as on the local engine.
INSERT INTO svc_queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
";

/// Version 10: the expiry of jobs not claimed.
const V10_EXPIRY: &str = "
-- When a job not yet claimed is discarded unclaimed (`expires_at`); the
-- leader's timers select on it.
ALTER TABLE svc_jobs ADD COLUMN expires_at timestamptz;
CREATE INDEX svc_jobs_expiry ON svc_jobs (expires_at) WHERE expires_at IS NOT NULL AND state <> 'active';
";

/// Version 11: cron runs waiting for the previous run.
const V11_CRON_WAITERS: &str = "
-- The run of a cron entry (`overlap_policy: enqueue`) that waits, pending,
-- for this job to end; it starts when this row leaves the table.
ALTER TABLE svc_jobs ADD COLUMN waiter uuid;
CREATE INDEX svc_jobs_waiter ON svc_jobs (waiter) WHERE waiter IS NOT NULL;
";

/// Version 12: webhook subscriptions, the outbox of their deliveries, and
/// the point up to which events were matched to subscriptions.
const V12_WEBHOOKS: &str = "
-- The transaction each event was written in: an event whose transaction is
-- older than every running one (the snapshot's xmin) can no longer appear,
-- so the leader matches events to subscriptions in this order, never
-- skipping one that commits late.
ALTER TABLE svc_events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX svc_events_xid ON svc_events (xid, id);

-- Subscriptions; `body` is the whole subscription in svc's stored form.
CREATE TABLE svc_webhooks (
    id uuid PRIMARY KEY,
    body bytea NOT NULL
);

-- Deliveries not yet delivered or abandoned: the event's envelope as it is
-- sent, the attempts started, and when the next may start (an attempt in
-- flight holds it until its timeout has passed). Times are Unix milliseconds.
CREATE TABLE svc_deliveries (
    id uuid PRIMARY KEY,
    subscription uuid NOT NULL REFERENCES svc_webhooks (id) ON DELETE CASCADE,
    event_type text NOT NULL,
    body text NOT NULL,
    held int8 NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_at int8 NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX svc_deliveries_due ON svc_deliveries (next_at);
-- A subscription's deliveries by due time: the sender's look, the cascade.
CREATE INDEX svc_deliveries_subscription ON svc_deliveries (subscription, next_at);

-- Events up to (xid, id) have been matched: none yet. (Events kept from
-- before this migration are matched once too; no subscription takes them.)
CREATE TABLE svc_webhook_cursor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid xid8 NOT NULL,
    id uuid NOT NULL
);
INSERT INTO svc_webhook_cursor (xid, id) VALUES ('0', '00000000-0000-0000-0000-000000000000');
";

/// Version 13: one index serves claims and the queues' figures. With the
/// partial claim index beside a `(queue, state)` one, statistics taken
/// while a queue was nearly empty let the planner claim through the latter,
/// sorting every available job of the queue for each claim; with one index
/// that leads with both and then has the claim order, no plan needs a sort.
const V13_CLAIM_ORDER: &str = "
CREATE INDEX svc_jobs_claim_order ON svc_jobs (queue, state, priority DESC, ready_at, id);
DROP INDEX svc_jobs_available;
DROP INDEX svc_jobs_queue_state;
";

/// Version 14: the leader's prunes of old firings and claims select by
/// age; without an index on it each pass read the whole table, which holds
/// a week of firings and the longest window's claims (docs/perf-log.md).
const V14_PRUNE_INDEXES: &str = "
CREATE INDEX svc_cron_firings_fired ON svc_cron_firings (fired_at);
CREATE INDEX svc_dispatch_claims_claimed ON svc_dispatch_claims (claimed_at);
";

/// Version 15: the depth of each queue (its jobs waiting: every state in
/// `svc_jobs` but `active`), kept by the database while some queue is
/// bounded. Counting a deep bounded queue at each enqueue read its whole
/// waiting set while its row was locked, so enqueues into it slowed with
/// its depth (docs/perf-log.md).
///
/// While the triggers exist, every statement that changes `svc_jobs` adds a
/// row per queue whose depth it changed (exact whichever path or node
/// changed the jobs), the leader folds them into one row a queue, and a
/// queue's depth is the sum of its rows. `svc_depths_keep` creates the
/// triggers and counts every queue once, with `svc_jobs` locked against
/// writes so that the count misses no change; a queue is given a bound
/// only in a transaction that ran it. `svc_depths_unkeep` (the leader)
/// drops them once no queue is bounded, so queues without bounds pay
/// nothing; dropping a trigger locks `svc_jobs` against reads too, so it
/// takes that lock at once rather than raise a weaker one. Both hold one
/// advisory lock (`svc_dept` as eight bytes), and lock `svc_queue_depths`
/// against a fold of the leader's running meanwhile, which could put back
/// rows they delete.
const V15_QUEUE_DEPTHS: &str = "
CREATE TABLE svc_queue_depths (
    queue text NOT NULL,
    delta bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX svc_queue_depths_queue ON svc_queue_depths (queue);

CREATE FUNCTION svc_depths_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO svc_queue_depths (queue, delta)
    SELECT queue, count(*) FROM svc_new WHERE state <> 'active' GROUP BY queue;
    RETURN NULL;
END $$;
CREATE FUNCTION svc_depths_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO svc_queue_depths (queue, delta)
    SELECT queue, sum(delta) FROM (
        SELECT queue, 1 AS delta FROM svc_new WHERE state <> 'active'
        UNION ALL SELECT queue, -1 FROM svc_old WHERE state <> 'active'
    ) AS changed GROUP BY queue HAVING sum(delta) <> 0;
    RETURN NULL;
END $$;
CREATE FUNCTION svc_depths_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO svc_queue_depths (queue, delta)
    SELECT queue, -count(*) FROM svc_old WHERE state <> 'active' GROUP BY queue;
    RETURN NULL;
END $$;

CREATE FUNCTION svc_depths_keep() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(8319946622970982516);
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'svc_jobs'::regclass AND tgname = 'svc_jobs_depths_inserted') THEN
        RETURN;
    END IF;
    LOCK TABLE svc_jobs IN SHARE ROW EXCLUSIVE MODE;
    LOCK TABLE svc_queue_depths IN EXCLUSIVE MODE;
    CREATE TRIGGER svc_jobs_depths_inserted AFTER INSERT ON svc_jobs
        REFERENCING NEW TABLE AS svc_new FOR EACH STATEMENT EXECUTE FUNCTION svc_depths_inserted();
    CREATE TRIGGER svc_jobs_depths_updated AFTER UPDATE ON svc_jobs
        REFERENCING OLD TABLE AS svc_old NEW TABLE AS svc_new FOR EACH STATEMENT EXECUTE FUNCTION svc_depths_updated();
    CREATE TRIGGER svc_jobs_depths_deleted AFTER DELETE ON svc_jobs
        REFERENCING OLD TABLE AS svc_old FOR EACH STATEMENT EXECUTE FUNCTION svc_depths_deleted();
    DELETE FROM svc_queue_depths;
    INSERT INTO svc_queue_depths (queue, delta)
    SELECT queue, count(*) FROM svc_jobs WHERE state <> 'active' GROUP BY queue;
END $$;

CREATE FUNCTION svc_depths_unkeep() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(8319946622970982516);
    IF EXISTS (SELECT 1 FROM svc_queues WHERE max_depth IS NOT NULL)
        OR NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'svc_jobs'::regclass AND tgname = 'svc_jobs_depths_inserted') THEN
        RETURN;
    END IF;
    LOCK TABLE svc_jobs IN ACCESS EXCLUSIVE MODE;
    LOCK TABLE svc_queue_depths IN EXCLUSIVE MODE;
    DROP TRIGGER svc_jobs_depths_inserted ON svc_jobs;
    DROP TRIGGER svc_jobs_depths_updated ON svc_jobs;
    DROP TRIGGER svc_jobs_depths_deleted ON svc_jobs;
    DELETE FROM svc_queue_depths;
END $$;

SELECT svc_depths_keep() WHERE EXISTS (SELECT 1 FROM svc_queues WHERE max_depth IS NOT NULL);
";

/// Version 16: a claim written as columns. A claim no longer rewrites the
/// job's `body`: it sets the claim's columns, and readers apply them to the
/// body (docs/postgres.md, "Claims as columns"). That lets one statement
/// select and claim jobs, where the new `body` needed a round trip.
const V16_CLAIM_COLUMNS: &str = "
-- Set by a claim, in Unix milliseconds: when it claimed the job and until
-- when its worker holds it unseen. While `claimed_ms` is set, `body` is the
-- job as it was before that claim; every later write of `body` clears both.
ALTER TABLE svc_jobs ADD COLUMN claimed_ms int8, ADD COLUMN visible_until_ms int8;
-- The job's own visibility timeout and execution timeout, for the lease a
-- claim computes in SQL; NULL on rows written before this version, which
-- are claimed the checked way.
ALTER TABLE svc_jobs ADD COLUMN visibility_ms int8, ADD COLUMN timeout_ms int8;
";

/// Version 17: one event row may hold a run of `job.enqueued` events of
/// one transaction (docs/postgres.md, "Events"): jobs of one queue and
/// type, enqueued at one time, whose event ids follow each other. `id` is
/// the first event's; `members` counts the events the row holds.
const V17_EVENT_RUNS: &str = "
ALTER TABLE svc_events ADD COLUMN members int4 NOT NULL DEFAULT 1;
";

/// Why the schema cannot be brought to this binary's version.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaError {
    /// The database was migrated by a newer svc: this binary does not know
    /// its tables and must not write to them.
    Newer { found: i32, supported: i32 },
    /// A statement of a migration failed; nothing of it was applied.
    Failed { version: i32, reason: String },
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaError::Newer { found, supported } => write!(
                f,
                "the database's svc schema is version {found}, newer than this binary's {supported}: \
                 run the svc release that migrated it, or a later one"
            ),
            SchemaError::Failed { version, reason } => {
                write!(f, "migrating the database to svc schema version {version} failed: {reason}")
            }
        }
    }
}

impl std::error::Error for SchemaError {}

/// The schema version the database holds (0 before any migration).
pub async fn schema_version(client: &impl GenericClient) -> Result<i32, super::PgError> {
    let exists: bool = client.query_one("SELECT to_regclass('svc_schema') IS NOT NULL", &[]).await?.get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client.query_one("SELECT coalesce(max(version), 0) FROM svc_schema", &[]).await?.get(0))
}

/// Brings the database to [`SCHEMA_VERSION`] and answers the version it was
/// at. Safe to run from several nodes at once.
pub async fn migrate(client: &mut deadpool_postgres::Client) -> Result<i32, super::PgError> {
    let transaction = client.transaction().await?;
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    transaction.batch_execute(VERSION_TABLE).await?;
    let found = schema_version(&transaction).await?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer { found, supported: SCHEMA_VERSION }.into());
    }
    let applied_by = concat!("svc ", env!("CARGO_PKG_VERSION"));
    for (index, statements) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index as i32 + 1;
        let failed = |error: tokio_postgres::Error| {
            let reason = error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_string());
            super::PgError::Schema(SchemaError::Failed { version, reason })
        };
        transaction.batch_execute(statements).await.map_err(failed)?;
        transaction
            .execute("INSERT INTO svc_schema (version, applied_by) VALUES ($1, $2)", &[&version, &applied_by])
            .await
            .map_err(failed)?;
    }
    transaction.commit().await?;
    if found < SCHEMA_VERSION {
        tracing::info!(from = found, to = SCHEMA_VERSION, "migrated the svc schema");
    }
    Ok(found)
}
