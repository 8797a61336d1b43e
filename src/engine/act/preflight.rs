//! The pre-flight read: gather the trusted text, notice a writer's skip, use the cache of the
//! same text, hold to the hourly caps, ask the model. Every outcome, a failure included, goes
//! back to `decide` as an event; it chooses the verdict's consequences and the retries.

use std::sync::Arc;
use std::time::Instant;

use super::Acts;
use super::forge::latest_label_actor;
use crate::domain::verdict;
use crate::domain::{Command, IssueRef, LeftOut, Vouched, command::is_only_commands, same_login};
use crate::engine::decide::{HOUR_MS, cap_reached};
use crate::event::{Event, PreflightOutcome, ReadContext};
use crate::forge::{Comment, Forge, ForgeError, Issue};
use crate::metrics::Metrics;
use crate::preflight::prompt::{self, Prompt, PromptComment};
use crate::preflight::{Preflight, PreflightError, comment};
use crate::settings::PreflightSettings;

pub struct PreflightAct {
    pub provider: Arc<dyn Preflight>,
    pub settings: PreflightSettings,
    pub template: String,
    pub metrics: Option<Metrics>,
    /// The pre-flight's own model calls are metered and count toward the day's budgets.
    pub metering: Metering,
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
/// never holds up the read.
async fn forecast(
    acts: &Acts,
    issue: &IssueRef,
    agent: Option<&str>,
) -> Option<crate::domain::forecast::Forecast> {
    acts.runs.as_ref()?;
    match acts.store.forecast_samples().await {
        Ok(samples) => Some(crate::domain::forecast::forecast(
            &samples,
            &issue.repo.to_string(),
            false,
            agent,
        )),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "no forecast: the finished runs cannot be read");
            Some(crate::domain::forecast::Forecast::unavailable())
        }
    }
}

/// What the pre-flight gathered from the forge for one issue.
pub struct Gathered {
    pub issue: Issue,
    pub prompt: Prompt,
    pub left_out: Vec<LeftOut>,
    /// A writer's `/director go` not yet acted on: (who, comment id).
    pub go_command: Option<(String, u64)>,
    /// The newest comment id seen.
    pub newest_comment_id: u64,
    /// The trusted title and body: what the prompt and the run's task hold.
    pub title: String,
    pub body: String,
    /// The text vouched for anew by this reading, if it was.
    pub vouched: Option<Vouched>,
    /// What the read left out as hidden from a reader, one line per place.
    pub hidden: Vec<String>,
    /// The comments the prompt holds that came after the pre-flight's last questions: their
    /// answers, for the run's task.
    pub answers: Vec<PromptComment>,
}

