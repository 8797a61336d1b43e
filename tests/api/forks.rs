//! Runs that push to the runner's fork (`runner.branch_home = "fork"`), end to end with
//! FakeForge's forks and its model of Forgejo Actions: the pull request comes from the fork,
//! opened by the runner, so its workflow runs wait for a maintainer's approval and never get
//! the repository's secrets; CI answers push to the same fork branch; the merge lane needs a
//! second writer; a runner that can write, or a repository that only looks like a fork, is
//! refused with the reason.

use director::domain::{IssueRef, Lifecycle, RunState};
use director::forge::Permission;
use director::settings::BranchHome;
use director_testkit::forge::ReviewEvent;
use director_testkit::llm::FakeLlm;

use crate::fake_runs::{labelled, spawn};
use crate::forge_helpers::{ForgeApp, WRITER};
use crate::pulls::{runs, status_row, wait_runs, with_pr};
use crate::runs::RUNNER;

/// A second writer, who reads the diff and approves.
const MAINTAINER: &str = "maya";

/// Fork mode, the runner a reader (as it must be), Actions on.
async fn spawn_forks(
    configure: impl FnOnce(&mut director::settings::Settings),
) -> (ForgeApp, FakeLlm) {
    let (t, llm, _fake) = spawn(|s| {
        s.runner.branch_home = BranchHome::Fork;
        configure(s);
    })
    .await;
    t.forge.grant(&t.repo, RUNNER, Permission::Read);
    t.forge.grant(&t.repo, MAINTAINER, Permission::Write);
    t.forge.enable_actions(&t.repo);
    (t, llm)
}

/// The runner's fork of `acme/widgets`.
fn fork() -> director::domain::RepoName {
    format!("{RUNNER}/widgets").parse().expect("a name")
}

async fn poll(t: &ForgeApp) {
    t.app
        .checks_poll()
        .expect("the checks poll")
        .poll_once()
        .await
        .expect("the poll runs");
    t.app.wait_processed().await;
}

async fn pr_row(t: &ForgeApp, issue: &IssueRef) -> serde_json::Value {
    let rows: serde_json::Value = t.app.get("/status.json").await.json().await.expect("JSON");
    status_row(&rows, issue)["pr"].clone()
}

/// The bodies of the runner's token mints.
fn mints(t: &ForgeApp) -> Vec<serde_json::Value> {
    t.forge
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.path.ends_with(&format!("/users/{RUNNER}/tokens")))
        .filter_map(|c| c.body)
        .collect()
}

fn issue_comments(t: &ForgeApp, issue: &IssueRef) -> String {
    t.forge
        .comments_on(issue)
        .into_iter()
        .map(|c| c.body)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test]
async fn a_go_issue_ends_in_a_pull_request_from_the_runners_fork_whose_checks_wait_for_a_maintainer()
 {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let fork = fork();
    // One fork, the runner's, holding the run's branch; the repository holds none of it.
    assert_eq!(t.forge.forks(&t.repo), vec![fork.clone()]);
    assert_eq!(t.forge.pull_head_repo(&t.repo, pr), Some(fork.clone()));
    let run = runs(&t, &issue).await.remove(0);
    assert_eq!(run.home.as_ref(), Some(&fork));
    assert!(t.forge.has_branch(&fork, &run.branch));
    assert!(
        !t.forge.has_branch(&t.repo, &run.branch),
        "nothing pushed to the repository"
    );
    // The runner opened it, so Forgejo judges the runner: its workflow run is held, and
    // would get no secret.
    let poster = t
        .forge
        .issues_in(&t.repo)
        .into_iter()
        .find(|i| i.0 == pr)
        .map(|i| i.3)
        .expect("the pull request");
    assert_eq!(poster, RUNNER);
    assert_eq!(
        t.forge.workflow_runs(&t.repo, pr),
        vec![(true, "blocked".to_owned(), false)]
    );
    // The run's token reached the fork alone.
    let mints = mints(&t);
    assert_eq!(mints.len(), 1);
    assert_eq!(
        mints[0]["repositories"],
        serde_json::json!([{ "owner": RUNNER, "name": "widgets" }])
    );
    // The checks wait, neither failing nor passing; the pull request is told once, the
    // status page says so.
    poll(&t).await;
    poll(&t).await;
    let said = t.forge.comments_saying(
        &IssueRef::new(t.repo.clone(), pr),
        "wait for a maintainer's approval",
    );
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("read the diff first") && said[0].contains("Approve once"));
    let row = pr_row(&t, &issue).await;
    assert_eq!(row["checks"], "held", "{row}");
    let html = t.app.get("/status").await.text().await.expect("the page");
    assert!(
        html.contains("checks wait for a maintainer"),
        "the page says it"
    );
    assert_eq!(
        runs(&t, &issue).await.len(),
        1,
        "no CI answer to a held check"
    );
    t.assert_contract();
}

