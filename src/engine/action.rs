//! The side effects `decide` asks for. Each is written to the outbox in the same transaction
//! as the state change that caused it, under an idempotency key, and performed later by an
//! executor that may repeat it after a crash: every action is safe to perform again.

use serde::{Deserialize, Serialize};

use crate::domain::{Command, RepoName};
use crate::event::StickyDraft;

/// Something to do on the forge, the model or the container engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// Find who added the trigger label (the timeline: a webhook's sender only changed *some*
    /// label) and their permission.
    ResolveTrigger,
    /// Check that the author of a `/director` command may write.
    AuthorizeCommand { command: Command, actor: String },
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
    /// Make the state labels match the state as it is when this runs.
    SyncLabels,
    /// Mint the run's token, check PR-only, create and start the container (or adopt it).
    StartRun { run_id: String },
    /// Stop the run's container.
    StopRun { run_id: String },
    /// Count the commits the run's branch has that the base has not.
    JudgeRun { run_id: String },
    /// Open the run's pull request, unless one from its branch is open already.
    OpenPr {
        run_id: String,
        title: String,
        body: String,
    },
    /// Remove the run's container.
    RemoveContainer { run_id: String },
    /// Delete the run's token (by name: safe when it is gone already).
    RevokeToken { run_id: String },
    /// Post the run's report on the issue, unless it is there already (found by its marker).
    ReportRun { run_id: String, body: String },
    /// Post on the pull request, unless a comment with `marker` is there already.
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
    /// The `kind` column and the metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ResolveTrigger { .. } => "resolve_trigger",
            Self::AuthorizeCommand { .. } => "authorize_command",
            Self::PostNotice { .. } => "post_notice",
            Self::ReadPreflight { .. } => "read_preflight",
            Self::UpsertSticky { .. } => "upsert_sticky",
            Self::FileRouted { .. } => "file_routed",
            Self::SyncLabels => "sync_labels",
            Self::StartRun { .. } => "start_run",
            Self::StopRun { .. } => "stop_run",
            Self::JudgeRun { .. } => "judge_run",
            Self::OpenPr { .. } => "open_pr",
            Self::RemoveContainer { .. } => "remove_container",
            Self::RevokeToken { .. } => "revoke_token",
            Self::ReportRun { .. } => "report_run",
            Self::CommentOnPull { .. } => "comment_on_pull",
            Self::ReadFeedback { .. } => "read_feedback",
        }
    }

    /// How often it is tried before the issue is left waiting for a person.
    /// `start_attempts`: `runner.start_attempts`.
    pub fn max_attempts(&self, start_attempts: u32) -> u32 {
        match self {
            // The pre-flight keeps its own attempts and backoff (`preflight.max_attempts`).
            Self::ReadPreflight { .. } => 3,
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
            _ => 120,
        };
        i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX / 4)
    }
}

/// An action as `decide` plans it: with its idempotency key and when it may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Unique per effect: the same decision made twice writes one row.
    pub key: String,
    pub action: Action,
    pub not_before_ms: i64,
}
