//! Crash tests: the real binary is stopped at a named point (the `failpoints` feature of test
//! builds), SIGKILLed there, and started again on the same database. Every effect must then
//! exist exactly once: one comment, one routed issue, one pull request, one container start,
//! no token left alive, no issue stuck in a state that is not its end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use director::domain::{IssueRef, Lifecycle, RunState};
use director::forge::Permission;
use director::store::Store;
use director_testkit::forge::{FakeForge, FakeServer};

use crate::forge_helpers::{BOT, BOT_TOKEN, TRIGGER, WRITER};
use crate::helpers::{SECRET, http_client};
use crate::runs::{RUNNER, RUNNER_PASSWORD, admit_runner, creations, runner_env};
use director_testkit::llm::FakeLlm;

/// A forge, a model and a database that outlive the director processes started on them.
struct World {
    forge: FakeForge,
    server: FakeServer,
    llm: FakeLlm,
    dir: tempfile::TempDir,
    /// `DIRECTOR_*` settings on top of the common ones.
    env: Vec<(String, String)>,
}

impl World {
    fn new(answer: &str) -> Self {
        let forge = FakeForge::new();
        forge.add_account(BOT, BOT_TOKEN);
        let repo = forge.add_repo("acme/widgets");
        forge.grant(&repo, BOT, Permission::Admin);
        forge.grant(&repo, WRITER, Permission::Write);
        forge.define_label(&repo, TRIGGER);
        let server = forge.serve().expect("serves");
        let llm = FakeLlm::start();
        llm.always(answer);
        Self {
            forge,
            server,
            llm,
            dir: tempfile::tempdir().expect("dir"),
            env: Vec::new(),
        }
    }

    fn with_runs(mut self) -> Self {
        let repo = "acme/widgets".parse().expect("repo");
        admit_runner(&self.forge, &repo);
        self.env.extend(runner_env());
        self
    }

