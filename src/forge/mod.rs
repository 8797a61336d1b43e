//! Everything about the forge: webhook payloads, the [`Forge`] trait covering exactly the
//! calls the director makes, its Forgejo and GitHub implementations. The stateful fake is in the test kit.

pub mod forgejo;
pub mod github;
pub mod payload;
mod pulls;
pub mod signature;

pub use pulls::*;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::{CommitSha, IssueRef, RepoName};

/// The bot's login, once the forge said it (or as `forge.bot_login` names it): what the
/// parts that ignore the bot's own events compare authors with. Learnt once, after start.
#[derive(Clone, Debug, Default)]
pub struct BotLogin(std::sync::Arc<std::sync::RwLock<Option<String>>>);

impl BotLogin {
    pub fn new(known: Option<String>) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(known)))
    }

    /// The login, when known.
    pub fn get(&self) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// What the forge said.
    pub fn learn(&self, login: String) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(login);
    }

    /// Whether `login` is the bot's (case aside).
    pub fn is(&self, login: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_deref()
            .is_some_and(|b| b.eq_ignore_ascii_case(login))
    }
}
/// An issue as the API returns it, reduced to what the director reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issue {
    pub number: u64,
    pub title: String,
    pub body: String,
    /// `open` or `closed`.
    pub state: String,
    pub labels: Vec<Label>,
    pub author: String,
    /// RFC 3339, second resolution.
    pub updated_at: String,
    pub is_pull: bool,
}

impl Issue {
    pub fn has_label(&self, name: &str) -> bool {
        self.labels.iter().any(|l| l.name == name)
    }

    pub fn label_names(&self) -> Vec<String> {
        self.labels.iter().map(|l| l.name.clone()).collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    pub id: u64,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comment {
    pub id: u64,
    pub author: String,
    pub body: String,
    pub created_at: String,
    pub updated_at: String,
}

/// One entry of an issue's timeline; only label changes are read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// Forgejo's comment type: `label`, `comment`, `close`, ...
    pub kind: String,
    pub actor: String,
    /// For `label` entries: the label's name.
    pub label: Option<String>,
    /// For `label` entries: added (`body == "1"`) or removed.
    pub added: bool,
    pub created_at: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repository {
    pub name: RepoName,
    pub default_branch: String,
    /// Visible only to those given access (a field the forge left out counts as private).
    pub private: bool,
}

/// What an issue search found, and when the forge answered (by its own clock).
#[derive(Clone, Debug, Default)]
pub struct IssueChanges {
    pub issues: Vec<(RepoName, Issue)>,
    pub server_time: Option<chrono::DateTime<chrono::Utc>>,
}

impl HookSpec {
    /// The `POST .../hooks` body: an active JSON hook of type `forgejo` (Forgejo leaves a hook
    /// inactive when `active` is left out).
    pub fn create_body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "type": "forgejo",
            "config": { "url": self.url, "content_type": "json", "secret": self.secret.expose() },
            "events": self.events,
            "active": true,
        });
        if let Some(a) = &self.authorization {
            body["authorization_header"] = format!("Bearer {}", a.expose()).into();
        }
        body
    }

    /// The `PATCH .../hooks/{id}` body that repairs a hook to this (its secret cannot be
    /// changed so), with `events`.
    pub fn edit_body(&self, events: &[String]) -> serde_json::Value {
        let mut body = serde_json::json!({
            "config": { "url": self.url, "content_type": "json" },
            "events": events,
            "active": true,
        });
        if let Some(a) = &self.authorization {
            body["authorization_header"] = format!("Bearer {}", a.expose()).into();
        }
        body
    }
}

