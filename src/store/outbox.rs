//! The outbox: actions written with the decisions that caused them, claimed by executors with
//! leases, finished in the same transaction as the outcome event they report. And retention.

use anyhow::Context;

use super::backend::{Cols, Marks, params, tuples};
use super::events::{NewDelivery, insert};
use super::statement::Statement;
use super::{CHUNK, Db, Store, to_i64};
use crate::domain::IssueRef;
use crate::event::SCHEMA_VERSION;

/// An action about to be written.
#[derive(Clone, Debug)]
pub struct NewAction {
    pub key: String,
    pub issue: IssueRef,
    pub kind: String,
    /// The action, as JSON.
    pub payload: String,
    pub max_attempts: u32,
    pub not_before_ms: i64,
}

/// An action claimed by one executor until `lease_until_ms`.
#[derive(Clone, Debug)]
pub struct ClaimedAction {
    pub id: i64,
    pub key: String,
    pub issue: IssueRef,
    pub kind: String,
    pub payload: String,
    pub schema: i64,
    /// Attempts made before this one.
    pub attempts: u32,
    pub max_attempts: u32,
}

/// One action as `status` and tests see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionRow {
    pub key: String,
    pub issue: IssueRef,
    pub kind: String,
    pub state: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub not_before_ms: i64,
}

/// What became of one performed action.
#[derive(Clone, Debug)]
pub enum Finished {
    /// Done; `event` is its outcome, if it reports one.
    Done { id: i64, event: Option<NewDelivery> },
    /// This attempt failed: try again from `not_before_ms`.
    Retry {
        id: i64,
        error: String,
        not_before_ms: i64,
    },
    /// Every attempt failed: `event` tells the state machine.
    GaveUp {
        id: i64,
        error: String,
        event: NewDelivery,
    },
}

/// Which kinds one claim takes: the pre-flight reads have their own concurrency.
#[derive(Clone, Copy, Debug)]
pub enum Lane<'a> {
    Only(&'a str),
    Except(&'a str),
}

/// Each issue's oldest due action: the only one of the issue that may run (a grouped scan of
/// the partial index `actions_due_by_issue`).
const HEADS: &str = "SELECT MIN(id) AS id FROM actions WHERE state = 'due' GROUP BY repo, number";

/// An issue's next action that may be claimed at `$1`: due, and no claim on it still running.
const CLAIMABLE: &str =
    "(a.not_before_ms <= $1 AND (a.lease_until_ms IS NULL OR a.lease_until_ms < $1))";

/// What [`Store::due_now`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DueNow {
    /// Claimable now, of the kind asked about.
    pub kind: u32,
    /// Claimable now, of any other kind.
    pub others: u32,
    /// When the next one not claimable now will be (ms), if any.
    pub next_at_ms: Option<i64>,
}

pub(super) fn insert_actions(
    actions: &[NewAction],
    now_ms: i64,
    marks: Marks,
) -> anyhow::Result<Vec<Statement>> {
    let mut statements = Vec::new();
    for chunk in actions.chunks(CHUNK / 2) {
        let mut statement = Statement::new(format!(
            "INSERT INTO actions (key, repo, number, kind, action, schema, max_attempts, not_before_ms, created_at_ms) \
             VALUES {} ON CONFLICT (key) DO NOTHING",
            tuples(marks, chunk.len(), 9)
        ));
        for a in chunk {
            statement.push(&a.key);
            statement.push(a.issue.repo.to_string());
            statement.push(to_i64(a.issue.number)?);
            statement.push(&a.kind);
            statement.push(&a.payload);
            statement.push(SCHEMA_VERSION);
            statement.push(i64::from(a.max_attempts));
            statement.push(a.not_before_ms);
            statement.push(now_ms);
        }
        statements.push(statement);
    }
    Ok(statements)
}

