//! Several real `director serve` processes on one real PostgreSQL database, behaving as one
//! director: duplicate deliveries sent to every replica land once, a replica SIGKILLed in the
//! middle of a pre-flight is taken over by another, each scan period runs on one replica, run
//! admission holds across replicas, and a database outage answers 503 and heals by itself.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use director::domain::{IssueRef, Lifecycle, RunState};
use director::forge::Permission;
use director::store::Store;
use director_testkit::forge::{FakeForge, FakeServer};

use crate::forge_helpers::{BOT, BOT_TOKEN, TRIGGER, WRITER};
use crate::helpers::{SECRET, http_client};
use crate::pg::Pg;
use director_testkit::llm::FakeLlm;

struct Replicas {
    forge: FakeForge,
    server: FakeServer,
    llm: FakeLlm,
    pg: Pg,
    db: String,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    /// (process, port) of each replica started, in order.
    running: Vec<(Child, u16)>,
}

impl Replicas {
    async fn new(pg: Pg) -> Self {
        let forge = FakeForge::new();
        forge.add_account(BOT, BOT_TOKEN);
        let repo = forge.add_repo("acme/widgets");
        forge.grant(&repo, BOT, Permission::Admin);
        forge.grant(&repo, WRITER, Permission::Write);
        forge.define_label(&repo, TRIGGER);
        let server = forge.serve().expect("serves");
        let llm = FakeLlm::start();
        llm.always("Fine.\n\nGO");
        let db = pg.database().await;
        Self {
            forge,
            server,
            llm,
            pg,
            db,
            dir: tempfile::tempdir().expect("dir"),
            env: Vec::new(),
            running: Vec::new(),
        }
    }

