//! Statements prepared once per connection: every query of the backend goes
//! through [`Prepared`], which prepares its text on a connection the first
//! time and reuses the statement after, so a statement costs one round trip
//! to the database instead of two (parse, then execute).

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row};

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
}

impl<C: GenericClient> Prepared for C {}
