//! The egress proxy runs talk to: an HTTP forward proxy (absolute-URI requests) and `CONNECT`
//! tunnels, on the network the runs are confined to.
//!
//! - **Who asks.** Each run's proxy URL carries credentials, `run-<run id>` and a password
//!   that is an HMAC of the run id under a key kept in the database: every replica can check
//!   them, also after a restart, and nothing is registered per run. A run that has ended
//!   (or never existed) is refused.
//! - **What it may reach.** Its [`Policy`]: the name checked against the allow-list, the
//!   resolved addresses against what no entry opens, and the connection made to the very
//!   address checked.
//! - **What was refused** is counted per run and destination (`host:port`), kept in the
//!   database (so the run's report has it whichever replica refused), and counted in
//!   `director_egress_refused_total`.
//! - A request is forwarded with `Connection: close`: one destination per client connection.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{Policy, split_host_port};

/// Where refusals go, and whether a run may still use the proxy (the store, in the director).
#[async_trait::async_trait]
pub trait Ledger: Send + Sync {
    /// Whether the run exists and has not ended.
    async fn active(&self, run_id: &str) -> bool;
    /// Adds refusals: (run id, `host:port`) → how many.
    async fn add_refusals(&self, refusals: &BTreeMap<(String, String), u32>) -> anyhow::Result<()>;
}

const HEAD_MAX: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once, all runs together: a run opening connections without end
/// gets 503s, and the director keeps its file descriptors.
const MAX_CONNECTIONS: usize = 1024;

pub struct Proxy {
    policy: Policy,
    key: Vec<u8>,
    ledger: Arc<dyn Ledger>,
    pending: Mutex<BTreeMap<(String, String), u32>>,
    /// Destinations recorded per run (bounded: a run cannot fill the database with names).
    distinct: Mutex<std::collections::HashMap<String, std::collections::HashSet<String>>>,
    refused_total: Option<prometheus::IntCounterVec>,
    listen: SocketAddr,
}

/// A refused request: what the client is answered and, when a run asked, what is recorded.
struct Refused {
    status: &'static str,
    reason: &'static str,
    why: String,
}

