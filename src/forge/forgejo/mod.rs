//! The Forgejo implementation of [`Forge`]: a thin client over reqwest for exactly the
//! endpoints the director uses. Per-request timeouts; retries with exponential backoff and
//! full jitter on connection errors, 5xx and 429 (honouring `Retry-After`); pages computed
//! here (Forgejo's `Link` header is built from its ROOT_URL, which may be wrong behind a
//! proxy). Errors name the method and path, never the token. Transport and paging here; the
//! wire types in `wire`, one method per endpoint in `forge`.

use std::time::Duration;

use rand::Rng;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Branch, ForgeError, RUN_TOKEN_SCOPE, RunEndpoints, RunnerAccount};
use crate::domain::RepoName;
use crate::metrics::Metrics;
use crate::settings::{ForgeSettings, Secret};

mod access;
mod forge;
mod fork;
mod tokens;
mod wire;
use wire::*;

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
    /// `DELETE` that treats a thing already gone as done; as the bot (`auth` `None`) or as
    /// whom `auth` names (the runner).
    async fn delete_idempotent(
        &self,
        auth: Option<&HeaderValue>,
        template: &'static str,
        path: &str,
    ) -> Result<(), ForgeError> {
        match self
            .send_as(auth, Method::DELETE, template, path, &[], None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Opens a pull request from `head` into `base`, as the bot or as whom `auth` names.
    async fn open_pull(
        &self,
        auth: Option<&HeaderValue>,
        repo: &RepoName,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        let path = format!("{}/pulls", repo_path(repo));
        let resp = self
            .send_as(
                auth,
                Method::POST,
                "/repos/{owner}/{repo}/pulls",
                &path,
                &[],
                Some(&serde_json::json!({ "head": head, "base": base, "title": title, "body": body })),
            )
            .await?;
        let wire: WirePull = decode(&Method::POST, &path, resp).await?;
        Ok(wire.number)
    }

    /// Merges the base into pull request `number`'s branch, as the bot or as whom `auth`
    /// names. 500 "HeadBranch of PR N is up to date" is a refusal too: said once, not retried.
    async fn update_branch_of(
        &self,
        auth: Option<&HeaderValue>,
        repo: &RepoName,
        number: u64,
    ) -> Result<super::MergeAnswer, ForgeError> {
        let path = format!("{}/pulls/{number}/update", repo_path(repo));
        let sent = self
            .send_as(
                auth,
                Method::POST,
                "/repos/{owner}/{repo}/pulls/{index}/update",
                &path,
                &[("style", "merge".to_owned())],
                None,
            )
            .await;
        super::refused_or_done(sent, &[409, 413, 422, 500])
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
