//! Everything that can happen to an issue, as one typed [`Event`]: webhook facts and scan
//! observations, and the outcomes the executors report back. Events are stored (with
//! [`SCHEMA_VERSION`]) before they are decided on, so a crash loses none; one that no longer
//! parses is moved aside, never blocks the queue.

use serde::{Deserialize, Serialize};

use crate::domain::run::{RunResult, StopCause};
use crate::domain::verdict::Verdict;
use crate::domain::{ActionKind, Command, Feedback, IssueRef, LeftOut, RepoName, RunId};

/// The version of the stored event format. Version 1 rows held a bare [`ForgeEvent`].
pub const SCHEMA_VERSION: i64 = 2;

/// Where a fact about an issue came from (`X-Forgejo-Event-Type`, or the director's own scan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Issues,
    IssueLabel,
    IssueComment,
    PullRequest,
    /// A plain comment in a pull request's conversation (`pull_request_comment`).
    PullComment,
    /// A submitted review (`pull_request_review_approved`, `_rejected`, `_comment`).
    PullReview,
    /// Not a webhook: what the director's own scan observed.
    Scan,
    /// A Forgejo Actions run of a pull request ended (`action_run_success`,
    /// `action_run_failure`, `action_run_recover`): its checks changed.
    ActionRun,
}

impl EventKind {
    /// `None` for event types the director does not use (push, release, ...).
    pub fn from_header(value: &str) -> Option<Self> {
        match value {
            "issues" => Some(Self::Issues),
            "issue_label" => Some(Self::IssueLabel),
            "issue_comment" => Some(Self::IssueComment),
            // `pull_request_sync`: new commits on the pull request's branch.
            "pull_request" | "pull_request_sync" => Some(Self::PullRequest),
            "action_run_success" | "action_run_failure" | "action_run_recover" => {
                Some(Self::ActionRun)
            }
            "pull_request_comment" => Some(Self::PullComment),
            "pull_request_review_approved"
            | "pull_request_review_rejected"
            | "pull_request_review_comment" => Some(Self::PullReview),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Issues => "issues",
            Self::IssueLabel => "issue_label",
            Self::IssueComment => "issue_comment",
            Self::PullRequest => "pull_request",
            Self::PullComment => "pull_request_comment",
            Self::PullReview => "pull_request_review",
            Self::Scan => "scan",
            Self::ActionRun => "action_run",
        }
    }
}

/// What the forge told (a webhook) or the scan saw: the issue as it is now, and who did it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgeEvent {
    pub kind: EventKind,
    pub action: String,
    pub issue: IssueRef,
    /// Who caused the event (empty for scan observations).
    pub sender: String,
    pub snapshot: IssueSnapshot,
    /// The item is a pull request (a `pull_request` event, or a comment on a pull).
    #[serde(default)]
    pub is_pull: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<CommentSnapshot>,
    /// A submitted review (the payload carries its kind and body, no id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<ReviewSnapshot>,
}

/// What kind of review was submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewKind {
    Approved,
    ChangesRequested,
    Comment,
}

