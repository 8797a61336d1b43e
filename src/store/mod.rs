//! The database behind methods that say what they do: SQLite (`sqlite://...`, the default,
//! for one process) or PostgreSQL (`postgres://...`, for several replicas sharing it). Both
//! run the same statements (see `backend`); nothing outside this module writes SQL.
//!
//! - `events`: stored deliveries and executor outcomes, consumed in arrival order;
//! - `records`: issues, runs and the pre-flight's cache and call log;
//! - `outbox`: actions, claimed with leases; retention;
//! - `leases`: work that one replica at a time may do (the consumer, a scan period);
//! - `checkpoint`: SQLite's write-ahead log copied back and started over;
//! - `pass`: a consumer pass, on SQLite whole on a connection of its own;
//! - `statement`: a statement and its values, run by sqlx or by rusqlite;
//! - `writer`: intake's own SQLite connection.

#[macro_use]
mod backend;
mod baselines;
mod checkpoint;
mod events;
mod filers;
mod leases;
mod migrate;
mod outbox;
mod outcomes;
mod pass;
mod records;
mod run_start;
mod statement;
mod transcripts;
mod usage;
mod writer;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions as _, SqlitePool};

pub use crate::domain::{IssueRecord, PreflightState, RunRecord};
pub use events::{NewDelivery, ReadyDelivery, StoredEvent};
pub use leases::Fence;
pub use outbox::{ActionRow, ClaimedAction, DueNow, Finished, Lane, NewAction};
pub use pass::{PassInput, Passed};
pub use records::CallWindow;
pub use transcripts::Transcript;
pub use usage::RunUsage;
pub use writer::DeliveryWriter;

use crate::domain::RunId;
use crate::settings::{StoreSettings, StoreUrl, Synchronous};
use backend::Backend;

#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    /// False from a failed health check until one succeeds (see [`Store::monitor`]).
    up: Arc<std::sync::atomic::AtomicBool>,
}

/// Which database, and what it needs.
#[derive(Clone, Debug)]
pub(crate) enum Db {
    Sqlite(Sqlite),
    Postgres(Postgres),
}

#[derive(Clone, Debug)]
pub(crate) struct Postgres {
    pub(crate) pool: PgPool,
}

#[derive(Clone, Debug)]
pub(crate) struct Sqlite {
    /// Commits are fsynced (`store.synchronous`): intake and decisions.
    pub(crate) pool: SqlitePool,
    /// The same database without an fsync per commit, for writes whose loss in a power cut is
    /// harmless: claims, attempts and completions of actions (an action lost that way is
    /// performed again, and every action is safe to repeat), the read cache, the call log.
    /// In WAL mode a later fsynced commit makes every earlier one durable too.
    relaxed: SqlitePool,
    /// SQLite allows one writer at a time and makes a blocked writer sleep and poll. Taking
    /// this lock around every write transaction queues writers fairly instead.
    write_lock: Arc<tokio::sync::Mutex<()>>,
    /// The database file and its `store.synchronous`, for intake's own connection.
    path: std::path::PathBuf,
    synchronous: Synchronous,
    /// What intake stored last, for the consumer to take without reading it back.
    recent: Arc<events::RecentEvents>,
    /// The consumer's own connection, opened on its first pass (see `pass`).
    pass: Arc<std::sync::Mutex<Option<pass::PassConnection>>>,
    /// Stops the checkpoint task when the last clone of this store is dropped.
    _checkpoints: Arc<tokio_util::sync::DropGuard>,
}

/// A write transaction on either backend (on SQLite, holding the writer's turn).
pub(crate) enum Tx<'a> {
    Sqlite(
        sqlx::Transaction<'static, sqlx::Sqlite>,
        tokio::sync::MutexGuard<'a, ()>,
    ),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl Tx<'_> {
    pub(crate) async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(tx, _turn) => tx.commit().await?,
            Self::Postgres(tx) => tx.commit().await?,
        }
        Ok(())
    }
}

pub use crate::settings::masked_url;

