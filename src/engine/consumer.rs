//! The consumer: reads stored events (webhooks, scan observations, executor outcomes) in
//! arrival order, asks [`decide`] about each, and commits the new records and runs, the actions
//! they call for and the consumed events in one transaction. Then it admits queued issues to
//! free run slots, the one place admission is counted. After a restart it picks up whatever
//! was stored and not consumed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::{IssueRecord, IssueRef, RunId, RunRecord};
use crate::engine::action::Planned;
use crate::engine::decide::{Decision, IssueView, Policy, decide};
use crate::engine::settled::Settled;
use crate::event::Event;
use crate::metrics::Metrics;
use crate::store::{Commit, Fence, NewAction, PassInput, Passed, Store, StoredEvent};
use crate::telemetry::Traces;

const BATCH: u32 = 256;
/// A backstop: the intake and the executors wake the consumer on every commit, but a missed
/// wake-up must not leave work waiting for long.
const IDLE_POLL: Duration = Duration::from_secs(5);
/// Under a steady stream of webhook deliveries a pass for them starts no sooner than this
/// after the one before, so that it takes what arrived meanwhile in one go: each pass costs a
/// few database round trips and thread wake-ups whatever its size, and at 1,000 deliveries a
/// second a pass per delivery cost more CPU than the deliveries themselves. The first
/// delivery after a quiet spell is taken at once, and so is every other event (an action's
/// outcome, a scan's finding): a flow's later steps never wait to be gathered.
const GATHER: Duration = Duration::from_millis(4);

/// With several replicas one consumes at a time: the holder of this lease.
const LEASE: &str = "consumer";
/// How long the lease lasts unrenewed: a replica that dies hands the consumer over within
/// this plus [`LEASE_POLL`].
const LEASE_MS: i64 = 15_000;
/// How often a replica renews the lease, or tries to take it.
const LEASE_POLL: Duration = Duration::from_secs(3);

/// Run slots: `runner.max_concurrent` and `runner.max_per_repo`; pacing by open pull
/// requests (`runner.max_open_prs_per_repo`); the priority labels, highest first.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_concurrent: usize,
    pub max_per_repo: usize,
    pub max_open_prs_per_repo: usize,
    pub priority: Vec<String>,
    /// A repository whose day's model budget (or the day's) is spent starts no run.
    pub budget: crate::settings::BudgetSettings,
    /// `runner.branch_template`.
    pub branch_template: String,
}

/// Who to wake when a commit gives them work.
#[derive(Clone, Default)]
pub struct Wakes {
    /// The action executor: new actions.
    pub executor: Option<Arc<Notify>>,
    /// The run watcher: a run changed.
    pub watcher: Option<Arc<Notify>>,
}

pub struct Consumer {
    store: Store,
    planner: Arc<Planner>,
    wake: Arc<Notify>,
    /// Intake's wake-up: new deliveries, taken in gathered passes (see [`GATHER`]).
    deliveries: Option<Arc<Notify>>,
    wakes: Wakes,
    /// `None` without a runtime: queued issues wait.
    limits: Option<Limits>,
    /// This replica's name, when several share the store.
    replica: Option<String>,
    /// What this replica last learnt of the lease, so that a wake-up costs no database
    /// round trip: (held by it until, held by another until).
    lease: std::sync::Mutex<(i64, i64)>,
    /// Where it says it has consumed everything (for whoever waits on the engine).
    settled: Settled,
}

impl Consumer {
    pub fn new(store: Store, policy: Policy, clock: SharedClock, wake: Arc<Notify>) -> Self {
        Self {
            store,
            planner: Arc::new(Planner {
                policy,
                clock,
                metrics: None,
                traces: Traces::default(),
            }),
            wake,
            deliveries: None,
            wakes: Wakes::default(),
            limits: None,
            replica: None,
            lease: std::sync::Mutex::new((0, 0)),
            settled: Settled::default(),
        }
    }

    /// One of several replicas on a shared store, named `name`: it consumes only while it
    /// holds the consumer lease, and each pass commits only if it still does.
    pub fn as_replica(mut self, name: &str) -> Self {
        self.replica = Some(name.to_owned());
        self
    }

