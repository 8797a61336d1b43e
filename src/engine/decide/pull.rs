//! The pull request: its facts, its end, feedback asked of it and the follow-up runs that
//! answer it.

use super::*;

impl Step<'_> {
    pub(super) fn has_open_pull(&self) -> bool {
        self.record.pr.as_ref().is_some_and(PullRecord::is_open)
    }

    /// A fact about a pull request, decided on the issue whose run opened it.
    pub(super) fn pull_fact(&mut self, fact: &ForgeEvent) -> bool {
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
                } else if open && matches!(fact.action.as_str(), "synchronized" | "synchronize") {
                    // New commits on the branch (Forgejo's word, GitHub's).
                    self.pull_synchronized()
                } else {
                    false
                }
            }
            EventKind::ActionRun => {
                if !open {
                    return false;
                }
                self.read_checks();
                true
            }
            EventKind::PullReview => {
                let Some(review) = fact
                    .review
                    .as_ref()
                    .filter(|r| r.kind == ReviewKind::ChangesRequested)
                else {
                    // An approval may be the one the merge lane waits for; a plain comment
                    // review starts nothing.
                    let approved = fact
                        .review
                        .as_ref()
                        .is_some_and(|r| r.kind == ReviewKind::Approved);
                    return open && approved && self.plan_merge();
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
    pub(super) fn pull_ended(&mut self, merged: bool) {
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
        pr.ended_at_ms = Some(self.now);
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

    pub(super) fn pull_reopened(&mut self) {
        if let Some(pr) = self.record.pr.as_mut() {
            pr.state = PullState::Open;
            pr.ended_at_ms = None;
        }
        if self.record.lifecycle == Lifecycle::PrClosed {
            self.set_lifecycle(Lifecycle::Succeeded);
        }
    }

    /// A later commit of the base reverts the merged pull request `number`: kept once, and
    /// the issue told once.
    pub(super) fn reverted(&mut self, number: u64, sha: &str, url: &str) -> bool {
        let now = self.now;
        let Some(pr) =
            self.record.pr.as_mut().filter(|p| {
                p.number == number && p.state == PullState::Merged && p.reverted.is_none()
            })
        else {
            return false;
        };
        pr.reverted = Some(crate::domain::pull::Reverted {
            sha: sha.to_owned(),
            url: url.to_owned(),
            found_at_ms: now,
        });
        self.act(
            Effect::Reverted { pr: number },
            Action::PostNotice {
                marker: comments::reverted_marker(number),
                body: comments::reverted(number, sha, url),
            },
        );
        true
    }

    /// The issue's pull request `number`, if it is open.
    pub(super) fn open_pull(&mut self, number: u64) -> Option<&mut PullRecord> {
        self.record
            .pr
            .as_mut()
            .filter(|p| p.number == number && p.is_open())
    }

    /// A writer's review, fix, cancel or retry on the open pull request.
    pub(super) fn pull_asked(&mut self, number: u64, ask: &PullAsk) -> bool {
        let Some(pr) = self.open_pull(number) else {
            return false;
        };
        match ask {
            PullAsk::Fix { feedback } => {
                if !pr.take(&feedback.key) {
                    return false;
                }
                pr.wait_on(feedback.clone());
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
                    pr.wait_on(capped);
                }
                self.queue_followup();
                true
            }
        }
    }

    /// Feedback is waiting: queue a follow-up, unless a run is on (it waits for its end) or
    /// the cap is reached (it waits for a writer's `/director retry`; the PR is told once).
    pub(super) fn queue_followup(&mut self) {
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
        if feedback.key.starts_with(lane::CI_KEY) {
            // Counted against `runner.max_ci_followups` when the failure was read.
            pr.pending = Some(feedback);
            self.set_lifecycle(Lifecycle::Queued);
            return;
        }
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
    pub(super) fn cancel_followup(&mut self) {
        if let Some(pr) = self.record.pr.as_mut() {
            pr.pending = None;
        }
        self.stop_followup();
        if self.record.lifecycle == Lifecycle::Queued {
            self.set_lifecycle(Lifecycle::Succeeded);
        }
    }

    pub(super) fn stop_followup(&mut self) {
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
    pub(super) fn followup_judged(&mut self, ahead: u64) {
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
            // Its new head is checked first (`[checks]`), and the answer carries the result.
            if self.checks_first_of(ahead) {
                return;
            }
            let mut body = comments::followup_succeeded(&id, ahead, summary.as_deref());
            body.push_str(&usage);
            if let Some((section, _)) = self.checks_section() {
                body.push_str(&section);
            }
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
            (Some(StopCause::Budget), _) => RunState::OverBudget,
            (Some(_), _) => RunState::TimedOut,
            (None, Some(_)) => RunState::Declined,
            _ => RunState::Failed,
        };
        let body = comments::followup_failed(&id, &why, &log);
        self.end_run(state, why, body);
    }
}
