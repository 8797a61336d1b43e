//! Scan benchmark: 100 repositories holding 1,000 labelled issues in total (or what
//! `--repos` and `--issues` say), served by the FakeForge over loopback from a separate
//! process, scanned by the director's own Scanner and Consumer with a real SQLite store.
//! Reports wall time, API calls and peak RSS for a cold full pass, a steady-state full pass
//! in which nothing changed, and a steady-state incremental pass in which nothing changed.
//!
//! `cargo run --release -p director-bench --bin director-scanbench`

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use director::domain::RepoName;
use director::engine::act::Acts;
use director::engine::consumer::{Consumer, Wakes};
use director::engine::decide::Policy;
use director::engine::executor::Executor;
use director::engine::scanner::Scanner;
use director::forge::Permission;
use director::forge::forgejo::ForgejoClient;
use director::metrics::Metrics;
use director::settings::{ForgeSettings, Secret, StoreSettings};
use director::store::Store;
use director_testkit::forge::FakeForge;
use tokio::sync::Notify;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100)]
    repos: usize,
    #[arg(long, default_value_t = 1000)]
    issues: usize,
    /// Internal: run the fake forge and print its URL.
    #[arg(long)]
    serve_fake: bool,
}

const TOKEN: &str = "bench-bot-token";

fn repo_names(n: usize) -> Vec<RepoName> {
    (0..n)
        .filter_map(|i| RepoName::new("bench", &format!("repo-{i:03}")).ok())
        .collect()
}

async fn serve_fake(args: &Args) -> anyhow::Result<()> {
    let forge = FakeForge::new();
    forge.add_account("director-bot", TOKEN);
    let repos = repo_names(args.repos);
    for repo in &repos {
        forge.add_repo(&repo.to_string());
        forge.grant(repo, "director-bot", Permission::Admin);
        forge.grant(repo, "alice", Permission::Write);
        forge.define_label(repo, "headless");
    }
    for n in 0..args.issues {
        let repo = &repos[n % repos.len()];
        let issue = forge
            .open_issue(repo, "reporter", &format!("Task {n}"), "Do the thing.")
            .await;
        forge.label("alice", &issue, "headless").await;
        // An unlabelled neighbour that the scan must not pay for.
        forge
            .open_issue(repo, "reporter", &format!("Other {n}"), "")
            .await;
    }
    let server = forge.serve()?;
    println!("{}", server.url());
    std::io::stdout().flush()?;
    // Serve until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    })
    .await;
    Ok(())
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak-RSS watermark (Linux `clear_refs` 5).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn calls(metrics: &Metrics) -> u64 {
    let text = metrics.render();
    text.lines()
        .filter(|l| l.starts_with("director_forge_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.serve_fake {
        return rt.block_on(serve_fake(&args));
    }
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--serve-fake",
            "--repos",
            &args.repos.to_string(),
            "--issues",
            &args.issues.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut url = String::new();
    BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
    )
    .read_line(&mut url)?;
    let url = url.trim().to_owned();

    let result = rt.block_on(async {
        let dir = tempfile_dir()?;
        let store = Store::connect(&StoreSettings {
            url: format!("sqlite://{}/scanbench.db", dir.display()),
            ..Default::default()
        })
        .await?;
        let metrics = Metrics::new();
        let settings = ForgeSettings { url: url.clone(), token: Secret::new(TOKEN), ..Default::default() };
        let forge: Arc<dyn director::forge::Forge> = Arc::new(ForgejoClient::new(&settings, Some(metrics.clone()))?);
        let wake = Arc::new(Notify::new());
        let scanner = Scanner::new(forge.clone(), store.clone(), "headless".into(), repo_names(args.repos), Vec::new(), wake.clone());
        // The consumer decides; the executor judges triggers (timeline and permission calls).
        let mut policy_settings = director::settings::Settings::default();
        policy_settings.forge.url = url.clone();
        policy_settings.preflight.enabled = false;
        let policy = Policy::from_settings(&policy_settings);
        let executor_wake = Arc::new(Notify::new());
        // As in `serve`: the consumer and the executor run as tasks woken by each other.
        let consumer = Consumer::new(store.clone(), policy, director::clock::system(), wake.clone())
            .with_wakes(Wakes { executor: Some(executor_wake.clone()), watcher: None });
        let acts = Arc::new(Acts {
            store: store.clone(),
            forge: forge.clone(),
            labels: policy_settings.labels.clone(),
            bot: director::forge::BotLogin::new(Some("director-bot".into())),
            clock: director::clock::system(),
            preflight: None,
            runs: None,
            lane: Default::default(),
            permissions: Default::default(),
        });
        let executor = Arc::new(Executor::new(acts, director::clock::system(), executor_wake, wake.clone(), 4, 60));
        let shutdown = tokio_util::sync::CancellationToken::new();
        tokio::spawn(executor.run(shutdown.clone()));
        tokio::spawn(consumer.run(shutdown.clone()));
        println!(
            "{} repositories, {} labelled issues (and as many unlabelled), FakeForge over loopback in its own process",
            args.repos, args.issues
        );
        println!("RSS before: {} kB", status_kb("VmRSS"));
        for phase in ["cold", "steady", "incremental"] {
            reset_peak();
            let before = calls(&metrics);
            let started = Instant::now();
            let report = if phase == "incremental" {
                scanner.scan_incremental().await?
            } else {
                scanner.scan_once().await?
            };
            let listed = started.elapsed();
            // Until every observation is decided, every trigger judged and every outcome
            // decided (checked every 2 ms; the work itself is driven by wake-ups).
            while store.due_actions().await? > 0 || store.pending_deliveries().await? > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let processed = store.delivery_counts().await?.0;
            let total = started.elapsed();
            println!(
                "{phase:>11} pass: {:.3} s listing + {:.3} s processing = {:.3} s; {} API calls; {} labelled, {} queued, {} processed; peak RSS {} kB",
                listed.as_secs_f64(),
                (total - listed).as_secs_f64(),
                total.as_secs_f64(),
                calls(&metrics) - before,
                report.labelled,
                report.queued,
                processed,
                status_kb("VmHWM"),
            );
        }
        let pending = store.list_issues().await?.iter().filter(|r| r.lifecycle == director::domain::Lifecycle::Pending).count();
        println!("issues picked up: {pending}");
        shutdown.cancel();
        let _ = std::fs::remove_dir_all(&dir);
        anyhow::Ok(())
    });
    drop(child.stdin.take());
    let _ = child.wait();
    result
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("director-scanbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
