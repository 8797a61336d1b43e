//! The one place that chooses a state. `decide` takes what the director knows of an issue (its
//! record and its latest run), one [`Event`], the [`Policy`] and `now`, and returns the new
//! record and run with the [`Action`]s the change calls for. No I/O here: the executors perform
//! the actions and report what happened as further events.

use chrono::DateTime;

use crate::domain::command::fix_request;
use crate::domain::issue::CallWindow;
use crate::domain::run::StopCause;
use crate::domain::verdict::Verdict;
use crate::domain::{
    ActionKind, Command, IssueRecord, IssueRef, Judgement, Lifecycle, RepoName, RunRecord, RunState,
};
use crate::domain::{FollowUp, PullRecord, PullState, Vouched};
use crate::engine::action::{Action, ActionKey, Effect, FeedbackSource, Planned};
use crate::engine::comments;
use crate::event::{
    Event, EventKind, ForgeEvent, IssueSnapshot, PreflightOutcome, PullAsk, ReadContext,
    ReviewKind, RunReport, StickyDraft,
};
use crate::preflight::comment::{self, CommentInput, Shown};
use crate::settings::{LabelSettings, OnError, Settings};

/// What decisions depend on, taken from the settings once.
#[derive(Clone, Debug)]
pub struct Policy {
    pub labels: LabelSettings,
    /// A forge is configured: triggers can be judged and state labels kept. Without one,
    /// issues are recorded and nothing is picked up.
    pub forge: bool,
    /// Without a pre-flight, picked-up issues wait in `pending`.
    pub preflight_enabled: bool,
    pub trusted_owners: Vec<String>,
    pub on_error: OnError,
    pub preflight_max_attempts: u32,
    pub retry_backoff_ms: u64,
    pub run_timeout_secs: u64,
    pub idle_timeout_secs: u64,
    pub keep_failed_secs: u64,
    /// `runner.max_followups`.
    pub max_followups: u32,
    /// `runner.start_attempts`.
    pub start_attempts: u32,
    /// Links to the forge's pages (branches), as the forge spells them.
    pub links: crate::settings::WebLinks,
}

impl Policy {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            labels: settings.labels.clone(),
            forge: !settings.forge.url.is_empty(),
            preflight_enabled: settings.preflight.enabled,
            trusted_owners: settings.preflight.trusted_owners.clone(),
            on_error: settings.preflight.on_error,
            preflight_max_attempts: settings.preflight.max_attempts.max(1),
            retry_backoff_ms: settings.preflight.retry_backoff_ms,
            run_timeout_secs: settings.runner.timeout_secs,
            idle_timeout_secs: settings.runner.idle_timeout_secs,
            keep_failed_secs: settings.runner.keep_failed_secs,
            max_followups: settings.runner.max_followups,
            start_attempts: settings.runner.start_attempts.max(1),
            links: crate::settings::WebLinks {
                base: settings.forge.web_url(),
                kind: settings.forge.kind,
            },
        }
    }
}

/// What the director knows of one issue when an event arrives.
#[derive(Clone, Copy, Debug)]
pub struct IssueView<'a> {
    pub issue: &'a IssueRef,
    pub record: Option<&'a IssueRecord>,
    /// The issue's latest run, if it ever had one.
    pub run: Option<&'a RunRecord>,
}

/// The outcome of one event: the new record and run, and what must happen next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub record: IssueRecord,
    pub run: Option<RunRecord>,
    pub actions: Vec<Planned>,
    /// Keys of actions not yet started that this change makes pointless.
    pub retract: Vec<ActionKey>,
}

/// The decision for `event`; `None` when it changes nothing (a stale result, an older
/// delivery, a duplicate, a pull request, an event for a state that has moved on).
pub fn decide(view: &IssueView<'_>, event: &Event, policy: &Policy, now: i64) -> Option<Decision> {
    let mut step = Step::new(view, policy, now);
    let changed = match event {
        Event::Forge(fact) => step.forge_fact(fact),
        Event::TriggerJudged {
            actor,
            trusted,
            labelled_at,
            ..
        } => step.trigger_judged(actor, *trusted, labelled_at.as_deref()),
        Event::CommandJudged {
            command,
            actor,
            allowed,
        } => *allowed && step.command(*command, actor),
        Event::PreflightRead { rev, outcome } => step.preflight_read(*rev, outcome),
        Event::RoutedFiled { rev, filed, sticky } => step.routed_filed(*rev, filed, sticky),
        Event::Admitted { run_id, branch } => step.admitted(run_id, branch),
        Event::Run { run_id, report } => step.run_report(run_id, report),
        Event::ActionGaveUp {
            key,
            kind,
            error,
            run,
        } => step.gave_up(
            *kind,
            run.as_deref().or_else(|| run_of_legacy_key(key)),
            error,
        ),
        Event::PullAsked {
            pr, allowed, ask, ..
        } => *allowed && step.pull_asked(*pr, ask),
    };
    changed.then(|| step.finish())
}

/// What a webhook fact or scan observation changed of the record.
struct Seen {
    was_judged: bool,
    unchanged: bool,
    skip_changed: bool,
    trigger_was_there: bool,
}

/// One decision being made: the record and run as they become, and the actions planned.
struct Step<'a> {
    policy: &'a Policy,
    now: i64,
    known: bool,
    before: Lifecycle,
    /// The state label the issue had before this decision.
    before_label: Option<String>,
    record: IssueRecord,
    run: Option<RunRecord>,
    actions: Vec<(Effect, Action, i64)>,
    retract: Vec<Effect>,
    /// Set by a give-up: the reason stays visible through the change it causes.
    blocked: Option<String>,
}

impl<'a> Step<'a> {
    fn new(view: &IssueView<'_>, policy: &'a Policy, now: i64) -> Self {
        let record = view
            .record
            .cloned()
            .unwrap_or_else(|| IssueRecord::new(view.issue, now));
        Self {
            policy,
            now,
            known: view.record.is_some(),
            before: record.lifecycle,
            before_label: state_label(&policy.labels, &record).map(str::to_owned),
            record,
            run: view.run.cloned(),
            actions: Vec::new(),
            retract: Vec::new(),
            blocked: None,
        }
    }

    /// The version the decision's actions are named after.
    fn version(&self) -> i64 {
        self.record.version + 1
    }

