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

use crate::clock::SharedClock;
use crate::engine::act::run::Secrets;
use crate::engine::act::{Acts, PreflightAct, RunAct};
use crate::engine::checks_poll::ChecksPoll;
use crate::engine::consumer::{Consumer, Limits, Wakes};
use crate::engine::decide::Policy;
use crate::engine::executor::Executor;
use crate::engine::scanner::{ScanReport, Scanner};
use crate::engine::settled::Settled;
use crate::engine::watcher::Watcher;
use crate::forge::Forge;
use crate::forge::RunnerAccount;
use crate::forge::forgejo::ForgejoClient;
use crate::http::{AppState, observe_latency, routes};
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::preflight::providers;
use crate::runtime::Runtime;
use crate::runtime::docker::DockerRuntime;
use crate::settings::{ForgeKind, Provider, Settings};
use crate::store::Store;
use crate::telemetry::Traces;

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
}

/// What tests (and benchmarks) put in place of the real thing.
#[derive(Clone, Default)]
pub struct Overrides {
    /// Used instead of the Docker engine.
    pub runtime: Option<Arc<dyn Runtime>>,
    /// Used instead of the system clock.
    pub clock: Option<SharedClock>,
}

/// The forge client, when `forge.url` is set.
pub fn forge_client(
    settings: &Settings,
    metrics: Option<Metrics>,
) -> anyhow::Result<Option<Arc<dyn Forge>>> {
    if settings.forge.url.is_empty() {
        return Ok(None);
    }
    match settings.forge.kind {
        ForgeKind::Forgejo => Ok(Some(Arc::new(ForgejoClient::new(
            &settings.forge,
            metrics,
        )?))),
        #[cfg(feature = "github")]
        ForgeKind::Github => Ok(Some(Arc::new(crate::forge::github::GithubClient::new(
            settings, metrics,
        )?))),
        #[cfg(not(feature = "github"))]
        ForgeKind::Github => anyhow::bail!("this build has no GitHub support"),
    }
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
    Some(
        Scanner::new(
            forge.clone(),
            store.clone(),
            settings.labels.trigger.clone(),
            settings.scan.repos.clone(),
            settings.scan.orgs.clone(),
            wake,
        )
        .with_state_labels(
            crate::engine::decide::all_state_labels(&settings.labels)
                .into_iter()
                .map(str::to_owned)
                .collect(),
        ),
    )
}

/// The pre-flight over the configured provider, when enabled.
fn preflight_act(settings: &Settings, metrics: &Metrics) -> anyhow::Result<Option<PreflightAct>> {
    if !settings.preflight.enabled {
        return Ok(None);
    }
    let provider: Arc<dyn crate::preflight::Preflight> =
        Arc::from(providers::from_settings(&settings.preflight)?);
    let metering = crate::engine::act::preflight::Metering {
        budget: settings.budget.clone(),
        prices: settings.models.prices.clone(),
        counters: Some(model_counters(settings, metrics)),
    };
    PreflightAct::new(provider, settings.preflight.clone(), Some(metrics.clone()))
        .map(|p| Some(p.with_metering(metering)))
}

/// The container runtime: the override, else the one `runner.kind` names, when runs are
/// configured. `Err` carries why it cannot be used (intake and pre-flights go on without it).
async fn runtime(
    settings: &Settings,
    overrides: &Overrides,
) -> Option<Result<(Arc<dyn Runtime>, Vec<(String, String, bool)>), String>> {
    if !settings.runs_configured() {
        return None;
    }
    if let Some(runtime) = &overrides.runtime {
        return Some(
            crate::runtime::mounts::translated(&settings.runner, None)
                .await
                .map(|mounts| (runtime.clone(), mounts)),
        );
    }
    #[cfg(feature = "kubernetes")]
    if settings.runner.kind == crate::settings::RunnerKind::Kubernetes {
        return Some(
            crate::runtime::kubernetes::KubeRuntime::connect(
                settings.runner.clone(),
                settings.kubernetes.clone(),
            )
            .await
            // Runs on Kubernetes have no host bind mounts (refused by the settings).
            .map(|k| (Arc::new(k) as Arc<dyn Runtime>, Vec::new()))
            .map_err(|e| e.to_string()),
        );
    }
    Some(
        match DockerRuntime::connect(settings.runner.clone()).await {
            Ok(docker) => {
                crate::runtime::mounts::translated(&settings.runner, Some(docker.docker()))
                    .await
                    .map(|mounts| (Arc::new(docker) as Arc<dyn Runtime>, mounts))
            }
            Err(e) => Err(e.to_string()),
        },
    )
}