#[tokio::test]
async fn after_approval_a_failing_check_starts_a_follow_up_that_pushes_to_the_same_fork_branch() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let fork = fork();
    let branch = runs(&t, &issue).await.remove(0).branch;
    let head = t.forge.pull_head(&t.repo, pr);
    // A maintainer reads the diff and approves the workflows once; they fail.
    t.forge.approve_workflows(MAINTAINER, &t.repo, pr);
    t.forge.finish_workflow(&t.repo, pr, false).await;
    wait_runs(&t, &issue, 2, RunState::Succeeded).await;
    let all = runs(&t, &issue).await;
    let answer = &all[1];
    assert!(answer.followup.is_some(), "a CI follow-up");
    assert_eq!(answer.home.as_ref(), Some(&fork), "in the same fork");
    assert_eq!(answer.branch, branch, "on the same branch");
    // Its push moved the pull request's head, in the fork, and the new head's workflow
    // run waits again: the runner pushed it.
    let new_head = t.forge.pull_head(&t.repo, pr);
    assert_ne!(new_head, head);
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1, "one pull request");
    let workflows = t.forge.workflow_runs(&t.repo, pr);
    assert_eq!(workflows.len(), 2, "{workflows:?}");
    assert_eq!(workflows[1], (true, "blocked".to_owned(), false));
    t.assert_contract();
}

#[tokio::test]
async fn a_green_fork_pull_request_approved_only_by_its_labeller_waits_then_merges_and_its_branch_goes()
 {
    let (t, _llm) = spawn_forks(|s| s.merge.enabled = true).await;
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let fork = fork();
    let branch = runs(&t, &issue).await.remove(0).branch;
    t.forge.approve_workflows(MAINTAINER, &t.repo, pr);
    t.forge.finish_workflow(&t.repo, pr, true).await;
    t.forge
        .review(WRITER, &t.repo, pr, ReviewEvent::Approve, "Mine.", &[])
        .await;
    poll(&t).await;
    let row = pr_row(&t, &issue).await;
    let waiting = row["merge"]["waiting"].as_str().unwrap_or_default();
    assert!(
        waiting.contains(&format!("the approval by @{WRITER} does not count")),
        "{row}"
    );
    assert!(t.forge.merges(&t.repo).is_empty(), "not merged");
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
    // The merged branch is gone from the fork (deleted by the runner, whose fork it is);
    // the fork itself stays.
    t.app
        .wait_for("the branch deleted in the fork", || async {
            !t.forge.has_branch(&fork, &branch)
        })
        .await;
    assert_eq!(t.forge.forks(&t.repo), vec![fork]);
    t.assert_contract();
}

#[tokio::test]
async fn a_pull_request_behind_its_base_is_updated_by_the_runner_and_waits_again() {
    let (t, _llm) = spawn_forks(|s| {
        s.merge.enabled = true;
        s.merge.requester_may_approve = true;
    })
    .await;
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    t.forge.approve_workflows(MAINTAINER, &t.repo, pr);
    t.forge.finish_workflow(&t.repo, pr, true).await;
    t.forge.push_commit(MAINTAINER, &t.repo, "main").await;
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
    poll(&t).await;
    // The runner updated it (the bot could not push to the fork), so its new workflow
    // run waits for approval, and nothing is merged unread.
    t.app
        .wait_for("the branch updated", || async {
            t.forge.workflow_runs(&t.repo, pr).len() == 2
        })
        .await;
    let update = t
        .forge
        .calls()
        .into_iter()
        .find(|c| c.method == "POST" && c.path.ends_with("/update"))
        .expect("an update");
    assert_eq!(update.login.as_deref(), Some(RUNNER));
    assert_eq!(
        t.forge.workflow_runs(&t.repo, pr)[1],
        (true, "blocked".to_owned(), false)
    );
    poll(&t).await;
    assert!(t.forge.merges(&t.repo).is_empty());
    assert_eq!(
        t.record(&issue).await.map(|r| r.lifecycle),
        Some(Lifecycle::Succeeded)
    );
}