    fn act(&mut self, what: Effect, action: Action) {
        self.act_at(what, action, self.now);
    }

    fn act_at(&mut self, what: Effect, action: Action, not_before_ms: i64) {
        self.actions.push((what, action, not_before_ms));
    }

    fn finish(mut self) -> Decision {
        if self.policy.forge
            && self.before_label.as_deref() != state_label(&self.policy.labels, &self.record)
        {
            let v = self.version();
            // An issue's actions run in order: the labels go before any deferred action (a
            // read waiting for its cap), which would hold them back until it is due.
            let at = self
                .actions
                .iter()
                .position(|(_, _, not_before)| *not_before > self.now)
                .unwrap_or(self.actions.len());
            self.actions.insert(
                at,
                (Effect::Labels { version: v }, Action::SyncLabels, self.now),
            );
        }
        if let Some(reason) = self.blocked.take() {
            self.record.blocked = Some(reason);
        } else if self.record.lifecycle != self.before {
            self.record.blocked = None;
        }
        self.record.version += 1;
        self.record.last_change_ms = self.now;
        let issue = self.record.issue_ref();
        let key = |effect| ActionKey {
            issue: issue.clone(),
            effect,
        };
        let actions = self
            .actions
            .into_iter()
            .map(|(effect, action, not_before_ms)| Planned {
                key: key(effect),
                action,
                not_before_ms,
            })
            .collect();
        let retract = self.retract.into_iter().map(key).collect();
        Decision {
            record: self.record,
            run: self.run,
            actions,
            retract,
        }
    }

    // ---- webhook facts and scan observations ----

    /// A webhook fact or scan observation: record what the issue looks like now, then react.
    fn forge_fact(&mut self, fact: &ForgeEvent) -> bool {
        if fact.is_pull {
            return self.pull_fact(fact);
        }
        if self.known
            && !is_not_older(
                fact.snapshot.updated_at.as_deref(),
                self.record.forge_updated_at.as_deref(),
            )
        {
            return false;
        }
        let seen = self.record_snapshot(&fact.snapshot);
        let live = self.record.trigger_present && self.record.is_open();
        let trusted = self.record.trigger_trusted == Some(true);
        let command = match &fact.comment {
            Some(c) if fact.kind == EventKind::IssueComment && fact.action == "created" => {
                Command::find(&c.body, &[Command::Cancel, Command::Retry]).map(|cmd| (cmd, c.id))
            }
            _ => None,
        };
        let acted = if let Some((command, comment_id)) =
            command.filter(|_| live && !fact.sender.is_empty() && trusted)
        {
            // Counts only once the author's permission is known.
            self.act(
                Effect::Command {
                    comment: comment_id,
                    command,
                },
                Action::AuthorizeCommand {
                    command,
                    actor: fact.sender.clone(),
                },
            );
            true
        } else if live && seen.was_judged {
            trusted && self.content_changed(fact, seen.skip_changed)
        } else if live && self.policy.forge && !seen.trigger_was_there {
            self.trigger_applied(&fact.snapshot);
            true
        } else if live && self.policy.forge && self.record.trigger_trusted.is_none() {
            // Still not judged (the timeline or permission read failed): ask again. The text
            // proposed stays the one first seen with the trigger; an edit since is not vouched
            // for by whoever applied it.
            self.resolve_trigger();
            true
        } else if self.record.lifecycle.is_active() {
            self.cancel();
            true
        } else {
            false
        };
        acted || !seen.unchanged
    }

    /// Takes the issue's title, state and labels from `snap`; says what changed.
    fn record_snapshot(&mut self, snap: &IssueSnapshot) -> Seen {
        let trigger = self.policy.labels.trigger.as_str();
        let skip = self.policy.labels.skip_preflight.as_str();
        let labels = sorted(&snap.labels);
        let seen = Seen {
            was_judged: self.known
                && self.record.trigger_present
                && self.record.is_open()
                && self.record.trigger_trusted.is_some(),
            unchanged: self.known
                && self.record.title == snap.title
                && self.record.state == snap.state
                && self.record.labels == labels
                && self.record.forge_updated_at == snap.updated_at,
            skip_changed: self.record.labels.iter().any(|l| l == skip)
                != labels.iter().any(|l| l == skip),
            trigger_was_there: self.known && self.record.trigger_present,
        };
        self.record.title = snap.title.clone();
        self.record.state = snap.state.clone();
        self.record.labels = labels;
        self.record.forge_updated_at = snap.updated_at.clone();
        self.record.trigger_present = self.record.labels.iter().any(|l| l == trigger);
        seen
    }

    /// A trusted issue's content changed (an edit, a comment, the skip label): read it again,
    /// unless a run is on (a comment during a run starts nothing and interrupts nothing).
    fn content_changed(&mut self, fact: &ForgeEvent, skip_changed: bool) -> bool {
        let content_event = !fact.sender.is_empty()
            && match fact.kind {
                EventKind::Issues => fact.action == "edited",
                EventKind::IssueComment => true,
                EventKind::IssueLabel => skip_changed,
                _ => false,
            };
        // While its pull request is open, the issue's text is settled: feedback goes to the PR.
        let rereadable = self.record.lifecycle.is_active()
            && !self.has_open_pull()
            && !matches!(
                self.record.lifecycle,
                Lifecycle::Launching | Lifecycle::Running
            );
        if !content_event || !rereadable {
            return false;
        }
        let says_go = fact.kind == EventKind::IssueComment
            && fact.action == "created"
            && fact
                .comment
                .as_ref()
                .is_some_and(|c| Command::find(&c.body, &[Command::Go]).is_some());
        if fact.kind == EventKind::Issues || says_go {
            // Read as the new text only if the editor may write (the read checks). A writer's
            // `/director go` vouches for the text as it was when they said it, which this
            // delivery carries.
            self.record.preflight.proposed = Some(Vouched {
                title: fact.snapshot.title.clone(),
                body: fact.snapshot.body.clone(),
                by: fact.sender.clone(),
            });
        }
        // Read again; a read of the same trusted text keeps its verdict.
        self.request_read();
        true
    }

