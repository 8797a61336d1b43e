//! A run's first start. What the start learns, fact by fact, is recorded as it is learned
//! and handed to `decide::start_refusal`, which says whether the run may go on; then the
//! container is made with its task and started.

use anyhow::Context;

use super::{Acts, RunAct, TrustedText, home, questions_text};
use crate::domain::{CommitSha, IssueRecord, IssueRef, RunId, RunRecord};
use crate::engine::decide::{BranchSeen, RunnerRole, StartFacts, StartRefusal};
use crate::event::RunReport;
use crate::forge::{Branch, RunEndpoints};
use crate::runtime::RuntimeError;
use crate::settings::Secret;

/// The report for a start refused on what is known so far, if it is.
fn refused(facts: &StartFacts) -> Option<RunReport> {
    crate::engine::decide::start_refusal(facts).map(|r| match r {
        StartRefusal::Stale => {
            tracing::info!("the issue changed since the pre-flight; not starting");
            RunReport::Stale
        }
        StartRefusal::Refused(why) => RunReport::Refused { why },
    })
}

impl RunAct {
    /// A first start: the trusted text still as the verdict read it, the runner's role, a
    /// run token restricted as asked and unable to reach the default branch; then the
    /// container is created with its task and started.
    pub(super) async fn start_afresh(
        &self,
        acts: &Acts,
        issue_ref: &IssueRef,
        mut run: RunRecord,
        run_id: &RunId,
    ) -> anyhow::Result<RunReport> {
        let issue = acts
            .store
            .issue(issue_ref)
            .await?
            .context("the issue is no longer known")?;
        let mut facts = StartFacts {
            followup: run.followup.is_some(),
            ..StartFacts::default()
        };
        let trusted = self.trusted_text(acts, &issue).await?;
        facts.stale = Some(trusted.stale);
        run.base_branch = self.base_branch(acts, &run).await?;
        facts.egress = self
            .egress
            .as_ref()
            .map(|e| e.as_ref().map(|_| ()).map_err(Clone::clone));
        if let Some(report) = refused(&facts) {
            return Ok(report);
        }
        let settled = self
            .settings_and_agent(acts, &issue, &mut run, &trusted.title, &mut facts)
            .await?;
        if let Some(report) = settled {
            return Ok(report);
        }
        if let Some(report) = self.runner_and_home(acts, &mut run, &mut facts).await? {
            return Ok(report);
        }
        // A run in a fork clones from and pushes to the fork.
        let endpoints = acts.forge.run_endpoints(run.branch_repo(), &self.runner);
        let token = self.run_token(acts, &run, run_id, &endpoints).await?;
        facts.token = Some(token.as_ref().map(|_| ()).map_err(Clone::clone));
        if let Some(report) = refused(&facts) {
            return Ok(report);
        }
        let Ok(token) = token else {
            anyhow::bail!("a refused token was not refused");
        };
        let branch = match self
            .default_branch(acts, &run, &token, &endpoints, &mut facts)
            .await?
        {
            Ok(branch) => branch,
            Err(report) => return Ok(report),
        };
        // The commit a first run starts from: the git gateway takes only a branch that
        // descends from it (an older base would bring back older CI definitions).
        // A continued run keeps the base of the run it continues (its branch descends from it).
        let base = run.continued.as_ref().and_then(|c| c.base_commit.clone());
        if run.followup.is_none()
            && let Some(commit) =
                base.or_else(|| branch.as_ref().and_then(|b| CommitSha::read(&b.commit)))
        {
            acts.store.put_run_base(run_id, &commit).await?;
            run.base_commit = Some(commit);
        }
        self.launch(acts, run, &issue, &trusted, &token, &endpoints)
            .await
    }

    /// The repository's own settings, read before anything is minted or made (a file that
    /// cannot be used starts nothing, and one that cannot be read now is retried), then the
    /// run's agent; each recorded on the run.
    async fn settings_and_agent(
        &self,
        acts: &Acts,
        issue: &IssueRecord,
        run: &mut RunRecord,
        title: &str,
        facts: &mut StartFacts,
    ) -> anyhow::Result<Option<RunReport>> {
        let file = self.repo_settings(acts, run, title).await?;
        if let Ok(Some((branch, settings))) = &file {
            acts.store
                .put_run_settings(&run.id, branch, settings)
                .await?;
            run.branch = branch.clone();
            run.settings = Some(settings.clone());
        }
        facts.repo_file = Some(file.map(|_| ()));
        if let Some(report) = refused(facts) {
            return Ok(Some(report));
        }
        let repository_agent = run.settings.as_ref().and_then(|s| s.agent.as_deref());
        let agent = self
            .choose_agent(acts, &issue.issue_ref(), &issue.labels, repository_agent)
            .await?;
        if let Ok(Some(chosen)) = &agent {
            tracing::info!(agent = %chosen.name, "the run's agent was chosen");
            acts.store.put_run_agent(&run.id, chosen).await?;
            run.agent = Some(chosen.clone());
        }
        facts.agent = Some(agent.map(|_| ()));
        Ok(refused(facts))
    }

