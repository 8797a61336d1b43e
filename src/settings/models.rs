//! `[models]` (the model providers runs reach through the director's metering gateway, and
//! their prices) and `[budget]` (what runs, a repository and the day may spend).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Secret, SettingsError, invalid, lenient};

/// One provider a run may call, through the model gateway, with the director's real key.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderSettings {
    /// The provider's API base: `https://api.anthropic.com` (without `/v1`), or an
    /// OpenAI-compatible base with its `/v1` (`https://api.openai.com/v1`).
    #[serde(deserialize_with = "lenient::string")]
    pub base_url: String,
    pub api_key: Secret,
    #[serde(deserialize_with = "lenient::opt_string")]
    pub api_key_file: Option<String>,
}

/// Dollars per million tokens of one model.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Cache reads (Anthropic's cache hits, OpenAI's cached input); default: the input price.
    pub cache_read_per_mtok: Option<f64>,
    /// Cache writes (Anthropic's 5-minute writes; 1-hour writes are priced at twice the
    /// input price when this is not set); default: the input price.
    pub cache_write_per_mtok: Option<f64>,
    /// Dollars per web search the provider runs (with `models.allow_server_tools`);
    /// default $0.01, both providers' published price.
    pub web_search_usd: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsSettings {
    pub anthropic: Option<ProviderSettings>,
    pub openai: Option<ProviderSettings>,
    /// Forward routes of the provider's API the gateway cannot meter (anything but
    /// Anthropic's messages and OpenAI's chat completions and responses). Off: refused.
    pub allow_unmetered: bool,
    /// Prices per model name, as the request names it.
    pub prices: BTreeMap<String, Price>,
    /// The largest request body the gateway forwards, in MB.
    pub max_request_mb: u64,
    /// Output tokens a call that names no limit of its own (`max_tokens`,
    /// `max_completion_tokens`, `max_output_tokens`) is reserved against the budgets for,
    /// while it runs.
    pub default_max_output_tokens: u64,
    /// Tools the provider runs on its own servers that runs may declare, by the start of
    /// their type (`web_search`, `web_fetch`, `code_execution`, `computer`, `mcp`, ... or
    /// `*`): each reaches outside the run. Empty (the default): none.
    pub allow_server_tools: Vec<String>,
    /// `anthropic-beta` flags runs may send beside the director's own list.
    pub allow_anthropic_betas: Vec<String>,
    /// How long the gateway keeps reading an answer the run hung up on, for the usage the
    /// provider bills; past it the call is charged its whole reservation.
    pub drain_secs: u64,
}

impl Default for ModelsSettings {
    fn default() -> Self {
        Self {
            anthropic: None,
            openai: None,
            allow_unmetered: false,
            prices: BTreeMap::new(),
            max_request_mb: 32,
            default_max_output_tokens: 32_000,
            allow_server_tools: Vec::new(),
            allow_anthropic_betas: Vec::new(),
            drain_secs: 300,
        }
    }
}

/// Spending limits in dollars; 0 is no limit. Counted from metered usage.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSettings {
    /// One run (a follow-up is a run of its own).
    pub run_usd: f64,
    /// One repository in one UTC day, runs and pre-flights together.
    pub repo_daily_usd: f64,
    /// Everything in one UTC day.
    pub daily_usd: f64,
    /// The most a writer's `/director continue $N` may give the follow-up of a run stopped on
    /// its budget; a plain `/director continue` gives it `run_usd` (or this, when lower).
    /// 0: `run_usd`.
    pub max_continue_usd: f64,
}

impl BudgetSettings {
    pub fn any(&self) -> bool {
        self.run_usd > 0.0 || self.repo_daily_usd > 0.0 || self.daily_usd > 0.0
    }

    /// These budgets for one run whose repository set `run_usd` (only ever lower: checked
    /// when its `.director.toml` was read, and held here again).
    pub fn for_run(&self, run_usd: Option<f64>) -> Self {
        let mut out = self.clone();
        if let Some(usd) = run_usd.filter(|u| u.is_finite() && *u > 0.0) {
            out.run_usd = if self.run_usd > 0.0 {
                usd.min(self.run_usd)
            } else {
                usd
            };
        }
        out
    }
}

impl ModelsSettings {
    /// The configured providers: (name, settings).
    pub fn providers(&self) -> impl Iterator<Item = (&'static str, &ProviderSettings)> {
        [("anthropic", &self.anthropic), ("openai", &self.openai)]
            .into_iter()
            .filter_map(|(name, p)| p.as_ref().map(|p| (name, p)))
    }