    fn db(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("director.db").display())
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("director.log")
    }

    async fn store(&self) -> Store {
        Store::connect(&director::settings::StoreSettings {
            url: self.db(),
            ..Default::default()
        })
        .await
        .expect("db")
    }

    /// Starts `director serve`, stopping at `failpoint` if named, and waits until it answers.
    async fn start(&self, failpoint: Option<&str>) -> Child {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        self.forge
            .set_webhook(&format!("http://127.0.0.1:{port}/webhooks/forgejo"), SECRET);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_director"));
        cmd.arg("serve")
            .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("DIRECTOR_STORE__URL", self.db())
            .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
            .env("DIRECTOR_FORGE__URL", self.server.url())
            .env("DIRECTOR_FORGE__TOKEN", BOT_TOKEN)
            .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
            .env("DIRECTOR_SCAN__ENABLED", "false")
            .env(
                "DIRECTOR_PREFLIGHT__BASE_URL",
                format!("{}/v1", self.llm.url),
            )
            .env("DIRECTOR_PREFLIGHT__MODEL", "fake-model")
            .env("DIRECTOR_PREFLIGHT__TRUSTED_OWNERS", "acme")
            .env("RUST_LOG", "info")
            .env_remove("DIRECTOR_FAILPOINT")
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.log())
                    .expect("log file"),
            );
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(point) = failpoint {
            cmd.env("DIRECTOR_FAILPOINT", point);
        }
        let child = cmd.spawn().expect("director starts");
        let client = http_client();
        self.wait("the director answers /healthz", || async {
            client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        child
    }

    /// Waits until the director stops at `point`, then SIGKILLs it there.
    async fn kill_at(&self, mut child: Child, point: &str) {
        let line = format!("failpoint reached: {point}");
        let log = self.log();
        self.wait(&format!("the director reaches {point}"), || async {
            read(&log).contains(&line)
        })
        .await;
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    /// Waits on the director (another process), saying what it logged if it times out.
    async fn wait<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let said = || format!("the director said:\n{}", read(&self.log()));
        crate::helpers::poll_until(what, Duration::from_secs(60), check, said).await;
    }

    /// Waits until the issue is in `state` and nothing is left to do.
    async fn settle(&self, store: &Store, issue: &IssueRef, state: Lifecycle) {
        self.wait(
            &format!("{issue} is {state} and the outbox is empty"),
            || async {
                // Every action done, also one waiting out a retry's backoff (after a restart
                // an action may fail once, say before the bot's login is known again).
                store.at_rest(issue).await.expect("query") == Some((state, 0, 0))
            },
        )
        .await;
    }

    fn preflight_comments(&self, issue: &IssueRef) -> usize {
        self.forge
            .comments_on(issue)
            .iter()
            .filter(|c| c.body.starts_with("<!-- director:preflight"))
            .count()
    }

    /// A new issue in acme/widgets, labelled by a writer.
    async fn labelled(&self, title: &str, body: &str) -> IssueRef {
        let repo = "acme/widgets".parse().expect("repo");
        let issue = self.forge.open_issue(&repo, "reporter", title, body).await;
        self.forge.label(WRITER, &issue, TRIGGER).await;
        issue
    }

    fn assert_contract(&self) {
        let v = self.forge.contract_violations();
        assert!(v.is_empty(), "{v:?}");
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn stop(mut child: Child) {
    child.kill().expect("stop");
    child.wait().expect("reaped");
}

#[tokio::test]
async fn killed_right_after_filing_the_routed_issue_files_it_once() {
    let w = World::new("It belongs to the API.\n\nWRONG-REPO: acme/api - fix the session check");
    let api = w.forge.add_repo("acme/api");
    w.forge.grant(&api, BOT, Permission::Admin);
    let store = w.store().await;
    let child = w.start(Some("after_routed_issue_created")).await;
    let issue = w.labelled("Login fails", "The API 500s.").await;
    w.kill_at(child, "after_routed_issue_created").await;
    assert_eq!(w.forge.issues_in(&api).len(), 1, "filed before the kill");

    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Routed).await;
    let record = store.issue(&issue).await.expect("query").expect("known");
    assert_eq!(record.preflight.routed_to.as_deref(), Some("acme/api#1"));
    assert_eq!(w.forge.issues_in(&api).len(), 1, "one routed issue, ever");
    assert_eq!(w.preflight_comments(&issue), 1);
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn killed_while_the_model_answers_posts_one_comment_after_restart() {
    let w = World::new("Fine.\n\nGO");
    let store = w.store().await;
    let child = w.start(Some("during_model_call")).await;
    let issue = w.labelled("Add --verbose", "Print each step.").await;
    w.kill_at(child, "during_model_call").await;
    assert_eq!(
        w.preflight_comments(&issue),
        0,
        "nothing posted before the kill"
    );

    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Queued).await;
    assert_eq!(w.preflight_comments(&issue), 1);
    assert_eq!(
        w.llm.prompts().len(),
        2,
        "the lost answer is asked for again"
    );
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn killed_right_after_the_container_started_adopts_it_and_starts_no_second() {
    let w = World::new("Fine.\n\nGO").with_runs();
    let store = w.store().await;
    let since = chrono::Utc::now().timestamp() - 1;
    let child = w.start(Some("after_container_started")).await;
    let issue = w.labelled("Survive", "mode: slow").await;
    w.kill_at(child, "after_container_started").await;

    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    let runs = store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Succeeded);
    assert_eq!(
        creations(&runs[0].id, since),
        1,
        "one container for the run, ever"
    );
    assert_eq!(w.forge.pulls_of(&issue.repo).len(), 1);
    assert!(w.forge.tokens_of(RUNNER).is_empty(), "no token left alive");
    assert_eq!(
        w.forge.minted_tokens().len(),
        1,
        "one token for the one run"
    );
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn a_restart_while_a_go_waits_for_approval_keeps_it_waiting_and_the_go_runs_it_once() {
    let mut w = World::new("Fine.\n\nPlan:\n1. Add the flag.\n\nGO").with_runs();
    w.env
        .push(("DIRECTOR_PREFLIGHT__APPROVAL".into(), "always".into()));
    let store = w.store().await;
    let since = chrono::Utc::now().timestamp() - 1;
    let child = w.start(None).await;
    let issue = w.labelled("Wait for me", "Print each step.").await;
    w.settle(&store, &issue, Lifecycle::AwaitingApproval).await;
    stop(child);

    // Started again: still waiting, nothing started by the restart itself.
    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::AwaitingApproval).await;
    assert!(store.runs_of(&issue).await.expect("runs").is_empty());
    w.forge.comment(WRITER, &issue, "/director go").await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    let runs = store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 1, "one run");
    assert_eq!(creations(&runs[0].id, since), 1, "one container, ever");
    assert_eq!(w.preflight_comments(&issue), 1, "one pre-flight comment");
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn killed_during_a_follow_up_adopts_its_container_and_starts_no_second() {
    let w = World::new("Fine.\n\nGO").with_runs();
    let store = w.store().await;
    let child = w.start(None).await;
    let issue = w
        .labelled("Add --verbose", "Print each step.\nmode: slow")
        .await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    stop(child);
    let pr = w.forge.pulls_of(&issue.repo)[0].0;
    let since = chrono::Utc::now().timestamp() - 1;
    let child = w.start(Some("after_followup_started")).await;
    w.forge
        .review(
            WRITER,
            &issue.repo,
            pr,
            director_testkit::forge::ReviewEvent::RequestChanges,
            "Rename the flag.",
            &[],
        )
        .await;
    w.kill_at(child, "after_followup_started").await;

    let child = w.start(None).await;
    w.wait("the follow-up ends", || async {
        let runs = store.runs_of(&issue).await.expect("runs");
        runs.len() == 2 && runs[1].state == RunState::Succeeded
    })
    .await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    let runs = store.runs_of(&issue).await.expect("runs");
    assert_eq!(
        creations(&runs[1].id, since),
        1,
        "one follow-up container, ever"
    );
    assert_eq!(w.forge.pulls_of(&issue.repo).len(), 1);
    assert!(w.forge.tokens_of(RUNNER).is_empty(), "no token left alive");
    let said = w.forge.comments_saying(
        &IssueRef::new(issue.repo.clone(), pr),
        "pushed 1 new commit(s)",
    );
    assert_eq!(said.len(), 1, "the PR is told once: {said:?}");
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn killed_right_after_opening_the_pull_request_opens_one_and_reports_once() {
    let w = World::new("Fine.\n\nGO").with_runs();
    let store = w.store().await;
    let child = w.start(Some("after_pr_opened")).await;
    let issue = w.labelled("Add --verbose", "Print each step.").await;
    w.kill_at(child, "after_pr_opened").await;
    assert_eq!(
        w.forge.pulls_of(&issue.repo).len(),
        1,
        "opened before the kill"
    );

    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    assert_eq!(
        w.forge.pulls_of(&issue.repo).len(),
        1,
        "one pull request, ever"
    );
    let reports = w
        .forge
        .comments_on(&issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:run "))
        .count();
    assert_eq!(reports, 1);
    assert!(w.forge.tokens_of(RUNNER).is_empty(), "no token left alive");
    let runs = store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs[0].pr_number, Some(w.forge.pulls_of(&issue.repo)[0].0));
    stop(child);
    w.assert_contract();
}

#[tokio::test]
async fn at_trace_level_the_logs_of_a_whole_run_hold_no_secret() {
    let mut w = World::new("Fine.\n\nGO").with_runs();
    // Even asked for by name, the libraries that would print secrets stay quiet.
    w.env.push((
        "RUST_LOG".into(),
        "trace,bollard=trace,hyper=trace,reqwest=trace".into(),
    ));
    w.env.push((
        "DIRECTOR_PREFLIGHT__API_KEY".into(),
        "llm-key-trace-7e1f".into(),
    ));
    let store = w.store().await;
    let child = w.start(None).await;
    let issue = w.labelled("Add --verbose", "Print each step.").await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    stop(child);
    let log = read(&w.log());
    assert!(
        log.contains("TRACE") || log.contains("\"level\":\"TRACE\""),
        "trace level is on"
    );
    let mut secrets = vec![
        BOT_TOKEN.to_owned(),
        RUNNER_PASSWORD.to_owned(),
        SECRET.to_owned(),
        "llm-key-trace-7e1f".to_owned(),
    ];
    secrets.extend(
        w.forge
            .minted_tokens()
            .into_iter()
            .map(|(_, _, value)| value),
    );
    assert_eq!(secrets.len(), 5, "one run token was minted");
    for (n, secret) in secrets.iter().enumerate() {
        let line = log.lines().find(|l| l.contains(secret.as_str()));
        assert!(
            line.is_none(),
            "secret {n} is in the trace log: {}",
            line.unwrap_or_default()
                .chars()
                .take(600)
                .collect::<String>()
        );
    }
}

#[tokio::test]
async fn a_token_printed_before_a_restart_is_redacted_in_the_report_after_it() {
    let w = World::new("Fine.\n\nGO").with_runs();
    let store = w.store().await;
    let child = w.start(Some("after_container_started")).await;
    // The agent prints its token and fails while the director is down.
    let issue = w.labelled("Leak", "mode: leak").await;
    w.kill_at(child, "after_container_started").await;
    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Failed).await;
    stop(child);
    let reports: Vec<String> = w
        .forge
        .comments_on(&issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:run "))
        .map(|c| c.body)
        .collect();
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].contains("my token is [redacted]"),
        "{}",
        reports[0]
    );
    for (_, _, token) in w.forge.minted_tokens() {
        assert!(!reports[0].contains(&token), "the token is in the report");
    }
    assert!(w.forge.tokens_of(RUNNER).is_empty());
}

