//! The service's own sections: `[server]`, `[store]`, `[webhook]`, `[status]`, `[telemetry]`,
//! and `[merge]`, the merge lane.

use super::*;
use crate::domain::RunId;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Json,
    Pretty,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address the HTTP server binds: an IP address and a port (`127.0.0.1:8080`,
    /// `[::]:8080`), parsed at load.
    pub listen: SocketAddr,
    /// Largest webhook body accepted; larger ones get 413. The default holds the largest real
    /// payloads with room to spare: an issue or comment body at GitHub's 65,536-character
    /// cap, every character escaped as `\uXXXX`, is 384 KiB; the rest of a payload is about
    /// 15 KiB.
    pub max_body_bytes: usize,
    /// A webhook body must have arrived this long after its headers; a slower one gets 408
    /// and its memory back.
    pub body_timeout_secs: u64,
    /// Memory for webhook bodies being read (before their signature can be checked), in
    /// MiB. A body reserves its declared length; one that does not fit waits, unread, for
    /// up to `body_timeout_secs`, then gets 503. Bodies cannot outlast their deadline, so
    /// a signed delivery waits at most that long for room whatever else is sent.
    pub body_memory_mb: usize,
    /// `json` (default) or `pretty`.
    pub log_format: LogFormat,
    /// HTTP worker threads (0: one per core).
    pub workers: usize,
    /// The director's public base URL (`https://director.example.org`): run reports and pull
    /// requests link to the run's page under it. Empty: no links.
    #[serde(deserialize_with = "super::lenient::string")]
    pub public_url: String,
    /// Serve a public repository's run pages and transcripts (`/runs/{id}`) to anyone.
    /// Off: they need the status token, as a private repository's do; the report
    /// shows the log tail as ever. Redaction is of the secrets' literal values and their
    /// common encodings: an agent that prints a passed-through secret reversed, split or
    /// otherwise transformed is not caught, and a transcript shows whatever it printed.
    pub transcripts_public: bool,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 1024 * 1024,
            body_timeout_secs: 10,
            body_memory_mb: 32,
            log_format: LogFormat::Json,
            workers: 0,
            public_url: String::new(),
            transcripts_public: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// fsync on every commit: an accepted delivery survives a power loss.
    #[default]
    Full,
    /// fsync at checkpoints only: survives a process crash, not a power loss.
    Normal,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    /// `sqlite://PATH` or `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (TLS with
    /// `?sslmode=require`); the password is never shown.
    #[serde(
        deserialize_with = "lenient::string",
        serialize_with = "masked_store_url"
    )]
    pub url: String,
    /// A file holding `store.url` (a PostgreSQL URL carries its password): when set, the URL
    /// is read from it and `store.url` is not used.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub url_file: Option<String>,
    pub synchronous: Synchronous,
    /// Processed deliveries, old pre-flight call records and finished actions are pruned
    /// after this many days.
    pub retention_days: u32,
}

/// `store.url` with any password replaced, for messages and `check-config`.
pub fn masked_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        // Not a URL: show only its scheme, if any (it may hold anything).
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://..."),
            None => "(not a URL)".to_owned(),
        },
    }
}

fn masked_store_url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&masked_url(url))
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://director.db".into(),
            url_file: None,
            synchronous: Synchronous::Full,
            retention_days: 30,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Every accepted secret; several at once while rotating.
    #[serde(deserialize_with = "secret_list")]
    pub secrets: Vec<Secret>,
    /// A file with one secret per line, added to `secrets`.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub secrets_file: Option<String>,
    /// Where Forgejo reaches this director's webhook route (`director hooks install`).
    #[serde(deserialize_with = "lenient::string")]
    pub public_url: String,
    /// A token Forgejo sends with every delivery as `Authorization: Bearer <token>` (the
    /// hook's authorization header, set by `director hooks install`). A delivery that shows it
    /// is read in a budget of its own, so no load from anyone without it can delay or refuse
    /// it. Empty: a token derived from the webhook secret (`signature::hook_token`).
    pub authorization: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub authorization_file: Option<String>,
}

/// The read-only status page (`GET /status`, `GET /status.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusSettings {
    pub enabled: bool,
    /// Requests bearing it (`Authorization: Bearer ...`) also see private repositories'
    /// issues; with none set, private issues are never shown.
    pub token: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_file: Option<String>,
}

