//! The outcomes of a window ([`crate::domain::outcomes`]) for people: the page
//! `/status/outcomes` (charts drawn here as inline SVG, each with its table beneath; no
//! script, readable narrow and dark), and `director report`'s table and CSV.

use std::fmt::Write as _;

use crate::domain::outcomes::{Day, Figures, Outcomes, RUN_OUTCOMES, Spread};
use crate::domain::units::duration;

/// Dollars to the cent, or to the hundredth of a cent below a dollar.
fn dollars(usd: f64) -> String {
    crate::domain::units::dollars(usd, 2)
        .chars()
        .take(if usd < 1.0 { 7 } else { usize::MAX })
        .collect()
}

use super::html::esc;

/// The windows the page offers, in days.
pub const WINDOWS: [u32; 3] = [7, 30, 90];

/// What a figure over no pull request says instead: which of them there is none of yet.
const NONE_OPENED: &str = "none opened yet";
const NONE_MERGED: &str = "none merged yet";
/// A duration that cannot be told (its moments were not kept, or could not be).
const NOT_KNOWN: &str = "not known";

fn or_words<T>(v: Option<T>, words: &str, show: impl Fn(T) -> String) -> String {
    v.map_or_else(|| words.to_owned(), show)
}

fn percent(r: f64) -> String {
    format!("{:.0}%", r * 100.0)
}

/// Merged over ended. Pull requests opened of which none ended yet: none of them merged,
/// so 0%, not a figure over nothing.
fn merge_rate(f: &Figures) -> String {
    match f.merge_rate {
        Some(r) => percent(r),
        None if f.prs_opened > 0 => percent(0.0),
        None => NONE_OPENED.to_owned(),
    }
}

/// A figure per merged pull request: none merged, none to divide by.
fn per_merged(v: Option<f64>, show: impl Fn(f64) -> String) -> String {
    or_words(v, NONE_MERGED, show)
}

fn secs(s: f64) -> String {
    duration(s.max(0.0) as i64)
}

/// A spread of durations, or why there is none: nothing of `count` yet, or moments not kept.
fn spread(v: Option<Spread>, count: u64, none_yet: &str) -> String {
    let words = if count == 0 { none_yet } else { NOT_KNOWN };
    or_words(v, words, |s| format!("{} / {}", secs(s.p50), secs(s.p90)))
}

/// The rows of a figures table: (label, value), in the order every view shows them.
pub fn rows(f: &Figures) -> Vec<(&'static str, String)> {
    vec![
        ("issues picked up", f.picked_up.to_string()),
        ("GO", f.go.to_string()),
        ("NO-GO", f.no_go.to_string()),
        ("WRONG-REPO", f.wrong_repo.to_string()),
        ("NEEDS-INFO", f.needs_info.to_string()),
        ("runs started", f.runs_started.to_string()),
        ("runs failed", f.runs_failed.to_string()),
        ("runs timed out", f.runs_timed_out.to_string()),
        ("runs over budget", f.runs_over_budget.to_string()),
        ("runs cancelled", f.runs_cancelled.to_string()),
        ("pull requests opened", f.prs_opened.to_string()),
        ("merged", f.merged.to_string()),
        ("closed unmerged", f.closed_unmerged.to_string()),
        ("reverted", f.reverted.to_string()),
        ("merge rate", merge_rate(f)),
        ("cost", dollars(f.cost_usd)),
        (
            "cost per merged pull request",
            per_merged(f.cost_per_merged_usd, dollars),
        ),
        (
            "label to pull request (median / 90th)",
            spread(f.label_to_pr, f.prs_opened, NONE_OPENED),
        ),
        (
            "pull request to merge (median / 90th)",
            spread(f.pr_to_merge, f.merged, NONE_MERGED),
        ),
        (
            "follow-ups per merged pull request",
            per_merged(f.followups_per_merged, |x| format!("{x:.1}")),
        ),
        (
            "opened with the director's checks passing",
            or_words(f.opened_green_rate, "none opened with checks yet", |r| {
                format!(
                    "{} of {} ({})",
                    f.prs_opened_green,
                    f.prs_checked,
                    percent(r)
                )
            }),
        ),
        (
            "follow-ups answering the director's checks",
            f.check_followups.to_string(),
        ),
    ]
}