impl ReviewKind {
    /// From `X-Forgejo-Event-Type`.
    pub fn from_header(value: &str) -> Option<Self> {
        match value {
            "pull_request_review_approved" => Some(Self::Approved),
            "pull_request_review_rejected" => Some(Self::ChangesRequested),
            "pull_request_review_comment" => Some(Self::Comment),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewSnapshot {
    pub kind: ReviewKind,
    /// The review's body (`review.content`).
    #[serde(default)]
    pub body: String,
}

/// The issue (or pull request) as the event saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueSnapshot {
    pub title: String,
    #[serde(default)]
    pub body: String,
    pub state: String,
    pub labels: Vec<String>,
    #[serde(default)]
    pub author: String,
    /// Forgejo's `updated_at`, RFC 3339.
    #[serde(default)]
    pub updated_at: Option<String>,
    #[serde(default)]
    pub merged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommentSnapshot {
    pub id: u64,
    pub author: String,
    pub body: String,
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// What happened. `decide` turns each into a new state and the actions it calls for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A webhook delivery or a scan observation.
    Forge(ForgeEvent),
    /// Who applied the trigger label, and whether they may write.
    TriggerJudged {
        actor: Option<String>,
        trusted: bool,
        permission: String,
        /// When the timeline says the trigger was added (RFC 3339).
        #[serde(default)]
        labelled_at: Option<String>,
    },
    /// A `/director` command, with whether its author may write.
    CommandJudged {
        command: Command,
        actor: String,
        allowed: bool,
        /// For `allow` and `continue`: what they said, and where.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        said: Option<crate::domain::command::Said>,
    },
    /// A pre-flight read of revision `rev` came back.
    PreflightRead { rev: i64, outcome: PreflightOutcome },
    /// The WRONG-REPO issue for revision `rev` exists (filed now, or found from before).
    RoutedFiled {
        rev: i64,
        filed: IssueRef,
        sticky: Box<StickyDraft>,
    },
    /// A run slot is free for this queued issue: the run id and branch it gets.
    Admitted { run_id: RunId, branch: String },
    /// Something happened to one run.
    Run { run_id: RunId, report: RunReport },
    /// A writer asked something of the issue's pull request (a review, a comment), or
    /// someone who may not did (`allowed` false: nothing happens).
    PullAsked {
        pr: u64,
        actor: String,
        allowed: bool,
        ask: PullAsk,
    },
    /// The checks of the pull request's head `head` were read.
    ChecksRead {
        pr: u64,
        head: String,
        state: crate::domain::CheckState,
        /// The failing ones, cut (see `domain::pull::failing`).
        #[serde(default)]
        failing: Vec<crate::domain::Check>,
        #[serde(default)]
        contexts: usize,
        /// Workflow runs of the head the forge holds for a maintainer's approval.
        #[serde(default)]
        held: u32,
    },
    /// The checks poll (`scan.checks_schedule`) found the pull request waiting on its
    /// checks, or in the merge lane.
    ChecksDue,
    /// What the merge lane did about the pull request.
    MergeTried { pr: u64, outcome: MergeOutcome },
    /// The revert check found a later commit of the base reverting the merged pull request.
    Reverted { pr: u64, sha: String, url: String },
    /// An action failed on every attempt; the issue waits for a person.
    ActionGaveUp {
        /// The action's key, as the outbox holds it (for people reading the database).
        key: String,
        kind: ActionKind,
        error: String,
        /// The run the action was about, for the actions of one run. Events stored by
        /// versions before it was recorded have none (see `decide`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<RunId>,
    },
}

/// What one attempt of the merge lane came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum MergeOutcome {
    /// Merged, as these writers approved its head.
    Merged { approvals: Vec<String> },
    /// Not yet, for this reason.
    Waiting {
        reason: String,
        #[serde(default)]
        approvals: Vec<String>,
        /// What it waits for has no webhook: the checks poll asks again.
        #[serde(default)]
        poll: bool,
    },
    /// The base had moved: the branch was brought up to it, and its checks run again.
    Updated,
    /// The forge refused to merge (or update) head `head`, for this reason.
    Refused { head: String, reason: String },
}

impl Event {
    /// The `event_type` column: what kind of row this is, for people reading the database.
    pub fn kind_str(&self) -> &'static str {
        match self {
            Self::Forge(f) => f.kind.as_str(),
            Self::TriggerJudged { .. } => "trigger_judged",
            Self::CommandJudged { .. } => "command_judged",
            Self::PreflightRead { .. } => "preflight_read",
            Self::RoutedFiled { .. } => "routed_filed",
            Self::Admitted { .. } => "admitted",
            Self::Run { .. } => "run",
            Self::PullAsked { .. } => "pull_asked",
            Self::ActionGaveUp { .. } => "action_gave_up",
            Self::ChecksRead { .. } => "checks_read",
            Self::ChecksDue => "checks_due",
            Self::MergeTried { .. } => "merge_tried",
            Self::Reverted { .. } => "reverted",
        }
    }

    /// Parses a stored row of the given schema version.
    pub fn from_stored(schema: i64, json: &str) -> Result<Self, String> {
        match schema {
            1 => serde_json::from_str::<ForgeEvent>(json)
                .map(Self::Forge)
                .map_err(|e| format!("schema 1: {e}")),
            SCHEMA_VERSION => serde_json::from_str(json).map_err(|e| format!("schema 2: {e}")),
            other => Err(format!("unknown schema version {other}")),
        }
    }
}

/// What a writer asked of the pull request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub enum PullAsk {
    /// A review requesting changes, or `/director fix`: a follow-up run on the branch.
    Fix { feedback: Feedback },
    /// `/director cancel`: stop the follow-up.
    Cancel { comment_id: u64 },
    /// `/director retry`: lift the follow-up cap.
    Retry { comment_id: u64 },
}