impl Default for StatusSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            token: Secret::default(),
            token_file: None,
        }
    }
}

impl ServerSettings {
    /// The page of run `run_id` under `public_url`, when it is set.
    pub fn run_url(&self, run_id: &RunId) -> Option<String> {
        let base = self.public_url.trim().trim_end_matches('/');
        (!base.is_empty()).then(|| format!("{base}/runs/{run_id}"))
    }

    /// Its keys alone: the listener, and webhook bodies' limits.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be greater than 0"));
        }
        if self.body_timeout_secs == 0 {
            return Err(invalid(
                "server.body_timeout_secs",
                "must be greater than 0",
            ));
        }
        let url = self.public_url.trim();
        if !url.is_empty() {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| invalid("server.public_url", format!("`{url}` is not a URL: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https")
                || parsed.host_str().is_none()
                || parsed.query().is_some()
                || !parsed.username().is_empty()
            {
                return Err(invalid(
                    "server.public_url",
                    format!(
                        "`{url}` must be an http(s) URL with a host, and no credentials or query"
                    ),
                ));
            }
        }
        if self.body_memory_mb.saturating_mul(1024 * 1024) < self.max_body_bytes {
            return Err(invalid(
                "server.body_memory_mb",
                format!(
                    "{} MiB cannot hold one body of server.max_body_bytes ({} bytes)",
                    self.body_memory_mb, self.max_body_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Where the director keeps its state: what `store.url` names, parsed by one function
/// for the settings' check and the store's connection alike.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH`: one process.
    Sqlite(String),
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`: several replicas. It holds a password.
    Postgres(Secret),
}

/// Never shows a PostgreSQL password.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(url) => write!(f, "Sqlite({url:?})"),
            Self::Postgres(url) => write!(f, "Postgres({:?})", masked_url(url.expose())),
        }
    }
}

impl StoreUrl {
    /// `url` as the store reads it; `Err` says why not, the password masked.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let usable = reqwest::Url::parse(url)
                .ok()
                .is_some_and(|u| u.host_str().is_some_and(|h| !h.is_empty()));
            return if usable {
                Ok(Self::Postgres(Secret::new(url)))
            } else {
                Err(format!(
                    "`{}`: not a PostgreSQL URL of the form postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                    masked_url(url)
                ))
            };
        }
        if url.starts_with("sqlite:") {
            return Ok(Self::Sqlite(url.to_owned()));
        }
        Err(format!(
            "`{}`: use sqlite://PATH (one process) or postgres://USER:PASSWORD@HOST:PORT/DATABASE (several replicas)",
            masked_url(url)
        ))
    }
}

impl StoreSettings {
    /// What `url` names (after `url_file`, when that is set).
    pub fn location(&self) -> Result<StoreUrl, SettingsError> {
        StoreUrl::parse(&self.url).map_err(|reason| invalid("store.url", reason))
    }

    /// `url`: SQLite for one process, a usable PostgreSQL URL for several.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        self.location().map(|_| ())
    }
}

impl WebhookSettings {
    /// Its keys alone: the public URL, and no empty secret.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if !self.public_url.is_empty() {
            let ok = (self.public_url.starts_with("http://")
                || self.public_url.starts_with("https://"))
                && reqwest::Url::parse(&self.public_url).is_ok();
            if !ok {
                return Err(invalid(
                    "webhook.public_url",
                    format!("`{}` is not an http(s) URL", self.public_url),
                ));
            }
        }
        if self.secrets.iter().any(Secret::is_empty) {
            return Err(invalid(
                "webhook.secrets",
                "an empty secret would accept unsigned deliveries",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod store_url_tests {
    use super::*;

    #[test]
    fn a_store_url_is_sqlite_or_a_usable_postgres_url_and_its_password_never_shows() {
        assert_eq!(
            StoreUrl::parse(" sqlite://director.db "),
            Ok(StoreUrl::Sqlite("sqlite://director.db".into()))
        );
        let pg = StoreUrl::parse("postgres://director:hunter2@db:5432/director").expect("pg");
        assert!(matches!(&pg, StoreUrl::Postgres(u) if u.expose().contains("hunter2")));
        assert!(!format!("{pg:?}").contains("hunter2"), "{pg:?}");
        for bad in ["postgres://", "mysql://u:hunter2@db/x", "director.db", ""] {
            let why = StoreUrl::parse(bad).expect_err(bad);
            assert!(!why.contains("hunter2"), "{why}");
        }
        let no_host = StoreUrl::parse("postgresql://u:hunter2@/x").expect_err("no host");
        assert!(
            no_host.contains("PostgreSQL") && !no_host.contains("hunter2"),
            "{no_host}"
        );
    }
}

/// `[telemetry]`: traces over OTLP/HTTP.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// The OTLP/HTTP collector (`http://otel-collector:4318`); spans go to `/v1/traces`
    /// under it unless the URL names a path of its own. Empty: no traces.
    pub otlp_endpoint: String,
    /// How often finished spans are sent, in milliseconds.
    pub export_interval_ms: u64,
    /// Spans waiting to be sent, at most; beyond it new ones are dropped and counted.
    pub max_queued_spans: usize,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            export_interval_ms: 2_000,
            max_queued_spans: 4_096,
        }
    }
}

impl TelemetrySettings {
    /// Where spans are posted, when traces are on.
    pub fn traces_url(&self) -> Option<String> {
        let url = reqwest::Url::parse(self.otlp_endpoint.trim()).ok()?;
        if url.path().is_empty() || url.path() == "/" {
            let base = self.otlp_endpoint.trim().trim_end_matches('/');
            return Some(format!("{base}/v1/traces"));
        }
        Some(url.to_string())
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty() {
            let url = reqwest::Url::parse(endpoint)
                .map_err(|e| invalid("telemetry.otlp_endpoint", format!("not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(invalid(
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL with a host",
                ));
            }
            // Credentials in the URL would reach logs and `check-config`.
            if !url.username().is_empty() || url.password().is_some() {
                return Err(invalid(
                    "telemetry.otlp_endpoint",
                    "must not carry a user name or password",
                ));
            }
        }
        if self.export_interval_ms < 100 {
            return Err(invalid(
                "telemetry.export_interval_ms",
                "must be at least 100",
            ));
        }
        if self.max_queued_spans == 0 {
            return Err(invalid(
                "telemetry.max_queued_spans",
                "must be greater than 0",
            ));
        }
        Ok(())
    }
}

/// `[merge]`: the opt-in merge lane.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MergeSettings {
    /// Merge the director's pull requests once approved and green.
    pub enabled: bool,
    /// Globs of `owner/name` the lane is on for (`*` any run of characters); empty: every
    /// watched repository.
    #[serde(deserialize_with = "lenient::list")]
    pub repos: Vec<String>,
    /// Forgejo's merge style.
    pub style: crate::domain::MergeStyle,
    /// Approvals of the current head, by writers other than the bot and the runner.
    pub required_approvals: u32,
    /// Delete the pull request's branch once merged.
    pub delete_branch: bool,
    /// Count an approval by the writer who asked for the run (applied the trigger, or said
    /// `/director go`). Off: another writer must approve (two people for a merge); a
    /// one-maintainer repository turns it on.
    pub requester_may_approve: bool,
}

impl Default for MergeSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            repos: Vec::new(),
            style: crate::domain::MergeStyle::Merge,
            required_approvals: 1,
            delete_branch: true,
            requester_may_approve: false,
        }
    }
}

impl MergeSettings {
    /// Whether the lane is on for `repo`.
    pub fn covers(&self, repo: &RepoName) -> bool {
        if !self.enabled {
            return false;
        }
        let name = repo.to_string().to_ascii_lowercase();
        self.repos.is_empty()
            || self
                .repos
                .iter()
                .any(|g| super::repo::glob(&g.to_ascii_lowercase(), &name))
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.required_approvals == 0 {
            return Err(invalid(
                "merge.required_approvals",
                "must be at least 1: the lane merges only what a writer approved",
            ));
        }
        for g in &self.repos {
            if g.trim().is_empty() || !g.contains('/') {
                return Err(invalid(
                    "merge.repos",
                    format!("{g:?} is not an `owner/name` glob"),
                ));
            }
        }
        Ok(())
    }
}
