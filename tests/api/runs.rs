//! Coder runs against the real Docker engine, with FakeForge and a fake model. The image is
//! built in the test setup from scratch: a static busybox and `tests/agent/agent.sh`, which
//! plays the agent and pushes its branch through the API with the run token.

use director::domain::RunId;
use std::process::Command;
use std::time::Duration;

use director::domain::{IssueRef, Lifecycle};
use director::forge::Permission;

use crate::forge_helpers::{BOT, ForgeApp, TRIGGER, WRITER};

pub const RUNNER: &str = "director-runner";
pub const RUNNER_PASSWORD: &str = "runner-pass-9d2f";
const GO: &str = "Context to front-load: none.\n\nFine.\n\nGO";

/// Builds the agent image once per content (tagged by its hash) and returns the tag.
pub fn agent_image() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agent");
    let read = |name: &str| std::fs::read(format!("{dir}/{name}")).expect(name);
    let busybox =
        std::fs::read("/bin/busybox").expect("busybox-static is installed (.ci/run installs it)");
    build_image(
        "director-test-agent",
        &String::from_utf8_lossy(&read("Dockerfile")),
        vec![
            ("agent.sh".into(), read("agent.sh")),
            ("busybox".into(), busybox),
        ],
    )
}

/// Builds an image from `dockerfile` and `files` (paths in the build context, all made
/// executable) unless one of the same content exists; returns `name:<content hash>`.
pub fn build_image(name: &str, dockerfile: &str, files: Vec<(String, Vec<u8>)>) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(dockerfile);
    for (path, data) in &files {
        h.update(path);
        h.update(data);
    }
    let tag = format!("{name}:{}", &hex::encode(h.finalize())[..12]);
    let present = Command::new("docker")
        .args(["image", "inspect", &tag])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return tag;
    }
    let ctx = tempfile::tempdir().expect("dir");
    std::fs::write(ctx.path().join("Dockerfile"), dockerfile).expect("write");
    for (path, data) in &files {
        let path = ctx.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, data).expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let out = Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(ctx.path())
        .output()
        .expect("docker build runs");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tag
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Containers (any state) of the given runs. Tests share the engine, so runs are told
/// apart by id, never by repository and issue number.
fn containers_of_runs(run_ids: &[RunId]) -> Vec<String> {
    labelled_containers(run_ids, &["-a"])
}

/// The runs' containers that are running now (not merely created).
fn running_containers_of_runs(run_ids: &[RunId]) -> Vec<String> {
    labelled_containers(run_ids, &["--filter", "status=running"])
}

