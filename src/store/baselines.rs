//! The checks' results on a base commit (`check_baselines`), kept so the same commands in the
//! same environment run once per base commit, whichever run asks first.

use super::Store;
use crate::domain::RepoName;
use crate::domain::checks::SideResult;

impl Store {
    /// The kept results of `env`'s checks on `base_commit` of `repo`, if any.
    pub async fn check_baseline(
        &self,
        repo: &RepoName,
        base_commit: &str,
        env: &str,
    ) -> anyhow::Result<Option<SideResult>> {
        let row: Option<(String,)> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT result FROM check_baselines WHERE repo = $1 AND base_commit = $2 AND env = $3",
            )
            .bind(repo.to_string())
            .bind(base_commit)
            .bind(env)
            .fetch_optional(p)
            .await?
        });
        // A row this version cannot read is as good as none: the base is checked again.
        Ok(row.and_then(|r| serde_json::from_str(&r.0).ok()))
    }

    /// Keeps the results (the first kept wins: two runs checking the same base at once
    /// agree, or the first one's stand).
    pub async fn put_check_baseline(
        &self,
        repo: &RepoName,
        base_commit: &str,
        env: &str,
        result: &SideResult,
        at_ms: i64,
    ) -> anyhow::Result<()> {
        let json = serde_json::to_string(result)?;
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO check_baselines (repo, base_commit, env, result, created_at_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (repo, base_commit, env) DO NOTHING",
            )
            .bind(repo.to_string())
            .bind(base_commit)
            .bind(env)
            .bind(json)
            .bind(at_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }
}
