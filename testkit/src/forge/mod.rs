//! `FakeForge`: a stateful, in-memory Forgejo for tests and benchmarks. It holds users,
//! repositories, labels, issues, comments, timelines and permissions; records every API call;
//! and behaves as Forgejo 15 does (checked in its source): label filters drop unknown names,
//! pages cap at 50, JSON is pretty-printed, the timeline's `X-Total-Count` is the page size,
//! and every change (the bot's own included) is echoed as a signed webhook when one is
//! configured.
//!
//! Use it in-process (it implements [`Forge`](director::forge::Forge)) or as a real HTTP
//! server ([`FakeForge::serve`]) so the real client and the whole app are tested end to end.
//! Over HTTP every request is checked against Forgejo's official API spec (see `contract`).
//!
//! The rooms: `state` (what it holds and its rules), `seed` (what a test arranges and reads,
//! and webhooks), `api` (the in-process face), `server` with `pulls` and `git` (the HTTP
//! face), `contract` (the API description check).

pub mod contract;
pub(crate) mod git;
pub use checks::{CommitStatus, MergeCall};
pub use pulls::ReviewEvent;
mod api;
mod checks;
mod filing;
mod forks;
mod history;
mod pulls;
mod seed;
mod server;
mod state;
mod teams;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use director::domain::RepoName;
use director::forge::{Comment, Hook, Permission};

pub use server::FakeServer;

/// One API call the fake received.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub body: Option<Value>,
    pub status: u16,
    /// The account the call authenticated as.
    pub login: Option<String>,
    /// When it arrived (wall clock, microseconds since the epoch).
    pub at_us: i64,
}

impl Call {
    /// When it arrived, in milliseconds since the epoch.
    pub fn at_ms(&self) -> i64 {
        self.at_us / 1000
    }
}

#[derive(Clone, Debug)]
pub(crate) struct FLabel {
    pub id: u64,
    pub name: String,
    pub color: String,
    pub description: String,
}

