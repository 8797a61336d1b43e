//! The pre-flight read: gather the trusted text, notice a writer's skip, use the cache of the
//! same text, hold to the hourly caps, ask the model. Every outcome, a failure included, goes
//! back to `decide` as an event; it chooses the verdict's consequences and the retries.

use std::sync::Arc;
use std::time::Instant;

use super::Acts;
use super::forge::latest_label_actor;
use crate::domain::IssueRef;
use crate::domain::verdict;
use crate::engine::decide::{HOUR_MS, cap_reached};
use crate::event::{Event, PreflightOutcome, ReadContext};
use crate::forge::{ForgeError, Issue};
use crate::metrics::Metrics;
use crate::preflight::prompt::{self, Prompt};
use crate::preflight::{Preflight, PreflightError};
use crate::settings::PreflightSettings;

mod gather;
pub use gather::{Gathered, Gatherer, gather_with};

pub struct PreflightAct {
    pub provider: Arc<dyn Preflight>,
    pub settings: PreflightSettings,
    pub template: String,
    pub metrics: Option<Metrics>,
    /// The pre-flight's own model calls are metered and count toward the day's budgets.
    pub metering: Metering,
    /// `[filers]`: an agent-filed issue's read is held by its filer's day, and a filer's
    /// `/director go` or skip label is never a maintainer's.
    pub filers: crate::domain::filer::Filers,
}

/// What the pre-flight's calls are priced and limited by.
#[derive(Clone, Default)]
pub struct Metering {
    pub budget: crate::settings::BudgetSettings,
    pub prices: std::collections::BTreeMap<String, crate::settings::Price>,
    pub counters: Option<crate::models::Counters>,
}

/// The repository's `.director.toml` as a run would read it now (`None`: runs are not
/// configured, repositories may set nothing, or it cannot be read now), or why it cannot be
/// used (inert, for the comment).
async fn repo_file(
    acts: &Acts,
    issue: &IssueRef,
) -> Option<Result<crate::domain::RunSettings, String>> {
    let runs = acts.runs.as_ref()?;
    if !runs.repo.ceiling.enabled() {
        return None;
    }
    let branch = match acts.forge.repository(&issue.repo).await {
        Ok(r) => r.default_branch,
        Err(e) => {
            tracing::warn!(error = %e, "the pre-flight: reading the repository");
            return None;
        }
    };
    match super::run::read_repo_settings(acts.forge.as_ref(), &runs.repo, &issue.repo, &branch)
        .await
    {
        Ok(Ok(settings)) => Some(Ok(settings)),
        Ok(Err(unusable)) => Some(Err(crate::domain::run::agent_text(
            &unusable.describe(),
            2_000,
        )
        .unwrap_or_default())),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "the pre-flight: reading the repository's settings");
            None
        }
    }
}

/// The agent a run of `issue` would get now, for the GO comment (`None`: runs are not
/// configured, or none is named anywhere), and its name. The run decides again as it starts.
async fn agent_line(
    acts: &Acts,
    issue: &IssueRef,
    labels: &[String],
    file: Option<&Result<crate::domain::RunSettings, String>>,
) -> (Option<crate::event::AgentLine>, Option<String>) {
    use crate::event::AgentLine;
    let Some(runs) = acts.runs.as_ref() else {
        return (None, None);
    };
    let repository = match file {
        Some(Err(why)) => return (Some(AgentLine::Refused { why: why.clone() }), None),
        Some(Ok(settings)) => settings.agent.clone(),
        None => None,
    };
    match runs
        .choose_agent(acts, issue, labels, repository.as_deref())
        .await
    {
        Ok(Ok(Some(chosen))) => (
            Some(AgentLine::Chosen {
                text: chosen.describe(),
            }),
            Some(chosen.name),
        ),
        Ok(Ok(None)) => (None, None),
        Ok(Err(why)) => (Some(AgentLine::Refused { why }), None),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "the agent line: choosing the agent");
            (None, None)
        }
    }
}

