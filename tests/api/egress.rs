//! The egress policy against the real Docker engine: an allow-listed run sits on an internal
//! network and reaches the outside only through the director's proxy. From inside the run,
//! an allowed destination answers through the proxy, a refused one does not, neither
//! answers on a direct connection, and plain git reaches the forge through the proxy; the
//! run ends in a pull request and its report names what was refused.

use std::process::Command;

use director::domain::Lifecycle;

use crate::fake_runs::status_json;
use crate::git::git_agent_image;
use crate::runs::{agent_image, labelled, run_comments, spawn_runs, wait_ended};

pub(crate) fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// A container on the engine's default bridge serving HTTP on 8000 (and nothing on 8001):
/// somewhere a run on the default network could reach directly.
pub(crate) struct Target {
    id: String,
    pub(crate) ip: String,
}

impl Target {
    pub(crate) fn start() -> Self {
        let (ok, id) = docker(&[
            "run",
            "-d",
            "--rm",
            &agent_image(),
            "httpd",
            "-f",
            "-p",
            "8000",
            "-h",
            "/",
        ]);
        assert!(ok, "the target starts: {id}");
        let (_, ip) = docker(&["inspect", "-f", "{{.NetworkSettings.IPAddress}}", &id]);
        assert!(!ip.is_empty(), "the target has an address");
        Self { id, ip }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.id]);
    }
}

/// Confined runs (`runner.egress = "allowlist"`) on `network`, a network of the test's own;
/// the proxy and the gateways on free ports.
pub(crate) fn confine(s: &mut director::settings::Settings, network: &str) {
    s.runner.network = "bridge".into();
    s.runner.egress = director::settings::Egress::Allowlist;
    // Debian's engine here (20.10.24) predates the fix for CVE-2024-29018.
    s.runner.allow_dns_leaking_engine = true;
    s.runner.egress_network = network.to_owned();
    s.runner.egress_proxy_port = crate::helpers::free_port();
    s.runner.git_gateway_port = crate::helpers::free_port();
    s.runner.model_gateway_port = crate::helpers::free_port();
}

/// `[models.anthropic]` at a fake provider (`url`, `key`), and the price of its model,
/// `claude-fake-1` ($3 and $15 a million tokens).
pub(crate) fn behind_fake_anthropic(s: &mut director::settings::Settings, url: &str, key: &str) {
    s.models.anthropic = Some(director::settings::ProviderSettings {
        base_url: url.to_owned(),
        api_key: director::settings::Secret::new(key),
        api_key_file: None,
    });
    s.models.prices.insert(
        "claude-fake-1".into(),
        director::settings::Price {
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
            ..director::settings::Price::default()
        },
    );
}

/// A network of the test's own, removed after it.
pub(crate) struct Network(pub(crate) String);

impl Drop for Network {
    fn drop(&mut self) {
        let _ = docker(&["network", "rm", &self.0]);
    }
}

