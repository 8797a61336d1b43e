//! Runs: admission, what the watcher and the executor report of a run, and how it ends.

use super::*;

impl Step<'_> {
    pub(super) fn admitted(&mut self, run_id: &RunId, branch: &str) -> bool {
        // A run id names one container and one token, ever: never admitted twice.
        if self.record.lifecycle != Lifecycle::Queued
            || self
                .run
                .as_ref()
                .is_some_and(|r| r.state.is_active() || r.id == *run_id)
        {
            return false;
        }
        let mut run =
            RunRecord::admitted(&self.record.issue_ref(), run_id.clone(), branch, self.now);
        if let Some(pr) = self.record.pr.as_mut().filter(|p| p.is_open()) {
            // A follow-up: on the pull request's branch, answering the feedback waiting.
            let Some(feedback) = pr.pending.take() else {
                self.set_lifecycle(Lifecycle::Succeeded);
                return true;
            };
            if feedback.key.starts_with(lane::CI_KEY) {
                // The director's own checks' answers are counted as they are asked.
                pr.ci_followups += u32::from(feedback.by != crate::domain::checks::CONTEXT);
            } else {
                pr.followups += 1;
            }
            run.branch = pr.branch.clone();
            run.followup = Some(FollowUp {
                pr: pr.number,
                feedback,
                start_head: None,
            });
        } else {
            self.take_continuation(&mut run);
        }
        self.act(
            Effect::Start {
                run: run_id.clone(),
            },
            Action::StartRun {
                run_id: run_id.clone(),
            },
        );
        self.run = Some(run);
        self.set_lifecycle(Lifecycle::Launching);
        true
    }

    /// A report about the issue's current run, applied only in the run state it follows from.
    pub(super) fn run_report(&mut self, run_id: &RunId, report: &RunReport) -> bool {
        let Some(state) = self
            .run
            .as_ref()
            .filter(|r| &r.id == run_id)
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
            RunReport::Refused { .. } | RunReport::SetupFailed { .. }
                if state == RunState::Launching
                    && self.run.as_ref().is_some_and(|r| r.stop_requested) =>
            {
                self.end_cancelled(run_id);
            }
            RunReport::Refused { why } if state == RunState::Launching => {
                let body = comments::run_refused(run_id, why);
                self.end_run(RunState::Refused, why.clone(), body);
            }
            RunReport::SetupFailed { why } if state == RunState::Launching => {
                let body = comments::setup_failed(run_id, why);
                let detail = why.lines().next().unwrap_or_default().to_owned();
                self.end_run(RunState::Refused, detail, body);
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
            RunReport::Checked {
                head,
                base,
                outcome,
            } if state == RunState::Exited => {
                return self.checked(head, base.as_deref(), outcome);
            }
            // Whatever the run's state: its pull request's checks now hold the status.
            RunReport::StatusPosted { .. } => {
                self.read_checks();
                return !self.actions.is_empty();
            }
            RunReport::Readied { pr } => return self.readied(*pr),
            RunReport::PrOpened { number } if state == RunState::Exited => {
                let mut body = comments::run_succeeded(run_id, *number);
                let mut draft = None;
                let opened_green = self.checks_section().map(|(_, green)| green);
                if let Some((section, green)) = self.checks_section() {
                    body.push_str(&section);
                    // Opened as a draft: made ready once a follow-up's checks pass.
                    draft = (!green).then(|| self.pull_title());
                }
                if let Some(run) = self.run.as_mut() {
                    run.pr_number = Some(*number);
                    if refused_default_push(run) {
                        body.push_str(&comments::default_push_refused(&run.base_branch));
                    }
                    body.push_str(&comments::usage_line(
                        run.result.as_ref().and_then(|r| r.usage.as_ref()),
                    ));
                    if let Some(setup) = &run.setup {
                        body.push_str(&format!("\n\n{}.", setup.line()));
                    }
                    let mut pr = PullRecord::opened(*number, &run.branch);
                    pr.opened_at_ms = Some(self.now);
                    pr.draft = draft;
                    pr.opened_green = opened_green;
                    self.record.pr = Some(pr);
                }
                // A fork's head reaches the repository with its pull request: its checks'
                // status can be posted only now.
                self.post_checks_status(true);
                self.end_run(RunState::Succeeded, format!("pull request #{number}"), body);
                // Its checks: CI may report at once, or later (then the poll finds them).
                self.read_checks();
            }
            _ => return false,
        }
        true
    }

    pub(super) fn started(
        &mut self,
        container_id: &str,
        base_branch: &str,
        start_head: Option<&str>,
    ) {
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
    pub(super) fn stale(&mut self) {
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
    pub(super) fn exited(&mut self, code: Option<i64>, log: &str) {
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
    pub(super) fn stop_words(&self, cause: StopCause) -> String {
        match cause {
            StopCause::Timeout => match self
                .run
                .as_ref()
                .and_then(|r| r.settings.as_ref())
                .and_then(|s| s.timeout_secs)
            {
                Some(secs) => format!(
                    "it outlived its repository's `runner.timeout_secs` ({secs} s, in `.director.toml`)"
                ),
                None => format!(
                    "it outlived `runner.timeout_secs` ({} s)",
                    self.policy.run_timeout_secs
                ),
            },
            StopCause::Idle => format!(
                "it printed nothing for `runner.idle_timeout_secs` ({} s) and was taken to be wedged",
                self.policy.idle_timeout_secs
            ),
            StopCause::Budget => "its model calls spent a budget of `[budget]`: the model gateway refused the next one, and the run was stopped".to_owned(),
        }
    }

    /// Success is the branch ahead of the base, not the exit code; but a run that was stopped
    /// or says it is blocked opens no pull request (its branch is named instead).
    pub(super) fn judged(&mut self, ahead: u64) {
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
            let state = if cause == StopCause::Budget {
                body.push_str(&comments::thread::how_to_continue(
                    &run.branch,
                    run.metered_cost_usd(),
                    self.default_continue_usd(),
                    self.max_continue_usd(),
                ));
                RunState::OverBudget
            } else {
                RunState::TimedOut
            };
            self.end_run(state, why, body);
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
        } else if !self.checks_first() {
            self.plan_pull();
        }
    }

    /// The pull request's title: the one a writer vouched for (the one the run was given),
    /// never the issue's latest, which its author may have changed since.
    pub(super) fn pull_title(&self) -> String {
        self.record
            .preflight
            .vouched
            .as_ref()
            .map(|v| {
                crate::preflight::prompt::strip_hidden(&v.title)
                    .trim()
                    .to_owned()
            })
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| format!("Issue #{}", self.record.number))
    }

    /// Plans the run's pull request, with its checks' result when it has one: a draft (its
    /// title starting `WIP: `) when they do not pass.
    pub(super) fn plan_pull(&mut self) {
        let Some(run) = self.run.as_ref() else {
            return;
        };
        let id = run.id.clone();
        {
            let verdict = self
                .record
                .preflight
                .verdict
                .map_or("none", Judgement::as_str);
            let mut title = self.pull_title();
            let summary = run.result.as_ref().and_then(|r| r.summary.as_deref());
            let mut body = comments::pr_body(self.record.number, &id, verdict, summary);
            body.push_str(&comments::agent_line(run.agent.as_ref()));
            if let Some(setup) = &run.setup {
                body.push_str(&format!("\n\n{}.", setup.line()));
            }
            if let Some((section, green)) = self.checks_section() {
                body.push_str(&section);
                if !green {
                    // Forgejo's draft: a title starting `WIP:` cannot be merged.
                    title = format!("WIP: {title}");
                }
            }
            body.push_str(&comments::transcript_link(self.policy.server.run_url(&id)));
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
    pub(super) fn end_cancelled(&mut self, id: &RunId) {
        self.end_run(
            RunState::Cancelled,
            "cancelled".into(),
            comments::run_cancelled(id),
        );
    }

    /// The run ends: its token is revoked, its container removed, the issue told once.
    pub(super) fn end_run(&mut self, state: RunState, detail: String, report: String) {
        let keep_ms = i64::try_from(self.policy.keep_failed_secs.saturating_mul(1000))
            .unwrap_or(i64::MAX / 4);
        let Some(run) = self.run.as_mut() else {
            return;
        };
        run.state = state;
        run.detail = Some(detail);
        run.finished_at_ms = Some(self.now);
        let id = run.id.clone();
        let mut report = report;
        if state != RunState::Succeeded {
            // A pull request's report names it already.
            report.push_str(&comments::usage_line(
                run.result.as_ref().and_then(|r| r.usage.as_ref()),
            ));
        }
        let report = report
            + &comments::agent_line(run.agent.as_ref())
            + &comments::forecast_line(self.record.preflight.forecast.as_ref(), run)
            + &comments::egress_refused(&run.egress_refused)
            + &comments::thread::approvals(
                &run.egress_refused,
                &crate::egress::approvable::globs(&self.policy.egress_approvable),
            )
            + &comments::thread::runtime_line(self.policy.sandbox.as_deref())
            + &comments::transcript_link(self.policy.server.run_url(&run.id));
        let followup_of = run.followup.as_ref().map(|f| f.pr);
        let keep = matches!(
            state,
            RunState::Failed | RunState::TimedOut | RunState::OverBudget
        ) && keep_ms > 0;
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
            if self.record.lifecycle == Lifecycle::Succeeded {
                self.followup_ended();
            }
            return;
        }
        self.set_lifecycle(match state {
            RunState::Succeeded => Lifecycle::Succeeded,
            RunState::TimedOut => Lifecycle::TimedOut,
            RunState::OverBudget => Lifecycle::OverBudget,
            RunState::Cancelled => Lifecycle::Cancelled,
            RunState::Declined => Lifecycle::Declined,
            _ => Lifecycle::Failed,
        });
    }
}

/// What a first start of a run has learnt so far, gathered by the act that starts it; `None`:
/// not known yet (each fact costs a forge call, and some need an earlier one to pass: the
/// PR-only check needs the run's token, which is minted only for the right runner role).
#[derive(Clone, Debug, Default)]
pub struct StartFacts {
    /// A follow-up answers feedback on its pull request: the issue's text is background.
    pub followup: bool,
    /// The issue's trusted text changed since the verdict.
    pub stale: Option<bool>,
    /// Confined runs' egress: `Err(why)` when the proxy could not be had.
    pub egress: Option<Result<(), String>>,
    /// The repository's `.director.toml`: `Err(why)` when it cannot be used.
    pub repo_file: Option<Result<(), String>>,
    /// The agent chosen for the run: `Err(why)` when none can be as asked.
    pub agent: Option<Result<(), String>>,
    /// The run's token: `Err(why)` when the forge would not mint it as asked.
    pub token: Option<Result<(), String>>,
    /// The runner account's role on the repository (`runner_account` forges only).
    pub runner_role: Option<RunnerRole>,
    /// The fork the run's branch lives in, made ready: `Err(why)` when it cannot be.
    pub home: Option<Result<(), String>>,
    /// The default branch as the run's own token sees it.
    pub default_branch: Option<BranchSeen>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerRole {
    pub login: String,
    pub repo: RepoName,
    pub role: crate::forge::Permission,
    /// The most its organisation teams give it on the repository's Actions unit (fork mode
    /// only; `None` otherwise): Forgejo's approval gate trusts a writer there, whatever
    /// `role` says.
    pub actions: crate::forge::Permission,
    /// The run pushes to a fork (`runner.branch_home = "fork"`, or a follow-up of a pull
    /// request from one): the runner must be no writer, so Forgejo holds its pull request's
    /// workflows for a maintainer.
    pub fork: bool,
    /// `runner.allow_writer_runner`.
    pub allow_writer: bool,
}

/// The default branch as the run's token sees it (the PR-only check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchSeen {
    pub base: String,
    /// `None`: the token cannot see the branch.
    pub can: Option<(bool, bool)>,
    /// `runner.allow_unprotected_default_branch`.
    pub allowed_unprotected: bool,
    /// The token is a runner account's (Forgejo), not an App's (GitHub).
    pub runner_account: bool,
    pub runner_login: String,
}

/// Why a run may not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartRefusal {
    /// The issue's trusted text changed since the verdict: nothing starts (not told as a
    /// refusal: the issue is read again).
    Stale,
    /// Refused, and the issue told why.
    Refused(String),
}

