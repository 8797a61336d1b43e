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
//! - A request is forwarded with `Connection: close`: one destination per client connection,
//!   and with the `Host` of the URL that was checked, whatever `Host` the run wrote (a front
//!   end hosting several names would otherwise serve another one).
//! - A tunnel to a name carries TLS whose server name (SNI) is that name, checked in the
//!   first record before a byte reaches the server; Encrypted Client Hello, which hides the
//!   name, is refused. A tunnel to an address may carry anything but another name.
//! - **How much.** At most [`MAX_PER_RUN`] connections per run (and per client address, which
//!   counts before credentials are read), of [`MAX_CONNECTIONS`] in all: one run cannot
//!   starve the others.

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

use crate::domain::RunId;

/// Where refusals go, and whether a run may still use the proxy (the store, in the director).
#[async_trait::async_trait]
pub trait Ledger: Send + Sync {
    /// `None` unless the run exists and has not ended; else what its repository's settings
    /// add to the allow-list (entries that never open a loopback address).
    async fn active(&self, run_id: &RunId) -> Option<Vec<super::Entry>>;
    /// `None` unless the run's setup phase is under way (the run is launching, its setup
    /// has not ended); else the setup's allow-list beyond the operator's: the run's own
    /// entries and the setup's.
    async fn active_setup(&self, run_id: &RunId) -> Option<Vec<super::Entry>> {
        let _ = run_id;
        None
    }
    /// Adds refusals: (run id, `host:port`) → how many.
    async fn add_refusals(&self, refusals: &BTreeMap<(RunId, String), u32>) -> anyhow::Result<()>;
}

const HEAD_MAX: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once, all runs together: a run opening connections without end
/// gets 503s, and the director keeps its file descriptors.
const MAX_CONNECTIONS: usize = 1024;
/// Connections one run, or one client address, may hold at once.
pub const MAX_PER_RUN: usize = 64;
/// The largest TLS record a ClientHello may come in (2^14 plus the header and some slack).
const RECORD_MAX: usize = 16 * 1024 + 512;

pub struct Proxy {
    policy: Policy,
    key: Vec<u8>,
    ledger: Arc<dyn Ledger>,
    pending: Mutex<BTreeMap<(RunId, String), u32>>,
    /// Destinations recorded per run (bounded: a run cannot fill the database with names).
    distinct: Mutex<std::collections::HashMap<RunId, std::collections::HashSet<String>>>,
    refused_total: Option<prometheus::IntCounterVec>,
    listen: SocketAddr,
    /// Connections held per client address and per run.
    held: Arc<Mutex<std::collections::HashMap<String, usize>>>,
}

/// One connection counted against a key (`peer:<ip>`, `run:<id>`), until dropped.
struct Held {
    key: String,
    held: Arc<Mutex<std::collections::HashMap<String, usize>>>,
}

impl Held {
    /// Counts one more under `key`, unless it already holds `max`.
    fn take(
        held: &Arc<Mutex<std::collections::HashMap<String, usize>>>,
        key: String,
        max: usize,
    ) -> Option<Self> {
        let mut map = held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(key.clone()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Self {
            key,
            held: held.clone(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut map = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

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
                held: Arc::default(),
            }),
            listener,
        ))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The run's proxy password.
    pub fn password(&self, run_id: &RunId) -> String {
        self.mac(b"director-egress:", run_id)
    }

    /// The proxy password of the run's setup phase (user `setup-<run id>`): taken only while
    /// the setup is under way, with the setup's allow-list.
    pub fn setup_password(&self, run_id: &RunId) -> String {
        self.mac(b"director-egress-setup:", run_id)
    }

