//! The facts the outcomes view and `director report` count ([`crate::domain::outcomes`]):
//! six queries, aggregated where a count or a sum is all that is needed, so a window of
//! 100,000 issues is one row per pull request and a few thousand more.

use super::Store;
use crate::domain::outcomes::{
    AgentSpend, Facts, ModelSpend, PickedUp, PrFacts, RunGroup, SpendDay,
};
use crate::domain::{Judgement, PullRecord, RunState};

/// A cost one call can have (`domain::outcomes::MAX_COST_USD`); others are counted apart.
macro_rules! sane {
    ($col:literal) => {
        concat!($col, " BETWEEN 0 AND 10000")
    };
}

/// A count the database gave, as a count (a negative one cannot be: none).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Store {
    /// Everything that counts toward the window `[since_ms, until_ms]`.
    pub async fn outcome_facts(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Facts> {
        Ok(Facts {
            picked_up: self.picked_up(since_ms, until_ms).await?,
            prs: self.pr_facts(since_ms).await?,
            runs: self.run_groups(since_ms, until_ms).await?,
            spend: self.spend_days(since_ms, until_ms).await?,
            agent_spend: self.agent_spend(since_ms, until_ms).await?,
            model_spend: self.model_spend(since_ms, until_ms).await?,
        })
    }

    /// Issues first picked up in the window, by repository and verdict.
    async fn picked_up(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Vec<PickedUp>> {
        type PickedRow = (String, Option<String>, i64, i64);
        let picked: Vec<PickedRow> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT repo, verdict, COUNT(*), \
                 CAST(CASE WHEN filer IS NULL THEN 0 ELSE 1 END AS BIGINT) FROM issues \
                 WHERE picked_at_ms >= $1 AND picked_at_ms <= $2 \
                 GROUP BY repo, verdict, CASE WHEN filer IS NULL THEN 0 ELSE 1 END",
            )
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(p)
            .await?
        });
        Ok(picked
            .into_iter()
            .filter_map(|(repo, verdict, n, filed)| {
                Some(PickedUp {
                    repo: repo.parse().ok()?,
                    verdict: verdict.as_deref().and_then(Judgement::parse),
                    count: count(n),
                    filed: filed != 0,
                })
            })
            .collect())
    }

    /// Each pull request that changed since `since_ms`: its course, and (once merged) what
    /// its runs and pre-flights cost.
    async fn pr_facts(&self, since_ms: i64) -> anyhow::Result<Vec<PrFacts>> {
        type PrRow = (
            String,
            Option<i64>,
            String,
            Option<f64>,
            Option<f64>,
            Option<String>,
            Option<String>,
        );
        let prs: Vec<PrRow> = on_pool!(&self.db, p => {
            sqlx::query_as(concat!(
                "SELECT i.repo, i.picked_at_ms, i.pr, \
                 CASE WHEN i.pr_state = 'merged' THEN \
                 (SELECT SUM(u.cost_usd) FROM runs r JOIN model_usage u ON u.run_id = r.id \
                  WHERE r.repo = i.repo AND r.number = i.number AND ", sane!("u.cost_usd"), ") END, \
                 CASE WHEN i.pr_state = 'merged' THEN \
                 (SELECT SUM(u.cost_usd) FROM model_usage u WHERE u.run_id IS NULL \
                  AND u.repo = i.repo AND u.number = i.number AND ", sane!("u.cost_usd"), ") END, \
                 (SELECT r.agent FROM runs r WHERE r.repo = i.repo AND r.number = i.number \
                  AND r.pr_number IS NOT NULL AND r.followup IS NULL \
                  ORDER BY r.created_at_ms LIMIT 1), i.filer \
                 FROM issues i WHERE i.pr IS NOT NULL AND i.last_change_ms >= $1"
            ))
            .bind(since_ms)
            .fetch_all(p)
            .await?
        });
        Ok(prs
            .into_iter()
            .filter_map(
                |(repo, picked_at_ms, pr, runs_cost, preflight_cost, agent, filer)| {
                    let pr = serde_json::from_str::<PullRecord>(&pr).ok()?;
                    Some(PrFacts {
                        repo: repo.parse().ok()?,
                        picked_at_ms,
                        state: pr.state,
                        opened_at_ms: pr.opened_at_ms,
                        ended_at_ms: pr.ended_at_ms,
                        reverted: pr.reverted.is_some(),
                        followups: pr.followups,
                        ci_followups: pr.ci_followups,
                        opened_green: pr.opened_green,
                        check_followups: pr.check_followups,
                        cost_usd: runs_cost.unwrap_or(0.0) + preflight_cost.unwrap_or(0.0),
                        agent: Some(agent_name(agent)),
                        filed: filer.is_some(),
                    })
                },
            )
            .collect())
    }

    /// Runs started in the window, by repository, agent, state and day.
    async fn run_groups(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Vec<RunGroup>> {
        type RunRow = (String, Option<String>, String, i64, i64);
        let runs: Vec<RunRow> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT repo, agent, state, COALESCE(started_at_ms, created_at_ms) / 86400000, \
                 COUNT(*) FROM runs WHERE COALESCE(started_at_ms, created_at_ms) >= $1 \
                 AND COALESCE(started_at_ms, created_at_ms) <= $2 \
                 GROUP BY repo, agent, state, COALESCE(started_at_ms, created_at_ms) / 86400000",
            )
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(p)
            .await?
        });
        Ok(runs
            .into_iter()
            .filter_map(|(repo, agent, state, day, n)| {
                Some(RunGroup {
                    repo: repo.parse().ok()?,
                    agent: agent_name(agent),
                    state: RunState::parse(&state)?,
                    day,
                    count: count(n),
                })
            })
            .collect())
    }

    /// What was spent in the window (runs' calls and pre-flights'), by repository and day;
    /// costs no call can have are counted apart.
    async fn spend_days(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Vec<SpendDay>> {
        type SpendRow = (String, i64, f64, i64);
        let spend: Vec<SpendRow> = on_pool!(&self.db, p => {
            sqlx::query_as(concat!(
                "SELECT repo, at_ms / 86400000, \
                 SUM(CASE WHEN ", sane!("cost_usd"), " THEN cost_usd ELSE CAST(0 AS DOUBLE PRECISION) END), \
                 SUM(CASE WHEN cost_usd < 0 OR cost_usd > 10000 THEN 1 ELSE 0 END) \
                 FROM model_usage WHERE at_ms >= $1 AND at_ms <= $2 \
                 GROUP BY repo, at_ms / 86400000"
            ))
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(p)
            .await?
        });
        Ok(spend
            .into_iter()
            .filter_map(|(repo, day, cost, absurd)| {
                Some(SpendDay {
                    repo: repo.parse().ok()?,
                    day,
                    cost_usd: cost,
                    absurd_costs: count(absurd),
                })
            })
            .collect())
    }

    /// What runs spent in the window, by repository and the run's agent.
    async fn agent_spend(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Vec<AgentSpend>> {
        type AgentRow = (String, Option<String>, f64);
        let by_agent: Vec<AgentRow> = on_pool!(&self.db, p => {
            sqlx::query_as(concat!(
                "SELECT r.repo, r.agent, SUM(u.cost_usd) FROM model_usage u \
                 JOIN runs r ON r.id = u.run_id \
                 WHERE u.at_ms >= $1 AND u.at_ms <= $2 AND ", sane!("u.cost_usd"), " \
                 GROUP BY r.repo, r.agent"
            ))
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(p)
            .await?
        });
        Ok(by_agent
            .into_iter()
            .filter_map(|(repo, agent, cost)| {
                Some(AgentSpend {
                    repo: repo.parse().ok()?,
                    agent: agent_name(agent),
                    cost_usd: cost,
                })
            })
            .collect())
    }

    /// Model calls in the window and what they cost, by repository and model.
    async fn model_spend(&self, since_ms: i64, until_ms: i64) -> anyhow::Result<Vec<ModelSpend>> {
        type ModelRow = (String, String, i64, f64);
        let by_model: Vec<ModelRow> = on_pool!(&self.db, p => {
            sqlx::query_as(concat!(
                "SELECT repo, model, COUNT(*), \
                 SUM(CASE WHEN ", sane!("cost_usd"), " THEN cost_usd ELSE CAST(0 AS DOUBLE PRECISION) END) \
                 FROM model_usage WHERE at_ms >= $1 AND at_ms <= $2 GROUP BY repo, model"
            ))
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(p)
            .await?
        });
        Ok(by_model
            .into_iter()
            .filter_map(|(repo, model, calls, cost)| {
                Some(ModelSpend {
                    repo: repo.parse().ok()?,
                    model,
                    calls: count(calls),
                    cost_usd: cost,
                })
            })
            .collect())
    }
}

/// The agent a run's `agent` column names, or `default` (`runner.image` and `command`).
fn agent_name(column: Option<String>) -> String {
    column
        .and_then(|a| serde_json::from_str::<crate::domain::AgentChoice>(&a).ok())
        .map_or_else(|| "default".to_owned(), |a| a.name)
}
