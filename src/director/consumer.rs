//! The single consumer: reads stored deliveries (webhooks and scan observations alike) in
//! arrival order, decides with [`apply_event`], acts, and commits the new state together with
//! the consumed deliveries. After a restart it picks up whatever was stored and not processed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::director::comments;
use crate::director::decide::{LabelNames, Step, apply_command, apply_event, judge_trigger};
use crate::domain::{IssueRef, Lifecycle, RepoName};
use crate::forge::{Forge, ForgeError, Permission};
use crate::settings::LabelSettings;
use crate::store::{IssueRecord, Store, StoredDelivery};

const BATCH: u32 = 256;
/// A backstop: the intake wakes the consumer on every commit, but a missed wake-up must not
/// leave work waiting for long.
const IDLE_POLL: Duration = Duration::from_secs(2);

pub struct Consumer {
    store: Store,
    wake: Arc<Notify>,
    labels: LabelNames,
    forge: Option<Arc<dyn Forge>>,
    /// Woken when an issue needs a pre-flight.
    preflight_wake: Option<Arc<Notify>>,
    /// Woken when an issue is queued for a run or cancelled.
    runs_wake: Option<Arc<Notify>>,
    /// Keeps the state labels (queued, running, PR open, failed, no-go) on issues.
    state_labels: Option<(LabelSettings, Arc<dyn Forge>)>,
}

impl Consumer {
    /// Without a forge, issues are recorded but no trigger can be judged (nobody's
    /// permission can be checked), so nothing is picked up.
    pub fn new(
        store: Store,
        wake: Arc<Notify>,
        labels: LabelNames,
        forge: Option<Arc<dyn Forge>>,
    ) -> Self {
        Self {
            store,
            wake,
            labels,
            forge,
            preflight_wake: None,
            runs_wake: None,
            state_labels: None,
        }
    }

    pub fn with_preflight_wake(mut self, wake: Arc<Notify>) -> Self {
        self.preflight_wake = Some(wake);
        self
    }

    pub fn with_runs_wake(mut self, wake: Arc<Notify>) -> Self {
        self.runs_wake = Some(wake);
        self
    }

    pub fn with_state_labels(mut self, labels: LabelSettings, forge: Arc<dyn Forge>) -> Self {
        self.state_labels = Some((labels, forge));
        self
    }

    /// Processes until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            if let Err(error) = self.drain().await {
                tracing::error!(error = %format!("{error:#}"), "consumer failed; retrying");
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