/// `director report --format table`.
pub fn table(o: &Outcomes) -> String {
    let mut groups: Vec<(String, &Figures)> = vec![("all".to_owned(), &o.total)];
    groups.extend(o.repos.iter().map(|(k, f)| (k.clone(), f)));
    groups.extend(o.agents.iter().map(|(k, f)| (format!("agent {k}"), f)));
    // Beside maintainers' only where agents filed work (`[filers]`).
    if o.requesters.contains_key("agent-filed") {
        groups.extend(
            o.requesters
                .iter()
                .map(|(k, f)| (format!("asked by {k}"), f)),
        );
    }
    let labels = rows(&o.total);
    let width = labels.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let mut out = format!("Outcomes of the last {} days\n", o.days);
    for (name, f) in groups {
        let _ = writeln!(out, "\n{name}");
        for (label, value) in rows(f) {
            let _ = writeln!(out, "  {label:<width$}  {value}");
        }
    }
    if !o.models.is_empty() {
        let _ = writeln!(out, "\nby model");
        for (model, m) in &o.models {
            let _ = writeln!(
                out,
                "  {model:<width$}  {} call(s), {}",
                m.calls,
                dollars(m.cost_usd)
            );
        }
    }
    if o.absurd > 0 {
        let _ = writeln!(
            out,
            "\n{} row(s) with an impossible duration or cost were left out",
            o.absurd
        );
    }
    out
}

/// `director report --format csv`: one line per group, the figures as numbers (empty where
/// over nothing).
pub fn csv(o: &Outcomes) -> String {
    let mut out = String::from(
        "group,name,picked_up,go,no_go,wrong_repo,needs_info,runs_started,runs_failed,runs_timed_out,runs_over_budget,runs_cancelled,prs_opened,merged,closed_unmerged,reverted,merge_rate,cost_usd,cost_per_merged_usd,label_to_pr_p50_secs,label_to_pr_p90_secs,pr_to_merge_p50_secs,pr_to_merge_p90_secs,followups_per_merged\n",
    );
    let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    let mut line = |group: &str, name: &str, f: &Figures| {
        let field = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_owned()
            }
        };
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            group,
            field(name),
            f.picked_up,
            f.go,
            f.no_go,
            f.wrong_repo,
            f.needs_info,
            f.runs_started,
            f.runs_failed,
            f.runs_timed_out,
            f.runs_over_budget,
            f.runs_cancelled,
            f.prs_opened,
            f.merged,
            f.closed_unmerged,
            f.reverted,
            opt(f.merge_rate),
            f.cost_usd,
            opt(f.cost_per_merged_usd),
            opt(f.label_to_pr.map(|s| s.p50)),
            opt(f.label_to_pr.map(|s| s.p90)),
            opt(f.pr_to_merge.map(|s| s.p50)),
            opt(f.pr_to_merge.map(|s| s.p90)),
            opt(f.followups_per_merged),
        );
    };
    line("all", "", &o.total);
    for (name, f) in &o.repos {
        line("repo", name, f);
    }
    for (name, f) in &o.agents {
        line("agent", name, f);
    }
    if o.requesters.contains_key("agent-filed") {
        for (name, f) in &o.requesters {
            line("requester", name, f);
        }
    }
    out
}