/// The egress proxy allow-listed runs go through: where the runtime says it must listen,
/// the allow-list (plus the forge and the model endpoint, minus the director's own
/// listeners), the credentials key from the database. `Err` says why there is none.
async fn egress_proxy(
    settings: &Settings,
    runtime: &dyn Runtime,
    store: &Store,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    runs: Arc<dyn crate::gateway::Runs>,
    model_runs: Arc<dyn crate::models::Runs>,
) -> Result<crate::engine::act::run::RunEgress, String> {
    use crate::egress::{Entry, Policy, proxy::Proxy};
    let port = settings.runner.egress_proxy_port;
    let point = runtime
        .prepare_egress(port)
        .await
        .map_err(|e| format!("the runs' network could not be prepared: {e}"))?;
    let mut always = Vec::new();
    let origin = |url: &str| {
        let u = reqwest::Url::parse(url).ok()?;
        Some(Entry::exact(u.host_str()?, u.port_or_known_default()?))
    };
    always.extend(origin(&settings.forge.url));
    // On GitHub, git goes to the site (github.com), the API elsewhere (api.github.com).
    let web = settings.forge.web_url();
    if web != settings.forge.url.trim_end_matches('/') {
        always.extend(origin(&web));
    }
    if settings.preflight.provider != Provider::Command {
        always.extend(origin(&settings.preflight.base_url));
    }
    let gateway_at = std::net::SocketAddr::new(point.listen, settings.runner.git_gateway_port);
    let mut guarded: Vec<std::net::SocketAddr> = vec![settings.server.listen];
    guarded.push(std::net::SocketAddr::new(point.listen, port));
    guarded.push(gateway_at);
    let models_at = std::net::SocketAddr::new(point.listen, settings.runner.model_gateway_port);
    guarded.push(models_at);
    if let Ok(host) = std::env::var("DOCKER_HOST")
        && let Some(authority) = host.strip_prefix("tcp://")
        && let Ok(addrs) = tokio::net::lookup_host(authority.trim_end_matches('/')).await
    {
        guarded.extend(addrs);
    }
    let policy = Policy::new(&settings.runner.egress_allow, always, guarded)?;
    let key = store
        .egress_key()
        .await
        .map_err(|e| format!("the egress key could not be read: {e:#}"))?;
    let (proxy, listener) = Proxy::bind(
        std::net::SocketAddr::new(point.listen, port),
        policy,
        key.clone(),
        Arc::new(store.clone()),
        Some(metrics.egress_refused.clone()),
    )
    .await?;
    tracing::info!(listen = %proxy.local_addr(), "egress proxy listening for allow-listed runs");
    proxy.clone().serve(listener, shutdown.clone());
    // One memory budget for the bodies of both gateways' requests.
    let r = &settings.runner;
    let budget = crate::gateway::request::Budget::new(
        r.gateway_memory_mb,
        r.gateway_requests_per_run,
        std::time::Duration::from_secs(r.gateway_body_timeout_secs),
    )
    .with_gauge(metrics.gateway_body_memory.clone());
    let gateway = git_gateway(
        settings,
        gateway_at,
        key.clone(),
        runs,
        metrics,
        budget.clone(),
        shutdown,
    )?;
    let models = model_gateway(
        settings, models_at, key, model_runs, metrics, budget, shutdown,
    )?
    .map(|gw| (gw, settings.runner.model_gateway_port));
    Ok(crate::engine::act::run::RunEgress {
        proxy,
        host: point.host,
        gateway,
        gateway_port: settings.runner.git_gateway_port,
        models,
    })
}

