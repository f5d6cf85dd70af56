//! The schema registry on PostgreSQL (docs/postgres.md, "Schemas"):
//! registered JSON Schemas in `svc_schemas`, and the check of a job's
//! `args` against the schema it names.
//!
//! A document is compiled once per node: each node keeps the entries it
//! compiled, and reuses one only while the row it came from is the one
//! registered (same URI, same registration time, same document), so a
//! schema deleted and registered again on another node is compiled again
//! here. Jobs are checked before their enqueue's transaction, as the local
//! engine checks them before its turn: a schema removed meanwhile may let
//! one more job in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::GenericClient;

use super::jobs::{PgJobs, database};
use super::sql::{Prepared, from_body, to_body};
use crate::backend::Page;
use crate::clock::Millis;
use crate::engine::EngineError;
use crate::job::NewJob;
use crate::schema::{SchemaEntry, SchemaRegistration, check_job_args};

/// The advisory lock registrations hold (`svc_schm` as eight bytes), so
/// that registrations past the cap cannot race each other.
const REGISTRATION_LOCK: i64 = i64::from_be_bytes(*b"svc_schm");

/// The entries a node compiled, by URI. Bounded by the registry's own cap:
/// past twice that, it starts again empty.
#[derive(Default)]
pub(super) struct CompiledSchemas {
    entries: Mutex<HashMap<String, Arc<SchemaEntry>>>,
}

impl CompiledSchemas {
    /// The entry decoded from `body`, or the one compiled before from the
    /// same registration.
    fn entry(&self, uri: &str, body: &[u8], cap: usize) -> Result<Arc<SchemaEntry>, EngineError> {
        let stored = Arc::new(decode(uri, body)?);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = entries.get(uri)
            && **known == *stored
        {
            return Ok(known.clone());
        }
        if entries.len() >= cap.saturating_mul(2) {
            entries.clear();
        }
        entries.insert(uri.to_string(), stored.clone());
        Ok(stored)
    }

    fn forget(&self, uri: &str) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).remove(uri);
    }
}

fn encode(entry: &SchemaEntry) -> Vec<u8> {
    to_body(entry)
}

fn decode(uri: &str, body: &[u8]) -> Result<SchemaEntry, EngineError> {
    from_body("schema", uri, body)
}

