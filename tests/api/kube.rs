//! The Kubernetes runtime: the real kube client against the fake API server over HTTP (a
//! kubeconfig pointing at it). The Job and its hardening, the Secret that holds what is
//! secret, the watch for the end, logs, the result, cancel, limits, adoption, what RBAC or a
//! missing namespace does; then the whole flow from a label to a pull request with runs as
//! Jobs.

use director::domain::RunId;
use std::collections::HashMap;
use std::time::Duration;

use director::domain::{Lifecycle, RunState};
use director::forge::Permission;
use director::runtime::kubernetes::{KubeRuntime, TERMINATION_LOG, job_name};
use director::runtime::{Exit, RunSpec, Runtime, RuntimeError, WaitLimits};
use director::settings::{KubernetesSettings, RunnerSettings};
use serde_json::Value;

use crate::fake_runs::{labelled, reports};
use crate::forge_helpers::ForgeApp;
use crate::helpers::wait_until;
use crate::runs::{RUNNER, RUNNER_PASSWORD};
use director_testkit::kube::FakeKube;

pub(crate) const NS: &str = "runs";
const TOKEN: &str = "run-token-5f2a9c0d";
const TASK: &str = "# Add --verbose\n\nPrint each step.";

fn runner() -> RunnerSettings {
    RunnerSettings {
        kind: director::settings::RunnerKind::Kubernetes,
        image: "registry.example/agent:1".into(),
        user: "1000:2000".into(),
        memory_mb: 1024,
        cpus: 1.5,
        timeout_secs: 600,
        stop_grace_secs: 7,
        workspace_mb: 512,
        // Open egress unless a test confines its runs (`confined_runner`).
        egress: director::settings::Egress::Open,
        ..RunnerSettings::default()
    }
}

fn kube_settings(fake: &FakeKube, namespace: &str) -> KubernetesSettings {
    KubernetesSettings {
        namespace: namespace.into(),
        kubeconfig: fake.kubeconfig.display().to_string(),
        service_account: "director-runs".into(),
        ttl_secs_after_finished: 600,
        ..KubernetesSettings::default()
    }
}

async fn runtime(fake: &FakeKube) -> KubeRuntime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    KubeRuntime::connect(runner(), kube_settings(fake, NS))
        .await
        .expect("a client from the kubeconfig")
}

fn spec(run_id: &str) -> RunSpec {
    RunSpec {
        run_id: RunId::parse(run_id).expect("a run id"),
        image: "registry.example/agent:1".into(),
        command: vec!["/agent.sh".into(), "--go".into()],
        env: vec![
            ("DIRECTOR_RUN_ID".into(), run_id.into()),
            ("DIRECTOR_TOKEN".into(), TOKEN.into()),
            ("DIRECTOR_RESULT_FILE".into(), TERMINATION_LOG.into()),
        ],
        labels: HashMap::from([
            ("director.run-id".into(), run_id.into()),
            ("director.repo".into(), "acme/widgets".into()),
            ("director.issue".into(), "7".into()),
        ]),
        task_path: "/task/task.md".into(),
        task: TASK.as_bytes().to_vec(),
        mounts: Vec::new(),
        result_path: Some(TERMINATION_LOG.into()),
        confined: false,
        workspace_volume: None,
        setup_phase: false,
    }
}

fn limits() -> WaitLimits {
    WaitLimits {
        timeout: Duration::from_secs(60),
        idle: None,
        grace: Duration::from_secs(7),
    }
}

fn pod_spec(job: &Value) -> &Value {
    &job["spec"]["template"]["spec"]
}