    /// The runner account's role first (a fork is made only for a runner that may have
    /// one), then where the run's branch lives, recorded on the run.
    async fn runner_and_home(
        &self,
        acts: &Acts,
        run: &mut RunRecord,
        facts: &mut StartFacts,
    ) -> anyhow::Result<Option<RunReport>> {
        let planned = self.planned_home(acts, run).await?;
        if acts
            .forge
            .run_endpoints(&run.repo, &self.runner)
            .runner_account
        {
            let role = acts
                .permission(&run.repo, &self.runner.login)
                .await
                .context("checking the runner account's permission")?;
            let fork = planned != home::Planned::Repository;
            // In fork mode the approval gate is what keeps the run's code from CI: it
            // reads the runner's access to the Actions unit, which a team can give alone.
            let actions = if fork && !role.can_write() {
                acts.forge
                    .runner_actions_access(&self.runner, &run.repo)
                    .await
                    .context("checking the runner account's access to Actions")?
            } else {
                crate::forge::Permission::None
            };
            facts.runner_role = Some(RunnerRole {
                login: self.runner.login.clone(),
                repo: run.repo.clone(),
                role,
                actions,
                fork,
                allow_writer: self.settings.allow_writer_runner,
            });
            if let Some(report) = refused(facts) {
                return Ok(Some(report));
            }
        }
        let home = self.branch_home(acts, run, planned).await?;
        if let Ok(Some(fork)) = &home {
            acts.store.put_run_home(&run.id, fork).await?;
            run.home = Some(fork.clone());
        }
        facts.home = Some(home.map(|_| ()));
        Ok(refused(facts))
    }

    /// The default branch the run starts from, as read. A run in the repository itself is
    /// checked PR-only first: its own token can neither push to nor merge into that branch
    /// (`Err` with the refusal when it can).
    async fn default_branch(
        &self,
        acts: &Acts,
        run: &RunRecord,
        token: &Secret,
        endpoints: &RunEndpoints,
        facts: &mut StartFacts,
    ) -> anyhow::Result<Result<Option<Branch>, RunReport>> {
        if run.home.is_some() {
            // The token reaches the fork alone (its restriction was checked): the
            // repository, its default branch included, is out of its reach.
            return Ok(Ok(acts
                .forge
                .branch(&run.repo, &run.base_branch)
                .await
                .context("reading the default branch")?));
        }
        let branch = acts
            .forge
            .branch_as(token, &run.repo, &run.base_branch)
            .await
            .context("checking the default branch with the run token")?;
        facts.default_branch = Some(BranchSeen {
            base: run.base_branch.clone(),
            can: branch.as_ref().map(|b| (b.user_can_push, b.user_can_merge)),
            allowed_unprotected: self.settings.allow_unprotected_default_branch,
            runner_account: endpoints.runner_account,
            runner_login: self.runner.login.clone(),
        });
        Ok(match refused(facts) {
            Some(report) => Err(report),
            None => Ok(branch),
        })
    }

    /// Makes the run's container with its task, and starts it. A follow-up is told the head
    /// its branch had when it started.
    async fn launch(
        &self,
        acts: &Acts,
        mut run: RunRecord,
        issue: &IssueRecord,
        trusted: &TrustedText,
        token: &Secret,
        endpoints: &RunEndpoints,
    ) -> anyhow::Result<RunReport> {
        if run.followup.is_some() {
            let head = self
                .home_branch(acts, &run, &run.branch)
                .await
                .context("reading the pull request's branch")?
                .map(|b| b.commit)
                .filter(|c| !c.is_empty());
            if let Some(f) = run.followup.as_mut() {
                f.start_head = head;
            }
        }
        let mut task = self
            .task(acts, &run, issue, &trusted.title, &trusted.body)
            .await?;
        task.push_str(&questions_text(
            &issue.preflight.questions,
            &trusted.answers,
        ));
        let mut spec = self.spec(&run, token, task, endpoints);
        if let Some(setup) = run.settings.as_ref().and_then(|s| s.setup.clone()) {
            if !self.runtime.prepares_workspaces() {
                return Ok(RunReport::SetupFailed {
                    why: super::setup::NOT_ON_THIS_RUNTIME.to_owned(),
                });
            }
            match self
                .prepare(acts, &run, &setup, &spec.image.clone())
                .await?
            {
                Ok(prepared) => {
                    // A cancel that came while the setup ran: no agent starts.
                    if acts
                        .store
                        .run(&run.id)
                        .await?
                        .is_some_and(|r| r.stop_requested)
                    {
                        let _ = self.runtime.remove_workspace(&run.id).await;
                        return Ok(RunReport::Refused {
                            why: "cancelled while its setup ran".into(),
                        });
                    }
                    spec.workspace_volume = Some(prepared.volume);
                    spec.env.push((
                        super::PREPARED_VAR.to_owned(),
                        prepared.outcome.mode.as_str().to_owned(),
                    ));
                }
                Err(super::setup::SetupFailed(why)) => return Ok(RunReport::SetupFailed { why }),
            }
        }
        let id = match self.runtime.create(&spec).await {
            Ok(id) => id,
            Err(RuntimeError::Exists(_)) => anyhow::bail!(
                "a container for this run appeared meanwhile; refusing to start a second"
            ),
            Err(e) => return Err(e.into()),
        };
        crate::failpoint::hit("after_container_created").await;
        if let Some(why) = self.start_container(&id, &run.id).await? {
            return Ok(RunReport::Refused { why });
        }
        crate::failpoint::hit(if run.followup.is_some() {
            "after_followup_started"
        } else {
            "after_container_started"
        })
        .await;
        tracing::info!(container = %id, "run started");
        Ok(RunReport::Started {
            container_id: id,
            base_branch: run.base_branch,
            start_head: run.followup.and_then(|f| f.start_head),
        })
    }
}