    /// Whether this consumer may consume now (it holds, or took, the lease). The lease is
    /// renewed when half of it is left (every commit renews it too); while another replica
    /// holds it, it is asked for again only every [`LEASE_POLL`]. Each commit checks it anyway.
    async fn lead(&self) -> anyhow::Result<bool> {
        let Some(me) = &self.replica else {
            return Ok(true);
        };
        let now = crate::clock::now_ms();
        let (mine, theirs) = *self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if mine > now + LEASE_MS / 2 {
            return Ok(true);
        }
        if theirs > now {
            return Ok(false);
        }
        let held = self
            .store
            .hold_lease(LEASE, me, now + LEASE_MS, now)
            .await?;
        let poll = i64::try_from(LEASE_POLL.as_millis()).unwrap_or(3_000);
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = if held {
            (now + LEASE_MS, 0)
        } else {
            (0, now + poll)
        };
        Ok(held)
    }

    fn fence(&self) -> Option<Fence> {
        self.replica.as_ref().map(|me| Fence {
            name: LEASE.to_owned(),
            owner: me.clone(),
            until_ms: crate::clock::now_ms() + LEASE_MS,
        })
    }

    /// Woken by `deliveries` for new webhook deliveries, which it takes in gathered passes.
    pub fn gathering(mut self, deliveries: Arc<Notify>) -> Self {
        self.deliveries = Some(deliveries);
        self
    }

    pub fn with_wakes(mut self, wakes: Wakes) -> Self {
        self.wakes = wakes;
        self
    }

    pub fn with_admission(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        Arc::make_mut(&mut self.planner).metrics = Some(metrics);
        self
    }

    /// Sends a span for each decision, and for each run as it ends, once the decision is
    /// committed.
    pub fn with_traces(mut self, traces: Traces) -> Self {
        Arc::make_mut(&mut self.planner).traces = traces.holding();
        self
    }

    /// Says on `settled` after each pass whether anything stored is left to consume.
    pub fn with_settled(mut self, settled: Settled) -> Self {
        self.settled = settled;
        self
    }

    /// Processes until `shutdown` fires. A replica hands the lease over as it stops.
    pub async fn run(self, shutdown: CancellationToken) {
        let poll = if self.replica.is_some() {
            LEASE_POLL
        } else {
            IDLE_POLL
        };
        let never = Notify::new();
        let deliveries = self.deliveries.as_deref().unwrap_or(&never);
        // When the last pass woken by intake started.
        let mut gathered: Option<tokio::time::Instant> = None;
        loop {
            match self.drain().await {
                // The last batch was short: nothing else was stored when it was read.
                Ok(_) => self.settled.consumer_passed(true),
                Err(error) => {
                    self.settled.consumer_passed(false);
                    if self.store.is_up() {
                        tracing::error!(error = %format!("{error:#}"), "consumer failed; retrying");
                    } else {
                        tracing::debug!(error = %format!("{error:#}"), "consumer waits for the database");
                    }
                }
            }
            let by_intake = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = self.wake.notified() => false,
                _ = deliveries.notified() => true,
                _ = tokio::time::sleep(poll) => false,
            };
            if !by_intake {
                continue;
            }
            let now = tokio::time::Instant::now();
            if let Some(at) = gathered.and_then(|last| gathered_until(last, now)) {
                // Anything else that comes meanwhile is taken at once, with what gathered.
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            gathered = Some(tokio::time::Instant::now());
        }
        self.hand_over().await;
    }

    /// Gives the consumer lease up, if this replica holds it: another takes over at once.
    pub async fn hand_over(&self) {
        if let Some(me) = &self.replica
            && let Err(error) = self.store.release_lease(LEASE, me).await
        {
            tracing::debug!(error = %format!("{error:#}"), "could not hand the consumer over");
        }
    }

    /// Processes every stored event and admits what fits; returns how many events.
    pub async fn drain(&self) -> anyhow::Result<usize> {
        if !self.lead().await? {
            return Ok(0);
        }
        let mut done = 0;
        loop {
            let passed = self.pass().await?;
            done += passed.events;
            // A short batch was all there was when it was read: what arrived since woke
            // the consumer, which comes back for it.
            if passed.events < BATCH as usize {
                if passed.queued {
                    self.admit().await?;
                }
                return Ok(done);
            }
        }
    }

    /// Decides the next batch of events and commits what it decided: on SQLite in one
    /// hand-off to a thread of the store's (see [`Store::pass`]).
    async fn pass(&self) -> anyhow::Result<Passed> {
        self.planner.traces.discard();
        let planner = self.planner.clone();
        let fence = self.fence();
        let until = fence.as_ref().map(|f| f.until_ms);
        let passed = self
            .store
            .pass(BATCH, move |input| planner.plan(input, fence))
            .await;
        self.after_commit(until, passed.as_ref().ok().map(|p| (p.actions, p.runs)));
        self.traced(passed.is_ok());
        passed
    }

