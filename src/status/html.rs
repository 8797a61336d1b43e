//! The status page and a run's page as HTML: escaped, no scripts, readable narrow and dark.
//! The rows they show are made in `super`.

use super::*;

/// Text made safe to put in HTML, in an element or an attribute.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) use crate::domain::units::duration;

/// The queue's totals: (label, count), in the order the page shows them.
pub(super) fn totals(rows: &[Row]) -> Vec<(&'static str, usize)> {
    let count = |states: &[&str]| {
        rows.iter()
            .filter(|r| states.contains(&r.state.as_str()))
            .count()
    };
    vec![
        ("tracked", rows.len()),
        ("pre-flight", count(&["pending"])),
        ("queued", count(&["queued"])),
        ("running", count(&["launching", "running"])),
        ("pull request open", count(&["succeeded"])),
        ("merged", count(&["merged"])),
        ("pull request closed", count(&["pr_closed"])),
        ("declined", count(&["declined"])),
        (
            "failed",
            count(&["failed", "timed_out", "over_budget", "preflight_failed"]),
        ),
        ("no-go", count(&["no_go"])),
        ("needs info", count(&["needs_info"])),
    ]
}

pub(super) fn why_it_waits(r: &Row) -> String {
    let mut parts = Vec::new();
    if let Some(words) = r.pr.as_ref().and_then(pr_words) {
        parts.push(words);
    }
    if let Some(p) = r.queue_position {
        parts.push(format!("queue position {p}"));
    }
    if let Some(w) = &r.waiting {
        parts.push(w.clone());
    }
    if let Some(f) = &r.filer {
        parts.push(format!(
            "filed by {} for an agent (filer {})",
            f.login, f.name
        ));
    }
    if !r.egress_allowed.is_empty() {
        parts.push(format!(
            "approved in the thread: {}",
            r.egress_allowed.join(", ")
        ));
    }
    for f in &r.failing {
        parts.push(match &f.retry_at {
            Some(t) => format!("{}, next try {t}", f.summary()),
            None => f.summary(),
        });
    }
    esc(&parts.join("; "))
}

pub(super) fn run_cell(r: &Row) -> String {
    let Some(run) = &r.run else {
        return String::new();
    };
    let mut out = format!(
        "<a href=\"runs/{}\"><code>{}</code></a> {}",
        esc(&run.id),
        esc(&run.id),
        esc(&run.state.replace('_', " "))
    );
    if let Some(age) = run.age_secs {
        out.push_str(&format!(" · {}", duration(age)));
    }
    match (&run.pr_url, run.pr) {
        (Some(url), Some(n)) => out.push_str(&format!(" · <a href=\"{}\">#{n}</a>", esc(url))),
        (None, Some(n)) => out.push_str(&format!(" · PR #{n}")),
        _ => {}
    }
    if let Some(agent) = &run.agent {
        out.push_str(&format!(
            " · <span class=\"agent\" title=\"{}\">{}</span>",
            esc(&agent.describe()),
            esc(&agent.name)
        ));
    }
    if let Some(settings) = &run.settings {
        out.push_str(&format!(
            " · <span class=\"muted settings\">{}</span>",
            esc(&settings.describe())
        ));
    }
    if let Some(runtime) = &run.runtime {
        out.push_str(&format!(
            " · <span class=\"runtime\">runtime {}</span>",
            esc(runtime)
        ));
    }
    if let Some(c) = &run.continued {
        out.push_str(&format!(
            " · continues <code>{}</code>",
            esc(c.from.as_str())
        ));
    }
    if let Some(setup) = &run.setup {
        out.push_str(&format!(
            " · <span class=\"setup\" title=\"{}\">setup {}</span>",
            esc(&setup.line()),
            setup.mode.as_str()
        ));
    }
    out
}

/// The status page: the rows as a table, the totals on top, refreshed every 15 s without
/// JavaScript. Every piece of issue text is escaped.
pub fn html(rows: &[Row], now_ms: i64, private_hidden: bool) -> String {
    html_with_spend(rows, now_ms, private_hidden, &[])
}