#[tokio::test]
async fn an_allow_listed_run_reaches_only_what_is_allowed_through_the_proxy_and_ends_in_a_pr() {
    let target = Target::start();
    let network = Network(format!(
        "director-egress-test-{:08x}",
        rand::random::<u32>()
    ));
    let allowed = format!("{}:8000", target.ip);
    let refused = format!("{}:8001", target.ip);
    let image = git_agent_image();
    let (network_name, allow) = (network.0.clone(), allowed.clone());
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        s.runner.network = "bridge".into();
        s.runner.egress = director::settings::Egress::Allowlist;
        // Debian's engine here (20.10.24) predates the fix for CVE-2024-29018.
        s.runner.allow_dns_leaking_engine = true;
        s.runner.egress_allow = vec![allow];
        s.runner.egress_network = network_name;
        s.runner.egress_proxy_port = crate::helpers::free_port();
        s.runner.git_gateway_port = crate::helpers::free_port();
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    let (ok, internal) = docker(&["network", "inspect", "-f", "{{.Internal}}", &network.0]);
    assert!(
        ok && internal == "true",
        "the runs' network is internal: {internal}"
    );

    let issue = labelled(
        &t,
        "Behind the proxy",
        &format!("mode: egress allowed: {allowed} refused: {refused}"),
    )
    .await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    assert_eq!(
        t.forge.pulls_of(&t.repo).len(),
        1,
        "git reached the forge through the proxy"
    );

    // The report names what was refused, and how often; the allowed one is not there.
    assert_eq!(reports.len(), 1);
    let report = &reports[0];
    assert!(report.contains("Network access refused"), "{report}");
    assert!(report.contains(&format!("`{refused}`: once")), "{report}");
    assert!(!report.contains(&format!("`{allowed}`")), "{report}");
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    assert_eq!(runs[0].egress_refused, vec![(refused.clone(), 1)]);
    let status = status_json(&t).await;
    let row = status
        .as_array()
        .and_then(|a| a.iter().find(|r| r["number"] == issue.number))
        .expect("the issue's row");
    assert_eq!(
        row["run"]["egress_refused"],
        serde_json::json!([{ "destination": refused, "count": 1 }]),
        "{row}"
    );
    t.app
        .wait_for_metric(r#"director_egress_refused_total{reason="not_allowed"} 1"#)
        .await;
    // The proxy's credentials never reach the report.
    assert!(
        !report.contains(&format!("run-{}:", runs[0].id)),
        "{report}"
    );
}

#[tokio::test]
async fn from_inside_a_container_only_the_runs_own_branch_can_be_pushed() {
    let network = Network(format!(
        "director-escape-test-{:08x}",
        rand::random::<u32>()
    ));
    let image = git_agent_image();
    let network_name = network.0.clone();
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        crate::egress::confine(s, &network_name);
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");

    let issue = labelled(&t, "Try everything", "mode: escape").await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    let mut branches = t.forge.branches_of(&t.repo);
    branches.sort();
    let mut want = vec!["main".to_owned(), runs[0].branch.clone()];
    want.sort();
    assert_eq!(branches, want, "no other branch, no tag");
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1);
    // The report lists each refusal.
    let report = &reports[0];
    assert!(report.contains("**Pushes refused**"), "{report}");
    for what in [
        "refs/heads/other: a run pushes only",
        "refs/tags/v1: tags are not pushed by runs",
        "deleting is not allowed",
        ".forgejo/workflows/x.yml, which runs may not change",
    ] {
        assert!(report.contains(what), "{what}: {report}");
    }
}

// ---- the proxy itself, in this process, as an attacker inside a run would use it ----

#[tokio::test]
async fn the_directors_own_routes_refuse_connections_on_the_runs_network() {
    let network = Network(format!(
        "director-egress-test-{:08x}",
        rand::random::<u32>()
    ));
    let network_name = network.0.clone();
    // The director listens on every address, as it does in a container.
    let (t, _llm) = spawn_runs(|s| {
        s.server.listen = "0.0.0.0:0".parse().expect("an address");
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.allow_dns_leaking_engine = true;
        s.runner.egress_network = network_name;
        s.runner.egress_proxy_port = crate::helpers::free_port();
        s.runner.git_gateway_port = crate::helpers::free_port();
    })
    .await;
    // The director's address on the runs' network: the bridge's gateway, on the host.
    let (ok, gateway) = docker(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
        &network.0,
    ]);
    assert!(
        ok && !gateway.is_empty(),
        "the network has a gateway: {gateway}"
    );
    let port = t.app.address.rsplit(':').next().expect("a port").to_owned();
    let client = crate::helpers::http_client();
    let from_runs = client
        .get(format!("http://{gateway}:{port}/status.json"))
        .send()
        .await
        .expect("answered");
    assert_eq!(from_runs.status(), 403, "the runs' network is not served");
    let from_host = client
        .get(format!("{}/healthz", t.app.address))
        .send()
        .await
        .expect("answered");
    assert_eq!(from_host.status(), 200);
}

mod proxy {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use base64::Engine as _;
    use director::domain::RunId;
    use director::egress::proxy::{Ledger, Proxy};
    use director::egress::{Entry, Policy};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_util::sync::CancellationToken;

    use crate::helpers::rid;

    #[derive(Default)]
    struct Book {
        ended: Mutex<Vec<RunId>>,
        refusals: Mutex<BTreeMap<(RunId, String), u32>>,
        /// What a run's repository settings add to its allow-list.
        extra: Mutex<std::collections::HashMap<RunId, Vec<Entry>>>,
    }

