//! Runs in a sandbox runtime and grants in the thread. With gVisor's `runsc` registered in the
//! real Docker engine (`tests/runtimes/register-runsc.sh`, which `.ci/run` calls), a confined
//! run under `runner.oci_runtime = "runsc"` clones through the git gateway, calls the model
//! gateway and pushes, and its pull request opens; a runtime the engine does not list stops
//! the director from starting. On the fake Kubernetes API the pod carries its RuntimeClass. In
//! the thread, a writer approves a refused host (a reader cannot, nor beyond the globs, nor
//! for another issue) and the refused run goes again and reaches it.

use std::process::Command;

use director::domain::{IssueRef, Lifecycle};
use director::settings::Secret;

use crate::egress::{Network, docker};
use crate::fake_runs::status_json;
use crate::forge_helpers::{ForgeApp, READER, WRITER};
use crate::runs::{labelled, run_comments, spawn_runs, wait_ended};

/// Busybox for a shell, this machine's git and curl with their libraries, and the sandbox
/// agent (`tests/runtimes/sandboxed-agent.sh`).
fn sandbox_image() -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/runtimes/sandboxed-agent.sh"
    );
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "bin/busybox".into(),
            std::fs::read("/bin/busybox").expect("busybox-static is installed"),
        ),
        ("agent.sh".into(), std::fs::read(script).expect("the agent")),
    ];
    let binaries = [
        "/usr/bin/git",
        "/usr/lib/git-core/git-remote-http",
        "/usr/bin/curl",
    ];
    let mut paths: Vec<String> = binaries.iter().map(|b| (*b).to_owned()).collect();
    let ldd = Command::new("ldd").args(binaries).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if line.trim_end().ends_with(':') {
            continue;
        }
        let path = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path
            && !paths.iter().any(|x| x == p)
        {
            paths.push(p.to_owned());
        }
    }
    for p in paths {
        let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        files.push((format!("rootfs/{}", p.trim_start_matches('/')), data));
    }
    let files = files
        .into_iter()
        .map(|(path, data)| {
            if path.starts_with("rootfs/") {
                (path, data)
            } else {
                (format!("rootfs/{path}"), data)
            }
        })
        .collect();
    let dockerfile = "FROM scratch\nCOPY rootfs/ /\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nCMD [\"/bin/sh\", \"/agent.sh\"]\n";
    crate::runs::build_image("director-test-sandbox-agent", dockerfile, files)
}

/// Whether the engine lists `runsc`; if not, `tests/runtimes/register-runsc.sh` registers it.
fn runsc_registered() -> bool {
    let listed = || {
        docker(&[
            "info",
            "--format",
            "{{range $k, $_ := .Runtimes}}{{$k}} {{end}}",
        ])
        .1
        .split_whitespace()
        .any(|r| r == "runsc")
    };
    if listed() {
        return true;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/runtimes/register-runsc.sh"
    );
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "runsc registers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    listed()
}

struct Confined {
    t: ForgeApp,
    provider: director_testkit::provider::FakeProvider,
    _llm: director_testkit::llm::FakeLlm,
    _network: Network,
    _git: tempfile::TempDir,
}