    /// Keeps what this replica knows of its lease after a commit fenced `until` (`None`
    /// without replicas), and wakes whoever has new work; `done` is `None` when the commit
    /// failed, else whether it made (actions, runs).
    fn after_commit(&self, until: Option<i64>, done: Option<(bool, bool)>) {
        if let Some(until) = until {
            let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
            // Renewed by the commit, or perhaps lost: then asked again before the next pass.
            lease.0 = if done.is_some() { until } else { 0 };
        }
        let Some((actions, runs)) = done else {
            return;
        };
        if actions && let Some(w) = &self.wakes.executor {
            w.notify_one();
        }
        if runs && let Some(w) = &self.wakes.watcher {
            w.notify_one();
        }
    }

    /// `durable`: fsynced before anything acts on it (see [`Store::commit_with`]).
    async fn commit(&self, mut pass: Pass, durable: bool) -> anyhow::Result<()> {
        pass.commit.fence = self.fence();
        let until = pass.commit.fence.as_ref().map(|f| f.until_ms);
        let committed = self
            .store
            .commit_with(&pass.commit, self.planner.clock.now_ms(), durable)
            .await;
        let made = (
            !pass.commit.actions.is_empty(),
            !pass.commit.runs.is_empty(),
        );
        self.after_commit(until, committed.as_ref().ok().map(|()| made));
        self.traced(committed.is_ok());
        committed
    }

    /// Sends the spans of what was decided once it is committed; forgets them if it was not
    /// (it is decided again, and traced then).
    fn traced(&self, committed: bool) {
        if committed {
            self.planner.traces.release();
        } else {
            self.planner.traces.discard();
        }
    }

    /// Gives free run slots to queued issues, priority labels first, then in queue order,
    /// within both limits. A repository with `max_open_prs_per_repo` open pull requests from
    /// the director starts no new run (follow-ups on an open one are exempt).
    async fn admit(&self) -> anyhow::Result<()> {
        let Some(limits) = &self.limits else {
            return Ok(());
        };
        // Spans held by an admission that failed before its commit are not of anything.
        self.planner.traces.discard();
        let (mut running, mut per_repo) = self.store.active_run_counts().await?;
        if running >= limits.max_concurrent {
            return Ok(());
        }
        let mut queued = self.store.queued_issues().await?;
        if queued.is_empty() {
            return Ok(());
        }
        // Stable: queue order within a priority.
        queued.sort_by_key(|r| crate::domain::priority_rank(&limits.priority, &r.labels));
        let open_prs = self.store.open_pull_counts().await?;
        let followup: HashSet<IssueRef> = queued
            .iter()
            .filter(|r| {
                r.pr.as_ref()
                    .is_some_and(crate::domain::PullRecord::is_open)
            })
            .map(IssueRecord::issue_ref)
            .collect();
        let refs: Vec<IssueRef> = queued.iter().map(IssueRecord::issue_ref).collect();
        let titles: HashMap<IssueRef, String> = queued
            .iter()
            .map(|r| (r.issue_ref(), r.title.clone()))
            .collect();
        let filed: HashMap<IssueRef, String> = queued
            .iter()
            .filter_map(|r| {
                let f = r.preflight.filer.as_ref().filter(|f| f.is_agents())?;
                Some((r.issue_ref(), f.name.clone()))
            })
            .collect();
        let mut filer_out: HashMap<String, bool> = HashMap::new();
        let mut views = Views::load(&self.store, &refs).await?;
        let mut pass = Pass::default();
        let now = self.planner.clock.now_ms();
        let mut spent_out: HashMap<crate::domain::RepoName, bool> = HashMap::new();
        for issue in refs {
            if running >= limits.max_concurrent {
                break;
            }
            let in_repo = per_repo.entry(issue.repo.clone()).or_default();
            if *in_repo >= limits.max_per_repo {
                continue;
            }
            if limits.budget.any() {
                let out = match spent_out.get(&issue.repo) {
                    Some(out) => *out,
                    None => {
                        let day = crate::models::day_of(now);
                        let spent = self.store.model_spent(None, &issue.repo, &day).await?;
                        let out =
                            crate::models::day_spent(&limits.budget, &spent, &issue.repo).is_some();
                        spent_out.insert(issue.repo.clone(), out);
                        out
                    }
                };
                if out {
                    continue;
                }
            }
            if let Some(filer) = filed.get(&issue)
                && self.filer_spent(filer, &mut filer_out, now).await?
            {
                continue;
            }
            let paced =
                open_prs.get(&issue.repo).copied().unwrap_or(0) >= limits.max_open_prs_per_repo;
            if paced && !followup.contains(&issue) {
                continue;
            }
            let run_id = RunId::random();
            let title = titles.get(&issue).map_or("", String::as_str);
            let branch = crate::domain::run::branch_name(
                &limits.branch_template,
                issue.number,
                run_id.short(),
                title,
            );
            let event = Event::Admitted { run_id, branch };
            if let Some(decision) = views.decide(&issue, &event, &self.planner, now) {
                tracing::info!(%issue, run_id = ?decision.run.as_ref().map(|r| &r.id), "run admitted");
                pass.add(&issue, decision, &self.planner.policy);
                *in_repo += 1;
                running += 1;
            }
        }
        if pass.is_empty() {
            return Ok(());
        }
        pass.commit.records = views.changed_records();
        pass.commit.runs = views.changed_runs();
        // New run ids: durable before a container can be started for one.
        self.commit(pass, true).await
    }
}

