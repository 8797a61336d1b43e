//! Actions that failed on every attempt: what the issue and its run become.

use super::*;

impl Step<'_> {
    /// `run`: the run the action was about, if it was one run's.
    pub(super) fn gave_up(&mut self, kind: ActionKind, run: Option<&RunId>, error: &str) -> bool {
        // One that gave up for an earlier run (its start still being retried when that run
        // was cancelled and the issue run again) says nothing about the run there is now.
        let this_run = self.run.as_ref().filter(|r| run == Some(&r.id)).map(|r| {
            (
                r.id.clone(),
                r.state,
                r.log_tail.clone().unwrap_or_default(),
            )
        });
        let about_a_run = matches!(
            kind,
            ActionKind::StartRun
                | ActionKind::JudgeRun
                | ActionKind::OpenPr
                | ActionKind::RunChecks
        );
        if about_a_run && this_run.is_none() {
            return false;
        }
        match (kind, this_run) {
            (ActionKind::StartRun, Some((id, RunState::Launching, _))) => {
                let why = format!("the run could not be started: {error}");
                self.end_run(
                    RunState::Failed,
                    why.clone(),
                    comments::run_failed(&id, &why, ""),
                );
            }
            (ActionKind::JudgeRun | ActionKind::OpenPr, Some((id, RunState::Exited, log))) => {
                let why = if kind == ActionKind::JudgeRun {
                    format!("the run's branch could not be checked: {error}")
                } else {
                    format!("opening the pull request failed: {error}")
                };
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
            (ActionKind::RunChecks, Some((_, RunState::Exited, _))) => {
                self.checks_gave_up(error);
            }
            (ActionKind::TryMerge, _) => {
                // The lane tries again on the next poll.
                if let Some(lane) = self.record.pr.as_mut().and_then(|p| p.merge.as_mut()) {
                    lane.trying = false;
                    lane.poll = true;
                    lane.waiting = format!("the last attempt failed: {error}");
                }
            }
            _ => {}
        }
        self.blocked = Some(format!("{kind} failed on every attempt: {error}"));
        true
    }
}
