//! Issues, runs, and the pre-flight's cache and call log.

use std::collections::HashMap;

use anyhow::Context;
use sqlx::Row;

use super::{CHUNK, Store, to_i64};
use crate::domain::run::StopCause;
use crate::domain::{IssueRecord, IssueRef, Lifecycle, RepoName, RunRecord, RunState};

const COLS: &str = "repo, number, title, state, labels, forge_updated_at, last_change_ms, lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, preflight, version, blocked, pr";
const RUN_COLS: &str = "id, repo, number, state, branch, base_branch, container_id, pr_number, detail, created_at_ms, started_at_ms, finished_at_ms, exit_code, log_tail, stop_requested, followup, result, stopped";
const ACTIVE_RUN: &str = "state IN ('launching', 'running', 'exited')";

/// Pre-flight calls within a window.
pub use crate::domain::issue::CallWindow;

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

pub(super) async fn upsert_issue(tx: &mut Tx<'_>, record: &IssueRecord) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO issues (repo, number, title, state, labels, forge_updated_at, last_change_ms, \
         lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, \
         preflight, preflight_not_before_ms, version, blocked, pr, pr_number, pr_state) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (repo, number) DO UPDATE SET title = excluded.title, \
         state = excluded.state, labels = excluded.labels, \
         forge_updated_at = excluded.forge_updated_at, last_change_ms = excluded.last_change_ms, \
         lifecycle = excluded.lifecycle, trigger_present = excluded.trigger_present, \
         trigger_actor = excluded.trigger_actor, trigger_trusted = excluded.trigger_trusted, \
         untrusted_notice = excluded.untrusted_notice, preflight = excluded.preflight, \
         preflight_not_before_ms = excluded.preflight_not_before_ms, \
         version = excluded.version, blocked = excluded.blocked, pr = excluded.pr, \
         pr_number = excluded.pr_number, pr_state = excluded.pr_state",
    )
    .bind(record.repo.to_string())
    .bind(to_i64(record.number)?)
    .bind(&record.title)
    .bind(&record.state)
    .bind(serde_json::to_string(&record.labels)?)
    .bind(&record.forge_updated_at)
    .bind(record.last_change_ms)
    .bind(record.lifecycle.as_str())
    .bind(record.trigger_present)
    .bind(&record.trigger_actor)
    .bind(record.trigger_trusted)
    .bind(record.untrusted_notice)
    .bind(serde_json::to_string(&record.preflight)?)
    .bind(record.preflight.not_before_ms)
    .bind(record.version)
    .bind(&record.blocked)
    .bind(record.pr.as_ref().map(serde_json::to_string).transpose()?)
    .bind(record.pr.as_ref().map(|p| to_i64(p.number)).transpose()?)
    .bind(record.pr.as_ref().map(|p| p.state.as_str()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn upsert_run(tx: &mut Tx<'_>, run: &RunRecord) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO runs (id, repo, number, state, branch, base_branch, container_id, pr_number, \
         detail, created_at_ms, started_at_ms, finished_at_ms, exit_code, log_tail, stop_requested, \
         followup, result, stopped) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (id) DO UPDATE SET state = excluded.state, base_branch = excluded.base_branch, \
         container_id = excluded.container_id, pr_number = excluded.pr_number, \
         detail = excluded.detail, started_at_ms = excluded.started_at_ms, \
         finished_at_ms = excluded.finished_at_ms, exit_code = excluded.exit_code, \
         log_tail = excluded.log_tail, stop_requested = excluded.stop_requested, \
         followup = excluded.followup, result = excluded.result, stopped = excluded.stopped",
    )
    .bind(&run.id)
    .bind(run.repo.to_string())
    .bind(to_i64(run.number)?)
    .bind(run.state.as_str())
    .bind(&run.branch)
    .bind(&run.base_branch)
    .bind(&run.container_id)
    .bind(run.pr_number.map(to_i64).transpose()?)
    .bind(&run.detail)
    .bind(run.created_at_ms)
    .bind(run.started_at_ms)
    .bind(run.finished_at_ms)
    .bind(run.exit_code)
    .bind(&run.log_tail)
    .bind(run.stop_requested)
    .bind(run.followup.as_ref().map(serde_json::to_string).transpose()?)
    .bind(run.result.as_ref().map(serde_json::to_string).transpose()?)
    .bind(run.stopped.map(stop_cause_str))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn stop_cause_str(cause: StopCause) -> &'static str {
    match cause {
        StopCause::Timeout => "timeout",
        StopCause::Idle => "idle",
    }
}

/// A JSON column that may be NULL.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &sqlx::sqlite::SqliteRow,
    name: &str,
) -> anyhow::Result<Option<T>> {
    let text: Option<String> = row.try_get(name)?;
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .with_context(|| format!("stored {name}"))
}

