//! Forgejo's JSON as the director reads it: every field defaulted, so other Forgejo versions
//! decode.

use serde::Deserialize;
use serde_json::Value;

use crate::domain::RepoName;
use crate::forge::{Comment, Hook, Issue, Label};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireBranch {
    pub(super) name: String,
    #[serde(default)]
    pub(super) commit: Option<WireCommitRef>,
    pub(super) user_can_push: Option<bool>,
    pub(super) user_can_merge: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireCompare {
    pub(super) total_commits: u64,
    pub(super) commits: Vec<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireToken {
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) sha1: String,
    pub(super) scopes: Vec<String>,
    pub(super) repositories: Option<Vec<WireRepoMeta>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireRepoMeta {
    pub(super) name: String,
    pub(super) owner: String,
    pub(super) full_name: String,
}

impl WireRepoMeta {
    pub(super) fn repo(&self) -> Option<RepoName> {
        self.full_name
            .parse()
            .ok()
            .or_else(|| RepoName::new(&self.owner, &self.name).ok())
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WirePull {
    pub(super) number: u64,
    pub(super) state: String,
    #[serde(default)]
    pub(super) merged: bool,
    #[serde(default)]
    pub(super) updated_at: Option<String>,
    pub(super) head: Option<WireBranchRef>,
    pub(super) base: Option<WireBranchRef>,
    pub(super) merge_base: Option<String>,
    pub(super) mergeable: Option<bool>,
    #[serde(default)]
    pub(super) merge_commit_sha: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireBranchRef {
    #[serde(rename = "ref")]
    pub(super) name: String,
    pub(super) sha: String,
    /// The repository the branch lives in (a fork, for a pull request from one).
    pub(super) repo: Option<WireForkRepo>,
}

/// `CombinedStatus`: the latest status of each context (one page of them).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireCombined {
    pub(super) statuses: Option<Vec<WireStatus>>,
    pub(super) total_count: usize,
}

/// `CommitStatus`: its state is named `status` (the create body's `state`).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireStatus {
    pub(super) context: String,
    pub(super) status: String,
    pub(super) description: Option<String>,
    pub(super) target_url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireCommitRef {
    pub(super) id: String,
}

#[derive(Deserialize)]
pub(super) struct WireReview {
    pub(super) id: u64,
    #[serde(default)]
    pub(super) user: Option<WireUser>,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) body: String,
    #[serde(default)]
    pub(super) submitted_at: Option<String>,
    #[serde(default)]
    pub(super) commit_id: String,
    #[serde(default)]
    pub(super) dismissed: bool,
}

#[derive(Deserialize)]
pub(super) struct WireReviewComment {
    #[serde(default)]
    pub(super) path: String,
    #[serde(default)]
    pub(super) body: String,
    #[serde(default)]
    pub(super) position: Option<u64>,
    #[serde(default)]
    pub(super) original_position: Option<u64>,
}

// Wire types: every field defaulted, so other Forgejo versions decode.

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireUser {
    pub(super) login: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireLabel {
    pub(super) id: u64,
    pub(super) name: String,
}

#[derive(Deserialize)]
pub(super) struct WireIssue {
    pub(super) number: u64,
    #[serde(default)]
    pub(super) title: String,
    #[serde(default)]
    pub(super) body: String,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) labels: Option<Vec<WireLabel>>,
    #[serde(default)]
    pub(super) user: Option<WireUser>,
    #[serde(default)]
    pub(super) updated_at: String,
    #[serde(default)]
    pub(super) pull_request: Option<Value>,
    /// Present in search results, which span repositories.
    #[serde(default)]
    pub(super) repository: Option<WireRepoMeta>,
}

impl From<WireIssue> for Issue {
    fn from(w: WireIssue) -> Self {
        Issue {
            number: w.number,
            title: w.title,
            body: w.body,
            state: w.state,
            labels: w
                .labels
                .unwrap_or_default()
                .into_iter()
                .map(|l| Label {
                    id: l.id,
                    name: l.name,
                })
                .collect(),
            author: w.user.map(|u| u.login).unwrap_or_default(),
            updated_at: w.updated_at,
            is_pull: w.pull_request.is_some_and(|p| !p.is_null()),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct WireComment {
    pub(super) id: u64,
    #[serde(default)]
    pub(super) body: String,
    #[serde(default)]
    pub(super) user: Option<WireUser>,
    #[serde(default)]
    pub(super) created_at: String,
    #[serde(default)]
    pub(super) updated_at: String,
}

impl From<WireComment> for Comment {
    fn from(w: WireComment) -> Self {
        Comment {
            id: w.id,
            author: w.user.map(|u| u.login).unwrap_or_default(),
            body: w.body,
            created_at: w.created_at,
            updated_at: w.updated_at,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireTimeline {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) body: String,
    pub(super) user: Option<WireUser>,
    pub(super) label: Option<WireLabel>,
    pub(super) created_at: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireRepo {
    pub(super) name: String,
    pub(super) full_name: String,
    pub(super) default_branch: String,
    pub(super) owner: Option<WireUser>,
    pub(super) private: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireHook {
    pub(super) id: u64,
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) config: std::collections::HashMap<String, String>,
    pub(super) events: Vec<String>,
    pub(super) active: bool,
}

impl From<WireHook> for Hook {
    fn from(w: WireHook) -> Self {
        Self {
            id: w.id,
            kind: w.kind,
            url: w.config.get("url").cloned().unwrap_or_default(),
            content_type: w.config.get("content_type").cloned().unwrap_or_default(),
            events: w.events,
            active: w.active,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WirePermission {
    pub(super) permission: String,
}

/// A repository with what says whether it is a fork, and of what.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireForkRepo {
    pub(super) full_name: String,
    pub(super) fork: bool,
    pub(super) parent: Option<Box<WireForkRepo>>,
    /// Whether Forgejo Actions is on (a unit of the repository).
    #[serde(default)]
    pub(super) has_actions: bool,
}

/// `SyncForkInfo`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireSyncFork {
    pub(super) allowed: bool,
    pub(super) fork_commit: String,
    pub(super) base_commit: String,
}

/// `GET .../actions/runs`: `{workflow_runs, total_count}`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireActionRuns {
    pub(super) workflow_runs: Vec<WireActionRun>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireActionRun {
    pub(super) need_approval: bool,
    pub(super) status: String,
}

/// `Commit`, reduced to what a revert check reads.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireCommit {
    pub(super) sha: String,
    pub(super) html_url: String,
    pub(super) commit: Option<WireRepoCommit>,
    pub(super) parents: Vec<WireCommitMeta>,
}

/// `CommitMeta`: a parent, named by its id.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireCommitMeta {
    pub(super) sha: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct WireRepoCommit {
    pub(super) message: String,
}
