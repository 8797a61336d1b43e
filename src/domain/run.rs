//! One coder run: [`RunRecord`] and its typed [`RunState`].

use serde::{Deserialize, Serialize};

use super::{IssueRef, RepoName};

/// Where a run stands. A run id names one container and one token (`director-run-<id>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted: the token is being minted and the container created and started.
    Launching,
    /// The container was started (or adopted after a restart).
    Running,
    /// The container ended; the branch is being checked and the pull request opened.
    Exited,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    /// Stopped before anything started (PR-only check failed).
    Refused,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launching => "launching",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Launching,
            Self::Running,
            Self::Exited,
            Self::Succeeded,
            Self::Failed,
            Self::TimedOut,
            Self::Cancelled,
            Self::Refused,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Not ended yet: at most one such run per issue (a unique index holds it too).
    pub fn is_active(self) -> bool {
        matches!(self, Self::Launching | Self::Running | Self::Exited)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One coder run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub repo: RepoName,
    pub number: u64,
    pub state: RunState,
    pub branch: String,
    pub base_branch: String,
    pub container_id: Option<String>,
    pub pr_number: Option<u64>,
    pub detail: Option<String>,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// The container's exit code, once it ended.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// The end of the run's output, redacted, kept for the report.
    #[serde(default)]
    pub log_tail: Option<String>,
    /// The issue was cancelled while the run was active: it ends as cancelled.
    #[serde(default)]
    pub stop_requested: bool,
}

impl RunRecord {
    pub fn issue_ref(&self) -> IssueRef {
        IssueRef::new(self.repo.clone(), self.number)
    }

    /// A new run for `issue`, admitted at `now_ms`.
    pub fn admitted(issue: &IssueRef, id: &str, branch: &str, now_ms: i64) -> Self {
        Self {
            id: id.to_owned(),
            repo: issue.repo.clone(),
            number: issue.number,
            state: RunState::Launching,
            branch: branch.to_owned(),
            base_branch: String::new(),
            container_id: None,
            pr_number: None,
            detail: None,
            created_at_ms: now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            exit_code: None,
            log_tail: None,
            stop_requested: false,
        }
    }
}