/// The page, with the model spend of each repository today (dollars, most first).
pub fn html_with_spend(
    rows: &[Row],
    now_ms: i64,
    private_hidden: bool,
    spend: &[(String, f64)],
) -> String {
    let mut out = String::from(concat!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta http-equiv=\"refresh\" content=\"15\">\n<title>director: status</title>\n<style>\n",
        "body{font:15px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1f24;background:#fafbfc}\n",
        "h1{font-size:1.4rem;margin:0 0 .5rem}\n",
        ".totals{display:flex;flex-wrap:wrap;gap:.5rem;padding:0;margin:0 0 1rem;list-style:none}\n",
        ".totals li{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.35rem .7rem}\n",
        ".totals b{font-size:1.15rem;margin-right:.3rem}\n",
        "table{border-collapse:collapse;width:100%;background:#fff}\n",
        "th,td{border-bottom:1px solid #d0d7de;padding:.45rem .6rem;text-align:left;vertical-align:top}\n",
        "th{background:#f0f3f6;font-weight:600}\n",
        ".state{border-radius:1rem;padding:.1rem .55rem;background:#eaeef2;white-space:nowrap}\n",
        ".state-running,.state-launching{background:#ddf4ff}.state-queued{background:#fff8c5}\n",
        ".state-succeeded{background:#dafbe1}.state-failed,.state-timed_out,.state-over_budget,.state-preflight_failed{background:#ffebe9}\n",
        ".verdict{font-weight:600}.muted{color:#57606a}\n",
        "</style>\n</head>\n<body>\n<h1>director</h1>\n<ul class=\"totals\">\n",
    ));
    for (label, n) in totals(rows) {
        out.push_str(&format!("<li><b>{n}</b>{label}</li>\n"));
    }
    out.push_str("</ul>\n<p><a href=\"/status/outcomes\">What the agents delivered: outcomes, cost and time</a></p>\n");
    if !spend.is_empty() {
        let parts: Vec<String> = spend
            .iter()
            .map(|(repo, usd)| {
                // Cents hide a day of small calls.
                let usd = if *usd < 1.0 {
                    format!("{usd:.4}")
                } else {
                    format!("{usd:.2}")
                };
                format!("{} <b>${usd}</b>", esc(repo))
            })
            .collect();
        out.push_str(&format!(
            "<p>Model spend today (UTC): {}</p>\n",
            parts.join(", ")
        ));
    }
    out.push_str(&format!(
        "<p class=\"muted\">As of {}.{}</p>\n",
        esc(&when(now_ms)),
        if private_hidden {
            " Issues of private repositories are not shown without the status token."
        } else {
            ""
        }
    ));
    if rows.is_empty() {
        out.push_str("<p>No tracked issues.</p>\n</body>\n</html>\n");
        return out;
    }
    out.push_str("<table>\n<thead><tr><th>Issue</th><th>Title</th><th>State</th><th>Why it waits</th><th>Run</th><th>Verdict</th></tr></thead>\n<tbody>\n");
    for r in rows {
        let reference = format!("{}#{}", r.repo, r.number);
        let link = match &r.url {
            Some(url) => format!("<a href=\"{}\">{}</a>", esc(url), esc(&reference)),
            None => esc(&reference),
        };
        let verdict = match (&r.verdict, &r.verdict_reason) {
            (Some(v), Some(why)) => format!(
                "<span class=\"verdict\">{}</span> <span class=\"muted\">{}</span>",
                esc(v),
                esc(why)
            ),
            (Some(v), None) => format!("<span class=\"verdict\">{}</span>", esc(v)),
            _ => String::new(),
        };
        out.push_str(&format!(
            "<tr data-issue=\"{}\" data-state=\"{}\"><td>{link}</td><td class=\"title\">{}</td><td><span class=\"state state-{}\">{}</span></td><td>{}</td><td>{}</td><td>{verdict}</td></tr>\n",
            esc(&reference),
            esc(&r.state),
            esc(&r.title),
            esc(&r.state),
            esc(&r.state.replace('_', " ")),
            why_it_waits(r),
            run_cell(r),
        ));
    }
    out.push_str("</tbody>\n</table>\n</body>\n</html>\n");
    out
}

/// The most of a transcript the run's page shows (the whole is at `/runs/{id}/log`).
const PAGE_TRANSCRIPT_MAX: usize = 1024 * 1024;

/// Output as a page may show it: valid text, escapes and other control characters shown as
/// visible symbols (never acted on), markup escaped.
pub(super) fn shown_output(text: &str) -> String {
    let visible: String = text
        .chars()
        .map(|c| match c {
            '\n' | '\t' => c,
            '\u{1b}' => '␛',
            c if c.is_control() => '\u{FFFD}',
            c => c,
        })
        .collect();
    esc(&visible)
}