#[tokio::test]
async fn a_run_is_a_suspended_hardened_job_whose_secrets_are_only_in_its_owned_secret() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    rt.check().await.expect("the namespace allows runs");
    let id = rt.create(&spec("0a1b2c3d4e5f")).await.expect("created");
    assert_eq!(id, "director-run-0a1b2c3d4e5f");
    let job = fake.job(NS, &id).expect("the Job");

    // Named and labelled for the run; one pod, no retry, a deadline, a TTL; not yet started.
    let labels = &job["metadata"]["labels"];
    assert_eq!(labels["director.run-id"], "0a1b2c3d4e5f");
    assert_eq!(labels["director.repo"], "acme.widgets", "label-safe");
    assert_eq!(labels["director.issue"], "7");
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(job["spec"]["suspend"], true);
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 600);
    let deadline = job["spec"]["activeDeadlineSeconds"]
        .as_u64()
        .expect("a deadline");
    assert!(deadline >= 600, "{deadline}");
    assert!(fake.pods_of(NS, &id).is_empty(), "suspended: no pod yet");
    let listed = rt.list_runs().await.expect("listed");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].never_started && !listed[0].running);

    // The pod is hardened as a Docker run is.
    let pod = pod_spec(&job);
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["enableServiceLinks"], false);
    assert_eq!(pod["serviceAccountName"], "director-runs");
    assert_eq!(pod["terminationGracePeriodSeconds"], 7);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 1000);
    assert_eq!(pod["securityContext"]["runAsGroup"], 2000);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.example/agent:1");
    assert_eq!(c["args"], serde_json::json!(["/agent.sh", "--go"]));
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 1000);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["resources"]["limits"]["memory"], "1024Mi");
    assert_eq!(c["resources"]["limits"]["cpu"], "1500m");
    assert_eq!(c["terminationMessagePath"], TERMINATION_LOG);
    let workspace = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "workspace"))
        .expect("a workspace volume");
    assert_eq!(workspace["emptyDir"]["sizeLimit"], "512Mi");
    // /tmp in memory, in the container's limit, as Docker's tmpfs.
    let tmp = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "tmp"))
        .expect("a /tmp volume");
    assert_eq!(
        tmp["emptyDir"],
        serde_json::json!({ "medium": "Memory", "sizeLimit": "256Mi" })
    );
    assert!(
        c["volumeMounts"].as_array().is_some_and(|m| m
            .iter()
            .any(|m| m["name"] == "tmp" && m["mountPath"] == "/tmp")),
        "{c}"
    );

    // No literal secret in the Job: the token and the task are in the Secret it references.
    let text = job.to_string();
    assert!(!text.contains(TOKEN), "the token is not in the Job");
    assert!(
        !text.contains("Print each step"),
        "the task is not in the Job"
    );
    let vars = c["env"].as_array().expect("the environment");
    assert_eq!(vars.len(), 3);
    for var in vars {
        assert!(var["value"].is_null(), "a literal value: {var}");
        assert_eq!(var["valueFrom"]["secretKeyRef"]["name"], id.as_str());
        assert_eq!(var["valueFrom"]["secretKeyRef"]["key"], var["name"]);
    }
    assert!(c["envFrom"].is_null());
    let secret = fake.secret(NS, &id).expect("the run's Secret");
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Job");
    assert_eq!(owner["name"], id.as_str());
    assert_eq!(owner["uid"], job["metadata"]["uid"]);
    let env = fake.pod_env(NS, &id).expect("the pod's environment");
    assert_eq!(env["DIRECTOR_TOKEN"], TOKEN);
    let task = secret["data"]["task.md"].as_str().expect("the task file");
    use base64::Engine as _;
    let task = base64::engine::general_purpose::STANDARD
        .decode(task)
        .expect("base64");
    assert_eq!(task, TASK.as_bytes());
    // What the runtime sends is what Kubernetes' own schemas accept, strictly.
    let problems = crate::chart::invalid(&[job.clone(), secret.clone()]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        rt.env(&id)
            .await
            .expect("env")
            .into_iter()
            .find(|(k, _)| k == "DIRECTOR_TOKEN")
            .map(|(_, v)| v)
            .as_deref(),
        Some(TOKEN),
        "read back for redaction after a restart"
    );
}

