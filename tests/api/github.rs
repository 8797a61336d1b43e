//! GitHub as the forge: the stories of the Forgejo scenarios, told against the real app, its
//! octocrab-based GitHub App client and a FakeGitHub on loopback (which checks every request
//! against GitHub's REST description and enforces what each token may do).

use std::sync::Arc;

use director::domain::{IssueRef, Lifecycle, RepoName};
use director::runtime::RunSpec;
use director::settings::Secret;
use director::startup::Overrides;
use director_testkit::runtime::FakeRuntime;
use futures_util::FutureExt;

use crate::fake_runs::env;
use crate::helpers::{SECRET, TestApp, wait_until};
use director_testkit::github::{self as fake_github, APP_ID, BOT, FakeGitHub};
use director_testkit::llm::FakeLlm;

pub(crate) const REPO: &str = "acme/widgets";
const OTHER: &str = "acme/gadgets";
const WRITER: &str = "alice";
const MAINTAINER: &str = "mona";
const READER: &str = "rita";
const TRIGGER: &str = "headless";

pub(crate) struct GithubApp {
    pub(crate) app: TestApp,
    pub(crate) gh: FakeGitHub,
    llm: FakeLlm,
    scanner: Option<Arc<director::engine::scanner::Scanner>>,
    pub(crate) runtime: FakeRuntime,
    installation: u64,
}

impl GithubApp {
    async fn spawn(configure: impl FnOnce(&mut director::settings::Settings)) -> Self {
        Self::spawn_on(FakeGitHub::start().await, configure).await
    }

    async fn spawn_on(
        gh: FakeGitHub,
        configure: impl FnOnce(&mut director::settings::Settings),
    ) -> Self {
        Self::spawn_timed(gh, None, configure).await
    }

    /// With `clock` in place of the system's.
    pub(crate) async fn spawn_timed(
        gh: FakeGitHub,
        clock: Option<director::clock::SharedClock>,
        configure: impl FnOnce(&mut director::settings::Settings),
    ) -> Self {
        gh.create_repo(REPO);
        gh.create_repo(OTHER);
        let installation = gh.install("acme", &[REPO, OTHER]);
        gh.grant(REPO, WRITER, "write");
        gh.grant(REPO, MAINTAINER, "maintain");
        gh.grant(REPO, READER, "read");
        let llm = FakeLlm::start();
        llm.always("Clear and small.\n\nGO");
        let runtime = FakeRuntime::new();
        runtime.set_behaviour(agent());
        let url = gh.url.clone();
        let llm_url = format!("{}/v1", llm.url);
        let (app, scanner) = TestApp::spawn_overridden(
            |s| {
                s.forge.kind = director::settings::ForgeKind::Github;
                s.forge.url = url;
                s.forge.bot_login = None;
                s.github.app_id = APP_ID;
                s.github.private_key = Secret::new(fake_github::app_key());
                s.scan.repos = vec![REPO.parse().expect("repo")];
                s.preflight.enabled = true;
                s.preflight.provider = director::settings::Provider::Openai;
                s.preflight.base_url = llm_url;
                s.preflight.model = "fake-model".into();
                s.preflight.api_key = Secret::new("llm-key-7c1d");
                s.preflight.retry_backoff_ms = 20;
                s.runner.image = "fake/agent:1".into();
                s.runner.timeout_secs = 60;
                configure(s);
            },
            Overrides {
                runtime: Some(Arc::new(runtime.clone())),
                clock,
            },
        )
        .await;
        gh.set_webhook(&format!("{}/webhooks/github", app.address), SECRET);
        let this = Self {
            app,
            gh,
            llm,
            scanner,
            runtime,
            installation,
        };
        // The App's bot login, learned from GET /app, is how its own events are told.
        this.app
            .wait_for_metric(r#"director_forge_requests_total{endpoint="/app",status="200"} 1"#)
            .await;
        this
    }

    /// A reporter's issue, labelled by a writer.
    pub(crate) fn labelled(&self, title: &str, body: &str) -> u64 {
        let n = self.gh.open_issue(REPO, "reporter", title, body);
        self.gh.label(WRITER, REPO, n, TRIGGER);
        n
    }

    /// Waits (on the engine) for a comment on issue `number` that holds `text`.
    async fn wait_comment(&self, number: u64, what: &str, text: &str) {
        self.app
            .wait_for(what, || async {
                self.gh
                    .comments(REPO, number)
                    .iter()
                    .any(|(_, b)| b.contains(text))
            })
            .await;
    }

    async fn record(&self, number: u64) -> director::store::IssueRecord {
        self.app
            .store
            .issue(&self.issue(number))
            .await
            .expect("query")
            .expect("recorded")
    }

    pub(crate) fn issue(&self, number: u64) -> IssueRef {
        IssueRef::new(REPO.parse::<RepoName>().expect("repo"), number)
    }

    fn preflight_comments(&self, number: u64) -> Vec<(String, String)> {
        self.gh
            .comments(REPO, number)
            .into_iter()
            .filter(|(_, b)| b.starts_with("<!-- director:preflight"))
            .collect()
    }

    pub(crate) fn assert_contract(&self) {
        let v = self.gh.violations();
        assert!(
            v.is_empty(),
            "requests that do not fit GitHub's REST description: {v:#?}"
        );
    }
}

/// The fake agent: with the run token, what a real agent does through GitHub's API: read
/// the base, make the branch, commit a file. It also tries what the token must not do, and
/// prints whether each attempt was refused.
fn agent() -> director_testkit::runtime::Behaviour {
    Arc::new(move |spec: RunSpec| {
        async move {
            if String::from_utf8_lossy(&spec.task).contains("mode: hang") {
                std::future::pending::<()>().await;
            }
            let api = env(&spec, "DIRECTOR_API_URL").to_owned();
            let repo = env(&spec, "DIRECTOR_REPO").to_owned();
            let branch = env(&spec, "DIRECTOR_BRANCH").to_owned();
            let base = env(&spec, "DIRECTOR_BASE_BRANCH").to_owned();
            let auth = format!("Bearer {}", env(&spec, "DIRECTOR_TOKEN"));
            let http = crate::helpers::http_client();
            let status = |r: Result<reqwest::Response, reqwest::Error>| {
                r.map(|r| r.status().as_u16()).unwrap_or(0)
            };
            let head: serde_json::Value = match http
                .get(format!("{api}/repos/{repo}/git/ref/heads/{base}"))
                .header("Authorization", &auth)
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => return (1, "cannot read the base".to_owned()),
            };
            let sha = head["object"]["sha"].as_str().unwrap_or_default().to_owned();
            // What the token must not do: push to the default branch, reach another
            // repository of the installation, write the issue.
            let to_main = status(
                http.put(format!("{api}/repos/{repo}/contents/evil.txt"))
                    .header("Authorization", &auth)
                    .json(&serde_json::json!({"message": "x", "content": "eA==", "branch": base}))
                    .send()
                    .await,
            );
            let elsewhere = status(
                http.put(format!("{api}/repos/{OTHER}/contents/evil.txt"))
                    .header("Authorization", &auth)
                    .json(&serde_json::json!({"message": "x", "content": "eA=="}))
                    .send()
                    .await,
            );
            let issue_write = status(
                http.post(format!(
                    "{api}/repos/{repo}/issues/{}/comments",
                    env(&spec, "DIRECTOR_ISSUE")
                ))
                .header("Authorization", &auth)
                .json(&serde_json::json!({"body": "I approve of myself"}))
                .send()
                .await,
            );
            let made = status(
                http.post(format!("{api}/repos/{repo}/git/refs"))
                    .header("Authorization", &auth)
                    .json(&serde_json::json!({"ref": format!("refs/heads/{branch}"), "sha": sha}))
                    .send()
                    .await,
            );
            let pushed = status(
                http.put(format!("{api}/repos/{repo}/contents/agent.txt"))
                    .header("Authorization", &auth)
                    .json(&serde_json::json!({"message": "agent work", "content": "aGVsbG8K", "branch": branch}))
                    .send()
                    .await,
            );
            let log = format!(
                "main={to_main} elsewhere={elsewhere} issue={issue_write} ref={made} push={pushed}"
            );
            (if pushed == 201 { 0 } else { 1 }, log)
        }
        .boxed()
    })
}

