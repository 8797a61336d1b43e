//! Builds the service from [`Settings`]: opens the store, binds the listener, and wires the
//! intake, the forge client, the consumer, the scan schedule and the HTTP routes.

use std::net::TcpListener;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, middleware::from_fn, web};
use anyhow::Context;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::engine::checks_poll::ChecksPoll;
use crate::engine::scanner::Scanner;
use crate::engine::settled::Settled;
use crate::forge::Forge;
use crate::http::{AppState, observe_latency, routes};
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::settings::{ForgeKind, Settings};
use crate::store::Store;
use crate::telemetry::Traces;

mod engine;
mod host;
mod oneshot;
mod parts;
mod schedules;

use engine::{Engine, start_checks_poll, start_scans};
pub use oneshot::{DryRun, check_repo, preflight_dry_run, scan_once, setup_warmth};
pub use parts::{Overrides, forge_client, model_counters, scanner};
use schedules::{learn_bot_login, prune_periodically, replica_name};
pub struct Application {
    port: u16,
    server: Server,
    shutdown: CancellationToken,
    store: Store,
    scanner: Option<Arc<Scanner>>,
    consumer_wake: Arc<Notify>,
    settled: Settled,
    traces: Traces,
    checks: Option<Arc<ChecksPoll>>,
    /// `runner.host_firewall`'s rule, taken away at the stop.
    firewall: Option<crate::egress::firewall::HostFirewall>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, Overrides::default()).await
    }

    /// Everything is started except the HTTP server's accept loop, which
    /// [`Application::run_until_stopped`] drives.
    pub async fn build_with(settings: Settings, overrides: Overrides) -> anyhow::Result<Self> {
        let settings = Arc::new(settings);
        for warning in settings.warnings() {
            tracing::warn!(%warning, "configuration");
        }
        let clock = overrides.clock.clone().unwrap_or_else(crate::clock::system);
        let shutdown = CancellationToken::new();
        let metrics = Metrics::new();
        let store = open_store(&settings, &clock, &metrics, &shutdown).await?;
        let consumer_wake = Arc::new(Notify::new());
        // Intake wakes the consumer on a notify of its own: a stream of deliveries is taken
        // in gathered passes, everything else at once.
        let deliveries_wake = Arc::new(Notify::new());
        let intake = Intake::spawn(store.clone(), deliveries_wake.clone())
            .context("starting the intake writer")?;
        let forge = forge_client(&settings, Some(metrics.clone()))?;
        let bot_login = start_learning_bot_login(&settings, forge.as_ref(), &shutdown);
        start_checking_runner_roles(&settings, forge.as_ref());
        let settled = Settled::default();
        let replica = replica_name();
        let traces = Traces::start(&settings.telemetry, &settings.forge.url, &replica, &metrics)?;
        let engine = Engine {
            settings: &settings,
            store: &store,
            clock: &clock,
            metrics: &metrics,
            shutdown: &shutdown,
            consumer_wake: &consumer_wake,
            settled: &settled,
            traces: &traces,
        };
        let consumer = engine.consumer(deliveries_wake, &replica);
        let mut listeners = crate::store::Listeners {
            events: Some(consumer_wake.clone()),
            ..Default::default()
        };
        let (consumer, mut runs) = engine
            .start_acting(
                &overrides,
                forge.as_ref(),
                &bot_login,
                consumer,
                &mut listeners,
            )
            .await?;
        tokio::spawn(consumer.run(shutdown.clone()));
        store.listen(listeners, shutdown.clone());
        let scanner = start_scans(
            &settings,
            forge.as_ref(),
            &store,
            &consumer_wake,
            &replica,
            &shutdown,
        )
        .await?;
        let checks = match &forge {
            Some(forge) => Some(
                start_checks_poll(
                    &settings,
                    forge,
                    &store,
                    &clock,
                    &consumer_wake,
                    &replica,
                    &shutdown,
                )
                .await?,
            ),
            None => None,
        };
        let state = web::Data::new(AppState {
            settings: settings.clone(),
            metrics,
            intake,
            store: store.clone(),
            bot_login,
            runtime_state: runs.state,
            forge: forge.clone(),
            visibility: Default::default(),
            outcomes: Default::default(),
            clock: clock.clone(),
            bodies: crate::http::webhook::BodyBudget::new(&settings.server),
            runs_network: runs.network,
            authorized_bodies: crate::http::webhook::BodyBudget::new(&settings.server),
        });
        let (server, port) = serve_http(&settings, state)?;
        Ok(Self {
            port,
            server,
            shutdown,
            store,
            scanner,
            consumer_wake,
            settled,
            traces,
            checks,
            firewall: runs.firewall.take(),
        })
    }

    /// The checks poll, when a forge is configured: tests run a pass at will.
    pub fn checks_poll(&self) -> Option<Arc<ChecksPoll>> {
        self.checks.clone()
    }

    /// Where the consumer and the executor say whether they have anything in hand: tests and
    /// the demo wait on it instead of polling.
    pub fn settled(&self) -> Settled {
        self.settled.clone()
    }

    /// Wakes the consumer: for tools that write to the store directly (benchmarks).
    pub fn consumer_wake(&self) -> Arc<Notify> {
        self.consumer_wake.clone()
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
        if let Some(mut firewall) = self.firewall
            && let Err(error) = firewall.remove()
        {
            tracing::error!(%error, "the host firewall rule could not be removed");
        }
        let traces = self.traces;
        // Sending the last spans blocks its thread for at most two seconds.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        result.context("HTTP server failed")
    }
}