#[tokio::test]
async fn a_runner_that_can_write_is_refused_in_fork_mode_with_the_reason() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    t.forge.grant(&t.repo, RUNNER, Permission::Write);
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let said = issue_comments(&t, &issue);
    assert!(
        said.contains("has `write` permission")
            && said.contains("without a maintainer's approval")
            && said.contains("runner.allow_writer_runner"),
        "{said}"
    );
    assert!(t.forge.forks(&t.repo).is_empty(), "no fork made");
    assert!(mints(&t).is_empty(), "no token minted");
}

#[tokio::test]
async fn the_operator_may_accept_a_writer_runner() {
    let (t, _llm) = spawn_forks(|s| s.runner.allow_writer_runner = true).await;
    t.forge.grant(&t.repo, RUNNER, Permission::Write);
    let (_, pr) = with_pr(&t, "Print each step.").await;
    // Forgejo trusts the writer: its pull request's workflows run unapproved.
    assert_eq!(
        t.forge.workflow_runs(&t.repo, pr),
        vec![(false, "waiting".to_owned(), false)]
    );
}

#[tokio::test]
async fn the_forks_default_branch_follows_the_base() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let _ = with_pr(&t, "Print each step.").await;
    let fork = fork();
    let moved = t.forge.push_commit(MAINTAINER, &t.repo, "main").await;
    let second = labelled(&t, "Add --quiet", "Print nothing.").await;
    t.app.wait_state(&second, Lifecycle::Succeeded).await;
    assert_eq!(t.forge.branch_head(&fork, "main"), Some(moved.clone()));
    let run = runs(&t, &second).await.remove(0);
    assert_eq!(
        run.base_commit.as_ref().map(|c| c.as_str()),
        Some(moved.as_str())
    );
    assert_eq!(t.forge.forks(&t.repo), vec![fork], "the same fork");
}

#[tokio::test]
async fn a_repository_of_the_forks_name_that_is_no_fork_is_never_used() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let lookalike = t.forge.add_repo(&format!("{RUNNER}/widgets"));
    let before = t.forge.branches_of(&lookalike);
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let said = issue_comments(&t, &issue);
    assert!(
        said.contains("could not be made") && said.contains("repository already exists"),
        "{said}"
    );
    assert_eq!(t.forge.branches_of(&lookalike), before, "left alone");
    assert!(mints(&t).is_empty(), "no token minted");
}

#[tokio::test]
async fn a_fork_whose_answer_was_lost_is_found_not_made_twice() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    // The forge makes the fork, and the proxy in front of it times out.
    t.forge.answer_after_applying("POST", "/forks", 504);
    let (_, pr) = with_pr(&t, "Print each step.").await;
    assert_eq!(t.forge.answers_after_applying_left(), 0);
    assert_eq!(t.forge.forks(&t.repo), vec![fork()]);
    assert_eq!(t.forge.pull_head_repo(&t.repo, pr), Some(fork()));
}

#[tokio::test]
async fn a_fork_made_by_an_earlier_attempt_is_used() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    // An attempt that died after the forge made the fork: the start finds it.
    t.forge.fork_as(RUNNER, &t.repo);
    let (_, pr) = with_pr(&t, "Print each step.").await;
    assert_eq!(t.forge.forks(&t.repo), vec![fork()]);
    assert_eq!(t.forge.pull_head_repo(&t.repo, pr), Some(fork()));
    let made = t
        .forge
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/forks"))
        .count();
    assert_eq!(made, 0, "never asked to make it again");
}

