//! The leader lease (docs/postgres.md, "One leader"): the work that must
//! run on one node at a time (promoting due jobs, ending expired claims,
//! firing cron, pruning) is done by whichever node holds the row of its
//! role in `svc_leader`. A node holds it until `expires_at` and renews it
//! well before then; when the holder dies, the row runs out and the next
//! node to ask takes it, so the work stops for at most one time-to-live.

use deadpool_postgres::Pool;

use super::PgError;
use crate::clock::Millis;

/// How long a lease lasts unless renewed.
pub const LEASE_TTL_MS_DEFAULT: Millis = 20_000;

/// One node's hold on one role.
pub struct LeaderLease {
    pool: Pool,
    role: String,
    node: String,
    ttl_ms: Millis,
}

impl LeaderLease {
    /// `node` names this node in `svc_leader` (unique among the nodes: a
    /// host name and process id, say).
    pub fn new(pool: Pool, role: impl Into<String>, node: impl Into<String>, ttl_ms: Millis) -> Self {
        LeaderLease { pool, role: role.into(), node: node.into(), ttl_ms }
    }

    /// Takes the role, or renews it when this node holds it already; answers
    /// whether this node holds it until `now` + the time-to-live. Taken only
    /// when no node holds it or the holder's lease has run out, in one
    /// statement, so two nodes asking at once cannot both win.
    pub async fn hold(&self, now: Millis) -> Result<bool, PgError> {
        let client = self.pool.get().await?;
        let until = now.saturating_add(self.ttl_ms);
        let row = client
            .query_opt(
                "INSERT INTO svc_leader (role, node, expires_at) \
                 VALUES ($1, $2, to_timestamp($3::int8::float8 / 1000)) \
                 ON CONFLICT (role) DO UPDATE SET node = EXCLUDED.node, expires_at = EXCLUDED.expires_at \
                 WHERE svc_leader.node = EXCLUDED.node \
                    OR svc_leader.expires_at <= to_timestamp($4::int8::float8 / 1000) \
                 RETURNING node",
                &[&self.role, &self.node, &until, &now],
            )
            .await?;
        Ok(row.is_some())
    }

    /// Gives the role up at once (a clean stop), if this node holds it.
    pub async fn release(&self) -> Result<(), PgError> {
        let client = self.pool.get().await?;
        client.execute("DELETE FROM svc_leader WHERE role = $1 AND node = $2", &[&self.role, &self.node]).await?;
        Ok(())
    }
}
