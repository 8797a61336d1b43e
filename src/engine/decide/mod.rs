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
    ActionKind, Command, IssueRecord, IssueRef, Judgement, Lifecycle, RepoName, RunId, RunRecord,
    RunState,
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

mod checks;
mod filers;
mod gave_up;
mod issue;
pub mod lane;
mod preflight;
mod pull;
mod runs;
pub use filers::{FILER_MARKER, FilerDay, filer_limit};
mod thread;
pub use runs::{
    BranchSeen, RunnerRole, StartFacts, StartRefusal, runner_role_refusal, start_refusal,
};

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
    /// `preflight.max_question_rounds`.
    pub max_question_rounds: u32,
    pub retry_backoff_ms: u64,
    pub run_timeout_secs: u64,
    pub idle_timeout_secs: u64,
    pub keep_failed_secs: u64,
    /// `runner.max_followups`.
    pub max_followups: u32,
    /// `runner.max_ci_followups`.
    pub max_ci_followups: u32,
    /// `runner.max_check_followups`.
    pub max_check_followups: u32,
    /// `[merge]`.
    pub merge: crate::settings::MergeSettings,
    /// `runner.start_attempts`.
    pub start_attempts: u32,
    /// Links to the forge's pages (branches), as the forge spells them.
    pub links: crate::settings::WebLinks,
    /// `server.public_url`, for links to runs' pages.
    pub server: crate::settings::ServerSettings,
    /// `preflight.approval`.
    pub approval: crate::domain::approval::Approval,
    /// `budget.run_usd` (0: none), for `over_forecast` approval.
    pub run_usd: f64,
    /// `[filers]`: whose issues are agent-filed, and their rules.
    pub filers: crate::domain::filer::Filers,
    /// `budget.max_continue_usd` (0: `run_usd`).
    pub max_continue_usd: f64,
    /// `runner.egress_approvable`: what a writer may approve in the thread.
    pub egress_approvable: Vec<String>,
    /// The sandbox runtime runs get (`runner.oci_runtime`, `runner.runtime_class_name`).
    pub sandbox: Option<String>,
    /// The operator's `[checks]`, for runs whose repository's file was not read.
    pub checks: Option<crate::domain::checks::ChecksDecl>,
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
            max_question_rounds: settings.preflight.max_question_rounds.max(1),
            retry_backoff_ms: settings.preflight.retry_backoff_ms,
            run_timeout_secs: settings.runner.timeout_secs,
            idle_timeout_secs: settings.runner.idle_timeout_secs,
            keep_failed_secs: settings.runner.keep_failed_secs,
            max_followups: settings.runner.max_followups,
            max_ci_followups: settings.runner.max_ci_followups,
            max_check_followups: settings.runner.max_check_followups,
            merge: settings.merge.clone(),
            start_attempts: settings.runner.start_attempts.max(1),
            links: crate::settings::WebLinks {
                base: settings.forge.web_url(),
                kind: settings.forge.kind,
            },
            server: settings.server.clone(),
            approval: settings.preflight.approval,
            run_usd: settings.budget.run_usd,
            filers: settings.filer_rules(),
            max_continue_usd: settings.budget.max_continue_usd,
            egress_approvable: settings.runner.egress_approvable.clone(),
            sandbox: settings.sandbox_runtime(),
            checks: settings
                .checks
                .is_set()
                .then(|| {
                    crate::settings::checks::decl(
                        &settings.checks,
                        settings.runner.timeout_secs,
                        &mut Vec::new(),
                    )
                    .ok()
                })
                .flatten(),
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
            said,
        } => *allowed && step.command(*command, actor, said.as_ref()),
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
            run.clone().or_else(|| run_of_legacy_key(key)).as_ref(),
            error,
        ),
        Event::PullAsked {
            pr, allowed, ask, ..
        } => *allowed && step.pull_asked(*pr, ask),
        Event::ChecksRead {
            pr,
            head,
            state,
            failing,
            contexts,
            held,
        } => step.checks_read(*pr, head, *state, failing, *contexts, *held),
        Event::ChecksDue => step.checks_due(),
        Event::MergeTried { pr, outcome } => step.merge_tried(*pr, outcome),
        Event::Reverted { pr, sha, url } => step.reverted(*pr, sha, url),
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
}

/// The run a give-up stored by an earlier version was about: those events carry only the
/// action's key, whose last part is the run id for the actions of one run
/// (`owner/name#N:start:<id>`). Newer events carry the run itself.
fn run_of_legacy_key(key: &str) -> Option<RunId> {
    key.rsplit(':').next().and_then(|id| RunId::parse(id).ok())
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
        Lifecycle::AwaitingApproval => &labels.awaiting_approval,
        Lifecycle::Launching | Lifecycle::Running => &labels.running,
        Lifecycle::Succeeded => &labels.pr_open,
        Lifecycle::Merged => &labels.merged,
        Lifecycle::Failed
        | Lifecycle::TimedOut
        | Lifecycle::OverBudget
        | Lifecycle::PreflightFailed => &labels.failed,
        Lifecycle::NoGo => &labels.no_go,
        Lifecycle::NeedsInfo => &labels.needs_info,
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
        &labels.needs_info,
        &labels.merged,
        &labels.waiting,
        &labels.awaiting_approval,
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