#[tokio::test]
async fn a_started_job_is_watched_to_its_end_with_its_log_and_result_and_removed_with_its_secret() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("111111111111")).await.expect("created");
    rt.start(&id).await.expect("started");
    assert_eq!(
        fake.pods_of(NS, &id).len(),
        1,
        "the Job controller made one pod"
    );
    fake.run_pod(NS, &id).expect("the pod runs");
    let waiting = waiting_on(&fake, &id).await;
    for n in 0..5 {
        fake.log(NS, &id, &format!("step {n}"));
    }
    fake.finish(NS, &id, 0, r#"{"outcome":"done","summary":"Added it."}"#);
    let exit = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch sees the end")
        .expect("joined")
        .expect("waited");
    assert_eq!(exit, Exit::Code(0));
    let tail = rt.logs_tail(&id, 2).await.expect("the log tail");
    assert_eq!(tail, "step 3\nstep 4\n");
    let result = rt
        .read_file(&id, TERMINATION_LOG, 64 * 1024)
        .await
        .expect("read");
    assert_eq!(
        result.as_deref(),
        Some(br#"{"outcome":"done","summary":"Added it."}"#.as_slice())
    );
    assert_eq!(
        rt.read_file(&id, TERMINATION_LOG, 8).await.expect("read"),
        None,
        "over the limit: absent"
    );
    // The end came through the watch, not a poll of the Job.
    let requests = fake.requests();
    let gets_of_the_job = requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&id))
        .count();
    assert!(gets_of_the_job <= 2, "{gets_of_the_job} reads of the Job");

    rt.remove(&id).await.expect("removed");
    assert!(fake.job(NS, &id).is_none());
    assert!(
        fake.secret(NS, &id).is_none(),
        "the Secret goes with the run"
    );
    assert!(fake.pods_of(NS, &id).is_empty(), "its pods too");
    let delete = requests_to(&fake, "DELETE", &format!("/jobs/{id}"));
    assert_eq!(delete.len(), 1);
    assert!(
        matches!(
            delete[0].body["propagationPolicy"].as_str(),
            Some("Background" | "Foreground")
        ),
        "never orphaned pods: {:?}",
        delete[0].body
    );
    rt.remove(&id).await.expect("gone already is fine");
}

async fn wait_for_run_id(t: &ForgeApp, issue: &director::domain::IssueRef) -> RunId {
    wait_until("the run is recorded", || async {
        !crate::fake_runs::run_ids(t, issue).await.is_empty()
    })
    .await;
    crate::fake_runs::run_ids(t, issue)
        .await
        .pop()
        .expect("a run")
}

#[tokio::test]
async fn a_runs_log_is_followed_live_with_marks_and_a_follow_from_a_mark_repeats_nothing() {
    use futures_util::StreamExt as _;
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("222222222222")).await.expect("created");
    rt.start(&id).await.expect("started");
    fake.run_pod(NS, &id).expect("the pod runs");
    fake.log(NS, &id, "one");
    let mut stream = rt
        .follow_output(&id, None)
        .await
        .expect("follows")
        .expect("a stream");
    let first = stream.next().await.expect("a line").expect("ok");
    assert_eq!(first.bytes, b"one\n", "from the container's start");
    fake.log(NS, &id, "two");
    let second = stream.next().await.expect("a line").expect("ok");
    assert_eq!(second.bytes, b"two\n", "live");
    let mark = second.mark.clone().expect("a mark");
    fake.log(NS, &id, "three");
    // Adopted after a restart: from the mark, nothing seen before it again.
    let mut resumed = rt
        .follow_output(&id, Some(&mark))
        .await
        .expect("follows")
        .expect("a stream");
    let next = resumed.next().await.expect("a line").expect("ok");
    assert_eq!(next.bytes, b"three\n");
    fake.finish(NS, &id, 0, "");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), resumed.next())
            .await
            .expect("the stream ends with the container")
            .is_none()
    );
}

/// A wait for the run's Job on a runtime of its own, once its watch is open.
async fn waiting_on(
    fake: &FakeKube,
    id: &str,
) -> tokio::task::JoinHandle<Result<Exit, RuntimeError>> {
    let rt = runtime(fake).await;
    let job = id.to_owned();
    let waiting = tokio::spawn(async move { rt.wait(&job, limits()).await });
    wait_until("the Job is watched", || async {
        fake.requests()
            .iter()
            .any(|r| r.path.ends_with("/jobs") && r.query.contains("watch=true"))
    })
    .await;
    waiting
}

fn requests_to(
    fake: &FakeKube,
    method: &str,
    suffix: &str,
) -> Vec<director_testkit::kube::Recorded> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == method && r.path.ends_with(suffix))
        .collect()
}

