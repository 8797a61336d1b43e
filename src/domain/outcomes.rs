//! What the agents delivered over a window of days: issues picked up and judged, runs and
//! how they ended, pull requests opened, merged, closed and reverted, what it cost and how
//! long it took; in total, per repository and per agent, and day by day. Pure: the store
//! gives the facts as the director wrote them, this counts them (`/status/outcomes`,
//! `director report`).
//!
//! Each figure belongs to the window by its own moment: an issue by its first pick-up, a run
//! by its start, a pull request's opening by when it opened and its end by when it ended (the
//! store gives the facts so, aggregated where a count suffices). A rate or a quantile over
//! nothing is `None` (shown as what there is none of yet), never a division by zero. A row whose duration or cost
//! cannot be (negative, or beyond [`MAX_DURATION_MS`] or [`MAX_COST_USD`]) is left out of
//! that figure and counted in `absurd`.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{Judgement, PullState, RepoName, RunState};

/// A duration longer than this (a year) is taken for a broken clock, not a fact.
pub const MAX_DURATION_MS: i64 = 365 * 24 * 3_600_000;
/// A cost above this, in dollars, for one run or one pre-flight, is taken for a broken price.
pub const MAX_COST_USD: f64 = 10_000.0;
const DAY_MS: i64 = 86_400_000;

/// Issues first picked up in the window, counted by repository and verdict.
#[derive(Clone, Debug)]
pub struct PickedUp {
    pub repo: RepoName,
    pub verdict: Option<Judgement>,
    pub count: u64,
    /// Agent-filed (`[filers]`), not a maintainer's.
    pub filed: bool,
}

/// A pull request of the director's that opened or ended in the window, with what its
/// issue's runs (follow-ups included) and pre-flights cost, and the agent that opened it.
#[derive(Clone, Debug)]
pub struct PrFacts {
    pub repo: RepoName,
    pub picked_at_ms: Option<i64>,
    pub state: PullState,
    pub opened_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub reverted: bool,
    /// Follow-up runs answering reviews and comments, and answering checks.
    pub followups: u32,
    pub ci_followups: u32,
    /// Whether the director's checks passed when it opened (`None`: it had none).
    pub opened_green: Option<bool>,
    /// Follow-ups that answered a failing `director/checks`.
    pub check_followups: u32,
    /// The runs' and pre-flights' metered cost, in dollars (calls whose cost could
    /// not be are left out, and counted in the window's spend).
    pub cost_usd: f64,
    /// The agent of the run that opened it.
    pub agent: Option<String>,
    /// Its issue was agent-filed (`[filers]`), not a maintainer's.
    pub filed: bool,
}

/// Runs started on one UTC day, of one repository and agent, that ended one way.
#[derive(Clone, Debug)]
pub struct RunGroup {
    pub repo: RepoName,
    /// The agent's name (`[agents]`), or `default`.
    pub agent: String,
    pub state: RunState,
    /// Days since the epoch, UTC.
    pub day: i64,
    pub count: u64,
}

/// What model calls (runs' and pre-flights') of one repository cost on one UTC day.
#[derive(Clone, Debug)]
pub struct SpendDay {
    pub repo: RepoName,
    pub day: i64,
    pub cost_usd: f64,
    /// Calls whose cost could not be (left out).
    pub absurd_costs: u64,
}

/// What the runs of one repository and agent spent in the window.
#[derive(Clone, Debug)]
pub struct AgentSpend {
    pub repo: RepoName,
    pub agent: String,
    pub cost_usd: f64,
}

/// What calls to one model, for one repository, cost in the window.
#[derive(Clone, Debug)]
pub struct ModelSpend {
    pub repo: RepoName,
    pub model: String,
    pub calls: u64,
    pub cost_usd: f64,
}

/// The calls to one model in the window (runs' and pre-flights').
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelFigures {
    pub calls: u64,
    pub cost_usd: f64,
}

