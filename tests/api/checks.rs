//! The director's checks on the real Docker engine: a repository whose `.director.toml` names
//! a small test script, a lint already failing on its base, and a probe of the check's own
//! sandbox (its network, its environment). An agent that breaks the test gets a
//! `director/checks` failure on its head and a draft pull request saying what fails; one that
//! keeps it green gets success, the base's results reused; a check that outlives its time is
//! stopped and reported. No check reaches a network or holds a secret.

use director::domain::Lifecycle;
use director::domain::checks::CONTEXT;

use crate::egress::{Network, docker};
use crate::git::git_agent_image;
use crate::helpers::http_client;
use crate::runs::{labelled, run_comments, spawn_runs, wait_ended};

const TEST: &str = "out=$(sh calc.sh)\nif [ \"$out\" = 4 ]; then echo 'ok: 2+2 is 4'; else echo \"FAIL: 2+2 is $out, want 4\"; exit 1; fi\n";
const LINT: &str = "echo 'LINT: an old problem on the base'\nexit 2\n";

/// Says what the check's sandbox holds: its interfaces, whether anything answers (the host's
/// address on the gateway's and the proxy's ports, the forge), and the names of variables
/// that look like credentials. Always exits 0: the test reads what it printed.
fn probe(host: &str, ports: &[u16]) -> String {
    let mut s = String::from("echo \"probe: interfaces $(ls /sys/class/net | tr '\\n' ' ')\"\n");
    for port in ports {
        s.push_str(&format!(
            "timeout 3 wget -q -O /dev/null http://{host}:{port}/ 2>/dev/null && echo NET-REACHED-{port}\n"
        ));
    }
    s.push_str(
        "env | cut -d= -f1 | grep -iE 'token|password|secret|key|proxy|director_git' | sed 's/^/SECRET-VAR: /'\n",
    );
    s.push_str("echo 'probe: done'\n");
    s
}

fn settings(commands: &[&str], timeout_secs: u64) -> String {
    let list = commands
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!("[checks]\ncommands = [{list}]\ntimeout_secs = {timeout_secs}\n")
}

fn host_address() -> String {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .expect("this machine has an IPv4 address")
        .to_owned()
}

