//! `FakeGitHub`: a stateful GitHub on loopback for the GitHub backend. It holds users and
//! their roles, one App (whose RS256 JWT it verifies against the App's public key),
//! installations, installation tokens (whose repository and permission limits it enforces
//! on every later request, and which expire and can be revoked), repositories with issues,
//! labels, comments, issue events, commits and branches (classic protection and rulesets),
//! git refs, contents, compare, pull requests and reviews. The App's own writes come back as
//! signed webhooks, as GitHub sends them. Rate limits can be scripted.
//!
//! Every request is checked against GitHub's REST description (the subset the director uses
//! of `api.github.com.json`, `tests/fixtures/github/api.github.com.subset.json`) by the same
//! checker FakeForge uses for Forgejo's: what does not fit is kept in `violations`, and
//! fails the test when the fake is dropped.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::sync::{Arc, Mutex, OnceLock};

use crate::forge::contract::Spec;

use actix_web::web::Bytes;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use director::forge::signature::sign;
use serde_json::{Value, json};

mod code;
mod git;
mod issues;
mod pulls;

pub const APP_ID: u64 = 4242;
pub const APP_SLUG: &str = "director-app";
pub const BOT: &str = "director-app[bot]";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/github");

/// The App's private key, as the operator gives it to the director.
pub fn app_key() -> String {
    std::fs::read_to_string(format!("{FIXTURES}/test-app-key.pem")).expect("test key")
}

/// Another RSA key: a JWT signed with it is not the App's.
pub fn other_key() -> String {
    std::fs::read_to_string(format!("{FIXTURES}/other-app-key.pem")).expect("other key")
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
    /// `app`, `token:<installation>` or `none`.
    pub auth: String,
}

/// An installation token as the fake minted it.
#[derive(Clone, Debug)]
pub struct Token {
    pub value: String,
    pub installation: u64,
    /// `None`: every repository of the installation.
    pub repositories: Option<Vec<String>>,
    pub permissions: BTreeMap<String, String>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub revoked: bool,
}

struct Installation {
    account: String,
    repos: Vec<String>,
    permissions: BTreeMap<String, String>,
}

#[derive(Clone)]
struct IssueS {
    number: u64,
    title: String,
    body: Option<String>,
    state: String,
    labels: Vec<String>,
    author: String,
    updated_at: String,
    pull: Option<PullS>,
}

#[derive(Clone)]
struct PullS {
    head: String,
    base: String,
    merged: bool,
}

#[derive(Clone)]
struct CommentS {
    id: u64,
    number: u64,
    author: String,
    body: String,
    created_at: String,
    updated_at: String,
}

#[derive(Clone)]
struct EventS {
    number: u64,
    event: String,
    actor: String,
    label: Option<String>,
    created_at: String,
}

struct ReviewS {
    id: u64,
    number: u64,
    user: String,
    state: String,
    body: String,
    comments: Vec<(String, String, u64)>,
}

struct Ruleset {
    id: u64,
    enforcement: String,
    approvals: u64,
    app_can_bypass: bool,
}

#[derive(Default)]
struct Repo {
    id: u64,
    private: bool,
    /// GitHub Actions is off for the repository (`PUT .../actions/permissions`).
    actions_off: bool,
    default_branch: String,
    labels: Vec<(u64, String, String)>,
    issues: BTreeMap<u64, IssueS>,
    comments: Vec<CommentS>,
    events: Vec<EventS>,
    reviews: Vec<ReviewS>,
    /// sha → parent.
    commits: HashMap<String, Option<String>>,
    branches: BTreeMap<String, String>,
    files: BTreeMap<(String, String), String>,
    /// Classic protection of the default branch: (approvals, apps that may bypass).
    protection: Option<(u64, Vec<String>)>,
    rulesets: Vec<Ruleset>,
    /// Commit statuses posted: (sha, the request's body), in order.
    statuses: Vec<(String, Value)>,
    next_number: u64,
    /// Served over git's smart HTTP: git holds the branches.
    git: Option<git::Served>,
}

#[derive(Default)]
struct Rates {
    /// The next answers are 429 with `Retry-After: 1`.
    limited: u32,
    /// `x-ratelimit-remaining` and reset (epoch seconds) to report.
    remaining: Option<(u64, i64)>,
}

