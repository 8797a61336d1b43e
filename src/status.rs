//! What the director is doing, for people and tools: `director status` (a table or JSON), and
//! the status page (`GET /status`, HTML; `GET /status.json`, the same JSON). One set of rows
//! serves all three.

use crate::settings::WebLinks;
use std::collections::HashMap;

use serde::Serialize;

use crate::domain::run::Usage;
use crate::domain::{IssueRef, Lifecycle, RepoName, RunRecord, priority_rank};
use crate::store::{ActionRow, IssueRecord};

mod html;
pub mod outcomes;
pub use html::{html, html_with_spend, run_html};

/// One tracked issue.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub repo: String,
    pub number: u64,
    /// The issue on the forge, when the forge's address is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The lifecycle state.
    pub state: String,
    pub title: String,
    /// The issue's own state on the forge: open or closed.
    pub issue_state: String,
    pub labels: Vec<String>,
    pub trigger_present: bool,
    pub trigger_actor: Option<String>,
    pub trigger_trusted: Option<bool>,
    /// For queued issues: 1 runs next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    pub last_change: String,
    /// Why the issue waits, when it waits on something other than its turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The last pre-flight verdict (`GO`, `NO-GO`, `WRONG-REPO`, `ERROR`) and its reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict_reason: Option<String>,
    /// While the issue needs information: the pre-flight's questions still open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_questions: Option<usize>,
    /// The forecast the GO comment showed (the run's actual cost and time are in `run`:
    /// `usage.cost_usd`, `age_secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast: Option<crate::domain::forecast::Forecast>,
    /// The pull request the issue's run opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pr: Option<PrRow>,
    /// The newest run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRow>,
    /// Actions of the issue that failed (being retried, or given up).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<Failing>,
    /// Agent-filed: the filer (`[filers]`) and the account that filed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filer: Option<crate::domain::filer::Filed>,
    /// Hosts writers approved in the thread for this issue's runs (`/director allow`).
    pub egress_allowed: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PrRow {
    pub number: u64,
    /// `open`, `merged` or `closed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Follow-up runs since it opened (or since the last `/director retry` on it).
    pub followups: u32,
    /// Follow-up runs answering its failing checks.
    pub ci_followups: u32,
    /// Its head's checks: `pending`, `held` (the forge holds its workflows for a
    /// maintainer's approval), `passing`, `failing`, `warning`, `none` (none reported), or
    /// absent (not read yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<String>,
    /// The failing checks' contexts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing_checks: Vec<String>,
    /// Writers whose approval of its head counts (as the merge lane last saw).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<String>,
    /// The merge lane, when it is on for the repository.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeRow>,
}

/// Where an open pull request stands in the merge lane.
#[derive(Clone, Debug, Serialize)]
pub struct MergeRow {
    /// In the lane's queue: an attempt is under way, or it waits for what the lane asks.
    pub queued: bool,
    /// Why it is not merged yet.
    pub waiting: String,
}

/// How queued issues are ordered and paced (`labels.priority`,
/// `runner.max_open_prs_per_repo`).
#[derive(Clone, Debug)]
pub struct Queueing {
    pub priority: Vec<String>,
    pub max_open_prs_per_repo: usize,
    pub budget: crate::settings::BudgetSettings,
    /// Dollars of model calls each repository spent today, and all of them together
    /// (filled by [`collect`] when a budget is set).
    pub spent: HashMap<String, f64>,
    pub spent_today: f64,
    /// `[merge]`: which pull requests are in the merge lane.
    pub merge: crate::settings::MergeSettings,
    /// What each filer was told of today (its limit reached, its budget spent), by filer
    /// (filled by [`collect`]): said once, not on every issue.
    pub filers_told: Vec<(String, String)>,
    /// The sandbox runtime runs get, shown with each run.
    pub runtime: Option<String>,
}

impl Queueing {
    pub fn from_settings(settings: &crate::settings::Settings) -> Self {
        Self {
            priority: settings.labels.priority.clone(),
            max_open_prs_per_repo: settings.runner.max_open_prs_per_repo.max(1),
            budget: settings.budget.clone(),
            spent: HashMap::new(),
            spent_today: 0.0,
            merge: settings.merge.clone(),
            filers_told: Vec::new(),
            runtime: settings.sandbox_runtime(),
        }
    }
}

