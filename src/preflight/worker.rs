//! The pre-flight worker: picks `pending` issues, reads them from the forge, builds the
//! prompt from trusted text, asks the provider (or the cache), posts or edits the one sticky
//! comment, files WRONG-REPO issues with trusted owners, and sends the result back through
//! the queue. Provider failures are retried with backoff across runs (nothing blocks), and
//! hourly caps defer reads instead of dropping them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::comment::{self, CommentInput, LeftOut, Shown};
use super::prompt::{self, Prompt, PromptComment};
use super::verdict::{self, Verdict};
use super::{Preflight, PreflightResult};
use crate::director::consumer::latest_label_actor;
use crate::domain::{IssueRef, Lifecycle};
use crate::forge::payload::{EventKind, ForgeEvent, IssueSnapshot};
use crate::forge::{Comment, Forge, ForgeError, Issue, Permission};
use crate::metrics::Metrics;
use crate::settings::{LabelSettings, OnError, PreflightSettings};
use crate::store::{IssueRecord, NewDelivery, PreflightState, Store};

const HOUR_MS: i64 = 3_600_000;

pub struct PreflightWorker {
    pub(crate) store: Store,
    pub(crate) forge: Arc<dyn Forge>,
    pub(crate) provider: Arc<dyn Preflight>,
    pub(crate) settings: PreflightSettings,
    pub(crate) labels: LabelSettings,
    pub(crate) template: String,
    pub(crate) bot: Arc<RwLock<Option<String>>>,
    pub(crate) metrics: Option<Metrics>,
    /// Woken when a result is queued.
    pub(crate) consumer_wake: Arc<Notify>,
    /// Issues being read, with the revision being read.
    in_flight: Mutex<HashMap<IssueRef, i64>>,
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
    /// The director's pre-flight comment already on the issue: (id, body).
    pub sticky: Option<(u64, String)>,
}

