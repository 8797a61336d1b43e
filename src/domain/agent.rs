//! Which agent a run gets: a writer's `agent:<name>` label on the issue, else the
//! repository's `.director.toml` (`runner.agent`, within the operator's ceiling), else the
//! operator's `runner.agent`. One pure function, [`choose`], so "why this agent?" and "why
//! was my agent refused?" have one answer.

use serde::{Deserialize, Serialize};

/// The repository's own settings file (as `settings::repo::FILE`, which the domain cannot
/// import).
const REPO_FILE: &str = ".director.toml";

/// Where the chosen agent's name came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum AgentSource {
    /// A writer's label on the issue.
    Label { label: String, by: String },
    /// The repository's `.director.toml`.
    Repository,
    /// The operator's `runner.agent`.
    Operator,
}

/// The agent a run gets, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentChoice {
    pub name: String,
    #[serde(flatten)]
    pub source: AgentSource,
}

impl AgentChoice {
    /// `claude-code (the label agent:claude-code by @alice)`, for comments and the status.
    pub fn describe(&self) -> String {
        let why = match &self.source {
            AgentSource::Label { label, by } => format!("the label `{label}` by @{by}"),
            AgentSource::Repository => format!("the repository's `{REPO_FILE}`"),
            AgentSource::Operator => "the operator's default, `runner.agent`".to_owned(),
        };
        format!("`{}` ({why})", self.name)
    }
}

/// What a GO comment says of the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "agent", rename_all = "snake_case")]
pub enum AgentLine {
    /// The agent a run would get now, described.
    Chosen { text: String },
    /// Why no run can start as asked (an unknown name, two labels).
    Refused { why: String },
}

/// One agent label on the issue, with who last applied it and whether they may write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentLabel {
    /// The label as it is on the issue (`agent:aider`).
    pub label: String,
    /// The name after the prefix.
    pub name: String,
    /// Who last applied it, when the timeline says.
    pub by: Option<String>,
    /// Whether that account may write to the repository.
    pub trusted: bool,
}

/// What the choice is made from.
pub struct AgentFacts<'a> {
    /// The names of `[agents]`, sorted.
    pub configured: &'a [String],
    /// `runner.agent` (empty: none; the run then uses `runner.image` and `runner.command`).
    pub default: &'a str,
    /// The repository's `runner.agent`, already held to the operator's ceiling.
    pub repository: Option<&'a str>,
    /// The agents this repository may use (`repo_settings.agents`); empty: every configured
    /// one. A writer's label names one of these or none: it never reaches past the list.
    pub repository_may: &'a [String],
    /// The agent labels. A reader's label is ignored (logged by the caller).
    pub labels: &'a [AgentLabel],
}

/// The agent a run gets (`Ok(None)`: none named anywhere, the run uses `runner.image`), or
/// why no run can start as asked, in a sentence naming the agents allowed.
pub fn choose(facts: &AgentFacts<'_>) -> Result<Option<AgentChoice>, String> {
    let allowed = || {
        if facts.configured.is_empty() {
            "none is configured (`[agents]`)".to_owned()
        } else {
            let names: Vec<String> = facts.configured.iter().map(|n| format!("`{n}`")).collect();
            format!("allowed: {}", names.join(", "))
        }
    };
    let known = |name: &str| facts.configured.iter().any(|n| n == name);
    let mut trusted: Vec<&AgentLabel> = facts.labels.iter().filter(|l| l.trusted).collect();
    trusted.sort_by(|a, b| a.name.cmp(&b.name));
    trusted.dedup_by(|a, b| a.name == b.name);
    match trusted.as_slice() {
        [] => {}
        [one] => {
            if !known(&one.name) {
                return Err(format!(
                    "the label `{}` names no agent of this director ({})",
                    one.label,
                    allowed()
                ));
            }
            let may = &facts.repository_may;
            if !may.is_empty() && !may.iter().any(|n| n.trim() == one.name) {
                let names: Vec<String> = may.iter().map(|n| format!("`{}`", n.trim())).collect();
                return Err(format!(
                    "the label `{}` names an agent this repository may not use (repo_settings.agents: {})",
                    one.label,
                    names.join(", ")
                ));
            }
            return Ok(Some(AgentChoice {
                name: one.name.clone(),
                source: AgentSource::Label {
                    label: one.label.clone(),
                    by: one.by.clone().unwrap_or_default(),
                },
            }));
        }
        many => {
            let labels: Vec<String> = many.iter().map(|l| format!("`{}`", l.label)).collect();
            return Err(format!(
                "the issue carries more than one agent label by a writer ({}); keep one",
                labels.join(", ")
            ));
        }
    }
    if let Some(name) = facts.repository {
        if !known(name) {
            return Err(format!(
                "the repository's `{REPO_FILE}` names the agent `{name}`, which this director does not have ({})",
                allowed()
            ));
        }
        return Ok(Some(AgentChoice {
            name: name.to_owned(),
            source: AgentSource::Repository,
        }));
    }
    if facts.default.is_empty() {
        return Ok(None);
    }
    Ok(Some(AgentChoice {
        name: facts.default.to_owned(),
        source: AgentSource::Operator,
    }))
}

