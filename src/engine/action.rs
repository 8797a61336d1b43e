//! The side effects `decide` asks for. Each is written to the outbox in the same transaction
//! as the state change that caused it, under an idempotency key, and performed later by an
//! executor that may repeat it after a crash: every action is safe to perform again.

use serde::{Deserialize, Serialize};

use std::fmt;

use crate::domain::{ActionKind, Command, IssueRef, RepoName, RunId};
use crate::event::StickyDraft;

/// Something to do on the forge, the model or the container engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// Find who added the trigger label (the timeline: a webhook's sender only changed *some*
    /// label) and their permission.
    ResolveTrigger,
    /// Check that the author of a `/director` command may write.
    AuthorizeCommand {
        command: Command,
        actor: String,
        /// For `allow` and `continue`: what they said, and where.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        said: Option<crate::domain::command::Said>,
    },
    /// Post a one-time notice (found again by its marker before posting).
    PostNotice { marker: String, body: String },
    /// Gather the trusted text and ask the model (or the cache) about revision `rev`.
    ReadPreflight { rev: i64, handled_command_id: u64 },
    /// Edit the pre-flight comment in place, or post it if there is none.
    UpsertSticky { body: String },
    /// File the WRONG-REPO issue in `target`, unless one with `marker` is there already.
    FileRouted {
        rev: i64,
        target: RepoName,
        title: String,
        body: String,
        marker: String,
        /// Handed back with the outcome, for the pre-flight comment that names the filed issue.
        sticky: Box<StickyDraft>,
    },
    /// Make the state labels match the issue's state as it is when this runs.
    SyncLabels,
    /// Mint the run's token, check PR-only, create and start the container (or adopt it).
    StartRun { run_id: RunId },
    /// Stop the run's container.
    StopRun { run_id: RunId },
    /// Count the commits the run's branch has that the base has not.
    JudgeRun { run_id: RunId },
    /// Open the run's pull request, unless one from its branch is open already.
    OpenPr {
        run_id: RunId,
        title: String,
        body: String,
    },
    /// Remove the run's container.
    RemoveContainer { run_id: RunId },
    /// Delete the run's token (by name: safe when it is gone already).
    RevokeToken { run_id: RunId },
    /// Post the run's report on the issue, unless it is there already (found by its marker).
    ReportRun { run_id: RunId, body: String },
    /// Post on the issue's pull request, unless a comment with `marker` is there already.
    CommentOnPull {
        pr: u64,
        marker: String,
        body: String,
    },
    /// Check that `sender` may write (and is neither the bot nor the runner account), then
    /// read what they asked of the pull request: a review's body and inline comments, or a
    /// comment's `/director` command.
    ReadFeedback {
        pr: u64,
        sender: String,
        source: FeedbackSource,
    },
    /// Read the checks of the pull request's head.
    ReadChecks { pr: u64 },
    /// Merge the pull request if everything the merge lane asks holds (approvals of its head,
    /// no request for changes, green checks, mergeable, the issue still labelled); update its
    /// branch first when the base moved.
    TryMerge { pr: u64 },
    /// Run the checks (`[checks]`) on the run's pushed head, and on its base unless the
    /// base's results are kept, in sealed containers; the outcome comes back as
    /// `RunReport::Checked`.
    RunChecks {
        run_id: RunId,
        checks: crate::domain::checks::ChecksDecl,
    },
    /// Give the pull request `title` (its draft prefix dropped once the checks pass).
    RetitlePull {
        run_id: RunId,
        pr: u64,
        title: String,
    },
    /// Post the checks' result as commit status `director/checks` on `sha` (statuses append:
    /// posting it twice shows it once).
    PostStatus {
        run_id: RunId,
        sha: String,
        state: crate::domain::checks::StatusState,
        description: String,
        target_url: String,
    },
}

/// Where feedback on a pull request came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum FeedbackSource {
    /// A review requesting changes; the webhook carries its body, not its id.
    Review { body: String },
    /// A comment in the pull request's conversation.
    Comment { id: u64, body: String },
}

