//! The pull request's checks and the merge lane: reading the checks of its head, and merging
//! it once everything the lane asks holds. Merges are made one at a time per repository (in
//! this process in the order asked, across replicas under a lease), and a merge the forge
//! refuses is reported, never repeated as is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;

use super::Acts;
use crate::domain::{CheckState, CommitSha, IssueRef, RepoName, same_login};
use crate::event::{Event, MergeOutcome};
use crate::forge::{MergeAnswer, PullRequest, Review};
use crate::settings::MergeSettings;

/// What a pull request whose workflow runs the forge holds waits for.
pub const HELD: &str = "checks wait for a maintainer's approval: read the diff first, then approve them on the pull request";

/// How long one replica holds a repository's merge lease unrenewed; it is renewed every
/// [`RENEW_EVERY`] while the attempt lasts.
const LEASE_MS: i64 = 20_000;
const RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The merge lane's settings and its per-repository order.
#[derive(Default)]
pub struct Lane {
    pub settings: MergeSettings,
    /// One merge at a time per repository in this process, taken in the order asked.
    order: Mutex<HashMap<RepoName, Arc<tokio::sync::Mutex<()>>>>,
    /// Names this process in the repository leases.
    pub owner: String,
}

impl Lane {
    pub fn new(settings: MergeSettings) -> Self {
        Self {
            settings,
            order: Mutex::default(),
            owner: format!("merge-{:08x}", rand::random::<u32>()),
        }
    }

    fn order_of(&self, repo: &RepoName) -> Arc<tokio::sync::Mutex<()>> {
        self.order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(repo.clone())
            .or_default()
            .clone()
    }
}

/// Reads the checks of pull request `pr`'s head.
pub(super) async fn read_checks(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
) -> anyhow::Result<Option<Event>> {
    let pull = acts
        .forge
        .pull(&issue.repo, pr)
        .await
        .context("reading the pull request")?;
    let Some(head) = pull.head_sha.filter(|_| pull.state == "open") else {
        return Ok(None);
    };
    let checks = acts
        .forge
        .checks(&issue.repo, &head)
        .await
        .context("reading the checks of the pull request's head")?;
    Ok(Some(Event::ChecksRead {
        pr,
        head: head.to_string(),
        state: checks.state(),
        failing: crate::domain::pull::failing(&checks.checks),
        contexts: checks.checks.len(),
        held: checks.held,
    }))
}

/// Merges pull request `pr` if the lane's every condition holds; says why not otherwise.
pub(super) async fn try_merge(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
) -> anyhow::Result<Option<Event>> {
    let lane = &acts.lane;
    let outcome = |outcome| Ok(Some(Event::MergeTried { pr, outcome }));
    if !lane.settings.covers(&issue.repo) {
        return outcome(waiting("the merge lane is off for this repository", &[]));
    }
    let order = lane.order_of(&issue.repo);
    let _turn = order.lock().await;
    // Replicas on one database take turns under a lease; one process alone needs none (and
    // a lease left by a process that died would only hold its successor up).
    if !acts.store.is_shared() {
        return outcome(attempt(acts, issue, pr).await?);
    }
    let lease = format!("merge:{}", issue.repo);
    let now = acts.clock.now_ms();
    if !acts
        .store
        .hold_lease(&lease, &lane.owner, now + LEASE_MS, now)
        .await?
    {
        return outcome(polled(
            "another replica is merging in this repository; next turn on the checks poll",
            &[],
        ));
    }
    let renew = {
        let (store, owner, lease, clock) = (
            acts.store.clone(),
            lane.owner.clone(),
            lease.clone(),
            acts.clock.clone(),
        );
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                let now = clock.now_ms();
                if !matches!(
                    store.hold_lease(&lease, &owner, now + LEASE_MS, now).await,
                    Ok(true)
                ) {
                    return;
                }
            }
        })
    };
    let tried = attempt(acts, issue, pr).await;
    renew.abort();
    if let Err(e) = acts.store.release_lease(&lease, &lane.owner).await {
        tracing::debug!(error = %format!("{e:#}"), "could not hand the merge lease back");
    }
    outcome(tried?)
}