/// The agent name a label carries, if it starts with `prefix` (an empty prefix: none does).
pub fn label_name<'a>(prefix: &str, label: &'a str) -> Option<&'a str> {
    if prefix.is_empty() {
        return None;
    }
    label.strip_prefix(prefix).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["aider".into(), "claude-code".into()]
    }

    fn label(name: &str, by: &str, trusted: bool) -> AgentLabel {
        AgentLabel {
            label: format!("agent:{name}"),
            name: name.into(),
            by: Some(by.into()),
            trusted,
        }
    }

    #[test]
    fn a_writers_label_wins_over_the_repository_and_the_operator() {
        let configured = names();
        let labels = [label("aider", "alice", true)];
        let chosen = choose(&AgentFacts {
            configured: &configured,
            default: "claude-code",
            repository: Some("claude-code"),
            labels: &labels,
            repository_may: &[],
        });
        let chosen = chosen.expect("allowed").expect("an agent");
        assert_eq!(chosen.name, "aider");
        assert_eq!(
            chosen.describe(),
            "`aider` (the label `agent:aider` by @alice)"
        );
    }

    #[test]
    fn a_readers_label_is_ignored() {
        let configured = names();
        let labels = [label("aider", "mallory", false)];
        let chosen = choose(&AgentFacts {
            configured: &configured,
            default: "claude-code",
            repository: None,
            labels: &labels,
            repository_may: &[],
        });
        assert_eq!(
            chosen.expect("allowed").expect("an agent"),
            AgentChoice {
                name: "claude-code".into(),
                source: AgentSource::Operator
            }
        );
        // Even a name no agent has: a reader cannot stop a run by labelling.
        let labels = [label("nonsense", "mallory", false)];
        let chosen = choose(&AgentFacts {
            configured: &configured,
            default: "",
            repository: None,
            labels: &labels,
            repository_may: &[],
        });
        assert_eq!(chosen, Ok(None));
    }

    #[test]
    fn an_unknown_name_is_refused_naming_the_agents_allowed() {
        let configured = names();
        let labels = [label("gpt-engineer", "alice", true)];
        let why = choose(&AgentFacts {
            configured: &configured,
            default: "claude-code",
            repository: None,
            labels: &labels,
            repository_may: &[],
        })
        .expect_err("refused");
        assert!(why.contains("`agent:gpt-engineer`"), "{why}");
        assert!(why.contains("allowed: `aider`, `claude-code`"), "{why}");
        let why = choose(&AgentFacts {
            configured: &[],
            default: "",
            repository: Some("aider"),
            labels: &[],
            repository_may: &[],
        })
        .expect_err("refused");
        assert!(why.contains("none is configured"), "{why}");
    }

    #[test]
    fn two_writers_labels_for_different_agents_are_refused_and_a_repeat_is_one() {
        let configured = names();
        let labels = [
            label("aider", "alice", true),
            label("claude-code", "bob", true),
        ];
        let why = choose(&AgentFacts {
            configured: &configured,
            default: "",
            repository: None,
            labels: &labels,
            repository_may: &[],
        })
        .expect_err("refused");
        assert!(why.contains("more than one agent label"), "{why}");
        let labels = [label("aider", "alice", true), label("aider", "bob", true)];
        let chosen = choose(&AgentFacts {
            configured: &configured,
            default: "",
            repository: None,
            labels: &labels,
            repository_may: &[],
        });
        assert_eq!(chosen.expect("allowed").expect("an agent").name, "aider");
    }

    #[test]
    fn the_repository_then_the_operator_then_none() {
        let configured = names();
        let facts = |repository| AgentFacts {
            configured: &configured,
            default: "claude-code",
            repository,
            labels: &[],
            repository_may: &[],
        };
        let chosen = choose(&facts(Some("aider")))
            .expect("allowed")
            .expect("an agent");
        assert_eq!(chosen.source, AgentSource::Repository);
        let chosen = choose(&facts(None)).expect("allowed").expect("an agent");
        assert_eq!(chosen.source, AgentSource::Operator);
        let none = choose(&AgentFacts {
            configured: &configured,
            default: "",
            repository: None,
            labels: &[],
            repository_may: &[],
        });
        assert_eq!(none, Ok(None));
    }

    #[test]
    fn a_writers_label_names_only_an_agent_the_repository_may_use() {
        let configured = names();
        let may = ["aider".to_owned()];
        let facts = |labels| AgentFacts {
            configured: &configured,
            default: "claude-code",
            repository: None,
            labels,
            repository_may: &may,
        };
        let refused = [label("claude-code", "alice", true)];
        let why = choose(&facts(&refused)).expect_err("refused");
        assert!(
            why.contains("`agent:claude-code`") && why.contains("repo_settings.agents: `aider`"),
            "{why}"
        );
        let allowed = [label("aider", "alice", true)];
        let chosen = choose(&facts(&allowed));
        assert_eq!(chosen.expect("allowed").expect("an agent").name, "aider");
        // The operator's own default is not held to the list.
        let chosen = choose(&facts(&[])).expect("allowed").expect("an agent");
        assert_eq!(chosen.source, AgentSource::Operator);
    }

    #[test]
    fn a_label_names_an_agent_only_under_its_prefix() {
        assert_eq!(label_name("agent:", "agent:aider"), Some("aider"));
        assert_eq!(label_name("agent:", "headless"), None);
        assert_eq!(label_name("", "agent:aider"), None);
    }
}
