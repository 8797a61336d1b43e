//! The periodic scan: Forgejo never retries a failed webhook delivery, so the director looks
//! for labelled issues itself. Each repository costs one list call per 50 labelled issues;
//! only issues that are new, changed since the last scan (`updated_at`), still unjudged, or
//! gone from the list cost more. What it finds goes into the same queue as webhooks.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures_util::StreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::domain::{IssueRef, RepoName};
use crate::event::{Event, EventKind, ForgeEvent, IssueSnapshot};
use crate::forge::{Forge, Issue};
use crate::store::{NewDelivery, Store};

/// Repositories scanned at once.
const PARALLEL_REPOS: usize = 8;

#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct ScanReport {
    pub repos: usize,
    /// Open issues carrying the trigger label.
    pub labelled: usize,
    /// Observations queued for the consumer.
    pub queued: usize,
    /// Repositories whose list came back without the trigger label on every issue: the label
    /// is not defined there, so nothing in them is picked up.
    pub repos_without_trigger_label: Vec<String>,
    /// Repositories (or organisations) that could not be read.
    pub errors: Vec<String>,
}

pub struct Scanner {
    forge: Arc<dyn Forge>,
    store: Store,
    trigger: String,
    repos: Vec<RepoName>,
    orgs: Vec<String>,
    wake: Arc<Notify>,
}

struct RepoScan {
    labelled: usize,
    observations: Vec<NewDelivery>,
    missing_label: bool,
}

impl Scanner {
    pub fn new(
        forge: Arc<dyn Forge>,
        store: Store,
        trigger: String,
        repos: Vec<RepoName>,
        orgs: Vec<String>,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            forge,
            store,
            trigger,
            repos,
            orgs,
            wake,
        }
    }

    /// One pass over every watched repository.
    #[tracing::instrument(skip_all)]
    pub async fn scan_once(&self) -> anyhow::Result<ScanReport> {
        let mut report = ScanReport::default();
        let mut repos: BTreeSet<RepoName> = self.repos.iter().cloned().collect();
        for org in &self.orgs {
            match self.forge.org_repos(org).await {
                Ok(list) => repos.extend(list),
                Err(e) => {
                    tracing::warn!(org, error = %e, "cannot list the organisation's repositories");
                    report.errors.push(format!("{org}: {e}"));
                }
            }
        }
        report.repos = repos.len();
        let results: Vec<(RepoName, anyhow::Result<RepoScan>)> = futures_util::stream::iter(repos)
            .map(|repo| async move {
                let result = self.scan_repo(&repo).await;
                (repo, result)
            })
            .buffer_unordered(PARALLEL_REPOS)
            .collect()
            .await;
        let mut observations = Vec::new();
        for (repo, result) in results {
            match result {
                Ok(scan) => {
                    report.labelled += scan.labelled;
                    observations.extend(scan.observations);
                    if scan.missing_label {
                        tracing::warn!(%repo, label = %self.trigger, "the repository does not define the trigger label; nothing there is picked up");
                        report.repos_without_trigger_label.push(repo.to_string());
                    }
                }
                Err(e) => {
                    tracing::warn!(%repo, error = %format!("{e:#}"), "scan of the repository failed");
                    report.errors.push(format!("{repo}: {e:#}"));
                }
            }
        }
        report.repos_without_trigger_label.sort();
        let fresh = self.store.insert_deliveries(&observations).await?;
        report.queued = fresh.iter().filter(|f| **f).count();
        if report.queued > 0 {
            self.wake.notify_one();
        }
        tracing::info!(
            repos = report.repos,
            labelled = report.labelled,
            queued = report.queued,
            errors = report.errors.len(),
            "scan finished"
        );
        Ok(report)
    }

    async fn scan_repo(&self, repo: &RepoName) -> anyhow::Result<RepoScan> {
        let listed = self
            .forge
            .open_issues_with_label(repo, &self.trigger)
            .await?;
        // Forgejo drops a label it does not know from the filter and returns every open
        // issue: only issues that really carry the label count.
        let labelled: Vec<&Issue> = listed
            .iter()
            .filter(|i| !i.is_pull && i.has_label(&self.trigger))
            .collect();
        let missing_label = !listed.is_empty() && labelled.is_empty();
        let known: HashMap<u64, _> = self
            .store
            .issues_in_repo(repo)
            .await?
            .into_iter()
            .map(|r| (r.number, r))
            .collect();
        let now = crate::clock::now_ms();
        let mut observations = Vec::new();
        let mut seen = HashSet::new();
        for issue in &labelled {
            seen.insert(issue.number);
            let record = known.get(&issue.number);
            let unjudged = record.is_some_and(|r| r.trigger_present && r.trigger_trusted.is_none());
            let changed = record
                .is_none_or(|r| r.forge_updated_at.as_deref() != Some(issue.updated_at.as_str()));
            if changed || unjudged {
                // An unjudged trigger is retried with a fresh observation each scan.
                let retry = unjudged.then_some(now);
                observations.push(observation(repo, issue, retry, now));
            }
        }
        // Issues that carried the trigger but left the list: label removed or issue closed
        // while no webhook arrived. One call each tells which.
        for record in known.values() {
            if record.trigger_present && record.state == "open" && !seen.contains(&record.number) {
                let issue_ref = IssueRef::new(repo.clone(), record.number);
                match self.forge.issue(&issue_ref).await {
                    Ok(issue) => observations.push(observation(repo, &issue, None, now)),
                    Err(e) if e.is_not_found() => {
                        // Deleted issues send no webhook; treat as closed.
                        let mut gone = Issue {
                            number: record.number,
                            title: record.title.clone(),
                            body: String::new(),
                            state: "closed".into(),
                            labels: Vec::new(),
                            author: String::new(),
                            updated_at: chrono::Utc::now()
                                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                            is_pull: false,
                        };
                        gone.labels.clear();
                        observations.push(observation(repo, &gone, None, now));
                    }
                    Err(e) => {
                        tracing::warn!(issue = %issue_ref, error = %e, "could not re-read an issue that left the list")
                    }
                }
            }
        }
        Ok(RepoScan {
            labelled: labelled.len(),
            observations,
            missing_label,
        })
    }
}

/// A scan result as a stored delivery: its id and content hash make the same observation
/// (same issue, same `updated_at`) a duplicate, so scanning twice queues it once.
fn observation(repo: &RepoName, issue: &Issue, retry: Option<i64>, now_ms: i64) -> NewDelivery {
    let event = ForgeEvent {
        kind: EventKind::Scan,
        action: "observed".into(),
        issue: IssueRef::new(repo.clone(), issue.number),
        sender: String::new(),
        is_pull: issue.is_pull,
        snapshot: IssueSnapshot {
            title: issue.title.clone(),
            body: issue.body.clone(),
            state: issue.state.clone(),
            labels: issue.label_names(),
            author: issue.author.clone(),
            updated_at: Some(issue.updated_at.clone()),
            merged: false,
        },
        comment: None,
    };
    let mut id = format!("scan:{repo}#{}@{}", issue.number, issue.updated_at);
    if let Some(at) = retry {
        id.push_str(&format!(":retry:{at}"));
    }
    let content_sha256 = hex::encode(Sha256::digest(id.as_bytes()));
    NewDelivery {
        delivery_id: id,
        content_sha256,
        issue: event.issue.clone(),
        event: Event::Forge(event),
        received_at_ms: now_ms,
    }
}
