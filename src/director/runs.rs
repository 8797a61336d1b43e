//! The run supervisor: turns queued issues into coder runs and sees each one through.
//!
//! Per run: a token of the runner account, restricted to the issue's repository with scope
//! `write:repository`, is minted for it alone; the director checks with that token that the
//! default branch is protected against it; the container (`director-run-<id>`: the engine
//! refuses a second one with that name) gets the task file and starts; when it exits (or is
//! killed at the timeout) the director checks through the API that the branch is ahead of the
//! base, opens the pull request, reports on the issue, revokes the token and removes the
//! container. At startup, containers of runs are adopted or finished, and stray tokens of
//! runs that are not live are deleted.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::director::comments;
use crate::domain::Lifecycle;
use crate::forge::payload::{EventKind, ForgeEvent, IssueSnapshot, RunTransition};
use crate::forge::{Forge, RunnerAccount};
use crate::runtime::{Exit, RunSpec, Runtime, RuntimeError, mounts};
use crate::settings::{RunnerSettings, Secret};
use crate::store::{IssueRecord, NewDelivery, RunRecord, Store};

/// Where the task file lands inside the container.
pub const TASK_PATH: &str = "/task/task.md";
const TOKEN_PREFIX: &str = "director-run-";

pub struct RunSupervisor {
    store: Store,
    forge: Arc<dyn Forge>,
    runtime: Arc<dyn Runtime>,
    runner: RunnerAccount,
    settings: RunnerSettings,
    forge_url: String,
    /// Checks the trusted text still hashes as the verdict's before a launch.
    gate: Option<Arc<crate::preflight::worker::PreflightWorker>>,
    consumer_wake: Arc<Notify>,
    /// Runs this process is watching (launching, or waiting for the container).
    watched: Mutex<HashSet<String>>,
    /// Host paths for `runner.mounts` (translated once at start).
    mounts: Vec<(String, String, bool)>,
    /// The director's own environment, for `runner.env_passthrough`.
    passthrough: Vec<(String, String)>,
    /// Values to redact from logs: every secret given to runs.
    secrets: RwLock<HashMap<String, Vec<String>>>,
}

/// What a run ended as.
enum Outcome {
    Succeeded { pr: u64 },
    Failed { why: String, log: String },
    TimedOut { log: String },
    Cancelled,
    Refused { why: String },
}