#[tokio::test]
async fn sealed_checks_against_the_base_give_the_head_a_status_and_the_pull_request_its_result() {
    let network = Network(format!(
        "director-checks-test-{:08x}",
        rand::random::<u32>()
    ));
    let image = git_agent_image();
    let network_name = network.0.clone();
    let (proxy_port, gateway_port) = (crate::helpers::free_port(), crate::helpers::free_port());
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        s.runner.network = "bridge".into();
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.allow_dns_leaking_engine = true;
        s.runner.egress_network = network_name;
        s.runner.egress_proxy_port = proxy_port;
        s.runner.git_gateway_port = gateway_port;
        s.repo_settings.allow = vec!["checks".into()];
        s.server.public_url = "https://director.example.org".into();
        s.server.transcripts_public = true;
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    let host = host_address();
    let forge_port: u16 = t
        .forge_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(80);
    t.forge.put_file(&t.repo, "main", "calc.sh", b"echo 4\n");
    t.forge
        .put_file(&t.repo, "main", "test.sh", TEST.as_bytes());
    t.forge
        .put_file(&t.repo, "main", "lint.sh", LINT.as_bytes());
    t.forge.put_file(
        &t.repo,
        "main",
        "probe.sh",
        probe(&host, &[gateway_port, proxy_port, forge_port]).as_bytes(),
    );
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings(&["sh test.sh", "sh lint.sh", "sh probe.sh"], 60).as_bytes(),
    );

    // An agent that breaks the test: a failure on its head, a draft saying what fails.
    let broken = labelled(&t, "Make calc five", "mode: calc calc: 5").await;
    // Its failure is answered by a follow-up on the same branch, told the failing tail.
    crate::helpers::wait_on_engine(
        &t.app.settled,
        "the follow-up that fixes the checks ends",
        std::time::Duration::from_secs(120),
        || async {
            let runs = t.app.store.runs_of(&broken).await.expect("runs");
            runs.len() == 2
                && runs.iter().all(|r| r.finished_at_ms.is_some())
                && t.forge
                    .pulls_of(&t.repo)
                    .first()
                    .is_some_and(|p| !p.3.starts_with("WIP"))
                && t.record(&broken)
                    .await
                    .is_some_and(|r| r.lifecycle == Lifecycle::Succeeded)
        },
    )
    .await;
    t.app.wait_processed().await;
    let reports = run_comments(&t, &broken);
    let runs = t.app.store.runs_of(&broken).await.expect("runs");
    let (run, followup) = if runs[0].followup.is_none() {
        (runs[0].clone(), runs[1].clone())
    } else {
        (runs[1].clone(), runs[0].clone())
    };
    let checks = run.checks.clone().expect("the head was checked");
    let outcome = checks.outcome.clone().expect("with an outcome");
    assert_eq!(outcome.state().as_str(), "failure", "{outcome:?}");
    assert!(!outcome.baseline_reused);
    // The first head (the branch has moved on since, with the follow-up's fix).
    let head = checks.head.clone();
    assert_eq!(head.len(), 40, "{checks:?}");
    let statuses = t.forge.statuses(&t.repo, &head);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    let (state, context, description, target_url, _) = &statuses[0];
    assert_eq!(
        (state.as_str(), context.as_str()),
        ("failure", CONTEXT),
        "{statuses:?}"
    );
    assert!(description.contains("1 failing"), "{description}");
    assert!(
        description.contains("1 already failing on the base"),
        "{description}"
    );
    assert_eq!(
        target_url,
        &format!("https://director.example.org/runs/{}/checks", run.id)
    );
    let pulls = t.forge.pulls_of(&t.repo);
    assert_eq!(pulls.len(), 1, "one pull request");
    let (_, _, _, title, body) = &pulls[0];
    // Opened as a draft saying what fails; made ready once the follow-up's checks passed.
    assert_eq!(title, "Make calc five");
    assert!(
        body.contains("### Checks (`director/checks`): failure"),
        "{body}"
    );
    assert!(
        body.contains("| `sh test.sh` | passed | failed (exit 1) | regression |"),
        "{body}"
    );
    assert!(
        body.contains(
            "| `sh lint.sh` | failed (exit 2) | failed (exit 2) | already failing on the base |"
        ),
        "{body}"
    );
    assert!(
        reports.iter().any(|r| r.contains("### Checks")),
        "{reports:?}"
    );

    // The transcript, served where the status points: each command's output, and the probe
    // found no network and no credential.
    let resp = http_client()
        .get(format!("{}/runs/{}/checks", t.app.address, run.id))
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status().as_u16(), 200);
    let log = resp.text().await.expect("text");
    assert!(log.contains("FAIL: 2+2 is 5, want 4"), "{log}");
    assert!(log.contains("LINT: an old problem on the base"), "{log}");
    assert!(
        log.contains("probe: interfaces lo \n"),
        "only loopback: {log}"
    );
    assert!(log.contains("probe: done"), "{log}");
    assert!(!log.contains("NET-REACHED"), "{log}");
    assert!(!log.contains("SECRET-VAR"), "{log}");
    for secret in [
        crate::runs::RUNNER_PASSWORD,
        crate::forge_helpers::BOT_TOKEN,
    ] {
        assert!(!log.contains(secret), "{log}");
    }

    // The follow-up was told the failing command and its tail, fixed it, and its head's
    // checks passed: a success status on the new head, said on the pull request.
    let feedback = followup.followup.clone().expect("a follow-up").feedback;
    assert!(
        feedback.text.contains("FAIL: 2+2 is 5, want 4"),
        "{}",
        feedback.text
    );
    assert!(feedback.text.contains("sh test.sh"), "{}", feedback.text);
    let fixed = followup.checks.clone().expect("checked again");
    assert_eq!(
        fixed.outcome.as_ref().map(|o| o.state().as_str()),
        Some("success"),
        "{fixed:?}"
    );
    let new_head = t.forge.branch_head(&t.repo, &run.branch).expect("branch");
    assert_eq!(fixed.head, new_head);
    let statuses = t.forge.statuses(&t.repo, &new_head);
    assert_eq!(
        statuses
            .iter()
            .map(|s| (s.0.as_str(), s.1.as_str()))
            .collect::<Vec<_>>(),
        vec![("success", CONTEXT)]
    );
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1, "still one pull request");
    let answers: Vec<String> = t
        .forge
        .comments_on(&director::domain::IssueRef::new(t.repo.clone(), pulls[0].0))
        .into_iter()
        .map(|c| c.body)
        .collect();
    assert!(
        answers
            .iter()
            .any(|b| b.contains("### Checks (`director/checks`): success")),
        "{answers:?}"
    );

    // An agent that keeps it green: success, the base's results reused, a ready pull request.
    let green = labelled(&t, "Keep calc four", "mode: calc calc: 4").await;
    let record = wait_ended(&t, &green).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let run = t.app.store.runs_of(&green).await.expect("runs").remove(0);
    let outcome = run.checks.and_then(|c| c.outcome).expect("checked");
    assert_eq!(outcome.state().as_str(), "success", "{outcome:?}");
    assert!(outcome.baseline_reused, "the base ran once");
    // The figure of docs/benchmarks.md: the checks' own overhead (a workspace, the fetch,
    // the transcript) beside the commands' time, baseline reused.
    eprintln!(
        "checks: overhead {} ms, commands {} ms (baseline reused)",
        outcome.overhead_ms,
        outcome.commands_ms()
    );
    let head = t.forge.branch_head(&t.repo, &run.branch).expect("branch");
    let statuses = t.forge.statuses(&t.repo, &head);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].0, "success");
    let pulls = t.forge.pulls_of(&t.repo);
    let (_, _, _, title, body) = pulls.last().expect("a second pull request");
    assert!(!title.starts_with("WIP"), "{title}");
    assert!(
        body.contains("### Checks (`director/checks`): success"),
        "{body}"
    );
    assert!(body.contains("results were reused"), "{body}");

    // A check that outlives its time: stopped, and said.
    t.forge.put_file(
        &t.repo,
        "main",
        ".director.toml",
        settings(&["sh test.sh", "sleep 120"], 6).as_bytes(),
    );
    let slow = labelled(&t, "Keep calc four, slowly", "mode: calc calc: 4").await;
    let record = wait_ended(&t, &slow).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let run = t.app.store.runs_of(&slow).await.expect("runs").remove(0);
    let outcome = run.checks.and_then(|c| c.outcome).expect("checked");
    let sleep = &outcome.head.commands[1];
    assert!(sleep.timed_out, "{outcome:?}");
    assert!(sleep.millis < 30_000, "stopped at its limit: {sleep:?}");
    let pulls = t.forge.pulls_of(&t.repo);
    let (_, _, _, _, body) = pulls.last().expect("a third pull request");
    assert!(
        body.contains("| `sleep 120` | timed out | timed out |"),
        "{body}"
    );
    let log = http_client()
        .get(format!("{}/runs/{}/checks", t.app.address, run.id))
        .send()
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert!(log.contains("== stopped: the checks' time limit"), "{log}");

    // Nothing of the checks is left: no container, no volume.
    let (_, containers) = docker(&["ps", "-aq", "--filter", "label=director.check-of"]);
    assert!(containers.trim().is_empty(), "{containers}");
    for issue in [&broken, &green, &slow] {
        let id = t.app.store.runs_of(issue).await.expect("runs")[0]
            .id
            .clone();
        for side in ["base", "head"] {
            let volume = format!(
                "director-ws-{}",
                director::engine::act::run::checks_id(&id, side)
            );
            let (_, volumes) = docker(&["volume", "ls", "-q"]);
            assert!(!volumes.contains(&volume), "{volumes}");
        }
    }
    t.assert_contract();
}

