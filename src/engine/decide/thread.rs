//! What writers grant in the thread: hosts approved for the runs (`/director allow
//! host:port`, within `runner.egress_approvable`) and a run stopped on its budget continued
//! (`/director continue [$N]`, at most `budget.max_continue_usd`). Only a writer's command
//! reaches here (its author's permission checked first); each comment is answered once, and
//! an answer that refuses changes nothing.

use super::*;
use crate::domain::command::Said;
use crate::domain::thread::Continuation;
use crate::egress::approvable;

impl Step<'_> {
    /// Answers the comment `said` was in, once, naming the commands it stated that were not
    /// taken (`command` was).
    pub(super) fn answer(&mut self, said: &Said, command: Command, body: String) {
        let comment = said.comment;
        let body = format!(
            "{body}{}",
            comments::thread::not_taken(command, &said.not_taken)
        );
        self.act(
            Effect::Answer { comment },
            Action::PostNotice {
                marker: format!("<!-- director:answer {comment} -->"),
                body: format!("<!-- director:answer {comment} -->\n{}", body.trim_start()),
            },
        );
    }

    pub(super) fn allow(&mut self, actor: &str, said: &Said) -> bool {
        let globs = approvable::globs(&self.policy.egress_approvable);
        let words: Vec<&str> = said
            .args
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .take(20)
            .collect();
        let checked: Result<Vec<String>, String> = if globs.is_empty() {
            Err("Approving hosts in the thread is off here (`runner.egress_approvable` is empty); an operator can add them to `runner.egress_allow`.".into())
        } else if words.is_empty() {
            Err("Name each host with its port: `/director allow pkgs.example:443`.".into())
        } else {
            let (ok, bad): (Vec<_>, Vec<_>) = words
                .iter()
                .map(|w| approvable::check(w, &globs))
                .partition(Result::is_ok);
            if bad.is_empty() {
                Ok(ok.into_iter().filter_map(Result::ok).collect())
            } else {
                Err(bad
                    .into_iter()
                    .filter_map(Result::err)
                    .map(|why| why.replace('\n', " "))
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        };
        let hosts = match checked {
            Ok(hosts) => hosts,
            Err(why) => {
                self.answer(
                    said,
                    Command::Allow,
                    comments::thread::refused("allow", &why),
                );
                return true;
            }
        };
        let allowed = &mut self.record.thread.egress_allowed;
        allowed.extend(hosts.iter().cloned());
        allowed.sort();
        allowed.dedup();
        let retried = self.retry_refused(&hosts);
        let body = comments::thread::allowed(
            actor,
            &hosts,
            &self.record.thread.egress_allowed,
            retried.as_ref().map(RunId::as_str),
        );
        self.answer(said, Command::Allow, body);
        true
    }

    /// Starts the last run again, once, when the egress proxy refused it one of
    /// `hosts` and it ended without a pull request.
    fn retry_refused(&mut self, hosts: &[String]) -> Option<RunId> {
        let entries: Vec<crate::egress::Entry> =
            hosts.iter().filter_map(|h| h.parse().ok()).collect();
        let run = self.run.as_ref().filter(|r| {
            r.finished_at_ms.is_some()
                && r.followup.is_none()
                && r.egress_refused.iter().any(|(what, _)| {
                    crate::egress::split_host_port(what)
                        .is_some_and(|(h, p)| crate::egress::covered(&entries, &h, p))
                })
        })?;
        let retryable = matches!(
            self.record.lifecycle,
            Lifecycle::Failed | Lifecycle::TimedOut | Lifecycle::Declined | Lifecycle::OverBudget
        ) && self.record.trigger_present
            && self.record.is_open()
            && self.record.thread.retried.as_ref() != Some(&run.id);
        if !retryable {
            return None;
        }
        let id = run.id.clone();
        self.record.thread.retried = Some(id.clone());
        self.set_lifecycle(Lifecycle::Queued);
        Some(id)
    }

    pub(super) fn continue_run(&mut self, actor: &str, said: &Said) -> bool {
        let run = self
            .run
            .as_ref()
            .filter(|r| r.state == RunState::OverBudget && r.followup.is_none());
        let default_usd = self.default_continue_usd();
        let max = self.max_continue_usd();
        let asked = said.args.trim();
        let usd: Result<f64, String> = if asked.is_empty() {
            Ok(default_usd)
        } else {
            match asked.trim_start_matches('$').parse::<f64>() {
                Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
                _ => Err(format!(
                    "`{}` is not an amount of dollars: say `/director continue` or `/director continue $5`.",
                    asked
                        .chars()
                        .filter(|c| !c.is_control() && *c != '`')
                        .take(40)
                        .collect::<String>()
                )),
            }
        };
        let checked = match (run, usd) {
            (None, _) => Err("Only a run stopped on its budget can be continued, and this issue's last run was not.".to_owned()),
            (_, Err(why)) => Err(why),
            (Some(_), Ok(n)) if max > 0.0 && n > max + 1e-9 => Err(format!(
                "{} is above `budget.max_continue_usd` ({}{}).",
                crate::domain::units::dollars(n, 2),
                crate::domain::units::dollars(max, 2),
                if self.policy.max_continue_usd > 0.0 {
                    ""
                } else {
                    ": it is not set, so `budget.run_usd`"
                }
            )),
            (Some(_), Ok(_))
                if self.record.lifecycle != Lifecycle::OverBudget
                    || !self.record.trigger_present
                    || !self.record.is_open() =>
            {
                Err("The issue has moved on since its run stopped on its budget (or its trigger is off, or it is closed).".to_owned())
            }
            (Some(r), Ok(n)) => Ok((r.clone(), n)),
        };
        let (from, usd) = match checked {
            Ok(c) => c,
            Err(why) => {
                self.answer(
                    said,
                    Command::Continue,
                    comments::thread::refused("continue", &why),
                );
                return true;
            }
        };
        self.record.thread.continuation = Some(Continuation {
            from: from.id.clone(),
            branch: from.branch.clone(),
            home: from.home.clone(),
            base_commit: from.base_commit.clone(),
            usd,
            spent_usd: from.metered_cost_usd(),
            by: actor.to_owned(),
        });
        let body = comments::thread::continuing(actor, from.id.as_str(), &from.branch, usd);
        self.answer(said, Command::Continue, body);
        self.set_lifecycle(Lifecycle::Queued);
        true
    }

    /// What a plain `/director continue` gives: `budget.run_usd`, within
    /// `budget.max_continue_usd`.
    pub(super) fn default_continue_usd(&self) -> f64 {
        let (run, max) = (self.policy.run_usd, self.max_continue_usd());
        if max > 0.0 && (run <= 0.0 || run > max) {
            max
        } else {
            run
        }
    }

    /// The most a `/director continue $N` may give: `budget.max_continue_usd`, or
    /// `budget.run_usd` when that is not set (as `docs/configuration.md` says); 0 only when
    /// neither is set, and then runs have no budget of their own to continue past.
    pub(super) fn max_continue_usd(&self) -> f64 {
        if self.policy.max_continue_usd > 0.0 {
            self.policy.max_continue_usd
        } else {
            self.policy.run_usd.max(0.0)
        }
    }

    /// At admission: a waiting continuation goes to the new run, on the stopped run's branch.
    pub(super) fn take_continuation(&mut self, run: &mut RunRecord) {
        if let Some(c) = self.record.thread.continuation.take() {
            run.branch = c.branch.clone();
            run.home = c.home.clone();
            run.base_commit = c.base_commit.clone();
            run.continued = Some(c);
        }
    }
}
