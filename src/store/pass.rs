//! A consumer pass: the next events, what they are decided on, and the commit of what was
//! decided.
//!
//! On SQLite the whole pass runs on a connection of its own, from one blocking thread, in one
//! hand-off. Through sqlx's pool each statement of a pass was a round trip to a connection's
//! worker thread (read the events, the records, the runs; begin, write, move the mark, commit;
//! then admission's reads), each two thread wake-ups: at 1,000 deliveries a second those
//! wake-ups cost more CPU than SQLite did. The statements are the ones sqlx runs for the same
//! commit ([`super::commit_statements`]); the commit takes the same write turn as every other
//! writer and, as every consumer pass did, goes without an fsync of its own (see
//! [`super::Store::commit_with`]). On PostgreSQL a pass goes through the pool as before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::Context;
use rusqlite::{Connection, TransactionBehavior};

use super::backend::{Backend, Marks, params};
use super::events::{RecentEvents, stored_event};
use super::records::{
    ANY_QUEUED, issue_from_row, issue_of_pull, issues_in, latest_runs_of, owner_of, run_from_row,
};
use super::statement::Statement;
use super::{CHUNK, Commit, Db, Sqlite, Store, StoredEvent, commit_statements};
use crate::domain::{IssueRecord, IssueRef, RunRecord};
use crate::event::Event;
use crate::settings::Synchronous;

/// What a pass decides on.
#[derive(Debug, Default)]
pub struct PassInput {
    /// The next events in arrival order, each with the issue it is decided on: its own, or,
    /// for a pull request's event, the issue whose run opened the pull request; `None` when
    /// the row names no valid issue.
    pub events: Vec<(StoredEvent, Option<IssueRef>)>,
    /// The records of those issues that have one.
    pub records: HashMap<IssueRef, IssueRecord>,
    /// The newest run of each of those issues that has one.
    pub runs: HashMap<IssueRef, RunRecord>,
}

/// What came of a pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Passed {
    /// How many events it consumed or set aside.
    pub events: usize,
    /// It planned actions (the executors have work).
    pub actions: bool,
    /// It changed runs (the watchers have work).
    pub runs: bool,
    /// An issue may be waiting for a run (admission has work): on SQLite, read after the
    /// commit; on PostgreSQL always, as admission reads for itself.
    pub queued: bool,
}

impl Store {
    /// One consumer pass: reads up to `limit` events and what they are decided on, has `plan`
    /// decide them into a commit (and the time to stamp it with), and commits it. A failed
    /// pass commits nothing: its events are read again.
    pub async fn pass<F>(&self, limit: u32, plan: F) -> anyhow::Result<Passed>
    where
        F: FnOnce(PassInput) -> (Commit, i64) + Send + 'static,
    {
        let Db::Sqlite(s) = &self.db else {
            return self.pass_through_pool(limit, plan).await;
        };
        s.on_own_connection(move |c| c.pass(limit, plan)).await
    }

    async fn pass_through_pool<F>(&self, limit: u32, plan: F) -> anyhow::Result<Passed>
    where
        F: FnOnce(PassInput) -> (Commit, i64),
    {
        let events = self.next_events(limit).await?;
        if events.is_empty() {
            return Ok(Passed {
                queued: true,
                ..Passed::default()
            });
        }
        let pulls = pulls(&events);
        let owners = if pulls.is_empty() {
            HashMap::new()
        } else {
            self.issues_of_pulls(&pulls).await?.into_iter().collect()
        };
        let events = targeted(events, &owners);
        let wanted = wanted(&events);
        let input = PassInput {
            records: keyed(self.issues(&wanted).await?, IssueRecord::issue_ref),
            runs: keyed(self.latest_runs(&wanted).await?, RunRecord::issue_ref),
            events,
        };
        let count = input.events.len();
        let (commit, now_ms) = plan(input);
        // Decided from stored events only: replayed the same way after a power cut.
        self.commit_with(&commit, now_ms, false).await?;
        Ok(Passed {
            queued: true,
            ..Passed::of(&commit, count)
        })
    }
}

