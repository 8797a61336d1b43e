//! Egress proxy benchmark: what the proxy adds to a run's network use, on loopback.
//!
//! - **Latency**: sequential HTTP requests to a trivial origin, each on a new connection (as
//!   the proxy forwards them: one destination per connection), direct and through the proxy.
//! - **Throughput**: `git clone` of a repository holding `--size-mb` of incompressible data,
//!   served by FakeForge's git smart HTTP (`git http-backend`), direct and through the proxy,
//!   alternating.
//!
//! `cargo run --release -p director-bench --bin director-egressbench`

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use director::domain::RunId;
use director::egress::proxy::{Ledger, Proxy};
use director::egress::{Entry, Policy};
use director::forge::Permission;
use director_testkit::forge::FakeForge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Clones each way.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The repository's size.
    #[arg(long, default_value_t = 50)]
    size_mb: usize,
    /// Requests each way for the latency.
    #[arg(long, default_value_t = 500)]
    requests: usize,
}

const BOT: &str = "director-bot";
const TOKEN: &str = "bench-bot-token";

struct Anyone;

#[async_trait::async_trait]
impl Ledger for Anyone {
    async fn active(&self, _run_id: &RunId) -> Option<Vec<director::egress::Entry>> {
        Some(Vec::new())
    }
    async fn add_refusals(&self, _r: &BTreeMap<(RunId, String), u32>) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A directory of the benchmark's own under the system's temporary directory, removed after.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "director-egressbench-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A trivial origin: answers every request `ok` and closes.
async fn origin() -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn latency(client: &reqwest::Client, url: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client.get(url).send().await?;
        anyhow::ensure!(r.status().is_success(), "{}", r.status());
        r.bytes().await?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(out)
}

fn clone(url: &str, dest: &Path, proxy: Option<&str>) -> anyhow::Result<f64> {
    let _ = std::fs::remove_dir_all(dest);
    let mut cmd = Command::new("git");
    cmd.args(["clone", "--quiet", url])
        .arg(dest)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env("NO_PROXY", "")
        .env("no_proxy", "");
    if let Some(p) = proxy {
        cmd.env("http_proxy", p).env("HTTP_PROXY", p);
    }
    let t = Instant::now();
    let status = cmd.status()?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        status.success(),
        "git clone failed (proxy: {})",
        proxy.is_some()
    );
    Ok(secs)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let forge = FakeForge::new();
        forge.add_account(BOT, TOKEN);
        let repo = forge.add_repo("acme/widgets");
        forge.grant(&repo, BOT, Permission::Admin);
        let server = forge.serve()?;
        let root = Scratch::new("forge")?;
        forge.serve_git(&repo, root.path())?;
        // The big commit, written into the bare repository directly (no push, no hook).
        let bare = root.path().join("acme/widgets.git");
        director_bench::commit_big_file(&bare, args.size_mb)?;

        let forge_addr: std::net::SocketAddr = server
            .url()
            .trim_start_matches("http://")
            .parse()?;
        let echo = origin().await?;
        let policy = Policy::new(
            &[],
            vec![
                Entry::exact("127.0.0.1", forge_addr.port()),
                Entry::exact("127.0.0.1", echo.port()),
            ],
            Vec::new(),
        )
        .map_err(anyhow::Error::msg)?;
        let (proxy, listener) = Proxy::bind(
            "127.0.0.1:0".parse()?,
            policy,
            b"bench-key".to_vec(),
            Arc::new(Anyone),
            None,
        )
        .await
        .map_err(anyhow::Error::msg)?;
        proxy.clone().serve(listener, CancellationToken::new());
        let run = RunId::random();
        let proxy_url = proxy.url_for(&run, "127.0.0.1");

        // Latency: a new connection per request, both ways.
        let direct = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()?;
        let proxied = reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(&proxy_url)?)
            .pool_max_idle_per_host(0)
            .build()?;
        let url = format!("http://{echo}/");
        latency(&direct, &url, 50).await?;
        latency(&proxied, &url, 50).await?;
        let d = latency(&direct, &url, args.requests).await?;
        let p = latency(&proxied, &url, args.requests).await?;
        println!(
            "request latency ({} each, new connection): direct p50 {:.3} ms p95 {:.3} ms; through the proxy p50 {:.3} ms p95 {:.3} ms; added p50 {:.3} ms",
            args.requests,
            percentile(d.clone(), 0.5),
            percentile(d.clone(), 0.95),
            percentile(p.clone(), 0.5),
            percentile(p.clone(), 0.95),
            percentile(p, 0.5) - percentile(d, 0.5),
        );

        // Throughput: git clone, alternating.
        let clone_url = format!(
            "http://{BOT}:{TOKEN}@127.0.0.1:{}/acme/widgets.git",
            forge_addr.port()
        );
        let work = Scratch::new("clone")?;
        let dest = work.path().join("clone");
        // The proxy is on the path: a wrong password fails the clone.
        let wrong = proxy_url.replacen(&proxy.password(&run), "wrong", 1);
        anyhow::ensure!(
            clone(&clone_url, &dest, Some(&wrong)).is_err(),
            "a clone with the wrong proxy password went through: the proxy is not on the path"
        );
        clone(&clone_url, &dest, None)?;
        let (mut direct_s, mut proxied_s) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            direct_s.push(clone(&clone_url, &dest, None)?);
            proxied_s.push(clone(&clone_url, &dest, Some(&proxy_url))?);
        }
        let (dm, pm) = (median(direct_s.clone()), median(proxied_s.clone()));
        let mb = args.size_mb as f64;
        println!(
            "git clone of {} MB ({} each, alternating): direct median {:.2} s ({:.0} MB/s); through the proxy median {:.2} s ({:.0} MB/s); proxied/direct {:.3}",
            args.size_mb,
            args.runs,
            dm,
            mb / dm,
            pm,
            mb / pm,
            pm / dm
        );
        println!("direct runs: {direct_s:.2?}\nproxied runs: {proxied_s:.2?}");
        anyhow::Ok(())
    })
}
