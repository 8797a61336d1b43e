//! The bottom of the house: small types that can only exist when valid (a repository name, an
//! issue reference), the records the director keeps of issues and runs, commands, and the
//! verdict. Nothing here does I/O, and nothing here imports another module of the crate.

pub mod action_kind;
pub mod agent;
pub mod approval;
pub mod checks;
pub mod command;
pub mod commit;
pub mod filer;
pub mod forecast;
pub mod git_env;
pub mod issue;
pub mod junit;
pub mod outcomes;
pub mod protected;
pub mod pull;
pub mod run;
pub mod setup;
pub mod thread;
pub mod units;
pub mod verdict;

pub use action_kind::ActionKind;
pub use agent::{AgentChoice, AgentSource};
pub use command::Command;
pub use commit::{BadCommitSha, CommitSha};
pub use issue::{IssueRecord, Judgement, LeftOut, PreflightState, Vouched};
pub use pull::{
    Check, CheckState, Feedback, FollowUp, MergeLane, MergeStyle, PullChecks, PullRecord, PullState,
};
pub use run::{BadRunId, RunId, RunRecord, RunSettings, RunState};

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `owner/name`, both parts non-empty and made of the characters Forgejo allows.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoName {
    owner: String,
    name: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DomainError {
    #[error("`{0}` is not a repository name of the form owner/name")]
    BadRepo(String),
    #[error("`{0}` is not an issue reference of the form owner/name#number")]
    BadIssueRef(String),
}

fn valid_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 100
        && part != "."
        && part != ".."
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl RepoName {
    /// Owner and name are case-insensitive on Forgejo and GitHub, so a repository has one
    /// identity however it is spelled (in the settings, a webhook, a scan): its lower-case
    /// spelling, which every forge API and web page accepts.
    pub fn new(owner: &str, name: &str) -> Result<Self, DomainError> {
        if valid_part(owner) && valid_part(name) {
            Ok(Self {
                owner: owner.to_ascii_lowercase(),
                name: name.to_ascii_lowercase(),
            })
        } else {
            Err(DomainError::BadRepo(format!("{owner}/{name}")))
        }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether two spellings name one account: logins are case-insensitive on Forgejo and GitHub,
/// and the settings may spell one (`forge.runner_login`, `forge.bot_login`) unlike the forge.
pub fn same_login(a: &str, b: &str) -> bool {
    !a.is_empty() && a.eq_ignore_ascii_case(b)
}

/// Whether the configuration watches `repo`: listed in `repos`, or owned by one of `orgs`
/// (names compared as Forgejo does, ignoring case). Only watched repositories are acted on.
pub fn is_watched(repos: &[RepoName], orgs: &[String], repo: &RepoName) -> bool {
    repos.iter().any(|r| {
        r.owner().eq_ignore_ascii_case(repo.owner()) && r.name().eq_ignore_ascii_case(repo.name())
    }) || orgs.iter().any(|o| o.eq_ignore_ascii_case(repo.owner()))
}

/// Where an issue's labels put it among `priority` (priority labels, highest first):
/// unlabelled issues come last. Queued issues start in this order, then in queue order.
pub fn priority_rank(priority: &[String], labels: &[String]) -> usize {
    priority
        .iter()
        .position(|p| labels.iter().any(|l| l == p))
        .unwrap_or(priority.len())
}

impl FromStr for RepoName {
    type Err = DomainError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (owner, name) = s
            .split_once('/')
            .ok_or_else(|| DomainError::BadRepo(s.to_owned()))?;
        Self::new(owner, name).map_err(|_| DomainError::BadRepo(s.to_owned()))
    }
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

impl Serialize for RepoName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RepoName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One issue of one repository: `owner/name#number`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IssueRef {
    pub repo: RepoName,
    pub number: u64,
}

impl IssueRef {
    pub fn new(repo: RepoName, number: u64) -> Self {
        Self { repo, number }
    }
}

impl FromStr for IssueRef {
    type Err = DomainError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DomainError::BadIssueRef(s.to_owned());
        let (repo, number) = s.split_once('#').ok_or_else(bad)?;
        let repo = repo.parse().map_err(|_| bad())?;
        let number = number.parse::<u64>().map_err(|_| bad())?;
        if number == 0 {
            return Err(bad());
        }
        Ok(Self { repo, number })
    }
}

impl fmt::Display for IssueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.repo, self.number)
    }
}

