//! The pull request's checks and the merge lane: when the checks are read, what a failure
//! starts, and when a merge is attempted.

use super::*;
use crate::domain::{Check, CheckState, Feedback, MergeLane, PullChecks};
use crate::event::MergeOutcome;

/// A head with no check reported is read again for this long: CI may not have started.
pub const CHECKS_GRACE_MS: i64 = 10 * 60 * 1000;
/// How feedback on failing checks is named (`checks:<head>`), apart from a writer's.
pub const CI_KEY: &str = "checks:";
/// Who the feedback on failing checks is from, in the follow-up's task.
pub const CI_AUTHOR: &str = "checks";

/// Whether the poll (`scan.checks_schedule`) should ask about this pull request: its checks
/// are not known, pending, or not reported yet for a while; or it waits in the merge lane for
/// something no webhook announces.
pub fn wanted(pr: &PullRecord, lane_on: bool, now: i64) -> bool {
    if !pr.is_open() {
        return false;
    }
    let Some(checks) = &pr.checks else {
        return true;
    };
    match checks.state {
        CheckState::Pending => true,
        CheckState::None => now.saturating_sub(checks.since_ms) < CHECKS_GRACE_MS,
        CheckState::Success => {
            lane_on
                && pr.merge.as_ref().is_some_and(|m| {
                    !m.trying && m.poll && m.refused_head() != Some(checks.head.as_str())
                })
        }
        // A failure not answered yet (read while a run was on, say).
        CheckState::Failure => !pr
            .handled
            .iter()
            .any(|k| *k == format!("{CI_KEY}{}", checks.head)),
        CheckState::Warning => false,
    }
}

impl MergeLane {
    fn refused_head(&self) -> Option<&str> {
        self.refused.as_ref().map(|(head, _)| head.as_str())
    }
}