    /// Applies a batch, then commits every change and the consumed deliveries in one
    /// transaction. A crash before the commit replays the batch, which is harmless: applying
    /// the same fact twice ends in the same state, and comments are found by their marker.
    async fn process_batch(&self, batch: &[StoredDelivery]) -> anyhow::Result<()> {
        let wanted: Vec<IssueRef> = batch
            .iter()
            .map(|d| d.event.issue.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut known: HashMap<IssueRef, IssueRecord> = self
            .store
            .issues(&wanted)
            .await?
            .into_iter()
            .map(|r| (r.issue_ref(), r))
            .collect();
        let before: HashMap<IssueRef, Lifecycle> = known
            .iter()
            .map(|(k, r)| (k.clone(), r.lifecycle))
            .collect();
        let mut changed: HashSet<IssueRef> = HashSet::new();
        let mut permissions = PermissionCache::default();
        for delivery in batch {
            let event = &delivery.event;
            let span = tracing::info_span!(
                "process",
                delivery = %delivery.delivery_id,
                repo = %event.issue.repo,
                issue = event.issue.number,
            );
            let now = crate::clock::now_ms();
            let Some(decision) = apply_event(known.get(&event.issue), event, &self.labels, now)
            else {
                continue;
            };
            let record = match decision.step {
                Step::Nothing => decision.record,
                Step::Reread => {
                    span.in_scope(|| tracing::info!("changed after the pre-flight: reading again"));
                    decision.record
                }
                Step::Applied => {
                    span.in_scope(
                        || tracing::info!(state = %decision.record.lifecycle, "result applied"),
                    );
                    decision.record
                }
                Step::Cancelled => {
                    span.in_scope(|| tracing::info!(state = %decision.record.state, "trigger removed or issue closed: cancelled"));
                    decision.record
                }
                Step::Command { actor, verb } => {
                    let _enter = span.enter();
                    let allowed = match &self.forge {
                        Some(forge) => permissions
                            .get(forge.as_ref(), &event.issue.repo, &actor)
                            .await
                            .map(Permission::can_write)
                            .unwrap_or(false),
                        None => false,
                    };
                    match (allowed, apply_command(decision.record.clone(), &verb, now)) {
                        (true, Some(record)) => {
                            tracing::info!(actor, verb, state = %record.lifecycle, "command applied");
                            record
                        }
                        (true, None) => {
                            tracing::info!(actor, verb, "command does not apply in this state");
                            decision.record
                        }
                        (false, _) => {
                            tracing::info!(
                                actor,
                                verb,
                                "command from an account without write access ignored"
                            );
                            decision.record
                        }
                    }
                }
                Step::ResolveTrigger { actor_hint } => {
                    let _enter = span.enter();
                    self.judge(decision.record, actor_hint, &mut permissions)
                        .await
                }
            };
            known.insert(event.issue.clone(), record);
            changed.insert(event.issue.clone());
        }
        let seqs: Vec<i64> = batch.iter().map(|d| d.seq).collect();
        let records: Vec<IssueRecord> = changed
            .into_iter()
            .filter_map(|i| known.remove(&i))
            .collect();
        let wake_preflight = records.iter().any(|r| r.lifecycle == Lifecycle::Pending);
        let wake_runs = records
            .iter()
            .any(|r| matches!(r.lifecycle, Lifecycle::Queued | Lifecycle::Cancelled));
        // Only changes that put a state label on or take one off cost forge calls.
        let label_changes: Vec<(IssueRef, Lifecycle)> = match &self.state_labels {
            Some((labels, _)) => records
                .iter()
                .filter(|r| {
                    let was = before.get(&r.issue_ref()).copied();
                    was != Some(r.lifecycle)
                        && (state_label(labels, r.lifecycle).is_some()
                            || was.is_some_and(|w| state_label(labels, w).is_some()))
                })
                .map(|r| (r.issue_ref(), r.lifecycle))
                .collect(),
            None => Vec::new(),
        };
        self.store
            .commit_processed(&records, &seqs, crate::clock::now_ms())
            .await?;
        if wake_preflight && let Some(wake) = &self.preflight_wake {
            wake.notify_one();
        }
        if wake_runs && let Some(wake) = &self.runs_wake {
            wake.notify_one();
        }
        if let Some((labels, forge)) = &self.state_labels {
            for (issue, lifecycle) in label_changes {
                tokio::spawn(sync_state_label(
                    forge.clone(),
                    labels.clone(),
                    issue,
                    lifecycle,
                ));
            }
        }
        Ok(())
    }

    /// Finds who applied the trigger and whether they may; says so once on the issue when
    /// they may not. On a forge error the trigger stays unjudged and the next scan retries.
    async fn judge(
        &self,
        record: IssueRecord,
        actor_hint: Option<String>,
        permissions: &mut PermissionCache,
    ) -> IssueRecord {
        let Some(forge) = &self.forge else {
            tracing::warn!("trigger seen but no forge is configured to check who applied it");
            return record;
        };
        let issue = record.issue_ref();
        let actor = match actor_hint {
            Some(actor) => Some(actor),
            None => match latest_label_actor(forge.as_ref(), &issue, &self.labels.trigger).await {
                Ok(actor) => actor,
                Err(error) => {
                    tracing::warn!(%error, "could not read the timeline; a later scan retries");
                    return record;
                }
            },
        };
        let permission = match &actor {
            Some(actor) => match permissions.get(forge.as_ref(), &issue.repo, actor).await {
                Ok(p) => p,
                Err(error) => {
                    tracing::warn!(%error, "could not check the permission; a later scan retries");
                    return record;
                }
            },
            None => Permission::None,
        };
        let trusted = permission.can_write();
        let mut record = judge_trigger(record, actor.clone(), trusted, crate::clock::now_ms());
        if trusted {
            tracing::info!(actor = actor.as_deref().unwrap_or(""), "picked up");
        } else {
            tracing::info!(
                actor = actor.as_deref().unwrap_or(""),
                permission = permission.as_str(),
                "trigger applied without write access: not picked up"
            );
            if !record.untrusted_notice {
                match self
                    .notify_untrusted(forge.as_ref(), &issue, actor.as_deref())
                    .await
                {
                    Ok(()) => record.untrusted_notice = true,
                    Err(error) => {
                        tracing::warn!(%error, "could not post the untrusted-trigger comment")
                    }
                }
            }
        }
        record
    }

    /// Posts the explanation unless a comment with its marker is already there (a crash after
    /// posting and before committing must not post it twice).
    async fn notify_untrusted(
        &self,
        forge: &dyn Forge,
        issue: &IssueRef,
        actor: Option<&str>,
    ) -> Result<(), ForgeError> {
        let existing = forge.comments(issue).await?;
        if existing
            .iter()
            .any(|c| c.body.contains(comments::UNTRUSTED_MARKER))
        {
            return Ok(());
        }
        forge
            .create_comment(
                issue,
                &comments::untrusted_trigger(&self.labels.trigger, actor),
            )
            .await
            .map(|_| ())
    }
}

/// The state label for a lifecycle state, if it has one.
pub fn state_label(labels: &LabelSettings, lifecycle: Lifecycle) -> Option<&str> {
    let name = match lifecycle {
        Lifecycle::Queued => &labels.queued,
        Lifecycle::Running => &labels.running,
        Lifecycle::Succeeded => &labels.pr_open,
        Lifecycle::Failed | Lifecycle::TimedOut | Lifecycle::PreflightFailed => &labels.failed,
        Lifecycle::NoGo => &labels.no_go,
        _ => return None,
    };
    (!name.is_empty()).then_some(name.as_str())
}

/// Puts the issue's state label on and takes the other state labels off (best effort: a
/// failure is logged and the next change sets it right).
async fn sync_state_label(
    forge: Arc<dyn Forge>,
    labels: LabelSettings,
    issue: IssueRef,
    lifecycle: Lifecycle,
) {
    let result: Result<(), ForgeError> = async {
        let current = forge.issue(&issue).await?;
        let all = [
            &labels.queued,
            &labels.running,
            &labels.pr_open,
            &labels.failed,
            &labels.no_go,
        ];
        let wanted = state_label(&labels, lifecycle);
        for l in current
            .labels
            .iter()
            .filter(|l| all.iter().any(|n| **n == l.name) && Some(l.name.as_str()) != wanted)
        {
            forge.remove_label(&issue, l.id).await?;
        }
        if let Some(name) = wanted
            && !current.has_label(name)
        {
            let label = forge
                .ensure_label(&issue.repo, name, "#5319e7", "Set by the director")
                .await?;
            forge.add_label(&issue, label.id).await?;
        }
        Ok(())
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%issue, %error, "could not update the state label");
    }
}

/// Permissions asked within one batch: the same person labelling many issues costs one call.
#[derive(Default)]
struct PermissionCache(HashMap<(RepoName, String), Permission>);

impl PermissionCache {
    async fn get(
        &mut self,
        forge: &dyn Forge,
        repo: &RepoName,
        user: &str,
    ) -> Result<Permission, ForgeError> {
        let key = (repo.clone(), user.to_owned());
        if let Some(p) = self.0.get(&key) {
            return Ok(*p);
        }
        let p = forge.permission(repo, user).await?;
        self.0.insert(key, p);
        Ok(p)
    }
}

/// The account on the latest "label added" timeline entry for `label`.
pub async fn latest_label_actor(
    forge: &dyn Forge,
    issue: &IssueRef,
    label: &str,
) -> Result<Option<String>, ForgeError> {
    let timeline = forge.timeline(issue).await?;
    Ok(timeline
        .into_iter()
        .rev()
        .find(|t| t.kind == "label" && t.added && t.label.as_deref() == Some(label))
        .map(|t| t.actor))
}
