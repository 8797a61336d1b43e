//! What the agents delivered: `/status/outcomes` (in headless Chromium), `director report`
//! (table, JSON, CSV) over a store seeded as the director writes it, the figures exactly what
//! the seed implies; private repositories only with the status token; the revert check.

use director::domain::{
    IssueRecord, IssueRef, Judgement, Lifecycle, PullRecord, PullState, RunRecord, RunState,
};
use director::models::{Metered, Provider};
use director::settings::Secret;
use director_testkit::forge::ReviewEvent;

use crate::fake_runs::spawn;
use crate::forge_helpers::{ForgeApp, WRITER};
use crate::pulls::with_pr;

use crate::status_page::TOKEN;
const H: i64 = 3_600_000;
const D: i64 = 24 * H;

fn issue_ref(s: &str) -> IssueRef {
    s.parse().expect("a reference")
}

/// A record as the consumer leaves it: picked up at `picked`, judged `verdict`, with its
/// pull request (opened, ended) when it has one.
fn record(
    r: &str,
    verdict: Judgement,
    picked: i64,
    pr: Option<(PullState, i64, Option<i64>, u32)>,
) -> IssueRecord {
    let mut rec = IssueRecord::new(&issue_ref(r), picked);
    rec.lifecycle = Lifecycle::Queued;
    rec.preflight.verdict = Some(verdict);
    rec.preflight.picked_at_ms = Some(picked);
    if let Some((state, opened, ended, followups)) = pr {
        let mut p = PullRecord::opened(rec.number + 100, "director-issue");
        p.state = state;
        p.opened_at_ms = Some(opened);
        p.ended_at_ms = ended;
        p.followups = followups;
        rec.pr = Some(p);
        rec.lifecycle = match state {
            PullState::Merged => Lifecycle::Merged,
            PullState::Closed => Lifecycle::PrClosed,
            PullState::Open => Lifecycle::Succeeded,
        };
    }
    rec
}

/// A run of `r` (its id, how it ended, when it started, what it cost, whether it opened the
/// pull request) as the consumer records it, its cost metered by the gateway.
type SeedRun<'a> = (&'a str, &'a str, RunState, i64, f64, bool);

async fn run(t: &ForgeApp, runs: &mut Vec<RunRecord>, seed: SeedRun<'_>) {
    let (r, id, state, started, cost, opened_pr) = seed;
    let issue = issue_ref(r);
    let mut run = RunRecord::admitted(&issue, crate::helpers::rid(id), "director-issue", started);
    run.state = state;
    run.started_at_ms = Some(started);
    run.finished_at_ms = Some(started + H);
    if opened_pr {
        run.pr_number = Some(issue.number + 100);
    }
    runs.push(run);
    t.app
        .store
        .record_model_usage(&Metered {
            run_id: Some(crate::helpers::rid(id)),
            repo: issue.repo.clone(),
            issue: None,
            provider: Provider::Anthropic,
            model: "claude-sonnet-4-5".into(),
            usage: Default::default(),
            cost_usd: Some(cost),
            at_ms: started + 60_000,
        })
        .await
        .expect("usage");
}