    /// The trigger is newly on (or not judged yet): find out who applied it. Reopening an
    /// issue whose trigger stayed on revives nothing: a writer applies it again, or says
    /// `/director retry`. The text as it is now is what whoever applied it vouches for.
    fn trigger_applied(&mut self, snap: &IssueSnapshot) {
        self.record.preflight.proposed = Some(Vouched {
            title: snap.title.clone(),
            body: snap.body.clone(),
            by: String::new(),
        });
        self.record.preflight.proposed_seen_at = snap.updated_at.clone();
        self.record.trigger_actor = None;
        self.record.trigger_trusted = None;
        self.resolve_trigger();
    }

    fn resolve_trigger(&mut self) {
        let v = self.version();
        self.act(Effect::Resolve { version: v }, Action::ResolveTrigger);
    }

    fn trigger_judged(
        &mut self,
        actor: &Option<String>,
        trusted: bool,
        labelled_at: Option<&str>,
    ) -> bool {
        if self.record.trigger_trusted.is_some()
            || !self.record.trigger_present
            || !self.record.is_open()
        {
            return false;
        }
        self.record.trigger_actor = actor.clone();
        self.record.trigger_trusted = Some(trusted);
        // What the trigger's (trusted) author vouched for is the text as it was when they
        // applied it: text seen with nothing changed on the issue after the label went on
        // (its `updated_at` not after the label's timeline entry; the label's own delivery
        // is such a sight). Any delivery, a label change among them, may come after a lost
        // one that carried a reader's edit: its text is not the labeller's to vouch for, and
        // the read then leaves a non-writer's text out and lists it.
        let proposed = self.record.preflight.proposed.take();
        let seen_at = self.record.preflight.proposed_seen_at.take();
        let as_labelled = matches!((labelled_at, seen_at.as_deref()),
            (Some(at), Some(seen_at)) if is_not_older(Some(at), Some(seen_at)));
        if trusted {
            if as_labelled {
                self.record.preflight.vouched = proposed.map(|p| Vouched {
                    by: actor.clone().unwrap_or_default(),
                    ..p
                });
            }
            self.request_read();
        } else {
            self.set_lifecycle(Lifecycle::Untracked);
            if !self.record.untrusted_notice {
                self.record.untrusted_notice = true;
                self.act(
                    Effect::UntrustedNotice,
                    Action::PostNotice {
                        marker: comments::UNTRUSTED_MARKER.into(),
                        body: comments::untrusted_trigger(
                            &self.policy.labels.trigger,
                            actor.as_deref(),
                        ),
                    },
                );
            }
        }
        true
    }

    fn command(&mut self, command: Command, _actor: &str) -> bool {
        match command {
            Command::Cancel if self.record.lifecycle.is_active() => {
                self.cancel();
                true
            }
            Command::Retry
                if matches!(
                    self.record.lifecycle,
                    Lifecycle::Failed
                        | Lifecycle::TimedOut
                        | Lifecycle::Cancelled
                        | Lifecycle::Declined
                        | Lifecycle::PrClosed
                ) && self.record.trigger_present
                    && self.record.is_open() =>
            {
                self.set_lifecycle(Lifecycle::Queued);
                true
            }
            _ => false,
        }
    }

    /// Stops whatever is going on: a pending read is retracted, an active run is stopped.
    fn cancel(&mut self) {
        if self.has_open_pull() {
            // The pull request stays; only the follow-up stops.
            self.cancel_followup();
            return;
        }
        self.retract.push(Effect::Read {
            rev: self.record.preflight.rev,
        });
        self.set_lifecycle(Lifecycle::Cancelled);
        if let Some(run) = self.run.as_mut().filter(|r| r.state.is_active())
            && !run.stop_requested
        {
            run.stop_requested = true;
            let id = run.id.clone();
            self.act(
                Effect::Stop { run: id.clone() },
                Action::StopRun { run_id: id },
            );
        }
    }

    /// Moves the issue to `pending` under a new revision, and asks for a read.
    fn request_read(&mut self) {
        self.retract.push(Effect::Read {
            rev: self.record.preflight.rev,
        });
        let p = &mut self.record.preflight;
        p.rev += 1;
        p.attempts = 0;
        p.last_error = None;
        p.not_before_ms = None;
        self.set_lifecycle(Lifecycle::Pending);
        self.plan_read(self.now);
    }

    fn plan_read(&mut self, at: i64) {
        if !self.policy.preflight_enabled {
            return;
        }
        let rev = self.record.preflight.rev;
        let handled_command_id = self.record.preflight.handled_command_id;
        self.act_at(
            Effect::Read { rev },
            Action::ReadPreflight {
                rev,
                handled_command_id,
            },
            at,
        );
    }

    fn set_lifecycle(&mut self, to: Lifecycle) {
        self.record.lifecycle = to;
    }

    // ---- the pre-flight ----

    fn preflight_read(&mut self, rev: i64, outcome: &PreflightOutcome) -> bool {
        if self.record.lifecycle != Lifecycle::Pending || self.record.preflight.rev != rev {
            return false;
        }
        match outcome {
            PreflightOutcome::NotEligible => false,
            PreflightOutcome::Skipped { by, how, read } => {
                self.seen_commands(read);
                let p = &mut self.record.preflight;
                p.verdict = Some(Judgement::Skipped);
                p.reason = Some(format!("skipped by @{by}"));
                p.hash = Some(read.hash.clone());
                p.attempts = 0;
                p.not_before_ms = None;
                let shown = Shown::Skipped {
                    by: by.clone(),
                    how: how.clone(),
                };
                self.sticky(&shown, None, "", read);
                self.set_lifecycle(Lifecycle::Queued);
                true
            }
            PreflightOutcome::Read {
                verdict,
                reading,
                model,
                read,
            } => {
                self.seen_commands(read);
                self.verdict(verdict, reading, model, read);
                true
            }
            PreflightOutcome::Failed {
                error,
                reading,
                model,
                read,
            } => {
                self.failed_read(error, reading.as_deref(), model, read.as_ref());
                true
            }
            PreflightOutcome::Capped {
                limit,
                until_ms,
                read,
            } => {
                // Waiting in the cap's queue is a state (its label, `status`, the status
                // page), not news: no comment, so a backlog never notifies every watcher.
                self.vouch(read);
                tracing::debug!(limit, until = %format_time(*until_ms), "pre-flight waits for its cap");
                self.record.preflight.not_before_ms = Some(*until_ms);
                self.record.preflight.rev += 1;
                self.plan_read(*until_ms);
                true
            }
        }
    }

