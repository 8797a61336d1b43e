//! Load generator for webhook intake. Fires signed, distinct `issues` deliveries at a URL and
//! reports throughput and latency percentiles, first flat out (closed loop, N connections),
//! then at a fixed rate (open loop: latency counts from the scheduled send time, so a stall
//! is not hidden). `--serve-trivial ADDR` instead runs a trivial actix handler to compare with.
//!
//! ```text
//! director-loadgen --url http://127.0.0.1:8080/webhooks/forgejo --secret S
//! director-loadgen --serve-trivial 127.0.0.1:8091
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use director::http::signature::sign;

#[derive(Parser)]
struct Args {
    /// Webhook URL to load; several, comma-separated, share the load in turn (replicas).
    #[arg(long)]
    url: Option<String>,
    /// Webhook secret to sign with.
    #[arg(long, default_value = "bench-secret")]
    secret: String,
    /// Deliveries in the flat-out phase.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Concurrent connections in the flat-out phase.
    #[arg(long, default_value_t = 32)]
    concurrency: u64,
    /// Deliveries per second in the fixed-rate phase.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// Length of the fixed-rate phase.
    #[arg(long, default_value_t = 10)]
    rate_secs: u64,
    /// Where delivery numbering starts, so several runs against one database stay distinct.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Run a trivial handler on this address instead of generating load.
    #[arg(long)]
    serve_trivial: Option<String>,
}

/// The body of delivery `n`: Forgejo's pretty-printed layout, ~1.4 KB. Built from a template
/// rendered once, so that the generator, which shares the machine's cores with what it
/// measures, spends as little as it can on each delivery.
struct Bodies {
    /// The template split at each place a number goes, and which number goes there.
    pieces: Vec<(String, Slot)>,
    tail: String,
}

#[derive(Clone, Copy)]
enum Slot {
    /// The delivery's own number.
    N,
    /// The issue it is about: `n % 5000 + 1`.
    Issue,
}

impl Bodies {
    /// Marks stand in for the numbers while the template is rendered.
    const N_MARK: u64 = 987_654_321_987;
    const ISSUE_MARK: u64 = 123_456_789_123;

    fn new() -> Self {
        let template = render(Self::N_MARK, Self::ISSUE_MARK);
        let (n, issue) = (Self::N_MARK.to_string(), Self::ISSUE_MARK.to_string());
        let mut pieces = Vec::new();
        let mut rest = template.as_str();
        loop {
            let next = [
                (rest.find(&n), Slot::N, n.len()),
                (rest.find(&issue), Slot::Issue, issue.len()),
            ]
            .into_iter()
            .filter_map(|(at, slot, len)| at.map(|at| (at, slot, len)))
            .min_by_key(|(at, _, _)| *at);
            let Some((at, slot, len)) = next else { break };
            pieces.push((rest[..at].to_owned(), slot));
            rest = &rest[at + len..];
        }
        Self {
            pieces,
            tail: rest.to_owned(),
        }
    }

    fn body(&self, n: u64) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(1536);
        for (text, slot) in &self.pieces {
            out.push_str(text);
            let value = match slot {
                Slot::N => n,
                Slot::Issue => n % 5000 + 1,
            };
            let _ = write!(out, "{value}");
        }
        out.push_str(&self.tail);
        out
    }
}

/// The delivery's JSON, as serde renders it (`issue` is normally `n % 5000 + 1`).
fn render(n: u64, issue: u64) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "action": "labeled_bench",
        "number": issue,
        "issue": {
            "id": n, "number": issue, "title": format!("Bench issue {n}"),
            "body": "A benchmark delivery with a body of ordinary size. ".repeat(20),
            "state": "open", "labels": [{"id": 1, "name": "headless"}],
            "user": {"id": 1, "login": "reporter"},
            "updated_at": "2026-11-30T10:00:00Z", "pull_request": null
        },
        "repository": {"id": 1, "name": "widgets", "full_name": "acme/widgets", "owner": {"login": "acme"}},
        "sender": {"id": 2, "login": "alice"}
    }))
    .unwrap_or_default()
}

