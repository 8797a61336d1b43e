//! Pure decisions: given what the director knows of an issue and a new fact about it, what it
//! now knows and what must happen next. No I/O here, and `now` comes in as an argument.

use chrono::DateTime;

use crate::domain::Lifecycle;
use crate::forge::payload::{EventKind, ForgeEvent};
use crate::store::IssueRecord;

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

/// What the consumer must do after recording a fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// The issue changed after a verdict: the pre-flight looks again.
    Reread,
    /// A pre-flight or run result was applied.
    Applied,
    /// `/director cancel` or `/director retry`: counts only if `actor` may write.
    Command {
        actor: String,
        verb: String,
    },
    /// The trigger is on an open issue and who applied it is not known yet: find out (the
    /// hint is the webhook sender of the label change itself) and check their permission.
    ResolveTrigger {
        actor_hint: Option<String>,
    },
    /// The trigger was removed or the issue closed while the director was on it.
    Cancelled,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub record: IssueRecord,
    pub step: Step,
}

/// The trigger is on an open issue, and that was already judged.
fn live_and_judged(r: &IssueRecord) -> bool {
    r.trigger_present && r.state == "open" && r.trigger_trusted.is_some()
}

/// The record after `event`, and the next step; `None` when the event changes nothing: it
/// is about a pull request, older than what is known (deliveries arrive out of order), or
/// says what is already known.
pub fn apply_event(
    known: Option<&IssueRecord>,
    event: &ForgeEvent,
    labels_cfg: &LabelNames,
    now_ms: i64,
) -> Option<Decision> {
    if event.kind == EventKind::Preflight {
        return apply_preflight(known?, event.preflight.as_ref()?, now_ms);
    }
    if event.kind == EventKind::Run {
        let known = known?;
        let t = event.run.as_ref()?;
        if !t.from.contains(&known.lifecycle) {
            return None;
        }
        let mut record = known.clone();
        record.lifecycle = t.to;
        record.last_change_ms = now_ms;
        return Some(Decision {
            record,
            step: Step::Applied,
        });
    }
    if event.is_pull {
        return None;
    }
    let trigger = labels_cfg.trigger.as_str();
    let snap = &event.snapshot;
    if let Some(known) = known
        && !is_not_older(
            snap.updated_at.as_deref(),
            known.forge_updated_at.as_deref(),
        )
    {
        return None;
    }
    let labels = sorted(&snap.labels);
    let trigger_present = labels.iter().any(|l| l == trigger);
    let open = snap.state == "open";
    let mut record = known.cloned().unwrap_or_else(|| IssueRecord {
        repo: event.issue.repo.clone(),
        number: event.issue.number,
        title: String::new(),
        state: String::new(),
        labels: Vec::new(),
        forge_updated_at: None,
        last_change_ms: now_ms,
        lifecycle: Lifecycle::Untracked,
        trigger_present: false,
        trigger_actor: None,
        trigger_trusted: None,
        untrusted_notice: false,
        preflight: Default::default(),
    });
    let was_judged = known.is_some_and(live_and_judged);
    let snapshot_unchanged = known.is_some_and(|k| {
        k.title == snap.title
            && k.state == snap.state
            && k.labels == labels
            && k.forge_updated_at == snap.updated_at
    });

    record.title = snap.title.clone();
    record.state = snap.state.clone();
    record.labels = labels;
    record.forge_updated_at = snap.updated_at.clone();
    record.trigger_present = trigger_present;

    let command = match (&event.kind, &event.comment) {
        (EventKind::IssueComment, Some(c))
            if event.action == "created" && !event.sender.is_empty() =>
        {
            ["cancel", "retry"]
                .into_iter()
                .find(|verb| crate::preflight::worker::is_command(&c.body, verb))
        }
        _ => None,
    };
    let step = if let Some(verb) =
        command.filter(|_| trigger_present && open && record.trigger_trusted == Some(true))
    {
        Step::Command {
            actor: event.sender.clone(),
            verb: verb.to_owned(),
        }
    } else if trigger_present && open {
        if was_judged {
            let skip_changed = known.is_some_and(|k| {
                k.labels.contains(&labels_cfg.skip_preflight)
                    != record.labels.contains(&labels_cfg.skip_preflight)
            });
            let content_event = !event.sender.is_empty()
                && match event.kind {
                    EventKind::Issues => event.action == "edited",
                    EventKind::IssueComment => true,
                    EventKind::IssueLabel => skip_changed,
                    _ => false,
                };
            if content_event && record.trigger_trusted == Some(true) && record.lifecycle.is_active()
            {
                // Read again; the worker keeps the old verdict if the trusted text is the same.
                request_read(&mut record);
                Step::Reread
            } else {
                Step::Nothing
            }
        } else {
            record.trigger_actor = None;
            record.trigger_trusted = None;
            let actor_hint = (event.kind == EventKind::IssueLabel && !event.sender.is_empty())
                .then(|| event.sender.clone());
            Step::ResolveTrigger { actor_hint }
        }
    } else if record.lifecycle.is_active() {
        record.lifecycle = Lifecycle::Cancelled;
        Step::Cancelled
    } else {
        Step::Nothing
    };
    if snapshot_unchanged && step == Step::Nothing {
        return None;
    }
    record.last_change_ms = now_ms;
    Some(Decision { record, step })
}