impl Default for Queueing {
    fn default() -> Self {
        Self {
            priority: Vec::new(),
            max_open_prs_per_repo: usize::MAX,
            budget: crate::settings::BudgetSettings::default(),
            spent: HashMap::new(),
            spent_today: 0.0,
            merge: crate::settings::MergeSettings::default(),
            filers_told: Vec::new(),
            runtime: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    pub id: String,
    pub state: String,
    pub branch: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Seconds from start to the end, or to now while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pr: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pr_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The pull request a follow-up run answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub followup_of: Option<u64>,
    /// The model usage the run reported in its result file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What the egress proxy refused the run, once it ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_refused: Vec<Refusal>,
    /// What its repository's `.director.toml` gave it, when repositories may set anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<SettingsRow>,
    /// The agent of `[agents]` it was given, and why; absent: `runner.image`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::domain::AgentChoice>,
    /// The sandbox runtime runs get (`runner.oci_runtime`, `runner.runtime_class_name`);
    /// absent: the engine's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The run it continues after a budget stop, and its own budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continued: Option<crate::domain::thread::Continuation>,
    /// Its setup phase (`[setup]`): cold or warm, the snapshot key, the time and exit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup: Option<crate::domain::setup::SetupOutcome>,
}

/// The repository settings a run got, and the file version they came from.
#[derive(Clone, Debug, Serialize)]
pub struct SettingsRow {
    /// The default branch's head the file was read at.
    pub commit: String,
    /// Whether the repository had the file there (else: the operator's settings).
    pub file: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_allow: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_template: Option<String>,
    /// Whether the task file carried the repository's instructions.
    pub instructions: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capped: Vec<String>,
}

impl SettingsRow {
    fn of(s: &crate::domain::RunSettings) -> Self {
        Self {
            commit: s.commit.clone(),
            file: s.file,
            image: s.image.clone(),
            egress_allow: s.egress_allow.clone(),
            timeout_secs: s.timeout_secs,
            run_usd: s.run_usd,
            branch_template: s.branch_template.clone(),
            instructions: s.instructions.is_some(),
            capped: s.capped.clone(),
        }
    }

    /// `.director.toml at 0a1b2c3d4e5f: image x`, or `no .director.toml at …`.
    fn describe(&self) -> String {
        // The forge's word: cut by characters, whatever it holds.
        let short: String = self.commit.chars().take(12).collect();
        if !self.file {
            return format!("no {} at {short}", crate::settings::repo::FILE);
        }
        let mut parts = Vec::new();
        if let Some(i) = &self.image {
            parts.push(format!("image {i}"));
        }
        if !self.egress_allow.is_empty() {
            parts.push(format!("egress {}", self.egress_allow.join(" ")));
        }
        if let Some(t) = self.timeout_secs {
            parts.push(format!("timeout {t}s"));
        }
        if let Some(u) = self.run_usd {
            parts.push(format!("budget ${u}"));
        }
        if self.instructions {
            parts.push("instructions".to_owned());
        }
        let set = if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        };
        format!("{} at {short}{set}", crate::settings::repo::FILE)
    }
}

/// A destination the egress proxy refused a run, and how many times.
#[derive(Clone, Debug, Serialize)]
pub struct Refusal {
    pub destination: String,
    pub count: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Failing {
    pub action: String,
    pub attempts: u32,
    /// `due` (retried at `retry_at`) or `failed` (given up).
    pub state: String,
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
}

impl Failing {
    /// `judge_trigger failing after 2 attempt(s)`.
    fn summary(&self) -> String {
        let how = if self.state == "failed" {
            "gave up"
        } else {
            "failing"
        };
        format!("{} {how} after {} attempt(s)", self.action, self.attempts)
    }
}

fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Why a waiting issue waits: a give-up, a pre-flight retry, a cap or a spent budget.
fn waiting(r: &IssueRecord) -> Option<String> {
    if let Some(b) = &r.blocked {
        return Some(b.clone());
    }
    if r.lifecycle == Lifecycle::AwaitingApproval {
        let why = r
            .preflight
            .awaiting
            .as_ref()
            .map_or("preflight.approval", |a| a.why.as_str());
        return Some(format!(
            "waits for a writer's `/director go` approving the GO comment's plan and text: {why}"
        ));
    }
    if r.lifecycle == Lifecycle::NeedsInfo {
        return Some(format!(
            "{} question(s) of the pre-flight open in the thread; a writer's answer reads it again",
            r.preflight.questions.len()
        ));
    }
    match (r.lifecycle, r.preflight.not_before_ms) {
        (Lifecycle::Pending, Some(at)) => Some(match &r.preflight.last_error {
            Some(e) => format!(
                "pre-flight retry {} at {}: {e}",
                r.preflight.attempts + 1,
                when(at)
            ),
            None => match &r.preflight.waits_for {
                Some(what) => format!("pre-flight waits until {}: {what}", when(at)),
                None => format!("pre-flight deferred by an hourly cap until {}", when(at)),
            },
        }),
        _ => None,
    }
}

fn run_row(run: &RunRecord, web: Option<&WebLinks>, now_ms: i64, runtime: Option<&str>) -> RunRow {
    let age_secs = run
        .started_at_ms
        .map(|s| (run.finished_at_ms.unwrap_or(now_ms) - s).max(0) / 1000);
    RunRow {
        id: run.id.to_string(),
        state: run.state.as_str().to_owned(),
        branch: run.branch.clone(),
        started_at: run.started_at_ms.map(when),
        finished_at: run.finished_at_ms.map(when),
        age_secs,
        pr: run.pr_number.or(run.followup.as_ref().map(|f| f.pr)),
        pr_url: match (web, run.pr_number.or(run.followup.as_ref().map(|f| f.pr))) {
            (Some(web), Some(n)) => Some(web.pull(&run.repo, n)),
            _ => None,
        },
        detail: run.detail.clone(),
        followup_of: run.followup.as_ref().map(|f| f.pr),
        usage: run.result.as_ref().and_then(|r| r.usage.clone()),
        egress_refused: run
            .egress_refused
            .iter()
            .map(|(destination, count)| Refusal {
                destination: destination.clone(),
                count: *count,
            })
            .collect(),
        settings: run.settings.as_ref().map(SettingsRow::of),
        agent: run.agent.clone(),
        runtime: runtime.map(str::to_owned),
        continued: run.continued.clone(),
        setup: run.setup.clone(),
    }
}

/// The rows for the tracked issues: those the director has seen carry the trigger (others
/// are recorded but not shown). `troubled` are the actions that failed, `runs` the newest
/// run of each issue, `web` the forge's address (for links).
pub fn rows(
    issues: &[IssueRecord],
    troubled: &[ActionRow],
    runs: &[RunRecord],
    web: Option<&WebLinks>,
    queueing: &Queueing,
    now_ms: i64,
) -> Vec<Row> {
    let mut failing: HashMap<&IssueRef, Vec<Failing>> = HashMap::new();
    for a in troubled {
        failing.entry(&a.issue).or_default().push(Failing {
            action: a.kind.clone(),
            attempts: a.attempts,
            state: a.state.clone(),
            error: a.last_error.clone(),
            retry_at: (a.state == "due").then(|| when(a.not_before_ms)),
        });
    }
    let runs: HashMap<(String, u64), &RunRecord> = runs
        .iter()
        .map(|r| ((r.repo.to_string(), r.number), r))
        .collect();
    let positions = queue_positions(issues, queueing);
    let mut open_prs: HashMap<&RepoName, usize> = HashMap::new();
    for r in issues {
        if r.pr
            .as_ref()
            .is_some_and(crate::domain::PullRecord::is_open)
        {
            *open_prs.entry(&r.repo).or_default() += 1;
        }
    }
    issues
        .iter()
        .filter(|r| {
            r.trigger_present || r.trigger_actor.is_some() || r.lifecycle != Lifecycle::Untracked
        })
        .map(|r| {
            let key = (r.repo.to_string(), r.number);
            Row {
                url: web.map(|w| w.issue(&r.repo, r.number)),
                repo: key.0.clone(),
                number: r.number,
                state: r.lifecycle.as_str().to_owned(),
                title: r.title.clone(),
                issue_state: r.state.clone(),
                labels: r.labels.clone(),
                trigger_present: r.trigger_present,
                trigger_actor: r.trigger_actor.clone(),
                trigger_trusted: r.trigger_trusted,
                queue_position: positions.get(&key).copied(),
                last_change: when(r.last_change_ms),
                waiting: waiting(r)
                    .or_else(|| budget_spent(r, queueing))
                    .or_else(|| filer_spent(r, queueing))
                    .or_else(|| {
                        let open = open_prs.get(&r.repo).copied().unwrap_or(0);
                        paced(r, open, queueing)
                    }),
                verdict: r.preflight.verdict.map(|v| v.as_str().to_owned()),
                verdict_reason: r.preflight.reason.clone(),
                open_questions: (r.lifecycle == Lifecycle::NeedsInfo)
                    .then_some(r.preflight.questions.len()),
                forecast: r.preflight.forecast.clone(),
                pr: r
                    .pr
                    .as_ref()
                    .map(|p| pr_row(p, &r.repo, web, &queueing.merge)),
                run: runs
                    .get(&key)
                    .map(|run| run_row(run, web, now_ms, queueing.runtime.as_deref())),
                failing: failing.remove(&r.issue_ref()).unwrap_or_default(),
                filer: r.preflight.filer.clone(),
                egress_allowed: r.thread.egress_allowed.clone(),
            }
        })
        .collect()
}

/// Each queued issue's place in the queue (from 1): by priority label, then the oldest
/// change first.
fn queue_positions(issues: &[IssueRecord], queueing: &Queueing) -> HashMap<(String, u64), usize> {
    let mut queued: Vec<&IssueRecord> = issues
        .iter()
        .filter(|r| r.lifecycle == Lifecycle::Queued)
        .collect();
    queued.sort_by_key(|r| {
        (
            priority_rank(&queueing.priority, &r.labels),
            r.last_change_ms,
            r.repo.to_string(),
            r.number,
        )
    });
    queued
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.repo.to_string(), r.number), i + 1))
        .collect()
}

