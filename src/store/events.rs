//! Stored events: webhook deliveries, scan observations and executor outcomes, in one table,
//! consumed in arrival order.

use std::collections::HashSet;

use anyhow::Context;
use sqlx::Row;

use super::{CHUNK, Store, to_i64};
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

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

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
        let mut sql = String::from(
            "INSERT INTO deliveries \
             (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) VALUES ",
        );
        for i in 0..chunk.len() {
            sql.push_str(if i == 0 {
                "(?, ?, ?, ?, ?, ?, ?, ?)"
            } else {
                ", (?, ?, ?, ?, ?, ?, ?, ?)"
            });
        }
        sql.push_str(" ON CONFLICT DO NOTHING RETURNING delivery_id");
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
        inserted.extend(query.fetch_all(&mut **tx).await?);
    }
    Ok(inserted)
}

pub(super) async fn mark_consumed(
    tx: &mut Tx<'_>,
    seqs: &[i64],
    now_ms: i64,
) -> anyhow::Result<()> {
    for chunk in seqs.chunks(CHUNK) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!("UPDATE deliveries SET processed_at_ms = ? WHERE seq IN ({marks})");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now_ms);
        for seq in chunk {
            query = query.bind(seq);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

pub(super) async fn set_aside(
    tx: &mut Tx<'_>,
    dead: &[(i64, String)],
    now_ms: i64,
) -> anyhow::Result<()> {
    for (seq, reason) in dead {
        sqlx::query("UPDATE deliveries SET processed_at_ms = ?, dead_reason = ? WHERE seq = ?")
            .bind(now_ms)
            .bind(reason)
            .bind(seq)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

impl Store {
    /// Stores a batch in one transaction (one fsync for the lot). Returns, per delivery,
    /// whether it was new: a known delivery id or the same body seen before is not.
    pub async fn insert_deliveries(&self, batch: &[NewDelivery]) -> anyhow::Result<Vec<bool>> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin().await?;
        let inserted = insert(&mut tx, batch).await?;
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
        let rows = sqlx::query(
            "SELECT seq, delivery_id, repo, number, event, schema FROM deliveries \
             WHERE processed_at_ms IS NULL ORDER BY seq LIMIT ?",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|row| {
                let repo: String = row.try_get("repo")?;
                let number: i64 = row.try_get("number")?;
                let json: String = row.try_get("event")?;
                let schema: i64 = row.try_get("schema")?;
                let issue = repo
                    .parse()
                    .ok()
                    .zip(u64::try_from(number).ok())
                    .map(|(repo, number)| IssueRef::new(repo, number));
                Ok(StoredEvent {
                    seq: row.try_get("seq")?,
                    delivery_id: row.try_get("delivery_id")?,
                    issue,
                    event: Event::from_stored(schema, &json),
                })
            })
            .collect()
    }

    /// Deliveries stored and not yet processed (answered from the partial index).
    pub async fn pending_deliveries(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM deliveries WHERE processed_at_ms IS NULL")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// (deliveries from the forge and the scan, events of any kind not yet consumed).
    pub async fn delivery_counts(&self) -> anyhow::Result<(i64, i64)> {
        let row = sqlx::query(
            "SELECT COALESCE(SUM(CASE WHEN event_type IN \
             ('issues', 'issue_label', 'issue_comment', 'pull_request', 'scan') THEN 1 ELSE 0 END), 0) AS total, \
             COALESCE(SUM(CASE WHEN processed_at_ms IS NULL THEN 1 ELSE 0 END), 0) AS pending \
             FROM deliveries",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("total")?, row.try_get("pending")?))
    }

    /// Stored events set aside because they no longer parse: (delivery id, reason).
    pub async fn dead_events(&self) -> anyhow::Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT delivery_id, dead_reason FROM deliveries WHERE dead_reason IS NOT NULL ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("delivery_id")?, r.try_get("dead_reason")?)))
            .collect::<Result<_, sqlx::Error>>()
            .context("reading set-aside events")
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
        let _writer = self.write_lock.lock().await;
        sqlx::query(
            "INSERT INTO deliveries (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) \
             VALUES (?, ?, 'raw', ?, ?, ?, ?, ?)",
        )
        .bind(delivery_id)
        .bind(delivery_id)
        .bind(issue.repo.to_string())
        .bind(to_i64(issue.number)?)
        .bind(json)
        .bind(now_ms)
        .bind(schema)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
