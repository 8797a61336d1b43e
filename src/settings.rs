//! Typed configuration: one TOML file, overridden by `DIRECTOR_<SECTION>__<KEY>` environment
//! variables (lists comma-separated), with every secret also readable from `<key>_file`.
//! Secrets are wrapped in [`Secret`] so they never reach a log, an error or `check-config`.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::RepoName;

/// A value that must never be printed. `Debug`, `Display` and `Serialize` all mask it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "***" })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::string(d).map(Secret)
    }
}

/// Environment values arrive untyped: `DIRECTOR_FORGE__TOKEN=1234` parses as a number and
/// `DIRECTOR_SCAN__REPOS=a/b,c/d` as one string. These accept both shapes.
mod lenient {
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use std::fmt;

    struct StringVisitor;

    impl<'de> Visitor<'de> for StringVisitor {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_char<E: de::Error>(self, v: char) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_any(StringVisitor)
    }

    pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        string(d).map(Some)
    }

    struct ListVisitor;

    impl<'de> Visitor<'de> for ListVisitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of strings or a comma-separated string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<Item>()? {
                out.push(item.0);
            }
            Ok(out)
        }
    }

    struct Item(String);
    impl<'de> de::Deserialize<'de> for Item {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            string(d).map(Item)
        }
    }

    pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_any(ListVisitor)
    }
}

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
    /// Address the HTTP server binds.
    #[serde(deserialize_with = "lenient::string")]
    pub listen: String,
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
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 1024 * 1024,
            body_timeout_secs: 10,
            body_memory_mb: 32,
            log_format: LogFormat::Json,
            workers: 0,
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

/// Where runs go with `runner.kind = "kubernetes"`: one Job per run in `namespace`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesSettings {
    /// The namespace the runs' Jobs, Pods and Secrets live in.
    #[serde(deserialize_with = "lenient::string")]
    pub namespace: String,
    /// A kubeconfig file; empty: the in-cluster configuration (the director's own service
    /// account), else the file `KUBECONFIG` names.
    #[serde(deserialize_with = "lenient::string")]
    pub kubeconfig: String,
    /// The service account the runs' pods run as (its token is never mounted); empty: the
    /// namespace's default.
    #[serde(deserialize_with = "lenient::string")]
    pub service_account: String,
    /// A finished Job is deleted by Kubernetes this long after it ends, should the director
    /// not have removed it itself.
    pub ttl_secs_after_finished: u32,
    /// With `runner.egress = "allowlist"`: the name runs reach the director's egress proxy
    /// by (its Service, e.g. `director.forge.svc`).
    #[serde(deserialize_with = "lenient::string")]
    pub proxy_host: String,
    /// Where the director's pods are, and their labels (`key=value`), for the runs'
    /// NetworkPolicy: egress only to those pods' proxy port, and DNS.
    #[serde(deserialize_with = "lenient::string")]
    pub proxy_namespace: String,
    #[serde(deserialize_with = "lenient::list")]
    pub proxy_pod_labels: Vec<String>,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            kubeconfig: String::new(),
            service_account: String::new(),
            ttl_secs_after_finished: 86_400,
            proxy_host: String::new(),
            proxy_namespace: String::new(),
            proxy_pod_labels: Vec::new(),
        }
    }
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

fn secret_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Secret>, D::Error> {
    Ok(lenient::list(d)?.into_iter().map(Secret).collect())
}

fn repo_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RepoName>, D::Error> {
    lenient::list(d)?
        .iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    #[default]
    Forgejo,
    /// GitHub or GitHub Enterprise Server, as a GitHub App (`[github]`).
    Github,
}

impl ForgeKind {
    /// The forge's name in messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Self::Forgejo => "Forgejo",
            Self::Github => "GitHub",
        }
    }
}

/// The GitHub App the director acts as with `forge.kind = "github"`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GithubSettings {
    /// The App's numeric id (its settings page shows it).
    pub app_id: u64,
    /// The App's private key (PEM, as GitHub hands it out); never shown.
    pub private_key: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub private_key_file: Option<String>,
    /// The installation to act through; 0: looked up per repository
    /// (`GET /repos/{owner}/{repo}/installation`).
    pub installation_id: u64,
}

/// Whether `key` is an RSA private key in PEM form (what GitHub hands out for an App),
/// without ever showing any of it.
#[cfg(feature = "github")]
pub fn check_private_key(key: &Secret) -> Result<(), String> {
    jsonwebtoken::EncodingKey::from_rsa_pem(key.expose().trim().as_bytes())
        .map(|_| ())
        .map_err(|_| {
            "is not an RSA private key in PEM form (the .pem file GitHub gives for the App)"
                .to_owned()
        })
}

/// How long a GitHub installation token lives, and so the longest run GitHub allows here
/// (less a margin for the director's own checks before and after the run).
pub const GITHUB_TOKEN_LIFETIME_SECS: u64 = 3600;
pub const GITHUB_MAX_RUN_SECS: u64 = 3300;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForgeSettings {
    pub kind: ForgeKind,
    /// Base URL of the Forgejo instance, without `/api/v1`.
    #[serde(deserialize_with = "lenient::string")]
    pub url: String,
    /// The bot account's token (admin of the watched repositories).
    pub token: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub token_file: Option<String>,
    /// The bot's login. Learned from `GET /user` when a token is set; this names it otherwise.
    #[serde(deserialize_with = "lenient::opt_string")]
    pub bot_login: Option<String>,
    /// The write-only account whose tokens runs get.
    #[serde(deserialize_with = "lenient::string")]
    pub runner_login: String,
    pub runner_password: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub runner_password_file: Option<String>,
    /// Per-request timeout, in seconds.
    pub timeout_secs: u64,
    /// Attempts per request on connection errors, 5xx and 429.
    pub max_attempts: u32,
}