impl Passed {
    fn of(commit: &Commit, events: usize) -> Self {
        Self {
            events,
            actions: !commit.actions.is_empty(),
            runs: !commit.runs.is_empty(),
            queued: false,
        }
    }
}

impl Sqlite {
    /// Runs `job` on the consumer's own connection, opened on first use, from a blocking
    /// thread.
    pub(super) async fn on_own_connection<T, F>(&self, job: F) -> anyhow::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut PassConnection) -> anyhow::Result<T> + Send + 'static,
    {
        let slot = self.pass.clone();
        let path = self.path.clone();
        let write_lock = self.write_lock.clone();
        let recent = self.recent.clone();
        tokio::task::spawn_blocking(move || {
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(PassConnection::open(&path, write_lock, recent)?);
            }
            let conn = slot.as_mut().context("the consumer's connection")?;
            job(conn)
        })
        .await
        .context("the consumer's database thread stopped")?
    }
}

/// The consumer's own SQLite connection. Blocking: used from one thread at a time.
pub(super) struct PassConnection {
    conn: Connection,
    write_lock: Arc<tokio::sync::Mutex<()>>,
    recent: Arc<RecentEvents>,
}

impl std::fmt::Debug for PassConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassConnection")
    }
}

/// The events after the mark; those intake holds (`seq` from `$2` to `$3`) come without
/// their JSON.
const NEXT_EVENTS: &str = "SELECT seq, delivery_id, repo, number, schema, \
     CASE WHEN seq BETWEEN $2 AND $3 THEN NULL ELSE event END AS event \
     FROM deliveries WHERE seq > (SELECT seq FROM consumer_mark) ORDER BY seq LIMIT $1";