/// The model gateway, beside the git gateway, when `[models]` names a provider: runs call
/// the providers through it with their own keys, metered and within `[budget]`.
fn model_gateway(
    settings: &Settings,
    at: std::net::SocketAddr,
    key: Vec<u8>,
    runs: Arc<dyn crate::models::Runs>,
    metrics: &Metrics,
    budget: crate::gateway::request::Budget,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<crate::models::ModelGateway>>, String> {
    use crate::models::{Provider, Upstream};
    let m = &settings.models;
    let upstreams: std::collections::BTreeMap<Provider, Upstream> = [
        (Provider::Anthropic, &m.anthropic),
        (Provider::Openai, &m.openai),
    ]
    .into_iter()
    .filter_map(|(p, s)| {
        s.as_ref().map(|s| {
            (
                p,
                Upstream {
                    base_url: s.base_url.clone(),
                    api_key: s.api_key.clone(),
                },
            )
        })
    })
    .collect();
    if upstreams.is_empty() {
        return Ok(None);
    }
    let config = crate::models::Config {
        upstreams,
        prices: m.prices.clone(),
        budget: settings.budget.clone(),
        allow_unmetered: m.allow_unmetered,
        max_request_mb: m.max_request_mb,
        requests: budget,
        default_max_output_tokens: m.default_max_output_tokens,
    };
    let gateway = crate::models::ModelGateway::new(
        key,
        runs,
        config,
        Some(model_counters(settings, metrics)),
    )?;
    let listener = std::net::TcpListener::bind(at)
        .map_err(|e| format!("the model gateway cannot listen on {at}: {e}"))?;
    let addr = gateway
        .serve(listener, shutdown.clone())
        .map_err(|e| format!("the model gateway cannot serve on {at}: {e}"))?;
    tracing::info!(listen = %addr, "model gateway listening for allow-listed runs");
    Ok(Some(gateway))
}

/// The model gateway's counters; a repository names its cost only if watched by name or
/// organisation (the label stays bounded).
pub fn model_counters(settings: &Settings, metrics: &Metrics) -> crate::models::Counters {
    let repos = settings.scan.repos.clone();
    let orgs = settings.scan.orgs.clone();
    crate::models::Counters {
        tokens: metrics.model_tokens.clone(),
        cost: metrics.model_cost.clone(),
        refused: metrics.model_refused.clone(),
        estimated: metrics.model_estimated.clone(),
        repos: Arc::new(move |r| {
            repos.contains(r) || orgs.iter().any(|o| o.eq_ignore_ascii_case(r.owner()))
        }),
    }
}

/// The git gateway, beside the egress proxy: runs clone and push through it.
fn git_gateway(
    settings: &Settings,
    at: std::net::SocketAddr,
    key: Vec<u8>,
    runs: Arc<dyn crate::gateway::Runs>,
    metrics: &Metrics,
    budget: crate::gateway::request::Budget,
    shutdown: &CancellationToken,
) -> Result<Arc<crate::gateway::Gateway>, String> {
    let config = crate::gateway::Config {
        protected_paths: settings.runner.protected(),
        max_push_mb: settings.runner.max_push_mb,
        git_timeout: std::time::Duration::from_secs(settings.runner.git_timeout_secs),
        requests: budget,
        cache_dir: std::env::temp_dir().join(format!("director-git-{}", std::process::id())),
    };
    let gateway =
        crate::gateway::Gateway::new(key, runs, config, Some(metrics.git_pushes_refused.clone()))?;
    let listener = std::net::TcpListener::bind(at)
        .map_err(|e| format!("the git gateway cannot listen on {at}: {e}"))?;
    let addr = gateway
        .serve(listener, shutdown.clone())
        .map_err(|e| format!("the git gateway cannot serve on {at}: {e}"))?;
    tracing::info!(listen = %addr, "git gateway listening for allow-listed runs");
    Ok(gateway)
}

/// What run tokens are sealed with in the database: a credential every replica is
/// configured with and the database does not hold.
fn seal_material(settings: &Settings) -> &crate::settings::Secret {
    match settings.forge.kind {
        crate::settings::ForgeKind::Github => &settings.github.private_key,
        crate::settings::ForgeKind::Forgejo => &settings.forge.runner_password,
    }
}

/// Asks the runtime whether runs can start, now and every `period`, into `/readyz`'s
/// `runtime` and `director_runtime_up`; a change is logged once.
fn monitor_runtime(
    runtime: Arc<dyn Runtime>,
    state: Arc<RwLock<String>>,
    metrics: Metrics,
    period: Duration,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut was_up = None;
        loop {
            let checked = tokio::select! {
                () = shutdown.cancelled() => return,
                checked = tokio::time::timeout(period, runtime.check()) => checked,
            };
            let checked = checked.unwrap_or_else(|_| {
                Err(crate::runtime::RuntimeError::Unavailable(
                    "the runtime did not answer in time".into(),
                ))
            });
            let up = checked.is_ok();
            match &checked {
                Ok(()) => set(&state, "ok"),
                Err(e) => set(&state, &format!("unavailable: {e}")),
            }
            metrics.runtime_up.set(i64::from(up));
            if was_up != Some(up) {
                match checked {
                    Ok(()) => tracing::info!("the container runtime can start runs"),
                    Err(error) => {
                        tracing::error!(%error, "the container runtime cannot start runs now")
                    }
                }
                was_up = Some(up);
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
        }
    });
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
        let settled = Settled::default();
        let replica = replica_name();
        let traces = Traces::start(&settings.telemetry, &settings.forge.url, &replica, &metrics)?;
        let mut consumer = Consumer::new(
            store.clone(),
            Policy::from_settings(&settings),
            clock.clone(),
            consumer_wake.clone(),
        )
        .gathering(deliveries_wake)
        .with_metrics(metrics.clone())
        .with_traces(traces.clone())
        .with_settled(settled.clone());
        if store.is_shared() {
            tracing::info!(%replica, "sharing the database with any other replicas");
            consumer = consumer.as_replica(&replica);
        }
        let mut listeners = crate::store::Listeners {
            events: Some(consumer_wake.clone()),
            ..Default::default()
        };
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
        let mut runs = RunsStarted::none();
        match &forge {
            Some(forge) => {
                let mut wakes = Wakes::default();
                runs = engine.start_runs(&overrides, forge).await?;
                if let Some(watcher) = &runs.watcher_wake {
                    wakes.watcher = Some(watcher.clone());
                    listeners.runs = Some(watcher.clone());
                }
                if let Some(limits) = runs.limits.take() {
                    consumer = consumer.with_admission(limits);
                }
                let executor_wake = engine
                    .start_executor(forge, &bot_login, runs.act.take())
                    .await?;
                wakes.executor = Some(executor_wake.clone());
                listeners.actions = Some(executor_wake);
                consumer = consumer.with_wakes(wakes);
            }
            // No forge, no executor: nothing is ever performed, so nothing is in hand.
            None => settled.executor_round(true),
        }
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
            Some(_) => Some(
                start_checks_poll(
                    &settings,
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

/// What the engine's parts share while they are started.
struct Engine<'a> {
    settings: &'a Arc<Settings>,
    store: &'a Store,
    clock: &'a SharedClock,
    metrics: &'a Metrics,
    shutdown: &'a CancellationToken,
    consumer_wake: &'a Arc<Notify>,
    settled: &'a Settled,
    traces: &'a Traces,
}

/// What starting the runs left for the rest: what the executor performs runs with, the
/// watcher's wake-up, admission limits, the runtime's state for `/readyz`, and the
/// director's address on the runs' network.
struct RunsStarted {
    act: Option<RunAct>,
    watcher_wake: Option<Arc<Notify>>,
    limits: Option<Limits>,
    state: Arc<RwLock<String>>,
    network: Option<std::net::IpAddr>,
}

impl RunsStarted {
    fn none() -> Self {
        Self {
            act: None,
            watcher_wake: None,
            limits: None,
            state: Arc::new(RwLock::new("disabled".to_owned())),
            network: None,
        }
    }
}

impl Engine<'_> {
    /// Connects the container runtime and, when it answers, starts the egress proxy, the
    /// runtime's health check and the run watcher.
    async fn start_runs(
        &self,
        overrides: &Overrides,
        forge: &Arc<dyn Forge>,
    ) -> anyhow::Result<RunsStarted> {
        let settings = self.settings;
        let mut started = RunsStarted::none();
        let secrets = Arc::new(Secrets::new(passthrough(settings)));
        let (runtime, mounts) = match runtime(settings, overrides).await {
            Some(Ok(connected)) => connected,
            Some(Err(error)) => {
                tracing::error!(%error, "the container runtime is unavailable: no runs start");
                self.metrics.runtime_up.set(0);
                set(&started.state, &format!("unavailable: {error}"));
                return Ok(started);
            }
            None => return Ok(started),
        };
        set(&started.state, "ok");
        let runner = RunnerAccount {
            login: settings.forge.runner_login.clone(),
            password: settings.forge.runner_password.clone(),
        };
        let seal = crate::engine::act::seal::Seal::new(seal_material(settings));
        let egress = if settings.egress_confined() {
            let gateway_runs = crate::engine::act::gateway::GatewayRuns {
                store: self.store.clone(),
                forge: forge.clone(),
                runner: runner.clone(),
                seal: seal.clone(),
                clock: self.clock.clone(),
                director_id: self.store.director_id().await?,
            };
            Some(
                egress_proxy(
                    settings,
                    runtime.as_ref(),
                    self.store,
                    self.metrics,
                    self.shutdown,
                    Arc::new(gateway_runs),
                    Arc::new(crate::engine::act::models::ModelRuns {
                        store: self.store.clone(),
                        clock: self.clock.clone(),
                    }),
                )
                .await,
            )
        } else {
            None
        };
        if let Some(Ok(e)) = &egress {
            let ip = e.proxy.local_addr().ip();
            started.network = (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip);
        }
        if let Some(Err(error)) = &egress {
            tracing::error!(%error, "no run starts: runs are allow-listed and the egress proxy is not there");
        }
        monitor_runtime(
            runtime.clone(),
            started.state.clone(),
            self.metrics.clone(),
            Duration::from_secs(30),
            self.shutdown.clone(),
        );
        let watcher_wake = Arc::new(Notify::new());
        let watcher = Watcher::new(
            self.store.clone(),
            runtime.clone(),
            self.clock.clone(),
            settings.runner.clone(),
            secrets.clone(),
            watcher_wake.clone(),
            self.consumer_wake.clone(),
        )
        .with_egress(match &egress {
            Some(Ok(e)) => Some(e.proxy.clone()),
            _ => None,
        })
        .with_models(
            matches!(&egress, Some(Ok(e)) if e.models.is_some()),
            settings.budget.any(),
        )
        .with_transcripts(
            settings
                .runner
                .transcript_max_mb
                .saturating_mul(1024 * 1024),
        );
        tokio::spawn(Arc::new(watcher).run(self.shutdown.clone()));
        started.watcher_wake = Some(watcher_wake);
        started.limits = Some(Limits {
            max_concurrent: settings.runner.max_concurrent.max(1),
            max_per_repo: settings.runner.max_per_repo.max(1),
            max_open_prs_per_repo: settings.runner.max_open_prs_per_repo.max(1),
            priority: settings.labels.priority.clone(),
            budget: settings.budget.clone(),
            branch_template: settings.runner.branch_template.clone(),
        });
        started.act = Some(RunAct {
            runtime,
            runner,
            seal,
            settings: settings.runner.clone(),
            mounts,
            secrets,
            director_id: self.store.director_id().await?,
            egress,
            repo: crate::settings::repo::Operator::new(
                &settings.repo_settings,
                &settings.runner,
                &settings.budget,
            ),
            agents: settings.agents.clone(),
        });
        Ok(started)
    }

    /// Starts the executor, which performs the outbox's actions (after the start-up sweeps);
    /// returns its wake-up.
    async fn start_executor(
        &self,
        forge: &Arc<dyn Forge>,
        bot_login: &Arc<RwLock<Option<String>>>,
        runs: Option<RunAct>,
    ) -> anyhow::Result<Arc<Notify>> {
        let settings = self.settings;
        let acts = Arc::new(Acts {
            store: self.store.clone(),
            forge: forge.clone(),
            labels: settings.labels.clone(),
            bot: bot_login.clone(),
            clock: self.clock.clone(),
            preflight: preflight_act(settings, self.metrics)?,
            runs,
            lane: crate::engine::act::lane::Lane::new(settings.merge.clone()),
            permissions: Default::default(),
        });
        let wake = Arc::new(Notify::new());
        let executor = Executor::new(
            acts.clone(),
            self.clock.clone(),
            wake.clone(),
            self.consumer_wake.clone(),
            settings.preflight.concurrency,
            settings.preflight.timeout_secs,
        )
        .with_metrics(self.metrics.clone())
        .with_traces(self.traces.clone())
        .with_settled(self.settled.clone());
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            startup_sweeps(&acts).await;
            Arc::new(executor).run(stop).await;
        });
        Ok(wake)
    }
}

