//! The single consumer: reads stored deliveries in arrival order, applies each, and marks it
//! processed. After a restart it picks up whatever was stored and not yet processed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::director::decide::apply_event;
use crate::store::{Store, StoredDelivery};

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
            for delivery in batch {
                self.process(&delivery).await?;
                done += 1;
            }
        }
    }

    async fn process(&self, delivery: &StoredDelivery) -> anyhow::Result<()> {
        let event = &delivery.event;
        let span = tracing::info_span!(
            "process",
            delivery = %delivery.delivery_id,
            repo = %event.issue.repo,
            issue = event.issue.number,
        );
        let _guard = span.enter();
        let known = self.store.issue(&event.issue).await?;
        let now = crate::clock::now_ms();
        if let Some(record) = apply_event(known.as_ref(), event, now) {
            self.store.upsert_issue(&record).await?;
            tracing::debug!(state = %record.state, labels = ?record.labels, "issue recorded");
        }
        self.store.mark_processed(delivery.seq, now).await?;
        Ok(())
    }
}