impl Action {
    /// Which kind it is: the `kind` column and the metric label.
    pub fn kind(&self) -> ActionKind {
        match self {
            Self::ResolveTrigger => ActionKind::ResolveTrigger,
            Self::AuthorizeCommand { .. } => ActionKind::AuthorizeCommand,
            Self::PostNotice { .. } => ActionKind::PostNotice,
            Self::ReadPreflight { .. } => ActionKind::ReadPreflight,
            Self::UpsertSticky { .. } => ActionKind::UpsertSticky,
            Self::FileRouted { .. } => ActionKind::FileRouted,
            Self::SyncLabels => ActionKind::SyncLabels,
            Self::StartRun { .. } => ActionKind::StartRun,
            Self::StopRun { .. } => ActionKind::StopRun,
            Self::JudgeRun { .. } => ActionKind::JudgeRun,
            Self::OpenPr { .. } => ActionKind::OpenPr,
            Self::RemoveContainer { .. } => ActionKind::RemoveContainer,
            Self::RevokeToken { .. } => ActionKind::RevokeToken,
            Self::ReportRun { .. } => ActionKind::ReportRun,
            Self::CommentOnPull { .. } => ActionKind::CommentOnPull,
            Self::ReadFeedback { .. } => ActionKind::ReadFeedback,
            Self::ReadChecks { .. } => ActionKind::ReadChecks,
            Self::TryMerge { .. } => ActionKind::TryMerge,
            Self::RunChecks { .. } => ActionKind::RunChecks,
            Self::PostStatus { .. } => ActionKind::PostStatus,
            Self::RetitlePull { .. } => ActionKind::RetitlePull,
        }
    }

    /// The run the action is about, for the actions of one run.
    pub fn run_id(&self) -> Option<&RunId> {
        match self {
            Self::StartRun { run_id }
            | Self::StopRun { run_id }
            | Self::JudgeRun { run_id }
            | Self::OpenPr { run_id, .. }
            | Self::RemoveContainer { run_id }
            | Self::RevokeToken { run_id }
            | Self::ReportRun { run_id, .. }
            | Self::RunChecks { run_id, .. }
            | Self::PostStatus { run_id, .. }
            | Self::RetitlePull { run_id, .. } => Some(run_id),
            _ => None,
        }
    }

    /// How often it is tried before the issue is left waiting for a person.
    /// `start_attempts`: `runner.start_attempts`.
    pub fn max_attempts(&self, start_attempts: u32) -> u32 {
        match self {
            // The pre-flight keeps its own attempts and backoff (`preflight.max_attempts`).
            Self::ReadPreflight { .. } | Self::RunChecks { .. } => 3,
            // A forge or engine restart must not fail a run for good within seconds.
            Self::StartRun { .. } => start_attempts,
            // A live token is never given up on: retried (backoff capped near 9 minutes) until
            // it is gone, and the run's report waits behind it.
            Self::RevokeToken { .. } => u32::MAX,
            _ => 6,
        }
    }

    /// How long a claim on it lasts before another executor may take it over.
    pub fn lease_ms(&self, preflight_timeout_secs: u64) -> i64 {
        let secs = match self {
            Self::ReadPreflight { .. } => preflight_timeout_secs.saturating_mul(2).max(60),
            Self::StartRun { .. } => 300,
            // The base's checks, then the head's, each within its time limit.
            Self::RunChecks { checks, .. } => {
                checks.timeout_secs.saturating_mul(2).saturating_add(300)
            }
            _ => 120,
        };
        i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX / 4)
    }
}