/// Why a queued issue waits for its repository's open pull requests (`open` of them) to be
/// merged or closed, if it does; a follow-up of an open one never waits for them.
fn paced(r: &IssueRecord, open: usize, queueing: &Queueing) -> Option<String> {
    let followup =
        r.pr.as_ref()
            .is_some_and(crate::domain::PullRecord::is_open);
    (r.lifecycle == Lifecycle::Queued && !followup && open >= queueing.max_open_prs_per_repo).then(
        || {
            format!(
                "{open} open pull request(s) from the director in {} (`runner.max_open_prs_per_repo` = {}): waits for one to be merged or closed",
                r.repo, queueing.max_open_prs_per_repo
            )
        },
    )
}

/// Why a queued issue waits for the next day: its repository's (or the director's) day's
/// model budget is spent.
fn budget_spent(r: &IssueRecord, queueing: &Queueing) -> Option<String> {
    if r.lifecycle != Lifecycle::Queued || !queueing.budget.any() {
        return None;
    }
    let spent = crate::models::Spent {
        run: 0.0,
        repo_day: queueing
            .spent
            .get(&r.repo.to_string())
            .copied()
            .unwrap_or(0.0),
        day: queueing.spent_today,
    };
    crate::models::day_spent(&queueing.budget, &spent, &r.repo)
        .map(|why| format!("{why}: waits for the next day (UTC)"))
}