/// Percent-encoding of everything but RFC 3986's unreserved characters: a path segment or
/// query value as sent to a forge (and one of the forms an agent may print a secret in).
pub fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A response's `Date` header (RFC 7231: `Tue, 01 Dec 2026 12:00:00 GMT`).
/// Whether an answer of `status` may be met by sending the same request again at once. Any
/// server error may, for a request that is safe to repeat. A POST may only on an answer that
/// says it was not applied: 429 (refused for its rate) and 503 (not served: Forgejo's own
/// answer while it cannot serve, or a proxy with no backend). A 502 or 504 from the reverse
/// proxy in front of a forge can come after the forge applied the write: repeating it would
/// post a second comment or file a second issue, so the attempt fails, and the action's next
/// attempt reads back first (the sticky comment by its marker, a filed issue by its own, a
/// pull request by its head, a run token by its name).
pub fn repeatable(idempotent: bool, status: u16) -> bool {
    match status {
        429 | 503 => true,
        500..=599 => idempotent,
        _ => false,
    }
}

pub fn http_date(headers: &reqwest::header::HeaderMap) -> Option<chrono::DateTime<chrono::Utc>> {
    let value = headers.get(reqwest::header::DATE)?.to_str().ok()?;
    chrono::DateTime::parse_from_rfc2822(value)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// A repository webhook as the forge lists it (the secret is never returned).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub id: u64,
    /// `forgejo`, `gitea`, `slack`, ...
    pub kind: String,
    pub url: String,
    pub content_type: String,
    pub events: Vec<String>,
    pub active: bool,
}

/// The webhook the director wants on a repository.
#[derive(Clone, Debug)]
pub struct HookSpec {
    pub url: String,
    pub events: Vec<String>,
    pub secret: crate::settings::Secret,
    /// `webhook.authorization`: sent by the forge as `Authorization: Bearer <it>`, so a
    /// delivery proves itself before its body is read.
    pub authorization: Option<crate::settings::Secret>,
}

/// How Forgejo lists a hook event back: it stores `pull_request_review` as one flag and lists
/// that flag as three events (`EventCheckers` in Forgejo's `models/webhook`).
pub fn hook_event_listed_as(event: &str) -> &'static [&'static str] {
    match event {
        "pull_request_review" => &[
            "pull_request_review_approved",
            "pull_request_review_rejected",
            "pull_request_review_comment",
        ],
        _ => &[],
    }
}

/// Whether `name` is one Forgejo only lists back, and ignores when it is given.
pub fn hook_event_only_listed(name: &str) -> bool {
    hook_event_listed_as("pull_request_review").contains(&name)
}

/// A branch as seen by the account asking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    pub name: String,
    /// Its head commit.
    #[serde(default)]
    pub commit: String,
    /// A field the forge left out counts as "can": the check fails closed.
    pub user_can_push: bool,
    pub user_can_merge: bool,
}

/// What the contents API holds at a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileAt {
    Missing,
    File(Vec<u8>),
    /// Something there that is not a readable file (a directory, a symlink, too big), in words.
    Unusable(String),
}

impl FileAt {
    /// From the API's answer to `GET .../contents/{path}` (`None`: 404).
    pub(crate) fn from_wire(wire: Option<WireContents>, path: &str, max_bytes: u64) -> Self {
        match wire {
            None => Self::Missing,
            Some(w) => match w.into_bytes(path, max_bytes) {
                Ok(bytes) => Self::File(bytes),
                Err(why) => Self::Unusable(why),
            },
        }
    }
}

/// An entry as the contents API shows it (`ContentsResponse` on Forgejo, `content-file` on
/// GitHub): only what reading one small file needs.
#[derive(Debug, Deserialize)]
pub(crate) struct WireContents {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub encoding: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
}

impl WireContents {
    /// The file's bytes, checked: a file, at most `max_bytes`, base64 as both forges send it
    /// (GitHub wraps its lines).
    pub(crate) fn into_bytes(self, path: &str, max_bytes: u64) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        if self.kind != "file" {
            return Err(format!("`{path}` is a {}, not a file", self.kind));
        }
        if self.size > max_bytes {
            return Err(format!(
                "`{path}` is {} bytes; at most {max_bytes} are read",
                self.size
            ));
        }
        if self.encoding.as_deref() != Some("base64") {
            return Err(format!("`{path}` came without base64 content"));
        }
        let text: String = self
            .content
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("`{path}`'s content does not decode: {e}"))?;
        if bytes.len() as u64 > max_bytes {
            return Err(format!(
                "`{path}` is {} bytes; at most {max_bytes} are read",
                bytes.len()
            ));
        }
        Ok(bytes)
    }
}

