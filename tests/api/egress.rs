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

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().expect("docker runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// A container on the engine's default bridge serving HTTP on 8000 (and nothing on 8001):
/// somewhere a run on the default network could reach directly.
struct Target {
    id: String,
    ip: String,
}

impl Target {
    fn start() -> Self {
        let (ok, id) = docker(&[
            "run", "-d", "--rm", &agent_image(), "httpd", "-f", "-p", "8000", "-h", "/",
        ]);
        assert!(ok, "the target starts: {id}");
        let (_, ip) = docker(&[
            "inspect",
            "-f",
            "{{.NetworkSettings.IPAddress}}",
            &id,
        ]);
        assert!(!ip.is_empty(), "the target has an address");
        Self { id, ip }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.id]);
    }
}

/// A network of the test's own, removed after it.
struct Network(String);

impl Drop for Network {
    fn drop(&mut self) {
        let _ = docker(&["network", "rm", &self.0]);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test]
async fn an_allow_listed_run_reaches_only_what_is_allowed_through_the_proxy_and_ends_in_a_pr() {
    let target = Target::start();
    let network = Network(format!("director-egress-test-{:08x}", rand::random::<u32>()));
    let allowed = format!("{}:8000", target.ip);
    let refused = format!("{}:8001", target.ip);
    let image = git_agent_image();
    let (network_name, allow) = (network.0.clone(), allowed.clone());
    let (t, _llm) = spawn_runs(|s| {
        s.runner.image = image;
        s.runner.command = vec!["/bin/sh".into(), "/agent.sh".into()];
        s.runner.network = "bridge".into();
        s.runner.egress = "allowlist".into();
        s.runner.egress_allow = vec![allow];
        s.runner.egress_network = network_name;
        s.runner.egress_proxy_port = free_port();
    })
    .await;
    let root = tempfile::tempdir().expect("dir");
    t.forge.serve_git(&t.repo, root.path()).expect("git serves");
    let (ok, internal) = docker(&["network", "inspect", "-f", "{{.Internal}}", &network.0]);
    assert!(ok && internal == "true", "the runs' network is internal: {internal}");

    let issue = labelled(
        &t,
        "Behind the proxy",
        &format!("mode: egress allowed: {allowed} refused: {refused}"),
    )
    .await;
    let record = wait_ended(&t, &issue).await;
    let reports = run_comments(&t, &issue);
    assert_eq!(record.lifecycle, Lifecycle::Succeeded, "{reports:?}");
    assert_eq!(t.forge.pulls_of(&t.repo).len(), 1, "git reached the forge through the proxy");

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
    t.wait_for_metric(r#"director_egress_refused_total{reason="not_allowed"} 1"#)
        .await;
    // The proxy's credentials never reach the report.
    assert!(!report.contains(&format!("run-{}:", runs[0].id)), "{report}");
}
