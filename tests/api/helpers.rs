//! `TestApp`: the real application on port 0 with a fresh database, and Forgejo-shaped
//! payloads built the way Forgejo builds them (pretty-printed, 2-space indent).

use std::path::PathBuf;
use std::time::Duration;

use director::engine::settled::Settled;
use director::forge::signature::sign;
use director::settings::{Secret, Settings};
use director::startup::{Application, Overrides};
use director::store::Store;
use serde_json::{Value, json};
use tempfile::TempDir;

pub const SECRET: &str = "test-webhook-secret";
pub const BOT: &str = "director-bot";

pub struct TestApp {
    pub address: String,
    pub store: Store,
    pub client: reqwest::Client,
    /// Where the app's consumer and executor say whether they have anything in hand.
    pub settled: Settled,
    /// The checks poll (`scan.checks_schedule`), run by tests at will.
    checks: Option<std::sync::Arc<director::engine::checks_poll::ChecksPoll>>,
    _dir: TempDir,
}

impl TestApp {
    pub fn checks_poll(&self) -> Option<std::sync::Arc<director::engine::checks_poll::ChecksPoll>> {
        self.checks.clone()
    }
}

pub fn test_settings(dir: &TempDir) -> Settings {
    let mut settings = Settings::default();
    settings.server.listen = "127.0.0.1:0".parse().expect("an address");
    settings.store.url = format!("sqlite://{}", dir.path().join("director.db").display());
    settings.webhook.secrets = vec![Secret::new(SECRET)];
    settings.forge.bot_login = Some(BOT.into());
    settings.scan.enabled = false;
    // Only watched repositories are acted on.
    settings.scan.repos = vec!["acme/widgets".parse().expect("repo")];
    // Runs reach the fakes on loopback directly; the egress tests confine them.
    settings.runner.egress = director::settings::Egress::Open;
    // Runs push to the repository itself, as before forks; `forks::` runs in forks.
    settings.runner.branch_home = director::settings::BranchHome::Repository;
    settings
}

/// A reqwest client; the TLS provider must be chosen before the first one is built.
pub use director_testkit::http_client;

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(configure: impl FnOnce(&mut Settings)) -> Self {
        Self::spawn_full(configure).await.0
    }

    /// The app and its scanner (present when a forge and repositories are configured).
    pub async fn spawn_full(
        configure: impl FnOnce(&mut Settings),
    ) -> (
        Self,
        Option<std::sync::Arc<director::engine::scanner::Scanner>>,
    ) {
        Self::spawn_overridden(configure, Overrides::default()).await
    }

    /// The same, with a fake runtime or clock in place of the real one.
    pub async fn spawn_overridden(
        configure: impl FnOnce(&mut Settings),
        overrides: Overrides,
    ) -> (
        Self,
        Option<std::sync::Arc<director::engine::scanner::Scanner>>,
    ) {
        let client = http_client();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut settings = test_settings(&dir);
        configure(&mut settings);
        let app = Application::build_with(settings, overrides)
            .await
            .expect("app builds");
        let address = format!("http://127.0.0.1:{}", app.port());
        let store = app.store().clone();
        let scanner = app.scanner();
        let settled = app.settled();
        let checks = app.checks_poll();
        tokio::spawn(app.run_until_stopped());
        let this = Self {
            address,
            store,
            client,
            settled,
            checks,
            _dir: dir,
        };
        (this, scanner)
    }

    pub fn db_url(&self) -> String {
        format!(
            "sqlite://{}",
            self._dir.path().join("director.db").display()
        )
    }

    /// Posts a body signed with the test secret, as Forgejo does (both header families).
    pub async fn deliver(&self, event_type: &str, delivery: &str, body: &str) -> reqwest::Response {
        let sig = sign(SECRET, body.as_bytes());
        self.post_webhook(
            &[
                ("X-Forgejo-Event-Type", event_type),
                ("X-Forgejo-Event", event_type),
                ("X-Gitea-Event-Type", event_type),
                ("X-Forgejo-Delivery", delivery),
                ("X-Gitea-Delivery", delivery),
                ("X-Forgejo-Signature", &sig),
                ("X-Gitea-Signature", &sig),
            ],
            body,
        )
        .await
    }

    pub async fn post_webhook(&self, headers: &[(&str, &str)], body: &str) -> reqwest::Response {
        let mut req = self
            .client
            .post(format!("{}/webhooks/forgejo", self.address))
            .header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(body.to_owned())
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn stored_deliveries(&self) -> i64 {
        self.store.delivery_counts().await.expect("count").0
    }

    /// Waits until the director has done all it can do now: its consumer and executor both
    /// said they have nothing in hand, and the store agrees (every stored event consumed, no
    /// action ready or running).
    pub async fn wait_processed(&self) {
        self.wait_for("the engine to settle", || async {
            self.settled.watch().borrow().is_settled()
                && self.store.delivery_counts().await.expect("count").1 == 0
                && self
                    .store
                    .ready_actions(director::clock::now_ms())
                    .await
                    .expect("count")
                    == 0
        })
        .await;
    }

    /// Waits until `check` holds, looking again each time the consumer or the executor
    /// finishes a step (what the engine does is all that can change what `check` reads),
    /// never on a timer. Fails the test after 10 seconds.
    pub async fn wait_for<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        wait_on_engine(&self.settled, what, Duration::from_secs(10), check).await;
    }

    /// Waits until the issue is in `state`, then until every delivery and action in hand is
    /// done; returns its record.
    pub async fn wait_state(
        &self,
        issue: &director::domain::IssueRef,
        state: director::domain::Lifecycle,
    ) -> director::store::IssueRecord {
        self.wait_for(&format!("{issue} is {state}"), || async {
            self.store
                .issue(issue)
                .await
                .expect("query")
                .is_some_and(|r| r.lifecycle == state)
        })
        .await;
        self.wait_processed().await;
        self.store
            .issue(issue)
            .await
            .expect("query")
            .expect("recorded")
    }

    /// Waits until `/metrics` holds `line`. Polled: much of what is counted is not the
    /// engine's steps (the gateways, the proxy, start-up learning the bot's login).
    pub async fn wait_for_metric(&self, line: &str) {
        wait_until(&format!("metric {line}"), || async {
            self.get("/metrics")
                .await
                .text()
                .await
                .expect("body")
                .contains(line)
        })
        .await;
    }

    /// The value of the unlabelled series `name` in `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.expect("body");
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until the unlabelled series `name` has a value that `holds`.
    pub async fn wait_for_metric_where(&self, name: &str, holds: impl Fn(f64) -> bool) {
        wait_until(&format!("metric {name}"), || async {
            holds(self.metric(name).await)
        })
        .await;
    }
}

