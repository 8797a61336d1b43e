//! Stored events: webhook deliveries, scan observations and executor outcomes, in one table,
//! consumed in arrival order.

use std::collections::{BTreeMap, HashSet};

use super::backend::{Backend, Cols, Marks, params, tuples};
use super::statement::Statement;
use super::{CHUNK, Db, Store, Tx, to_i64};
use crate::domain::IssueRef;
use crate::event::{Event, SCHEMA_VERSION};

/// An event about to be stored.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    /// A webhook's delivery id, or a key naming the outcome it reports: for logs.
    pub delivery_id: String,
    /// The dedupe key: SHA-256 of the body (Forgejo's "Replay" sends the same body under a
    /// new id), or of an internal event's id. The same key twice is one delivery.
    pub content_sha256: String,
    pub issue: IssueRef,
    pub event: Event,
    pub received_at_ms: i64,
}

impl NewDelivery {
    /// An event the director itself produced, named by `id` (stored once, however often sent).
    pub fn internal(id: String, issue: IssueRef, event: Event, now_ms: i64) -> Self {
        use sha2::Digest;
        Self {
            content_sha256: hex::encode(sha2::Sha256::digest(id.as_bytes())),
            delivery_id: id,
            issue,
            event,
            received_at_ms: now_ms,
        }
    }

    /// Renders the row's values. Fails only for an issue number past `i64`.
    pub fn ready(self) -> anyhow::Result<ReadyDelivery> {
        Ok(ReadyDelivery {
            event_json: serde_json::to_string(&self.event)?,
            repo: self.issue.repo.to_string(),
            number: to_i64(self.issue.number)?,
            delivery: self,
        })
    }
}

/// A delivery with its row's values made ready: the event rendered as JSON once, by the
/// caller (a webhook handler, on the HTTP workers), so that the one writer that stores many of
/// them ([`super::DeliveryWriter`]) only binds values.
#[derive(Debug)]
pub struct ReadyDelivery {
    pub(super) delivery: NewDelivery,
    pub(super) event_json: String,
    pub(super) repo: String,
    pub(super) number: i64,
}

/// How many events [`RecentEvents`] holds at most.
const RECENT_MAX: usize = 1024;

/// Events intake stored moments ago, by `seq`, so that the consumer takes them as they are
/// instead of reading each row back and parsing its JSON again (SQLite). Only a cache: an
/// event not here (the cache was full, the process restarted, a pass failed and reads again)
/// is read from the database, which stays what counts. Intake's events are webhook facts,
/// which read back from their JSON as the same event (a property test in `forge::payload`).
#[derive(Debug, Default)]
pub(crate) struct RecentEvents(std::sync::Mutex<BTreeMap<i64, Event>>);

impl RecentEvents {
    /// Keeps `events` (stored and committed under these `seq`s) while there is room.
    pub(super) fn keep(&self, events: impl IntoIterator<Item = (i64, Event)>) {
        let mut recent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (seq, event) in events {
            if recent.len() >= RECENT_MAX {
                break;
            }
            recent.insert(seq, event);
        }
    }

    /// The first and last `seq` held, if any.
    pub(super) fn span(&self) -> Option<(i64, i64)> {
        let recent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Some((*recent.keys().next()?, *recent.keys().next_back()?))
    }

    /// Takes what is held up to `last`, the end of a batch read in `seq` order: the rest of
    /// it was consumed before.
    pub(super) fn take_through(&self, last: i64) -> BTreeMap<i64, Event> {
        let mut recent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let later = recent.split_off(&last.saturating_add(1));
        std::mem::replace(&mut *recent, later)
    }
}

/// A stored event waiting for the consumer. `event` is the reason when it no longer parses.
#[derive(Clone, Debug)]
pub struct StoredEvent {
    pub seq: i64,
    pub delivery_id: String,
    pub issue: Option<IssueRef>,
    pub event: Result<Event, String>,
}