#[tokio::test]
async fn a_failed_pod_is_its_exit_code_and_a_clash_is_adoption_never_a_second_job() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("222222222222")).await.expect("created");
    match rt.create(&spec("222222222222")).await {
        Err(RuntimeError::Exists(run)) => assert_eq!(run.as_str(), "222222222222"),
        other => panic!("a second Job: {other:?}"),
    }
    assert_eq!(fake.jobs(NS).len(), 1);
    assert_eq!(
        requests_to(&fake, "POST", "/secrets").len(),
        1,
        "one Secret"
    );
    rt.start(&id).await.expect("started");
    fake.run_pod(NS, &id).expect("runs");
    fake.log(NS, &id, "oops");
    fake.finish(NS, &id, 3, "");
    let exit = rt.wait(&id, limits()).await.expect("waited");
    assert_eq!(exit, Exit::Code(3));
    assert_eq!(
        rt.read_file(&id, TERMINATION_LOG, 1024)
            .await
            .expect("read"),
        None
    );
    assert_eq!(rt.logs_tail(&id, 10).await.expect("log"), "oops\n");
    let listed = rt.list_runs().await.expect("listed");
    assert!(!listed[0].running && !listed[0].never_started);
}

#[tokio::test]
async fn cancel_deletes_the_job_in_the_foreground_and_the_watch_ends() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("333333333333")).await.expect("created");
    rt.start(&id).await.expect("started");
    fake.run_pod(NS, &id).expect("runs");
    // The watch is open before the cancel.
    let waiting = waiting_on(&fake, &id).await;
    rt.kill(&id).await.expect("killed");
    let delete = requests_to(&fake, "DELETE", &format!("/jobs/{id}"));
    assert_eq!(delete[0].body["propagationPolicy"], "Foreground");
    // The fake's garbage collector, like the cluster's, leaves a pod collected with its Job
    // running for its grace period: the agent's pod must have been deleted with none.
    assert!(
        fake.job(NS, &id).is_none() && fake.pods_of(NS, &id).is_empty(),
        "the pod still runs after the cancel: {:?}",
        fake.pods_of(NS, &id)
    );
    let requests = fake.requests();
    let pod_delete = requests
        .iter()
        .position(|r| r.method == "DELETE" && r.path.contains("/pods/"))
        .expect("the pod is deleted itself");
    assert_eq!(requests[pod_delete].body["gracePeriodSeconds"], 0);
    let job_delete = requests
        .iter()
        .position(|r| r.method == "DELETE" && r.path.ends_with(&format!("/jobs/{id}")))
        .expect("the Job is deleted");
    assert!(pod_delete < job_delete, "the pod before its Job");
    assert!(
        fake.secret(NS, &id).is_none(),
        "the owned Secret is collected"
    );
    let waited = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch ends")
        .expect("joined");
    // Gone, or seen failing in the moment between its pod's end and its own deletion.
    assert!(
        matches!(waited, Err(RuntimeError::NotFound(_)) | Ok(Exit::Code(_))),
        "{waited:?}"
    );
    rt.kill(&id).await.expect("killing what is gone is fine");
}

#[tokio::test]
async fn a_silent_run_is_stopped_at_the_idle_limit_with_its_log_kept() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("444444444444")).await.expect("created");
    rt.start(&id).await.expect("started");
    fake.run_pod(NS, &id).expect("runs");
    fake.log(NS, &id, "thinking");
    let exit = rt
        .wait(
            &id,
            WaitLimits {
                idle: Some(Duration::from_millis(800)),
                ..limits()
            },
        )
        .await
        .expect("waited");
    assert_eq!(exit, Exit::Idle);
    let job = fake.job(NS, &id).expect("kept until removed");
    assert_eq!(
        job["spec"]["suspend"], true,
        "no pod replaces the stopped one"
    );
    let deletes = requests_to(&fake, "DELETE", "-p1");
    assert_eq!(deletes.len(), 1, "the pod got its stop signal");
    assert_eq!(deletes[0].body["gracePeriodSeconds"], 7);
    assert_eq!(rt.logs_tail(&id, 10).await.expect("log"), "thinking\n");
}