/// Why a queued agent-filed issue waits for the next day: its filer's day's budget is
/// spent (as the admission told the log).
fn filer_spent(r: &IssueRecord, queueing: &Queueing) -> Option<String> {
    let filer = r.preflight.filer.as_ref()?;
    (r.lifecycle == Lifecycle::Queued)
        .then(|| {
            queueing
                .filers_told
                .iter()
                .find(|(name, what)| *name == filer.name && what.contains("daily_usd"))
        })
        .flatten()
        .map(|(_, what)| format!("{what}: waits for the next day (UTC)"))
}

/// What filers were told of today, one line each: `director status` says it once, above
/// the issues it holds.
pub fn filer_lines(told: &[(String, String)]) -> Vec<String> {
    told.iter()
        .map(|(_, what)| format!("filer: {what}; its issues wait for the next day (UTC)"))
        .collect()
}

/// `director status`: a table for people, or one JSON array.
pub fn render(rows: &[Row], json: bool) -> anyhow::Result<String> {
    if json {
        return Ok(format!("{}\n", serde_json::to_string_pretty(rows)?));
    }
    if rows.is_empty() {
        return Ok("no tracked issues\n".to_owned());
    }
    let mut out = format!(
        "{:<40} {:<10} {:<20} {:<20} {}\n",
        "ISSUE", "STATE", "TRIGGER BY", "LAST CHANGE", "TITLE"
    );
    for r in rows {
        let actor = match (&r.trigger_actor, r.trigger_trusted) {
            (Some(a), Some(false)) => format!("{a} (no write)"),
            (Some(a), _) => a.clone(),
            (None, _) if r.trigger_present => "(checking)".to_owned(),
            (None, _) => "-".to_owned(),
        };
        let title: String = r.title.chars().take(60).collect();
        let state = match r.queue_position {
            Some(p) => format!("{} #{p}", r.state),
            None => r.state.clone(),
        };
        out.push_str(&format!(
            "{:<40} {:<10} {:<20} {:<20} {}\n",
            format!("{}#{}", r.repo, r.number),
            state,
            actor,
            r.last_change,
            title
        ));
        if let Some(f) = &r.filer {
            out.push_str(&format!(
                "    filed by {} for an agent (filer {})\n",
                f.login, f.name
            ));
        }
        if let Some(w) = &r.waiting {
            out.push_str(&format!("    waiting: {w}\n"));
        }
        if let Some(run) = &r.run {
            out.push_str(&format!("    run {}: {}", run.id, run.state));
            if let Some(pr) = run.followup_of {
                out.push_str(&format!(", follow-up on pull request #{pr}"));
            } else if let Some(pr) = run.pr {
                out.push_str(&format!(", pull request #{pr}"));
            }
            if let Some(a) = &run.agent {
                out.push_str(&format!(", agent {}", a.describe()));
            }
            if let Some(u) = run.usage.as_ref().and_then(Usage::describe) {
                out.push_str(&format!(", used {u}"));
            }
            if !run.egress_refused.is_empty() {
                let shown: Vec<String> = run
                    .egress_refused
                    .iter()
                    .map(|r| format!("{} ({}x)", r.destination, r.count))
                    .collect();
                out.push_str(&format!(", egress refused: {}", shown.join(", ")));
            }
            if let Some(settings) = &run.settings {
                out.push_str(&format!(", {}", settings.describe()));
            }
            if let Some(setup) = &run.setup {
                out.push_str(&format!(
                    ", setup {} ({:.1} s)",
                    setup.mode.as_str(),
                    setup.millis as f64 / 1000.0
                ));
            }
            out.push('\n');
        }
        if let Some(pr) = &r.pr {
            out.push_str(&format!(
                "    pull request #{}: {}, {} follow-up run(s)\n",
                pr.number, pr.state, pr.followups
            ));
            if let Some(words) = pr_words(pr) {
                out.push_str(&format!("    {words}\n"));
            }
        }
        for f in &r.failing {
            out.push_str(&format!(
                "    {}: {}\n",
                f.summary(),
                f.error.as_deref().unwrap_or("")
            ));
        }
    }
    Ok(out)
}

