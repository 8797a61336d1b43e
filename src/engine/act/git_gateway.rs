//! What the git gateway asks of the director: an active run's repository, branch and forge
//! token. The token is kept in the database sealed, so the gateway of any replica, or of a
//! director restarted while the run goes on, can forward the run's git with it; the key
//! comes from a credential in the configuration, never from the database. A token that
//! expires (GitHub's installation tokens, after an hour) is renewed before it does, so a
//! run may last longer than its first token.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::seal::Seal;
use crate::clock::SharedClock;
use crate::domain::RunId;
use crate::forge::{Forge, RunnerAccount};
use crate::git_gateway::{RunAccess, Runs};
use crate::settings::Secret;
use crate::store::Store;

/// How long before a run token's expiry the gateway replaces it.
const RENEW_BEFORE_MS: i64 = 10 * 60 * 1000;

/// The gateway's view of runs: the store, the tokens this process holds, the forge's git
/// address, and what renews a token that expires.
pub struct GatewayRuns {
    pub store: Store,
    pub forge: Arc<dyn Forge>,
    pub runner: RunnerAccount,
    pub seal: Seal,
    pub clock: SharedClock,
    /// Names this director in the tokens it mints.
    pub director_id: String,
}

impl GatewayRuns {
    /// The run's token, replaced by a fresh one when it is about to expire (GitHub's live an
    /// hour; a run may live longer). One replica renews it; one that loses the race revokes
    /// what it minted and takes the winner's.
    async fn current_token(
        &self,
        run: &crate::domain::RunRecord,
        lifetime_secs: Option<u64>,
    ) -> Result<Secret, String> {
        let store_err = |e: anyhow::Error| format!("the store: {e:#}");
        let (sealed, minted_at) = self
            .store
            .run_token(&run.id)
            .await
            .map_err(store_err)?
            .ok_or_else(|| "no token is kept for the run".to_owned())?;
        let token = self
            .seal
            .open(&run.id, &sealed)
            .ok_or_else(|| "the run's kept token does not open".to_owned())?;
        let now = self.clock.now_ms();
        let due = lifetime_secs.is_some_and(|life| {
            let life_ms = i64::try_from(life.saturating_mul(1000)).unwrap_or(i64::MAX);
            now.saturating_sub(minted_at) >= life_ms.saturating_sub(RENEW_BEFORE_MS)
        });
        if !due {
            return Ok(token);
        }
        let name = super::run::token_name(&self.director_id, &run.id);
        let minted = self
            .forge
            .mint_run_token(&self.runner, run.branch_repo(), &name)
            .await
            .map_err(|e| format!("renewing the run's token: {e}"))?;
        let fresh = minted.token;
        if minted.repositories.as_deref() != Some(std::slice::from_ref(run.branch_repo())) {
            // As at the run's start: a token for more than its repository is never used.
            self.forge.hold_run_token(&name, &fresh);
            revoke_in_background(
                self.forge.clone(),
                self.runner.clone(),
                name,
                run.id.to_string(),
            );
            return Err("the renewed token is not restricted to the run's repository".into());
        }
        let kept = self
            .store
            .renew_run_token(&run.id, &self.seal.seal(&run.id, &fresh), now, minted_at)
            .await
            .map_err(store_err)?;
        // Whichever of the two is not kept is revoked now, not left to expire; the one kept
        // is read from the store when the run ends.
        let surplus = if kept { token } else { fresh.clone() };
        self.forge.hold_run_token(&name, &surplus);
        if let Err(e) = self.forge.delete_run_token(&self.runner, &name).await {
            tracing::warn!(run_id = %run.id, error = %e, "a surplus run token could not be revoked");
        }
        if !kept {
            // Another replica renewed it first: use what it kept.
            return Box::pin(self.current_token(run, None)).await;
        }
        tracing::info!(run_id = %run.id, "the run's token was renewed before it expired");
        Ok(fresh)
    }
}

/// Deletes a token that must not live (over-broad), trying again with back-off while the
/// forge fails; one that outlasts every try is logged as an error, for a person to revoke.
fn revoke_in_background(
    forge: Arc<dyn Forge>,
    runner: RunnerAccount,
    name: String,
    run_id: String,
) {
    tokio::spawn(async move {
        let mut wait = std::time::Duration::from_secs(1);
        for attempt in 1..=5 {
            match forge.delete_run_token(&runner, &name).await {
                Ok(()) => return,
                Err(e) if attempt == 5 => {
                    tracing::error!(run_id, token = %name, error = %e, "a renewed run token that is not restricted to the run's repository could not be revoked: revoke it on the forge");
                }
                Err(e) => {
                    tracing::warn!(run_id, token = %name, attempt, error = %e, "an over-broad run token could not be revoked yet");
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
            }
        }
    });
}

#[async_trait::async_trait]
impl Runs for GatewayRuns {
    async fn access(&self, run_id: &RunId) -> Result<Option<RunAccess>, String> {
        let run = self
            .store
            .run(run_id)
            .await
            .map_err(|e| format!("the store: {e:#}"))?;
        let Some(run) = run.filter(|r| r.finished_at_ms.is_none()) else {
            return Ok(None);
        };
        // A run in a fork fetches from and pushes to the fork, under the repository's name.
        let endpoints = self.forge.run_endpoints(run.branch_repo(), &self.runner);
        let token = self
            .current_token(&run, endpoints.token_lifetime_secs)
            .await?;
        Ok(Some(RunAccess {
            repo: run.repo.clone(),
            home: run.branch_repo().clone(),
            branch: run.branch.clone(),
            base_branch: run.base_branch.clone(),
            follow_up: run.followup.is_some(),
            base_commit: run.base_commit.clone(),
            setup_open: run.setup_open(),
            checks_open: run.checks_open(),
            upstream: endpoints.clone_url,
            origin: endpoints.git_origin,
            user: endpoints.git_user,
            token,
        }))
    }

    async fn add_refusals(&self, refusals: &BTreeMap<(RunId, String), u32>) {
        if let Err(e) = self.store.add_egress_refusals(refusals).await {
            tracing::warn!(error = %format!("{e:#}"), "a refused push could not be recorded");
        }
    }
}