#[tokio::test]
async fn the_clusters_deadline_is_a_timeout_and_an_image_that_cannot_be_pulled_a_clear_failure() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    let id = rt.create(&spec("555555555555")).await.expect("created");
    rt.start(&id).await.expect("started");
    fake.run_pod(NS, &id).expect("runs");
    fake.deadline(NS, &id);
    assert_eq!(
        rt.wait(&id, limits()).await.expect("waited"),
        Exit::TimedOut
    );

    let id = rt.create(&spec("666666666666")).await.expect("created");
    rt.start(&id).await.expect("started");
    fake.pod_image_fails(NS, &id);
    assert_eq!(
        rt.wait(&id, limits()).await.expect("waited"),
        Exit::Code(-1)
    );
    let log = rt.logs_tail(&id, 10).await.expect("log");
    assert!(log.contains("ImagePullBackOff"), "{log}");
    assert!(fake.job(NS, &id).is_none(), "the stuck Job is deleted");
}

#[tokio::test]
async fn a_job_without_its_secret_is_not_started() {
    let fake = FakeKube::start();
    let rt = runtime(&fake).await;
    // An earlier attempt died between the Job and its Secret.
    let mut job = serde_json::to_value(rt.job(&spec("777777777777")).expect("job")).expect("json");
    job["metadata"]["namespace"] = NS.into();
    fake.insert_job(NS, job);
    let listed = rt.list_runs().await.expect("listed");
    assert!(listed[0].never_started);
    let err = rt
        .start("director-run-777777777777")
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("Secret"), "{err}");
    assert_eq!(
        fake.job(NS, "director-run-777777777777").expect("job")["spec"]["suspend"],
        true
    );
}

#[tokio::test]
async fn a_missing_namespace_forbidden_jobs_or_an_unreachable_api_server_is_told_by_check() {
    let fake = FakeKube::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nowhere = KubeRuntime::connect(runner(), kube_settings(&fake, "nowhere"))
        .await
        .expect("client");
    let err = nowhere.check().await.expect_err("no namespace");
    assert!(err.to_string().contains("namespace"), "{err}");
    assert!(fake.jobs("nowhere").is_empty(), "a dry run stores nothing");

    let rt = runtime(&fake).await;
    rt.check().await.expect("fine so far");
    assert!(fake.jobs(NS).is_empty(), "a dry run stores nothing");
    fake.forbid("create", "jobs");
    let err = rt.check().await.expect_err("forbidden");
    assert!(err.to_string().contains("RBAC"), "{err}");
    assert!(matches!(
        rt.create(&spec("888888888888")).await,
        Err(RuntimeError::Engine(_))
    ));

    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("kubeconfig");
    std::fs::write(
        &config,
        director_testkit::kube::kubeconfig_yaml(&format!("http://127.0.0.1:{port}")),
    )
    .expect("write");
    let mut settings = kube_settings(&fake, NS);
    settings.kubeconfig = config.display().to_string();
    let down = KubeRuntime::connect(runner(), settings)
        .await
        .expect("client");
    assert!(matches!(
        down.check().await,
        Err(RuntimeError::Unavailable(_))
    ));
}

/// The director with runs as Jobs: FakeForge, a GO model and the fake API server. The test
/// plays the pod: it pushes the run's branch with the token the pod's environment holds.
async fn spawn_kube(fake: &FakeKube) -> (ForgeApp, director_testkit::llm::FakeLlm) {
    spawn_kube_with(fake, |_| {}).await
}

/// [`spawn_kube`], with more settings.
pub(crate) async fn spawn_kube_with(
    fake: &FakeKube,
    configure: impl FnOnce(&mut director::settings::Settings),
) -> (ForgeApp, director_testkit::llm::FakeLlm) {
    let kubeconfig = fake.kubeconfig.display().to_string();
    let (t, llm) = ForgeApp::spawn_with_llm(|s| {
        s.forge.runner_login = RUNNER.into();
        s.forge.runner_password = director::settings::Secret::new(RUNNER_PASSWORD);
        s.runner.kind = director::settings::RunnerKind::Kubernetes;
        s.runner.image = "registry.example/agent:1".into();
        s.runner.timeout_secs = 600;
        // A start the cluster refuses is told after three attempts, not four minutes.
        s.runner.start_attempts = 3;
        s.kubernetes.namespace = NS.into();
        s.kubernetes.kubeconfig = kubeconfig;
        configure(s);
    })
    .await;
    t.forge.set_password(RUNNER, RUNNER_PASSWORD);
    t.forge.grant(&t.repo, RUNNER, Permission::Write);
    llm.always("Fine.\n\nGO");
    (t, llm)
}

