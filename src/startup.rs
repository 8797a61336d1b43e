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
use crate::director::scanner::{ScanReport, Scanner};
use crate::forge::Forge;
use crate::forge::forgejo::ForgejoClient;
use crate::http::{AppState, observe_latency, routes};
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Store;

pub struct Application {
    port: u16,
    server: Server,
    shutdown: CancellationToken,
    store: Store,
    scanner: Option<Arc<Scanner>>,
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
        let consumer = Consumer::new(
            store.clone(),
            wake.clone(),
            settings.labels.trigger.clone(),
            forge.clone(),
        );
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
    Consumer::new(store, wake, settings.labels.trigger.clone(), Some(forge))
        .drain()
        .await?;
    Ok(report)
}
