//! Work one replica at a time may do. A lease names the work and its holder until a time; the
//! holder renews it while it works, and when it dies the lease runs out and another replica
//! takes the work over. A pass that must not be committed by a holder that lost its lease
//! (a consumer pass) carries a [`Fence`], checked in the pass's own transaction.

use super::Store;
use super::statement::Statement;

/// The lease a commit depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub owner: String,
    /// Renewed to this by the commit.
    pub until_ms: i64,
}

/// Renews the fence's lease in `tx`, or fails if another holder has it now: the pass rolls
/// back and its events are decided again by whoever holds it.
pub(super) fn check_fence(fence: &Fence, now_ms: i64) -> Statement {
    Statement::new(
        "UPDATE leases SET until_ms = $1 WHERE name = $2 AND owner = $3 AND until_ms >= $4",
    )
    .bind(fence.until_ms)
    .bind(&fence.name)
    .bind(&fence.owner)
    .bind(now_ms)
    .or_fail(format!(
        "the lease `{}` was lost to another replica",
        fence.name
    ))
}

impl Store {
    /// Takes or renews the lease `name` for `owner` until `until_ms`; true when `owner` holds
    /// it now. Free, expired, or already `owner`'s: taken; anyone else's and live: not.
    pub async fn hold_lease(
        &self,
        name: &str,
        owner: &str,
        until_ms: i64,
        now_ms: i64,
    ) -> anyhow::Result<bool> {
        let mut tx = self.relaxed().await?;
        let holder: Option<String> = on_tx!(&mut tx, t => {
            sqlx::query_scalar(
                "INSERT INTO leases (name, owner, until_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, until_ms = excluded.until_ms \
                 WHERE leases.owner = excluded.owner OR leases.until_ms < $4 \
                 RETURNING owner",
            )
            .bind(name)
            .bind(owner)
            .bind(until_ms)
            .bind(now_ms)
            .fetch_optional(&mut **t)
            .await?
        });
        tx.commit().await?;
        Ok(holder.as_deref() == Some(owner))
    }

    /// Gives the lease up (a replica shutting down hands its work over at once).
    pub async fn release_lease(&self, name: &str, owner: &str) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query("DELETE FROM leases WHERE name = $1 AND owner = $2")
                .bind(name)
                .bind(owner)
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }

    /// Claims `name` for good, once: true for the one caller that got it (a scan period:
    /// whichever replica's schedule fires first runs it). Old claims are pruned by
    /// `prune_claims`.
    pub async fn claim_once(&self, name: &str, owner: &str, now_ms: i64) -> anyhow::Result<bool> {
        let mut tx = self.relaxed().await?;
        let got: Option<String> = on_tx!(&mut tx, t => {
            sqlx::query_scalar(
                "INSERT INTO leases (name, owner, until_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING RETURNING owner",
            )
            .bind(name)
            .bind(owner)
            .bind(now_ms)
            .fetch_optional(&mut **t)
            .await?
        });
        tx.commit().await?;
        Ok(got.is_some())
    }

    /// The names of the claims that start with `prefix` (tests and benchmarks).
    pub async fn claim_names_like(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar(
                "SELECT name FROM leases WHERE substr(name, 1, length($1)) = $1 ORDER BY name",
            )
            .bind(prefix)
            .fetch_all(p)
            .await?
        }))
    }

    /// Who holds `name` now, if anyone.
    pub async fn lease_holder(&self, name: &str, now_ms: i64) -> anyhow::Result<Option<String>> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar("SELECT owner FROM leases WHERE name = $1 AND until_ms >= $2")
                .bind(name)
                .bind(now_ms)
                .fetch_optional(p)
                .await?
        }))
    }
}