const STYLE: &str = concat!(
    ":root{color-scheme:light dark;--fg:#1b1f24;--bg:#fafbfc;--card:#fff;--line:#d0d7de;--muted:#57606a}\n",
    "@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--bg:#0d1117;--card:#161b22;--line:#30363d;--muted:#8b949e}}\n",
    "body{font:15px/1.4 system-ui,sans-serif;margin:1.5rem;color:var(--fg);background:var(--bg)}\n",
    "h1{font-size:1.4rem;margin:0 0 .5rem}h2{font-size:1.1rem;margin:1.5rem 0 .5rem}\n",
    "nav a{margin-right:.8rem}a{color:#0969da}@media (prefers-color-scheme:dark){a{color:#4493f8}}\n",
    ".scroll{overflow-x:auto}table{border-collapse:collapse;background:var(--card);min-width:18rem}\n",
    "th,td{border-bottom:1px solid var(--line);padding:.35rem .6rem;text-align:left}\n",
    "td.n{text-align:right;font-variant-numeric:tabular-nums}th{font-weight:600}\n",
    "figure{margin:1rem 0;max-width:60rem}figcaption{font-weight:600;margin-bottom:.3rem}\n",
    "svg{width:100%;height:auto;background:var(--card);border:1px solid var(--line)}\n",
    "svg text{fill:var(--fg);font-size:11px}svg .axis{stroke:var(--muted);stroke-width:1}\n",
    ".o-succeeded{fill:#2da44e;background:#2da44e}.o-failed{fill:#cf222e;background:#cf222e}\n",
    ".o-timed_out{fill:#bf8700;background:#bf8700}.o-over_budget{fill:#8250df;background:#8250df}\n",
    ".o-cancelled{fill:#6e7781;background:#6e7781}.o-other{fill:#afb8c1;background:#afb8c1}\n",
    ".merges{stroke:#0969da;stroke-width:2;fill:none}.headline{font-size:1.05rem}\n",
    ".merge{fill:#0969da}.cost{fill:#1f6feb}.legend span{margin-right:.8rem}\n",
    ".legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.25rem;vertical-align:-1px}\n",
    ".muted{color:var(--muted)}.empty{padding:1rem;background:var(--card);border:1px solid var(--line)}\n",
);

const W: f64 = 720.0;
const H: f64 = 200.0;
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 24.0;
const TOP: f64 = 12.0;

/// The frame of a chart: its axes, the largest value (`max_label`) on the left and three
/// dates beneath.
fn frame(title_id: &str, title: &str, days: &[Day], max_label: &str) -> String {
    let mut s = format!(
        "<svg viewBox=\"0 0 {W} {H}\" role=\"img\" aria-labelledby=\"{title_id}\"><title id=\"{title_id}\">{}</title>\n",
        esc(title)
    );
    let base = H - BOTTOM;
    let _ = write!(
        s,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{base}\"/><line class=\"axis\" x1=\"{LEFT}\" y1=\"{base}\" x2=\"{W}\" y2=\"{base}\"/>\n\
         <text class=\"y-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><text x=\"{}\" y=\"{base}\" text-anchor=\"end\">0</text>\n",
        LEFT - 4.0,
        TOP + 8.0,
        esc(max_label),
        LEFT - 4.0
    );
    let n = days.len().max(1);
    for (i, anchor) in [(0, "start"), (n / 2, "middle"), (n - 1, "end")] {
        if let Some(d) = days.get(i) {
            let _ = writeln!(
                s,
                "<text class=\"x-label\" x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\">{}</text>",
                x_of(i, n) + slot(n) / 2.0,
                H - 6.0,
                esc(&d.date)
            );
        }
    }
    s
}