/// The scanner, when a forge and repositories are configured, on its schedule when scans
/// are enabled.
async fn start_scans(
    settings: &Settings,
    forge: Option<&Arc<dyn Forge>>,
    store: &Store,
    consumer_wake: &Arc<Notify>,
    replica: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Arc<Scanner>>> {
    let scanner = scanner(settings, forge, store, consumer_wake.clone()).map(Arc::new);
    if let Some(scanner) = &scanner
        && settings.scan.enabled
    {
        schedule_scans(
            scanner.clone(),
            &settings.scan.schedule,
            &settings.scan.full_schedule,
            store
                .is_shared()
                .then(|| (store.clone(), replica.to_owned())),
            shutdown.clone(),
        )
        .await?;
    }
    Ok(scanner)
}

/// Starts the checks poll on `scan.checks_schedule` (while scans are enabled); with several
/// replicas each period's pass runs on one.
async fn start_checks_poll(
    settings: &Settings,
    store: &Store,
    clock: &SharedClock,
    consumer_wake: &Arc<Notify>,
    replica: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<Arc<ChecksPoll>> {
    let poll = Arc::new(ChecksPoll {
        store: store.clone(),
        clock: clock.clone(),
        merge: settings.merge.clone(),
        wake: consumer_wake.clone(),
    });
    if !settings.scan.enabled {
        return Ok(poll);
    }
    let shared = Arc::new(
        store
            .is_shared()
            .then(|| (store.clone(), replica.to_owned())),
    );
    let schedule = settings.scan.checks_schedule.clone();
    let mut scheduler = JobScheduler::new()
        .await
        .context("starting the checks scheduler")?;
    let (p, sh, expr) = (poll.clone(), shared.clone(), schedule.clone());
    let job = Job::new_async(schedule.as_str(), move |_, _| {
        let (p, sh, period) = (p.clone(), sh.clone(), period_of(&expr));
        Box::pin(async move {
            if !claim_scan(&sh, "checks", &period).await {
                return;
            }
            if let Err(error) = p.poll_once().await {
                tracing::warn!(error = %format!("{error:#}"), "the checks poll failed");
            }
        })
    })
    .with_context(|| format!("scan.checks_schedule `{schedule}`"))?;
    scheduler
        .add(job)
        .await
        .context("scheduling the checks poll")?;
    scheduler
        .start()
        .await
        .context("starting the checks scheduler")?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        let _ = scheduler.shutdown().await;
    });
    Ok(poll)
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

fn set(state: &RwLock<String>, value: &str) {
    if let Ok(mut s) = state.write() {
        *s = value.to_owned();
    }
}

/// `runner.env_passthrough`, from the director's own environment.
fn passthrough(settings: &Settings) -> Vec<(String, String)> {
    settings
        .runner
        .env_passthrough
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
        .collect()
}

/// Tokens and containers a previous process left behind.
async fn startup_sweeps(acts: &Acts) {
    let Some(runs) = &acts.runs else {
        return;
    };
    if let Err(error) = runs.sweep_tokens(acts).await {
        tracing::warn!(error = %format!("{error:#}"), "could not sweep stray run tokens");
    }
    if let Err(error) = runs.sweep_containers(acts).await {
        tracing::warn!(error = %format!("{error:#}"), "could not sweep finished run containers");
    }
}

/// Rows pruned per statement: small, so that intake never waits long for the writer.
const PRUNE_BATCH: u32 = 500;

/// Deletes what `store.retention_days` no longer keeps, at start and then hourly.
async fn prune_periodically(
    store: Store,
    retention_days: u32,
    clock: SharedClock,
    shutdown: CancellationToken,
) {
    let keep_ms = i64::from(retention_days.max(1)) * 86_400_000;
    loop {
        let before = clock.now_ms() - keep_ms;
        loop {
            match store.prune(before, PRUNE_BATCH).await {
                Ok(0) => break,
                Ok(n) => tracing::debug!(deleted = n, "pruned old rows"),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "pruning failed; retried later");
                    break;
                }
            }
            tokio::task::yield_now().await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
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
    full_schedule: &str,
    shared: Option<(Store, String)>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // One pass at a time. A full pass waits for a running incremental one (it must not be
    // skipped for a whole period); an incremental pass due while another pass runs is skipped.
    // With several replicas, each period's pass runs on the first replica to claim it.
    let running = Arc::new(tokio::sync::Mutex::new(()));
    let shared = Arc::new(shared);
    let full = |scanner: Arc<Scanner>,
                running: Arc<tokio::sync::Mutex<()>>,
                shared: Arc<Option<(Store, String)>>,
                period: String| async move {
        let _guard = running.lock().await;
        if !claim_scan(&shared, "full", &period).await {
            return;
        }
        if let Err(error) = scanner.scan_once().await {
            tracing::error!(error = %format!("{error:#}"), "full scan failed");
        }
    };
    let incremental = |scanner: Arc<Scanner>,
                       running: Arc<tokio::sync::Mutex<()>>,
                       shared: Arc<Option<(Store, String)>>,
                       period: String| async move {
        let Ok(_guard) = running.try_lock() else {
            tracing::info!("a scan is still running; skipping this incremental pass");
            return;
        };
        if !claim_scan(&shared, "incremental", &period).await {
            return;
        }
        if let Err(error) = scanner.scan_incremental().await {
            tracing::error!(error = %format!("{error:#}"), "incremental scan failed");
        }
    };
    // At start-up: a replica starting soon after another's full pass leaves it out.
    let startup = (crate::clock::now_ms() + STARTUP_SCAN_WINDOW_MS / 2) / STARTUP_SCAN_WINDOW_MS;
    tokio::spawn(full(
        scanner.clone(),
        running.clone(),
        shared.clone(),
        format!("startup:{startup}"),
    ));
    let mut scheduler = JobScheduler::new()
        .await
        .context("starting the scan scheduler")?;
    let (s, r, sh) = (scanner.clone(), running.clone(), shared.clone());
    let expr = schedule.to_owned();
    let job = Job::new_async(schedule, move |_, _| {
        Box::pin(incremental(
            s.clone(),
            r.clone(),
            sh.clone(),
            period_of(&expr),
        ))
    })
    .with_context(|| format!("scan.schedule `{schedule}`"))?;
    scheduler.add(job).await.context("scheduling the scan")?;
    let (s, r, sh) = (scanner.clone(), running.clone(), shared.clone());
    let expr = full_schedule.to_owned();
    let job = Job::new_async(full_schedule, move |_, _| {
        Box::pin(full(s.clone(), r.clone(), sh.clone(), period_of(&expr)))
    })
    .with_context(|| format!("scan.full_schedule `{full_schedule}`"))?;
    scheduler
        .add(job)
        .await
        .context("scheduling the full scan")?;
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

/// The start-up full pass is claimed once per window this wide (the nearest window edge).
const STARTUP_SCAN_WINDOW_MS: i64 = 600_000;

/// A scheduled pass fires on every replica moments apart: it is named by the scheduled time
/// nearest now, the same on each.
fn period_of(expr: &str) -> String {
    let now = crate::clock::now_ms();
    crate::settings::nearest_occurrence_ms(expr, now)
        .unwrap_or(now / 1000 * 1000)
        .to_string()
}

/// Whether this replica runs the `pass` of `period`: always alone; with several, only the
/// first to claim it.
async fn claim_scan(shared: &Option<(Store, String)>, pass: &str, period: &str) -> bool {
    let Some((store, replica)) = shared else {
        return true;
    };
    let now = crate::clock::now_ms();
    let name = format!("scan:{pass}:{period}");
    match store.claim_once(&name, replica, now).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::debug!(pass, "another replica runs this scan period");
            false
        }
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), pass, "cannot claim the scan period; skipping it");
            false
        }
    }
}