impl RunSupervisor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        forge: Arc<dyn Forge>,
        runtime: Arc<dyn Runtime>,
        runner: RunnerAccount,
        settings: RunnerSettings,
        forge_url: String,
        gate: Option<Arc<crate::preflight::worker::PreflightWorker>>,
        consumer_wake: Arc<Notify>,
        mounts: Vec<(String, String, bool)>,
    ) -> Self {
        let passthrough = settings
            .env_passthrough
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect();
        Self {
            store,
            forge,
            runtime,
            runner,
            settings,
            forge_url,
            gate,
            consumer_wake,
            watched: Mutex::default(),
            mounts,
            passthrough,
            secrets: RwLock::default(),
        }
    }

    /// `runner.mounts` with sources translated to host paths when the director itself runs
    /// in a container (found through `/proc/self/mountinfo` and an inspect of itself).
    pub async fn translated_mounts(
        settings: &RunnerSettings,
        docker: Option<&bollard::Docker>,
    ) -> Vec<(String, String, bool)> {
        let parsed: Vec<_> = settings
            .mounts
            .iter()
            .filter_map(|m| mounts::parse(m))
            .collect();
        let own_id = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|i| mounts::own_container_id(&i));
        let (Some(id), Some(docker)) = (own_id, docker) else {
            return parsed;
        };
        let own: Vec<mounts::OwnMount> = match docker.inspect_container(&id, None).await {
            Ok(c) => c
                .mounts
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| {
                    let is_volume = m.name.is_some()
                        && m.typ
                            .as_ref()
                            .is_some_and(|t| format!("{t:?}").to_lowercase().contains("volume"));
                    Some(mounts::OwnMount {
                        destination: m.destination?,
                        source: if is_volume { m.name? } else { m.source? },
                        is_volume,
                    })
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot inspect the director's own container; mounts passed as given");
                return parsed;
            }
        };
        parsed
            .into_iter()
            .map(|(source, target, ro)| (mounts::translate(&source, &own).0, target, ro))
            .collect()
    }

    /// Adopts or finishes what a previous process left, deletes stray tokens, then admits
    /// and watches runs until `shutdown`.
    pub async fn run(self: Arc<Self>, wake: Arc<Notify>, shutdown: CancellationToken) {
        if let Err(error) = self.sweep_tokens().await {
            tracing::warn!(error = %format!("{error:#}"), "could not sweep stray run tokens");
        }
        if let Err(error) = self.sweep_containers().await {
            tracing::warn!(error = %format!("{error:#}"), "could not sweep finished run containers");
        }
        loop {
            if let Err(error) = self.clone().tick().await {
                tracing::error!(error = %format!("{error:#}"), "run supervisor pass failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Deletes `director-run-*` tokens that belong to no live run.
    pub async fn sweep_tokens(&self) -> anyhow::Result<()> {
        let live: HashSet<String> = self
            .store
            .active_runs()
            .await?
            .into_iter()
            .map(|r| token_name(&r.id))
            .collect();
        for (_, name) in self.forge.runner_tokens(&self.runner).await? {
            if name.starts_with(TOKEN_PREFIX) && !live.contains(&name) {
                tracing::info!(token = %name, "deleting a run token left behind");
                self.forge.delete_run_token(&self.runner, &name).await?;
            }
        }
        Ok(())
    }

    /// Removes containers of runs that ended (kept failures past `keep_failed_secs`, whose
    /// removal timer died with the previous process). Containers of runs this database does
    /// not know are left alone: another director may share the engine.
    pub async fn sweep_containers(&self) -> anyhow::Result<()> {
        let keep_ms =
            i64::try_from(self.settings.keep_failed_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let now = crate::clock::now_ms();
        for c in self.runtime.list_runs().await? {
            let remove = match self.store.run(&c.run_id).await? {
                Some(run) => run.finished_at_ms.is_some_and(|f| now - f >= keep_ms),
                None => false,
            };
            if remove {
                tracing::info!(run_id = %c.run_id, "removing a finished run's container");
                self.runtime.remove(&c.id).await?;
            }
        }
        Ok(())
    }

    async fn tick(self: Arc<Self>) -> anyhow::Result<()> {
        let active = self.store.active_runs().await?;
        // Watch (or adopt) every active run; cancel those whose issue was cancelled.
        for run in &active {
            let issue = self.store.issue(&run.issue_ref()).await?;
            let cancelled = issue
                .as_ref()
                .is_none_or(|i| i.lifecycle == Lifecycle::Cancelled);
            if cancelled {
                // Stop the container; the run's own task sees it exit and finishes the run.
                self.stop_container(run).await;
            }
            self.clone().watch_once(run.clone());
        }
        // Admit queued issues in order while slots are free.
        let mut running = active.len();
        let mut per_repo: HashMap<String, usize> = HashMap::new();
        for run in &active {
            *per_repo.entry(run.repo.to_string()).or_default() += 1;
        }
        for issue in self.store.queued_issues().await? {
            if running >= self.settings.max_concurrent {
                break;
            }
            let repo_count = per_repo.entry(issue.repo.to_string()).or_default();
            if *repo_count >= self.settings.max_per_repo {
                continue;
            }
            // A run that ended after the issue was queued is this queueing's run: its result
            // is on its way to the issue. Only a new queueing (retry, re-read) starts another.
            let last = self
                .store
                .runs_of(&issue.issue_ref())
                .await?
                .into_iter()
                .next_back();
            if last.is_some_and(|r| {
                r.finished_at_ms.is_some_and(|f| f >= issue.last_change_ms)
                    || r.created_at_ms >= issue.last_change_ms
            }) {
                continue;
            }
            let run = new_run(&issue);
            if !self.store.insert_run(&run).await? {
                continue; // the issue already has an active run
            }
            *repo_count += 1;
            running += 1;
            tracing::info!(run_id = %run.id, issue = %issue.issue_ref(), "run admitted");
            self.clone().watch_once(run);
        }
        Ok(())
    }

    /// Starts the task that drives `run`, unless one already does.
    fn watch_once(self: Arc<Self>, run: RunRecord) {
        let fresh = self
            .watched
            .lock()
            .map(|mut w| w.insert(run.id.clone()))
            .unwrap_or(false);
        if !fresh {
            return;
        }
        tokio::spawn(async move {
            let id = run.id.clone();
            self.drive(run).await;
            if let Ok(mut w) = self.watched.lock() {
                w.remove(&id);
            }
        });
    }

    /// Takes one run from wherever it is to its end.
    #[tracing::instrument(skip_all, fields(run_id = %run.id, repo = %run.repo, issue = run.number))]
    async fn drive(&self, mut run: RunRecord) {
        let outcome = match self.launch_or_adopt(&mut run).await {
            Ok(Some(container)) => {
                if self.is_cancelled(&run).await && !container.is_empty() {
                    let _ = self.runtime.kill(&container).await;
                }
                self.watch(&mut run, &container).await
            }
            Ok(None) => return, // handed back (stale verdict) or already finished
            Err(outcome) => outcome,
        };
        self.finish(run, outcome).await;
    }

    /// Starts the run's container, or finds the one a previous process started.
    async fn launch_or_adopt(&self, run: &mut RunRecord) -> Result<Option<String>, Outcome> {
        let fail = |why: String| Outcome::Failed {
            why,
            log: String::new(),
        };
        // A container may exist already (a restart): adopt it, never start a second one.
        let existing = self
            .runtime
            .list_runs()
            .await
            .map_err(|e| fail(e.to_string()))?
            .into_iter()
            .find(|c| c.run_id == run.id);
        if let Some(c) = existing {
            tracing::info!(running = c.running, "adopting the run's container");
            if run.base_branch.is_empty() {
                // Killed before it was recorded: the base is the default branch.
                run.base_branch = self
                    .forge
                    .repository(&run.repo)
                    .await
                    .map_err(|e| fail(e.to_string()))?
                    .default_branch;
                let _ = self.store.update_run(run).await;
            }
            if c.never_started {
                // Created but never started (a crash in between): start it, once.
                self.runtime
                    .start(&c.id)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                if run.started_at_ms.is_none() {
                    run.started_at_ms = Some(crate::clock::now_ms());
                }
                run.state = "running".into();
                let _ = self.store.update_run(run).await;
                self.transition(run, &[Lifecycle::Queued], Lifecycle::Running)
                    .await;
            }
            run.container_id = Some(c.id.clone());
            return Ok(Some(c.id));
        }
        if run.state == "running" {
            // It ran, and its container is gone: judge it by its branch.
            return Ok(Some(String::new()));
        }
        let issue_ref = run.issue_ref();
        let Ok(Some(issue)) = self.store.issue(&issue_ref).await else {
            return Err(fail("the issue is no longer known".into()));
        };
        if issue.lifecycle == Lifecycle::Cancelled {
            return Err(Outcome::Cancelled);
        }
        // The verdict is bound to the text it read: check it again just before the launch.
        if let Some(gate) = &self.gate
            && let Some(hash) = issue.preflight.hash.clone()
        {
            match gate.gather(&issue_ref, u64::MAX).await {
                Ok(g) if g.prompt.sha256 != hash => {
                    tracing::info!("the issue changed since the pre-flight; reading it again");
                    run.state = "cancelled".into();
                    run.detail =
                        Some("stale verdict: the issue changed since the pre-flight".into());
                    run.finished_at_ms = Some(crate::clock::now_ms());
                    let _ = self.store.update_run(run).await;
                    self.transition(run, &[Lifecycle::Queued], Lifecycle::Pending)
                        .await;
                    return Ok(None);
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(fail(format!(
                        "could not re-read the issue before the launch: {e}"
                    )));
                }
            }
        }
        let repository = self
            .forge
            .repository(&run.repo)
            .await
            .map_err(|e| fail(e.to_string()))?;
        run.base_branch = repository.default_branch.clone();
        // A previous process may have minted it before dying: a token's value cannot be read
        // back, so replace it.
        self.forge
            .delete_run_token(&self.runner, &token_name(&run.id))
            .await
            .map_err(|e| fail(format!("clearing an earlier run token failed: {e}")))?;
        let minted = self
            .forge
            .mint_run_token(&self.runner, &run.repo, &token_name(&run.id))
            .await
            .map_err(|e| fail(format!("minting the run token failed: {e}")))?;
        self.remember_secret(&run.id, minted.token.expose());
        // PR-only: the run's own token must not be able to push to the default branch.
        match self
            .forge
            .branch_as(&minted.token, &run.repo, &run.base_branch)
            .await
        {
            Ok(Some(b)) if b.user_can_push && !self.settings.allow_unprotected_default_branch => {
                return Err(Outcome::Refused {
                    why: format!(
                        "the runner account `{}` can push to `{}`: protect the default branch against it (or set runner.allow_unprotected_default_branch)",
                        self.runner.login, run.base_branch
                    ),
                });
            }
            Ok(_) => {}
            Err(e) => {
                return Err(fail(format!(
                    "checking the default branch with the run token failed: {e}"
                )));
            }
        }
        let task = self.task(run, &issue).await;
        let spec = self.spec(run, &minted.token, task);
        let id = match self.runtime.create(&spec).await {
            Ok(id) => id,
            Err(RuntimeError::Exists(_)) => {
                return Err(fail(
                    "a container for this run exists already; refusing to start a second".into(),
                ));
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        run.container_id = Some(id.clone());
        run.state = "running".into();
        run.started_at_ms = Some(crate::clock::now_ms());
        self.store
            .update_run(run)
            .await
            .map_err(|e| fail(e.to_string()))?;
        self.runtime
            .start(&id)
            .await
            .map_err(|e| fail(e.to_string()))?;
        tracing::info!(container = %id, "run started");
        self.transition(run, &[Lifecycle::Queued], Lifecycle::Running)
            .await;
        Ok(Some(id))
    }

    /// The task handed to the agent: the issue as it is now (hidden content stripped) and
    /// the pre-flight's read.
    async fn task(&self, run: &RunRecord, issue: &IssueRecord) -> String {
        let (title, body) = match self.forge.issue(&run.issue_ref()).await {
            Ok(i) => (i.title, i.body),
            Err(_) => (issue.title.clone(), String::new()),
        };
        let read = match &issue.preflight.hash {
            Some(hash) => self
                .store
                .cached_reading(hash)
                .await
                .ok()
                .flatten()
                .map(|(r, _)| r),
            None => None,
        };
        format!(
            "# {}\n\nIssue {}#{}, run `{}`. Work on branch `{}` from `{}` and push it; the director opens the pull request.\n\n## The issue\n\n{}\n\n## The pre-flight's read ({})\n\n{}\n",
            crate::preflight::prompt::strip_hidden(&title).trim(),
            run.repo,
            run.number,
            run.id,
            run.branch,
            run.base_branch,
            crate::preflight::prompt::strip_hidden(&body).trim(),
            issue
                .preflight
                .verdict
                .clone()
                .unwrap_or_else(|| "none".into()),
            read.unwrap_or_else(|| "(none)".into()).trim(),
        )
    }

    fn spec(&self, run: &RunRecord, token: &Secret, task: String) -> RunSpec {
        let repo = run.repo.to_string();
        let mut env = vec![
            ("DIRECTOR_RUN_ID".to_owned(), run.id.clone()),
            ("DIRECTOR_REPO".to_owned(), repo.clone()),
            ("DIRECTOR_ISSUE".to_owned(), run.number.to_string()),
            ("DIRECTOR_BASE_BRANCH".to_owned(), run.base_branch.clone()),
            ("DIRECTOR_BRANCH".to_owned(), run.branch.clone()),
            (
                "DIRECTOR_CLONE_URL".to_owned(),
                format!("{}/{repo}.git", self.forge_url.trim_end_matches('/')),
            ),
            (
                "DIRECTOR_API_URL".to_owned(),
                format!("{}/api/v1", self.forge_url.trim_end_matches('/')),
            ),
            ("DIRECTOR_TOKEN".to_owned(), token.expose().to_owned()),
            ("DIRECTOR_TASK_FILE".to_owned(), TASK_PATH.to_owned()),
        ];
        env.extend(self.passthrough.iter().cloned());
        let labels = HashMap::from([
            (crate::runtime::docker::RUN_LABEL.to_owned(), run.id.clone()),
            ("director.repo".to_owned(), repo),
            ("director.issue".to_owned(), run.number.to_string()),
        ]);
        RunSpec {
            run_id: run.id.clone(),
            image: self.settings.image.clone(),
            command: self.settings.command.clone(),
            env,
            labels,
            task_path: TASK_PATH.to_owned(),
            task: task.into_bytes(),
            mounts: self.mounts.clone(),
        }
    }

    /// Waits for the container, then judges the run by its branch on the forge.
    async fn watch(&self, run: &mut RunRecord, container: &str) -> Outcome {
        let limit = Duration::from_secs(self.settings.timeout_secs);
        let elapsed = run
            .started_at_ms
            .map(|s| Duration::from_millis(u64::try_from(crate::clock::now_ms() - s).unwrap_or(0)))
            .unwrap_or_default();
        let exit = if container.is_empty() {
            Exit::Code(-1)
        } else {
            match self
                .runtime
                .wait(
                    container,
                    limit.saturating_sub(elapsed).max(Duration::from_secs(1)),
                )
                .await
            {
                Ok(exit) => exit,
                Err(e) => {
                    return Outcome::Failed {
                        why: e.to_string(),
                        log: String::new(),
                    };
                }
            }
        };
        let log = if container.is_empty() {
            String::new()
        } else {
            self.runtime
                .logs_tail(container, self.settings.log_tail_lines)
                .await
                .unwrap_or_default()
        };
        if exit == Exit::TimedOut {
            return Outcome::TimedOut { log };
        }
        // Still ours? A cancel may have landed while it ran.
        if self.is_cancelled(run).await {
            return Outcome::Cancelled;
        }
        let ahead = match self.forge.branch(&run.repo, &run.branch).await {
            Ok(Some(_)) => self
                .forge
                .commits_ahead(&run.repo, &run.base_branch, &run.branch)
                .await
                .unwrap_or(0),
            _ => 0,
        };
        if ahead == 0 {
            let code = match exit {
                Exit::Code(c) => c,
                Exit::TimedOut => -1,
            };
            return Outcome::Failed {
                why: format!(
                    "the run exited with code {code} and branch `{}` is not ahead of `{}`",
                    run.branch, run.base_branch
                ),
                log,
            };
        }
        let issue = self.store.issue(&run.issue_ref()).await.ok().flatten();
        let title = issue
            .as_ref()
            .map(|i| i.title.clone())
            .unwrap_or_else(|| format!("Issue #{}", run.number));
        let verdict = issue
            .as_ref()
            .and_then(|i| i.preflight.verdict.clone())
            .unwrap_or_else(|| "none".into());
        let pr = match self
            .forge
            .find_pull(&run.repo, &run.base_branch, &run.branch)
            .await
        {
            Ok(Some(n)) => n,
            _ => {
                let body = format!(
                    "Closes #{}\n\nOpened by the director for run `{}` (pre-flight verdict: {verdict}).\n",
                    run.number, run.id
                );
                match self
                    .forge
                    .create_pull(&run.repo, &run.branch, &run.base_branch, &title, &body)
                    .await
                {
                    Ok(n) => n,
                    Err(e) => {
                        return Outcome::Failed {
                            why: format!("opening the pull request failed: {e}"),
                            log,
                        };
                    }
                }
            }
        };
        Outcome::Succeeded { pr }
    }

    /// Kills the container of a run whose issue was cancelled.
    async fn stop_container(&self, run: &RunRecord) {
        let id = match &run.container_id {
            Some(id) => Some(id.clone()),
            None => self
                .runtime
                .list_runs()
                .await
                .ok()
                .and_then(|list| list.into_iter().find(|c| c.run_id == run.id).map(|c| c.id)),
        };
        if let Some(id) = id {
            tracing::info!(run_id = %run.id, "issue cancelled: stopping the run");
            if let Err(e) = self.runtime.kill(&id).await {
                tracing::warn!(error = %e, "could not stop the run's container");
            }
        }
    }

    async fn is_cancelled(&self, run: &RunRecord) -> bool {
        self.store
            .issue(&run.issue_ref())
            .await
            .ok()
            .flatten()
            .is_none_or(|i| i.lifecycle == Lifecycle::Cancelled)
    }

    /// Revokes the token, removes the container, records and reports the outcome.
    async fn finish(&self, mut run: RunRecord, outcome: Outcome) {
        if let Err(e) = self
            .forge
            .delete_run_token(&self.runner, &token_name(&run.id))
            .await
        {
            tracing::warn!(error = %e, "could not revoke the run token; the startup sweep retries");
        }
        let (state, lifecycle, detail) = match &outcome {
            Outcome::Succeeded { pr } => (
                "succeeded",
                Lifecycle::Succeeded,
                format!("pull request #{pr}"),
            ),
            Outcome::Failed { why, .. } => ("failed", Lifecycle::Failed, why.clone()),
            Outcome::TimedOut { .. } => (
                "timed_out",
                Lifecycle::TimedOut,
                format!("killed after {} s", self.settings.timeout_secs),
            ),
            Outcome::Cancelled => ("cancelled", Lifecycle::Cancelled, "cancelled".into()),
            Outcome::Refused { why } => ("refused", Lifecycle::Failed, why.clone()),
        };
        let keep = matches!(outcome, Outcome::Failed { .. } | Outcome::TimedOut { .. })
            && self.settings.keep_failed_secs > 0;
        if let Some(id) = run.container_id.clone().filter(|c| !c.is_empty()) {
            if keep {
                let runtime = self.runtime.clone();
                let wait = Duration::from_secs(self.settings.keep_failed_secs);
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = runtime.remove(&id).await;
                });
            } else if let Err(e) = self.runtime.remove(&id).await {
                tracing::warn!(error = %e, "could not remove the run's container");
            }
        }
        run.state = state.into();
        run.detail = Some(self.redact(&run.id, &detail));
        run.finished_at_ms = Some(crate::clock::now_ms());
        if let Outcome::Succeeded { pr } = &outcome {
            run.pr_number = Some(*pr);
        }
        if let Err(e) = self.store.update_run(&run).await {
            tracing::error!(error = %format!("{e:#}"), "could not record the run's end");
        }
        let body = match &outcome {
            Outcome::Succeeded { pr } => comments::run_succeeded(&run.id, *pr),
            Outcome::Failed { why, log } => comments::run_failed(
                &run.id,
                &self.redact(&run.id, why),
                &self.redact(&run.id, log),
            ),
            Outcome::TimedOut { log } => comments::run_timed_out(
                &run.id,
                self.settings.timeout_secs,
                &self.redact(&run.id, log),
            ),
            Outcome::Cancelled => comments::run_cancelled(&run.id),
            Outcome::Refused { why } => comments::run_refused(&run.id, why),
        };
        self.post_once(&run, &body).await;
        tracing::info!(state, "run finished");
        if let Ok(mut s) = self.secrets.write() {
            s.remove(&run.id);
        }
        if lifecycle != Lifecycle::Cancelled {
            self.transition(&run, &[Lifecycle::Queued, Lifecycle::Running], lifecycle)
                .await;
        }
    }

    /// Posts the run's report unless it is there already (found by its marker).
    async fn post_once(&self, run: &RunRecord, body: &str) {
        let issue = run.issue_ref();
        let marker = comments::run_marker(&run.id);
        match self.forge.comments(&issue).await {
            Ok(list) if list.iter().any(|c| c.body.contains(&marker)) => {}
            Ok(_) => {
                if let Err(e) = self.forge.create_comment(&issue, body).await {
                    tracing::warn!(error = %e, "could not report the run on the issue");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read the issue's comments"),
        }
    }

    fn remember_secret(&self, run_id: &str, value: &str) {
        if let Ok(mut s) = self.secrets.write() {
            s.entry(run_id.to_owned())
                .or_default()
                .push(value.to_owned());
        }
    }

    /// Replaces every secret value the director injected into the run.
    fn redact(&self, run_id: &str, text: &str) -> String {
        let mut out = text.to_owned();
        if let Ok(s) = self.secrets.read() {
            for v in s.get(run_id).into_iter().flatten() {
                if !v.is_empty() {
                    out = out.replace(v.as_str(), "[redacted]");
                }
            }
        }
        for (_, v) in &self.passthrough {
            if v.len() >= 4 {
                out = out.replace(v.as_str(), "[redacted]");
            }
        }
        out
    }

    /// Sends the run's effect on the issue through the queue (the consumer decides).
    async fn transition(&self, run: &RunRecord, from: &[Lifecycle], to: Lifecycle) {
        let id = format!("run:{}:{}", run.id, to.as_str());
        let event = ForgeEvent {
            kind: EventKind::Run,
            action: to.as_str().to_owned(),
            issue: run.issue_ref(),
            sender: String::new(),
            is_pull: false,
            snapshot: IssueSnapshot::default(),
            comment: None,
            preflight: None,
            run: Some(RunTransition {
                run_id: run.id.clone(),
                from: from.to_vec(),
                to,
            }),
        };
        let delivery = NewDelivery {
            content_sha256: hex::encode(Sha256::digest(id.as_bytes())),
            delivery_id: id,
            event,
            received_at_ms: crate::clock::now_ms(),
        };
        match self.store.insert_deliveries(&[delivery]).await {
            Ok(_) => self.consumer_wake.notify_one(),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "could not queue the run's transition")
            }
        }
    }
}

pub fn token_name(run_id: &str) -> String {
    format!("{TOKEN_PREFIX}{run_id}")
}

fn new_run(issue: &IssueRecord) -> RunRecord {
    let id = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    RunRecord {
        branch: format!("director-issue-{}-{}", issue.number, &id[..8]),
        id,
        repo: issue.repo.clone(),
        number: issue.number,
        state: "launching".into(),
        base_branch: String::new(),
        container_id: None,
        pr_number: None,
        detail: None,
        created_at_ms: crate::clock::now_ms(),
        started_at_ms: None,
        finished_at_ms: None,
    }
}