    fn set(&mut self, key: &str, value: &str) {
        self.env.push((key.to_owned(), value.to_owned()));
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("replica-{i}.log"))
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}/webhooks/forgejo", self.running[i].1)
    }

    fn urls(&self) -> Vec<String> {
        (0..self.running.len()).map(|i| self.url(i)).collect()
    }

    async fn store(&self) -> Store {
        Store::connect(&director::settings::StoreSettings {
            url: self.db.clone(),
            ..Default::default()
        })
        .await
        .expect("db")
    }

    /// Starts one more replica (stopping at `failpoint` if named) and waits for `/healthz`.
    async fn start(&mut self, failpoint: Option<&str>) -> usize {
        let i = self.running.len();
        let port = crate::helpers::free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_director"));
        cmd.arg("serve")
            .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("DIRECTOR_STORE__URL", &self.db)
            .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
            .env("DIRECTOR_FORGE__URL", self.server.url())
            .env("DIRECTOR_FORGE__TOKEN", BOT_TOKEN)
            .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
            .env("DIRECTOR_SCAN__ENABLED", "false")
            .env(
                "DIRECTOR_PREFLIGHT__BASE_URL",
                format!("{}/v1", self.llm.url),
            )
            .env("DIRECTOR_PREFLIGHT__MODEL", "fake-model")
            .env("HOSTNAME", format!("replica-{i}"))
            .env("RUST_LOG", "info")
            .env_remove("DIRECTOR_FAILPOINT")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.log(i)).expect("log"));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(point) = failpoint {
            cmd.env("DIRECTOR_FAILPOINT", point);
        }
        let child = cmd.spawn().expect("director starts");
        self.running.push((child, port));
        let client = http_client();
        let health = format!("http://127.0.0.1:{port}/healthz");
        self.wait(&format!("replica {i} answers"), || async {
            client
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        i
    }

    fn kill(&mut self, i: usize) {
        let child = &mut self.running[i].0;
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    /// Waits on the replicas (other processes), saying what each logged if it times out.
    async fn wait<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let logs = || -> String {
            (0..self.running.len())
                .map(|i| {
                    format!(
                        "--- replica {i}:\n{}\n",
                        std::fs::read_to_string(self.log(i)).unwrap_or_default()
                    )
                })
                .collect()
        };
        crate::helpers::poll_until(what, Duration::from_secs(90), check, logs).await;
    }

    fn preflight_comments(&self, issue: &IssueRef) -> usize {
        self.forge
            .comments_on(issue)
            .iter()
            .filter(|c| c.body.starts_with("<!-- director:preflight"))
            .count()
    }

    async fn settled(&self, store: &Store, issue: &IssueRef, state: Lifecycle) {
        self.wait(
            &format!("{issue} is {state} with nothing left to do"),
            || async { store.at_rest(issue).await.ok().flatten() == Some((state, 0, 0)) },
        )
        .await;
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (child, _) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn deliveries_sent_to_every_replica_land_once_and_each_issue_gets_one_comment() {
    let mut r = Replicas::new(Pg::start()).await;
    for _ in 0..3 {
        r.start(None).await;
    }
    let store = r.store().await;
    r.forge.set_webhook(&r.url(0), SECRET);
    r.forge.hold_webhooks(true);
    let repo = "acme/widgets".parse().expect("repo");
    let mut issues = Vec::new();
    for n in 0..5 {
        let issue = r
            .forge
            .open_issue(&repo, "reporter", &format!("Task {n}"), "Do it.")
            .await;
        r.forge.label(WRITER, &issue, TRIGGER).await;
        issues.push(issue);
    }
    let urls = r.urls();
    let mut statuses = Vec::new();
    for out in r.forge.take_webhooks() {
        statuses.extend(r.forge.send_webhook_to_all(&urls, &out).await);
    }
    // Each delivery is accepted by one replica and known to the others as a duplicate, or
    // all answered 2xx: nothing is refused.
    assert!(
        statuses.iter().all(|s| (200..300).contains(s)),
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 202).count(),
        10,
        "{statuses:?}"
    );
    for issue in &issues {
        r.wait("the GO comment", || async {
            r.preflight_comments(issue) == 1
        })
        .await;
        r.settled(&store, issue, Lifecycle::Queued).await;
        assert_eq!(r.preflight_comments(issue), 1, "{issue}: one comment");
    }
    assert_eq!(
        r.llm.prompts().len(),
        5,
        "one read per issue, whichever replica did it"
    );
    let (stored, _) = store.delivery_counts().await.expect("counts");
    assert_eq!(
        stored, 10,
        "each delivery stored once, by whichever replica got it first"
    );
    // `director status --json` reads the shared database like a local one.
    let out = Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["status", "--json"])
        .env("DIRECTOR_STORE__URL", &r.db)
        .output()
        .expect("status runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let queued = rows
        .as_array()
        .map(|a| a.iter().filter(|r| r["state"] == "queued").count());
    assert_eq!(queued, Some(5), "{rows}");
}

#[tokio::test]
async fn a_replica_killed_during_a_pre_flight_is_taken_over_by_another_within_30_seconds() {
    let mut r = Replicas::new(Pg::start()).await;
    let store = r.store().await;
    let doomed = r.start(Some("during_model_call")).await;
    r.forge.set_webhook(&r.url(doomed), SECRET);
    let repo = "acme/widgets".parse().expect("repo");
    let issue = r
        .forge
        .open_issue(&repo, "reporter", "Add --verbose", "Print.")
        .await;
    r.forge.label(WRITER, &issue, TRIGGER).await;
    let log = r.log(doomed);
    r.wait("the replica is inside the model call", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("failpoint reached: during_model_call")
    })
    .await;
    r.kill(doomed);
    let killed_at = std::time::Instant::now();
    r.start(None).await;
    r.settled(&store, &issue, Lifecycle::Queued).await;
    assert!(
        killed_at.elapsed() < Duration::from_secs(30),
        "taken over in {:?}",
        killed_at.elapsed()
    );
    assert_eq!(r.preflight_comments(&issue), 1);
}