/// Waits until `check` holds, looking again each time `settled` says the engine finished a
/// step; fails the test after `within`.
pub async fn wait_on_engine<F, Fut>(settled: &Settled, what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut steps = settled.watch();
    loop {
        // Marked seen before looking: a step taken while `check` runs wakes the wait below.
        steps.borrow_and_update();
        if check().await {
            return;
        }
        match tokio::time::timeout_at(deadline, steps.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the engine stopped while waiting for: {what}"),
            Err(_) => panic!(
                "timed out waiting for: {what} (the engine last said {:?})",
                *steps.borrow()
            ),
        }
    }
}

/// Polls `check` every 20 ms until it holds, failing the test after 10 seconds. For what
/// the engine of this process does not drive: another process, an HTTP server coming up, a
/// fake's own state. What the engine drives is waited on with [`TestApp::wait_for`].
pub async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(what, Duration::from_secs(10), check, String::new).await;
}

/// The one polling wait: `check` every 20 ms until it holds; after `within` the test fails
/// with `what` and whatever `context` says then (a child process's log, say).
pub async fn poll_until<F, Fut>(
    what: &str,
    within: Duration,
    mut check: F,
    context: impl Fn() -> String,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for: {what}\n{}", context());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port free on every address of this machine (the runs' network included) just now,
/// chosen at random below the kernel's ephemeral range: a port the kernel hands out (`:0`)
/// may meanwhile become the local end of any outgoing connection of a test running beside
/// this one, and the server that was to listen on it then cannot (a gateway that cannot
/// listen starts no run, and the test waits in vain).
pub fn free_port() -> u16 {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000, ephemeral_low.max(10_001));
    for _ in 0..1_000 {
        let port = rand::random_range(low..high);
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high}")
}

pub fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/forgejo")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

fn user(id: u64, login: &str) -> Value {
    json!({
        "id": id,
        "login": login,
        "login_name": "",
        "source_id": 0,
        "full_name": "",
        "email": format!("{login}@noreply.example.org"),
        "avatar_url": format!("https://forgejo.example.org/avatars/{id}"),
        "html_url": format!("https://forgejo.example.org/{login}"),
        "language": "",
        "is_admin": false,
        "restricted": false,
        "active": false,
        "prohibit_login": false,
        "visibility": "public",
        "username": login
    })
}

