//! Builds the service from [`Settings`]: opens the store, binds the listener, and wires the
//! intake, the forge client, the consumer, the scan schedule and the HTTP routes.

use std::net::TcpListener;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, middleware::from_fn, web};
use anyhow::Context;
use tokio::sync::Notify;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::director::consumer::Consumer;
use crate::director::decide::LabelNames;
use crate::director::runs::RunSupervisor;
use crate::director::scanner::{ScanReport, Scanner};
use crate::forge::Forge;
use crate::forge::RunnerAccount;
use crate::forge::forgejo::ForgejoClient;
use crate::http::{AppState, observe_latency, routes};
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::preflight::providers;
use crate::preflight::worker::PreflightWorker;
use crate::runtime::docker::DockerRuntime;
use crate::settings::Settings;
use crate::store::Store;

pub struct Application {
    port: u16,
    server: Server,
    shutdown: CancellationToken,
    store: Store,
    scanner: Option<Arc<Scanner>>,
}

pub fn label_names(settings: &Settings) -> LabelNames {
    LabelNames {
        trigger: settings.labels.trigger.clone(),
        skip_preflight: settings.labels.skip_preflight.clone(),
    }
}

/// The forge client, when `forge.url` is set.
pub fn forge_client(
    settings: &Settings,
    metrics: Option<Metrics>,
) -> anyhow::Result<Option<Arc<dyn Forge>>> {
    if settings.forge.url.is_empty() {
        return Ok(None);
    }
    let client = ForgejoClient::new(&settings.forge, metrics)?;
    Ok(Some(Arc::new(client)))
}

/// The pre-flight worker over the configured provider.
pub fn preflight_worker(
    settings: &Settings,
    forge: Arc<dyn Forge>,
    store: &Store,
    bot: Arc<RwLock<Option<String>>>,
    metrics: Option<Metrics>,
    consumer_wake: Arc<Notify>,
) -> anyhow::Result<PreflightWorker> {
    let provider: Arc<dyn crate::preflight::Preflight> =
        Arc::from(providers::from_settings(&settings.preflight)?);
    PreflightWorker::new(
        store.clone(),
        forge,
        provider,
        settings.preflight.clone(),
        settings.labels.clone(),
        bot,
        metrics,
        consumer_wake,
    )
}

/// The scanner, when a forge and something to watch are configured.
pub fn scanner(
    settings: &Settings,
    forge: Option<&Arc<dyn Forge>>,
    store: &Store,
    wake: Arc<Notify>,
) -> Option<Scanner> {
    let forge = forge?;
    if settings.scan.repos.is_empty() && settings.scan.orgs.is_empty() {
        return None;
    }
    Some(Scanner::new(
        forge.clone(),
        store.clone(),
        settings.labels.trigger.clone(),
        settings.scan.repos.clone(),
        settings.scan.orgs.clone(),
        wake,
    ))
}

impl Application {
    /// Everything is started except the HTTP server's accept loop, which
    /// [`Application::run_until_stopped`] drives.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let settings = Arc::new(settings);
        let store = Store::connect(&settings.store).await?;
        let metrics = Metrics::new();
        let wake = Arc::new(Notify::new());
        let intake = Intake::spawn(store.clone(), wake.clone());
        let shutdown = CancellationToken::new();