#[tokio::test]
async fn each_scan_period_runs_on_one_replica() {
    let mut r = Replicas::new(Pg::start()).await;
    r.set("DIRECTOR_SCAN__ENABLED", "true");
    // Incremental passes every 2 s; the full pass at start-up only.
    r.set("DIRECTOR_SCAN__SCHEDULE", "*/2 * * * * *");
    r.set("DIRECTOR_SCAN__FULL_SCHEDULE", "0 0 0 1 1 *");
    for _ in 0..3 {
        r.start(None).await;
    }
    let store = r.store().await;
    let count = |suffix: &str| {
        r.forge
            .calls()
            .iter()
            .filter(|c| c.method == "GET" && c.path.ends_with(suffix))
            .count()
    };
    // Until three periods have passed and each made its request: never more requests than
    // periods claimed (the claim comes first), whichever replica ran each.
    r.wait("three scan periods, one request each", || async {
        let periods = store
            .claim_names_like("scan:incremental:")
            .await
            .map_or(0, |n| n.len());
        let searches = count("/repos/issues/search");
        assert!(
            searches <= periods,
            "{searches} incremental requests for {periods} periods"
        );
        periods >= 3 && searches == periods
    })
    .await;
    // Each period is named by its scheduled time (a whole even second here), so replicas
    // whose schedules fired moments apart took the same name: one of them ran it.
    let names = store
        .claim_names_like("scan:incremental:")
        .await
        .expect("names");
    for name in &names {
        let at: i64 = name
            .trim_start_matches("scan:incremental:")
            .parse()
            .expect("a time");
        assert_eq!(at % 2_000, 0, "{names:?}");
    }
    // Replicas starting together share the start-up pass (two only if their starts straddle
    // the edge of its 10-minute window).
    let lists = count("/repos/acme/widgets/issues");
    assert!(
        (1..=2).contains(&lists),
        "{lists} start-up full passes for three replicas"
    );
}

#[tokio::test]
async fn run_admission_holds_across_replicas() {
    let mut r = Replicas::new(Pg::start()).await;
    let repo: director::domain::RepoName = "acme/widgets".parse().expect("repo");
    crate::runs::admit_runner(&r.forge, &repo);
    r.env.extend(crate::runs::runner_env());
    r.set("DIRECTOR_RUNNER__MAX_CONCURRENT", "1");
    r.set("DIRECTOR_RUNNER__MAX_PER_REPO", "1");
    for _ in 0..3 {
        r.start(None).await;
    }
    let store = r.store().await;
    let urls = r.urls();
    let mut issues = Vec::new();
    for (n, url) in urls.iter().enumerate() {
        // Each issue's webhooks go to another replica.
        r.forge.set_webhook(url, SECRET);
        let issue = r
            .forge
            .open_issue(&repo, "reporter", &format!("Run {n}"), "mode: slow")
            .await;
        r.forge.label(WRITER, &issue, TRIGGER).await;
        issues.push(issue);
    }
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    r.wait("every run ends in a pull request", || {
        let store = store.clone();
        let issues = issues.clone();
        let most = most.clone();
        async move {
            let active = store.active_runs().await.map(|a| a.len()).unwrap_or(0);
            most.fetch_max(active, std::sync::atomic::Ordering::SeqCst);
            let mut done = 0;
            for issue in &issues {
                if store
                    .issue(issue)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|i| i.lifecycle == Lifecycle::Succeeded)
                {
                    done += 1;
                }
            }
            done == issues.len()
        }
    })
    .await;
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        most, 1,
        "never more than runner.max_concurrent runs at once"
    );
    for issue in &issues {
        let runs = store.runs_of(issue).await.expect("runs");
        assert_eq!(runs.len(), 1, "{issue}");
        assert_eq!(runs[0].state, RunState::Succeeded);
        assert_eq!(
            crate::runs::creations(&runs[0].id, 0),
            1,
            "one container for the run"
        );
    }
    assert_eq!(r.forge.pulls_of(&repo).len(), 3);
}