fn repository(full_name: &str) -> Value {
    let (owner, name) = full_name.split_once('/').expect("owner/name");
    json!({
        "id": 42,
        "owner": user(7, owner),
        "name": name,
        "full_name": full_name,
        "description": "",
        "empty": false,
        "private": false,
        "fork": false,
        "html_url": format!("https://forgejo.example.org/{full_name}"),
        "clone_url": format!("https://forgejo.example.org/{full_name}.git"),
        "default_branch": "main",
        // Computed for the issue author, never the sender: the director must not read it.
        "permissions": { "admin": true, "push": true, "pull": true },
        "has_issues": true
    })
}

/// An issue as it appears inside a payload.
pub struct Issue<'a> {
    pub repo: &'a str,
    pub number: u64,
    pub title: &'a str,
    pub body: &'a str,
    pub state: &'a str,
    pub labels: &'a [&'a str],
    pub updated_at: &'a str,
}

impl Default for Issue<'_> {
    fn default() -> Self {
        Self {
            repo: "acme/widgets",
            number: 7,
            title: "Add a --verbose flag",
            body: "The CLI should print what it does.",
            state: "open",
            labels: &[],
            updated_at: "2026-11-30T10:00:00Z",
        }
    }
}

fn issue_json(issue: &Issue<'_>) -> Value {
    let labels: Vec<Value> = issue
        .labels
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "id": 100 + i as u64,
                "name": name,
                "exclusive": false,
                "is_archived": false,
                "color": "e11d21",
                "description": "",
                "url": format!("https://forgejo.example.org/api/v1/repos/{}/labels/{}", issue.repo, 100 + i as u64)
            })
        })
        .collect();
    json!({
        "id": 1000 + issue.number,
        "url": format!("https://forgejo.example.org/api/v1/repos/{}/issues/{}", issue.repo, issue.number),
        "html_url": format!("https://forgejo.example.org/{}/issues/{}", issue.repo, issue.number),
        "number": issue.number,
        "user": user(11, "reporter"),
        "original_author": "",
        "original_author_id": 0,
        "title": issue.title,
        "body": issue.body,
        "ref": "",
        "assets": [],
        "labels": labels,
        "milestone": null,
        "assignee": null,
        "assignees": null,
        "state": issue.state,
        "is_locked": false,
        "comments": 0,
        "created_at": "2026-11-30T09:00:00Z",
        "updated_at": issue.updated_at,
        "closed_at": null,
        "due_date": null,
        "pull_request": null,
        "repository": { "id": 42, "name": issue.repo.split('/').nth(1), "owner": issue.repo.split('/').next(), "full_name": issue.repo },
        "pin_order": 0
    })
}

/// An `issues` or `issue_label` payload.
pub fn issue_payload(action: &str, sender: &str, issue: &Issue<'_>) -> String {
    let body = json!({
        "action": action,
        "number": issue.number,
        "issue": issue_json(issue),
        "repository": repository(issue.repo),
        "sender": user(21, sender),
        "commit_id": ""
    });
    serde_json::to_string_pretty(&body).expect("serialises")
}

/// An `issue_comment` payload.
pub fn comment_payload(
    action: &str,
    sender: &str,
    issue: &Issue<'_>,
    comment_id: u64,
    text: &str,
) -> String {
    let body = json!({
        "action": action,
        "issue": issue_json(issue),
        "comment": {
            "id": comment_id,
            "html_url": format!("https://forgejo.example.org/{}/issues/{}#issuecomment-{comment_id}", issue.repo, issue.number),
            "pull_request_url": "",
            "issue_url": format!("https://forgejo.example.org/{}/issues/{}", issue.repo, issue.number),
            "user": user(21, sender),
            "original_author": "",
            "original_author_id": 0,
            "body": text,
            "assets": [],
            "created_at": issue.updated_at,
            "updated_at": issue.updated_at
        },
        "repository": repository(issue.repo),
        "sender": user(21, sender),
        "is_pull": false
    });
    serde_json::to_string_pretty(&body).expect("serialises")
}

/// A well-formed run id for a test (see [`director::domain::run::test_id`]).
pub fn rid(name: &str) -> director::domain::RunId {
    director::domain::run::test_id(name)
}