#[derive(Default)]
struct State {
    installations: BTreeMap<u64, Installation>,
    tokens: Vec<Token>,
    /// (repo, user) → role name (`admin`, `maintain`, `write`, `triage`, `read`).
    roles: HashMap<(String, String), String>,
    repos: BTreeMap<String, Repo>,
    next_id: u64,
    requests: Vec<Recorded>,
    /// Every distinct credential presented (JWTs and tokens), to look for in logs.
    credentials: Vec<String>,
    violations: Vec<String>,
    webhook: Option<(String, String)>,
    webhooks_on: bool,
    /// Where the API is served below the root: `/api/v3` on GitHub Enterprise Server.
    prefix: String,
    rates: Rates,
    /// How far the fake's clock for tokens runs ahead of the system's ([`FakeGitHub::advance`]).
    ahead: chrono::Duration,
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn user(login: &str) -> Value {
    let kind = if login.ends_with("[bot]") {
        "Bot"
    } else {
        "User"
    };
    json!({ "login": login, "id": login.len(), "type": kind })
}

impl Repo {
    /// A new open issue (or pull request) with the next number; issues and pulls share them.
    fn add_issue(
        &mut self,
        title: &str,
        body: Option<&str>,
        author: &str,
        pull: Option<PullS>,
    ) -> IssueS {
        let issue = IssueS {
            number: self.next_number,
            title: title.to_owned(),
            body: body.map(str::to_owned),
            state: "open".into(),
            labels: Vec::new(),
            author: author.to_owned(),
            updated_at: now(),
            pull,
        };
        self.next_number += 1;
        self.issues.insert(issue.number, issue.clone());
        issue
    }
}

impl State {
    /// The fake's time for tokens: when they expire, and whether they have.
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + self.ahead
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn repo(&mut self, name: &str) -> Option<&mut Repo> {
        self.repos.get_mut(&name.to_ascii_lowercase())
    }

    fn role(&self, repo: &str, login: &str) -> Option<String> {
        self.roles
            .get(&(repo.to_ascii_lowercase(), login.to_owned()))
            .cloned()
    }

    fn issue_json(&self, repo: &str, i: &IssueS) -> Value {
        let r = &self.repos[&repo.to_ascii_lowercase()];
        let labels: Vec<Value> = i
            .labels
            .iter()
            .map(|n| {
                let id = r
                    .labels
                    .iter()
                    .find(|(_, name, _)| name == n)
                    .map_or(0, |(id, _, _)| *id);
                json!({ "id": id, "name": n })
            })
            .collect();
        let mut v = json!({
            "id": i.number * 1000,
            "number": i.number,
            "title": i.title,
            "body": i.body,
            "state": i.state,
            "labels": labels,
            "user": user(&i.author),
            "updated_at": i.updated_at,
            "repository_url": format!("https://api.github.com/repos/{repo}"),
        });
        if i.pull.is_some() {
            v["pull_request"] =
                json!({ "url": format!("https://api.github.com/repos/{repo}/pulls/{}", i.number) });
        }
        v
    }

    fn pull_json(&self, repo: &str, i: &IssueS) -> Value {
        let p = i.pull.clone().unwrap_or(PullS {
            head: String::new(),
            base: String::new(),
            merged: false,
        });
        json!({
            "number": i.number, "title": i.title, "body": i.body, "state": i.state,
            "merged": p.merged, "merged_at": if p.merged { Some(i.updated_at.clone()) } else { None },
            "updated_at": i.updated_at, "user": user(&i.author),
            "head": { "ref": p.head, "repo": { "full_name": repo } },
            "base": { "ref": p.base, "repo": { "full_name": repo } },
        })
    }

    /// Ancestors of `sha`, itself included.
    fn history(repo: &Repo, sha: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = Some(sha.to_owned());
        while let Some(s) = at {
            if out.contains(&s) {
                break;
            }
            at = repo.commits.get(&s).cloned().flatten();
            out.push(s);
        }
        out
    }
}

/// The App's webhook echo of a change, queued to send after the answer.
struct Echo {
    event: &'static str,
    body: Value,
}

pub struct FakeGitHub {
    state: Arc<Mutex<State>>,
    echoes: tokio::sync::mpsc::UnboundedSender<Echo>,
    handle: actix_web::dev::ServerHandle,
    pub url: String,
}

/// Stops the server; fails the test (panics) when any request it served was outside GitHub's
/// REST description, unless the test took them ([`FakeGitHub::take_violations`]) or is
/// already failing.
impl Drop for FakeGitHub {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::spawn(async move { handle.stop(false).await });
        if std::thread::panicking() {
            return;
        }
        let violations = self.take_violations();
        assert!(
            violations.is_empty(),
            "requests outside GitHub's REST description ({}):\n{}",
            violations.len(),
            violations.join("\n")
        );
    }
}

type Shared = (Arc<Mutex<State>>, tokio::sync::mpsc::UnboundedSender<Echo>);

impl FakeGitHub {
    pub async fn start() -> Self {
        Self::start_at("").await
    }

