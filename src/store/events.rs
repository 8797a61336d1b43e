//! Stored events: webhook deliveries, scan observations and executor outcomes, in one table,
//! consumed in arrival order.

use std::collections::HashSet;

use super::backend::{Cols, Marks, params, tuples};
use super::{CHUNK, Store, Tx, to_i64};
use crate::domain::IssueRef;
use crate::event::{Event, SCHEMA_VERSION};

/// An event about to be stored.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    /// Unique: a webhook's delivery id, or a key naming the outcome it reports.
    pub delivery_id: String,
    /// Unique too: Forgejo's "Replay" sends the same body under a new id.
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
}

/// A stored event waiting for the consumer. `event` is the reason when it no longer parses.
#[derive(Clone, Debug)]
pub struct StoredEvent {
    pub seq: i64,
    pub delivery_id: String,
    pub issue: Option<IssueRef>,
    pub event: Result<Event, String>,
}

/// Inserts in `tx`; returns the delivery ids that were new.
pub(super) async fn insert(
    tx: &mut Tx<'_>,
    batch: &[NewDelivery],
) -> anyhow::Result<HashSet<String>> {
    let events = batch
        .iter()
        .map(|d| serde_json::to_string(&d.event))
        .collect::<Result<Vec<_>, _>>()?;
    let mut inserted = HashSet::new();
    for (chunk, events) in batch.chunks(CHUNK).zip(events.chunks(CHUNK)) {
        let sql = format!(
            "INSERT INTO deliveries \
             (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) \
             VALUES {} ON CONFLICT DO NOTHING RETURNING delivery_id",
            tuples(Marks::of(tx), chunk.len(), 8)
        );
        let ids: Vec<String> = on_tx!(&mut *tx, t => {
            let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
            for (d, event) in chunk.iter().zip(events) {
                query = query
                    .bind(&d.delivery_id)
                    .bind(&d.content_sha256)
                    .bind(d.event.kind_str())
                    .bind(d.issue.repo.to_string())
                    .bind(to_i64(d.issue.number)?)
                    .bind(event)
                    .bind(d.received_at_ms)
                    .bind(SCHEMA_VERSION);
            }
            query.fetch_all(&mut **t).await?
        });
        inserted.extend(ids);
    }
    Ok(inserted)
}

pub(super) async fn mark_consumed(
    tx: &mut Tx<'_>,
    seqs: &[i64],
    now_ms: i64,
) -> anyhow::Result<()> {
    for chunk in seqs.chunks(CHUNK) {
        let marks = Marks::of(tx);
        let sql = format!(
            "UPDATE deliveries SET processed_at_ms = {} WHERE seq IN ({})",
            params(marks, 1, 1),
            params(marks, 2, chunk.len())
        );
        on_tx!(&mut *tx, t => {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now_ms);
            for seq in chunk {
                query = query.bind(seq);
            }
            query.execute(&mut **t).await?;
        });
    }
    Ok(())
}

pub(super) async fn set_aside(
    tx: &mut Tx<'_>,
    dead: &[(i64, String)],
    now_ms: i64,
) -> anyhow::Result<()> {
    for (seq, reason) in dead {
        on_tx!(&mut *tx, t => {
            sqlx::query(
                "UPDATE deliveries SET processed_at_ms = $1, dead_reason = $2 WHERE seq = $3",
            )
            .bind(now_ms)
            .bind(reason)
            .bind(seq)
            .execute(&mut **t)
            .await?;
        });
    }
    Ok(())
}

impl Store {
    /// Stores a batch in one transaction (one fsync for the lot). Returns, per delivery,
    /// whether it was new: a known delivery id or the same body seen before is not.
    pub async fn insert_deliveries(&self, batch: &[NewDelivery]) -> anyhow::Result<Vec<bool>> {
        let mut tx = self.begin(true).await?;
        let inserted = insert(&mut tx, batch).await?;
        if !inserted.is_empty() {
            super::notify(&mut tx, super::Work::Events).await?;
        }
        tx.commit().await?;
        // A delivery id repeated inside one batch is new only the first time.
        let mut seen = HashSet::new();
        Ok(batch
            .iter()
            .map(|d| inserted.contains(&d.delivery_id) && seen.insert(d.delivery_id.as_str()))
            .collect())
    }

    /// The oldest unconsumed events, in arrival order.
    pub async fn next_events(&self, limit: u32) -> anyhow::Result<Vec<StoredEvent>> {
        on_pool!(&self.db, p => {
            let rows = sqlx::query(
                "SELECT seq, delivery_id, repo, number, event, schema FROM deliveries \
                 WHERE processed_at_ms IS NULL ORDER BY seq LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(p)
            .await?;
            rows.iter().map(stored_event).collect()
        })
    }

    /// Deliveries stored and not yet processed (answered from the partial index).
    pub async fn pending_deliveries(&self) -> anyhow::Result<i64> {
        Ok(on_pool!(&self.db, p => {
            sqlx::query_scalar("SELECT COUNT(*) FROM deliveries WHERE processed_at_ms IS NULL")
                .fetch_one(p)
                .await?
        }))
    }

    /// (deliveries from the forge and the scan, events of any kind not yet consumed).
    pub async fn delivery_counts(&self) -> anyhow::Result<(i64, i64)> {
        // COUNT, not SUM: a bigint on both backends.
        on_pool!(&self.db, p => {
            let row = sqlx::query(
                "SELECT COUNT(CASE WHEN event_type IN \
                 ('issues', 'issue_label', 'issue_comment', 'pull_request', 'pull_request_comment', \
                 'pull_request_review', 'scan') THEN 1 END) AS total, \
                 COUNT(CASE WHEN processed_at_ms IS NULL THEN 1 END) AS pending \
                 FROM deliveries",
            )
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
    #[cfg(any(test, feature = "fake-forge"))]
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

fn stored_event(row: &impl Cols) -> anyhow::Result<StoredEvent> {
    let repo = row.text("repo")?;
    let number = row.int("number")?;
    let json = row.text("event")?;
    let schema = row.int("schema")?;
    let issue = repo
        .parse()
        .ok()
        .zip(u64::try_from(number).ok())
        .map(|(repo, number)| IssueRef::new(repo, number));
    Ok(StoredEvent {
        seq: row.int("seq")?,
        delivery_id: row.text("delivery_id")?,
        issue,
        event: Event::from_stored(schema, &json),
    })
}