/// Links to the forge's web pages, as each forge spells them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebLinks {
    /// The site, without a trailing `/`.
    pub base: String,
    pub kind: ForgeKind,
}

impl WebLinks {
    pub fn issue(&self, repo: &RepoName, number: u64) -> String {
        format!("{}/{repo}/issues/{number}", self.base)
    }

    pub fn pull(&self, repo: &RepoName, number: u64) -> String {
        match self.kind {
            ForgeKind::Forgejo => format!("{}/{repo}/pulls/{number}", self.base),
            ForgeKind::Github => format!("{}/{repo}/pull/{number}", self.base),
        }
    }

    pub fn branch(&self, repo: &RepoName, branch: &str) -> String {
        match self.kind {
            ForgeKind::Forgejo => format!("{}/{repo}/src/branch/{branch}", self.base),
            ForgeKind::Github => format!("{}/{repo}/tree/{branch}", self.base),
        }
    }

    pub fn compare(&self, repo: &RepoName, base: &str, head: &str) -> String {
        format!("{}/{repo}/compare/{base}...{head}", self.base)
    }
}

impl ForgeSettings {
    /// Links to the forge's pages; `None` without a forge.
    pub fn links(&self) -> Option<WebLinks> {
        let base = self.web_url();
        (!base.is_empty()).then_some(WebLinks {
            base,
            kind: self.kind,
        })
    }

    /// The forge's web address (for links): `forge.url` on Forgejo; on GitHub the site
    /// matching the API base (`https://api.github.com` is `https://github.com`, GitHub
    /// Enterprise Server's `https://HOST/api/v3` is `https://HOST`).
    pub fn web_url(&self) -> String {
        let url = self.url.trim_end_matches('/');
        if self.kind != ForgeKind::Github {
            return url.to_owned();
        }
        match reqwest::Url::parse(url) {
            Ok(u) if u.host_str() == Some("api.github.com") => "https://github.com".to_owned(),
            _ => url.strip_suffix("/api/v3").unwrap_or(url).to_owned(),
        }
    }
}

