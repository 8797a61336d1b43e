//! The parts the application is built from: the pre-flight, the container runtime, the
//! egress proxy, the git and model gateways, the runtime's health check.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::engine::act::PreflightAct;
use crate::engine::scanner::Scanner;
use crate::forge::Forge;
use crate::forge::forgejo::ForgejoClient;
use crate::metrics::Metrics;
use crate::preflight::providers;
use crate::runtime::Runtime;
use crate::runtime::docker::DockerRuntime;
use crate::settings::{ForgeKind, Provider, Settings};
use crate::store::Store;

/// The pre-flight over the configured provider, when enabled.
pub(super) fn preflight_act(
    settings: &Settings,
    metrics: &Metrics,
) -> anyhow::Result<Option<PreflightAct>> {
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
    PreflightAct::new(provider, settings.preflight.clone(), Some(metrics.clone())).map(|p| {
        Some(
            p.with_metering(metering)
                .with_filers(settings.filer_rules()),
        )
    })
}

/// The container runtime: the override, else the one `runner.kind` names, when runs are
/// configured. The inner `Err` carries why it cannot be used now (intake and pre-flights go
/// on without it); the outer one a configuration the engine cannot serve (`runner.oci_runtime`
/// it does not list): the director does not start.
pub(super) async fn runtime(
    settings: &Settings,
    overrides: &Overrides,
) -> anyhow::Result<Option<Result<(Arc<dyn Runtime>, Vec<(String, String, bool)>), String>>> {
    if !settings.runs_configured() {
        return Ok(None);
    }
    if let Some(runtime) = &overrides.runtime {
        return Ok(Some(
            crate::runtime::mounts::translated(&settings.runner, None)
                .await
                .map(|mounts| (runtime.clone(), mounts)),
        ));
    }
    #[cfg(feature = "kubernetes")]
    if settings.runner.kind == crate::settings::RunnerKind::Kubernetes {
        return Ok(Some(
            crate::runtime::kubernetes::KubeRuntime::connect(
                settings.runner.clone(),
                settings.kubernetes.clone(),
            )
            .await
            // Runs on Kubernetes have no host bind mounts (refused by the settings).
            .map(|k| (Arc::new(k) as Arc<dyn Runtime>, Vec::new()))
            .map_err(|e| e.to_string()),
        ));
    }
    Ok(Some(
        match DockerRuntime::connect(settings.runner.clone()).await {
            Ok(docker) => {
                // A sandbox the engine does not have is a configuration error: the director
                // refuses to start rather than run anything without it.
                docker
                    .check_oci_runtime()
                    .await
                    .map_err(anyhow::Error::msg)?;
                crate::runtime::mounts::translated(&settings.runner, Some(docker.docker()))
                    .await
                    .map(|mounts| (Arc::new(docker) as Arc<dyn Runtime>, mounts))
            }
            Err(e) => Err(e.to_string()),
        },
    ))
}

/// The egress proxy allow-listed runs go through: where the runtime says it must listen,
/// the allow-list (plus the forge and the model endpoint, minus the director's own
/// listeners), the credentials key from the database. `Err` says why there is none.
pub(super) async fn egress_proxy(
    settings: &Settings,
    runtime: &dyn Runtime,
    store: &Store,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    runs: Arc<dyn crate::git_gateway::Runs>,
    model_runs: Arc<dyn crate::models::Runs>,
) -> Result<
    (
        crate::engine::act::run::RunEgress,
        crate::runtime::EgressPoint,
    ),
    String,
> {
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
    let memory = r.gateway_memory()?;
    tracing::info!(%memory, "the gateways' request bodies may hold");
    let share_mb = match r.gateway_memory_per_run_mb {
        0 => (memory.mb / 4)
            .max(r.max_push_mb)
            .max(settings.models.max_request_mb),
        mb => mb,
    };
    let budget = crate::git_gateway::request::Budget::new(
        memory.mb,
        r.gateway_requests_per_run,
        std::time::Duration::from_secs(r.gateway_body_timeout_secs),
    )
    .with_run_share(share_mb)
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
    let egress = crate::engine::act::run::RunEgress {
        proxy,
        host: point.host.clone(),
        gateway,
        gateway_port: settings.runner.git_gateway_port,
        models,
    };
    Ok((egress, point))
}

/// The model gateway, beside the git gateway, when `[models]` names a provider: runs call
/// the providers through it with their own keys, metered and within `[budget]`.
pub(super) fn model_gateway(
    settings: &Settings,
    at: std::net::SocketAddr,
    key: Vec<u8>,
    runs: Arc<dyn crate::models::Runs>,
    metrics: &Metrics,
    budget: crate::git_gateway::request::Budget,
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
        policy: crate::models::policy::Policy {
            server_tools: m.allow_server_tools.clone(),
            anthropic_betas: m.allow_anthropic_betas.clone(),
        },
        drain: std::time::Duration::from_secs(m.drain_secs),
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
pub(super) fn git_gateway(
    settings: &Settings,
    at: std::net::SocketAddr,
    key: Vec<u8>,
    runs: Arc<dyn crate::git_gateway::Runs>,
    metrics: &Metrics,
    budget: crate::git_gateway::request::Budget,
    shutdown: &CancellationToken,
) -> Result<Arc<crate::git_gateway::Gateway>, String> {
    let config = crate::git_gateway::Config {
        protected_paths: settings.runner.protected(),
        max_push_mb: settings.runner.max_push_mb,
        git_timeout: std::time::Duration::from_secs(settings.runner.git_timeout_secs),
        requests: budget,
        cache_dir: settings.runner.gateway_root(),
        disk_mb: settings.runner.gateway_disk_mb,
    };
    let gateway = crate::git_gateway::Gateway::new(
        key,
        runs,
        config,
        Some(metrics.git_pushes_refused.clone()),
    )?;
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
pub(super) fn seal_material(settings: &Settings) -> &crate::settings::Secret {
    match settings.forge.kind {
        crate::settings::ForgeKind::Github => &settings.github.private_key,
        crate::settings::ForgeKind::Forgejo => &settings.forge.runner_password,
    }
}

/// Asks the runtime whether runs can start, now and every `period`, into `/readyz`'s
/// `runtime` and `director_runtime_up`; a change is logged once.
pub(super) fn monitor_runtime(
    runtime: Arc<dyn Runtime>,
    state: crate::runtime::Health,
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
                Ok(()) => state.set("ok"),
                Err(e) => state.set(&format!("unavailable: {e}")),
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

/// `runner.env_passthrough`, from the director's own environment.
pub(super) fn passthrough(settings: &Settings) -> Vec<(String, String)> {
    settings
        .runner
        .env_passthrough
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
        .collect()
}