struct Report {
    sent: u64,
    failed: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Report {
    fn print(&self, label: &str) {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        let pct = |p: f64| {
            if l.is_empty() {
                0.0
            } else {
                l[((l.len() as f64 - 1.0) * p) as usize] as f64 / 1000.0
            }
        };
        println!(
            "{label}: {} sent, {} failed, {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.sent,
            self.failed,
            self.sent as f64 / self.elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            pct(1.0),
        );
    }
}

static BODIES: std::sync::LazyLock<Bodies> = std::sync::LazyLock::new(Bodies::new);

async fn send(client: &reqwest::Client, url: &str, secret: &str, n: u64) -> bool {
    let body = BODIES.body(n);
    let sig = sign(secret, body.as_bytes());
    client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Forgejo-Event-Type", "issues")
        .header("X-Forgejo-Delivery", format!("bench-{n}"))
        .header("X-Forgejo-Signature", sig)
        .body(body)
        .send()
        .await
        // 202: stored as new. Anything else (a duplicate, an ignored event, an error) means
        // the measurement is not of the durable intake path.
        .is_ok_and(|r| r.status() == reqwest::StatusCode::ACCEPTED)
}

/// The URL delivery `n` goes to.
fn pick(urls: &[String], n: u64) -> &str {
    &urls[usize::try_from(n).unwrap_or(0) % urls.len()]
}

async fn flat_out(client: &reqwest::Client, args: &Args, urls: &[String], offset: u64) -> Report {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, urls, secret) = (
            client.clone(),
            next.clone(),
            urls.to_vec(),
            args.secret.clone(),
        );
        let total = args.requests;
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut failed) = (Vec::new(), 0);
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return (lat, failed);
                }
                let t = Instant::now();
                if !send(&client, pick(&urls, n), &secret, offset + n).await {
                    failed += 1;
                }
                lat.push(t.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut report = Report {
        sent: args.requests,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        if let Ok((lat, failed)) = t.await {
            report.latencies_us.extend(lat);
            report.failed += failed;
        }
    }
    report.elapsed = started.elapsed();
    report
}

async fn fixed_rate(client: &reqwest::Client, args: &Args, urls: &[String], offset: u64) -> Report {
    let total = args.rate * args.rate_secs;
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = started + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let (client, url, secret) = (
            client.clone(),
            pick(urls, i).to_owned(),
            args.secret.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let ok = send(&client, &url, &secret, offset + i).await;
            (ok, due.elapsed().as_micros() as u64)
        }));
    }
    let mut report = Report {
        sent: total,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        if let Ok((ok, lat)) = t.await {
            report.failed += u64::from(!ok);
            report.latencies_us.push(lat);
        }
    }
    report.elapsed = started.elapsed();
    report
}

async fn trivial() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Accepted().body("{\"status\":\"accepted\"}")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(addr) = &args.serve_trivial {
        let addr = addr.clone();
        return actix_web::rt::System::new().block_on(async move {
            actix_web::HttpServer::new(|| {
                actix_web::App::new()
                    .app_data(actix_web::web::PayloadConfig::new(8 << 20))
                    .route(
                        "/webhooks/forgejo",
                        actix_web::web::post().to(|_b: actix_web::web::Bytes| trivial()),
                    )
            })
            .bind(addr)?
            .run()
            .await
            .map_err(Into::into)
        });
    }
    let urls: Vec<String> = args
        .url
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--url is required"))?
        .split(',')
        .map(str::to_owned)
        .collect();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        let warm = Args {
            requests: 500,
            ..Args::parse()
        };
        flat_out(&client, &warm, &urls, args.offset + 10_000_000).await;
        flat_out(&client, &args, &urls, args.offset)
            .await
            .print("flat-out");
        fixed_rate(&client, &args, &urls, args.offset + 1_000_000)
            .await
            .print(&format!("fixed {}/s", args.rate));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_from_the_template_are_those_serde_renders() {
        let bodies = Bodies::new();
        for n in [0, 1, 4_999, 5_000, 10_000_123, 987_654] {
            assert_eq!(bodies.body(n), render(n, n % 5000 + 1), "delivery {n}");
        }
    }
}