/// Everything the store gives for one window, aggregated where a count is all that is
/// needed (a window of 100,000 issues is a few thousand rows).
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub picked_up: Vec<PickedUp>,
    pub prs: Vec<PrFacts>,
    pub runs: Vec<RunGroup>,
    pub spend: Vec<SpendDay>,
    pub agent_spend: Vec<AgentSpend>,
    pub model_spend: Vec<ModelSpend>,
}

impl Facts {
    /// Every repository the facts name.
    pub fn repos(&self) -> std::collections::BTreeSet<RepoName> {
        self.picked_up
            .iter()
            .map(|p| p.repo.clone())
            .chain(self.prs.iter().map(|p| p.repo.clone()))
            .chain(self.runs.iter().map(|r| r.repo.clone()))
            .chain(self.spend.iter().map(|s| s.repo.clone()))
            .collect()
    }

    /// Keeps the facts of the repositories `keep` says.
    pub fn retain(&mut self, keep: impl Fn(&RepoName) -> bool) {
        self.picked_up.retain(|p| keep(&p.repo));
        self.prs.retain(|p| keep(&p.repo));
        self.runs.retain(|r| keep(&r.repo));
        self.spend.retain(|s| keep(&s.repo));
        self.agent_spend.retain(|s| keep(&s.repo));
        self.model_spend.retain(|s| keep(&s.repo));
    }
}

/// The median and the 90th percentile of some durations, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
    pub count: usize,
}

/// The figures of one group (all, a repository, an agent).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    pub picked_up: u64,
    pub go: u64,
    pub no_go: u64,
    pub wrong_repo: u64,
    pub needs_info: u64,
    pub runs_started: u64,
    pub runs_failed: u64,
    pub runs_timed_out: u64,
    pub runs_over_budget: u64,
    pub runs_cancelled: u64,
    pub prs_opened: u64,
    pub merged: u64,
    pub closed_unmerged: u64,
    pub reverted: u64,
    /// What model calls (runs' and pre-flights') cost in the window, in dollars; per agent,
    /// its runs'.
    pub cost_usd: f64,
    /// Merged over merged and closed: `None` when none ended.
    pub merge_rate: Option<f64>,
    /// The runs (follow-ups included) and pre-flights of the merged pull requests' issues,
    /// per merged pull request.
    pub cost_per_merged_usd: Option<f64>,
    /// From the first pick-up to the pull request's opening.
    pub label_to_pr: Option<Spread>,
    /// From the opening to the merge.
    pub pr_to_merge: Option<Spread>,
    /// Follow-up runs (review and check answers) per merged pull request.
    pub followups_per_merged: Option<f64>,
    /// Pull requests opened with the director's checks (`[checks]`), and those of them that
    /// opened with the checks passing.
    pub prs_checked: u64,
    pub prs_opened_green: u64,
    /// Opened green over opened with checks: `None` when none was.
    pub opened_green_rate: Option<f64>,
    /// Follow-up runs that answered a failing `director/checks`, of the pull requests opened
    /// in the window.
    pub check_followups: u64,
}

/// One UTC day.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Day {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// Runs started that day, by how they ended (`succeeded`, `failed`, `timed_out`,
    /// `over_budget`, `cancelled`, `other` for refused, declined or still going).
    pub runs: BTreeMap<&'static str, u64>,
    pub merged: u64,
    pub cost_usd: f64,
    /// The day's merges' times from opening.
    pub time_to_merge: Option<Spread>,
}

/// The outcomes of a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcomes {
    pub days: u32,
    pub since_ms: i64,
    pub until_ms: i64,
    pub total: Figures,
    pub repos: BTreeMap<String, Figures>,
    pub agents: BTreeMap<String, Figures>,
    /// By who asked for the work: `agent-filed` (through a filer, `[filers]`) and
    /// `maintainers`, for issues picked up and pull requests.
    pub requesters: BTreeMap<String, Figures>,
    /// Model calls, by model.
    pub models: BTreeMap<String, ModelFigures>,
    pub daily: Vec<Day>,
    /// Rows left out of a figure for a duration or cost that cannot be.
    pub absurd: u64,
}

