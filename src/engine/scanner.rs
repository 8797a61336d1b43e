//! The periodic scan: Forgejo never retries a failed webhook delivery, so the director looks
//! for labelled issues itself, in two passes.
//!
//! - The **full pass** (at start-up and on `scan.full_schedule`) lists each watched
//!   repository's labelled issues: one call per repository per 50 labelled issues; only issues
//!   that are new, changed since the last scan (`updated_at`), still unjudged, or gone from the
//!   list cost more.
//! - The **incremental pass** (on `scan.schedule`) asks once, across every repository, for
//!   the issues updated since the last pass (`GET /repos/issues/search`, `since`, paged by
//!   `X-Total-Count`), and keeps those of watched repositories that are tracked or carry the
//!   trigger (labels checked here). Its cost follows what changed, not how many repositories
//!   are watched: with nothing changed it is one request.
//!
//! What either finds goes into the same queue as webhooks.

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

/// Where the watermark is kept in the database: `RFC 3339|forge` or `RFC 3339|local`.
const WATERMARK_KEY: &str = "scan.watermark";

fn parse_watermark(value: &str) -> Option<(chrono::DateTime<chrono::Utc>, bool)> {
    let (at, clock) = value.split_once('|')?;
    let at = chrono::DateTime::parse_from_rfc3339(at)
        .ok()?
        .with_timezone(&chrono::Utc);
    Some((at, clock == "forge"))
}

/// Repositories scanned at once.
const PARALLEL_REPOS: usize = 8;

/// How far back an incremental pass looks before the forge's clock at the last pass, so a
/// change committed while that pass ran (or within the same second) is not missed. What it
/// sees again is dropped cheaply (same `updated_at`).
const OVERLAP: chrono::Duration = chrono::Duration::seconds(60);

/// The same, when the forge did not say its time and the director's clock stands in for
/// it: wide enough for the two clocks to disagree by minutes.
const SKEW_OVERLAP: chrono::Duration = chrono::Duration::minutes(10);

