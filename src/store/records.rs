//! Issues, runs, and the pre-flight's cache and call log.

use std::collections::HashMap;

use anyhow::Context;

use super::backend::{Backend, Cols, Marks, tuples};
use super::statement::Statement;
use super::{CHUNK, Store, to_i64};
use crate::domain::run::StopCause;
use crate::domain::{IssueRecord, IssueRef, Lifecycle, RepoName, RunId, RunRecord, RunState};

const COLS: &str = "repo, number, title, state, labels, forge_updated_at, last_change_ms, lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, preflight, version, blocked, pr, thread";
const RUN_COLS: &str = "id, repo, number, state, branch, base_branch, container_id, pr_number, detail, created_at_ms, started_at_ms, finished_at_ms, exit_code, log_tail, stop_requested, followup, result, stopped, egress_refused, settings, base_commit, agent, branch_home, setup, continued, checks";
const ACTIVE_RUN: &str = "state IN ('launching', 'running', 'exited')";

/// Pre-flight calls within a window.
pub use crate::domain::issue::CallWindow;

/// Columns an issue record is written to, in the order [`upsert_issues`] binds them.
const WRITE_COLS: &str = "repo, number, title, state, labels, forge_updated_at, last_change_ms, \
     lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, \
     preflight, preflight_not_before_ms, version, blocked, pr, pr_number, pr_state, verdict, \
     picked_at_ms, filer, thread";
const WRITE_WIDTH: usize = 23;

/// Writes `records`, [`CHUNK`] to a statement (a consumer pass changes up to one record per
/// event it decides, and a statement per record cost more than the rest of the pass). Of
/// two records of one issue the later is written: one statement may not change a row twice.
pub(super) fn upsert_issues(
    records: &[IssueRecord],
    marks: Marks,
) -> anyhow::Result<Vec<Statement>> {
    let mut seen = std::collections::HashSet::new();
    let mut latest: Vec<&IssueRecord> = records
        .iter()
        .rev()
        .filter(|r| seen.insert((&r.repo, r.number)))
        .collect();
    latest.reverse();
    let mut statements = Vec::new();
    for chunk in latest.chunks(CHUNK) {
        let mut statement = Statement::new(format!(
            "INSERT INTO issues ({WRITE_COLS}) VALUES {} \
             ON CONFLICT (repo, number) DO UPDATE SET title = excluded.title, \
             state = excluded.state, labels = excluded.labels, \
             forge_updated_at = excluded.forge_updated_at, last_change_ms = excluded.last_change_ms, \
             lifecycle = excluded.lifecycle, trigger_present = excluded.trigger_present, \
             trigger_actor = excluded.trigger_actor, trigger_trusted = excluded.trigger_trusted, \
             untrusted_notice = excluded.untrusted_notice, preflight = excluded.preflight, \
             preflight_not_before_ms = excluded.preflight_not_before_ms, \
             version = excluded.version, blocked = excluded.blocked, pr = excluded.pr, \
             pr_number = excluded.pr_number, pr_state = excluded.pr_state, \
             verdict = excluded.verdict, picked_at_ms = excluded.picked_at_ms, \
             filer = excluded.filer,
             thread = excluded.thread",
            tuples(marks, chunk.len(), WRITE_WIDTH)
        ));
        for &record in chunk {
            statement.push(record.repo.to_string());
            statement.push(to_i64(record.number)?);
            statement.push(&record.title);
            statement.push(&record.state);
            statement.push(serde_json::to_string(&record.labels)?);
            statement.push(&record.forge_updated_at);
            statement.push(record.last_change_ms);
            statement.push(record.lifecycle.as_str());
            statement.push(record.trigger_present);
            statement.push(&record.trigger_actor);
            statement.push(record.trigger_trusted);
            statement.push(record.untrusted_notice);
            statement.push(serde_json::to_string(&record.preflight)?);
            statement.push(record.preflight.not_before_ms);
            statement.push(record.version);
            statement.push(&record.blocked);
            statement.push(record.pr.as_ref().map(serde_json::to_string).transpose()?);
            statement.push(record.pr.as_ref().map(|p| to_i64(p.number)).transpose()?);
            statement.push(record.pr.as_ref().map(|p| p.state.as_str()));
            statement.push(record.preflight.verdict.map(|v| v.as_str()));
            statement.push(record.preflight.picked_at_ms);
            // Agent-filed work only: one a maintainer made theirs counts as theirs.
            let filer = record.preflight.filer.as_ref().filter(|f| f.is_agents());
            statement.push(filer.map(|f| f.name.as_str()));
            statement.push(
                (!record.thread.is_empty())
                    .then(|| serde_json::to_string(&record.thread))
                    .transpose()?,
            );
        }
        statements.push(statement);
    }
    Ok(statements)
}