fn trim(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn slot(n: usize) -> f64 {
    (W - LEFT) / n as f64
}

fn x_of(i: usize, n: usize) -> f64 {
    LEFT + slot(n) * i as f64
}

fn y_of(v: f64, max: f64) -> f64 {
    let base = H - BOTTOM;
    if max <= 0.0 {
        return base;
    }
    base - (v / max) * (base - TOP)
}

/// Runs per day stacked by outcome, merges as a line.
fn runs_chart(days: &[Day]) -> String {
    let n = days.len();
    let max = days
        .iter()
        .map(|d| (d.runs.values().sum::<u64>()).max(d.merged))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut s = frame(
        "runs-title",
        "Runs per day by outcome, and merges",
        days,
        &trim(max),
    );
    let w = (slot(n) * 0.7).max(1.0);
    for (i, d) in days.iter().enumerate() {
        let mut at = 0.0;
        for outcome in RUN_OUTCOMES {
            let v = d.runs.get(outcome).copied().unwrap_or(0) as f64;
            if v == 0.0 {
                continue;
            }
            let (y1, y0) = (y_of(at + v, max), y_of(at, max));
            let _ = writeln!(
                s,
                "<rect class=\"o-{outcome}\" x=\"{:.1}\" y=\"{y1:.1}\" width=\"{w:.1}\" height=\"{:.1}\"><title>{} {}: {}</title></rect>",
                x_of(i, n) + slot(n) * 0.15,
                y0 - y1,
                esc(&d.date),
                outcome.replace('_', " "),
                v
            );
            at += v;
        }
    }
    let points: Vec<String> = days
        .iter()
        .enumerate()
        .map(|(i, d)| {
            format!(
                "{:.1},{:.1}",
                x_of(i, n) + slot(n) / 2.0,
                y_of(d.merged as f64, max)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "<polyline class=\"merges\" points=\"{}\"/>",
        points.join(" ")
    );
    s.push_str("</svg>\n");
    s
}

fn cost_chart(days: &[Day]) -> String {
    let n = days.len();
    let max = days.iter().map(|d| d.cost_usd).fold(0.0, f64::max);
    let mut s = frame(
        "cost-title",
        "Model cost per day, in dollars",
        days,
        &dollars(max),
    );
    let w = (slot(n) * 0.7).max(1.0);
    for (i, d) in days.iter().enumerate().filter(|(_, d)| d.cost_usd > 0.0) {
        let y = y_of(d.cost_usd, max);
        let _ = writeln!(
            s,
            "<rect class=\"cost\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\"><title>{}: {}</title></rect>",
            x_of(i, n) + slot(n) * 0.15,
            H - BOTTOM - y,
            esc(&d.date),
            dollars(d.cost_usd)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn merge_time_chart(days: &[Day]) -> String {
    let n = days.len();
    let hours = |secs: f64| secs / 3600.0;
    let max = days
        .iter()
        .filter_map(|d| d.time_to_merge.map(|t| hours(t.p90)))
        .fold(0.0, f64::max)
        .max(1.0)
        .ceil();
    let mut s = frame(
        "merge-title",
        "Time from pull request to merge, in hours: each day's median, and a line up to its 90th percentile",
        days,
        &format!("{} h", trim(max)),
    );
    for (i, d) in days.iter().enumerate() {
        let Some(t) = d.time_to_merge else { continue };
        let x = x_of(i, n) + slot(n) / 2.0;
        let _ = writeln!(
            s,
            "<line class=\"merges\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/><circle class=\"merge\" cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3.5\"><title>{}: median {:.1} h, 90th {:.1} h, {} merged</title></circle>",
            y_of(hours(t.p50), max),
            y_of(hours(t.p90), max),
            y_of(hours(t.p50), max),
            esc(&d.date),
            hours(t.p50),
            hours(t.p90),
            t.count
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The days that had anything, as a table (those who read rather than look).
fn days_table(days: &[Day]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table class=\"days\"><thead><tr><th>Day</th>");
    for o in RUN_OUTCOMES {
        let _ = write!(s, "<th>{}</th>", o.replace('_', " "));
    }
    s.push_str(
        "<th>merged</th><th>cost</th><th>hours to merge (median / 90th)</th></tr></thead><tbody>\n",
    );
    let busy: Vec<&Day> = days
        .iter()
        .filter(|d| !d.runs.is_empty() || d.merged > 0 || d.cost_usd > 0.0)
        .collect();
    if busy.is_empty() {
        s.push_str("<tr><td colspan=\"10\">no runs</td></tr>\n");
    }
    for d in busy {
        let _ = write!(s, "<tr><td>{}</td>", esc(&d.date));
        for o in RUN_OUTCOMES {
            let _ = write!(
                s,
                "<td class=\"n\">{}</td>",
                d.runs.get(o).copied().unwrap_or(0)
            );
        }
        let hours = d.time_to_merge.map_or_else(String::new, |t| {
            format!("{:.1} / {:.1}", t.p50 / 3600.0, t.p90 / 3600.0)
        });
        let _ = writeln!(
            s,
            "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{hours}</td></tr>",
            d.merged,
            dollars(d.cost_usd),
        );
    }
    s.push_str("</tbody></table></div>\n");
    s
}

fn figures_table(groups: &[(String, &Figures)]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table class=\"figures\"><thead><tr><th></th>");
    for (name, _) in groups {
        let _ = write!(s, "<th>{}</th>", esc(name));
    }
    s.push_str("</tr></thead><tbody>\n");
    let labels = rows(&Figures::default());
    for (i, (label, _)) in labels.iter().enumerate() {
        let _ = write!(s, "<tr><th>{label}</th>");
        for (_, f) in groups {
            let value = rows(f).swap_remove(i).1;
            let _ = write!(s, "<td class=\"n\">{}</td>", esc(&value));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
    s
}

/// `count` and its noun, singular or plural.
fn counted(count: u64, one: &str, many: &str) -> String {
    format!("<b>{count}</b> {}", if count == 1 { one } else { many })
}

/// The page's first sentence: nothing at all (the whole page then), nothing opened yet,
/// opened but none merged yet ("merge rate 0%, none merged yet"), or the usual merges.
pub fn headline(o: &Outcomes) -> String {
    let t = &o.total;
    if t.picked_up == 0 && t.runs_started == 0 && t.prs_opened == 0 && t.merged == 0 {
        return format!(
            "<p class=\"empty\">No runs in the last {} days: nothing was picked up, run or merged.</p>\n",
            o.days
        );
    }
    let spent = format!("<b>{}</b> spent", dollars(t.cost_usd));
    if t.prs_opened == 0 && t.merged == 0 && t.closed_unmerged == 0 {
        return format!(
            "<p class=\"headline\">No pull request opened yet: {} picked up, {} started, {spent}.</p>\n",
            counted(t.picked_up, "issue", "issues"),
            counted(t.runs_started, "run", "runs"),
        );
    }
    let per = match t.cost_per_merged_usd {
        Some(c) => format!("<b>{}</b> per merged pull request", dollars(c)),
        None => NONE_MERGED.to_owned(),
    };
    format!(
        "<p class=\"headline\"><b>{}</b> merged of {} opened, merge rate <b>{}</b>, {per}, {spent}.</p>\n",
        t.merged,
        counted(t.prs_opened, "pull request", "pull requests"),
        merge_rate(t),
    )
}

/// The page. `watched` says whether a repository is still in the configuration (one
/// removed keeps its history, marked so); `hidden`: private repositories were left out.
pub fn page(o: &Outcomes, watched: &dyn Fn(&str) -> bool, hidden: bool) -> String {
    let mut s = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>director: outcomes, {} days</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <h1>What the agents delivered</h1>\n<nav><a href=\"/status\">status</a>",
        o.days
    );
    for d in WINDOWS {
        if d == o.days {
            let _ = write!(s, "<b>{d} days</b> ");
        } else {
            let _ = write!(s, "<a href=\"/status/outcomes?days={d}\">{d} days</a>");
        }
    }
    s.push_str("</nav>\n");
    if hidden {
        s.push_str("<p class=\"muted\">Private repositories are not counted without the status token.</p>\n");
    }
    let headline = headline(o);
    s.push_str(&headline);
    if headline.starts_with("<p class=\"empty\">") {
        s.push_str("</body>\n</html>\n");
        return s;
    }
    s.push_str("<h2>Day by day</h2>\n<figure><figcaption>Runs and merges per day</figcaption>\n<p class=\"legend\">");
    for o in RUN_OUTCOMES {
        let _ = write!(
            s,
            "<span><i class=\"o-{o}\"></i>{}</span>",
            o.replace('_', " ")
        );
    }
    s.push_str("<span>line: merges</span></p>\n");
    s.push_str(&runs_chart(&o.daily));
    s.push_str("</figure>\n<figure><figcaption>Cost per day</figcaption>\n");
    s.push_str(&cost_chart(&o.daily));
    s.push_str("</figure>\n<figure><figcaption>Time to merge</figcaption>\n");
    s.push_str(&merge_time_chart(&o.daily));
    s.push_str("</figure>\n");
    s.push_str(&days_table(&o.daily));
    let mut groups: Vec<(String, &Figures)> = vec![("all".to_owned(), &o.total)];
    for (repo, f) in &o.repos {
        let name = if watched(repo) {
            repo.clone()
        } else {
            format!("{repo} (no longer watched)")
        };
        groups.push((name, f));
    }
    s.push_str("<h2>In figures</h2>\n");
    s.push_str(&figures_table(&groups));
    if !o.agents.is_empty() {
        let agents: Vec<(String, &Figures)> =
            o.agents.iter().map(|(k, f)| (k.clone(), f)).collect();
        s.push_str("<h2>By agent</h2>\n");
        s.push_str(&figures_table(&agents));
    }
    if o.requesters.contains_key("agent-filed") {
        let asked: Vec<(String, &Figures)> =
            o.requesters.iter().map(|(k, f)| (k.clone(), f)).collect();
        s.push_str("<h2>Agent-filed work beside maintainers'</h2>\n");
        s.push_str(&figures_table(&asked));
    }
    if !o.models.is_empty() {
        s.push_str("<h2>By model</h2>\n<div class=\"scroll\"><table class=\"models\"><thead><tr><th>model</th><th>calls</th><th>cost</th></tr></thead><tbody>\n");
        for (model, m) in &o.models {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(model),
                m.calls,
                dollars(m.cost_usd)
            );
        }
        s.push_str("</tbody></table></div>\n");
    }
    if o.absurd > 0 {
        let _ = writeln!(
            s,
            "<p class=\"muted\">{} row(s) with an impossible duration or cost were left out.</p>",
            o.absurd
        );
    }
    s.push_str("</body>\n</html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outcomes::{Facts, PickedUp, PrFacts, RunGroup, SpendDay, compute};
    use crate::domain::{Judgement, PullState, RunState};

    const NOW: i64 = 1_796_000_000_000;
    const H: i64 = 3_600_000;

    fn repo() -> crate::domain::RepoName {
        "acme/widgets".parse().expect("a name")
    }

    fn pull(state: PullState, ended: Option<i64>, cost: f64) -> PrFacts {
        PrFacts {
            repo: repo(),
            picked_at_ms: Some(NOW - 30 * H),
            state,
            opened_at_ms: Some(NOW - 28 * H),
            ended_at_ms: ended,
            reverted: false,
            followups: 0,
            ci_followups: 0,
            opened_green: None,
            check_followups: 0,
            cost_usd: cost,
            agent: Some("claude-code".into()),
            filed: false,
        }
    }

    /// What the store gives after one issue was picked up and run, and its pull request
    /// opened: the first look at a new installation (the demo's).
    fn first() -> Facts {
        Facts {
            picked_up: vec![PickedUp {
                repo: repo(),
                verdict: Some(Judgement::Go),
                count: 1,
                filed: false,
            }],
            prs: vec![pull(PullState::Open, None, 0.40)],
            runs: vec![RunGroup {
                repo: repo(),
                agent: "claude-code".into(),
                state: RunState::Succeeded,
                day: crate::domain::outcomes::epoch_day(NOW - 29 * H),
                count: 1,
            }],
            spend: vec![SpendDay {
                repo: repo(),
                day: crate::domain::outcomes::epoch_day(NOW - 29 * H),
                cost_usd: 0.40,
                absurd_costs: 0,
            }],
            ..Facts::default()
        }
    }

    /// Several merged, one closed, one still open.
    fn usual() -> Facts {
        let mut facts = first();
        facts.picked_up[0].count = 4;
        facts.runs[0].count = 5;
        facts.spend[0].cost_usd = 4.35;
        facts.prs.extend([
            pull(PullState::Merged, Some(NOW - 20 * H), 2.00),
            pull(PullState::Merged, Some(NOW - 10 * H), 1.20),
            pull(PullState::Closed, Some(NOW - 5 * H), 0.70),
        ]);
        facts
    }

    #[test]
    fn the_headline_says_what_happened_from_the_empty_window_to_the_usual_one() {
        let empty = compute(&Facts::default(), 7, NOW);
        insta::assert_snapshot!("headline_empty", headline(&empty));
        let said = headline(&compute(&first(), 7, NOW));
        assert!(
            said.contains("merge rate <b>0%</b>, none merged yet") && !said.contains("no runs"),
            "{said}"
        );
        insta::assert_snapshot!("headline_first", said);
        insta::assert_snapshot!("headline_usual", headline(&compute(&usual(), 7, NOW)));
        // Picked up and run, nothing opened: no rate to speak of.
        let mut none = first();
        none.prs.clear();
        insta::assert_snapshot!("headline_nothing_opened", headline(&compute(&none, 7, NOW)));
    }

    #[test]
    fn the_reports_table_says_none_merged_yet_where_nothing_was_merged() {
        let first = super::table(&compute(&first(), 7, NOW));
        assert!(!first.contains("no runs"), "{first}");
        insta::assert_snapshot!("report_first", first);
        let usual = super::table(&compute(&usual(), 7, NOW));
        assert!(
            usual
                .lines()
                .any(|l| l.trim_start().starts_with("merge rate ") && l.ends_with(" 67%")),
            "{usual}"
        );
    }
}