#[tokio::test]
async fn a_writers_label_via_webhook_gets_one_go_comment_and_the_apps_own_echoes_are_ignored() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    let n = t.labelled("Add --verbose", "Print each step.");
    t.app.wait_state(&t.issue(n), Lifecycle::Queued).await;
    let comments = t.preflight_comments(n);
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert_eq!(comments[0].0, BOT);
    assert!(comments[0].1.contains("verdict=GO"), "{}", comments[0].1);
    // The App's comment and label came back as webhooks, signed: told apart by the sender.
    t.app
        .wait_for_metric(r#"director_webhook_deliveries_total{event="issues",outcome="own_event"}"#)
        .await;
    assert!(
        t.gh.labels_of(REPO, n)
            .iter()
            .any(|l| l.starts_with("headless:")),
        "a state label: {:?}",
        t.gh.labels_of(REPO, n)
    );
    assert_eq!(t.llm.prompts().len(), 1, "one pre-flight");
    // A maintainer counts as a writer.
    let m = t.gh.open_issue(REPO, "reporter", "Second", "More.");
    t.gh.label(MAINTAINER, REPO, m, TRIGGER);
    t.app.wait_state(&t.issue(m), Lifecycle::Queued).await;
    t.assert_contract();
}

#[tokio::test]
async fn a_readers_label_gets_no_preflight() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    let n = t.gh.open_issue(REPO, READER, "Do my homework", "Please.");
    t.gh.label(READER, REPO, n, TRIGGER);
    t.app
        .wait_for("the explanation is posted", || async {
            !t.gh.comments(REPO, n).is_empty()
        })
        .await;
    t.app.wait_processed().await;
    let record = t.record(n).await;
    assert_eq!(record.lifecycle, Lifecycle::Untracked);
    assert_eq!(record.trigger_actor.as_deref(), Some(READER));
    assert_eq!(record.trigger_trusted, Some(false));
    assert!(t.preflight_comments(n).is_empty());
    assert!(t.llm.prompts().is_empty(), "the model never saw it");
    t.assert_contract();
}

