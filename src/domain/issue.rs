//! What the director knows of one issue: [`IssueRecord`], and the pre-flight's memory of it.

use serde::{Deserialize, Serialize};

use super::{IssueRef, Lifecycle, PullRecord, RepoName};

/// What the director knows of one issue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueRecord {
    pub repo: RepoName,
    pub number: u64,
    pub title: String,
    /// The issue's own state on the forge: `open` or `closed`.
    pub state: String,
    pub labels: Vec<String>,
    pub forge_updated_at: Option<String>,
    pub last_change_ms: i64,
    pub lifecycle: Lifecycle,
    pub trigger_present: bool,
    pub trigger_actor: Option<String>,
    /// `None` while who applied the trigger is not resolved.
    pub trigger_trusted: Option<bool>,
    pub untrusted_notice: bool,
    pub preflight: PreflightState,
    /// Bumped by every decision that changes the record: names the actions it caused.
    #[serde(default)]
    pub version: i64,
    /// Why the issue waits on something that failed past its attempts (shown in `status`).
    #[serde(default)]
    pub blocked: Option<String>,
    /// The pull request the issue's run opened, and the feedback on it.
    #[serde(default)]
    pub pr: Option<PullRecord>,
    /// What writers granted the issue in its thread (hosts approved, a budget continued).
    #[serde(default, skip_serializing_if = "super::thread::ThreadGrants::is_empty")]
    pub thread: super::thread::ThreadGrants,
}

impl IssueRecord {
    /// A record for an issue the director has not seen before.
    pub fn new(issue: &IssueRef, now_ms: i64) -> Self {
        Self {
            repo: issue.repo.clone(),
            number: issue.number,
            title: String::new(),
            state: String::new(),
            labels: Vec::new(),
            forge_updated_at: None,
            last_change_ms: now_ms,
            lifecycle: Lifecycle::Untracked,
            trigger_present: false,
            trigger_actor: None,
            trigger_trusted: None,
            untrusted_notice: false,
            preflight: PreflightState::default(),
            version: 0,
            blocked: None,
            pr: None,
            thread: super::thread::ThreadGrants::default(),
        }
    }

    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }

    pub fn is_open(&self) -> bool {
        self.state == "open"
    }
}

/// What the last pre-flight concluded. Stored with the words people see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Judgement {
    #[serde(rename = "GO")]
    Go,
    #[serde(rename = "NO-GO")]
    NoGo,
    #[serde(rename = "WRONG-REPO")]
    WrongRepo,
    /// Questions were asked in the thread.
    #[serde(rename = "NEEDS-INFO")]
    NeedsInfo,
    /// A writer skipped the gate (`/director go` or the skip label).
    #[serde(rename = "SKIPPED")]
    Skipped,
    /// The pre-flight could not run after every attempt.
    #[serde(rename = "ERROR")]
    Error,
}

impl Judgement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Go => "GO",
            Self::NoGo => "NO-GO",
            Self::WrongRepo => "WRONG-REPO",
            Self::NeedsInfo => "NEEDS-INFO",
            Self::Skipped => "SKIPPED",
            Self::Error => "ERROR",
        }
    }

    /// The judgement [`Judgement::as_str`] names.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Go,
            Self::NoGo,
            Self::WrongRepo,
            Self::NeedsInfo,
            Self::Skipped,
            Self::Error,
        ]
        .into_iter()
        .find(|j| j.as_str() == s)
    }
}

/// The pre-flight's memory of one issue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PreflightState {
    /// When a writer first handed the issue over (its first pick-up), for the outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picked_at_ms: Option<i64>,
    /// Bumped whenever the issue must be read (again); a result for an older revision is
    /// stale and dropped.
    pub rev: i64,
    /// The last verdict, if any.
    pub verdict: Option<Judgement>,
    pub reason: Option<String>,
    /// SHA-256 of the exact text the verdict was given for.
    pub hash: Option<String>,
    pub model: Option<String>,
    /// Failed reads since the last verdict.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Not before this time (retry backoff, hourly caps, a spent day's budget).
    pub not_before_ms: Option<i64>,
    /// What the pre-flight waits for until `not_before_ms`, in words (a cap, a spent
    /// budget), while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<String>,
    /// Where a WRONG-REPO issue was filed (`owner/repo#N`).
    pub routed_to: Option<String>,
    /// The newest comment id whose `/director` command was already acted on.
    pub handled_command_id: u64,
    /// The title and body a writer vouched for (by applying the trigger, editing, or saying
    /// `/director go`). Text by someone without write access counts only as it was then.
    pub vouched: Option<Vouched>,
    /// Text seen with the trigger being applied or an edit, waiting for its proposer's
    /// permission to be known before it can be vouched for.
    pub proposed: Option<Vouched>,
    /// The issue's `updated_at` (RFC 3339) when the text proposed with a trigger was seen: it
    /// counts as the text the trigger's author saw only when nothing changed after the label
    /// went on.
    #[serde(default)]
    pub proposed_seen_at: Option<String>,
    /// The questions of the last NEEDS-INFO: open while the issue needs information, and kept
    /// after a GO for the run's task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<String>,
    /// The newest comment when they were asked: the answers come after it.
    #[serde(default)]
    pub asked_after: u64,
    /// How many reads in a row said NEEDS-INFO (a read of the same text counts once).
    #[serde(default)]
    pub question_rounds: u32,
    /// The plan the GO comment showed (the model's steps), for the run's task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
    /// The forecast the GO comment showed, kept to set against the run's actual cost and time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<super::forecast::Forecast>,
    /// A GO waiting for a writer's `/director go` (`preflight.approval`): the text it binds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<super::approval::Awaiting>,
    /// The writer whose `/director go` approved the waiting GO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The last edit of the title or body a delivery told of: who made the text as it is
    /// then, for a renewed ask to name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_edit: Option<super::approval::Edit>,
    /// The issue's author as the delivery that brought the trigger showed it: a filer's
    /// account authoring it makes it agent-filed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The filer whose account applied the trigger or authored the issue (`[filers]`):
    /// agent-filed work, until a writer's `/director go` makes it a maintainer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filer: Option<super::filer::Filed>,
    /// The issue said once why a filer's limit holds it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filer_notice: bool,
}

impl PreflightState {
    /// Whether questions are open: the last verdict asked them.
    pub fn asking(&self) -> bool {
        self.verdict == Some(Judgement::NeedsInfo) && !self.questions.is_empty()
    }
}

/// An issue's title and body, and who vouched for (or proposed) them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vouched {
    pub title: String,
    pub body: String,
    /// The account; empty while not known yet (the trigger's author is read from the timeline).
    pub by: String,
}

/// What was left out of the prompt: a comment, or the issue's own text as edited since a
/// writer vouched for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    pub author: String,
    /// The comment's id; 0 for the issue text.
    pub comment_id: u64,
    /// The issue's title and body as they are now (the vouched text was read instead).
    #[serde(default)]
    pub issue_text: bool,
    /// For the issue text: no writer vouched for any version of it, so none of it was read.
    #[serde(default)]
    pub never_vouched: bool,
    /// For a comment: an answer edited after the writer's reply that vouched for it (the
    /// writer vouched for it as it was).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edited_after_vouched: bool,
}

/// Pre-flight calls made within a window, overall and for one repository.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallWindow {
    pub total: i64,
    pub oldest_ms: Option<i64>,
    pub repo_total: i64,
    pub repo_oldest_ms: Option<i64>,
}
