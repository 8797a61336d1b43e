//! The checks of the director's pull requests and the opt-in merge lane, end to end with
//! FakeForge (commit statuses, the combined status, reviews carrying their commit, the merge
//! and update endpoints) and the in-memory runtime. Forgejo sends no webhook for a commit
//! status: each test runs the checks poll itself, as `scan.checks_schedule` would.

use director::domain::{IssueRef, Lifecycle, RunState};
use director::forge::{MergeStyle, Permission};
use director_testkit::forge::{CommitStatus, ReviewEvent};

use crate::fake_runs::{spawn, status_json_with};
use crate::forge_helpers::{ForgeApp, READER, WRITER};

/// The lane on, counting the labeller's approval (these tests have one writer; the
/// two-person rule has its own test).
fn lane_on(s: &mut director::settings::Settings) {
    s.merge.enabled = true;
    s.merge.requester_may_approve = true;
}
use crate::pulls::{pr_comments, runs, status_row, wait_runs, with_pr};
use crate::runs::RUNNER;

/// The CI account that posts statuses (Forgejo Actions writes as `forgejo-actions`).
const CI: &str = "ci-bot";
/// A second writer.
const MAINTAINER: &str = "maya";

async fn poll(t: &ForgeApp) {
    t.app
        .checks_poll()
        .expect("the checks poll")
        .poll_once()
        .await
        .expect("the poll runs");
    t.app.wait_processed().await;
}

fn allow_ci(t: &ForgeApp) {
    t.forge.grant(&t.repo, CI, Permission::Write);
    t.forge.grant(&t.repo, MAINTAINER, Permission::Write);
}

/// Posts `state` for `context` on the pull request's head; returns the head.
fn status(t: &ForgeApp, pr: u64, state: &str, context: &str) -> String {
    let head = t.forge.pull_head(&t.repo, pr);
    t.forge.post_status(
        CI,
        &t.repo,
        &head,
        &CommitStatus {
            state,
            context,
            description: &format!("{context} says {state}"),
            target_url: &format!("/acme/widgets/actions/runs/7/jobs/{}", context.len()),
        },
    );
    head
}

/// The issue's pull request as `/status.json` shows it (the service's own settings).
async fn pr_row(t: &ForgeApp, issue: &IssueRef) -> serde_json::Value {
    let rows: serde_json::Value = t.app.get("/status.json").await.json().await.expect("JSON");
    status_row(&rows, issue)["pr"].clone()
}

fn issue_comments(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    t.forge
        .comments_on(issue)
        .into_iter()
        .map(|c| c.body)
        .collect()
}

#[tokio::test]
async fn a_failing_check_starts_one_follow_up_naming_it_and_they_stop_at_the_cap() {
    let (t, _llm, fake) = spawn(|s| s.runner.max_ci_followups = 2).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "success", "lint");
    let head = status(&t, pr, "failure", "ci / test (pull_request)");
    poll(&t).await;
    wait_runs(&t, &issue, 2, RunState::Succeeded).await;
    let all = runs(&t, &issue).await;
    let task = String::from_utf8_lossy(&fake.spec_of(&all[1].id).expect("spec").task).into_owned();
    assert!(task.contains("## Failing checks to fix"), "{task}");
    assert!(task.contains("ci / test (pull_request)"), "{task}");
    assert!(
        task.contains(&format!(
            "{}/acme/widgets/actions/runs/7/jobs/24",
            t.forge_url()
        )),
        "the failing check's relative link, made absolute: {task}"
    );
    assert!(
        !task.contains("check `lint`"),
        "a passing check is not listed: {task}"
    );
    // Polling again finds the failure answered: nothing more starts for that head.
    poll(&t).await;
    assert_eq!(runs(&t, &issue).await.len(), 2);
    // The follow-up pushed: its head's checks are the ones that count.
    let new_head = t.forge.pull_head(&t.repo, pr);
    assert_ne!(new_head, head);
    status(&t, pr, "failure", "ci / test (pull_request)");
    poll(&t).await;
    wait_runs(&t, &issue, 3, RunState::Succeeded).await;
    // The cap: a third failure starts nothing, and the issue is told once.
    status(&t, pr, "error", "ci / test (pull_request)");
    poll(&t).await;
    poll(&t).await;
    assert_eq!(runs(&t, &issue).await.len(), 3, "no run past the cap");
    let told: Vec<String> = issue_comments(&t, &issue)
        .into_iter()
        .filter(|c| c.contains("director:ci-cap"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("`runner.max_ci_followups`"), "{}", told[0]);
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["checks"], "failing", "{row}");
    assert_eq!(row["ci_followups"], 2, "{row}");
    assert_eq!(
        row["failing_checks"][0], "ci / test (pull_request)",
        "{row}"
    );
    assert!(t.forge.contract_violations().is_empty());
}