    pub(super) fn validate(&self, budget: &BudgetSettings) -> Result<(), SettingsError> {
        for (name, p) in self.providers() {
            let key: &'static str = match name {
                "anthropic" => "models.anthropic.base_url",
                _ => "models.openai.base_url",
            };
            match reqwest::Url::parse(&p.base_url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => return Err(invalid(key, "must be an http(s) URL")),
            }
            if p.api_key.is_empty() {
                let key: &'static str = match name {
                    "anthropic" => "models.anthropic.api_key",
                    _ => "models.openai.api_key",
                };
                return Err(invalid(key, "is required (or `api_key_file`)"));
            }
        }
        for (model, price) in &self.prices {
            let all = [
                Some(price.input_per_mtok),
                Some(price.output_per_mtok),
                price.cache_read_per_mtok,
                price.cache_write_per_mtok,
                price.web_search_usd,
            ];
            if all.iter().flatten().any(|p| !p.is_finite() || *p < 0.0) {
                return Err(invalid(
                    "models.prices",
                    format!("the prices of `{model}` must be numbers of at least 0"),
                ));
            }
        }
        if self.max_request_mb == 0 {
            return Err(invalid("models.max_request_mb", "must be at least 1"));
        }
        let word = |w: &String| {
            !w.is_empty()
                && w.len() <= 80
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c))
        };
        if let Some(bad) = self
            .allow_server_tools
            .iter()
            .find(|t| t.as_str() != "*" && !word(t))
        {
            return Err(invalid(
                "models.allow_server_tools",
                format!(
                    "`{}` is not a tool type (lower-case letters, digits, `_`; or `*`)",
                    bad.escape_debug()
                ),
            ));
        }
        if let Some(bad) = self.allow_anthropic_betas.iter().find(|b| !word(b)) {
            return Err(invalid(
                "models.allow_anthropic_betas",
                format!(
                    "`{}` is not a beta flag (lower-case letters, digits, `-`)",
                    bad.escape_debug()
                ),
            ));
        }
        if self.drain_secs == 0 || self.drain_secs > 3600 {
            return Err(invalid("models.drain_secs", "must be 1 to 3600 seconds"));
        }
        for (key, v) in [
            ("budget.run_usd", budget.run_usd),
            ("budget.repo_daily_usd", budget.repo_daily_usd),
            ("budget.daily_usd", budget.daily_usd),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(invalid(key, "must be a number of dollars, at least 0"));
            }
        }
        Ok(())
    }
}

impl super::Settings {
    /// What is allowed but likely not meant: said by `check-config` and logged at start.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let m = &self.models;
        let any_provider = m.providers().next().is_some();
        if self.budget.any() {
            if !any_provider {
                out.push("[budget] is set but [models] names no provider: runs' model calls do not go through the director, so only the pre-flight's are counted".to_owned());
            }
            let preflight_model = &self.preflight.model;
            if self.preflight.enabled
                && self.preflight.provider != super::Provider::Command
                && super::prices::price_of(&m.prices, preflight_model).is_none()
            {
                out.push(format!(
                    "the pre-flight's model `{preflight_model}` has no price in [models.prices] or the director's own table: its calls count in tokens only, not toward [budget]"
                ));
            }
        }
        if !m.allow_server_tools.is_empty() {
            out.push(format!(
                "models.allow_server_tools = {:?}: runs may have the provider's servers search, fetch or call out for them, outside runner.egress_allow",
                m.allow_server_tools
            ));
        }
        if m.allow_unmetered && self.budget.any() {
            out.push("models.allow_unmetered = true with a [budget]: calls on the routes the gateway cannot meter are forwarded and escape the budget".to_owned());
        }
        if self.runner.unprotect_ci {
            let left = self.runner.unprotected_defaults();
            if !left.is_empty() {
                out.push(format!(
                    "runner.unprotect_ci = true and runner.protected_paths leaves out {}: a run's commits may change what the forge runs with the repository's secrets",
                    left.join(", ")
                ));
            }
        }
        if any_provider && !self.egress_confined() {
            out.push("[models] names providers but runner.egress = \"open\": runs get no model variables (the model gateway serves allow-listed runs only)".to_owned());
        }
        if self.runs_configured() && self.runner.branch_home == super::BranchHome::Repository {
            out.push("runner.branch_home = \"repository\": runs push their branches to the watched repositories themselves: a workflow that runs on those pushes, or on their pull requests with secrets, runs agent-written code with the repository's secrets; restrict such workflows (docs/security.md#agent-code-in-ci)".to_owned());
        }
        out.extend(self.repo_settings.warnings(self.egress_confined()));
        out
    }

    /// With a provider in `[models]`, no variable of that provider passes into runs: the
    /// director gives them their own, and the real key must not reach one.
    pub(super) fn validate_model_passthrough(&self) -> Result<(), SettingsError> {
        let m = &self.models;
        for name in &self.runner.env_passthrough {
            let covered = (m.anthropic.is_some() && name.starts_with("ANTHROPIC_"))
                || (m.openai.is_some() && name.starts_with("OPENAI_"));
            if covered {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "names {name}, but [models] gives runs that provider through the director's model gateway (a provider's real key must not reach a run); drop it"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repositorys_run_budget_only_ever_lowers_the_operators() {
        let operator = BudgetSettings {
            run_usd: 2.0,
            repo_daily_usd: 10.0,
            daily_usd: 0.0,
            max_continue_usd: 0.0,
        };
        assert_eq!(operator.for_run(Some(0.5)).run_usd, 0.5);
        assert_eq!(operator.for_run(Some(50.0)).run_usd, 2.0);
        assert_eq!(operator.for_run(None).run_usd, 2.0);
        assert_eq!(operator.for_run(Some(f64::NAN)).run_usd, 2.0);
        assert_eq!(operator.for_run(Some(-1.0)).run_usd, 2.0);
        assert_eq!(operator.for_run(Some(0.5)).repo_daily_usd, 10.0);
        let unlimited = BudgetSettings::default();
        assert_eq!(unlimited.for_run(Some(0.5)).run_usd, 0.5);
        assert!(unlimited.for_run(Some(0.5)).any());
    }
}