/// The outcome word a run is drawn under.
pub fn run_outcome(state: RunState) -> &'static str {
    match state {
        RunState::Succeeded => "succeeded",
        RunState::Failed => "failed",
        RunState::TimedOut => "timed_out",
        RunState::OverBudget => "over_budget",
        RunState::Cancelled => "cancelled",
        _ => "other",
    }
}

/// The order runs are stacked in, and their names in a chart's legend.
pub const RUN_OUTCOMES: [&str; 6] = [
    "succeeded",
    "failed",
    "timed_out",
    "over_budget",
    "cancelled",
    "other",
];

/// What one group gathers before its figures are made.
#[derive(Default)]
struct Acc {
    figures: Figures,
    to_pr: Vec<f64>,
    to_merge: Vec<f64>,
    merged_cost: f64,
    merged_followups: u64,
}

impl Acc {
    fn finish(mut self) -> Figures {
        let f = &mut self.figures;
        f.label_to_pr = spread(&mut self.to_pr);
        f.pr_to_merge = spread(&mut self.to_merge);
        f.cost_per_merged_usd = per(self.merged_cost, f.merged);
        f.followups_per_merged = per(self.merged_followups as f64, f.merged);
        f.merge_rate = per(f.merged as f64, f.merged + f.closed_unmerged);
        f.opened_green_rate = per(f.prs_opened_green as f64, f.prs_checked);
        self.figures
    }
}

/// Every group: all, each repository, each agent.
#[derive(Default)]
struct Groups<'a> {
    total: Acc,
    repos: HashMap<&'a RepoName, Acc>,
    agents: HashMap<&'a str, Acc>,
    requesters: HashMap<&'static str, Acc>,
}

impl<'a> Groups<'a> {
    fn each(&mut self, repo: &'a RepoName, agent: Option<&'a str>, mut f: impl FnMut(&mut Acc)) {
        f(&mut self.total);
        f(self.repos.entry(repo).or_default());
        if let Some(a) = agent {
            f(self.agents.entry(a).or_default());
        }
    }

    /// [`Groups::each`], and the group of who asked: an agent (through a filer) or a
    /// maintainer.
    fn each_asked(
        &mut self,
        repo: &'a RepoName,
        agent: Option<&'a str>,
        filed: bool,
        mut f: impl FnMut(&mut Acc),
    ) {
        self.each(repo, agent, &mut f);
        let who = if filed { "agent-filed" } else { "maintainers" };
        f(self.requesters.entry(who).or_default());
    }
}

/// The days of a window, by UTC date, and the index of the one a moment falls on.
struct Days {
    first: i64,
    days: Vec<Day>,
    merge_secs: Vec<Vec<f64>>,
}

impl Days {
    fn new(since_ms: i64, until_ms: i64) -> Self {
        let first = since_ms.div_euclid(DAY_MS);
        let count = (until_ms.div_euclid(DAY_MS) - first + 1).max(1);
        let days = (0..count)
            .map(|d| Day {
                date: date_of((first + d) * DAY_MS),
                ..Day::default()
            })
            .collect();
        Self {
            first,
            days,
            merge_secs: vec![Vec::new(); usize::try_from(count).unwrap_or(0)],
        }
    }

    fn at(&self, ms: i64) -> Option<usize> {
        self.on(ms.div_euclid(DAY_MS))
    }

    /// The index of epoch day `day`.
    fn on(&self, day: i64) -> Option<usize> {
        let i = usize::try_from(day - self.first).ok()?;
        (i < self.days.len()).then_some(i)
    }
}