/// The label names decisions depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelNames {
    pub trigger: String,
    pub skip_preflight: String,
}

/// Moves the issue to `pending` under a new revision: the pre-flight worker reads it.
fn request_read(record: &mut IssueRecord) {
    record.lifecycle = Lifecycle::Pending;
    record.preflight.rev += 1;
    record.preflight.attempts = 0;
    record.preflight.last_error = None;
    record.preflight.not_before_ms = None;
}

/// The record once the trigger's author and their permission are known.
pub fn judge_trigger(
    mut record: IssueRecord,
    actor: Option<String>,
    trusted: bool,
    now_ms: i64,
) -> IssueRecord {
    record.trigger_actor = actor;
    record.trigger_trusted = Some(trusted);
    if trusted {
        request_read(&mut record);
    } else {
        record.lifecycle = Lifecycle::Untracked;
    }
    record.last_change_ms = now_ms;
    record
}

/// A writer's `/director cancel` or `/director retry`.
pub fn apply_command(mut record: IssueRecord, verb: &str, now_ms: i64) -> Option<IssueRecord> {
    let next = match verb {
        "cancel" if record.lifecycle.is_active() => Lifecycle::Cancelled,
        "retry"
            if matches!(
                record.lifecycle,
                Lifecycle::Failed | Lifecycle::TimedOut | Lifecycle::Cancelled
            ) =>
        {
            Lifecycle::Queued
        }
        _ => return None,
    };
    record.lifecycle = next;
    record.last_change_ms = now_ms;
    Some(record)
}

/// A pre-flight result, applied only to the revision it was computed for.
fn apply_preflight(
    known: &IssueRecord,
    result: &crate::preflight::PreflightResult,
    now_ms: i64,
) -> Option<Decision> {
    if known.lifecycle != Lifecycle::Pending || known.preflight.rev != result.rev {
        return None;
    }
    let mut record = known.clone();
    record.lifecycle = result.lifecycle;
    record.preflight = result.state.clone();
    record.last_change_ms = now_ms;
    Some(Decision {
        record,
        step: Step::Applied,
    })
}