async fn wait_for_pod(fake: &FakeKube) -> String {
    let with_pod = || {
        fake.jobs(NS).into_iter().find_map(|j| {
            let name = j["metadata"]["name"].as_str()?.to_owned();
            (!fake.pods_of(NS, &name).is_empty()).then_some(name)
        })
    };
    wait_until("a run's pod", || async { with_pod().is_some() }).await;
    with_pod().unwrap_or_default()
}

/// Pushes a commit to the run's branch with the run token, as an agent in the pod would.
async fn push_as_the_pod(env: &std::collections::BTreeMap<String, String>) -> bool {
    let body = serde_json::json!({
        "content": "aGVsbG8K",
        "message": "agent work",
        "branch": env["DIRECTOR_BASE_BRANCH"],
        "new_branch": env["DIRECTOR_BRANCH"],
    });
    let url = format!(
        "{}/repos/{}/contents/agent.txt",
        env["DIRECTOR_API_URL"], env["DIRECTOR_REPO"]
    );
    crate::helpers::http_client()
        .post(url)
        .header("Authorization", format!("token {}", env["DIRECTOR_TOKEN"]))
        .json(&body)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test]
async fn a_go_issue_runs_as_one_job_and_ends_in_one_pull_request_with_its_token_revoked() {
    let fake = FakeKube::start();
    let (t, _llm) = spawn_kube(&fake).await;
    wait_until("the runtime is checked", || async {
        fake.requests()
            .iter()
            .any(|r| r.query.contains("dryRun=All"))
    })
    .await;
    let ready: Value = t.app.get("/readyz").await.json().await.expect("json");
    assert_eq!(ready["runtime"], "ok");
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    let job = wait_for_pod(&fake).await;
    let env = fake.pod_env(NS, &job).expect("the pod's environment");
    assert_eq!(env["DIRECTOR_RESULT_FILE"], TERMINATION_LOG);
    assert!(
        push_as_the_pod(&env).await,
        "the run token pushes its branch"
    );
    fake.run_pod(NS, &job).expect("runs");
    fake.log(NS, &job, "pushed");
    // The transcript follows the pod's log live, not only at the end.
    let run_id = wait_for_run_id(&t, &issue).await;
    wait_until("the transcript has the line while the pod runs", || async {
        t.app
            .store
            .transcript(&run_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|tr| tr.text.contains("pushed\n"))
    })
    .await;
    fake.finish(
        NS,
        &job,
        0,
        r#"{"outcome":"done","summary":"Added `--verbose`."}"#,
    );
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    t.app.wait_processed().await;
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Succeeded);
    assert_eq!(
        requests_to(&fake, "POST", &format!("/namespaces/{NS}/jobs"))
            .iter()
            .filter(|r| !r.query.contains("dryRun"))
            .count(),
        1,
        "one Job ever"
    );
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1);
    let pull_body = &t.forge.pulls_of(&t.repo)[0].4;
    assert!(
        pull_body.contains("Added `--verbose`."),
        "the result reached the PR: {pull_body}"
    );
    assert!(t.forge.tokens_of(RUNNER).is_empty(), "the token is revoked");
    wait_until("the Job and its Secret are removed", || async {
        fake.job(NS, &job).is_none() && fake.secret(NS, &job).is_none()
    })
    .await;
    assert_eq!(reports(&t, &issue).len(), 1);
    assert_eq!(job, job_name(&runs[0].id));
    t.assert_contract();
}