    fn seen_commands(&mut self, read: &ReadContext) {
        let p = &mut self.record.preflight;
        p.handled_command_id = p.handled_command_id.max(read.newest_comment_id);
        self.vouch(read);
    }

    /// The read found a writer vouching for the text as it is: that is the text from now on.
    fn vouch(&mut self, read: &ReadContext) {
        if let Some(v) = &read.vouched {
            let p = &mut self.record.preflight;
            p.vouched = Some(v.clone());
            p.proposed = None;
        }
    }

    fn verdict(&mut self, verdict: &Verdict, reading: &str, model: &str, read: &ReadContext) {
        let p = &mut self.record.preflight;
        p.hash = Some(read.hash.clone());
        p.model = Some(model.to_owned());
        p.attempts = 0;
        p.last_error = None;
        p.not_before_ms = None;
        let (shown, lifecycle, judgement) = match verdict {
            Verdict::Go => (Shown::Go, Lifecycle::Queued, Judgement::Go),
            Verdict::NoGo { reason } => (
                Shown::NoGo {
                    reason: reason.clone(),
                },
                Lifecycle::NoGo,
                Judgement::NoGo,
            ),
            Verdict::WrongRepo { repo, what } if self.trusted_owner(repo) => {
                self.record.preflight.verdict = Some(Judgement::WrongRepo);
                self.record.preflight.reason = Some(what.clone());
                self.set_lifecycle(Lifecycle::Routed);
                let draft = StickyDraft {
                    reading: Some(reading.to_owned()),
                    model: model.to_owned(),
                    read: read.clone(),
                    what: what.clone(),
                    target: repo.clone(),
                };
                match self.record.preflight.routed_to.clone() {
                    // Filed there by an earlier read of this issue: say so again.
                    Some(filed) if filed.starts_with(&format!("{repo}#")) => {
                        self.routed_sticky(&filed, &draft);
                    }
                    _ => {
                        self.record.preflight.routed_to = None;
                        let from = self.record.issue_ref();
                        let rev = self.record.preflight.rev;
                        self.act(
                            Effect::Routed { rev },
                            Action::FileRouted {
                                rev,
                                target: repo.clone(),
                                title: comments::routed_title(&read.title),
                                body: comments::routed_body(&from, &read.title, &read.body, what),
                                marker: comments::routed_marker(&from),
                                sticky: Box::new(draft),
                            },
                        );
                    }
                }
                return;
            }
            Verdict::WrongRepo { repo, what } => {
                let reason = format!(
                    "the read says this belongs in {repo} ({what}), but `{}` is not in preflight.trusted_owners",
                    repo.owner()
                );
                (Shown::NoGo { reason }, Lifecycle::NoGo, Judgement::NoGo)
            }
        };
        self.record.preflight.verdict = Some(if matches!(verdict, Verdict::WrongRepo { .. }) {
            Judgement::WrongRepo
        } else {
            judgement
        });
        self.record.preflight.reason = match &shown {
            Shown::NoGo { reason } => Some(reason.clone()),
            _ => None,
        };
        self.sticky(&shown, Some(reading), model, read);
        self.set_lifecycle(lifecycle);
    }

    fn trusted_owner(&self, repo: &RepoName) -> bool {
        self.policy
            .trusted_owners
            .iter()
            .any(|o| o.eq_ignore_ascii_case(repo.owner()))
    }

    fn failed_read(
        &mut self,
        error: &str,
        reading: Option<&str>,
        model: &str,
        read: Option<&ReadContext>,
    ) {
        let p = &mut self.record.preflight;
        p.attempts += 1;
        p.last_error = Some(error.to_owned());
        if p.attempts < self.policy.preflight_max_attempts {
            let at = self
                .now
                .saturating_add(backoff_ms(p.attempts, self.policy.retry_backoff_ms));
            p.not_before_ms = Some(at);
            p.rev += 1;
            self.plan_read(at);
            return;
        }
        let proceeding = self.policy.on_error == OnError::Proceed;
        let shown = Shown::Failed {
            error: error.to_owned(),
            proceeding,
        };
        let empty = ReadContext::default();
        self.sticky(&shown, reading, model, read.unwrap_or(&empty));
        let p = &mut self.record.preflight;
        p.verdict = Some(Judgement::Error);
        p.reason = Some(error.to_owned());
        p.not_before_ms = None;
        self.set_lifecycle(if proceeding {
            Lifecycle::Queued
        } else {
            Lifecycle::PreflightFailed
        });
    }

    fn routed_filed(&mut self, rev: i64, filed: &IssueRef, draft: &StickyDraft) -> bool {
        if self.record.lifecycle != Lifecycle::Routed
            || self.record.preflight.rev != rev
            || self.record.preflight.routed_to.is_some()
        {
            return false;
        }
        let filed = filed.to_string();
        self.record.preflight.routed_to = Some(filed.clone());
        self.routed_sticky(&filed, draft);
        true
    }

    fn routed_sticky(&mut self, filed: &str, draft: &StickyDraft) {
        let shown = Shown::Routed {
            repo: draft.target.clone(),
            filed: filed.to_owned(),
            what: draft.what.clone(),
        };
        self.sticky(&shown, draft.reading.as_deref(), &draft.model, &draft.read);
    }

    /// Plans the edit of the one pre-flight comment.
    fn sticky(&mut self, shown: &Shown, reading: Option<&str>, model: &str, read: &ReadContext) {
        let body = comment::render(&CommentInput {
            shown,
            trigger: &self.policy.labels.trigger,
            skip_label: &self.policy.labels.skip_preflight,
            reading,
            left_out: &read.left_out,
            hidden: &read.hidden,
            model,
            hash: &read.hash,
        });
        let v = self.version();
        self.act(Effect::Sticky { version: v }, Action::UpsertSticky { body });
    }

    // ---- runs ----

