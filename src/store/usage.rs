//! What model calls cost (the model gateway's metering and the pre-flight's own), summed
//! for budgets, reports and the status page; and the runs stopped for their budget.

use super::Store;
use crate::domain::{RepoName, RunId};
use crate::models::{Metered, Spent};

/// What a run's model calls used, from the metering.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RunUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// `None` when one of its calls had no price.
    pub cost_usd: Option<f64>,
    pub requests: u64,
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn back(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Store {
    /// Records one metered call.
    pub async fn record_model_usage(&self, m: &Metered) -> anyhow::Result<()> {
        let u = &m.usage;
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO model_usage (run_id, repo, day, provider, model, input_tokens, \
                 cache_read_tokens, cache_write_tokens, output_tokens, cost_usd, at_ms, number) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(m.run_id.as_ref().map(RunId::as_str))
            .bind(m.repo.to_string())
            .bind(crate::models::day_of(m.at_ms))
            .bind(m.provider.as_str())
            .bind(&m.model)
            .bind(count(u.input))
            .bind(count(u.cache_read))
            .bind(count(u.cache_write + u.cache_write_1h))
            .bind(count(u.output))
            .bind(m.cost_usd)
            .bind(m.at_ms)
            .bind(m.issue.and_then(|n| i64::try_from(n).ok()))
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Dollars spent by the run, by `repo` on `day`, and by everything on `day`.
    pub async fn model_spent(
        &self,
        run_id: Option<&RunId>,
        repo: &RepoName,
        day: &str,
    ) -> anyhow::Result<Spent> {
        let (run, repo_day, all): (f64, f64, f64) = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT \
                 COALESCE(SUM(CASE WHEN run_id = $1 THEN cost_usd END), CAST(0 AS DOUBLE PRECISION)), \
                 COALESCE(SUM(CASE WHEN repo = $2 AND day = $3 THEN cost_usd END), CAST(0 AS DOUBLE PRECISION)), \
                 COALESCE(SUM(CASE WHEN day = $3 THEN cost_usd END), CAST(0 AS DOUBLE PRECISION)) \
                 FROM model_usage WHERE run_id = $1 OR day = $3",
            )
            .bind(run_id.map_or("", RunId::as_str))
            .bind(repo.to_string())
            .bind(day)
            .fetch_one(p)
            .await?
        });
        Ok(Spent {
            run,
            repo_day,
            day: all,
        })
    }

    /// What the run's model calls used, if it made any through the gateway.
    pub async fn run_usage(&self, run_id: &RunId) -> anyhow::Result<Option<RunUsage>> {
        type Row = (i64, i64, i64, i64, i64, Option<f64>, i64);
        let row: Row = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT COUNT(*), CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(cache_read_tokens), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(cache_write_tokens), 0) AS BIGINT), \
                 SUM(cost_usd), COUNT(cost_usd) FROM model_usage WHERE run_id = $1",
            )
            .bind(run_id.as_str())
            .fetch_one(p)
            .await?
        });
        let (requests, input, output, read, write, cost, priced) = row;
        if requests == 0 {
            return Ok(None);
        }
        Ok(Some(RunUsage {
            input_tokens: back(input),
            output_tokens: back(output),
            cache_read_tokens: back(read),
            cache_write_tokens: back(write),
            cost_usd: cost.filter(|_| priced == requests),
            requests: back(requests),
        }))
    }

    /// The newest finished runs that started a container, for a forecast: repository, kind,
    /// agent, metered cost (when every call was priced) and wall time. Newest first, at most
    /// [`crate::domain::forecast::MAX_SAMPLES`]; impossible rows are the forecast's to judge.
    pub async fn forecast_samples(&self) -> anyhow::Result<Vec<crate::domain::forecast::Sample>> {
        type Row = (
            String,
            i64,
            i64,
            Option<String>,
            Option<String>,
            Option<f64>,
            i64,
            i64,
        );
        let rows: Vec<Row> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT r.repo, r.started_at_ms, r.finished_at_ms, r.followup, r.agent,                  u.cost, COALESCE(u.calls, 0), COALESCE(u.priced, 0)                  FROM runs r LEFT JOIN (SELECT run_id, SUM(cost_usd) AS cost, COUNT(*) AS calls,                  COUNT(cost_usd) AS priced FROM model_usage WHERE run_id IS NOT NULL GROUP BY run_id) u                  ON u.run_id = r.id                  WHERE r.state IN ('succeeded', 'failed', 'timed_out', 'over_budget', 'declined')                  AND r.started_at_ms IS NOT NULL AND r.finished_at_ms IS NOT NULL                  ORDER BY r.finished_at_ms DESC LIMIT $1",
            )
            .bind(crate::domain::forecast::MAX_SAMPLES as i64)
            .fetch_all(p)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(
                |(repo, started, finished, followup, agent, cost, calls, priced)| {
                    let agent = agent
                        .and_then(|a| serde_json::from_str::<crate::domain::AgentChoice>(&a).ok())
                        .map(|a| a.name);
                    crate::domain::forecast::Sample {
                        repo,
                        followup: followup.is_some_and(|f| f != "null"),
                        agent,
                        cost_usd: cost.filter(|_| calls > 0 && priced == calls),
                        secs: (finished - started) / 1000,
                    }
                },
            )
            .collect())
    }

    /// Dollars spent per repository on `day`, most first.
    pub async fn spent_by_repo(&self, day: &str) -> anyhow::Result<Vec<(String, f64)>> {
        let rows: Vec<(String, f64)> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT repo, COALESCE(SUM(cost_usd), CAST(0 AS DOUBLE PRECISION)) AS spent FROM model_usage \
                 WHERE day = $1 GROUP BY repo ORDER BY spent DESC, repo",
            )
            .bind(day)
            .fetch_all(p)
            .await?
        });
        Ok(rows)
    }

    /// Asks for the run to be stopped for its budget (once: the first reason stays).
    pub async fn request_budget_stop(
        &self,
        run_id: &RunId,
        why: &str,
        at_ms: i64,
    ) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO budget_stops (run_id, why, at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id) DO NOTHING",
            )
            .bind(run_id.as_str())
            .bind(why)
            .bind(at_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Why the run is to be stopped for its budget, if it is.
    pub async fn budget_stop(&self, run_id: &RunId) -> anyhow::Result<Option<String>> {
        let row: Option<(String,)> = on_pool!(&self.db, p => {
            sqlx::query_as("SELECT why FROM budget_stops WHERE run_id = $1")
                .bind(run_id.as_str())
                .fetch_optional(p)
                .await?
        });
        Ok(row.map(|r| r.0))
    }
}