#[tokio::test]
async fn a_transcript_followed_before_a_restart_is_continued_after_it_without_a_repeat() {
    let w = World::new("Fine.\n\nGO").with_runs();
    let store = w.store().await;
    let child = w.start(None).await;
    let issue = w.labelled("Talk", "mode: chatty").await;
    let run_id = || async {
        store
            .runs_of(&issue)
            .await
            .expect("runs")
            .first()
            .map(|r| r.id.clone())
    };
    w.wait("the transcript holds the run's first lines", || async {
        match run_id().await {
            Some(id) => store
                .transcript(&id)
                .await
                .expect("store")
                .is_some_and(|t| t.text.contains("chatty line 2\n")),
            None => false,
        }
    })
    .await;
    stop(child);
    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Succeeded).await;
    stop(child);
    let id = run_id().await.expect("a run");
    let text = store
        .transcript(&id)
        .await
        .expect("store")
        .expect("a transcript")
        .text;
    for n in 1..=15 {
        assert_eq!(
            text.matches(&format!("chatty line {n}\n")).count(),
            1,
            "line {n} once: {text}"
        );
    }
    assert_eq!(text.matches("agent: run").count(), 1, "{text}");
}

/// Runs as Jobs on the fake Kubernetes API server, which outlives the processes too.
#[cfg(feature = "kubernetes")]
mod kubernetes {
    use super::*;
    use director_testkit::kube::FakeKube;