/// What one pre-flight read found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PreflightOutcome {
    /// The model (or the cache of the same text) gave a verdict.
    Read {
        verdict: Verdict,
        reading: String,
        model: String,
        read: ReadContext,
    },
    /// A writer skipped the gate.
    Skipped {
        by: String,
        how: String,
        read: ReadContext,
    },
    /// This attempt failed (provider error, unclear answer, forge error while gathering).
    Failed {
        error: String,
        reading: Option<String>,
        model: String,
        read: Option<ReadContext>,
    },
    /// An hourly cap is reached: read again at `until_ms`.
    Capped {
        limit: String,
        until_ms: i64,
        read: ReadContext,
        /// The filer whose day's limit this is (`[filers]`): the issue says why, once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filer: Option<String>,
    },
    /// The issue is closed or lost its trigger meanwhile: the forge fact will say so.
    NotEligible,
}

/// What the read was given: the text's hash, what was left out, the issue as read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadContext {
    pub hash: String,
    pub left_out: Vec<LeftOut>,
    /// The newest comment id seen (commands up to it are handled).
    pub newest_comment_id: u64,
    /// The trusted title and body that were read.
    pub title: String,
    pub body: String,
    /// The text this read vouched for anew (its author, or the writer who proposed exactly
    /// it, may write; or a writer said `/director go`).
    #[serde(default)]
    pub vouched: Option<crate::domain::Vouched>,
    /// What was removed from the read as hidden from a reader of the rendered issue, one
    /// line per place (`the body: a link reference definition (not rendered)`).
    #[serde(default)]
    pub hidden: Vec<String>,
    /// The agent a run would get, in words (`` `aider` (the label `agent:aider` by @alice) ``),
    /// or why none can start as asked: shown under a GO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentLine>,
    /// The run's likely cost and time, from the finished runs (when runs are configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<crate::domain::forecast::Forecast>,
    /// A repository's `preflight.approval` (its `.director.toml`), when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_approval: Option<crate::domain::approval::Approval>,
    /// The writer whose `/director go` (or skip label) came while a GO waited for approval:
    /// it approves the GO of this read only if the read is of the text that GO showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// SHA-256 of the issue's title and body as the forge gave them to this read (read or
    /// left out alike): a go approves only a GO asked of this very text.
    #[serde(default)]
    pub text_sha: String,
}

pub use crate::domain::agent::AgentLine;

/// What happened to one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum RunReport {
    /// The container runs (started now, or found running after a restart).
    Started {
        container_id: String,
        base_branch: String,
        /// A follow-up's branch head when it started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_head: Option<String>,
    },
    /// The issue's trusted text changed since the verdict: nothing was started.
    Stale,
    /// Refused before anything started (the run token could push to the default branch).
    Refused { why: String },
    /// The run's setup phase failed, or left a secret in the workspace: the agent never
    /// started. Not the agent's failure.
    SetupFailed { why: String },
    /// The container ended (or was killed at the timeout); `log` is already redacted.
    Exited {
        code: Option<i64>,
        timed_out: bool,
        log: String,
        /// Stopped by the director: at the wall-clock limit or when it fell silent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stopped: Option<StopCause>,
        /// The result file the run left, when readable.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<RunResult>,
        /// What the egress proxy refused it: (`host:port`, how many times).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        egress_refused: Vec<(String, u64)>,
    },
    /// Commits the run's branch has that the base has not.
    Judged { ahead: u64 },
    /// The pull request exists (opened now, or found from before).
    PrOpened { number: u64 },
    /// The checks of its pushed head ran (or could not: the outcome says why).
    Checked {
        head: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<String>,
        outcome: crate::domain::checks::ChecksOutcome,
    },
    /// The checks' status was posted on `sha`: the pull request's checks are read again.
    StatusPosted { sha: String },
    /// The draft pull request was retitled ready (its checks pass).
    Readied { pr: u64 },
}

/// What the pre-flight comment of a WRONG-REPO verdict shows once the issue is filed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StickyDraft {
    pub reading: Option<String>,
    pub model: String,
    pub read: ReadContext,
    pub what: String,
    pub target: RepoName,
}