/// The likely cost and time of a first run of `issue` by `agent`, from the finished runs
/// (`None` when runs are not configured). A store that cannot be read gives no forecast and
/// never holds up the read. The forecast rests only on history a reader of the issue may
/// see: its repository's own runs and public repositories', never another private one's
/// (its GO comment would show what that repository's runs cost and took).
async fn forecast(
    acts: &Acts,
    issue: &IssueRef,
    agent: Option<&str>,
) -> Option<crate::domain::forecast::Forecast> {
    acts.runs.as_ref()?;
    match acts.store.forecast_samples().await {
        Ok(mut samples) => {
            let public = public_repos(acts, issue, &samples).await;
            let here = issue.repo.to_string();
            samples.retain(|s| {
                s.repo
                    .parse::<crate::domain::RepoName>()
                    .is_ok_and(|r| r == issue.repo || public.contains(&r))
            });
            Some(crate::domain::forecast::forecast(
                &samples, &here, false, agent,
            ))
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "no forecast: the finished runs cannot be read");
            Some(crate::domain::forecast::Forecast::unavailable())
        }
    }
}

/// The repositories of `samples` other than `issue`'s that an anonymous visitor of the forge
/// can see. One the forge cannot answer for counts as private.
async fn public_repos(
    acts: &Acts,
    issue: &IssueRef,
    samples: &[crate::domain::forecast::Sample],
) -> std::collections::BTreeSet<crate::domain::RepoName> {
    use futures_util::StreamExt;
    let others: std::collections::BTreeSet<crate::domain::RepoName> = samples
        .iter()
        .filter_map(|s| s.repo.parse().ok())
        .filter(|r| *r != issue.repo)
        .collect();
    futures_util::stream::iter(others)
        .map(|repo| async move {
            match acts.forge.anonymous_can_see(&repo).await {
                Ok(true) => Some(repo),
                Ok(false) => None,
                Err(e) => {
                    tracing::debug!(%repo, error = %e, "forecast: cannot tell whether the repository is public; its runs are left out");
                    None
                }
            }
        })
        .buffer_unordered(8)
        .filter_map(|r| async move { r })
        .collect()
        .await
}

impl PreflightAct {
    /// The template from `preflight.template_file`, or the default.
    pub fn new(
        provider: Arc<dyn Preflight>,
        settings: PreflightSettings,
        metrics: Option<Metrics>,
    ) -> anyhow::Result<Self> {
        let template = load_template(&settings)?;
        if !prompt::uses_fence(&template) {
            tracing::warn!(
                "preflight.template_file has no {{{{fence}}}}: issue text can close its data block"
            );
        }
        Ok(Self {
            provider,
            settings,
            template,
            metrics,
            metering: Metering::default(),
            filers: Default::default(),
        })
    }

    /// The filers and their rules.
    pub fn with_filers(mut self, filers: crate::domain::filer::Filers) -> Self {
        self.filers = filers;
        self
    }

    /// Prices, budgets and counters for the pre-flight's own calls.
    pub fn with_metering(mut self, metering: Metering) -> Self {
        self.metering = metering;
        self
    }

    /// Gathers with what the director knows of the issue (the vouched text).
    pub async fn gather(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        handled_command_id: u64,
    ) -> anyhow::Result<Gathered> {
        let state = acts.store.issue(issue).await?.map(|r| r.preflight);
        let bot = acts.bot();
        let with = Gatherer {
            forge: acts.forge.as_ref(),
            acts: Some(acts),
            template: &self.template,
            automation_accounts: &self.settings.automation_accounts,
            bot: bot.as_deref(),
            read_unvouched: false,
        };
        let mut g = gather_with(&with, issue, handled_command_id, state.as_ref()).await?;
        // An agent's request says so in the prompt: the read and the launch's check of it
        // hash the same text.
        if let Some(f) = state.as_ref().and_then(|s| s.filer.as_ref()) {
            g.prompt = prompt::from_agent(&g.prompt, f);
        }
        Ok(g)
    }

