//! What a starting run writes before its container exists, beside its record (which only
//! the consumer writes): its sealed token (replaced when renewed, dropped at its end), the
//! repository settings and branch it got, the base commit it started from, its fork, its
//! agent. Only a launching run's columns change, so a late write never touches a run that
//! moved on.

use super::Store;
use crate::domain::RunId;

impl Store {
    /// Keeps a run's sealed forge token, minted at `minted_at_ms` (replacing one an earlier
    /// attempt kept). Durable: the run starts only after it is kept.
    pub async fn put_run_token(
        &self,
        run_id: &RunId,
        sealed: &str,
        minted_at_ms: i64,
    ) -> anyhow::Result<()> {
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO run_tokens (run_id, sealed, minted_at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id) DO UPDATE \
                 SET sealed = excluded.sealed, minted_at_ms = excluded.minted_at_ms",
            )
            .bind(run_id.as_str())
            .bind(sealed)
            .bind(minted_at_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Records what a starting run got from its repository's settings file, and the branch
    /// that file's template names: written before the run's container is made, so the
    /// gateways and the watcher of every replica see them. Only a launching run changes.
    pub async fn put_run_settings(
        &self,
        run_id: &RunId,
        branch: &str,
        settings: &crate::domain::RunSettings,
    ) -> anyhow::Result<()> {
        let json = serde_json::to_string(settings)?;
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "UPDATE runs SET branch = $2, settings = $3 WHERE id = $1 AND state = 'launching'",
            )
            .bind(run_id.as_str())
            .bind(branch)
            .bind(json)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Records the base branch's head a starting run was given (before its container is
    /// made, so the git gateway of every replica sees it). Only a launching run changes.
    pub async fn put_run_base(
        &self,
        run_id: &RunId,
        commit: &crate::domain::CommitSha,
    ) -> anyhow::Result<()> {
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "UPDATE runs SET base_commit = $2 WHERE id = $1 AND state = 'launching'",
            )
            .bind(run_id.as_str())
            .bind(commit.as_str())
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Records the fork a starting run's branch lives in, before its container is made. Only
    /// a launching run changes.
    pub async fn put_run_home(
        &self,
        run_id: &RunId,
        home: &crate::domain::RepoName,
    ) -> anyhow::Result<()> {
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query("UPDATE runs SET branch_home = $2 WHERE id = $1 AND state = 'launching'")
                .bind(run_id.as_str())
                .bind(home.to_string())
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }

    /// Records the agent a starting run was given, before its container is made. Only a
    /// launching run changes.
    pub async fn put_run_agent(
        &self,
        run_id: &RunId,
        agent: &crate::domain::AgentChoice,
    ) -> anyhow::Result<()> {
        let json = serde_json::to_string(agent)?;
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query("UPDATE runs SET agent = $2 WHERE id = $1 AND state = 'launching'")
                .bind(run_id.as_str())
                .bind(json)
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }

    /// Replaces a run's token with a fresher one, unless someone (another replica) already
    /// replaced the one minted at `was_minted_at_ms`: whether this one is now kept.
    pub async fn renew_run_token(
        &self,
        run_id: &RunId,
        sealed: &str,
        minted_at_ms: i64,
        was_minted_at_ms: i64,
    ) -> anyhow::Result<bool> {
        let mut tx = self.begin(true).await?;
        let changed = on_tx!(&mut tx, t => {
            sqlx::query(
                "UPDATE run_tokens SET sealed = $2, minted_at_ms = $3 \
                 WHERE run_id = $1 AND minted_at_ms = $4",
            )
            .bind(run_id.as_str())
            .bind(sealed)
            .bind(minted_at_ms)
            .bind(was_minted_at_ms)
            .execute(&mut **t)
            .await?
            .rows_affected()
        });
        tx.commit().await?;
        Ok(changed == 1)
    }

    /// A run's sealed forge token and when it was minted, if one is kept.
    pub async fn run_token(&self, run_id: &RunId) -> anyhow::Result<Option<(String, i64)>> {
        let row: Option<(String, i64)> = on_pool!(&self.db, p => {
            sqlx::query_as("SELECT sealed, minted_at_ms FROM run_tokens WHERE run_id = $1")
                .bind(run_id.as_str())
                .fetch_optional(p)
                .await?
        });
        Ok(row)
    }

    /// Forgets a run's token (its run ended, and the forge's copy is revoked).
    pub async fn drop_run_token(&self, run_id: &RunId) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query("DELETE FROM run_tokens WHERE run_id = $1")
                .bind(run_id.as_str())
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }

    /// Records what became of a starting run's setup phase, before its agent's container is
    /// made: from then on the setup's own credentials are refused by both gateways. Only a
    /// launching run changes.
    pub async fn put_run_setup(
        &self,
        run_id: &RunId,
        outcome: &crate::domain::setup::SetupOutcome,
    ) -> anyhow::Result<()> {
        let json = serde_json::to_string(outcome)?;
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query("UPDATE runs SET setup = $2 WHERE id = $1 AND state = 'launching'")
                .bind(run_id.as_str())
                .bind(json)
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }
}
