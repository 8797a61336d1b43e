//! The database behind methods that say what they do. SQLite today; the SQL is kept to what
//! PostgreSQL also speaks, so a second backend changes this module and nothing that calls it.

mod migrate;

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::domain::{IssueRef, Lifecycle, RepoName};
use crate::forge::payload::ForgeEvent;
use crate::settings::{StoreSettings, Synchronous};

#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    /// SQLite allows one writer at a time and makes a blocked writer sleep and poll. Taking
    /// this lock around every write transaction queues writers fairly instead.
    write_lock: Arc<tokio::sync::Mutex<()>>,
}

const COLS: &str = "repo, number, title, state, labels, forge_updated_at, last_change_ms, lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, preflight";

/// Rows per multi-row INSERT: 7 bound values each, well under SQLite's variable limit.
const INSERT_CHUNK: usize = 256;

/// A verified, parsed delivery about to be stored.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    pub delivery_id: String,
    pub content_sha256: String,
    pub event: ForgeEvent,
    pub received_at_ms: i64,
}

/// A stored delivery waiting for the consumer.
#[derive(Clone, Debug)]
pub struct StoredDelivery {
    pub seq: i64,
    pub delivery_id: String,
    pub event: ForgeEvent,
}

const RUN_COLS: &str = "id, repo, number, state, branch, base_branch, container_id, pr_number, detail, created_at_ms, started_at_ms, finished_at_ms";

/// One coder run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunRecord {
    pub id: String,
    pub repo: RepoName,
    pub number: u64,
    pub state: String,
    pub branch: String,
    pub base_branch: String,
    pub container_id: Option<String>,
    pub pr_number: Option<u64>,
    pub detail: Option<String>,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
}

impl RunRecord {
    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }
}

fn run_from_row(row: sqlx::sqlite::SqliteRow) -> anyhow::Result<RunRecord> {
    let repo: String = row.try_get("repo")?;
    let number: i64 = row.try_get("number")?;
    let pr: Option<i64> = row.try_get("pr_number")?;
    Ok(RunRecord {
        id: row.try_get("id")?,
        repo: repo.parse().context("stored repository name")?,
        number: u64::try_from(number).context("stored issue number")?,
        state: row.try_get("state")?,
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
    })
}

/// Pre-flight calls within a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallWindow {
    pub total: i64,
    pub oldest_ms: Option<i64>,
    pub repo_total: i64,
    pub repo_oldest_ms: Option<i64>,
}

/// What the director knows of one issue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IssueRecord {
    pub repo: RepoName,
    pub number: u64,
    pub title: String,
    pub state: String,
    pub labels: Vec<String>,
    pub forge_updated_at: Option<String>,
    pub last_change_ms: i64,
    pub lifecycle: Lifecycle,
    pub trigger_present: bool,
    pub trigger_actor: Option<String>,
    /// `None` while who applied the trigger is not resolved.
    pub trigger_trusted: Option<bool>,
    pub untrusted_notice: bool,
    pub preflight: PreflightState,
}

/// The pre-flight's memory of one issue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PreflightState {
    /// Bumped whenever the issue must be read (again); a result for an older revision is
    /// stale and dropped.
    pub rev: i64,
    /// `GO`, `NO-GO`, `WRONG-REPO`, `SKIPPED`, `ERROR`: the last verdict, if any.
    pub verdict: Option<String>,
    pub reason: Option<String>,
    /// SHA-256 of the exact text the verdict was given for.
    pub hash: Option<String>,
    pub model: Option<String>,
    /// Failed reads since the last verdict.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Not before this time (retry backoff, hourly caps).
    pub not_before_ms: Option<i64>,
    /// Where a WRONG-REPO issue was filed (`owner/repo#N`).
    pub routed_to: Option<String>,
    /// The newest comment id whose `/director` command was already acted on.
    pub handled_command_id: u64,
}

impl IssueRecord {
    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }
}

fn to_i64(n: u64) -> anyhow::Result<i64> {
    i64::try_from(n).context("number out of range")
}