impl PgJobs {
    /// Registers a schema compiled by the caller; a URI already registered
    /// is refused, as is one past the cap. `now` is its registration time.
    pub async fn register_schema(
        &self,
        now: Millis,
        registration: SchemaRegistration,
    ) -> Result<Arc<SchemaEntry>, EngineError> {
        let mut entry = registration.entry;
        entry.created_at = now;
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        transaction.run("SELECT pg_advisory_xact_lock($1)", &[&REGISTRATION_LOCK]).await.map_err(database)?;
        let count: i64 = transaction.row("SELECT count(*) FROM svc_schemas", &[]).await.map_err(database)?.get(0);
        let max_schemas = self.max_schemas;
        let exists = transaction
            .maybe_row("SELECT 1 FROM svc_schemas WHERE uri = $1", &[&entry.uri])
            .await
            .map_err(database)?
            .is_some();
        if exists {
            return Err(EngineError::SchemaExists { uri: entry.uri });
        }
        if count as usize >= max_schemas {
            return Err(EngineError::SchemaLimit { max_schemas });
        }
        transaction
            .run(
                "INSERT INTO svc_schemas (uri, created_at, body) VALUES ($1, to_timestamp($2::int8::float8 / 1000), $3)",
                &[&entry.uri, &now, &encode(&entry)],
            )
            .await
            .map_err(database)?;
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(entry))
    }

    /// Removes a schema; jobs that named it keep their `schema` field.
    pub async fn delete_schema(&self, uri: &str) -> Result<Arc<SchemaEntry>, EngineError> {
        let client = self.client().await?;
        let row = client
            .maybe_row("DELETE FROM svc_schemas WHERE uri = $1 RETURNING body", &[&uri])
            .await
            .map_err(database)?;
        self.compiled_schemas().forget(uri);
        match row {
            Some(row) => Ok(Arc::new(decode(uri, row.get(0))?)),
            None => Err(EngineError::SchemaNotFound { uri: uri.to_string() }),
        }
    }

    pub async fn schema(&self, uri: &str) -> Result<Option<Arc<SchemaEntry>>, EngineError> {
        let client = self.client().await?;
        let row = client.maybe_row("SELECT body FROM svc_schemas WHERE uri = $1", &[&uri]).await.map_err(database)?;
        row.map(|row| decode(uri, row.get(0)).map(Arc::new)).transpose()
    }

    /// Schemas in URI order after `after`.
    pub async fn schemas_page(&self, after: Option<&str>, limit: usize) -> Result<Page<Arc<SchemaEntry>>, EngineError> {
        let client = self.client().await?;
        let rows = client
            .rows(
                "SELECT uri, body FROM svc_schemas WHERE ($1::text IS NULL OR uri > $1) ORDER BY uri LIMIT $2",
                &[&after, &(limit as i64 + 1)],
            )
            .await
            .map_err(database)?;
        let has_more = rows.len() > limit;
        let entries = rows.iter().take(limit).map(|row| decode(row.get(0), row.get(1)).map(Arc::new));
        Ok((entries.collect::<Result<_, _>>()?, has_more))
    }

    /// The registered entries among `uris`, compiled (once per node).
    async fn registered(
        &self,
        client: &impl GenericClient,
        uris: &[&str],
    ) -> Result<HashMap<String, Arc<SchemaEntry>>, EngineError> {
        let rows =
            client.rows("SELECT uri, body FROM svc_schemas WHERE uri = ANY($1)", &[&uris]).await.map_err(database)?;
        let compiled = self.compiled_schemas();
        let mut found = HashMap::with_capacity(rows.len());
        for row in rows {
            let uri: String = row.get(0);
            let entry = compiled.entry(&uri, row.get(1), self.max_schemas)?;
            found.insert(uri, entry);
        }
        for uri in uris {
            if !found.contains_key(*uri) {
                compiled.forget(uri);
            }
        }
        Ok(found)
    }

    /// Checks the `args` of every job that names a schema against it
    /// (docs/api.md, "Schemas"); the first job that fails decides the
    /// error, `index_of` its place in a batch.
    pub(super) async fn check_schemas(
        &self,
        jobs: &[NewJob],
        index_of: impl Fn(usize) -> Option<usize>,
    ) -> Result<(), EngineError> {
        let named = jobs.iter().enumerate().filter_map(|(position, job)| {
            job.schema.as_deref().map(|uri| (index_of(position), uri, job.payload.args()))
        });
        self.check_args(named.collect()).await
    }

    /// Checks each `(index, schema uri, args)` in order; the first that
    /// fails decides the error.
    pub(super) async fn check_args(&self, named: Vec<(Option<usize>, &str, &str)>) -> Result<(), EngineError> {
        if named.is_empty() {
            return Ok(());
        }
        let mut uris: Vec<&str> = named.iter().map(|(_, uri, _)| *uri).collect();
        uris.sort_unstable();
        uris.dedup();
        let registered = self.registered(&self.client().await?, &uris).await?;
        for (index, uri, args) in named {
            check_job_args(registered.get(uri).map(Arc::as_ref), uri, args)
                .map_err(|error| EngineError::Invalid { error, index })?;
        }
        Ok(())
    }

    /// Whether a schema is registered under `uri`, in the caller's
    /// transaction (a cron firing checks that its schema still is).
    pub(super) async fn schema_registered(&self, client: &impl GenericClient, uri: &str) -> Result<bool, EngineError> {
        let row = client.maybe_row("SELECT 1 FROM svc_schemas WHERE uri = $1", &[&uri]).await.map_err(database)?;
        Ok(row.is_some())
    }
}
