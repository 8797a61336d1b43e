//! What the forge says of pull requests, their checks and reviews, and of forks: the types
//! the [`Forge`](super::Forge) calls about them return.

use serde::{Deserialize, Serialize};

use super::ForgeError;
use crate::domain::{CommitSha, RepoName};

pub use crate::domain::{Check, CheckState, MergeStyle};

/// The most checks read of one commit: a flood of contexts is cut here (and counts as not
/// passed).
pub const MAX_CHECKS: usize = 200;

/// A pull request as `GET /repos/{o}/{r}/pulls/{index}` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    pub number: u64,
    /// `open` or `closed`.
    pub state: String,
    pub merged: bool,
    pub updated_at: Option<String>,
    /// The head commit (`None`: the forge gave no commit id).
    #[serde(default)]
    pub head_sha: Option<CommitSha>,
    /// The head branch's name.
    #[serde(default)]
    pub head_ref: String,
    /// The base branch's name.
    #[serde(default)]
    pub base_ref: String,
    /// Where the head branched from the base (Forgejo's `merge_base`); empty when unknown.
    #[serde(default)]
    pub merge_base: String,
    /// The forge's own word: it can be merged without conflicts (`None`: not said, or still
    /// being checked).
    #[serde(default)]
    pub mergeable: Option<bool>,
    /// The base branch moved past the head's merge base (GitHub's `behind`); `None`: the
    /// forge does not say, and the director compares the merge base with the base's head.
    #[serde(default)]
    pub behind: Option<bool>,
    /// Where the head branch lives when it is not the repository itself (a fork); `None`:
    /// the repository, or not said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_repo: Option<RepoName>,
    /// The commit its merge made on the base (the merge, squash or last rebased commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_commit: Option<String>,
}

/// A commit of a branch, as a list of them shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitSummary {
    pub sha: String,
    pub message: String,
    /// Where a person reads it.
    pub url: String,
    /// Its parents' ids, the first parent first (two or more: a merge commit).
    #[serde(default)]
    pub parents: Vec<String>,
}

impl PullRequest {
    /// The fork its head branch lives in, when it comes from one.
    pub fn fork(&self, repo: &RepoName) -> Option<&RepoName> {
        self.head_repo.as_ref().filter(|h| *h != repo)
    }
}

/// How a fork's branch stands against the same branch of the repository it was forked from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForkSync {
    /// It is the base's.
    InStep,
    /// It was behind and was brought up to the base.
    Synced,
    /// It holds commits the base lacks, so it cannot be brought up (nor be trusted as the
    /// base): a person must look.
    Diverged,
}

/// A commit's checks, as far as they were read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checks {
    pub checks: Vec<Check>,
    /// More contexts than were read (a flood): the state is `failure` unless every one read
    /// passed, then `pending`.
    #[serde(default)]
    pub truncated: bool,
    /// Workflow runs of the commit that the forge holds until a maintainer approves them
    /// (Forgejo's `need_approval`: a pull request from a fork by an untrusted poster).
    #[serde(default)]
    pub held: u32,
}

impl Checks {
    /// The combined state: a held workflow run is neither a failure nor a success, so what
    /// passes or says nothing yet is pending while one waits.
    pub fn state(&self) -> CheckState {
        let read = CheckState::combined(&self.checks);
        if (self.truncated || self.held > 0) && read >= CheckState::Warning {
            CheckState::Pending
        } else {
            read
        }
    }
}

/// A merge's or an update's answer: done, or refused with one of `refusals` (or 403), what a
/// person must see and is never repeated as is; anything else is an error (retried).
pub(crate) fn refused_or_done<T>(
    sent: Result<T, ForgeError>,
    refusals: &[u16],
) -> Result<MergeAnswer, ForgeError> {
    match sent {
        Ok(_) => Ok(MergeAnswer::Done),
        Err(ForgeError::Status {
            status, message, ..
        }) if refusals.contains(&status) => Ok(MergeAnswer::Refused { status, message }),
        Err(ForgeError::Forbidden { .. }) => Ok(MergeAnswer::Refused {
            status: 403,
            message: "the director's forge account may not do this".to_owned(),
        }),
        Err(e) => Err(e),
    }
}

/// What the forge said to a merge or an update of a pull request's branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum MergeAnswer {
    /// Done.
    Done,
    /// Refused for a reason a person must see (405, 409, 422...): never repeated as is.
    Refused { status: u16, message: String },
}

/// A submitted (or pending) review.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Review {
    pub id: u64,
    pub user: String,
    /// `APPROVED`, `PENDING`, `COMMENT`, `REQUEST_CHANGES`, `REQUEST_REVIEW`, or empty.
    pub state: String,
    pub body: String,
    pub submitted_at: Option<String>,
    /// The commit the review was made on (`None`: not said).
    #[serde(default)]
    pub commit_id: Option<CommitSha>,
    /// Dismissed by a person or by the forge (a newer review by the same user, a push).
    #[serde(default)]
    pub dismissed: bool,
}

/// An inline comment of a review: on a file, at a line of the new (or the old) version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewComment {
    pub path: String,
    pub body: String,
    /// The line in the new file, when on the new side.
    pub line: Option<u64>,
    /// The line in the old file, when on the old side.
    pub old_line: Option<u64>,
}
