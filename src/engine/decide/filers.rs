//! Agent-filed work (`[filers]`): which issues a filer's account filed, the filer's own
//! approval rule, and its day's limits (`max_per_day`, `daily_usd`). A writer's `/director
//! go` makes the issue a maintainer's.

use super::*;

/// The hidden marker of the one comment saying why a filer's limit holds the issue.
pub const FILER_MARKER: &str = "<!-- director:filer-held -->";

pub use crate::domain::filer::FilerDay;

/// Whether the filer's day holds a read of its issue, and until when (the next UTC
/// midnight): its budget spent, or, for an issue not yet taken, `max_per_day` reached.
pub fn filer_limit(
    name: &str,
    rule: &crate::domain::filer::FilerRule,
    day: FilerDay,
    now: i64,
) -> Option<(String, i64)> {
    let until = crate::models::next_day_ms(now);
    if rule.daily_usd > 0.0 && day.spent_usd >= rule.daily_usd {
        return Some((
            format!(
                "the filer `{name}` spent its day's budget ({}, filers.{name}.daily_usd)",
                crate::domain::forecast::dollars((rule.daily_usd * 1e6).round() as u64)
            ),
            until,
        ));
    }
    if rule.max_per_day > 0 && !day.taken_before && day.taken_today >= rule.max_per_day {
        return Some((
            format!(
                "the filer `{name}` filed its {} issues for today (filers.{name}.max_per_day)",
                rule.max_per_day
            ),
            until,
        ));
    }
    None
}

impl Step<'_> {
    /// The trigger is judged a writer's: the issue is agent-filed when a filer's account
    /// applied it or authored the issue.
    pub(super) fn filed(&mut self, actor: Option<&str>) {
        let author = self.record.preflight.author.clone();
        let filed = self.policy.filers.filed(actor, author.as_deref());
        if let Some(f) = &filed {
            tracing::info!(filer = %f.name, login = %f.login, "agent-filed: a filer's account filed the issue");
        }
        self.record.preflight.filer = filed;
        self.record.preflight.filer_notice = false;
    }

    /// A writer who is not a filer said `/director go` (or applied the skip label): the
    /// work is a maintainer's from now on.
    pub(super) fn maintainers(&mut self, by: &str) {
        if !self.policy.filers.is_filer(by)
            && let Some(f) = self.record.preflight.filer.as_mut()
            && f.is_agents()
        {
            f.taken_by = Some(by.to_owned());
            tracing::info!(filer = %f.name, by, "a writer's go makes agent-filed work a maintainer's");
        }
    }

    /// Why the GO must wait for approval: the operator's and the repository's settings, and
    /// for an agent-filed issue its filer's rule.
    pub(super) fn approval_needed(&self, read: &ReadContext) -> Option<String> {
        let filer = self
            .record
            .preflight
            .filer
            .as_ref()
            .filter(|f| f.is_agents())
            .and_then(|f| Some((f.name.as_str(), self.policy.filers.rule(&f.name)?.approval)));
        match filer {
            Some(filer) => crate::domain::approval::needs_filed(
                filer,
                self.policy.approval,
                read.repo_approval,
                read.forecast.as_ref(),
                self.policy.run_usd,
            ),
            None => crate::domain::approval::needs(
                self.policy.approval,
                read.repo_approval,
                read.forecast.as_ref(),
                self.policy.run_usd,
            ),
        }
    }

    /// A filer's day holds the read: the issue says why, once.
    pub(super) fn filer_held(&mut self, filer: &str, limit: &str, until_ms: i64) {
        if self.record.preflight.filer_notice {
            return;
        }
        self.record.preflight.filer_notice = true;
        let v = self.version();
        self.act(
            Effect::FilerNotice { version: v },
            Action::PostNotice {
                marker: FILER_MARKER.into(),
                body: format!(
                    "{FILER_MARKER}\nThis issue was filed for an agent by the filer `{filer}`, and it waits: {limit}. It is read on {}, when the filer's day starts over; a maintainer's `/director go` takes it now, as a maintainer's.",
                    format_time(until_ms)
                ),
            },
        );
    }
}