fn labelled_containers(run_ids: &[RunId], filter: &[&str]) -> Vec<String> {
    run_ids
        .iter()
        .flat_map(|id| {
            let label = format!("label=director.run-id={id}");
            let mut args = vec!["ps", "-q", "--filter", &label];
            args.extend_from_slice(filter);
            docker(&args).lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect()
}

async fn run_ids(t: &ForgeApp, issue: &IssueRef) -> Vec<RunId> {
    t.app
        .store
        .runs_of(issue)
        .await
        .expect("runs")
        .into_iter()
        .map(|r| r.id.clone())
        .collect()
}

async fn containers_of(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    containers_of_runs(&run_ids(t, issue).await)
}

/// How many containers the engine created for a run since `since` (a unix timestamp).
pub fn creations(run_id: &RunId, since: i64) -> usize {
    docker(&[
        "events",
        "--since",
        &since.to_string(),
        "--until",
        &(chrono::Utc::now().timestamp() + 1).to_string(),
        "--filter",
        "event=create",
        "--filter",
        &format!("label=director.run-id={run_id}"),
        "--format",
        "{{.ID}}",
    ])
    .lines()
    .filter(|l| !l.trim().is_empty())
    .count()
}

/// What a `director serve` process needs to start runs with the test agent image, as the
/// environment, after the forge has let the runner account in ([`admit_runner`]).
pub fn runner_env() -> Vec<(String, String)> {
    [
        ("DIRECTOR_FORGE__RUNNER_LOGIN", RUNNER.to_owned()),
        (
            "DIRECTOR_FORGE__RUNNER_PASSWORD",
            RUNNER_PASSWORD.to_owned(),
        ),
        ("DIRECTOR_RUNNER__IMAGE", agent_image()),
        ("DIRECTOR_RUNNER__NETWORK", "host".to_owned()),
        ("DIRECTOR_RUNNER__EGRESS", "open".to_owned()),
        ("DIRECTOR_RUNNER__MEMORY_MB", "256".to_owned()),
        ("DIRECTOR_RUNNER__TIMEOUT_SECS", "60".to_owned()),
        // These runs push to the repository; the fork tests choose forks.
        ("DIRECTOR_RUNNER__BRANCH_HOME", "repository".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The runner account: write access to `repo`, and a password to mint its tokens with.
pub fn admit_runner(forge: &director_testkit::forge::FakeForge, repo: &director::domain::RepoName) {
    forge.grant(repo, RUNNER, Permission::Write);
    forge.set_password(RUNNER, RUNNER_PASSWORD);
}

pub async fn spawn_runs(
    configure: impl FnOnce(&mut director::settings::Settings),
) -> (ForgeApp, director_testkit::llm::FakeLlm) {
    let image = agent_image();
    let (t, llm) = ForgeApp::spawn_with_llm(|s| {
        s.forge.runner_login = RUNNER.into();
        s.forge.runner_password = director::settings::Secret::new(RUNNER_PASSWORD);
        s.runner.image = image;
        s.runner.network = "host".into();
        s.runner.timeout_secs = 60;
        s.runner.memory_mb = 256;
        s.runner.tmp_mb = Some(64);
        s.runner.cpus = 1.0;
        s.runner.pids_limit = 64;
        configure(s);
    })
    .await;
    t.forge.set_password(RUNNER, RUNNER_PASSWORD);
    t.forge.grant(&t.repo, RUNNER, Permission::Write);
    let other = t.forge.add_repo("acme/other");
    t.forge.grant(&other, RUNNER, Permission::Write);
    llm.always(GO);
    (t, llm)
}

pub async fn labelled(t: &ForgeApp, title: &str, body: &str) -> IssueRef {
    let issue = t.forge.open_issue(&t.repo, "reporter", title, body).await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    issue
}

pub async fn wait_ended(t: &ForgeApp, issue: &IssueRef) -> director::store::IssueRecord {
    // Room for containers to start and stop.
    let within = Duration::from_secs(60);
    crate::helpers::wait_on_engine(&t.app.settled, &format!("{issue} ends"), within, || async {
        t.record(issue).await.is_some_and(|r| {
            matches!(
                r.lifecycle,
                Lifecycle::Succeeded
                    | Lifecycle::Failed
                    | Lifecycle::TimedOut
                    | Lifecycle::Cancelled
                    | Lifecycle::Declined
                    | Lifecycle::OverBudget
            )
        })
    })
    .await;
    t.app.wait_processed().await;
    t.record(issue).await.expect("known")
}

/// Like `wait_until`, with room for containers to start and stop.
async fn wait_until_long<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    crate::helpers::poll_until(what, Duration::from_secs(60), check, String::new).await;
}

pub fn run_comments(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    t.forge
        .comments_on(issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:run "))
        .map(|c| c.body)
        .collect()
}

#[tokio::test]
async fn a_go_issue_runs_hardened_and_ends_in_one_pull_request_with_the_token_revoked() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.\nmode: slow").await;
    // Inspect the container while it runs.
    wait_until_long("the container runs", || async {
        !containers_of(&t, &issue).await.is_empty()
    })
    .await;
    let id = containers_of(&t, &issue).await.remove(0);
    let inspect: serde_json::Value =
        serde_json::from_str(&docker(&["inspect", &id])).expect("inspect JSON");
    let c = &inspect[0];
    assert_eq!(c["Config"]["User"], "1000:1000");
    assert_eq!(c["HostConfig"]["CapDrop"], serde_json::json!(["ALL"]));
    assert_eq!(
        c["HostConfig"]["SecurityOpt"],
        serde_json::json!(["no-new-privileges:true"])
    );
    assert_eq!(c["HostConfig"]["ReadonlyRootfs"], true);
    assert_eq!(c["HostConfig"]["Memory"], 256 * 1024 * 1024);
    assert_eq!(c["HostConfig"]["NanoCpus"], 1_000_000_000i64);
    assert_eq!(c["HostConfig"]["PidsLimit"], 64);
    assert_eq!(c["HostConfig"]["NetworkMode"], "host");
    assert!(
        c["HostConfig"]["Tmpfs"]["/workspace"]
            .as_str()
            .expect("tmpfs")
            .contains("size=2048m")
    );
    // A writable /tmp, programs allowed (an agent runs what it builds there).
    let tmp = c["HostConfig"]["Tmpfs"]["/tmp"].as_str().expect("a /tmp");
    assert!(
        tmp.contains("size=64m") && tmp.contains("exec") && !tmp.contains("noexec"),
        "{tmp}"
    );
    assert_eq!(c["Config"]["Labels"]["director.repo"], "acme/widgets");
    assert_eq!(
        c["Config"]["Labels"]["director.issue"],
        issue.number.to_string()
    );
    let env: Vec<String> = serde_json::from_value(c["Config"]["Env"].clone()).expect("env");
    for var in [
        "DIRECTOR_RUN_ID",
        "DIRECTOR_REPO",
        "DIRECTOR_ISSUE",
        "DIRECTOR_BASE_BRANCH",
        "DIRECTOR_BRANCH",
        "DIRECTOR_CLONE_URL",
        "DIRECTOR_TOKEN",
        "DIRECTOR_TASK_FILE",
        "TMPDIR",
    ] {
        assert!(
            env.iter().any(|e| e.starts_with(&format!("{var}="))),
            "{var} missing: {env:?}"
        );
    }
    assert!(
        !env.iter()
            .any(|e| e.contains(crate::forge_helpers::BOT_TOKEN) || e.contains(RUNNER_PASSWORD)),
        "no bot token or runner password in a run"
    );

    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let pulls = t.forge.pulls_of(&t.repo);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let (pr, head, base, title, body) = &pulls[0];
    assert!(head.starts_with(&format!("director-issue-{}-", issue.number)));
    assert_eq!(base, "main");
    assert_eq!(title, "Add --verbose");
    assert!(
        body.contains(&format!("Closes #{}", issue.number)) && body.contains("GO"),
        "{body}"
    );
    let reports = run_comments(&t, &issue);
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].contains(&format!("pull request #{pr}")),
        "{}",
        reports[0]
    );
    // The token was the runner's, restricted to this repository, and is gone.
    let minted = t.forge.minted_tokens();
    assert_eq!(minted.len(), 1);
    assert_eq!(
        minted[0].0, RUNNER,
        "minted for the runner account, never the bot"
    );
    assert!(minted[0].1.starts_with("director-run-"));
    assert!(
        t.forge.tokens_of(RUNNER).is_empty(),
        "the run token is revoked"
    );
    assert!(t.forge.tokens_of(BOT).is_empty());
    wait_until_long("the state label says a PR is open", || async {
        let labels = t.forge.labels_on(&issue);
        labels.contains(&"headless:pr-open".to_owned())
            && !labels.contains(&"headless:queued".to_owned())
            && !labels.contains(&"headless:running".to_owned())
    })
    .await;
    wait_until_long("the container is removed", || async {
        containers_of(&t, &issue).await.is_empty()
    })
    .await;
    t.assert_contract();
}

#[tokio::test]
async fn the_run_token_is_refused_on_any_other_repository() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Try elsewhere", "mode: other").await;
    let record = wait_ended(&t, &issue).await;
    // The agent pushes its own branch only when the other repository refused the token.
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let other: director::domain::RepoName = "acme/other".parse().expect("repo");
    assert_eq!(t.forge.branches_of(&other), vec!["main".to_owned()]);
    let refused = t
        .forge
        .calls()
        .into_iter()
        .filter(|c| c.path.contains("/repos/acme/other/contents") && c.status == 403)
        .count();
    assert_eq!(refused, 1);
}

#[tokio::test]
async fn exit_zero_without_a_branch_is_a_failure() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Nothing", "mode: nobranch").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let reports = run_comments(&t, &issue);
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].contains("exited with code 0") && reports[0].contains("not ahead"),
        "{}",
        reports[0]
    );
    assert!(
        reports[0].contains("nothing to do"),
        "the log tail is posted: {}",
        reports[0]
    );
    assert!(t.forge.pulls_of(&t.repo).is_empty());
    assert!(t.forge.tokens_of(RUNNER).is_empty());
}