impl PreflightWorker {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        forge: Arc<dyn Forge>,
        provider: Arc<dyn Preflight>,
        settings: PreflightSettings,
        labels: LabelSettings,
        bot: Arc<RwLock<Option<String>>>,
        metrics: Option<Metrics>,
        consumer_wake: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let template = match &settings.template_file {
            Some(file) => std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("preflight.template_file {file}: {e}"))?,
            None => prompt::DEFAULT_TEMPLATE.to_owned(),
        };
        Ok(Self {
            store,
            forge,
            provider,
            settings,
            labels,
            template,
            bot,
            metrics,
            consumer_wake,
            in_flight: Mutex::default(),
        })
    }

    fn bot(&self) -> Option<String> {
        self.bot.read().ok().and_then(|b| b.clone())
    }

    /// Runs until `shutdown`: reads due issues, `concurrency` at a time.
    pub async fn run(self: Arc<Self>, wake: Arc<Notify>, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.settings.concurrency));
        loop {
            match self.store.due_preflights(crate::clock::now_ms(), 64).await {
                Ok(due) => {
                    // Forget issues that are no longer waiting: their result was applied.
                    if let Ok(mut in_flight) = self.in_flight.lock() {
                        let waiting: std::collections::HashSet<IssueRef> =
                            due.iter().map(IssueRecord::issue_ref).collect();
                        in_flight.retain(|issue, _| waiting.contains(issue));
                    }
                    for record in due {
                        let issue = record.issue_ref();
                        {
                            let Ok(mut in_flight) = self.in_flight.lock() else {
                                continue;
                            };
                            if in_flight.get(&issue) == Some(&record.preflight.rev) {
                                continue;
                            }
                            in_flight.insert(issue.clone(), record.preflight.rev);
                        }
                        let Ok(permit) = permits.clone().acquire_owned().await else {
                            return;
                        };
                        let this = self.clone();
                        tokio::spawn(async move {
                            let span = tracing::info_span!("preflight", repo = %issue.repo, issue = issue.number, rev = record.preflight.rev);
                            if let Err(error) =
                                tracing::Instrument::instrument(this.run_one(&record), span.clone())
                                    .await
                            {
                                span.in_scope(|| tracing::warn!(error = %format!("{error:#}"), "pre-flight run failed; retried later"));
                                // Let a later pass pick it up again.
                                if let Ok(mut f) = this.in_flight.lock() {
                                    f.remove(&issue);
                                }
                            }
                            drop(permit);
                        });
                    }
                }
                Err(error) => {
                    tracing::error!(error = %format!("{error:#}"), "cannot list due pre-flights")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One run for one issue, ending in a result queued for the consumer.
    async fn run_one(&self, record: &IssueRecord) -> anyhow::Result<()> {
        let Some(result) = self.evaluate(record).await? else {
            return Ok(());
        };
        let issue = record.issue_ref();
        let id = format!(
            "preflight:{issue}:rev{}:{}",
            record.preflight.rev,
            crate::clock::now_ms()
        );
        let event = ForgeEvent {
            kind: EventKind::Preflight,
            action: result.lifecycle.as_str().to_owned(),
            issue,
            sender: String::new(),
            is_pull: false,
            snapshot: IssueSnapshot::default(),
            comment: None,
            preflight: Some(result),
            run: None,
        };
        let content_sha256 = hex::encode(Sha256::digest(id.as_bytes()));
        self.store
            .insert_deliveries(&[NewDelivery {
                delivery_id: id,
                content_sha256,
                event,
                received_at_ms: crate::clock::now_ms(),
            }])
            .await?;
        self.consumer_wake.notify_one();
        Ok(())
    }

    pub async fn gather(
        &self,
        issue_ref: &IssueRef,
        handled_command_id: u64,
    ) -> Result<Gathered, ForgeError> {
        gather_with(
            self.forge.as_ref(),
            &self.template,
            &self.settings.automation_accounts,
            self.bot().as_deref(),
            issue_ref,
            handled_command_id,
        )
        .await
    }

    /// Decides the next state of a pending issue. `None` when there is nothing to say (the
    /// issue closed or lost its trigger: the consumer cancels it from that fact).
    pub async fn evaluate(&self, record: &IssueRecord) -> anyhow::Result<Option<PreflightResult>> {
        let issue_ref = record.issue_ref();
        let mut state = record.preflight.clone();
        let now = crate::clock::now_ms();
        let g = match self.gather(&issue_ref, state.handled_command_id).await {
            Ok(g) => g,
            Err(e) => {
                return Ok(Some(
                    self.failed_attempt(record, state, None, &e.to_string(), now)
                        .await,
                ));
            }
        };
        if g.issue.state != "open" || !g.issue.has_label(&self.labels.trigger) {
            return Ok(None);
        }
        let skip = match &g.go_command {
            Some((by, id)) => {
                state.handled_command_id = *id;
                Some((by.clone(), "`/director go`".to_owned()))
            }
            None => self.skip_label_by(&g.issue, &issue_ref).await?,
        };
        state.handled_command_id = state.handled_command_id.max(g.newest_comment_id);
        if let Some((by, how)) = skip {
            let shown = Shown::Skipped {
                by: by.clone(),
                how,
            };
            self.upsert_comment(&issue_ref, &shown, None, &g, "")
                .await?;
            self.count_verdict("skipped");
            state.verdict = Some("SKIPPED".into());
            state.reason = Some(format!("skipped by @{by}"));
            state.hash = Some(g.prompt.sha256.clone());
            state.attempts = 0;
            state.not_before_ms = None;
            return Ok(Some(PreflightResult {
                rev: record.preflight.rev,
                lifecycle: Lifecycle::Queued,
                state,
            }));
        }
        // The trusted text is what the verdict was given for: keep the verdict.
        if state.hash.as_deref() == Some(g.prompt.sha256.as_str())
            && let Some(lifecycle) = lifecycle_of_verdict(&state)
        {
            tracing::info!("trusted text unchanged since the last verdict; keeping it");
            state.attempts = 0;
            state.not_before_ms = None;
            return Ok(Some(PreflightResult {
                rev: record.preflight.rev,
                lifecycle,
                state,
            }));
        }
        let (reading, model) = match self.store.cached_reading(&g.prompt.sha256).await? {
            Some(cached) => {
                tracing::info!("this exact text was read before; using that read");
                cached
            }
            None => {
                if let Some(deferred) = self.cap_reached(record, &g, state.clone(), now).await? {
                    return Ok(Some(deferred));
                }
                self.store
                    .record_preflight_call(&issue_ref.repo, now)
                    .await?;
                let started = Instant::now();
                let answer = self.provider.read(&g.prompt.text).await;
                if let Some(m) = &self.metrics {
                    m.preflight_latency.observe(started.elapsed().as_secs_f64());
                }
                match answer {
                    Ok(r) if verdict::parse(&r.text).is_some() => {
                        self.store
                            .cache_reading(&g.prompt.sha256, &r.text, &r.model, now)
                            .await?;
                        (r.text, r.model)
                    }
                    Ok(r) => {
                        self.count_error("unclear");
                        let error = "the answer held no verdict line (GO, NO-GO or WRONG-REPO)";
                        return Ok(Some(
                            self.failed_attempt(
                                record,
                                state,
                                Some((&g, r.text.as_str(), r.model.as_str())),
                                error,
                                now,
                            )
                            .await,
                        ));
                    }
                    Err(e) => {
                        self.count_error(match e {
                            super::PreflightError::Timeout(_) => "timeout",
                            super::PreflightError::Status { .. } => "status",
                            _ => "other",
                        });
                        return Ok(Some(
                            self.failed_attempt(
                                record,
                                state,
                                Some((&g, "", self.provider.model())),
                                &e.to_string(),
                                now,
                            )
                            .await,
                        ));
                    }
                }
            }
        };
        let Some(v) = verdict::parse(&reading) else {
            return Ok(Some(
                self.failed_attempt(record, state, None, "the cached read held no verdict", now)
                    .await,
            ));
        };
        state.hash = Some(g.prompt.sha256.clone());
        state.model = Some(model.clone());
        state.attempts = 0;
        state.last_error = None;
        state.not_before_ms = None;
        let (shown, lifecycle) = match &v {
            Verdict::Go => (Shown::Go, Lifecycle::Queued),
            Verdict::NoGo { reason } => (
                Shown::NoGo {
                    reason: reason.clone(),
                },
                Lifecycle::NoGo,
            ),
            Verdict::WrongRepo { repo, what } => {
                let trusted_owner = self
                    .settings
                    .trusted_owners
                    .iter()
                    .any(|o| o.eq_ignore_ascii_case(repo.owner()));
                if trusted_owner {
                    let filed = match &state.routed_to {
                        Some(filed) if filed.starts_with(&format!("{repo}#")) => filed.clone(),
                        _ => {
                            let body = routed_body(&issue_ref, &g.issue, what);
                            match self.forge.create_issue(repo, &g.issue.title, &body).await {
                                Ok(number) => format!("{repo}#{number}"),
                                Err(e) => {
                                    let error = format!("filing the issue in {repo} failed: {e}");
                                    return Ok(Some(
                                        self.failed_attempt(record, state, None, &error, now).await,
                                    ));
                                }
                            }
                        }
                    };
                    state.routed_to = Some(filed.clone());
                    (
                        Shown::Routed {
                            repo: repo.clone(),
                            filed,
                            what: what.clone(),
                        },
                        Lifecycle::Routed,
                    )
                } else {
                    let reason = format!(
                        "the read says this belongs in {repo} ({what}), but `{}` is not in preflight.trusted_owners",
                        repo.owner()
                    );
                    (Shown::NoGo { reason }, Lifecycle::NoGo)
                }
            }
        };
        state.verdict = Some(v.word().to_owned());
        state.reason = match &shown {
            Shown::NoGo { reason } => Some(reason.clone()),
            Shown::Routed { what, .. } => Some(what.clone()),
            _ => None,
        };
        self.upsert_comment(&issue_ref, &shown, Some(&reading), &g, &model)
            .await?;
        self.count_verdict(match lifecycle {
            Lifecycle::Queued => "go",
            Lifecycle::Routed => "wrong_repo",
            _ => "no_go",
        });
        tracing::info!(verdict = v.word(), state = %lifecycle, "pre-flight read");
        Ok(Some(PreflightResult {
            rev: record.preflight.rev,
            lifecycle,
            state,
        }))
    }

    /// Who applied the skip label, if it is on the issue and they may.
    async fn skip_label_by(
        &self,
        issue: &Issue,
        issue_ref: &IssueRef,
    ) -> Result<Option<(String, String)>, ForgeError> {
        let skip = &self.labels.skip_preflight;
        if skip.is_empty() || !issue.has_label(skip) {
            return Ok(None);
        }
        let Some(actor) = latest_label_actor(self.forge.as_ref(), issue_ref, skip).await? else {
            return Ok(None);
        };
        if self
            .forge
            .permission(&issue_ref.repo, &actor)
            .await?
            .can_write()
        {
            Ok(Some((actor, format!("the label `{skip}`"))))
        } else {
            tracing::info!(actor, "skip label applied without write access: ignored");
            Ok(None)
        }
    }

    /// A failed read: retried later with backoff, or given up after `max_attempts`.
    async fn failed_attempt(
        &self,
        record: &IssueRecord,
        mut state: PreflightState,
        gathered: Option<(&Gathered, &str, &str)>,
        error: &str,
        now: i64,
    ) -> PreflightResult {
        state.attempts += 1;
        state.last_error = Some(error.to_owned());
        tracing::warn!(
            attempt = state.attempts,
            max = self.settings.max_attempts,
            error,
            "pre-flight attempt failed"
        );
        if state.attempts < self.settings.max_attempts {
            let backoff = self
                .settings
                .retry_backoff_ms
                .saturating_mul(1 << (state.attempts - 1).min(10));
            state.not_before_ms = Some(now + i64::try_from(backoff).unwrap_or(i64::MAX / 2));
            state.rev += 1;
            return PreflightResult {
                rev: record.preflight.rev,
                lifecycle: Lifecycle::Pending,
                state,
            };
        }
        let proceeding = self.settings.on_error == OnError::Proceed;
        let shown = Shown::Failed {
            error: error.to_owned(),
            proceeding,
        };
        if let Some((g, reading, model)) = gathered {
            let reading = (!reading.is_empty()).then_some(reading);
            if let Err(e) = self
                .upsert_comment(&record.issue_ref(), &shown, reading, g, model)
                .await
            {
                tracing::warn!(error = %e, "could not post the pre-flight comment");
            }
        } else if let Ok(g) = self
            .gather(&record.issue_ref(), state.handled_command_id)
            .await
            && let Err(e) = self
                .upsert_comment(&record.issue_ref(), &shown, None, &g, self.provider.model())
                .await
        {
            tracing::warn!(error = %e, "could not post the pre-flight comment");
        }
        self.count_verdict("error");
        state.verdict = Some("ERROR".into());
        state.reason = Some(error.to_owned());
        state.not_before_ms = None;
        let lifecycle = if proceeding {
            Lifecycle::Queued
        } else {
            Lifecycle::PreflightFailed
        };
        PreflightResult {
            rev: record.preflight.rev,
            lifecycle,
            state,
        }
    }

    /// Defers the read when an hourly cap is reached, telling the issue once.
    async fn cap_reached(
        &self,
        record: &IssueRecord,
        g: &Gathered,
        mut state: PreflightState,
        now: i64,
    ) -> anyhow::Result<Option<PreflightResult>> {
        let repo = &record.repo;
        let window = self
            .store
            .preflight_calls_since(repo, now - HOUR_MS)
            .await?;
        let (limit, oldest) = if window.repo_total >= i64::from(self.settings.max_per_repo_per_hour)
        {
            (
                format!(
                    "{} pre-flights per hour for {repo}",
                    self.settings.max_per_repo_per_hour
                ),
                window.repo_oldest_ms,
            )
        } else if window.total >= i64::from(self.settings.max_per_hour) {
            (
                format!("{} pre-flights per hour", self.settings.max_per_hour),
                window.oldest_ms,
            )
        } else {
            return Ok(None);
        };
        let until = oldest.unwrap_or(now) + HOUR_MS + 1_000;
        let until_text = chrono::DateTime::from_timestamp_millis(until)
            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_default();
        tracing::info!(limit, until = %until_text, "pre-flight cap reached; waiting");
        let shown = Shown::WaitingOnCap {
            limit,
            until: until_text,
        };
        self.upsert_comment(&record.issue_ref(), &shown, None, g, "")
            .await?;
        self.count_verdict("capped");
        state.not_before_ms = Some(until);
        state.rev += 1;
        Ok(Some(PreflightResult {
            rev: record.preflight.rev,
            lifecycle: Lifecycle::Pending,
            state,
        }))
    }

    /// Edits the issue's pre-flight comment in place, or posts it if there is none.
    async fn upsert_comment(
        &self,
        issue: &IssueRef,
        shown: &Shown,
        reading: Option<&str>,
        g: &Gathered,
        model: &str,
    ) -> Result<(), ForgeError> {
        let body = comment::render(&CommentInput {
            shown,
            trigger: &self.labels.trigger,
            skip_label: &self.labels.skip_preflight,
            reading,
            left_out: &g.left_out,
            model,
            hash: &g.prompt.sha256,
        });
        // Found while gathering: one issue is never read twice at once, so it is current.
        match &g.sticky {
            Some((_, current)) if *current == body => Ok(()),
            Some((id, _)) => self
                .forge
                .edit_comment(&issue.repo, *id, &body)
                .await
                .map(|_| ()),
            None => self.forge.create_comment(issue, &body).await.map(|_| ()),
        }
    }

    fn count_verdict(&self, outcome: &str) {
        if let Some(m) = &self.metrics {
            m.preflight_verdicts.with_label_values(&[outcome]).inc();
        }
    }

    fn count_error(&self, kind: &str) {
        if let Some(m) = &self.metrics {
            m.preflight_errors.with_label_values(&[kind]).inc();
        }
    }
}

/// Reads the issue and its comments and builds the prompt from trusted text: comments by
/// writers and automation accounts, oldest first; the director's own left out silently;
/// everyone else's left out and listed.
pub async fn gather_with(
    forge: &dyn Forge,
    template: &str,
    automation_accounts: &[String],
    bot: Option<&str>,
    issue_ref: &IssueRef,
    handled_command_id: u64,
) -> Result<Gathered, ForgeError> {
    let issue = forge.issue(issue_ref).await?;
    let comments = forge.comments(issue_ref).await?;
    let mut permissions: HashMap<String, Permission> = HashMap::new();
    let mut trusted = Vec::new();
    let mut left_out = Vec::new();
    let mut go_command = None;
    let mut newest_comment_id = handled_command_id;
    let sticky = comments
        .iter()
        .find(|c| c.body.starts_with(comment::MARKER) && bot.is_none_or(|b| b == c.author))
        .map(|c| (c.id, c.body.clone()));
    for c in &comments {
        newest_comment_id = newest_comment_id.max(c.id);
        if bot == Some(c.author.as_str()) || c.body.starts_with(comment::MARKER) {
            continue;
        }
        let automation = automation_accounts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&c.author));
        let permission = match permissions.get(&c.author) {
            Some(p) => *p,
            None => {
                let p = forge.permission(&issue_ref.repo, &c.author).await?;
                permissions.insert(c.author.clone(), p);
                p
            }
        };
        if permission.can_write() && c.id > handled_command_id && is_command(&c.body, "go") {
            go_command = Some((c.author.clone(), c.id));
        }
        if is_only_commands(&c.body) {
            // Instructions to the director, not issue content: they never change the text read.
            continue;
        }
        if automation || permission.can_write() {
            trusted.push(prompt_comment(c));
        } else {
            left_out.push(LeftOut {
                author: c.author.clone(),
                comment_id: c.id,
            });
        }
    }
    let prompt = prompt::build(template, issue_ref, &issue.title, &issue.body, &trusted);
    Ok(Gathered {
        issue,
        prompt,
        left_out,
        go_command,
        newest_comment_id,
        sticky,
    })
}