    #[async_trait::async_trait]
    impl Ledger for Book {
        async fn active(&self, run_id: &RunId) -> Option<Vec<Entry>> {
            let active = !self.ended.lock().expect("lock").iter().any(|r| r == run_id);
            active.then(|| {
                self.extra
                    .lock()
                    .expect("lock")
                    .get(run_id)
                    .cloned()
                    .unwrap_or_default()
            })
        }
        async fn add_refusals(
            &self,
            refusals: &BTreeMap<(RunId, String), u32>,
        ) -> anyhow::Result<()> {
            let mut mine = self.refusals.lock().expect("lock");
            for (k, n) in refusals {
                *mine.entry(k.clone()).or_default() += n;
            }
            Ok(())
        }
    }

    /// An origin that records the first request it gets and answers `hello`.
    async fn origin() -> (SocketAddr, Arc<Mutex<String>>) {
        origin_on("127.0.0.1:0").await
    }

    async fn origin_on(bind: &str) -> (SocketAddr, Arc<Mutex<String>>) {
        let listener = TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(String::new()));
        let keep = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let keep = keep.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    *keep.lock().expect("lock") = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
                        .await;
                });
            }
        });
        (addr, seen)
    }

    struct Setup {
        proxy: Arc<Proxy>,
        book: Arc<Book>,
        origin: SocketAddr,
        seen: Arc<Mutex<String>>,
        director: SocketAddr,
    }

    async fn setup() -> Setup {
        let (origin, seen) = origin().await;
        // Stands for the director's own HTTP listener.
        let director = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let director_addr = director.local_addr().expect("addr");
        std::mem::forget(director);
        let policy = Policy::new(
            &[
                format!("127.0.0.1:{}", director_addr.port()),
                "169.254.169.254:80".into(),
                "*.example.invalid:443".into(),
            ],
            vec![
                Entry::exact("127.0.0.1", origin.port()),
                Entry::exact("localhost", origin.port()),
            ],
            vec![director_addr],
        )
        .expect("policy");
        let book = Arc::new(Book::default());
        let (proxy, listener) = Proxy::bind(
            "127.0.0.1:0".parse().expect("addr"),
            policy,
            b"test-key".to_vec(),
            book.clone(),
            None,
        )
        .await
        .expect("binds");
        proxy.clone().serve(listener, CancellationToken::new());
        Setup {
            proxy,
            book,
            origin,
            seen,
            director: director_addr,
        }
    }

    fn auth(user: &str, password: &str) -> String {
        format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    /// Sends `head` to the proxy and returns everything it answers.
    async fn ask(proxy: &Proxy, head: &str) -> String {
        let mut s = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        s.write_all(head.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_runs_request_to_an_allowed_origin_is_forwarded_in_origin_form_without_its_credentials()
     {
        let s = setup().await;
        let pw = s.proxy.password(&rid("run1"));
        let head = format!(
            "GET http://127.0.0.1:{}/repo.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: 127.0.0.1\r\n{}Proxy-Connection: keep-alive\r\n\r\n",
            s.origin.port(),
            auth(&format!("run-{}", rid("run1")), &pw)
        );
        let answer = ask(&s.proxy, &head).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
            "{answer}"
        );
        let seen = s.seen.lock().expect("lock").clone();
        assert!(
            seen.starts_with("GET /repo.git/info/refs?service=git-upload-pack HTTP/1.1\r\n"),
            "{seen}"
        );
        assert!(
            !seen.to_ascii_lowercase().contains("proxy-"),
            "credentials stay with the proxy: {seen}"
        );
        assert!(seen.contains("Connection: close"), "{seen}");
        // CONNECT: a tunnel to the allowed origin.
        let mut t = TcpStream::connect(s.proxy.local_addr())
            .await
            .expect("connect");
        t.write_all(
            format!(
                "CONNECT 127.0.0.1:{} HTTP/1.1\r\n{}\r\n",
                s.origin.port(),
                auth(&format!("run-{}", rid("run1")), &pw)
            )
            .as_bytes(),
        )
        .await
        .expect("write");
        let mut buf = vec![0u8; 39];
        t.read_exact(&mut buf).await.expect("established");
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200 Connection established"));
        t.write_all(b"PING / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        let mut rest = Vec::new();
        let _ = t.read_to_end(&mut rest).await;
        assert!(String::from_utf8_lossy(&rest).ends_with("hello"));
        assert!(
            s.seen.lock().expect("lock").starts_with("PING /"),
            "the tunnel carried the bytes"
        );
        assert!(s.book.refusals.lock().expect("lock").is_empty());
    }

    /// This machine's address on its default route: not a loopback one.
    fn outside_ip() -> std::net::IpAddr {
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        probe.connect("198.51.100.1:9").expect("a default route");
        let ip = probe.local_addr().expect("addr").ip();
        assert!(!ip.is_loopback(), "{ip}");
        ip
    }

    #[tokio::test]
    async fn a_repositorys_entries_open_their_host_for_its_runs_alone_and_never_loopback() {
        let s = setup().await;
        let (outside, _) = origin_on("0.0.0.0:0").await;
        let ip = outside_ip();
        let (local, _) = origin().await;
        s.book.extra.lock().expect("lock").insert(
            rid("run1"),
            vec![
                Entry::exact(&ip.to_string(), outside.port()),
                format!("127.0.0.1:{}", local.port())
                    .parse()
                    .expect("entry"),
                format!("localhost:{}", local.port())
                    .parse()
                    .expect("entry"),
            ],
        );
        let get = |run: &str, host: String| {
            let head = format!(
                "GET http://{host}/ HTTP/1.1\r\n{}\r\n",
                auth(&format!("run-{}", rid(run)), &s.proxy.password(&rid(run)))
            );
            let proxy = s.proxy.clone();
            async move { ask(&proxy, &head).await }
        };
        let mine = get("run1", format!("{ip}:{}", outside.port())).await;
        assert!(
            mine.starts_with("HTTP/1.1 200") && mine.ends_with("hello"),
            "{mine}"
        );
        let other = get("run2", format!("{ip}:{}", outside.port())).await;
        assert!(
            other.starts_with("HTTP/1.1 403"),
            "another run's repository opens nothing: {other}"
        );
        for host in ["127.0.0.1", "localhost"] {
            let answer = get("run1", format!("{host}:{}", local.port())).await;
            assert!(
                answer.starts_with("HTTP/1.1 403") && answer.contains("loopback"),
                "a repository's entry opens no loopback address: {answer}"
            );
        }
    }

    #[tokio::test]
    async fn a_forwarded_request_carries_the_host_that_was_checked_not_the_one_written() {
        let s = setup().await;
        let a = auth(
            &format!("run-{}", rid("run1")),
            &s.proxy.password(&rid("run1")),
        );
        let head = format!(
            "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: internal-admin.example\r\n{a}\r\n",
            s.origin.port()
        );
        let answer = ask(&s.proxy, &head).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let seen = s.seen.lock().expect("lock").clone();
        assert!(
            seen.contains(&format!("Host: 127.0.0.1:{}\r\n", s.origin.port())),
            "{seen}"
        );
        assert!(!seen.contains("internal-admin"), "{seen}");
    }

    /// A minimal TLS ClientHello record for `server_name`, with `ech` when asked.
    fn client_hello(server_name: Option<&str>, ech: bool) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = server_name {
            let n = name.as_bytes();
            let list_len = 3 + n.len();
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&((list_len + 2) as u16).to_be_bytes());
            ext.extend_from_slice(&(list_len as u16).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&(n.len() as u16).to_be_bytes());
            ext.extend_from_slice(n);
        }
        if ech {
            ext.extend_from_slice(&[0xfe, 0x0d, 0, 1, 0]);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        record.extend_from_slice(&hs);
        record
    }

    /// Opens a tunnel to `target`, sends `first`, and returns whether the origin got it.
    async fn tunnel(s: &Setup, target: &str, first: &[u8]) -> bool {
        s.seen.lock().expect("lock").clear();
        let a = auth(
            &format!("run-{}", rid("run1")),
            &s.proxy.password(&rid("run1")),
        );
        let mut t = TcpStream::connect(s.proxy.local_addr())
            .await
            .expect("connect");
        t.write_all(format!("CONNECT {target} HTTP/1.1\r\n{a}\r\n").as_bytes())
            .await
            .expect("write");
        let mut buf = vec![0u8; 39];
        t.read_exact(&mut buf).await.expect("established");
        let _ = t.write_all(first).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), t.read_to_end(&mut rest))
            .await;
        !s.seen.lock().expect("lock").is_empty()
    }

    #[tokio::test]
    async fn a_tunnel_to_a_name_carries_tls_for_that_name_only() {
        let s = setup().await;
        let named = format!("localhost:{}", s.origin.port());
        let address = format!("127.0.0.1:{}", s.origin.port());
        assert!(tunnel(&s, &named, &client_hello(Some("LocalHost"), false)).await);
        // A front end hosting several names would serve the other one.
        assert!(!tunnel(&s, &named, &client_hello(Some("billing.internal"), false)).await);
        assert!(!tunnel(&s, &named, &client_hello(None, false)).await);
        assert!(!tunnel(&s, &named, &client_hello(Some("localhost"), true)).await);
        assert!(
            !tunnel(
                &s,
                &named,
                b"GET / HTTP/1.1\r\nHost: billing.internal\r\n\r\n"
            )
            .await
        );
        // To an address: anything but a name.
        assert!(tunnel(&s, &address, &client_hello(None, false)).await);
        assert!(!tunnel(&s, &address, &client_hello(Some("billing.internal"), false)).await);
        s.proxy.flush().await;
        let refusals = s.book.refusals.lock().expect("lock").clone();
        assert_eq!(refusals.values().sum::<u32>(), 5, "{refusals:?}");
    }

    #[tokio::test]
    async fn one_run_cannot_hold_every_connection_of_the_proxy() {
        let s = setup().await;
        let a = auth(
            &format!("run-{}", rid("run1")),
            &s.proxy.password(&rid("run1")),
        );
        let mut held = Vec::new();
        for _ in 0..director::egress::proxy::MAX_PER_RUN {
            let mut t = TcpStream::connect(s.proxy.local_addr())
                .await
                .expect("connect");
            t.write_all(
                format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n{a}\r\n", s.origin.port()).as_bytes(),
            )
            .await
            .expect("write");
            let mut buf = vec![0u8; 39];
            t.read_exact(&mut buf).await.expect("established");
            held.push(t);
        }
        let answer = ask(
            &s.proxy,
            &format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n{a}\r\n", s.origin.port()),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        held.pop();
        // The slot comes back once the connection is gone.
        crate::helpers::wait_until("a slot is free again", || async {
            ask(
                &s.proxy,
                &format!(
                    "GET http://127.0.0.1:{}/ HTTP/1.1\r\n{a}\r\n",
                    s.origin.port()
                ),
            )
            .await
            .starts_with("HTTP/1.1 200")
        })
        .await;
    }

    #[tokio::test]
    async fn without_right_credentials_or_after_the_run_ended_the_proxy_answers_407() {
        let s = setup().await;
        let url = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n", s.origin.port());
        for head in [
            format!("{url}\r\n"),
            format!(
                "{url}{}\r\n",
                auth(&format!("run-{}", rid("run1")), "guess")
            ),
            // Another run's password.
            format!(
                "{url}{}\r\n",
                auth(
                    &format!("run-{}", rid("run1")),
                    &s.proxy.password(&rid("run2"))
                )
            ),
            format!("{url}{}\r\n", auth("bob", &s.proxy.password(&rid("bob")))),
            // A user that is no run id is refused before anything is looked up.
            format!("{url}{}\r\n", auth("run-../../etc/passwd", "x")),
            format!("{url}Proxy-Authorization: Basic !!!\r\n\r\n"),
        ] {
            let answer = ask(&s.proxy, &head).await;
            assert!(answer.starts_with("HTTP/1.1 407"), "{head:?}: {answer}");
            assert!(answer.contains("Proxy-Authenticate: Basic"), "{answer}");
        }
        s.book.ended.lock().expect("lock").push(rid("run3"));
        let answer = ask(
            &s.proxy,
            &format!(
                "{url}{}\r\n",
                auth(
                    &format!("run-{}", rid("run3")),
                    &s.proxy.password(&rid("run3"))
                )
            ),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 407") && answer.contains("ended"),
            "{answer}"
        );
        assert!(
            s.seen.lock().expect("lock").is_empty(),
            "nothing reached the origin"
        );
    }

    #[tokio::test]
    async fn refused_destinations_are_counted_per_run_and_never_reached() {
        let s = setup().await;
        let a = auth(
            &format!("run-{}", rid("run1")),
            &s.proxy.password(&rid("run1")),
        );
        for (head, why) in [
            (
                format!("CONNECT example.org:443 HTTP/1.1\r\n{a}\r\n"),
                "allow-list",
            ),
            (
                format!("CONNECT example.org:443 HTTP/1.1\r\n{a}\r\n"),
                "allow-list",
            ),
            (
                format!(
                    "GET http://127.0.0.1:{}/ HTTP/1.1\r\n{a}\r\n",
                    s.origin.port() + 1
                ),
                "allow-list",
            ),
            (
                format!("GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n{a}\r\n"),
                "metadata",
            ),
            (
                format!(
                    "CONNECT 127.0.0.1:{} HTTP/1.1\r\n{a}\r\n",
                    s.director.port()
                ),
                "own listeners",
            ),
            (
                format!("CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\n{a}\r\n"),
                "allow-list",
            ),
            (
                format!("CONNECT nowhere.example.invalid:443 HTTP/1.1\r\n{a}\r\n"),
                "resolved to no address",
            ),
        ] {
            let answer = ask(&s.proxy, &head).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{head:?}: {answer}");
            assert!(answer.contains(why), "{head:?}: {answer}");
        }
        s.proxy.flush().await;
        let refusals = s.book.refusals.lock().expect("lock").clone();
        let got: Vec<(String, u32)> = refusals.into_iter().map(|((_, d), n)| (d, n)).collect();
        assert!(got.contains(&("example.org:443".to_owned(), 2)), "{got:?}");
        assert!(
            got.contains(&("169.254.169.254:80".to_owned(), 1)),
            "{got:?}"
        );
        assert!(
            got.contains(&(format!("127.0.0.1:{}", s.director.port()), 1)),
            "{got:?}"
        );
        assert!(
            s.seen.lock().expect("lock").is_empty(),
            "nothing reached the origin"
        );
        // Garbage is a 400, never a crash, and the proxy goes on serving.
        let smuggled = format!(
            "GET http://127.0.0.1:{}/ HTTP/1.1\r\n{a}X-A: b\nGET http://127.0.0.1:{}/x HTTP/1.1\r\n\r\n",
            s.origin.port(),
            s.origin.port()
        );
        for junk in [
            "\r\n\r\n",
            "GET\r\n\r\n",
            "GET https://x/ HTTP/1.1\r\n\r\n",
            smuggled.as_str(),
        ] {
            let answer = ask(&s.proxy, junk).await;
            assert!(answer.starts_with("HTTP/1.1 4"), "{junk:?}: {answer}");
        }
        assert!(
            s.seen.lock().expect("lock").is_empty(),
            "a smuggled request never reaches the origin"
        );
        let mut big = "GET http://x/ HTTP/1.1\r\n".to_owned();
        big.push_str(&"X-Pad: aaaaaaaaaaaaaaaa\r\n".repeat(2000));
        let answer = ask(&s.proxy, &big).await;
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "an oversized head: {answer}"
        );
    }
}