/// Set on every SQLite connection, the pool's and intake's own ([`DeliveryWriter`]), besides
/// WAL, `store.synchronous` and foreign keys.
const PRAGMAS: [(&str, &str); 3] = [
    // A multi-row insert that may skip conflicting rows keeps a statement journal: in
    // memory, not a temporary file per statement.
    ("temp_store", "memory"),
    // Checkpoints run in the background (`checkpoint`), never inside a commit that a
    // webhook is waiting for.
    ("wal_autocheckpoint", "0"),
    // Above what the log grows to between restarts (`checkpoint::RESTART_AT`), so that its
    // file is written over rather than cut back and grown again.
    ("journal_size_limit", "134217728"),
];

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
    /// Stored events now consumed: with `dead`, the whole of what one read of
    /// [`Store::next_events`] returned (events are consumed in arrival order).
    pub consumed: Vec<i64>,
    /// Stored events that do not parse: kept, with the reason, and never read again.
    pub dead: Vec<(i64, String)>,
    /// Committed only while this lease is still held (the consumer's, with several replicas).
    pub fence: Option<Fence>,
}

/// What another replica may have to do after a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Stored events for the consumer.
    Events,
    /// New actions for the executors.
    Actions,
    /// Runs changed, for the watchers.
    Runs,
}

impl Work {
    fn as_str(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::Actions => "actions",
            Self::Runs => "runs",
        }
    }
}

/// The channel replicas tell each other about new work on.
const CHANNEL: &str = "director_work";

/// Tells every replica listening, when `tx` commits, that there is `work` (PostgreSQL's
/// `NOTIFY`: delivered on commit, once per distinct payload). One process needs no telling.
pub(crate) async fn notify(tx: &mut Tx<'_>, work: Work) -> anyhow::Result<()> {
    if let Tx::Postgres(t) = tx {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(work.as_str())
            .execute(&mut **t)
            .await?;
    }
    Ok(())
}

/// Who to wake when another replica committed work.
#[derive(Clone, Default)]
pub struct Listeners {
    pub events: Option<Arc<tokio::sync::Notify>>,
    pub actions: Option<Arc<tokio::sync::Notify>>,
    pub runs: Option<Arc<tokio::sync::Notify>>,
}

impl Listeners {
    fn wake(&self, work: Option<Work>) {
        let all = [
            (Work::Events, &self.events),
            (Work::Actions, &self.actions),
            (Work::Runs, &self.runs),
        ];
        for (w, n) in all {
            if (work.is_none() || work == Some(w))
                && let Some(n) = n
            {
                n.notify_one();
            }
        }
    }
}

/// An error message with the URL's password, if it appears, replaced.
fn redact_error(message: &str, url: &str) -> String {
    match reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        Some(p) if !p.is_empty() => message.replace(&p, "***"),
        _ => message.to_owned(),
    }
}

impl Store {
    /// Opens the database named by `store.url` and applies pending migrations: SQLite
    /// (created if missing) or PostgreSQL. A bad or unreachable URL fails naming the key,
    /// never showing its password.
    pub async fn connect(settings: &StoreSettings) -> anyhow::Result<Self> {
        match settings.location()? {
            StoreUrl::Postgres(url) => Self::connect_postgres(url.expose()).await,
            StoreUrl::Sqlite(_) => Self::connect_sqlite(settings).await,
        }
    }

