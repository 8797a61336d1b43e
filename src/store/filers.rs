//! What filers (`[filers]`) used of their day: the agent-filed issues taken to a pre-flight,
//! the dollars their issues spent, and what each filer was told of its day (once).

use super::Store;
use crate::domain::IssueRef;
use crate::domain::filer::FilerDay;

impl Store {
    /// What `filer` used of `day` (`YYYY-MM-DD`, UTC), and whether `issue` was taken before.
    pub async fn filer_day(
        &self,
        filer: &str,
        issue: &IssueRef,
        day: &str,
    ) -> anyhow::Result<FilerDay> {
        let repo = issue.repo.to_string();
        let number = i64::try_from(issue.number)?;
        let (before, today, spent): (i64, i64, f64) = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT \
                 (SELECT COUNT(*) FROM filer_takes WHERE repo = $1 AND number = $2), \
                 (SELECT COUNT(*) FROM filer_takes WHERE filer = $3 AND day = $4), \
                 (SELECT COALESCE(SUM(u.cost_usd), CAST(0 AS DOUBLE PRECISION)) FROM model_usage u \
                  LEFT JOIN runs r ON r.id = u.run_id \
                  JOIN issues i ON i.repo = u.repo AND i.number = COALESCE(u.number, r.number) \
                  WHERE u.day = $4 AND i.filer = $3)",
            )
            .bind(&repo)
            .bind(number)
            .bind(filer)
            .bind(day)
            .fetch_one(p)
            .await?
        });
        Ok(FilerDay {
            taken_before: before > 0,
            taken_today: u32::try_from(today).unwrap_or(u32::MAX),
            spent_usd: spent,
        })
    }

    /// Dollars the issues of `filer` spent on `day`.
    pub async fn filer_spent(&self, filer: &str, day: &str) -> anyhow::Result<f64> {
        let spent: (f64,) = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT COALESCE(SUM(u.cost_usd), CAST(0 AS DOUBLE PRECISION)) FROM model_usage u \
                 LEFT JOIN runs r ON r.id = u.run_id \
                 JOIN issues i ON i.repo = u.repo AND i.number = COALESCE(u.number, r.number) \
                 WHERE u.day = $1 AND i.filer = $2",
            )
            .bind(day)
            .bind(filer)
            .fetch_one(p)
            .await?
        });
        Ok(spent.0)
    }

    /// Counts `issue` as taken to a pre-flight by `filer` on `day` (once: a later read of it
    /// counts no more).
    pub async fn filer_take(
        &self,
        filer: &str,
        issue: &IssueRef,
        day: &str,
        at_ms: i64,
    ) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO filer_takes (repo, number, filer, day, at_ms) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(issue.repo.to_string())
            .bind(i64::try_from(issue.number)?)
            .bind(filer)
            .bind(day)
            .bind(at_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Notes that `filer` was told `what` of `day`; true only the first time (the log says
    /// it once a day, however many issues wait).
    pub async fn filer_told(
        &self,
        filer: &str,
        day: &str,
        what: &str,
        at_ms: i64,
    ) -> anyhow::Result<bool> {
        let mut tx = self.relaxed().await?;
        let new = on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO filer_told (filer, day, what, at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(filer)
            .bind(day)
            .bind(what)
            .bind(at_ms)
            .execute(&mut **t)
            .await?
            .rows_affected()
        });
        tx.commit().await?;
        Ok(new > 0)
    }

    /// What filers were told of `day`, by filer: the status's line for each.
    pub async fn filers_told(&self, day: &str) -> anyhow::Result<Vec<(String, String)>> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT filer, what FROM filer_told WHERE day = $1 ORDER BY filer, at_ms",
            )
            .bind(day)
            .fetch_all(p)
            .await?
        }))
    }
}