/// Counts `facts` over `[until - days, until]` (the store chose them for that window:
/// pick-ups, runs and spend by when they happened, pull requests opened or ended in it).
pub fn compute(facts: &Facts, days: u32, until_ms: i64) -> Outcomes {
    let since_ms = until_ms - i64::from(days) * DAY_MS;
    let mut absurd = 0u64;
    let mut groups = Groups::default();
    let mut daily = Days::new(since_ms, until_ms);
    for p in &facts.picked_up {
        groups.picked_up(p);
    }
    for sp in &facts.spend {
        absurd += sp.absurd_costs;
        groups.each(&sp.repo, None, |a| a.figures.cost_usd += sp.cost_usd);
        if let Some(d) = daily.on(sp.day) {
            daily.days[d].cost_usd += sp.cost_usd;
        }
    }
    for sp in &facts.agent_spend {
        groups
            .agents
            .entry(sp.agent.as_str())
            .or_default()
            .figures
            .cost_usd += sp.cost_usd;
    }
    for r in &facts.runs {
        groups.runs(r);
        if let Some(d) = daily.on(r.day) {
            *daily.days[d].runs.entry(run_outcome(r.state)).or_default() += r.count;
        }
    }
    for pr in &facts.prs {
        absurd += pull_request(&mut groups, &mut daily, pr, (since_ms, until_ms));
    }
    let mut models: BTreeMap<String, ModelFigures> = BTreeMap::new();
    for m in &facts.model_spend {
        let f = models.entry(m.model.clone()).or_default();
        f.calls += m.calls;
        f.cost_usd += m.cost_usd;
    }
    for (day, mut secs) in daily.days.iter_mut().zip(daily.merge_secs) {
        day.time_to_merge = spread(&mut secs);
    }
    Outcomes {
        days,
        since_ms,
        until_ms,
        total: groups.total.finish(),
        repos: groups
            .repos
            .into_iter()
            .map(|(r, a)| (r.to_string(), a.finish()))
            .collect(),
        agents: groups
            .agents
            .into_iter()
            .map(|(n, a)| (n.to_owned(), a.finish()))
            .collect(),
        requesters: groups
            .requesters
            .into_iter()
            .map(|(n, a)| (n.to_owned(), a.finish()))
            .collect(),
        models,
        daily: daily.days,
        absurd,
    }
}

impl<'a> Groups<'a> {
    /// Issues picked up, by their verdict.
    fn picked_up(&mut self, p: &'a PickedUp) {
        self.each_asked(&p.repo, None, p.filed, |a| {
            let f = &mut a.figures;
            f.picked_up += p.count;
            match p.verdict {
                Some(Judgement::Go | Judgement::Skipped) => f.go += p.count,
                Some(Judgement::NoGo) => f.no_go += p.count,
                Some(Judgement::WrongRepo) => f.wrong_repo += p.count,
                Some(Judgement::NeedsInfo) => f.needs_info += p.count,
                _ => {}
            }
        });
    }

    /// Runs started, and how those that did not succeed ended.
    fn runs(&mut self, r: &'a RunGroup) {
        self.each(&r.repo, Some(r.agent.as_str()), |a| {
            let f = &mut a.figures;
            f.runs_started += r.count;
            match r.state {
                RunState::Failed => f.runs_failed += r.count,
                RunState::TimedOut => f.runs_timed_out += r.count,
                RunState::OverBudget => f.runs_over_budget += r.count,
                RunState::Cancelled => f.runs_cancelled += r.count,
                _ => {}
            }
        });
    }
}