#[derive(Clone, Debug)]
pub(crate) struct FComment {
    pub id: u64,
    pub author: String,
    pub body: String,
    pub created: i64,
    pub updated: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct FTimeline {
    pub id: u64,
    pub kind: String,
    pub actor: String,
    pub label_id: Option<u64>,
    pub body: String,
    pub created: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct FIssue {
    pub id: u64,
    pub number: u64,
    pub title: String,
    pub body: String,
    pub state: String,
    pub labels: Vec<u64>,
    pub author: String,
    pub created: i64,
    pub updated: i64,
    pub is_pull: bool,
    pub comments: Vec<FComment>,
    pub timeline: Vec<FTimeline>,
}

/// A token of a user, possibly restricted (Forgejo >= 15: repository-restricted tokens).
#[derive(Clone, Debug)]
pub(crate) struct FToken {
    pub id: u64,
    pub name: String,
    pub sha1: String,
    pub login: String,
    pub scopes: Vec<String>,
    /// `None`: every repository the user can reach.
    pub repos: Option<Vec<RepoName>>,
}

#[derive(Clone, Debug)]
pub(crate) struct FReview {
    pub id: u64,
    pub user: String,
    /// `APPROVED`, `REQUEST_CHANGES`, `COMMENT` (`PENDING` is never sent).
    pub state: String,
    pub body: String,
    pub submitted: i64,
    pub comments: Vec<FReviewComment>,
    /// The head commit it was made on.
    pub commit: String,
    /// A newer approval or rejection by the same user dismissed it.
    pub dismissed: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct FReviewComment {
    pub id: u64,
    pub path: String,
    pub body: String,
    /// Line in the new file.
    pub line: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct FPull {
    pub number: u64,
    pub head: String,
    /// The fork the head branch lives in (`None`: this repository). Its commits are
    /// mirrored into the repository as `refs/pull/<n>/head`, as Forgejo keeps them
    /// (`FRepo::pull_heads`).
    pub head_repo: Option<RepoName>,
    pub base: String,
    pub state: String,
    pub merged: bool,
    pub reviews: Vec<FReview>,
    /// What the forge says of it (tests may make it unmergeable).
    pub mergeable: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct FRepo {
    pub id: u64,
    pub name: RepoName,
    pub default_branch: String,
    /// Branch name → the ids of its commits, oldest first.
    pub branches: BTreeMap<String, Vec<u64>>,
    /// The default branch accepts pushes from admins only.
    pub protect_default: bool,
    /// ... but writers may merge into it (a protection that forgot merges).
    pub merge_default: bool,
    pub pulls: Vec<FPull>,
    pub labels: Vec<FLabel>,
    pub issues: BTreeMap<u64, FIssue>,
    pub permissions: HashMap<String, Permission>,
    pub next_number: u64,
    /// Served over git's smart HTTP too (`FakeForge::serve_git`).
    pub git: Option<git::FGit>,
    /// Without git: the files each commit holds (a commit with none holds no file).
    pub trees: HashMap<u64, BTreeMap<String, Vec<u8>>>,
    pub private: bool,
    pub hooks: Vec<FHook>,
    /// Commit statuses, by commit, in the order posted.
    pub statuses: HashMap<u64, Vec<checks::FStatus>>,
    /// Merges made through the API.
    pub merges: Vec<checks::MergeCall>,
    /// The repository this one is a fork of.
    pub fork_of: Option<RepoName>,
    /// The head commits of pull requests from forks, by number (`refs/pull/<n>/head`).
    pub pull_heads: BTreeMap<u64, Vec<u64>>,
    /// Forgejo Actions: a workflow runs on every pull request event (`forks::FActionRun`).
    pub actions: bool,
    pub action_runs: Vec<forks::FActionRun>,
    /// Pull request posters a maintainer trusted with "Approve always".
    pub trusted_posters: std::collections::BTreeSet<String>,
    /// Commit messages a test gave (others read "commit").
    pub messages: HashMap<u64, String>,
    /// Parents recorded when a commit was made, first parent first (`FRepo::parents_of`).
    pub parents: HashMap<u64, Vec<u64>>,
}

impl FRepo {
    /// A commit as the API names it: git's own id where the repository is served over git
    /// (as Forgejo's answers hold), else the fake's number in hex.
    pub fn commit_name(&self, id: u64) -> String {
        self.git
            .as_ref()
            .and_then(|g| {
                g.ids
                    .iter()
                    .find(|(_, i)| **i == id)
                    .map(|(sha, _)| sha.clone())
            })
            .unwrap_or_else(|| format!("{id:040x}"))
    }

    /// The commits of pull request `p`'s head: its branch here, or its mirror of a fork's.
    pub(crate) fn pull_commits(&self, p: &FPull) -> Vec<u64> {
        match &p.head_repo {
            Some(_) => self.pull_heads.get(&p.number).cloned().unwrap_or_default(),
            None => self.branches.get(&p.head).cloned().unwrap_or_default(),
        }
    }

    /// The head commit of pull request `p`, as the API names it.
    pub(crate) fn pull_head_name(&self, p: &FPull) -> String {
        self.pull_commits(p)
            .last()
            .map(|c| self.commit_name(*c))
            .unwrap_or_default()
    }

    /// The commit a reference names: a branch's head, or a full commit id as
    /// [`FRepo::commit_name`] shows it, of a commit one of its branches (or pull request
    /// heads) holds.
    pub fn commit_named(&self, reference: &str) -> Option<u64> {
        if let Some(head) = self.branches.get(reference).and_then(|c| c.last()) {
            return Some(*head);
        }
        if reference.len() != 40 {
            return None;
        }
        let id = match self.git.as_ref().and_then(|g| g.ids.get(reference)) {
            Some(id) => *id,
            None => u64::from_str_radix(reference, 16).ok()?,
        };
        self.branches
            .values()
            .chain(self.pull_heads.values())
            .any(|b| b.contains(&id))
            .then_some(id)
    }

    /// The head of `branch`, as the API names it (empty when there is none).
    pub fn head_name(&self, branch: &str) -> String {
        self.branches
            .get(branch)
            .and_then(|c| c.last())
            .map(|c| self.commit_name(*c))
            .unwrap_or_default()
    }
}

/// A repository webhook; the secret is kept but never shown, as Forgejo does.
#[derive(Clone, Debug)]
pub(crate) struct FHook {
    pub id: u64,
    pub kind: String,
    pub url: String,
    pub content_type: String,
    pub secret: String,
    pub events: Vec<String>,
    pub active: bool,
    /// The `Authorization` header value it sends with each delivery.
    pub authorization: String,
}

struct Webhook {
    url: String,
    secret: String,
    enabled: bool,
    held: bool,
}

/// A webhook the fake will send (or, with webhooks off, dropped as Forgejo drops a failed one).
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub event_type: String,
    pub body: String,
}

#[derive(Default)]
pub(crate) struct State {
    pub now: i64,
    pub next_id: u64,
    pub tokens: HashMap<String, String>,
    pub users: BTreeMap<String, u64>,
    pub repos: BTreeMap<RepoName, FRepo>,
    pub orgs: BTreeMap<String, Vec<RepoName>>,
    /// Organisation teams (`teams::FTeam`).
    pub teams: Vec<teams::FTeam>,
    pub passwords: HashMap<String, String>,
    pub user_tokens: Vec<FToken>,
    /// Every token ever minted: (login, name, value), for tests that look for leaks.
    pub minted: Vec<(String, String, String)>,
    pub calls: Vec<Call>,
    /// Told each time a call is recorded (how many so far), for those who wait for one.
    pub called: tokio::sync::watch::Sender<usize>,
    pub fail_next: VecDeque<u16>,
    /// Requests whose path holds the text to fail with the status, each once, in order.
    pub fail_paths: VecDeque<(String, u16)>,
    /// Requests (method, a part of the path, status) that are applied and then answered with
    /// the status instead, each once: a reverse proxy that timed out after the forge wrote.
    pub answer_after_applying: Vec<(String, String, u16)>,
    /// git pushes (`POST …/git-receive-pack`) to fail with a status, before git sees them.
    pub fail_pushes: VecDeque<u16>,
    pub violations: Vec<String>,
    /// Tokens are minted unrestricted, whatever was asked (a Forgejo older than 15).
    pub ignore_token_restrictions: bool,
    /// Owners (users and organisations) whose visibility is `limited` or `private`: their
    /// repositories are hidden from anonymous visitors, `private: false` or not.
    pub hidden_owners: std::collections::BTreeSet<String>,
    webhook: Option<Webhook>,
    outbox: Vec<Outgoing>,
}

/// 2026-11-30T10:00:00Z: the fake's clock starts here and ticks one second per change, so
/// every change has its own `updated_at` (Forgejo's resolution is one second).
const EPOCH: i64 = 1_795_860_000;

pub(crate) fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[derive(Clone, Default)]
pub struct FakeForge {
    inner: Arc<Mutex<State>>,
    /// What webhooks go out through, made once: a client reads every root certificate of
    /// the machine as it is made, tens of milliseconds that would stall the fake's one
    /// worker on each delivery.
    webhooks: Arc<std::sync::OnceLock<reqwest::Client>>,
}

/// What a fake API method can answer besides success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    NotFound,
    Forbidden,
    Unauthorized,
    Conflict(String),
    Unprocessable(String),
    BadRequest(String),
    /// 405, as Forgejo answers a merge it will not make.
    NotAllowed(String),
    /// 500.
    Internal(String),
}

pub(crate) fn to_hook(h: &FHook) -> Hook {
    Hook {
        id: h.id,
        kind: h.kind.clone(),
        url: h.url.clone(),
        content_type: h.content_type.clone(),
        events: h.events.clone(),
        active: h.active,
    }
}

pub(crate) fn to_comment(c: &FComment) -> Comment {
    Comment {
        id: c.id,
        author: c.author.clone(),
        body: c.body.clone(),
        created_at: rfc3339(c.created),
        updated_at: rfc3339(c.updated),
    }
}

/// A hook's events as Forgejo 15 keeps and lists them: `pull_request_review` is one flag,
/// listed back as its three events, and those three names are not recognised when given.
pub(crate) fn stored_events(list: &[Value]) -> Vec<String> {
    let given: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
    let mut out = Vec::new();
    for e in given {
        let listed = director::forge::hook_event_listed_as(e);
        let names: Vec<&str> = if !listed.is_empty() {
            listed.to_vec()
        } else if director::forge::hook_event_only_listed(e) {
            Vec::new()
        } else {
            vec![e]
        };
        for n in names {
            if !out.iter().any(|o| o == n) {
                out.push(n.to_owned());
            }
        }
    }
    out
}
