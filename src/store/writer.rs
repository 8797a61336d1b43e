//! Intake's own SQLite connection, driven from a thread of its own.
//!
//! Through the pool every statement of a delivery batch was a round trip to a connection's
//! worker thread, scheduled between the consumer's work on the same runtime, with the rows
//! of `RETURNING` sent back one by one: a batch spent most of its time waiting between
//! threads rather than in SQLite. This connection is used by one blocking thread that runs
//! a batch as one transaction of one cached statement per delivery, with every value made
//! ready by the webhook handlers ([`ReadyDelivery`]). It takes the same write turn as every
//! other writer (`Sqlite::write_lock`) and the same `store.synchronous`, so a commit is as
//! durable as before: intake answers only after it. The new events are then handed to the
//! consumer in memory ([`RecentEvents`]), which need not read them back.

use std::sync::Arc;

use anyhow::Context;
use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

use super::events::{ReadyDelivery, RecentEvents};
use crate::event::SCHEMA_VERSION;
use crate::settings::Synchronous;

const INSERT: &str = "INSERT INTO deliveries \
    (delivery_id, content_sha256, event_type, repo, number, event, received_at_ms, schema) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING";

/// A connection of its own to the database file the pool has already created and migrated,
/// set up as the pool's are, with commits fsynced as `synchronous` says; `purpose` names it
/// in errors.
pub(super) fn open(
    path: &std::path::Path,
    synchronous: Synchronous,
    purpose: &str,
) -> anyhow::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening the database for {purpose}"))?;
    let sync = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;"
    ))
    .with_context(|| format!("setting up the connection for {purpose}"))?;
    for (key, value) in super::PRAGMAS {
        conn.pragma_update(None, key, value)
            .with_context(|| format!("setting up the connection for {purpose}"))?;
    }
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

/// Stores delivery batches; blocking, for a thread of its own.
pub struct DeliveryWriter {
    conn: Connection,
    write_lock: Arc<tokio::sync::Mutex<()>>,
    recent: Arc<RecentEvents>,
}

impl DeliveryWriter {
    /// Opens the database file the pool has already created and migrated.
    pub(super) fn open(
        path: &std::path::Path,
        synchronous: Synchronous,
        write_lock: Arc<tokio::sync::Mutex<()>>,
        recent: Arc<RecentEvents>,
    ) -> anyhow::Result<Self> {
        let conn = open(path, synchronous, "intake")?;
        Ok(Self {
            conn,
            write_lock,
            recent,
        })
    }

    /// Stores `batch` in one transaction (one fsync for the lot) and returns, per delivery,
    /// whether it was new: one whose content hash was seen before is not. The new ones
    /// are then held for the consumer. Blocks: call it from a thread outside the async
    /// runtime.
    pub fn insert(&mut self, batch: Vec<ReadyDelivery>) -> anyhow::Result<Vec<bool>> {
        let _turn = self.write_lock.blocking_lock();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut stored = Vec::with_capacity(batch.len());
        {
            let mut insert = tx.prepare_cached(INSERT)?;
            for d in &batch {
                let changed = insert.execute(params![
                    d.delivery.delivery_id,
                    d.delivery.content_sha256,
                    d.delivery.event.kind_str(),
                    d.repo,
                    d.number,
                    d.event_json,
                    d.delivery.received_at_ms,
                    SCHEMA_VERSION,
                ])?;
                stored.push((changed == 1).then(|| tx.last_insert_rowid()));
            }
        }
        tx.commit()?;
        let fresh = stored.iter().map(Option::is_some).collect();
        self.recent.keep(
            batch
                .into_iter()
                .zip(stored)
                .filter_map(|(d, seq)| Some((seq?, d.delivery.event))),
        );
        Ok(fresh)
    }
}