fn issue_from_row(row: sqlx::sqlite::SqliteRow) -> anyhow::Result<IssueRecord> {
    let repo: String = row.try_get("repo")?;
    let number: i64 = row.try_get("number")?;
    let labels: String = row.try_get("labels")?;
    let lifecycle: String = row.try_get("lifecycle")?;
    let preflight: String = row.try_get("preflight")?;
    Ok(IssueRecord {
        repo: repo.parse().context("stored repository name")?,
        number: u64::try_from(number).context("stored issue number")?,
        title: row.try_get("title")?,
        state: row.try_get("state")?,
        labels: serde_json::from_str(&labels).context("stored labels")?,
        forge_updated_at: row.try_get("forge_updated_at")?,
        last_change_ms: row.try_get("last_change_ms")?,
        lifecycle: Lifecycle::parse(&lifecycle)
            .with_context(|| format!("stored lifecycle `{lifecycle}`"))?,
        trigger_present: row.try_get("trigger_present")?,
        trigger_actor: row.try_get("trigger_actor")?,
        trigger_trusted: row.try_get("trigger_trusted")?,
        untrusted_notice: row.try_get("untrusted_notice")?,
        preflight: serde_json::from_str(&preflight).context("stored pre-flight state")?,
        version: row.try_get("version")?,
        blocked: row.try_get("blocked")?,
        pr: json_column(&row, "pr")?,
    })
}

fn run_from_row(row: sqlx::sqlite::SqliteRow) -> anyhow::Result<RunRecord> {
    let repo: String = row.try_get("repo")?;
    let number: i64 = row.try_get("number")?;
    let pr: Option<i64> = row.try_get("pr_number")?;
    let state: String = row.try_get("state")?;
    Ok(RunRecord {
        id: row.try_get("id")?,
        repo: repo.parse().context("stored repository name")?,
        number: u64::try_from(number).context("stored issue number")?,
        state: RunState::parse(&state).with_context(|| format!("stored run state `{state}`"))?,
        branch: row.try_get("branch")?,
        base_branch: row.try_get("base_branch")?,
        container_id: row.try_get("container_id")?,
        pr_number: pr
            .map(u64::try_from)
            .transpose()
            .context("stored PR number")?,
        detail: row.try_get("detail")?,
        created_at_ms: row.try_get("created_at_ms")?,
        started_at_ms: row.try_get("started_at_ms")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
        exit_code: row.try_get("exit_code")?,
        log_tail: row.try_get("log_tail")?,
        stop_requested: row.try_get("stop_requested")?,
        followup: json_column(&row, "followup")?,
        result: json_column(&row, "result")?,
        stopped: match row.try_get::<Option<String>, _>("stopped")?.as_deref() {
            Some("timeout") => Some(StopCause::Timeout),
            Some("idle") => Some(StopCause::Idle),
            _ => None,
        },
    })
}

