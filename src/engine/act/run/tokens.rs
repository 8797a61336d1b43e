//! Run tokens by name: `director-run-<run id>-<director id>`, so that every director finds
//! its own after a crash, and the sweep that deletes those no active run holds.

use std::collections::HashSet;

use super::TOKEN_PREFIX;
use crate::domain::RunId;
use crate::forge::{ForgeError, RunnerAccount};
use crate::store::Store;

/// The name of a run's token: `director-run-<run id>-<director id>`. The director id tells
/// which director minted it, so two sharing one runner account leave each other's alone.
pub fn token_name(director_id: &str, run_id: &RunId) -> String {
    format!("{TOKEN_PREFIX}{run_id}-{director_id}")
}

/// (run id, director id) of a run token's name; the director id is `None` in names from
/// before directors named themselves (`director-run-<run id>`). A name whose run id is not
/// one is no run token of a director's.
pub(super) fn parse_token_name(name: &str) -> Option<(RunId, Option<&str>)> {
    let rest = name.strip_prefix(TOKEN_PREFIX)?;
    let (run, director) = match rest.split_once('-') {
        Some((run, director)) => (run, Some(director)),
        None => (rest, None),
    };
    Some((RunId::parse(run).ok()?, director))
}

/// Deletes the runner's run tokens that this director minted and that belong to no active
/// run: those named with `director_id`, and old-style names of runs this database knows.
/// Another director's tokens are never touched.
pub async fn sweep_tokens(
    forge: &dyn crate::forge::Forge,
    store: &Store,
    runner: &RunnerAccount,
    director_id: &str,
) -> anyhow::Result<()> {
    let active: HashSet<RunId> = store
        .active_runs()
        .await?
        .into_iter()
        .map(|r| r.id)
        .collect();
    for (_, name) in forge.runner_tokens(runner).await? {
        let Some((run_id, minted_by)) = parse_token_name(&name) else {
            continue;
        };
        let ours = match minted_by {
            Some(id) => id == director_id,
            None => store.run(&run_id).await?.is_some(),
        };
        if ours && !active.contains(&run_id) {
            tracing::info!(token = %name, "deleting a run token left behind");
            match forge.delete_run_token(runner, &name).await {
                Ok(()) => {}
                Err(ForgeError::TokenNotHeld { name }) => {
                    tracing::warn!(token = %name, "a run token left behind cannot be revoked here");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