impl Gathered {
    fn context(&self) -> ReadContext {
        ReadContext {
            hash: self.prompt.sha256.clone(),
            left_out: self.left_out.clone(),
            newest_comment_id: self.newest_comment_id,
            title: self.title.clone(),
            body: self.body.clone(),
            vouched: self.vouched.clone(),
            hidden: self.hidden.clone(),
            agent: None,
            forecast: None,
            repo_approval: None,
            approved_by: None,
        }
    }
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
        })
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
        Ok(gather_with(&with, issue, handled_command_id, state.as_ref()).await?)
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
        self.count(&outcome);
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
        let g = match self.gather(acts, issue, handled_command_id).await {
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
        let mut read = g.context();
        *labels = g.issue.labels.iter().map(|l| l.name.clone()).collect();
        // While a GO waits for approval, a writer's go (or skip label) approves it: the read
        // goes on, and `decide` holds it to the text that GO showed.
        let awaiting = acts
            .store
            .issue(issue)
            .await?
            .is_some_and(|r| r.preflight.awaiting.is_some());
        if let Some((by, _)) = &g.go_command {
            if !awaiting {
                return Ok(PreflightOutcome::Skipped {
                    by: by.clone(),
                    how: "`/director go`".into(),
                    read,
                });
            }
            read.approved_by = Some(by.clone());
        }
        match skip_label_by(acts, &g.issue, issue).await {
            Ok(Some((by, _))) if awaiting => {
                read.approved_by.get_or_insert(by);
            }
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
            return Ok(PreflightOutcome::Capped {
                limit,
                until_ms,
                read,
            });
        }
        if self.metering.budget.any() {
            let spent = acts
                .store
                .model_spent(None, &issue.repo, &crate::models::day_of(now))
                .await?;
            let budget = &self.metering.budget;
            if let Some(limit) = crate::models::day_spent(budget, &spent, &issue.repo) {
                tracing::info!(
                    limit,
                    "the day's model budget is spent; the pre-flight waits"
                );
                return Ok(PreflightOutcome::Capped {
                    limit,
                    until_ms: crate::models::next_day_ms(now),
                    read,
                });
            }
        }
        acts.store.record_preflight_call(&issue.repo, now).await?;
        let started = Instant::now();
        let answer = self.provider.read(&g.prompt.text).await;
        crate::failpoint::hit("during_model_call").await;
        if let Some(m) = &self.metrics {
            m.preflight_latency.observe(started.elapsed().as_secs_f64());
        }
        if let Ok(crate::preflight::Reading {
            usage: Some((provider, usage)),
            model,
            ..
        }) = &answer
        {
            self.meter(acts, issue, *provider, model, *usage, now).await;
        }
        Ok(match answer {
            Ok(r) => match verdict::parse(&r.text) {
                Some(verdict) => {
                    acts.store
                        .cache_reading(&g.prompt.sha256, &r.text, &r.model, now)
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
                    self.count_error("unclear");
                    PreflightOutcome::Failed {
                        error: "the answer held no verdict line (GO, NO-GO, WRONG-REPO, or NEEDS-INFO with numbered questions)".into(),
                        reading: Some(r.text),
                        model: r.model,
                        read: Some(read),
                    }
                }
            },
            Err(e) => {
                self.count_error(match e {
                    PreflightError::Timeout(_) => "timeout",
                    PreflightError::Status { .. } => "status",
                    _ => "other",
                });
                tracing::warn!(error = %e, "pre-flight attempt failed");
                PreflightOutcome::Failed {
                    error: e.to_string(),
                    reading: None,
                    model,
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

    fn count(&self, outcome: &PreflightOutcome) {
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
            m.preflight_verdicts.with_label_values(&[label]).inc();
        }
    }

    fn count_error(&self, kind: &str) {
        if let Some(m) = &self.metrics {
            m.preflight_errors.with_label_values(&[kind]).inc();
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

/// What gathering reads with: the forge (through `acts` when there, for its role cache), the
/// template, the automation accounts, and the bot's login (its own comments are left out).
#[derive(Clone, Copy)]
pub struct Gatherer<'a> {
    pub forge: &'a dyn Forge,
    pub acts: Option<&'a Acts>,
    pub template: &'a str,
    pub automation_accounts: &'a [String],
    pub bot: Option<&'a str>,
    /// Text no writer vouched for is read as it is (the operator's dry run, which acts on
    /// nothing) rather than left out.
    pub read_unvouched: bool,
}

/// Roles asked while gathering: each account once.
struct Roles<'a> {
    forge: &'a dyn Forge,
    acts: Option<&'a Acts>,
    repo: &'a crate::domain::RepoName,
    automation: &'a [String],
    known: std::collections::HashMap<String, crate::forge::Permission>,
}

impl Roles<'_> {
    async fn of(&mut self, user: &str) -> Result<crate::forge::Permission, ForgeError> {
        if let Some(p) = self.known.get(user) {
            return Ok(*p);
        }
        let p = match self.acts {
            Some(acts) => acts.permission(self.repo, user).await?,
            None => self.forge.permission(self.repo, user).await?,
        };
        self.known.insert(user.to_owned(), p);
        Ok(p)
    }

    /// A writer or a configured automation account: their text is read.
    async fn trusted(&mut self, user: &str) -> Result<bool, ForgeError> {
        let automation = self.automation.iter().any(|a| a.eq_ignore_ascii_case(user));
        Ok(automation || (!user.is_empty() && self.of(user).await?.can_write()))
    }
}

/// Reads the issue and its comments and builds the prompt from trusted text: comments by
/// writers and automation accounts, oldest first; the director's own left out silently;
/// everyone else's left out and listed. The issue's own title and body are read as they are
/// when their author may write, or when a writer vouches for exactly this text (the edit was
/// theirs, or they said `/director go`); otherwise as they were when a writer last vouched
/// (`state.vouched`), and a later edit is listed as left out.
pub async fn gather_with(
    with: &Gatherer<'_>,
    issue_ref: &IssueRef,
    handled_command_id: u64,
    state: Option<&crate::domain::PreflightState>,
) -> Result<Gathered, ForgeError> {
    let Gatherer {
        forge,
        acts,
        template,
        automation_accounts,
        bot,
        read_unvouched,
    } = *with;
    // Independent reads, at once: one round trip fewer on every read.
    let (issue, comments) = tokio::join!(forge.issue(issue_ref), forge.comments(issue_ref));
    let (issue, comments) = (issue?, comments?);
    let mut roles = Roles {
        forge,
        acts,
        repo: &issue_ref.repo,
        automation: automation_accounts,
        known: std::collections::HashMap::new(),
    };
    let mut trusted = Vec::new();
    let mut answers = Vec::new();
    let mut left_out = Vec::new();
    let mut go_command = None;
    let mut newest_comment_id = handled_command_id;
    // While the pre-flight's questions are open, a writer's comment after them (any text, or
    // `/director go`) vouches for the thread up to it: an answer by someone without write
    // access before it is read, one after it waits. A `/director go` then asks for a read
    // with the answers, not a skip of the gate.
    // Kept once asked (until the trigger is applied anew), so that the launch's read of the
    // thread is the one the verdict was given for.
    let asked_after = state
        .filter(|s| !s.questions.is_empty())
        .map(|s| s.asked_after);
    // The newest writer's comment after the questions: its id, author and time.
    let mut vouched_until: Option<(u64, String, String)> = None;
    let mut first_reader_answer: Option<u64> = None;
    if let Some(after) = asked_after {
        for c in comments.iter().filter(|c| c.id > after) {
            if bot.is_some_and(|b| same_login(b, &c.author)) || c.body.starts_with(comment::MARKER)
            {
                continue;
            }
            if roles.of(&c.author).await?.can_write() {
                vouched_until = Some((c.id, c.author.clone(), c.created_at.clone()));
            } else if !is_only_commands(&c.body) && !roles.trusted(&c.author).await? {
                first_reader_answer = first_reader_answer.or(Some(c.id));
            }
        }
    }
    for c in &comments {
        newest_comment_id = newest_comment_id.max(c.id);
        if bot.is_some_and(|b| same_login(b, &c.author)) || c.body.starts_with(comment::MARKER) {
            continue;
        }
        let writer = roles.of(&c.author).await?.can_write();
        // With an answer waiting before it, `/director go` vouches for it (a read follows);
        // otherwise it skips the gate, as always.
        let vouches = asked_after.is_some() && first_reader_answer.is_some_and(|a| a < c.id);
        if writer
            && c.id > handled_command_id
            && !vouches
            && Command::find(&c.body, &[Command::Go]).is_some()
        {
            go_command = Some((c.author.clone(), c.id));
        }
        if is_only_commands(&c.body) {
            continue;
        }
        let is_answer = asked_after.is_some_and(|after| c.id > after);
        let vouching = vouched_until
            .as_ref()
            .filter(|(until, _, _)| is_answer && c.id < *until);
        // A writer vouches for an answer as it was when they replied: one edited since is
        // not the text they read.
        let edited_since = vouching.is_some_and(|(_, _, at)| edited_since(c, at));
        let vouched_by = vouching
            .filter(|_| !edited_since)
            .map(|(_, by, _)| by.clone());
        if roles.trusted(&c.author).await? {
            trusted.push(prompt_comment(c));
            if is_answer {
                answers.push(prompt_comment(c));
            }
        } else if let Some(by) = vouched_by {
            let mut answer = prompt_comment(c);
            answer.author = format!("{} (no write access; vouched for by @{by})", c.author);
            trusted.push(answer.clone());
            answers.push(answer);
        } else {
            left_out.push(LeftOut {
                author: c.author.clone(),
                comment_id: c.id,
                issue_text: false,
                never_vouched: false,
                edited_after_vouched: edited_since,
            });
        }
    }
    let current = Vouched {
        title: issue.title.clone(),
        body: issue.body.clone(),
        by: String::new(),
    };
    let same_text = |v: &Vouched| v.title == current.title && v.body == current.body;
    let by = |who: &str| Vouched {
        by: who.to_owned(),
        ..current.clone()
    };
    let proposed = state
        .and_then(|s| s.proposed.as_ref())
        .filter(|p| same_text(p));
    let (text, vouched) = if roles.trusted(&issue.author).await? {
        (current.clone(), Some(by(&issue.author)))
    } else if let Some(p) = proposed
        && roles.trusted(&p.by).await?
    {
        (current.clone(), Some(by(&p.by)))
    } else if let Some(v) = state.and_then(|s| s.vouched.as_ref()) {
        if !same_text(v) {
            left_out.insert(0, issue_text_left_out(&issue.author, false));
        }
        (v.clone(), None)
    } else if read_unvouched {
        (current.clone(), None)
    } else {
        // No writer vouched for any version of this text (the trigger was seen only after an
        // edit, or its timeline could not be read): none of it is read. A writer's edit or
        // `/director go` vouches for it; a `/director go` counts for the text its delivery
        // carried (the proposed text above), never for the text as it is when read.
        left_out.insert(0, issue_text_left_out(&issue.author, true));
        (
            Vouched {
                title: String::new(),
                body: String::new(),
                by: String::new(),
            },
            None,
        )
    };
    let prompt = prompt::build(template, issue_ref, &text.title, &text.body, &trusted);
    let mut hidden = Vec::new();
    for (place, t) in [("the title", &text.title), ("the body", &text.body)] {
        note_hidden(&mut hidden, place, t);
    }
    for c in &trusted {
        note_hidden(
            &mut hidden,
            &format!("the comment by `{}` of {}", c.author, c.created_at),
            &c.body,
        );
    }
    Ok(Gathered {
        issue,
        prompt,
        left_out,
        go_command,
        newest_comment_id,
        title: text.title,
        body: text.body,
        vouched,
        hidden,
        answers,
    })
}

/// One line naming what `text` (at `place`) held that a reader of the rendered page does not
/// see, if anything.
fn note_hidden(out: &mut Vec<String>, place: &str, text: &str) {
    let mut kinds = crate::preflight::visible::visible(text).hidden;
    kinds.sort();
    kinds.dedup();
    if !kinds.is_empty() {
        let what: Vec<&str> = kinds.iter().map(|k| k.describe()).collect();
        out.push(format!("{place}: {}", what.join(", ")));
    }
}

fn issue_text_left_out(author: &str, never_vouched: bool) -> LeftOut {
    LeftOut {
        author: author.to_owned(),
        comment_id: 0,
        issue_text: true,
        never_vouched,
        edited_after_vouched: false,
    }
}

/// Whether comment `c` was edited at or after `reply` (a writer's comment's `created_at`).
/// The forges give seconds: an edit in the reply's own second counts as after it, and a time
/// that does not read counts as an edit (the answer is left out, never taken unseen).
fn edited_since(c: &Comment, reply: &str) -> bool {
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    match (at(&c.created_at), at(&c.updated_at), at(reply)) {
        (Some(created), Some(updated), Some(reply)) => updated > created && updated >= reply,
        _ => c.updated_at != c.created_at,
    }
}

fn prompt_comment(c: &Comment) -> PromptComment {
    PromptComment {
        author: c.author.clone(),
        created_at: c.created_at.clone(),
        body: c.body.clone(),
    }
}