    fn admitted(&mut self, run_id: &str, branch: &str) -> bool {
        // A run id names one container and one token, ever: never admitted twice.
        if self.record.lifecycle != Lifecycle::Queued
            || self
                .run
                .as_ref()
                .is_some_and(|r| r.state.is_active() || r.id == run_id)
        {
            return false;
        }
        let mut run = RunRecord::admitted(&self.record.issue_ref(), run_id, branch, self.now);
        if let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) {
            // A follow-up: on the pull request's branch, answering the feedback waiting.
            let Some(feedback) = pr.pending.take() else {
                self.set_lifecycle(Lifecycle::Succeeded);
                return true;
            };
            pr.followups += 1;
            run.branch = pr.branch.clone();
            run.followup = Some(FollowUp {
                pr: pr.number,
                feedback,
                start_head: None,
            });
        }
        self.act(
            Effect::Start {
                run: run_id.to_owned(),
            },
            Action::StartRun {
                run_id: run_id.to_owned(),
            },
        );
        self.run = Some(run);
        self.set_lifecycle(Lifecycle::Launching);
        true
    }

    /// A report about the issue's current run, applied only in the run state it follows from.
    fn run_report(&mut self, run_id: &str, report: &RunReport) -> bool {
        let Some(state) = self
            .run
            .as_ref()
            .filter(|r| r.id == run_id)
            .map(|r| r.state)
        else {
            return false;
        };
        let launched = matches!(state, RunState::Launching | RunState::Running);
        match report {
            RunReport::Started {
                container_id,
                base_branch,
                start_head,
            } if state == RunState::Launching => {
                self.started(container_id, base_branch, start_head.as_deref());
            }
            RunReport::Stale if state == RunState::Launching => self.stale(),
            RunReport::Refused { .. }
                if state == RunState::Launching
                    && self.run.as_ref().is_some_and(|r| r.stop_requested) =>
            {
                self.end_cancelled(run_id);
            }
            RunReport::Refused { why } if state == RunState::Launching => {
                let body = comments::run_refused(run_id, why);
                self.end_run(RunState::Refused, why.clone(), body);
            }
            RunReport::Exited {
                code,
                timed_out,
                log,
                stopped,
                result,
                egress_refused,
            } if launched => {
                // Stored before stop causes were named: a time-out.
                let stopped = stopped.or(timed_out.then_some(StopCause::Timeout));
                if let Some(run) = self.run.as_mut() {
                    run.result = result.clone();
                    run.stopped = stopped;
                    run.egress_refused = egress_refused.clone();
                }
                self.exited(*code, log);
            }
            RunReport::Judged { ahead } if state == RunState::Exited => self.judged(*ahead),
            RunReport::PrOpened { number } if state == RunState::Exited => {
                let mut body = comments::run_succeeded(run_id, *number);
                if let Some(run) = self.run.as_mut() {
                    run.pr_number = Some(*number);
                    if refused_default_push(run) {
                        body.push_str(&comments::default_push_refused(&run.base_branch));
                    }
                    body.push_str(&comments::usage_line(
                        run.result.as_ref().and_then(|r| r.usage.as_ref()),
                    ));
                    self.record.pr = Some(PullRecord::opened(*number, &run.branch));
                }
                self.end_run(RunState::Succeeded, format!("pull request #{number}"), body);
            }
            _ => return false,
        }
        true
    }

    fn started(&mut self, container_id: &str, base_branch: &str, start_head: Option<&str>) {
        let mut notice = None;
        if let Some(run) = self.run.as_mut() {
            run.state = RunState::Running;
            run.container_id = Some(container_id.to_owned());
            run.base_branch = base_branch.to_owned();
            run.started_at_ms = Some(self.now);
            if let Some(f) = run.followup.as_mut() {
                f.start_head = start_head.map(str::to_owned);
                notice = Some((
                    f.pr,
                    comments::followup_start_marker(&run.id),
                    comments::followup_started(&run.id, &f.feedback.by, &run.branch),
                    run.id.clone(),
                ));
            }
        }
        if let Some((pr, marker, body, id)) = notice {
            self.act(
                Effect::FollowupStart { run: id.clone() },
                Action::CommentOnPull { pr, marker, body },
            );
        }
        if self.record.lifecycle == Lifecycle::Launching {
            self.set_lifecycle(Lifecycle::Running);
        }
    }

    /// The trusted text changed since the verdict: nothing started; read it again.
    fn stale(&mut self) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        run.state = RunState::Cancelled;
        run.detail = Some("stale verdict: the issue changed since the pre-flight".into());
        run.finished_at_ms = Some(self.now);
        let id = run.id.clone();
        self.act(
            Effect::Revoke { run: id.clone() },
            Action::RevokeToken { run_id: id },
        );
        if self.record.lifecycle == Lifecycle::Launching {
            self.request_read();
        }
    }

    /// The container ended. Whatever ended it, the branch is judged next: a stopped or
    /// declined run may have pushed work worth naming.
    fn exited(&mut self, code: Option<i64>, log: &str) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        run.exit_code = code;
        run.log_tail = Some(log.to_owned());
        let id = run.id.clone();
        if run.stop_requested {
            self.end_cancelled(&id);
        } else {
            run.state = RunState::Exited;
            self.act(
                Effect::Judge { run: id.clone() },
                Action::JudgeRun { run_id: id },
            );
        }
    }

    /// Why the director stopped the run, in words.
    fn stop_words(&self, cause: StopCause) -> String {
        match cause {
            StopCause::Timeout => format!(
                "it outlived `runner.timeout_secs` ({} s)",
                self.policy.run_timeout_secs
            ),
            StopCause::Idle => format!(
                "it printed nothing for `runner.idle_timeout_secs` ({} s) and was taken to be wedged",
                self.policy.idle_timeout_secs
            ),
        }
    }

    /// Success is the branch ahead of the base, not the exit code; but a run that was stopped
    /// or says it is blocked opens no pull request (its branch is named instead).
    fn judged(&mut self, ahead: u64) {
        let Some(run) = self.run.as_ref() else {
            return;
        };
        let id = run.id.clone();
        let log = run.log_tail.clone().unwrap_or_default();
        let branch_note = (ahead > 0).then(|| {
            comments::branch_note(
                &self.policy.links,
                &run.repo,
                &run.base_branch,
                &run.branch,
                ahead,
            )
        });
        let declined = run.declined_reason().map(str::to_owned);
        if run.stop_requested {
            self.end_cancelled(&id);
        } else if run.followup.is_some() {
            self.followup_judged(ahead);
        } else if let Some(cause) = run.stopped {
            let why = self.stop_words(cause);
            let mut body = comments::run_stopped(&id, &why, &log);
            body.push_str(&branch_note.unwrap_or_default());
            self.end_run(RunState::TimedOut, why, body);
        } else if let Some(reason) = declined {
            let mut body = comments::run_declined(&id, &reason);
            body.push_str(&branch_note.unwrap_or_default());
            self.end_run(RunState::Declined, format!("blocked: {reason}"), body);
        } else if ahead == 0 {
            let code = run.exit_code.map_or("none".to_owned(), |c| c.to_string());
            let mut why = format!(
                "the run exited with code {code} and branch `{}` is not ahead of `{}`",
                run.branch, run.base_branch
            );
            if refused_default_push(run) {
                why.push_str(&format!(
                    "; the forge refused its push to the default branch `{}` (a run pushes to its own branch, `DIRECTOR_BRANCH`)",
                    run.base_branch
                ));
            }
            let body = comments::run_failed(&id, &why, &log);
            self.end_run(RunState::Failed, why, body);
        } else {
            let verdict = self
                .record
                .preflight
                .verdict
                .map_or("none", Judgement::as_str);
            // The title a writer vouched for (the one the run was given), never the issue's
            // latest, which its author may have changed since.
            let vouched = self
                .record
                .preflight
                .vouched
                .as_ref()
                .map(|v| {
                    crate::preflight::prompt::strip_hidden(&v.title)
                        .trim()
                        .to_owned()
                })
                .filter(|t| !t.is_empty());
            let title = vouched.unwrap_or_else(|| format!("Issue #{}", self.record.number));
            let summary = run.result.as_ref().and_then(|r| r.summary.as_deref());
            let body = comments::pr_body(self.record.number, &id, verdict, summary);
            self.act(
                Effect::Pr { run: id.clone() },
                Action::OpenPr {
                    run_id: id.clone(),
                    title,
                    body,
                },
            );
        }
    }

    /// A run stopped because the issue was cancelled ends as cancelled.
    fn end_cancelled(&mut self, id: &str) {
        self.end_run(
            RunState::Cancelled,
            "cancelled".into(),
            comments::run_cancelled(id),
        );
    }

    /// The run ends: its token is revoked, its container removed, the issue told once.
    fn end_run(&mut self, state: RunState, detail: String, report: String) {
        let keep_ms = i64::try_from(self.policy.keep_failed_secs.saturating_mul(1000))
            .unwrap_or(i64::MAX / 4);
        let Some(run) = self.run.as_mut() else {
            return;
        };
        run.state = state;
        run.detail = Some(detail);
        run.finished_at_ms = Some(self.now);
        let id = run.id.clone();
        let report = report + &comments::egress_refused(&run.egress_refused);
        let followup_of = run.followup.as_ref().map(|f| f.pr);
        let keep = matches!(state, RunState::Failed | RunState::TimedOut) && keep_ms > 0;
        // The token first, then the people; the container last (an engine that is down must
        // not hold up the report).
        self.act(
            Effect::Revoke { run: id.clone() },
            Action::RevokeToken { run_id: id.clone() },
        );
        let report = match followup_of {
            // A follow-up answers on the pull request it worked on.
            Some(pr) => Action::CommentOnPull {
                pr,
                marker: comments::run_marker(&id),
                body: report,
            },
            None => Action::ReportRun {
                run_id: id.clone(),
                body: report,
            },
        };
        self.act(Effect::Report { run: id.clone() }, report);
        self.act_at(
            Effect::Remove { run: id.clone() },
            Action::RemoveContainer { run_id: id },
            if keep {
                self.now.saturating_add(keep_ms)
            } else {
                self.now
            },
        );
        if !matches!(
            self.record.lifecycle,
            Lifecycle::Launching | Lifecycle::Running
        ) {
            return;
        }
        if followup_of.is_some() {
            // The pull request is still open: back to it, or on to the feedback that waited.
            self.set_lifecycle(Lifecycle::Succeeded);
            self.queue_followup();
            return;
        }
        self.set_lifecycle(match state {
            RunState::Succeeded => Lifecycle::Succeeded,
            RunState::TimedOut => Lifecycle::TimedOut,
            RunState::Cancelled => Lifecycle::Cancelled,
            RunState::Declined => Lifecycle::Declined,
            _ => Lifecycle::Failed,
        });
    }

    // ---- the pull request ----

    fn has_open_pull(&self) -> bool {
        self.record.pr.as_ref().is_some_and(PullRecord::is_open)
    }

    /// A fact about a pull request, decided on the issue whose run opened it.
    fn pull_fact(&mut self, fact: &ForgeEvent) -> bool {
        let Some(pr) = self
            .record
            .pr
            .as_ref()
            .filter(|p| p.number == fact.issue.number)
        else {
            return false;
        };
        let number = pr.number;
        let open = pr.is_open();
        let snap = &fact.snapshot;
        match fact.kind {
            EventKind::PullRequest | EventKind::Scan => {
                if snap.state == "closed" && open {
                    self.pull_ended(snap.merged);
                    true
                } else if snap.state == "open" && pr.state == PullState::Closed {
                    self.pull_reopened();
                    true
                } else {
                    false
                }
            }
            EventKind::PullReview => {
                let Some(review) = fact
                    .review
                    .as_ref()
                    .filter(|r| r.kind == ReviewKind::ChangesRequested)
                else {
                    // An approval or a plain comment review starts nothing.
                    return false;
                };
                if !open || fact.sender.is_empty() {
                    return false;
                }
                let key = short_hash(&[
                    &fact.sender,
                    &review.body,
                    snap.updated_at.as_deref().unwrap_or(""),
                ]);
                self.act(
                    Effect::ReviewFeedback {
                        pr: number,
                        review: key,
                    },
                    Action::ReadFeedback {
                        pr: number,
                        sender: fact.sender.clone(),
                        source: FeedbackSource::Review {
                            body: review.body.clone(),
                        },
                    },
                );
                true
            }
            EventKind::PullComment => {
                let Some(c) = fact.comment.as_ref() else {
                    return false;
                };
                let asks = fix_request(&c.body).is_some()
                    || Command::find(&c.body, &[Command::Cancel, Command::Retry]).is_some();
                if fact.action != "created" || !open || !asks || fact.sender.is_empty() {
                    return false;
                }
                self.act(
                    Effect::CommentFeedback {
                        pr: number,
                        comment: c.id,
                    },
                    Action::ReadFeedback {
                        pr: number,
                        sender: fact.sender.clone(),
                        source: FeedbackSource::Comment {
                            id: c.id,
                            body: c.body.clone(),
                        },
                    },
                );
                true
            }
            _ => false,
        }
    }

    /// Merged or closed: the issue says so, and a follow-up on it stops.
    fn pull_ended(&mut self, merged: bool) {
        let v = self.version();
        let Some(pr) = self.record.pr.as_mut() else {
            return;
        };
        pr.state = if merged {
            PullState::Merged
        } else {
            PullState::Closed
        };
        pr.pending = None;
        let number = pr.number;
        self.stop_followup();
        self.set_lifecycle(if merged {
            Lifecycle::Merged
        } else {
            Lifecycle::PrClosed
        });
        if !merged {
            self.act(
                Effect::PrClosed {
                    pr: number,
                    version: v,
                },
                Action::PostNotice {
                    marker: comments::pr_closed_marker(number, v),
                    body: comments::pr_closed(number, v),
                },
            );
        }
    }

    fn pull_reopened(&mut self) {
        if let Some(pr) = self.record.pr.as_mut() {
            pr.state = PullState::Open;
        }
        if self.record.lifecycle == Lifecycle::PrClosed {
            self.set_lifecycle(Lifecycle::Succeeded);
        }
    }

    /// A writer's review, fix, cancel or retry on the open pull request.
    fn pull_asked(&mut self, number: u64, ask: &PullAsk) -> bool {
        let Some(pr) = self
            .record
            .pr
            .as_mut()
            .filter(|p| p.number == number && p.is_open())
        else {
            return false;
        };
        match ask {
            PullAsk::Fix { feedback } => {
                if !pr.take(&feedback.key) {
                    return false;
                }
                pr.pending = Some(match pr.pending.take() {
                    Some(waiting) => waiting.merged_with(feedback.clone()),
                    None => feedback.clone(),
                });
                self.queue_followup();
                true
            }
            PullAsk::Cancel { comment_id } => {
                if !pr.take(&format!("comment:{comment_id}")) {
                    return false;
                }
                self.cancel_followup();
                true
            }
            PullAsk::Retry { comment_id } => {
                if !pr.take(&format!("comment:{comment_id}")) {
                    return false;
                }
                pr.followups = 0;
                pr.grants += 1;
                if let Some(capped) = pr.capped.take() {
                    pr.pending = Some(match pr.pending.take() {
                        Some(waiting) => waiting.merged_with(capped),
                        None => capped,
                    });
                }
                self.queue_followup();
                true
            }
        }
    }

    /// Feedback is waiting: queue a follow-up, unless a run is on (it waits for its end) or
    /// the cap is reached (it waits for a writer's `/director retry`; the PR is told once).
    fn queue_followup(&mut self) {
        let max = self.policy.max_followups;
        if self.record.lifecycle != Lifecycle::Succeeded {
            return;
        }
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) else {
            return;
        };
        let Some(feedback) = pr.pending.take() else {
            return;
        };
        if pr.followups >= max {
            pr.capped = Some(match pr.capped.take() {
                Some(earlier) => earlier.merged_with(feedback),
                None => feedback,
            });
            let (number, grants) = (pr.number, pr.grants);
            self.act(
                Effect::FollowupCap { pr: number, grants },
                Action::CommentOnPull {
                    pr: number,
                    marker: comments::followup_cap_marker(number, grants),
                    body: comments::followup_cap(number, grants, max),
                },
            );
            return;
        }
        pr.pending = Some(feedback);
        self.set_lifecycle(Lifecycle::Queued);
    }

    /// Stops the follow-up: waiting feedback is dropped, a running one is stopped.
    fn cancel_followup(&mut self) {
        if let Some(pr) = self.record.pr.as_mut() {
            pr.pending = None;
        }
        self.stop_followup();
        if self.record.lifecycle == Lifecycle::Queued {
            self.set_lifecycle(Lifecycle::Succeeded);
        }
    }

    fn stop_followup(&mut self) {
        if let Some(run) = self
            .run
            .as_mut()
            .filter(|r| r.state.is_active() && r.followup.is_some())
            && !run.stop_requested
        {
            run.stop_requested = true;
            let id = run.id.clone();
            self.act(
                Effect::Stop { run: id.clone() },
                Action::StopRun { run_id: id },
            );
        }
    }

    /// A follow-up succeeds once the branch moved past the head it started from.
    fn followup_judged(&mut self, ahead: u64) {
        let Some(run) = self.run.as_ref() else {
            return;
        };
        let id = run.id.clone();
        let log = run.log_tail.clone().unwrap_or_default();
        let summary = run.result.as_ref().and_then(|r| r.summary.clone());
        let usage = comments::usage_line(run.result.as_ref().and_then(|r| r.usage.as_ref()));
        let stopped = run.stopped;
        let declined = run.declined_reason().map(str::to_owned);
        if ahead > 0 && stopped.is_none() && declined.is_none() {
            let mut body = comments::followup_succeeded(&id, ahead, summary.as_deref());
            body.push_str(&usage);
            self.end_run(
                RunState::Succeeded,
                format!("{ahead} new commit(s) on the pull request"),
                body,
            );
            return;
        }
        let mut why = match (stopped, &declined) {
            (Some(cause), _) => format!("it was stopped: {}", self.stop_words(cause)),
            (None, Some(reason)) => format!("the agent reported that it is blocked: {reason}"),
            (None, None) => {
                let code = run.exit_code.map_or("none".to_owned(), |c| c.to_string());
                format!(
                    "the run exited with code {code} and pushed no new commits to `{}`",
                    run.branch
                )
            }
        };
        if ahead > 0 {
            why.push_str(&format!(
                "; {ahead} commit(s) it pushed before that are on the pull request"
            ));
        }
        let state = match (stopped, declined) {
            (Some(_), _) => RunState::TimedOut,
            (None, Some(_)) => RunState::Declined,
            _ => RunState::Failed,
        };
        let body = comments::followup_failed(&id, &why, &log);
        self.end_run(state, why, body);
    }

    // ---- actions that failed on every attempt ----

    /// `run`: the run the action was about, if it was one run's.
    fn gave_up(&mut self, kind: ActionKind, run: Option<&str>, error: &str) -> bool {
        let run_state = self.run.as_ref().map(|r| r.state);
        // One that gave up for an earlier run (its start still being retried when that run
        // was cancelled and the issue run again) says nothing about the run there is now.
        let of_this_run = self
            .run
            .as_ref()
            .is_some_and(|r| run == Some(r.id.as_str()));
        let about_a_run = matches!(
            kind,
            ActionKind::StartRun | ActionKind::JudgeRun | ActionKind::OpenPr
        );
        if about_a_run && !of_this_run {
            return false;
        }
        match (kind, run_state) {
            (ActionKind::StartRun, Some(RunState::Launching)) => {
                let why = format!("the run could not be started: {error}");
                let id = self.run.as_ref().map(|r| r.id.clone()).unwrap_or_default();
                self.end_run(
                    RunState::Failed,
                    why.clone(),
                    comments::run_failed(&id, &why, ""),
                );
            }
            (ActionKind::JudgeRun | ActionKind::OpenPr, Some(RunState::Exited)) => {
                let why = if kind == ActionKind::JudgeRun {
                    format!("the run's branch could not be checked: {error}")
                } else {
                    format!("opening the pull request failed: {error}")
                };
                let run = self.run.as_ref();
                let id = run.map(|r| r.id.clone()).unwrap_or_default();
                let log = run.and_then(|r| r.log_tail.clone()).unwrap_or_default();
                self.end_run(
                    RunState::Failed,
                    why.clone(),
                    comments::run_failed(&id, &why, &log),
                );
            }
            (ActionKind::FileRouted, _) if self.record.lifecycle == Lifecycle::Routed => {
                let error = format!("filing the issue in the named repository failed: {error}");
                let shown = Shown::Failed {
                    error: error.clone(),
                    proceeding: false,
                };
                self.sticky(&shown, None, "", &ReadContext::default());
                self.record.preflight.verdict = Some(Judgement::Error);
                self.record.preflight.reason = Some(error);
                self.set_lifecycle(Lifecycle::PreflightFailed);
            }
            _ => {}
        }
        self.blocked = Some(format!("{kind} failed on every attempt: {error}"));
        true
    }
}