/// The pull request's row: its checks, approvals and place in the merge lane.
fn pr_row(
    p: &crate::domain::PullRecord,
    repo: &RepoName,
    web: Option<&WebLinks>,
    merge: &crate::settings::MergeSettings,
) -> PrRow {
    use crate::domain::CheckState;
    let checks = p.checks.as_ref().map(|c| {
        match c.state {
            CheckState::Failure => "failing",
            CheckState::Pending if c.held > 0 => "held",
            CheckState::Pending => "pending",
            CheckState::Warning => "warning",
            CheckState::Success => "passing",
            CheckState::None => "none",
        }
        .to_owned()
    });
    let lane = p.merge.clone().unwrap_or_default();
    let merge = (p.is_open() && merge.covers(repo)).then(|| MergeRow {
        queued: lane.trying || !lane.waiting.is_empty() || checks.as_deref() == Some("passing"),
        waiting: if lane.trying {
            "being merged".to_owned()
        } else if !lane.waiting.is_empty() {
            lane.waiting.clone()
        } else {
            match checks.as_deref() {
                None | Some("none") => "waiting for its checks to report".to_owned(),
                Some("passing") => "waiting for its turn".to_owned(),
                Some("held") => crate::engine::act::lane::HELD.to_owned(),
                Some(state) => format!("waiting for its checks ({state})"),
            }
        },
    });
    PrRow {
        number: p.number,
        state: p.state.as_str().to_owned(),
        url: web.map(|w| w.pull(repo, p.number)),
        followups: p.followups,
        ci_followups: p.ci_followups,
        checks,
        failing_checks: p
            .checks
            .iter()
            .flat_map(|c| c.failing.iter().map(|f| f.context.clone()))
            .collect(),
        approvals: lane.approvals,
        merge,
    }
}

