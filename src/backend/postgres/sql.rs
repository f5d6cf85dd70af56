//! Statements prepared once per connection: every query of the backend goes
//! through [`Prepared`], which prepares its text on a connection the first
//! time and reuses the statement after, so a statement costs one round trip
//! to the database instead of two (parse, then execute). Also the `body`
//! column of svc's tables: a value in svc's stored form (postcard).

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row, RowStream};

use crate::engine::{EngineError, Unavailable};

/// A statement's parameters.
pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Queries through statements cached on the connection.
pub(super) trait Prepared: GenericClient {
    /// Runs a statement; answers the rows it changed.
    async fn run(&self, sql: &str, params: Params<'_>) -> Result<u64, Error> {
        let statement = self.prepare_cached(sql).await?;
        self.execute(&statement, params).await
    }

    async fn rows(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query(&statement, params).await
    }

    async fn row(&self, sql: &str, params: Params<'_>) -> Result<Row, Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_one(&statement, params).await
    }

    async fn maybe_row(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>, Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_opt(&statement, params).await
    }

    /// The rows as they come, for a result too large to hold at once; one
    /// dropped early leaves the rest to be read past by the connection.
    async fn row_stream(&self, sql: &str, params: Params<'_>) -> Result<RowStream, Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_raw(&statement, params.iter().copied()).await
    }
}

impl<C: GenericClient> Prepared for C {}

/// A value as a row's `body`.
pub(super) fn to_body<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("svc's stored forms always encode")
}

/// A row's `body` read back. One that does not decode is logged (`what`
/// and `key` name the row) and answered as a failing database.
pub(super) fn from_body<T: serde::de::DeserializeOwned>(what: &str, key: &str, body: &[u8]) -> Result<T, EngineError> {
    postcard::from_bytes(body).map_err(|error| {
        tracing::error!(what, key, %error, "a stored row does not decode");
        EngineError::Unavailable { reason: Unavailable::Database }
    })
}
