//! The pre-flight read: gather the trusted text, notice a writer's skip, use the cache of the
//! same text, hold to the hourly caps, ask the model. Every outcome, a failure included, goes
//! back to `decide` as an event; it chooses the verdict's consequences and the retries.

use std::sync::Arc;
use std::time::Instant;

use super::Acts;
use super::forge::latest_label_actor;
use crate::director::decide::{HOUR_MS, cap_reached};
use crate::domain::verdict;
use crate::domain::{Command, IssueRef, LeftOut, command::is_only_commands};
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
}

impl Gathered {
    fn context(&self) -> ReadContext {
        ReadContext {
            hash: self.prompt.sha256.clone(),
            left_out: self.left_out.clone(),
            newest_comment_id: self.newest_comment_id,
            title: self.issue.title.clone(),
            body: self.issue.body.clone(),
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
        })
    }

    pub async fn gather(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        handled_command_id: u64,
    ) -> Result<Gathered, ForgeError> {
        gather_with(
            acts.forge.as_ref(),
            Some(acts),
            &self.template,
            &self.settings.automation_accounts,
            acts.bot().as_deref(),
            issue,
            handled_command_id,
        )
        .await
    }

    /// Reads revision `rev` of the issue.
    pub async fn read(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        rev: i64,
        handled_command_id: u64,
    ) -> anyhow::Result<Option<Event>> {
        let outcome = self.outcome(acts, issue, handled_command_id).await?;
        self.count(&outcome);
        Ok(Some(Event::PreflightRead { rev, outcome }))
    }

    async fn outcome(
        &self,
        acts: &Acts,
        issue: &IssueRef,
        handled_command_id: u64,
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
        let read = g.context();
        if let Some((by, _)) = &g.go_command {
            return Ok(PreflightOutcome::Skipped {
                by: by.clone(),
                how: "`/director go`".into(),
                read,
            });
        }
        match skip_label_by(acts, &g.issue, issue).await {
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
        acts.store.record_preflight_call(&issue.repo, now).await?;
        let started = Instant::now();
        let answer = self.provider.read(&g.prompt.text).await;
        crate::failpoint::hit("during_model_call").await;
        if let Some(m) = &self.metrics {
            m.preflight_latency.observe(started.elapsed().as_secs_f64());
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
                        error: "the answer held no verdict line (GO, NO-GO or WRONG-REPO)".into(),
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

    fn count(&self, outcome: &PreflightOutcome) {
        let label = match outcome {
            PreflightOutcome::Read { verdict, .. } => match verdict {
                verdict::Verdict::Go => "go",
                verdict::Verdict::NoGo { .. } => "no_go",
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

/// Reads the issue and its comments and builds the prompt from trusted text: comments by
/// writers and automation accounts, oldest first; the director's own left out silently;
/// everyone else's left out and listed.
pub async fn gather_with(
    forge: &dyn Forge,
    acts: Option<&Acts>,
    template: &str,
    automation_accounts: &[String],
    bot: Option<&str>,
    issue_ref: &IssueRef,
    handled_command_id: u64,
) -> Result<Gathered, ForgeError> {
    let issue = forge.issue(issue_ref).await?;
    let comments = forge.comments(issue_ref).await?;
    let mut permissions: std::collections::HashMap<String, crate::forge::Permission> =
        std::collections::HashMap::new();
    let mut trusted = Vec::new();
    let mut left_out = Vec::new();
    let mut go_command = None;
    let mut newest_comment_id = handled_command_id;
    for c in &comments {
        newest_comment_id = newest_comment_id.max(c.id);
        if bot == Some(c.author.as_str()) || c.body.starts_with(comment::MARKER) {
            continue;
        }
        let automation = automation_accounts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&c.author));
        let permission = match (permissions.get(&c.author), acts) {
            (Some(p), _) => *p,
            (None, Some(acts)) => acts.permission(&issue_ref.repo, &c.author).await?,
            (None, None) => forge.permission(&issue_ref.repo, &c.author).await?,
        };
        permissions.insert(c.author.clone(), permission);
        if permission.can_write()
            && c.id > handled_command_id
            && Command::find(&c.body, &[Command::Go]).is_some()
        {
            go_command = Some((c.author.clone(), c.id));
        }
        if is_only_commands(&c.body) {
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
    })
}

fn prompt_comment(c: &Comment) -> PromptComment {
    PromptComment {
        author: c.author.clone(),
        created_at: c.created_at.clone(),
        body: c.body.clone(),
    }
}