/// Which of an issue's effects an action is. With the issue it is the action's idempotency
/// key ([`ActionKey`]): the same decision made twice names the same effect, and the outbox
/// keeps one row for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// The state labels, as of the record's version.
    Labels {
        version: i64,
    },
    /// Checking who wrote a `/director` command.
    Command {
        comment: u64,
        command: Command,
    },
    /// Finding who applied the trigger, as of the record's version.
    Resolve {
        version: i64,
    },
    /// The one-time notice that the trigger was applied by someone who may not write.
    UntrustedNotice,
    /// The notice that a filer's day holds the issue, as of the record's version.
    FilerNotice {
        version: i64,
    },
    /// The director's one answer to a writer's `allow` or `continue` comment.
    Answer {
        comment: u64,
    },
    /// The pre-flight read of a revision of the issue.
    Read {
        rev: i64,
    },
    /// Filing the WRONG-REPO issue for a revision.
    Routed {
        rev: i64,
    },
    /// The pre-flight comment, as of the record's version.
    Sticky {
        version: i64,
    },
    Start {
        run: RunId,
    },
    FollowupStart {
        run: RunId,
    },
    Stop {
        run: RunId,
    },
    Judge {
        run: RunId,
    },
    Pr {
        run: RunId,
    },
    Revoke {
        run: RunId,
    },
    Report {
        run: RunId,
    },
    Remove {
        run: RunId,
    },
    /// Running the checks of a run's pushed head.
    RunChecks {
        run: RunId,
    },
    /// Making the draft pull request ready, its checks green on `head`.
    Ready {
        pr: u64,
        head: String,
    },
    /// Posting the checks' commit status on `sha`.
    Status {
        run: RunId,
        sha: String,
    },
    /// Reading a review that requested changes (`review`: a digest of who, what and when).
    ReviewFeedback {
        pr: u64,
        review: String,
    },
    /// Reading a comment on the pull request.
    CommentFeedback {
        pr: u64,
        comment: u64,
    },
    /// Telling the issue its pull request was closed, as of the record's version.
    PrClosed {
        pr: u64,
        version: i64,
    },
    /// Telling the pull request its follow-ups ran out, per grant of more.
    FollowupCap {
        pr: u64,
        grants: u32,
    },
    /// The `read`-th read of the pull request's checks.
    Checks {
        pr: u64,
        read: u32,
    },
    /// Telling the issue its checks' follow-ups ran out.
    CiCap {
        pr: u64,
    },
    /// The `attempt`-th attempt of the merge lane.
    Merge {
        pr: u64,
        attempt: u32,
    },
    /// Telling the pull request the forge refused to merge (or update) head `head`.
    MergeRefused {
        pr: u64,
        head: String,
    },
    /// Telling the issue the merge lane merged its pull request.
    Merged {
        pr: u64,
    },
    /// Telling the pull request the forge holds its checks for a maintainer's approval.
    ChecksHeld {
        pr: u64,
    },
    /// Telling the issue its merged pull request was reverted.
    Reverted {
        pr: u64,
    },
}

impl fmt::Display for Effect {
    /// The effect as the outbox's `key` column holds it (`start:<run id>`, `read:rev3`...):
    /// written, never read back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Labels { version } => write!(f, "labels:v{version}"),
            Self::Command { comment, command } => {
                write!(f, "command:{comment}:{}", command.as_str())
            }
            Self::Resolve { version } => write!(f, "resolve:v{version}"),
            Self::UntrustedNotice => f.write_str("notice:untrusted"),
            Self::FilerNotice { version } => write!(f, "notice:filer:v{version}"),
            Self::Answer { comment } => write!(f, "answer:{comment}"),
            Self::Read { rev } => write!(f, "read:rev{rev}"),
            Self::Routed { rev } => write!(f, "routed:rev{rev}"),
            Self::Sticky { version } => write!(f, "sticky:v{version}"),
            Self::Start { run } => write!(f, "start:{run}"),
            Self::FollowupStart { run } => write!(f, "followup-start:{run}"),
            Self::Stop { run } => write!(f, "stop:{run}"),
            Self::Judge { run } => write!(f, "judge:{run}"),
            Self::Pr { run } => write!(f, "pr:{run}"),
            Self::Revoke { run } => write!(f, "revoke:{run}"),
            Self::Report { run } => write!(f, "report:{run}"),
            Self::Remove { run } => write!(f, "remove:{run}"),
            Self::RunChecks { run } => write!(f, "run-checks:{run}"),
            Self::Status { run, sha } => write!(f, "status:{run}:{sha}"),
            Self::Ready { pr, head } => write!(f, "ready:pr{pr}:{head}"),
            Self::ReviewFeedback { pr, review } => write!(f, "feedback:pr{pr}:review:{review}"),
            Self::CommentFeedback { pr, comment } => write!(f, "feedback:pr{pr}:comment:{comment}"),
            Self::PrClosed { pr, version } => write!(f, "pr-closed:pr{pr}:v{version}"),
            Self::FollowupCap { pr, grants } => write!(f, "followup-cap:pr{pr}:g{grants}"),
            Self::Checks { pr, read } => write!(f, "checks:pr{pr}:r{read}"),
            Self::CiCap { pr } => write!(f, "ci-cap:pr{pr}"),
            Self::Merge { pr, attempt } => write!(f, "merge:pr{pr}:a{attempt}"),
            Self::MergeRefused { pr, head } => write!(f, "merge-refused:pr{pr}:{head}"),
            Self::Merged { pr } => write!(f, "merged:pr{pr}"),
            Self::ChecksHeld { pr } => write!(f, "checks-held:pr{pr}"),
            Self::Reverted { pr } => write!(f, "reverted:pr{pr}"),
        }
    }
}

