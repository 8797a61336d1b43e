//! The checks poll (`scan.checks_schedule`): Forgejo sends no webhook for a commit status, so
//! the director's open pull requests whose checks are pending, not known, or not reported yet,
//! and those waiting in the merge lane for what no webhook announces, are asked about again.
//! Each gets a `ChecksDue` event; the state machine plans the read (one call per pull request)
//! or the merge attempt.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::clock::SharedClock;
use crate::engine::decide::lane;
use crate::event::Event;
use crate::settings::MergeSettings;
use crate::store::{NewDelivery, Store};

pub struct ChecksPoll {
    pub store: Store,
    pub clock: SharedClock,
    pub merge: MergeSettings,
    /// The consumer, woken when events are stored.
    pub wake: Arc<Notify>,
    /// The look for reverts of merged pull requests, made on the same schedule (each
    /// repository at most once a day).
    pub reverts: Option<Arc<crate::engine::reverts::RevertCheck>>,
}

impl ChecksPoll {
    /// One pass: stores a `ChecksDue` for each pull request that wants asking; returns how
    /// many.
    pub async fn poll_once(&self) -> anyhow::Result<usize> {
        let now = self.clock.now_ms();
        let batch: Vec<NewDelivery> = self
            .store
            .issues_with_open_pulls()
            .await?
            .into_iter()
            .filter(|r| {
                r.pr.as_ref()
                    .is_some_and(|p| lane::wanted(p, self.merge.covers(&r.repo), now))
            })
            .map(|r| {
                let issue = r.issue_ref();
                NewDelivery::internal(
                    format!("checks-due:{issue}:{now}"),
                    issue,
                    Event::ChecksDue,
                    now,
                )
            })
            .collect();
        if batch.is_empty() {
            return Ok(0);
        }
        self.store.insert_deliveries(&batch).await?;
        self.wake.notify_one();
        Ok(batch.len())
    }
}
