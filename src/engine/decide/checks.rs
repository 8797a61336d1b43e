//! The director's checks of a run's pushed head (`[checks]`): started once the agent has
//! exited with its branch ahead, before the pull request opens; their outcome is posted as
//! commit status `director/checks` on the head and written in the pull request, which opens
//! as a draft when they do not pass.

use super::*;
use crate::domain::checks::{ChecksDecl, ChecksOutcome, ChecksRecord, SideResult, StatusState};

impl Step<'_> {
    /// The checks the run gets: its repository's file's (as read when the run started, which
    /// holds the operator's when the file has none), else the operator's.
    pub(super) fn checks_decl(&self) -> Option<ChecksDecl> {
        let run = self.run.as_ref()?;
        match &run.settings {
            Some(s) => s.checks.clone(),
            None => self.policy.checks.clone(),
        }
    }

    /// Starts the checks of the pushed head unless they ran: whether the pull request waits
    /// for them.
    pub(super) fn checks_first(&mut self) -> bool {
        self.checks_first_of(0)
    }

    /// [`Self::checks_first`] for a run whose branch is `ahead` commits ahead (kept, for the
    /// judgement made again once the checks are known).
    pub(super) fn checks_first_of(&mut self, ahead: u64) -> bool {
        let Some(decl) = self.checks_decl() else {
            return false;
        };
        let Some(run) = self.run.as_mut() else {
            return false;
        };
        match &run.checks {
            Some(c) => c.outcome.is_none(),
            None => {
                run.checks = Some(ChecksRecord {
                    head: String::new(),
                    base: None,
                    ahead,
                    outcome: None,
                });
                let id = run.id.clone();
                self.act(
                    Effect::RunChecks { run: id.clone() },
                    Action::RunChecks {
                        run_id: id,
                        checks: decl,
                    },
                );
                true
            }
        }
    }

    /// The checks' outcome: kept, posted as a status, and the pull request opened with it.
    pub(super) fn checked(
        &mut self,
        head: &str,
        base: Option<&str>,
        outcome: &ChecksOutcome,
    ) -> bool {
        let Some(record) = self
            .run
            .as_mut()
            .and_then(|r| r.checks.as_mut())
            .filter(|c| c.outcome.is_none())
        else {
            return false;
        };
        record.head = head.to_owned();
        record.base = base.map(str::to_owned);
        record.outcome = Some(outcome.clone());
        let ahead = record.ahead;
        if let Some(id) = self
            .run
            .as_ref()
            .filter(|r| r.stop_requested)
            .map(|r| r.id.clone())
        {
            // Cancelled while its checks ran: no pull request, no status.
            self.end_cancelled(&id);
            return true;
        }
        self.post_checks_status(false);
        self.ready_if_green(head, outcome);
        if self.run.as_ref().is_some_and(|r| r.followup.is_some()) {
            // A follow-up: its pull request exists; it ends now, saying what the checks found
            // (a failure is read from the status like any failing check, and answered).
            self.followup_judged(ahead);
        } else {
            self.plan_pull();
        }
        true
    }

    /// A draft pull request whose checks now pass on its head is made ready (its title
    /// without the `WIP: ` it was opened with).
    fn ready_if_green(&mut self, head: &str, outcome: &ChecksOutcome) {
        if outcome.state() != StatusState::Success
            || self.run.as_ref().is_none_or(|r| r.followup.is_none())
        {
            return;
        }
        let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) else {
            return;
        };
        // Kept until the forge has the new title: the merge lane waits for it (Forgejo
        // refuses to merge a `WIP:` title).
        let Some(title) = pr.draft.clone() else {
            return;
        };
        let number = pr.number;
        let Some(run_id) = self.run.as_ref().map(|r| r.id.clone()) else {
            return;
        };
        self.act(
            Effect::Ready {
                pr: number,
                head: head.to_owned(),
            },
            Action::RetitlePull {
                run_id,
                pr: number,
                title,
            },
        );
    }

    /// The draft pull request has its ready title: the merge lane may take it.
    pub(super) fn readied(&mut self, number: u64) -> bool {
        let Some(pr) = self
            .record
            .pr
            .as_mut()
            .filter(|p| p.number == number && p.draft.is_some())
        else {
            return false;
        };
        pr.draft = None;
        self.plan_merge();
        true
    }

    /// The checks could not be run at all (their action failed on every attempt): the pull
    /// request opens as a draft saying so, never as if they passed.
    pub(super) fn checks_gave_up(&mut self, error: &str) {
        let outcome = ChecksOutcome {
            head: SideResult {
                commands: Vec::new(),
                error: Some(format!("the checks could not be run: {error}")),
                junit: None,
                changed_tests: Vec::new(),
            },
            base: None,
            baseline_reused: false,
            overhead_ms: 0,
        };
        self.checked("", None, &outcome);
    }

    /// Plans the status of the run's checks, once they have an outcome, when the head is in
    /// the repository: now for a branch there, after the pull request opened (`pr_opened`)
    /// for a branch in a fork (Forgejo refuses a status on a commit it does not hold).
    pub(super) fn post_checks_status(&mut self, pr_opened: bool) {
        let Some(run) = self.run.as_ref() else {
            return;
        };
        let Some((c, outcome)) = run
            .checks
            .as_ref()
            .and_then(|c| c.outcome.as_ref().map(|o| (c, o)))
        else {
            return;
        };
        // A first run's branch in a fork reaches the repository with its pull request; a
        // follow-up's pull request exists already.
        let head_in_repo = run.home.is_none() || run.followup.is_some();
        if head_in_repo == pr_opened || c.head.is_empty() {
            return;
        }
        let (id, sha) = (run.id.clone(), c.head.clone());
        let action = Action::PostStatus {
            run_id: id.clone(),
            sha: sha.clone(),
            state: outcome.state(),
            description: outcome.description(),
            target_url: self.checks_url(&id).unwrap_or_default(),
        };
        self.act(Effect::Status { run: id, sha }, action);
    }

    /// The checks' section of the pull request and the report, and whether they passed.
    pub(super) fn checks_section(&self) -> Option<(String, bool)> {
        let run = self.run.as_ref()?;
        let c = run.checks.as_ref()?;
        let o = c.outcome.as_ref()?;
        let url = self.checks_url(&run.id);
        Some((
            o.section(&c.head, c.base.as_deref(), url.as_deref()),
            o.state() == StatusState::Success,
        ))
    }

    /// What a follow-up answering failing checks on `head` is told beyond the failing
    /// contexts: the failing command of the director's checks and the end of its output.
    pub(super) fn checks_feedback(&self, head: &str) -> Option<String> {
        let c = self.run.as_ref()?.checks.as_ref()?;
        let outcome = c.outcome.as_ref().filter(|_| c.head == head)?;
        outcome
            .first_regression()
            .map(|r| crate::domain::checks::feedback(r, head))
    }

    /// With `[checks]`, the merge lane also waits for the director's own checks to have
    /// passed on `head` (a head they have not run on, such as a person's push, waits).
    pub(super) fn checks_allow_merge(&self, head: &str) -> bool {
        if self.checks_decl().is_none() {
            return true;
        }
        if self.record.pr.as_ref().is_some_and(|p| p.draft.is_some()) {
            return false;
        }
        self.run
            .as_ref()
            .and_then(|r| r.checks.as_ref())
            .filter(|c| c.head == head)
            .and_then(|c| c.outcome.as_ref())
            .is_some_and(|o| o.state() == StatusState::Success)
    }

    /// Where the checks' transcript is served (`/runs/<id>/checks`).
    fn checks_url(&self, id: &RunId) -> Option<String> {
        self.policy
            .server
            .run_url(id)
            .map(|u| format!("{u}/checks"))
    }
}