/// This process's name among replicas: the host's (a pod's name) and its process id.
fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "director".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// `director scan --once`: one scan, then everything it found is decided. The actions it
/// calls for (judging triggers, pre-flights) are left in the outbox for `serve` to perform.
pub async fn scan_once(settings: Settings) -> anyhow::Result<ScanReport> {
    let store = Store::connect(&settings.store).await?;
    let forge = forge_client(&settings, None)?.context("forge.url must be set to scan")?;
    let wake = Arc::new(Notify::new());
    let scanner = scanner(&settings, Some(&forge), &store, wake.clone())
        .context("nothing to scan: set scan.repos or scan.orgs")?;
    let report = scanner.scan_once().await?;
    let shared = store.is_shared();
    let mut consumer = Consumer::new(
        store,
        Policy::from_settings(&settings),
        crate::clock::system(),
        wake,
    );
    // Replicas serving the same database decide what was found; this one only if none
    // holds the consumer lease (never a second consumer beside them).
    if shared {
        consumer = consumer.as_replica(&replica_name());
    }
    let drained = consumer.drain().await;
    consumer.hand_over().await;
    drained?;
    Ok(report)
}

/// What `director preflight --dry-run` shows.
pub struct DryRun {
    pub prompt: String,
    pub reading: String,
    pub model: String,
    pub verdict: Option<crate::domain::verdict::Verdict>,
    pub left_out: Vec<String>,
}