impl Store {
    pub async fn issue(&self, issue: &IssueRef) -> anyhow::Result<Option<IssueRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE repo = ? AND number = ?"
        )))
        .bind(issue.repo.to_string())
        .bind(to_i64(issue.number)?)
        .fetch_optional(&self.pool)
        .await?;
        row.map(issue_from_row).transpose()
    }

    /// Rows of `select` (a statement ending in `(repo, number) IN (VALUES <pairs>)` where
    /// it holds `{pairs}`) for every issue of `issues`, one query per chunk.
    async fn rows_for(
        &self,
        select: &str,
        issues: &[IssueRef],
    ) -> anyhow::Result<Vec<sqlx::sqlite::SqliteRow>> {
        let mut out = Vec::with_capacity(issues.len());
        for chunk in issues.chunks(CHUNK) {
            let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
            let sql = select.replace("{pairs}", &pairs);
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for issue in chunk {
                query = query
                    .bind(issue.repo.to_string())
                    .bind(to_i64(issue.number)?);
            }
            out.extend(query.fetch_all(&self.pool).await?);
        }
        Ok(out)
    }

    /// The known records among `issues`.
    pub async fn issues(&self, issues: &[IssueRef]) -> anyhow::Result<Vec<IssueRecord>> {
        let select =
            format!("SELECT {COLS} FROM issues WHERE (repo, number) IN (VALUES {{pairs}})");
        self.rows_for(&select, issues)
            .await?
            .into_iter()
            .map(issue_from_row)
            .collect()
    }

    /// The newest run of each of `issues` that has one.
    pub async fn latest_runs(&self, issues: &[IssueRef]) -> anyhow::Result<Vec<RunRecord>> {
        let select = format!(
            "SELECT {RUN_COLS} FROM runs r WHERE (repo, number) IN (VALUES {{pairs}}) \
             AND NOT EXISTS (SELECT 1 FROM runs n WHERE n.repo = r.repo AND n.number = r.number \
             AND (n.created_at_ms > r.created_at_ms OR (n.created_at_ms = r.created_at_ms AND n.id > r.id)))"
        );
        self.rows_for(&select, issues)
            .await?
            .into_iter()
            .map(run_from_row)
            .collect()
    }

    /// Every known issue of one repository.
    pub async fn issues_in_repo(&self, repo: &RepoName) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE repo = ? ORDER BY number"
        )))
        .bind(repo.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(issue_from_row).collect()
    }

    /// Issues waiting for a run, in queue order.
    pub async fn queued_issues(&self) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE lifecycle = 'queued' ORDER BY last_change_ms, repo, number"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(issue_from_row).collect()
    }

    /// The issues whose run opened the given pull requests, as (pull request, issue).
    pub async fn issues_of_pulls(
        &self,
        pulls: &[IssueRef],
    ) -> anyhow::Result<Vec<(IssueRef, IssueRef)>> {
        let mut out = Vec::new();
        for pull in pulls {
            let row: Option<i64> = sqlx::query_scalar(
                "SELECT number FROM issues WHERE repo = ? AND pr_number = ? LIMIT 1",
            )
            .bind(pull.repo.to_string())
            .bind(to_i64(pull.number)?)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(n) = row {
                let number = u64::try_from(n).context("stored issue number")?;
                out.push((pull.clone(), IssueRef::new(pull.repo.clone(), number)));
            }
        }
        Ok(out)
    }

    /// Open pull requests from the director, per repository: what pacing counts.
    pub async fn open_pull_counts(&self) -> anyhow::Result<HashMap<RepoName, usize>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT repo, COUNT(*) FROM issues WHERE pr_state = 'open' GROUP BY repo",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = HashMap::new();
        for (repo, n) in rows {
            out.insert(
                repo.parse().context("stored repository name")?,
                usize::try_from(n).unwrap_or(0),
            );
        }
        Ok(out)
    }

    /// Issues whose pull request is open as far as the director knows (the scan checks them).
    pub async fn issues_with_open_pulls(&self) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE pr_state = 'open' ORDER BY repo, number"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(issue_from_row).collect()
    }

    pub async fn list_issues(&self) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues ORDER BY repo, number"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(issue_from_row).collect()
    }

    /// Runs not ended yet (launching, running, or exited and being judged).
    pub async fn active_runs(&self) -> anyhow::Result<Vec<RunRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLS} FROM runs WHERE {ACTIVE_RUN} ORDER BY created_at_ms"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(run_from_row).collect()
    }

    /// Active runs in all, and per repository: what admission counts against the limits.
    pub async fn active_run_counts(&self) -> anyhow::Result<(usize, HashMap<RepoName, usize>)> {
        let mut per_repo: HashMap<RepoName, usize> = HashMap::new();
        let mut total = 0;
        for run in self.active_runs().await? {
            total += 1;
            *per_repo.entry(run.repo).or_default() += 1;
        }
        Ok((total, per_repo))
    }

    pub async fn runs_of(&self, issue: &IssueRef) -> anyhow::Result<Vec<RunRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLS} FROM runs WHERE repo = ? AND number = ? ORDER BY created_at_ms, id"
        )))
        .bind(issue.repo.to_string())
        .bind(to_i64(issue.number)?)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(run_from_row).collect()
    }

    pub async fn run(&self, id: &str) -> anyhow::Result<Option<RunRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLS} FROM runs WHERE id = ?"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(run_from_row).transpose()
    }

    /// A reading stored for this exact prompt text.
    pub async fn cached_reading(&self, sha256: &str) -> anyhow::Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT reading, model FROM preflight_reads WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get("reading")?, r.try_get("model")?)))
            .transpose()
    }

    pub async fn cache_reading(
        &self,
        sha256: &str,
        reading: &str,
        model: &str,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query(
            "INSERT INTO preflight_reads (sha256, reading, model, created_at_ms) VALUES (?, ?, ?, ?) \
             ON CONFLICT DO NOTHING",
        )
        .bind(sha256)
        .bind(reading)
        .bind(model)
        .bind(now_ms)
        .execute(&self.relaxed)
        .await?;
        Ok(())
    }

    /// Records a call to the provider, for the hourly caps.
    pub async fn record_preflight_call(&self, repo: &RepoName, now_ms: i64) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query("INSERT INTO preflight_calls (repo, at_ms) VALUES (?, ?)")
            .bind(repo.to_string())
            .bind(now_ms)
            .execute(&self.relaxed)
            .await?;
        Ok(())
    }

    /// Calls since `since_ms`, overall and for `repo`, with the oldest of each.
    pub async fn preflight_calls_since(
        &self,
        repo: &RepoName,
        since_ms: i64,
    ) -> anyhow::Result<CallWindow> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS total, MIN(at_ms) AS oldest, \
             COALESCE(SUM(CASE WHEN repo = ? THEN 1 ELSE 0 END), 0) AS repo_total, \
             MIN(CASE WHEN repo = ? THEN at_ms END) AS repo_oldest \
             FROM preflight_calls WHERE at_ms >= ?",
        )
        .bind(repo.to_string())
        .bind(repo.to_string())
        .bind(since_ms)
        .fetch_one(&self.pool)
        .await?;
        Ok(CallWindow {
            total: row.try_get("total")?,
            oldest_ms: row.try_get("oldest")?,
            repo_total: row.try_get("repo_total")?,
            repo_oldest_ms: row.try_get("repo_oldest")?,
        })
    }
}
