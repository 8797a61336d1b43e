//! Model gateway benchmark: what the metering gateway adds to a run's model calls, on
//! loopback, against a local stand-in provider (Anthropic's Messages API).
//!
//! - **Latency**: sequential non-streamed calls, direct and through the gateway, alternating;
//!   the added p50.
//! - **First streamed byte**: the time to the first byte of a streamed answer, direct and
//!   through the gateway; the added p50.
//! - **Concurrent streams**: `--streams` streams held open at once through the gateway (each
//!   an event every 100 ms for two seconds); the process's resident memory then, against idle.
//!   Clients, provider and gateway share the process, so the figure is an upper bound of the
//!   gateway's own.
//!
//! `cargo run --release -p director-bench --bin director-modelbench`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use clap::Parser;
use director::domain::{RepoName, RunId};
use director::models::{ActiveRun, Config, Metered, ModelGateway, Provider, Runs, Spent, Upstream};
use director::settings::{BudgetSettings, Price, Secret};
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Calls each way for the latencies.
    #[arg(long, default_value_t = 500)]
    requests: usize,
    /// Streams held open at once.
    #[arg(long, default_value_t = 200)]
    streams: usize,
}

const KEY: &str = "sk-bench-provider";
const MODEL: &str = "claude-bench";

/// Every run is active and has spent nothing; what is metered is counted, not kept.
struct Always(std::sync::atomic::AtomicU64);

#[async_trait::async_trait]
impl Runs for Always {
    async fn active(&self, _run_id: &RunId) -> Result<Option<ActiveRun>, String> {
        let repo = "acme/widgets".parse().map_err(|e| format!("{e}"))?;
        Ok(Some(ActiveRun {
            repo,
            run_usd: None,
            providers: None,
            continued_usd: None,
        }))
    }
    async fn spent(&self, _: &RunId, _: &RepoName, _: &str) -> Result<Spent, String> {
        Ok(Spent::default())
    }
    async fn record(&self, _metered: &Metered) -> Result<(), String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    async fn over_budget(&self, _: &RunId, _: &str) {}
    fn now_ms(&self) -> i64 {
        director::clock::now_ms()
    }
}