impl Step<'_> {
    /// Plans a read of the open pull request's checks.
    pub(super) fn read_checks(&mut self) {
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) else {
            return;
        };
        pr.check_reads += 1;
        let (number, read) = (pr.number, pr.check_reads);
        self.act(
            Effect::Checks { pr: number, read },
            Action::ReadChecks { pr: number },
        );
    }

    /// The poll found the pull request waiting: read its checks, or try the merge again.
    pub(super) fn checks_due(&mut self) -> bool {
        let lane_on = self.lane_on();
        let Some(pr) = self.record.pr.as_ref() else {
            return false;
        };
        if !wanted(pr, lane_on, self.now) {
            return false;
        }
        if pr
            .checks
            .as_ref()
            .is_some_and(|c| c.state == CheckState::Success)
        {
            return self.plan_merge();
        }
        self.read_checks();
        true
    }

    /// The checks of `head` were read.
    pub(super) fn checks_read(
        &mut self,
        number: u64,
        head: &str,
        state: CheckState,
        failing: &[Check],
        contexts: usize,
        held: u32,
    ) -> bool {
        let now = self.now;
        let Some(pr) = self.open_pull(number) else {
            return false;
        };
        let newly_held = held > 0 && pr.checks.as_ref().is_none_or(|c| c.held == 0);
        let since = pr
            .checks
            .as_ref()
            .filter(|c| c.head == head)
            .map_or(now, |c| c.since_ms);
        let read = PullChecks {
            head: head.to_owned(),
            state,
            // Cut when read; cut here too, a stored event being input like any other.
            failing: crate::domain::pull::failing(failing),
            contexts,
            held,
            since_ms: since,
        };
        let unchanged = pr.checks.as_ref() == Some(&read);
        pr.checks = Some(read);
        if newly_held {
            // Said once per pull request: what the maintainers must do, and why first.
            self.act(
                Effect::ChecksHeld { pr: number },
                Action::CommentOnPull {
                    pr: number,
                    marker: comments::checks_held_marker(number),
                    body: comments::checks_held(number),
                },
            );
        }
        match state {
            CheckState::Failure => self.checks_failed(number, head),
            CheckState::Success => {
                self.plan_merge();
            }
            _ => {}
        }
        !unchanged || !self.actions.is_empty()
    }

    /// Failing checks: a follow-up answers them (once per head), up to
    /// `runner.max_ci_followups`; past it the issue is told once.
    fn checks_failed(&mut self, number: u64, head: &str) {
        // A run on the pull request pushes, and its push's checks are the ones that count.
        if self.run.as_ref().is_some_and(|r| r.state.is_active())
            || self.record.lifecycle != Lifecycle::Succeeded
        {
            return;
        }
        let Some(pr) = self.record.pr.as_mut() else {
            return;
        };
        let key = format!("{CI_KEY}{head}");
        if pr.handled.contains(&key) {
            return;
        }
        let failing = pr
            .checks
            .as_ref()
            .map(|c| c.failing.clone())
            .unwrap_or_default();
        let contexts = pr.checks.as_ref().map_or(0, |c| c.contexts);
        // The director's own checks failing are answered within `runner.max_check_followups`,
        // counted apart from the forge's CI.
        let ours = failing
            .iter()
            .any(|c| c.context == crate::domain::checks::CONTEXT);
        let (spent, max) = if ours {
            (pr.check_followups, self.policy.max_check_followups)
        } else {
            (pr.ci_followups, self.policy.max_ci_followups)
        };
        if spent >= max {
            pr.take(&key);
            self.act(
                Effect::CiCap { pr: number },
                Action::PostNotice {
                    marker: comments::ci_cap_marker(number),
                    body: if ours {
                        comments::ci_cap(number, max, &failing)
                            .replace("runner.max_ci_followups", "runner.max_check_followups")
                    } else {
                        comments::ci_cap(number, max, &failing)
                    },
                },
            );
            return;
        }
        let mut text = comments::ci_feedback(head, &failing, contexts);
        if ours && let Some(more) = self.checks_feedback(head) {
            text.push_str("\n\n");
            text.push_str(&more);
        }
        let Some(pr) = self.record.pr.as_mut() else {
            return;
        };
        pr.check_followups += u32::from(ours);
        pr.take(&key);
        let feedback = Feedback {
            key,
            by: if ours {
                crate::domain::checks::CONTEXT.to_owned()
            } else {
                CI_AUTHOR.to_owned()
            },
            text,
        };
        pr.wait_on(feedback);
        self.set_lifecycle(Lifecycle::Queued);
    }

    fn lane_on(&self) -> bool {
        self.policy.merge.covers(&self.record.repo)
    }

    /// Plans an attempt of the merge lane, when it is on for the repository, the pull request
    /// is open with green checks, nothing runs or waits on it, and no attempt is under way.
    pub(super) fn plan_merge(&mut self) -> bool {
        if !self.lane_on() || self.record.lifecycle != Lifecycle::Succeeded {
            return false;
        }
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) else {
            return false;
        };
        let Some(head) = pr
            .checks
            .as_ref()
            .filter(|c| c.state == CheckState::Success)
            .map(|c| c.head.clone())
        else {
            return false;
        };
        if !self.checks_allow_merge(&head) {
            return false;
        }
        let Some(pr) = self.record.pr.as_mut() else {
            return false;
        };
        let lane = pr.merge.get_or_insert_with(MergeLane::default);
        if lane.trying || lane.refused_head() == Some(head.as_str()) {
            return false;
        }
        lane.trying = true;
        lane.tries += 1;
        let (number, attempt) = (pr.number, lane.tries);
        self.act(
            Effect::Merge {
                pr: number,
                attempt,
            },
            Action::TryMerge { pr: number },
        );
        true
    }

    /// What an attempt of the merge lane came to.
    pub(super) fn merge_tried(&mut self, number: u64, outcome: &MergeOutcome) -> bool {
        let style = self.policy.merge.style.as_str();
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.number == number) else {
            return false;
        };
        let lane = pr.merge.get_or_insert_with(MergeLane::default);
        lane.trying = false;
        match outcome {
            MergeOutcome::Merged { approvals } => {
                if !approvals.is_empty() {
                    lane.approvals = approvals.clone();
                }
                lane.waiting.clear();
                let approvals = lane.approvals.clone();
                if pr.is_open() {
                    self.pull_ended(true);
                }
                self.act(
                    Effect::Merged { pr: number },
                    Action::PostNotice {
                        marker: comments::merged_marker(number),
                        body: comments::merged_by_lane(number, style, &approvals),
                    },
                );
            }
            MergeOutcome::Waiting {
                reason,
                approvals,
                poll,
            } => {
                lane.waiting = reason.clone();
                lane.approvals = approvals.clone();
                lane.poll = *poll;
            }
            MergeOutcome::Updated => {
                lane.waiting =
                    "the base branch moved: the branch was updated, its checks run again".into();
                lane.poll = false;
                pr.checks = None;
                self.read_checks();
            }
            MergeOutcome::Refused { head, reason } => {
                lane.waiting = reason.clone();
                lane.refused = Some((head.clone(), reason.clone()));
                lane.poll = false;
                self.act(
                    Effect::MergeRefused {
                        pr: number,
                        head: head.chars().take(12).collect(),
                    },
                    Action::CommentOnPull {
                        pr: number,
                        marker: comments::merge_refused_marker(number, head),
                        body: comments::merge_refused(number, head, reason),
                    },
                );
            }
        }
        true
    }

    /// A follow-up on the pull request ended: checks read while it ran count now.
    pub(super) fn followup_ended(&mut self) {
        let Some(checks) = self.record.pr.as_ref().and_then(|p| p.checks.clone()) else {
            return;
        };
        let number = self.record.pr.as_ref().map_or(0, |p| p.number);
        match checks.state {
            CheckState::Failure => self.checks_failed(number, &checks.head),
            CheckState::Success => {
                self.plan_merge();
            }
            _ => {}
        }
    }

    /// The pull request's head moved (a push, an update): its checks are read anew.
    pub(super) fn pull_synchronized(&mut self) -> bool {
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) else {
            return false;
        };
        if let Some(lane) = pr.merge.as_mut() {
            lane.waiting = "the branch moved: waiting for its checks".into();
            lane.poll = false;
        }
        self.read_checks();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr_with(state: Option<CheckState>, since_ms: i64) -> PullRecord {
        let mut pr = PullRecord::opened(5, "director/issue-7");
        pr.checks = state.map(|state| PullChecks {
            head: "abc".into(),
            state,
            failing: Vec::new(),
            contexts: 1,
            held: 0,
            since_ms,
        });
        pr
    }

    #[test]
    fn the_poll_asks_about_what_is_unknown_pending_or_not_reported_yet_and_nothing_else() {
        let now = 1_000_000_000;
        assert!(wanted(&pr_with(None, 0), false, now), "never read");
        assert!(wanted(&pr_with(Some(CheckState::Pending), 0), false, now));
        assert!(
            wanted(&pr_with(Some(CheckState::None), now - 1_000), false, now),
            "CI may not have started"
        );
        assert!(
            !wanted(
                &pr_with(Some(CheckState::None), now - CHECKS_GRACE_MS),
                false,
                now
            ),
            "a head no check reports on for ten minutes has none"
        );
        assert!(!wanted(&pr_with(Some(CheckState::Success), 0), false, now));
        assert!(!wanted(&pr_with(Some(CheckState::Warning), 0), false, now));
        let mut answered = pr_with(Some(CheckState::Failure), 0);
        assert!(wanted(&answered, false, now), "a failure not answered yet");
        answered.take("checks:abc");
        assert!(!wanted(&answered, false, now), "answered once");
        let mut waiting = pr_with(Some(CheckState::Success), 0);
        waiting.merge = Some(MergeLane {
            waiting: "the forge cannot merge it yet".into(),
            poll: true,
            ..MergeLane::default()
        });
        assert!(wanted(&waiting, true, now), "the lane asks again");
        assert!(!wanted(&waiting, false, now), "not with the lane off");
        if let Some(lane) = waiting.merge.as_mut() {
            lane.refused = Some(("abc".into(), "405".into()));
        }
        assert!(
            !wanted(&waiting, true, now),
            "a refused head is not tried again"
        );
        let mut closed = pr_with(None, 0);
        closed.state = crate::domain::PullState::Merged;
        assert!(!wanted(&closed, true, now));
    }
}