    /// Reads revision `rev` of the issue.
    pub async fn read(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        rev: i64,
        handled_command_id: u64,
    ) -> anyhow::Result<Option<Event>> {
        let mut labels = Vec::new();
        let mut outcome = self
            .outcome(acts, issue, handled_command_id, &mut labels)
            .await?;
        // What only a GO shows (the agent, the forecast) and what only a GO needs (the
        // repository's approval setting): read for a GO alone.
        if let PreflightOutcome::Read {
            verdict: verdict::Verdict::Go,
            read,
            ..
        }
        | PreflightOutcome::Skipped { read, .. } = &mut outcome
        {
            let file = repo_file(acts, issue).await;
            let (agent, agent_name) = agent_line(acts, issue, &labels, file.as_ref()).await;
            read.agent = agent;
            read.forecast = forecast(acts, issue, agent_name.as_deref()).await;
            read.repo_approval = file
                .as_ref()
                .and_then(|f| f.as_ref().ok())
                .and_then(|s| s.approval);
        }
        self.count(issue, &outcome);
        Ok(Some(Event::PreflightRead { rev, outcome }))
    }

    /// The read's outcome; `labels` gets the issue's labels as gathered.
    async fn outcome(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        handled_command_id: u64,
        labels: &mut Vec<String>,
    ) -> anyhow::Result<PreflightOutcome> {
        let model = self.provider.model().to_owned();
        let mut g = match self.gather(acts, issue, handled_command_id).await {
            Ok(g) => g,
            Err(e) => {
                return Ok(PreflightOutcome::Failed {
                    error: e.to_string(),
                    reading: None,
                    model,
                    read: None,
                });
            }
        };
        if g.issue.state != "open" || !g.issue.has_label(&acts.labels.trigger) {
            return Ok(PreflightOutcome::NotEligible);
        }
        let filer = self.agent_filed(acts, issue, &mut g).await?;
        let mut read = g.context();
        *labels = g.issue.labels.iter().map(|l| l.name.clone()).collect();
        match approval(acts, issue, &g, &mut read, &self.filers).await? {
            Ok(Some((by, how))) => return Ok(PreflightOutcome::Skipped { by, how, read }),
            Ok(None) => {}
            Err(e) => {
                return Ok(PreflightOutcome::Failed {
                    error: e.to_string(),
                    reading: None,
                    model,
                    read: Some(read),
                });
            }
        }
        if let Some(filed) = &filer
            && let Some((limit, until_ms)) = self.filer_holds(acts, issue, filed).await?
        {
            return Ok(PreflightOutcome::Capped {
                limit,
                until_ms,
                read,
                filer: Some(filed.name.clone()),
            });
        }
        if let Some((reading, model)) = acts.store.cached_reading(&g.prompt.sha256).await? {
            tracing::info!("this exact text was read before; using that read");
            return Ok(match verdict::parse(&reading) {
                Some(verdict) => PreflightOutcome::Read {
                    verdict,
                    reading,
                    model,
                    read,
                },
                None => PreflightOutcome::Failed {
                    error: "the cached read held no verdict".into(),
                    reading: Some(reading),
                    model,
                    read: Some(read),
                },
            });
        }
        let now = acts.clock.now_ms();
        if let Some((limit, until_ms)) = self.held_back(acts, issue, now).await? {
            return Ok(PreflightOutcome::Capped {
                limit,
                until_ms,
                read,
                filer: None,
            });
        }
        acts.store.record_preflight_call(&issue.repo, now).await?;
        self.ask(acts, issue, &g.prompt, now, read).await
    }

    /// An agent-filed issue's filer, as its record says; a filer's own `/director go` is
    /// dropped (its word is never a maintainer's).
    async fn agent_filed(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        g: &mut Gathered,
    ) -> anyhow::Result<Option<crate::domain::filer::Filed>> {
        if g.go_command
            .as_ref()
            .is_some_and(|(by, _)| self.filers.is_filer(by))
        {
            tracing::info!("a `/director go` by a filer's account: not a maintainer's, ignored");
            g.go_command = None;
        }
        Ok(acts
            .store
            .issue(issue)
            .await?
            .and_then(|r| r.preflight.filer)
            .filter(crate::domain::filer::Filed::is_agents))
    }