/// An action's idempotency key: the issue and the effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActionKey {
    pub issue: IssueRef,
    pub effect: Effect,
}

impl fmt::Display for ActionKey {
    /// The outbox's `key` column: `owner/name#N:<effect>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.issue, self.effect)
    }
}

/// An action as `decide` plans it: with its idempotency key and when it may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Unique per effect: the same decision made twice writes one row.
    pub key: ActionKey,
    pub action: Action,
    pub not_before_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::test_id;

    /// The outbox holds keys as text, and rows written by an earlier version are still there
    /// after an upgrade: each effect must be spelt as it always was, or an effect decided
    /// again would get a second row.
    #[test]
    fn each_effect_is_spelt_as_the_outbox_has_always_held_it() {
        let issue: IssueRef = "acme/widgets#7".parse().expect("an issue");
        let run = || test_id("0123456789ab");
        let cases = [
            (Effect::Labels { version: 3 }, "labels:v3"),
            (
                Effect::Command {
                    comment: 41,
                    command: Command::Retry,
                },
                "command:41:retry",
            ),
            (Effect::Resolve { version: 1 }, "resolve:v1"),
            (Effect::UntrustedNotice, "notice:untrusted"),
            (Effect::FilerNotice { version: 2 }, "notice:filer:v2"),
            (Effect::Read { rev: 2 }, "read:rev2"),
            (Effect::Routed { rev: 2 }, "routed:rev2"),
            (Effect::Sticky { version: 4 }, "sticky:v4"),
            (Effect::Start { run: run() }, "start:0123456789ab"),
            (
                Effect::FollowupStart { run: run() },
                "followup-start:0123456789ab",
            ),
            (Effect::Stop { run: run() }, "stop:0123456789ab"),
            (Effect::Judge { run: run() }, "judge:0123456789ab"),
            (Effect::Pr { run: run() }, "pr:0123456789ab"),
            (Effect::Revoke { run: run() }, "revoke:0123456789ab"),
            (Effect::Report { run: run() }, "report:0123456789ab"),
            (Effect::Remove { run: run() }, "remove:0123456789ab"),
            (
                Effect::ReviewFeedback {
                    pr: 12,
                    review: "9f2c".into(),
                },
                "feedback:pr12:review:9f2c",
            ),
            (
                Effect::CommentFeedback {
                    pr: 12,
                    comment: 77,
                },
                "feedback:pr12:comment:77",
            ),
            (Effect::PrClosed { pr: 12, version: 9 }, "pr-closed:pr12:v9"),
            (
                Effect::FollowupCap { pr: 12, grants: 1 },
                "followup-cap:pr12:g1",
            ),
        ];
        for (effect, spelt) in cases {
            let key = ActionKey {
                issue: issue.clone(),
                effect,
            };
            assert_eq!(key.to_string(), format!("acme/widgets#7:{spelt}"));
        }
    }

    #[test]
    fn the_actions_of_one_run_name_it_and_the_others_do_not() {
        let run = Action::OpenPr {
            run_id: test_id("000000000001"),
            title: "t".into(),
            body: "b".into(),
        };
        assert_eq!(run.run_id().map(RunId::as_str), Some("000000000001"));
        assert_eq!(run.kind(), ActionKind::OpenPr);
        assert_eq!(Action::SyncLabels.run_id(), None);
    }
}
