//! Actions on coder runs: start (mint the run's token, check PR-only, create and start the
//! container, or adopt the one an earlier attempt started), stop, judge the branch, open the
//! pull request, remove the container, revoke the token. And the startup sweeps.

use std::sync::Arc;

use anyhow::Context;

use super::Acts;
use crate::domain::{IssueRecord, IssueRef, RunId, RunRecord, RunSettings, RunState};
use crate::event::{Event, RunReport};
use crate::forge::{ForgeError, RunEndpoints, RunnerAccount};
use crate::runtime::{Runtime, RuntimeError};
use crate::settings::{RunnerSettings, Secret};

mod agent;
mod checks;
pub use checks::checks_id;
mod home;
pub use home::unfit_fork;
mod repo;
mod secrets;
mod setup;
pub use setup::{PREPARED_VAR, key_extra, snapshot_key};
mod spec;
mod start;
mod task;
mod tokens;
pub use repo::{Unusable, read_repo_settings};
pub use secrets::Secrets;
pub use spec::RunEgress;
pub use task::{followup_text, instructions_text, plan_text, questions_text, task_text};
pub use tokens::{sweep_tokens, token_name};

/// The text a run is given, and whether it still matches the verdict.
struct TrustedText {
    stale: bool,
    title: String,
    body: String,
    /// The thread's answers to the pre-flight's questions, as the verdict read them.
    answers: Vec<crate::preflight::prompt::PromptComment>,
}

/// Where the task file lands inside the container.
pub const TASK_PATH: &str = "/task/task.md";
pub use crate::runtime::RESULT_PATH;
const TOKEN_PREFIX: &str = "director-run-";
/// The variable a confined run's git credential helper reads its gateway password from.
pub const GATEWAY_PASSWORD_VAR: &str = "DIRECTOR_GIT_PASSWORD";

/// The variables that hold a run's model-gateway key: redacted from what the run prints,
/// also when the run is adopted after a restart.
pub const MODEL_KEY_VARS: [&str; 2] = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"];

pub struct RunAct {
    pub runtime: Arc<dyn Runtime>,
    pub runner: RunnerAccount,
    /// Seals the run's token for the database.
    pub seal: super::seal::Seal,
    pub settings: RunnerSettings,
    /// Host paths for `runner.mounts` (translated once at start).
    pub mounts: Vec<(String, String, bool)>,
    pub secrets: Arc<Secrets>,
    /// Names this director in the tokens it mints.
    pub director_id: String,
    /// With `runner.egress = "allowlist"`: the egress proxy runs reach the outside through,
    /// or why it could not be had (then no run starts: never with open egress by accident).
    pub egress: Option<Result<RunEgress, String>>,
    /// What a repository's `.director.toml` may set (`[repo_settings]`), and the operator's
    /// own values it may only lower.
    pub repo: crate::settings::repo::Operator,
    /// The agents runs may be given (`[agents]`).
    pub agents: std::collections::BTreeMap<String, crate::settings::agents::AgentSettings>,
    /// What repositories' setup phases may be given (`[setup_secrets]`).
    pub setup_secrets: std::collections::BTreeMap<String, crate::settings::setup::SetupSecret>,
}

/// What an earlier attempt at starting a run left behind.
enum Earlier {
    /// The run was cancelled before it started: nothing more is done for it.
    Cancelled,
    /// A container for the run, started or not.
    Container { id: String, never_started: bool },
    /// Nothing usable: start afresh.
    Nothing,
}

impl RunAct {
    async fn run_record(acts: &Acts, run_id: &RunId) -> anyhow::Result<RunRecord> {
        acts.store
            .run(run_id)
            .await?
            .with_context(|| format!("run {run_id} is not recorded"))
    }

    async fn find_container(&self, run_id: &RunId) -> Result<Option<(String, bool)>, RuntimeError> {
        Ok(self
            .runtime
            .list_runs()
            .await?
            .into_iter()
            .find(|c| &c.run_id == run_id)
            .map(|c| (c.id, c.never_started)))
    }

    /// Starts the run, once. A container that an earlier attempt created is adopted (and
    /// started, if that attempt died before starting it): one container per run id, ever.
    pub async fn start(
        &self,
        acts: &Acts,
        issue_ref: &IssueRef,
        run_id: &RunId,
    ) -> anyhow::Result<Option<Event>> {
        let run = Self::run_record(acts, run_id).await?;
        if run.state != RunState::Launching {
            return Ok(None);
        }
        let report = match self.earlier_attempt(&run, run_id).await? {
            Earlier::Cancelled => RunReport::Refused {
                why: "it was cancelled before it started".into(),
            },
            Earlier::Container { id, never_started } => {
                self.adopt(acts, &run, id, never_started).await?
            }
            Earlier::Nothing => self.start_afresh(acts, issue_ref, run, run_id).await?,
        };
        Ok(Some(Event::Run {
            run_id: run_id.clone(),
            report,
        }))
    }

