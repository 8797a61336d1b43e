//! The pull request a run opened, what became of it, and the review feedback waiting to be
//! answered by a follow-up run on its branch.

use serde::{Deserialize, Serialize};

/// One check of a commit: a commit status's latest state for its context (or, on GitHub, a
/// check run's conclusion).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub context: String,
    pub state: CheckState,
    #[serde(default)]
    pub description: String,
    /// Where to read it (absolute; a forge's relative path is made absolute).
    #[serde(default)]
    pub target_url: String,
}

/// How a commit's checks stand, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckState {
    /// `failure` or `error`.
    Failure,
    /// Running or waiting.
    Pending,
    /// `warning`: not a failure to answer, not a pass to merge on.
    Warning,
    Success,
    /// No check reported at all.
    None,
}

impl CheckState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failure => "failure",
            Self::Pending => "pending",
            Self::Warning => "warning",
            Self::Success => "success",
            Self::None => "none",
        }
    }

    /// A forge's state word; anything unknown counts as a failure (as Forgejo maps it).
    pub fn from_forge(state: &str) -> Self {
        match state.trim().to_ascii_lowercase().as_str() {
            "success" | "neutral" | "skipped" => Self::Success,
            "pending" | "queued" | "in_progress" | "waiting" | "requested" | "expected" => {
                Self::Pending
            }
            "warning" => Self::Warning,
            _ => Self::Failure,
        }
    }

    /// The state of a set of checks: the worst of them; none at all is [`CheckState::None`].
    pub fn combined(checks: &[Check]) -> Self {
        checks.iter().map(|c| c.state).min().unwrap_or(Self::None)
    }
}

/// How a pull request is merged (Forgejo's `Do`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MergeStyle {
    #[default]
    #[serde(rename = "merge")]
    Merge,
    #[serde(rename = "rebase")]
    Rebase,
    #[serde(rename = "rebase-merge")]
    RebaseMerge,
    #[serde(rename = "squash")]
    Squash,
    #[serde(rename = "fast-forward-only")]
    FastForwardOnly,
}

impl MergeStyle {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Merge => "merge",
            Self::Rebase => "rebase",
            Self::RebaseMerge => "rebase-merge",
            Self::Squash => "squash",
            Self::FastForwardOnly => "fast-forward-only",
        }
    }
}

/// What became of the pull request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullState {
    Open,
    Merged,
    Closed,
}

impl PullState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Merged => "merged",
            Self::Closed => "closed",
        }
    }
}

/// How many answered feedback keys a pull request remembers (older ones are dropped; a
/// review that old is not delivered again).
const HANDLED_KEPT: usize = 64;

/// The pull request of an issue's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRecord {
    pub number: u64,
    /// Its head branch: follow-up runs push here.
    pub branch: String,
    pub state: PullState,
    /// Follow-up runs started since it opened (or since a writer's `/director retry`).
    #[serde(default)]
    pub followups: u32,
    /// Times a writer lifted the cap with `/director retry`: names the cap notice.
    #[serde(default)]
    pub grants: u32,
    /// Feedback waiting for a follow-up run.
    #[serde(default)]
    pub pending: Option<Feedback>,
    /// Feedback that arrived past the cap; a writer's `/director retry` on the PR starts it.
    #[serde(default)]
    pub capped: Option<Feedback>,
    /// Keys of feedback already taken (a review or comment is answered once).
    #[serde(default)]
    pub handled: Vec<String>,
    /// What was last read of its head's checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<PullChecks>,
    /// Follow-up runs started for failing checks (`runner.max_ci_followups`).
    #[serde(default)]
    pub ci_followups: u32,
    /// Reads of its checks planned so far: names each read's action apart.
    #[serde(default)]
    pub check_reads: u32,
    /// The merge lane's view of it, when the lane is on for its repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeLane>,
    /// When the director opened it (`None`: opened before this was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at_ms: Option<i64>,
    /// When it was merged or closed, as the director learnt it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
    /// A later commit of the base that reverts its merge, once found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<Reverted>,
    /// It was opened as a draft (`WIP: `) because the director's checks did not pass: the
    /// title to give it once they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// Whether the director's checks (`[checks]`) passed when it opened (`None`: it had
    /// none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_green: Option<bool>,
    /// Follow-up runs that answered a failing `director/checks` (among `ci_followups`).
    #[serde(default)]
    pub check_followups: u32,
}

/// A commit of the base branch that reverts a merged pull request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reverted {
    /// The reverting commit.
    pub sha: String,
    /// Where a person reads it.
    #[serde(default)]
    pub url: String,
    pub found_at_ms: i64,
}

/// The checks of a pull request's head, as last read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullChecks {
    /// The head commit they are of.
    pub head: String,
    pub state: CheckState,
    /// The failing ones (at most [`FAILING_KEPT`], their text cut), for the follow-up's task
    /// and the status page.
    #[serde(default)]
    pub failing: Vec<Check>,
    /// How many contexts there were.
    #[serde(default)]
    pub contexts: usize,
    /// Workflow runs the forge holds for a maintainer's approval (a pull request from a
    /// fork): neither failing nor passing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub held: u32,
    /// When this head was first seen: a head with no check yet is read again for a while,
    /// CI may not have started.
    pub since_ms: i64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Failing checks kept per pull request.
