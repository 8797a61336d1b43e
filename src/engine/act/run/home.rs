//! Where a run's branch lives. With `runner.branch_home = "fork"` it is the runner's fork of
//! the repository (or `runner.fork_owner`'s), found or made once, its base branch brought up
//! to the repository's before the run starts; the pull request then comes from the fork, and
//! Forgejo holds its workflows until a maintainer approves them, without the repository's
//! secrets. A follow-up pushes wherever its pull request's head lives.

use anyhow::Context;

use super::{Acts, RunAct};
use crate::domain::{RepoName, RunRecord};
use crate::forge::{ForgeError, ForkSync};
use crate::settings::BranchHome;

/// Where a run's branch is to live, before anything is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Planned {
    /// The repository itself.
    Repository,
    /// The runner's fork, found or made at the start.
    NewFork,
    /// The fork its pull request's head lives in (a follow-up).
    PullFork(RepoName),
}

impl RunAct {
    /// Where the run's branch is to live: a first run where `runner.branch_home` says, a
    /// follow-up wherever its pull request's head lives.
    pub(super) async fn planned_home(
        &self,
        acts: &Acts,
        run: &RunRecord,
    ) -> anyhow::Result<Planned> {
        Ok(match &run.followup {
            Some(f) => match acts
                .forge
                .pull(&run.repo, f.pr)
                .await
                .context("reading the pull request the follow-up answers")?
                .fork(&run.repo)
            {
                Some(fork) => Planned::PullFork(fork.clone()),
                None => Planned::Repository,
            },
            // A continued run goes on in the home of the run it continues.
            None if run.continued.is_some() => {
                match run.continued.as_ref().and_then(|c| c.home.clone()) {
                    Some(fork) => Planned::PullFork(fork),
                    None => Planned::Repository,
                }
            }
            None if self.settings.branch_home == BranchHome::Repository => Planned::Repository,
            None => Planned::NewFork,
        })
    }

    /// The fork the run's branch is to live in (`Ok(None)`: the repository itself), made
    /// ready; `Err(why)`: the run is refused, saying why. A failure that may pass (the
    /// forge unreachable) is an error, and the start is tried again.
    pub(super) async fn branch_home(
        &self,
        acts: &Acts,
        run: &RunRecord,
        planned: Planned,
    ) -> anyhow::Result<Result<Option<RepoName>, String>> {
        let fork = match planned {
            Planned::Repository => None,
            Planned::PullFork(fork) => Some(fork),
            Planned::NewFork => match self.find_or_make_fork(acts, &run.repo).await? {
                Ok(fork) => Some(fork),
                Err(why) => return Ok(Err(why)),
            },
        };
        let Some(fork) = fork else {
            return Ok(Ok(None));
        };
        let problems = acts
            .forge
            .fork_problems(&self.runner, &fork)
            .await
            .context("checking the runner's fork")?;
        if !problems.is_empty() {
            return Ok(Err(unfit_fork(&fork, &problems)));
        }
        let synced = acts
            .forge
            .sync_fork(&self.runner, &fork, &run.base_branch)
            .await;
        let why = match synced {
            Ok(ForkSync::InStep | ForkSync::Synced) => return Ok(Ok(Some(fork))),
            Ok(ForkSync::Diverged) => format!(
                "the fork {fork} has commits on `{}` that {} lacks, so it is not used: bring its `{0}` back to the repository's (or delete the fork; the director makes it again)",
                run.base_branch, run.repo
            ),
            Err(e) if e.is_not_found() => format!(
                "the fork {fork} has no branch `{}` to bring up to {}'s",
                run.base_branch, run.repo
            ),
            Err(e) if e.is_refusal() => {
                format!(
                    "the forge refused to bring the fork {fork} up to {}: {e}",
                    run.repo
                )
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context("bringing the fork up to the repository"));
            }
        };
        Ok(Err(why))
    }

    /// The runner's fork of `repo`: the one under the repository's name whose parent is
    /// `repo`, else one made now. A fork made
    /// by an attempt that died before it heard the answer is found, never made twice; a
    /// repository of the fork's name that is no fork of `repo` is never used.
    async fn find_or_make_fork(
        &self,
        acts: &Acts,
        repo: &RepoName,
    ) -> anyhow::Result<Result<RepoName, String>> {
        let org = Some(self.settings.fork_owner.as_str()).filter(|o| !o.is_empty());
        let owner = org.unwrap_or(&self.runner.login);
        let listed = || acts.forge.fork_of(&self.runner, repo, owner);
        if let Some(fork) = listed().await.context("looking for the runner's fork")? {
            return Ok(Ok(fork));
        }
        let made = acts.forge.create_fork(&self.runner, repo, org).await;
        crate::failpoint::hit("after_fork_created").await;
        match made {
            Ok(fork) => {
                tracing::info!(%fork, "the runner's fork was made");
                Ok(Ok(fork))
            }
            // Refused or unanswered: a fork may exist all the same (made meanwhile, or
            // made by a request whose answer was lost). Only the forge's list says so.
            Err(e) => match listed()
                .await
                .context("looking for the runner's fork again")?
            {
                Some(fork) => Ok(Ok(fork)),
                // 409: the name is taken, and not by a fork of the repository.
                None if e.is_refusal() || matches!(e, ForgeError::Status { status: 409, .. }) => {
                    Ok(Err(refused_fork(repo, owner, &e)))
                }
                None => Err(anyhow::Error::new(e).context("making the runner's fork")),
            },
        }
    }
}

/// Why the runner's fork is not used: each thing wrong with it.
pub fn unfit_fork(fork: &RepoName, problems: &[String]) -> String {
    format!(
        "the fork {fork} is not used (runs push to it, and only the runner may write there, with Actions off): {}",
        problems.join("; ")
    )
}

/// Why no fork could be made, in the forge's words.
fn refused_fork(repo: &RepoName, owner: &str, e: &ForgeError) -> String {
    format!(
        "the fork of {repo} could not be made in `{owner}` (runner.branch_home = \"fork\"): {e}; a repository of that name that is not a fork of {repo} is never used"
    )
}