/// Labels in a canonical order, so the same set always compares equal.
pub fn sorted(labels: &[String]) -> Vec<String> {
    let mut out = labels.to_vec();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::payload::IssueSnapshot;

    const T: &str = "headless";

    fn names() -> LabelNames {
        LabelNames {
            trigger: T.into(),
            skip_preflight: "headless:skip-preflight".into(),
        }
    }

    fn event(kind: EventKind, updated_at: &str, labels: &[&str], state: &str) -> ForgeEvent {
        ForgeEvent {
            kind,
            action: "label_updated".into(),
            issue: "acme/widgets#7".parse().expect("valid"),
            sender: "alice".into(),
            is_pull: false,
            snapshot: IssueSnapshot {
                title: "Fix it".into(),
                body: String::new(),
                state: state.into(),
                labels: labels.iter().map(|s| s.to_string()).collect(),
                author: "bob".into(),
                updated_at: Some(updated_at.into()),
                merged: false,
            },
            comment: None,
            preflight: None,
            run: None,
        }
    }

    fn label(updated_at: &str, labels: &[&str]) -> ForgeEvent {
        event(EventKind::IssueLabel, updated_at, labels, "open")
    }

    fn trusted(d: Decision) -> IssueRecord {
        judge_trigger(d.record, Some("alice".into()), true, 9)
    }

    #[test]
    fn newer_events_replace_older_ones_in_either_order() {
        let early = label("2026-01-01T10:00:00Z", &["bug"]);
        let late = label("2026-01-01T10:00:05+00:00", &["bug", "headless"]);
        let first = apply_event(None, &early, &names(), 1)
            .expect("applies")
            .record;
        let in_order = apply_event(Some(&first), &late, &names(), 2)
            .expect("newer applies")
            .record;
        let reversed = apply_event(None, &late, &names(), 1)
            .expect("applies")
            .record;
        assert!(
            apply_event(Some(&reversed), &early, &names(), 2).is_none(),
            "an older event must not win"
        );
        assert_eq!(in_order.labels, reversed.labels);
        assert_eq!(
            in_order.labels,
            vec!["bug".to_owned(), "headless".to_owned()]
        );
    }

    #[test]
    fn a_label_event_that_adds_the_trigger_names_its_sender() {
        let d = apply_event(
            None,
            &label("2026-01-01T10:00:00Z", &["headless"]),
            &names(),
            1,
        )
        .expect("applies");
        assert_eq!(
            d.step,
            Step::ResolveTrigger {
                actor_hint: Some("alice".into())
            }
        );
    }

    #[test]
    fn other_events_that_reveal_the_trigger_ask_the_timeline() {
        let e = event(
            EventKind::Scan,
            "2026-01-01T10:00:00Z",
            &["headless"],
            "open",
        );
        let d = apply_event(None, &e, &names(), 1).expect("applies");
        assert_eq!(d.step, Step::ResolveTrigger { actor_hint: None });
    }

    #[test]
    fn the_same_event_twice_changes_nothing() {
        let e = label("2026-01-01T10:00:00Z", &["headless"]);
        let once = trusted(apply_event(None, &e, &names(), 1).expect("applies"));
        assert!(apply_event(Some(&once), &e, &names(), 2).is_none());
    }

    #[test]
    fn an_unresolved_trigger_is_resolved_again_on_the_next_observation() {
        let e = label("2026-01-01T10:00:00Z", &["headless"]);
        let unresolved = apply_event(None, &e, &names(), 1).expect("applies").record;
        let again = apply_event(Some(&unresolved), &e, &names(), 2).expect("retries");
        assert!(matches!(again.step, Step::ResolveTrigger { .. }));
    }

    #[test]
    fn removing_the_trigger_or_closing_cancels_a_picked_up_issue() {
        let on = trusted(
            apply_event(
                None,
                &label("2026-01-01T10:00:00Z", &["headless"]),
                &names(),
                1,
            )
            .expect("applies"),
        );
        assert_eq!(on.lifecycle, Lifecycle::Pending);
        let off = apply_event(Some(&on), &label("2026-01-01T10:00:01Z", &[]), &names(), 2)
            .expect("applies");
        assert_eq!(off.step, Step::Cancelled);
        assert_eq!(off.record.lifecycle, Lifecycle::Cancelled);
        let closed = event(
            EventKind::Issues,
            "2026-01-01T10:00:01Z",
            &["headless"],
            "closed",
        );
        let d = apply_event(Some(&on), &closed, &names(), 2).expect("applies");
        assert_eq!(d.record.lifecycle, Lifecycle::Cancelled);
    }

    #[test]
    fn removing_an_untrusted_trigger_cancels_nothing() {
        let d = apply_event(
            None,
            &label("2026-01-01T10:00:00Z", &["headless"]),
            &names(),
            1,
        )
        .expect("applies");
        let untrusted = judge_trigger(d.record, Some("mallory".into()), false, 2);
        let off = apply_event(
            Some(&untrusted),
            &label("2026-01-01T10:00:01Z", &[]),
            &names(),
            3,
        )
        .expect("applies");
        assert_eq!(off.step, Step::Nothing);
        assert_eq!(off.record.lifecycle, Lifecycle::Untracked);
    }

    #[test]
    fn reapplying_after_cancel_is_judged_afresh() {
        let on = trusted(
            apply_event(
                None,
                &label("2026-01-01T10:00:00Z", &["headless"]),
                &names(),
                1,
            )
            .expect("applies"),
        );
        let off = apply_event(Some(&on), &label("2026-01-01T10:00:01Z", &[]), &names(), 2)
            .expect("applies")
            .record;
        let again = apply_event(
            Some(&off),
            &label("2026-01-01T10:00:02Z", &["headless"]),
            &names(),
            3,
        )
        .expect("applies");
        assert!(matches!(again.step, Step::ResolveTrigger { .. }));
    }

    #[test]
    fn pull_requests_are_not_issues() {
        let mut e = label("2026-01-01T10:00:00Z", &["headless"]);
        e.is_pull = true;
        assert!(apply_event(None, &e, &names(), 1).is_none());
    }

    #[test]
    fn timestamps_compare_as_instants_not_strings() {
        assert!(is_not_older(
            Some("2026-01-01T12:00:00+02:00"),
            Some("2026-01-01T09:59:59Z")
        ));
        assert!(!is_not_older(
            Some("2026-01-01T11:00:00+02:00"),
            Some("2026-01-01T09:59:59Z")
        ));
        assert!(!is_not_older(None, Some("2026-01-01T09:59:59Z")));
    }
}