/// `director check-repo owner/name`: the settings a run in `repo` would get now from its
/// `.director.toml` within `[repo_settings]`, or why it would get none. Starts nothing.
pub async fn check_repo(
    settings: &Settings,
    repo: &crate::domain::RepoName,
) -> anyhow::Result<Result<crate::domain::RunSettings, crate::engine::act::run::Unusable>> {
    let operator = crate::settings::repo::Operator::new(
        &settings.repo_settings,
        &settings.runner,
        &settings.budget,
    );
    let forge = forge_client(settings, None)?.context("forge.url must be set")?;
    let default_branch = forge
        .repository(repo)
        .await
        .with_context(|| format!("reading {repo}"))?
        .default_branch;
    crate::engine::act::run::read_repo_settings(forge.as_ref(), &operator, repo, &default_branch)
        .await
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
    let template = crate::engine::act::preflight::load_template(&settings.preflight)?;
    let with = crate::engine::act::preflight::Gatherer {
        forge: forge.as_ref(),
        acts: None,
        template: &template,
        automation_accounts: &settings.preflight.automation_accounts,
        bot: bot.as_deref(),
        // The operator asked to see this issue read; nothing is acted on.
        read_unvouched: true,
    };
    let gathered = crate::engine::act::preflight::gather_with(&with, &issue, 0, None).await?;
    let reading = provider.read(&gathered.prompt.text).await?;
    Ok(DryRun {
        prompt: gathered.prompt.text,
        verdict: crate::domain::verdict::parse(&reading.text),
        reading: reading.text,
        model: reading.model,
        left_out: gathered
            .left_out
            .iter()
            .map(|l| format!("@{} (comment {})", l.author, l.comment_id))
            .collect(),
    })
}