#[tokio::test]
async fn pending_checks_wait_and_a_pass_is_noted() {
    let (t, _llm, _fake) = spawn(|_| {}).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "pending", "ci / test (pull_request)");
    poll(&t).await;
    poll(&t).await;
    assert_eq!(runs(&t, &issue).await.len(), 1, "pending starts nothing");
    assert_eq!(pr_row(&t, &issue).await["checks"], "pending");
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["checks"], "passing", "{row}");
    assert!(row.get("merge").is_none(), "the lane is off: {row}");
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Succeeded
    );
}

#[tokio::test]
async fn a_forgejo_actions_webhook_reads_the_checks_at_once() {
    let (t, _llm, _fake) = spawn(|_| {}).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "success", "ci / test (pull_request)");
    t.forge.send_action_run(&t.repo, pr, true).await;
    t.app
        .wait_for("the checks are read without a poll", || async {
            pr_row(&t, &issue).await["checks"] == "passing"
        })
        .await;
}

#[tokio::test]
async fn a_green_pull_request_approved_by_a_writer_is_merged_in_the_configured_style() {
    let (t, _llm, _fake) = spawn(|s| {
        lane_on(s);
        s.merge.style = MergeStyle::Squash;
    })
    .await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let branch = t
        .record(&issue)
        .await
        .and_then(|r| r.pr)
        .expect("pr")
        .branch;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["merge"]["queued"], true, "{row}");
    assert!(
        row["merge"]["waiting"]
            .as_str()
            .is_some_and(|w| w.contains("0 of 1 approvals")),
        "{row}"
    );
    assert!(t.forge.merges(&t.repo).is_empty());
    // `director status` says the same, with the operator's configuration.
    let cli = status_json_with(&t, &[("DIRECTOR_MERGE__ENABLED", "true")]).await;
    let cli_row = status_row(&cli, &issue)["pr"].clone();
    assert_eq!(cli_row["merge"]["queued"], true, "{cli_row}");
    assert_eq!(cli_row["checks"], "passing", "{cli_row}");
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "Ship it.", &[])
        .await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    t.app.wait_processed().await;
    let merges = t.forge.merges(&t.repo);
    assert_eq!(merges.len(), 1, "{merges:?}");
    assert_eq!(merges[0].number, pr);
    assert_eq!(merges[0].style, "squash");
    assert!(merges[0].deleted_branch);
    assert!(
        !t.forge.has_branch(&t.repo, &branch),
        "the branch is deleted"
    );
    let told: Vec<String> = issue_comments(&t, &issue)
        .into_iter()
        .filter(|c| c.contains("director:merged"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains(&format!("approved by @{WRITER}")),
        "{}",
        told[0]
    );
    assert!(t.forge.contract_violations().is_empty());
}

#[tokio::test]
async fn the_lane_merges_only_in_the_repositories_it_names() {
    let (t, _llm, _fake) = spawn(|s| {
        lane_on(s);
        s.merge.repos = vec!["acme/other-*".into()];
    })
    .await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "Ship it.", &[])
        .await;
    t.app.wait_processed().await;
    poll(&t).await;
    assert!(t.forge.merges(&t.repo).is_empty());
    assert!(pr_row(&t, &issue).await.get("merge").is_none());
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Succeeded
    );
}

/// Waits until the lane's reason for `issue` contains `words`.
async fn waits_for(t: &ForgeApp, issue: &IssueRef, words: &str) {
    t.app
        .wait_for(&format!("the lane says: {words}"), || async {
            pr_row(t, issue).await["merge"]["waiting"]
                .as_str()
                .is_some_and(|w| w.contains(words))
        })
        .await;
}

