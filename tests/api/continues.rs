//! Budgets that continue on a writer's word, on the real Docker engine: a confined run under
//! the example entrypoint spends its model budget through the model gateway and is stopped
//! `over_budget`, the entrypoint pushing what it wrote; the issue says what was spent and how
//! to go on. A reader's `/director continue` does nothing; one above
//! `budget.max_continue_usd` is answered once and changes nothing, as is one a comment states
//! after another command (one command per comment); a writer's starts a run on the same
//! branch that finds the first run's work, spends a budget of its own (the amount the writer
//! gave, not `budget.run_usd`), and adds to the repository's spend.

use director::domain::{IssueRef, Lifecycle, RunRecord, RunState};

use crate::egress::Network;
use crate::forge_helpers::{ForgeApp, READER, WRITER};
use crate::git::git_agent_image;
use crate::runs::{labelled, run_comments, spawn_runs, wait_ended};

/// A call of 1,000 tokens in and 100 out at $3 and $15 per million.
const CALL_USD: f64 = 0.0045;

struct Confined {
    t: ForgeApp,
    _provider: director_testkit::provider::FakeProvider,
    _llm: director_testkit::llm::FakeLlm,
    _network: Network,
    _git: tempfile::TempDir,
}

/// The director with confined runs of the budget agent under the example entrypoint, the
/// model behind `[models]`, a run budget of $0.008 (two calls cross it) and continues of at
/// most $0.05.
async fn confined() -> Confined {
    let provider = director_testkit::provider::FakeProvider::start();
    let network = Network(format!(
        "director-continue-test-{:08x}",
        rand::random::<u32>()
    ));
    let image = git_agent_image();
    let (name, url, key) = (
        network.0.clone(),
        provider.url.clone(),
        provider.key.clone(),
    );
    let (t, llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec![
            "/bin/sh".into(),
            "-c".into(),
            "AGENT_COMMAND='sh /budget-agent.sh' exec /bin/sh /director-entrypoint".into(),
        ];
        crate::egress::confine(s, &name);
        s.runner.stop_grace_secs = 15;
        crate::egress::behind_fake_anthropic(s, &url, &key);
        s.budget.run_usd = 0.008;
        s.budget.max_continue_usd = 0.05;
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    Confined {
        t,
        _provider: provider,
        _llm: llm,
        _network: network,
        _git: root,
    }
}

/// The director's answers to commands in the issue's thread.
async fn answers(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    t.app.wait_processed().await;
    answers_on(t, issue)
}

fn answers_on(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    t.forge
        .comments_on(issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:answer "))
        .map(|c| c.body)
        .collect()
}

/// The answers once there are at least `n` (waited for on the engine's sync points, with a
/// deadline), and whatever else is in hand is done.
async fn answers_at_least(t: &ForgeApp, issue: &IssueRef, n: usize) -> Vec<String> {
    t.app
        .wait_for(&format!("{n} answer(s) on {issue}"), || async {
            answers_on(t, issue).len() >= n
        })
        .await;
    answers(t, issue).await
}

/// What the repository spent today, as the store counts it for its budget.
async fn repo_spent(t: &ForgeApp) -> f64 {
    let day = director::models::day_of(director::clock::now_ms());
    t.app
        .store
        .spent_by_repo(&day)
        .await
        .expect("store")
        .into_iter()
        .find(|(repo, _)| *repo == t.repo.to_string())
        .map_or(0.0, |(_, usd)| usd)
}

fn log_of(run: &RunRecord) -> String {
    run.log_tail.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_writers_continue_goes_on_on_the_same_branch_with_a_budget_of_its_own() {
    let c = confined().await;
    let t = &c.t;
    let issue = labelled(t, "Spend and go on", "Write two parts.").await;

    // The first run: two calls cross its $0.008, the third is refused, the run is stopped
    // and the entrypoint pushes what it wrote.
    let record = wait_ended(t, &issue).await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    let first = runs[0].clone();
    let reports = run_comments(t, &issue);
    assert_eq!(
        record.lifecycle,
        Lifecycle::OverBudget,
        "{reports:?} {}",
        log_of(&first)
    );
    assert_eq!(first.state, RunState::OverBudget);
    let log = log_of(&first);
    assert!(log.contains("calls answered: 2"), "{log}");
    assert!(log.contains("429"), "{log}");
    assert!(log.contains("entrypoint: pushed"), "{log}");
    assert_eq!(
        t.forge
            .git_show(&t.repo, &first.branch, "part-one.txt")
            .as_deref(),
        Some("part one"),
        "the stopped run's work is on its branch"
    );
    assert!(
        t.forge.pulls_of(&t.repo).is_empty(),
        "a stopped run opens no pull request"
    );
    // The report says what was spent and how to go on.
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = &reports[0];
    assert!(report.contains("[budget]"), "{report}");
    // To the micro-dollar: the usage line rounds to cents ($0.01).
    assert!(
        report.contains("It spent $0.009 on model calls."),
        "what was spent: {report}"
    );
    assert!(
        report.contains(&format!("stays on branch `{}`", first.branch))
            && report.contains("`/director continue`")
            && report.contains("at most $0.05 (`budget.max_continue_usd`)"),
        "{report}"
    );
    let spent_first = repo_spent(t).await;
    assert!((spent_first - 2.0 * CALL_USD).abs() < 1e-9, "{spent_first}");

    // A reader's continue: nothing, not even an answer.
    t.forge.comment(READER, &issue, "/director continue").await;
    assert!(answers(t, &issue).await.is_empty());
    // Above `budget.max_continue_usd`: answered once with the reason, nothing changed.
    t.forge
        .comment(WRITER, &issue, "/director continue $1")
        .await;
    let said = answers_at_least(t, &issue, 1).await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("nothing changed")
            && said[0].contains("$1.00 is above `budget.max_continue_usd` ($0.05)"),
        "{said:?}"
    );
    let record = t.record(&issue).await.expect("known");
    assert_eq!(record.lifecycle, Lifecycle::OverBudget);
    assert_eq!(record.thread.continuation, None);
    assert_eq!(t.app.store.runs_of(&issue).await.expect("runs").len(), 1);
    // A scan reads the thread again: still one answer.
    t.scan().await;
    assert_eq!(answers(t, &issue).await.len(), 1);
    // A comment gives one command, its first: a continue after a cancel is not taken, and
    // the answer says so rather than dropping it unsaid.
    t.forge
        .comment(WRITER, &issue, "/director cancel\n/director continue $0.02")
        .await;
    let said = answers_at_least(t, &issue, 2).await;
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[1].contains("took `/director cancel`, its first. Not taken: `/director continue`"),
        "{said:?}"
    );
    let record = t.record(&issue).await.expect("known");
    assert_eq!(record.lifecycle, Lifecycle::OverBudget);
    assert_eq!(record.thread.continuation, None);

    // A writer's continue of $0.02 (within the $0.05): answered, and a run on the same
    // branch goes on from the first one's work with its own $0.02, not the $0.008 of
    // `budget.run_usd`: five calls are answered (the fifth crosses $0.02), the sixth refused.
    t.forge
        .comment(WRITER, &issue, "/director continue $0.02")
        .await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    let record = wait_ended(t, &issue).await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 2, "one follow-up");
    let next = runs[1].clone();
    let log = log_of(&next);
    assert_eq!(record.lifecycle, Lifecycle::OverBudget, "{log}");
    assert_eq!(next.branch, first.branch, "the same branch");
    let continued = next.continued.clone().expect("a continued run");
    assert_eq!(continued.from, first.id);
    assert!((continued.usd - 0.02).abs() < 1e-9, "{continued:?}");
    assert_eq!(continued.by, WRITER);
    assert!(log.contains("found part one on the branch"), "{log}");
    assert!(log.contains("calls answered: 5"), "its own budget: {log}");
    assert!(log.contains("entrypoint: pushed"), "{log}");
    for (file, text) in [("part-one.txt", "part one"), ("part-two.txt", "part two")] {
        assert_eq!(
            t.forge.git_show(&t.repo, &first.branch, file).as_deref(),
            Some(text),
            "{file} on the branch"
        );
    }
    let usage = t
        .app
        .store
        .run_usage(&next.id)
        .await
        .expect("store")
        .expect("metered");
    assert_eq!(usage.requests, 5);
    // Its spend adds to the repository's.
    let spent = repo_spent(t).await;
    assert!((spent - 7.0 * CALL_USD).abs() < 1e-9, "{spent}");
    t.app
        .wait_for_metric(r#"director_model_requests_refused_total{reason="budget"} 2"#)
        .await;
    let said = answers_at_least(t, &issue, 3).await;
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(
        said[2].contains("Continuing for @alice")
            && said[2].contains(&format!("run `{}`", first.id))
            && said[2].contains("a budget of its own, $0.02"),
        "{said:?}"
    );
    // Its report says again how to go on.
    let reports = run_comments(t, &issue);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        reports[1].contains("`/director continue`"),
        "{:?}",
        reports[1]
    );
    t.assert_contract();
}
