//! What a confined run on Docker reaches of the host itself. The runs' internal network has
//! no route out, but its gateway is the host's own address: a service listening on every
//! address answers a run there, around the proxy. With `runner.host_firewall` the director
//! drops that traffic but for the proxy and the gateways, and takes the rule away at its
//! stop; a rule it cannot install keeps it from starting. Real Docker, real iptables, a real
//! listener on this host.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use director::forge::Permission;

use crate::egress::{Network, docker};
use crate::forge_helpers::{BOT, BOT_TOKEN, TRIGGER, WRITER};
use crate::runs::{RUNNER, RUNNER_PASSWORD, agent_image, spawn_runs};

/// A service of the host on every address, as a database or a forge would be: the kernel
/// completes a connection to it without an accept.
fn host_service() -> (std::net::TcpListener, u16) {
    let port = crate::helpers::free_port();
    let listener = std::net::TcpListener::bind(("0.0.0.0", port)).expect("binds");
    (listener, port)
}

/// The runs' network's gateway and the host's interface for it, once the director made it.
fn gateway_and_bridge(network: &str) -> (String, String) {
    let (ok, gateway) = docker(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
        network,
    ]);
    assert!(ok && !gateway.is_empty(), "a gateway: {gateway}");
    let (_, id) = docker(&["network", "inspect", "-f", "{{.Id}}", network]);
    (gateway, format!("br-{}", &id[..12]))
}

/// From a container on the runs' network: `port open` or `port closed` for each port of
/// the gateway, in order.
fn probe(network: &str, gateway: &str, ports: &[u16]) -> String {
    let script: String = ports
        .iter()
        .map(|p| {
            // `nc` stays on a connection it made until the far end closes: the outer
            // timeout ends it (not 1); a refused or dropped connection exits 1 (`-w 3`).
            format!("timeout 6 nc -w 3 {gateway} {p} </dev/null >/dev/null 2>&1; if [ $? = 1 ]; then echo '{p} closed'; else echo '{p} open'; fi; ")
        })
        .collect();
    let (ok, out) = docker(&[
        "run",
        "--rm",
        "--network",
        network,
        "--entrypoint",
        "/bin/sh",
        &agent_image(),
        "-c",
        &script,
    ]);
    assert!(ok, "the probe ran: {out}");
    out
}

fn iptables(args: &[&str]) -> String {
    let out = Command::new("iptables")
        .args(args)
        .output()
        .expect("iptables runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_confined_run_reaches_a_host_service_on_its_gateway_and_the_listing_names_it() {
    let network = Network(format!(
        "director-hostfw-test-{:08x}",
        rand::random::<u32>()
    ));
    let (_service, port) = host_service();
    let name = network.0.clone();
    let (proxy_port, git_port) = (crate::helpers::free_port(), crate::helpers::free_port());
    let (_t, _llm) = spawn_runs(|s| {
        s.runner.network = "bridge".into();
        s.runner.egress = director::settings::Egress::Allowlist;
        s.runner.allow_dns_leaking_engine = true;
        s.runner.egress_network = name;
        s.runner.egress_proxy_port = proxy_port;
        s.runner.git_gateway_port = git_port;
    })
    .await;
    let (gateway, _) = gateway_and_bridge(&network.0);
    // The hole, as it stays without runner.host_firewall.
    assert_eq!(
        probe(&network.0, &gateway, &[port]),
        format!("{port} open"),
        "a run reaches the host's service around the proxy"
    );
    let found =
        director::egress::host::read_reachable(gateway.parse().ok(), &[proxy_port, git_port]);
    let said =
        director::egress::host::describe(&found, director::egress::host::ReadIn::Host, false);
    assert!(said.contains(&format!("0.0.0.0:{port}")), "{said}");
    assert!(said.contains("runner.host_firewall = true"), "{said}");
    assert!(
        !said.contains(&format!(":{proxy_port},")) && !said.ends_with(&format!(":{proxy_port}")),
        "the proxy listens there on purpose: {said}"
    );
}

/// `director serve` confining runs to `network`, with the host firewall on; its log in
/// `log`.
fn serve(
    forge_url: &str,
    db: &str,
    network: &str,
    ports: (u16, u16, u16),
    command: &str,
    log: &std::path::Path,
) -> Child {
    let (http, proxy, git) = ports;
    Command::new(env!("CARGO_BIN_EXE_director"))
        .arg("serve")
        .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{http}"))
        .env("DIRECTOR_STORE__URL", db)
        .env("DIRECTOR_WEBHOOK__SECRETS", crate::helpers::SECRET)
        .env("DIRECTOR_FORGE__URL", forge_url)
        .env("DIRECTOR_FORGE__TOKEN", BOT_TOKEN)
        .env("DIRECTOR_FORGE__RUNNER_LOGIN", RUNNER)
        .env("DIRECTOR_FORGE__RUNNER_PASSWORD", RUNNER_PASSWORD)
        .env("DIRECTOR_RUNNER__BRANCH_HOME", "repository")
        .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
        .env("DIRECTOR_SCAN__ENABLED", "false")
        .env("DIRECTOR_PREFLIGHT__ENABLED", "false")
        .env("DIRECTOR_RUNNER__IMAGE", agent_image())
        .env("DIRECTOR_RUNNER__EGRESS", "allowlist")
        .env("DIRECTOR_RUNNER__ALLOW_DNS_LEAKING_ENGINE", "true")
        .env("DIRECTOR_RUNNER__EGRESS_NETWORK", network)
        .env("DIRECTOR_RUNNER__EGRESS_PROXY_PORT", proxy.to_string())
        .env("DIRECTOR_RUNNER__GIT_GATEWAY_PORT", git.to_string())
        .env("DIRECTOR_RUNNER__HOST_FIREWALL", "true")
        .env("DIRECTOR_RUNNER__HOST_FIREWALL_COMMAND", command)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("log file"),
        )
        .spawn()
        .expect("director starts")
}