pub(super) fn upsert_run(run: &RunRecord) -> anyhow::Result<Statement> {
    let followup = run
        .followup
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    let result = run.result.as_ref().map(serde_json::to_string).transpose()?;
    let continued = run
        .continued
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    let checks = run.checks.as_ref().map(serde_json::to_string).transpose()?;
    let egress_refused = (!run.egress_refused.is_empty())
        .then(|| serde_json::to_string(&run.egress_refused))
        .transpose()?;
    Ok(Statement::new(
        "INSERT INTO runs (id, repo, number, state, branch, base_branch, container_id, pr_number, \
         detail, created_at_ms, started_at_ms, finished_at_ms, exit_code, log_tail, stop_requested, \
         followup, result, stopped, egress_refused, continued, checks) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21) \
         ON CONFLICT (id) DO UPDATE SET state = excluded.state, base_branch = excluded.base_branch, \
         container_id = excluded.container_id, pr_number = excluded.pr_number, \
         detail = excluded.detail, started_at_ms = excluded.started_at_ms, \
         finished_at_ms = excluded.finished_at_ms, exit_code = excluded.exit_code, \
         log_tail = excluded.log_tail, stop_requested = excluded.stop_requested, \
         followup = excluded.followup, result = excluded.result, stopped = excluded.stopped, \
         egress_refused = excluded.egress_refused, checks = excluded.checks",
    )
    .bind(run.id.as_str())
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
    .bind(followup)
    .bind(result)
    .bind(run.stopped.map(stop_cause_str))
    .bind(egress_refused)
    .bind(continued)
    .bind(checks))
}

/// The known records among `chunk` (at most [`CHUNK`] issues).
pub(super) fn issues_in(chunk: &[IssueRef], marks: Marks) -> anyhow::Result<Statement> {
    in_pairs(
        format!(
            "SELECT {COLS} FROM issues WHERE (repo, number) IN (VALUES {})",
            tuples(marks, chunk.len(), 2)
        ),
        chunk,
    )
}

/// The newest run of each of `chunk` (at most [`CHUNK`] issues) that has one.
pub(super) fn latest_runs_of(chunk: &[IssueRef], marks: Marks) -> anyhow::Result<Statement> {
    in_pairs(
        format!(
            "SELECT {RUN_COLS} FROM runs r WHERE (repo, number) IN (VALUES {}) \
             AND NOT EXISTS (SELECT 1 FROM runs n WHERE n.repo = r.repo AND n.number = r.number \
             AND (n.created_at_ms > r.created_at_ms OR (n.created_at_ms = r.created_at_ms AND n.id > r.id)))",
            tuples(marks, chunk.len(), 2)
        ),
        chunk,
    )
}

/// `sql` with the (repository, number) of each of `issues` bound in order.
fn in_pairs(sql: String, issues: &[IssueRef]) -> anyhow::Result<Statement> {
    let mut statement = Statement::new(sql);
    for issue in issues {
        statement.push(issue.repo.to_string());
        statement.push(to_i64(issue.number)?);
    }
    Ok(statement)
}

/// The issue whose run opened the pull request `pull`: a row of its `number`, if any.
pub(super) fn issue_of_pull(pull: &IssueRef) -> anyhow::Result<Statement> {
    Ok(
        Statement::new("SELECT number FROM issues WHERE repo = $1 AND pr_number = $2 LIMIT 1")
            .bind(pull.repo.to_string())
            .bind(to_i64(pull.number)?),
    )
}

/// (pull request, issue) when the pull request's issue was found as `number`.
pub(super) fn owner_of(
    pull: &IssueRef,
    number: Option<i64>,
) -> anyhow::Result<Option<(IssueRef, IssueRef)>> {
    let Some(n) = number else {
        return Ok(None);
    };
    let number = u64::try_from(n).context("stored issue number")?;
    Ok(Some((
        pull.clone(),
        IssueRef::new(pull.repo.clone(), number),
    )))
}