        let forge = forge_client(&settings, Some(metrics.clone()))?;
        let bot_login = Arc::new(RwLock::new(settings.forge.bot_login.clone()));
        if let Some(forge) = &forge
            && !settings.forge.token.is_empty()
        {
            tokio::spawn(learn_bot_login(
                forge.clone(),
                bot_login.clone(),
                shutdown.clone(),
            ));
        }
        let mut consumer = Consumer::new(
            store.clone(),
            wake.clone(),
            label_names(&settings),
            forge.clone(),
        );
        let mut gate = None;
        if let Some(forge) = &forge
            && settings.preflight.enabled
        {
            let worker = preflight_worker(
                &settings,
                forge.clone(),
                &store,
                bot_login.clone(),
                Some(metrics.clone()),
                wake.clone(),
            )?;
            let preflight_wake = Arc::new(Notify::new());
            consumer = consumer.with_preflight_wake(preflight_wake.clone());
            let worker = Arc::new(worker);
            gate = Some(worker.clone());
            tokio::spawn(worker.run(preflight_wake, shutdown.clone()));
        }
        let runtime_state = Arc::new(RwLock::new("disabled".to_owned()));
        if let Some(forge) = &forge
            && settings.runner.enabled
            && !settings.runner.image.is_empty()
        {
            match DockerRuntime::connect(settings.runner.clone()).await {
                Ok(runtime) => {
                    let mounts =
                        RunSupervisor::translated_mounts(&settings.runner, Some(runtime.docker()))
                            .await;
                    let supervisor = RunSupervisor::new(
                        store.clone(),
                        forge.clone(),
                        Arc::new(runtime),
                        RunnerAccount {
                            login: settings.forge.runner_login.clone(),
                            password: settings.forge.runner_password.clone(),
                        },
                        settings.runner.clone(),
                        settings.forge.url.clone(),
                        gate.clone(),
                        wake.clone(),
                        mounts,
                    );
                    let runs_wake = Arc::new(Notify::new());
                    consumer = consumer.with_runs_wake(runs_wake.clone());
                    tokio::spawn(Arc::new(supervisor).run(runs_wake, shutdown.clone()));
                    if let Ok(mut s) = runtime_state.write() {
                        *s = "ok".into();
                    }
                }
                Err(error) => {
                    // Intake and pre-flights go on without the engine; readiness says so.
                    tracing::error!(%error, "the container engine is unavailable: no runs start");
                    if let Ok(mut s) = runtime_state.write() {
                        *s = format!("unavailable: {error}");
                    }
                }
            }
        }
        if let Some(forge) = &forge {
            consumer = consumer.with_state_labels(settings.labels.clone(), forge.clone());
        }
        tokio::spawn(consumer.run(shutdown.clone()));

        let scanner = scanner(&settings, forge.as_ref(), &store, wake).map(Arc::new);
        if let Some(scanner) = &scanner
            && settings.scan.enabled
        {
            schedule_scans(scanner.clone(), &settings.scan.schedule, shutdown.clone()).await?;
        }

        let listener = TcpListener::bind(&settings.server.listen)
            .with_context(|| format!("cannot listen on {}", settings.server.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState {
            settings: settings.clone(),
            metrics,
            intake,
            store: store.clone(),
            bot_login,
            runtime_state,
        });
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .wrap(from_fn(observe_latency))
                .configure(routes)
        })
        .listen(listener)?;
        if settings.server.workers > 0 {
            server = server.workers(settings.server.workers);
        }
        let server = server.shutdown_timeout(10).run();
        tracing::info!(port, "director listening");
        Ok(Self {
            port,
            server,
            shutdown,
            store,
            scanner,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn scanner(&self) -> Option<Arc<Scanner>> {
        self.scanner.clone()
    }

    /// Serves until the process is told to stop (SIGINT/SIGTERM), then stops the background
    /// tasks.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = self.server.await;
        self.shutdown.cancel();
        result.context("HTTP server failed")
    }
}

