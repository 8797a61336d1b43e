//! Git gateway benchmark: what the director's git gateway adds to a run's clone and push, on
//! loopback, against FakeForge's git smart HTTP (`git http-backend`).
//!
//! - **Clone**: `git clone` of a repository holding `--size-mb` of incompressible data,
//!   direct and through the gateway, alternating.
//! - **Push**: a new commit of `--push-mb` of incompressible data on top of the default
//!   branch, pushed direct and through the gateway (where it is checked in a quarantine
//!   first), alternating.
//! - **Memory**: the gateway runs in a process of its own; its resident memory is sampled
//!   while a clone streams through it, against its idle figure.
//!
//! `cargo run --release -p director-bench --bin director-gatewaybench`

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use director::domain::RunId;
use director::forge::Permission;
use director::git_gateway::{Config, Gateway, RunAccess, Runs};
use director::settings::Secret;
use director_bench::git;
use director_testkit::forge::FakeForge;

#[derive(Parser)]
struct Args {
    /// Clones and pushes each way.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The repository's size.
    #[arg(long, default_value_t = 50)]
    size_mb: usize,
    /// Each push's size.
    #[arg(long, default_value_t = 5)]
    push_mb: usize,
    /// Internal: serve a gateway in front of UPSTREAM with TOKEN, print its port and the
    /// run's password, and wait.
    #[arg(long, num_args = 2, value_names = ["UPSTREAM", "TOKEN"])]
    serve_gateway: Option<Vec<String>>,
}

const BOT: &str = "director-bot";
const TOKEN: &str = "bench-bot-token";
/// The one run's id.
const RUN: &str = "0000000be4c8";
const BRANCH: &str = "director-bench";

/// One run, always active, whose token is the bot's.
struct OneRun {
    upstream: String,
    token: String,
}

#[async_trait::async_trait]
impl Runs for OneRun {
    async fn access(&self, run_id: &RunId) -> Result<Option<RunAccess>, String> {
        let origin = self
            .upstream
            .split("/acme/")
            .next()
            .unwrap_or_default()
            .to_owned();
        Ok((run_id.as_str() == RUN).then(|| RunAccess {
            repo: "acme/widgets".parse().expect("a repository name"),
            home: "acme/widgets".parse().expect("a repository name"),
            branch: BRANCH.into(),
            base_branch: "main".into(),
            follow_up: false,
            base_commit: None,
            setup_open: false,
            checks_open: false,
            upstream: self.upstream.clone(),
            origin,
            user: BOT.into(),
            token: Secret::new(self.token.clone()),
        }))
    }

    async fn add_refusals(&self, _refusals: &BTreeMap<(RunId, String), u32>) {}
}

fn serve_gateway(upstream: String, token: String) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let cache =
            std::env::temp_dir().join(format!("director-gatewaybench-{}", std::process::id()));
        let gateway = Gateway::new(
            b"bench key".to_vec(),
            Arc::new(OneRun { upstream, token }),
            Config {
                protected_paths: director::domain::protected::default_protected_paths(),
                max_push_mb: 100,
                git_timeout: std::time::Duration::from_secs(120),
                requests: director::git_gateway::request::Budget::new(
                    1024,
                    64,
                    std::time::Duration::from_secs(120),
                ),
                cache_dir: cache.clone(),
                disk_mb: 4096,
            },
            None,
        )
        .map_err(anyhow::Error::msg)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = gateway.serve(listener, tokio_util::sync::CancellationToken::new())?;
        println!("{} {}", addr.port(), gateway.password(&RunId::parse(RUN)?));
        std::io::stdout().flush()?;
        // Until the parent closes our stdin.
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        })
        .await?;
        let _ = std::fs::remove_dir_all(cache);
        Ok(())
    })
}

fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(v) = args.serve_gateway {
        let mut v = v.into_iter();
        let (Some(upstream), Some(token)) = (v.next(), v.next()) else {
            anyhow::bail!("--serve-gateway UPSTREAM TOKEN");
        };
        return serve_gateway(upstream, token);
    }
    let rt = tokio::runtime::Runtime::new()?;
    let forge = FakeForge::new();
    forge.add_account(BOT, TOKEN);
    let repo = forge.add_repo("acme/widgets");
    forge.grant(&repo, BOT, Permission::Admin);
    let server = rt.block_on(async { forge.serve() })?;
    let scratch = tempfile::tempdir()?;
    let root = scratch.path().join("forge");
    std::fs::create_dir_all(&root)?;
    forge.serve_git(&repo, &root)?;
    // The big commit, written into the bare repository directly.
    let bare = root.join("acme/widgets.git");
    director_bench::commit_big_file(&bare, args.size_mb)?;

    let upstream = format!("{}/acme/widgets.git", server.url());
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--serve-gateway", &upstream, TOKEN])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    std::io::BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("stdout"))?,
    )
    .read_line(&mut first)?;
    let mut parts = first.split_whitespace();
    let (Some(port), Some(password)) = (parts.next(), parts.next()) else {
        anyhow::bail!("the gateway said {first:?}");
    };
    let host = server.url().trim_start_matches("http://").to_owned();
    let direct = format!("http://{BOT}:{TOKEN}@{host}/acme/widgets.git");
    let through = format!("http://run-{RUN}:{password}@127.0.0.1:{port}/acme/widgets.git");
    let idle_kb = rss_kb(child.id());

    // Clones, alternating; the gateway's resident memory sampled while each streams.
    let (mut clone_direct, mut clone_gateway) = (Vec::new(), Vec::new());
    let peak = Arc::new(AtomicU64::new(idle_kb));
    for i in 0..args.runs {
        let d = scratch.path().join(format!("direct-{i}"));
        clone_direct.push(timed(|| {
            git(
                scratch.path(),
                &["clone", "-q", &direct, d.to_str().unwrap_or_default()],
                None,
            )
            .map(drop)
        })?);
        let g = scratch.path().join(format!("gateway-{i}"));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (sampling, peak, pid) = (sampling.clone(), peak.clone(), child.id());
            std::thread::spawn(move || {
                while sampling.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kb(pid), Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            })
        };
        clone_gateway.push(timed(|| {
            git(
                scratch.path(),
                &["clone", "-q", &through, g.to_str().unwrap_or_default()],
                None,
            )
            .map(drop)
        })?);
        sampling.store(false, Ordering::Relaxed);
        let _ = sampler.join();
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&g);
    }

    // Pushes: a fresh commit of --push-mb each time, each way.
    let work = scratch.path().join("work");
    git(
        scratch.path(),
        &["clone", "-q", &direct, work.to_str().unwrap_or_default()],
        None,
    )?;
    let (mut push_direct, mut push_gateway) = (Vec::new(), Vec::new());
    for i in 0..args.runs {
        for via_gateway in [false, true] {
            git(&work, &["checkout", "-q", "--detach", "origin/main"], None)?;
            std::fs::write(
                work.join("push.bin"),
                director_bench::random_bytes(args.push_mb),
            )?;
            git(&work, &["add", "push.bin"], None)?;
            git(&work, &["commit", "-q", "-m", "push"], None)?;
            let ms = if via_gateway {
                timed(|| {
                    git(
                        &work,
                        &[
                            "push",
                            "-q",
                            "--force",
                            &through,
                            &format!("HEAD:refs/heads/{BRANCH}"),
                        ],
                        None,
                    )
                    .map(drop)
                })?
            } else {
                timed(|| {
                    git(
                        &work,
                        &[
                            "push",
                            "-q",
                            &direct,
                            &format!("HEAD:refs/heads/direct-{i}"),
                        ],
                        None,
                    )
                    .map(drop)
                })?
            };
            if via_gateway {
                push_gateway.push(ms);
            } else {
                push_direct.push(ms);
            }
        }
    }
    drop(child.stdin.take());
    let _ = child.wait();

    let (cd, cg) = (median(clone_direct), median(clone_gateway));
    let (pd, pg) = (median(push_direct), median(push_gateway));
    let grew_mb = peak.load(Ordering::Relaxed).saturating_sub(idle_kb) as f64 / 1024.0;
    println!("git gateway, {} runs each way, medians:", args.runs);
    println!(
        "clone {} MB   direct {cd:7.1} ms   gateway {cg:7.1} ms   {:+.1}%",
        args.size_mb,
        (cg / cd - 1.0) * 100.0
    );
    println!(
        "push {} MB     direct {pd:7.1} ms   gateway {pg:7.1} ms   {:+.1}%",
        args.push_mb,
        (pg / pd - 1.0) * 100.0
    );
    println!(
        "gateway memory: idle {:.1} MB, at most {grew_mb:.1} MB more while clones streamed",
        idle_kb as f64 / 1024.0
    );
    Ok(())
}