#[tokio::test]
async fn an_image_without_a_shell_is_refused_saying_what_the_contract_needs() {
    // An image with one file and no program at all: the engine cannot start its command.
    let image = build_image(
        "director-test-noshell",
        "FROM scratch\nCOPY marker /marker\n",
        vec![("marker".into(), b"no shell here\n".to_vec())],
    );
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/usr/local/bin/director-entrypoint".into()];
    })
    .await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let reports = run_comments(&t, &issue);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        reports[0].contains("its image cannot start its command")
            && reports[0].contains("/usr/local/bin/director-entrypoint")
            && reports[0].contains("a POSIX shell at /bin/sh and git"),
        "{}",
        reports[0]
    );
    // Refused at once (no retries for minutes), nothing left behind.
    assert!(
        containers_of(&t, &issue).await.is_empty(),
        "the container is removed"
    );
    assert!(t.forge.tokens_of(RUNNER).is_empty(), "the token is revoked");
    assert!(t.forge.pulls_of(&t.repo).is_empty());
}

#[tokio::test]
async fn a_run_past_its_timeout_is_killed_and_its_token_revoked() {
    let (t, _llm) = spawn_runs(|s| {
        s.runner.timeout_secs = 2;
        s.runner.stop_grace_secs = 1;
    })
    .await;
    let issue = labelled(&t, "Forever", "mode: sleep").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::TimedOut);
    assert!(run_comments(&t, &issue)[0].contains("outlived `runner.timeout_secs` (2 s)"));
    assert!(t.forge.tokens_of(RUNNER).is_empty());
    wait_until_long("the container is removed", || async {
        containers_of(&t, &issue).await.is_empty()
    })
    .await;
}