impl Proxy {
    /// Binds the proxy's listener. `Err` says why it cannot: runs are then refused, never
    /// started with open egress.
    pub async fn bind(
        listen: SocketAddr,
        policy: Policy,
        key: Vec<u8>,
        ledger: Arc<dyn Ledger>,
        refused_total: Option<prometheus::IntCounterVec>,
    ) -> Result<(Arc<Self>, TcpListener), String> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| format!("the egress proxy cannot listen on {listen}: {e}"))?;
        let listen = listener.local_addr().map_err(|e| e.to_string())?;
        Ok((
            Arc::new(Self {
                policy,
                key,
                ledger,
                pending: Mutex::default(),
                distinct: Mutex::default(),
                refused_total,
                listen,
            }),
            listener,
        ))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The run's proxy password.
    pub fn password(&self, run_id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(b"director-egress:");
        mac.update(run_id.as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    /// The proxy URL a run gets, as `host` (how the run reaches the proxy) names it.
    pub fn url_for(&self, run_id: &str, host: &str) -> String {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        format!(
            "http://run-{run_id}:{}@{host}:{}",
            self.password(run_id),
            self.listen.port()
        )
    }

    /// Serves until `shutdown`; refusals are written to the ledger every half second.
    pub fn serve(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        let flusher = self.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => { flusher.flush().await; return; }
                    () = tokio::time::sleep(Duration::from_millis(500)) => flusher.flush().await,
                }
            }
        });
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => return,
                    a = listener.accept() => a,
                };
                match accepted {
                    Ok((mut stream, _)) => {
                        let Ok(slot) = slots.clone().try_acquire_owned() else {
                            self.count("busy");
                            let _ = stream
                                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                                .await;
                            continue;
                        };
                        let this = self.clone();
                        tokio::spawn(async move {
                            this.handle(stream).await;
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the egress proxy could not accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }

    /// Writes the refusals counted so far.
    pub async fn flush(&self) {
        let batch = match self.pending.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return,
        };
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.ledger.add_refusals(&batch).await {
            tracing::warn!(error = %format!("{e:#}"), "cannot record egress refusals; keeping them");
            if let Ok(mut p) = self.pending.lock() {
                for (k, n) in batch {
                    *p.entry(k).or_default() += n;
                }
            }
        }
    }

    fn count(&self, reason: &str) {
        if let Some(c) = &self.refused_total {
            c.with_label_values(&[reason]).inc();
        }
    }

    async fn handle(&self, mut client: TcpStream) {
        let _ = client.set_nodelay(true);
        let Ok(Ok(Some((head, rest)))) =
            tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await
        else {
            let _ = client
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                )
                .await;
            return;
        };
        match self.route(&head).await {
            Ok((request, upstream)) => {
                let Ok(Ok(mut server)) =
                    tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await
                else {
                    let _ = client
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                };
                let _ = server.set_nodelay(true);
                let opened = match request {
                    Forward::Tunnel => client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await
                        .is_ok(),
                    Forward::Request(head) => server.write_all(&head).await.is_ok(),
                };
                if !opened || (!rest.is_empty() && server.write_all(&rest).await.is_err()) {
                    return;
                }
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut client,
                    &mut server,
                    64 * 1024,
                    64 * 1024,
                )
                .await;
            }
            Err(refused) => {
                self.count(refused.reason);
                let body = format!("{}\n", refused.why);
                let challenge = if refused.status.starts_with("407") {
                    "Proxy-Authenticate: Basic realm=\"director\"\r\n"
                } else {
                    ""
                };
                let answer = format!(
                    "HTTP/1.1 {}\r\n{challenge}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    refused.status,
                    body.len()
                );
                let _ = client.write_all(answer.as_bytes()).await;
            }
        }
    }

    /// Who asks for what, and whether it may: the request to send on (or a tunnel) and
    /// the address to connect to.
    async fn route(&self, head: &[u8]) -> Result<(Forward, SocketAddr), Refused> {
        let bad = |why: &str| Refused {
            status: "400 Bad Request",
            reason: "malformed",
            why: why.to_owned(),
        };
        let text = std::str::from_utf8(head).map_err(|_| bad("the request head is not UTF-8"))?;
        // A lone CR or LF would split differently at the origin: one request here, two there.
        if text.replace("\r\n", "").contains(['\r', '\n']) {
            return Err(bad("a line break that is not CRLF"));
        }
        let mut lines = text.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let (method, target, version) =
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some(m), Some(t), Some(v), None) if v.starts_with("HTTP/1.") => (m, t, v),
                _ => return Err(bad("not an HTTP/1 request line")),
            };
        let headers: Vec<(&str, &str)> = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim(), v.trim())))
            .collect();
        let run_id = self.authenticate(&headers).await?;
        let (host, port, forward) = if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) =
                split_host_port(target).ok_or_else(|| bad("CONNECT needs host:port"))?;
            (host, port, Forward::Tunnel)
        } else {
            let rest = target.strip_prefix("http://").ok_or_else(|| {
                bad("only http:// URLs are forwarded; https goes through CONNECT")
            })?;
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
            let (host, port) = match split_host_port(authority) {
                Some(hp) => hp,
                None => (super::normal_host(authority), 80),
            };
            let mut out = format!("{method} {path} {version}\r\n");
            for (k, v) in &headers {
                let drop = [
                    "proxy-authorization",
                    "proxy-connection",
                    "connection",
                    "keep-alive",
                ]
                .iter()
                .any(|h| k.eq_ignore_ascii_case(h));
                if !drop {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
            }
            out.push_str("Connection: close\r\n\r\n");
            (host, port, Forward::Request(out.into_bytes()))
        };
        let destination = if host.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{host}]:{port}")
        } else if super::valid_name(&host) || host.parse::<std::net::IpAddr>().is_ok() {
            format!("{host}:{port}")
        } else {
            format!("(not a host name):{port}")
        };
        let refuse = |reason: &'static str, why: String| {
            self.refused(&run_id, &destination);
            Refused {
                status: "403 Forbidden",
                reason,
                why: format!("the director's egress policy refuses {destination}: {why}"),
            }
        };
        let exact = self
            .policy
            .allows_name(&host, port)
            .map_err(|why| refuse("not_allowed", why))?;
        let resolved: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => Vec::new(),
        };
        // The name was checked first: an unlisted one is never even resolved.
        match self.policy.pick(&host, &resolved, exact) {
            Ok(addr) => Ok((forward, addr)),
            Err(why) => Err(refuse("forbidden_address", why)),
        }
    }

    fn refused(&self, run_id: &str, destination: &str) {
        const DISTINCT_PER_RUN: usize = 50;
        let destination = match self.distinct.lock() {
            Ok(mut d) => {
                if d.len() > 10_000 {
                    d.clear();
                }
                let seen = d.entry(run_id.to_owned()).or_default();
                if seen.contains(destination) || seen.len() < DISTINCT_PER_RUN {
                    seen.insert(destination.to_owned());
                    destination.to_owned()
                } else {
                    "(other destinations)".to_owned()
                }
            }
            Err(_) => destination.to_owned(),
        };
        tracing::info!(run_id, %destination, "egress refused");
        if let Ok(mut p) = self.pending.lock() {
            *p.entry((run_id.to_owned(), destination)).or_default() += 1;
        }
    }

    /// The run the request's credentials name, if they are right and the run is active.
    async fn authenticate(&self, headers: &[(&str, &str)]) -> Result<String, Refused> {
        let refused = |why: &str| Refused {
            status: "407 Proxy Authentication Required",
            reason: "unauthenticated",
            why: why.to_owned(),
        };
        let value = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
            .map(|(_, v)| *v)
            .ok_or_else(|| refused("the proxy needs the run's credentials"))?;
        let encoded = value
            .strip_prefix("Basic ")
            .or_else(|| value.strip_prefix("basic "))
            .ok_or_else(|| refused("Basic credentials only"))?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or_else(|| refused("malformed credentials"))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| refused("malformed credentials"))?;
        let run_id = user
            .strip_prefix("run-")
            .ok_or_else(|| refused("not a run's credentials"))?;
        let expected = self.password(run_id);
        use subtle::ConstantTimeEq as _;
        if !bool::from(expected.as_bytes().ct_eq(password.as_bytes())) {
            return Err(refused("wrong credentials"));
        }
        if !self.ledger.active(run_id).await {
            return Err(refused("the run has ended"));
        }
        Ok(run_id.to_owned())
    }
}

enum Forward {
    Tunnel,
    /// The request head to send, rewritten to origin form.
    Request(Vec<u8>),
}

/// Reads up to the end of the request head; returns it and whatever came after it.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > HEAD_MAX {
            return Ok(None);
        }
    }
}
