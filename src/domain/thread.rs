//! What writers grant an issue in its thread: hosts approved for its runs (`/director allow
//! host:port`, within `runner.egress_approvable`) and a budget to go on with after a run was
//! stopped on its own (`/director continue [$N]`). Kept on the record, never shared
//! with another issue.

use serde::{Deserialize, Serialize};

use super::{CommitSha, RepoName, RunId};

/// What writers granted the issue in its thread.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ThreadGrants {
    /// `host:port` entries writers approved for this runs (its later runs, attempts
    /// and follow-ups), sorted, each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_allowed: Vec<String>,
    /// The refused run an approval started again: each refused run is retried once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retried: Option<RunId>,
    /// A writer's `/director continue`, until its run is admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuation: Option<Continuation>,
}

impl ThreadGrants {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A run that goes on where one stopped on its budget stopped: on its branch, from its base,
/// with a budget of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Continuation {
    /// The run stopped on its budget.
    pub from: RunId,
    /// Its branch, which the new run checks out and pushes to.
    pub branch: String,
    /// Where that branch lives (its fork), when not in the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<RepoName>,
    /// The base commit its pushes descend from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<CommitSha>,
    /// The new run's own budget, in dollars (`budget.run_usd` for it); 0: none.
    pub usd: f64,
    /// What the stopped run spent, as the model gateway metered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent_usd: Option<f64>,
    /// Who said `/director continue`.
    pub by: String,
}

/// Compared by their text: a budget is never NaN (the command's parser refuses it).
impl Eq for Continuation {}
