//! The GitHub implementation of [`Forge`], as a GitHub App through octocrab: a short-lived
//! JWT for the App's own routes, installation tokens (minted and cached by octocrab until
//! shortly before they expire) for everything else, and per-run installation tokens limited
//! to one repository and `contents: write`, revoked when the run ends.
//!
//! Requests are octocrab's raw calls with our own types (two of its typed models do not fit
//! GitHub's real answers; see DEPENDENCIES.md). Rate limits are honoured per credential:
//! `Retry-After` and `x-ratelimit-reset` when limited, and the remaining budget spread over
//! the time to the reset once it runs low, so the director slows down before the limit
//! instead of hammering into it. Errors name the method and path, never a token or the key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use octocrab::Octocrab;
use octocrab::models::{AppId, InstallationId};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::domain::{CommitSha, IssueRef, RepoName};
use crate::forge::{
    Branch, Check, CheckState, Checks, Comment, Forge, ForgeError, Hook, HookSpec, Issue,
    IssueChanges, Label, MAX_CHECKS, MergeAnswer, MergeStyle, MintedToken, Permission, PullRequest,
    Repository, Review, ReviewComment, RunEndpoints, RunnerAccount, TimelineEntry,
};
use crate::metrics::Metrics;
use crate::settings::{GithubSettings, Secret, Settings};

/// GitHub's largest page.
pub const PAGE_SIZE: usize = 100;
/// The permission a run token carries, and nothing else (GitHub adds `metadata: read` to
/// every token).
pub const RUN_TOKEN_PERMISSIONS: &[&str] = &["contents:write", "metadata:read"];
/// The longest wait for a rate limit the client sits out; a longer one is an error.
const MAX_RATE_WAIT: Duration = Duration::from_secs(120);
/// Below this many requests left, the rest are spread over the time to the reset.
const RESERVE: u64 = 100;

pub use crate::settings::check_private_key;

mod access;
mod answers;
mod forge;

use answers::*;

/// The web address matching an API base (see [`crate::settings::ForgeSettings::web_url`]).
pub fn web_base(api: &str) -> String {
    crate::settings::ForgeSettings {
        kind: crate::settings::ForgeKind::Github,
        url: api.to_owned(),
        ..Default::default()
    }
    .web_url()
}

use crate::forge::percent_encode as enc;

fn query(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn repo_path(repo: &RepoName) -> String {
    format!("/repos/{}/{}", enc(repo.owner()), enc(repo.name()))
}

/// Who a request is made as.
#[derive(Clone, Copy)]
enum As<'a> {
    /// The App itself (its JWT): `/app...` and the installation look-ups.
    App,
    /// An installation's token (octocrab mints and caches it).
    Installation(u64),
    /// A token the director holds (a run's).
    Token(&'a Secret),
}

impl As<'_> {
    fn gate_key(&self) -> String {
        match self {
            Self::App => "app".to_owned(),
            Self::Installation(id) => format!("installation:{id}"),
            // A run token has its own budget; they are short-lived, so one gate for all.
            Self::Token(_) => "run-token".to_owned(),
        }
    }
}

/// The body of a 2xx answer.
struct Answer {
    body: Vec<u8>,
}