async fn healthy(port: u16, log: &std::path::Path) {
    let client = crate::helpers::http_client();
    crate::helpers::poll_until(
        "director answers /healthz",
        Duration::from_secs(60),
        || async {
            client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
        || std::fs::read_to_string(log).unwrap_or_default(),
    )
    .await;
}

fn forge() -> (
    director_testkit::forge::FakeForge,
    director_testkit::forge::FakeServer,
) {
    let forge = director_testkit::forge::FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    forge.grant(&repo, BOT, Permission::Admin);
    forge.grant(&repo, WRITER, Permission::Write);
    forge.grant(&repo, RUNNER, Permission::Write);
    forge.set_password(RUNNER, RUNNER_PASSWORD);
    forge.define_label(&repo, TRIGGER);
    let server = forge.serve().expect("serves");
    (forge, server)
}

/// Ends the process if the test fails before it does.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn with_the_host_firewall_a_run_reaches_only_the_proxy_and_gateways_until_the_stop() {
    let (_forge, server) = forge();
    let network = Network(format!(
        "director-hostfw-test-{:08x}",
        rand::random::<u32>()
    ));
    let (_service, port) = host_service();
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}", dir.path().join("director.db").display());
    let log = dir.path().join("director.log");
    let free = crate::helpers::free_port;
    let ports = (free(), free(), free());
    let start = || serve(server.url(), &db, &network.0, ports, "iptables", &log);

    // A start, then a crash: the rule stays behind.
    let mut crashed = Kill(start());
    healthy(ports.0, &log).await;
    let (gateway, bridge) = gateway_and_bridge(&network.0);
    let chain = format!("DIRECTOR-{bridge}");
    let link = format!("-A INPUT -i {bridge} -j {chain}");
    crashed.0.kill().expect("SIGKILL");
    crashed.0.wait().expect("reaped");
    assert_eq!(
        iptables(&["-S", "INPUT"]).matches(&link).count(),
        1,
        "left by the crash"
    );

    // The next start replaces it: one link, one chain.
    let mut director = Kill(start());
    healthy(ports.0, &log).await;
    let input = iptables(&["-S", "INPUT"]);
    assert_eq!(input.matches(&link).count(), 1, "not duplicated: {input}");
    let rules = iptables(&["-S", &chain]);
    assert_eq!(rules.matches("-j DROP").count(), 1, "{rules}");
    assert_eq!(rules.matches("-j RETURN").count(), 2, "{rules}");

    let (_, proxy, git) = ports;
    assert_eq!(
        probe(&network.0, &gateway, &[port, proxy, git]),
        format!("{port} closed\n{proxy} open\n{git} open"),
        "the host's service is dropped; the proxy and the git gateway still answer"
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains(&format!("0.0.0.0:{port}")) && said.contains("runner.host_firewall drops"),
        "the start said the service and that it is dropped: {said}"
    );

    // The stop takes the rule away.
    let pid = director.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let waited = tokio::task::spawn_blocking(move || {
        let status = director.0.wait();
        (status, director)
    });
    let (status, _director) = tokio::time::timeout(Duration::from_secs(30), waited)
        .await
        .expect("it stops")
        .expect("joined");
    assert!(status.expect("reaped").success(), "a clean stop");
    let all = iptables(&["-S"]);
    assert!(
        !all.contains(&chain),
        "the rule is gone after the stop: {all}"
    );
    assert_eq!(
        probe(&network.0, &gateway, &[port]),
        format!("{port} open"),
        "and the host is as it was"
    );
}

#[tokio::test]
async fn a_director_that_cannot_install_the_host_firewall_refuses_to_start_naming_the_key() {
    let (_forge, server) = forge();
    let network = Network(format!(
        "director-hostfw-test-{:08x}",
        rand::random::<u32>()
    ));
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}", dir.path().join("director.db").display());
    let log = dir.path().join("director.log");
    let free = crate::helpers::free_port;
    let ports = (free(), free(), free());
    let child = serve(
        server.url(),
        &db,
        &network.0,
        ports,
        "/nonexistent/iptables",
        &log,
    );
    let waited = tokio::task::spawn_blocking(move || {
        let mut child = Kill(child);
        let status = child.0.wait();
        (status, child)
    });
    let (status, _child) = tokio::time::timeout(Duration::from_secs(60), waited)
        .await
        .expect("it exits instead of serving")
        .expect("joined");
    assert!(!status.expect("reaped").success());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("runner.host_firewall"), "{said}");
    assert!(said.contains("/nonexistent/iptables"), "{said}");
    let (_, bridge) = gateway_and_bridge(&network.0);
    assert!(
        !iptables(&["-S"]).contains(&format!("DIRECTOR-{bridge}")),
        "nothing of a rule is left"
    );
}
