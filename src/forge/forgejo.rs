//! The Forgejo implementation of [`Forge`]: a thin client over reqwest for exactly the
//! endpoints the director uses. Per-request timeouts; retries with exponential backoff and
//! full jitter on connection errors, 5xx and 429 (honouring `Retry-After`); pages computed
//! here (Forgejo's `Link` header is built from its ROOT_URL, which may be wrong behind a
//! proxy). Errors name the method and path, never the token.

use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{
    Branch, Check, CheckState, Checks, Comment, FileAt, Forge, ForgeError, Hook, HookSpec, Issue,
    IssueChanges, Label, MergeAnswer, MergeStyle, MintedToken, Permission, PullRequest,
    RUN_TOKEN_SCOPE, Repository, Review, ReviewComment, RunEndpoints, RunnerAccount, TimelineEntry,
};
use crate::domain::{IssueRef, RepoName};
use crate::metrics::Metrics;
use crate::settings::{ForgeSettings, Secret};

/// Forgejo caps every page at 50 items.
pub const PAGE_SIZE: usize = 50;
/// The longest `Retry-After` the client will wait before trying again.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

pub struct ForgejoClient {
    http: reqwest::Client,
    /// The same with no credential: what an anonymous visitor may see.
    anonymous: reqwest::Client,
    api: String,
    max_attempts: u32,
    backoff_base: Duration,
    metrics: Option<Metrics>,
    /// The `Date` of the newest answer: the forge's clock, learnt for free.
    last_date: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

impl ForgejoClient {
    pub fn new(settings: &ForgeSettings, metrics: Option<Metrics>) -> anyhow::Result<Self> {
        Self::with_token(&settings.url, &settings.token, settings, metrics)
    }

    /// A client acting with `token` (the bot's, or later a run's).
    pub fn with_token(
        base_url: &str,
        token: &Secret,
        settings: &ForgeSettings,
        metrics: Option<Metrics>,
    ) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        if !token.is_empty() {
            let mut value =
                HeaderValue::from_str(&format!("token {}", token.expose())).map_err(|_| {
                    anyhow::anyhow!("forge.token contains characters not allowed in a header")
                })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let builder = || {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(settings.timeout_secs))
                .connect_timeout(Duration::from_secs(settings.timeout_secs.min(10)))
                .user_agent(concat!("director/", env!("CARGO_PKG_VERSION")))
        };
        let http = builder().default_headers(headers).build()?;
        let anonymous = builder().build()?;
        Ok(Self {
            http,
            anonymous,
            api: format!("{}/api/v1", base_url.trim_end_matches('/')),
            max_attempts: settings.max_attempts.max(1),
            backoff_base: Duration::from_millis(250),
            metrics,
            last_date: std::sync::Mutex::new(None),
        })
    }

    /// Shortens the backoff between attempts (tests).
    pub fn with_backoff_base(mut self, base: Duration) -> Self {
        self.backoff_base = base;
        self
    }

    fn count(&self, endpoint: &str, status: &str) {
        if let Some(m) = &self.metrics {
            m.forge_requests
                .with_label_values(&[endpoint, status])
                .inc();
        }
    }