/// The stand-in provider: a whole answer, a short stream, or a slow one (`"slow": true`).
async fn provider(req: HttpRequest, body: Bytes) -> HttpResponse {
    let key_ok = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) == Some(KEY);
    if !key_ok {
        return HttpResponse::Unauthorized().finish();
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let usage = r#"{"input_tokens":1000,"output_tokens":100}"#;
    if v["stream"].as_bool() != Some(true) {
        return HttpResponse::Ok()
            .content_type("application/json")
            .body(format!(
                r#"{{"id":"msg_b","type":"message","role":"assistant","model":"{MODEL}","content":[{{"type":"text","text":"ok"}}],"stop_reason":"end_turn","usage":{usage}}}"#
            ));
    }
    let slow = v["slow"].as_bool() == Some(true);
    let start = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"model\":\"{MODEL}\",\"usage\":{{\"input_tokens\":1000,\"output_tokens\":1}}}}}}\n\n"
    );
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"token \"}}\n\n";
    let end = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":100}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let events = if slow { 20 } else { 3 };
    let stream = futures_util::stream::unfold(0usize, move |i| {
        let (start, delta, end) = (start.clone(), delta, end);
        async move {
            let chunk = match i {
                0 => start,
                n if n <= events => {
                    if slow {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    delta.to_owned()
                }
                n if n == events + 1 => end.to_owned(),
                _ => return None,
            };
            Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), i + 1))
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(stream)
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn call(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    stream: bool,
) -> anyhow::Result<(f64, f64)> {
    let t = Instant::now();
    let body = serde_json::json!({ "model": MODEL, "max_tokens": 8, "stream": stream,
        "messages": [{ "role": "user", "content": "hi" }] });
    let answer = client
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(answer.status().is_success(), "{}", answer.status());
    let mut chunks = answer.bytes_stream();
    let mut first = None;
    while let Some(c) = chunks.next().await {
        c?;
        first.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((first.unwrap_or(0.0), t.elapsed().as_secs_f64() * 1000.0))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let upstream = format!("http://{}", listener.local_addr()?);
    let server = HttpServer::new(|| App::new().default_service(web::to(provider)))
        .listen(listener)?
        .workers(2)
        .disable_signals()
        .run();
    tokio::spawn(server);

    let metered = Arc::new(Always(Default::default()));
    let config = Config {
        upstreams: BTreeMap::from([(
            Provider::Anthropic,
            Upstream {
                base_url: upstream.clone(),
                api_key: Secret::new(KEY),
            },
        )]),
        prices: BTreeMap::from([(
            MODEL.to_owned(),
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
                ..Price::default()
            },
        )]),
        budget: BudgetSettings {
            run_usd: 1_000_000.0,
            ..BudgetSettings::default()
        },
        allow_unmetered: false,
        max_request_mb: 32,
        // One run's parallel streams are the load here: its cap is set above them.
        requests: director::git_gateway::request::Budget::new(
            1024,
            args.streams + 8,
            std::time::Duration::from_secs(60),
        ),
        default_max_output_tokens: 1000,
        policy: Default::default(),
        drain: std::time::Duration::from_secs(5),
    };
    let gateway = ModelGateway::new(b"bench-key".to_vec(), metered.clone(), config, None)
        .map_err(anyhow::Error::msg)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = gateway.serve(listener, CancellationToken::new())?;
    let through = format!("http://{addr}/anthropic");
    let run_key = gateway.key_of(&RunId::random());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.streams + 8)
        .build()?;

    // Warm both paths.
    for _ in 0..20 {
        call(&client, &upstream, KEY, false).await?;
        call(&client, &through, &run_key, false).await?;
    }
    let (mut direct, mut gw) = (Vec::new(), Vec::new());
    let (mut direct_first, mut gw_first) = (Vec::new(), Vec::new());
    for _ in 0..args.requests {
        direct.push(call(&client, &upstream, KEY, false).await?.1);
        gw.push(call(&client, &through, &run_key, false).await?.1);
        direct_first.push(call(&client, &upstream, KEY, true).await?.0);
        gw_first.push(call(&client, &through, &run_key, true).await?.0);
    }
    let (d, g) = (p50(direct), p50(gw));
    println!(
        "non-streamed call   p50 direct {d:.3} ms  through the gateway {g:.3} ms  added {:.3} ms",
        g - d
    );
    let (d, g) = (p50(direct_first), p50(gw_first));
    println!(
        "first streamed byte p50 direct {d:.3} ms  through the gateway {g:.3} ms  added {:.3} ms",
        g - d
    );

    // Concurrent slow streams.
    let idle = rss_kb();
    let mut tasks = Vec::new();
    for _ in 0..args.streams {
        let (client, url, key) = (client.clone(), through.clone(), run_key.clone());
        tasks.push(tokio::spawn(async move {
            let body = serde_json::json!({ "model": MODEL, "max_tokens": 8, "stream": true, "slow": true,
                "messages": [{ "role": "user", "content": "hi" }] });
            let answer = client
                .post(format!("{url}/v1/messages"))
                .header("x-api-key", key)
                .json(&body)
                .send()
                .await?;
            let mut chunks = answer.bytes_stream();
            let mut bytes = 0usize;
            while let Some(c) = chunks.next().await {
                bytes += c?.len();
            }
            anyhow::Ok(bytes)
        }));
    }
    let mut peak = idle;
    let started = Instant::now();
    while tasks.iter().any(|t| !t.is_finished()) {
        peak = peak.max(rss_kb());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ok = 0;
    for t in tasks {
        if t.await?.is_ok() {
            ok += 1;
        }
    }
    println!(
        "{} concurrent streams ({ok} completed in {:.1} s): resident {:.1} MB idle, {:.1} MB peak, +{:.1} MB",
        args.streams,
        started.elapsed().as_secs_f64(),
        idle as f64 / 1024.0,
        peak as f64 / 1024.0,
        (peak.saturating_sub(idle)) as f64 / 1024.0
    );
    println!(
        "calls metered: {}",
        metered.0.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}
