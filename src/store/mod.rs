//! The database behind methods that say what they do. SQLite today; the SQL is kept to what
//! PostgreSQL also speaks, so a second backend changes this module and nothing that calls it.
//!
//! - `events`: stored deliveries and executor outcomes, consumed in arrival order;
//! - `records`: issues, runs and the pre-flight's cache and call log;
//! - `outbox`: actions, claimed with leases; retention.

mod events;
mod migrate;
mod outbox;
mod records;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use crate::domain::{IssueRecord, PreflightState, RunRecord};
pub use events::{NewDelivery, StoredEvent};
pub use outbox::{ActionRow, ClaimedAction, Finished, Lane, NewAction};
pub use records::CallWindow;

use crate::settings::{StoreSettings, Synchronous};

#[derive(Clone, Debug)]
pub struct Store {
    /// Commits are fsynced (`store.synchronous`): intake and decisions.
    pool: SqlitePool,
    /// The same database without an fsync per commit, for writes whose loss in a power cut is
    /// harmless: claims, attempts and completions of actions (an action lost that way is
    /// performed again, and every action is safe to repeat), the read cache, the call log.
    /// In WAL mode a later fsynced commit makes every earlier one durable too.
    relaxed: SqlitePool,
    /// SQLite allows one writer at a time and makes a blocked writer sleep and poll. Taking
    /// this lock around every write transaction queues writers fairly instead.
    write_lock: Arc<tokio::sync::Mutex<()>>,
    /// Stops the checkpoint task when the last clone of this store is dropped.
    _checkpoints: Arc<tokio_util::sync::DropGuard>,
}

/// Copies the write-ahead log back into the database every 250 ms (as far as readers allow,
/// without waiting for them), off the path of every commit: SQLite's own checkpoint would run
/// inside whichever commit crossed its threshold, a webhook's. Stops with `stop`.
fn spawn_checkpoints(pool: SqlitePool, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&pool)
                .await
            {
                tracing::debug!(%error, "checkpoint did not run");
            }
        }
    });
}

/// Rows per multi-row statement: well under SQLite's variable limit.
const CHUNK: usize = 256;

fn to_i64(n: u64) -> anyhow::Result<i64> {
    i64::try_from(n).context("number out of range")
}

/// Everything one consumer pass decided, committed in one transaction.
#[derive(Debug, Default)]
pub struct Commit {
    pub records: Vec<IssueRecord>,
    pub runs: Vec<RunRecord>,
    pub actions: Vec<NewAction>,
    /// Keys of due actions, not claimed, that are no longer wanted.
    pub retract: Vec<String>,
    /// Stored events now consumed.
    pub consumed: Vec<i64>,
    /// Stored events that do not parse: kept, with the reason, and never read again.
    pub dead: Vec<(i64, String)>,
}

impl Store {
    /// Opens (creating if missing) the database and applies pending migrations.
    pub async fn connect(settings: &StoreSettings) -> anyhow::Result<Self> {
        let options = |sync: SqliteSynchronous| {
            SqliteConnectOptions::from_str(&settings.url)
                .with_context(|| format!("store.url `{}` is not a SQLite URL", settings.url))
                .map(|o| {
                    o.create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .synchronous(sync)
                        .busy_timeout(Duration::from_secs(10))
                        .foreign_keys(true)
                        // A multi-row insert that may skip conflicting rows keeps a statement
                        // journal: in memory, not a temporary file per statement.
                        .pragma("temp_store", "memory")
                        // Checkpoints run in the background (`checkpoints`), never inside a
                        // commit that a webhook is waiting for.
                        .pragma("wal_autocheckpoint", "0")
                        .pragma("journal_size_limit", "67108864")
                })
        };
        let durable = match settings.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(options(durable)?)
            .await
            .with_context(|| format!("cannot open the database at {}", settings.url))?;
        migrate::run(&pool).await.context("applying migrations")?;
        // Its writes are serialised by `write_lock` anyway: one connection, one page cache.
        let relaxed = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(options(SqliteSynchronous::Normal)?)
            .await
            .with_context(|| format!("cannot open the database at {}", settings.url))?;
        let stop = tokio_util::sync::CancellationToken::new();
        spawn_checkpoints(pool.clone(), stop.clone());
        Ok(Self {
            pool,
            relaxed,
            write_lock: Arc::default(),
            _checkpoints: Arc::new(stop.drop_guard()),
        })
    }

    /// This director's id: made once, at random, and kept in the database.
    pub async fn director_id(&self) -> anyhow::Result<String> {
        let fresh = format!("{:08x}", rand::random::<u32>());
        {
            let _writer = self.write_lock.lock().await;
            sqlx::query(
                "INSERT INTO meta (key, value) VALUES ('director_id', ?) ON CONFLICT DO NOTHING",
            )
            .bind(&fresh)
            .execute(&self.pool)
            .await?;
        }
        Ok(
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'director_id'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Succeeds when the database answers a query.
    pub async fn ping(&self) -> anyhow::Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Writes a consumer pass in one transaction: the records and runs it changed, the
    /// actions they call for, the retractions, and the events consumed or set aside. A crash
    /// before the commit replays the events, which decide the same way again.
    pub async fn commit(&self, commit: &Commit, now_ms: i64) -> anyhow::Result<()> {
        self.commit_with(commit, now_ms, true).await
    }

    /// [`Store::commit`], fsynced only when `durable`. A pass decided from stored events alone
    /// need not be: lost in a power cut, the same events replay into the same decisions and
    /// the same action keys, and every action is safe to repeat. A pass that draws something
    /// new (a run id at admission) must be, before anything acts on it.
    pub async fn commit_with(
        &self,
        commit: &Commit,
        now_ms: i64,
        durable: bool,
    ) -> anyhow::Result<()> {
        let _writer = self.write_lock.lock().await;
        let mut tx = if durable {
            self.pool.begin().await?
        } else {
            self.relaxed.begin().await?
        };
        for record in &commit.records {
            records::upsert_issue(&mut tx, record).await?;
        }
        for run in &commit.runs {
            records::upsert_run(&mut tx, run).await?;
        }
        outbox::insert_actions(&mut tx, &commit.actions, now_ms).await?;
        outbox::retract(&mut tx, &commit.retract, now_ms).await?;
        events::mark_consumed(&mut tx, &commit.consumed, now_ms).await?;
        events::set_aside(&mut tx, &commit.dead, now_ms).await?;
        tx.commit().await?;
        Ok(())
    }
}