/// The run a give-up stored by an earlier version was about: those events carry only the
/// action's key, whose last part is the run id for the actions of one run
/// (`owner/name#N:start:<id>`). Newer events carry the run itself.
fn run_of_legacy_key(key: &str) -> Option<&str> {
    key.rsplit(':').next()
}

/// The retry delay after `attempts` failed reads: doubling from `base_ms`, capped.
pub fn backoff_ms(attempts: u32, base_ms: u64) -> i64 {
    let ms = base_ms.saturating_mul(1 << attempts.saturating_sub(1).min(10));
    i64::try_from(ms).unwrap_or(i64::MAX / 4)
}

pub const HOUR_MS: i64 = 3_600_000;

/// Which hourly cap a new call would break, and when a call is allowed again.
pub fn cap_reached(
    window: &CallWindow,
    repo: &RepoName,
    max_per_hour: u32,
    max_per_repo_per_hour: u32,
    now: i64,
) -> Option<(String, i64)> {
    let (limit, oldest) = if window.repo_total >= i64::from(max_per_repo_per_hour) {
        (
            format!("{max_per_repo_per_hour} pre-flights per hour for {repo}"),
            window.repo_oldest_ms,
        )
    } else if window.total >= i64::from(max_per_hour) {
        (
            format!("{max_per_hour} pre-flights per hour"),
            window.oldest_ms,
        )
    } else {
        return None;
    };
    Some((limit, oldest.unwrap_or(now) + HOUR_MS + 1_000))
}

