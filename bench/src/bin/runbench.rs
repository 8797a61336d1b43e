//! Run overhead benchmark: what the director adds to launching a run, and to reporting its
//! end, beside a bare create-and-start of the same image with the same hardening through the
//! engine. Uses the real Docker engine, the FakeForge over loopback, and the test agent image
//! (`tests/agent/`, built here from a static busybox).
//!
//! `cargo run --release -p director-bench --bin director-runbench -- --runs 10`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use director_bench as common;

use clap::Parser;
use director::domain::{IssueRef, Judgement, Lifecycle, RunState};
use director::forge::Permission;
use director::runtime::docker::DockerRuntime;
use director::runtime::{RunSpec, Runtime};
use director::settings::{ForgeSettings, RunnerSettings, Secret, Settings, StoreSettings};
use director::startup::Application;
use director::store::{Commit, IssueRecord, PreflightState, Store};
use director_testkit::forge::FakeForge;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10)]
    runs: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let image = common::build_image("director-runbench-agent:latest")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let forge = FakeForge::new();
        forge.add_account("director-bot", "bench-bot-token");
        let repo = forge.add_repo("bench/widgets");
        forge.grant(&repo, "director-bot", Permission::Admin);
        forge.grant(&repo, "director-runner", Permission::Write);
        forge.set_password("director-runner", "bench-pass");
        let server = forge.serve()?;
        let runner = RunnerSettings {
            image: image.clone(),
            network: "host".into(),
            egress: director::settings::Egress::Open,
            memory_mb: 256,
            cpus: 1.0,
            max_concurrent: 1,
            ..Default::default()
        };
        let docker = DockerRuntime::connect(runner.clone()).await?;

        // Bare: the same image and hardening, created, given its task file and started.
        let mut bare = Vec::new();
        for _ in 0..args.runs {
            let spec = RunSpec {
                run_id: director::domain::RunId::random(),
                image: image.clone(),
                command: vec!["/bin/sh".into(), "-c".into(), "exit 0".into()],
                env: vec![],
                labels: HashMap::new(),
                task_path: "/task/task.md".into(),
                task: b"task".to_vec(),
                mounts: vec![],
                result_path: Some(director::engine::act::run::RESULT_PATH.into()),
                confined: false,
                workspace_volume: None,
                setup_phase: false,
            };
            // Measured like the director's launch: from the request to the engine's StartedAt.
            let t_us = chrono::Utc::now().timestamp_micros();
            let id = docker.create(&spec).await?;
            docker.start(&id).await?;
            bare.push((started_at(docker.docker(), &id).await? - t_us) as f64 / 1000.0);
            let limits = director::runtime::WaitLimits {
                timeout: Duration::from_secs(30),
                idle: None,
                grace: Duration::from_secs(5),
            };
            docker.wait(&id, limits).await?;
            docker.remove(&id).await?;
        }

        let dir = std::env::temp_dir().join(format!("director-runbench-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut settings = Settings::default();
        settings.server.listen = "127.0.0.1:0".parse().expect("an address");
        settings.store = StoreSettings {
            url: format!("sqlite://{}/b.db", dir.display()),
            ..Default::default()
        };
        settings.webhook.secrets = vec![Secret::new("bench-secret")];
        settings.forge = ForgeSettings {
            url: server.url().to_owned(),
            token: Secret::new("bench-bot-token"),
            runner_login: "director-runner".into(),
            runner_password: Secret::new("bench-pass"),
            ..Default::default()
        };
        settings.scan.enabled = false;
        settings.preflight.enabled = false;
        settings.runner = runner;
        let app = Application::build(settings).await?;
        let store = app.store().clone();
        let wake = app.consumer_wake();
        tokio::spawn(app.run_until_stopped());

        let mut launch = Vec::new();
        let mut report = Vec::new();
        for i in 0..args.runs {
            let issue = forge
                .open_issue(&repo, "reporter", &format!("Bench {i}"), "Bench issue.")
                .await;
            let mut record = IssueRecord::new(&issue, director::clock::now_ms());
            record.title = format!("Bench {i}");
            record.state = "open".into();
            record.lifecycle = Lifecycle::Queued;
            record.trigger_present = true;
            record.trigger_actor = Some("alice".into());
            record.trigger_trusted = Some(true);
            record.preflight = PreflightState {
                verdict: Some(Judgement::Go),
                ..Default::default()
            };
            // The GO verdict lands: the issue is queued and the consumer woken to admit it.
            let go_us = chrono::Utc::now().timestamp_micros();
            store
                .commit(
                    &Commit {
                        records: vec![record],
                        ..Default::default()
                    },
                    director::clock::now_ms(),
                )
                .await?;
            wake.notify_one();
            let run = wait_for_run(&store, &issue).await?;
            let container = run.container_id.clone().unwrap_or_default();
            let started_us = started_at(docker.docker(), &container).await?;
            launch.push((started_us - go_us) as f64 / 1000.0);
            // Exit → the issue is told (the run's report comment arrives at the forge).
            let mut exited_us = None;
            let told_ms = loop {
                if exited_us.is_none()
                    && let Ok(c) = docker.docker().inspect_container(&container, None).await
                    && let Some(at) = c.state.and_then(|s| s.finished_at)
                    && let Ok(t) = chrono::DateTime::parse_from_rfc3339(&at)
                    && t.timestamp() > 0
                {
                    exited_us = Some(t.timestamp_micros());
                }
                if let Some(c) = forge.calls().into_iter().find(|c| {
                    c.method == "POST"
                        && c.path
                            .ends_with(&format!("/issues/{}/comments", issue.number))
                }) {
                    break c.at_ms();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            if let Some(exited) = exited_us {
                report.push((told_ms * 1000 - exited) as f64 / 1000.0);
            }
            while !store.active_runs().await?.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        common::stats(
            "bare: create + copy task + start -> container started",
            &mut bare,
        );
        common::stats("director: GO verdict -> container started", &mut launch);
        if !report.is_empty() {
            common::stats(
                "director: container exit -> issue told (PR opened, report)",
                &mut report,
            );
        }
        let bare_median = bare[bare.len() / 2];
        let launch_median = launch[launch.len() / 2];
        println!(
            "director launch overhead: {:.1} ms over a bare launch of {:.1} ms ({:+.1}%)",
            launch_median - bare_median,
            bare_median,
            (launch_median - bare_median) / bare_median * 100.0
        );
        let _ = std::fs::remove_dir_all(&dir);
        drop(server);
        anyhow::Ok(())
    })
}

/// Waits for the run to be recorded as running (the engine has been asked to start it).
async fn wait_for_run(
    store: &Store,
    issue: &IssueRef,
) -> anyhow::Result<director::store::RunRecord> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(run) = store
            .runs_of(issue)
            .await?
            .into_iter()
            .find(|r| r.state == RunState::Running && r.container_id.is_some())
        {
            return Ok(run);
        }
        anyhow::ensure!(Instant::now() < deadline, "the run did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// When the engine started the container (its own clock, microseconds).
async fn started_at(docker: &bollard::Docker, id: &str) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = docker.inspect_container(id, None).await?;
        if let Some(at) = c.state.and_then(|s| s.started_at)
            && let Ok(t) = chrono::DateTime::parse_from_rfc3339(&at)
            && t.timestamp() > 0
        {
            return Ok(t.timestamp_micros());
        }
        anyhow::ensure!(Instant::now() < deadline, "the container did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