    /// Whether the filer's day holds the read of its issue (its budget spent, or
    /// `max_per_day` taken), and until when; else counts the issue as taken. The log says
    /// it once a day per filer, however many issues wait.
    async fn filer_holds(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        filed: &crate::domain::filer::Filed,
    ) -> anyhow::Result<Option<(String, i64)>> {
        let Some(rule) = self.filers.rule(&filed.name) else {
            return Ok(None);
        };
        let now = acts.clock.now_ms();
        let day = crate::models::day_of(now);
        let used = acts.store.filer_day(&filed.name, issue, &day).await?;
        match crate::engine::decide::filer_limit(&filed.name, rule, used, now) {
            Some((limit, until_ms)) => {
                if acts
                    .store
                    .filer_told(&filed.name, &day, &limit, now)
                    .await?
                {
                    tracing::warn!(filer = %filed.name, day, limit, "a filer's day is used up: its issues wait for the next day");
                }
                Ok(Some((limit, until_ms)))
            }
            None => {
                acts.store.filer_take(&filed.name, issue, &day, now).await?;
                Ok(None)
            }
        }
    }

    /// The limit that holds the read back now, and until when: the hourly caps, then the
    /// day's model budget.
    async fn held_back(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        now: i64,
    ) -> anyhow::Result<Option<(String, i64)>> {
        let window = acts
            .store
            .preflight_calls_since(&issue.repo, now - HOUR_MS)
            .await?;
        if let Some((limit, until_ms)) = cap_reached(
            &window,
            &issue.repo,
            self.settings.max_per_hour,
            self.settings.max_per_repo_per_hour,
            now,
        ) {
            tracing::info!(limit, "pre-flight cap reached; waiting");
            return Ok(Some((limit, until_ms)));
        }
        if !self.metering.budget.any() {
            return Ok(None);
        }
        let spent = acts
            .store
            .model_spent(None, &issue.repo, &crate::models::day_of(now))
            .await?;
        let budget = &self.metering.budget;
        Ok(
            crate::models::day_spent(budget, &spent, &issue.repo).map(|limit| {
                tracing::info!(
                    limit,
                    "the day's model budget is spent; the pre-flight waits"
                );
                (limit, crate::models::next_day_ms(now))
            }),
        )
    }

    /// Asks the model, meters the call, and reads the verdict from its answer (cached by
    /// the prompt's hash once it holds one).
    async fn ask(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        prompt: &Prompt,
        now: i64,
        read: ReadContext,
    ) -> anyhow::Result<PreflightOutcome> {
        let started = Instant::now();
        let answer = self.provider.read(&prompt.text).await;
        crate::failpoint::hit("during_model_call").await;
        if let Some(m) = &self.metrics {
            m.preflight_latency
                .with_label_values(&[&issue.repo.to_string()])
                .observe(started.elapsed().as_secs_f64());
        }
        let r = match answer {
            Ok(r) => r,
            Err(e) => {
                self.count_error(
                    issue,
                    match e {
                        PreflightError::Timeout(_) => "timeout",
                        PreflightError::Status { .. } => "status",
                        _ => "other",
                    },
                );
                tracing::warn!(error = %e, "pre-flight attempt failed");
                return Ok(PreflightOutcome::Failed {
                    error: e.to_string(),
                    reading: None,
                    model: self.provider.model().to_owned(),
                    read: Some(read),
                });
            }
        };
        if let Some((provider, usage)) = r.usage {
            self.meter(acts, issue, provider, &r.model, usage, now)
                .await;
        }
        Ok(match verdict::parse(&r.text) {
            Some(verdict) => {
                acts.store
                    .cache_reading(&prompt.sha256, &r.text, &r.model, now)
                    .await?;
                tracing::info!(verdict = verdict.word(), "pre-flight read");
                PreflightOutcome::Read {
                    verdict,
                    reading: r.text,
                    model: r.model,
                    read,
                }
            }
            None => {
                self.count_error(issue, "unclear");
                PreflightOutcome::Failed {
                    error: "the answer held no verdict line (GO, NO-GO, WRONG-REPO, or NEEDS-INFO with numbered questions)".into(),
                    reading: Some(r.text),
                    model: r.model,
                    read: Some(read),
                }
            }
        })
    }