/// Asks the forge who the bot is until it answers; its own events are then ignored.
async fn learn_bot_login(
    forge: Arc<dyn Forge>,
    bot: Arc<RwLock<Option<String>>>,
    shutdown: CancellationToken,
) {
    let mut wait = Duration::from_secs(1);
    loop {
        match forge.current_user().await {
            Ok(login) => {
                tracing::info!(bot = %login, "forge account identified");
                if let Ok(mut b) = bot.write() {
                    *b = Some(login);
                }
                return;
            }
            Err(error) => tracing::warn!(%error, "cannot identify the bot account yet"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(300));
    }
}

/// Runs a scan now (to catch up on what was missed while down) and then on the schedule;
/// a scan still running when the next is due is not started twice.
async fn schedule_scans(
    scanner: Arc<Scanner>,
    schedule: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let running = Arc::new(tokio::sync::Mutex::new(()));
    let run = move |scanner: Arc<Scanner>, running: Arc<tokio::sync::Mutex<()>>| async move {
        let Ok(_guard) = running.try_lock() else {
            tracing::info!("previous scan still running; skipping this one");
            return;
        };
        if let Err(error) = scanner.scan_once().await {
            tracing::error!(error = %format!("{error:#}"), "scan failed");
        }
    };
    tokio::spawn(run(scanner.clone(), running.clone()));
    let mut scheduler = JobScheduler::new()
        .await
        .context("starting the scan scheduler")?;
    let job = Job::new_async(schedule, move |_, _| {
        let (scanner, running) = (scanner.clone(), running.clone());
        Box::pin(run(scanner, running))
    })
    .with_context(|| format!("scan.schedule `{schedule}`"))?;
    scheduler.add(job).await.context("scheduling the scan")?;
    scheduler
        .start()
        .await
        .context("starting the scan scheduler")?;
    tokio::spawn(async move {
        shutdown.cancelled().await;
        let _ = scheduler.shutdown().await;
    });
    Ok(())
}

/// `director scan --once`: one scan, then everything it queued is processed.
pub async fn scan_once(settings: Settings) -> anyhow::Result<ScanReport> {
    let store = Store::connect(&settings.store).await?;
    let forge = forge_client(&settings, None)?.context("forge.url must be set to scan")?;
    let wake = Arc::new(Notify::new());
    let scanner = scanner(&settings, Some(&forge), &store, wake.clone())
        .context("nothing to scan: set scan.repos or scan.orgs")?;
    let report = scanner.scan_once().await?;
    Consumer::new(store, wake, label_names(&settings), Some(forge))
        .drain()
        .await?;
    Ok(report)
}

/// What `director preflight --dry-run` shows.
pub struct DryRun {
    pub prompt: String,
    pub reading: String,
    pub model: String,
    pub verdict: Option<crate::preflight::verdict::Verdict>,
    pub left_out: Vec<String>,
}

/// `director preflight owner/repo#N --dry-run`: reads the issue, builds the prompt, asks the
/// provider; writes nothing to Forgejo and nothing to the database.
pub async fn preflight_dry_run(
    settings: Settings,
    issue: crate::domain::IssueRef,
) -> anyhow::Result<DryRun> {
    let forge = forge_client(&settings, None)?.context("forge.url must be set")?;
    let bot = match forge.current_user().await {
        Ok(login) => Some(login),
        Err(_) => settings.forge.bot_login.clone(),
    };
    let provider: Arc<dyn crate::preflight::Preflight> =
        Arc::from(providers::from_settings(&settings.preflight)?);
    let template = match &settings.preflight.template_file {
        Some(file) => std::fs::read_to_string(file)
            .with_context(|| format!("preflight.template_file {file}"))?,
        None => crate::preflight::prompt::DEFAULT_TEMPLATE.to_owned(),
    };
    let gathered = crate::preflight::worker::gather_with(
        forge.as_ref(),
        &template,
        &settings.preflight.automation_accounts,
        bot.as_deref(),
        &issue,
        0,
    )
    .await?;
    let reading = provider.read(&gathered.prompt.text).await?;
    Ok(DryRun {
        prompt: gathered.prompt.text,
        verdict: crate::preflight::verdict::parse(&reading.text),
        reading: reading.text,
        model: reading.model,
        left_out: gathered
            .left_out
            .iter()
            .map(|l| format!("@{} (comment {})", l.author, l.comment_id))
            .collect(),
    })
}