#[tokio::test]
async fn a_missed_webhook_is_found_by_the_scan_full_and_incremental() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    t.gh.set_webhooks(false);
    let n =
        t.gh.open_issue(REPO, "reporter", "Missed", "No webhook came.");
    t.gh.label(WRITER, REPO, n, TRIGGER);
    let scanner = t.scanner.as_ref().expect("a scanner");
    let report = scanner.scan_once().await.expect("scan");
    assert_eq!(report.labelled, 1, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    t.app.wait_state(&t.issue(n), Lifecycle::Queued).await;
    assert_eq!(t.preflight_comments(n).len(), 1);

    // Another, seen by the incremental pass: one search per watched owner.
    let m =
        t.gh.open_issue(REPO, "reporter", "Missed too", "Still no webhook.");
    t.gh.label(WRITER, REPO, m, TRIGGER);
    let before = t.gh.requests().len();
    let report = scanner.scan_incremental().await.expect("scan");
    assert!(report.errors.is_empty(), "{report:?}");
    t.app.wait_state(&t.issue(m), Lifecycle::Queued).await;
    let searches = t.gh.requests()[before..]
        .iter()
        .filter(|r| r.path == "/search/issues")
        .count();
    assert_eq!(searches, 1);
    // The PRs GitHub lists among issues, and repositories outside the watched set, are not
    // queued: OTHER is installed but not watched.
    let o = t.gh.open_issue(OTHER, "reporter", "Not watched", "");
    t.gh.label(WRITER, OTHER, o, TRIGGER);
    scanner.scan_incremental().await.expect("scan");
    t.app.wait_processed().await;
    let other = IssueRef::new(OTHER.parse().expect("repo"), o);
    assert!(t.app.store.issue(&other).await.expect("query").is_none());
    t.assert_contract();
}

#[tokio::test]
async fn a_go_issue_ends_in_one_pr_from_a_run_whose_token_is_limited_to_its_repository_and_revoked()
{
    let t = GithubApp::spawn(|_| {}).await;
    t.gh.ruleset(REPO, "active", 1, false);
    let n = t.labelled("Add --verbose", "Print each step.");
    t.app.wait_state(&t.issue(n), Lifecycle::Succeeded).await;

    let runs = t.app.store.runs_of(&t.issue(n)).await.expect("runs");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(
        (t.runtime.creations(&run.id), t.runtime.starts(&run.id)),
        (1, 1)
    );
    let pulls = t.gh.pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let (number, head, base, body) = &pulls[0];
    assert_eq!(run.pr_number, Some(*number));
    assert_eq!(
        (head.as_str(), base.as_str()),
        (run.branch.as_str(), "main")
    );
    assert!(body.contains(&format!("Closes #{n}")), "{body}");

    // The run's token: this repository alone, contents: write and nothing more; revoked.
    let spec = t.runtime.spec_of(&run.id).expect("spec");
    let value = env(&spec, "DIRECTOR_TOKEN").to_owned();
    let token =
        t.gh.tokens()
            .into_iter()
            .find(|tk| tk.value == value)
            .expect("the run's token was minted here");
    assert_eq!(token.repositories, Some(vec![REPO.to_owned()]));
    assert_eq!(
        token.permissions.into_iter().collect::<Vec<_>>(),
        vec![
            ("contents".to_owned(), "write".to_owned()),
            ("metadata".to_owned(), "read".to_owned())
        ]
    );
    assert!(token.revoked, "revoked when the run ended");
    assert_eq!(env(&spec, "DIRECTOR_API_URL"), t.gh.url);
    assert_eq!(
        env(&spec, "DIRECTOR_CLONE_URL"),
        format!("{}/{REPO}.git", t.gh.url)
    );

    // What the token was refused, as the agent saw it: the default branch (the ruleset),
    // another repository of the same installation (invisible), the issue (no permission).
    let report =
        t.gh.comments(REPO, n)
            .into_iter()
            .map(|(_, b)| b)
            .find(|b| b.contains("<!-- director:run "))
            .expect("a report");
    assert!(!report.contains(&value), "the token never appears");
    let log = t
        .app
        .store
        .run(&run.id)
        .await
        .expect("query")
        .expect("run")
        .log_tail
        .unwrap_or_default();
    assert!(
        log.contains("main=409 elsewhere=404 issue=403 ref=201 push=201"),
        "{log}"
    );
    assert_eq!(
        t.gh.branch_head(REPO, "main").as_deref(),
        Some("c0"),
        "main untouched"
    );
    t.assert_contract();
}