/// Whether a run may start, given what its start learnt so far: the first reason it may
/// not, or `None`. Called by the act after each fact it gathers, so "why was my run
/// refused?" has one answer, here.
pub fn start_refusal(facts: &StartFacts) -> Option<StartRefusal> {
    if facts.stale == Some(true) && !facts.followup {
        return Some(StartRefusal::Stale);
    }
    if let Some(Err(why)) = &facts.egress {
        return Some(StartRefusal::Refused(format!(
            "runs are allow-listed (runner.egress) and {why}"
        )));
    }
    for said in [&facts.repo_file, &facts.agent] {
        if let Some(Err(why)) = said {
            return Some(StartRefusal::Refused(why.clone()));
        }
    }
    if let Some(why) = facts.runner_role.as_ref().and_then(runner_role_refusal) {
        return Some(StartRefusal::Refused(why));
    }
    for said in [&facts.home, &facts.token] {
        if let Some(Err(why)) = said {
            return Some(StartRefusal::Refused(why.clone()));
        }
    }
    facts
        .default_branch
        .as_ref()
        .and_then(pr_only_refusal)
        .map(StartRefusal::Refused)
}

/// Why the runner account may not run here, if it may not. Pushing to the repository it must
/// be exactly a writer (an admin's token could lift the branch protection); pushing to a
/// fork it must read the repository and be no writer, unless the operator accepts that its
/// pull requests' workflows then run unapproved (Forgejo trusts a writer's pull request).
pub fn runner_role_refusal(r: &RunnerRole) -> Option<String> {
    use crate::forge::Permission;
    let (login, role, repo) = (&r.login, r.role.as_str(), &r.repo);
    if !r.fork {
        return (r.role != Permission::Write).then(|| format!(
            "the runner account `{login}` has `{role}` permission on {repo}; it must have exactly write (an admin's token could lift the branch protection)"
        ));
    }
    if r.role < Permission::Read {
        return Some(format!(
            "the runner account `{login}` cannot read {repo}; runs push to its fork (runner.branch_home = \"fork\"), and it needs read access to make one"
        ));
    }
    if r.allow_writer {
        return None;
    }
    let role = if r.role.can_write() {
        format!("`{role}` permission on {repo}")
    } else if r.actions.can_write() {
        format!(
            "`{}` access to the Actions unit of {repo} through a team (its repository permission is `{role}`)",
            r.actions.as_str()
        )
    } else {
        return None;
    };
    Some(format!(
        "the runner account `{login}` has {role}: Forgejo trusts a writer's pull request and runs its workflows without a maintainer's approval, so runs from its fork would run unread code; give it read access only, on every unit (or set runner.allow_writer_runner)"
    ))
}

/// Why the run's token is not PR-only, if it is not. A branch the token cannot see fails
/// closed.
fn pr_only_refusal(b: &BranchSeen) -> Option<String> {
    if b.allowed_unprotected {
        return None;
    }
    let base = &b.base;
    let can = match b.can {
        None => {
            return Some(format!(
                "the default branch `{base}` cannot be seen with the run token, so it cannot be shown to be protected against it"
            ));
        }
        Some((false, false)) => return None,
        Some((true, true)) => "push to and merge into",
        Some((true, false)) => "push to",
        Some((false, true)) => "merge into",
    };
    if !b.runner_account {
        return Some(format!(
            "the App's run token can {can} `{base}`: protect the default branch with an active ruleset, or a branch protection, that requires a pull request with an approving review and lets the App never bypass it (a branch protection is read with the App's Administration: read permission), or set runner.allow_unprotected_default_branch"
        ));
    }
    Some(format!(
        "the runner account `{}` can {can} `{base}`: protect the default branch against it, for pushes and merges (or set runner.allow_unprotected_default_branch)",
        b.runner_login
    ))
}
