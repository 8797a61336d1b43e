//! Pure decisions: given what the director knows and a new fact, what it should now know.
//! No I/O here, and `now` comes in as an argument.

use chrono::DateTime;

use crate::forge::payload::ForgeEvent;
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

/// The issue record after `event`, or `None` when the event changes nothing: it is about a
/// pull request, or older than what is already known (deliveries arrive out of order).
pub fn apply_event(
    known: Option<&IssueRecord>,
    event: &ForgeEvent,
    now_ms: i64,
) -> Option<IssueRecord> {
    if event.is_pull {
        return None;
    }
    let snap = &event.snapshot;
    if let Some(known) = known {
        if !is_not_older(
            snap.updated_at.as_deref(),
            known.forge_updated_at.as_deref(),
        ) {
            return None;
        }
        let unchanged = known.title == snap.title
            && known.state == snap.state
            && known.labels == sorted(&snap.labels)
            && known.forge_updated_at == snap.updated_at;
        if unchanged {
            return None;
        }
    }
    Some(IssueRecord {
        repo: event.issue.repo.clone(),
        number: event.issue.number,
        title: snap.title.clone(),
        state: snap.state.clone(),
        labels: sorted(&snap.labels),
        forge_updated_at: snap.updated_at.clone(),
        last_change_ms: now_ms,
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
    use crate::forge::payload::{EventKind, IssueSnapshot};

    fn event(updated_at: &str, labels: &[&str]) -> ForgeEvent {
        ForgeEvent {
            kind: EventKind::IssueLabel,
            action: "label_updated".into(),
            issue: "acme/widgets#7".parse().expect("valid"),
            sender: "alice".into(),
            is_pull: false,
            snapshot: IssueSnapshot {
                title: "Fix it".into(),
                body: String::new(),
                state: "open".into(),
                labels: labels.iter().map(|s| s.to_string()).collect(),
                author: "bob".into(),
                updated_at: Some(updated_at.into()),
                merged: false,
            },
            comment: None,
        }
    }

    #[test]
    fn newer_events_replace_older_ones_in_either_order() {
        let early = event("2026-01-01T10:00:00Z", &["bug"]);
        let late = event("2026-01-01T10:00:05+00:00", &["bug", "headless"]);
        let in_order =
            apply_event(apply_event(None, &early, 1).as_ref(), &late, 2).expect("newer applies");
        let first = apply_event(None, &late, 1).expect("first applies");
        assert!(
            apply_event(Some(&first), &early, 2).is_none(),
            "an older event must not win"
        );
        assert_eq!(in_order.labels, first.labels);
        assert_eq!(
            in_order.labels,
            vec!["bug".to_owned(), "headless".to_owned()]
        );
    }

    #[test]
    fn the_same_event_twice_changes_nothing() {
        let e = event("2026-01-01T10:00:00Z", &["headless"]);
        let once = apply_event(None, &e, 1).expect("applies");
        assert!(apply_event(Some(&once), &e, 2).is_none());
    }

    #[test]
    fn pull_requests_are_not_issues() {
        let mut e = event("2026-01-01T10:00:00Z", &[]);
        e.is_pull = true;
        assert!(apply_event(None, &e, 1).is_none());
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