impl PassConnection {
    /// Commits are not fsynced: a consumer pass need not be (see
    /// [`super::Store::commit_with`]), and a later fsynced commit makes them durable too.
    fn open(
        path: &std::path::Path,
        write_lock: Arc<tokio::sync::Mutex<()>>,
        recent: Arc<RecentEvents>,
    ) -> anyhow::Result<Self> {
        let conn = super::writer::open(path, Synchronous::Normal, "the consumer")?;
        // Multi-row statements differ by their row count: room for a few sizes of each.
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Self {
            conn,
            write_lock,
            recent,
        })
    }

    fn pass<F>(&mut self, limit: u32, plan: F) -> anyhow::Result<Passed>
    where
        F: FnOnce(PassInput) -> (Commit, i64),
    {
        let events = self.next_events(limit)?;
        if events.is_empty() {
            return Ok(Passed {
                queued: self.any_queued()?,
                ..Passed::default()
            });
        }
        let mut owners = HashMap::new();
        for pull in pulls(&events) {
            let found = issue_of_pull(&pull)?.rows(&self.conn, |r| r.int("number"))?;
            owners.extend(owner_of(&pull, found.first().copied())?);
        }
        let events = targeted(events, &owners);
        let wanted = wanted(&events);
        let mut records = Vec::new();
        let mut runs = Vec::new();
        for chunk in wanted.chunks(CHUNK) {
            records
                .extend(issues_in(chunk, Marks::InOrder)?.rows(&self.conn, |r| issue_from_row(r))?);
            runs.extend(
                latest_runs_of(chunk, Marks::InOrder)?.rows(&self.conn, |r| run_from_row(r))?,
            );
        }
        let input = PassInput {
            events,
            records: keyed(records, IssueRecord::issue_ref),
            runs: keyed(runs, RunRecord::issue_ref),
        };
        let count = input.events.len();
        let (commit, now_ms) = plan(input);
        self.commit(&commit, now_ms)?;
        Ok(Passed {
            queued: self.any_queued()?,
            ..Passed::of(&commit, count)
        })
    }

    fn commit(&mut self, commit: &Commit, now_ms: i64) -> anyhow::Result<()> {
        let statements = commit_statements(commit, now_ms, Backend::Sqlite)?;
        let _turn = self.write_lock.blocking_lock();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for statement in &statements {
            statement.run(&tx)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn any_queued(&self) -> anyhow::Result<bool> {
        Ok(!Statement::new(ANY_QUEUED)
            .rows(&self.conn, |_| Ok(()))?
            .is_empty())
    }

    /// The oldest unconsumed events, in arrival order. Those intake holds are taken as they
    /// are; any other is read and parsed (another writer's, or everything after a restart).
    pub(super) fn next_events(&mut self, limit: u32) -> anyhow::Result<Vec<StoredEvent>> {
        // Nothing held: an empty span.
        let (first, last) = self.recent.span().unwrap_or((1, 0));
        let rows = Statement::new(NEXT_EVENTS)
            .bind(i64::from(limit))
            .bind(first)
            .bind(last)
            .rows(&self.conn, |r| {
                Ok((r.int("seq")?, r.int("schema")?, r.opt_text("event")?, {
                    stored_event(r, Err(String::new()))?
                }))
            })?;
        let Some(end) = rows.last().map(|(seq, ..)| *seq) else {
            return Ok(Vec::new());
        };
        let mut held = self.recent.take_through(end);
        let mut events = Vec::with_capacity(rows.len());
        let mut unread = Vec::new();
        for (seq, schema, json, mut stored) in rows {
            stored.event = match (json, held.remove(&seq)) {
                (Some(json), _) => Event::from_stored(schema, &json),
                (None, Some(event)) => Ok(event),
                (None, None) => {
                    unread.push((events.len(), schema));
                    Err(String::new())
                }
            };
            events.push(stored);
        }
        // Held once, taken by a pass that then failed: read again.
        for chunk in unread.chunks(CHUNK) {
            let mut statement = Statement::new(format!(
                "SELECT seq, event FROM deliveries WHERE seq IN ({})",
                params(Marks::InOrder, 1, chunk.len())
            ));
            for (at, _) in chunk {
                statement.push(events[*at].seq);
            }
            let mut read: HashMap<i64, String> = statement
                .rows(&self.conn, |r| Ok((r.int("seq")?, r.text("event")?)))?
                .into_iter()
                .collect();
            for (at, schema) in chunk {
                let event = &mut events[*at];
                event.event = match read.remove(&event.seq) {
                    Some(json) => Event::from_stored(*schema, &json),
                    None => Err("the row was gone when read".to_owned()),
                };
            }
        }
        Ok(events)
    }
}

/// The pull requests that events of the batch are about.
fn pulls(events: &[StoredEvent]) -> Vec<IssueRef> {
    events
        .iter()
        .filter(|e| matches!(&e.event, Ok(Event::Forge(f)) if f.is_pull))
        .filter_map(|e| e.issue.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect()
}

/// Each event with the issue it is decided on: a pull request's event goes to the issue whose
/// run opened it (`owners`), when known.
fn targeted(
    events: Vec<StoredEvent>,
    owners: &HashMap<IssueRef, IssueRef>,
) -> Vec<(StoredEvent, Option<IssueRef>)> {
    events
        .into_iter()
        .map(|stored| {
            let target = stored.issue.as_ref().map(|issue| match &stored.event {
                Ok(Event::Forge(f)) if f.is_pull => owners.get(issue).unwrap_or(issue).clone(),
                _ => issue.clone(),
            });
            (stored, target)
        })
        .collect()
}

/// The issues a batch is decided on, each once.
fn wanted(events: &[(StoredEvent, Option<IssueRef>)]) -> Vec<IssueRef> {
    events
        .iter()
        .filter_map(|(_, target)| target.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect()
}

fn keyed<T>(items: Vec<T>, key: impl Fn(&T) -> IssueRef) -> HashMap<IssueRef, T> {
    items.into_iter().map(|item| (key(&item), item)).collect()
}