/// The director with confined runs of the sandbox image, the model behind `[models]`.
async fn confined(configure: impl FnOnce(&mut director::settings::Settings)) -> Confined {
    let provider = director_testkit::provider::FakeProvider::start();
    let network = Network(format!(
        "director-sandbox-test-{:08x}",
        rand::random::<u32>()
    ));
    let image = sandbox_image();
    let (name, url, key) = (
        network.0.clone(),
        provider.url.clone(),
        provider.key.clone(),
    );
    let (t, llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        crate::egress::confine(s, &name);
        // gVisor's own threads (its kernel, the file proxies of each mount) count against
        // the pids limit: at 64 a pipeline of two cannot start (docs/operations.md).
        s.runner.pids_limit = 256;
        crate::egress::behind_fake_anthropic(s, &url, &key);
        configure(s);
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    Confined {
        t,
        provider,
        _llm: llm,
        _network: network,
        _git: root,
    }
}

fn row_of(status: &serde_json::Value, issue: &IssueRef) -> serde_json::Value {
    status
        .as_array()
        .and_then(|a| a.iter().find(|r| r["number"] == issue.number))
        .cloned()
        .expect("the issue's row")
}

#[tokio::test]
async fn under_gvisor_a_confined_run_clones_calls_the_model_pushes_and_opens_its_pull_request() {
    assert!(runsc_registered(), "the engine lists runsc");
    let c = confined(|s| s.runner.oci_runtime = "runsc".into()).await;
    let t = &c.t;
    let issue = labelled(t, "In a sandbox", "Write sandboxed.txt.").await;
    let record = wait_ended(t, &issue).await;
    let reports = run_comments(t, &issue);
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    let log = runs[0].log_tail.clone().unwrap_or_default();
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?} {log}");
    // gVisor's own kernel answered `uname`, the model gateway the call, the gateway git.
    assert!(log.contains("kernel 4.4.0"), "{log}");
    assert!(log.contains("the model answered"), "{log}");
    assert!(log.contains("pushed"), "{log}");
    assert_eq!(c.provider.keys().len(), 1, "one call reached the provider");
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1, "its pull request");
    assert!(reports[0].contains("Runtime: `runsc`"), "{reports:?}");
    let status =
        crate::fake_runs::status_json_with(t, &[("DIRECTOR_RUNNER__OCI_RUNTIME", "runsc")]).await;
    let row = row_of(&status, &issue);
    assert_eq!(row["run"]["runtime"], "runsc", "{row}");
}

#[tokio::test]
async fn a_run_container_carries_the_runtime_docker_inspect_shows() {
    use director::runtime::Runtime as _;
    assert!(runsc_registered(), "the engine lists runsc");
    let settings = director::settings::RunnerSettings {
        oci_runtime: "runsc".into(),
        network: "none".into(),
        memory_mb: 256,
        ..Default::default()
    };
    let rt = director::runtime::docker::DockerRuntime::connect(settings.clone())
        .await
        .expect("the engine");
    rt.check_oci_runtime().await.expect("listed");
    let run_id = director::domain::RunId::random();
    let spec = director::runtime::RunSpec {
        run_id: run_id.clone(),
        image: sandbox_image(),
        command: vec!["/bin/sh".into(), "-c".into(), "uname -r".into()],
        env: Vec::new(),
        labels: Default::default(),
        task_path: "/task/task.md".into(),
        task: b"task".to_vec(),
        mounts: Vec::new(),
        result_path: None,
        confined: false,
        workspace_volume: None,
        setup_phase: false,
    };
    let id = rt.create(&spec).await.expect("created");
    let (_, runtime) = docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &id]);
    assert_eq!(runtime, "runsc", "docker inspect shows the runtime");
    rt.remove(&id).await.expect("removed");
}

#[tokio::test]
async fn a_runtime_the_engine_does_not_list_stops_the_director_naming_the_key() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("dir");
    let forge = director_testkit::forge::FakeForge::new();
    forge.add_account(crate::forge_helpers::BOT, crate::forge_helpers::BOT_TOKEN);
    let server = forge.serve().expect("serves");
    let mut settings = crate::helpers::test_settings(&dir);
    settings.forge.url = server.url().to_owned();
    settings.forge.token = Secret::new(crate::forge_helpers::BOT_TOKEN);
    settings.runner.image = "director-test-none:1".into();
    settings.runner.oci_runtime = "no-such-sandbox".into();
    let built = director::startup::Application::build(settings).await;
    let Err(e) = built else {
        panic!("the director started with a runtime the engine does not have");
    };
    let said = format!("{e:#}");
    assert!(
        said.contains("runner.oci_runtime") && said.contains("no-such-sandbox"),
        "{said}"
    );
}

async fn answers(t: &ForgeApp, issue: &IssueRef) -> Vec<String> {
    t.app.wait_processed().await;
    t.forge
        .comments_on(issue)
        .into_iter()
        .filter(|c| c.body.contains("<!-- director:answer "))
        .map(|c| c.body)
        .collect()
}