/// Whether any issue waits for a run: a row when one does.
pub(super) const ANY_QUEUED: &str = "SELECT 1 FROM issues WHERE lifecycle = 'queued' LIMIT 1";

fn stop_cause_str(cause: StopCause) -> &'static str {
    match cause {
        StopCause::Timeout => "timeout",
        StopCause::Idle => "idle",
        StopCause::Budget => "budget",
    }
}

/// A JSON column that may be NULL.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &dyn Cols,
    name: &str,
) -> anyhow::Result<Option<T>> {
    row.opt_text(name)?
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .with_context(|| format!("stored {name}"))
}

pub(super) fn issue_from_row(row: &dyn Cols) -> anyhow::Result<IssueRecord> {
    let repo = row.text("repo")?;
    let number = row.int("number")?;
    let labels = row.text("labels")?;
    let lifecycle = row.text("lifecycle")?;
    let preflight = row.text("preflight")?;
    Ok(IssueRecord {
        repo: repo.parse().context("stored repository name")?,
        number: u64::try_from(number).context("stored issue number")?,
        title: row.text("title")?,
        state: row.text("state")?,
        labels: serde_json::from_str(&labels).context("stored labels")?,
        forge_updated_at: row.opt_text("forge_updated_at")?,
        last_change_ms: row.int("last_change_ms")?,
        lifecycle: Lifecycle::parse(&lifecycle)
            .with_context(|| format!("stored lifecycle `{lifecycle}`"))?,
        trigger_present: row.flag("trigger_present")?,
        trigger_actor: row.opt_text("trigger_actor")?,
        trigger_trusted: row.opt_flag("trigger_trusted")?,
        untrusted_notice: row.flag("untrusted_notice")?,
        preflight: serde_json::from_str(&preflight).context("stored pre-flight state")?,
        version: row.int("version")?,
        blocked: row.opt_text("blocked")?,
        pr: json_column(row, "pr")?,
        thread: json_column(row, "thread")?.unwrap_or_default(),
    })
}

pub(super) fn run_from_row(row: &dyn Cols) -> anyhow::Result<RunRecord> {
    let repo = row.text("repo")?;
    let number = row.int("number")?;
    let pr = row.opt_int("pr_number")?;
    let state = row.text("state")?;
    Ok(RunRecord {
        id: RunId::parse(&row.text("id")?).context("stored run id")?,
        repo: repo.parse().context("stored repository name")?,
        number: u64::try_from(number).context("stored issue number")?,
        state: RunState::parse(&state).with_context(|| format!("stored run state `{state}`"))?,
        branch: row.text("branch")?,
        base_branch: row.text("base_branch")?,
        container_id: row.opt_text("container_id")?,
        pr_number: pr
            .map(u64::try_from)
            .transpose()
            .context("stored PR number")?,
        detail: row.opt_text("detail")?,
        created_at_ms: row.int("created_at_ms")?,
        started_at_ms: row.opt_int("started_at_ms")?,
        finished_at_ms: row.opt_int("finished_at_ms")?,
        exit_code: row.opt_int("exit_code")?,
        log_tail: row.opt_text("log_tail")?,
        stop_requested: row.flag("stop_requested")?,
        followup: json_column(row, "followup")?,
        result: json_column(row, "result")?,
        stopped: match row.opt_text("stopped")?.as_deref() {
            Some("timeout") => Some(StopCause::Timeout),
            Some("idle") => Some(StopCause::Idle),
            Some("budget") => Some(StopCause::Budget),
            _ => None,
        },
        egress_refused: json_column(row, "egress_refused")?.unwrap_or_default(),
        settings: json_column(row, "settings")?,
        base_commit: row
            .opt_text("base_commit")?
            .map(|c| crate::domain::CommitSha::parse(&c))
            .transpose()
            .context("stored base commit")?,
        agent: json_column(row, "agent")?,
        home: row.opt_text("branch_home")?.and_then(|h| h.parse().ok()),
        setup: json_column(row, "setup")?,
        checks: json_column(row, "checks")?,
        continued: json_column(row, "continued")?,
    })
}