    /// Serving the API below `prefix` (`/api/v3`, as GitHub Enterprise Server does); `url`
    /// is then the API base.
    pub async fn start_at(prefix: &str) -> Self {
        let state = Arc::new(Mutex::new(State {
            webhooks_on: true,
            prefix: prefix.to_owned(),
            ..State::default()
        }));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Echo>();
        {
            let state = state.clone();
            tokio::spawn(async move {
                let client = crate::http_client();
                while let Some(echo) = rx.recv().await {
                    let target = {
                        let s = state.lock().expect("lock");
                        s.webhook.clone().filter(|_| s.webhooks_on)
                    };
                    let Some((url, secret)) = target else {
                        continue;
                    };
                    let body = echo.body.to_string();
                    let _ = client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .header("X-GitHub-Event", echo.event)
                        .header("X-GitHub-Delivery", uuid_like())
                        .header(
                            "X-Hub-Signature-256",
                            format!("sha256={}", sign(&secret, body.as_bytes())),
                        )
                        .header("User-Agent", "GitHub-Hookshot/fake")
                        .body(body)
                        .send()
                        .await;
                }
            });
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let data = web::Data::new((state.clone(), tx.clone()));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .default_service(web::to(handle))
        })
        .listen(listener)
        .expect("listen")
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            state,
            echoes: tx,
            handle,
            url: format!("http://127.0.0.1:{port}{prefix}"),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().expect("lock");
        f(&mut s)
    }

    /// A repository with one commit on `main`.
    /// Turns GitHub Actions off for the repository, as its settings page does.
    pub fn disable_actions(&self, full_name: &str) {
        self.with(|s| {
            if let Some(r) = s.repos.get_mut(&full_name.to_ascii_lowercase()) {
                r.actions_off = true;
            }
        });
    }

    pub fn create_repo(&self, full_name: &str) {
        self.with(|s| {
            let id = s.id();
            let mut repo = Repo {
                id,
                private: false,
                default_branch: "main".into(),
                next_number: 1,
                ..Repo::default()
            };
            repo.commits.insert("c0".into(), None);
            repo.branches.insert("main".into(), "c0".into());
            s.repos.insert(full_name.to_ascii_lowercase(), repo);
        });
    }

    /// Serves `repo` over git's smart HTTP at `<site>/<owner>/<name>.git`, its bare
    /// repository kept under `root` (which the caller owns and removes); from now on git
    /// holds its branches, starting from one commit on the default branch. Needs `git`.
    pub fn serve_git(&self, repo: &str, root: &std::path::Path) -> std::io::Result<()> {
        self.with(|s| {
            let full = repo.to_ascii_lowercase();
            let r = s
                .repos
                .get_mut(&full)
                .ok_or_else(|| std::io::Error::other(format!("no repository {repo}")))?;
            git::serve_repo(r, &full, root)
        })
    }

    /// The file at `path` on `branch`, as git has it (for tests of what was pushed).
    pub fn git_show(&self, repo: &str, branch: &str, path: &str) -> Option<String> {
        let g = self.with(|s| s.repo(repo).and_then(|r| r.git.clone()))?;
        crate::forge::git::git(
            &g.dir,
            &["show", &format!("refs/heads/{branch}:{path}")],
            &[],
            None,
        )
        .ok()
    }

    /// Moves the fake's clock for tokens on by `by`: tokens minted an hour before are expired.
    pub fn advance(&self, by: std::time::Duration) {
        self.with(|s| s.ahead += chrono::Duration::from_std(by).unwrap_or_default());
    }

    /// The site's base URL, where git is served (the API may be below it).
    pub fn site(&self) -> String {
        let prefix = self.with(|s| s.prefix.clone());
        self.url
            .strip_suffix(prefix.as_str())
            .unwrap_or(&self.url)
            .to_owned()
    }

    /// Installs the App on `account` for `repos`, with the App's usual permissions.
    pub fn install(&self, account: &str, repos: &[&str]) -> u64 {
        self.with(|s| {
            let id = 100 + s.id();
            let permissions = [
                ("administration", "read"),
                ("contents", "write"),
                ("issues", "write"),
                ("metadata", "read"),
                ("pull_requests", "write"),
                ("statuses", "write"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            s.installations.insert(
                id,
                Installation {
                    account: account.to_owned(),
                    repos: repos.iter().map(|r| r.to_ascii_lowercase()).collect(),
                    permissions,
                },
            );
            id
        })
    }

    /// Sets what the installation was granted of one permission (`read`, `write`, or
    /// anything else for none): tokens can never get more.
    pub fn set_permission(&self, installation: u64, permission: &str, level: &str) {
        self.with(|s| {
            if let Some(i) = s.installations.get_mut(&installation) {
                if level == "read" || level == "write" {
                    i.permissions
                        .insert(permission.to_owned(), level.to_owned());
                } else {
                    i.permissions.remove(permission);
                }
            }
        });
    }

    pub fn grant(&self, repo: &str, login: &str, role: &str) {
        self.with(|s| {
            s.roles.insert(
                (repo.to_ascii_lowercase(), login.to_owned()),
                role.to_owned(),
            );
        });
    }

    /// Classic protection on the default branch: a pull request with `approvals` approving
    /// reviews, `bypass_apps` (slugs) exempt.
    pub fn protect(&self, repo: &str, approvals: u64, bypass_apps: &[&str]) {
        self.with(|s| {
            if let Some(r) = s.repo(repo) {
                r.protection = Some((
                    approvals,
                    bypass_apps.iter().map(|a| (*a).to_owned()).collect(),
                ));
            }
        });
    }

    /// A ruleset on the default branch requiring a pull request with `approvals` reviews.
    pub fn ruleset(&self, repo: &str, enforcement: &str, approvals: u64, app_can_bypass: bool) {
        self.with(|s| {
            let id = s.id();
            if let Some(r) = s.repo(repo) {
                r.rulesets.push(Ruleset {
                    id,
                    enforcement: enforcement.to_owned(),
                    approvals,
                    app_can_bypass,
                });
            }
        });
    }

    pub fn set_webhook(&self, url: &str, secret: &str) {
        self.with(|s| s.webhook = Some((url.to_owned(), secret.to_owned())));
    }

    /// Webhooks lost (an outage of the receiver, say): nothing is sent while off.
    pub fn set_webhooks(&self, on: bool) {
        self.with(|s| s.webhooks_on = on);
    }

    /// The next `n` answers are 429 with `Retry-After: 1`.
    pub fn rate_limit_next(&self, n: u32) {
        self.with(|s| s.rates.limited = n);
    }

    /// Every answer reports `remaining` requests left until `reset_in` seconds from now.
    pub fn report_remaining(&self, remaining: u64, reset_in: i64) {
        self.with(|s| {
            s.rates.remaining = Some((remaining, chrono::Utc::now().timestamp() + reset_in))
        });
    }

    pub fn open_issue(&self, repo: &str, author: &str, title: &str, body: &str) -> u64 {
        let (number, echo) = self.with(|s| {
            let r = s.repo(repo).expect("repo");
            let issue = r.add_issue(title, Some(body), author, None);
            let number = issue.number;
            let echo = issues_echo(s, repo, &issue, "opened", author, None);
            (number, echo)
        });
        let _ = self.echoes.send(echo);
        number
    }

    /// `actor` puts `label` on the issue (creating the label as needed): an event, and a
    /// webhook.
    pub fn label(&self, actor: &str, repo: &str, number: u64, label: &str) {
        self.set_label(actor, repo, number, label, true);
    }

    /// `actor` takes `label` off.
    pub fn unlabel(&self, actor: &str, repo: &str, number: u64, label: &str) {
        self.set_label(actor, repo, number, label, false);
    }

    fn set_label(&self, actor: &str, repo: &str, number: u64, label: &str, on: bool) {
        let echo = self.with(|s| {
            let id = s.id();
            let r = s.repo(repo).expect("repo");
            if !r.labels.iter().any(|(_, n, _)| n == label) {
                r.labels.push((id, label.to_owned(), "ededed".into()));
            }
            let at = now();
            let i = r.issues.get_mut(&number).expect("issue");
            i.labels.retain(|l| l != label);
            if on {
                i.labels.push(label.to_owned());
            }
            i.updated_at = at.clone();
            let issue = i.clone();
            let action = if on { "labeled" } else { "unlabeled" };
            r.events.push(EventS {
                number,
                event: action.into(),
                actor: actor.to_owned(),
                label: Some(label.to_owned()),
                created_at: at,
            });
            issues_echo(s, repo, &issue, action, actor, Some(label))
        });
        let _ = self.echoes.send(echo);
    }

    /// `actor` replaces the issue's body (an `issues` `edited` webhook).
    pub fn edit_issue(&self, actor: &str, repo: &str, number: u64, body: &str) {
        let echo = self.with(|s| {
            let r = s.repo(repo).expect("repo");
            let i = r.issues.get_mut(&number).expect("issue");
            let before = i.body.clone();
            i.body = Some(body.to_owned());
            i.updated_at = now();
            let issue = i.clone();
            let mut echo = issues_echo(s, repo, &issue, "edited", actor, None);
            echo.body["changes"] = json!({ "body": { "from": before } });
            echo
        });
        let _ = self.echoes.send(echo);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|s| s.requests.clone())
    }

    pub fn credentials_seen(&self) -> Vec<String> {
        self.with(|s| s.credentials.clone())
    }

    pub fn violations(&self) -> Vec<String> {
        self.with(|s| s.violations.clone())
    }

    /// The requests outside GitHub's REST description, forgotten here: a test that makes
    /// them on purpose takes them, so that dropping the fake does not fail it.
    pub fn take_violations(&self) -> Vec<String> {
        self.with(|s| std::mem::take(&mut s.violations))
    }

    pub fn tokens(&self) -> Vec<Token> {
        self.with(|s| s.tokens.clone())
    }

    /// The title of issue or pull request `number`.
    pub fn title_of(&self, repo: &str, number: u64) -> Option<String> {
        self.with(|s| {
            s.repo(repo)
                .and_then(|r| r.issues.get(&number).map(|i| i.title.clone()))
        })
    }

    /// The commit statuses posted on `sha`: (state, context, description, target_url).
    pub fn statuses(&self, repo: &str, sha: &str) -> Vec<(String, String, String, String)> {
        self.with(|s| {
            s.repo(repo)
                .map(|r| {
                    r.statuses
                        .iter()
                        .filter(|(at, _)| at == sha)
                        .map(|(_, b)| {
                            let text = |k: &str| b[k].as_str().unwrap_or_default().to_owned();
                            (
                                text("state"),
                                text("context"),
                                text("description"),
                                text("target_url"),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// (author, body) of the issue's comments, oldest first.
    pub fn comments(&self, repo: &str, number: u64) -> Vec<(String, String)> {
        self.with(|s| {
            s.repo(repo)
                .map(|r| {
                    r.comments
                        .iter()
                        .filter(|c| c.number == number)
                        .map(|c| (c.author.clone(), c.body.clone()))
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    pub fn labels_of(&self, repo: &str, number: u64) -> Vec<String> {
        self.with(|s| {
            s.repo(repo)
                .and_then(|r| r.issues.get(&number).map(|i| i.labels.clone()))
                .unwrap_or_default()
        })
    }

    /// (number, head, base, body) of the repository's pull requests.
    pub fn pulls(&self, repo: &str) -> Vec<(u64, String, String, String)> {
        self.with(|s| {
            s.repo(repo)
                .map(|r| {
                    r.issues
                        .values()
                        .filter_map(|i| {
                            i.pull.as_ref().map(|p| {
                                (
                                    i.number,
                                    p.head.clone(),
                                    p.base.clone(),
                                    i.body.clone().unwrap_or_default(),
                                )
                            })
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// A branch's head commit.
    pub fn branch_head(&self, repo: &str, branch: &str) -> Option<String> {
        self.with(|s| s.repo(repo).and_then(|r| r.branches.get(branch).cloned()))
    }
}

fn comment_json(c: &CommentS) -> Value {
    json!({ "id": c.id, "body": c.body, "user": user(&c.author), "created_at": c.created_at, "updated_at": c.updated_at })
}

fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn issues_echo(
    s: &State,
    repo: &str,
    issue: &IssueS,
    action: &str,
    sender: &str,
    label: Option<&str>,
) -> Echo {
    let mut body = json!({
        "action": action,
        "issue": s.issue_json(repo, issue),
        "repository": { "full_name": repo, "name": repo.split('/').nth(1), "private": false },
        "sender": user(sender),
        "installation": { "id": s.installations.keys().next() },
    });
    if let Some(l) = label {
        body["label"] = json!({ "name": l });
    }
    Echo {
        event: "issues",
        body,
    }
}

// ---- the contract: GitHub's REST description, the subset the director uses ----

fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| {
        Spec::load(&format!("{FIXTURES}/api.github.com.subset.json")).expect("GitHub's description")
    })
}

// ---- the HTTP face ----

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reply(code: u16, body: Value) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(code).expect("status"))
        .content_type("application/json")
        .body(body.to_string())
}

fn message(code: u16, text: &str) -> HttpResponse {
    reply(
        code,
        json!({ "message": text, "documentation_url": "https://docs.github.com/rest" }),
    )
}

/// Who is asking.
#[derive(Clone)]
enum Caller {
    App,
    Token(Token),
}

fn verify_jwt(token: &str) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Claims {
        iat: i64,
        exp: i64,
        iss: Value,
    }
    let public =
        std::fs::read(format!("{FIXTURES}/test-app-key.pub.pem")).map_err(|e| e.to_string())?;
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&public).map_err(|e| e.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    // `iss` is the App id as a number, which the library reads only as a string: checked below.
    validation.set_required_spec_claims(&["exp"]);
    let data = jsonwebtoken::decode::<Claims>(token, &key, &validation)
        .map_err(|e| format!("A JSON web token could not be decoded ({e})"))?;
    let c = data.claims;
    let iss = c
        .iss
        .as_u64()
        .or_else(|| c.iss.as_str().and_then(|s| s.parse().ok()));
    if iss != Some(APP_ID) {
        return Err("'Issuer' claim ('iss') must be an Integer".into());
    }
    if c.exp - c.iat > 660 {
        return Err("'Expiration time' claim ('exp') is too far in the future".into());
    }
    Ok(())
}

/// What a route needs of an installation token: (permission, write).
fn needs(segments: &[String], method: &str) -> Option<(&'static str, bool)> {
    let write = method != "GET";
    let area = segments.get(3).map(String::as_str);
    Some(match (segments.first().map(String::as_str), area) {
        (Some("search"), _) => ("issues", false),
        (Some("orgs"), _) => ("metadata", false),
        (Some("repos"), None) => ("metadata", false),
        (Some("repos"), Some("issues" | "labels")) => ("issues", write),
        (Some("repos"), Some("pulls")) => ("pull_requests", write),
        (Some("repos"), Some("branches")) if segments.len() > 5 => ("administration", write),
        (Some("repos"), Some("branches" | "compare" | "git" | "contents")) => ("contents", write),
        (Some("repos"), Some("collaborators" | "rules" | "rulesets")) => ("metadata", false),
        // Commit statuses and check runs: read with `statuses` and `checks` on GitHub; this
        // fake's installations have neither, and grants them as metadata.
        (Some("repos"), Some("commits")) => ("metadata", false),
        // Posting one: the App's Commit statuses permission.
        (Some("repos"), Some("statuses")) => ("statuses", write),
        _ => return None,
    })
}

async fn handle(req: HttpRequest, body: Bytes, data: web::Data<Shared>) -> HttpResponse {
    if git::is_git_path(req.path()) {
        return git::serve(req, &body, &data).await;
    }
    let (state, echoes) = (&data.0, &data.1);
    let method = req.method().as_str().to_owned();
    let prefix = state.lock().expect("lock").prefix.clone();
    let Some(path) = req.path().strip_prefix(prefix.as_str()).map(str::to_owned) else {
        return message(404, "Not Found");
    };
    let query_text = req.query_string().to_owned();
    let query: Vec<(String, String)> = query_text
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(_) => return message(400, "Problems parsing JSON"),
        }
    };
    let segments: Vec<String> = path.trim_matches('/').split('/').map(decode).collect();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut s = state.lock().expect("lock");
    // An empty JSON object is how a client says "no options".
    let checked_body = json_body
        .as_ref()
        .filter(|b| b.as_object().is_none_or(|o| !o.is_empty()));
    if let Err(v) = spec().check_segments(&method, &segments, &query, checked_body) {
        s.violations.push(v);
    }
    let credential = auth
        .strip_prefix("Bearer ")
        .or_else(|| auth.strip_prefix("token "))
        .unwrap_or("");
    if !credential.is_empty() && !s.credentials.iter().any(|c| c == credential) {
        s.credentials.push(credential.to_owned());
    }
    // Who is asking, or why they are refused (401): recorded either way.
    let caller: Result<Option<Caller>, (String, String)> = if credential.is_empty() {
        Ok(None)
    } else if credential.split('.').count() == 3 {
        verify_jwt(credential)
            .map(|()| Some(Caller::App))
            .map_err(|e| (format!("bad-jwt {e}"), e))
    } else {
        match s.tokens.iter().find(|t| t.value == credential) {
            Some(t) if t.revoked || t.expires_at < s.now() => {
                Err(("dead-token".into(), "Bad credentials".into()))
            }
            Some(t) => Ok(Some(Caller::Token(t.clone()))),
            None => Err(("unknown".into(), "Bad credentials".into())),
        }
    };
    s.requests.push(Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query_text.clone(),
        body: json_body.clone().unwrap_or(Value::Null),
        auth: match &caller {
            Err((label, _)) => label.clone(),
            Ok(None) => "none".into(),
            Ok(Some(Caller::App)) => "app".into(),
            Ok(Some(Caller::Token(t))) => format!("token:{}", t.installation),
        },
    });
    let caller = match caller {
        Ok(c) => c,
        Err((_, why)) => return message(401, &why),
    };
    if s.rates.limited > 0 {
        s.rates.limited -= 1;
        return HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", "1"))
            .insert_header(("x-ratelimit-remaining", "0"))
            .content_type("application/json")
            .body(json!({ "message": "API rate limit exceeded" }).to_string());
    }
    let mut answer = route(
        &mut s,
        echoes,
        &method,
        &segments,
        &query,
        json_body.as_ref(),
        caller,
    );
    answer.headers_mut().insert(
        actix_web::http::header::DATE,
        actix_web::http::header::HeaderValue::from_str(
            &chrono::Utc::now().to_rfc2822().replace("+0000", "GMT"),
        )
        .expect("date"),
    );
    if let Some((remaining, reset)) = s.rates.remaining {
        let h = answer.headers_mut();
        h.insert(
            actix_web::http::header::HeaderName::from_static("x-ratelimit-remaining"),
            remaining.to_string().parse().expect("header"),
        );
        h.insert(
            actix_web::http::header::HeaderName::from_static("x-ratelimit-reset"),
            reset.to_string().parse().expect("header"),
        );
    }
    answer
}

fn q<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A page of `items` (`per_page` capped at 100, `page` from 1).
fn page(items: Vec<Value>, query: &[(String, String)]) -> HttpResponse {
    let per = q(query, "per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(30usize)
        .clamp(1, 100);
    let page = q(query, "page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    let items: Vec<Value> = items.into_iter().skip((page - 1) * per).take(per).collect();
    reply(200, Value::Array(items))
}

fn route(
    s: &mut State,
    echoes: &tokio::sync::mpsc::UnboundedSender<Echo>,
    method: &str,
    seg: &[String],
    query: &[(String, String)],
    body: Option<&Value>,
    caller: Option<Caller>,
) -> HttpResponse {
    let segs: Vec<&str> = seg.iter().map(String::as_str).collect();
    // The App's own routes, with its JWT.
    let app_route = matches!(segs.as_slice(), ["app", ..])
        || matches!(
            segs.as_slice(),
            ["repos", _, _, "installation"]
                | ["orgs", _, "installation"]
                | ["users", _, "installation"]
        );
    if app_route {
        if !matches!(caller, Some(Caller::App)) {
            return message(401, "A JSON web token could not be decoded");
        }
        return app_routes(s, method, &segs, body);
    }
    if segs == ["installation", "token"] && method == "DELETE" {
        let Some(Caller::Token(t)) = caller else {
            return message(401, "Bad credentials");
        };
        for token in s.tokens.iter_mut().filter(|x| x.value == t.value) {
            token.revoked = true;
        }
        return HttpResponse::NoContent().finish();
    }
    let token = match caller {
        Some(Caller::Token(t)) => t,
        Some(Caller::App) => {
            return message(
                401,
                "A JSON web token cannot be used here: use an installation token",
            );
        }
        None => return message(401, "Requires authentication"),
    };
    let inst = &s.installations[&token.installation];
    let reaches = |repo: &str| {
        let repo = repo.to_ascii_lowercase();
        inst.repos.contains(&repo)
            && token
                .repositories
                .as_ref()
                .is_none_or(|list| list.iter().any(|r| r.eq_ignore_ascii_case(&repo)))
    };
    if let Some((perm, write)) = needs(seg, method) {
        let have = token.permissions.get(perm).map(String::as_str);
        let ok = perm == "metadata"
            || match have {
                Some("write") => true,
                Some("read") => !write,
                _ => false,
            };
        if !ok {
            return message(403, "Resource not accessible by integration");
        }
    }
    if segs.first() == Some(&"search") {
        let text = q(query, "q").unwrap_or_default().to_owned();
        let mut since = String::new();
        let mut owner = String::new();
        for term in text.split(' ') {
            if let Some(v) = term.strip_prefix("updated:>=") {
                since = v.to_owned();
            } else if let Some(v) = term.strip_prefix("user:") {
                owner = v.to_ascii_lowercase();
            }
        }
        let mut items = Vec::new();
        for (name, repo) in &s.repos {
            if !name.starts_with(&format!("{owner}/")) || !reaches(name) {
                continue;
            }
            for i in repo.issues.values() {
                if i.pull.is_none() && i.updated_at >= since {
                    items.push(s.issue_json(name, i));
                }
            }
        }
        let total = items.len();
        let per = q(query, "per_page")
            .and_then(|v| v.parse().ok())
            .unwrap_or(30usize)
            .clamp(1, 100);
        let page = q(query, "page")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1usize)
            .max(1);
        let items: Vec<Value> = items.into_iter().skip((page - 1) * per).take(per).collect();
        return reply(
            200,
            json!({ "total_count": total, "incomplete_results": false, "items": items }),
        );
    }
    if let ["orgs", org, "repos"] = segs.as_slice() {
        let names: Vec<Value> = s
            .repos
            .keys()
            .filter(|n| n.starts_with(&format!("{}/", org.to_ascii_lowercase())) && reaches(n))
            .map(|n| json!({ "full_name": n, "default_branch": "main", "private": false }))
            .collect();
        return page(names, query);
    }
    let ["repos", owner, name, rest @ ..] = segs.as_slice() else {
        return message(404, "Not Found");
    };
    let full = format!("{owner}/{name}").to_ascii_lowercase();
    if !s.repos.contains_key(&full) || !reaches(&full) {
        return message(404, "Not Found");
    }
    let at = InRepo {
        next_id: s.id(),
        s,
        echoes,
        full,
        name,
        query,
        body,
        bot: BOT.to_owned(),
    };
    match rest.first().copied() {
        Some("issues" | "labels") => issues::route(at, method, rest),
        Some("pulls") => pulls::route(at, method, rest),
        _ => code::route(at, method, rest),
    }
}

/// A request under `/repos/{owner}/{repo}` the caller may make, with what its routes need.
pub(crate) struct InRepo<'a> {
    s: &'a mut State,
    echoes: &'a tokio::sync::mpsc::UnboundedSender<Echo>,
    /// `owner/name`, lower-cased.
    full: String,
    name: &'a str,
    query: &'a [(String, String)],
    body: Option<&'a Value>,
    bot: String,
    next_id: u64,
}

/// GitHub refuses a push to a branch that requires a pull request, unless the App may
/// bypass the rule.
fn guard_push(r: &Repo, branch: &str) -> Option<HttpResponse> {
    protection_of(r, branch).map(|_| message(409, "Changes must be made through a pull request."))
}

/// What guards `branch` against the App's pushes, in the words of git's refusal: classic
/// protection (`GH006`) or a ruleset (`GH013`).
fn protection_of(r: &Repo, branch: &str) -> Option<&'static str> {
    if branch != r.default_branch {
        return None;
    }
    let by_protection = r
        .protection
        .as_ref()
        .is_some_and(|(n, bypass)| *n >= 1 && !bypass.iter().any(|a| a == APP_SLUG));
    let by_ruleset = r
        .rulesets
        .iter()
        .any(|x| x.enforcement == "active" && x.approvals >= 1 && !x.app_can_bypass);
    if by_protection {
        Some("GH006: Protected branch update failed")
    } else if by_ruleset {
        Some("GH013: Repository rule violations found")
    } else {
        None
    }
}

fn app_routes(s: &mut State, method: &str, segs: &[&str], body: Option<&Value>) -> HttpResponse {
    let installation_of = |s: &State, pred: &dyn Fn(&Installation) -> bool| {
        s.installations
            .iter()
            .find(|(_, i)| pred(i))
            .map(|(id, i)| json!({ "id": id, "account": { "login": i.account }, "repository_selection": "selected", "permissions": i.permissions }))
    };
    let found = match (method, segs) {
        ("GET", ["app"]) => {
            return reply(
                200,
                json!({ "id": APP_ID, "slug": APP_SLUG, "name": "Director" }),
            );
        }
        ("GET", ["repos", o, r, "installation"]) => {
            let full = format!("{o}/{r}").to_ascii_lowercase();
            installation_of(s, &|i| i.repos.contains(&full))
        }
        ("GET", ["orgs", o, "installation"] | ["users", o, "installation"]) => {
            installation_of(s, &|i| i.account.eq_ignore_ascii_case(o))
        }
        ("POST", ["app", "installations", id, "access_tokens"]) => {
            let id: u64 = id.parse().unwrap_or(0);
            let Some(inst) = s.installations.get(&id) else {
                return message(404, "Not Found");
            };
            let b = body.cloned().unwrap_or_else(|| json!({}));
            let mut permissions = inst.permissions.clone();
            if let Some(asked) = b["permissions"].as_object() {
                let mut limited = BTreeMap::new();
                for (k, v) in asked {
                    let v = v.as_str().unwrap_or_default();
                    let granted = inst.permissions.get(k).map(String::as_str);
                    let fits = matches!((granted, v), (Some("write"), _) | (Some("read"), "read"));
                    if !fits {
                        return message(
                            422,
                            &format!(
                                "The permissions requested are not granted to this installation: {k}"
                            ),
                        );
                    }
                    limited.insert(k.clone(), v.to_owned());
                }
                limited.insert("metadata".into(), "read".into());
                permissions = limited;
            }
            let repositories: Option<Vec<String>> = b["repositories"].as_array().map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(|n| format!("{}/{n}", inst.account).to_ascii_lowercase())
                    .collect()
            });
            if let Some(list) = &repositories
                && list.iter().any(|r| !inst.repos.contains(r))
            {
                return message(
                    422,
                    "There is at least one repository that does not exist or is not accessible to the parent installation.",
                );
            }
            let value = format!("ghs_{:036x}", rand::random::<u128>());
            let expires_at = s.now() + chrono::Duration::hours(1);
            s.tokens.push(Token {
                value: value.clone(),
                installation: id,
                repositories: repositories.clone(),
                permissions: permissions.clone(),
                expires_at,
                revoked: false,
            });
            let mut answer = json!({
                "token": value,
                "expires_at": expires_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
                "permissions": permissions,
                "repository_selection": if repositories.is_some() { "selected" } else { "all" },
            });
            if let Some(list) = repositories {
                answer["repositories"] = Value::Array(
                    list.iter()
                        .map(|r| json!({ "full_name": r, "name": r.split('/').nth(1) }))
                        .collect(),
                );
            }
            return reply(201, answer);
        }
        _ => return message(404, "Not Found"),
    };
    match found {
        Some(v) => reply(200, v),
        None => message(404, "Not Found"),
    }
}

// ---- scripted user actions ----

impl FakeGitHub {
    /// `reviewer` submits a review on the pull request (a webhook with the lower-case state).
    pub fn review(&self, repo: &str, number: u64, reviewer: &str, state: &str, body: &str) {
        let echo = self.with(|s| {
            let id = s.id();
            let full = repo.to_ascii_lowercase();
            let r = s.repo(&full).expect("repo");
            r.reviews.push(ReviewS { id, number, user: reviewer.to_owned(), state: state.to_owned(), body: body.to_owned(), comments: Vec::new() });
            let issue = r.issues.get(&number).cloned().expect("pull");
            Echo {
                event: "pull_request_review",
                body: json!({ "action": "submitted", "review": { "id": id, "state": state.to_ascii_lowercase(), "body": body, "user": user(reviewer) },
                    "pull_request": s.pull_json(&full, &issue), "repository": { "full_name": full }, "sender": user(reviewer) }),
            }
        });
        let _ = self.echoes.send(echo);
    }

    /// `who` merges the pull request (its branch into the base).
    pub fn merge(&self, repo: &str, number: u64, who: &str) {
        let echo = self.with(|s| {
            let full = repo.to_ascii_lowercase();
            let r = s.repo(&full).expect("repo");
            let i = r.issues.get_mut(&number).expect("pull");
            i.state = "closed".into();
            i.updated_at = now();
            if let Some(p) = i.pull.as_mut() {
                p.merged = true;
            }
            let issue = i.clone();
            Echo {
                event: "pull_request",
                body: json!({ "action": "closed", "number": number, "pull_request": s.pull_json(&full, &issue), "repository": { "full_name": full }, "sender": user(who) }),
            }
        });
        let _ = self.echoes.send(echo);
    }
}