/// The one scope a run token carries.
pub const RUN_TOKEN_SCOPE: &str = "write:repository";

/// A per-run token of the runner account.
#[derive(Clone, Debug)]
pub struct MintedToken {
    pub id: u64,
    pub name: String,
    pub token: crate::settings::Secret,
    /// The repositories the forge says the token is restricted to (`None`: unrestricted,
    /// as an older Forgejo answers when it ignores the restriction).
    pub repositories: Option<Vec<RepoName>>,
    pub scopes: Vec<String>,
}

/// The runner account's Basic-auth credentials (tokens are minted and deleted with them).
#[derive(Clone, Debug)]
pub struct RunnerAccount {
    pub login: String,
    pub password: crate::settings::Secret,
}

/// A user's role on a repository, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    None,
    Read,
    Write,
    Admin,
    Owner,
}

impl Permission {
    pub fn parse(s: &str) -> Self {
        match s {
            "owner" => Self::Owner,
            "admin" => Self::Admin,
            "write" => Self::Write,
            "read" => Self::Read,
            _ => Self::None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
            Self::Owner => "owner",
        }
    }

    /// Write or more: may hand issues to the director and give it commands.
    pub fn can_write(self) -> bool {
        self >= Self::Write
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("{method} {path}: not found")]
    NotFound { method: String, path: String },
    #[error("{method} {path}: unauthorized (check forge.token)")]
    Unauthorized { method: String, path: String },
    #[error("{method} {path}: forbidden (the bot account lacks permission)")]
    Forbidden { method: String, path: String },
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        method: String,
        path: String,
        status: u16,
        message: String,
    },
    #[error("{method} {path}: {reason}")]
    Transport {
        method: String,
        path: String,
        reason: String,
    },
    #[error("{method} {path}: unexpected response: {reason}")]
    Decode {
        method: String,
        path: String,
        reason: String,
    },
    /// A run token this process cannot revoke: it does not hold it (GitHub revokes a token
    /// only when shown it).
    #[error("the run token {name} is not held by this process and cannot be revoked")]
    TokenNotHeld { name: String },
}

impl ForgeError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether the forge answered no, for good: retrying the same request changes nothing (a
    /// 4xx other than a timeout, a conflict or a rate limit).
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Unauthorized { .. } | Self::Forbidden { .. } | Self::NotFound { .. } => true,
            Self::Status { status, .. } => {
                (400..500).contains(status) && !matches!(status, 408 | 409 | 425 | 429)
            }
            _ => false,
        }
    }

    /// Whether a write that failed this way may still have taken effect: no answer, an
    /// answer cut or unreadable, or a server error midway. A refusal (4xx) took none.
    pub fn is_ambiguous(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Decode { .. } => true,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// How a run reaches its repository on this forge, and what its token must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEndpoints {
    pub clone_url: String,
    pub api_url: String,
    /// `scheme://host[:port]`: the one place git may send the run token.
    pub git_origin: String,
    /// The user name git sends with the token.
    pub git_user: String,
    /// The default author of the run's commits (name, email).
    pub author: (String, String),
    /// The permissions a minted run token must report, exactly (sorted).
    pub token_scopes: Vec<String>,
    /// Run tokens are the runner account's (whose role is then checked); else the forge's
    /// App is the run's identity.
    pub runner_account: bool,
    /// The forge's name in messages.
    pub name: &'static str,
    /// How long a minted run token lives (`None`: until it is deleted). The git gateway
    /// replaces one before it expires.
    pub token_lifetime_secs: Option<u64>,
}

/// What a run-side call needs of a forge that is not supported there (GitHub: an App owns no
/// fork).
fn unsupported(what: &str) -> ForgeError {
    ForgeError::Status {
        method: "-".into(),
        path: what.into(),
        status: 501,
        message: "not supported on this forge".into(),
    }
}

