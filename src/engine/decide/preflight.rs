//! The pre-flight: a read's outcome, the verdict and what it does, the WRONG-REPO route, and
//! the pre-flight comment.

use super::*;
use crate::preflight::comment::ApprovalNote;

impl Step<'_> {
    pub(super) fn preflight_read(&mut self, rev: i64, outcome: &PreflightOutcome) -> bool {
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
                p.waits_for = None;
                p.plan = Vec::new();
                p.forecast = read.forecast.clone();
                p.awaiting = None;
                // The writer who skipped the gate asked for the run.
                p.approved_by = Some(by.clone());
                self.maintainers(by);
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
                filer,
            } => {
                if let Some(filer) = filer {
                    self.filer_held(filer, limit, *until_ms);
                }
                // Waiting in the cap's queue is a state (its label, `status`, the status
                // page), not news: no comment, so a backlog never notifies every watcher.
                self.vouch(read);
                tracing::debug!(limit, until = %format_time(*until_ms), "pre-flight waits for its cap");
                self.record.preflight.not_before_ms = Some(*until_ms);
                self.record.preflight.waits_for = Some(limit.clone());
                self.record.preflight.rev += 1;
                self.plan_read(*until_ms);
                true
            }
        }
    }

    pub(super) fn seen_commands(&mut self, read: &ReadContext) {
        let p = &mut self.record.preflight;
        p.handled_command_id = p.handled_command_id.max(read.newest_comment_id);
        self.vouch(read);
    }

    /// The read found a writer vouching for the text as it is: that is the text from now on.
    pub(super) fn vouch(&mut self, read: &ReadContext) {
        if let Some(v) = &read.vouched {
            let p = &mut self.record.preflight;
            p.vouched = Some(v.clone());
            p.proposed = None;
        }
    }

    pub(super) fn verdict(
        &mut self,
        verdict: &Verdict,
        reading: &str,
        model: &str,
        read: &ReadContext,
    ) {
        let p = &mut self.record.preflight;
        // The text the last questions were asked of, read again (a comment by someone without
        // write access changes nothing the model reads): the same round, not a new one.
        let same_round = p.asking() && p.hash.as_deref() == Some(read.hash.as_str());
        p.hash = Some(read.hash.clone());
        p.model = Some(model.to_owned());
        p.attempts = 0;
        p.last_error = None;
        p.not_before_ms = None;
        p.waits_for = None;
        if !matches!(verdict, Verdict::NeedsInfo { .. }) {
            p.question_rounds = 0;
        }
        p.plan = match verdict {
            Verdict::Go => crate::domain::verdict::plan(reading).unwrap_or_default(),
            _ => Vec::new(),
        };
        p.forecast = matches!(verdict, Verdict::Go)
            .then(|| read.forecast.clone())
            .flatten();
        let mut approval = None;
        let (shown, lifecycle, judgement) = match verdict {
            Verdict::Go => {
                let (lifecycle, note) = self.go_approval(read);
                approval = note;
                (Shown::Go, lifecycle, Judgement::Go)
            }
            Verdict::NeedsInfo { questions } => self.questions(questions, same_round, read),
            Verdict::NoGo { reason } => (
                Shown::NoGo {
                    reason: reason.clone(),
                },
                Lifecycle::NoGo,
                Judgement::NoGo,
            ),
            Verdict::WrongRepo { repo, what } if self.trusted_owner(repo) => {
                self.route(repo, what, reading, model, read);
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
            Shown::NeedsInfo { questions, .. } => {
                Some(format!("{} open question(s)", questions.len()))
            }
            _ => None,
        };
        if !matches!(verdict, Verdict::Go) {
            self.record.preflight.awaiting = None;
            self.record.preflight.approved_by = None;
        }
        self.sticky_with(&shown, Some(reading), model, read, approval.as_ref());
        self.set_lifecycle(lifecycle);
    }

    /// Whether a GO waits for a maintainer's approval, or was approved, or needs none: its
    /// lifecycle, and the note the comment shows. A writer's go approves the GO that showed
    /// exactly this text (and plan).
    fn go_approval(&mut self, read: &ReadContext) -> (Lifecycle, Option<ApprovalNote>) {
        let p = &mut self.record.preflight;
        // Edited since the GO asked (by anyone, the edit read or left out): not what the
        // ask showed, so a go approves nothing and the ask is renewed, naming the editor.
        let edited_since = p.awaiting.as_ref().is_some_and(|a| {
            a.text_sha
                .as_ref()
                .is_some_and(|shown| *shown != read.text_sha)
        });
        let editor = p
            .last_edit
            .as_ref()
            .filter(|e| e.text_sha == read.text_sha)
            .map(|e| e.by.clone());
        let edited = if edited_since {
            Some(editor)
        } else {
            // The same text asked again: what was said of its edit stays, its editor
            // named once a delivery tells.
            p.awaiting
                .as_ref()
                .and_then(|a| a.edited.clone())
                .map(|by| by.or(editor))
        };
        let approved = read.approved_by.is_some()
            && !edited_since
            && p.awaiting.as_ref().is_some_and(|a| a.hash == read.hash);
        let waits = self.approval_needed(read);
        let p = &mut self.record.preflight;
        if approved {
            p.awaiting = None;
            p.approved_by = read.approved_by.clone();
            if let Some(by) = read.approved_by.clone() {
                self.maintainers(&by);
            }
            (
                Lifecycle::Queued,
                read.approved_by.clone().map(ApprovalNote::Approved),
            )
        } else if let Some(why) = waits {
            if let Some(by) = &read.approved_by {
                tracing::info!(by, "a go for a GO whose text changed since: asking again");
            }
            let shown = match &edited {
                Some(by) => format!(
                    "{why}. {}",
                    crate::domain::approval::edited_sentence(by.as_deref())
                ),
                None => why.clone(),
            };
            p.awaiting = Some(crate::domain::approval::Awaiting {
                hash: read.hash.clone(),
                why,
                text_sha: Some(read.text_sha.clone()),
                edited,
                shown_sha: Some(crate::domain::approval::text_sha(&read.title, &read.body)),
            });
            p.approved_by = None;
            (
                Lifecycle::AwaitingApproval,
                Some(ApprovalNote::Waiting(shown)),
            )
        } else {
            p.awaiting = None;
            (Lifecycle::Queued, None)
        }
    }

    /// NEEDS-INFO: a new round of questions (the same round when the text the last ones were
    /// asked of is read again), or NO-GO after `preflight.max_question_rounds` rounds.
    fn questions(
        &mut self,
        questions: &[String],
        same_round: bool,
        read: &ReadContext,
    ) -> (Shown, Lifecycle, Judgement) {
        let max_rounds = self.policy.max_question_rounds;
        let p = &mut self.record.preflight;
        if !same_round {
            p.question_rounds += 1;
            p.asked_after = read.newest_comment_id;
        }
        let questions = if same_round {
            p.questions.clone()
        } else {
            questions.to_vec()
        };
        if p.question_rounds >= max_rounds {
            let open: Vec<String> = questions
                .iter()
                .enumerate()
                .map(|(n, q)| format!("{}) {q}", n + 1))
                .collect();
            let reason = format!(
                "still needs information after {max_rounds} rounds of questions (preflight.max_question_rounds); open: {}",
                open.join(" ")
            );
            p.questions = questions;
            return (Shown::NoGo { reason }, Lifecycle::NoGo, Judgement::NoGo);
        }
        let asked_after = p.asked_after;
        p.questions = questions.clone();
        let waiting = read
            .left_out
            .iter()
            .filter(|l| !l.issue_text && l.comment_id > asked_after)
            .cloned()
            .collect();
        (
            Shown::NeedsInfo { questions, waiting },
            Lifecycle::NeedsInfo,
            Judgement::NeedsInfo,
        )
    }

    /// WRONG-REPO to a trusted owner's repository: the issue is filed there (once; an
    /// earlier read's filing is named again) and this one is routed.
    fn route(
        &mut self,
        repo: &RepoName,
        what: &str,
        reading: &str,
        model: &str,
        read: &ReadContext,
    ) {
        self.record.preflight.verdict = Some(Judgement::WrongRepo);
        self.record.preflight.reason = Some(what.to_owned());
        self.set_lifecycle(Lifecycle::Routed);
        let draft = StickyDraft {
            reading: Some(reading.to_owned()),
            model: model.to_owned(),
            read: read.clone(),
            what: what.to_owned(),
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
    }

    pub(super) fn trusted_owner(&self, repo: &RepoName) -> bool {
        self.policy
            .trusted_owners
            .iter()
            .any(|o| o.eq_ignore_ascii_case(repo.owner()))
    }

    pub(super) fn failed_read(
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
        p.waits_for = None;
        self.set_lifecycle(if proceeding {
            Lifecycle::Queued
        } else {
            Lifecycle::PreflightFailed
        });
    }

    pub(super) fn routed_filed(&mut self, rev: i64, filed: &IssueRef, draft: &StickyDraft) -> bool {
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

    pub(super) fn routed_sticky(&mut self, filed: &str, draft: &StickyDraft) {
        let shown = Shown::Routed {
            repo: draft.target.clone(),
            filed: filed.to_owned(),
            what: draft.what.clone(),
        };
        self.sticky(&shown, draft.reading.as_deref(), &draft.model, &draft.read);
    }

    /// Plans the edit of the one pre-flight comment.
    pub(super) fn sticky(
        &mut self,
        shown: &Shown,
        reading: Option<&str>,
        model: &str,
        read: &ReadContext,
    ) {
        self.sticky_with(shown, reading, model, read, None);
    }

    /// The same, with what a GO waits for (or who approved it).
    pub(super) fn sticky_with(
        &mut self,
        shown: &Shown,
        reading: Option<&str>,
        model: &str,
        read: &ReadContext,
        approval: Option<&ApprovalNote>,
    ) {
        let body = comment::render(&CommentInput {
            shown,
            trigger: &self.policy.labels.trigger,
            skip_label: &self.policy.labels.skip_preflight,
            reading,
            left_out: &read.left_out,
            hidden: &read.hidden,
            model,
            hash: &read.hash,
            max_question_rounds: self.policy.max_question_rounds,
            agent: read.agent.as_ref(),
            plan: reading.and_then(crate::domain::verdict::plan).as_deref(),
            forecast: read.forecast.as_ref(),
            approval,
            filer: self.record.preflight.filer.as_ref(),
        });
        let v = self.version();
        self.act(Effect::Sticky { version: v }, Action::UpsertSticky { body });
    }
}