impl Consumer {
    /// Whether `filer`'s day's budget (`filers.<name>.daily_usd`) is spent: its issues
    /// start no run today, a maintainer's do. Said in the log once a day.
    async fn filer_spent(
        &self,
        filer: &str,
        known: &mut HashMap<String, bool>,
        now: i64,
    ) -> anyhow::Result<bool> {
        if let Some(out) = known.get(filer) {
            return Ok(*out);
        }
        let Some(rule) = self.planner.policy.filers.rule(filer) else {
            return Ok(false);
        };
        let day = crate::models::day_of(now);
        let out = if rule.daily_usd > 0.0 {
            let used = crate::domain::filer::FilerDay {
                taken_before: true,
                spent_usd: self.store.filer_spent(filer, &day).await?,
                ..Default::default()
            };
            match crate::engine::decide::filer_limit(filer, rule, used, now) {
                Some((limit, _)) => {
                    if self.store.filer_told(filer, &day, &limit, now).await? {
                        tracing::warn!(
                            filer,
                            day,
                            limit,
                            "a filer's day is used up: its issues wait for the next day"
                        );
                    }
                    true
                }
                None => false,
            }
        } else {
            false
        };
        known.insert(filer.to_owned(), out);
        Ok(out)
    }
}

/// What decides a batch of events: pure, so that on SQLite it runs on the store's thread,
/// between the pass's reads and its commit.
#[derive(Clone)]
struct Planner {
    policy: Policy,
    clock: SharedClock,
    metrics: Option<Metrics>,
    traces: Traces,
}

impl Planner {
    /// Decides `input`'s events in order; returns the commit, fenced by `fence`, and the time
    /// to stamp it with. Every event read is consumed or set aside.
    fn plan(&self, input: PassInput, fence: Option<Fence>) -> (Commit, i64) {
        let mut views = Views {
            records: input.records,
            runs: input.runs,
            ..Views::default()
        };
        let mut pass = Pass::default();
        let now = self.clock.now_ms();
        for (stored, target) in &input.events {
            let (issue, event) = match (target, &stored.event) {
                (Some(issue), Ok(event)) => (issue, event),
                (_, Err(reason)) => {
                    self.set_aside(stored, reason, &mut pass);
                    continue;
                }
                (None, Ok(_)) => {
                    self.set_aside(stored, "the row names no valid issue", &mut pass);
                    continue;
                }
            };
            pass.commit.consumed.push(stored.seq);
            let span = tracing::info_span!(
                "decide",
                event = %stored.delivery_id,
                repo = %issue.repo,
                issue = issue.number,
            );
            if let Some(decision) = views.decide(issue, event, self, now) {
                span.in_scope(|| log_decision(event, &decision));
                pass.add(issue, decision, &self.policy);
            }
        }
        pass.commit.records = views.changed_records();
        pass.commit.runs = views.changed_runs();
        pass.commit.fence = fence;
        (pass.commit, self.clock.now_ms())
    }

    fn set_aside(&self, stored: &StoredEvent, reason: &str, pass: &mut Pass) {
        tracing::warn!(
            event = %stored.delivery_id,
            reason,
            "a stored event does not parse; set aside"
        );
        if let Some(m) = &self.metrics {
            m.events_set_aside.inc();
        }
        pass.commit.dead.push((stored.seq, reason.to_owned()));
    }
}

