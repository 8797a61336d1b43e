//! Flow benchmark: what a maintainer waits for, through a real `director serve` process.
//!
//! - a signed `issue_label` webhook (a writer applies the trigger) → the pre-flight comment
//!   created on the forge, with an instant model;
//! - the GO verdict (that comment) → the run's container started (Docker, the test agent).
//!
//! The director is driven only over HTTP and its configuration variables, so the same
//! benchmark measures any build of it (`--director PATH`). FakeForge serves the forge over
//! loopback in this process; a tiny OpenAI-compatible model answers `GO` at once.
//!
//! `cargo run --release -p director-bench --bin director-flowbench -- --issues 40 --runs 10`

use director_bench as common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use director::domain::RepoName;
use director::forge::Permission;
use director_testkit::forge::FakeForge;

const SECRET: &str = "bench-webhook-secret";
const BOT_TOKEN: &str = "bench-bot-token";

#[derive(Parser)]
struct Args {
    /// The `director` binary to measure (default: the one built beside this benchmark).
    #[arg(long)]
    director: Option<String>,
    /// Issues labelled one after another for the pre-flight figure.
    #[arg(long, default_value_t = 40)]
    issues: usize,
    /// Runs for the launch figure (0: skip; needs Docker).
    #[arg(long, default_value_t = 10)]
    runs: usize,
}

/// An OpenAI-compatible model on loopback that answers every request with `GO` at once.
fn instant_model() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = answer(stream);
            });
        }
    });
    Ok(url)
}

fn answer(stream: std::net::TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let reply = r#"{"id":"b","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Context: none.\n\nGO"},"finish_reason":"stop"}]}"#;
        // One write, no Nagle: a reply split over small writes waits for a delayed ACK.
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        );
        stream.write_all(response.as_bytes())?;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Director {
    child: Child,
    _dir: tempfile_dir::Dir,
}

mod tempfile_dir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn start(
    binary: &str,
    forge: &FakeForge,
    forge_url: &str,
    model_url: &str,
    runs: Option<(&str, usize)>,
) -> anyhow::Result<Director> {
    let port = free_port()?;
    let dir =
        std::env::temp_dir().join(format!("director-flowbench-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    forge.set_webhook(&format!("http://127.0.0.1:{port}/webhooks/forgejo"), SECRET);
    let mut cmd = Command::new(binary);
    cmd.arg("serve")
        .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "DIRECTOR_STORE__URL",
            format!("sqlite://{}/d.db", dir.display()),
        )
        .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
        .env("DIRECTOR_FORGE__URL", forge_url)
        .env("DIRECTOR_FORGE__TOKEN", BOT_TOKEN)
        .env("DIRECTOR_FORGE__RUNNER_LOGIN", "director-runner")
        .env("DIRECTOR_FORGE__RUNNER_PASSWORD", "bench-pass")
        .env("DIRECTOR_SCAN__REPOS", "bench/widgets")
        .env("DIRECTOR_SCAN__ENABLED", "false")
        .env("DIRECTOR_PREFLIGHT__BASE_URL", model_url)
        .env("DIRECTOR_PREFLIGHT__MODEL", "bench")
        .env("DIRECTOR_PREFLIGHT__MAX_PER_HOUR", "100000")
        .env("DIRECTOR_PREFLIGHT__MAX_PER_REPO_PER_HOUR", "100000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    // `FLOWBENCH_LOG=FILE` keeps what the director says.
    match std::env::var("FLOWBENCH_LOG") {
        Ok(file) => {
            cmd.env("RUST_LOG", "info").stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(file)?,
            );
        }
        Err(_) => {
            cmd.stderr(Stdio::null());
        }
    }
    match runs {
        Some((image, count)) => {
            cmd.env("DIRECTOR_RUNNER__IMAGE", image)
                .env("DIRECTOR_RUNNER__NETWORK", "host")
                .env("DIRECTOR_RUNNER__EGRESS", "open")
                .env("DIRECTOR_RUNNER__MEMORY_MB", "256")
                .env("DIRECTOR_RUNNER__MAX_CONCURRENT", "1")
                // Every run leaves a pull request open; the limit on them (6 by default) is
                // not what this measures, and held back every run after the sixth.
                .env(
                    "DIRECTOR_RUNNER__MAX_OPEN_PRS_PER_REPO",
                    count.max(1).to_string(),
                );
        }
        None => {
            cmd.env("DIRECTOR_RUNNER__ENABLED", "false");
        }
    }
    let child = cmd.spawn()?;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the director did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The director learns its own login (`GET /user`) before it ignores its own events.
    let learned = r#"director_forge_requests_total{endpoint="/user",status="200"} 1"#;
    loop {
        let metrics = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        if metrics.contains(learned) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the director did not learn its login"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Director {
        child,
        _dir: tempfile_dir::Dir(dir),
    })
}