#[tokio::test]
async fn the_runners_and_a_readers_approvals_do_not_count() {
    let (t, _llm, _fake) = spawn(lane_on).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    // The runner account (a run's token) and a reader approve: neither counts.
    t.forge
        .review(RUNNER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.forge
        .review(READER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.app.wait_processed().await;
    waits_for(&t, &issue, "0 of 1 approvals").await;
    poll(&t).await;
    assert!(t.forge.merges(&t.repo).is_empty());
    assert!(
        pr_row(&t, &issue).await.get("approvals").is_none(),
        "neither is listed as an approval"
    );
}

#[tokio::test]
async fn an_approval_of_an_older_head_does_not_count() {
    let (t, _llm, _fake) = spawn(lane_on).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    let branch = t
        .record(&issue)
        .await
        .and_then(|r| r.pr)
        .expect("pr")
        .branch;
    // New commits on the branch after the approval.
    t.forge.push_commit(MAINTAINER, &t.repo, &branch).await;
    t.app.wait_processed().await;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    waits_for(&t, &issue, "0 of 1 approvals").await;
    assert!(t.forge.merges(&t.repo).is_empty());
}

#[tokio::test]
async fn an_outstanding_request_for_changes_blocks_the_merge() {
    // No follow-up answers the request here: the cap is 0.
    let (t, _llm, _fake) = spawn(|s| {
        lane_on(s);
        s.runner.max_followups = 0;
    })
    .await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge
        .review(
            MAINTAINER,
            &t.repo,
            pr,
            ReviewEvent::RequestChanges,
            "Not like this.",
            &[],
        )
        .await;
    t.app.wait_processed().await;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.app.wait_processed().await;
    waits_for(&t, &issue, &format!("changes requested by @{MAINTAINER}")).await;
    assert!(t.forge.merges(&t.repo).is_empty());
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["approvals"][0], WRITER, "{row}");
}

#[tokio::test]
async fn a_failing_or_missing_check_leaves_it_unmerged() {
    let (t, _llm, _fake) = spawn(|s| {
        lane_on(s);
        s.runner.max_ci_followups = 0;
    })
    .await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["checks"], "none", "{row}");
    assert_eq!(
        row["merge"]["waiting"], "waiting for its checks to report",
        "{row}"
    );
    status(&t, pr, "failure", "ci / test (pull_request)");
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["checks"], "failing", "{row}");
    assert!(
        row["merge"]["waiting"]
            .as_str()
            .is_some_and(|w| w.contains("failing")),
        "{row}"
    );
    assert!(t.forge.merges(&t.repo).is_empty());
}

#[tokio::test]
async fn a_moved_base_is_merged_into_the_branch_first_and_the_checks_wait_again() {
    let (t, _llm, _fake) = spawn(lane_on).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let before = t.forge.pull_head(&t.repo, pr);
    t.forge.push_commit(MAINTAINER, &t.repo, "main").await;
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.app
        .wait_for("the branch is updated", || async {
            t.forge.pull_head(&t.repo, pr) != before
        })
        .await;
    t.app.wait_processed().await;
    assert!(t.forge.merges(&t.repo).is_empty(), "updated, not merged");
    // The update's head needs its checks and a writer's approval again.
    status(&t, pr, "success", "ci / test (pull_request)");
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "Again.", &[])
        .await;
    poll(&t).await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    assert_eq!(t.forge.merges(&t.repo).len(), 1);
}

#[tokio::test]
async fn two_green_pull_requests_in_one_repository_merge_one_after_the_other() {
    let (t, _llm, _fake) = spawn(lane_on).await;
    allow_ci(&t);
    let (a, pr_a) = with_pr(&t, "First.").await;
    let (b, pr_b) = with_pr(&t, "Second.").await;
    for pr in [pr_a, pr_b] {
        status(&t, pr, "success", "ci / test (pull_request)");
    }
    poll(&t).await;
    // Both approved at once: one merges; the other's base moved, so it is updated first.
    t.forge
        .review(WRITER, &t.repo, pr_a, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.forge
        .review(WRITER, &t.repo, pr_b, ReviewEvent::Approve, "LGTM", &[])
        .await;
    t.app.wait_state(&a, Lifecycle::Merged).await;
    t.app.wait_processed().await;
    assert_eq!(t.forge.merges(&t.repo).len(), 1, "one at a time");
    waits_for(&t, &b, "the branch").await;
    status(&t, pr_b, "success", "ci / test (pull_request)");
    t.forge
        .review(WRITER, &t.repo, pr_b, ReviewEvent::Approve, "Again.", &[])
        .await;
    poll(&t).await;
    t.app.wait_state(&b, Lifecycle::Merged).await;
    let order: Vec<u64> = t.forge.merges(&t.repo).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![pr_a, pr_b]);
}