/// One merge attempt: each gate in turn (the pull request open, the label, the checks, the
/// approvals, mergeability), then an update of a branch that is behind, or the merge.
async fn attempt(acts: &Acts, issue: &IssueRef, pr: u64) -> anyhow::Result<MergeOutcome> {
    let repo = &issue.repo;
    let pull = acts
        .forge
        .pull(repo, pr)
        .await
        .context("reading the pull request")?;
    if pull.merged {
        // Merged already: by this lane before a crash, or by a person. Never twice.
        return Ok(MergeOutcome::Merged {
            approvals: Vec::new(),
        });
    }
    if pull.state != "open" {
        return Ok(waiting("the pull request is closed", &[]));
    }
    let labelled = acts
        .forge
        .issue(issue)
        .await
        .context("reading the issue")?
        .labels
        .iter()
        .any(|l| l.name == acts.labels.trigger);
    if !labelled {
        return Ok(waiting(
            &format!("the issue no longer carries `{}`", acts.labels.trigger),
            &[],
        ));
    }
    let Some(head) = pull.head_sha.clone() else {
        return Ok(polled(
            "the forge does not say which commit is its head",
            &[],
        ));
    };
    if let Some(not_green) = checks_gate(acts, repo, &head).await? {
        return Ok(not_green);
    }
    let approvals = match approvals_gate(acts, issue, pr, &head).await? {
        Ok(approvals) => approvals,
        Err(short) => return Ok(short),
    };
    if pull.mergeable == Some(false) {
        return Ok(polled(
            "the forge cannot merge it yet (conflicts, or still checking)",
            &approvals,
        ));
    }
    update_or_merge(acts, repo, pr, pull, &head, approvals).await
}

/// What the lane waits for while the head's checks are not all green (`None`: they are).
async fn checks_gate(
    acts: &Acts,
    repo: &RepoName,
    head: &CommitSha,
) -> anyhow::Result<Option<MergeOutcome>> {
    let checks = acts
        .forge
        .checks(repo, head)
        .await
        .context("reading the checks")?;
    let why = match checks.state() {
        CheckState::Success => return Ok(None),
        CheckState::None => {
            return Ok(Some(polled("no check has reported on its head", &[])));
        }
        CheckState::Failure => format!(
            "checks are failing: {}",
            contexts(
                checks
                    .checks
                    .iter()
                    .filter(|c| c.state == CheckState::Failure)
            )
        ),
        _ if checks.held > 0 => HELD.to_owned(),
        other => format!("checks are {}", other.as_str()),
    };
    Ok(Some(waiting(&why, &[])))
}

/// The writers' approvals of the current head that count (`Err`: what the lane waits for
/// instead: changes requested, or too few approvals). Two people for a merge: who asked for
/// the run does not also approve its result.
async fn approvals_gate(
    acts: &Acts,
    issue: &IssueRef,
    pr: u64,
    head: &CommitSha,
) -> anyhow::Result<Result<Vec<String>, MergeOutcome>> {
    let settings = &acts.lane.settings;
    let reviews = acts
        .forge
        .reviews(&issue.repo, pr)
        .await
        .context("reading reviews")?;
    let verdicts = writers_verdicts(acts, &issue.repo, &reviews).await?;
    let approved: Vec<String> = verdicts
        .iter()
        .filter(|(_, r)| r.state == "APPROVED" && r.commit_id.as_ref() == Some(head))
        .map(|(user, _)| user.clone())
        .collect();
    let requesters = if settings.requester_may_approve {
        Vec::new()
    } else {
        requesters(acts, issue).await?
    };
    let (approvals, by_requester): (Vec<String>, Vec<String>) = approved
        .into_iter()
        .partition(|user| !requesters.iter().any(|r| same_login(r, user)));
    let blocking: Vec<String> = verdicts
        .iter()
        .filter(|(_, r)| r.state == "REQUEST_CHANGES")
        .map(|(user, _)| format!("@{user}"))
        .collect();
    if !blocking.is_empty() {
        return Ok(Err(waiting(
            &format!("changes requested by {}", blocking.join(", ")),
            &approvals,
        )));
    }
    let needed = usize::try_from(settings.required_approvals).unwrap_or(usize::MAX);
    if approvals.len() >= needed {
        return Ok(Ok(approvals));
    }
    let requester_note = if by_requester.is_empty() {
        String::new()
    } else {
        let who: Vec<String> = by_requester.iter().map(|u| format!("@{u}")).collect();
        format!(
            "; the approval by {} does not count: they asked for the run, and another writer must approve its result (merge.requester_may_approve)",
            who.join(", ")
        )
    };
    Ok(Err(waiting(
        &format!(
            "{} of {} approvals of the current head by writers{requester_note}",
            approvals.len(),
            settings.required_approvals
        ),
        &approvals,
    )))
}