/// What one pass decided, before it is committed.
#[derive(Default)]
struct Pass {
    commit: Commit,
    decided: usize,
}

impl Pass {
    fn add(&mut self, issue: &IssueRef, decision: Decision, policy: &Policy) {
        self.decided += 1;
        // The store keeps keys as text: written once here, never read back into a key.
        self.commit
            .retract
            .extend(decision.retract.iter().map(ToString::to_string));
        self.commit.actions.extend(
            decision
                .actions
                .into_iter()
                .map(|p| new_action(issue, p, policy)),
        );
    }

    fn is_empty(&self) -> bool {
        self.decided == 0
    }
}

fn new_action(issue: &IssueRef, planned: Planned, policy: &Policy) -> NewAction {
    NewAction {
        key: planned.key.to_string(),
        issue: issue.clone(),
        kind: planned.action.kind().as_str().to_owned(),
        payload: serde_json::to_string(&planned.action).unwrap_or_default(),
        max_attempts: planned.action.max_attempts(policy.start_attempts),
        not_before_ms: planned.not_before_ms,
    }
}

/// The records and runs a pass reads and changes, applied in event order.
#[derive(Default)]
struct Views {
    records: HashMap<IssueRef, IssueRecord>,
    runs: HashMap<IssueRef, RunRecord>,
    changed: HashSet<IssueRef>,
    changed_runs: HashSet<IssueRef>,
}

impl Views {
    async fn load(store: &Store, issues: &[IssueRef]) -> anyhow::Result<Self> {
        let records = store
            .issues(issues)
            .await?
            .into_iter()
            .map(|r| (r.issue_ref(), r))
            .collect();
        let runs = store
            .latest_runs(issues)
            .await?
            .into_iter()
            .map(|r| (r.issue_ref(), r))
            .collect();
        Ok(Self {
            records,
            runs,
            ..Default::default()
        })
    }

    /// Decides `event` for `issue` and keeps what changed; sends the decision's span, the
    /// issue's root span when this is its first record, and a run's span as it ends.
    fn decide(
        &mut self,
        issue: &IssueRef,
        event: &Event,
        planner: &Planner,
        now: i64,
    ) -> Option<Decision> {
        let view = IssueView {
            issue,
            record: self.records.get(issue),
            run: self.runs.get(issue),
        };
        let decision = decide(&view, event, &planner.policy, now)?;
        trace(&planner.traces, &view, event, &decision, now);
        if let Some(m) = &planner.metrics {
            observe_forecast(m, view.run, &decision);
            observe_outcome(m, view.run, view.record, &decision);
        }
        if let Some(run) = &decision.run
            && self.runs.get(issue) != Some(run)
        {
            self.runs.insert(issue.clone(), run.clone());
            self.changed_runs.insert(issue.clone());
        }
        self.records.insert(issue.clone(), decision.record.clone());
        self.changed.insert(issue.clone());
        Some(decision)
    }

    fn changed_records(&mut self) -> Vec<IssueRecord> {
        self.changed
            .iter()
            .filter_map(|i| self.records.get(i).cloned())
            .collect()
    }

    fn changed_runs(&mut self) -> Vec<RunRecord> {
        self.changed_runs
            .iter()
            .filter_map(|i| self.runs.get(i).cloned())
            .collect()
    }
}

/// A first run that ends in this decision: its actual cost and wall time over the median its
/// GO comment forecast (`director_forecast_ratio`), so the forecast's error can be watched.
fn observe_forecast(metrics: &Metrics, before: Option<&RunRecord>, decision: &Decision) {
    let Some(run) = &decision.run else { return };
    let ended_now = run.ended_since(before);
    let Some(forecast) = decision.record.preflight.forecast.as_ref() else {
        return;
    };
    if !ended_now || run.followup.is_some() {
        return;
    }
    let repo = decision.record.repo.to_string();
    let cost = run.metered_cost_usd();
    if let (Some(cost), Some(median)) = (cost, forecast.cost_median_micros.filter(|m| *m > 0)) {
        metrics
            .forecast_ratio
            .with_label_values(&["cost", &repo])
            .observe(cost / (median as f64 / 1e6));
    }
    if let (Some(start), Some(end), Some(median)) = (
        run.started_at_ms,
        run.finished_at_ms,
        forecast.secs_median.filter(|m| *m > 0),
    ) {
        metrics
            .forecast_ratio
            .with_label_values(&["duration", &repo])
            .observe(((end - start) as f64 / 1000.0) / median as f64);
    }
}