/// The commit status through the real clients: each request fits the forge's description,
/// and the fake keeps what was posted.
#[tokio::test]
async fn a_checks_status_fits_both_forges_api_descriptions() {
    let _ = http_client();
    use director::domain::checks::StatusState;
    use director::forge::{Forge as _, NewStatus};
    let status = NewStatus {
        state: StatusState::Failure,
        context: CONTEXT.into(),
        description: "0 of 1 passed, 1 failing".into(),
        target_url: "https://director.example.org/runs/0123456789ab/checks".into(),
    };
    // GitHub: a commit status with the App's installation token.
    let gh = director_testkit::github::FakeGitHub::start().await;
    gh.create_repo("acme/widgets");
    gh.install("acme", &["acme/widgets"]);
    let root = tempfile::tempdir().expect("dir");
    gh.serve_git("acme/widgets", root.path()).expect("git");
    let sha = gh.branch_head("acme/widgets", "main").expect("main");
    let mut settings = director::settings::Settings::default();
    settings.forge.kind = director::settings::ForgeKind::Github;
    settings.forge.url = gh.url.clone();
    settings.github.app_id = director_testkit::github::APP_ID;
    settings.github.private_key =
        director::settings::Secret::new(director_testkit::github::app_key());
    let client = director::forge::github::GithubClient::new(&settings, None).expect("client");
    let repo: director::domain::RepoName = "acme/widgets".parse().expect("repo");
    let commit = director::domain::CommitSha::parse(&sha).expect("a commit");
    client
        .post_status(&repo, &commit, &status)
        .await
        .expect("posted");
    assert_eq!(
        gh.statuses("acme/widgets", &sha),
        vec![(
            "failure".to_owned(),
            CONTEXT.to_owned(),
            status.description.clone(),
            status.target_url.clone()
        )]
    );
    // A draft made ready: its title.
    let number = client
        .create_pull(&repo, "main", "main", "WIP: Add calc", "")
        .await
        .expect("opened");
    client
        .edit_pull_title(&repo, number, "Add calc")
        .await
        .expect("retitled");
    assert_eq!(
        gh.title_of("acme/widgets", number).as_deref(),
        Some("Add calc")
    );
    let v = gh.violations();
    assert!(v.is_empty(), "{v:#?}");

    // Forgejo: a commit status on a commit of the repository; one it does not hold is a 404,
    // as a fork's head is before its pull request exists.
    let forge = director_testkit::forge::FakeForge::new();
    forge.add_account(crate::forge_helpers::BOT, crate::forge_helpers::BOT_TOKEN);
    let repo = forge.add_org_repo("acme", "widgets");
    forge.grant(
        &repo,
        crate::forge_helpers::BOT,
        director::forge::Permission::Admin,
    );
    let server = forge.serve().expect("serves");
    let client = director::forge::forgejo::ForgejoClient::new(
        &director::settings::ForgeSettings {
            url: server.url().to_owned(),
            token: director::settings::Secret::new(crate::forge_helpers::BOT_TOKEN),
            timeout_secs: 5,
            max_attempts: 2,
            ..Default::default()
        },
        None,
    )
    .expect("client");
    let head = forge.branch_head(&repo, "main").expect("main");
    let commit = director::domain::CommitSha::parse(&head).expect("a commit");
    client
        .post_status(&repo, &commit, &status)
        .await
        .expect("posted");
    let kept = forge.statuses(&repo, &head);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0].0.as_str(), kept[0].1.as_str(), kept[0].3.as_str()),
        ("failure", CONTEXT, status.target_url.as_str())
    );
    let elsewhere = director::domain::CommitSha::parse(&"ab".repeat(20)).expect("sha");
    let err = client
        .post_status(&repo, &elsewhere, &status)
        .await
        .expect_err("not a commit of the repository");
    assert!(
        matches!(err, director::forge::ForgeError::NotFound { .. }),
        "{err}"
    );
    let v = forge.contract_violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// Making a draft ready through the Forgejo client: the PATCH fits the description and only