/// Issues, by any statement that selects `COLS`.
macro_rules! issues_where {
    ($store:expr, $sql:expr $(, $bind:expr)*) => {{
        let sql = format!("SELECT {COLS} FROM issues {}", $sql);
        on_pool!(&$store.db, p => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                $(.bind($bind))*
                .fetch_all(p)
                .await?;
            rows.iter().map(|r| issue_from_row(r)).collect::<anyhow::Result<Vec<_>>>()
        })
    }};
}

/// Runs, likewise.
macro_rules! runs_where {
    ($store:expr, $sql:expr $(, $bind:expr)*) => {{
        let sql = format!("SELECT {RUN_COLS} FROM runs {}", $sql);
        on_pool!(&$store.db, p => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                $(.bind($bind))*
                .fetch_all(p)
                .await?;
            rows.iter().map(|r| run_from_row(r)).collect::<anyhow::Result<Vec<_>>>()
        })
    }};
}

impl Store {
    pub async fn issue(&self, issue: &IssueRef) -> anyhow::Result<Option<IssueRecord>> {
        let found = issues_where!(
            self,
            "WHERE repo = $1 AND number = $2",
            issue.repo.to_string(),
            to_i64(issue.number)?
        )?;
        Ok(found.into_iter().next())
    }

    /// The known records among `issues`, one query per chunk.
    pub async fn issues(&self, issues: &[IssueRef]) -> anyhow::Result<Vec<IssueRecord>> {
        let mut out = Vec::with_capacity(issues.len());
        for chunk in issues.chunks(CHUNK) {
            let statement = issues_in(chunk, Backend::of(&self.db).marks())?;
            out.extend(self.fetch(statement, issue_from_row).await?);
        }
        Ok(out)
    }

    /// The newest run of each of `issues` that has one.
    pub async fn latest_runs(&self, issues: &[IssueRef]) -> anyhow::Result<Vec<RunRecord>> {
        let mut out = Vec::with_capacity(issues.len());
        for chunk in issues.chunks(CHUNK) {
            let statement = latest_runs_of(chunk, Backend::of(&self.db).marks())?;
            out.extend(self.fetch(statement, run_from_row).await?);
        }
        Ok(out)
    }

    /// Every known issue of one repository.
    pub async fn issues_in_repo(&self, repo: &RepoName) -> anyhow::Result<Vec<IssueRecord>> {
        issues_where!(self, "WHERE repo = $1 ORDER BY number", repo.to_string())
    }

    /// Issues waiting for a run, in queue order.
    pub async fn queued_issues(&self) -> anyhow::Result<Vec<IssueRecord>> {
        issues_where!(
            self,
            "WHERE lifecycle = 'queued' ORDER BY last_change_ms, repo, number"
        )
    }

    /// The issues whose run opened the given pull requests, as (pull request, issue).
    pub async fn issues_of_pulls(
        &self,
        pulls: &[IssueRef],
    ) -> anyhow::Result<Vec<(IssueRef, IssueRef)>> {
        let mut out = Vec::new();
        for pull in pulls {
            let found = self
                .fetch(issue_of_pull(pull)?, |r| r.int("number"))
                .await?;
            if let Some(owner) = owner_of(pull, found.first().copied())? {
                out.push(owner);
            }
        }
        Ok(out)
    }