/// Counts one pull request: opened in `window` (and how long after its pick-up), merged or
/// closed in it (how long its merge took, on the day it ended). Returns how many of its
/// durations were impossible, and left out.
fn pull_request<'a>(
    groups: &mut Groups<'a>,
    daily: &mut Days,
    pr: &'a PrFacts,
    (since_ms, until_ms): (i64, i64),
) -> u64 {
    let within = |t: Option<i64>| t.is_some_and(|t| t >= since_ms && t <= until_ms);
    let mut absurd = 0;
    let agent = pr.agent.as_deref();
    if within(pr.opened_at_ms) {
        let waited = pr
            .picked_at_ms
            .zip(pr.opened_at_ms)
            .map(|(p, o)| span(p, o));
        if waited == Some(None) {
            absurd += 1;
        }
        groups.each_asked(&pr.repo, agent, pr.filed, |a| {
            a.figures.prs_opened += 1;
            a.figures.prs_checked += u64::from(pr.opened_green.is_some());
            a.figures.prs_opened_green += u64::from(pr.opened_green == Some(true));
            a.figures.check_followups += u64::from(pr.check_followups);
            if let Some(Some(secs)) = waited {
                a.to_pr.push(secs);
            }
        });
    }
    if !within(pr.ended_at_ms) {
        return absurd;
    }
    match pr.state {
        PullState::Merged => {
            let followups = u64::from(pr.followups) + u64::from(pr.ci_followups);
            let ended = pr.ended_at_ms.unwrap_or(until_ms);
            let took = pr.opened_at_ms.map(|o| span(o, ended));
            if took == Some(None) {
                absurd += 1;
            }
            groups.each_asked(&pr.repo, agent, pr.filed, |a| {
                a.figures.merged += 1;
                a.figures.reverted += u64::from(pr.reverted);
                a.merged_cost += pr.cost_usd;
                a.merged_followups += followups;
                if let Some(Some(secs)) = took {
                    a.to_merge.push(secs);
                }
            });
            if let Some(d) = daily.at(ended) {
                daily.days[d].merged += 1;
                if let Some(Some(secs)) = took {
                    daily.merge_secs[d].push(secs);
                }
            }
        }
        PullState::Closed => {
            groups.each_asked(&pr.repo, agent, pr.filed, |a| {
                a.figures.closed_unmerged += 1;
            });
        }
        PullState::Open => {}
    }
    absurd
}

/// Whether a cost can be one run's or one call's.
pub fn sane_cost(c: f64) -> bool {
    c.is_finite() && (0.0..=MAX_COST_USD).contains(&c)
}

fn per(amount: f64, count: u64) -> Option<f64> {
    (count > 0).then(|| amount / count as f64)
}

/// Seconds from `from` to `to`, unless that cannot be.
fn span(from: i64, to: i64) -> Option<f64> {
    let ms = to.checked_sub(from)?;
    (0..=MAX_DURATION_MS)
        .contains(&ms)
        .then(|| ms as f64 / 1000.0)
}

/// The median and the 90th percentile (nearest rank).
fn spread(values: &mut [f64]) -> Option<Spread> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let rank =
        |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    Some(Spread {
        p50: rank(0.5),
        p90: rank(0.9),
        count: values.len(),
    })
}

