//! The single consumer: reads stored deliveries in arrival order, applies each, and marks it
//! processed. After a restart it picks up whatever was stored and not yet processed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::director::decide::apply_event;
use crate::domain::IssueRef;
use crate::store::{IssueRecord, Store, StoredDelivery};

const BATCH: u32 = 256;
/// A backstop: the intake wakes the consumer on every commit, but a missed wake-up must not
/// leave work waiting for long.
const IDLE_POLL: Duration = Duration::from_secs(2);

pub struct Consumer {
    store: Store,
    wake: Arc<Notify>,
}

impl Consumer {
    pub fn new(store: Store, wake: Arc<Notify>) -> Self {
        Self { store, wake }
    }

    /// Processes until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.drain().await {
                Ok(_) => {}
                Err(error) => {
                    tracing::error!(error = %format!("{error:#}"), "consumer failed; retrying");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(IDLE_POLL) => {}
            }
        }
    }

    /// Processes every stored delivery; returns how many.
    pub async fn drain(&self) -> anyhow::Result<usize> {
        let mut done = 0;
        loop {
            let batch = self.store.unprocessed_deliveries(BATCH).await?;
            if batch.is_empty() {
                return Ok(done);
            }
            done += batch.len();
            self.process_batch(&batch).await?;
        }
    }

    /// Applies a batch in memory, then commits every change and the consumed deliveries in
    /// one transaction. A crash before the commit replays the batch, which is harmless:
    /// applying the same fact twice ends in the same state.
    async fn process_batch(&self, batch: &[StoredDelivery]) -> anyhow::Result<()> {
        let now = crate::clock::now_ms();
        let wanted: Vec<IssueRef> = batch
            .iter()
            .map(|d| d.event.issue.clone())
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        let mut known_issues: HashMap<IssueRef, IssueRecord> = self
            .store
            .issues(&wanted)
            .await?
            .into_iter()
            .map(|r| (r.issue_ref(), r))
            .collect();
        let mut changed: HashMap<IssueRef, IssueRecord> = HashMap::new();
        for delivery in batch {
            let event = &delivery.event;
            let span = tracing::info_span!(
                "process",
                delivery = %delivery.delivery_id,
                repo = %event.issue.repo,
                issue = event.issue.number,
            );
            let _guard = span.enter();
            if let Some(record) = apply_event(known_issues.get(&event.issue), event, now) {
                tracing::debug!(state = %record.state, labels = ?record.labels, "issue recorded");
                known_issues.insert(event.issue.clone(), record.clone());
                changed.insert(event.issue.clone(), record);
            }
        }
        let seqs: Vec<i64> = batch.iter().map(|d| d.seq).collect();
        let records: Vec<IssueRecord> = changed.into_values().collect();
        self.store.commit_processed(&records, &seqs, now).await
    }
}
