//! The PostgreSQL backend (docs/postgres.md): any number of stateless svc
//! nodes sharing one database, each request one SQL transaction.
//!
//! This module holds what every part of it stands on: the settings
//! ([`PgSettings`]), the connection pool ([`connect`]), and the schema with
//! its migrations (`schema.rs`), which the first node to start applies
//! under an advisory lock.

mod acks;
mod backend;
mod batch;
mod claims;
mod cron;
#[cfg(feature = "webhooks")]
mod deliveries;
mod dispatch;
mod enqueues;
mod events;
mod history;
mod jobs;
mod leader;
mod listing;
mod queues;
mod schema;
mod schemas;
mod sql;
mod stream;
mod unique;
mod wakeup;
mod webhooks;
mod workers;
mod workflows;

use std::time::Duration;

pub use backend::PgBackend;
pub use jobs::PgJobs;
pub use leader::{LEASE_TTL_MS_DEFAULT, LeaderLease};
pub use listing::SCAN_BUDGET;
pub use schema::{SCHEMA_VERSION, SchemaError, migrate, schema_version};
pub use wakeup::{POLL_INTERVAL, RECHECK_INTERVAL};
pub use webhooks::Matching;

/// Where the database is and how svc uses it (`--postgres`,
/// `SVC_POSTGRES_URL`, `[postgres]` in the settings file).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgSettings {
    /// A libpq connection string or URL: `postgres://user:pass@host:5432/db`.
    pub url: String,
    /// Connections this node keeps open at most.
    pub pool_size: usize,
    /// The longest one statement may run before the database cancels it.
    pub statement_timeout: Duration,
    /// How long finished jobs stay in the history, by state (the same
    /// `retention` settings as on the local engine).
    pub retention: crate::engine::Retention,
    /// The most schemas the registry holds (`limits.max_schemas`).
    pub max_schemas: usize,
    /// The most cron entries registered (`limits.max_cron`).
    pub max_cron: usize,
    /// The bounds of webhook subscriptions and their deliveries (the same
    /// `webhooks` settings as on the local engine).
    pub webhook_limits: crate::engine::outbox::WebhookLimits,
    /// How long one delivery attempt may take (`webhooks.timeout_s`).
    pub delivery_timeout: Duration,
    /// The priority of the thread deliveries are sent from
    /// (`webhooks.priority`), as on the local engine.
    pub delivery_priority: crate::webhook::DeliveryPriority,
}

/// Connections a node keeps by default: enough for the merged statements of
/// a busy node, few enough that ten nodes stay under PostgreSQL's default
/// `max_connections` of 100.
pub const POOL_SIZE_DEFAULT: usize = 8;
/// The default `statement_timeout`: far above any statement svc sends, so it
/// only ends a statement stuck behind a lock or a sick database.
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

impl PgSettings {
    pub fn new(url: impl Into<String>) -> Self {
        PgSettings {
            url: url.into(),
            pool_size: POOL_SIZE_DEFAULT,
            statement_timeout: STATEMENT_TIMEOUT_DEFAULT,
            retention: crate::engine::Retention::default(),
            max_schemas: crate::limits::SCHEMAS_MAX,
            max_cron: crate::limits::CRON_ENTRIES_MAX_DEFAULT,
            webhook_limits: Default::default(),
            delivery_timeout: Duration::from_millis(crate::engine::outbox::ATTEMPT_TIMEOUT_MS_DEFAULT as u64),
            delivery_priority: crate::webhook::DeliveryPriority::default(),
        }
    }

    /// The connection settings, with the session settings svc relies on:
    /// `synchronous_commit = on` (a commit is on disk before svc answers,
    /// whatever the database's default) and the statement timeout.
    fn connection_config(&self) -> Result<tokio_postgres::Config, PgError> {
        let mut config: tokio_postgres::Config =
            self.url.parse().map_err(|error| PgError::Settings(format!("postgres url: {error}")))?;
        let timeout_ms = self.statement_timeout.as_millis().max(1);
        config.options(format!("-c synchronous_commit=on -c statement_timeout={timeout_ms}"));
        config.application_name("svc");
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        Ok(config)
    }
}

/// What can go wrong talking to the database.
#[derive(Debug)]
#[non_exhaustive]
pub enum PgError {
    /// The settings cannot be used (a malformed URL, a pool size of zero).
    Settings(String),
    /// The database refused, failed or could not be reached.
    Database(tokio_postgres::Error),
    /// No connection could be had from the pool.
    Pool(String),
    /// The database's schema cannot be used by this binary.
    Schema(SchemaError),
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgError::Settings(message) | PgError::Pool(message) => f.write_str(message),
            PgError::Database(error) => match error.as_db_error() {
                Some(db) => write!(f, "postgres: {} ({})", db.message(), db.code().code()),
                None => write!(f, "postgres: {error}"),
            },
            PgError::Schema(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for PgError {}

impl From<tokio_postgres::Error> for PgError {
    fn from(error: tokio_postgres::Error) -> Self {
        PgError::Database(error)
    }
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(error) => PgError::Database(error),
            other => PgError::Pool(format!("postgres pool: {other}")),
        }
    }
}

impl From<SchemaError> for PgError {
    fn from(error: SchemaError) -> Self {
        PgError::Schema(error)
    }
}

/// A pool of connections to the database, each with svc's session settings.
/// Connections are opened as requests need them, up to `pool_size`; a broken
/// one is dropped and replaced.
pub fn connect(settings: &PgSettings) -> Result<deadpool_postgres::Pool, PgError> {
    if settings.pool_size == 0 {
        return Err(PgError::Settings("postgres pool_size must be at least 1".into()));
    }
    let config = settings.connection_config()?;
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(settings.pool_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(settings.statement_timeout))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|error| PgError::Settings(format!("postgres pool: {error}")))
}

/// Connects and brings the schema up to this binary's version
/// ([`migrate`]): what a node does first when it starts.
pub async fn open(settings: &PgSettings) -> Result<deadpool_postgres::Pool, PgError> {
    let pool = connect(settings)?;
    let mut client = pool.get().await?;
    migrate(&mut client).await?;
    drop(client);
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_carry_the_session_settings_svc_needs() {
        let mut settings = PgSettings::new("postgres://svc@db.example:5433/jobs");
        settings.statement_timeout = Duration::from_millis(2500);
        let config = settings.connection_config().unwrap();
        let options = config.get_options().unwrap();
        assert!(options.contains("synchronous_commit=on"), "{options}");
        assert!(options.contains("statement_timeout=2500"), "{options}");
        assert_eq!(config.get_dbname(), Some("jobs"));
        assert_eq!(config.get_ports(), &[5433]);
    }

    #[test]
    fn unusable_settings_are_refused_with_a_reason() {
        let error = connect(&PgSettings::new("postgres://host:notaport/db")).unwrap_err();
        assert!(error.to_string().contains("postgres url"), "{error}");
        let mut settings = PgSettings::new("postgres://localhost/db");
        settings.pool_size = 0;
        assert!(connect(&settings).unwrap_err().to_string().contains("pool_size"));
    }
}