#[tokio::test]
async fn a_proxy_that_cannot_listen_refuses_every_run_and_never_starts_one_with_open_egress() {
    // Another process holds the proxy's port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let (t, _llm, fake) = crate::fake_runs::spawn(|s| {
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.egress_proxy_port = port;
        s.runner.git_gateway_port = crate::helpers::free_port();
    })
    .await;
    let issue = crate::fake_runs::labelled(&t, "Add --verbose", "Print each step.").await;
    let record = wait_ended(&t, &issue).await;
    assert_ne!(record.lifecycle, Lifecycle::Succeeded);
    let reports = crate::fake_runs::reports(&t, &issue);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        reports[0].contains("egress proxy cannot listen"),
        "the report says why: {}",
        reports[0]
    );
    let runs = crate::fake_runs::run_ids(&t, &issue).await;
    assert_eq!(fake.creations(&runs[0]), 0, "no container, confined or not");
    assert!(t.forge.minted_tokens().is_empty(), "no token was minted");
    drop(taken);
}

#[tokio::test]
async fn an_allow_listed_fake_run_gets_the_proxy_in_its_environment_and_nothing_that_bypasses_it() {
    let port = crate::helpers::free_port();
    let (t, _llm, fake) = crate::fake_runs::spawn(|s| {
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.egress_proxy_port = port;
        s.runner.git_gateway_port = crate::helpers::free_port();
    })
    .await;
    let issue = crate::fake_runs::labelled(&t, "Add --verbose", "mode: hang").await;
    let started = || async {
        crate::fake_runs::run_ids(&t, &issue)
            .await
            .pop()
            .filter(|i| fake.starts(i) == 1)
    };
    crate::helpers::wait_until("the run starts", || async { started().await.is_some() }).await;
    let id = started().await.expect("a started run");
    let spec = fake.spec_of(&id).expect("the run's spec");
    assert!(spec.confined);
    let env = |k: &str| crate::fake_runs::env(&spec, k).to_owned();
    let url = env("HTTP_PROXY");
    assert!(url.starts_with(&format!("http://run-{id}:")), "{url}");
    assert!(url.ends_with(&format!("@127.0.0.1:{port}")), "{url}");
    for k in [
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        assert_eq!(env(k), url, "{k}");
    }
    // Only the git gateway, beside the proxy, is reached directly.
    assert_eq!(env("NO_PROXY"), "127.0.0.1");
    assert_eq!(env("no_proxy"), "127.0.0.1");
    // The proxy knows the run by those credentials, and refuses what is not allowed.
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&url).expect("proxy"))
        .build()
        .expect("client");
    let refused = client
        .get("http://blocked.example.invalid:8080/")
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), 403);
    let forge = client
        .get(format!("{}/api/v1/repos/acme/widgets", t.forge_url()))
        .send()
        .await
        .expect("answered");
    assert!(
        forge.status().is_success(),
        "the forge through the proxy: {}",
        forge.status()
    );
}