    fn mac(&self, domain: &[u8], run_id: &RunId) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(domain);
        mac.update(run_id.as_str().as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    /// The proxy URL of the run's setup phase.
    pub fn setup_url_for(&self, run_id: &RunId, host: &str) -> String {
        self.url_for(run_id, host).replacen(
            &format!("run-{run_id}:{}@", self.password(run_id)),
            &format!("setup-{run_id}:{}@", self.setup_password(run_id)),
            1,
        )
    }

    /// The proxy URL a run gets, as `host` (how the run reaches the proxy) names it.
    pub fn url_for(&self, run_id: &RunId, host: &str) -> String {
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
                    Ok((mut stream, peer)) => {
                        let peer_slot =
                            Held::take(&self.held, format!("peer:{}", peer.ip()), MAX_PER_RUN);
                        let (Ok(slot), Some(peer_slot)) =
                            (slots.clone().try_acquire_owned(), peer_slot)
                        else {
                            self.count("busy");
                            let _ = stream.write_all(BUSY).await;
                            continue;
                        };
                        let this = self.clone();
                        tokio::spawn(async move {
                            this.handle(stream).await;
                            drop((slot, peer_slot));
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
            Ok((request, upstream, run_id)) => {
                let Some(_run_slot) = Held::take(&self.held, format!("run:{run_id}"), MAX_PER_RUN)
                else {
                    self.count("busy");
                    let _ = client.write_all(BUSY).await;
                    return;
                };
                let Ok(Ok(mut server)) =
                    tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await
                else {
                    let _ = client
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                };
                let _ = server.set_nodelay(true);
                // What goes to the server before the two sides are joined.
                let first: Vec<u8> = match request {
                    Forward::Tunnel { name } => {
                        if client
                            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                            .await
                            .is_err()
                        {
                            return;
                        }
                        match first_record(&mut client, rest, name.as_deref()).await {
                            Ok(first) => first,
                            Err(why) => {
                                self.count("server_name");
                                self.refused(&run_id, &format!("{upstream} ({why})"));
                                tracing::info!(%run_id, %upstream, why, "egress tunnel refused");
                                return;
                            }
                        }
                    }
                    Forward::Request(head) => {
                        if server.write_all(&head).await.is_err() {
                            return;
                        }
                        rest
                    }
                };
                if !first.is_empty() && server.write_all(&first).await.is_err() {
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
    async fn route(&self, head: &[u8]) -> Result<(Forward, SocketAddr, RunId), Refused> {
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
        let (run_id, extra) = self.authenticate(&headers).await?;
        let (host, port, forward) = if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) =
                split_host_port(target).ok_or_else(|| bad("CONNECT needs host:port"))?;
            // A name must be the TLS server name; an address must not be given another.
            let name = host
                .parse::<std::net::IpAddr>()
                .is_err()
                .then(|| host.clone());
            (host, port, Forward::Tunnel { name })
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
            let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
            for (k, v) in &headers {
                // The Host is the checked URL's: never one the run wrote.
                let drop = [
                    "host",
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
        // The operator's entries first; a repository's own (`.director.toml`) never count as
        // naming a host exactly, so they open no loopback address.
        let exact = self
            .policy
            .allows_name(&host, port)
            .or_else(|why| {
                super::covered(&extra, &host, port)
                    .then_some(false)
                    .ok_or(why)
            })
            .map_err(|why| refuse("not_allowed", why))?;
        let resolved: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => Vec::new(),
        };
        // The name was checked first: an unlisted one is never even resolved.
        match self.policy.pick(&host, &resolved, exact) {
            Ok(addr) => Ok((forward, addr, run_id)),
            Err(why) => Err(refuse("forbidden_address", why)),
        }
    }

    fn refused(&self, run_id: &RunId, destination: &str) {
        const DISTINCT_PER_RUN: usize = 50;
        let destination = match self.distinct.lock() {
            Ok(mut d) => {
                if d.len() > 10_000 {
                    d.clear();
                }
                let seen = d.entry(run_id.clone()).or_default();
                if seen.contains(destination) || seen.len() < DISTINCT_PER_RUN {
                    seen.insert(destination.to_owned());
                    destination.to_owned()
                } else {
                    "(other destinations)".to_owned()
                }
            }
            Err(_) => destination.to_owned(),
        };
        tracing::info!(%run_id, %destination, "egress refused");
        if let Ok(mut p) = self.pending.lock() {
            *p.entry((run_id.clone(), destination)).or_default() += 1;
        }
    }

    /// The run the request's credentials name, if they are right and the run is active.
    async fn authenticate(
        &self,
        headers: &[(&str, &str)],
    ) -> Result<(RunId, Vec<super::Entry>), Refused> {
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
        let (run_id, setup) = match (user.strip_prefix("run-"), user.strip_prefix("setup-")) {
            (Some(id), _) => (RunId::parse(id).ok(), false),
            (_, Some(id)) => (RunId::parse(id).ok(), true),
            _ => (None, false),
        };
        let run_id = run_id.ok_or_else(|| refused("not a run's credentials"))?;
        let expected = if setup {
            self.setup_password(&run_id)
        } else {
            self.password(&run_id)
        };
        use subtle::ConstantTimeEq as _;
        if !bool::from(expected.as_bytes().ct_eq(password.as_bytes())) {
            return Err(refused("wrong credentials"));
        }
        let extra = if setup {
            self.ledger.active_setup(&run_id).await
        } else {
            self.ledger.active(&run_id).await
        };
        let Some(extra) = extra else {
            return Err(refused(if setup {
                "the run's setup has ended"
            } else {
                "the run has ended"
            }));
        };
        Ok((run_id, extra))
    }
}

enum Forward {
    /// A tunnel; `name`: the host name its TLS must be for (`None` for an address).
    Tunnel { name: Option<String> },
    /// The request head to send, rewritten to origin form.
    Request(Vec<u8>),
}

/// Reads the tunnel's first TLS record (after what already came, `got`) and checks the server
/// name it asks for: `name` exactly (ignoring case) for a name, none for an address. Returns
/// every byte read, to be sent on. Plain bytes may go to an address, never to a name.
async fn first_record(
    client: &mut TcpStream,
    mut got: Vec<u8>,
    name: Option<&str>,
) -> Result<Vec<u8>, &'static str> {
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match first_kind(&got) {
                Some(Record::Complete(len)) if len > RECORD_MAX => {
                    return Err("a record too large");
                }
                Some(Record::Complete(len)) if got.len() >= len => return Ok(()),
                Some(Record::NotTls) => return Ok(()),
                _ => {}
            }
            if got.len() > RECORD_MAX {
                return Err("a record too large");
            }
            let n = client
                .read(&mut chunk)
                .await
                .map_err(|_| "the connection failed")?;
            if n == 0 {
                return Err("the connection closed before a TLS handshake");
            }
            got.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, read)
        .await
        .map_err(|_| "no TLS handshake in time")??;
    let hello = match first_kind(&got) {
        Some(Record::Complete(len)) => client_hello(&got[5..len]),
        _ => None,
    };
    match (name, hello) {
        (Some(_), None) => Err("a tunnel to a name must carry TLS"),
        (_, Some(h)) if h.encrypted => Err("Encrypted Client Hello hides the server name"),
        (Some(want), Some(h)) => match h.server_name {
            Some(sni) if sni.eq_ignore_ascii_case(want) => Ok(got),
            Some(_) => Err("TLS for another name than the one allowed"),
            None => Err("TLS without a server name"),
        },
        (None, Some(h)) if h.server_name.is_some() => Err("TLS for a name, through an address"),
        (None, _) => Ok(got),
    }
}

enum Record {
    /// A TLS handshake record of this many bytes, header included.
    Complete(usize),
    NotTls,
}

/// What the first bytes of a tunnel are, once five have come.
fn first_kind(bytes: &[u8]) -> Option<Record> {
    let header = bytes.get(..5)?;
    if header[0] != 0x16 || header[1] != 0x03 {
        return Some(Record::NotTls);
    }
    Some(Record::Complete(
        5 + usize::from(u16::from_be_bytes([header[3], header[4]])),
    ))
}

/// What a ClientHello says of the server it is for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Hello {
    server_name: Option<String>,
    /// It carries Encrypted Client Hello (the real name is inside).
    encrypted: bool,
}

/// Reads a ClientHello from a handshake record's body; `None` when it is not one.
fn client_hello(record: &[u8]) -> Option<Hello> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None;
    }
    let length = r.u24()?;
    let mut body = Reader(r.take(length)?);
    body.take(2 + 32)?; // version, random
    let session = usize::from(body.u8()?);
    body.take(session)?;
    let suites = usize::from(body.u16()?);
    body.take(suites)?;
    let compression = usize::from(body.u8()?);
    body.take(compression)?;
    let mut hello = Hello::default();
    if body.0.is_empty() {
        return Some(hello);
    }
    let extensions = usize::from(body.u16()?);
    let mut ext = Reader(body.take(extensions)?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let len = usize::from(ext.u16()?);
        let data = ext.take(len)?;
        match kind {
            0x0000 => {
                let mut list = Reader(data);
                let total = usize::from(list.u16()?);
                let mut names = Reader(list.take(total)?);
                while !names.0.is_empty() {
                    let name_type = names.u8()?;
                    let n = usize::from(names.u16()?);
                    let name = names.take(n)?;
                    if name_type == 0 {
                        hello.server_name = Some(String::from_utf8(name.to_vec()).ok()?);
                    }
                }
            }
            0xfe0d => hello.encrypted = true,
            _ => {}
        }
    }
    Some(hello)
}

/// Big-endian reads that end in `None`, never a panic, past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
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