/// Inserts in `tx`; returns the content hashes that were new.
pub(super) async fn insert(
    tx: &mut Tx<'_>,
    batch: &[ReadyDelivery],
) -> anyhow::Result<HashSet<String>> {
    let mut inserted = HashSet::new();
    for chunk in batch.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO deliveries \
             (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) \
             VALUES {} ON CONFLICT DO NOTHING RETURNING content_sha256",
            tuples(Marks::of(tx), chunk.len(), 8)
        );
        let keys: Vec<String> = on_tx!(&mut *tx, t => {
            let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
            for d in chunk {
                query = query
                    .bind(&d.delivery.delivery_id)
                    .bind(&d.delivery.content_sha256)
                    .bind(d.delivery.event.kind_str())
                    .bind(&d.repo)
                    .bind(d.number)
                    .bind(&d.event_json)
                    .bind(d.delivery.received_at_ms)
                    .bind(SCHEMA_VERSION);
            }
            query.fetch_all(&mut **t).await?
        });
        inserted.extend(keys);
    }
    Ok(inserted)
}

/// Makes each delivery's row values ready.
pub(super) fn ready_all(batch: &[NewDelivery]) -> anyhow::Result<Vec<ReadyDelivery>> {
    batch.iter().cloned().map(NewDelivery::ready).collect()
}

/// Which stored events are still to consume: on SQLite those above the consumer's mark, on
/// PostgreSQL those not marked processed (see `migrations/sqlite/0010_consumer_mark.sql`).
pub(super) fn unconsumed(db: &Db) -> &'static str {
    match db {
        Db::Sqlite(_) => "seq > (SELECT seq FROM consumer_mark)",
        Db::Postgres(_) => "processed_at_ms IS NULL",
    }
}

/// Consumes `seqs` and sets `dead` aside (kept with the reason, never read again). Events are
/// consumed in arrival order, every event of a batch either consumed or set aside: on SQLite
/// that moves the consumer's mark to the batch's last event, and only if together they are
/// exactly the events after the mark; otherwise (another consumer moved it meanwhile, or a
/// gap) it fails, nothing is committed, and the events are read again. On PostgreSQL each
/// row is marked.
pub(super) fn consume(
    seqs: &[i64],
    dead: &[(i64, String)],
    now_ms: i64,
    backend: Backend,
) -> anyhow::Result<Vec<Statement>> {
    let mut statements: Vec<Statement> = dead
        .iter()
        .map(|(seq, reason)| {
            Statement::new(
                "UPDATE deliveries SET processed_at_ms = $1, dead_reason = $2 WHERE seq = $3",
            )
            .bind(now_ms)
            .bind(reason)
            .bind(*seq)
        })
        .collect();
    match backend {
        Backend::Sqlite => {
            let all: std::collections::BTreeSet<i64> = seqs
                .iter()
                .chain(dead.iter().map(|(seq, _)| seq))
                .copied()
                .collect();
            let (Some(first), Some(last)) = (all.first(), all.last()) else {
                return Ok(statements);
            };
            // Every event from the mark to `last` must be among them: consumed in order.
            statements.push(
                Statement::new(
                    "UPDATE consumer_mark SET seq = $1 WHERE id = 1 AND seq < $2 \
                     AND (SELECT COUNT(*) FROM deliveries \
                          WHERE seq > consumer_mark.seq AND seq <= $1) = $3",
                )
                .bind(*last)
                .bind(*first)
                .bind(i64::try_from(all.len())?)
                .or_fail(format!(
                    "events {first} to {last} are not the next to consume, in order \
                     (another consumer on this database?)"
                )),
            );
        }
        Backend::Postgres => {
            for chunk in seqs.chunks(CHUNK) {
                let mut statement = Statement::new(format!(
                    "UPDATE deliveries SET processed_at_ms = $1 WHERE seq IN ({})",
                    params(Marks::Numbered, 2, chunk.len())
                ))
                .bind(now_ms);
                for seq in chunk {
                    statement.push(*seq);
                }
                statements.push(statement);
            }
        }
    }
    Ok(statements)
}

impl Store {
    /// Stores a batch in one transaction (one fsync for the lot). Returns, per delivery,
    /// whether it was new: one whose content hash was seen before is not.
    pub async fn insert_deliveries(&self, batch: &[NewDelivery]) -> anyhow::Result<Vec<bool>> {
        self.insert_ready(&ready_all(batch)?).await
    }