#[tokio::test]
async fn a_host_a_writer_approves_in_the_thread_is_reached_by_the_retried_run_alone() {
    let target = crate::egress::Target::start();
    let host = format!("{}:8000", target.ip);
    let c = confined(|s| {
        s.runner.egress_approvable = vec!["172.*:8000".into(), "10.*:8000".into()];
    })
    .await;
    let t = &c.t;
    let issue = labelled(t, "Needs a package", &format!("reach: {host}")).await;
    let record = wait_ended(t, &issue).await;
    assert_eq!(record.lifecycle, Lifecycle::Failed);
    let reports = run_comments(t, &issue);
    assert!(
        reports[0].contains(&format!("```\n/director allow {host}\n```")),
        "{reports:?}"
    );
    // Another issue, refused the same host.
    let other = labelled(t, "Also needs it", &format!("reach: {host}")).await;
    assert_eq!(wait_ended(t, &other).await.lifecycle, Lifecycle::Failed);

    // A reader's approval: nothing, not even an answer.
    t.forge
        .comment(READER, &issue, &format!("/director allow {host}"))
        .await;
    assert!(answers(t, &issue).await.is_empty());
    // Outside the globs, a bad port, a malformed one: answered once each, nothing changed.
    t.forge
        .comment(WRITER, &issue, "/director allow 192.168.1.1:8000")
        .await;
    t.forge
        .comment(WRITER, &issue, &format!("/director allow {}:22", target.ip))
        .await;
    t.forge
        .comment(WRITER, &issue, "/director allow nope")
        .await;
    let said = answers(t, &issue).await;
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(
        said.iter().all(|a| a.contains("nothing changed")),
        "{said:?}"
    );
    assert!(said[0].contains("not within"), "{said:?}");
    assert!(said[1].contains("port 22 is outside"), "{said:?}");
    let record = t.record(&issue).await.expect("known");
    assert!(record.thread.egress_allowed.is_empty());
    assert_eq!(record.lifecycle, Lifecycle::Failed);

    // A writer's: recorded, answered, and the refused run goes again and reaches it.
    t.forge
        .comment(WRITER, &issue, &format!("/director allow {host}"))
        .await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    let record = wait_ended(t, &issue).await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    let log = runs[1].log_tail.clone().unwrap_or_default();
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{log}");
    assert!(log.contains(&format!("reached {host}")), "{log}");
    assert_eq!(record.thread.egress_allowed, vec![host.clone()]);
    let said = answers(t, &issue).await;
    assert_eq!(said.len(), 4, "{said:?}");
    assert!(
        said[3].contains("Approved by @alice") && said[3].contains("starts again, once"),
        "{said:?}"
    );
    let row = row_of(&status_json(t).await, &issue);
    assert_eq!(row["egress_allowed"], serde_json::json!([host]), "{row}");
    // The other issue is not widened: its retry is refused the host again.
    let other_row = row_of(&status_json(t).await, &other);
    assert_eq!(
        other_row["egress_allowed"],
        serde_json::json!([]),
        "{other_row}"
    );
    t.forge.comment(WRITER, &other, "/director retry").await;
    let retried = || async {
        t.app
            .store
            .runs_of(&other)
            .await
            .is_ok_and(|r| r.len() == 2 && r[1].finished_at_ms.is_some())
    };
    crate::helpers::wait_on_engine(
        &t.app.settled,
        "the other issue's retry ends",
        std::time::Duration::from_secs(60),
        retried,
    )
    .await;
    t.app.wait_processed().await;
    let again = t.record(&other).await.expect("known");
    assert_eq!(again.lifecycle, Lifecycle::Failed);
    let runs = t.app.store.runs_of(&other).await.expect("runs");
    assert!(
        runs[1]
            .log_tail
            .as_deref()
            .unwrap_or_default()
            .contains("refused"),
        "{:?}",
        runs[1].log_tail
    );
    assert_eq!(
        runs[1].egress_refused.len(),
        1,
        "{:?}",
        runs[1].egress_refused
    );
}