/// `GET /runs/{id}`: the run's facts and its transcript (the end of it, when long), in the
/// status page's style, refreshed while the run is live. Every piece of run output and issue
/// text is escaped.
pub fn run_html(
    run: &RunRecord,
    transcript: Option<&crate::store::Transcript>,
    web: Option<&WebLinks>,
    now_ms: i64,
) -> String {
    let row = run_row(run, web, now_ms, None);
    let live = run.state.is_active();
    let mut out = String::from(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
    );
    if live {
        out.push_str("<meta http-equiv=\"refresh\" content=\"5\">\n");
    }
    out.push_str(&format!(
        "<title>director: run {}</title>\n<style>\nbody{{font:15px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1f24;background:#fafbfc}}\nh1{{font-size:1.4rem;margin:0 0 .5rem}}\ndl{{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}}\ndt{{font-weight:600}}\npre{{background:#fff;border:1px solid #d0d7de;padding:.6rem;white-space:pre-wrap;overflow-wrap:anywhere}}\n.muted{{color:#57606a}}\n</style>\n</head>\n<body>\n<h1>Run <code>{}</code></h1>\n<dl>\n",
        esc(&row.id),
        esc(&row.id)
    ));
    let facts = run_facts(run, &row, web);
    for (name, value) in facts {
        out.push_str(&format!("<dt>{name}</dt><dd>{value}</dd>\n"));
    }
    out.push_str("</dl>\n<h2>Transcript</h2>\n");
    out.push_str(&transcript_html(transcript, &row.id, live));
    out.push_str("</body>\n</html>\n");
    out
}

/// The run's facts, as (name, HTML) pairs: its issue, state, branch, pull request, times,
/// outcome, usage, refusals, agent and repository settings.
fn run_facts(run: &RunRecord, row: &RunRow, web: Option<&WebLinks>) -> Vec<(&'static str, String)> {
    let issue = format!("{}#{}", run.repo, run.number);
    let issue = match web {
        Some(w) => format!(
            "<a href=\"{}\">{}</a>",
            esc(&w.issue(&run.repo, run.number)),
            esc(&issue)
        ),
        None => esc(&issue),
    };
    let mut facts: Vec<(&str, String)> = vec![
        ("Issue", issue),
        ("State", esc(&row.state.replace('_', " "))),
        ("Branch", format!("<code>{}</code>", esc(&row.branch))),
    ];
    if let Some(n) = row.pr {
        facts.push((
            "Pull request",
            match &row.pr_url {
                Some(url) => format!("<a href=\"{}\">#{n}</a>", esc(url)),
                None => format!("#{n}"),
            },
        ));
    }
    if let Some(t) = &row.started_at {
        facts.push(("Started", esc(t)));
    }
    if let Some(t) = &row.finished_at {
        facts.push(("Ended", esc(t)));
    }
    if let Some(d) = &row.detail {
        facts.push(("Outcome", esc(d)));
    }
    if let Some(u) = row.usage.as_ref().and_then(Usage::describe) {
        facts.push(("Model usage", esc(&u)));
    }
    if !row.egress_refused.is_empty() {
        let shown: Vec<String> = row
            .egress_refused
            .iter()
            .map(|r| format!("{} ({}x)", r.destination, r.count))
            .collect();
        facts.push(("Refused", esc(&shown.join(", "))));
    }
    if let Some(agent) = &row.agent {
        facts.push(("Agent", esc(&agent.describe())));
    }
    if let Some(settings) = &row.settings {
        facts.push(("Repository settings", esc(&settings.describe())));
    }
    facts
}

/// The transcript's end (at most `PAGE_TRANSCRIPT_MAX` bytes), escaped, with a link to the
/// whole text, or why there is none.
fn transcript_html(transcript: Option<&crate::store::Transcript>, id: &str, live: bool) -> String {
    let mut out = String::new();
    match transcript {
        None => out.push_str(&format!(
            "<p class=\"muted\">{}</p>\n",
            if live {
                "Nothing printed yet."
            } else {
                "No transcript was kept."
            }
        )),
        Some(t) => {
            let text = &t.text;
            let mut start = text.len().saturating_sub(PAGE_TRANSCRIPT_MAX);
            while !text.is_char_boundary(start) {
                start += 1;
            }
            let hidden = t.dropped_bytes + start as u64;
            if hidden > 0 {
                out.push_str(&format!(
                    "<p class=\"muted\">The first {hidden} bytes are not shown{}; the end is. <a href=\"{}/log\">The transcript as text</a>.</p>\n",
                    if t.dropped_bytes > 0 {
                        format!(" ({} were dropped at runner.transcript_max_mb)", t.dropped_bytes)
                    } else {
                        String::new()
                    },
                    esc(id)
                ));
            } else {
                out.push_str(&format!(
                    "<p class=\"muted\"><a href=\"{}/log\">The transcript as text</a>.</p>\n",
                    esc(id)
                ));
            }
            out.push_str(&format!("<pre>{}</pre>\n", shown_output(&text[start..])));
        }
    }
    out
}