/// A commit status the director posts (its checks' result, `director/checks`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewStatus {
    pub state: crate::domain::checks::StatusState,
    pub context: String,
    pub description: String,
    /// Where its details are (the checks' transcript); empty: none.
    pub target_url: String,
}

impl NewStatus {
    /// The request body both forges take (`state`, `target_url`, `description`, `context`).
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "state": self.state.as_str(),
            "context": self.context,
            "description": self.description,
        });
        if !self.target_url.is_empty() {
            body["target_url"] = serde_json::Value::String(self.target_url.clone());
        }
        body
    }
}

/// The calls the director makes to a forge, and no others.
#[async_trait]
pub trait Forge: Send + Sync {
    /// The login of the account whose token the director uses.
    async fn current_user(&self) -> Result<String, ForgeError>;
    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError>;
    /// Whether an anonymous visitor of the forge can see `repo`. A repository's own `private`
    /// flag is not enough: on Forgejo one of a `limited` or `private` organisation or user
    /// reports `private: false`. By default the flag (GitHub's, where it is the whole answer).
    async fn anonymous_can_see(&self, repo: &RepoName) -> Result<bool, ForgeError> {
        Ok(!self.repository(repo).await?.private)
    }
    /// Open issues (not pulls) that the forge says carry `label`, every page. The forge may
    /// ignore a label the repository does not define: callers check the labels themselves.
    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError>;
    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError>;
    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError>;
    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError>;
    /// The user's role on the repository; an unknown user has none.
    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError>;
    /// The label named `name`, created with `color` when the repository lacks it.
    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError>;
    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError>;
    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError>;
    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError>;
    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError>;
    /// Issues (open or closed, not pulls) of `repo` opened by `login`, every page.
    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError>;
    /// Files a new issue; returns its number.
    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError>;
    /// The branch as the bot sees it; `None` when it does not exist.
    async fn branch(&self, repo: &RepoName, name: &str) -> Result<Option<Branch>, ForgeError>;
    /// The file at `path` as of commit `at`, through the contents API. A file over
    /// `max_bytes` is found too big before its content is decoded.
    async fn file_at(
        &self,
        repo: &RepoName,
        path: &str,
        at: &str,
        max_bytes: u64,
    ) -> Result<FileAt, ForgeError>;
    /// The branch as the holder of `token` sees it (`user_can_push` is theirs).
    async fn branch_as(
        &self,
        token: &crate::settings::Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError>;
    /// How many commits `head` has that `base` has not.
    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError>;
    /// The open pull request from `head` into `base`, if any; `owner:branch` names a branch
    /// of the fork of `repo` that `owner` holds.
    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError>;
    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError>;
    async fn pull(&self, repo: &RepoName, number: u64) -> Result<PullRequest, ForgeError>;
    /// Every review of a pull request, oldest first.
    async fn reviews(&self, repo: &RepoName, number: u64) -> Result<Vec<Review>, ForgeError>;
    /// The checks of commit `sha`: its commit statuses, latest per context (and on GitHub its
    /// check runs), at most [`MAX_CHECKS`] of them.
    async fn checks(&self, repo: &RepoName, sha: &CommitSha) -> Result<Checks, ForgeError>;
    /// Retitles pull request `number` (a draft of the director's, `WIP: `, made ready).
    async fn edit_pull_title(
        &self,
        repo: &RepoName,
        number: u64,
        title: &str,
    ) -> Result<(), ForgeError>;
    /// Posts a commit status on commit `sha` (statuses append; per context the latest wins).
    async fn post_status(
        &self,
        repo: &RepoName,
        sha: &CommitSha,
        status: &NewStatus,
    ) -> Result<(), ForgeError>;
    /// Merges pull request `number` in `style`, only if its head is still `head_sha`.
    async fn merge_pull(
        &self,
        repo: &RepoName,
        number: u64,
        style: MergeStyle,
        head_sha: &CommitSha,
        delete_branch: bool,
    ) -> Result<MergeAnswer, ForgeError>;
    /// Brings pull request `number`'s branch up to its base (the forge's update, merging the
    /// base in).
    async fn update_pull(&self, repo: &RepoName, number: u64) -> Result<MergeAnswer, ForgeError>;
    /// The inline comments of one review.
    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<ReviewComment>, ForgeError>;
    /// A token of the runner account restricted to `repo`, scope `write:repository`.
    async fn mint_run_token(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError>;
    /// The runner account's tokens: (id, name).
    async fn runner_tokens(&self, runner: &RunnerAccount)
    -> Result<Vec<(u64, String)>, ForgeError>;
    /// Deletes a runner token by name; a token already gone is not an error.
    async fn delete_run_token(&self, runner: &RunnerAccount, name: &str) -> Result<(), ForgeError>;
    /// Every repository of an organisation.
    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError>;
    /// Issues (not pulls, open or closed) of every repository the bot can see, updated at or
    /// after `since`, every page: the incremental scan's one question.
    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<IssueChanges, ForgeError>;
    /// The forge's own clock as of its newest answer (its `Date` header), when it said:
    /// changes are timed by it, so the incremental scan counts from it rather than from the
    /// director's clock. Asks nothing of the forge.
    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError>;
    /// The repository's webhooks (needs admin rights on it).
    async fn hooks(&self, repo: &RepoName) -> Result<Vec<Hook>, ForgeError>;
    /// Creates an active JSON webhook of type `forgejo`.
    async fn create_hook(&self, repo: &RepoName, spec: &HookSpec) -> Result<Hook, ForgeError>;
    /// Sets a hook's URL, content type (JSON), events and active flag; the secret cannot be
    /// changed this way.
    async fn edit_hook(
        &self,
        repo: &RepoName,
        id: u64,
        spec: &HookSpec,
        events: &[String],
    ) -> Result<Hook, ForgeError>;
    async fn delete_hook(&self, repo: &RepoName, id: u64) -> Result<(), ForgeError>;
    /// Where a run of `repo` clones from and pushes to, as whom, with what token.
    fn run_endpoints(&self, repo: &RepoName, runner: &RunnerAccount) -> RunEndpoints;
    /// Whether the repository's own workflows run on a run's push to its branch, with no
    /// one's approval (`None`: not asked of this forge). On GitHub, where runs push to the
    /// repository itself: whether its Actions are enabled (GitHub asks no approval for an
    /// App's push to the repository).
    async fn workflows_run_unapproved(&self, _repo: &RepoName) -> Result<Option<bool>, ForgeError> {
        Ok(None)
    }
    /// The newest commits of `branch` (at most 50, newest first), leaving out those `not`
    /// (a commit) already has: one list call.
    async fn recent_commits(
        &self,
        _repo: &RepoName,
        _branch: &str,
        _not: Option<&str>,
    ) -> Result<Vec<CommitSummary>, ForgeError> {
        Err(unsupported("commit lists"))
    }
    /// What commit `sha` changed against its first parent, as a unified diff of at most
    /// `cap` bytes; `Ok(None)` when it is larger. Not asked of GitHub, whose commits are not
    /// listed for reverts (`recent_commits`), so no revert is counted there.
    async fn commit_diff(
        &self,
        _repo: &RepoName,
        _sha: &str,
        _cap: usize,
    ) -> Result<Option<String>, ForgeError> {
        Err(unsupported("commit diffs"))
    }
    /// The fork of `base` that `owner` (the runner, or an organisation) holds, read as the
    /// runner under the name the director gives it (`owner/<base's name>`), its `parent`
    /// checked; `None`: there is none. A repository of the fork's name that is not a fork
    /// of `base` is not one.
    async fn fork_of(
        &self,
        _runner: &RunnerAccount,
        _base: &RepoName,
        _owner: &str,
    ) -> Result<Option<RepoName>, ForgeError> {
        Err(unsupported("forks"))
    }
    /// What makes the runner's fork unfit for runs, in words (none: fit), read as the
    /// runner: Actions on in it, anyone but the runner able to write to it, or what of
    /// that cannot be read.
    async fn fork_problems(
        &self,
        _runner: &RunnerAccount,
        _fork: &RepoName,
    ) -> Result<Vec<String>, ForgeError> {
        Err(unsupported("forks"))
    }
    /// Forks `base` as the runner, into its own account or organisation `org`.
    async fn create_fork(
        &self,
        _runner: &RunnerAccount,
        _base: &RepoName,
        _org: Option<&str>,
    ) -> Result<RepoName, ForgeError> {
        Err(unsupported("forks"))
    }
    /// Brings `branch` of the runner's fork up to the same branch of its base, when it is
    /// behind (a fast-forward only).
    async fn sync_fork(
        &self,
        _runner: &RunnerAccount,
        _fork: &RepoName,
        _branch: &str,
    ) -> Result<ForkSync, ForgeError> {
        Err(unsupported("sync_fork"))
    }
    /// Opens a pull request as the runner account (`head`: `owner:branch` of its fork), so
    /// the forge treats it as the runner's, not the bot's.
    async fn create_pull_as(
        &self,
        _runner: &RunnerAccount,
        _repo: &RepoName,
        _head: &str,
        _base: &str,
        _title: &str,
        _body: &str,
    ) -> Result<u64, ForgeError> {
        Err(unsupported("pull requests as the runner"))
    }
    /// [`Forge::update_pull`] as the runner account, who owns the fork the head lives in.
    async fn update_pull_as(
        &self,
        _runner: &RunnerAccount,
        _repo: &RepoName,
        _number: u64,
    ) -> Result<MergeAnswer, ForgeError> {
        Err(unsupported("updates as the runner"))
    }
    /// Deletes `branch` of `repo` (the runner's fork) as the runner; one already gone is
    /// not an error.
    async fn delete_branch_as(
        &self,
        _runner: &RunnerAccount,
        _repo: &RepoName,
        _branch: &str,
    ) -> Result<(), ForgeError> {
        Err(unsupported("branch deletion as the runner"))
    }
    /// The most the runner's organisation teams give it on `repo`'s Actions unit, read as
    /// the runner (`None` where no organisation owns `repo`). Forgejo's approval gate trusts
    /// a writer of that unit, and a team can give it to a reader of the code, whose
    /// repository permission says `read`.
    async fn runner_actions_access(
        &self,
        _runner: &RunnerAccount,
        _repo: &RepoName,
    ) -> Result<Permission, ForgeError> {
        Err(unsupported("teams"))
    }
    /// Branch `name` of the runner's fork as the runner sees it: the fork of a private
    /// repository is private, and only its owner (and those it lets in) can see it, not the
    /// bot.
    async fn fork_branch(
        &self,
        _runner: &RunnerAccount,
        _fork: &RepoName,
        _name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        Err(unsupported("forks"))
    }
    /// [`Forge::commits_ahead`] in the runner's fork, as the runner.
    async fn fork_commits_ahead(
        &self,
        _runner: &RunnerAccount,
        _fork: &RepoName,
        _base: &str,
        _head: &str,
    ) -> Result<u64, ForgeError> {
        Err(unsupported("forks"))
    }
    /// The run token to revoke under `name` (kept sealed, or read back from its run),
    /// replacing any this process holds under it, so [`Forge::delete_run_token`] can revoke
    /// it where the forge needs the token itself (GitHub). Forgejo deletes tokens by name and
    /// ignores this.
    fn hold_run_token(&self, _name: &str, _token: &crate::settings::Secret) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_is_repeated_only_on_an_answer_that_says_it_was_not_applied() {
        for status in [429, 503] {
            assert!(repeatable(false, status), "{status}");
        }
        // A proxy's 502 or 504 may follow the applied write.
        for status in [500, 502, 504, 400, 404, 409] {
            assert!(!repeatable(false, status), "{status}");
        }
        for status in [500, 502, 503, 504, 429] {
            assert!(repeatable(true, status), "{status}");
        }
        assert!(!repeatable(true, 404));
    }
}