#[tokio::test]
async fn forbidden_jobs_are_told_in_readyz_and_metrics_and_the_run_fails_on_the_issue_with_its_token_revoked()
 {
    let fake = FakeKube::start();
    fake.forbid("create", "jobs");
    let (t, _llm) = spawn_kube(&fake).await;
    wait_until("the runtime is found unable", || async {
        let ready: Value = t.app.get("/readyz").await.json().await.unwrap_or_default();
        ready["runtime"]
            .as_str()
            .is_some_and(|r| r.contains("RBAC"))
    })
    .await;
    t.app.wait_for_metric("director_runtime_up 0").await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    t.app.wait_processed().await;
    let report = reports(&t, &issue).pop().expect("the issue is told");
    assert!(report.contains("could not be started"), "{report}");
    assert!(
        report.contains("forbidden") || report.contains("403"),
        "{report}"
    );
    assert!(
        t.forge.tokens_of(RUNNER).is_empty(),
        "the minted token is revoked"
    );
    assert!(fake.jobs(NS).is_empty());
}

fn confined_runner() -> RunnerSettings {
    RunnerSettings {
        egress: director::settings::Egress::Allowlist,
        egress_proxy_port: 3128,
        ..runner()
    }
}

fn confined_settings(fake: &FakeKube) -> KubernetesSettings {
    KubernetesSettings {
        // Resolved by the director: runs have no DNS.
        proxy_host: "localhost".into(),
        proxy_namespace: "forge".into(),
        proxy_pod_labels: vec![
            "app.kubernetes.io/name=director".into(),
            "app.kubernetes.io/instance=director".into(),
        ],
        ..kube_settings(fake, NS)
    }
}