#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct ScanReport {
    /// `full` or `incremental`.
    pub pass: &'static str,
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
    /// The state labels the director keeps on issues: a change of these alone is its own.
    state_labels: Vec<String>,
    /// Where the next incremental pass asks from (less the overlap): the forge's clock at the
    /// last pass, and whether it was the forge's (else the director's). `None` until a full
    /// pass.
    watermark: std::sync::Mutex<Option<(chrono::DateTime<chrono::Utc>, bool)>>,
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
            state_labels: Vec::new(),
            watermark: std::sync::Mutex::new(None),
        }
    }

    /// The state labels the director keeps (`labels.queued`, ...): an issue whose only change
    /// since its record is in these is not observed again.
    pub fn with_state_labels(mut self, labels: Vec<String>) -> Self {
        self.state_labels = labels;
        self
    }

    /// The newest of this process's watermark and the one kept in the database (where
    /// another replica's pass, or this director before a restart, left it).
    async fn watermark(&self) -> Option<(chrono::DateTime<chrono::Utc>, bool)> {
        let kept = match self.store.meta(WATERMARK_KEY).await {
            Ok(v) => v.and_then(|v| parse_watermark(&v)),
            Err(error) => {
                tracing::debug!(error = %format!("{error:#}"), "cannot read the kept scan watermark");
                None
            }
        };
        if let Some((at, forge)) = kept {
            self.advance_local(at, forge);
        }
        *self.watermark.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the watermark forward, never back; returns whether it moved.
    fn advance_local(&self, to: chrono::DateTime<chrono::Utc>, forge_clock: bool) -> bool {
        let mut w = self.watermark.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none_or(|(cur, _)| to > cur) {
            *w = Some((to, forge_clock));
            true
        } else {
            false
        }
    }

    /// Moves the watermark forward and keeps it in the database.
    async fn advance(&self, to: chrono::DateTime<chrono::Utc>, forge_clock: bool) {
        if self.advance_local(to, forge_clock) {
            let value = format!(
                "{}|{}",
                to.to_rfc3339(),
                if forge_clock { "forge" } else { "local" }
            );
            if let Err(error) = self.store.set_meta(WATERMARK_KEY, &value).await {
                tracing::debug!(error = %format!("{error:#}"), "cannot keep the scan watermark");
            }
        }
    }

    /// The configuration watches `repo`: listed, or owned by a watched organisation.
    fn watches(&self, repo: &RepoName) -> bool {
        crate::domain::is_watched(&self.repos, &self.orgs, repo)
    }

    /// One incremental pass: what changed since the last pass, across every repository at
    /// once. Before any full pass it runs a full pass instead.
    #[tracing::instrument(skip_all)]
    pub async fn scan_incremental(&self) -> anyhow::Result<ScanReport> {
        let Some((mark, forge_clock)) = self.watermark().await else {
            return self.scan_once().await;
        };
        let since = mark - if forge_clock { OVERLAP } else { SKEW_OVERLAP };
        let changes = self.forge.issues_updated_since(since).await?;
        // The next pass asks from the forge's clock at this answer (every change it holds is
        // at or before it), or, when it did not say, from the newest change seen.
        let newest = changes.issues.iter().fold(mark, |acc, (_, issue)| {
            chrono::DateTime::parse_from_rfc3339(&issue.updated_at)
                .map(|t| acc.max(t.with_timezone(&chrono::Utc)))
                .unwrap_or(acc)
        });
        let next = changes.server_time.map_or(newest, |t| t.max(newest));
        let next_from_forge = changes.server_time.is_some() || forge_clock;
        let candidates: Vec<(RepoName, Issue)> = changes
            .issues
            .into_iter()
            .filter(|(repo, issue)| !issue.is_pull && self.watches(repo))
            .collect();
        let refs: Vec<IssueRef> = candidates
            .iter()
            .map(|(repo, i)| IssueRef::new(repo.clone(), i.number))
            .collect();
        let known: HashMap<IssueRef, _> = self
            .store
            .issues(&refs)
            .await?
            .into_iter()
            .map(|r| (r.issue_ref(), r))
            .collect();
        let now = crate::clock::now_ms();
        let mut report = ScanReport {
            pass: "incremental",
            ..ScanReport::default()
        };
        let mut observations = Vec::new();
        let mut repos = BTreeSet::new();
        for ((repo, issue), issue_ref) in candidates.iter().zip(&refs) {
            let record = known.get(issue_ref);
            let labelled = issue.has_label(&self.trigger);
            // Tracked: the director has seen the trigger on it, or acts on it.
            let tracked = record.is_some_and(|r| {
                r.trigger_present || r.lifecycle != crate::domain::Lifecycle::Untracked
            });
            if !labelled && !tracked {
                continue;
            }
            repos.insert(repo.clone());
            if labelled && issue.state == "open" {
                report.labelled += 1;
            }
            if let Some(seen) = worth_observing(repo, record, issue, &self.state_labels, now) {
                observations.push(seen);
            }
        }
        report.repos = repos.len();
        let fresh = self.store.insert_deliveries(&observations).await?;
        report.queued = fresh.iter().filter(|f| **f).count();
        if report.queued > 0 {
            self.wake.notify_one();
        }
        self.advance(next, next_from_forge).await;
        tracing::info!(
            since = %since,
            changed = candidates.len(),
            queued = report.queued,
            "incremental scan finished"
        );
        Ok(report)
    }

    /// One pass over every watched repository.
    #[tracing::instrument(skip_all)]
    pub async fn scan_once(&self) -> anyhow::Result<ScanReport> {
        // Everything updated before this pass began is seen by it; the next incremental pass
        // asks from there (less the overlap). On the forge's clock, which times the changes:
        // its time at the pass's last answer, less how long the pass took.
        let started = std::time::Instant::now();
        let started_ms = crate::clock::now_ms();
        let mut report = ScanReport {
            pass: "full",
            ..ScanReport::default()
        };
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
        observations.extend(self.pull_observations(&mut report).await?);
        let fresh = self.store.insert_deliveries(&observations).await?;
        report.queued = fresh.iter().filter(|f| **f).count();
        if report.queued > 0 {
            self.wake.notify_one();
        }
        // A pass that could not read every repository leaves the watermark: the incremental
        // pass would otherwise skip what the failed repositories hold.
        if report.errors.is_empty() {
            let took = chrono::Duration::from_std(started.elapsed()).unwrap_or_default();
            match self.forge.server_time().await {
                Ok(Some(t)) => self.advance(t - took, true).await,
                Ok(None) | Err(_) => {
                    self.advance(
                        chrono::DateTime::from_timestamp_millis(started_ms)
                            .unwrap_or_else(chrono::Utc::now),
                        false,
                    )
                    .await
                }
            }
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

    /// The pull requests the director believes open, asked one by one: a merge or close whose
    /// webhook never arrived becomes an observation. One call per open pull request (their
    /// number is bounded by `runner.max_open_prs_per_repo`).
    async fn pull_observations(&self, report: &mut ScanReport) -> anyhow::Result<Vec<NewDelivery>> {
        let open: Vec<(RepoName, u64)> = self
            .store
            .issues_with_open_pulls()
            .await?
            .into_iter()
            .filter(|r| self.watches(&r.repo))
            .filter_map(|r| r.pr.map(|p| (r.repo, p.number)))
            .collect();
        let now = crate::clock::now_ms();
        let answers: Vec<_> = futures_util::stream::iter(open)
            .map(|(repo, number)| async move {
                let pull = self.forge.pull(&repo, number).await;
                (repo, number, pull)
            })
            .buffer_unordered(PARALLEL_REPOS)
            .collect()
            .await;
        let mut out = Vec::new();
        for (repo, number, pull) in answers {
            match pull {
                Ok(p) if p.state != "open" => out.push(pull_observation(&repo, &p, now)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%repo, pr = number, error = %e, "cannot read the pull request");
                    report.errors.push(format!("{repo}#{number}: {e}"));
                }
            }
        }
        Ok(out)
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
            if let Some(seen) = worth_observing(repo, record, issue, &self.state_labels, now) {
                observations.push(seen);
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

/// The observation to queue for `issue`, when it is new, its `updated_at` changed since the
/// director recorded it, or its trigger is still unjudged (a forge error while judging): an
/// unjudged trigger is retried with a fresh observation each scan.
///
/// A change in nothing but the director's own state labels is its own write (a backlog's
/// thousands of `waiting` labels): not observed. What a scan observation can change in a
/// decision is the trigger, the skip and priority labels, the title and the state, so any
/// other change is observed. (Text and comments reach a decision only by webhook.)
fn worth_observing(
    repo: &RepoName,
    record: Option<&crate::store::IssueRecord>,
    issue: &Issue,
    state_labels: &[String],
    now_ms: i64,
) -> Option<NewDelivery> {
    let unjudged = record.is_some_and(|r| r.trigger_present && r.trigger_trusted.is_none());
    let changed = record.is_none_or(|r| {
        r.forge_updated_at.as_deref() != Some(issue.updated_at.as_str())
            && !(r.title == issue.title
                && r.state == issue.state
                && other_labels(r.labels.iter().map(String::as_str), state_labels)
                    == other_labels(issue.labels.iter().map(|l| l.name.as_str()), state_labels))
    });
    (changed || unjudged).then(|| observation(repo, issue, unjudged.then_some(now_ms), now_ms))
}

/// The labels that are not the director's own state labels, in order.
fn other_labels<'a>(
    labels: impl Iterator<Item = &'a str>,
    state_labels: &[String],
) -> Vec<&'a str> {
    let mut kept: Vec<&str> = labels
        .filter(|l| !state_labels.iter().any(|s| s == l))
        .collect();
    kept.sort_unstable();
    kept.dedup();
    kept
}

/// A pull request's state as the scan found it, as a stored delivery (the same state seen
/// twice is queued once).
fn pull_observation(repo: &RepoName, pull: &crate::forge::PullRequest, now_ms: i64) -> NewDelivery {
    let updated = pull.updated_at.clone().unwrap_or_default();
    let event = ForgeEvent {
        kind: EventKind::Scan,
        action: "observed".into(),
        issue: IssueRef::new(repo.clone(), pull.number),
        sender: String::new(),
        is_pull: true,
        snapshot: IssueSnapshot {
            state: pull.state.clone(),
            merged: pull.merged,
            updated_at: pull.updated_at.clone(),
            ..IssueSnapshot::default()
        },
        comment: None,
        review: None,
    };
    let id = format!(
        "scan:pull:{repo}#{}@{updated}:{}:{}",
        pull.number, pull.state, pull.merged
    );
    scan_delivery(id, event, now_ms)
}

/// A scan observation stored under `id`, whose hash is its content: the same id twice is
/// one delivery.
fn scan_delivery(id: String, event: ForgeEvent, now_ms: i64) -> NewDelivery {
    let content_sha256 = hex::encode(Sha256::digest(id.as_bytes()));
    NewDelivery {
        delivery_id: id,
        content_sha256,
        issue: event.issue.clone(),
        event: Event::Forge(event),
        received_at_ms: now_ms,
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
        review: None,
    };
    let mut id = format!("scan:{repo}#{}@{}", issue.number, issue.updated_at);
    if let Some(at) = retry {
        id.push_str(&format!(":retry:{at}"));
    }
    scan_delivery(id, event, now_ms)
}
