//! Load generator for webhook intake. Fires signed, distinct `issues` deliveries at a URL and
//! reports throughput and latency percentiles, first flat out (closed loop, N connections),
//! then at a fixed rate (open loop: latency counts from the scheduled send time, so a stall
//! is not hidden). `--serve-trivial ADDR` instead runs a trivial actix handler to compare with.
//! `--flood URLS` instead sends anonymous GETs to loopback URLs flat out (`bench/outcomes-flood.sh`
//! floods `/status/outcomes` with it while intake is measured).
//!
//! It shares the machine's cores with what it measures, so it spends as little as it can:
//! each phase's requests are rendered and signed before its clock starts, written whole on
//! keep-alive HTTP/1.1 connections of its own and their answers read only as far as status
//! and length; the fixed-rate schedule keeps time on a thread of its own.
//!
//! ```text
//! director-loadgen --url http://127.0.0.1:8080/webhooks/forgejo --secret S
//! director-loadgen --serve-trivial 127.0.0.1:8091
//! director-loadgen --flood 'http://127.0.0.1:8080/status/outcomes?days=30' --concurrency 64
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use director::forge::signature::sign;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    /// Leave out the flat-out phase: a warm-up, then the fixed-rate phase alone.
    #[arg(long)]
    fixed_only: bool,
    /// Instead of deliveries: GET these loopback URLs (comma-separated, in turn) without
    /// credentials on `--concurrency` connections, flat out, until `--flood-secs` pass,
    /// `--flood-requests` are sent or a SIGTERM comes; then print how many were answered.
    #[arg(long)]
    flood: Option<String>,
    /// The flood's longest duration.
    #[arg(long, default_value_t = 120)]
    flood_secs: u64,
    /// The flood's most requests.
    #[arg(long, default_value_t = 5_000_000)]
    flood_requests: u64,
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

/// Where one `--url` points: the address to connect to and the request line's target.
struct Target {
    addr: SocketAddr,
    authority: String,
    path: String,
}

impl Target {
    /// Resolves the address once, before any load.
    fn parse(url: &str) -> anyhow::Result<Self> {
        let parsed = reqwest::Url::parse(url).with_context(|| format!("--url `{url}`"))?;
        if parsed.scheme() != "http" {
            anyhow::bail!("--url `{url}`: only plain http is spoken here");
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| anyhow::anyhow!("--url `{url}` names no host"))?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let addr = parsed
            .socket_addrs(|| None)
            .with_context(|| format!("--url `{url}`: resolving {host}"))?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("--url `{url}`: {host} resolves to nothing"))?;
        let path = match parsed.query() {
            Some(query) => format!("{}?{query}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        Ok(Self {
            addr,
            authority: format!("{host}:{port}"),
            path,
        })
    }

    /// Delivery `n` as the bytes of a whole HTTP/1.1 request: body, signature and headers
    /// made before the clock starts, so that sending it costs the generator one write.
    fn request(&self, secret: &str, n: u64) -> Vec<u8> {
        let body = BODIES.body(n);
        let sig = sign(secret, body.as_bytes());
        let mut out = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             X-Forgejo-Event-Type: issues\r\nX-Forgejo-Delivery: bench-{n}\r\n\
             X-Forgejo-Signature: {sig}\r\nContent-Length: {}\r\n\r\n",
            self.path,
            self.authority,
            body.len(),
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// An anonymous GET of the target, as the bytes of a whole HTTP/1.1 request.
    fn get(&self) -> Vec<u8> {
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: text/html\r\n\r\n",
            self.path, self.authority
        )
        .into_bytes()
    }
}