#[tokio::test]
async fn removing_the_label_mid_run_stops_the_container_and_revokes_the_token() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Stop me", "mode: sleep").await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    assert_eq!(t.forge.tokens_of(RUNNER).len(), 1);
    let ids = run_ids(&t, &issue).await;
    assert_eq!(containers_of_runs(&ids).len(), 1);
    t.forge.unlabel(WRITER, &issue, TRIGGER).await;
    wait_until_long("the container is gone", || async {
        containers_of_runs(&ids).is_empty()
    })
    .await;
    wait_until_long("the token is revoked", || async {
        t.forge.tokens_of(RUNNER).is_empty()
    })
    .await;
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Cancelled
    );
    wait_until_long("the issue is told", || async {
        !run_comments(&t, &issue).is_empty()
    })
    .await;
    assert!(run_comments(&t, &issue)[0].contains("was stopped"));
}

#[tokio::test]
async fn a_pushable_default_branch_is_refused_before_any_container() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    t.forge.unprotect_default_branch(&t.repo);
    let since = chrono::Utc::now().timestamp() - 1;
    let issue = labelled(&t, "Unprotected", "").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let reports = run_comments(&t, &issue);
    assert!(
        reports[0].contains("refused") && reports[0].contains("can push to and merge into `main`"),
        "{}",
        reports[0]
    );
    assert!(t.forge.tokens_of(RUNNER).is_empty(), "the token is revoked");
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, director::domain::RunState::Refused);
    assert_eq!(creations(&runs[0].id, since), 0, "no container was created");
}