/// Opens the store, takes over what a previous process had claimed, and starts its upkeep:
/// pruning old rows and watching whether the database answers.
async fn open_store(
    settings: &Settings,
    clock: &SharedClock,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> anyhow::Result<Store> {
    let store = Store::connect(&settings.store).await?;
    // One director per SQLite database: claims of a process that died are void now.
    let released = store.release_leases().await?;
    if released > 0 {
        tracing::info!(released, "took over actions a previous process had claimed");
    }
    tokio::spawn(prune_periodically(
        store.clone(),
        settings.store.retention_days,
        clock.clone(),
        shutdown.clone(),
    ));
    let (up, outages) = (metrics.store_up.clone(), metrics.store_outages.clone());
    store.monitor(
        Duration::from_secs(2),
        move |now_up| {
            up.set(i64::from(now_up));
            if !now_up {
                outages.inc();
            }
        },
        shutdown.clone(),
    );
    Ok(store)
}

/// The bot's login as configured, learnt from the forge in the background when a token (or
/// an App) is there to ask with.
fn start_learning_bot_login(
    settings: &Settings,
    forge: Option<&Arc<dyn Forge>>,
    shutdown: &CancellationToken,
) -> Arc<RwLock<Option<String>>> {
    let bot_login = Arc::new(RwLock::new(settings.forge.bot_login.clone()));
    if let Some(forge) = forge
        && (!settings.forge.token.is_empty() || settings.forge.kind == ForgeKind::Github)
    {
        tokio::spawn(learn_bot_login(
            forge.clone(),
            bot_login.clone(),
            shutdown.clone(),
        ));
    }
    bot_login
}

/// In fork mode, says at start-up, per watched repository, where the runner account's role
/// would have runs refused (a writer defeats Forgejo's approval gate): once, in the
/// background, changing nothing.
fn start_checking_runner_roles(settings: &Arc<Settings>, forge: Option<&Arc<dyn Forge>>) {
    let Some(forge) = forge.cloned() else { return };
    if settings.runs_configured()
        && settings.runner.branch_home == crate::settings::BranchHome::Repository
    {
        start_checking_workflows(settings.clone(), forge.clone());
    }
    if !settings.runs_configured()
        || settings.runner.branch_home != crate::settings::BranchHome::Fork
    {
        return;
    }
    let settings = settings.clone();
    tokio::spawn(async move {
        for repo in &settings.scan.repos {
            if let Some(problem) = crate::hooks::runner_problem(
                forge.as_ref(),
                repo,
                &settings.runner,
                &crate::forge::RunnerAccount {
                    login: settings.forge.runner_login.clone(),
                    password: settings.forge.runner_password.clone(),
                },
            )
            .await
            {
                tracing::warn!(%repo, %problem, "runs here will be refused");
            }
        }
    });
}

/// Where runs push to the repository itself, says at start-up, per watched repository,
/// whether its own workflows will run on those pushes with no one's approval (GitHub: its
/// Actions are on), and where to turn them off or restrict them.
fn start_checking_workflows(settings: Arc<Settings>, forge: Arc<dyn Forge>) {
    tokio::spawn(async move {
        for repo in &settings.scan.repos {
            match forge.workflows_run_unapproved(repo).await {
                Ok(Some(true)) => tracing::warn!(
                    %repo,
                    "the repository's workflows run on the runs' pushes with its secrets and no one's approval (GitHub asks none for an App's push to the repository itself): restrict them to the default branch or turn Actions off there (Settings, Actions, General); docs/security.md#agent-code-in-ci"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    %repo,
                    error = %e,
                    "whether the repository's workflows run on the runs' pushes cannot be read (the App needs Administration: read); docs/security.md#agent-code-in-ci"
                ),
            }
        }
    });
}

/// Binds `server.listen` and builds the HTTP server (not yet accepting: see
/// [`Application::run_until_stopped`]); returns it with the port it got.
fn serve_http(settings: &Settings, state: web::Data<AppState>) -> anyhow::Result<(Server, u16)> {
    let listener = TcpListener::bind(settings.server.listen)
        .with_context(|| format!("cannot listen on {}", settings.server.listen))?;
    let port = listener.local_addr()?.port();
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(from_fn(observe_latency))
            .wrap(from_fn(crate::http::not_from_runs))
            .configure(routes)
    })
    // Which of the host's addresses each connection came in on (see `not_from_runs`).
    .on_connect(|conn, data| {
        if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>()
            && let Ok(local) = tcp.local_addr()
        {
            data.insert(crate::http::LocalAddr(local));
        }
    })
    .listen(listener)?;
    if settings.server.workers > 0 {
        server = server.workers(settings.server.workers);
    }
    let server = server.shutdown_timeout(10).run();
    tracing::info!(port, "director listening");
    Ok((server, port))
}