impl Drop for Director {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When the forge received the first comment on issue `number` (µs since the epoch): woken
/// by each call the forge records, so the wait neither polls nor holds the forge's lock.
async fn comment_posted(forge: &FakeForge, number: u64) -> anyhow::Result<i64> {
    let suffix = format!("/issues/{number}/comments");
    forge
        .first_call(
            |c| c.method == "POST" && c.path.ends_with(&suffix),
            Duration::from_secs(30),
        )
        .await
        .map(|c| c.at_us)
        .ok_or_else(|| anyhow::anyhow!("no pre-flight comment on #{number}"))
}

/// When the engine started the run container of issue `number` (µs since the epoch).
async fn container_started(docker: &bollard::Docker, number: u64) -> anyhow::Result<(String, i64)> {
    use bollard::query_parameters::ListContainersOptions;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let filters = std::collections::HashMap::from([(
            "label".to_owned(),
            vec![
                format!("director.issue={number}"),
                "director.repo=bench/widgets".to_owned(),
            ],
        )]);
        let list = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        // A container gone between the listing and the inspect is looked for again.
        if let Some(id) = list.into_iter().find_map(|c| c.id)
            && let Ok(c) = docker.inspect_container(&id, None).await
            && let Some(at) = c.state.and_then(|s| s.started_at)
            && let Ok(t) = chrono::DateTime::parse_from_rfc3339(&at)
            && t.timestamp() > 0
        {
            return Ok((id, t.timestamp_micros()));
        }
        anyhow::ensure!(Instant::now() < deadline, "no container for #{number}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let binary = match args.director {
        Some(b) => b,
        None => std::env::current_exe()?
            .with_file_name("director")
            .to_string_lossy()
            .into_owned(),
    };
    let image = if args.runs > 0 {
        Some(common::build_image("director-flowbench-agent:latest")?)
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let forge = FakeForge::new();
        forge.add_account("director-bot", BOT_TOKEN);
        let repo: RepoName = forge.add_repo("bench/widgets");
        forge.grant(&repo, "director-bot", Permission::Admin);
        forge.grant(&repo, "alice", Permission::Write);
        // Runs push to the runner's fork (the default): the runner reads the repository
        // and may not write to it, or no run starts.
        forge.grant(&repo, "director-runner", Permission::Read);
        forge.set_password("director-runner", "bench-pass");
        forge.define_label(&repo, "headless");
        let server = forge.serve()?;
        let model = instant_model()?;
        println!("director: {binary}");

        let mut preflight = Vec::new();
        {
            let _d = start(&binary, &forge, server.url(), &model, None).await?;
            for i in 0..args.issues {
                let issue = forge
                    .open_issue(&repo, "reporter", &format!("Flow {i}"), "Bench issue.")
                    .await;
                let t0 = chrono::Utc::now().timestamp_micros();
                forge.label("alice", &issue, "headless").await;
                let posted = comment_posted(&forge, issue.number).await?;
                preflight.push((posted - t0) as f64 / 1000.0);
            }
        }
        common::percentiles(
            "webhook (trigger applied) -> pre-flight comment",
            &mut preflight,
        );

        if let Some(image) = image {
            let docker = bollard::Docker::connect_with_defaults()?
                .negotiate_version()
                .await?;
            let runs = Some((image.as_str(), args.runs));
            let _d = start(&binary, &forge, server.url(), &model, runs).await?;
            let mut launch = Vec::new();
            for i in 0..args.runs {
                let issue = forge
                    .open_issue(
                        &repo,
                        "reporter",
                        &format!("Run {i}"),
                        "Bench run.\nmode: slow",
                    )
                    .await;
                forge.label("alice", &issue, "headless").await;
                let go_us = comment_posted(&forge, issue.number).await?;
                let (id, started_us) = container_started(&docker, issue.number).await?;
                launch.push((started_us - go_us) as f64 / 1000.0);
                // One at a time: wait for the run's end (the container is removed).
                let deadline = Instant::now() + Duration::from_secs(60);
                while docker.inspect_container(&id, None).await.is_ok() {
                    anyhow::ensure!(Instant::now() < deadline, "run {i} did not end");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            common::percentiles("GO verdict (comment) -> container started", &mut launch);
        }
        drop(server);
        anyhow::Ok(())
    })
}