#[tokio::test]
async fn a_private_repositorys_run_in_the_runners_private_fork_ends_in_a_pull_request() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    t.forge.make_private(&t.repo);
    // The fork Forgejo makes of a private repository is private: the runner's alone, out
    // of the bot's sight. The run's end reads its branch as the runner.
    let (issue, pr) = with_pr(&t, "Print each step.").await;
    let fork = fork();
    assert!(t.forge.is_private(&fork), "the fork is private");
    assert_eq!(t.forge.pull_head_repo(&t.repo, pr), Some(fork.clone()));
    let run = runs(&t, &issue).await.remove(0);
    assert!(t.forge.has_branch(&fork, &run.branch));
    // A follow-up's start head is read there too: it pushes to the same branch.
    t.forge.approve_workflows(MAINTAINER, &t.repo, pr);
    t.forge.finish_workflow(&t.repo, pr, false).await;
    wait_runs(&t, &issue, 2, RunState::Succeeded).await;
    let answer = runs(&t, &issue).await.remove(1);
    assert!(
        answer
            .followup
            .as_ref()
            .and_then(|f| f.start_head.as_ref())
            .is_some(),
        "the follow-up knew its start head"
    );
    assert_eq!(
        t.forge.workflow_runs(&t.repo, pr).len(),
        2,
        "its push moved the head"
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_runner_that_reads_the_code_but_writes_to_actions_through_a_team_is_refused() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    // An organisation team gives the runner read on the code and write on Actions: its
    // repository permission says `read`, but Forgejo's approval gate trusts it.
    let team = t.forge.add_team(
        t.repo.owner(),
        "ci-helpers",
        Permission::Read,
        &[
            ("repo.code", Permission::Read),
            ("repo.pulls", Permission::Read),
            ("repo.actions", Permission::Write),
        ],
    );
    t.forge.team_add(team, &t.repo, RUNNER);
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let said = issue_comments(&t, &issue);
    assert!(
        said.contains("`write` access to the Actions unit of acme/widgets through a team")
            && said.contains("runner.allow_writer_runner"),
        "{said}"
    );
    assert!(t.forge.forks(&t.repo).is_empty(), "no fork made");
    assert!(mints(&t).is_empty(), "no token minted");
    t.assert_contract();
}

/// A run's refusal, waited for, in the issue's comments.
async fn refused_saying(t: &ForgeApp) -> String {
    let issue = labelled(t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    issue_comments(t, &issue)
}

#[tokio::test]
async fn a_fork_with_actions_on_is_not_used() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let fork = t.forge.fork_as(RUNNER, &t.repo);
    // Someone turned Actions on in the fork: the agent's pushes would run its workflows.
    t.forge.enable_actions(&fork);
    let said = refused_saying(&t).await;
    assert!(
        said.contains("Forgejo Actions is on in the fork director-runner/widgets"),
        "{said}"
    );
    assert!(mints(&t).is_empty(), "no token minted");
}

#[tokio::test]
async fn a_fork_another_account_can_write_to_is_not_used() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    let fork = t.forge.fork_as(RUNNER, &t.repo);
    t.forge.add_user("mallory");
    t.forge.grant(&fork, "mallory", Permission::Write);
    let said = refused_saying(&t).await;
    assert!(
        said.contains("`mallory` can write to the fork director-runner/widgets"),
        "{said}"
    );
    assert!(mints(&t).is_empty(), "no token minted");
}

#[tokio::test]
async fn an_organisations_fork_whose_team_lets_others_write_is_not_used() {
    let (t, _llm) = spawn_forks(|s| s.runner.fork_owner = "forks".into()).await;
    let writers = t.forge.add_team("forks", "Owners", Permission::Owner, &[]);
    let hidden = t.forge.add_team(
        "forks",
        "pushers",
        Permission::Write,
        &[("repo.code", Permission::Write)],
    );
    let fork = t.forge.fork_into(RUNNER, &t.repo, "forks");
    t.forge.team_add(writers, &fork, RUNNER);
    t.forge.team_add(writers, &fork, "olga");
    t.forge.team_add(hidden, &fork, "pete");
    let said = refused_saying(&t).await;
    assert!(
        said.contains("`olga` can write to the fork forks/widgets (team `Owners`)")
            && said.contains("the members of team `pushers`")
            && said.contains("cannot be read as the runner"),
        "{said}"
    );
}

#[tokio::test]
async fn the_runners_fork_is_found_among_thousands() {
    let (t, _llm) = spawn_forks(|_| {}).await;
    // More forks than a scan of 100 pages reads, all listed before the runner's.
    t.forge.add_forks(&t.repo, 5_001, "crowd");
    t.forge.fork_as(RUNNER, &t.repo);
    let (_, pr) = with_pr(&t, "Print each step.").await;
    assert_eq!(t.forge.pull_head_repo(&t.repo, pr), Some(fork()));
    let listed = t
        .forge
        .calls()
        .into_iter()
        .filter(|c| c.method == "GET" && c.path.ends_with("/forks"))
        .count();
    assert_eq!(listed, 0, "found by its name, not by a scan");
}