impl Default for ForgeSettings {
    fn default() -> Self {
        Self {
            kind: ForgeKind::Forgejo,
            url: String::new(),
            token: Secret::default(),
            token_file: None,
            bot_login: None,
            runner_login: String::new(),
            runner_password: Secret::default(),
            runner_password_file: None,
            timeout_secs: 30,
            max_attempts: 4,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScanSettings {
    #[serde(deserialize_with = "repo_list")]
    pub repos: Vec<RepoName>,
    #[serde(deserialize_with = "lenient::list")]
    pub orgs: Vec<String>,
    /// When the incremental pass runs: a cron expression with a seconds field.
    #[serde(deserialize_with = "lenient::string")]
    pub schedule: String,
    /// When the full pass over every watched repository runs (it also runs at start-up).
    #[serde(deserialize_with = "lenient::string")]
    pub full_schedule: String,
    /// Scan on the schedules while serving.
    pub enabled: bool,
}

impl Default for ScanSettings {
    fn default() -> Self {
        Self {
            repos: Vec::new(),
            orgs: Vec::new(),
            schedule: "0 */5 * * * *".into(),
            full_schedule: "0 0 * * * *".into(),
            enabled: true,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LabelSettings {
    #[serde(deserialize_with = "lenient::string")]
    pub trigger: String,
    /// Applied by a writer, skips the pre-flight gate.
    #[serde(deserialize_with = "lenient::string")]
    pub skip_preflight: String,
    /// State labels the director keeps on issues (created when missing).
    #[serde(deserialize_with = "lenient::string")]
    pub queued: String,
    #[serde(deserialize_with = "lenient::string")]
    pub running: String,
    #[serde(deserialize_with = "lenient::string")]
    pub pr_open: String,
    #[serde(deserialize_with = "lenient::string")]
    pub failed: String,
    #[serde(deserialize_with = "lenient::string")]
    pub no_go: String,
    /// Put on the issue when its pull request was merged (`pr_open` comes off).
    #[serde(deserialize_with = "lenient::string")]
    pub merged: String,
    /// On an issue whose pre-flight waits: for an hourly cap's queue, or to retry.
    #[serde(deserialize_with = "lenient::string")]
    pub waiting: String,
    /// Priority labels, highest first: queued issues start in this order, then queue order.
    #[serde(deserialize_with = "lenient::list")]
    pub priority: Vec<String>,
}

impl Default for LabelSettings {
    fn default() -> Self {
        Self {
            trigger: "headless".into(),
            skip_preflight: "headless:skip-preflight".into(),
            queued: "headless:queued".into(),
            running: "headless:running".into(),
            pr_open: "headless:pr-open".into(),
            failed: "headless:failed".into(),
            no_go: "headless:no-go".into(),
            merged: "headless:merged".into(),
            waiting: "headless:waiting".into(),
            priority: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// A pre-flight that could not run leaves the issue waiting.
    #[default]
    Wait,
    /// A pre-flight that could not run lets the issue proceed to a run.
    Proceed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreflightSettings {
    /// Run pre-flights (needs a forge). Off: picked-up issues wait in `pending`.
    pub enabled: bool,
    /// `anthropic`, `openai` (any compatible endpoint) or `command`.
    #[serde(deserialize_with = "lenient::string")]
    pub provider: String,
    #[serde(deserialize_with = "lenient::string")]
    pub base_url: String,
    #[serde(deserialize_with = "lenient::string")]
    pub model: String,
    pub api_key: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub api_key_file: Option<String>,
    /// For `command`: the program and its arguments; the prompt arrives on stdin.
    #[serde(deserialize_with = "lenient::list")]
    pub command: Vec<String>,
    /// For `command`: the environment variables (besides `PATH` and `HOME`) the program
    /// gets; everything else, the director's own secrets included, is cleared.
    #[serde(deserialize_with = "lenient::list")]
    pub command_env: Vec<String>,
    /// Per read, in seconds.
    pub timeout_secs: u64,
    /// Cap on the model's answer, in tokens.
    pub max_tokens: u32,
    /// Reads tried (errors, timeouts, answers without a verdict) before giving up.
    pub max_attempts: u32,
    /// First wait between attempts, doubled each time, in milliseconds.
    pub retry_backoff_ms: u64,
    /// `wait` (default) or `proceed` when the pre-flight could not run.
    pub on_error: OnError,
    /// Owners (users or organisations) a WRONG-REPO issue may be filed with.
    #[serde(deserialize_with = "lenient::list")]
    pub trusted_owners: Vec<String>,
    /// Accounts whose comments count as trusted without write access (e.g. the broker that
    /// files issues for explore agents).
    #[serde(deserialize_with = "lenient::list")]
    pub automation_accounts: Vec<String>,
    /// A prompt template replacing the built-in one (`config/preflight-prompt.md`).
    #[serde(deserialize_with = "lenient::opt_string")]
    pub template_file: Option<String>,
    /// Reads per hour, over all repositories and per repository.
    pub max_per_hour: u32,
    pub max_per_repo_per_hour: u32,
    /// Reads at once.
    pub concurrency: usize,
}

impl Default for PreflightSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            provider: "openai".into(),
            base_url: String::new(),
            model: String::new(),
            api_key: Secret::default(),
            api_key_file: None,
            command: Vec::new(),
            command_env: Vec::new(),
            timeout_secs: 180,
            max_tokens: 1024,
            max_attempts: 3,
            retry_backoff_ms: 30_000,
            on_error: OnError::Wait,
            trusted_owners: Vec::new(),
            automation_accounts: Vec::new(),
            template_file: None,
            max_per_hour: 60,
            max_per_repo_per_hour: 20,
            concurrency: 2,
        }
    }
}

/// Coder runs: the container each GO issue gets, its limits and its hardening.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerSettings {
    /// `docker` (the local engine, through its socket) or `kubernetes` (Jobs; see
    /// `[kubernetes]`).
    #[serde(deserialize_with = "lenient::string")]
    pub kind: String,
    /// Start coder runs for queued issues.
    pub enabled: bool,
    /// The image each run starts from (must be present on the engine).
    #[serde(deserialize_with = "lenient::string")]
    pub image: String,
    /// The command to run; empty: the image's own entry point.
    #[serde(deserialize_with = "lenient::list")]
    pub command: Vec<String>,
    /// A Docker network mode or network name: `bridge`, `host`, `none`, ... (with
    /// `egress = "open"` only).
    #[serde(deserialize_with = "lenient::string")]
    pub network: String,
    /// `allowlist`: a run reaches only the forge, the model endpoint and `egress_allow`,
    /// through the director's egress proxy; `open`: whatever `network` gives it.
    #[serde(deserialize_with = "lenient::string")]
    pub egress: String,
    /// `host:port` entries (`*.example.org:443`, `[2001:db8::1]:443`, `10.0.0.5:22`) an
    /// allow-listed run may reach besides the forge and the model endpoint.
    #[serde(deserialize_with = "lenient::list")]
    pub egress_allow: Vec<String>,
    /// The egress proxy's port (on the runs' network; in a cluster, on the director's pod).
    pub egress_proxy_port: u16,
    /// Docker: the internal network (no route out) allow-listed runs are attached to; the
    /// director creates it.
    #[serde(deserialize_with = "lenient::string")]
    pub egress_network: String,
    /// `uid:gid` the run's process has; never root by default.
    #[serde(deserialize_with = "lenient::string")]
    pub user: String,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_limit: i64,
    /// Read-only root filesystem (the workspace is a writable tmpfs).
    pub read_only_rootfs: bool,
    /// The writable tmpfs workspace inside the container, and its size.
    #[serde(deserialize_with = "lenient::string")]
    pub workspace: String,
    pub workspace_mb: u64,
    /// Wall-clock limit per run, in seconds: the run gets a stop signal, then
    /// `stop_grace_secs` to push what it has, then it is killed.
    pub timeout_secs: u64,
    /// Between the stop signal and the kill.
    pub stop_grace_secs: u64,
    /// A run that prints nothing for this long is wedged: stopped the same way (0: never).
    pub idle_timeout_secs: u64,
    /// Follow-up runs per pull request (review feedback, `/director fix`) before a writer's
    /// `/director retry` on it is needed.
    pub max_followups: u32,
    /// Confine runs on a Docker engine that leaks DNS from internal networks
    /// (CVE-2024-29018: before 23.0.11, 24, and 25 before 25.0.5), with a warning, instead of
    /// refusing them: a run could then carry any name out through the host's resolver.
    pub allow_dns_leaking_engine: bool,
    /// Attempts at starting a run before the issue is told it could not start. Retries back
    /// off from half a second, doubling: the default of 10 spans about four minutes, to
    /// outlast a forge or engine restart.
    pub start_attempts: u32,
    /// No new run starts in a repository with this many open pull requests from the
    /// director (follow-ups on an open one are exempt).
    pub max_open_prs_per_repo: usize,
    /// Keep a failed run's container this long for inspection (0: remove at once).
    pub keep_failed_secs: u64,
    /// Environment variables of the director passed through to runs (e.g. the agent's key).
    #[serde(deserialize_with = "lenient::list")]
    pub env_passthrough: Vec<String>,
    /// Runs at once, overall and per repository.
    pub max_concurrent: usize,
    pub max_per_repo: usize,
    /// Allow runs even when the runner account can push to the default branch.
    pub allow_unprotected_default_branch: bool,
    /// Extra bind mounts, `source:target[:ro]`; sources are translated to host paths when the
    /// director itself runs in a container.
    #[serde(deserialize_with = "lenient::list")]
    pub mounts: Vec<String>,
    /// Lines of the log tail kept and posted on failure.
    pub log_tail_lines: usize,
    /// The author and committer of a run's git commits; empty: the runner account's login,
    /// and its Forgejo no-reply address.
    #[serde(deserialize_with = "lenient::string")]
    pub git_author_name: String,
    #[serde(deserialize_with = "lenient::string")]
    pub git_author_email: String,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        Self {
            kind: "docker".into(),
            enabled: true,
            image: String::new(),
            command: Vec::new(),
            network: "bridge".into(),
            egress: "allowlist".into(),
            egress_allow: Vec::new(),
            egress_proxy_port: 3128,
            egress_network: "director-egress".into(),
            user: "1000:1000".into(),
            memory_mb: 4096,
            cpus: 2.0,
            pids_limit: 512,
            read_only_rootfs: true,
            workspace: "/workspace".into(),
            workspace_mb: 2048,
            timeout_secs: 3600,
            stop_grace_secs: 30,
            idle_timeout_secs: 1800,
            max_followups: 3,
            start_attempts: 10,
            allow_dns_leaking_engine: false,
            max_open_prs_per_repo: 6,
            keep_failed_secs: 0,
            env_passthrough: Vec::new(),
            max_concurrent: 2,
            max_per_repo: 1,
            allow_unprotected_default_branch: false,
            mounts: Vec::new(),
            log_tail_lines: 40,
            git_author_name: String::new(),
            git_author_email: String::new(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub webhook: WebhookSettings,
    pub forge: ForgeSettings,
    pub scan: ScanSettings,
    pub labels: LabelSettings,
    pub preflight: PreflightSettings,
    pub runner: RunnerSettings,
    pub kubernetes: KubernetesSettings,
    pub github: GithubSettings,
    pub status: StatusSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("configuration: {0}")]
    Parse(String),
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Settings {
    /// Reads `path` (when given), then the `DIRECTOR_*` environment, then secret files, and
    /// validates the result.
    pub fn load(path: Option<&Path>) -> Result<Self, SettingsError> {
        Self::load_from(path, std::env::vars())
    }

    /// Like [`Settings::load`] with an explicit environment, so tests need not touch the
    /// process's own.
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let mut figment = Figment::new();
        if let Some(path) = path {
            if !path.is_file() {
                return Err(SettingsError::Parse(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let env: Vec<(String, String)> = env.into_iter().collect();
        // Only `SECTION__KEY` names: `DIRECTOR_CONFIG` and friends belong to the CLI.
        let vars: Vec<(String, String)> = env
            .iter()
            .cloned()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix("DIRECTOR_")?;
                rest.contains("__").then(|| (rest.to_owned(), v))
            })
            .collect();
        figment = figment.merge(EnvPairs(vars));
        let mut settings: Settings = figment
            .extract()
            .map_err(|e| SettingsError::Parse(one_line(&e)))?;
        // Defaults work on every forge: on GitHub a run's push must fit in its installation
        // token's hour, so the default wall-clock limit there is the longest that fits.
        if settings.forge.kind == ForgeKind::Github
            && figment.find_value("runner.timeout_secs").is_err()
        {
            settings.runner.timeout_secs = settings.runner.timeout_secs.min(GITHUB_MAX_RUN_SECS);
        }
        settings.read_secret_files()?;
        settings.validate(&env)?;
        Ok(settings)
    }

    fn read_secret_files(&mut self) -> Result<(), SettingsError> {
        fn read(key: &'static str, file: &str) -> Result<String, SettingsError> {
            let text = std::fs::read_to_string(file)
                .map_err(|e| invalid(key, format!("cannot read {file}: {e}")))?;
            Ok(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        fn one(
            value: &mut Secret,
            file: &Option<String>,
            key: &'static str,
            file_key: &'static str,
        ) -> Result<(), SettingsError> {
            if let Some(file) = file {
                if !value.is_empty() {
                    return Err(invalid(
                        file_key,
                        format!("set both `{key}` and `{file_key}`; keep one"),
                    ));
                }
                *value = Secret(read(file_key, file)?);
            }
            Ok(())
        }
        one(
            &mut self.forge.token,
            &self.forge.token_file,
            "forge.token",
            "forge.token_file",
        )?;
        one(
            &mut self.forge.runner_password,
            &self.forge.runner_password_file,
            "forge.runner_password",
            "forge.runner_password_file",
        )?;
        one(
            &mut self.github.private_key,
            &self.github.private_key_file,
            "github.private_key",
            "github.private_key_file",
        )?;
        one(
            &mut self.preflight.api_key,
            &self.preflight.api_key_file,
            "preflight.api_key",
            "preflight.api_key_file",
        )?;
        one(
            &mut self.status.token,
            &self.status.token_file,
            "status.token",
            "status.token_file",
        )?;
        one(
            &mut self.webhook.authorization,
            &self.webhook.authorization_file,
            "webhook.authorization",
            "webhook.authorization_file",
        )?;
        if let Some(file) = &self.store.url_file {
            self.store.url = read("store.url_file", file)?.trim().to_owned();
        }
        if let Some(file) = &self.webhook.secrets_file {
            let text = read("webhook.secrets_file", file)?;
            self.webhook.secrets.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| Secret(l.to_owned())),
            );
        }
        Ok(())
    }

    /// Every secret the director holds.
    fn secrets(&self) -> impl Iterator<Item = &Secret> {
        [
            &self.forge.token,
            &self.forge.runner_password,
            &self.github.private_key,
            &self.preflight.api_key,
            &self.status.token,
            &self.webhook.authorization,
        ]
        .into_iter()
        .chain(self.webhook.secrets.iter())
        .filter(|s| !s.is_empty())
    }

    /// `env`: the environment the director runs with (what `runner.env_passthrough` reads).
    fn validate(&self, env: &[(String, String)]) -> Result<(), SettingsError> {
        self.server
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("server.listen", format!("`{}`: {e}", self.server.listen)))?;
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be greater than 0"));
        }
        if self.server.body_timeout_secs == 0 {
            return Err(invalid(
                "server.body_timeout_secs",
                "must be greater than 0",
            ));
        }
        if self.server.body_memory_mb.saturating_mul(1024 * 1024) < self.server.max_body_bytes {
            return Err(invalid(
                "server.body_memory_mb",
                format!(
                    "{} MiB cannot hold one body of server.max_body_bytes ({} bytes)",
                    self.server.body_memory_mb, self.server.max_body_bytes
                ),
            ));
        }
        let url = self.store.url.trim();
        let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
        if postgres {
            let parsed = reqwest::Url::parse(url).ok();
            let usable = parsed
                .as_ref()
                .is_some_and(|u| u.host_str().is_some_and(|h| !h.is_empty()));
            if !usable {
                return Err(invalid(
                    "store.url",
                    format!(
                        "`{}`: not a PostgreSQL URL of the form postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                        masked_url(url)
                    ),
                ));
            }
        } else if !url.starts_with("sqlite:") {
            return Err(invalid(
                "store.url",
                format!(
                    "`{}`: use sqlite://PATH (one process) or postgres://USER:PASSWORD@HOST:PORT/DATABASE (several replicas)",
                    masked_url(url)
                ),
            ));
        }
        if !self.webhook.public_url.is_empty() {
            let ok = (self.webhook.public_url.starts_with("http://")
                || self.webhook.public_url.starts_with("https://"))
                && reqwest::Url::parse(&self.webhook.public_url).is_ok();
            if !ok {
                return Err(invalid(
                    "webhook.public_url",
                    format!("`{}` is not an http(s) URL", self.webhook.public_url),
                ));
            }
        }
        if self.webhook.secrets.iter().any(Secret::is_empty) {
            return Err(invalid(
                "webhook.secrets",
                "an empty secret would accept unsigned deliveries",
            ));
        }
        if !self.forge.url.is_empty() {
            let ok = (self.forge.url.starts_with("http://")
                || self.forge.url.starts_with("https://"))
                && reqwest::Url::parse(&self.forge.url).is_ok();
            if !ok {
                return Err(invalid(
                    "forge.url",
                    format!("`{}` is not an http(s) URL", self.forge.url),
                ));
            }
        }
        if self.forge.kind == ForgeKind::Github {
            self.validate_github()?;
        } else if !self.forge.url.is_empty() && self.forge.token.is_empty() {
            return Err(invalid(
                "forge.token",
                "required when forge.url is set (or use forge.token_file)",
            ));
        }
        if self.forge.timeout_secs == 0 {
            return Err(invalid("forge.timeout_secs", "must be greater than 0"));
        }
        if self.forge.max_attempts == 0 {
            return Err(invalid("forge.max_attempts", "must be at least 1"));
        }
        let trigger = self.labels.trigger.trim();
        if trigger.is_empty() || trigger.contains(',') {
            return Err(invalid(
                "labels.trigger",
                "must be one non-empty label name without commas",
            ));
        }
        let p = &self.preflight;
        if !["anthropic", "openai", "command"].contains(&p.provider.as_str()) {
            return Err(invalid(
                "preflight.provider",
                format!("`{}`: use anthropic, openai or command", p.provider),
            ));
        }
        if p.enabled && p.provider == "command" && p.command.is_empty() {
            return Err(invalid(
                "preflight.command",
                "required when preflight.provider is `command`",
            ));
        }
        if p.timeout_secs == 0 {
            return Err(invalid("preflight.timeout_secs", "must be greater than 0"));
        }
        if p.max_attempts == 0 {
            return Err(invalid("preflight.max_attempts", "must be at least 1"));
        }
        if p.concurrency == 0 {
            return Err(invalid("preflight.concurrency", "must be at least 1"));
        }
        if let Some(file) = &p.template_file
            && !Path::new(file).is_file()
        {
            return Err(invalid(
                "preflight.template_file",
                format!("{file} does not exist"),
            ));
        }
        let r = &self.runner;
        match r.kind.as_str() {
            "docker" => {}
            "kubernetes" if cfg!(feature = "kubernetes") => self.validate_kubernetes()?,
            "kubernetes" => {
                return Err(invalid(
                    "runner.kind",
                    "this build has no Kubernetes support (built without the `kubernetes` feature)",
                ));
            }
            other => {
                return Err(invalid(
                    "runner.kind",
                    format!("`{other}`: must be docker or kubernetes"),
                ));
            }
        }
        self.validate_egress()?;
        if r.start_attempts == 0 {
            return Err(invalid("runner.start_attempts", "must be at least 1"));
        }
        if r.timeout_secs == 0 {
            return Err(invalid("runner.timeout_secs", "must be greater than 0"));
        }
        if r.max_open_prs_per_repo == 0 {
            return Err(invalid(
                "runner.max_open_prs_per_repo",
                "must be at least 1 (no run could ever start)",
            ));
        }
        if r.max_concurrent == 0 || r.max_per_repo == 0 {
            return Err(invalid(
                "runner.max_concurrent",
                "limits must be at least 1",
            ));
        }
        if r.user.trim().is_empty() || is_root(&r.user) {
            return Err(invalid(
                "runner.user",
                format!(
                    "`{}` means root; runs never run as root: use a numeric uid:gid such as 1000:1000",
                    r.user
                ),
            ));
        }
        for name in &r.env_passthrough {
            if name.to_ascii_uppercase().starts_with("DIRECTOR_") {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` is the director's own configuration; it never goes into a run"
                    ),
                ));
            }
            if crate::domain::run::sets_git_credentials(name) {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` would change how git in the run gets its credentials or identity; the director sets it"
                    ),
                ));
            }
            if let Some((_, value)) = env.iter().find(|(k, _)| k == name)
                && !value.is_empty()
                && self.secrets().any(|s| s.expose() == value)
            {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` holds one of the director's secrets; it never goes into a run"
                    ),
                ));
            }
        }
        if r.git_author_email.contains(['<', '>', '\n'])
            || r.git_author_name.contains(['<', '>', '\n'])
        {
            return Err(invalid(
                "runner.git_author_name",
                "an author name or email may not hold `<`, `>` or a line break".to_owned(),
            ));
        }
        for m in &r.mounts {
            let parts: Vec<&str> = m.split(':').collect();
            if !(2..=3).contains(&parts.len())
                || parts[0].is_empty()
                || !parts[1].starts_with('/')
                || (parts.len() == 3 && parts[2] != "ro" && parts[2] != "rw")
            {
                return Err(invalid(
                    "runner.mounts",
                    format!("`{m}` is not source:/target[:ro|rw]"),
                ));
            }
            if binds_docker_socket(parts[0])
                || parts[1].trim_end_matches('/').ends_with("docker.sock")
            {
                return Err(invalid(
                    "runner.mounts",
                    format!("`{m}` would hand the run the Docker socket (root on the host)"),
                ));
            }
        }
        if !self.forge.url.is_empty()
            && self.forge.kind == ForgeKind::Forgejo
            && r.enabled
            && !r.image.is_empty()
            && (self.forge.runner_login.is_empty() || self.forge.runner_password.is_empty())
        {
            return Err(invalid(
                "forge.runner_login",
                "runs need the runner account and its password (forge.runner_password)",
            ));
        }
        if let Err(e) = croner_check(&self.scan.schedule) {
            return Err(invalid("scan.schedule", e));
        }
        if let Err(e) = croner_check(&self.scan.full_schedule) {
            return Err(invalid("scan.full_schedule", e));
        }
        for org in &self.scan.orgs {
            if RepoName::new(org, "x").is_err() {
                return Err(invalid(
                    "scan.orgs",
                    format!("`{org}` is not an organisation name"),
                ));
            }
        }
        Ok(())
    }

    /// The configuration as TOML, with every secret masked.
    pub fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

fn cron(expr: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .dom_and_dow(true)
        .build()
        .parse(expr)
        .map_err(|e| format!("`{expr}`: {e} (six fields, seconds first, e.g. `0 */5 * * * *`)"))
}

/// A cron expression with a seconds field, parsed the way the scheduler parses it.
fn croner_check(expr: &str) -> Result<(), String> {
    cron(expr).map(|_| ())
}

/// The time (ms) `expr` fires at that lies nearest `now_ms`: what names one scheduled period
/// alike on replicas whose schedules fired moments apart.
pub fn nearest_occurrence_ms(expr: &str, now_ms: i64) -> Option<i64> {
    let cron = cron(expr).ok()?;
    // Occurrences are whole seconds: search from the whole second, measure from `now`.
    let second = chrono::DateTime::from_timestamp(now_ms.div_euclid(1000), 0)?;
    let before = cron
        .find_previous_occurrence(&second, true)
        .ok()
        .map(|t| t.timestamp_millis());
    let after = cron
        .find_next_occurrence(&second, false)
        .ok()
        .map(|t| t.timestamp_millis());
    match (before, after) {
        (Some(b), Some(a)) => Some(if now_ms - b <= a - now_ms { b } else { a }),
        (Some(t), None) | (None, Some(t)) => Some(t),
        (None, None) => None,
    }
}

/// Environment pairs already filtered to `SECTION__KEY`, turned into nested figment values.
struct EnvPairs(Vec<(String, String)>);

/// The configuration keys that hold secrets.
const SECRET_KEYS: &[(&str, &str)] = &[
    ("forge", "token"),
    ("forge", "runner_password"),
    ("github", "private_key"),
    ("preflight", "api_key"),
    ("webhook", "secrets"),
    ("status", "token"),
];

fn is_secret_key(section: &str, key: &str) -> bool {
    SECRET_KEYS.contains(&(section, key))
}

/// `runner.user` names root: uid 0 (any number of zeros) or `root`, as user or group.
impl Settings {
    /// What a Kubernetes run needs that a Docker one does not: a numeric user (a pod's
    /// `runAsUser`), a namespace that can be a name, and no host bind mounts.
    /// `forge.kind = "github"`: the App's id and key, and runs that fit in a token's hour.
    fn validate_github(&self) -> Result<(), SettingsError> {
        if !cfg!(feature = "github") {
            return Err(invalid(
                "forge.kind",
                "this build has no GitHub support (built without the `github` feature)",
            ));
        }
        if self.forge.url.is_empty() {
            return Err(invalid(
                "forge.url",
                "required with forge.kind = \"github\": https://api.github.com, or https://HOST/api/v3 for GitHub Enterprise Server",
            ));
        }
        let g = &self.github;
        if g.app_id == 0 {
            return Err(invalid(
                "github.app_id",
                "required with forge.kind = \"github\" (the App's numeric id)",
            ));
        }
        if g.private_key.is_empty() {
            return Err(invalid(
                "github.private_key",
                "required with forge.kind = \"github\" (or use github.private_key_file)",
            ));
        }
        #[cfg(feature = "github")]
        if let Err(why) = check_private_key(&g.private_key) {
            return Err(invalid("github.private_key", why));
        }
        if !self.forge.token.is_empty() {
            return Err(invalid(
                "forge.token",
                "not used with forge.kind = \"github\": the director acts as the App (github.app_id, github.private_key)",
            ));
        }
        let r = &self.runner;
        if r.enabled && !r.image.is_empty() && r.timeout_secs > GITHUB_MAX_RUN_SECS {
            return Err(invalid(
                "runner.timeout_secs",
                format!(
                    "{} is longer than a run can push on GitHub: its installation token expires {} minutes after it is minted, so runs are limited to {GITHUB_MAX_RUN_SECS} s",
                    r.timeout_secs,
                    GITHUB_TOKEN_LIFETIME_SECS / 60
                ),
            ));
        }
        Ok(())
    }

    fn validate_kubernetes(&self) -> Result<(), SettingsError> {
        let k = &self.kubernetes;
        if !is_dns_label(&k.namespace) {
            return Err(invalid(
                "kubernetes.namespace",
                format!(
                    "`{}` is not a namespace name (lower-case letters, digits and `-`, at most 63)",
                    k.namespace
                ),
            ));
        }
        if !k.service_account.is_empty() && !is_dns_subdomain(&k.service_account) {
            return Err(invalid(
                "kubernetes.service_account",
                format!("`{}` is not a service account name", k.service_account),
            ));
        }
        if !k.kubeconfig.is_empty() && !Path::new(&k.kubeconfig).is_file() {
            return Err(invalid(
                "kubernetes.kubeconfig",
                format!("{} does not exist", k.kubeconfig),
            ));
        }
        if numeric_user(&self.runner.user).is_none() {
            return Err(invalid(
                "runner.user",
                format!(
                    "`{}`: a Kubernetes run needs a numeric uid:gid (its pod's runAsUser and runAsGroup)",
                    self.runner.user
                ),
            ));
        }
        if !self.runner.mounts.is_empty() {
            return Err(invalid(
                "runner.mounts",
                "host bind mounts are Docker's; a Kubernetes run gets only its workspace and task (put tools in the image)",
            ));
        }
        Ok(())
    }
}

impl Settings {
    /// Whether runs are allow-listed (`runner.egress = "allowlist"`).
    pub fn egress_confined(&self) -> bool {
        self.runner.egress == "allowlist"
    }

    fn validate_egress(&self) -> Result<(), SettingsError> {
        let r = &self.runner;
        match r.egress.as_str() {
            "allowlist" | "open" => {}
            other => {
                return Err(invalid(
                    "runner.egress",
                    format!("`{other}`: must be allowlist or open"),
                ));
            }
        }
        for entry in &r.egress_allow {
            entry
                .parse::<crate::egress::Entry>()
                .map_err(|e| invalid("runner.egress_allow", e))?;
        }
        if !self.egress_confined() {
            return Ok(());
        }
        if r.egress_proxy_port == 0 {
            return Err(invalid(
                "runner.egress_proxy_port",
                "must be a port (1-65535)",
            ));
        }
        if r.kind == "docker" && r.network != "bridge" {
            return Err(invalid(
                "runner.network",
                format!(
                    "`{}` applies with runner.egress = \"open\" only: an allow-listed run is attached to runner.egress_network (`{}`) and reaches the outside through the egress proxy",
                    r.network, r.egress_network
                ),
            ));
        }
        if r.kind == "docker" && r.egress_network.trim().is_empty() {
            return Err(invalid("runner.egress_network", "must name a network"));
        }
        if r.kind == "kubernetes" {
            let k = &self.kubernetes;
            if k.proxy_host.trim().is_empty() {
                return Err(invalid(
                    "kubernetes.proxy_host",
                    "required with runner.egress = \"allowlist\": the name runs reach the director's egress proxy by (its Service)",
                ));
            }
            if k.proxy_pod_labels.is_empty()
                || k.proxy_pod_labels.iter().any(|l| {
                    l.split_once('=')
                        .is_none_or(|(key, _)| key.trim().is_empty())
                })
            {
                return Err(invalid(
                    "kubernetes.proxy_pod_labels",
                    "required with runner.egress = \"allowlist\": the director's pod labels, as key=value, for the runs' NetworkPolicy",
                ));
            }
        }
        Ok(())
    }
}

/// `uid:gid` (or a lone `uid`, the group the same) as numbers, when both are.
pub fn numeric_user(user: &str) -> Option<(i64, i64)> {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    Some((uid.trim().parse().ok()?, gid.trim().parse().ok()?))
}

/// An RFC 1123 label: what a namespace name must be.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 in all.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

fn is_root(user: &str) -> bool {
    user.split(':').any(|part| {
        let p = part.trim();
        p.eq_ignore_ascii_case("root") || (!p.is_empty() && p.bytes().all(|b| b == b'0'))
    })
}

/// A bind-mount source that is the Docker socket or a directory holding it.
fn binds_docker_socket(source: &str) -> bool {
    let s = source.trim_end_matches('/');
    let s = if s.is_empty() { "/" } else { s };
    s == "/"
        || s.ends_with("docker.sock")
        || ["/var/run/docker.sock", "/run/docker.sock"]
            .iter()
            .any(|sock| sock.starts_with(&format!("{s}/")))
}

impl figment::Provider for EnvPairs {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("DIRECTOR_* environment variable(s)")
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        let mut dict = figment::value::Dict::new();
        for (name, value) in &self.0 {
            let Some((section, key)) = name.split_once("__") else {
                continue;
            };
            let section = section.to_ascii_lowercase();
            let key = key.to_ascii_lowercase();
            // A secret is kept exactly as given: `00123` is not the number 123.
            let secret = is_secret_key(&section, &key);
            let entry = dict
                .entry(section)
                .or_insert_with(|| figment::value::Value::from(figment::value::Dict::new()));
            if let figment::value::Value::Dict(_, inner) = entry {
                let parsed = if secret {
                    value.clone().into()
                } else {
                    value.parse().unwrap_or_else(|_| value.clone().into())
                };
                inner.insert(key, parsed);
            }
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

fn one_line(e: &figment::Error) -> String {
    // figment's Display names the key ("for key `server.listen`") and the source.
    e.to_string()
        .replace('\n', " ")
        .replace("key \"default.", "key \"")
}

#[cfg(test)]
mod schedule_tests {
    #[test]
    fn a_scheduled_period_is_named_alike_by_replicas_firing_moments_apart() {
        // An even second, on a schedule every 2 s: replicas firing around it name it alike.
        let tick = 1_796_000_002_000;
        for now in [tick - 400, tick - 1, tick, tick + 3, tick + 900] {
            assert_eq!(
                super::nearest_occurrence_ms("*/2 * * * * *", now),
                Some(tick),
                "{now}"
            );
        }
        assert_eq!(
            super::nearest_occurrence_ms("0 */5 * * * *", 1_796_000_299_500),
            Some(1_796_000_400_000)
        );
        assert_eq!(super::nearest_occurrence_ms("not cron", tick), None);
    }
}

#[cfg(test)]
mod links_tests {
    use super::*;

    #[test]
    fn links_follow_each_forge_s_spelling() {
        let repo: RepoName = "acme/widgets".parse().expect("repo");
        let github = ForgeSettings {
            kind: ForgeKind::Github,
            url: "https://api.github.com/".into(),
            ..Default::default()
        }
        .links()
        .expect("links");
        assert_eq!(
            github.pull(&repo, 7),
            "https://github.com/acme/widgets/pull/7"
        );
        assert_eq!(
            github.branch(&repo, "b"),
            "https://github.com/acme/widgets/tree/b"
        );
        let ghes = ForgeSettings {
            kind: ForgeKind::Github,
            url: "https://ghe.example/api/v3".into(),
            ..Default::default()
        };
        assert_eq!(ghes.web_url(), "https://ghe.example");
        let forgejo = ForgeSettings {
            url: "https://forgejo.example/".into(),
            ..Default::default()
        }
        .links()
        .expect("links");
        assert_eq!(
            forgejo.pull(&repo, 7),
            "https://forgejo.example/acme/widgets/pulls/7"
        );
        assert_eq!(
            forgejo.issue(&repo, 3),
            "https://forgejo.example/acme/widgets/issues/3"
        );
        assert!(ForgeSettings::default().links().is_none());
    }
}