#[tokio::test]
async fn an_unprotected_default_branch_refuses_the_run_and_says_why() {
    // A ruleset only in `evaluate`, and a classic protection the App may bypass: neither
    // makes the branch PR-only for the App.
    let t = GithubApp::spawn(|_| {}).await;
    t.gh.ruleset(REPO, "evaluate", 1, false);
    t.gh.protect(REPO, 1, &[fake_github::APP_SLUG]);
    let n = t.labelled("Add --verbose", "Print each step.");
    t.wait_comment(n, "the refusal is told", "protect the default branch")
        .await;
    t.app.wait_processed().await;
    let runs = t.app.store.runs_of(&t.issue(n)).await.expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(t.runtime.creations(&runs[0].id), 0, "nothing started");
    assert!(t.gh.pulls(REPO).is_empty());
    assert!(
        t.gh.tokens()
            .iter()
            .filter(|tk| tk.repositories.is_some())
            .all(|tk| tk.revoked),
        "the refused run's token is revoked"
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_classic_protection_requiring_a_review_makes_the_branch_pr_only() {
    let t = GithubApp::spawn(|_| {}).await;
    t.gh.protect(REPO, 1, &["someone-elses-app"]);
    let n = t.labelled("Add --verbose", "Print each step.");
    t.app.wait_state(&t.issue(n), Lifecycle::Succeeded).await;
    assert_eq!(t.gh.pulls(REPO).len(), 1);
    t.assert_contract();
}

/// The app on GitHub as App `app_id` with `key`, nothing but the forge configured.
async fn bare_app(gh: &FakeGitHub, app_id: u64, key: String) -> TestApp {
    let url = gh.url.clone();
    TestApp::spawn_overridden(
        |s| {
            s.forge.kind = director::settings::ForgeKind::Github;
            s.forge.url = url;
            s.forge.bot_login = None;
            s.github.app_id = app_id;
            s.github.private_key = Secret::new(key);
            s.scan.repos = vec![REPO.parse().expect("repo")];
            s.preflight.enabled = false;
        },
        Overrides::default(),
    )
    .await
    .0
}

/// Waits until the app has counted `GET /app` answered `status`.
async fn wait_app_answered(app: &TestApp, status: u16) {
    let line = format!(r#"director_forge_requests_total{{endpoint="/app",status="{status}"}}"#);
    wait_until(&format!("GET /app answered {status}"), || async {
        app.get("/metrics")
            .await
            .text()
            .await
            .expect("body")
            .contains(&line)
    })
    .await;
}

/// `director check-config` with a GitHub App configured from the environment.
fn check_config(key_file: &std::path::Path, extra: &[(&str, &str)]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .arg("check-config")
        .env("DIRECTOR_FORGE__KIND", "github")
        .env("DIRECTOR_FORGE__URL", "https://api.github.com")
        .env("DIRECTOR_GITHUB__APP_ID", "4242")
        .env("DIRECTOR_GITHUB__PRIVATE_KEY_FILE", key_file)
        .envs(extra.iter().copied())
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_wrong_key_is_a_clear_error_counted_in_the_metrics_never_a_crash_and_never_shown() {
    let gh = FakeGitHub::start().await;
    gh.create_repo(REPO);
    gh.install("acme", &[REPO]);
    let key = fake_github::other_key();
    let app = bare_app(&gh, APP_ID, key.clone()).await;
    wait_app_answered(&app, 401).await;
    assert!(gh.requests().iter().all(|r| r.auth.starts_with("bad-jwt")));
    assert_eq!(app.get("/healthz").await.status(), 200, "still serving");
    // The right key under another App's id is refused the same way.
    let wrong_id = bare_app(&gh, APP_ID + 1, fake_github::app_key()).await;
    wait_app_answered(&wrong_id, 401).await;

    // check-config says what is wrong with a key that is not one, and never shows it.
    let dir = tempfile::tempdir().expect("dir");
    let bad = dir.path().join("app.pem");
    std::fs::write(
        &bad,
        "-----BEGIN RSA PRIVATE KEY-----\nTOPSECRETBYTES\n-----END RSA PRIVATE KEY-----\n",
    )
    .expect("write");
    let (ok, out, err) = check_config(&bad, &[]);
    assert!(!ok);
    let text = format!("{out}{err}");
    assert!(text.contains("github.private_key"), "{text}");
    assert!(!text.contains("TOPSECRETBYTES"), "{text}");

    // A good key is accepted and shown masked; a run longer than a token's hour is refused.
    let good = dir.path().join("good.pem");
    std::fs::write(&good, &key).expect("write");
    let (ok, out, err) = check_config(&good, &[("DIRECTOR_RUNNER__TIMEOUT_SECS", "3000")]);
    assert!(ok, "{out} {err}");
    let body = key.lines().nth(1).unwrap_or_default().to_owned();
    assert!(!out.contains(&body), "the key is never printed");
    // An open run holds the token itself, so it must fit in the token's hour.
    let (ok, _, err) = check_config(
        &good,
        &[
            ("DIRECTOR_RUNNER__TIMEOUT_SECS", "3600"),
            ("DIRECTOR_RUNNER__IMAGE", "agent:1"),
            ("DIRECTOR_RUNNER__EGRESS", "open"),
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("runner.timeout_secs") && err.contains("3300"),
        "{err}"
    );
    // A confined run pushes through the gateway, which renews the token: no cap, and the
    // defaults (an hour, confined) start on GitHub.
    let (ok, out, err) = check_config(
        &good,
        &[
            ("DIRECTOR_RUNNER__TIMEOUT_SECS", "10800"),
            ("DIRECTOR_RUNNER__IMAGE", "agent:1"),
        ],
    );
    assert!(ok, "three hours, confined: {out} {err}");
    let (ok, out, err) = check_config(&good, &[("DIRECTOR_RUNNER__IMAGE", "agent:1")]);
    assert!(ok, "the default configuration on GitHub: {out} {err}");
    // Runs push to the repository there (an App owns no fork); asking for forks is refused.
    assert!(out.contains("branch_home = \"repository\""), "{out}");
    let (ok, _, err) = check_config(
        &good,
        &[
            ("DIRECTOR_RUNNER__IMAGE", "agent:1"),
            ("DIRECTOR_RUNNER__BRANCH_HOME", "fork"),
        ],
    );
    assert!(
        !ok && err.contains("runner.branch_home") && err.contains("cannot own forks"),
        "{err}"
    );
}

#[tokio::test]
async fn an_app_not_installed_on_a_watched_repository_is_named_in_the_scan() {
    let t = GithubApp::spawn(|s| {
        s.runner.enabled = false;
        s.scan.repos.push("acme/elsewhere".parse().expect("repo"));
    })
    .await;
    t.gh.create_repo("acme/elsewhere");
    let report = t
        .scanner
        .as_ref()
        .expect("scanner")
        .scan_once()
        .await
        .expect("scan");
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("not installed on acme/elsewhere")),
        "{report:?}"
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_rate_limited_answer_is_waited_out_and_a_low_budget_slows_requests_down() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    let scanner = t.scanner.as_ref().expect("scanner");
    t.gh.rate_limit_next(1);
    let before = t.gh.requests().len();
    let started = std::time::Instant::now();
    let report = scanner.scan_once().await.expect("scan");
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
    // The refused request (the first of the scan), then the same asked again once: not
    // hammered.
    let lookups = t.gh.requests()[before..]
        .iter()
        .filter(|r| r.path == "/repos/acme/widgets/installation")
        .count();
    assert_eq!(lookups, 2);

    // One left until a reset 2-3 s away: the next request waits half of that, at least a
    // second, rather than spending the last one at once.
    t.gh.report_remaining(1, 3);
    scanner.scan_once().await.expect("scan");
    let started = std::time::Instant::now();
    scanner.scan_once().await.expect("scan");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(900),
        "paced: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn github_webhooks_must_be_signed_and_go_to_a_github_director() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/github/issues-labeled.payload.json"
    ))
    .expect("payload");
    let post = |sig: String| {
        t.app
            .client
            .post(format!("{}/webhooks/github", t.app.address))
            .header("X-GitHub-Event", "issues")
            .header("X-GitHub-Delivery", "d-1")
            .header("X-Hub-Signature-256", sig)
            .body(body.clone())
            .send()
    };
    let forged = post(format!("sha256={}", "0".repeat(64)))
        .await
        .expect("sent");
    assert_eq!(forged.status(), 401);
    let good = format!(
        "sha256={}",
        director::forge::signature::sign(SECRET, body.as_bytes())
    );
    // Signed, for a repository not watched here: answered, not acted on.
    let unwatched = post(good.clone()).await.expect("sent");
    assert_eq!(unwatched.status(), 200);

    // For a watched repository: stored once; GitHub's redelivery (same GUID) and the same
    // body under another GUID are duplicates.
    let watched = body.replace(
        "\"full_name\": \"Codertocat/Hello-World\"",
        "\"full_name\": \"acme/widgets\"",
    );
    assert_ne!(watched, body);
    let signed = format!(
        "sha256={}",
        director::forge::signature::sign(SECRET, watched.as_bytes())
    );
    for (guid, want) in [("g-1", 202), ("g-1", 200), ("g-2", 200)] {
        let r = t
            .app
            .client
            .post(format!("{}/webhooks/github", t.app.address))
            .header("X-GitHub-Event", "issues")
            .header("X-GitHub-Delivery", guid)
            .header("X-Hub-Signature-256", &signed)
            .body(watched.clone())
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), want, "{guid}");
    }
    // `ping` and other events are answered and dropped.
    let ping = t
        .app
        .client
        .post(format!("{}/webhooks/github", t.app.address))
        .header("X-GitHub-Event", "ping")
        .header(
            "X-Hub-Signature-256",
            format!("sha256={}", director::forge::signature::sign(SECRET, b"{}")),
        )
        .body("{}")
        .send()
        .await
        .expect("sent");
    assert_eq!(ping.status(), 200);

    // A Forgejo director refuses GitHub's deliveries (the names would mean nothing to it).
    let forgejo = TestApp::spawn().await;
    let refused = forgejo
        .client
        .post(format!("{}/webhooks/github", forgejo.address))
        .header("X-GitHub-Event", "issues")
        .header("X-Hub-Signature-256", good)
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), 400);
}