impl Store {
    /// Opens (creating if missing) the database and applies pending migrations.
    pub async fn connect(settings: &StoreSettings) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::from_str(&settings.url)
            .with_context(|| format!("store.url `{}` is not a SQLite URL", settings.url))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match settings.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(options)
            .await
            .with_context(|| format!("cannot open the database at {}", settings.url))?;
        migrate::run(&pool).await.context("applying migrations")?;
        Ok(Self {
            pool,
            write_lock: Arc::default(),
        })
    }

    /// Succeeds when the database answers a query.
    pub async fn ping(&self) -> anyhow::Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Stores a batch of deliveries in one transaction (one fsync for the lot). Returns, per
    /// delivery, whether it was new: a known delivery id or the same body seen before is not.
    pub async fn insert_deliveries(&self, batch: &[NewDelivery]) -> anyhow::Result<Vec<bool>> {
        let events = batch
            .iter()
            .map(|d| serde_json::to_string(&d.event))
            .collect::<Result<Vec<_>, _>>()?;
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin().await?;
        let mut inserted: HashSet<String> = HashSet::new();
        for (chunk, events) in batch.chunks(INSERT_CHUNK).zip(events.chunks(INSERT_CHUNK)) {
            let mut sql = String::from(
                "INSERT INTO deliveries \
                 (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms) VALUES ",
            );
            for i in 0..chunk.len() {
                sql.push_str(if i == 0 {
                    "(?, ?, ?, ?, ?, ?, ?)"
                } else {
                    ", (?, ?, ?, ?, ?, ?, ?)"
                });
            }
            sql.push_str(" ON CONFLICT DO NOTHING RETURNING delivery_id");
            let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
            for (d, event) in chunk.iter().zip(events) {
                query = query
                    .bind(&d.delivery_id)
                    .bind(&d.content_sha256)
                    .bind(d.event.kind.as_str())
                    .bind(d.event.issue.repo.to_string())
                    .bind(to_i64(d.event.issue.number)?)
                    .bind(event)
                    .bind(d.received_at_ms);
            }
            inserted.extend(query.fetch_all(&mut *tx).await?);
        }
        tx.commit().await?;
        // A delivery id repeated inside one batch is new only the first time.
        let mut seen = HashSet::new();
        Ok(batch
            .iter()
            .map(|d| inserted.contains(&d.delivery_id) && seen.insert(d.delivery_id.as_str()))
            .collect())
    }

    /// The oldest unprocessed deliveries, in arrival order.
    pub async fn unprocessed_deliveries(&self, limit: u32) -> anyhow::Result<Vec<StoredDelivery>> {
        let rows = sqlx::query(
            "SELECT seq, delivery_id, event FROM deliveries \
             WHERE processed_at_ms IS NULL ORDER BY seq LIMIT ?",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|row| {
                let event: String = row.try_get("event")?;
                Ok(StoredDelivery {
                    seq: row.try_get("seq")?,
                    delivery_id: row.try_get("delivery_id")?,
                    event: serde_json::from_str(&event).context("stored event does not parse")?,
                })
            })
            .collect()
    }

    /// Records the outcome of processing a batch in one transaction: the issues it changed,
    /// and the deliveries it consumed.
    pub async fn commit_processed(
        &self,
        issues: &[IssueRecord],
        seqs: &[i64],
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin().await?;
        for record in issues {
            upsert_issue(&mut tx, record).await?;
        }
        for chunk in seqs.chunks(INSERT_CHUNK) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let sql = format!("UPDATE deliveries SET processed_at_ms = ? WHERE seq IN ({marks})");
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now_ms);
            for seq in chunk {
                query = query.bind(seq);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deliveries stored and not yet processed (answered from the partial index).
    pub async fn pending_deliveries(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM deliveries WHERE processed_at_ms IS NULL")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// (all, unprocessed) delivery counts.
    pub async fn delivery_counts(&self) -> anyhow::Result<(i64, i64)> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS total, \
             COALESCE(SUM(CASE WHEN processed_at_ms IS NULL THEN 1 ELSE 0 END), 0) AS pending \
             FROM deliveries",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("total")?, row.try_get("pending")?))
    }

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

    /// The known records among `issues`, in one query per chunk.
    pub async fn issues(&self, issues: &[IssueRef]) -> anyhow::Result<Vec<IssueRecord>> {
        let mut out = Vec::with_capacity(issues.len());
        for chunk in issues.chunks(INSERT_CHUNK) {
            let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
            let sql = format!("SELECT {COLS} FROM issues WHERE (repo, number) IN (VALUES {pairs})");
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for issue in chunk {
                query = query
                    .bind(issue.repo.to_string())
                    .bind(to_i64(issue.number)?);
            }
            for row in query.fetch_all(&self.pool).await? {
                out.push(issue_from_row(row)?);
            }
        }
        Ok(out)
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

    /// Picked-up issues whose pre-flight may run now, oldest change first.
    pub async fn due_preflights(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE lifecycle = 'pending' \
             AND (preflight_not_before_ms IS NULL OR preflight_not_before_ms <= ?) \
             ORDER BY last_change_ms LIMIT ?"
        )))
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(issue_from_row).collect()
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
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a call to the provider, for the hourly caps.
    pub async fn record_preflight_call(&self, repo: &RepoName, now_ms: i64) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query("INSERT INTO preflight_calls (repo, at_ms) VALUES (?, ?)")
            .bind(repo.to_string())
            .bind(now_ms)
            .execute(&self.pool)
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

    /// Records a new run unless the issue has an active one; `false` when it has.
    pub async fn insert_run(&self, run: &RunRecord) -> anyhow::Result<bool> {
        let _writer = self.write_lock.lock().await;
        let result = sqlx::query(
            "INSERT INTO runs (id, repo, number, state, branch, base_branch, created_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(&run.id)
        .bind(run.repo.to_string())
        .bind(to_i64(run.number)?)
        .bind(&run.state)
        .bind(&run.branch)
        .bind(&run.base_branch)
        .bind(run.created_at_ms)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn update_run(&self, run: &RunRecord) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query(
            "UPDATE runs SET state = ?, base_branch = ?, container_id = ?, pr_number = ?, detail = ?, \
             started_at_ms = ?, finished_at_ms = ? WHERE id = ?",
        )
        .bind(&run.state)
        .bind(&run.base_branch)
        .bind(&run.container_id)
        .bind(run.pr_number.map(to_i64).transpose()?)
        .bind(&run.detail)
        .bind(run.started_at_ms)
        .bind(run.finished_at_ms)
        .bind(&run.id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Runs still launching or running.
    pub async fn active_runs(&self) -> anyhow::Result<Vec<RunRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {RUN_COLS} FROM runs WHERE state IN ('launching', 'running') ORDER BY created_at_ms")))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(run_from_row).collect()
    }

    pub async fn runs_of(&self, issue: &IssueRef) -> anyhow::Result<Vec<RunRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLS} FROM runs WHERE repo = ? AND number = ? ORDER BY created_at_ms"
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

    /// Issues waiting for a run, in queue order.
    pub async fn queued_issues(&self) -> anyhow::Result<Vec<IssueRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLS} FROM issues WHERE lifecycle = 'queued' ORDER BY last_change_ms, repo, number"
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
}

async fn upsert_issue(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    record: &IssueRecord,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO issues (repo, number, title, state, labels, forge_updated_at, last_change_ms, \
         lifecycle, trigger_present, trigger_actor, trigger_trusted, untrusted_notice, \
         preflight, preflight_not_before_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (repo, number) DO UPDATE SET title = excluded.title, \
         state = excluded.state, labels = excluded.labels, \
         forge_updated_at = excluded.forge_updated_at, last_change_ms = excluded.last_change_ms, \
         lifecycle = excluded.lifecycle, trigger_present = excluded.trigger_present, \
         trigger_actor = excluded.trigger_actor, trigger_trusted = excluded.trigger_trusted, \
         untrusted_notice = excluded.untrusted_notice, preflight = excluded.preflight, \
         preflight_not_before_ms = excluded.preflight_not_before_ms",
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
    .execute(&mut **tx)
    .await?;
    Ok(())
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
    })
}