#[tokio::test]
async fn from_inside_a_container_the_model_is_reached_with_the_runs_own_key_and_its_budget_holds() {
    let provider = director_testkit::provider::FakeProvider::start();
    let network = Network(format!(
        "director-egress-test-{:08x}",
        rand::random::<u32>()
    ));
    let image = git_agent_image();
    let (network_name, url, key) = (
        network.0.clone(),
        provider.url.clone(),
        provider.key.clone(),
    );
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.allow_dns_leaking_engine = true;
        s.runner.egress_network = network_name;
        s.runner.egress_proxy_port = crate::helpers::free_port();
        s.runner.git_gateway_port = crate::helpers::free_port();
        s.runner.model_gateway_port = crate::helpers::free_port();
        s.runner.stop_grace_secs = 5;
        // Kept after it ends, to read the environment it was given.
        s.runner.keep_failed_secs = 600;
        crate::egress::behind_fake_anthropic(s, &url, &key);
        // Two calls of $0.0045 cross it.
        s.budget.run_usd = 0.008;
    })
    .await;
    let issue = labelled(&t, "Think with a model", "mode: model").await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::OverBudget, "{reports:?}");
    let runs = t.app.store.runs_of(&issue).await.expect("runs");
    let run = &runs[0];
    let log = run.log_tail.clone().unwrap_or_default();
    for said in ["answered", "streamed", "refused: over budget", "stopped"] {
        assert!(log.contains(said), "{said}: {log}");
    }
    // What counts is what the gateway metered, not the result file's "nothing".
    let usage = run
        .result
        .as_ref()
        .and_then(|r| r.usage.clone())
        .expect("usage");
    assert!(usage.metered);
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.requests),
        (Some(2000), Some(200), Some(2))
    );
    assert!(
        reports[0].contains("metered by the director"),
        "{reports:?}"
    );
    // The provider saw its real key on both calls and nothing else from the run.
    assert_eq!(provider.keys(), vec![provider.key.clone(); 2]);
    // Nothing in the run's environment is a key the provider takes.
    let (ok, env) = docker(&[
        "inspect",
        "-f",
        "{{json .Config.Env}}",
        run.container_id.as_deref().expect("a container"),
    ]);
    assert!(ok, "the container is kept: {env}");
    let env: Vec<String> = serde_json::from_str(&env).expect("env");
    assert!(
        env.iter()
            .any(|e| e.starts_with("ANTHROPIC_API_KEY=director-"))
    );
    let client = crate::helpers::http_client();
    for entry in &env {
        let value = entry.split_once('=').map_or("", |(_, v)| v);
        assert!(!value.contains(&provider.key), "{entry}");
        let direct = client
            .post(format!("{}/v1/messages", provider.url))
            .header("x-api-key", value)
            .json(&serde_json::json!({ "model": "claude-fake-1", "max_tokens": 8, "messages": [] }))
            .send()
            .await
            .expect("answered");
        assert_eq!(direct.status(), 401, "the provider takes {entry}");
    }
    let _ = docker(&["rm", "-f", run.container_id.as_deref().unwrap_or_default()]);
}