/// One keep-alive HTTP/1.1 connection, opened on first use and again after a failure.
/// A request is written whole and its answer read just far enough to know its status
/// and where it ends. The generator shares the two cores with what it measures: through
/// a general-purpose client each request cost it about 50 µs of CPU.
struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            stream: None,
            buf: Vec::with_capacity(1024),
        }
    }

    /// The answer's status; `None` when the exchange failed (the connection is dropped).
    async fn send(&mut self, request: &[u8]) -> Option<u16> {
        let reused = self.stream.is_some();
        let mut answer = self.exchange(request).await;
        // A kept-alive connection that the server closed while it sat idle fails before a
        // byte of answer: sent once more, on a new connection. (Had the request reached the
        // director after all, the second copy is answered as a duplicate, not with a 202, and
        // still counts as a failure.)
        if reused && answer.is_err() && self.buf.is_empty() {
            self.stream = None;
            answer = self.exchange(request).await;
        }
        match answer {
            Ok((status, keep)) => {
                if !keep {
                    self.stream = None;
                }
                Some(status)
            }
            Err(_) => {
                self.stream = None;
                None
            }
        }
    }

    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, bool)> {
        let stream = match &mut self.stream {
            Some(s) => s,
            None => {
                let s = TcpStream::connect(self.addr).await?;
                s.set_nodelay(true)?;
                self.stream.insert(s)
            }
        };
        stream.write_all(request).await?;
        self.buf.clear();
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            let parsed = response.parse(&self.buf).map_err(std::io::Error::other)?;
            if let httparse::Status::Complete(head) = parsed {
                let status = response.code.unwrap_or(0);
                let header = |name: &str| {
                    response
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                };
                if header("transfer-encoding").is_some() {
                    return Err(std::io::Error::other("chunked answers are not read here"));
                }
                let keep = !header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
                let length: usize = header("content-length")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while self.buf.len() < head + length {
                    read_more(stream, &mut self.buf).await?;
                }
                return Ok((status, keep));
            }
            read_more(stream, &mut self.buf).await?;
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    // Room for a large answer (a status page) in few reads: the flood's reading costs the
    // shared cores what it costs the server, not a read per kilobyte.
    buf.reserve(16 * 1024);
    match stream.read_buf(buf).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(()),
    }
}

/// 202: stored as new. Anything else (a duplicate, an ignored event, an error) means the
/// measurement is not of the durable intake path.
fn accepted(status: Option<u16>) -> bool {
    status == Some(202)
}

/// Request `i` of a phase goes to target `i % targets`, in turn (replicas share the load).
fn pick_mut<T>(items: &mut [T], i: usize) -> &mut T {
    let at = i % items.len();
    &mut items[at]
}

/// Requests `offset + 0 .. offset + count`, rendered before the phase that sends them.
fn prepare(targets: &[Target], secret: &str, offset: u64, count: u64) -> Vec<Vec<u8>> {
    (0..count)
        .zip(targets.iter().cycle())
        .map(|(i, target)| target.request(secret, offset + i))
        .collect()
}