/// A few weeks of work in three repositories: `acme/widgets` (watched, public),
/// `acme/secret` (private), `acme/retired` (no longer watched), and one merge too old to
/// count.
async fn seeded() -> (ForgeApp, i64) {
    let t = ForgeApp::spawn_with(|s| {
        s.status.token = Secret::new(TOKEN);
        s.scan.repos.push("acme/secret".parse().expect("repo"));
    })
    .await;
    let secret = t.forge.add_repo("acme/secret");
    t.forge.make_private(&secret);
    t.forge.add_repo("acme/retired");
    let now = director::clock::now_ms();
    let records = vec![
        record(
            "acme/widgets#1",
            Judgement::Go,
            now - 5 * D,
            Some((PullState::Merged, now - 5 * D + 2 * H, Some(now - 4 * D), 1)),
        ),
        record(
            "acme/widgets#2",
            Judgement::Go,
            now - 3 * D,
            Some((PullState::Closed, now - 3 * D + 4 * H, Some(now - 2 * D), 0)),
        ),
        record("acme/widgets#3", Judgement::NoGo, now - 2 * D, None),
        record("acme/widgets#4", Judgement::NeedsInfo, now - D, None),
        record("acme/widgets#5", Judgement::Go, now - D, None),
        record(
            "acme/widgets#9",
            Judgement::Go,
            now - 40 * D,
            Some((PullState::Merged, now - 40 * D, Some(now - 39 * D), 0)),
        ),
        record(
            "acme/secret#1",
            Judgement::Go,
            now - 6 * D,
            Some((
                PullState::Merged,
                now - 6 * D + H,
                Some(now - 6 * D + 3 * H),
                0,
            )),
        ),
        record("acme/retired#1", Judgement::WrongRepo, now - 10 * D, None),
    ];
    let mut runs = Vec::new();
    run(
        &t,
        &mut runs,
        (
            "acme/widgets#1",
            "0a0000000001",
            RunState::Succeeded,
            now - 5 * D + H,
            1.5,
            true,
        ),
    )
    .await;
    run(
        &t,
        &mut runs,
        (
            "acme/widgets#2",
            "0a0000000003",
            RunState::Succeeded,
            now - 3 * D + H,
            2.0,
            true,
        ),
    )
    .await;
    run(
        &t,
        &mut runs,
        (
            "acme/widgets#5",
            "0a0000000004",
            RunState::TimedOut,
            now - D + H,
            0.25,
            false,
        ),
    )
    .await;
    run(
        &t,
        &mut runs,
        (
            "acme/secret#1",
            "0a0000000005",
            RunState::Succeeded,
            now - 6 * D,
            1.0,
            true,
        ),
    )
    .await;
    run(
        &t,
        &mut runs,
        (
            "acme/widgets#9",
            "0a0000000009",
            RunState::Succeeded,
            now - 40 * D,
            9.0,
            true,
        ),
    )
    .await;
    t.app
        .store
        .commit(
            &director::store::Commit {
                records,
                runs,
                ..Default::default()
            },
            now,
        )
        .await
        .expect("seeded");
    // The follow-up on widgets#1 (a second run of the same issue, after the first ended).
    let mut followup = Vec::new();
    run(
        &t,
        &mut followup,
        (
            "acme/widgets#1",
            "0a0000000002",
            RunState::Succeeded,
            now - 4 * D - 6 * H,
            0.5,
            false,
        ),
    )
    .await;
    t.app
        .store
        .commit(
            &director::store::Commit {
                runs: followup,
                ..Default::default()
            },
            now,
        )
        .await
        .expect("seeded");
    // The pre-flight's own call on widgets#1.
    t.app
        .store
        .record_model_usage(&Metered {
            run_id: None,
            repo: "acme/widgets".parse().expect("repo"),
            issue: Some(1),
            provider: Provider::Anthropic,
            model: "claude-sonnet-4-5".into(),
            usage: Default::default(),
            cost_usd: Some(0.05),
            at_ms: now - 5 * D,
        })
        .await
        .expect("usage");
    (t, now)
}

