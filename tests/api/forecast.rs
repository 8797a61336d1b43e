//! A pre-flight a maintainer can sign: the plan in the GO comment and the task, the forecast
//! from the finished runs the store keeps (seeded as earlier runs would leave them), and the
//! report setting the forecast against the run's actual cost and time. On FakeRuntime.

use director::domain::{IssueRef, Lifecycle, RunRecord, RunState};
use director::models::{Metered, Provider};

use crate::fake_runs::{labelled, reports, spawn, status_json};
use crate::forge_helpers::ForgeApp;

const PLANNED_GO: &str = "Context to front-load: src/cli.rs.\n\nSmall change.\n\nPlan:\n1. Add the `--verbose` flag in `src/cli.rs`.\n2. Print each step in `src/run.rs`.\n3. Test it in `tests/cli.rs`.\n\nGO";

/// Finished first runs in `repo`, one per `(cost in dollars, minutes)`, each with one metered
/// call, as the consumer and the model gateway would have written them, in the last day (old
/// usage rows are pruned at start-up, `store.retention_days`); and one corrupt row (it ended
/// before it started), never to be averaged in.
pub async fn seed_runs(t: &ForgeApp, repo: &str, runs: &[(f64, i64)]) {
    let store = &t.app.store;
    let now = director::clock::now_ms();
    let start = now - 86_400_000;
    // Run ids apart per repository, so two repositories can be seeded.
    let tag = repo
        .bytes()
        .fold(0u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let mut records = Vec::new();
    for (n, (cost, minutes)) in runs.iter().enumerate() {
        let issue: IssueRef = format!("{repo}#{}", 900 + n).parse().expect("ref");
        let id = crate::helpers::rid(&format!("5e{tag:02x}{n:08x}"));
        let mut run = RunRecord::admitted(&issue, id.clone(), "b", 1_000);
        run.state = RunState::Succeeded;
        run.started_at_ms = Some(start);
        run.finished_at_ms = Some(start + minutes * 60_000);
        records.push(run);
        store
            .record_model_usage(&Metered {
                run_id: Some(id),
                repo: repo.parse().expect("repo"),
                issue: None,
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5".into(),
                usage: Default::default(),
                cost_usd: Some(*cost),
                at_ms: start + 1_000,
            })
            .await
            .expect("usage");
    }
    let issue: IssueRef = format!("{repo}#999").parse().expect("ref");
    let mut bad = RunRecord::admitted(
        &issue,
        crate::helpers::rid(&format!("bad{tag:02x}0000000")),
        "b",
        1_000,
    );
    bad.state = RunState::Failed;
    bad.started_at_ms = Some(start + 50_000);
    bad.finished_at_ms = Some(start + 10_000);
    records.push(bad);
    store
        .commit(
            &director::store::Commit {
                runs: records,
                ..Default::default()
            },
            now,
        )
        .await
        .expect("seeded");
}

/// `runs` finished runs: run `n` cost `n` × $0.10 and took `n` minutes.
async fn seed_history(t: &ForgeApp, repo: &str, runs: u64) {
    let list: Vec<(f64, i64)> = (1..=runs).map(|n| (n as f64 / 10.0, n as i64)).collect();
    seed_runs(t, repo, &list).await;
}

#[tokio::test]
async fn a_go_shows_the_plan_and_a_forecast_from_the_repositorys_runs_and_the_report_the_actual() {
    let (t, llm, fake) = spawn(|_| {}).await;
    llm.always(PLANNED_GO);
    let repo = t.repo.to_string();
    seed_history(&t, &repo, 9).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;

    let go = t.preflight_comment(&issue);
    assert!(
        go.contains("1. Add the `--verbose` flag in `src/cli.rs`.\n2. Print each step in `src/run.rs`.\n3. Test it in `tests/cli.rs`."),
        "{go}"
    );
    // Nine runs of $0.10 .. $0.90 and 1 .. 9 minutes: the median $0.50, 5 min; the 90th
    // percentile $0.90, 9 min; the corrupt row left out and said so.
    assert!(
        go.contains("**Forecast:** $0.50 (median) to $0.90 (90th percentile), 5m 00s to 9m 00s; from 9 finished first runs in this repository; 1 impossible row(s) left out."),
        "{go}"
    );

    // The agent starts from the plan the maintainers saw.
    let run = t.app.store.runs_of(&issue).await.expect("runs").remove(0);
    let spec = fake.spec_of(&run.id).expect("the run's container");
    let task = String::from_utf8_lossy(&spec.task).into_owned();
    assert!(
        task.contains("## The plan the maintainers saw")
            && task.contains("2. Print each step in `src/run.rs`."),
        "{task}"
    );

    // The report sets the forecast against the actual; the status carries both.
    let report = reports(&t, &issue).join("\n");
    assert!(
        report.contains("Forecast $0.50–$0.90, 5m 00s–9m 00s (median to 90th percentile); actual"),
        "{report}"
    );
    let row = crate::pulls::status_row(&status_json(&t).await, &issue);
    assert_eq!(row["forecast"]["basis"], "repository", "{row}");
    assert_eq!(row["forecast"]["runs"], 9, "{row}");
    assert_eq!(row["forecast"]["cost_median_micros"], 500_000, "{row}");
    assert!(row["run"]["age_secs"].is_number(), "{row}");
    // The forecast's error, for Prometheus: one first run ended, its duration observed.
    let metrics = t
        .app
        .client
        .get(format!("{}/metrics", t.app.address))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("director_forecast_ratio_count{what=\"duration\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn too_few_runs_here_forecast_from_every_repository_and_none_say_no_history() {
    let (t, llm, _fake) = spawn(|_| {}).await;
    llm.always(PLANNED_GO);
    let first = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&first, Lifecycle::Succeeded).await;
    let go = t.preflight_comment(&first);
    assert!(
        go.contains("**Forecast:** no history yet: no finished run to forecast from."),
        "{go}"
    );
    // Another (public) repository's history: used, and said to be.
    t.forge.add_repo("acme/elsewhere");
    seed_history(&t, "acme/elsewhere", 6).await;
    let second = labelled(&t, "Add --quiet", "Print less.").await;
    t.app.wait_state(&second, Lifecycle::Succeeded).await;
    let go = t.preflight_comment(&second);
    assert!(
        go.contains("in this and the public repositories (this one has 1, fewer than 5)"),
        "{go}"
    );
}

#[tokio::test]
async fn a_go_without_a_plan_says_so_and_still_runs() {
    let (t, _llm, fake) = spawn(|_| {}).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let go = t.preflight_comment(&issue);
    assert!(go.contains("**The plan:** no plan given."), "{go}");
    let run = t.app.store.runs_of(&issue).await.expect("runs").remove(0);
    let task = String::from_utf8_lossy(&fake.spec_of(&run.id).expect("spec").task).into_owned();
    assert!(!task.contains("## The plan the maintainers saw"), "{task}");
}

#[tokio::test]
async fn a_public_repositorys_forecast_never_rests_on_a_private_repositorys_runs() {
    let (t, llm, _fake) = spawn(|_| {}).await;
    llm.always(PLANNED_GO);
    // A private repository's runs: $7.00 .. $7.50, 41 .. 46 minutes, which a reader of the
    // public repository must not learn from its GO comment.
    let secret = t.forge.add_repo("acme/secret");
    t.forge.make_private(&secret);
    let runs: Vec<(f64, i64)> = (0..6).map(|n| (7.0 + n as f64 / 10.0, 41 + n)).collect();
    seed_runs(&t, "acme/secret", &runs).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let go = t.preflight_comment(&issue);
    assert!(
        go.contains("**Forecast:** no history yet: no finished run to forecast from."),
        "{go}"
    );
    assert!(!go.contains("$7."), "{go}");
    // A public repository's same history may be quoted.
    t.forge.add_repo("acme/open");
    seed_runs(&t, "acme/open", &runs).await;
    let second = labelled(&t, "Add --quiet", "Print less.").await;
    t.app.wait_state(&second, Lifecycle::Succeeded).await;
    let go = t.preflight_comment(&second);
    assert!(go.contains("$7.20 (median)"), "{go}");
}