#[tokio::test]
async fn a_confined_runs_pod_gets_a_network_policy_to_the_proxy_only_before_it_starts() {
    let fake = FakeKube::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = KubeRuntime::connect(confined_runner(), confined_settings(&fake))
        .await
        .expect("client");
    rt.check().await.expect("allowed");
    let point = rt.prepare_egress(3128).await.expect("egress");
    assert_eq!(
        point.host, "127.0.0.1",
        "runs are given the proxy's address"
    );
    assert!(point.listen.is_unspecified());
    let confined = RunSpec {
        confined: true,
        ..spec("999999999999")
    };
    let id = rt.create(&confined).await.expect("created");
    let policy = fake
        .network_policy(NS, &id)
        .expect("the run's NetworkPolicy");
    let job = fake.job(NS, &id).expect("job");
    assert_eq!(
        job["spec"]["suspend"], true,
        "the policy is there before the pod"
    );
    assert_eq!(
        policy["metadata"]["ownerReferences"][0]["uid"],
        job["metadata"]["uid"]
    );
    let p = &policy["spec"];
    assert_eq!(
        p["podSelector"]["matchLabels"]["director.run-id"], "999999999999",
        "it selects the run's pod"
    );
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["director.run-id"],
        "999999999999"
    );
    assert_eq!(p["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(
        p["ingress"],
        serde_json::json!([]),
        "nothing reaches the run"
    );
    let egress = p["egress"].as_array().expect("egress rules");
    assert_eq!(
        egress.len(),
        1,
        "the proxy, nothing else (no DNS: a resolver carries any name out): {egress:?}"
    );
    let proxy = &egress[0];
    assert_eq!(
        proxy["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "forge"
    );
    assert_eq!(
        proxy["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "director"
    );
    assert_eq!(
        proxy["ports"],
        serde_json::json!([
            { "protocol": "TCP", "port": 3128 },
            { "protocol": "TCP", "port": 3129 },
            { "protocol": "TCP", "port": 3130 }
        ])
    );
    assert!(proxy["to"][0]["ipBlock"].is_null());
    let problems = crate::chart::invalid(std::slice::from_ref(&policy));
    assert!(problems.is_empty(), "{problems:?}");
    rt.remove(&id).await.expect("removed");
    assert!(fake.network_policy(NS, &id).is_none());

    // A policy that cannot be made: the run is not created at all.
    fake.forbid("create", "networkpolicies");
    let err = rt.check().await.expect_err("told");
    assert!(err.to_string().contains("NetworkPolicies"), "{err}");
    let err = rt
        .create(&RunSpec {
            confined: true,
            ..spec("aaaaaaaaaaaa")
        })
        .await;
    assert!(err.is_err());
    assert!(
        fake.job(NS, "director-run-aaaaaaaaaaaa").is_none(),
        "no Job left to start unconfined"
    );
    assert!(fake.secret(NS, "director-run-aaaaaaaaaaaa").is_none());
}

#[tokio::test]
async fn a_confined_run_whose_policy_is_missing_is_never_started() {
    let fake = FakeKube::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = KubeRuntime::connect(confined_runner(), confined_settings(&fake))
        .await
        .expect("client");
    let confined = RunSpec {
        confined: true,
        ..spec("bbbbbbbbbbbb")
    };
    let id = rt.create(&confined).await.expect("created");
    // The director died between the Secret and the policy (or the policy's clean-up
    // failed): the next attempt adopts the suspended Job.
    fake.remove_network_policy(NS, &id);
    let err = rt.start(&id).await.expect_err("refused");
    assert!(err.to_string().contains("NetworkPolicy"), "{err}");
    assert_eq!(
        fake.job(NS, &id).expect("job")["spec"]["suspend"],
        true,
        "still suspended: no pod ran unconfined"
    );
    assert!(fake.pods_of(NS, &id).is_empty());

    // A policy that cannot be made, and a clean-up that fails as well: the error says both,
    // and what is left is never started.
    fake.forbid("create", "networkpolicies");
    fake.forbid("delete", "jobs");
    let err = rt
        .create(&RunSpec {
            confined: true,
            ..spec("cccccccccccc")
        })
        .await
        .expect_err("not created");
    assert!(
        err.to_string().contains("removing the half-made Job"),
        "{err}"
    );
    let left = "director-run-cccccccccccc";
    assert!(fake.job(NS, left).is_some(), "the Job could not be removed");
    let err = rt.start(left).await.expect_err("refused");
    assert!(err.to_string().contains("NetworkPolicy"), "{err}");
    assert!(fake.pods_of(NS, left).is_empty());
}

#[tokio::test]
async fn a_runs_pod_carries_the_runtime_class_it_is_given() {
    let fake = FakeKube::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sandboxed = RunnerSettings {
        runtime_class_name: "gvisor".into(),
        ..runner()
    };
    let rt = KubeRuntime::connect(sandboxed, kube_settings(&fake, NS))
        .await
        .expect("a client from the kubeconfig");
    let id = rt.create(&spec("0a1b2c3d4e60")).await.expect("created");
    let job = fake.job(NS, &id).expect("the Job");
    assert_eq!(pod_spec(&job)["runtimeClassName"], "gvisor");
    // Without one, the cluster's default: no field at all.
    let plain = runtime(&fake).await;
    let id = plain.create(&spec("0a1b2c3d4e61")).await.expect("created");
    let job = fake.job(NS, &id).expect("the Job");
    assert!(pod_spec(&job).get("runtimeClassName").is_none(), "{job}");
}

#[tokio::test]
async fn a_sealed_check_pod_gets_a_network_policy_with_no_egress_at_all() {
    let fake = FakeKube::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = KubeRuntime::connect(confined_runner(), confined_settings(&fake))
        .await
        .expect("client");
    rt.check().await.expect("allowed");
    rt.prepare_egress(3128).await.expect("egress");
    let mut sealed = RunSpec {
        confined: true,
        ..spec("888888888888")
    };
    sealed.labels.insert(
        director::runtime::SEALED_LABEL.into(),
        "888888888888".into(),
    );
    let id = rt.create(&sealed).await.expect("created");
    let policy = fake
        .network_policy(NS, &id)
        .expect("the check's NetworkPolicy");
    let p = &policy["spec"];
    assert_eq!(p["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(p["ingress"], serde_json::json!([]));
    assert_eq!(
        p["egress"],
        serde_json::json!([]),
        "not even the director's pods"
    );
    assert_eq!(
        p["podSelector"]["matchLabels"]["director.run-id"],
        "888888888888"
    );
    let problems = crate::chart::invalid(std::slice::from_ref(&policy));
    assert!(problems.is_empty(), "{problems:?}");
    rt.remove(&id).await.expect("removed");
}
