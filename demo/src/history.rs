//! A made-up past for the demo's repository, so that its first GO comment shows a forecast (the
//! director forecasts a run from the finished runs it keeps: `docs/forecast.md`). The demo
//! writes these runs into its own scratch store before the director starts, as earlier runs
//! would have left them: finished first runs of `demo/widgets`, on issues the fake forge never
//! had, each with one metered model call (a run's call names no issue: its run does). They are
//! the demo's, and say so where they show: the demo prints that it made them up, their model is
//! `demo-seeded-past` (the outcomes page's "By model" table shows it) and their branches
//! `demo-seeded-past-N`.

use director::domain::{IssueRef, RepoName, RunId, RunRecord, RunState};
use director::models::{Metered, Provider};
use director::store::{Commit, Store};

/// Each earlier run: (its cost in dollars, its wall time in minutes). Six, one more than the
/// forecast needs to rest on this repository alone; their median is $0.31 and 5 minutes,
/// their 90th percentile $0.60 and 12 minutes.
pub const PAST_RUNS: [(f64, i64); 6] = [
    (0.22, 4),
    (0.31, 5),
    (0.18, 3),
    (0.60, 12),
    (0.35, 6),
    (0.42, 8),
];

/// The model name the seeded calls are metered under: never a real model's.
pub const SEEDED_MODEL: &str = "demo-seeded-past";

/// The first issue number of the seeded past: far above the demo's own issues.
const FIRST_ISSUE: u64 = 901;

/// Writes [`PAST_RUNS`] into `store`, as finished runs of `repo`, one a day over the days
/// before `now_ms` (within `store.retention_days`, so start-up pruning keeps them).
pub async fn seed(store: &Store, repo: &RepoName, now_ms: i64) -> anyhow::Result<()> {
    const DAY_MS: i64 = 86_400_000;
    let mut runs = Vec::new();
    for (n, (cost, minutes)) in PAST_RUNS.iter().enumerate() {
        let n = n as u64;
        let issue = IssueRef::new(repo.clone(), FIRST_ISSUE + n);
        // Ids the random ones could only meet by chance: `de5eed` and the run's number.
        let id = RunId::parse(&format!("de5eed{n:06x}"))?;
        let started = now_ms - (n as i64 + 1) * DAY_MS;
        let mut run = RunRecord::admitted(
            &issue,
            id.clone(),
            &format!("demo-seeded-past-{}", n + 1),
            started,
        );
        run.state = RunState::Succeeded;
        run.started_at_ms = Some(started);
        run.finished_at_ms = Some(started + minutes * 60_000);
        runs.push(run);
        store
            .record_model_usage(&Metered {
                run_id: Some(id),
                repo: repo.clone(),
                issue: None,
                provider: Provider::Openai,
                model: SEEDED_MODEL.into(),
                usage: Default::default(),
                cost_usd: Some(*cost),
                at_ms: started + 60_000,
            })
            .await?;
    }
    store
        .commit(
            &Commit {
                runs,
                ..Default::default()
            },
            now_ms,
        )
        .await
}