fn report(t: &ForgeApp, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .arg("report")
        .args(args)
        .env("DIRECTOR_STORE__URL", t.app.db_url())
        .output()
        .expect("report runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_report_gives_exactly_the_figures_the_seed_implies_as_json_csv_and_a_table() {
    let (t, _) = seeded().await;
    let json: serde_json::Value =
        serde_json::from_str(&report(&t, &["--since", "30d", "--format", "json"])).expect("JSON");
    let all = &json["total"];
    let n = |k: &str| all[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        [
            n("picked_up"),
            n("go"),
            n("no_go"),
            n("wrong_repo"),
            n("needs_info")
        ],
        [7, 4, 1, 1, 1],
        "{all}"
    );
    assert_eq!(
        [n("runs_started"), n("runs_timed_out"), n("runs_failed")],
        [5, 1, 0]
    );
    assert_eq!(
        [n("prs_opened"), n("merged"), n("closed_unmerged")],
        [3, 2, 1]
    );
    let f = |k: &str| all[k].as_f64().unwrap_or(f64::NAN);
    assert!((f("merge_rate") - 2.0 / 3.0).abs() < 1e-9, "{all}");
    assert!((f("cost_usd") - 5.30).abs() < 1e-9, "{all}");
    // widgets#1: 1.5 + 0.5 + its pre-flight 0.05; secret#1: 1.0; over two merges.
    assert!((f("cost_per_merged_usd") - 1.525).abs() < 1e-9, "{all}");
    assert!((f("followups_per_merged") - 0.5).abs() < 1e-9, "{all}");
    assert_eq!(all["label_to_pr"]["p50"], 7200.0);
    assert_eq!(all["label_to_pr"]["p90"], 14400.0);
    assert_eq!(all["pr_to_merge"]["p50"], 7200.0);
    assert_eq!(all["pr_to_merge"]["p90"], 79200.0);
    assert_eq!(json["repos"]["acme/secret"]["merged"], 1);
    // By model: the window's six calls (five runs', one pre-flight's), $5.30.
    let model = &json["models"]["claude-sonnet-4-5"];
    assert_eq!(model["calls"], 6, "{model}");
    assert!((model["cost_usd"].as_f64().unwrap_or(0.0) - 5.30).abs() < 1e-9);
    let days = json["daily"].as_array().map_or(0, Vec::len);
    assert!(
        (31..=32).contains(&days),
        "every UTC day of the window: {days}"
    );
    // One repository, as CSV: the header, the whole, the repository.
    let csv = report(&t, &["--repo", "acme/widgets", "--format", "csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(lines[0].starts_with("group,name,picked_up,go,no_go"));
    // Five picked up, three GO, one NO-GO, one NEEDS-INFO; four runs (a follow-up among
    // them), one timed out; two pull requests, one merged, one closed; $4.30, of which
    // $2.05 went to the one merge; 2 h / 4 h to a pull request, 22 h to the merge.
    assert_eq!(
        lines[1], "all,,5,3,1,0,1,4,0,1,0,0,2,1,1,0,0.5,4.3,2.05,7200,14400,79200,79200,1",
        "{csv}"
    );
    assert!(lines[2].starts_with("repo,acme/widgets,5,"));
    // By agent, what runs did (issues are not an agent's).
    assert!(lines[3].starts_with("agent,default,0,0,0,0,0,4,"), "{csv}");
    let table = report(&t, &["--since", "7d"]);
    assert!(table.contains("Outcomes of the last 7 days") && table.contains("merge rate"));
    // Bad input: a clear error, exit 2.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["report", "--since", "forever"])
        .env("DIRECTOR_STORE__URL", t.app.db_url())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a number of days"));
}

#[tokio::test]
async fn the_outcomes_page_draws_its_charts_with_tables_and_hides_private_repositories() {
    let (t, _) = seeded().await;
    let anonymous = t
        .app
        .get("/status/outcomes?days=30")
        .await
        .text()
        .await
        .expect("the page");
    assert!(
        !anonymous.contains("acme/secret"),
        "a private repository without the token"
    );
    assert!(anonymous.contains("Private repositories are not counted"));
    assert!(anonymous.contains("acme/retired (no longer watched)"));
    assert!(!anonymous.contains("<script"));
    let status = t
        .app
        .get("/status")
        .await
        .text()
        .await
        .expect("the status page");
    assert!(
        status.contains("href=\"/status/outcomes\""),
        "linked from /status"
    );

    let (proxy, handle) = crate::status_page::with_token(t.app.address.clone());
    let url = format!("{proxy}/status/outcomes?days=30");
    let dom = crate::status_page::chromium(&url, None).await;
    assert!(dom.contains("acme/secret"), "with the token");
    assert!(dom.contains("By model") && dom.contains("claude-sonnet-4-5"));
    // Kept as a test artefact beside the screenshot: the whole page, charts first.
    let kept = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("outcomes-page.html");
    std::fs::write(&kept, &dom).expect("kept");
    for element in [
        "aria-labelledby=\"runs-title\"",
        "aria-labelledby=\"cost-title\"",
        "aria-labelledby=\"merge-title\"",
        "class=\"o-succeeded\"",
        "class=\"o-timed_out\"",
        "class=\"merges\"",
        "class=\"merge\"",
        "class=\"x-label\"",
        "class=\"y-label\"",
    ] {
        assert!(dom.contains(element), "{element} in the charts");
    }
    // The tables beneath hold the chart's numbers: the merge rate, the two merges' hours.
    assert!(
        dom.contains("67%") && dom.contains("22.0") && dom.contains("2.0"),
        "{dom}"
    );
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("outcomes-page.png");
    crate::status_page::chromium(&url, Some(&shot)).await;
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000);
    handle.stop(false).await;
}

#[tokio::test]
async fn an_empty_store_shows_an_empty_state_not_an_error() {
    let t = ForgeApp::spawn().await;
    let resp = t.app.get("/status/outcomes?days=7").await;
    assert_eq!(resp.status(), 200);
    let page = resp.text().await.expect("the page");
    assert!(page.contains("No runs in the last 7 days"), "{page}");
    let json: serde_json::Value =
        serde_json::from_str(&report(&t, &["--format", "json"])).expect("JSON");
    assert_eq!(json["total"]["merge_rate"], serde_json::Value::Null);
    assert_eq!(
        json["total"]["cost_per_merged_usd"],
        serde_json::Value::Null
    );
}

#[tokio::test]
async fn a_revert_on_the_base_marks_the_merge_reverted_once_and_says_so_once() {
    let (t, _llm, _fake) = spawn(|s| s.merge.enabled = false).await;
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge
        .review("maya", &t.repo, pr, ReviewEvent::Comment, "fine", &[])
        .await;
    t.forge.merge_pull(WRITER, &t.repo, pr).await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    let merged = t.forge.pull_head(&t.repo, pr);
    let reverts = t
        .app
        .checks_poll()
        .and_then(|p| p.reverts.clone())
        .expect("the revert check");
    // Nothing reverted yet: one list call today, none again the same day.
    assert_eq!(reverts.check_once().await.expect("a pass"), 0);
    // A real revert on the base's first-parent line: it deletes the file the merge added.
    let revert = t
        .forge
        .push_change(
            "maya",
            &t.repo,
            "main",
            &format!("Revert \"Add --verbose\"\n\nThis reverts commit {merged}.\n"),
            &[("agent.txt", None)],
        )
        .await;
    assert_eq!(
        reverts.check_once().await.expect("a pass"),
        0,
        "checked today already"
    );
    assert_eq!(t.calls_to("GET", "/commits"), 1, "one list call a day");
    // The next day: found, kept once, said once, also when looked for again.
    let key = format!("revert-check:{}:main", t.repo);
    let kept = t.app.store.meta(&key).await.expect("meta").expect("kept");
    let (_, head) = kept.split_once(' ').expect("day and head");
    t.app
        .store
        .set_meta(&key, &format!("2000-01-01 {head}"))
        .await
        .expect("meta");
    assert_eq!(reverts.check_once().await.expect("a pass"), 1);
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("the record");
    let kept = record.pr.and_then(|p| p.reverted).expect("reverted");
    assert_eq!(kept.sha, revert);
    t.app
        .store
        .set_meta(&key, "2000-01-01 ")
        .await
        .expect("meta");
    assert_eq!(
        reverts.check_once().await.expect("a pass"),
        0,
        "a reverted merge is watched no more"
    );
    t.app.wait_processed().await;
    let said = t.forge.comments_saying(&issue, "was reverted");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains(&revert[..12]));
    let json: serde_json::Value =
        serde_json::from_str(&report(&t, &["--format", "json"])).expect("JSON");
    assert_eq!(json["total"]["reverted"], 1);
    // For Prometheus: the run's duration by outcome, the merge and the revert, once each,
    // with no repository label.
    for line in [
        "director_run_duration_seconds_count{outcome=\"succeeded\"} 1",
        "director_prs_total{end=\"merged\"} 1",
        "director_prs_total{end=\"reverted\"} 1",
    ] {
        t.app.wait_for_metric(line).await;
    }
}

/// A merged pull request of the director's, its merge commit and the revert check.
async fn merged_pr(
    t: &ForgeApp,
) -> (
    IssueRef,
    String,
    std::sync::Arc<director::engine::reverts::RevertCheck>,
) {
    let (issue, pr) = with_pr(t, "Print each step.").await;
    t.forge.merge_pull(WRITER, &t.repo, pr).await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    let merged = t.forge.pull_head(&t.repo, pr);
    let reverts = t
        .app
        .checks_poll()
        .and_then(|p| p.reverts.clone())
        .expect("the revert check");
    assert_eq!(reverts.check_once().await.expect("a pass"), 0);
    (issue, merged, reverts)
}

/// Makes the revert check's next pass a new day's, from the head it saw last.
async fn next_day(t: &ForgeApp) {
    let key = format!("revert-check:{}:main", t.repo);
    let kept = t.app.store.meta(&key).await.expect("meta").expect("kept");
    let (_, head) = kept.split_once(' ').expect("day and head");
    t.app
        .store
        .set_meta(&key, &format!("2000-01-01 {head}"))
        .await
        .expect("meta");
}

#[tokio::test]
async fn a_revert_message_in_a_merged_branch_is_not_a_revert() {
    let (t, _llm, _fake) = spawn(|s| s.merge.enabled = false).await;
    let (issue, merged, reverts) = merged_pr(&t).await;
    // Anyone's pull request: its first commit says (and even does) the revert, its second
    // puts the file back as the merge left it and tidies the readme; it is merged with a
    // merge commit.
    t.forge.create_branch(&t.repo, "tidy", "main");
    let claimed = format!("Tidy the readme\n\nThis reverts commit {merged}.\n");
    t.forge
        .push_change("mallory", &t.repo, "tidy", &claimed, &[("agent.txt", None)])
        .await;
    t.forge
        .push_change(
            "mallory",
            &t.repo,
            "tidy",
            "Put it back",
            &[
                ("agent.txt", Some(b"hello\n")),
                ("README.md", Some(b"tidy\n")),
            ],
        )
        .await;
    t.forge
        .merge_branch(&t.repo, "main", "tidy", "Merge pull request 'Tidy' (#9)");
    next_day(&t).await;
    assert_eq!(
        reverts.check_once().await.expect("a pass"),
        0,
        "a message in a merged branch's commit is not a revert"
    );
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("the record");
    assert!(record.pr.and_then(|p| p.reverted).is_none());
    // A revert pull request merged the same way is one: the merge commit undoes the merge.
    t.forge.create_branch(&t.repo, "revert", "main");
    let revert = format!("Revert \"Add --verbose\"\n\nThis reverts commit {merged}.\n");
    t.forge
        .push_change("maya", &t.repo, "revert", &revert, &[("agent.txt", None)])
        .await;
    let merge = t.forge.merge_branch(
        &t.repo,
        "main",
        "revert",
        "Merge pull request 'Revert' (#10)",
    );
    next_day(&t).await;
    assert_eq!(reverts.check_once().await.expect("a pass"), 1);
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("the record");
    assert_eq!(
        record.pr.and_then(|p| p.reverted).expect("reverted").sha,
        merge
    );
}

#[tokio::test]
async fn a_revert_message_on_a_change_that_does_not_undo_the_merge_is_not_a_revert() {
    let (t, _llm, _fake) = spawn(|s| s.merge.enabled = false).await;
    let (issue, merged, reverts) = merged_pr(&t).await;
    // On the base itself, naming the merge, but the file it added is changed, not removed.
    t.forge
        .push_change(
            "maya",
            &t.repo,
            "main",
            &format!("Revert \"Add --verbose\"\n\nThis reverts commit {merged}.\n"),
            &[("agent.txt", Some(b"other\n"))],
        )
        .await;
    next_day(&t).await;
    assert_eq!(reverts.check_once().await.expect("a pass"), 0);
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("the record");
    assert!(record.pr.and_then(|p| p.reverted).is_none());
    assert!(t.forge.comments_saying(&issue, "was reverted").is_empty());
}

/// `/metrics` without the token, as anyone who can reach it.
async fn scrape(t: &ForgeApp, token: Option<&str>) -> String {
    let mut req = t.app.client.get(format!("{}/metrics", t.app.address));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("text")
}

#[tokio::test]
async fn an_anonymous_scrape_sees_no_aggregate_fed_by_a_private_repository() {
    let (t, _llm, _fake) = spawn(|s| s.status.token = Secret::new(TOKEN)).await;
    t.forge.make_private(&t.repo);
    let issue = crate::fake_runs::labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    // With the token: the private repository's run and verdict are in the aggregates.
    let full = scrape(&t, Some(TOKEN)).await;
    for line in [
        "director_run_duration_seconds_count{outcome=\"succeeded\"} 1",
        "director_preflight_verdicts_total{outcome=\"go\"} 1",
        "director_preflight_provider_seconds_count 1",
    ] {
        assert!(full.contains(line), "{line}\n{full}");
    }
    assert!(!full.contains("of_repo"), "the hidden label is never shown");
    // Without it: none of them moved, and nothing names the repository.
    let anonymous = scrape(&t, None).await;
    assert!(anonymous.contains("director_store_up 1"), "{anonymous}");
    for family in [
        "director_run_duration_seconds",
        "director_run_cost_usd",
        "director_preflight_verdicts_total",
        "director_preflight_provider_seconds",
        "director_prs_total",
    ] {
        assert!(
            !anonymous.lines().any(|l| l.starts_with(family)),
            "{family}\n{anonymous}"
        );
    }
    assert!(!anonymous.contains(&t.repo.to_string()), "{anonymous}");
}

#[tokio::test]
async fn a_flood_of_anonymous_outcomes_requests_computes_the_page_once_and_intake_goes_on() {
    use futures_util::StreamExt;
    let (t, _) = seeded().await;
    let before = t.app.stored_deliveries().await;
    // 300 anonymous requests, 50 at a time, while issues are opened (each a webhook).
    let flood = futures_util::stream::iter(0..300)
        .map(|_| async {
            let resp = t.app.get("/status/outcomes?days=90").await;
            (resp.status().as_u16(), resp.text().await.expect("the page"))
        })
        .buffer_unordered(50)
        .collect::<Vec<_>>();
    let intake = async {
        for n in 0..5 {
            t.forge
                .open_issue(&t.repo, "reporter", &format!("During the flood {n}"), "b")
                .await;
        }
    };
    let (pages, ()) = tokio::join!(flood, intake);
    assert!(pages.iter().all(|(status, _)| *status == 200));
    assert!(
        pages.iter().all(|(_, page)| *page == pages[0].1),
        "one page"
    );
    assert!(
        !pages[0].1.contains("acme/secret"),
        "still public ones only"
    );
    crate::helpers::wait_until("the webhooks stored", || async {
        t.app.stored_deliveries().await >= before + 5
    })
    .await;
    // One computation served them all (one interval), the store read once for the page.
    let metrics = scrape(&t, None).await;
    assert!(
        metrics.contains("director_outcomes_pages_computed_total 1\n"),
        "{metrics}"
    );
}
