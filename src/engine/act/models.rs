//! What the model gateway asks of the director: whether a run is active and its repository,
//! what was spent against each budget, where metered usage goes, and how a run refused for
//! its budget is stopped. All of it is in the store every replica shares, so any replica's
//! gateway can serve any run, and counting holds across restarts.

use std::collections::BTreeMap;

use crate::clock::SharedClock;
use crate::domain::{RepoName, RunId};
use crate::models::{ActiveRun, Metered, Provider, Runs, Spent};
use crate::settings::Settings;
use crate::store::Store;

pub struct ModelRuns {
    pub store: Store,
    pub clock: SharedClock,
    /// The providers each agent profile that names some may call (`agents.<name>.providers`).
    pub providers: BTreeMap<String, Vec<Provider>>,
}

/// `agents.<name>.providers` of every profile that names some (validated at start).
pub fn agent_providers(settings: &Settings) -> BTreeMap<String, Vec<Provider>> {
    settings
        .agents
        .iter()
        .filter(|(_, a)| !a.providers.is_empty())
        .map(|(name, a)| {
            let providers = a
                .providers
                .iter()
                .filter_map(|p| Provider::parse(p))
                .collect();
            (name.clone(), providers)
        })
        .collect()
}

#[async_trait::async_trait]
impl Runs for ModelRuns {
    async fn active(&self, run_id: &RunId) -> Result<Option<ActiveRun>, String> {
        let run = self
            .store
            .run(run_id)
            .await
            .map_err(|e| format!("the store: {e:#}"))?;
        Ok(run
            .filter(|r| r.finished_at_ms.is_none())
            .map(|r| ActiveRun {
                run_usd: r.settings.and_then(|s| s.run_usd),
                continued_usd: r.continued.as_ref().map(|c| c.usd),
                providers: r.agent.as_ref().and_then(|a| {
                    let providers = self.providers.get(&a.name)?;
                    Some((a.name.clone(), providers.clone()))
                }),
                repo: r.repo,
            }))
    }

    async fn spent(&self, run_id: &RunId, repo: &RepoName, day: &str) -> Result<Spent, String> {
        self.store
            .model_spent(Some(run_id), repo, day)
            .await
            .map_err(|e| format!("the store: {e:#}"))
    }

    async fn record(&self, metered: &Metered) -> Result<(), String> {
        self.store
            .record_model_usage(metered)
            .await
            .map_err(|e| format!("the store: {e:#}"))
    }

    async fn over_budget(&self, run_id: &RunId, why: &str) {
        if let Err(e) = self
            .store
            .request_budget_stop(run_id, why, self.clock.now_ms())
            .await
        {
            tracing::error!(error = %format!("{e:#}"), %run_id, "a budget stop could not be recorded");
        }
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}
