//! `[agents.<name>]`: the agents users bring, by name. Each names its image, its command,
//! the variables it is given, which `[models]` providers it talks to, and its own turn
//! limit. `runner.agent` is the default; a repository's `.director.toml` may choose among
//! `repo_settings.agents`; a writer may choose for one issue with the label
//! `labels.agent_prefix` + name (`agent:aider`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Settings, SettingsError, invalid, lenient};

/// One agent's profile.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// The image its runs start from (present on the engine, or pullable by the cluster).
    #[serde(deserialize_with = "lenient::string")]
    pub image: String,
    /// The command to run; empty: the image's own entry point.
    #[serde(deserialize_with = "lenient::list")]
    pub command: Vec<String>,
    /// Variables its runs get. Treated as secrets: masked by `check-config`, redacted from
    /// every run's output, and never one of the director's own secrets. A provider's key
    /// comes from `[models]` through the model gateway.
    #[serde(serialize_with = "masked_values")]
    pub env: BTreeMap<String, String>,
    /// The `[models]` providers whose base URL and key variables it gets; empty: every
    /// configured one.
    #[serde(deserialize_with = "lenient::list")]
    pub providers: Vec<String>,
    /// The agent's own turn limit, given to the run as `DIRECTOR_MAX_TURNS` (the example
    /// entrypoint passes it to agents that have one, e.g. Claude Code's `--max-turns`).
    pub max_turns: Option<u32>,
}

/// A profile's variables as `check-config` shows them: their names, every value masked.
fn masked_values<S: serde::Serializer>(
    env: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(env.len()))?;
    for (k, v) in env {
        map.serialize_entry(k, if v.is_empty() { "" } else { "***" })?;
    }
    map.end()
}

/// Variables an agent profile may not set: the run contract's own, git's, the proxy's and
/// the providers' (the director sets those, and a profile must not point a run elsewhere).
fn reserved(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let provider = upper.starts_with("ANTHROPIC_") || upper.starts_with("OPENAI_");
    upper.starts_with("DIRECTOR_")
        || upper.starts_with("GIT_")
        // Where a provider's calls go and what they carry (the model name may be chosen).
        || (provider
            && ["_BASE_URL", "_API_BASE", "_API_KEY", "_AUTH_TOKEN", "_CUSTOM_HEADERS"]
                .iter()
                .any(|end| upper.ends_with(end)))
        || matches!(
            upper.as_str(),
            "HOME" | "TMPDIR" | "HTTP_PROXY" | "HTTPS_PROXY" | "ALL_PROXY" | "NO_PROXY"
        )
}

/// An agent's name: what a label and a repository's file say, so short and plain.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 40
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

fn valid_variable(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Settings {
    /// The names of `[agents]`, sorted.
    pub fn agent_names(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    /// Whether coder runs are configured: enabled, with an image or a default agent.
    pub fn runs_configured(&self) -> bool {
        self.runner.enabled
            && (!self.runner.image.trim().is_empty() || !self.runner.agent.trim().is_empty())
    }

    pub(super) fn validate_agents(&self) -> Result<(), SettingsError> {
        for (name, agent) in &self.agents {
            if !valid_name(name) {
                return Err(invalid(
                    "agents",
                    format!(
                        "`{name}` is not an agent name (lower-case letters, digits, `-`, `_`, `.`; at most 40)"
                    ),
                ));
            }
            if agent.image.trim().is_empty() {
                return Err(invalid("agents", format!("`agents.{name}.image` is empty")));
            }
            for key in agent.env.keys() {
                if !valid_variable(key) {
                    return Err(invalid(
                        "agents",
                        format!("`agents.{name}.env`: `{key}` is not a variable name"),
                    ));
                }
                let value = agent.env.get(key).map_or("", String::as_str);
                if self.holds_a_secret(value) {
                    return Err(invalid(
                        "agents",
                        format!(
                            "`agents.{name}.env` `{key}` holds one of the director's own secrets (the forge token, a model key, a webhook secret, ...); a run must never get it"
                        ),
                    ));
                }
                if reserved(key) {
                    return Err(invalid(
                        "agents",
                        format!(
                            "`agents.{name}.env` may not set `{key}`: the director sets it (the run contract, git, the proxy and the model gateway)"
                        ),
                    ));
                }
            }
            for provider in &agent.providers {
                let configured = self.models.providers().any(|(p, _)| p == provider);
                if !configured {
                    return Err(invalid(
                        "agents",
                        format!(
                            "`agents.{name}.providers` names `{provider}`, which is not configured in `[models]` (configured: {})",
                            self.models
                                .providers()
                                .map(|(p, _)| p)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
            if agent.max_turns == Some(0) {
                return Err(invalid(
                    "agents",
                    format!("`agents.{name}.max_turns` must be at least 1"),
                ));
            }
        }
        let agent = self.runner.agent.trim();
        if !agent.is_empty() && !self.agents.contains_key(agent) {
            return Err(invalid(
                "runner.agent",
                format!(
                    "`{agent}` is not an agent of `[agents]` (configured: {})",
                    self.known_agents()
                ),
            ));
        }
        if !self.agents.is_empty() && agent.is_empty() && self.runner.image.trim().is_empty() {
            return Err(invalid(
                "runner.agent",
                format!(
                    "`[agents]` is configured but neither `runner.agent` nor `runner.image` is set: a run whose issue and repository name no agent needs one (configured: {})",
                    self.known_agents()
                ),
            ));
        }
        for name in &self.repo_settings.agents {
            if !self.agents.contains_key(name.trim()) {
                return Err(invalid(
                    "repo_settings.agents",
                    format!(
                        "`{name}` is not an agent of `[agents]` (configured: {})",
                        self.known_agents()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `value` is, or holds, one of the director's own secrets (one short enough to
    /// occur by chance is compared whole).
    fn holds_a_secret(&self, value: &str) -> bool {
        !value.is_empty()
            && self.secrets().any(|s| {
                let secret = s.expose();
                secret == value || (secret.len() >= 8 && value.contains(secret))
            })
    }

    fn known_agents(&self) -> String {
        if self.agents.is_empty() {
            "none".to_owned()
        } else {
            self.agent_names().join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_are_plain() {
        for ok in ["claude-code", "aider", "mini-swe-agent", "codex", "a1.b_c"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "Claude", "-x", "a b", "a/b", "agent:x", &"a".repeat(41)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_contracts_variables_are_reserved() {
        for name in [
            "DIRECTOR_TOKEN",
            "GIT_CONFIG_COUNT",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_AUTH_TOKEN",
            "OPENAI_API_BASE",
            "openai_api_key",
            "https_proxy",
            "HOME",
            "TMPDIR",
        ] {
            assert!(reserved(name), "{name}");
        }
        assert!(!reserved("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"));
        assert!(!reserved("ANTHROPIC_MODEL"));
    }
}
