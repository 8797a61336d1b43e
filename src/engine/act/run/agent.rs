//! The agent a run gets: the facts gathered from the forge (the issue's agent labels, who
//! applied each and whether they may write), decided by [`crate::domain::agent::choose`],
//! and the chosen profile applied to the run's container.

use anyhow::Context;

use super::super::Acts;
use super::RunAct;
use crate::domain::IssueRef;
use crate::domain::agent::{self, AgentChoice, AgentFacts, AgentLabel};
use crate::settings::agents::AgentSettings;

impl RunAct {
    /// The agent `issue`'s run gets now, given its `labels` and the repository's own choice
    /// (`repository`, already held to the operator's ceiling); `Err(why)`: no run can start
    /// as asked. The timeline is read only when the issue carries an agent label.
    pub async fn choose_agent(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        labels: &[String],
        repository: Option<&str>,
    ) -> anyhow::Result<Result<Option<AgentChoice>, String>> {
        let prefix = acts.labels.agent_prefix.as_str();
        let named: Vec<(&String, &str)> = labels
            .iter()
            .filter_map(|l| agent::label_name(prefix, l).map(|n| (l, n)))
            .collect();
        let mut found = Vec::new();
        if !named.is_empty() {
            let timeline = acts
                .forge
                .timeline(issue)
                .await
                .context("reading who applied the agent label")?;
            for (label, name) in named {
                let by = super::super::forge::last_added(&timeline, label).map(|t| t.actor.clone());
                let trusted = match &by {
                    Some(actor) => acts
                        .permission(&issue.repo, actor)
                        .await
                        .context("checking the agent label's author")?
                        .can_write(),
                    None => false,
                };
                if !trusted {
                    tracing::info!(
                        label = %label,
                        actor = by.as_deref().unwrap_or(""),
                        "an agent label applied by an account without write access is ignored"
                    );
                }
                found.push(AgentLabel {
                    label: label.clone(),
                    name: name.to_owned(),
                    by,
                    trusted,
                });
            }
        }
        let configured: Vec<String> = self.agents.keys().cloned().collect();
        Ok(agent::choose(&AgentFacts {
            configured: &configured,
            default: self.settings.agent.trim(),
            repository,
            labels: &found,
            repository_may: &self.repo.ceiling.agents,
        }))
    }

    /// The profile of the agent a run was given.
    pub(super) fn profile(&self, chosen: Option<&AgentChoice>) -> Option<&AgentSettings> {
        chosen.and_then(|c| self.agents.get(&c.name))
    }
}

/// The variables a profile adds to its run: its own, its name, its turn limit.
pub(super) fn profile_environment(
    chosen: &AgentChoice,
    profile: &AgentSettings,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = profile
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("DIRECTOR_AGENT".to_owned(), chosen.name.clone()));
    if let Some(turns) = profile.max_turns {
        env.push(("DIRECTOR_MAX_TURNS".to_owned(), turns.to_string()));
    }
    env
}
