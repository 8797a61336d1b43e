//! `cargo run -p director-demo`: the whole flow on this machine, for someone who has just
//! cloned the project and has no Forgejo at hand. An in-process FakeForge holds a repository
//! and a writer; a scripted model answers GO, with a plan, for one issue and NO-GO for another;
//! a made-up past of the demo's repository, said to be one, gives the GO comment a forecast
//! (`history.rs`); runs use the real Docker engine when it answers (with a tiny agent image
//! built here from a static busybox), and are skipped, saying so, when it does not. Each step
//! is printed as it happens, and the status page stays up until Ctrl-C.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use serde_json::{Value, json};

use director::domain::{IssueRef, Lifecycle, RepoName};
use director::forge::Permission;
use director::settings::{Secret, Settings};
use director::startup::{Application, Overrides};
use director_testkit::forge::FakeForge;

mod history;

const AGENT: &str = include_str!("agent.sh");
const BOT: &str = "director-bot";
const WRITER: &str = "alice";
const RUNNER: &str = "director-runner";
const SECRET: &str = "demo-webhook-secret";
const REPO: &str = "demo/widgets";

/// The whole flow on this machine, against a fake Forgejo and a scripted model: watch a label
/// become a pre-flight comment, a run, a pull request; then look at the status page.
#[derive(clap::Parser)]
#[command(name = "director-demo", version)]
struct DemoOptions {
    /// Where the director and its status page listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Exit when the flow is done instead of waiting for Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Skip runs even when a Docker engine answers.
    #[arg(long)]
    no_docker: bool,
}