fn format_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// The state label for a lifecycle state, if it has one.
pub fn state_label<'a>(labels: &'a LabelSettings, record: &IssueRecord) -> Option<&'a str> {
    let name = match record.lifecycle {
        Lifecycle::Pending if record.preflight.not_before_ms.is_some() => &labels.waiting,
        Lifecycle::Queued => &labels.queued,
        Lifecycle::Launching | Lifecycle::Running => &labels.running,
        Lifecycle::Succeeded => &labels.pr_open,
        Lifecycle::Merged => &labels.merged,
        Lifecycle::Failed | Lifecycle::TimedOut | Lifecycle::PreflightFailed => &labels.failed,
        Lifecycle::NoGo => &labels.no_go,
        _ => return None,
    };
    (!name.is_empty()).then_some(name.as_str())
}

/// Every state label the director manages.
pub fn all_state_labels(labels: &LabelSettings) -> Vec<&str> {
    [
        &labels.queued,
        &labels.running,
        &labels.pr_open,
        &labels.failed,
        &labels.no_go,
        &labels.merged,
        &labels.waiting,
    ]
    .into_iter()
    .filter(|l| !l.is_empty())
    .map(String::as_str)
    .collect()
}

/// True when `candidate` is at least as new as `known` (Forgejo's `updated_at`, RFC 3339).
/// A missing or unreadable timestamp never wins over a readable one.
pub fn is_not_older(candidate: Option<&str>, known: Option<&str>) -> bool {
    let parse = |s: Option<&str>| s.and_then(|s| DateTime::parse_from_rfc3339(s).ok());
    match (parse(candidate), parse(known)) {
        (Some(c), Some(k)) => c >= k,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        (None, None) => true,
    }
}

/// Labels in a canonical order, so the same set always compares equal.
pub fn sorted(labels: &[String]) -> Vec<String> {
    let mut out = labels.to_vec();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

/// Whether the run's log shows the forge refusing its push to the default branch.
fn refused_default_push(run: &RunRecord) -> bool {
    !run.base_branch.is_empty()
        && run
            .log_tail
            .as_deref()
            .is_some_and(|log| crate::domain::run::log_shows_refused_push(log, &run.base_branch))
}

/// A short stable name for a piece of text (feedback without an id of its own).
fn short_hash(parts: &[&str]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
