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

pub mod agents;
pub mod checks;
mod filers;
mod forge;
pub mod memory;
mod models;
mod preflight;
pub mod prices;
pub mod repo;
mod runner;
mod sandbox;
mod scan;
mod server;
pub mod setup;

pub use forge::*;
pub use models::*;
pub use preflight::*;
pub use repo::RepoSettingsCeiling;
pub use runner::*;
pub use scan::*;
pub use server::*;

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

fn secret_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Secret>, D::Error> {
    Ok(lenient::list(d)?.into_iter().map(Secret).collect())
}

fn repo_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RepoName>, D::Error> {
    lenient::list(d)?
        .iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
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
    pub models: ModelsSettings,
    pub budget: BudgetSettings,
    pub repo_settings: RepoSettingsCeiling,
    pub telemetry: TelemetrySettings,
    pub merge: MergeSettings,
    /// The agents runs may be given, by name (`[agents.<name>]`).
    pub agents: std::collections::BTreeMap<String, agents::AgentSettings>,
    /// Values repositories' setup phases may ask for, by name (`[setup_secrets.<NAME>]`).
    pub setup_secrets: std::collections::BTreeMap<String, setup::SetupSecret>,
    /// The accounts that file work for agents, by name (`[filers.<name>]`).
    pub filers: std::collections::BTreeMap<String, crate::domain::filer::FilerRule>,
    /// The checks the director runs on every run's pushed head (`[checks]`), unless a
    /// repository's own `[checks]` replaces them.
    pub checks: checks::ChecksSettings,
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
        // Defaults work on every forge: on GitHub an open run's push must fit in its
        // installation token's hour, so the default wall-clock limit there is the longest
        // that fits. (A confined run pushes through the git gateway, which renews the token.)
        if settings.forge.kind == ForgeKind::Github
            && !settings.egress_confined()
            && figment.find_value("runner.timeout_secs").is_err()
        {
            settings.runner.timeout_secs = settings.runner.timeout_secs.min(GITHUB_MAX_RUN_SECS);
        }
        // A GitHub App cannot own forks: its runs push to the repository unless told
        // otherwise (and told otherwise, the configuration is refused below).
        if settings.forge.kind == ForgeKind::Github
            && figment.find_value("runner.branch_home").is_err()
        {
            settings.runner.branch_home = BranchHome::Repository;
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
        if let Some(p) = &mut self.models.anthropic {
            one(
                &mut p.api_key,
                &p.api_key_file,
                "models.anthropic.api_key",
                "models.anthropic.api_key_file",
            )?;
        }
        if let Some(p) = &mut self.models.openai {
            one(
                &mut p.api_key,
                &p.api_key_file,
                "models.openai.api_key",
                "models.openai.api_key_file",
            )?;
        }
        setup::load(&mut self.setup_secrets)?;
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

    /// `[setup_secrets]` as a repository's ceiling sees them: names and `repos` globs.
    pub fn setup_secret_globs(&self) -> Vec<(String, Vec<String>)> {
        self.setup_secrets
            .iter()
            .map(|(name, s)| (name.clone(), s.repos.clone()))
            .collect()
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
        .chain(self.models.providers().map(|(_, p)| &p.api_key))
        .chain(self.setup_secrets.values().map(|s| &s.value))
        .filter(|s| !s.is_empty())
    }

    /// `env`: the environment the director runs with (what `runner.env_passthrough` reads).
    fn validate(&self, env: &[(String, String)]) -> Result<(), SettingsError> {
        self.server.validate()?;
        self.store.validate()?;
        self.webhook.validate()?;
        self.forge.validate()?;
        if self.forge.kind == ForgeKind::Github {
            self.validate_github()?;
        }
        self.labels.validate()?;
        self.preflight.validate()?;
        self.validate_runner(env)?;
        self.scan.validate()?;
        self.models.validate(&self.budget)?;
        self.validate_model_passthrough()?;
        self.repo_settings.validate()?;
        if self.repo_settings.allow.iter().any(|k| k == "setup") && !self.egress_confined() {
            return Err(invalid(
                "repo_settings.allow",
                "names `setup`, which needs confined runs (runner.egress = \"allowlist\"): the setup's network and secrets are kept apart from the agent's only there",
            ));
        }
        if self.checks.is_set() {
            checks::decl(&self.checks, self.runner.timeout_secs, &mut Vec::new())
                .map_err(|problems| invalid("checks", problems.join("; ")))?;
        }
        let checks_allowed = self.repo_settings.allow.iter().any(|k| k == "checks");
        if (self.checks.is_set() || checks_allowed) && !self.egress_confined() {
            return Err(invalid(
                if checks_allowed {
                    "repo_settings.allow"
                } else {
                    "checks"
                },
                "the director's checks need confined runs (runner.egress = \"allowlist\"): the head is fetched through the git gateway on the runs' network",
            ));
        }
        self.validate_agents()?;
        self.validate_filers()?;
        self.telemetry.validate()?;
        self.merge.validate()?;
        Ok(())
    }

    /// The configuration as TOML, with every secret masked.
    pub fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
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
    ("models", "api_key"),
];

fn is_secret_key(section: &str, key: &str) -> bool {
    SECRET_KEYS.contains(&(section, key))
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
            // `SECTION__KEY`, or deeper: `MODELS__ANTHROPIC__API_KEY`.
            let path: Vec<String> = name.split("__").map(str::to_ascii_lowercase).collect();
            let [section, _, ..] = path.as_slice() else {
                continue;
            };
            let key = path.last().unwrap_or(section);
            // A secret is kept exactly as given: `00123` is not the number 123.
            let secret = is_secret_key(section, key);
            let parsed: figment::value::Value = if secret {
                value.clone().into()
            } else {
                value.parse().unwrap_or_else(|_| value.clone().into())
            };
            insert_at(&mut dict, &path, parsed);
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

/// Puts `value` at `path` (sections, then the key) in `dict`, making sections as needed.
fn insert_at(dict: &mut figment::value::Dict, path: &[String], value: figment::value::Value) {
    match path {
        [] => {}
        [key] => {
            dict.insert(key.clone(), value);
        }
        [section, rest @ ..] => {
            let entry = dict
                .entry(section.clone())
                .or_insert_with(|| figment::value::Value::from(figment::value::Dict::new()));
            if let figment::value::Value::Dict(_, inner) = entry {
                insert_at(inner, rest, value);
            }
        }
    }
}

fn one_line(e: &figment::Error) -> String {
    // figment's Display names the key ("for key `server.listen`") and the source.
    e.to_string()
        .replace('\n', " ")
        .replace("key \"default.", "key \"")
}