/// Where an issue stands with the director (see DESIGN.md, "Issue lifecycle").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Not handed to the director (no trigger, or one applied by someone who may not).
    #[default]
    Untracked,
    /// Handed over by a writer; the pre-flight reads it (again).
    Pending,
    /// The pre-flight said GO (or the gate was skipped): waiting for a run.
    Queued,
    /// The pre-flight said GO and `preflight.approval` asks a writer's `/director go`.
    AwaitingApproval,
    /// The pre-flight said NO-GO; a trusted edit or comment reads it again.
    NoGo,
    /// The pre-flight asked questions in the thread; a writer's answer reads it again.
    NeedsInfo,
    /// The pre-flight said WRONG-REPO and the issue was filed in the named repository.
    Routed,
    /// The pre-flight could not run after every attempt; the issue waits.
    PreflightFailed,
    /// Admitted: the run's token is minted and its container created and started.
    Launching,
    /// A coder run's container is running (or has exited and is being judged).
    Running,
    /// The run's branch became a pull request, and it is open.
    Succeeded,
    /// The pull request was merged.
    Merged,
    /// The pull request was closed without merging.
    PrClosed,
    /// The agent reported that it cannot or should not do the work (its result file).
    Declined,
    /// The run ended without a branch ahead of the base, or was refused.
    Failed,
    /// The run outlived `runner.timeout_secs` and was killed.
    TimedOut,
    /// The run's model calls spent a budget of `[budget]`, and it was stopped.
    OverBudget,
    /// The trigger was removed or the issue closed after it was handed over.
    Cancelled,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Untracked => "untracked",
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::AwaitingApproval => "awaiting_approval",
            Self::NoGo => "no_go",
            Self::NeedsInfo => "needs_info",
            Self::Routed => "routed",
            Self::PreflightFailed => "preflight_failed",
            Self::Launching => "launching",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Merged => "merged",
            Self::PrClosed => "pr_closed",
            Self::Declined => "declined",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::OverBudget => "over_budget",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "untracked" => Some(Self::Untracked),
            "pending" => Some(Self::Pending),
            "queued" => Some(Self::Queued),
            "awaiting_approval" => Some(Self::AwaitingApproval),
            "no_go" => Some(Self::NoGo),
            "needs_info" => Some(Self::NeedsInfo),
            "routed" => Some(Self::Routed),
            "preflight_failed" => Some(Self::PreflightFailed),
            "launching" => Some(Self::Launching),
            "running" => Some(Self::Running),
            "succeeded" => Some(Self::Succeeded),
            "merged" => Some(Self::Merged),
            "pr_closed" => Some(Self::PrClosed),
            "declined" => Some(Self::Declined),
            "failed" => Some(Self::Failed),
            "timed_out" => Some(Self::TimedOut),
            "over_budget" => Some(Self::OverBudget),
            "cancelled" => Some(Self::Cancelled),
            _ => None,
        }
    }

    /// The director is working on the issue: removing the trigger or closing it cancels.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            Self::Pending
                | Self::Queued
                | Self::AwaitingApproval
                | Self::NoGo
                | Self::NeedsInfo
                | Self::Routed
                | Self::PreflightFailed
                | Self::Launching
                | Self::Running
        )
    }
}

impl fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_parse_only_when_well_formed() {
        let repo: RepoName = "acme/widgets".parse().expect("valid");
        assert_eq!(repo.owner(), "acme");
        assert_eq!(repo.name(), "widgets");
        assert_eq!(repo.to_string(), "acme/widgets");
        for bad in ["", "acme", "/x", "x/", "a/b/c", "a/..", "a b/c", "ä/b"] {
            assert!(bad.parse::<RepoName>().is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn a_repository_spelled_in_two_cases_is_one_repository() {
        let a: IssueRef = "Acme/Widgets#7".parse().expect("valid");
        let b: IssueRef = "acme/WIDGETS#7".parse().expect("valid");
        assert_eq!(a, b);
        assert_eq!(a.to_string(), b.to_string(), "one store key");
        let json: RepoName = serde_json::from_str("\"ACME/widgets\"").expect("valid");
        assert_eq!(json, a.repo);
    }

    #[test]
    fn logins_compare_as_the_forge_does() {
        assert!(same_login("Director-Runner", "director-runner"));
        assert!(!same_login("", ""), "an unknown login is nobody");
        assert!(!same_login("runner", "runner2"));
    }

    #[test]
    fn issue_refs_round_trip() {
        let r: IssueRef = "acme/widgets#42".parse().expect("valid");
        assert_eq!(r.number, 42);
        assert_eq!(r.to_string(), "acme/widgets#42");
        for bad in [
            "acme/widgets",
            "acme/widgets#",
            "acme/widgets#0",
            "acme#1",
            "a/b#-1",
        ] {
            assert!(bad.parse::<IssueRef>().is_err(), "{bad:?} must be rejected");
        }
    }
}