#[tokio::test]
async fn review_feedback_starts_a_follow_up_and_a_merge_is_told_on_the_issue() {
    let t = GithubApp::spawn(|_| {}).await;
    t.gh.ruleset(REPO, "active", 1, false);
    let n = t.labelled("Add --verbose", "Print each step.");
    t.app.wait_state(&t.issue(n), Lifecycle::Succeeded).await;
    let pr = t.gh.pulls(REPO)[0].0;
    let first = t.gh.branch_head(REPO, &t.gh.pulls(REPO)[0].1);

    // A writer asks for changes: one follow-up run on the same branch, its own token.
    t.gh.review(
        REPO,
        pr,
        WRITER,
        "CHANGES_REQUESTED",
        "Rename the flag to --loud.",
    );
    t.app
        .wait_for("a follow-up ran and ended", || async {
            let runs = t.app.store.runs_of(&t.issue(n)).await.expect("runs");
            runs.len() == 2 && runs.iter().all(|r| r.finished_at_ms.is_some())
        })
        .await;
    t.app.wait_processed().await;
    assert_eq!(t.gh.pulls(REPO).len(), 1, "the same pull request");
    assert_ne!(
        t.gh.branch_head(REPO, &t.gh.pulls(REPO)[0].1),
        first,
        "the follow-up pushed to the branch"
    );
    let restricted: Vec<_> =
        t.gh.tokens()
            .into_iter()
            .filter(|tk| tk.repositories.is_some())
            .collect();
    assert_eq!(restricted.len(), 2, "one token per run");
    assert!(restricted.iter().all(|tk| tk.revoked));
    // A reader's review starts nothing (once its webhook is in and decided).
    t.gh.review(REPO, pr, READER, "CHANGES_REQUESTED", "Do it my way.");
    t.app.wait_for_metric(
        r#"director_webhook_deliveries_total{event="pull_request_review",outcome="accepted"} 2"#,
    )
    .await;
    t.app.wait_processed().await;
    assert_eq!(
        t.app.store.runs_of(&t.issue(n)).await.expect("runs").len(),
        2,
        "no run for a reader"
    );

    t.gh.merge(REPO, pr, WRITER);
    t.app.wait_state(&t.issue(n), Lifecycle::Merged).await;
    assert_eq!(
        t.app.store.runs_of(&t.issue(n)).await.expect("runs").len(),
        2
    );
    let labels = t.gh.labels_of(REPO, n);
    assert!(labels.contains(&"headless:merged".to_owned()), "{labels:?}");
    assert!(
        !labels.contains(&"headless:pr-open".to_owned()),
        "{labels:?}"
    );
    // The App's writes: comments, labels and the pull request, never a push of its own.
    let writes: Vec<(String, String)> =
        t.gh.requests()
            .into_iter()
            .filter(|r| r.auth.starts_with("token") && r.method != "GET")
            .filter(|r| r.query.is_empty() && !r.body.is_null())
            .map(|r| (r.method, r.path))
            .collect();
    assert!(
        writes
            .iter()
            .any(|(m, p)| m == "POST" && p.ends_with("/pulls"))
    );
    assert!(
        writes
            .iter()
            .any(|(m, p)| m == "POST" && p.ends_with(&format!("/issues/{n}/labels")))
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_token_github_refuses_is_told_on_the_issue_and_counted() {
    // Told at once, with the default attempts: a refusal is not retried for minutes.
    let t = GithubApp::spawn(|_| {}).await;
    t.gh.ruleset(REPO, "active", 1, false);
    // The App was granted `contents: read` only: a run token with write is refused (422).
    t.gh.set_permission(t.installation, "contents", "read");
    let n = t.labelled("Add --verbose", "Print each step.");
    t.wait_comment(n, "the failure is told on the issue", "not granted")
        .await;
    t.app
        .wait_for_metric(
            r#"endpoint="/app/installations/{installation_id}/access_tokens",status="422""#,
        )
        .await;
    assert!(t.gh.pulls(REPO).is_empty());
    let runs = t.app.store.runs_of(&t.issue(n)).await.expect("runs");
    assert!(runs.iter().all(|r| t.runtime.creations(&r.id) == 0));
    // An issue author cannot lift the label-bound trust by removing and re-adding it.
    // (The webhooks arrive after the fake answers: wait for the reader's label to be judged.)
    t.gh.unlabel(READER, REPO, n, TRIGGER);
    t.gh.label(READER, REPO, n, TRIGGER);
    t.app
        .wait_for("the reader's label is judged", || async {
            t.app
                .store
                .issue(&t.issue(n))
                .await
                .expect("query")
                .is_some_and(|r| r.trigger_actor.as_deref() == Some(READER))
        })
        .await;
    t.app.wait_processed().await;
    let record = t.record(n).await;
    assert_eq!(record.trigger_trusted, Some(false));
    assert_ne!(record.lifecycle, Lifecycle::Queued);
    t.assert_contract();
}

#[tokio::test]
async fn the_sticky_preflight_comment_is_found_by_its_marker_and_edited_in_place() {
    let t = GithubApp::spawn(|s| s.runner.enabled = false).await;
    t.llm.always("Too vague to act on.\n\nNO-GO");
    let n =
        t.gh.open_issue(REPO, "reporter", "Make it better", "Somehow.");
    t.gh.label(WRITER, REPO, n, TRIGGER);
    t.app.wait_state(&t.issue(n), Lifecycle::NoGo).await;
    assert_eq!(t.preflight_comments(n).len(), 1);
    // A writer makes it concrete: read again, and the one comment now says GO.
    t.llm.always("Clear now.\n\nGO");
    t.gh.edit_issue(
        WRITER,
        REPO,
        n,
        "Add a --verbose flag that prints each step.",
    );
    t.app.wait_state(&t.issue(n), Lifecycle::Queued).await;
    let comments = t.preflight_comments(n);
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert!(comments[0].1.contains("verdict=GO"), "{}", comments[0].1);
    let edits =
        t.gh.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/issues/comments/"))
            .count();
    assert!(edits >= 1, "edited in place");
    t.assert_contract();
}

#[tokio::test]
async fn wrong_repo_files_the_issue_in_the_named_repository_of_a_trusted_owner() {
    let t = GithubApp::spawn(|s| {
        s.runner.enabled = false;
        s.preflight.trusted_owners = vec!["acme".into()];
    })
    .await;
    t.llm.always(
        "It belongs with the gadgets.\n\nWRONG-REPO: acme/gadgets - add the /status endpoint",
    );
    let n =
        t.gh.open_issue(REPO, "reporter", "Status endpoint", "We need /status.");
    t.gh.label(WRITER, REPO, n, TRIGGER);
    t.app.wait_state(&t.issue(n), Lifecycle::Routed).await;
    let comment = &t.preflight_comments(n)[0].1;
    assert!(comment.contains("Filed as acme/gadgets#1"), "{comment}");
    let filed =
        t.gh.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path == "/repos/acme/gadgets/issues")
            .collect::<Vec<_>>();
    assert_eq!(filed.len(), 1);
    assert_eq!(filed[0].body["title"], "Status endpoint");
    assert!(
        filed[0].body["body"]
            .as_str()
            .is_some_and(|b| b.contains("acme/widgets#1") && b.contains("> We need /status.")),
        "{:?}",
        filed[0].body
    );
    t.assert_contract();
}

#[tokio::test]
async fn a_run_token_minted_before_a_restart_is_revoked_once_read_back_from_its_run() {
    use director::forge::{Forge, RunnerAccount};
    let gh = FakeGitHub::start().await;
    gh.create_repo(REPO);
    gh.install("acme", &[REPO]);
    let mut settings = director::settings::Settings::default();
    settings.forge.kind = director::settings::ForgeKind::Github;
    settings.forge.url = gh.url.clone();
    settings.github.app_id = APP_ID;
    settings.github.private_key = Secret::new(fake_github::app_key());
    let runner = RunnerAccount {
        login: String::new(),
        password: Secret::default(),
    };
    let repo: RepoName = REPO.parse().expect("repo");
    let before = director::forge::github::GithubClient::new(&settings, None).expect("client");
    let minted = before
        .mint_run_token(&runner, &repo, "director-run-r1-d1")
        .await
        .expect("minted");
    drop(before);
    // The director restarts: the new process holds no token by that name.
    let after = director::forge::github::GithubClient::new(&settings, None).expect("client");
    // It cannot be revoked without being shown, and the client says so: never a quiet Ok.
    let err = after
        .delete_run_token(&runner, "director-run-r1-d1")
        .await
        .expect_err("not held");
    assert!(
        matches!(err, director::forge::ForgeError::TokenNotHeld { .. }),
        "{err}"
    );
    assert!(
        gh.tokens().iter().all(|t| !t.revoked),
        "it could not be shown"
    );
    // The run's environment gives it back: now it is revoked, and only it.
    after.hold_run_token("director-run-r1-d1", &minted.token);
    after
        .delete_run_token(&runner, "director-run-r1-d1")
        .await
        .expect("revoked");
    let tokens = gh.tokens();
    let run = tokens
        .iter()
        .find(|t| t.value == minted.token.expose())
        .expect("minted here");
    assert!(run.revoked);
    assert!(
        tokens
            .iter()
            .filter(|t| t.value != minted.token.expose())
            .all(|t| !t.revoked),
        "the App's own token stays"
    );
    // Revoking again is not an error (GitHub answers 401 for a dead token).
    after.hold_run_token("director-run-r1-d1", &minted.token);
    after
        .delete_run_token(&runner, "director-run-r1-d1")
        .await
        .expect("already gone is done");
}

#[tokio::test]
async fn at_trace_level_the_logs_hold_neither_the_key_nor_a_jwt_nor_a_token() {
    let gh = FakeGitHub::start().await;
    gh.create_repo(REPO);
    gh.install("acme", &[REPO]);
    gh.grant(REPO, WRITER, "write");
    let llm = FakeLlm::start();
    llm.always("Clear.\n\nGO");
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    gh.set_webhook(&format!("http://127.0.0.1:{port}/webhooks/github"), SECRET);
    let (mut child, log) = serve_against(
        &gh,
        dir.path(),
        port,
        &[
            ("DIRECTOR_SCAN__REPOS", REPO.to_owned()),
            ("DIRECTOR_PREFLIGHT__BASE_URL", format!("{}/v1", llm.url)),
            ("DIRECTOR_PREFLIGHT__MODEL", "fake-model".to_owned()),
            (
                "DIRECTOR_PREFLIGHT__API_KEY",
                "llm-key-trace-9a2b".to_owned(),
            ),
            ("DIRECTOR_RUNNER__ENABLED", "false".to_owned()),
            (
                "RUST_LOG",
                "trace,octocrab=trace,hyper=trace,hyper_util=trace,tower=trace,reqwest=trace"
                    .to_owned(),
            ),
        ],
    );
    let client = crate::helpers::http_client();
    wait_until("the director answers", || async {
        client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let n = gh.open_issue(REPO, "reporter", "Add --verbose", "Print each step.");
    gh.label(WRITER, REPO, n, TRIGGER);
    wait_until("the GO comment is posted", || async {
        gh.comments(REPO, n)
            .iter()
            .any(|(_, b)| b.contains("verdict=GO"))
    })
    .await;
    child.kill().expect("stop");
    child.wait().expect("reaped");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("TRACE"), "trace level is on");
    let key = fake_github::app_key();
    let mut secrets: Vec<String> = key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_owned)
        .collect();
    secrets.push(SECRET.to_owned());
    secrets.push("llm-key-trace-9a2b".to_owned());
    let credentials = gh.credentials_seen();
    assert!(
        credentials.iter().any(|c| c.split('.').count() == 3)
            && credentials.iter().any(|c| c.starts_with("ghs_")),
        "a JWT and an installation token were used: {}",
        credentials.len()
    );
    secrets.extend(credentials);
    for (i, secret) in secrets.iter().enumerate() {
        let line = text.lines().find(|l| l.contains(secret.as_str()));
        assert!(
            line.is_none(),
            "secret {i} is in the trace log: {}",
            line.unwrap_or_default()
                .chars()
                .take(400)
                .collect::<String>()
        );
    }
}

#[tokio::test]
async fn github_enterprise_server_is_the_same_app_below_api_v3() {
    let t = GithubApp::spawn_on(FakeGitHub::start_at("/api/v3").await, |_| {}).await;
    t.gh.ruleset(REPO, "active", 1, false);
    let n = t.labelled("Add --verbose", "Print each step.");
    t.app.wait_state(&t.issue(n), Lifecycle::Succeeded).await;
    assert_eq!(t.gh.pulls(REPO).len(), 1);
    let run = t
        .app
        .store
        .runs_of(&t.issue(n))
        .await
        .expect("runs")
        .remove(0);
    let spec = t.runtime.spec_of(&run.id).expect("spec");
    let site = t.gh.url.trim_end_matches("/api/v3");
    // The API below /api/v3; git and the links on the site itself.
    assert_eq!(env(&spec, "DIRECTOR_API_URL"), t.gh.url);
    assert_eq!(
        env(&spec, "DIRECTOR_CLONE_URL"),
        format!("{site}/{REPO}.git")
    );
    assert!(
        t.gh.tokens()
            .iter()
            .any(|tk| tk.repositories.is_some() && tk.revoked)
    );
    t.assert_contract();
}

#[tokio::test]
async fn at_start_a_repository_whose_actions_run_on_the_runs_pushes_is_named() {
    // Runs push to the repository itself on GitHub: where its Actions are on, its workflows
    // run on those pushes with its secrets, and GitHub asks no one's approval.
    let gh = FakeGitHub::start().await;
    let quiet = "acme/quiet";
    gh.create_repo(REPO);
    gh.create_repo(quiet);
    gh.disable_actions(quiet);
    gh.install("acme", &[REPO, quiet]);
    let dir = tempfile::tempdir().expect("dir");
    let (mut child, log) = serve_against(
        &gh,
        dir.path(),
        free_port(),
        &[
            ("DIRECTOR_SCAN__REPOS", format!("{REPO},{quiet}")),
            ("DIRECTOR_PREFLIGHT__ENABLED", "false".to_owned()),
            ("DIRECTOR_RUNNER__IMAGE", "agent:1".to_owned()),
            ("DIRECTOR_RUNNER__EGRESS", "open".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ],
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the start-up names the repository", || async {
        said().contains("no one's approval")
    })
    .await;
    child.kill().expect("stop");
    child.wait().expect("reaped");
    let text = said();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("no one's approval"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains(REPO) && lines[0].contains("agent-code-in-ci"),
        "{text}"
    );
    assert!(
        !lines[0].contains(quiet),
        "a repository without Actions is not named: {text}"
    );
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// `director serve` as its own process on `port` against `gh` with the App's key, its log
/// (stderr) written to `dir/director.log`, configured further by `env`: the process and
/// its log's path.
fn serve_against(
    gh: &FakeGitHub,
    dir: &std::path::Path,
    port: u16,
    env: &[(&str, String)],
) -> (std::process::Child, std::path::PathBuf) {
    let key_file = dir.join("app.pem");
    std::fs::write(&key_file, fake_github::app_key()).expect("key");
    let log = dir.join("director.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .arg("serve")
        .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "DIRECTOR_STORE__URL",
            format!("sqlite://{}", dir.join("d.db").display()),
        )
        .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
        .env("DIRECTOR_FORGE__KIND", "github")
        .env("DIRECTOR_FORGE__URL", &gh.url)
        .env("DIRECTOR_GITHUB__APP_ID", APP_ID.to_string())
        .env("DIRECTOR_GITHUB__PRIVATE_KEY_FILE", &key_file)
        .env("DIRECTOR_SCAN__ENABLED", "false")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("director starts");
    (child, log)
}