async fn flat_out(
    targets: &Arc<[Target]>,
    secret: &str,
    count: u64,
    concurrency: u64,
    offset: u64,
) -> Report {
    let requests: Arc<[Vec<u8>]> = prepare(targets, secret, offset, count).into();
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (targets, next, requests) = (targets.clone(), next.clone(), requests.clone());
        tasks.push(tokio::spawn(async move {
            let mut conns: Vec<Conn> = targets.iter().map(|t| Conn::new(t.addr)).collect();
            let (mut lat, mut failed) = (Vec::new(), 0);
            loop {
                let i = usize::try_from(next.fetch_add(1, Ordering::Relaxed)).unwrap_or(usize::MAX);
                let Some(request) = requests.get(i) else {
                    return (lat, failed);
                };
                let t = Instant::now();
                if !accepted(pick_mut(&mut conns, i).send(request).await) {
                    failed += 1;
                }
                lat.push(t.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut report = Report {
        sent: count,
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

/// Connections not in use, per target, for the open-loop phase: a request never waits for
/// one (a new connection is opened when none is free).
type Idle = Arc<std::sync::Mutex<Vec<Vec<Conn>>>>;

async fn fixed_rate(targets: &Arc<[Target]>, args: &Args, offset: u64) -> Report {
    let total = args.rate * args.rate_secs;
    let requests = prepare(targets, &args.secret, offset, total);
    let targets = targets.clone();
    let idle: Idle = Arc::new(std::sync::Mutex::new(
        targets.iter().map(|_| Vec::new()).collect(),
    ));
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let runtime = tokio::runtime::Handle::current();
    let started = Instant::now();
    // The schedule keeps time on a thread of its own, with the system's sleep: tokio's timer
    // counts whole milliseconds and sent each request up to 1 ms late, time that was then
    // counted against the server.
    let schedule = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::with_capacity(requests.len());
        for (i, request) in requests.into_iter().enumerate() {
            let due = started + interval * i as u32;
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let at = i % targets.len();
            let (addr, idle) = (targets[at].addr, idle.clone());
            tasks.push(runtime.spawn(async move {
                let taken = idle.lock().ok().and_then(|mut free| free[at].pop());
                let mut conn = taken.unwrap_or_else(|| Conn::new(addr));
                let ok = accepted(conn.send(&request).await);
                let latency = due.elapsed().as_micros() as u64;
                if let Ok(mut free) = idle.lock() {
                    free[at].push(conn);
                }
                (ok, latency)
            }));
        }
        tasks
    });
    let tasks = schedule.await.unwrap_or_default();
    let mut report = Report {
        sent: total,
        failed: total,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    // What does not come back accepted, however it was lost, failed.
    for t in tasks {
        if let Ok((ok, lat)) = t.await {
            report.failed -= u64::from(ok);
            report.latencies_us.push(lat);
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// The flood: each of `concurrency` connections sends the next GET as soon as the last is
/// answered, until the deadline, the count or a SIGTERM. Only a 200 counts as answered.
async fn flood(targets: &Arc<[Target]>, args: &Args) -> anyhow::Result<Report> {
    for t in targets.iter() {
        if !t.addr.ip().is_loopback() {
            anyhow::bail!("--flood sends only to loopback, not {}", t.addr);
        }
    }
    let requests: Arc<[Vec<u8>]> = targets.iter().map(Target::get).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let on_term = stop.clone();
    tokio::spawn(async move {
        term.recv().await;
        on_term.store(true, Ordering::Relaxed);
    });
    let deadline = Instant::now() + Duration::from_secs(args.flood_secs);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (targets, requests) = (targets.clone(), requests.clone());
        let (next, stop, max) = (next.clone(), stop.clone(), args.flood_requests);
        tasks.push(tokio::spawn(async move {
            let mut conns: Vec<Conn> = targets.iter().map(|t| Conn::new(t.addr)).collect();
            let (mut lat, mut failed) = (Vec::new(), 0u64);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max {
                    break;
                }
                let at = usize::try_from(i).unwrap_or(0) % requests.len();
                let t = Instant::now();
                if conns[at].send(&requests[at]).await != Some(200) {
                    failed += 1;
                }
                lat.push(t.elapsed().as_micros() as u64);
            }
            (lat, failed)
        }));
    }
    let mut report = Report {
        sent: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        if let Ok((lat, failed)) = t.await {
            report.sent += lat.len() as u64;
            report.latencies_us.extend(lat);
            report.failed += failed;
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
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
    let urls = args
        .flood
        .clone()
        .or_else(|| args.url.clone())
        .ok_or_else(|| anyhow::anyhow!("--url (or --flood) is required"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let targets = urls
            .split(',')
            .map(Target::parse)
            .collect::<anyhow::Result<Arc<[Target]>>>()?;
        if args.flood.is_some() {
            flood(&targets, &args).await?.print("flood (200 answers)");
            return Ok(());
        }
        let warm_offset = args.offset + 10_000_000;
        flat_out(&targets, &args.secret, 500, args.concurrency, warm_offset).await;
        if !args.fixed_only {
            flat_out(
                &targets,
                &args.secret,
                args.requests,
                args.concurrency,
                args.offset,
            )
            .await
            .print("flat-out");
        }
        fixed_rate(&targets, &args, args.offset + 1_000_000)
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

    fn target(addr: SocketAddr) -> Target {
        Target {
            addr,
            authority: addr.to_string(),
            path: "/webhooks/forgejo".to_owned(),
        }
    }

    #[test]
    fn a_url_becomes_an_address_a_host_and_a_target() {
        let t = Target::parse("http://[::1]:9001/webhooks/forgejo?x=1").expect("a URL");
        assert_eq!(t.addr, SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 9001)));
        assert_eq!(t.authority, "[::1]:9001");
        assert_eq!(t.path, "/webhooks/forgejo?x=1");
        let t = Target::parse("http://127.0.0.1/hook").expect("a URL");
        assert_eq!(t.addr, SocketAddr::from(([127, 0, 0, 1], 80)));
        for bad in ["https://127.0.0.1/hook", "not a url", "http:///nohost"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_prepared_request_is_the_delivery_signed() {
        let t = target(SocketAddr::from(([127, 0, 0, 1], 8080)));
        let bytes = t.request("s3cret", 4_321);
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(head)) = request.parse(&bytes) else {
            panic!("not a whole HTTP request");
        };
        assert_eq!(request.method, Some("POST"));
        assert_eq!(request.path, Some("/webhooks/forgejo"));
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let body = &bytes[head..];
        assert_eq!(body, render(4_321, 4_322).as_bytes());
        assert_eq!(header("content-length"), Some(body.len().to_string()));
        assert_eq!(header("x-forgejo-signature"), Some(sign("s3cret", body)));
        assert_eq!(header("x-forgejo-delivery").as_deref(), Some("bench-4321"));
        assert_eq!(header("x-forgejo-event-type").as_deref(), Some("issues"));
        assert_eq!(header("host").as_deref(), Some("127.0.0.1:8080"));
    }

    #[test]
    fn a_flood_request_is_an_anonymous_get_of_the_url() {
        let t = Target::parse("http://127.0.0.1:8080/status/outcomes?days=90").expect("a URL");
        let bytes = t.get();
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(head)) = request.parse(&bytes) else {
            panic!("not a whole HTTP request");
        };
        assert_eq!(request.method, Some("GET"));
        assert_eq!(request.path, Some("/status/outcomes?days=90"));
        assert_eq!(head, bytes.len(), "no body");
        assert!(
            request
                .headers
                .iter()
                .all(|h| !h.name.eq_ignore_ascii_case("authorization")),
            "no credentials"
        );
    }

    /// Reads one request (headers and `Content-Length` bytes) from `stream`.
    async fn read_request(stream: &mut TcpStream) -> Vec<u8> {
        let mut buf = Vec::new();
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut request = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(head)) = request.parse(&buf) {
                let length: usize = request
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                    .unwrap_or(0);
                if buf.len() >= head + length {
                    return buf;
                }
            }
            read_more(stream, &mut buf).await.expect("request bytes");
        }
    }

    /// Reads one request into `seen` and answers it in `pieces`, each sent on its own.
    async fn serve_one(stream: &mut TcpStream, seen: &mut Vec<Vec<u8>>, pieces: &[&[u8]]) {
        seen.push(read_request(stream).await);
        for piece in pieces {
            stream.write_all(piece).await.expect("written");
            stream.flush().await.expect("flushed");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn answers_are_read_whole_and_a_connection_closed_is_opened_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let t = target(addr);
        let requests: Vec<Vec<u8>> = (0..5).map(|n| t.request("k", n)).collect();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            // First connection: an answer split mid-header and mid-body, then a refusal that
            // closes the connection.
            let (mut s, _) = listener.accept().await.expect("a connection");
            let split: [&[u8]; 3] = [
                b"HTTP/1.1 202 Accepted\r\nconte",
                b"nt-length: 8\r\n\r\nACCE",
                b"PTED",
            ];
            serve_one(&mut s, &mut seen, &split).await;
            let close = b"HTTP/1.1 409 Conflict\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            serve_one(&mut s, &mut seen, &[close]).await;
            drop(s);
            let ok = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
            // Second: one answer that keeps it alive, then closed as if idle.
            let (mut s, _) = listener.accept().await.expect("a connection");
            serve_one(&mut s, &mut seen, &[ok]).await;
            drop(s);
            // Third: the request sent again and answered, then the next answer cut short.
            let (mut s, _) = listener.accept().await.expect("a connection");
            serve_one(&mut s, &mut seen, &[ok]).await;
            let cut = b"HTTP/1.1 202 Accepted\r\ncontent-length: 99\r\n\r\nshort";
            serve_one(&mut s, &mut seen, &[cut]).await;
            drop(s);
            // The listener stays open: a request wrongly sent again would wait on it for
            // an answer that never comes.
            (seen, listener)
        });
        // Each step fails by its deadline rather than hanging.
        let deadline = Duration::from_secs(10);
        let mut conn = Conn::new(addr);
        assert_eq!(conn.send(&requests[0]).await, Some(202));
        assert_eq!(conn.send(&requests[1]).await, Some(409));
        assert!(conn.stream.is_none(), "`Connection: close` is honoured");
        assert_eq!(conn.send(&requests[2]).await, Some(202));
        assert!(conn.stream.is_some(), "kept alive");
        let again = tokio::time::timeout(deadline, conn.send(&requests[3]))
            .await
            .expect("a connection closed while idle is opened again");
        assert_eq!(again, Some(202));
        let last = tokio::time::timeout(deadline, conn.send(&requests[4]))
            .await
            .expect("a cut answer is not sent again");
        assert_eq!(last, None, "a cut answer is a failure");
        assert!(!accepted(None) && !accepted(Some(409)) && accepted(Some(202)));
        let (seen, _listener) = tokio::time::timeout(deadline, server)
            .await
            .expect("the server saw every request")
            .expect("the server ends");
        assert_eq!(seen, requests, "each request arrives whole, once");
    }
}