    /// What an earlier attempt at starting the run left: a container to adopt, or nothing
    /// usable. A run cancelled before it started gets nothing more, and a container an
    /// earlier attempt created for it is removed, never started.
    async fn earlier_attempt(&self, run: &RunRecord, run_id: &RunId) -> anyhow::Result<Earlier> {
        let found = self.find_container(run_id).await?;
        if run.stop_requested
            && found
                .as_ref()
                .is_none_or(|(_, never_started)| *never_started)
        {
            if let Some((id, _)) = &found {
                self.runtime.remove(id).await?;
            }
            return Ok(Earlier::Cancelled);
        }
        match found {
            Some((id, true)) if !self.runtime.has_task(&id, TASK_PATH).await? => {
                // An earlier attempt created the container but could not put its task in (nor
                // remove it): it is removed and made again, with a new token.
                tracing::warn!(container = %id, "an earlier attempt's container has no task; making it again");
                self.runtime.remove(&id).await?;
                Ok(Earlier::Nothing)
            }
            Some((id, never_started)) => Ok(Earlier::Container { id, never_started }),
            None => Ok(Earlier::Nothing),
        }
    }

    /// Takes over the container an earlier attempt created. That attempt got this far: the
    /// PR-only check passed before the container was created, and the token it holds stays
    /// alive while the run is active.
    async fn adopt(
        &self,
        acts: &Acts,
        run: &RunRecord,
        id: String,
        never_started: bool,
    ) -> anyhow::Result<RunReport> {
        if never_started {
            tracing::info!(container = %id, "starting the run's container an earlier attempt created");
            if let Some(why) = self.start_container(&id, &run.id).await? {
                return Ok(RunReport::Refused { why });
            }
        } else {
            tracing::info!(container = %id, "adopting the run's container");
        }
        let base = self.base_branch(acts, run).await?;
        // A follow-up's start head was given to it: read it back, not from the branch,
        // which the run may have moved already.
        let start_head = match run.followup {
            Some(_) => self
                .runtime
                .env(&id)
                .await?
                .into_iter()
                .find(|(k, _)| k == "DIRECTOR_START_HEAD")
                .map(|(_, v)| v)
                .filter(|v| !v.is_empty()),
            None => None,
        };
        Ok(RunReport::Started {
            container_id: id,
            base_branch: base,
            start_head,
        })
    }