pub const FAILING_KEPT: usize = 20;
/// A check's context, description or URL, cut to this many characters.
pub const CHECK_TEXT_CHARS: usize = 300;

/// The failing ones of `checks`, at most [`FAILING_KEPT`], each text cut at
/// [`CHECK_TEXT_CHARS`] with no control character (a terminal's escapes) left: what a
/// pull request keeps of its checks, and what a read reports.
pub fn failing(checks: &[Check]) -> Vec<Check> {
    let cut = |s: &str| {
        s.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(CHECK_TEXT_CHARS)
            .collect::<String>()
    };
    checks
        .iter()
        .filter(|c| c.state == CheckState::Failure)
        .take(FAILING_KEPT)
        .map(|c| Check {
            context: cut(&c.context),
            state: c.state,
            description: cut(&c.description),
            target_url: cut(&c.target_url),
        })
        .collect()
}

/// Where a pull request stands in the merge lane.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeLane {
    /// Why it is not merged yet (empty: not looked at yet).
    #[serde(default)]
    pub waiting: String,
    /// Writers whose approval of the current head counts.
    #[serde(default)]
    pub approvals: Vec<String>,
    /// The head the forge refused to merge or update, and why: said once, not tried again
    /// until the head moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<(String, String)>,
    /// Attempts planned so far: names each attempt's action apart.
    #[serde(default)]
    pub tries: u32,
    /// An attempt is planned or under way.
    #[serde(default)]
    pub trying: bool,
    /// It waits for something no webhook announces (the forge's mergeability, the base): the
    /// checks poll tries again.
    #[serde(default)]
    pub poll: bool,
}

impl PullRecord {
    pub fn opened(number: u64, branch: &str) -> Self {
        Self {
            number,
            branch: branch.to_owned(),
            state: PullState::Open,
            followups: 0,
            grants: 0,
            pending: None,
            capped: None,
            handled: Vec::new(),
            checks: None,
            ci_followups: 0,
            check_reads: 0,
            merge: None,
            opened_at_ms: None,
            ended_at_ms: None,
            reverted: None,
            draft: None,
            opened_green: None,
            check_followups: 0,
        }
    }

    pub fn is_open(&self) -> bool {
        self.state == PullState::Open
    }

    /// `feedback` waits for the next follow-up, with whatever waited already.
    pub fn wait_on(&mut self, feedback: Feedback) {
        self.pending = Some(match self.pending.take() {
            Some(waiting) => waiting.merged_with(feedback),
            None => feedback,
        });
    }

    /// Remembers `key`; false when it was taken before.
    pub fn take(&mut self, key: &str) -> bool {
        if self.handled.iter().any(|k| k == key) {
            return false;
        }
        self.handled.push(key.to_owned());
        if self.handled.len() > HANDLED_KEPT {
            self.handled.remove(0);
        }
        true
    }
}

/// A writer's review or `/director fix` comment, as the follow-up run's task gets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feedback {
    /// Names it once: `review:<id>` or `comment:<id>`.
    pub key: String,
    /// The writer who gave it.
    pub by: String,
    /// The review body with each inline comment (file and line), or the fix instructions.
    pub text: String,
}

impl Feedback {
    /// Two pieces of feedback waiting at once go to one follow-up run.
    pub fn merged_with(self, later: Feedback) -> Feedback {
        Feedback {
            key: later.key,
            by: if super::same_login(&self.by, &later.by) {
                later.by
            } else {
                format!("{}, {}", self.by, later.by)
            },
            text: format!("{}\n\n---\n\n{}", self.text, later.text),
        }
    }
}

/// A follow-up run: which pull request it answers, with what, from which head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUp {
    pub pr: u64,
    pub feedback: Feedback,
    /// The branch's head commit when the run started: it succeeds once the branch moved past.
    #[serde(default)]
    pub start_head: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_is_taken_once() {
        let mut pr = PullRecord::opened(3, "director-issue-1-abc");
        assert!(pr.take("review:9"));
        assert!(!pr.take("review:9"));
        for i in 0..100 {
            pr.take(&format!("comment:{i}"));
        }
        assert_eq!(pr.handled.len(), HANDLED_KEPT);
    }

    #[test]
    fn waiting_feedback_is_merged_into_one_task() {
        let a = Feedback {
            key: "review:1".into(),
            by: "alice".into(),
            text: "Rename it.".into(),
        };
        let b = Feedback {
            key: "comment:2".into(),
            by: "bob".into(),
            text: "And add a test.".into(),
        };
        let m = a.merged_with(b);
        assert_eq!(m.key, "comment:2");
        assert_eq!(m.by, "alice, bob");
        assert!(m.text.contains("Rename it.") && m.text.contains("And add a test."));
    }
}