    const NS: &str = "runs";

    fn with_kube(mut w: World, fake: &FakeKube) -> World {
        let repo = "acme/widgets".parse().expect("repo");
        admit_runner(&w.forge, &repo);
        w.env.extend(
            [
                ("DIRECTOR_FORGE__RUNNER_LOGIN", RUNNER.to_owned()),
                (
                    "DIRECTOR_FORGE__RUNNER_PASSWORD",
                    RUNNER_PASSWORD.to_owned(),
                ),
                ("DIRECTOR_RUNNER__KIND", "kubernetes".to_owned()),
                ("DIRECTOR_RUNNER__EGRESS", "open".to_owned()),
                ("DIRECTOR_RUNNER__BRANCH_HOME", "repository".to_owned()),
                (
                    "DIRECTOR_RUNNER__IMAGE",
                    "registry.example/agent:1".to_owned(),
                ),
                ("DIRECTOR_RUNNER__TIMEOUT_SECS", "600".to_owned()),
                ("DIRECTOR_KUBERNETES__NAMESPACE", NS.to_owned()),
                (
                    "DIRECTOR_KUBERNETES__KUBECONFIG",
                    fake.kubeconfig.display().to_string(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
        );
        w
    }

    fn jobs_created(fake: &FakeKube) -> usize {
        fake.requests()
            .iter()
            .filter(|r| {
                r.method == "POST" && r.path.ends_with("/jobs") && !r.query.contains("dryRun")
            })
            .count()
    }

    /// Plays the run's pod to a pushed branch and a clean exit.
    async fn run_the_pod(w: &World, fake: &FakeKube) {
        let job = {
            let find = || {
                fake.jobs(NS).into_iter().find_map(|j| {
                    let name = j["metadata"]["name"].as_str()?.to_owned();
                    (!fake.pods_of(NS, &name).is_empty()).then_some(name)
                })
            };
            w.wait("the run's pod", || async { find().is_some() }).await;
            find().unwrap_or_default()
        };
        let env = fake.pod_env(NS, &job).expect("the pod's environment");
        let body = serde_json::json!({
            "content": "aGVsbG8K",
            "message": "agent work",
            "branch": env["DIRECTOR_BASE_BRANCH"],
            "new_branch": env["DIRECTOR_BRANCH"],
        });
        let pushed = http_client()
            .post(format!(
                "{}/repos/{}/contents/agent.txt",
                env["DIRECTOR_API_URL"], env["DIRECTOR_REPO"]
            ))
            .header("Authorization", format!("token {}", env["DIRECTOR_TOKEN"]))
            .json(&body)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        assert!(pushed, "the pod's token pushes");
        fake.run_pod(NS, &job).expect("runs");
        fake.finish(NS, &job, 0, "");
    }

    async fn survives(point: &str) {
        let fake = FakeKube::start();
        let w = with_kube(World::new("Fine.\n\nGO"), &fake);
        let store = w.store().await;
        let child = w.start(Some(point)).await;
        let issue = w.labelled("Survive", "Print each step.").await;
        w.kill_at(child, point).await;
        assert_eq!(jobs_created(&fake), 1);

        let child = w.start(None).await;
        run_the_pod(&w, &fake).await;
        w.settle(&store, &issue, Lifecycle::Succeeded).await;
        let runs = store.runs_of(&issue).await.expect("runs");
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].state, RunState::Succeeded);
        assert_eq!(jobs_created(&fake), 1, "one Job for the run, ever");
        assert_eq!(w.forge.pulls_of(&issue.repo).len(), 1);
        assert!(w.forge.tokens_of(RUNNER).is_empty(), "no token left alive");
        assert_eq!(
            w.forge.minted_tokens().len(),
            1,
            "one token for the one run"
        );
        w.wait("the Job and its Secret are removed", || async {
            fake.jobs(NS).is_empty()
                && fake
                    .secret(NS, &format!("director-run-{}", runs[0].id))
                    .is_none()
        })
        .await;
        stop(child);
        w.assert_contract();
    }

    #[tokio::test]
    async fn killed_between_creating_the_job_and_starting_it_starts_that_job_once() {
        survives("after_container_created").await;
    }

    #[tokio::test]
    async fn killed_right_after_the_job_started_adopts_it_and_creates_no_second() {
        survives("after_container_started").await;
    }
}

#[tokio::test]
async fn killed_right_after_the_merge_call_merges_once() {
    let mut w = World::new("Fine.\n\nGO").with_runs();
    w.env
        .push(("DIRECTOR_MERGE__ENABLED".into(), "true".into()));
    w.env.push((
        "DIRECTOR_MERGE__REQUESTER_MAY_APPROVE".into(),
        "true".into(),
    ));
    let repo: director::domain::RepoName = "acme/widgets".parse().expect("repo");
    w.forge.grant(&repo, "ci-bot", Permission::Write);
    let store = w.store().await;
    let child = w.start(Some("after_merge_call")).await;
    let issue = w.labelled("Add --verbose", "Print each step.").await;
    w.wait("the pull request is open and the run over", || async {
        store
            .issue(&issue)
            .await
            .ok()
            .flatten()
            .is_some_and(|r| r.lifecycle == Lifecycle::Succeeded && r.pr.is_some())
    })
    .await;
    let pr = w.forge.pulls_of(&repo)[0].0;
    let head = w.forge.pull_head(&repo, pr);
    w.forge.post_status(
        "ci-bot",
        &repo,
        &head,
        &director_testkit::forge::CommitStatus {
            state: "success",
            context: "ci / test",
            ..Default::default()
        },
    );
    w.forge
        .review(
            WRITER,
            &repo,
            pr,
            director_testkit::forge::ReviewEvent::Approve,
            "LGTM",
            &[],
        )
        .await;
    // Forgejo Actions says the run passed: the checks are read, and the lane merges.
    w.forge.send_action_run(&repo, pr, true).await;
    w.kill_at(child, "after_merge_call").await;
    assert_eq!(w.forge.merges(&repo).len(), 1, "merged before the kill");

    let child = w.start(None).await;
    w.settle(&store, &issue, Lifecycle::Merged).await;
    assert_eq!(w.forge.merges(&repo).len(), 1, "merged once, ever");
    let told = w
        .forge
        .comments_on(&issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:merged "))
        .count();
    assert_eq!(told, 1);
    stop(child);
    w.assert_contract();
}
