//! The kinds of side effect the director performs: the engine's `Action` says what to do, and
//! its kind is what the outbox's `kind` column, the metrics and an action's outcome name.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which kind of action: one per `Action` variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    ResolveTrigger,
    AuthorizeCommand,
    PostNotice,
    ReadPreflight,
    UpsertSticky,
    FileRouted,
    SyncLabels,
    StartRun,
    StopRun,
    JudgeRun,
    OpenPr,
    RemoveContainer,
    RevokeToken,
    ReportRun,
    CommentOnPull,
    ReadFeedback,
    ReadChecks,
    TryMerge,
    RunChecks,
    PostStatus,
    RetitlePull,
    /// A kind this version does not know (stored by a newer one).
    #[serde(other)]
    Unknown,
}

impl ActionKind {
    pub const ALL: [ActionKind; 21] = [
        Self::ResolveTrigger,
        Self::AuthorizeCommand,
        Self::PostNotice,
        Self::ReadPreflight,
        Self::UpsertSticky,
        Self::FileRouted,
        Self::SyncLabels,
        Self::StartRun,
        Self::StopRun,
        Self::JudgeRun,
        Self::OpenPr,
        Self::RemoveContainer,
        Self::RevokeToken,
        Self::ReportRun,
        Self::CommentOnPull,
        Self::ReadFeedback,
        Self::ReadChecks,
        Self::TryMerge,
        Self::RunChecks,
        Self::PostStatus,
        Self::RetitlePull,
    ];

    /// The `kind` column and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ResolveTrigger => "resolve_trigger",
            Self::AuthorizeCommand => "authorize_command",
            Self::PostNotice => "post_notice",
            Self::ReadPreflight => "read_preflight",
            Self::UpsertSticky => "upsert_sticky",
            Self::FileRouted => "file_routed",
            Self::SyncLabels => "sync_labels",
            Self::StartRun => "start_run",
            Self::StopRun => "stop_run",
            Self::JudgeRun => "judge_run",
            Self::OpenPr => "open_pr",
            Self::RemoveContainer => "remove_container",
            Self::RevokeToken => "revoke_token",
            Self::ReportRun => "report_run",
            Self::CommentOnPull => "comment_on_pull",
            Self::ReadFeedback => "read_feedback",
            Self::ReadChecks => "read_checks",
            Self::TryMerge => "try_merge",
            Self::RunChecks => "run_checks",
            Self::PostStatus => "post_status",
            Self::RetitlePull => "retitle_pull",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads the outbox's `kind` column; a name this version does not know is `Unknown`.
impl FromStr for ActionKind {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or(Self::Unknown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_back_as_itself_in_the_column_and_in_json() {
        for kind in ActionKind::ALL {
            assert_eq!(kind.as_str().parse::<ActionKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).expect("serialises");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<ActionKind>(&json).ok(), Some(kind));
        }
        assert_eq!(
            "from_the_future".parse::<ActionKind>(),
            Ok(ActionKind::Unknown)
        );
        assert_eq!(
            serde_json::from_str::<ActionKind>("\"from_the_future\"").ok(),
            Some(ActionKind::Unknown)
        );
    }
}
