//! One function per [`Action`]: each performs its effect, safe to repeat, and returns the
//! outcome as an [`Event`] (or nothing to report). Before creating anything on the forge it
//! looks for what an earlier attempt may already have created. Nothing here chooses a state.

mod forge;
pub mod git_gateway;
pub mod lane;
pub mod models;
pub mod preflight;
mod pull;
pub mod run;
pub mod seal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::clock::SharedClock;
use crate::domain::IssueRef;
use crate::domain::RepoName;
use crate::engine::action::Action;
use crate::event::Event;
use crate::forge::{Forge, ForgeError, Permission};
use crate::settings::LabelSettings;
use crate::store::Store;

pub use preflight::PreflightAct;
pub use run::RunAct;

/// Everything the executors need.
pub struct Acts {
    pub store: Store,
    pub forge: Arc<dyn Forge>,
    pub labels: LabelSettings,
    /// The bot's login, once the forge said it.
    pub bot: crate::forge::BotLogin,
    pub clock: SharedClock,
    /// The pre-flight, when enabled.
    pub preflight: Option<PreflightAct>,
    /// Coder runs, when a runtime is configured.
    pub runs: Option<RunAct>,
    /// The merge lane (`[merge]`).
    pub lane: lane::Lane,
    /// Permissions asked in the last few seconds: one writer labelling many issues at once
    /// costs one call, and a change of role counts within [`PERMISSION_TTL_MS`].
    pub permissions: PermissionCache,
}

/// How long an answer about someone's role is reused.
pub const PERMISSION_TTL_MS: i64 = 5_000;

/// One answer per (repository, user) at a time: callers asking at once share one call.
type Answer = Arc<tokio::sync::OnceCell<Permission>>;

#[derive(Default)]
pub struct PermissionCache(Mutex<HashMap<(RepoName, String), (Answer, i64)>>);

impl Acts {
    /// `user`'s role on `repo`, from the cache while fresh.
    pub async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, ForgeError> {
        let now = self.clock.now_ms();
        let key = (repo.clone(), user.to_owned());
        let answer = {
            let mut cache = self
                .permissions
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            cache.retain(|_, (_, at)| now - *at < PERMISSION_TTL_MS);
            cache
                .entry(key)
                .or_insert_with(|| (Answer::default(), now))
                .0
                .clone()
        };
        answer
            .get_or_try_init(|| self.forge.permission(repo, user))
            .await
            .copied()
    }

    pub fn bot(&self) -> Option<String> {
        self.bot.get()
    }

    /// Performs one action for `issue`.
    pub async fn perform(
        &self,
        issue: &IssueRef,
        action: &Action,
    ) -> anyhow::Result<Option<Event>> {
        match action {
            Action::ResolveTrigger => forge::resolve_trigger(self, issue).await,
            Action::AuthorizeCommand {
                command,
                actor,
                said,
            } => forge::authorize_command(self, issue, *command, actor, said.clone()).await,
            Action::PostNotice { marker, body } => {
                forge::post_once(self, issue, marker, body).await?;
                Ok(None)
            }
            Action::UpsertSticky { body } => {
                forge::upsert_sticky(self, issue, body).await?;
                Ok(None)
            }
            Action::FileRouted {
                rev,
                target,
                title,
                body,
                marker,
                sticky,
            } => forge::file_routed(self, *rev, target, title, body, marker, sticky).await,
            Action::SyncLabels => {
                forge::sync_labels(self, issue).await?;
                Ok(None)
            }
            Action::ReadPreflight {
                rev,
                handled_command_id,
            } => match &self.preflight {
                Some(p) => p.read(self, issue, *rev, *handled_command_id).await,
                None => anyhow::bail!("the pre-flight is not enabled"),
            },
            Action::ReportRun { run_id, body } => {
                let marker = crate::engine::comments::run_marker(run_id);
                forge::post_once(self, issue, &marker, body).await?;
                Ok(None)
            }
            Action::RevokeToken { run_id } => {
                let runs = self.runs()?;
                runs.revoke(self, run_id).await?;
                Ok(None)
            }
            Action::StartRun { run_id } => self.runs()?.start(self, issue, run_id).await,
            Action::StopRun { run_id } => {
                self.runs()?.stop(self, run_id).await?;
                Ok(None)
            }
            Action::JudgeRun { run_id } => self.runs()?.judge(self, run_id).await,
            Action::OpenPr {
                run_id,
                title,
                body,
            } => self.runs()?.open_pr(self, run_id, title, body).await,
            Action::RemoveContainer { run_id } => {
                self.runs()?.remove(run_id).await?;
                Ok(None)
            }
            Action::CommentOnPull { pr, marker, body } => {
                let pull = IssueRef::new(issue.repo.clone(), *pr);
                forge::post_once(self, &pull, marker, body).await?;
                Ok(None)
            }
            Action::ReadFeedback { pr, sender, source } => {
                pull::read_feedback(self, issue, *pr, sender, source).await
            }
            Action::ReadChecks { pr } => lane::read_checks(self, issue, *pr).await,
            Action::TryMerge { pr } => lane::try_merge(self, issue, *pr).await,
            Action::RetitlePull { run_id, pr, title } => {
                self.forge
                    .edit_pull_title(&issue.repo, *pr, title)
                    .await
                    .map_err(|e| anyhow::anyhow!("retitling the pull request: {e}"))?;
                Ok(Some(crate::event::Event::Run {
                    run_id: run_id.clone(),
                    report: crate::event::RunReport::Readied { pr: *pr },
                }))
            }
            Action::RunChecks { run_id, checks } => {
                self.runs()?.run_checks(self, run_id, checks).await
            }
            Action::PostStatus {
                run_id,
                sha,
                state,
                description,
                target_url,
            } => {
                forge::post_checks_status(
                    self,
                    issue,
                    run_id,
                    sha,
                    *state,
                    description,
                    target_url,
                )
                .await?;
                Ok(Some(crate::event::Event::Run {
                    run_id: run_id.clone(),
                    report: crate::event::RunReport::StatusPosted { sha: sha.clone() },
                }))
            }
        }
    }

    fn runs(&self) -> anyhow::Result<&RunAct> {
        self.runs
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no container runtime is configured"))
    }
}