    /// Records what one of the pre-flight's calls used, toward the day's budgets.
    async fn meter(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        provider: crate::models::Provider,
        model: &str,
        usage: crate::models::usage::Usage,
        at_ms: i64,
    ) {
        let metered = crate::models::Metered {
            run_id: None,
            repo: issue.repo.clone(),
            issue: Some(issue.number),
            provider,
            model: model.to_owned(),
            usage,
            cost_usd: crate::settings::prices::price_of(&self.metering.prices, model)
                .map(|p| usage.cost(&p)),
            at_ms,
        };
        if let Some(c) = &self.metering.counters {
            c.count(&metered);
        }
        if let Err(e) = acts.store.record_model_usage(&metered).await {
            tracing::error!(error = %format!("{e:#}"), "the pre-flight's usage could not be recorded");
        }
    }

    fn count(&self, issue: &IssueRef, outcome: &PreflightOutcome) {
        let label = match outcome {
            PreflightOutcome::Read { verdict, .. } => match verdict {
                verdict::Verdict::Go => "go",
                verdict::Verdict::NoGo { .. } => "no_go",
                verdict::Verdict::NeedsInfo { .. } => "needs_info",
                verdict::Verdict::WrongRepo { .. } => "wrong_repo",
            },
            PreflightOutcome::Skipped { .. } => "skipped",
            PreflightOutcome::Capped { .. } => "capped",
            PreflightOutcome::Failed { .. } => "error",
            PreflightOutcome::NotEligible => return,
        };
        if let Some(m) = &self.metrics {
            m.preflight_verdicts
                .with_label_values(&[label, &issue.repo.to_string()])
                .inc();
        }
    }

    fn count_error(&self, issue: &IssueRef, kind: &str) {
        if let Some(m) = &self.metrics {
            m.preflight_errors
                .with_label_values(&[kind, &issue.repo.to_string()])
                .inc();
        }
    }
}

/// `preflight.template_file`, or the default template.
pub fn load_template(settings: &PreflightSettings) -> anyhow::Result<String> {
    match &settings.template_file {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("preflight.template_file {file}: {e}")),
        None => Ok(prompt::DEFAULT_TEMPLATE.to_owned()),
    }
}

/// A writer's skip of the gate (`/director go`, or the skip label): who and how. While a GO
/// waits for approval, a writer's go (or skip label) approves it instead: `read.approved_by`
/// says who, the read goes on, and `decide` holds it to the text that GO showed.
async fn approval(
    acts: &Acts,
    issue: &IssueRef,
    g: &Gathered,
    read: &mut ReadContext,
    filers: &crate::domain::filer::Filers,
) -> anyhow::Result<Result<Option<(String, String)>, ForgeError>> {
    let awaiting = acts
        .store
        .issue(issue)
        .await?
        .is_some_and(|r| r.preflight.awaiting.is_some());
    if let Some((by, _)) = &g.go_command {
        if !awaiting {
            return Ok(Ok(Some((by.clone(), "`/director go`".into()))));
        }
        read.approved_by = Some(by.clone());
    }
    let skip = skip_label_by(acts, &g.issue, issue)
        .await
        .map(|by| by.filter(|(who, _)| !filers.is_filer(who)));
    Ok(match skip {
        Ok(Some((by, _))) if awaiting => {
            read.approved_by.get_or_insert(by);
            Ok(None)
        }
        other => other,
    })
}

/// Who applied the skip label, if it is on the issue and they may.
async fn skip_label_by(
    acts: &Acts,
    issue: &Issue,
    issue_ref: &IssueRef,
) -> Result<Option<(String, String)>, ForgeError> {
    let skip = &acts.labels.skip_preflight;
    if skip.is_empty() || !issue.has_label(skip) {
        return Ok(None);
    }
    let Some(actor) = latest_label_actor(acts.forge.as_ref(), issue_ref, skip).await? else {
        return Ok(None);
    };
    if acts.permission(&issue_ref.repo, &actor).await?.can_write() {
        Ok(Some((actor, format!("the label `{skip}`"))))
    } else {
        tracing::info!(actor, "skip label applied without write access: ignored");
        Ok(None)
    }
}
