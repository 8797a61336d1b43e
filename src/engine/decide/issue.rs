//! What the forge says about the issue: webhook facts and scan observations, the trigger and
//! who applied it, `/director` commands, and what stops or asks for a read.

use super::*;

impl Step<'_> {
    /// A webhook fact or scan observation: record what the issue looks like now, then react.
    pub(super) fn forge_fact(&mut self, fact: &ForgeEvent) -> bool {
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
        // One command per comment: the first it states. The rest are named in the answer.
        let command = match &fact.comment {
            Some(c) if fact.kind == EventKind::IssueComment && fact.action == "created" => {
                let mut stated = Command::find_all(
                    &c.body,
                    &[
                        Command::Cancel,
                        Command::Retry,
                        Command::Allow,
                        Command::Continue,
                    ],
                );
                (!stated.is_empty()).then(|| (stated.remove(0), stated, c))
            }
            _ => None,
        };
        let acted = if let Some((command, not_taken, comment)) =
            command.filter(|_| live && !fact.sender.is_empty() && trusted)
        {
            let said = (matches!(command, Command::Allow | Command::Continue)
                || !not_taken.is_empty())
            .then(|| crate::domain::command::Said {
                comment: comment.id,
                args: command.arguments(&comment.body),
                not_taken,
            });
            // Counts only once the author's permission is known.
            self.act(
                Effect::Command {
                    comment: comment.id,
                    command,
                },
                Action::AuthorizeCommand {
                    command,
                    actor: fact.sender.clone(),
                    said,
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
    pub(super) fn record_snapshot(&mut self, snap: &IssueSnapshot) -> Seen {
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
    pub(super) fn content_changed(&mut self, fact: &ForgeEvent, skip_changed: bool) -> bool {
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
        let delivered =
            crate::domain::approval::text_sha(&fact.snapshot.title, &fact.snapshot.body);
        if fact.kind == EventKind::Issues {
            self.record.preflight.last_edit = Some(crate::domain::approval::Edit {
                text_sha: delivered.clone(),
                by: fact.sender.clone(),
            });
        }
        // While a GO waits for approval, a go vouches for the text that GO showed and no
        // other: a delivery carrying an edit made since proposes nothing.
        let asked_of_other_text = self.record.lifecycle == Lifecycle::AwaitingApproval
            && self
                .record
                .preflight
                .awaiting
                .as_ref()
                .and_then(|a| a.shown_sha.as_ref())
                .is_some_and(|shown| *shown != delivered);
        if fact.kind == EventKind::Issues || (says_go && !asked_of_other_text) {
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
    pub(super) fn trigger_applied(&mut self, snap: &IssueSnapshot) {
        self.record.preflight.proposed = Some(Vouched {
            title: snap.title.clone(),
            body: snap.body.clone(),
            by: String::new(),
        });
        self.record.preflight.proposed_seen_at = snap.updated_at.clone();
        self.record.preflight.author = Some(snap.author.clone()).filter(|a| !a.is_empty());
        // A new hand-over starts the questions afresh.
        self.record.preflight.question_rounds = 0;
        self.record.preflight.questions.clear();
        self.record.trigger_actor = None;
        self.record.trigger_trusted = None;
        self.resolve_trigger();
    }

    pub(super) fn resolve_trigger(&mut self) {
        let v = self.version();
        self.act(Effect::Resolve { version: v }, Action::ResolveTrigger);
    }

    pub(super) fn trigger_judged(
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
            self.filed(actor.as_deref());
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

    pub(super) fn command(
        &mut self,
        command: Command,
        actor: &str,
        said: Option<&crate::domain::command::Said>,
    ) -> bool {
        match command {
            Command::Allow => said.is_some_and(|s| self.allow(actor, s)),
            Command::Continue => said.is_some_and(|s| self.continue_run(actor, s)),
            _ => {
                let acted = self.plain_command(command);
                // `allow` and `continue` name what was not taken in their own answer; these
                // answer only to name it.
                match said.filter(|s| !s.not_taken.is_empty()) {
                    Some(s) => {
                        self.answer(s, command, String::new());
                        true
                    }
                    None => acted,
                }
            }
        }
    }

    /// `cancel` and `retry`, which say nothing in the thread of their own.
    fn plain_command(&mut self, command: Command) -> bool {
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
                        | Lifecycle::OverBudget
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
    pub(super) fn cancel(&mut self) {
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
    pub(super) fn request_read(&mut self) {
        self.retract.push(Effect::Read {
            rev: self.record.preflight.rev,
        });
        let p = &mut self.record.preflight;
        p.rev += 1;
        p.attempts = 0;
        p.last_error = None;
        p.not_before_ms = None;
        p.waits_for = None;
        self.set_lifecycle(Lifecycle::Pending);
        self.plan_read(self.now);
    }

    pub(super) fn plan_read(&mut self, at: i64) {
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

    pub(super) fn set_lifecycle(&mut self, to: Lifecycle) {
        if to != Lifecycle::Untracked && self.record.preflight.picked_at_ms.is_none() {
            self.record.preflight.picked_at_ms = Some(self.now);
        }
        self.record.lifecycle = to;
    }
}