/// `/director <word>` alone on a line of the comment.
pub fn is_command(body: &str, word: &str) -> bool {
    body.lines().any(|l| {
        let mut parts = l.split_whitespace();
        parts.next() == Some("/director")
            && parts.next().is_some_and(|w| w.eq_ignore_ascii_case(word))
            && parts.next().is_none()
    })
}

/// A comment made only of `/director ...` lines.
fn is_only_commands(body: &str) -> bool {
    let mut lines = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .peekable();
    lines.peek().is_some() && lines.all(|l| l.starts_with("/director "))
}

fn prompt_comment(c: &Comment) -> PromptComment {
    PromptComment {
        author: c.author.clone(),
        created_at: c.created_at.clone(),
        body: c.body.clone(),
    }
}

/// The state a kept verdict leads to.
fn lifecycle_of_verdict(state: &PreflightState) -> Option<Lifecycle> {
    match state.verdict.as_deref()? {
        "GO" | "SKIPPED" => Some(Lifecycle::Queued),
        "NO-GO" => Some(Lifecycle::NoGo),
        "WRONG-REPO" if state.routed_to.is_some() => Some(Lifecycle::Routed),
        "WRONG-REPO" => Some(Lifecycle::NoGo),
        _ => None,
    }
}

/// The body of an issue filed elsewhere for a WRONG-REPO verdict.
fn routed_body(from: &IssueRef, issue: &Issue, what: &str) -> String {
    format!(
        "<!-- director:routed-from {from} -->\n\
         Filed by the director: the pre-flight of {from} found that this work belongs here.\n\n\
         **What to do here:** {}\n\n\
         ---\n\n\
         Original issue {from}, \"{}\":\n\n{}\n",
        what.trim(),
        prompt::strip_hidden(&issue.title).trim(),
        prompt::strip_hidden(&issue.body)
            .lines()
            .map(|l| format!("> {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_only_comments_are_not_content() {
        assert!(is_only_commands("/director go"));
        assert!(is_only_commands("\n/director retry\n"));
        assert!(!is_only_commands("/director go\nalso, use TOML"));
        assert!(!is_only_commands(""));
    }

    #[test]
    fn commands_are_recognised_only_alone_on_a_line() {
        assert!(is_command("/director go", "go"));
        assert!(is_command("Looks fine.\n/director GO\n", "go"));
        assert!(!is_command("please /director go now", "go"));
        assert!(!is_command("/director going", "go"));
        assert!(!is_command("/director go now", "go"));
    }
}