/// the title changes.
#[tokio::test]
async fn a_draft_pull_request_is_retitled_through_forgejos_api() {
    use director::forge::Forge as _;
    let _ = http_client();
    let forge = director_testkit::forge::FakeForge::new();
    forge.add_account(crate::forge_helpers::BOT, crate::forge_helpers::BOT_TOKEN);
    let repo = forge.add_org_repo("acme", "widgets");
    forge.grant(
        &repo,
        crate::forge_helpers::BOT,
        director::forge::Permission::Admin,
    );
    forge.put_file(&repo, "calc", "calc.sh", b"echo 5\n");
    let server = forge.serve().expect("serves");
    let client = director::forge::forgejo::ForgejoClient::new(
        &director::settings::ForgeSettings {
            url: server.url().to_owned(),
            token: director::settings::Secret::new(crate::forge_helpers::BOT_TOKEN),
            timeout_secs: 5,
            max_attempts: 2,
            ..Default::default()
        },
        None,
    )
    .expect("client");
    let number = client
        .create_pull(&repo, "calc", "main", "WIP: Add calc", "the body")
        .await
        .expect("opened");
    client
        .edit_pull_title(&repo, number, "Add calc")
        .await
        .expect("retitled");
    let pulls = forge.pulls_of(&repo);
    assert_eq!(
        (pulls[0].3.as_str(), pulls[0].4.as_str()),
        ("Add calc", "the body")
    );
    let v = forge.contract_violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// The base's results are kept once per repository, base commit and environment, on both
/// databases: the first kept stands, another environment is another baseline.
#[tokio::test]
async fn a_baseline_is_kept_once_per_base_commit_and_environment_on_both_databases() {
    use director::domain::checks::{CommandResult, SideResult};
    let dir = tempfile::tempdir().expect("dir");
    let pg = crate::pg::Pg::start();
    let urls = [
        format!("sqlite://{}", dir.path().join("d.db").display()),
        pg.database().await,
    ];
    let side = |exit: i64| SideResult {
        commands: vec![CommandResult {
            command: "sh test.sh".into(),
            exit: Some(exit),
            timed_out: false,
            millis: 12,
            tail: String::new(),
        }],
        error: None,
        junit: None,
        changed_tests: Vec::new(),
    };
    let repo: director::domain::RepoName = "acme/widgets".parse().expect("repo");
    for url in urls {
        let store = director::store::Store::connect(&director::settings::StoreSettings {
            url: url.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{url}: {e:#}"));
        assert_eq!(
            store
                .check_baseline(&repo, "c1", "env")
                .await
                .expect("read"),
            None
        );
        store
            .put_check_baseline(&repo, "c1", "env", &side(0), 1)
            .await
            .expect("kept");
        store
            .put_check_baseline(&repo, "c1", "env", &side(1), 2)
            .await
            .expect("a second is no error");
        assert_eq!(
            store
                .check_baseline(&repo, "c1", "env")
                .await
                .expect("read"),
            Some(side(0)),
            "{url}: the first stands"
        );
        assert_eq!(
            store
                .check_baseline(&repo, "c1", "other")
                .await
                .expect("read"),
            None,
            "{url}"
        );
        assert_eq!(
            store
                .check_baseline(&repo, "c2", "env")
                .await
                .expect("read"),
            None,
            "{url}"
        );
    }
}

const JUNIT_TEST: &str = "out=junit.xml\necho '<testsuite name=\"calc\">' > $out\nfail=0\nfor t in tests/t_*.sh; do\n  n=$(basename $t .sh)\n  if sh $t; then echo \"<testcase classname=\\\"calc\\\" name=\\\"$n\\\"/>\" >> $out\n  else echo \"<testcase classname=\\\"calc\\\" name=\\\"$n\\\"><failure/></testcase>\" >> $out; fail=1; fi\ndone\necho '</testsuite>' >> $out\nexit $fail\n";

#[tokio::test]
async fn an_agent_that_deletes_the_failing_test_is_reported_as_removing_it() {
    let network = Network(format!(
        "director-checks-junit-{:08x}",
        rand::random::<u32>()
    ));
    let image = git_agent_image();
    let network_name = network.0.clone();
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        crate::egress::confine(s, &network_name);
        s.runner.max_check_followups = 0;
        s.checks.commands = vec!["sh test.sh".into()];
        s.checks.junit = vec!["junit.xml".into()];
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    t.forge.put_file(&t.repo, "main", "calc.sh", b"echo 4\n");
    t.forge
        .put_file(&t.repo, "main", "test.sh", JUNIT_TEST.as_bytes());
    t.forge.put_file(
        &t.repo,
        "main",
        "tests/t_add.sh",
        b"[ \"$(sh calc.sh)\" = 4 ] || { echo 'FAIL: 2+2'; exit 1; }\n",
    );
    t.forge
        .put_file(&t.repo, "main", "tests/t_sub.sh", b"[ $((5-3)) = 2 ]\n");
    let issue = labelled(
        &t,
        "Make calc five",
        "mode: calc calc: 5 delete: tests/t_add.sh",
    )
    .await;
    let record = wait_ended(&t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Succeeded);
    let run = t.app.store.runs_of(&issue).await.expect("runs").remove(0);
    let checks = run.checks.expect("checked");
    let outcome = checks.outcome.expect("an outcome");
    assert!(
        outcome.head.commands[0].passed(),
        "the command passes without the test: {outcome:?}"
    );
    assert_eq!(outcome.removed(), vec!["calc.t_add"], "{outcome:?}");
    assert_eq!(outcome.state().as_str(), "failure");
    let statuses = t.forge.statuses(&t.repo, &checks.head);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].0, "failure");
    assert!(
        statuses[0].2.contains("1 test(s) removed or skipped"),
        "{statuses:?}"
    );
    let pulls = t.forge.pulls_of(&t.repo);
    let (_, _, _, title, body) = &pulls[0];
    assert!(title.starts_with("WIP: "), "{title}");
    assert!(body.contains("`calc.t_add`"), "{body}");
    assert!(
        body.contains("Test files this change touched (1): `tests/t_add.sh`"),
        "{body}"
    );
    t.assert_contract();
}