    /// [`Store::insert_deliveries`] of rows made ready by the caller.
    pub async fn insert_ready(&self, batch: &[ReadyDelivery]) -> anyhow::Result<Vec<bool>> {
        let mut tx = self.begin(true).await?;
        let inserted = insert(&mut tx, batch).await?;
        if !inserted.is_empty() {
            super::notify(&mut tx, super::Work::Events).await?;
        }
        tx.commit().await?;
        // A content hash repeated inside one batch is new only the first time.
        let mut seen = HashSet::new();
        Ok(batch
            .iter()
            .map(|d| {
                let key = d.delivery.content_sha256.as_str();
                inserted.contains(key) && seen.insert(key)
            })
            .collect())
    }

    /// The oldest unconsumed events, in arrival order.
    pub async fn next_events(&self, limit: u32) -> anyhow::Result<Vec<StoredEvent>> {
        if let Db::Sqlite(s) = &self.db {
            return s.on_own_connection(move |c| c.next_events(limit)).await;
        }
        let sql = format!(
            "SELECT seq, delivery_id, repo, number, event, schema FROM deliveries \
             WHERE {} ORDER BY seq LIMIT $1",
            unconsumed(&self.db)
        );
        on_pool!(&self.db, p => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(i64::from(limit))
                .fetch_all(p)
                .await?;
            rows.iter()
                .map(|r| stored_event(r, Event::from_stored(r.int("schema")?, &r.text("event")?)))
                .collect()
        })
    }

    /// Events stored and not yet consumed (a range of `seq` on SQLite, the partial index on
    /// PostgreSQL).
    pub async fn pending_deliveries(&self) -> anyhow::Result<i64> {
        let sql = format!(
            "SELECT COUNT(*) FROM deliveries WHERE {}",
            unconsumed(&self.db)
        );
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(p)
                .await?
        }))
    }

    /// (deliveries from the forge and the scan, events of any kind not yet consumed).
    pub async fn delivery_counts(&self) -> anyhow::Result<(i64, i64)> {
        // COUNT, not SUM: a bigint on both backends.
        let sql = format!(
            "SELECT COUNT(CASE WHEN event_type IN \
             ('issues', 'issue_label', 'issue_comment', 'pull_request', 'pull_request_comment', \
             'pull_request_review', 'scan') THEN 1 END) AS total, \
             COUNT(CASE WHEN {} THEN 1 END) AS pending \
             FROM deliveries",
            unconsumed(&self.db)
        );
        on_pool!(&self.db, p => {
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_one(p)
            .await?;
            Ok((row.int("total")?, row.int("pending")?))
        })
    }

    /// Stored events set aside because they no longer parse: (delivery id, reason).
    pub async fn dead_events(&self) -> anyhow::Result<Vec<(String, String)>> {
        on_pool!(&self.db, p => {
            let rows = sqlx::query(
                "SELECT delivery_id, dead_reason FROM deliveries WHERE dead_reason IS NOT NULL ORDER BY seq",
            )
            .fetch_all(p)
            .await?;
            rows.iter()
                .map(|r| Ok((r.text("delivery_id")?, r.text("dead_reason")?)))
                .collect()
        })
    }

    /// Stores a raw event row as an older or foreign writer might have (tests of set-aside).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn insert_raw_event(
        &self,
        delivery_id: &str,
        issue: &IssueRef,
        schema: i64,
        json: &str,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let mut tx = self.begin(true).await?;
        on_tx!(&mut tx, t => {
            sqlx::query(
                "INSERT INTO deliveries (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) \
                 VALUES ($1, $2, 'raw', $3, $4, $5, $6, $7)",
            )
            .bind(delivery_id)
            .bind(delivery_id)
            .bind(issue.repo.to_string())
            .bind(to_i64(issue.number)?)
            .bind(json)
            .bind(now_ms)
            .bind(schema)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }
}

pub(super) fn stored_event(
    row: &dyn Cols,
    event: Result<Event, String>,
) -> anyhow::Result<StoredEvent> {
    let repo = row.text("repo")?;
    let number = row.int("number")?;
    let issue = repo
        .parse()
        .ok()
        .zip(u64::try_from(number).ok())
        .map(|(repo, number)| IssueRef::new(repo, number));
    Ok(StoredEvent {
        seq: row.int("seq")?,
        delivery_id: row.text("delivery_id")?,
        issue,
        event,
    })
}