#[tokio::test]
async fn a_token_printed_by_the_run_is_redacted_in_the_comment() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Leaky", "mode: leak").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let token = t.forge.minted_tokens()[0].2.clone();
    let report = &run_comments(&t, &issue)[0];
    assert!(report.contains("my token is [redacted]"), "{report}");
    assert!(!report.contains(&token));
    for c in t.forge.comments_on(&issue) {
        assert!(
            !c.body.contains(&token),
            "a comment leaks the token: {}",
            c.body
        );
    }
    // The whole output, followed from Docker as it came, is kept redacted too.
    let id = run_ids(&t, &issue).await.pop().expect("a run");
    let transcript = t
        .app
        .store
        .transcript(&id)
        .await
        .expect("store")
        .expect("a transcript");
    assert!(
        transcript.text.contains(&format!("agent: run {id} for"))
            && transcript.text.contains("my token is [redacted]"),
        "{}",
        transcript.text
    );
    assert!(!transcript.text.contains(&token));
    assert_eq!(transcript.text.matches("agent: run").count(), 1, "once");
}

#[tokio::test]
async fn with_a_limit_of_one_three_go_issues_run_one_after_another() {
    let (t, _llm) = spawn_runs(|s| s.runner.max_concurrent = 1).await;
    let mut issues = Vec::new();
    for n in 0..3 {
        issues.push(labelled(&t, &format!("Queue {n}"), "mode: slow").await);
    }
    // While the first runs, the others wait with their queue positions.
    wait_until_long("one runs, two wait", || async {
        let all = t.app.store.list_issues().await.expect("list");
        all.iter()
            .filter(|r| r.lifecycle == Lifecycle::Running)
            .count()
            == 1
            && all
                .iter()
                .filter(|r| r.lifecycle == Lifecycle::Queued)
                .count()
                == 2
    })
    .await;
    let out = Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["status", "--json"])
        .env("DIRECTOR_STORE__URL", t.app.db_url())
        .output()
        .expect("status runs");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut positions: Vec<u64> = rows
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["queue_position"].as_u64())
        .collect();
    positions.sort();
    assert_eq!(positions, vec![1, 2]);
    for issue in &issues {
        assert_eq!(wait_ended(&t, issue).await.lifecycle, Lifecycle::Succeeded);
    }
    let mut spans = Vec::new();
    for issue in &issues {
        let runs = t.app.store.runs_of(issue).await.expect("runs");
        assert_eq!(runs.len(), 1);
        spans.push((
            runs[0].started_at_ms.expect("started"),
            runs[0].finished_at_ms.expect("finished"),
        ));
    }
    spans.sort();
    assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "runs overlapped: {spans:?}"
    );
}