#[tokio::test]
async fn a_database_outage_answers_503_and_heals_by_itself() {
    // A cluster of this test's own, to stop and start again.
    let mut r = Replicas::new(Pg::start_private()).await;
    r.start(None).await;
    r.forge.set_webhook(&r.url(0), SECRET);
    let port = r.running[0].1;
    let client = http_client();
    let ready = |client: reqwest::Client| async move {
        client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    assert_eq!(ready(client.clone()).await, 200);
    r.pg.stop();
    r.wait("readyz fails", || async {
        ready(client.clone()).await == 503
    })
    .await;
    let repo = "acme/widgets".parse().expect("repo");
    let issue = r
        .forge
        .open_issue(&repo, "reporter", "During", "the outage")
        .await;
    r.forge.hold_webhooks(true);
    r.forge.label(WRITER, &issue, TRIGGER).await;
    let held = r.forge.take_webhooks();
    for out in &held {
        let status = r.forge.send_webhook(out).await;
        assert_eq!(status, 503, "nothing is acknowledged that was not stored");
    }
    let metrics = |client: reqwest::Client| async move {
        client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    };
    r.wait("the metric shows the outage", || async {
        metrics(client.clone())
            .await
            .is_some_and(|m| m.contains("director_store_up 0"))
    })
    .await;
    r.pg.restart();
    r.wait("readyz recovers", || async {
        ready(client.clone()).await == 200
    })
    .await;
    // Forgejo would show the failed deliveries for redelivery: sent again, they are stored.
    for out in &held {
        assert_eq!(r.forge.send_webhook(out).await, 202);
    }
    let store = r.store().await;
    r.settled(&store, &issue, Lifecycle::Queued).await;
    r.wait("the end of the outage is logged", || async {
        std::fs::read_to_string(r.log(0))
            .unwrap_or_default()
            .contains("the database answers again")
    })
    .await;
    let log = std::fs::read_to_string(r.log(0)).unwrap_or_default();
    assert_eq!(
        log.matches("the database is unreachable").count(),
        1,
        "the outage is logged once: {log}"
    );
    assert!(log.contains("the database answers again"));
    let m = metrics(client.clone()).await.unwrap_or_default();
    assert!(m.contains("director_store_outages_total 1"), "{m}");
}

#[tokio::test]
async fn a_replica_that_did_not_start_a_run_serves_its_git_and_counts_its_budget() {
    let mut r = Replicas::new(Pg::start()).await;
    let provider = director_testkit::provider::FakeProvider::start();
    let repo: director::domain::RepoName = "acme/widgets".parse().expect("repo");
    crate::runs::admit_runner(&r.forge, &repo);
    let git_root = tempfile::tempdir().expect("dir");
    r.forge
        .serve_git(&repo, git_root.path())
        .expect("git serves");
    r.env.extend(crate::runs::runner_env());
    let network = format!("director-replicas-test-{:08x}", rand::random::<u32>());
    r.set("DIRECTOR_RUNNER__EGRESS", "allowlist");
    r.set("DIRECTOR_RUNNER__NETWORK", "bridge");
    r.set("DIRECTOR_RUNNER__EGRESS_NETWORK", &network);
    r.set("DIRECTOR_RUNNER__ALLOW_DNS_LEAKING_ENGINE", "true");
    r.set("DIRECTOR_MODELS__ANTHROPIC__BASE_URL", &provider.url);
    r.set("DIRECTOR_MODELS__ANTHROPIC__API_KEY", &provider.key);
    r.set(
        "DIRECTOR_MODELS__PRICES__CLAUDE-FAKE-1__INPUT_PER_MTOK",
        "3",
    );
    r.set(
        "DIRECTOR_MODELS__PRICES__CLAUDE-FAKE-1__OUTPUT_PER_MTOK",
        "15",
    );
    // Two calls of $0.0045 cross it.
    r.set("DIRECTOR_BUDGET__RUN_USD", "0.008");
    r.set("DIRECTOR_RUNNER__STOP_GRACE_SECS", "1");
    // On one host, each replica's proxy and gateways need ports of their own.
    let mut gateways = Vec::new();
    let mut model_gateways = Vec::new();
    for _ in 0..2 {
        let (proxy, gateway) = (crate::helpers::free_port(), crate::helpers::free_port());
        let models = crate::helpers::free_port();
        r.env.retain(|(k, _)| {
            k != "DIRECTOR_RUNNER__EGRESS_PROXY_PORT"
                && k != "DIRECTOR_RUNNER__GIT_GATEWAY_PORT"
                && k != "DIRECTOR_RUNNER__MODEL_GATEWAY_PORT"
        });
        r.set("DIRECTOR_RUNNER__EGRESS_PROXY_PORT", &proxy.to_string());
        r.set("DIRECTOR_RUNNER__GIT_GATEWAY_PORT", &gateway.to_string());
        r.set("DIRECTOR_RUNNER__MODEL_GATEWAY_PORT", &models.to_string());
        r.start(None).await;
        gateways.push(gateway);
        model_gateways.push(models);
    }
    let _cleanup = NetworkCleanup(network);
    let store = r.store().await;
    r.forge.set_webhook(&r.url(0), SECRET);
    let issue = r
        .forge
        .open_issue(&repo, "reporter", "Stay a while", "mode: sleep")
        .await;
    r.forge.label(WRITER, &issue, TRIGGER).await;
    let running = || async {
        store
            .runs_of(&issue)
            .await
            .ok()
            .and_then(|runs| runs.into_iter().find(|x| x.state == RunState::Running))
    };
    r.wait("the run is running", || async { running().await.is_some() })
        .await;
    let run = running().await.expect("a running run");
    let inspect = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{json .Config.Env}}",
            &format!("director-run-{}", run.id),
        ])
        .output()
        .expect("docker");
    let env: Vec<String> = serde_json::from_slice(&inspect.stdout).expect("the run's environment");
    let get = |k: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_owned()
    };
    // The other replica's gateway, on the same network address.
    let url = get("DIRECTOR_CLONE_URL");
    let (own, other) = if url.contains(&format!(":{}/", gateways[0])) {
        (gateways[0], gateways[1])
    } else {
        (gateways[1], gateways[0])
    };
    let other_url = url.replace(&format!(":{own}/"), &format!(":{other}/"));
    assert_ne!(other_url, url, "{url}");
    let password = get("DIRECTOR_GIT_PASSWORD");
    let (id, branch) = (run.id.clone(), run.branch.clone());
    tokio::task::spawn_blocking(move || {
        let home = tempfile::tempdir().expect("dir");
        let work = tempfile::tempdir().expect("dir");
        let origin = other_url.trim_end_matches("/acme/widgets.git").to_owned();
        let git = |dir: &std::path::Path, args: &[&str]| {
            let mut cmd = Command::new("git");
            cmd.current_dir(dir)
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", home.path())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("DIRECTOR_GIT_PASSWORD", &password);
            for (k, v) in director::domain::run::git_environment(
                &origin,
                &format!("run-{id}"),
                "DIRECTOR_GIT_PASSWORD",
                "agent",
                "agent@example.org",
            ) {
                cmd.env(k, v);
            }
            let out = cmd.args(args).output().expect("git");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let w = work.path().join("w");
        git(work.path(), &["clone", "-q", &other_url, "w"]);
        std::fs::write(w.join("agent.txt"), "from the other replica\n").expect("write");
        git(&w, &["add", "agent.txt"]);
        git(&w, &["commit", "-q", "-m", "agent work"]);
        git(&w, &["push", "-q", "origin", &format!("HEAD:{branch}")]);
    })
    .await
    .expect("git through the other replica's gateway");
    assert!(r.forge.branches_of(&repo).contains(&run.branch));

    // The run's model budget is one, whichever replica's gateway meters its calls.
    let base = get("ANTHROPIC_BASE_URL");
    let (own_models, other_models) = if base.contains(&format!(":{}/", model_gateways[0])) {
        (model_gateways[0], model_gateways[1])
    } else {
        (model_gateways[1], model_gateways[0])
    };
    let other_base = base.replace(&format!(":{own_models}/"), &format!(":{other_models}/"));
    let key = get("ANTHROPIC_API_KEY");
    let call = |base: String| {
        let key = key.clone();
        async move {
            crate::helpers::http_client()
                .post(format!("{base}/v1/messages"))
                .header("x-api-key", key)
                .json(
                    &serde_json::json!({ "model": "claude-fake-1", "max_tokens": 8,
                    "messages": [{ "role": "user", "content": "hi" }] }),
                )
                .send()
                .await
                .expect("answered")
                .status()
        }
    };
    let metered = |n: u64| {
        let (store, id) = (&store, run.id.clone());
        async move {
            crate::helpers::wait_until(&format!("{n} metered calls"), || async {
                store
                    .run_usage(&id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|u| u.requests == n)
            })
            .await;
        }
    };
    assert_eq!(call(base.clone()).await, 200);
    metered(1).await;
    assert_eq!(call(other_base.clone()).await, 200);
    metered(2).await;
    // Spent: refused by either replica.
    assert_eq!(call(base).await, 429);
    assert_eq!(call(other_base).await, 429);
    assert_eq!(provider.requests().len(), 2);
    r.settled(&store, &issue, Lifecycle::OverBudget).await;
}

/// The runs' network a test made, removed after it.
struct NetworkCleanup(String);

impl Drop for NetworkCleanup {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["network", "rm", &self.0])
            .output();
    }
}