pub struct GithubClient {
    app: Octocrab,
    fixed_installation: Option<u64>,
    /// `owner/repo` (or `org:NAME`) to its installation, as GitHub said.
    installations: Mutex<HashMap<String, u64>>,
    clients: Mutex<HashMap<u64, Octocrab>>,
    /// Label ids to names per repository: GitHub adds and removes labels by name.
    label_names: Mutex<HashMap<(String, u64), String>>,
    /// Run tokens minted by this process, by name: GitHub revokes a token only when shown it.
    run_tokens: Mutex<HashMap<String, Secret>>,
    /// The App's bot login (`<slug>[bot]`), once known.
    bot: Mutex<Option<String>>,
    /// Owners whose issues the incremental scan searches (the watched ones).
    owners: Vec<String>,
    api: String,
    max_attempts: u32,
    backoff_base: Duration,
    metrics: Option<Metrics>,
    /// Per credential: no request before this instant (a rate limit, or a budget running low).
    gates: Mutex<HashMap<String, Instant>>,
    last_date: Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

impl GithubClient {
    pub fn new(settings: &Settings, metrics: Option<Metrics>) -> anyhow::Result<Self> {
        let g: &GithubSettings = &settings.github;
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(g.private_key.expose().trim().as_bytes())
            .map_err(|_| {
                anyhow::anyhow!("github.private_key is not an RSA private key in PEM form")
            })?;
        let timeout = Duration::from_secs(settings.forge.timeout_secs);
        let api = settings.forge.url.trim_end_matches('/').to_owned();
        let app = Octocrab::builder()
            .base_uri(api.as_str())
            .map_err(|_| anyhow::anyhow!("forge.url `{api}` is not a usable API base"))?
            .set_connect_timeout(Some(timeout.min(Duration::from_secs(10))))
            .set_read_timeout(Some(timeout))
            .set_write_timeout(Some(timeout))
            .add_header(
                http::header::USER_AGENT,
                concat!("director/", env!("CARGO_PKG_VERSION")).to_owned(),
            )
            .app(AppId(g.app_id), key)
            .build()
            .map_err(|_| anyhow::anyhow!("cannot build the GitHub client"))?;
        let mut owners: Vec<String> = settings
            .scan
            .repos
            .iter()
            .map(|r| r.owner().to_owned())
            .chain(settings.scan.orgs.iter().cloned())
            .collect();
        owners.sort_by_key(|o| o.to_ascii_lowercase());
        owners.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
        Ok(Self {
            app,
            fixed_installation: (g.installation_id != 0).then_some(g.installation_id),
            installations: Mutex::default(),
            clients: Mutex::default(),
            label_names: Mutex::default(),
            run_tokens: Mutex::default(),
            bot: Mutex::new(None),
            owners,
            api,
            max_attempts: settings.forge.max_attempts.max(1),
            backoff_base: Duration::from_millis(250),
            metrics,
            gates: Mutex::default(),
            last_date: Mutex::new(None),
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

    fn client(&self, who: As<'_>) -> Result<Octocrab, String> {
        match who {
            As::App => Ok(self.app.clone()),
            As::Installation(id) => {
                let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = clients.get(&id) {
                    return Ok(c.clone());
                }
                let c = self
                    .app
                    .installation(InstallationId(id))
                    .map_err(|_| "cannot act as the installation".to_owned())?;
                clients.insert(id, c.clone());
                Ok(c)
            }
            As::Token(token) => self
                .app
                .user_access_token(token.expose().to_owned())
                .map_err(|_| "cannot use the token".to_owned()),
        }
    }

    /// Waits out the credential's gate; `Err` with the wait when it is too long to sit out.
    async fn pass_gate(&self, key: &str) -> Result<(), Duration> {
        let until = self
            .gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied();
        if let Some(until) = until {
            let wait = until.saturating_duration_since(Instant::now());
            if wait > MAX_RATE_WAIT {
                return Err(wait);
            }
            if !wait.is_zero() {
                tracing::debug!(
                    wait_ms = wait.as_millis() as u64,
                    "pacing GitHub requests to its rate limit"
                );
                tokio::time::sleep(wait).await;
            }
        }
        Ok(())
    }

    fn set_gate(&self, key: &str, until: Instant) {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        let slot = gates.entry(key.to_owned()).or_insert(until);
        *slot = (*slot).max(until);
    }

    /// Reads the rate-limit headers: a budget running low spaces the next requests over the
    /// time left to the reset. Returns how long to wait before retrying when this answer is
    /// a rate limit (403 or 429 with the signs of one).
    fn read_limits(
        &self,
        key: &str,
        status: StatusCode,
        headers: &http::HeaderMap,
    ) -> Option<Duration> {
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let remaining = number("x-ratelimit-remaining");
        let until_reset = number("x-ratelimit-reset").map(|reset| {
            let now = chrono::Utc::now().timestamp();
            Duration::from_secs(
                u64::try_from(i64::try_from(reset).unwrap_or(i64::MAX) - now).unwrap_or(0),
            )
        });
        let retry_after = number("retry-after").map(Duration::from_secs);
        if let (Some(left), Some(reset)) = (remaining, until_reset)
            && left < RESERVE
        {
            let spacing = if left == 0 {
                reset
            } else {
                reset / u32::try_from(left + 1).unwrap_or(u32::MAX)
            };
            self.set_gate(key, Instant::now() + spacing);
        }
        let limited = status == StatusCode::TOO_MANY_REQUESTS
            || (status == StatusCode::FORBIDDEN && (retry_after.is_some() || remaining == Some(0)));
        if !limited {
            return None;
        }
        // GitHub: wait `Retry-After` when given; else until the reset when none are left;
        // else at least a minute.
        let wait = retry_after
            .or(if remaining == Some(0) {
                until_reset
            } else {
                None
            })
            .unwrap_or(Duration::from_secs(60));
        self.set_gate(key, Instant::now() + wait);
        Some(wait)
    }

    fn backoff(&self, attempt: u32) -> Duration {
        use rand::Rng;
        let cap = self.backoff_base.saturating_mul(1 << attempt.min(6));
        cap.mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    /// Sends one request as `who`, retrying what is safe to retry; `endpoint` is the path
    /// template used as the metric label. Any 2xx is returned; other answers are errors.
    async fn send(
        &self,
        who: As<'_>,
        method: Method,
        endpoint: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ForgeError> {
        let err_path = path.split('?').next().unwrap_or(path).to_owned();
        let transport = |reason: String| ForgeError::Transport {
            method: method.to_string(),
            path: err_path.clone(),
            reason,
        };
        let client = self.client(who).map_err(&transport)?;
        let key = who.gate_key();
        // A POST that reached GitHub may have taken effect: repeat it only on a rate limit
        // (nothing was done) or when it never left.
        let idempotent = method != Method::POST;
        let mut attempt = 1;
        loop {
            if let Err(wait) = self.pass_gate(&key).await {
                self.count(endpoint, "rate_limited");
                return Err(ForgeError::Status {
                    method: method.to_string(),
                    path: err_path,
                    status: 429,
                    message: format!(
                        "GitHub's rate limit for this credential resets in {} s; not asking before then",
                        wait.as_secs()
                    ),
                });
            }
            let uri = path.to_owned();
            let outcome = match method {
                Method::GET => client._get(uri).await,
                Method::POST => client._post(uri, body).await,
                Method::PATCH => client._patch(uri, body).await,
                Method::PUT => client._put(uri, body).await,
                Method::DELETE => client._delete(uri, body).await,
                _ => return Err(transport("unsupported method".into())),
            };
            let retry_in = match outcome {
                Ok(resp) => {
                    let status = resp.status();
                    self.count(endpoint, status.as_str());
                    let headers = resp.headers().clone();
                    if let Some(date) = headers
                        .get(http::header::DATE)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| chrono::DateTime::parse_from_rfc2822(v).ok())
                    {
                        let date = date.with_timezone(&chrono::Utc);
                        let mut last = self.last_date.lock().unwrap_or_else(|e| e.into_inner());
                        *last = Some(last.map_or(date, |l| l.max(date)));
                    }
                    let limited = self.read_limits(&key, status, &headers);
                    let retry = limited.or_else(|| {
                        crate::forge::repeatable(idempotent, status.as_u16())
                            .then(|| self.backoff(attempt))
                    });
                    match retry {
                        Some(wait) if attempt < self.max_attempts && wait <= MAX_RATE_WAIT => {
                            Some(wait)
                        }
                        _ => {
                            let body = read_body(resp).await.map_err(&transport)?;
                            return classify(&method, &err_path, status, body);
                        }
                    }
                }
                Err(e) => {
                    self.count(endpoint, "error");
                    // octocrab's error may carry the URL; ours has only the path.
                    let reason = transport_reason(&e);
                    if !idempotent || attempt >= self.max_attempts {
                        return Err(transport(reason));
                    }
                    Some(self.backoff(attempt))
                }
            };
            if let Some(wait) = retry_in {
                tracing::debug!(%method, path = %err_path, attempt, wait_ms = wait.as_millis() as u64, "GitHub request will be retried");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        who: As<'_>,
        method: Method,
        endpoint: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ForgeError> {
        let answer = self.send(who, method.clone(), endpoint, path, body).await?;
        decode(&method, path, &answer.body)
    }

    /// A `GET` of one thing; `None` when GitHub says there is none (404).
    async fn get<T: DeserializeOwned>(
        &self,
        who: As<'_>,
        endpoint: &'static str,
        path: &str,
    ) -> Result<Option<T>, ForgeError> {
        match self.json(who, Method::GET, endpoint, path, None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every page of a list (`per_page=100`), read until a page comes back short.
    async fn all_pages<T: DeserializeOwned>(
        &self,
        who: As<'_>,
        endpoint: &'static str,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<Vec<T>, ForgeError> {
        let mut out = Vec::new();
        for page in 1..=1000usize {
            let mut q = params.to_vec();
            q.push(("per_page", PAGE_SIZE.to_string()));
            q.push(("page", page.to_string()));
            let items: Vec<T> = self
                .json(
                    who,
                    Method::GET,
                    endpoint,
                    &format!("{path}?{}", query(&q)),
                    None,
                )
                .await?;
            let short = items.len() < PAGE_SIZE;
            out.extend(items);
            if short {
                break;
            }
        }
        Ok(out)
    }

    /// The App's bot login, `<slug>[bot]` (asked once).
    async fn bot_login(&self) -> Result<String, ForgeError> {
        if let Some(b) = self.bot.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(b);
        }
        let app: RawApp = self
            .json(As::App, Method::GET, "/app", "/app", None)
            .await
            .map_err(|e| match e {
                ForgeError::Status {
                    status: 401,
                    method,
                    path,
                    ..
                } => ForgeError::Status {
                    method,
                    path,
                    status: 401,
                    message:
                        "GitHub refused the App's JWT: check github.app_id and github.private_key"
                            .into(),
                },
                other => other,
            })?;
        let login = format!("{}[bot]", app.slug);
        *self.bot.lock().unwrap_or_else(|e| e.into_inner()) = Some(login.clone());
        Ok(login)
    }

    async fn label_name(&self, repo: &RepoName, id: u64) -> Result<String, ForgeError> {
        let key = (repo.to_string(), id);
        if let Some(n) = self
            .label_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(n.clone());
        }
        let labels: Vec<RawLabel> = self
            .all_pages(
                self.on(repo).await?,
                "/repos/{o}/{r}/labels",
                &format!("{}/labels", repo_path(repo)),
                &[],
            )
            .await?;
        for l in &labels {
            self.remember_label(repo, l.id, &l.name);
        }
        labels
            .into_iter()
            .find(|l| l.id == id)
            .map(|l| l.name)
            .ok_or_else(|| ForgeError::NotFound {
                method: "GET".into(),
                path: format!("{}/labels", repo_path(repo)),
            })
    }

    /// Every page of a repository's issue list, pull requests (which GitHub lists among
    /// issues) left out.
    async fn issues_of(
        &self,
        repo: &RepoName,
        params: &[(&str, String)],
    ) -> Result<Vec<Issue>, ForgeError> {
        let items: Vec<RawIssue> = self
            .all_pages(
                self.on(repo).await?,
                "/repos/{o}/{r}/issues",
                &format!("{}/issues", repo_path(repo)),
                params,
            )
            .await?;
        Ok(items
            .into_iter()
            .map(Issue::from)
            .filter(|i| !i.is_pull)
            .collect())
    }

    fn remember_label(&self, repo: &RepoName, id: u64, name: &str) {
        self.label_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((repo.to_string(), id), name.to_owned());
    }
}

fn transport_reason(e: &octocrab::Error) -> String {
    let text = format!("{e}");
    if text.to_ascii_lowercase().contains("timed out") || text.contains("Elapsed") {
        "timed out".to_owned()
    } else if text.to_ascii_lowercase().contains("connect") {
        "could not connect to GitHub".to_owned()
    } else {
        "the request failed".to_owned()
    }
}

async fn read_body(
    resp: http::Response<http_body_util::combinators::BoxBody<bytes::Bytes, octocrab::Error>>,
) -> Result<Vec<u8>, String> {
    let limited = http_body_util::Limited::new(resp.into_body(), crate::limits::FORGE_BODY_BYTES);
    limited
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .map_err(|_| "the answer could not be read (or was too large)".to_owned())
}

fn classify(
    method: &Method,
    path: &str,
    status: StatusCode,
    body: Vec<u8>,
) -> Result<Answer, ForgeError> {
    if status.is_success() {
        return Ok(Answer { body });
    }
    let (method, path) = (method.to_string(), path.to_owned());
    let text = String::from_utf8_lossy(&body);
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| text.into_owned());
    let message = crate::limits::shorten(&message, 200);
    Err(match status {
        StatusCode::NOT_FOUND => ForgeError::NotFound { method, path },
        _ => ForgeError::Status {
            method,
            path,
            status: status.as_u16(),
            message: match status {
                StatusCode::UNAUTHORIZED => format!(
                    "GitHub refused the credentials ({message}): check github.app_id and github.private_key"
                ),
                _ => message,
            },
        },
    })
}

fn decode<T: DeserializeOwned>(method: &Method, path: &str, body: &[u8]) -> Result<T, ForgeError> {
    serde_json::from_slice(body).map_err(|e| ForgeError::Decode {
        method: method.to_string(),
        path: path.split('?').next().unwrap_or(path).to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_addresses_follow_the_api_base() {
        assert_eq!(web_base("https://api.github.com"), "https://github.com");
        assert_eq!(web_base("https://api.github.com/"), "https://github.com");
        assert_eq!(
            web_base("https://ghe.example/api/v3"),
            "https://ghe.example"
        );
        assert_eq!(web_base("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }

    #[test]
    fn search_items_name_their_repository() {
        assert_eq!(
            repo_of_url("https://api.github.com/repos/acme/widgets").map(|r| r.to_string()),
            Some("acme/widgets".to_owned())
        );
        assert!(repo_of_url("https://api.github.com/users/acme").is_none());
        assert!(repo_of_url("").is_none());
    }

    #[test]
    fn a_bad_key_is_refused_without_being_shown() {
        let key = Secret::new(
            "-----BEGIN RSA PRIVATE KEY-----\nnot-a-key-SECRETBYTES\n-----END RSA PRIVATE KEY-----",
        );
        let err = check_private_key(&key).expect_err("refused");
        assert!(!err.contains("SECRETBYTES"));
    }

    #[test]
    fn values_are_percent_encoded() {
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
        assert_eq!(
            query(&[("q", "is:issue user:acme".into())]),
            "q=is%3Aissue%20user%3Aacme"
        );
    }
}
