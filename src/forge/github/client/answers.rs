//! GitHub's answers, reduced to what the director reads, and how they become the forge's
//! types.

use super::*;

#[derive(Deserialize)]
pub(super) struct RawInstallation {
    pub(super) id: u64,
}

#[derive(Deserialize)]
pub(super) struct RawApp {
    pub(super) slug: String,
}

#[derive(Deserialize, Default)]
pub(super) struct RawUser {
    #[serde(default)]
    pub(super) login: String,
}

#[derive(Deserialize)]
pub(super) struct RawLabel {
    pub(super) id: u64,
    pub(super) name: String,
}

#[derive(Deserialize)]
pub(super) struct RawIssue {
    pub(super) number: u64,
    #[serde(default)]
    pub(super) title: String,
    #[serde(default)]
    pub(super) body: Option<String>,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) labels: Vec<RawLabel>,
    #[serde(default)]
    pub(super) user: Option<RawUser>,
    #[serde(default)]
    pub(super) updated_at: String,
    #[serde(default)]
    pub(super) pull_request: Option<Value>,
    /// Search results only: `https://api.github.com/repos/OWNER/NAME`.
    #[serde(default)]
    pub(super) repository_url: String,
}

impl From<RawIssue> for Issue {
    fn from(r: RawIssue) -> Self {
        Issue {
            number: r.number,
            title: r.title,
            body: r.body.unwrap_or_default(),
            state: r.state,
            labels: r
                .labels
                .into_iter()
                .map(|l| Label {
                    id: l.id,
                    name: l.name,
                })
                .collect(),
            author: r.user.unwrap_or_default().login,
            updated_at: r.updated_at,
            is_pull: r.pull_request.is_some_and(|p| !p.is_null()),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawComment {
    pub(super) id: u64,
    #[serde(default)]
    pub(super) body: Option<String>,
    #[serde(default)]
    pub(super) user: Option<RawUser>,
    #[serde(default)]
    pub(super) created_at: String,
    #[serde(default)]
    pub(super) updated_at: String,
}

impl From<RawComment> for Comment {
    fn from(c: RawComment) -> Self {
        Comment {
            id: c.id,
            author: c.user.unwrap_or_default().login,
            body: c.body.unwrap_or_default(),
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawEvent {
    #[serde(default)]
    pub(super) event: String,
    #[serde(default)]
    pub(super) actor: Option<RawUser>,
    #[serde(default)]
    pub(super) label: Option<RawEventLabel>,
    #[serde(default)]
    pub(super) created_at: String,
}

#[derive(Deserialize)]
pub(super) struct RawEventLabel {
    pub(super) name: String,
}

#[derive(Deserialize)]
pub(super) struct RawPermission {
    pub(super) permission: String,
    #[serde(default)]
    pub(super) role_name: String,
}

#[derive(Deserialize)]
pub(super) struct RawRepository {
    pub(super) full_name: String,
    #[serde(default)]
    pub(super) default_branch: String,
    #[serde(default = "yes")]
    pub(super) private: bool,
}

pub(super) fn yes() -> bool {
    true
}

#[derive(Deserialize)]
pub(super) struct RawBranch {
    pub(super) name: String,
    pub(super) commit: RawSha,
}

#[derive(Deserialize)]
pub(super) struct RawSha {
    pub(super) sha: String,
}

#[derive(Deserialize)]
pub(super) struct RawCompare {
    pub(super) ahead_by: u64,
}

#[derive(Deserialize)]
pub(super) struct RawPull {
    pub(super) number: u64,
    pub(super) state: String,
    #[serde(default)]
    pub(super) merged: bool,
    #[serde(default)]
    pub(super) merged_at: Option<String>,
    #[serde(default)]
    pub(super) updated_at: Option<String>,
    #[serde(default)]
    pub(super) head: Option<RawPullRef>,
    #[serde(default)]
    pub(super) base: Option<RawPullRef>,
    #[serde(default)]
    pub(super) mergeable: Option<bool>,
    /// `clean`, `behind`, `blocked`, `dirty`, `unstable`, `unknown`...
    #[serde(default)]
    pub(super) mergeable_state: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawPullRef {
    #[serde(rename = "ref")]
    pub(super) name: String,
    pub(super) sha: String,
}

/// The combined status of a ref (`statuses`: the latest per context).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawCombined {
    pub(super) statuses: Vec<RawStatus>,
    pub(super) total_count: usize,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawStatus {
    pub(super) context: String,
    pub(super) state: String,
    pub(super) description: Option<String>,
    pub(super) target_url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawCheckRuns {
    pub(super) total_count: usize,
    pub(super) check_runs: Vec<RawCheckRun>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawCheckRun {
    pub(super) name: String,
    /// `queued`, `in_progress`, `completed`...
    pub(super) status: String,
    /// Once completed: `success`, `failure`, `neutral`, `cancelled`, `skipped`, `timed_out`,
    /// `action_required`.
    pub(super) conclusion: Option<String>,
    pub(super) details_url: Option<String>,
    pub(super) html_url: Option<String>,
    pub(super) output: Option<RawCheckOutput>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RawCheckOutput {
    pub(super) title: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawReview {
    pub(super) id: u64,
    #[serde(default)]
    pub(super) user: Option<RawUser>,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) body: Option<String>,
    #[serde(default)]
    pub(super) submitted_at: Option<String>,
    #[serde(default)]
    pub(super) commit_id: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawReviewComment {
    pub(super) path: String,
    #[serde(default)]
    pub(super) body: String,
    #[serde(default)]
    pub(super) line: Option<u64>,
    #[serde(default)]
    pub(super) original_line: Option<u64>,
    #[serde(default)]
    pub(super) side: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawToken {
    pub(super) token: String,
    #[serde(default)]
    pub(super) permissions: HashMap<String, String>,
    #[serde(default)]
    pub(super) repositories: Option<Vec<RawRepository>>,
}

#[derive(Deserialize)]
pub(super) struct RawRule {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) parameters: Option<Value>,
    #[serde(default)]
    pub(super) ruleset_id: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct RawRuleset {
    #[serde(default)]
    pub(super) enforcement: String,
    #[serde(default)]
    pub(super) current_user_can_bypass: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawProtection {
    #[serde(default)]
    pub(super) required_pull_request_reviews: Option<RawReviewRule>,
}

#[derive(Deserialize)]
pub(super) struct RawReviewRule {
    #[serde(default)]
    pub(super) required_approving_review_count: u64,
    #[serde(default)]
    pub(super) bypass_pull_request_allowances: Option<RawAllowances>,
}

#[derive(Deserialize)]
pub(super) struct RawAllowances {
    #[serde(default)]
    pub(super) apps: Vec<RawApp>,
}

#[derive(Deserialize)]
pub(super) struct RawSearch {
    #[serde(default)]
    pub(super) total_count: u64,
    #[serde(default)]
    pub(super) items: Vec<RawIssue>,
}

/// `owner/name` from a search item's `repository_url` (`.../repos/OWNER/NAME`).
pub(super) fn repo_of_url(url: &str) -> Option<RepoName> {
    let mut parts = url.trim_end_matches('/').rsplit('/');
    let name = parts.next()?;
    let owner = parts.next()?;
    (parts.next()? == "repos").then_some(())?;
    RepoName::new(owner, name).ok()
}

/// GitHub's review states in the words the director uses (Forgejo's).
pub(super) fn review_state(state: &str) -> String {
    match state {
        "CHANGES_REQUESTED" => "REQUEST_CHANGES".to_owned(),
        "COMMENTED" => "COMMENT".to_owned(),
        other => other.to_owned(),
    }
}