    async fn connect_postgres(url: &str) -> anyhow::Result<Self> {
        let shown = masked_url(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| anyhow::anyhow!("store.url `{shown}` is not a PostgreSQL URL"))?
            // Statements are logged at debug only: parameters never are.
            .log_statements(tracing::log::LevelFilter::Debug);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "store.url: cannot connect to the database at `{shown}`: {}",
                    redact_error(&e.to_string(), url)
                )
            })?;
        migrate::run_postgres(&pool)
            .await
            .context("applying migrations")?;
        Ok(Self {
            db: Db::Postgres(Postgres { pool }),
            up: Arc::new(true.into()),
        })
    }

    /// Whether this store is shared by several replicas (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }

    /// Wakes `listeners` whenever any replica commits work for them, until `stop`. A
    /// connection lost and made again wakes them all (a notification may have been missed).
    /// Nothing to do on SQLite: this process made all the work itself.
    pub fn listen(&self, listeners: Listeners, stop: tokio_util::sync::CancellationToken) {
        let Db::Postgres(pg) = &self.db else {
            return;
        };
        let pool = pg.pool.clone();
        tokio::spawn(async move {
            loop {
                let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(l) => l,
                    Err(error) => {
                        tracing::debug!(%error, "cannot listen for other replicas' work yet");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                        }
                    }
                };
                if listener.listen(CHANNEL).await.is_err() {
                    continue;
                }
                listeners.wake(None);
                loop {
                    let note = tokio::select! {
                        _ = stop.cancelled() => return,
                        note = listener.try_recv() => note,
                    };
                    match note {
                        Ok(Some(n)) => listeners.wake(match n.payload() {
                            "events" => Some(Work::Events),
                            "actions" => Some(Work::Actions),
                            "runs" => Some(Work::Runs),
                            _ => None,
                        }),
                        // The connection was lost; it is made again on the next receive.
                        Ok(None) => listeners.wake(None),
                        Err(_) => break,
                    }
                }
            }
        });
    }

    /// A write transaction; on SQLite `durable` picks the fsynced connection (PostgreSQL
    /// commits are always durable).
    pub(crate) async fn begin(&self, durable: bool) -> anyhow::Result<Tx<'_>> {
        Ok(match &self.db {
            Db::Sqlite(s) => {
                let turn = s.write_lock.lock().await;
                let tx = if durable {
                    s.pool.begin().await?
                } else {
                    s.relaxed.begin().await?
                };
                Tx::Sqlite(tx, turn)
            }
            Db::Postgres(pg) => Tx::Postgres(pg.pool.begin().await?),
        })
    }

    async fn connect_sqlite(settings: &StoreSettings) -> anyhow::Result<Self> {
        let options = |sync: SqliteSynchronous| {
            SqliteConnectOptions::from_str(&settings.url)
                .with_context(|| {
                    format!(
                        "store.url `{}` is not a SQLite URL",
                        masked_url(&settings.url)
                    )
                })
                .map(|o| {
                    o.create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .synchronous(sync)
                        .busy_timeout(Duration::from_secs(10))
                        .foreign_keys(true)
                })
                .map(|o| {
                    PRAGMAS
                        .iter()
                        .fold(o, |o, (key, value)| o.pragma(*key, *value))
                })
        };
        let durable = match settings.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
        };
        let durable_options = options(durable)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(durable_options.clone())
            .await
            .with_context(|| {
                format!(
                    "store.url: cannot open the database at {}",
                    masked_url(&settings.url)
                )
            })?;
        migrate::run_sqlite(&pool)
            .await
            .context("applying migrations")?;
        // Its writes are serialised by `write_lock` anyway: one connection, one page cache.
        let relaxed = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(options(SqliteSynchronous::Normal)?)
            .await
            .with_context(|| {
                format!(
                    "store.url: cannot open the database at {}",
                    masked_url(&settings.url)
                )
            })?;
        let path = durable_options.get_filename().to_path_buf();
        let write_lock = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let reopen = {
            let (path, synchronous, write_lock) =
                (path.clone(), settings.synchronous, Arc::clone(&write_lock));
            move || checkpoint::Checkpoints::open(&path, synchronous, Arc::clone(&write_lock))
        };
        checkpoint::spawn(reopen()?, reopen, stop.clone());
        Ok(Self {
            db: Db::Sqlite(Sqlite {
                path,
                synchronous: settings.synchronous,
                recent: Arc::default(),
                pass: Arc::default(),
                pool,
                relaxed,
                write_lock,
                _checkpoints: Arc::new(stop.drop_guard()),
            }),
            up: Arc::new(true.into()),
        })
    }

    /// On SQLite, a connection of intake's own for [`DeliveryWriter::insert`], taking the
    /// same write turn as every other writer. `None` on PostgreSQL, whose pool serves
    /// intake well (see [`Store::insert_deliveries`]).
    pub fn delivery_writer(&self) -> anyhow::Result<Option<DeliveryWriter>> {
        match &self.db {
            Db::Sqlite(s) => DeliveryWriter::open(
                &s.path,
                s.synchronous,
                s.write_lock.clone(),
                s.recent.clone(),
            )
            .map(Some),
            Db::Postgres(_) => Ok(None),
        }
    }

    /// A write outside a consumer pass that may go without an fsync on SQLite (claims,
    /// attempts, the read cache): see [`Sqlite::relaxed`].
    pub(crate) async fn relaxed(&self) -> anyhow::Result<Tx<'_>> {
        self.begin(false).await
    }

    /// This director's id: made once, at random, and kept in the database.
    /// Replicas sharing a PostgreSQL database share it: they are one director.
    pub async fn director_id(&self) -> anyhow::Result<String> {
        self.made_once("director_id", format!("{:08x}", rand::random::<u32>()))
            .await
    }

    /// The key run proxy passwords are made with: made once, at random, and kept in the
    /// database, so every replica checks the same passwords, also after a restart.
    pub async fn egress_key(&self) -> anyhow::Result<Vec<u8>> {
        let key = self
            .made_once("egress_key", hex::encode(rand::random::<[u8; 32]>()))
            .await?;
        hex::decode(key).map_err(|e| anyhow::anyhow!("the stored egress key is not hex: {e}"))
    }

    /// The value kept under `key`: `fresh` if none was (the first writer wins, durably).
    async fn made_once(&self, key: &str, fresh: String) -> anyhow::Result<String> {
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(key)
                .bind(&fresh)
                .execute(&mut **t)
                .await?;
        });
        tx.commit().await?;
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
                .bind(key)
                .fetch_one(p)
                .await?
        }))
    }

    /// Adds to the egress refusals of runs: (run id, `host:port`) → how many more.
    pub async fn add_egress_refusals(
        &self,
        refusals: &std::collections::BTreeMap<(RunId, String), u32>,
    ) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        for ((run_id, destination), n) in refusals {
            on_tx!(&mut tx, t => {
                sqlx::query(
                    "INSERT INTO egress_refusals (run_id, destination, count) VALUES ($1, $2, $3) \
                     ON CONFLICT (run_id, destination) DO UPDATE \
                     SET count = egress_refusals.count + excluded.count",
                )
                .bind(run_id.as_str())
                .bind(destination)
                .bind(i64::from(*n))
                .execute(&mut **t)
                .await?;
            });
        }
        tx.commit().await
    }

    /// What the egress proxy refused the run: (`host:port`, how many times), most first.
    /// (The proxy's [`crate::egress::proxy::Ledger`] is the store.)
    pub async fn egress_refusals(&self, run_id: &RunId) -> anyhow::Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT destination, count FROM egress_refusals WHERE run_id = $1 \
                 ORDER BY count DESC, destination",
            )
            .bind(run_id.as_str())
            .fetch_all(p)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(d, n)| (d, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    /// Whether the database answered the last health check: errors while it does not are
    /// the outage, already reported once, and need not be logged as new failures.
    pub fn is_up(&self) -> bool {
        self.up.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checks every `every` that the database answers, until `stop`; an outage is logged
    /// once when it starts and once when it ends, and shown by `on_change(up)` (the metrics).
    pub fn monitor(
        &self,
        every: Duration,
        on_change: impl Fn(bool) + Send + 'static,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let answered = tokio::time::timeout(Duration::from_secs(5), store.ping()).await;
                let now_up = matches!(answered, Ok(Ok(())));
                let was_up = store.up.swap(now_up, std::sync::atomic::Ordering::Relaxed);
                match (was_up, now_up) {
                    (true, false) => {
                        let why = match answered {
                            Ok(Err(e)) => format!("{e:#}"),
                            _ => "no answer within 5 s".to_owned(),
                        };
                        tracing::error!(error = %why, "the database is unreachable: intake answers 503 and no work is claimed until it returns");
                        on_change(false);
                    }
                    (false, true) => {
                        tracing::info!("the database answers again; work resumes");
                        on_change(true);
                    }
                    _ => {}
                }
            }
        });
    }

    /// A fact kept in the database (`meta`), if set.
    pub async fn meta(&self, key: &str) -> anyhow::Result<Option<String>> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
                .bind(key)
                .fetch_optional(p)
                .await?
        }))
    }

    pub async fn set_meta(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO meta (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .bind(key)
            .bind(value)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// Succeeds when the database answers a query.
    pub async fn ping(&self) -> anyhow::Result<()> {
        on_pool!(&self.db, p => {
            sqlx::query("SELECT 1").execute(p).await?;
        });
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
        let statements = commit_statements(commit, now_ms, Backend::of(&self.db))?;
        let mut tx = self.begin(durable).await?;
        for statement in statements {
            statement.execute(&mut tx).await?;
        }
        if !commit.actions.is_empty() {
            notify(&mut tx, Work::Actions).await?;
        }
        if !commit.runs.is_empty() {
            notify(&mut tx, Work::Runs).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// What committing `commit` writes, in order: the fence's renewal, which fails the commit if
/// the lease was lost; the records and runs; the actions and retractions; the events consumed
/// and set aside. The same statements whichever driver runs them (`pass`).
fn commit_statements(
    commit: &Commit,
    now_ms: i64,
    backend: Backend,
) -> anyhow::Result<Vec<statement::Statement>> {
    let marks = backend.marks();
    let mut all = Vec::new();
    if let Some(fence) = &commit.fence {
        all.push(leases::check_fence(fence, now_ms));
    }
    all.extend(records::upsert_issues(&commit.records, marks)?);
    for run in &commit.runs {
        all.push(records::upsert_run(run)?);
    }
    all.extend(outbox::insert_actions(&commit.actions, now_ms, marks)?);
    all.extend(outbox::retract(&commit.retract, now_ms, marks));
    all.extend(events::consume(
        &commit.consumed,
        &commit.dead,
        now_ms,
        backend,
    )?);
    Ok(all)
}

#[async_trait::async_trait]
impl crate::egress::proxy::Ledger for Store {
    async fn active(&self, run_id: &RunId) -> Option<Vec<crate::egress::Entry>> {
        let run = self.run(run_id).await.ok()??;
        if run.finished_at_ms.is_some() {
            return None;
        }
        // What writers approved in its issue's thread (`/director allow`), for this issue's
        // runs alone; read now, so an approval reaches a run already going. An issue that
        // cannot be read adds nothing.
        let approved = match self.issue(&run.issue_ref()).await {
            Ok(Some(issue)) => issue.thread.egress_allowed,
            _ => Vec::new(),
        };
        // Checked against the ceiling when the file was read; one that no longer parses
        // (it cannot, short of a hand-edited row) opens nothing.
        Some(
            run.settings
                .map(|s| s.egress_allow)
                .unwrap_or_default()
                .iter()
                .chain(approved.iter())
                .filter_map(|e| e.parse().ok())
                .collect(),
        )
    }

    async fn active_setup(&self, run_id: &RunId) -> Option<Vec<crate::egress::Entry>> {
        let run = self.run(run_id).await.ok()??;
        if !run.setup_open() {
            return None;
        }
        let settings = run.settings?;
        let setup = settings.setup.as_ref()?;
        Some(
            settings
                .egress_allow
                .iter()
                .chain(&setup.egress_allow)
                .filter_map(|e| e.parse().ok())
                .collect(),
        )
    }

    async fn add_refusals(
        &self,
        refusals: &std::collections::BTreeMap<(RunId, String), u32>,
    ) -> anyhow::Result<()> {
        self.add_egress_refusals(refusals).await
    }
}