fn date_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// The UTC day (days since the epoch) `ms` falls on.
pub fn epoch_day(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_796_000_000_000;
    const H: i64 = 3_600_000;

    fn repo(name: &str) -> RepoName {
        name.parse().expect("a name")
    }

    fn runs(name: &str, state: RunState, at: i64, count: u64) -> RunGroup {
        RunGroup {
            repo: repo(name),
            agent: "claude-code".into(),
            state,
            day: epoch_day(at),
            count,
        }
    }

    fn spent(name: &str, at: i64, cost: f64) -> SpendDay {
        SpendDay {
            repo: repo(name),
            day: epoch_day(at),
            cost_usd: cost,
            absurd_costs: 0,
        }
    }

    fn picked(name: &str, verdict: Judgement, count: u64) -> PickedUp {
        PickedUp {
            repo: repo(name),
            verdict: Some(verdict),
            count,
            filed: false,
        }
    }

    fn pr(
        name: &str,
        state: PullState,
        picked: i64,
        opened: i64,
        ended: Option<i64>,
        cost: f64,
    ) -> PrFacts {
        PrFacts {
            repo: repo(name),
            picked_at_ms: Some(picked),
            state,
            opened_at_ms: Some(opened),
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

    #[test]
    fn the_share_opened_green_counts_only_pull_requests_that_had_checks() {
        let mut green = pr("acme/widgets", PullState::Open, 0, 1_000, None, 0.0);
        green.opened_green = Some(true);
        let mut red = pr("acme/widgets", PullState::Open, 0, 1_000, None, 0.0);
        red.opened_green = Some(false);
        red.check_followups = 2;
        let unchecked = pr("acme/widgets", PullState::Open, 0, 1_000, None, 0.0);
        let facts = Facts {
            prs: vec![green, red, unchecked],
            ..Facts::default()
        };
        let o = compute(&facts, 7, 2_000);
        assert_eq!(o.total.prs_opened, 3);
        assert_eq!((o.total.prs_checked, o.total.prs_opened_green), (2, 1));
        assert_eq!(o.total.opened_green_rate, Some(0.5));
        assert_eq!(o.total.check_followups, 2);
    }

    #[test]
    fn agent_filed_work_is_counted_beside_maintainers() {
        let now = T0 + 10 * 24 * H;
        let filed = |mut p: PrFacts| {
            p.filed = true;
            p
        };
        let facts = Facts {
            picked_up: vec![
                PickedUp {
                    filed: true,
                    ..picked("acme/widgets", Judgement::Go, 3)
                },
                picked("acme/widgets", Judgement::Go, 1),
            ],
            prs: vec![
                filed(pr(
                    "acme/widgets",
                    PullState::Merged,
                    T0,
                    T0 + H,
                    Some(T0 + 2 * H),
                    4.0,
                )),
                filed(pr(
                    "acme/widgets",
                    PullState::Closed,
                    T0,
                    T0 + H,
                    Some(T0 + 2 * H),
                    1.0,
                )),
                pr(
                    "acme/widgets",
                    PullState::Merged,
                    T0,
                    T0 + H,
                    Some(T0 + 2 * H),
                    1.0,
                ),
            ],
            ..Facts::default()
        };
        let o = compute(&facts, 30, now);
        let agents = &o.requesters["agent-filed"];
        let people = &o.requesters["maintainers"];
        assert_eq!((agents.picked_up, people.picked_up), (3, 1));
        assert_eq!(agents.merge_rate, Some(0.5));
        assert_eq!(people.merge_rate, Some(1.0));
        assert_eq!(agents.cost_per_merged_usd, Some(4.0));
        assert_eq!(people.cost_per_merged_usd, Some(1.0));
        // The total still counts both.
        assert_eq!(o.total.merged, 2);
    }

    #[test]
    fn the_figures_are_what_the_facts_imply_exactly() {
        let now = T0 + 10 * 24 * H;
        let mut merged = pr(
            "acme/widgets",
            PullState::Merged,
            T0,
            T0 + 2 * H,
            Some(T0 + 12 * H),
            2.05,
        );
        merged.followups = 1;
        let facts = Facts {
            picked_up: vec![
                picked("acme/widgets", Judgement::Go, 2),
                picked("acme/widgets", Judgement::NoGo, 1),
                picked("acme/gears", Judgement::WrongRepo, 1),
                picked("acme/gears", Judgement::NeedsInfo, 1),
            ],
            prs: vec![
                merged,
                pr(
                    "acme/widgets",
                    PullState::Closed,
                    T0 + 24 * H,
                    T0 + 28 * H,
                    Some(T0 + 30 * H),
                    2.0,
                ),
            ],
            runs: vec![
                runs("acme/widgets", RunState::Succeeded, T0 + H, 3),
                runs("acme/widgets", RunState::TimedOut, T0 + 49 * H, 1),
            ],
            spend: vec![
                spent("acme/widgets", T0 + H, 4.0),
                spent("acme/widgets", T0 + 49 * H, 0.25),
                spent("acme/widgets", T0, 0.05),
                spent("acme/gears", T0 + 48 * H, 0.05),
            ],
            agent_spend: vec![AgentSpend {
                repo: repo("acme/widgets"),
                agent: "claude-code".into(),
                cost_usd: 4.25,
            }],
            model_spend: vec![
                ModelSpend {
                    repo: repo("acme/widgets"),
                    model: "claude-sonnet-4-5".into(),
                    calls: 3,
                    cost_usd: 4.0,
                },
                ModelSpend {
                    repo: repo("acme/gears"),
                    model: "claude-sonnet-4-5".into(),
                    calls: 1,
                    cost_usd: 0.05,
                },
            ],
        };
        let o = compute(&facts, 30, now);
        let t = &o.total;
        assert_eq!(
            (t.picked_up, t.go, t.no_go, t.wrong_repo, t.needs_info),
            (5, 2, 1, 1, 1)
        );
        assert_eq!((t.runs_started, t.runs_timed_out, t.runs_failed), (4, 1, 0));
        assert_eq!((t.prs_opened, t.merged, t.closed_unmerged), (2, 1, 1));
        assert_eq!(t.merge_rate, Some(0.5));
        assert_eq!(t.cost_per_merged_usd, Some(2.05));
        assert!((t.cost_usd - 4.35).abs() < 1e-9, "{}", t.cost_usd);
        assert_eq!(t.followups_per_merged, Some(1.0));
        let to_pr = t.label_to_pr.expect("two opened");
        assert_eq!((to_pr.p50, to_pr.p90, to_pr.count), (7200.0, 14400.0, 2));
        assert_eq!(t.pr_to_merge.map(|s| s.p50), Some(36000.0));
        assert_eq!(o.repos["acme/gears"].picked_up, 2);
        assert_eq!(
            o.repos["acme/gears"].merge_rate, None,
            "nothing ended: no rate"
        );
        assert_eq!(o.agents["claude-code"].merged, 1);
        assert_eq!(o.agents["claude-code"].cost_usd, 4.25);
        assert_eq!(
            o.models["claude-sonnet-4-5"],
            ModelFigures {
                calls: 4,
                cost_usd: 4.05
            }
        );
        assert!(
            (31..=32).contains(&o.daily.len()),
            "every day of the window"
        );
        let first = o
            .daily
            .iter()
            .find(|d| d.merged == 1)
            .expect("the merge's day");
        assert_eq!(first.time_to_merge.map(|s| s.p50), Some(36000.0));
        assert_eq!(o.absurd, 0);
    }

    #[test]
    fn an_empty_window_has_no_rates_and_a_day_per_day() {
        let o = compute(&Facts::default(), 7, T0);
        assert_eq!(o.total, Figures::default());
        assert!((8..=9).contains(&o.daily.len()), "{}", o.daily.len());
        assert!(o.daily.iter().all(|d| d.runs.is_empty() && d.merged == 0));
    }

    #[test]
    fn what_ended_outside_the_window_counts_nowhere_and_absurd_rows_are_left_out_and_counted() {
        let now = T0 + 100 * 24 * H;
        let mut bad_spend = spent("acme/widgets", now - H, 0.0);
        bad_spend.absurd_costs = 1;
        let facts = Facts {
            prs: vec![
                pr(
                    "acme/widgets",
                    PullState::Merged,
                    T0,
                    T0 + H,
                    Some(T0 + 2 * H),
                    1.0,
                ),
                // Merged before it was opened: a broken clock.
                pr(
                    "acme/widgets",
                    PullState::Merged,
                    now - H,
                    now - H,
                    Some(now - 2 * H),
                    1.0,
                ),
            ],
            // A call that cost less than nothing.
            spend: vec![bad_spend],
            ..Facts::default()
        };
        let o = compute(&facts, 7, now);
        assert_eq!(o.total.merged, 1, "the old one is not in the window");
        assert_eq!(o.total.prs_opened, 1);
        assert_eq!(o.total.pr_to_merge, None);
        assert_eq!(o.absurd, 2, "the negative cost and the negative wait");
    }
}