    /// Starts the created container. An image that cannot run its command at all (no such
    /// program, no shell for its script) is no failure to retry: the container is removed and
    /// `Some(why)` says what the run contract needs.
    async fn start_container(&self, id: &str, run_id: &RunId) -> anyhow::Result<Option<String>> {
        match self.runtime.start(id).await {
            Ok(()) => Ok(None),
            Err(RuntimeError::CannotExec(what)) => {
                tracing::warn!(container = %id, run = %run_id, error = %what, "the run's image cannot start its command");
                self.runtime.remove(id).await?;
                Ok(Some(format!(
                    "its image cannot start its command ({what}); {}",
                    crate::runtime::IMAGE_NEEDS
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What the repository's `.director.toml` gives the run, read at the default branch's
    /// head now (never from the run's branch or a pull request), with the branch its
    /// template names: `Ok(None)` when repositories may set nothing (the file is not read),
    /// `Err(why)` when the file cannot be used (the run is refused, and the issue told why).
    async fn repo_settings(
        &self,
        acts: &Acts,
        run: &RunRecord,
        title: &str,
    ) -> anyhow::Result<Result<Option<(String, RunSettings)>, String>> {
        if !self.repo.ceiling.enabled() {
            return Ok(Ok(None));
        }
        let settings =
            match read_repo_settings(acts.forge.as_ref(), &self.repo, &run.repo, &run.base_branch)
                .await?
            {
                Ok(settings) => settings,
                // Written by whoever can push to the default branch, and echoed in the
                // issue: made inert (no mention, no command, no HTML) and cut.
                Err(problems) => {
                    let why = crate::domain::run::agent_text(&problems.describe(), 4_000)
                        .unwrap_or_default();
                    return Ok(Err(why));
                }
            };
        // A follow-up pushes to its pull request's branch, whatever the template says now.
        // So does a continued run, to the branch of the run it continues.
        let branch = match (&settings.branch_template, &run.followup) {
            (Some(template), None) if run.continued.is_none() => {
                crate::domain::run::branch_name(template, run.number, run.id.short(), title)
            }
            _ => run.branch.clone(),
        };
        if branch == run.base_branch {
            return Ok(Err(format!(
                "the repository's branch template names the default branch `{branch}`"
            )));
        }
        tracing::info!(commit = %settings.commit, file = settings.file, "the repository's settings were read");
        Ok(Ok(Some((branch, settings))))
    }

    /// The run's token: one an earlier attempt minted is replaced (a token's value cannot be
    /// read back), and the forge's answer must show the restriction asked for (an older
    /// Forgejo ignores it). `Err(why)`: the run is refused.
    async fn run_token(
        &self,
        acts: &Acts,
        run: &RunRecord,
        run_id: &RunId,
        endpoints: &RunEndpoints,
    ) -> anyhow::Result<Result<Secret, String>> {
        let name = token_name(&self.director_id, run_id);
        match acts.forge.delete_run_token(&self.runner, &name).await {
            // Nothing minted by this process under the name: nothing to clear here.
            Ok(()) | Err(ForgeError::TokenNotHeld { .. }) => {}
            Err(e) => return Err(anyhow::Error::new(e).context("clearing an earlier run token")),
        }
        let home = run.branch_repo();
        let minted = match self.mint(acts, home, &name).await {
            Ok(minted) => minted,
            // The forge said no (a permission, the runner's password): no retry changes that,
            // and the issue is told at once, not after minutes of attempts.
            Err(e)
                if e.downcast_ref::<ForgeError>()
                    .is_some_and(ForgeError::is_refusal) =>
            {
                return Ok(Err(format!(
                    "the forge refused to mint the run's token: {e:#}"
                )));
            }
            Err(e) => return Err(e),
        };
        self.secrets.remember_token(run_id, &minted.token);
        // Kept sealed for the git gateway of any replica, and for this director after a
        // restart: the run itself never holds it.
        acts.store
            .put_run_token(
                run_id,
                &self.seal.seal(run_id, &minted.token),
                acts.clock.now_ms(),
            )
            .await?;
        let restricted = minted.repositories.as_deref() == Some(std::slice::from_ref(home));
        if restricted && minted.scopes == endpoints.token_scopes {
            return Ok(Ok(minted.token));
        }
        let repositories = minted
            .repositories
            .as_ref()
            .map_or("none".to_owned(), |list| {
                list.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            });
        let hint = if endpoints.runner_account {
            "; repository-restricted tokens need Forgejo 15 or later"
        } else {
            ""
        };
        Ok(Err(format!(
            "{} did not restrict the run token to {} with `{}` alone (it answered repositories: {repositories}; permissions: {}){hint}",
            endpoints.name,
            home,
            endpoints.token_scopes.join(", "),
            minted.scopes.join(", ")
        )))
    }

    /// Mints the run's token. A mint that got no answer (the connection closed, the answer
    /// was cut, the forge failed midway) may or may not have made the token; its name is
    /// known, so one that was made is deleted (its value cannot be read back) and the token
    /// minted again, once. A second failure is left to the action's retries.
    async fn mint(
        &self,
        acts: &Acts,
        repo: &crate::domain::RepoName,
        name: &str,
    ) -> anyhow::Result<crate::forge::MintedToken> {
        match acts.forge.mint_run_token(&self.runner, repo, name).await {
            Ok(minted) => Ok(minted),
            Err(e) if e.is_ambiguous() => {
                tracing::warn!(error = %e, "the run token's mint got no clear answer; looking for it by name");
                acts.forge
                    .delete_run_token(&self.runner, name)
                    .await
                    .context("removing the token an unanswered mint may have made")?;
                acts.forge
                    .mint_run_token(&self.runner, repo, name)
                    .await
                    .context("minting the run token again")
            }
            Err(e) => Err(anyhow::Error::new(e).context("minting the run token")),
        }
    }

    async fn base_branch(&self, acts: &Acts, run: &RunRecord) -> anyhow::Result<String> {
        if !run.base_branch.is_empty() {
            return Ok(run.base_branch.clone());
        }
        Ok(acts.forge.repository(&run.repo).await?.default_branch)
    }

    /// The trusted text as the pre-flight would read it now, and whether it still hashes as
    /// the verdict's: the verdict is bound to the text it read, checked again just before the
    /// launch. Without a pre-flight, the vouched text (else the current one).
    async fn trusted_text(&self, acts: &Acts, issue: &IssueRecord) -> anyhow::Result<TrustedText> {
        if let Some(p) = &acts.preflight {
            let g = p
                .gather(acts, &issue.issue_ref(), u64::MAX)
                .await
                .context("re-reading the issue before the launch")?;
            return Ok(TrustedText {
                stale: issue
                    .preflight
                    .hash
                    .as_ref()
                    .is_some_and(|h| *h != g.prompt.sha256),
                title: g.title,
                body: g.body,
                answers: g.answers,
            });
        }
        let (title, body) = match &issue.preflight.vouched {
            Some(v) => (v.title.clone(), v.body.clone()),
            None => {
                let current = acts.forge.issue(&issue.issue_ref()).await?;
                (current.title, current.body)
            }
        };
        Ok(TrustedText {
            stale: false,
            title,
            body,
            answers: Vec::new(),
        })
    }

    /// A cancel ends the run's ability to act at once: its token first (revoked at the forge,
    /// still remembered for redaction until the run's end is reported), then the run.
    pub async fn stop(&self, acts: &Acts, run_id: &RunId) -> anyhow::Result<()> {
        self.revoke_token(acts, run_id)
            .await
            .context("revoking the run's token before stopping it")?;
        if let Some((id, _)) = self.find_container(run_id).await? {
            tracing::info!(container = %id, "stopping the run");
            self.runtime.kill(&id).await?;
        }
        Ok(())
    }

    /// Commits the run's branch has that the base has not; for a follow-up, that the head it
    /// started from has not.
    pub async fn judge(&self, acts: &Acts, run_id: &RunId) -> anyhow::Result<Option<Event>> {
        let run = Self::run_record(acts, run_id).await?;
        let from = run
            .followup
            .as_ref()
            .and_then(|f| f.start_head.clone())
            .unwrap_or_else(|| run.base_branch.clone());
        let ahead = match self.home_branch(acts, &run, &run.branch).await? {
            Some(b) if b.commit == from => 0,
            Some(_) => match &run.home {
                Some(fork) => {
                    acts.forge
                        .fork_commits_ahead(&self.runner, fork, &from, &run.branch)
                        .await?
                }
                None => {
                    acts.forge
                        .commits_ahead(&run.repo, &from, &run.branch)
                        .await?
                }
            },
            None => 0,
        };
        Ok(Some(Event::Run {
            run_id: run_id.clone(),
            report: RunReport::Judged { ahead },
        }))
    }

    /// Branch `name` where the run's branch lives: in the runner's fork as the runner (the
    /// fork of a private repository is private, out of the bot's sight), else as the bot.
    pub(super) async fn home_branch(
        &self,
        acts: &Acts,
        run: &RunRecord,
        name: &str,
    ) -> Result<Option<crate::forge::Branch>, crate::forge::ForgeError> {
        match &run.home {
            Some(fork) => acts.forge.fork_branch(&self.runner, fork, name).await,
            None => acts.forge.branch(&run.repo, name).await,
        }
    }

    /// Opens the pull request, unless one from the branch is open (an earlier attempt's).
    pub async fn open_pr(
        &self,
        acts: &Acts,
        run_id: &RunId,
        title: &str,
        body: &str,
    ) -> anyhow::Result<Option<Event>> {
        let run = Self::run_record(acts, run_id).await?;
        // From a fork: `owner:branch` (Forgejo reads the fork of the repository that owner
        // holds, under the repository's name, as the director makes it), opened by the
        // runner: the poster is whom Forgejo's approval gate judges.
        let head = match &run.home {
            Some(fork) => format!("{}:{}", fork.owner(), run.branch),
            None => run.branch.clone(),
        };
        let number = match acts
            .forge
            .find_pull(&run.repo, &run.base_branch, &head)
            .await?
        {
            Some(n) => n,
            None => {
                let n = match &run.home {
                    Some(_) => {
                        acts.forge
                            .create_pull_as(
                                &self.runner,
                                &run.repo,
                                &head,
                                &run.base_branch,
                                title,
                                body,
                            )
                            .await?
                    }
                    None => {
                        acts.forge
                            .create_pull(&run.repo, &head, &run.base_branch, title, body)
                            .await?
                    }
                };
                crate::failpoint::hit("after_pr_opened").await;
                n
            }
        };
        Ok(Some(Event::Run {
            run_id: run_id.clone(),
            report: RunReport::PrOpened { number },
        }))
    }

    pub async fn remove(&self, run_id: &RunId) -> anyhow::Result<()> {
        for c in self.runtime.list_runs().await? {
            if &c.run_id == run_id {
                self.runtime.remove(&c.id).await?;
            }
        }
        Ok(())
    }

    /// The run's end: its token revoked, and its secrets forgotten (nothing of it is
    /// redacted any more after this).
    pub async fn revoke(&self, acts: &Acts, run_id: &RunId) -> anyhow::Result<()> {
        self.revoke_token(acts, run_id).await?;
        self.secrets.forget(run_id);
        Ok(())
    }

    async fn revoke_token(&self, acts: &Acts, run_id: &RunId) -> anyhow::Result<()> {
        let name = token_name(&self.director_id, run_id);
        // The sealed copy is the run's token as it is now (the gateway of any replica may
        // have renewed it); a run started before tokens were kept has only what this process
        // holds or read back from the run's environment.
        let kept = match acts
            .store
            .run_token(run_id)
            .await?
            .and_then(|(sealed, _)| self.seal.open(run_id, &sealed))
        {
            Some(token) => Some(token),
            None => self.secrets.token(run_id),
        };
        if let Some(token) = kept {
            acts.forge.hold_run_token(&name, &token);
        }
        match acts.forge.delete_run_token(&self.runner, &name).await {
            Ok(()) => {
                acts.store.drop_run_token(run_id).await?;
                Ok(())
            }
            Err(ForgeError::TokenNotHeld { name }) => {
                // Nothing here can revoke it (GitHub revokes a token only when shown it, and
                // this process never held it, or lost it with its container). A run that never
                // started may never have had one; one that started did: said, not hidden.
                let started = acts
                    .store
                    .run(run_id)
                    .await?
                    .is_some_and(|r| r.container_id.is_some());
                if started {
                    tracing::warn!(
                        token = %name,
                        "cannot revoke the run's token: this process does not hold it; GitHub expires it within the hour of its minting"
                    );
                } else {
                    tracing::debug!(token = %name, "no run token held to revoke");
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes this director's run tokens that belong to no active run.
    pub async fn sweep_tokens(&self, acts: &Acts) -> anyhow::Result<()> {
        sweep_tokens(
            acts.forge.as_ref(),
            &acts.store,
            &self.runner,
            &self.director_id,
        )
        .await
    }

    /// Removes containers of ended runs whose removal never happened (kept failures past
    /// `keep_failed_secs` included). Containers of runs this database does not know are left
    /// alone: another director may share the engine.
    pub async fn sweep_containers(&self, acts: &Acts) -> anyhow::Result<()> {
        let keep_ms =
            i64::try_from(self.settings.keep_failed_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let now = acts.clock.now_ms();
        for c in self.runtime.list_runs().await? {
            let remove = match acts.store.run(&c.run_id).await? {
                Some(run) => run.finished_at_ms.is_some_and(|f| now - f >= keep_ms),
                None => false,
            };
            if remove {
                tracing::info!(run_id = %c.run_id, "removing a finished run's container");
                self.runtime.remove(&c.id).await?;
            }
        }
        // A prepared workspace (and a setup container) left by a run that ended without its
        // agent's container removing it: a crash mid-setup, a cancel.
        for run_id in self.runtime.list_workspaces().await? {
            let ended = match acts.store.run(&run_id).await? {
                Some(run) => run.finished_at_ms.is_some_and(|f| now - f >= keep_ms),
                None => false,
            };
            if ended {
                tracing::info!(run_id = %run_id, "removing an ended run's workspace");
                self.runtime.remove_workspace(&run_id).await?;
            }
        }
        Ok(())
    }

    /// The task handed to the agent: the trusted title and body (hidden content stripped)
    /// and the pre-flight's read.
    async fn task(
        &self,
        acts: &Acts,
        run: &RunRecord,
        issue: &IssueRecord,
        title: &str,
        body: &str,
    ) -> anyhow::Result<String> {
        let read = match &issue.preflight.hash {
            Some(hash) => acts.store.cached_reading(hash).await?.map(|(r, _)| r),
            None => None,
        };
        let verdict = issue
            .preflight
            .verdict
            .map_or("none", crate::domain::Judgement::as_str);
        let mut task = task_text(run, title, body, verdict, read.as_deref());
        task.push_str(&plan_text(&issue.preflight.plan));
        if let Some(f) = &run.followup {
            task.push_str(&followup_text(f, &run.branch));
        }
        if let Some(c) = &run.continued {
            task.push_str(&task::continued_text(c));
        }
        if let Some(text) = run
            .settings
            .as_ref()
            .and_then(|s| s.instructions.as_deref())
        {
            task.push_str(&instructions_text(text));
        }
        Ok(task)
    }
}
