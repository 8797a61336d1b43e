//! `director status`: the tracked issues as a table for people or JSON for tools.

use serde::Serialize;

use crate::domain::Lifecycle;
use crate::store::IssueRecord;

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
}

fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Issues the director has seen carry the trigger; others are recorded but not shown.
pub fn render(issues: &[IssueRecord], json: bool) -> anyhow::Result<String> {
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
    }
    Ok(out)
}