    /// Open pull requests from the director, per repository: what pacing counts.
    pub async fn open_pull_counts(&self) -> anyhow::Result<HashMap<RepoName, usize>> {
        let rows: Vec<(String, i64)> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT repo, COUNT(*) FROM issues WHERE pr_state = 'open' GROUP BY repo",
            )
            .fetch_all(p)
            .await?
        });
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
        issues_where!(self, "WHERE pr_state = 'open' ORDER BY repo, number")
    }

    /// Issues whose pull request was merged at or after `since_ms` and is not known to be
    /// reverted: what the revert check watches.
    pub async fn recently_merged(&self, since_ms: i64) -> anyhow::Result<Vec<IssueRecord>> {
        let records: Vec<IssueRecord> = issues_where!(
            self,
            "WHERE pr_state = 'merged' AND last_change_ms >= $1 ORDER BY repo, number",
            since_ms
        )?;
        Ok(records
            .into_iter()
            .filter(|r| {
                r.pr.as_ref().is_some_and(|p| {
                    p.reverted.is_none() && p.ended_at_ms.is_some_and(|t| t >= since_ms)
                })
            })
            .collect())
    }

    pub async fn list_issues(&self) -> anyhow::Result<Vec<IssueRecord>> {
        issues_where!(self, "ORDER BY repo, number")
    }

    /// Runs not ended yet (launching, running, or exited and being judged).
    pub async fn active_runs(&self) -> anyhow::Result<Vec<RunRecord>> {
        runs_where!(self, format!("WHERE {ACTIVE_RUN} ORDER BY created_at_ms"))
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
        runs_where!(
            self,
            "WHERE repo = $1 AND number = $2 ORDER BY created_at_ms, id",
            issue.repo.to_string(),
            to_i64(issue.number)?
        )
    }

    pub async fn run(&self, id: &RunId) -> anyhow::Result<Option<RunRecord>> {
        Ok(runs_where!(self, "WHERE id = $1", id.as_str())?
            .into_iter()
            .next())
    }

    /// The issue's lifecycle with the events still to consume and the actions still due, all
    /// read by one statement, so the three agree (separate reads can straddle a commit that
    /// moves work from one to the other). `None` while the issue is unknown.
    pub async fn at_rest(&self, issue: &IssueRef) -> anyhow::Result<Option<(Lifecycle, i64, i64)>> {
        let sql = format!(
            "SELECT lifecycle, \
             (SELECT COUNT(*) FROM deliveries WHERE {}) AS pending, \
             (SELECT COUNT(*) FROM actions WHERE state = 'due') AS due \
             FROM issues WHERE repo = $1 AND number = $2",
            super::events::unconsumed(&self.db)
        );
        on_pool!(&self.db, p => {
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(issue.repo.to_string())
            .bind(to_i64(issue.number)?)
            .fetch_optional(p)
            .await?;
            row.map(|r| {
                let lifecycle = r.text("lifecycle")?;
                Ok((
                    Lifecycle::parse(&lifecycle)
                        .with_context(|| format!("stored lifecycle `{lifecycle}`"))?,
                    r.int("pending")?,
                    r.int("due")?,
                ))
            })
            .transpose()
        })
    }

    /// A reading stored for this exact prompt text.
    pub async fn cached_reading(&self, sha256: &str) -> anyhow::Result<Option<(String, String)>> {
        on_pool!(&self.db, p => {
            let row = sqlx::query("SELECT reading, model FROM preflight_reads WHERE sha256 = $1")
                .bind(sha256)
                .fetch_optional(p)
                .await?;
            row.map(|r| Ok((r.text("reading")?, r.text("model")?)))
                .transpose()
        })
    }

    pub async fn cache_reading(
        &self,
        sha256: &str,
        reading: &str,
        model: &str,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO preflight_reads (sha256, reading, model, created_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(sha256)
            .bind(reading)
            .bind(model)
            .bind(now_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Records a call to the provider, for the hourly caps.
    pub async fn record_preflight_call(&self, repo: &RepoName, now_ms: i64) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query("INSERT INTO preflight_calls (repo, at_ms) VALUES ($1, $2)")
                .bind(repo.to_string())
                .bind(now_ms)
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await
    }

    /// Calls since `since_ms`, overall and for `repo`, with the oldest of each.
    pub async fn preflight_calls_since(
        &self,
        repo: &RepoName,
        since_ms: i64,
    ) -> anyhow::Result<CallWindow> {
        on_pool!(&self.db, p => {
            let row = sqlx::query(
                "SELECT COUNT(*) AS total, MIN(at_ms) AS oldest, \
                 COUNT(CASE WHEN repo = $1 THEN 1 END) AS repo_total, \
                 MIN(CASE WHEN repo = $1 THEN at_ms END) AS repo_oldest \
                 FROM preflight_calls WHERE at_ms >= $2",
            )
            .bind(repo.to_string())
            .bind(since_ms)
            .fetch_one(p)
            .await?;
            Ok(CallWindow {
                total: row.int("total")?,
                oldest_ms: row.opt_int("oldest")?,
                repo_total: row.int("repo_total")?,
                repo_oldest_ms: row.opt_int("repo_oldest")?,
            })
        })
    }
}