#[tokio::test]
async fn a_director_killed_mid_run_adopts_the_run_after_restart_and_one_container_ever_exists() {
    use director_testkit::forge::FakeForge;
    let image = agent_image();
    let forge = FakeForge::new();
    forge.add_account(BOT, crate::forge_helpers::BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    forge.grant(&repo, BOT, Permission::Admin);
    forge.grant(&repo, WRITER, Permission::Write);
    forge.grant(&repo, RUNNER, Permission::Write);
    forge.set_password(RUNNER, RUNNER_PASSWORD);
    forge.define_label(&repo, TRIGGER);
    let server = forge.serve().expect("serves");
    let llm = director_testkit::llm::FakeLlm::start();
    llm.always(GO);
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}", dir.path().join("director.db").display());
    let start = |port: u16| {
        Command::new(env!("CARGO_BIN_EXE_director"))
            .arg("serve")
            .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("DIRECTOR_STORE__URL", &db)
            .env("DIRECTOR_WEBHOOK__SECRETS", crate::helpers::SECRET)
            .env("DIRECTOR_FORGE__URL", server.url())
            .env("DIRECTOR_FORGE__TOKEN", crate::forge_helpers::BOT_TOKEN)
            .env("DIRECTOR_FORGE__RUNNER_LOGIN", RUNNER)
            .env("DIRECTOR_FORGE__RUNNER_PASSWORD", RUNNER_PASSWORD)
            .env("DIRECTOR_RUNNER__BRANCH_HOME", "repository")
            .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
            .env("DIRECTOR_SCAN__ENABLED", "false")
            .env("DIRECTOR_PREFLIGHT__BASE_URL", format!("{}/v1", llm.url))
            .env("DIRECTOR_PREFLIGHT__MODEL", "fake-model")
            .env("DIRECTOR_RUNNER__IMAGE", &image)
            .env("DIRECTOR_RUNNER__NETWORK", "host")
            .env("DIRECTOR_RUNNER__EGRESS", "open")
            .env("DIRECTOR_RUNNER__MEMORY_MB", "256")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.path().join("director.log"))
                    .expect("log file"),
            )
            .spawn()
            .expect("director starts")
    };
    let free_port = crate::helpers::free_port;
    let client = crate::helpers::http_client();
    let healthy = |port: u16| {
        let client = client.clone();
        async move {
            wait_until_long("director answers /healthz", || async {
                client
                    .get(format!("http://127.0.0.1:{port}/healthz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await;
        }
    };

    let port = free_port();
    forge.set_webhook(
        &format!("http://127.0.0.1:{port}/webhooks/forgejo"),
        crate::helpers::SECRET,
    );
    let mut child = start(port);
    healthy(port).await;
    let since = chrono::Utc::now().timestamp() - 1;
    let issue = forge
        .open_issue(&repo, "reporter", "Survive", "mode: slow")
        .await;
    forge.label(WRITER, &issue, TRIGGER).await;
    let store = director::store::Store::connect(&director::settings::StoreSettings {
        url: db.clone(),
        ..Default::default()
    })
    .await
    .expect("db");
    // Running, not merely created: killed between the creation and the task's copy, the
    // director rightly makes the container again (another test holds it to that).
    wait_until_long("the container runs", || async {
        let ids: Vec<RunId> = store
            .runs_of(&issue)
            .await
            .expect("runs")
            .into_iter()
            .map(|r| r.id.clone())
            .collect();
        !running_containers_of_runs(&ids).is_empty()
    })
    .await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let port = free_port();
    forge.set_webhook(
        &format!("http://127.0.0.1:{port}/webhooks/forgejo"),
        crate::helpers::SECRET,
    );
    let mut child = start(port);
    healthy(port).await;
    let log_path = dir.path().join("director.log");
    crate::helpers::poll_until(
        "the adopted run opens its pull request",
        Duration::from_secs(60),
        || async { forge.pulls_of(&repo).len() == 1 },
        || {
            format!(
                "the director said:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            )
        },
    )
    .await;
    wait_until_long("the token is revoked", || async {
        forge.tokens_of(RUNNER).is_empty()
    })
    .await;
    let runs = store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 1, "one run");
    assert_eq!(
        creations(&runs[0].id, since),
        1,
        "exactly one container ever existed for the run"
    );
    assert_eq!(forge.minted_tokens().len(), 1, "one token for the one run");
    wait_until_long("the run is recorded as succeeded", || async {
        store
            .runs_of(&issue)
            .await
            .is_ok_and(|r| r[0].state == director::domain::RunState::Succeeded)
    })
    .await;
    child.kill().expect("stop");
    child.wait().expect("reaped");
    assert!(
        forge.contract_violations().is_empty(),
        "{:?}",
        forge.contract_violations()
    );
}

#[tokio::test]
async fn director_cancel_and_retry_count_only_from_writers() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Commands", "mode: sleep").await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    t.forge
        .comment(crate::forge_helpers::READER, &issue, "/director cancel")
        .await;
    t.app.wait_processed().await;
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Running,
        "a reader cannot cancel"
    );

    t.forge.comment(WRITER, &issue, "/director cancel").await;
    let ids = run_ids(&t, &issue).await;
    wait_until_long("the container is gone", || async {
        containers_of_runs(&ids).is_empty()
    })
    .await;
    wait_until_long("the token is revoked", || async {
        t.forge.tokens_of(RUNNER).is_empty()
    })
    .await;
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Cancelled
    );
    wait_until_long("one report", || async {
        run_comments(&t, &issue).len() == 1
    })
    .await;

    t.forge
        .comment(crate::forge_helpers::READER, &issue, "/director retry")
        .await;
    t.app.wait_processed().await;
    assert_eq!(
        t.record(&issue).await.expect("known").lifecycle,
        Lifecycle::Cancelled,
        "a reader cannot retry"
    );
    t.forge.comment(WRITER, &issue, "/director retry").await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 2, "a fresh run");
    assert_ne!(runs[0].id, runs[1].id);
    assert_eq!(runs[0].state, director::domain::RunState::Cancelled);
    t.forge.unlabel(WRITER, &issue, TRIGGER).await;
    wait_until_long("the second run stops", || async {
        t.app.store.active_runs().await.is_ok_and(|a| a.is_empty())
    })
    .await;
    wait_until_long("one report per run", || async {
        run_comments(&t, &issue).len() == 2
    })
    .await;
}