/// What the row says of its open pull request, for people.
fn pr_words(pr: &PrRow) -> Option<String> {
    if pr.state != "open" {
        return None;
    }
    let mut parts = Vec::new();
    if let Some(checks) = &pr.checks {
        if checks == "held" {
            parts.push(crate::engine::act::lane::HELD.to_owned());
        } else if pr.failing_checks.is_empty() {
            parts.push(format!("checks {checks}"));
        } else {
            let shown: Vec<&str> = pr
                .failing_checks
                .iter()
                .take(5)
                .map(String::as_str)
                .collect();
            parts.push(format!("checks {checks}: {}", shown.join(", ")));
        }
    }
    if !pr.approvals.is_empty() {
        parts.push(format!("approved by {}", pr.approvals.join(", ")));
    }
    if let Some(merge) = &pr.merge {
        parts.push(format!("merge lane: {}", merge.waiting));
    }
    (!parts.is_empty()).then(|| format!("pull request #{}: {}", pr.number, parts.join("; ")))
}

/// Every tracked issue's row, read from the store.
pub async fn collect(
    store: &crate::store::Store,
    web: Option<&WebLinks>,
    queueing: &Queueing,
    now_ms: i64,
) -> anyhow::Result<Vec<Row>> {
    let issues = store.list_issues().await?;
    let troubled = store.troubled_actions().await?;
    let refs: Vec<IssueRef> = issues.iter().map(IssueRecord::issue_ref).collect();
    let runs = store.latest_runs(&refs).await?;
    let mut queueing = queueing.clone();
    if queueing.budget.any() {
        let spent = store.spent_by_repo(&crate::models::day_of(now_ms)).await?;
        queueing.spent_today = spent.iter().map(|(_, usd)| usd).sum();
        queueing.spent = spent.into_iter().collect();
    }
    queueing.filers_told = store.filers_told(&crate::models::day_of(now_ms)).await?;
    Ok(rows(&issues, &troubled, &runs, web, &queueing, now_ms))
}

#[cfg(test)]
mod tests {
    use super::html::{duration, esc};
    use super::*;
    use crate::domain::run::test_id;

    #[test]
    fn escaping_covers_markup_and_attributes() {
        assert_eq!(
            esc("<img src=x onerror=\"alert('1')\">&"),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"
        );
    }

