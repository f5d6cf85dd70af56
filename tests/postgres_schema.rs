//! The PostgreSQL backend's schema on a real PostgreSQL server of the
//! test's own: migrations applied once, by nodes starting together too; a
//! schema newer than the binary refused; the tables, their partial indexes
//! and autovacuum settings as docs/postgres.md describes them; and every
//! connection committing synchronously.

mod common;

use common::postgres::TempPostgres;
use svc::backend::postgres::{PgError, PgSettings, SCHEMA_VERSION, SchemaError, connect, migrate, open};

async fn versions(pool: &deadpool_postgres::Pool) -> Vec<i32> {
    let client = pool.get().await.unwrap();
    let rows = client.query("SELECT version FROM svc_schema ORDER BY version", &[]).await.unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_even_when_nodes_start_together() {
    let server = TempPostgres::start();

    // One node on a fresh database: from nothing to the current version.
    let settings = PgSettings::new(server.database("single"));
    let pool = connect(&settings).unwrap();
    let mut client = pool.get().await.unwrap();
    assert_eq!(migrate(&mut client).await.unwrap(), 0, "a fresh database starts at version 0");
    assert_eq!(versions(&pool).await, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let applied_by: String =
        client.query_one("SELECT applied_by FROM svc_schema WHERE version = 1", &[]).await.unwrap().get(0);
    assert!(applied_by.starts_with("svc "), "{applied_by}");
    // Started again: nothing to do, nothing changes.
    assert_eq!(migrate(&mut client).await.unwrap(), SCHEMA_VERSION);
    assert_eq!(versions(&pool).await, (1..=SCHEMA_VERSION).collect::<Vec<_>>());

    // Four nodes starting at once on another fresh database: one migrates,
    // the others wait for its lock and find the work done.
    let url = server.database("together");
    let nodes: Vec<_> = (0..4)
        .map(|_| {
            let settings = PgSettings::new(url.clone());
            tokio::spawn(async move {
                let pool = open(&settings).await.expect("every node starts");
                let version: i32 = pool
                    .get()
                    .await
                    .unwrap()
                    .query_one("SELECT max(version) FROM svc_schema", &[])
                    .await
                    .unwrap()
                    .get(0);
                version
            })
        })
        .collect();
    for node in nodes {
        assert_eq!(node.await.unwrap(), SCHEMA_VERSION);
    }
    let pool = connect(&PgSettings::new(url)).unwrap();
    assert_eq!(versions(&pool).await, (1..=SCHEMA_VERSION).collect::<Vec<_>>(), "each migration once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_the_tables_are_as_documented() {
    let server = TempPostgres::start();
    let settings = PgSettings::new(server.database("svc"));
    let pool = open(&settings).await.unwrap();
    let client = pool.get().await.unwrap();

    // Every connection commits synchronously, whatever the server's default,
    // and carries the statement timeout.
    client.batch_execute("ALTER DATABASE svc SET synchronous_commit = off").await.unwrap();
    let fresh = connect(&settings).unwrap();
    let fresh = fresh.get().await.unwrap();
    let synchronous: String = fresh.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
    assert_eq!(synchronous, "on");
    let timeout: String = fresh.query_one("SHOW statement_timeout", &[]).await.unwrap().get(0);
    assert_eq!(timeout, "30s");

    // One index reads a queue's jobs, in claim order for each state, so no
    // claim plan sorts the queue; the timers' lookups are partial.
    let indexes = client
        .query("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'svc_jobs' ORDER BY indexname", &[])
        .await
        .unwrap();
    let indexes: Vec<(String, String)> = indexes.iter().map(|row| (row.get(0), row.get(1))).collect();
    let definition = |name: &str| indexes.iter().find(|(n, _)| n == name).map(|(_, d)| d.clone()).unwrap();
    assert!(definition("svc_jobs_claim_order").contains("(queue, state, priority DESC, ready_at, id)"));
    let by_queue: Vec<&str> =
        indexes.iter().filter(|(_, d)| d.contains("USING btree (queue")).map(|(n, _)| n.as_str()).collect();
    assert_eq!(by_queue, ["svc_jobs_claim_order"]);
    assert!(definition("svc_jobs_leases").contains("WHERE (state = 'active'::text)"));
    assert!(definition("svc_jobs_due").contains("scheduled"));
    // Vacuumed early, as a queue table needs.
    let options: Vec<String> =
        client.query_one("SELECT reloptions FROM pg_class WHERE relname = 'svc_jobs'", &[]).await.unwrap().get(0);
    assert!(options.contains(&"autovacuum_vacuum_scale_factor=0.02".to_string()), "{options:?}");
    // Finished jobs are partitioned by day.
    let partitioned: String = client
        .query_one("SELECT pg_get_partkeydef(oid) FROM pg_class WHERE relname = 'svc_job_history'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(partitioned, "RANGE (finished_at)");
    // A state outside the hot table's is refused by the database itself.
    let refused = client
        .execute(
            "INSERT INTO svc_jobs (id, queue, type, state, priority, ready_at, attempt, created_at, body) \
             VALUES (gen_random_uuid(), 'default', 't', 'completed', 0, now(), 0, now(), '')",
            &[],
        )
        .await;
    assert!(refused.is_err(), "a finished job does not go in the hot table");

    // A database migrated by a newer svc: refused, with both versions named,
    // and nothing written.
    let newer = SCHEMA_VERSION + 1;
    client.execute("INSERT INTO svc_schema (version, applied_by) VALUES ($1, 'svc 9.9.9')", &[&newer]).await.unwrap();
    let error = open(&settings).await.unwrap_err();
    match &error {
        PgError::Schema(SchemaError::Newer { found, supported }) => {
            assert_eq!((*found, *supported), (newer, SCHEMA_VERSION));
        }
        other => panic!("expected a newer schema error, got {other}"),
    }
    let message = error.to_string();
    assert!(message.contains(&format!("version {newer}")) && message.contains("newer than this binary"), "{message}");
    assert_eq!(versions(&pool).await.len() as i32, newer);
}