pub(super) fn retract(keys: &[String], now_ms: i64, marks: Marks) -> Vec<Statement> {
    keys.chunks(CHUNK)
        .map(|chunk| {
            let mut statement = Statement::new(format!(
                "UPDATE actions SET state = 'retracted', done_at_ms = {} \
                 WHERE key IN ({}) AND state = 'due' AND lease_owner IS NULL",
                params(marks, 1, 1),
                params(marks, 2, chunk.len())
            ))
            .bind(now_ms);
            for k in chunk {
                statement.push(k);
            }
            statement
        })
        .collect()
}

fn row_issue(row: &impl Cols) -> anyhow::Result<IssueRef> {
    let repo = row.text("repo")?;
    let number = row.int("number")?;
    Ok(IssueRef::new(
        repo.parse().context("stored repository name")?,
        u64::try_from(number).context("stored issue number")?,
    ))
}

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Store {
    /// Claims up to `limit` due actions for `owner` until `now + lease_ms`. An issue's actions
    /// are taken one at a time, oldest first: a later one waits while an earlier one is due.
    pub async fn claim_actions(
        &self,
        owner: &str,
        lane: Lane<'_>,
        limit: usize,
        lease_ms: i64,
        now_ms: i64,
    ) -> anyhow::Result<Vec<ClaimedAction>> {
        let mut claimed = self
            .claim_lanes(owner, &[(lane, limit, lease_ms)], now_ms)
            .await?;
        Ok(claimed.pop().unwrap_or_default())
    }

    /// [`Store::claim_actions`] for several lanes, each `(lane, limit, lease_ms)`, in one
    /// transaction (one turn of the writer for the lot); what each lane got, in order.
    pub async fn claim_lanes(
        &self,
        owner: &str,
        lanes: &[(Lane<'_>, usize, i64)],
        now_ms: i64,
    ) -> anyhow::Result<Vec<Vec<ClaimedAction>>> {
        if lanes.iter().all(|(_, limit, _)| *limit == 0) {
            return Ok(vec![Vec::new(); lanes.len()]);
        }
        // Several replicas claim at once on PostgreSQL: rows another is claiming are skipped,
        // never claimed twice (SQLite has one writer at a time).
        let lock = match self.db {
            Db::Postgres(_) => " FOR UPDATE OF a SKIP LOCKED",
            Db::Sqlite(_) => "",
        };
        let mut tx = self.relaxed().await?;
        let mut all = Vec::with_capacity(lanes.len());
        for (lane, limit, lease_ms) in lanes {
            if *limit == 0 {
                all.push(Vec::new());
                continue;
            }
            let (op, kind) = match lane {
                Lane::Only(k) => ("=", *k),
                Lane::Except(k) => ("<>", *k),
            };
            let sql = format!(
                "SELECT a.id, a.key, a.repo, a.number, a.kind, a.action, a.schema, a.attempts, a.max_attempts \
                 FROM actions a JOIN ({HEADS}) h ON a.id = h.id \
                 WHERE {CLAIMABLE} AND a.kind {op} $2 \
                 ORDER BY a.id LIMIT $3{lock}"
            );
            let claimed = on_tx!(&mut tx, t => {
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(now_ms)
                    .bind(kind)
                    .bind(i64::try_from(*limit).unwrap_or(i64::MAX))
                    .fetch_all(&mut **t)
                    .await?;
                let claimed = rows
                    .iter()
                    .map(|row| {
                        Ok(ClaimedAction {
                            id: row.int("id")?,
                            key: row.text("key")?,
                            issue: row_issue(row)?,
                            kind: row.text("kind")?,
                            payload: row.text("action")?,
                            schema: row.int("schema")?,
                            attempts: count(row.int("attempts")?),
                            max_attempts: count(row.int("max_attempts")?),
                        })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                for c in &claimed {
                    sqlx::query("UPDATE actions SET lease_owner = $1, lease_until_ms = $2 WHERE id = $3")
                        .bind(owner)
                        .bind(now_ms.saturating_add(*lease_ms))
                        .bind(c.id)
                        .execute(&mut **t)
                        .await?;
                }
                claimed
            });
            all.push(claimed);
        }
        tx.commit().await?;
        Ok(all)
    }

    /// What could be claimed now, read without the writer's turn (so looking when there is
    /// nothing to take never queues behind a commit): how many issues' next actions of kind
    /// `kind` and of the other kinds are due and unclaimed, and when the next one that is not
    /// (a retry's back-off, another's claim running out) will be.
    pub async fn due_now(&self, kind: &str, now_ms: i64) -> anyhow::Result<DueNow> {
        let sql = format!(
            "SELECT \
             COALESCE(SUM(CASE WHEN {CLAIMABLE} AND a.kind = $2 THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN {CLAIMABLE} AND a.kind <> $2 THEN 1 ELSE 0 END), 0), \
             MIN(CASE WHEN {CLAIMABLE} THEN NULL WHEN a.lease_owner IS NULL THEN a.not_before_ms \
             WHEN a.lease_until_ms > a.not_before_ms THEN a.lease_until_ms ELSE a.not_before_ms END) \
             FROM actions a JOIN ({HEADS}) h ON a.id = h.id"
        );
        let (kind_due, other_due, next): (i64, i64, Option<i64>) = on_pool!(&self.db, p => {
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(now_ms)
                .bind(kind)
                .fetch_one(p)
                .await?
        });
        Ok(DueNow {
            kind: count(kind_due),
            others: count(other_due),
            next_at_ms: next,
        })
    }

    /// Extends `owner`'s claim on action `id` to `until_ms` while it is being performed;
    /// false when the claim is no longer `owner`'s (it ran out and another took it over).
    pub async fn renew_action_lease(
        &self,
        id: i64,
        owner: &str,
        until_ms: i64,
    ) -> anyhow::Result<bool> {
        let mut tx = self.relaxed().await?;
        let done = on_tx!(&mut tx, t => {
            sqlx::query(
                "UPDATE actions SET lease_until_ms = $1 WHERE id = $2 AND lease_owner = $3 AND state = 'due'",
            )
            .bind(until_ms)
            .bind(id)
            .bind(owner)
            .execute(&mut **t)
            .await?
            .rows_affected()
        });
        tx.commit().await?;
        Ok(done > 0)
    }

    /// Records what became of several performed actions in one transaction (one write for the
    /// lot): each outcome event is stored with its action's end.
    pub async fn record_outcomes(&self, outcomes: &[Finished], now_ms: i64) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        let mut events = Vec::new();
        for f in outcomes {
            on_tx!(&mut tx, t => match f {
                Finished::Done { id, event } => {
                    sqlx::query(
                        "UPDATE actions SET state = 'done', done_at_ms = $1, lease_owner = NULL, \
                         lease_until_ms = NULL WHERE id = $2 AND state = 'due'",
                    )
                    .bind(now_ms)
                    .bind(id)
                    .execute(&mut **t)
                    .await?;
                    events.extend(event.iter().cloned());
                }
                Finished::Retry {
                    id,
                    error,
                    not_before_ms,
                } => {
                    sqlx::query(
                        "UPDATE actions SET attempts = attempts + 1, last_error = $1, not_before_ms = $2, \
                         lease_owner = NULL, lease_until_ms = NULL WHERE id = $3 AND state = 'due'",
                    )
                    .bind(error)
                    .bind(not_before_ms)
                    .bind(id)
                    .execute(&mut **t)
                    .await?;
                }
                Finished::GaveUp { id, error, event } => {
                    sqlx::query(
                        "UPDATE actions SET state = 'failed', attempts = attempts + 1, last_error = $1, \
                         done_at_ms = $2, lease_owner = NULL, lease_until_ms = NULL WHERE id = $3 AND state = 'due'",
                    )
                    .bind(error)
                    .bind(now_ms)
                    .bind(id)
                    .execute(&mut **t)
                    .await?;
                    events.push(event.clone());
                }
            });
        }
        insert(&mut tx, &super::events::ready_all(&events)?).await?;
        if !events.is_empty() {
            super::notify(&mut tx, super::Work::Events).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Frees every claim: with SQLite there is one director, and at its start nobody else
    /// holds one (the process that did is gone). Replicas on PostgreSQL leave each other's
    /// claims alone: a dead replica's run out with their leases.
    pub async fn release_leases(&self) -> anyhow::Result<u64> {
        if self.is_shared() {
            return Ok(0);
        }
        let mut tx = self.relaxed().await?;
        let done = on_tx!(&mut tx, t => {
            sqlx::query(
                "UPDATE actions SET lease_owner = NULL, lease_until_ms = NULL \
                 WHERE state = 'due' AND lease_owner IS NOT NULL",
            )
            .execute(&mut **t)
            .await?
            .rows_affected()
        });
        tx.commit().await?;
        Ok(done)
    }

    /// Every action of one issue, oldest first.
    pub async fn actions_of(&self, issue: &IssueRef) -> anyhow::Result<Vec<ActionRow>> {
        on_pool!(&self.db, p => {
            let rows = sqlx::query(
                "SELECT key, repo, number, kind, state, attempts, last_error, not_before_ms FROM actions \
                 WHERE repo = $1 AND number = $2 ORDER BY id",
            )
            .bind(issue.repo.to_string())
            .bind(to_i64(issue.number)?)
            .fetch_all(p)
            .await?;
            rows.iter().map(action_row).collect()
        })
    }

    /// Actions still due after a failed attempt, or given up: what `status` shows as waiting.
    pub async fn troubled_actions(&self) -> anyhow::Result<Vec<ActionRow>> {
        on_pool!(&self.db, p => {
            let rows = sqlx::query(
                "SELECT key, repo, number, kind, state, attempts, last_error, not_before_ms FROM actions \
                 WHERE (state = 'due' AND attempts > 0) OR state = 'failed' ORDER BY id",
            )
            .fetch_all(p)
            .await?;
            rows.iter().map(action_row).collect()
        })
    }

    /// Actions that may run now or are running: what a quiet director has none of.
    pub async fn ready_actions(&self, now_ms: i64) -> anyhow::Result<i64> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM actions WHERE state = 'due' AND (not_before_ms <= $1 OR lease_owner IS NOT NULL)",
            )
            .bind(now_ms)
            .fetch_one(p)
            .await?
        }))
    }

    /// Due actions, for `/readyz` and the metrics.
    pub async fn due_actions(&self) -> anyhow::Result<i64> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar("SELECT COUNT(*) FROM actions WHERE state = 'due'")
                .fetch_one(p)
                .await?
        }))
    }

    /// Deletes up to `batch` rows of each kind older than `before_ms`: consumed deliveries
    /// (set-aside ones are kept), finished actions, pre-flight call records, expired leases,
    /// the egress refusals of ended runs. Returns how many.
    pub async fn prune(&self, before_ms: i64, batch: u32) -> anyhow::Result<u64> {
        let mut deleted = 0;
        // Deliveries: consumed ones received before `before_ms` (set-aside ones are kept).
        // SQLite keeps no index on the time: the old rows are those below the first `seq`
        // received since, found by bisecting `seq`, and are deleted in `seq` order. The
        // newest row is always kept: the next `seq` is one more than the largest left, and
        // must stay above the consumer's mark (`migrations/sqlite/0011_one_dedupe_key.sql`).
        let (deliveries, bound) = match &self.db {
            Db::Sqlite(s) => (
                "DELETE FROM deliveries WHERE seq IN (SELECT seq FROM deliveries \
                 WHERE seq < $1 AND seq <= (SELECT seq FROM consumer_mark) \
                 AND seq < (SELECT MAX(seq) FROM deliveries) \
                 AND dead_reason IS NULL ORDER BY seq LIMIT $2)",
                first_received_since(&s.pool, before_ms).await?,
            ),
            Db::Postgres(_) => (
                "DELETE FROM deliveries WHERE seq IN (SELECT seq FROM deliveries \
                 WHERE processed_at_ms IS NOT NULL AND processed_at_ms < $1 AND dead_reason IS NULL LIMIT $2)",
                before_ms,
            ),
        };
        // Each statement with what its `$1` is.
        for (sql, bound) in [
            (deliveries, bound),
            (
                "DELETE FROM actions WHERE id IN (SELECT id FROM actions \
                 WHERE state <> 'due' AND done_at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            (
                "DELETE FROM preflight_calls WHERE id IN (SELECT id FROM preflight_calls \
                 WHERE at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            (
                "DELETE FROM leases WHERE name IN (SELECT name FROM leases \
                 WHERE until_ms < $1 LIMIT $2)",
                before_ms,
            ),
            // A run's refusals are in its record once it ended.
            (
                "DELETE FROM egress_refusals WHERE run_id IN (SELECT id FROM runs \
                 WHERE finished_at_ms IS NOT NULL AND finished_at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            // Spending older than the retention: budgets count one day at most.
            (
                "DELETE FROM model_usage WHERE id IN (SELECT id FROM model_usage \
                 WHERE at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            (
                "DELETE FROM budget_stops WHERE run_id IN (SELECT run_id FROM budget_stops \
                 WHERE at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            // Transcripts of runs that ended before the retention.
            (
                "DELETE FROM transcript_chunks WHERE (run_id, seq) IN (SELECT c.run_id, c.seq \
                 FROM transcript_chunks c JOIN runs r ON r.id = c.run_id \
                 WHERE r.finished_at_ms IS NOT NULL AND r.finished_at_ms < $1 LIMIT $2)",
                before_ms,
            ),
            (
                "DELETE FROM run_transcripts WHERE run_id IN (SELECT id FROM runs \
                 WHERE finished_at_ms IS NOT NULL AND finished_at_ms < $1 \
                 AND NOT EXISTS (SELECT 1 FROM transcript_chunks c WHERE c.run_id = runs.id) LIMIT $2)",
                before_ms,
            ),
            // A token kept for a run that ended and whose removal was missed.
            (
                "DELETE FROM run_tokens WHERE run_id IN (SELECT id FROM runs \
                 WHERE finished_at_ms IS NOT NULL AND finished_at_ms < $1 LIMIT $2)",
                before_ms,
            ),
        ] {
            // One short transaction per statement: intake waits for at most one batch.
            let mut tx = self.relaxed().await?;
            deleted += on_tx!(&mut tx, t => {
                sqlx::query(sql)
                    .bind(bound)
                    .bind(i64::from(batch))
                    .execute(&mut **t)
                    .await?
                    .rows_affected()
            });
            tx.commit().await?;
        }
        Ok(deleted)
    }
}

/// The first delivery `seq` received at or after `at_ms` (past the last row if none was).
/// Received times rise with `seq` (a clock set back leaves a few rows for a later pass), so a
/// bisection of `seq`, each step one look-up by key, finds it without reading the old rows.
async fn first_received_since(pool: &sqlx::SqlitePool, at_ms: i64) -> anyhow::Result<i64> {
    let (first, last): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT MIN(seq), MAX(seq) FROM deliveries")
            .fetch_one(pool)
            .await?;
    let (Some(mut lo), Some(last)) = (first, last) else {
        return Ok(0);
    };
    // Rows below `lo` are older; the first row at or after `hi` is newer, or there is none.
    let mut hi = last.saturating_add(1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let at: Option<i64> = sqlx::query_scalar(
            "SELECT received_at_ms FROM deliveries WHERE seq >= $1 ORDER BY seq LIMIT 1",
        )
        .bind(mid)
        .fetch_optional(pool)
        .await?;
        match at {
            Some(at) if at < at_ms => lo = mid + 1,
            _ => hi = mid,
        }
    }
    Ok(lo)
}

fn action_row(row: &impl Cols) -> anyhow::Result<ActionRow> {
    Ok(ActionRow {
        key: row.text("key")?,
        issue: row_issue(row)?,
        kind: row.text("kind")?,
        state: row.text("state")?,
        attempts: count(row.int("attempts")?),
        last_error: row.opt_text("last_error")?,
        not_before_ms: row.int("not_before_ms")?,
    })
}