fn main() -> std::process::ExitCode {
    let opts = <DemoOptions as clap::Parser>::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    match actix_web::rt::System::new().block_on(run(opts)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints one step, with the seconds since the demo started.
struct Steps(Instant);

impl Steps {
    fn say(&self, text: &str) {
        let secs = self.0.elapsed().as_secs_f64();
        let mut lines = text.lines();
        println!("[{secs:6.1}s] {}", lines.next().unwrap_or_default());
        for line in lines {
            println!("          {line}");
        }
    }
}

/// The scripted model's GO: a plan, as the pre-flight's prompt asks for one (a `Plan:` line
/// and a numbered list), then the verdict.
const GO_ANSWER: &str = "Context to front-load: the flag parsing lives in one place.\n\nSmall and clear: one flag, one behaviour, easy to check in review.\n\nPlan:\n1. Add the `--verbose` flag where the flags are parsed.\n2. Print each step as the tool runs it when the flag is given.\n3. Say what the flag does in `VERBOSE.md`.\n\nGO";

/// The scripted model: NO-GO for the rewrite, GO with a plan for anything else, in the shape
/// an OpenAI-compatible endpoint answers.
async fn model(body: web::Json<Value>) -> HttpResponse {
    let prompt = body["messages"][0]["content"].as_str().unwrap_or_default();
    let answer = if prompt.contains("Rewrite the whole project") {
        "Context to front-load: none.\n\nThis asks for a rewrite of the whole project in one go, with no way to review it in one pull request.\n\nNO-GO: far too broad for a single run; split it into small steps, one issue each."
    } else {
        GO_ANSWER
    };
    HttpResponse::Ok().json(json!({
        "id": "demo", "object": "chat.completion", "model": body["model"],
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": answer }, "finish_reason": "stop" }]
    }))
}

fn serve_model() -> anyhow::Result<(String, actix_web::dev::ServerHandle)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let server =
        HttpServer::new(|| App::new().route("/v1/chat/completions", web::post().to(model)))
            .listen(listener)?
            .workers(1)
            .disable_signals()
            .run();
    let handle = server.handle();
    tokio::spawn(server);
    Ok((format!("http://127.0.0.1:{port}/v1"), handle))
}

/// Builds the demo's agent image from this machine's static busybox; `Err` says why runs
/// are skipped.
async fn agent_image(dir: &std::path::Path) -> Result<String, String> {
    let docker = tokio::process::Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .await;
    match docker {
        Ok(out) if out.status.success() => {}
        Ok(_) => return Err("no Docker engine answers (`docker info` failed)".into()),
        Err(_) => return Err("no `docker` command on this machine".into()),
    }
    let busybox = std::fs::read("/bin/busybox")
        .map_err(|_| "the agent image needs a static busybox at /bin/busybox (Debian: apt-get install busybox-static)".to_owned())?;
    let ctx = dir.join("agent-image");
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&ctx)?;
        std::fs::write(ctx.join("busybox"), &busybox)?;
        std::fs::write(ctx.join("agent.sh"), AGENT)?;
        std::fs::write(
            ctx.join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nCOPY agent.sh /agent.sh\nCMD [\"/bin/sh\", \"/agent.sh\"]\n",
        )?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(ctx.join("busybox"), std::fs::Permissions::from_mode(0o755))
    };
    write().map_err(|e| format!("cannot write the image's files: {e}"))?;
    let tag = "director-demo-agent:latest";
    let out = tokio::process::Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(&ctx)
        .output()
        .await
        .map_err(|e| format!("docker build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker build failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(tag.to_owned())
}

fn settings(
    dir: &std::path::Path,
    listen: &str,
    forge_url: &str,
    model_url: &str,
    image: Option<&str>,
) -> anyhow::Result<Settings> {
    let mut s = Settings::default();
    s.server.listen = listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen `{listen}`: {e}"))?;
    s.store.url = format!("sqlite://{}", dir.join("director.db").display());
    s.webhook.secrets = vec![Secret::new(SECRET)];
    s.forge.url = forge_url.to_owned();
    s.forge.token = Secret::new("demo-bot-token");
    s.forge.runner_login = RUNNER.into();
    s.forge.runner_password = Secret::new("demo-runner-password");
    s.scan.repos = vec![REPO.parse()?];
    s.preflight.enabled = true;
    s.preflight.provider = director::settings::Provider::Openai;
    s.preflight.base_url = model_url.to_owned();
    s.preflight.model = "scripted-demo-model".into();
    s.preflight.api_key = Secret::new("demo-model-key");
    match image {
        Some(image) => {
            s.runner.image = image.to_owned();
            s.runner.network = "host".into();
            // The demo's agent talks to the in-process fake forge on loopback directly.
            s.runner.egress = director::settings::Egress::Open;
            s.runner.timeout_secs = 120;
            s.runner.memory_mb = 256;
            s.runner.cpus = 1.0;
        }
        None => s.runner.enabled = false,
    }
    Ok(s)
}

/// What the demo has already printed, to print only what is new.
#[derive(Default)]
struct Seen {
    comments: HashMap<u64, String>,
    labels: HashMap<u64, Vec<String>>,
    branches: BTreeSet<String>,
    pulls: BTreeSet<u64>,
    runs: BTreeMap<String, String>,
}

impl Seen {
    async fn report(
        &mut self,
        steps: &Steps,
        forge: &FakeForge,
        store: &director::store::Store,
        repo: &RepoName,
        issues: &[IssueRef],
    ) {
        // In the order things happen within one look: a container starts, its branch is
        // pushed while it runs, it exits, then the pull request and the report follow.
        let mut early = Vec::new();
        let mut late = Vec::new();
        // A branch pushed by a run the director has not yet seen start is told after its
        // start, in a later look: the agent can push before its start is recorded.
        let mut not_started = std::collections::HashSet::new();
        for issue in issues {
            let Ok(runs) = store.runs_of(issue).await else {
                continue;
            };
            for run in runs {
                let state = run.state.as_str().to_owned();
                if state == "launching" {
                    not_started.insert(run.branch.clone());
                }
                let before = self.runs.insert(run.id.to_string(), state.clone());
                if before.as_ref() == Some(&state) {
                    continue;
                }
                let say = |what: &str| format!("run {} for #{}: {what}", run.id, issue.number);
                // A run first seen past its admission was still admitted first.
                if before.is_none() && state != "launching" {
                    early.push(say(
                        "admitted: minting its token and starting its container",
                    ));
                }
                match state.as_str() {
                    "launching" => early.push(say(
                        "admitted: minting its token and starting its container",
                    )),
                    "running" => early.push(say("container started")),
                    other => {
                        // A run that went by faster than one look still started its container.
                        if run.started_at_ms.is_some()
                            && matches!(before.as_deref(), None | Some("launching"))
                        {
                            early.push(say("container started"));
                        }
                        late.push(say(&match other {
                            "exited" => "container exited; checking its branch".to_owned(),
                            other => other.replace('_', " "),
                        }));
                    }
                }
            }
        }
        for line in early {
            steps.say(&line);
        }
        for home in std::iter::once(repo.clone()).chain(forge.forks(repo)) {
            for branch in forge.branches_of(&home) {
                if not_started.contains(&branch) || branch == "main" {
                    continue;
                }
                if self.branches.insert(branch.clone()) {
                    steps.say(&format!("branch pushed: {branch} (in {home})"));
                }
            }
        }
        for line in late {
            steps.say(&line);
        }
        let mut threads: Vec<IssueRef> = issues.to_vec();
        for (number, head, _, title, _) in forge.pulls_of(repo) {
            if self.pulls.insert(number) {
                let from = forge
                    .pull_head_repo(repo, number)
                    .map(|fork| format!(" of {fork}"))
                    .unwrap_or_default();
                steps.say(&format!(
                    "pull request #{number} opened from {head}{from}: {title}"
                ));
            }
            threads.push(IssueRef::new(repo.clone(), number));
        }
        for issue in &threads {
            let labels = forge.labels_on(issue);
            let is_issue = issues.contains(issue);
            if is_issue && self.labels.get(&issue.number) != Some(&labels) {
                steps.say(&format!(
                    "labels on #{}: {}",
                    issue.number,
                    labels.join(", ")
                ));
                self.labels.insert(issue.number, labels);
            }
            for c in forge.comments_on(issue) {
                if self.comments.get(&c.id) == Some(&c.body) {
                    continue;
                }
                let verb = if self.comments.contains_key(&c.id) {
                    "edits its comment"
                } else {
                    "comments"
                };
                steps.say(&format!(
                    "{} {verb} on #{}:\n{}",
                    c.author,
                    issue.number,
                    visible(&c.body)
                ));
                self.comments.insert(c.id, c.body);
            }
        }
    }
}

/// A comment as a reader sees it: hidden markers dropped, indented.
fn visible(body: &str) -> String {
    body.lines()
        .filter(|l| !l.trim_start().starts_with("<!--"))
        .map(|l| format!("  │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn done(state: Option<Lifecycle>, runs: bool) -> bool {
    match state {
        Some(
            Lifecycle::Succeeded | Lifecycle::Failed | Lifecycle::TimedOut | Lifecycle::Cancelled,
        ) => true,
        Some(Lifecycle::Queued) => !runs,
        _ => false,
    }
}

async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    let steps = Steps(Instant::now());
    let dir = std::env::temp_dir().join(format!("director-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let _cleanup = RemoveOnDrop(dir.clone());

    let forge = FakeForge::new();
    forge.add_account(BOT, "demo-bot-token");
    let repo = forge.add_repo(REPO);
    forge.grant(&repo, BOT, Permission::Admin);
    forge.grant(&repo, WRITER, Permission::Write);
    forge.add_user(RUNNER);
    forge.set_password(RUNNER, "demo-runner-password");
    // A reader: runs push to its fork, and Forgejo holds its pull requests' workflows.
    forge.grant(&repo, RUNNER, Permission::Read);
    forge.enable_actions(&repo);
    forge.define_label(&repo, "headless");
    let server = forge.serve().context("the fake forge cannot listen")?;
    steps.say(&format!(
        "a fake Forgejo at {} with repository {REPO} (main protected, Actions on), {WRITER} (write access), the bot {BOT} and the runner {RUNNER} (read access: runs push to its fork)",
        server.url()
    ));
    let (model_url, model_handle) = serve_model()?;
    steps.say("a scripted model: GO with a plan for the --verbose issue, NO-GO for the rewrite");

    let image = if opts.no_docker {
        Err("--no-docker".to_owned())
    } else {
        agent_image(&dir).await
    };
    match &image {
        Ok(tag) => steps.say(&format!(
            "runs use the local Docker engine, image {tag} (built from busybox)"
        )),
        Err(why) => steps.say(&format!(
            "runs skipped: {why}; GO issues will wait in the queue"
        )),
    }
    let runs = image.is_ok();
    let settings = settings(
        &dir,
        &opts.listen,
        server.url(),
        &model_url,
        image.as_deref().ok(),
    )?;
    let app = Application::build_with(settings, Overrides::default())
        .await
        .context("the director cannot start")?;
    if runs {
        // Before the engine starts: the forecast of the first GO reads these.
        history::seed(app.store(), &repo, director::clock::now_ms())
            .await
            .context("cannot seed the demo's past runs")?;
        steps.say(&format!(
            "seeded a made-up past in the demo's own store, so the GO comment has a forecast to show: {} finished runs of {REPO} on the days before today (branches demo-seeded-past-N, model `{}`); none of them happened",
            history::PAST_RUNS.len(),
            history::SEEDED_MODEL
        ));
    }
    let address = format!("http://127.0.0.1:{}", app.port());
    forge.set_webhook(&format!("{address}/webhooks/forgejo"), SECRET);
    steps.say(&format!(
        "the director listens at {address}; the fake forge sends it webhooks"
    ));
    let store = app.store().clone();
    // Each step of the engine (a consumer pass, an executor round) wakes the loop below.
    let mut activity = app.settled().watch();
    let served = tokio::spawn(app.run_until_stopped());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !forge
        .calls()
        .iter()
        .any(|c| c.path == "/api/v1/user" && c.status == 200)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the director never asked the forge who it is"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let verbose = forge
        .open_issue(
            &repo,
            "reporter",
            "Add a --verbose flag",
            "Print each step as the tool runs it, when `--verbose` is given.",
        )
        .await;
    let rewrite = forge
        .open_issue(
            &repo,
            "reporter",
            "Rewrite the whole project in another language",
            "Everything, in one go, please.",
        )
        .await;
    steps.say(&format!(
        "reporter opens #{} \"Add a --verbose flag\" and #{} \"Rewrite the whole project in another language\"",
        verbose.number, rewrite.number
    ));
    for issue in [&verbose, &rewrite] {
        forge.label(WRITER, issue, "headless").await;
        steps.say(&format!(
            "{WRITER} applies the label `headless` to #{}",
            issue.number
        ));
    }

    let issues = [verbose.clone(), rewrite.clone()];
    let mut seen = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        seen.report(&steps, &forge, &store, &repo, &issues).await;
        // Done when both issues reached their end and nothing is left to do (the report
        // posted, the labels set): each read in one statement, so an action's end and the
        // outcome event it leaves are never seen apart.
        let at_rest = |i: IssueRef| {
            let store = store.clone();
            async move {
                match store.at_rest(&i).await {
                    Ok(Some((state, 0, 0))) => Some(state),
                    _ => None,
                }
            }
        };
        if done(at_rest(verbose.clone()).await, runs)
            && at_rest(rewrite.clone()).await == Some(Lifecycle::NoGo)
        {
            seen.report(&steps, &forge, &store, &repo, &issues).await;
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(!left.is_zero(), "the flow did not finish within 3 minutes");
        // Look again when the engine did something: never on a timer. (A branch the agent
        // pushes is seen at the step its container's end brings.)
        if let Ok(Err(_)) = tokio::time::timeout(left, activity.changed()).await {
            anyhow::bail!("the director stopped before the flow finished");
        }
    }
    steps.say(&format!(
        "done. The status page: {address}/status (JSON: {address}/status.json)"
    ));
    if !opts.once {
        // Listening before saying so: a signal sent as soon as the line is read is caught.
        let stop = stop_signal();
        steps.say("press Ctrl-C to stop (or send SIGTERM)");
        stop.await;
        steps.say("stopping");
    }
    served.abort();
    model_handle.stop(false).await;
    drop(server);
    Ok(())
}

/// Ctrl-C (SIGINT) or SIGTERM, as `timeout`, `docker stop` and process managers send it. Both
/// are listened for from the call on (not from the first poll), so none sent meanwhile is lost.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        match (term, int) {
            (Some(mut term), Some(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Some(mut term), None) => {
                term.recv().await;
            }
            (None, Some(mut int)) => {
                int.recv().await;
            }
            (None, None) => {
                tokio::signal::ctrl_c().await.ok();
            }
        }
    }
}

/// Removes the demo's scratch directory (database, image context) at the end.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