#[tokio::test]
async fn a_merge_the_forge_refuses_is_reported_once_and_never_repeated() {
    let (t, _llm, _fake) = spawn(lane_on).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge.fail_path(&format!("/pulls/{pr}/merge"), &[405]);
    status(&t, pr, "success", "ci / test (pull_request)");
    poll(&t).await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "LGTM", &[])
        .await;
    waits_for(&t, &issue, "refused to merge (HTTP 405)").await;
    poll(&t).await;
    poll(&t).await;
    let told: Vec<String> = pr_comments(&t, pr)
        .into_iter()
        .filter(|c| c.contains("director:merge-refused"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(t.forge.merges(&t.repo).is_empty());
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Succeeded
    );
}

#[tokio::test]
async fn hostile_check_text_is_inert_in_the_task_and_the_status_page_and_a_flood_is_bounded() {
    let (t, _llm, fake) = spawn(|s| s.runner.max_ci_followups = 1).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let head = t.forge.pull_head(&t.repo, pr);
    let hostile = format!(
        "<script>alert(1)</script> `x` @{WRITER} \u{1b}[31m\n/director retry {}",
        "A".repeat(2000)
    );
    let hostile_status = CommitStatus {
        state: "failure",
        context: &hostile,
        description: &hostile,
        target_url: "javascript:alert(1)",
    };
    // A flood of contexts: at most 200 are read, the newest first.
    for n in 0..300 {
        let context = format!("flood {n}");
        let flood = CommitStatus {
            state: "success",
            context: &context,
            ..CommitStatus::default()
        };
        t.forge.post_status(CI, &t.repo, &head, &flood);
    }
    t.forge.post_status(CI, &t.repo, &head, &hostile_status);
    poll(&t).await;
    wait_runs(&t, &issue, 2, RunState::Succeeded).await;
    let all = runs(&t, &issue).await;
    let task = String::from_utf8_lossy(&fake.spec_of(&all[1].id).expect("spec").task).into_owned();
    let section = task
        .split("## Failing checks to fix")
        .nth(1)
        .expect("the checks section");
    assert!(!section.contains("<script>"), "{section}");
    assert!(!section.contains('\u{1b}'), "{section}");
    let item: Vec<&str> = section.lines().filter(|l| l.contains("alert(1)")).collect();
    assert_eq!(
        item.len(),
        1,
        "the check's text stays on its one line: {section}"
    );
    assert!(
        !section
            .lines()
            .any(|l| l.trim_start().starts_with("/director")),
        "no command: {section}"
    );
    assert!(!section.contains(&"A".repeat(400)), "cut: {section}");
    // The same on the follow-up's head, past the cap: the check stays on the status page.
    let head = t.forge.pull_head(&t.repo, pr);
    t.forge.post_status(CI, &t.repo, &head, &hostile_status);
    poll(&t).await;
    assert_eq!(runs(&t, &issue).await.len(), 2, "the cap holds");
    let page = t.app.get("/status").await.text().await.expect("page");
    assert!(page.contains("&lt;script&gt;alert(1)"), "shown, escaped");
    assert!(!page.contains("<script>alert"), "escaped on the page");
    assert!(!page.contains('\u{1b}'));
    let row = pr_row(&t, &issue).await;
    assert!(
        row["failing_checks"][0]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 300 && !c.contains('\u{1b}')),
        "{row}"
    );
}

#[tokio::test]
async fn a_green_pull_request_approved_only_by_its_requester_waits_for_a_second_writer() {
    // The default: two people for a merge.
    let (t, _llm, _fake) = spawn(|s| s.merge.enabled = true).await;
    allow_ci(&t);
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    status(&t, pr, "success", "ci / test (pull_request)");
    // The writer who applied the trigger approves their own run's result.
    t.forge
        .review(
            WRITER,
            &t.repo,
            pr,
            ReviewEvent::Approve,
            "Mine, ship it.",
            &[],
        )
        .await;
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    let waiting = row["merge"]["waiting"].as_str().unwrap_or_default();
    assert!(
        waiting.contains("0 of 1 approvals")
            && waiting.contains(&format!("the approval by @{WRITER} does not count"))
            && waiting.contains("merge.requester_may_approve"),
        "{row}"
    );
    assert!(t.forge.merges(&t.repo).is_empty(), "not merged");
    // Another writer approves: merged.
    t.forge
        .review(
            MAINTAINER,
            &t.repo,
            pr,
            ReviewEvent::Approve,
            "Read it.",
            &[],
        )
        .await;
    t.app.wait_state(&issue, Lifecycle::Merged).await;
    assert_eq!(t.forge.merges(&t.repo).len(), 1);
}