    /// Sends one request, retrying what is safe to retry. `endpoint` is the path template
    /// used as the metric label; `path` the concrete path below `/api/v1`.
    async fn send(
        &self,
        method: Method,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, ForgeError> {
        self.send_as(None, method, endpoint, path, query, body)
            .await
    }

    /// [`Self::send`] authenticated as someone else (`Authorization` replaced).
    async fn send_as(
        &self,
        auth: Option<&HeaderValue>,
        method: Method,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, ForgeError> {
        // A POST that reached the server may have taken effect: repeat it only when the
        // answer says it did not ([`super::repeatable`]) or it never left (connection refused).
        let idempotent = method != Method::POST;
        let mut attempt = 1;
        loop {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.api));
            if let Some(auth) = auth {
                req = req.header(AUTHORIZATION, auth.clone());
            }
            if !query.is_empty() {
                req = req.query(query);
            }
            if let Some(body) = body {
                req = req.json(body);
            }
            let outcome = req.send().await;
            let retry_in = match &outcome {
                Ok(resp) => {
                    let status = resp.status();
                    self.count(endpoint, status.as_str());
                    if let Some(date) = super::http_date(resp.headers()) {
                        let mut last = self.last_date.lock().unwrap_or_else(|e| e.into_inner());
                        *last = Some(last.map_or(date, |l| l.max(date)));
                    }
                    let retryable = super::repeatable(idempotent, status.as_u16());
                    retryable.then(|| {
                        retry_after(resp.headers()).unwrap_or_else(|| self.backoff(attempt))
                    })
                }
                Err(e) => {
                    self.count(endpoint, "error");
                    let retryable =
                        e.is_connect() || (idempotent && (e.is_timeout() || e.is_request()));
                    retryable.then(|| self.backoff(attempt))
                }
            };
            match retry_in {
                Some(wait) if attempt < self.max_attempts => {
                    tracing::debug!(%method, path, attempt, wait_ms = wait.as_millis() as u64, "forge request will be retried");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                _ => return self.classify(&method, path, outcome).await,
            }
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self.backoff_base.saturating_mul(1 << attempt.min(6));
        let jitter = rand::rng().random_range(0.5..=1.0);
        cap.mul_f64(jitter)
    }

    async fn classify(
        &self,
        method: &Method,
        path: &str,
        outcome: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<reqwest::Response, ForgeError> {
        let (method, path) = (method.to_string(), path.to_owned());
        let resp = match outcome {
            Ok(resp) => resp,
            Err(e) => {
                // reqwest's message may carry the URL; ours has only the path, so say why.
                let reason = if e.is_timeout() {
                    "timed out".to_owned()
                } else if e.is_connect() {
                    "could not connect to the forge".to_owned()
                } else {
                    "the request failed".to_owned()
                };
                return Err(ForgeError::Transport {
                    method,
                    path,
                    reason,
                });
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        Err(match status {
            StatusCode::NOT_FOUND => ForgeError::NotFound { method, path },
            StatusCode::UNAUTHORIZED => ForgeError::Unauthorized { method, path },
            StatusCode::FORBIDDEN => ForgeError::Forbidden { method, path },
            _ => {
                let bytes = crate::limits::read_capped(resp, 64 * 1024)
                    .await
                    .unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes);
                let message = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| text.into_owned());
                let message = crate::limits::shorten(&message, 200);
                ForgeError::Status {
                    method,
                    path,
                    status: status.as_u16(),
                    message,
                }
            }
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, ForgeError> {
        let resp = self
            .send(method.clone(), endpoint, path, query, body)
            .await?;
        decode(&method, path, resp).await
    }

    /// Every page of a list endpoint. With `trust_total`, the `X-Total-Count` of the first
    /// page says how many pages to ask for; otherwise (the timeline, whose header is only the
    /// page size) pages are read until one comes back short.
    async fn all_pages<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        trust_total: bool,
    ) -> Result<Vec<T>, ForgeError> {
        Ok(self
            .all_pages_dated(endpoint, path, query, trust_total)
            .await?
            .0)
    }

    /// Every page, and the forge's `Date` on the first.
    async fn all_pages_dated<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        trust_total: bool,
    ) -> Result<(Vec<T>, Option<chrono::DateTime<chrono::Utc>>), ForgeError> {
        let mut out = Vec::new();
        let mut pages: Option<usize> = None;
        let mut page = 1usize;
        let mut date = None;
        loop {
            let mut q = query.to_vec();
            q.push(("limit", PAGE_SIZE.to_string()));
            q.push(("page", page.to_string()));
            let resp = self.send(Method::GET, endpoint, path, &q, None).await?;
            if page == 1 {
                date = super::http_date(resp.headers());
            }
            if trust_total && pages.is_none() {
                pages = resp
                    .headers()
                    .get("x-total-count")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .map(|total| total.div_ceil(PAGE_SIZE).max(1));
            }
            let items: Vec<T> = decode(&Method::GET, path, resp).await?;
            let count = items.len();
            out.extend(items);
            let done = match pages {
                // An empty page means the total was stale: nothing more to read.
                Some(pages) => page >= pages || count == 0,
                None => count < PAGE_SIZE,
            };
            if done || page >= 10_000 {
                return Ok((out, date));
            }
            page += 1;
        }
    }
}

/// A target URL as a person can follow it: Forgejo Actions gives a path on the forge.
fn absolute(web: &str, url: &str) -> String {
    let url = url.trim();
    if url.starts_with('/') && !url.starts_with("//") {
        format!("{web}{url}")
    } else {
        url.to_owned()
    }
}

async fn decode<T: DeserializeOwned>(
    method: &Method,
    path: &str,
    resp: reqwest::Response,
) -> Result<T, ForgeError> {
    let bytes = crate::limits::read_capped(resp, crate::limits::FORGE_BODY_BYTES)
        .await
        .map_err(|e| ForgeError::Transport {
            method: method.to_string(),
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    serde_json::from_slice(&bytes).map_err(|e| ForgeError::Decode {
        method: method.to_string(),
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn sensitive(value: String) -> Result<HeaderValue, ForgeError> {
    let mut v = HeaderValue::from_str(&value).map_err(|_| ForgeError::Transport {
        method: String::new(),
        path: String::new(),
        reason: "credentials contain characters not allowed in a header".into(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

fn basic(runner: &RunnerAccount) -> Result<HeaderValue, ForgeError> {
    use base64::Engine;
    let raw = format!("{}:{}", runner.login, runner.password.expose());
    sensitive(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireBranch {
    name: String,
    #[serde(default)]
    commit: Option<WireCommitRef>,
    user_can_push: Option<bool>,
    user_can_merge: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCompare {
    total_commits: u64,
    commits: Vec<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireToken {
    id: u64,
    name: String,
    sha1: String,
    scopes: Vec<String>,
    repositories: Option<Vec<WireRepoMeta>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireRepoMeta {
    name: String,
    owner: String,
    full_name: String,
}

impl WireRepoMeta {
    fn repo(&self) -> Option<RepoName> {
        self.full_name
            .parse()
            .ok()
            .or_else(|| RepoName::new(&self.owner, &self.name).ok())
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WirePull {
    number: u64,
    state: String,
    #[serde(default)]
    merged: bool,
    #[serde(default)]
    updated_at: Option<String>,
    head: Option<WireBranchRef>,
    base: Option<WireBranchRef>,
    merge_base: Option<String>,
    mergeable: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireBranchRef {
    #[serde(rename = "ref")]
    name: String,
    sha: String,
}

/// `CombinedStatus`: the latest status of each context (one page of them).
#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCombined {
    statuses: Option<Vec<WireStatus>>,
    total_count: usize,
}

/// `CommitStatus`: its state is named `status` (the create body's `state`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct WireStatus {
    context: String,
    status: String,
    description: Option<String>,
    target_url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCommitRef {
    id: String,
}

#[derive(Deserialize)]
struct WireReview {
    id: u64,
    #[serde(default)]
    user: Option<WireUser>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    submitted_at: Option<String>,
    #[serde(default)]
    commit_id: String,
    #[serde(default)]
    dismissed: bool,
}

#[derive(Deserialize)]
struct WireReviewComment {
    #[serde(default)]
    path: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    position: Option<u64>,
    #[serde(default)]
    original_position: Option<u64>,
}

/// `Retry-After` as seconds or an HTTP date, capped.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
        (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or_default()
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Path segments are escaped: a label name or login may hold anything.
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn repo_path(repo: &RepoName) -> String {
    format!("/repos/{}/{}", seg(repo.owner()), seg(repo.name()))
}

// Wire types: every field defaulted, so other Forgejo versions decode.

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUser {
    login: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireLabel {
    id: u64,
    name: String,
}

#[derive(Deserialize)]
struct WireIssue {
    number: u64,
    #[serde(default)]
    title: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    labels: Option<Vec<WireLabel>>,
    #[serde(default)]
    user: Option<WireUser>,
    #[serde(default)]
    updated_at: String,
    #[serde(default)]
    pull_request: Option<Value>,
    /// Present in search results, which span repositories.
    #[serde(default)]
    repository: Option<WireRepoMeta>,
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
struct WireComment {
    id: u64,
    #[serde(default)]
    body: String,
    #[serde(default)]
    user: Option<WireUser>,
    #[serde(default)]
    created_at: String,
    #[serde(default)]
    updated_at: String,
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
struct WireTimeline {
    #[serde(rename = "type")]
    kind: String,
    body: String,
    user: Option<WireUser>,
    label: Option<WireLabel>,
    created_at: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireRepo {
    name: String,
    full_name: String,
    default_branch: String,
    owner: Option<WireUser>,
    private: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireHook {
    id: u64,
    #[serde(rename = "type")]
    kind: String,
    config: std::collections::HashMap<String, String>,
    events: Vec<String>,
    active: bool,
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
struct WirePermission {
    permission: String,
}

#[async_trait]
impl Forge for ForgejoClient {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: WireUser = self.json(Method::GET, "/user", "/user", &[], None).await?;
        Ok(user.login)
    }

    async fn repository(&self, repo: &RepoName) -> Result<Repository, ForgeError> {
        let path = repo_path(repo);
        let wire: WireRepo = self
            .json(Method::GET, "/repos/{owner}/{repo}", &path, &[], None)
            .await?;
        Ok(Repository {
            name: repo.clone(),
            default_branch: wire.default_branch,
            private: wire.private.unwrap_or(true),
        })
    }

    /// Asked as an anonymous visitor: the forge applies every rule (the repository's and its
    /// owner's visibility, `REQUIRE_SIGNIN_VIEW`) itself.
    async fn anonymous_can_see(&self, repo: &RepoName) -> Result<bool, ForgeError> {
        let path = repo_path(repo);
        let endpoint = "/repos/{owner}/{repo}";
        let resp = self
            .anonymous
            .get(format!("{}{path}", self.api))
            .send()
            .await
            .map_err(|e| ForgeError::Transport {
                method: "GET".into(),
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status();
        self.count(endpoint, status.as_str());
        match status.as_u16() {
            200 => Ok(true),
            401 | 403 | 404 => Ok(false),
            code => Err(ForgeError::Status {
                method: "GET".into(),
                path,
                status: code,
                message: "asked as an anonymous visitor".into(),
            }),
        }
    }

    async fn open_issues_with_label(
        &self,
        repo: &RepoName,
        label: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let query = [
            ("state", "open".to_owned()),
            ("type", "issues".to_owned()),
            ("labels", label.to_owned()),
        ];
        let wire: Vec<WireIssue> = self
            .all_pages("/repos/{owner}/{repo}/issues", &path, &query, true)
            .await?;
        Ok(wire.into_iter().map(Issue::from).collect())
    }

    async fn issues_created_by(
        &self,
        repo: &RepoName,
        login: &str,
    ) -> Result<Vec<Issue>, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let query = [
            ("state", "all".to_owned()),
            ("type", "issues".to_owned()),
            ("created_by", login.to_owned()),
        ];
        let wire: Vec<WireIssue> = self
            .all_pages("/repos/{owner}/{repo}/issues", &path, &query, true)
            .await?;
        Ok(wire.into_iter().map(Issue::from).collect())
    }

    async fn issue(&self, issue: &IssueRef) -> Result<Issue, ForgeError> {
        let path = format!("{}/issues/{}", repo_path(&issue.repo), issue.number);
        let wire: WireIssue = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/issues/{index}",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire.into())
    }

    async fn comments(&self, issue: &IssueRef) -> Result<Vec<Comment>, ForgeError> {
        // Not paginated by Forgejo: one call returns every comment.
        let path = format!(
            "{}/issues/{}/comments",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: Vec<WireComment> = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/issues/{index}/comments",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire.into_iter().map(Comment::from).collect())
    }

    async fn timeline(&self, issue: &IssueRef) -> Result<Vec<TimelineEntry>, ForgeError> {
        let path = format!(
            "{}/issues/{}/timeline",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: Vec<WireTimeline> = self
            .all_pages(
                "/repos/{owner}/{repo}/issues/{index}/timeline",
                &path,
                &[],
                false,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|w| TimelineEntry {
                added: w.kind == "label" && w.body == "1",
                kind: w.kind,
                actor: w.user.map(|u| u.login).unwrap_or_default(),
                label: w.label.map(|l| l.name),
                created_at: w.created_at,
            })
            .collect())
    }

    async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        let path = format!("{}/collaborators/{}/permission", repo_path(repo), seg(user));
        match self
            .json::<WirePermission>(
                Method::GET,
                "/repos/{owner}/{repo}/collaborators/{collaborator}/permission",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(p) => Ok(Permission::parse(&p.permission)),
            Err(e) if e.is_not_found() => Ok(Permission::None),
            Err(e) => Err(e),
        }
    }

    async fn ensure_label(
        &self,
        repo: &RepoName,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgeError> {
        let path = format!("{}/labels", repo_path(repo));
        let labels: Vec<WireLabel> = self
            .all_pages("/repos/{owner}/{repo}/labels", &path, &[], true)
            .await?;
        if let Some(l) = labels.into_iter().find(|l| l.name == name) {
            return Ok(Label {
                id: l.id,
                name: l.name,
            });
        }
        let body = json!({ "name": name, "color": color, "description": description });
        let created: WireLabel = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/labels",
                &path,
                &[],
                Some(&body),
            )
            .await?;
        Ok(Label {
            id: created.id,
            name: created.name,
        })
    }

    async fn add_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let path = format!("{}/issues/{}/labels", repo_path(&issue.repo), issue.number);
        let body = json!({ "labels": [label_id] });
        self.send(
            Method::POST,
            "/repos/{owner}/{repo}/issues/{index}/labels",
            &path,
            &[],
            Some(&body),
        )
        .await?;
        Ok(())
    }

    async fn remove_label(&self, issue: &IssueRef, label_id: u64) -> Result<(), ForgeError> {
        let path = format!(
            "{}/issues/{}/labels/{label_id}",
            repo_path(&issue.repo),
            issue.number
        );
        match self
            .send(
                Method::DELETE,
                "/repos/{owner}/{repo}/issues/{index}/labels/{identifier}",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            // Already gone: removing is idempotent.
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create_comment(&self, issue: &IssueRef, body: &str) -> Result<Comment, ForgeError> {
        let path = format!(
            "{}/issues/{}/comments",
            repo_path(&issue.repo),
            issue.number
        );
        let wire: WireComment = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/issues/{index}/comments",
                &path,
                &[],
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(wire.into())
    }

    async fn edit_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let path = format!("{}/issues/comments/{comment_id}", repo_path(repo));
        let wire: WireComment = self
            .json(
                Method::PATCH,
                "/repos/{owner}/{repo}/issues/comments/{id}",
                &path,
                &[],
                Some(&json!({ "body": body })),
            )
            .await?;
        Ok(wire.into())
    }

    async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/issues", repo_path(repo));
        let wire: WireIssue = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/issues",
                &path,
                &[],
                Some(&json!({ "title": title, "body": body })),
            )
            .await?;
        Ok(wire.number)
    }

    async fn branch(&self, repo: &RepoName, name: &str) -> Result<Option<Branch>, ForgeError> {
        self.branch_with(None, repo, name).await
    }

    async fn file_at(
        &self,
        repo: &RepoName,
        file: &str,
        at: &str,
        max_bytes: u64,
    ) -> Result<FileAt, ForgeError> {
        let encoded: Vec<String> = file.split('/').map(seg).collect();
        let path = format!("{}/contents/{}", repo_path(repo), encoded.join("/"));
        let wire = match self
            .json::<super::WireContents>(
                Method::GET,
                "/repos/{owner}/{repo}/contents/{filepath}",
                &path,
                &[("ref", at.to_owned())],
                None,
            )
            .await
        {
            Ok(w) => Some(w),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        Ok(FileAt::from_wire(wire, file, max_bytes))
    }

    async fn branch_as(
        &self,
        token: &Secret,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        let auth = sensitive(format!("token {}", token.expose()))?;
        self.branch_with(Some(&auth), repo, name).await
    }

    async fn commits_ahead(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/compare/{}...{}", repo_path(repo), seg(base), seg(head));
        let wire: WireCompare = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/compare/{basehead}",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire.total_commits.max(wire.commits.len() as u64))
    }

    async fn find_pull(
        &self,
        repo: &RepoName,
        base: &str,
        head: &str,
    ) -> Result<Option<u64>, ForgeError> {
        let path = format!("{}/pulls/{}/{}", repo_path(repo), seg(base), seg(head));
        match self
            .json::<WirePull>(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{base}/{head}",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(p) if p.state == "open" => Ok(Some(p.number)),
            Ok(_) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn pull(&self, repo: &RepoName, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("{}/pulls/{number}", repo_path(repo));
        let w: WirePull = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{index}",
                &path,
                &[],
                None,
            )
            .await?;
        let (head, base) = (w.head.unwrap_or_default(), w.base.unwrap_or_default());
        Ok(PullRequest {
            number: w.number,
            state: w.state,
            merged: w.merged,
            updated_at: w.updated_at,
            head_sha: head.sha,
            head_ref: head.name,
            base_ref: base.name,
            merge_base: w.merge_base.unwrap_or_default(),
            mergeable: w.mergeable,
            behind: None,
        })
    }

    /// The combined status, page by page (each page combines only its own contexts, so the
    /// state is worked out here), up to [`super::MAX_CHECKS`] contexts.
    async fn checks(&self, repo: &RepoName, sha: &str) -> Result<Checks, ForgeError> {
        const LIMIT: usize = 50;
        let path = format!("{}/commits/{sha}/status", repo_path(repo));
        let web = self.api.trim_end_matches("/api/v1").to_owned();
        let mut checks = Checks::default();
        for page in 1..=super::MAX_CHECKS.div_ceil(LIMIT) {
            let query = [("page", page.to_string()), ("limit", LIMIT.to_string())];
            let w: WireCombined = self
                .json(
                    Method::GET,
                    "/repos/{owner}/{repo}/commits/{ref}/status",
                    &path,
                    &query,
                    None,
                )
                .await?;
            let statuses = w.statuses.unwrap_or_default();
            let count = statuses.len();
            checks.checks.extend(statuses.into_iter().map(|s| Check {
                state: CheckState::from_forge(&s.status),
                context: s.context,
                description: s.description.unwrap_or_default(),
                target_url: absolute(&web, s.target_url.as_deref().unwrap_or_default()),
            }));
            let read = checks.checks.len();
            if count < LIMIT || read >= w.total_count {
                return Ok(checks);
            }
        }
        checks.truncated = true;
        Ok(checks)
    }

    async fn merge_pull(
        &self,
        repo: &RepoName,
        number: u64,
        style: MergeStyle,
        head_sha: &str,
        delete_branch: bool,
    ) -> Result<MergeAnswer, ForgeError> {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo));
        let body = serde_json::json!({
            "Do": style.as_str(),
            "head_commit_id": head_sha,
            "delete_branch_after_merge": delete_branch,
        });
        let sent = self
            .send(
                Method::POST,
                "/repos/{owner}/{repo}/pulls/{index}/merge",
                &path,
                &[],
                Some(&body),
            )
            .await;
        super::refused_or_done(sent, &[405, 409, 413, 423])
    }

    async fn update_pull(&self, repo: &RepoName, number: u64) -> Result<MergeAnswer, ForgeError> {
        let path = format!("{}/pulls/{number}/update", repo_path(repo));
        let sent = self
            .send(
                Method::POST,
                "/repos/{owner}/{repo}/pulls/{index}/update",
                &path,
                &[("style", "merge".to_owned())],
                None,
            )
            .await;
        // 500 "HeadBranch of PR N is up to date" is a refusal too: said once, not retried.
        super::refused_or_done(sent, &[409, 413, 422, 500])
    }

    async fn reviews(&self, repo: &RepoName, number: u64) -> Result<Vec<Review>, ForgeError> {
        let path = format!("{}/pulls/{number}/reviews", repo_path(repo));
        let wire: Vec<WireReview> = self
            .all_pages(
                "/repos/{owner}/{repo}/pulls/{index}/reviews",
                &path,
                &[],
                false,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|r| Review {
                id: r.id,
                user: r.user.map(|u| u.login).unwrap_or_default(),
                state: r.state,
                body: r.body,
                submitted_at: r.submitted_at,
                commit_id: r.commit_id,
                dismissed: r.dismissed,
            })
            .collect())
    }

    async fn review_comments(
        &self,
        repo: &RepoName,
        number: u64,
        review: u64,
    ) -> Result<Vec<ReviewComment>, ForgeError> {
        // Not paginated by Forgejo.
        let path = format!(
            "{}/pulls/{number}/reviews/{review}/comments",
            repo_path(repo)
        );
        let wire: Vec<WireReviewComment> = self
            .json(
                Method::GET,
                "/repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments",
                &path,
                &[],
                None,
            )
            .await?;
        Ok(wire
            .into_iter()
            .map(|c| ReviewComment {
                path: c.path,
                body: c.body,
                line: c.position.filter(|p| *p > 0),
                old_line: c.original_position.filter(|p| *p > 0),
            })
            .collect())
    }

    async fn create_pull(
        &self,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/pulls", repo_path(repo));
        let wire: WirePull = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/pulls",
                &path,
                &[],
                Some(&json!({ "head": head, "base": base, "title": title, "body": body })),
            )
            .await?;
        Ok(wire.number)
    }

    async fn mint_run_token(
        &self,
        runner: &RunnerAccount,
        repo: &RepoName,
        name: &str,
    ) -> Result<MintedToken, ForgeError> {
        let path = format!("/users/{}/tokens", seg(&runner.login));
        let body = json!({
            "name": name,
            "scopes": [RUN_TOKEN_SCOPE],
            "repositories": [{ "owner": repo.owner(), "name": repo.name() }],
        });
        let resp = self
            .send_as(
                Some(&basic(runner)?),
                Method::POST,
                "/users/{username}/tokens",
                &path,
                &[],
                Some(&body),
            )
            .await?;
        let wire: WireToken = decode(&Method::POST, &path, resp).await?;
        if wire.sha1.is_empty() {
            return Err(ForgeError::Decode {
                method: "POST".into(),
                path,
                reason: "no token in the answer".into(),
            });
        }
        Ok(MintedToken {
            id: wire.id,
            name: wire.name,
            token: Secret::new(wire.sha1),
            repositories: wire
                .repositories
                .map(|list| list.iter().filter_map(WireRepoMeta::repo).collect()),
            scopes: wire.scopes,
        })
    }

    async fn runner_tokens(
        &self,
        runner: &RunnerAccount,
    ) -> Result<Vec<(u64, String)>, ForgeError> {
        let path = format!("/users/{}/tokens", seg(&runner.login));
        let auth = basic(runner)?;
        let mut out = Vec::new();
        for page in 1..=100 {
            let q = [("limit", PAGE_SIZE.to_string()), ("page", page.to_string())];
            let resp = self
                .send_as(
                    Some(&auth),
                    Method::GET,
                    "/users/{username}/tokens",
                    &path,
                    &q,
                    None,
                )
                .await?;
            let items: Vec<WireToken> = decode(&Method::GET, &path, resp).await?;
            let n = items.len();
            out.extend(items.into_iter().map(|t| (t.id, t.name)));
            if n < PAGE_SIZE {
                break;
            }
        }
        Ok(out)
    }

    async fn delete_run_token(&self, runner: &RunnerAccount, name: &str) -> Result<(), ForgeError> {
        let path = format!("/users/{}/tokens/{}", seg(&runner.login), seg(name));
        match self
            .send_as(
                Some(&basic(runner)?),
                Method::DELETE,
                "/users/{username}/tokens/{token}",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<RepoName>, ForgeError> {
        let path = format!("/orgs/{}/repos", seg(org));
        let wire: Vec<WireRepo> = self
            .all_pages("/orgs/{org}/repos", &path, &[], true)
            .await?;
        Ok(wire
            .into_iter()
            .filter_map(|r| {
                r.full_name.parse().ok().or_else(|| {
                    let owner = r.owner.map(|o| o.login).unwrap_or_else(|| org.to_owned());
                    RepoName::new(&owner, &r.name).ok()
                })
            })
            .collect())
    }

    async fn issues_updated_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<IssueChanges, ForgeError> {
        let query = [
            ("type", "issues".to_owned()),
            ("state", "all".to_owned()),
            (
                "since",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
        ];
        let (wire, server_time): (Vec<WireIssue>, _) = self
            .all_pages_dated("/repos/issues/search", "/repos/issues/search", &query, true)
            .await?;
        let issues = wire
            .into_iter()
            .filter_map(|w| {
                let repo = w.repository.as_ref()?.repo()?;
                Some((repo, Issue::from(w)))
            })
            .collect();
        Ok(IssueChanges {
            issues,
            server_time,
        })
    }

    async fn server_time(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>, ForgeError> {
        Ok(*self.last_date.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn hooks(&self, repo: &RepoName) -> Result<Vec<Hook>, ForgeError> {
        let path = format!("{}/hooks", repo_path(repo));
        let wire: Vec<WireHook> = self
            .all_pages("/repos/{owner}/{repo}/hooks", &path, &[], true)
            .await?;
        Ok(wire.into_iter().map(Hook::from).collect())
    }

    async fn create_hook(&self, repo: &RepoName, spec: &HookSpec) -> Result<Hook, ForgeError> {
        let path = format!("{}/hooks", repo_path(repo));
        let wire: WireHook = self
            .json(
                Method::POST,
                "/repos/{owner}/{repo}/hooks",
                &path,
                &[],
                Some(&spec.create_body()),
            )
            .await?;
        Ok(wire.into())
    }

    async fn edit_hook(
        &self,
        repo: &RepoName,
        id: u64,
        spec: &HookSpec,
        events: &[String],
    ) -> Result<Hook, ForgeError> {
        let path = format!("{}/hooks/{id}", repo_path(repo));
        let wire: WireHook = self
            .json(
                Method::PATCH,
                "/repos/{owner}/{repo}/hooks/{id}",
                &path,
                &[],
                Some(&spec.edit_body(events)),
            )
            .await?;
        Ok(wire.into())
    }

    async fn delete_hook(&self, repo: &RepoName, id: u64) -> Result<(), ForgeError> {
        let path = format!("{}/hooks/{id}", repo_path(repo));
        self.delete_idempotent("/repos/{owner}/{repo}/hooks/{id}", &path)
            .await
    }

    fn run_endpoints(&self, repo: &RepoName, runner: &RunnerAccount) -> RunEndpoints {
        run_endpoints(self.api.trim_end_matches("/api/v1"), repo, runner)
    }
}

/// A Forgejo run: clone and push over HTTP as the runner account with its run token, the
/// token `write:repository` alone, commits by the runner with Forgejo's no-reply address.
pub fn run_endpoints(base: &str, repo: &RepoName, runner: &RunnerAccount) -> RunEndpoints {
    let base = base.trim_end_matches('/');
    let url = reqwest::Url::parse(base).ok();
    let host = url
        .as_ref()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_else(|| "localhost".to_owned());
    RunEndpoints {
        clone_url: format!("{base}/{repo}.git"),
        api_url: format!("{base}/api/v1"),
        git_origin: url
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_else(|| base.to_owned()),
        git_user: runner.login.clone(),
        author: (
            runner.login.clone(),
            format!("{}@noreply.{host}", runner.login),
        ),
        token_scopes: vec![RUN_TOKEN_SCOPE.to_owned()],
        runner_account: true,
        name: "Forgejo",
        token_lifetime_secs: None,
    }
}

impl ForgejoClient {
    /// `DELETE` that treats a thing already gone as done.
    async fn delete_idempotent(
        &self,
        template: &'static str,
        path: &str,
    ) -> Result<(), ForgeError> {
        match self
            .send_as(None, Method::DELETE, template, path, &[], None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn branch_with(
        &self,
        auth: Option<&HeaderValue>,
        repo: &RepoName,
        name: &str,
    ) -> Result<Option<Branch>, ForgeError> {
        let path = format!("{}/branches/{}", repo_path(repo), seg(name));
        match self
            .send_as(
                auth,
                Method::GET,
                "/repos/{owner}/{repo}/branches/{branch}",
                &path,
                &[],
                None,
            )
            .await
        {
            Ok(resp) => {
                let w: WireBranch = decode(&Method::GET, &path, resp).await?;
                Ok(Some(Branch {
                    name: w.name,
                    commit: w.commit.map(|c| c.id).unwrap_or_default(),
                    user_can_push: w.user_can_push.unwrap_or(true),
                    user_can_merge: w.user_can_merge.unwrap_or(true),
                }))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(seg("plain-name_1.x"), "plain-name_1.x");
        assert_eq!(seg("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(seg("ümlaut"), "%C3%BCmlaut");
    }

    #[test]
    fn retry_after_reads_seconds_and_caps_them() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }
}
