//! `director status`: the tracked issues as a table for people or JSON for tools.

use serde::Serialize;

use crate::domain::{IssueRef, Lifecycle};
use crate::store::{ActionRow, IssueRecord};

#[derive(Serialize)]
struct Row<'a> {
    repo: String,
    number: u64,
    /// The lifecycle state.
    state: &'a str,
    title: &'a str,
    /// The issue's own state on the forge: open or closed.
    issue_state: &'a str,
    labels: &'a [String],
    trigger_present: bool,
    trigger_actor: Option<&'a str>,
    trigger_trusted: Option<bool>,
    /// For queued issues: 1 runs next.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_position: Option<usize>,
    last_change: String,
    /// Why the issue waits, when it waits on something other than its turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<String>,
    /// Actions of the issue that failed (being retried, or given up).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failing: Vec<Failing<'a>>,
}

#[derive(Serialize)]
struct Failing<'a> {
    action: &'a str,
    attempts: u32,
    /// `due` (retried at `retry_at`) or `failed` (given up).
    state: &'a str,
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_at: Option<String>,
}

fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Why a waiting issue waits: a give-up, a pre-flight retry or an hourly cap.
fn waiting(r: &IssueRecord) -> Option<String> {
    if let Some(b) = &r.blocked {
        return Some(b.clone());
    }
    match (r.lifecycle, r.preflight.not_before_ms) {
        (Lifecycle::Pending, Some(at)) => Some(match &r.preflight.last_error {
            Some(e) => format!(
                "pre-flight retry {} at {}: {e}",
                r.preflight.attempts + 1,
                when(at)
            ),
            None => format!("pre-flight deferred by an hourly cap until {}", when(at)),
        }),
        _ => None,
    }
}

/// Issues the director has seen carry the trigger; others are recorded but not shown.
/// `troubled` are the actions that failed (from [`crate::store::Store::troubled_actions`]).
pub fn render(
    issues: &[IssueRecord],
    troubled: &[ActionRow],
    json: bool,
) -> anyhow::Result<String> {
    let mut failing: std::collections::HashMap<&IssueRef, Vec<Failing<'_>>> =
        std::collections::HashMap::new();
    for a in troubled {
        failing.entry(&a.issue).or_default().push(Failing {
            action: &a.kind,
            attempts: a.attempts,
            state: &a.state,
            error: a.last_error.as_deref(),
            retry_at: (a.state == "due").then(|| when(a.not_before_ms)),
        });
    }
    let mut queued: Vec<&IssueRecord> = issues
        .iter()
        .filter(|r| r.lifecycle == Lifecycle::Queued)
        .collect();
    queued.sort_by_key(|r| (r.last_change_ms, r.repo.to_string(), r.number));
    let positions: std::collections::HashMap<(String, u64), usize> = queued
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.repo.to_string(), r.number), i + 1))
        .collect();
    let rows: Vec<Row<'_>> = issues
        .iter()
        .filter(|r| {
            r.trigger_present || r.trigger_actor.is_some() || r.lifecycle != Lifecycle::Untracked
        })
        .map(|r| Row {
            repo: r.repo.to_string(),
            number: r.number,
            state: r.lifecycle.as_str(),
            title: &r.title,
            issue_state: &r.state,
            labels: &r.labels,
            trigger_present: r.trigger_present,
            trigger_actor: r.trigger_actor.as_deref(),
            trigger_trusted: r.trigger_trusted,
            queue_position: positions.get(&(r.repo.to_string(), r.number)).copied(),
            last_change: when(r.last_change_ms),
            waiting: waiting(r),
            failing: failing.remove(&r.issue_ref()).unwrap_or_default(),
        })
        .collect();
    if json {
        return Ok(format!("{}\n", serde_json::to_string_pretty(&rows)?));
    }
    if rows.is_empty() {
        return Ok("no tracked issues\n".to_owned());
    }
    let mut out = format!(
        "{:<40} {:<10} {:<20} {:<20} {}\n",
        "ISSUE", "STATE", "TRIGGER BY", "LAST CHANGE", "TITLE"
    );
    for r in rows {
        let actor = match (r.trigger_actor, r.trigger_trusted) {
            (Some(a), Some(false)) => format!("{a} (no write)"),
            (Some(a), _) => a.to_owned(),
            (None, _) if r.trigger_present => "(checking)".to_owned(),
            (None, _) => "-".to_owned(),
        };
        let title: String = r.title.chars().take(60).collect();
        let state = match r.queue_position {
            Some(p) => format!("{} #{p}", r.state),
            None => r.state.to_owned(),
        };
        out.push_str(&format!(
            "{:<40} {:<10} {:<20} {:<20} {}\n",
            format!("{}#{}", r.repo, r.number),
            state,
            actor,
            r.last_change,
            title
        ));
        if let Some(w) = &r.waiting {
            out.push_str(&format!("    waiting: {w}\n"));
        }
        for f in &r.failing {
            out.push_str(&format!(
                "    {} {} after {} attempt(s): {}\n",
                f.action,
                if f.state == "failed" {
                    "gave up"
                } else {
                    "failing"
                },
                f.attempts,
                f.error.unwrap_or("")
            ));
        }
    }
    Ok(out)
}