#[tokio::test]
async fn run_tokens_left_behind_are_deleted_and_another_directors_live_tokens_kept() {
    use director::forge::{Forge, RunnerAccount};
    use director_testkit::forge::FakeForge;
    let forge = FakeForge::new();
    forge.add_account(BOT, crate::forge_helpers::BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    forge.set_password(RUNNER, RUNNER_PASSWORD);
    let runner = RunnerAccount {
        login: RUNNER.into(),
        password: director::settings::Secret::new(RUNNER_PASSWORD),
    };
    let dir = tempfile::tempdir().expect("dir");
    let store = director::store::Store::connect(&director::settings::StoreSettings {
        url: format!("sqlite://{}", dir.path().join("d.db").display()),
        ..Default::default()
    })
    .await
    .expect("store");
    let me = store.director_id().await.expect("id");
    assert_eq!(store.director_id().await.expect("id"), me, "stable");
    // A run of ours still active, and one that ended before its token was revoked.
    let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
    let mut ended =
        director::domain::RunRecord::admitted(&issue, crate::helpers::rid("01d0000000aa"), "b1", 1);
    ended.state = director::domain::RunState::Failed;
    let live =
        director::domain::RunRecord::admitted(&issue, crate::helpers::rid("11fe000000bb"), "b2", 2);
    store
        .commit(
            &director::store::Commit {
                runs: vec![ended, live],
                ..Default::default()
            },
            3,
        )
        .await
        .expect("runs");
    for name in [
        format!("director-run-01d0000000aa-{me}"),
        format!("director-run-11fe000000bb-{me}"),
        format!("director-run-deadbeef0000-{me}"),
        // Another director sharing the runner account: its live run's token.
        "director-run-0a1e000000cc-0badf00d".to_owned(),
        // Named before directors named themselves: ours only if our database knows the run.
        "director-run-01d0000000aa".to_owned(),
        "director-run-50fe000000dd".to_owned(),
        "laptop".to_owned(),
    ] {
        forge
            .mint_run_token(&runner, &repo, &name)
            .await
            .expect("mint");
    }
    director::engine::act::run::sweep_tokens(&forge, &store, &runner, &me)
        .await
        .expect("sweep");
    let mut names: Vec<String> = forge.tokens_of(RUNNER).into_iter().map(|t| t.0).collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "director-run-0a1e000000cc-0badf00d".to_owned(),
            format!("director-run-11fe000000bb-{me}"),
            "director-run-50fe000000dd".to_owned(),
            "laptop".to_owned(),
        ]
    );
}

#[tokio::test]
async fn the_result_file_a_run_leaves_is_read_after_its_container_ends() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Write it down", "mode: result").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let pulls = t.forge.pulls_of(&t.repo);
    assert!(pulls[0].4.contains("Wrote agent.txt."), "{}", pulls[0].4);
    assert!(run_comments(&t, &issue)[0].contains("321 input and 45 output tokens"));
}

