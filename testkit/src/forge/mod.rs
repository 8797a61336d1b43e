//! `FakeForge`: a stateful, in-memory Forgejo for tests and benchmarks. It holds users,
//! repositories, labels, issues, comments, timelines and permissions; records every API call;
//! and behaves as Forgejo 15 does (checked in its source): label filters drop unknown names,
//! pages cap at 50, JSON is pretty-printed, the timeline's `X-Total-Count` is the page size,
//! and every change (the bot's own included) is echoed as a signed webhook when one is
//! configured.
//!
//! Use it in-process (it implements [`Forge`]) or as a real HTTP server ([`FakeForge::serve`])
//! so the real client and the whole app are tested end to end. Over HTTP every request is
//! checked against Forgejo's official API spec (see `contract`).

pub mod contract;
mod git;
pub use pulls::ReviewEvent;
mod pulls;
mod server;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::{Value, json};

use director::domain::{IssueRef, RepoName};
use director::forge::{
    Comment, Forge, ForgeError, Hook, HookSpec, Issue, Label, Permission, Repository, TimelineEntry,
};

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
    /// When it arrived (wall clock, milliseconds since the epoch).
    pub at_ms: i64,
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
    pub base: String,
    pub state: String,
    pub merged: bool,
    pub reviews: Vec<FReview>,
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
    pub private: bool,
    pub hooks: Vec<FHook>,
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
    pub passwords: HashMap<String, String>,
    pub user_tokens: Vec<FToken>,
    /// Every token ever minted: (login, name, value), for tests that look for leaks.
    pub minted: Vec<(String, String, String)>,
    pub calls: Vec<Call>,
    pub fail_next: VecDeque<u16>,
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
}

/// What a fake API method can answer besides success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    NotFound,
    Forbidden,
    Unauthorized,
    Conflict(String),
    Unprocessable(String),
}

impl State {
    /// As Forgejo answers an anonymous visitor: the repository is public and so is its owner.
    pub(crate) fn anonymous_can_see(&self, repo: &RepoName) -> bool {
        self.repos.get(repo).is_some_and(|r| !r.private)
            && !self.hidden_owners.contains(repo.owner())
    }