/// A run that ends in this decision (its wall time and metered cost, by outcome), and a pull
/// request that ends or is found reverted: for Prometheus, the repository in the hidden label
/// only (a scrape sees the sum over the repositories it may see).
fn observe_outcome(
    metrics: &Metrics,
    before_run: Option<&RunRecord>,
    before: Option<&crate::domain::IssueRecord>,
    decision: &Decision,
) {
    let repo = decision.record.repo.to_string();
    if let Some(run) = &decision.run
        && run.ended_since(before_run)
    {
        let outcome = crate::domain::outcomes::run_outcome(run.state);
        if let (Some(start), Some(end)) = (run.started_at_ms, run.finished_at_ms) {
            metrics
                .run_duration
                .with_label_values(&[outcome, &repo])
                .observe(((end - start).max(0) as f64) / 1000.0);
        }
        if let Some(cost) = run.metered_cost_usd() {
            metrics
                .run_cost
                .with_label_values(&[outcome, &repo])
                .observe(cost);
        }
    }
    let was = before.and_then(|b| b.pr.as_ref());
    if let Some(pr) = &decision.record.pr {
        let same = was.filter(|w| w.number == pr.number);
        if pr.ended_at_ms.is_some() && same.is_none_or(|w| w.ended_at_ms.is_none()) {
            let end = if pr.state == crate::domain::PullState::Merged {
                "merged"
            } else {
                "closed"
            };
            metrics.prs.with_label_values(&[end, &repo]).inc();
        }
        if pr.reverted.is_some() && same.is_none_or(|w| w.reverted.is_none()) {
            metrics.prs.with_label_values(&["reverted", &repo]).inc();
        }
    }
}

/// The spans of one decision: the issue's root when it had no record, the decision, and the
/// run's when the decision ends it.
fn trace(traces: &Traces, before: &IssueView<'_>, event: &Event, decision: &Decision, now: i64) {
    if !traces.is_on() {
        return;
    }
    if before.record.is_none() {
        traces.issue(before.issue, now);
    }
    let kinds: Vec<&str> = decision
        .actions
        .iter()
        .map(|p| p.action.kind().as_str())
        .collect();
    let run = decision.run.as_ref();
    traces.decision(
        before.issue,
        &event_name(event),
        decision.record.lifecycle.as_str(),
        &kinds,
        run.map(|r| r.id.as_str()),
        now,
    );
    if let Some(run) = run
        && !run.state.is_active()
        && before
            .run
            .is_none_or(|was| was.id != run.id || was.state.is_active())
    {
        traces.run(run, now);
    }
}

/// What a decision's span calls its event: the kind, and for the forge's, its action
/// (`pull_request.closed`), kept to a short name of plain characters.
fn event_name(event: &Event) -> String {
    let kind = event.kind_str();
    let Event::Forge(forge) = event else {
        return kind.to_owned();
    };
    let action: String = forge
        .action
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(40)
        .collect();
    if action.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{action}")
    }
}

/// When a pass for deliveries woken at `now` may start, if not at once: [`GATHER`] after the
/// previous one `started`.
fn gathered_until(
    started: tokio::time::Instant,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let at = started + GATHER;
    (now < at).then_some(at)
}

fn log_decision(event: &Event, decision: &Decision) {
    let kinds: Vec<&str> = decision
        .actions
        .iter()
        .map(|p| p.action.kind().as_str())
        .collect();
    if kinds.is_empty() {
        tracing::debug!(event = event.kind_str(), state = %decision.record.lifecycle, "recorded");
        return;
    }
    tracing::info!(
        event = event.kind_str(),
        state = %decision.record.lifecycle,
        run = decision.run.as_ref().map(|r| r.state.as_str()).unwrap_or(""),
        actions = ?kinds,
        "decided"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_soon_after_the_last_waits_to_gather_and_one_after_a_quiet_spell_does_not() {
        let started = tokio::time::Instant::now();
        let soon = started + Duration::from_millis(1);
        assert_eq!(gathered_until(started, soon), Some(started + GATHER));
        assert_eq!(gathered_until(started, started + GATHER), None);
        let quiet = started + Duration::from_secs(1);
        assert_eq!(gathered_until(started, quiet), None);
    }
}