    /// A fixed set of issues: one per kind of row the page shows.
    fn fixture() -> Vec<Row> {
        use crate::domain::{Judgement, RunState};
        let now = 1_795_860_000_000;
        let issue = |n: u64, title: &str, state: Lifecycle| {
            let mut r = IssueRecord::new(
                &format!("acme/widgets#{n}").parse().expect("valid"),
                now - 60_000,
            );
            r.title = title.to_owned();
            r.state = "open".into();
            r.lifecycle = state;
            r.trigger_present = true;
            r.trigger_actor = Some("alice".into());
            r.trigger_trusted = Some(true);
            r
        };
        let mut running = issue(1, "Add --verbose", Lifecycle::Running);
        running.preflight.verdict = Some(Judgement::Go);
        running.preflight.reason = Some("Small and clear.".into());
        let mut queued = issue(
            2,
            "<script>alert(1)</script> & \"quotes\"",
            Lifecycle::Queued,
        );
        queued.preflight.verdict = Some(Judgement::Go);
        let mut retry = issue(3, "Flaky model", Lifecycle::Pending);
        retry.preflight.attempts = 1;
        retry.preflight.last_error = Some("model answered 503".into());
        retry.preflight.not_before_ms = Some(now + 30_000);
        let mut done = issue(4, "Fix typo", Lifecycle::Succeeded);
        done.preflight.verdict = Some(Judgement::Go);
        let mut nogo = issue(5, "Rewrite everything", Lifecycle::NoGo);
        nogo.preflight.verdict = Some(Judgement::NoGo);
        nogo.preflight.reason = Some("Too broad: split it.".into());
        let mut asking = issue(6, "Add a config file", Lifecycle::NeedsInfo);
        asking.preflight.verdict = Some(Judgement::NeedsInfo);
        asking.preflight.reason = Some("2 open question(s)".into());
        asking.preflight.questions = vec!["TOML or YAML?".into(), "Where is it read?".into()];
        let mut run1 = RunRecord::admitted(
            &running.issue_ref(),
            test_id("0123456789ab"),
            "director-issue-1-01234567",
            now - 200_000,
        );
        run1.state = RunState::Running;
        run1.started_at_ms = Some(now - 200_000);
        let mut run4 = RunRecord::admitted(
            &done.issue_ref(),
            test_id("ba9876543210"),
            "director-issue-4-ba987654",
            now - 900_000,
        );
        run4.state = RunState::Succeeded;
        run4.started_at_ms = Some(now - 900_000);
        run4.finished_at_ms = Some(now - 600_000);
        run4.pr_number = Some(12);
        rows(
            &[running, queued, retry, done, nogo, asking],
            &[],
            &[run1, run4],
            Some(&WebLinks {
                base: "https://forgejo.example.org".into(),
                kind: crate::settings::ForgeKind::Forgejo,
            }),
            &Queueing::default(),
            now,
        )
    }

    #[test]
    fn a_commit_the_forge_spells_oddly_is_cut_without_a_panic() {
        let settings = crate::domain::RunSettings {
            commit: "ééééééééééééééé".into(),
            file: true,
            ..Default::default()
        };
        let shown = SettingsRow::of(&settings).describe();
        assert_eq!(shown, format!(".director.toml at {}", "é".repeat(12)));
    }

    #[test]
    fn the_page_for_a_fixed_set_of_issues() {
        let rows = fixture();
        let html = html(&rows, 1_795_860_000_000, true);
        assert!(!html.contains("<script>"), "a title is text, never markup");
        insta::assert_snapshot!(html);
    }

    #[test]
    fn rows_carry_links_runs_and_verdicts() {
        let rows = fixture();
        let run = rows[0].run.as_ref().expect("a run");
        assert_eq!(run.age_secs, Some(200));
        assert_eq!(
            rows[0].url.as_deref(),
            Some("https://forgejo.example.org/acme/widgets/issues/1")
        );
        assert_eq!(rows[1].queue_position, Some(1));
        assert!(
            rows[2]
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("retry 2"))
        );
        assert_eq!(
            rows[3].run.as_ref().and_then(|r| r.pr_url.as_deref()),
            Some("https://forgejo.example.org/acme/widgets/pulls/12")
        );
        assert_eq!(
            rows[3].run.as_ref().and_then(|r| r.age_secs),
            Some(300),
            "start to end"
        );
        assert_eq!(
            rows[4].verdict_reason.as_deref(),
            Some("Too broad: split it.")
        );
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(45), "45s");
        assert_eq!(duration(200), "3m 20s");
        assert_eq!(duration(3720), "1h 02m");
    }
}