/// Updates a branch the base moved past, or merges it (a merged branch in the runner's fork
/// is deleted by the runner). A head in the runner's fork is updated by the runner, who owns
/// it: Forgejo lets a trusted writer's push to a fork's pull request run its workflows
/// unapproved.
async fn update_or_merge(
    acts: &Acts,
    repo: &RepoName,
    pr: u64,
    pull: PullRequest,
    head: &CommitSha,
    approvals: Vec<String>,
) -> anyhow::Result<MergeOutcome> {
    let settings = &acts.lane.settings;
    let runner = acts.runs.as_ref().map(|r| &r.runner);
    let fork = pull.fork(repo).cloned();
    if behind(acts, repo, &pull).await? {
        let updated = match (&fork, runner) {
            (Some(_), Some(runner)) => acts.forge.update_pull_as(runner, repo, pr).await,
            _ => acts.forge.update_pull(repo, pr).await,
        };
        return Ok(match updated.context("updating the branch")? {
            MergeAnswer::Done => MergeOutcome::Updated,
            MergeAnswer::Refused { status, message } => MergeOutcome::Refused {
                head: head.to_string(),
                reason: format!(
                    "the forge refused to update the branch (HTTP {status}): {message}"
                ),
            },
        });
    }
    let answer = acts
        .forge
        .merge_pull(
            repo,
            pr,
            settings.style,
            head,
            // The bot cannot delete a branch in the runner's fork: the runner does, below.
            settings.delete_branch && fork.is_none(),
        )
        .await
        .context("merging")?;
    crate::failpoint::hit("after_merge_call").await;
    if let (MergeAnswer::Done, Some(fork), Some(runner), true) =
        (&answer, &fork, runner, settings.delete_branch)
        && let Err(e) = acts
            .forge
            .delete_branch_as(runner, fork, &pull.head_ref)
            .await
    {
        // Merged all the same: a branch left in the fork is only clutter.
        tracing::warn!(%fork, branch = %pull.head_ref, error = %e, "the merged branch could not be deleted in the fork");
    }
    Ok(match answer {
        MergeAnswer::Done => MergeOutcome::Merged { approvals },
        MergeAnswer::Refused { status, message } => MergeOutcome::Refused {
            head: head.to_string(),
            reason: format!("the forge refused to merge (HTTP {status}): {message}"),
        },
    })
}

/// The writers who asked for the issue's run: who applied the trigger, and who approved its
/// GO or skipped the gate with `/director go`.
async fn requesters(acts: &Acts, issue: &IssueRef) -> anyhow::Result<Vec<String>> {
    let record = acts
        .store
        .issue(issue)
        .await?
        .context("the issue is no longer known")?;
    Ok([record.trigger_actor, record.preflight.approved_by]
        .into_iter()
        .flatten()
        .filter(|u| !u.is_empty())
        .collect())
}

/// Waiting for what a webhook announces (a review, a push, the label).
fn waiting(reason: &str, approvals: &[String]) -> MergeOutcome {
    MergeOutcome::Waiting {
        reason: reason.to_owned(),
        approvals: approvals.to_vec(),
        poll: false,
    }
}

/// Waiting for what only asking again tells (the forge's mergeability, a check that has not
/// reported).
fn polled(reason: &str, approvals: &[String]) -> MergeOutcome {
    MergeOutcome::Waiting {
        reason: reason.to_owned(),
        approvals: approvals.to_vec(),
        poll: true,
    }
}

fn contexts<'a>(checks: impl Iterator<Item = &'a crate::domain::Check>) -> String {
    let names: Vec<String> = checks
        .take(5)
        .map(|c| {
            format!(
                "`{}`",
                crate::limits::shorten(&c.context.replace('`', "'"), 80)
            )
        })
        .collect();
    names.join(", ")
}

/// Each writer's latest approval or request for changes that stands (not dismissed), other
/// than the bot's and the runner's, whose permission the forge confirms.
async fn writers_verdicts<'a>(
    acts: &Acts,
    repo: &RepoName,
    reviews: &'a [Review],
) -> anyhow::Result<Vec<(String, &'a Review)>> {
    let runner = acts.runs.as_ref().map(|r| r.runner.login.clone());
    let bot = acts.bot();
    let mut latest: Vec<(String, &Review)> = Vec::new();
    for review in reviews
        .iter()
        .filter(|r| matches!(r.state.as_str(), "APPROVED" | "REQUEST_CHANGES"))
    {
        let user = review.user.to_ascii_lowercase();
        latest.retain(|(u, _)| *u != user);
        if !review.dismissed {
            latest.push((user, review));
        }
    }
    let mut writers = Vec::new();
    for (user, review) in latest {
        let own = bot.as_deref().is_some_and(|b| same_login(b, &user))
            || runner.as_deref().is_some_and(|r| same_login(r, &user));
        if own {
            continue;
        }
        let can_write = acts
            .permission(repo, &review.user)
            .await
            .context("checking a reviewer's permission")?
            .can_write();
        if can_write {
            writers.push((review.user.clone(), review));
        }
    }
    Ok(writers)
}

/// Whether the base moved past the head's merge base: the forge says so (GitHub), or the
/// base branch's head is not the merge base (Forgejo).
async fn behind(acts: &Acts, repo: &RepoName, pull: &PullRequest) -> anyhow::Result<bool> {
    if let Some(behind) = pull.behind {
        return Ok(behind);
    }
    if pull.merge_base.is_empty() || pull.base_ref.is_empty() {
        return Ok(false);
    }
    let base = acts
        .forge
        .branch(repo, &pull.base_ref)
        .await
        .context("reading the base branch")?;
    Ok(base.is_some_and(|b| !b.commit.is_empty() && b.commit != pull.merge_base))
}