    fn tick(&mut self) -> i64 {
        self.now += 1;
        self.now
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn repo(&self, repo: &RepoName) -> Result<&FRepo, Refusal> {
        self.repos.get(repo).ok_or(Refusal::NotFound)
    }

    fn repo_mut(&mut self, repo: &RepoName) -> Result<&mut FRepo, Refusal> {
        self.repos.get_mut(repo).ok_or(Refusal::NotFound)
    }

    pub(crate) fn issue(&self, issue: &IssueRef) -> Result<&FIssue, Refusal> {
        self.repo(&issue.repo)?
            .issues
            .get(&issue.number)
            .ok_or(Refusal::NotFound)
    }

    fn issue_mut(&mut self, issue: &IssueRef) -> Result<&mut FIssue, Refusal> {
        self.repo_mut(&issue.repo)?
            .issues
            .get_mut(&issue.number)
            .ok_or(Refusal::NotFound)
    }

    fn ensure_user(&mut self, login: &str) {
        if !self.users.contains_key(login) {
            let id = self.id();
            self.users.insert(login.to_owned(), id);
        }
    }

    pub(crate) fn permission_of(&self, repo: &RepoName, login: &str) -> Permission {
        let Ok(r) = self.repo(repo) else {
            return Permission::None;
        };
        if repo.owner() == login {
            return Permission::Owner;
        }
        r.permissions
            .get(login)
            .copied()
            // Public repositories: everyone with an account can read.
            .unwrap_or(if self.users.contains_key(login) {
                Permission::Read
            } else {
                Permission::None
            })
    }

    /// Issues of a repository as `GET .../issues` answers: `labels` names that the repository
    /// does not define are dropped from the filter, and every remaining one must match.
    pub(crate) fn list_issues(
        &self,
        repo: &RepoName,
        state: &str,
        kind: &str,
        labels: &str,
        created_by: &str,
    ) -> Result<Vec<&FIssue>, Refusal> {
        let r = self.repo(repo)?;
        let wanted: Vec<u64> = labels
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .filter_map(|n| r.labels.iter().find(|l| l.name == n).map(|l| l.id))
            .collect();
        Ok(r.issues
            .values()
            .rev() // newest first, as Forgejo sorts by default
            .filter(|i| state == "all" || i.state == state)
            .filter(|i| match kind {
                "issues" => !i.is_pull,
                "pulls" => i.is_pull,
                _ => true,
            })
            .filter(|i| wanted.iter().all(|id| i.labels.contains(id)))
            .filter(|i| created_by.is_empty() || i.author == created_by)
            .collect())
    }

    /// `GET /repos/issues/search`, as Forgejo answers it: every repository `login` can read,
    /// `labels` matching any of the names (unknown names dropped), `since` meaning updated at
    /// or after; most recently updated first.
    pub(crate) fn search_issues(
        &self,
        login: &str,
        state: &str,
        kind: &str,
        labels: &str,
        since: Option<i64>,
    ) -> Vec<(RepoName, &FIssue)> {
        let names: Vec<&str> = labels
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        let mut out: Vec<(RepoName, &FIssue)> = Vec::new();
        for (name, r) in &self.repos {
            let readable = if r.private {
                name.owner() == login || r.permissions.contains_key(login)
            } else {
                self.permission_of(name, login) >= Permission::Read
            };
            if !readable {
                continue;
            }
            let wanted: Vec<u64> = names
                .iter()
                .filter_map(|n| r.labels.iter().find(|l| l.name == *n).map(|l| l.id))
                .collect();
            for i in r.issues.values() {
                let keep = (state == "all" || i.state == state)
                    && match kind {
                        "issues" => !i.is_pull,
                        "pulls" => i.is_pull,
                        _ => true,
                    }
                    && (names.is_empty() || wanted.iter().any(|id| i.labels.contains(id)))
                    && since.is_none_or(|t| i.updated >= t);
                if keep {
                    out.push((name.clone(), i));
                }
            }
        }
        out.sort_by(|a, b| {
            b.1.updated
                .cmp(&a.1.updated)
                .then(b.1.number.cmp(&a.1.number))
        });
        out
    }

    pub(crate) fn label_by_name(&self, repo: &RepoName, name: &str) -> Result<FLabel, Refusal> {
        self.repo(repo)?
            .labels
            .iter()
            .find(|l| l.name == name)
            .cloned()
            .ok_or_else(|| Refusal::Unprocessable(format!("label `{name}` does not exist")))
    }

    pub(crate) fn create_label(
        &mut self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<FLabel, Refusal> {
        if self.repo(repo)?.labels.iter().any(|l| l.name == name) {
            return Err(Refusal::Unprocessable(format!(
                "label `{name}` already exists"
            )));
        }
        let id = self.id();
        let label = FLabel {
            id,
            name: name.to_owned(),
            color: color.to_owned(),
            description: description.to_owned(),
        };
        self.repo_mut(repo)?.labels.push(label.clone());
        Ok(label)
    }

    pub(crate) fn create_issue(
        &mut self,
        author: &str,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, Refusal> {
        self.repo(repo)?;
        let now = self.tick();
        let id = self.id();
        let r = self.repo_mut(repo)?;
        let number = r.next_number;
        r.next_number += 1;
        r.issues.insert(
            number,
            FIssue {
                id,
                number,
                title: title.to_owned(),
                body: body.to_owned(),
                state: "open".into(),
                labels: Vec::new(),
                author: author.to_owned(),
                created: now,
                updated: now,
                is_pull: false,
                comments: Vec::new(),
                timeline: Vec::new(),
            },
        );
        self.emit(
            "issues",
            "opened",
            author,
            &IssueRef::new(repo.clone(), number),
            None,
        );
        Ok(number)
    }

    /// Adds or removes labels as `actor`: a timeline entry per change, `updated_at` bumped,
    /// and one `label_updated` webhook carrying the full label set.
    pub(crate) fn change_label(
        &mut self,
        actor: &str,
        issue: &IssueRef,
        label_id: u64,
        add: bool,
    ) -> Result<(), Refusal> {
        if !self
            .repo(&issue.repo)?
            .labels
            .iter()
            .any(|l| l.id == label_id)
        {
            return Err(if add {
                Refusal::Unprocessable(format!("label {label_id} does not exist"))
            } else {
                Refusal::NotFound
            });
        }
        let has = self.issue(issue)?.labels.contains(&label_id);
        if has == add {
            return Ok(());
        }
        let now = self.tick();
        let entry_id = self.id();
        let i = self.issue_mut(issue)?;
        if add {
            i.labels.push(label_id);
        } else {
            i.labels.retain(|l| *l != label_id);
        }
        i.updated = now;
        i.timeline.push(FTimeline {
            id: entry_id,
            kind: "label".into(),
            actor: actor.to_owned(),
            label_id: Some(label_id),
            body: if add { "1".into() } else { String::new() },
            created: now,
        });
        let kind = if i.is_pull {
            "pull_request_label"
        } else {
            "issue_label"
        };
        self.emit(kind, "label_updated", actor, issue, None);
        Ok(())
    }

    /// What `login` (through a token restricted or not) may do on `repo`'s branch `name`.
    pub(crate) fn can_merge(&self, repo: &RepoName, login: &str, name: &str) -> bool {
        let Ok(r) = self.repo(repo) else { return false };
        if name == r.default_branch && r.protect_default && r.merge_default {
            self.permission_of(repo, login) >= Permission::Write
        } else {
            self.can_push(repo, login, name)
        }
    }

    pub(crate) fn can_push(&self, repo: &RepoName, login: &str, name: &str) -> bool {
        let Ok(r) = self.repo(repo) else { return false };
        let perm = self.permission_of(repo, login);
        if name == r.default_branch && r.protect_default {
            perm >= Permission::Admin
        } else {
            perm >= Permission::Write
        }
    }

    /// A commit on `branch`, created from `from` when new; as `login`.
    pub(crate) fn commit_file(
        &mut self,
        login: &str,
        repo: &RepoName,
        from: &str,
        branch: &str,
    ) -> Result<u64, Refusal> {
        if !self.can_push(repo, login, branch) {
            return Err(Refusal::Forbidden);
        }
        let commit = self.id();
        let r = self.repo_mut(repo)?;
        let base = r.branches.get(from).cloned().ok_or(Refusal::NotFound)?;
        let entry = r.branches.entry(branch.to_owned()).or_insert(base);
        entry.push(commit);
        Ok(commit)
    }

    pub(crate) fn create_pull(
        &mut self,
        login: &str,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, Refusal> {
        let r = self.repo(repo)?;
        if !r.branches.contains_key(head) || !r.branches.contains_key(base) {
            return Err(Refusal::NotFound);
        }
        if r.pulls
            .iter()
            .any(|p| p.head == head && p.base == base && p.state == "open")
        {
            return Err(Refusal::Conflict("pull request already exists".into()));
        }
        let number = self.create_issue(login, repo, title, body)?;
        let r = self.repo_mut(repo)?;
        if let Some(i) = r.issues.get_mut(&number) {
            i.is_pull = true;
        }
        r.pulls.push(FPull {
            number,
            head: head.to_owned(),
            base: base.to_owned(),
            state: "open".into(),
            merged: false,
            reviews: Vec::new(),
        });
        Ok(number)
    }

    pub(crate) fn add_comment(
        &mut self,
        actor: &str,
        issue: &IssueRef,
        body: &str,
    ) -> Result<FComment, Refusal> {
        self.issue(issue)?;
        let now = self.tick();
        let id = self.id();
        let comment = FComment {
            id,
            author: actor.to_owned(),
            body: body.to_owned(),
            created: now,
            updated: now,
        };
        let i = self.issue_mut(issue)?;
        i.comments.push(comment.clone());
        i.updated = now;
        i.timeline.push(FTimeline {
            id,
            kind: "comment".into(),
            actor: actor.to_owned(),
            label_id: None,
            body: body.to_owned(),
            created: now,
        });
        let kind = if self.issue(issue).is_ok_and(|i| i.is_pull) {
            "pull_request_comment"
        } else {
            "issue_comment"
        };
        self.emit(kind, "created", actor, issue, Some(&comment));
        Ok(comment)
    }

    pub(crate) fn edit_comment(
        &mut self,
        actor: &str,
        repo: &RepoName,
        id: u64,
        body: &str,
    ) -> Result<(FComment, u64), Refusal> {
        let now = self.tick();
        let r = self.repo_mut(repo)?;
        let (number, comment) = r
            .issues
            .values_mut()
            .find_map(|i| {
                i.comments
                    .iter_mut()
                    .find(|c| c.id == id)
                    .map(|c| (i.number, c))
            })
            .ok_or(Refusal::NotFound)?;
        if comment.author != actor {
            return Err(Refusal::Forbidden);
        }
        comment.body = body.to_owned();
        comment.updated = now;
        let comment = comment.clone();
        let issue = IssueRef::new(repo.clone(), number);
        if let Ok(i) = self.issue_mut(&issue) {
            i.updated = now;
        }
        self.emit("issue_comment", "edited", actor, &issue, Some(&comment));
        Ok((comment, number))
    }

    pub(crate) fn check_password(&self, login: &str, password: &str) -> Result<(), Refusal> {
        match self.passwords.get(login) {
            Some(p) if p == password => Ok(()),
            _ => Err(Refusal::Unauthorized),
        }
    }

    pub(crate) fn mint_token(
        &mut self,
        login: &str,
        password: &str,
        name: &str,
        scopes: Vec<String>,
        repos: Option<Vec<RepoName>>,
    ) -> Result<FToken, Refusal> {
        self.check_password(login, password)?;
        if name.is_empty()
            || self
                .user_tokens
                .iter()
                .any(|t| t.login == login && t.name == name)
        {
            return Err(Refusal::Unprocessable(format!(
                "access token name `{name}` is empty or taken"
            )));
        }
        let repos = if self.ignore_token_restrictions {
            None
        } else {
            repos
        };
        let id = self.id();
        let sha1 = format!("{:040x}", rand::random::<u128>());
        let token = FToken {
            id,
            name: name.to_owned(),
            sha1,
            login: login.to_owned(),
            scopes,
            repos,
        };
        self.user_tokens.push(token.clone());
        self.minted
            .push((token.login.clone(), token.name.clone(), token.sha1.clone()));
        Ok(token)
    }

    pub(crate) fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, Refusal> {
        let r = self.repo(repo)?;
        let head = r.branches.get(head).ok_or(Refusal::NotFound)?;
        // A base may be a branch or a commit (as Forgejo's compare accepts both): the history
        // of a commit is that of a branch holding it, up to it.
        let base: Vec<u64> = match r.branches.get(base) {
            Some(b) => b.clone(),
            None => {
                let id = u64::from_str_radix(base, 16).map_err(|_| Refusal::NotFound)?;
                let history = r
                    .branches
                    .values()
                    .find(|b| b.contains(&id))
                    .ok_or(Refusal::NotFound)?;
                let at = history.iter().position(|c| *c == id).unwrap_or(0);
                history[..=at].to_vec()
            }
        };
        Ok(head.iter().filter(|c| !base.contains(c)).count() as u64)
    }

    /// Hooks are managed by repository admins only.
    fn hook_admin(&mut self, login: &str, repo: &RepoName) -> Result<&mut FRepo, Refusal> {
        if self.permission_of(repo, login) < Permission::Admin {
            return Err(if self.permission_of(repo, login) == Permission::None {
                Refusal::NotFound
            } else {
                Refusal::Forbidden
            });
        }
        self.repo_mut(repo)
    }

    pub(crate) fn list_hooks(
        &mut self,
        login: &str,
        repo: &RepoName,
    ) -> Result<Vec<FHook>, Refusal> {
        Ok(self.hook_admin(login, repo)?.hooks.clone())
    }

    /// As Forgejo: `active` defaults to false and `events` to `["push"]`.
    pub(crate) fn create_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        body: &Value,
    ) -> Result<FHook, Refusal> {
        let id = self.id();
        let config = &body["config"];
        let url = config["url"].as_str().unwrap_or_default().to_owned();
        let content_type = config["content_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if url.is_empty() || content_type.is_empty() {
            return Err(Refusal::Unprocessable(
                "Missing config option: url and content_type are required".into(),
            ));
        }
        let events: Vec<String> = match body["events"].as_array() {
            Some(list) => stored_events(list),
            None => vec!["push".to_owned()],
        };
        let hook = FHook {
            id,
            kind: body["type"].as_str().unwrap_or("forgejo").to_owned(),
            url,
            content_type,
            secret: config["secret"].as_str().unwrap_or_default().to_owned(),
            events,
            active: body["active"].as_bool().unwrap_or(false),
            authorization: body["authorization_header"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        self.hook_admin(login, repo)?.hooks.push(hook.clone());
        Ok(hook)
    }

    /// PATCH: config keys, events and `active` as given; the secret stays as it was.
    pub(crate) fn edit_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        id: u64,
        body: &Value,
    ) -> Result<FHook, Refusal> {
        let r = self.hook_admin(login, repo)?;
        let h = r
            .hooks
            .iter_mut()
            .find(|h| h.id == id)
            .ok_or(Refusal::NotFound)?;
        if let Some(url) = body["config"]["url"].as_str() {
            h.url = url.to_owned();
        }
        if let Some(ct) = body["config"]["content_type"].as_str() {
            h.content_type = ct.to_owned();
        }
        if let Some(list) = body["events"].as_array() {
            h.events = stored_events(list);
        }
        if let Some(active) = body["active"].as_bool() {
            h.active = active;
        }
        if let Some(a) = body["authorization_header"].as_str() {
            h.authorization = a.to_owned();
        }
        Ok(h.clone())
    }

    pub(crate) fn delete_hook(
        &mut self,
        login: &str,
        repo: &RepoName,
        id: u64,
    ) -> Result<(), Refusal> {
        let r = self.hook_admin(login, repo)?;
        let before = r.hooks.len();
        r.hooks.retain(|h| h.id != id);
        if r.hooks.len() == before {
            return Err(Refusal::NotFound);
        }
        Ok(())
    }

    /// Queues the webhook Forgejo would send for a change.
    pub(super) fn emit(
        &mut self,
        event_type: &str,
        action: &str,
        sender: &str,
        issue: &IssueRef,
        comment: Option<&FComment>,
    ) {
        if self.webhook.is_none() {
            return;
        }
        let Ok(i) = self.issue(issue) else { return };
        let issue_json = server::issue_json(self, &issue.repo, i);
        let mut body = json!({
            "action": action,
            "number": issue.number,
            "issue": issue_json,
            "repository": server::repo_json(self, &issue.repo),
            "sender": server::user_json(self, sender),
        });
        if let Some(c) = comment {
            body["comment"] = server::comment_json(self, &issue.repo, issue.number, c);
            body["is_pull"] = json!(i.is_pull);
        }
        let body = serde_json::to_string_pretty(&body).unwrap_or_default();
        self.outbox.push(Outgoing {
            event_type: event_type.to_owned(),
            body,
        });
    }
}

impl FakeForge {
    pub fn new() -> Self {
        let forge = Self::default();
        forge.state().now = EPOCH;
        forge
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; keep the data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an account and the API token that authenticates as it.
    pub fn add_account(&self, login: &str, token: &str) {
        let mut s = self.state();
        s.ensure_user(login);
        s.tokens.insert(token.to_owned(), login.to_owned());
    }

    pub fn add_user(&self, login: &str) {
        self.state().ensure_user(login);
    }

    /// A repository with branch `main`, owned by its owner (user or organisation).
    pub fn add_repo(&self, repo: &str) -> RepoName {
        let name: RepoName = repo
            .parse()
            .unwrap_or_else(|e| panic!("test repo {repo}: {e}"));
        let mut s = self.state();
        s.ensure_user(name.owner());
        let id = s.id();
        let commit = s.id();
        s.repos.entry(name.clone()).or_insert_with(|| FRepo {
            id,
            name: name.clone(),
            default_branch: "main".into(),
            branches: BTreeMap::from([("main".to_owned(), vec![commit])]),
            protect_default: true,
            merge_default: false,
            pulls: Vec::new(),
            labels: Vec::new(),
            issues: BTreeMap::new(),
            permissions: HashMap::new(),
            next_number: 1,
            git: None,
            private: false,
            hooks: Vec::new(),
        });
        name
    }

    /// Sets an owner's visibility as Forgejo names it (`public`, `limited`, `private`).
    pub fn set_owner_visibility(&self, owner: &str, visibility: &str) {
        let mut s = self.state();
        let owner = owner.to_ascii_lowercase();
        if visibility == "public" {
            s.hidden_owners.remove(&owner);
        } else {
            s.hidden_owners.insert(owner);
        }
    }

    /// Makes a repository private (visible to those granted access only).
    pub fn make_private(&self, repo: &RepoName) {
        if let Some(r) = self.state().repos.get_mut(repo) {
            r.private = true;
        }
    }

    /// A webhook on `repo` set up by hand (as someone clicking through Forgejo's form would);
    /// returns its id.
    pub fn add_hook(&self, repo: &RepoName, url: &str, events: &[&str], active: bool) -> u64 {
        let mut s = self.state();
        let id = s.id();
        if let Some(r) = s.repos.get_mut(repo) {
            r.hooks.push(FHook {
                id,
                kind: "forgejo".into(),
                url: url.to_owned(),
                content_type: "json".into(),
                secret: String::new(),
                events: events.iter().map(|e| (*e).to_owned()).collect(),
                active,
                authorization: String::new(),
            });
        }
        id
    }

    /// The `Authorization` header the hook `id` of `repo` sends.
    pub fn hook_authorization(&self, repo: &RepoName, id: u64) -> Option<String> {
        let s = self.state();
        let r = s.repo(repo).ok()?;
        r.hooks
            .iter()
            .find(|h| h.id == id)
            .map(|h| h.authorization.clone())
    }

    /// The hooks of `repo`: (id, url, events, active, secret).
    pub fn hooks_of(&self, repo: &RepoName) -> Vec<(u64, String, Vec<String>, bool, String)> {
        self.state()
            .repos
            .get(repo)
            .map(|r| {
                r.hooks
                    .iter()
                    .map(|h| {
                        (
                            h.id,
                            h.url.clone(),
                            h.events.clone(),
                            h.active,
                            h.secret.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A repository that belongs to organisation `org` (listed by `GET /orgs/{org}/repos`).
    pub fn add_org_repo(&self, org: &str, name: &str) -> RepoName {
        let repo = self.add_repo(&format!("{org}/{name}"));
        self.state()
            .orgs
            .entry(org.to_owned())
            .or_default()
            .push(repo.clone());
        repo
    }

    pub fn define_label(&self, repo: &RepoName, name: &str) -> u64 {
        let mut s = self.state();
        match s.label_by_name(repo, name) {
            Ok(l) => l.id,
            Err(_) => s
                .create_label(repo, name, "#e11d21", "")
                .map(|l| l.id)
                .unwrap_or_default(),
        }
    }

    pub fn grant(&self, repo: &RepoName, login: &str, permission: Permission) {
        let mut s = self.state();
        s.ensure_user(login);
        if let Ok(r) = s.repo_mut(repo) {
            r.permissions.insert(login.to_owned(), permission);
        }
    }

    /// Gives an account a password (Basic auth: the only way to mint, list and delete its tokens).
    pub fn set_password(&self, login: &str, password: &str) {
        let mut s = self.state();
        s.ensure_user(login);
        s.passwords.insert(login.to_owned(), password.to_owned());
    }

    /// Lets writers push to the default branch (an unprotected repository).
    /// The default branch stays protected against pushes but lets writers merge into it.
    pub fn allow_merge_into_default_branch(&self, repo: &RepoName) {
        if let Ok(r) = self.state().repo_mut(repo) {
            r.merge_default = true;
        }
    }

    /// Behave like a Forgejo older than 15: accept a repository restriction when minting a
    /// token, ignore it, and answer without it.
    pub fn ignore_token_restrictions(&self) {
        self.state().ignore_token_restrictions = true;
    }

    pub fn unprotect_default_branch(&self, repo: &RepoName) {
        if let Ok(r) = self.state().repo_mut(repo) {
            r.protect_default = false;
        }
    }

    /// Tokens of `login`: (name, restricted repositories, scopes).
    pub fn tokens_of(&self, login: &str) -> Vec<(String, Option<Vec<String>>, Vec<String>)> {
        self.state()
            .user_tokens
            .iter()
            .filter(|t| t.login == login)
            .map(|t| {
                (
                    t.name.clone(),
                    t.repos
                        .as_ref()
                        .map(|r| r.iter().map(|r| r.to_string()).collect()),
                    t.scopes.clone(),
                )
            })
            .collect()
    }

    /// Every token ever minted: (login, name, value).
    pub fn minted_tokens(&self) -> Vec<(String, String, String)> {
        self.state().minted.clone()
    }

    /// Branch names of a repository.
    pub fn branches_of(&self, repo: &RepoName) -> Vec<String> {
        self.state()
            .repo(repo)
            .map(|r| r.branches.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Open pull requests of a repository: (number, head, base, title, body).
    pub fn pulls_of(&self, repo: &RepoName) -> Vec<(u64, String, String, String, String)> {
        let s = self.state();
        let Ok(r) = s.repo(repo) else {
            return Vec::new();
        };
        r.pulls
            .iter()
            .filter_map(|p| {
                let i = r.issues.get(&p.number)?;
                Some((
                    p.number,
                    p.head.clone(),
                    p.base.clone(),
                    i.title.clone(),
                    i.body.clone(),
                ))
            })
            .collect()
    }

    /// Where webhooks go, signed with `secret`. Until set, changes send nothing.
    pub fn set_webhook(&self, url: &str, secret: &str) {
        self.state().webhook = Some(Webhook {
            url: url.to_owned(),
            secret: secret.to_owned(),
            enabled: true,
            held: false,
        });
    }

    /// With webhooks off, changes happen but their deliveries are lost (the receiver was down:
    /// Forgejo never retries).
    pub fn webhooks_enabled(&self, enabled: bool) {
        if let Some(w) = self.state().webhook.as_mut() {
            w.enabled = enabled;
        }
    }

    /// While held, webhooks queue up instead of being sent; [`FakeForge::take_webhooks`]
    /// hands them to the test to deliver in any order, any number of times.
    pub fn hold_webhooks(&self, held: bool) {
        if let Some(w) = self.state().webhook.as_mut() {
            w.held = held;
        }
    }

    pub fn take_webhooks(&self) -> Vec<Outgoing> {
        std::mem::take(&mut self.state().outbox)
    }

    /// Sends one webhook as Forgejo would (a fresh delivery id each time, like *Replay*).
    pub async fn send_webhook(&self, out: &Outgoing) -> u16 {
        let target = self
            .state()
            .webhook
            .as_ref()
            .map(|w| (w.url.clone(), w.secret.clone()));
        match target {
            Some((url, secret)) => send_webhook(&reqwest::Client::new(), &url, &secret, out).await,
            None => 0,
        }
    }

    /// Sends one delivery, under one delivery id, to each of `urls` at once (a load balancer
    /// that retried it on every replica); returns their statuses.
    pub async fn send_webhook_to_all(&self, urls: &[String], out: &Outgoing) -> Vec<u16> {
        let secret = self
            .state()
            .webhook
            .as_ref()
            .map(|w| w.secret.clone())
            .unwrap_or_default();
        let delivery = format!("{:032x}", rand::random::<u128>());
        let client = reqwest::Client::new();
        let sends = urls
            .iter()
            .map(|url| send_delivery(&client, url, &secret, out, &delivery));
        futures_util::future::join_all(sends).await
    }

    /// Sends every queued webhook, in order, and returns the HTTP statuses.
    pub async fn deliver_webhooks(&self) -> Vec<u16> {
        let (target, outbox) = {
            let mut s = self.state();
            if s.webhook.as_ref().is_some_and(|w| w.held) {
                return Vec::new();
            }
            let outbox = std::mem::take(&mut s.outbox);
            match &s.webhook {
                Some(w) if w.enabled => (Some((w.url.clone(), w.secret.clone())), outbox),
                _ => (None, outbox),
            }
        };
        let Some((url, secret)) = target else {
            return Vec::new();
        };
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        for out in outbox {
            statuses.push(send_webhook(&client, &url, &secret, &out).await);
        }
        statuses
    }

    /// A new issue by `author`; returns its reference.
    pub async fn open_issue(
        &self,
        repo: &RepoName,
        author: &str,
        title: &str,
        body: &str,
    ) -> IssueRef {
        let number = {
            let mut s = self.state();
            s.ensure_user(author);
            s.create_issue(author, repo, title, body)
                .unwrap_or_else(|_| panic!("no repo {repo}"))
        };
        self.deliver_webhooks().await;
        IssueRef::new(repo.clone(), number)
    }

    /// The issues of a repository (title, body, author), oldest first.
    /// The issue's `updated_at`, as the API shows it.
    pub fn issue_updated_at(&self, issue: &IssueRef) -> Option<String> {
        self.state().issue(issue).ok().map(|i| rfc3339(i.updated))
    }

    pub fn issues_in(&self, repo: &RepoName) -> Vec<(u64, String, String, String)> {
        let s = self.state();
        s.repo(repo)
            .map(|r| {
                r.issues
                    .values()
                    .map(|i| (i.number, i.title.clone(), i.body.clone(), i.author.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `actor` applies a label in the web UI.
    pub async fn label(&self, actor: &str, issue: &IssueRef, name: &str) {
        self.set_label(actor, issue, name, true).await;
    }

    /// `actor` removes a label in the web UI.
    pub async fn unlabel(&self, actor: &str, issue: &IssueRef, name: &str) {
        self.set_label(actor, issue, name, false).await;
    }

    async fn set_label(&self, actor: &str, issue: &IssueRef, name: &str, add: bool) {
        {
            let mut s = self.state();
            s.ensure_user(actor);
            let label = s
                .label_by_name(&issue.repo, name)
                .unwrap_or_else(|e| panic!("{e:?}"));
            s.change_label(actor, issue, label.id, add)
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        self.deliver_webhooks().await;
    }

    pub async fn comment(&self, actor: &str, issue: &IssueRef, body: &str) -> u64 {
        let id = {
            let mut s = self.state();
            s.ensure_user(actor);
            s.add_comment(actor, issue, body)
                .map(|c| c.id)
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        self.deliver_webhooks().await;
        id
    }

    pub async fn set_state(&self, actor: &str, issue: &IssueRef, state: &str) {
        {
            let mut s = self.state();
            let now = s.tick();
            let i = s.issue_mut(issue).unwrap_or_else(|e| panic!("{e:?}"));
            i.state = state.to_owned();
            i.updated = now;
            let action = if state == "closed" {
                "closed"
            } else {
                "reopened"
            };
            s.emit("issues", action, actor, issue, None);
        }
        self.deliver_webhooks().await;
    }

    /// `actor` edits the issue's body (Forgejo lets its author and writers do so).
    pub async fn edit_body(&self, actor: &str, issue: &IssueRef, body: &str) {
        {
            let mut s = self.state();
            let now = s.tick();
            let i = s.issue_mut(issue).unwrap_or_else(|e| panic!("{e:?}"));
            i.body = body.to_owned();
            i.updated = now;
            s.emit("issues", "edited", actor, issue, None);
        }
        self.deliver_webhooks().await;
    }

    /// The issue's comments, oldest first.
    pub fn comments_on(&self, issue: &IssueRef) -> Vec<Comment> {
        let s = self.state();
        s.issue(issue)
            .map(|i| i.comments.iter().map(to_comment).collect())
            .unwrap_or_default()
    }

    pub fn labels_on(&self, issue: &IssueRef) -> Vec<String> {
        let s = self.state();
        let Ok(i) = s.issue(issue) else {
            return Vec::new();
        };
        let Ok(r) = s.repo(&issue.repo) else {
            return Vec::new();
        };
        i.labels
            .iter()
            .filter_map(|id| {
                r.labels
                    .iter()
                    .find(|l| l.id == *id)
                    .map(|l| l.name.clone())
            })
            .collect()
    }

    /// Every API call received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The next API requests are answered with these statuses instead, one each.
    pub fn fail_next(&self, statuses: &[u16]) {
        self.state().fail_next.extend(statuses.iter().copied());
    }

    /// Failures queued by `fail_next` and not yet served are dropped: the forge is well again.
    pub fn heal(&self) {
        self.state().fail_next.clear();
    }

    /// Requests that did not fit Forgejo's API spec.
    pub fn contract_violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// Requests that did not fit Forgejo's API spec, forgotten here: a test that makes such
    /// requests on purpose takes them, so that dropping the server does not fail it.
    pub fn take_contract_violations(&self) -> Vec<String> {
        std::mem::take(&mut self.state().violations)
    }

    /// Serves the API over HTTP on a random loopback port.
    pub fn serve(&self) -> std::io::Result<FakeServer> {
        server::start(self.clone())
    }

    fn native_issue(s: &State, repo: &RepoName, i: &FIssue) -> Issue {
        let r = s.repo(repo).ok();
        Issue {
            number: i.number,
            title: i.title.clone(),
            body: i.body.clone(),
            state: i.state.clone(),
            labels: i
                .labels
                .iter()
                .filter_map(|id| r.and_then(|r| r.labels.iter().find(|l| l.id == *id)))
                .map(|l| Label {
                    id: l.id,
                    name: l.name.clone(),
                })
                .collect(),
            author: i.author.clone(),
            updated_at: rfc3339(i.updated),
            is_pull: i.is_pull,
        }
    }
}

async fn send_webhook(client: &reqwest::Client, url: &str, secret: &str, out: &Outgoing) -> u16 {
    let delivery = format!("{:032x}", rand::random::<u128>());
    send_delivery(client, url, secret, out, &delivery).await
}

async fn send_delivery(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    out: &Outgoing,
    delivery: &str,
) -> u16 {
    let sig = director::forge::signature::sign(secret, out.body.as_bytes());
    let (family, _) = out
        .event_type
        .split_once('_')
        .unwrap_or((&out.event_type, ""));
    let event = if family == "issue" && out.event_type == "issue_comment" {
        "issue_comment"
    } else if family == "issue" {
        "issues"
    } else {
        family
    };
    client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Forgejo-Delivery", delivery)
        .header("X-Gitea-Delivery", delivery)
        .header("X-Forgejo-Event", event)
        .header("X-Gitea-Event", event)
        .header("X-Forgejo-Event-Type", &out.event_type)
        .header("X-Gitea-Event-Type", &out.event_type)
        .header("X-Forgejo-Signature", &sig)
        .header("X-Gitea-Signature", &sig)
        .header("X-Hub-Signature-256", format!("sha256={sig}"))
        .body(out.body.clone())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

fn to_comment(c: &FComment) -> Comment {
    Comment {
        id: c.id,
        author: c.author.clone(),
        body: c.body.clone(),
        created_at: rfc3339(c.created),
        updated_at: rfc3339(c.updated),
    }
}

fn refused(method: &str, path: String, r: Refusal) -> ForgeError {
    let method = method.to_owned();
    match r {
        Refusal::NotFound => ForgeError::NotFound { method, path },
        Refusal::Forbidden => ForgeError::Forbidden { method, path },
        Refusal::Unauthorized => ForgeError::Unauthorized { method, path },
        Refusal::Conflict(message) => ForgeError::Status {
            method,
            path,
            status: 409,
            message,
        },
        Refusal::Unprocessable(message) => ForgeError::Status {
            method,
            path,
            status: 422,
            message,
        },
    }
}

/// In-process use: the bot is the first account registered with a token.
impl FakeForge {
    fn bot(&self) -> String {
        let s = self.state();
        s.users
            .iter()
            .filter(|(login, _)| s.tokens.values().any(|l| l == *login))
            .min_by_key(|(_, id)| **id)
            .map(|(login, _)| login.clone())
            .unwrap_or_default()
    }
}

#[async_trait]
impl Forge for FakeForge {
    async fn current_user(&self) -> Result<String, ForgeError> {
        Ok(self.bot())
    }

    async fn anonymous_can_see(&self, repo: &RepoName) -> Result<bool, ForgeError> {
        Ok(self.state().anonymous_can_see(repo))
    }

    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError> {
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(Repository {
            name: r.name.clone(),
            default_branch: r.default_branch.clone(),
            private: r.private,
        })
    }

    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let s = self.state();
        let list = s
            .list_issues(repo, "open", "issues", label, "")
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(list
            .into_iter()
            .map(|i| Self::native_issue(&s, repo, i))
            .collect())
    }

    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<director::forge::IssueChanges, ForgeError> {
        let bot = self.bot();
        let s = self.state();
        let issues = s
            .search_issues(&bot, "all", "issues", "", Some(since.timestamp()))
            .into_iter()
            .map(|(repo, i)| {
                let issue = Self::native_issue(&s, &repo, i);
                (repo, issue)
            })
            .collect();
        Ok(director::forge::IssueChanges {
            issues,
            server_time: chrono::DateTime::from_timestamp(s.now, 0),
        })
    }

    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError> {
        Ok(chrono::DateTime::from_timestamp(self.state().now, 0))
    }

    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let s = self.state();
        let list = s
            .list_issues(repo, "all", "issues", "", login)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(list
            .into_iter()
            .map(|i| Self::native_issue(&s, repo, i))
            .collect())
    }

    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(Self::native_issue(&s, &issue.repo, i))
    }

    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(i.comments.iter().map(to_comment).collect())
    }

    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError> {
        let s = self.state();
        let i = s
            .issue(issue)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        let r = s
            .repo(&issue.repo)
            .map_err(|e| refused("GET", issue.to_string(), e))?;
        Ok(i.timeline
            .iter()
            .map(|t| TimelineEntry {
                kind: t.kind.clone(),
                actor: t.actor.clone(),
                label: t
                    .label_id
                    .and_then(|id| r.labels.iter().find(|l| l.id == id))
                    .map(|l| l.name.clone()),
                added: t.kind == "label" && t.body == "1",
                created_at: rfc3339(t.created),
            })
            .collect())
    }

    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        Ok(self.state().permission_of(repo, user))
    }

    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError> {
        let mut s = self.state();
        let l = match s.label_by_name(repo, name) {
            Ok(l) => l,
            Err(_) => s
                .create_label(repo, name, color, description)
                .map_err(|e| refused("POST", repo.to_string(), e))?,
        };
        Ok(Label {
            id: l.id,
            name: l.name,
        })
    }

    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        self.state()
            .change_label(&bot, issue, label_id, true)
            .map_err(|e| refused("POST", issue.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(())
    }

    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        match self.state().change_label(&bot, issue, label_id, false) {
            Ok(()) | Err(Refusal::NotFound) => {}
            Err(e) => return Err(refused("DELETE", issue.to_string(), e)),
        }
        self.deliver_webhooks().await;
        Ok(())
    }

    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError> {
        let bot = self.bot();
        let c = self
            .state()
            .add_comment(&bot, issue, body)
            .map_err(|e| refused("POST", issue.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(to_comment(&c))
    }

    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let bot = self.bot();
        let (c, _) = self
            .state()
            .edit_comment(&bot, repo, comment_id, body)
            .map_err(|e| refused("PATCH", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(to_comment(&c))
    }

    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let bot = self.bot();
        let number = self
            .state()
            .create_issue(&bot, repo, title, body)
            .map_err(|e| refused("POST", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(number)
    }

    async fn branch(
        &self,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<director::forge::Branch>, ForgeError> {
        let bot = self.bot();
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.branches.get(name).map(|commits| director::forge::Branch {
            name: name.to_owned(),
            commit: commits
                .last()
                .map(|c| format!("{c:040x}"))
                .unwrap_or_default(),
            user_can_push: s.can_push(repo, &bot, name),
            user_can_merge: s.can_merge(repo, &bot, name),
        }))
    }

    async fn branch_as(
        &self,
        token: &director::settings::Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<director::forge::Branch>, ForgeError> {
        let s = self.state();
        let t = s
            .user_tokens
            .iter()
            .find(|t| t.sha1 == token.expose())
            .cloned();
        let Some(t) = t else {
            return Err(ForgeError::Unauthorized {
                method: "GET".into(),
                path: repo.to_string(),
            });
        };
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.branches.get(name).map(|commits| director::forge::Branch {
            name: name.to_owned(),
            commit: commits
                .last()
                .map(|c| format!("{c:040x}"))
                .unwrap_or_default(),
            user_can_push: s.can_push(repo, &t.login, name),
            user_can_merge: s.can_merge(repo, &t.login, name),
        }))
    }

    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        let s = self.state();
        s.commits_ahead(repo, base, head)
            .map_err(|e| refused("GET", repo.to_string(), e))
    }

    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError> {
        let s = self.state();
        let r = s
            .repo(repo)
            .map_err(|e| refused("GET", repo.to_string(), e))?;
        Ok(r.pulls
            .iter()
            .find(|p| p.base == base && p.head == head && p.state == "open")
            .map(|p| p.number))
    }

    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let bot = self.bot();
        let n = self
            .state()
            .create_pull(&bot, repo, head, base, title, body)
            .map_err(|e| refused("POST", repo.to_string(), e))?;
        self.deliver_webhooks().await;
        Ok(n)
    }

    async fn pull(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<director::forge::PullRequest, ForgeError> {
        pulls::pull(&self.state(), repo, number)
            .map_err(|e| refused("GET", format!("{repo}/pulls/{number}"), e))
    }

    async fn reviews(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<Vec<director::forge::Review>, ForgeError> {
        pulls::reviews(&self.state(), repo, number)
            .map_err(|e| refused("GET", format!("{repo}/pulls/{number}/reviews"), e))
    }

    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<director::forge::ReviewComment>, ForgeError> {
        pulls::review_comments(&self.state(), repo, number, review).map_err(|e| {
            refused(
                "GET",
                format!("{repo}/pulls/{number}/reviews/{review}/comments"),
                e,
            )
        })
    }

    async fn mint_run_token(
        &self,
        runner: &director::forge::RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<director::forge::MintedToken, ForgeError> {
        let mut s = self.state();
        let t = s
            .mint_token(
                &runner.login,
                runner.password.expose(),
                name,
                vec![director::forge::RUN_TOKEN_SCOPE.into()],
                Some(vec![repo.clone()]),
            )
            .map_err(|e| refused("POST", format!("/users/{}/tokens", runner.login), e))?;
        Ok(director::forge::MintedToken {
            id: t.id,
            name: t.name,
            token: director::settings::Secret::new(t.sha1),
            repositories: t.repos,
            scopes: t.scopes,
        })
    }

    async fn runner_tokens(
        &self,
        runner: &director::forge::RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        let s = self.state();
        s.check_password(&runner.login, runner.password.expose())
            .map_err(|e| refused("GET", runner.login.clone(), e))?;
        Ok(s.user_tokens
            .iter()
            .filter(|t| t.login == runner.login)
            .map(|t| (t.id, t.name.clone()))
            .collect())
    }

    async fn delete_run_token(
        &self,
        runner: &director::forge::RunnerAccount,
        name: &str,
    ) -> Result<(), ForgeError> {
        let mut s = self.state();
        s.check_password(&runner.login, runner.password.expose())
            .map_err(|e| refused("DELETE", runner.login.clone(), e))?;
        s.user_tokens
            .retain(|t| !(t.login == runner.login && (t.name == name || t.id.to_string() == name)));
        Ok(())
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError> {
        self.state()
            .orgs
            .get(org)
            .cloned()
            .ok_or_else(|| ForgeError::NotFound {
                method: "GET".into(),
                path: format!("/orgs/{org}/repos"),
            })
    }

    async fn hooks(&self, repo: &RepoName) -> Result<Vec<Hook>, ForgeError> {
        let bot = self.bot();
        let hooks = self
            .state()
            .list_hooks(&bot, repo)
            .map_err(|e| refused("GET", format!("{repo}/hooks"), e))?;
        Ok(hooks.iter().map(to_hook).collect())
    }

    async fn create_hook(&self, repo: &RepoName, spec: &HookSpec) -> Result<Hook, ForgeError> {
        let bot = self.bot();
        let body = spec.create_body();
        let h = self
            .state()
            .create_hook(&bot, repo, &body)
            .map_err(|e| refused("POST", format!("{repo}/hooks"), e))?;
        Ok(to_hook(&h))
    }

    async fn edit_hook(
        &self,
        repo: &RepoName,
        id: u64,
        spec: &director::forge::HookSpec,
        events: &[String],
    ) -> Result<Hook, ForgeError> {
        let bot = self.bot();
        let body = spec.edit_body(events);
        let h = self
            .state()
            .edit_hook(&bot, repo, id, &body)
            .map_err(|e| refused("PATCH", format!("{repo}/hooks/{id}"), e))?;
        Ok(to_hook(&h))
    }

    async fn delete_hook(&self, repo: &RepoName, id: u64) -> Result<(), ForgeError> {
        let bot = self.bot();
        match self.state().delete_hook(&bot, repo, id) {
            Ok(()) | Err(Refusal::NotFound) => Ok(()),
            Err(e) => Err(refused("DELETE", format!("{repo}/hooks/{id}"), e)),
        }
    }

    fn run_endpoints(
        &self,
        repo: &RepoName,
        runner: &director::forge::RunnerAccount,
    ) -> director::forge::RunEndpoints {
        director::forge::forgejo::run_endpoints("http://fake-forge.invalid", repo, runner)
    }
}

/// A hook's events as Forgejo 15 keeps and lists them: `pull_request_review` is one flag,
/// listed back as its three events, and those three names are not recognised when given.
fn stored_events(list: &[Value]) -> Vec<String> {
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