#[tokio::test]
async fn at_the_time_limit_a_run_gets_a_stop_signal_and_its_pushed_branch_is_named() {
    let (t, _llm) = spawn_runs(|s| {
        s.runner.timeout_secs = 2;
        s.runner.stop_grace_secs = 10;
    })
    .await;
    let issue = labelled(&t, "Slow work", "mode: grace").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::TimedOut);
    let report = run_comments(&t, &issue).remove(0);
    assert!(
        report.contains("outlived `runner.timeout_secs` (2 s)"),
        "{report}"
    );
    assert!(
        report.contains("1 commit(s) ahead of `main`"),
        "pushed in the grace: {report}"
    );
    assert!(report.contains("pushed at the stop signal"), "{report}");
    assert!(t.forge.pulls_of(&t.repo).is_empty(), "named, not opened");
}

#[tokio::test]
async fn a_run_that_prints_nothing_for_the_idle_limit_is_stopped_the_same_way() {
    let (t, _llm) = spawn_runs(|s| {
        s.runner.idle_timeout_secs = 2;
        s.runner.stop_grace_secs = 10;
    })
    .await;
    let issue = labelled(&t, "Wedged", "mode: grace").await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::TimedOut);
    let report = run_comments(&t, &issue).remove(0);
    assert!(
        report.contains("printed nothing for `runner.idle_timeout_secs` (2 s)"),
        "{report}"
    );
    assert!(report.contains("ahead of `main`"), "{report}");
}

#[tokio::test]
async fn a_writers_review_gets_a_follow_up_container_that_pushes_to_the_pr() {
    let (t, _llm) = spawn_runs(|_| {}).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    assert_eq!(wait_ended(&t, &issue).await.lifecycle, Lifecycle::Succeeded);
    let pr = t.forge.pulls_of(&t.repo)[0].0;
    t.forge
        .review(
            WRITER,
            &t.repo,
            pr,
            director_testkit::forge::ReviewEvent::RequestChanges,
            "Rename the flag.",
            &[],
        )
        .await;
    wait_until_long("the follow-up succeeds", || async {
        let runs = t.app.store.runs_of(&issue).await.expect("runs");
        runs.len() == 2 && runs[1].state == director::domain::RunState::Succeeded
    })
    .await;
    t.app.wait_processed().await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs[1].branch, runs[0].branch);
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1);
    assert!(t.forge.tokens_of(RUNNER).is_empty());
    wait_until_long("the follow-up's container is removed", || async {
        containers_of_runs(&[runs[1].id.clone()]).is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_created_container_is_told_apart_by_whether_its_task_is_in_it() {
    use director::runtime::{RunSpec, Runtime, docker::DockerRuntime};
    let image = agent_image();
    let settings = director::settings::RunnerSettings {
        image: image.clone(),
        network: "none".into(),
        ..Default::default()
    };
    let rt = DockerRuntime::connect(settings).await.expect("the engine");
    let run_id = RunId::random();
    let spec = RunSpec {
        run_id: run_id.clone(),
        image: image.clone(),
        command: vec!["/bin/true".into()],
        env: Vec::new(),
        labels: Default::default(),
        task_path: "/run/director/task.md".into(),
        task: b"# A task".to_vec(),
        mounts: Vec::new(),
        result_path: None,
        confined: false,
        workspace_volume: None,
        setup_phase: false,
    };
    // Created, never started: the state an adopting attempt finds after a crash.
    let with_task = rt.create(&spec).await.expect("created");
    assert!(
        rt.has_task(&with_task, &spec.task_path)
            .await
            .expect("asked"),
        "the task was copied in"
    );
    let name = format!("director-test-bare-{run_id}");
    let created = Command::new("docker")
        .args(["create", "--name", &name, &image, "/bin/true"])
        .output()
        .expect("docker runs");
    assert!(created.status.success());
    let bare = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    let has = rt.has_task(&bare, &spec.task_path).await;
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    rt.remove(&with_task).await.expect("removed");
    assert!(
        !has.expect("asked"),
        "no task in a container made without one"
    );
}
