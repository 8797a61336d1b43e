//! The engine's tasks, started in order: the runs (runtime, proxy, watcher), the executor,
//! the scans and the checks poll.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Notify;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::engine::act::run::Secrets;
use crate::engine::act::{Acts, RunAct};
use crate::engine::checks_poll::ChecksPoll;
use crate::engine::consumer::{Consumer, Limits, Wakes};
use crate::engine::decide::Policy;
use crate::engine::executor::Executor;
use crate::engine::scanner::Scanner;
use crate::engine::settled::Settled;
use crate::engine::watcher::Watcher;
use crate::forge::Forge;
use crate::forge::RunnerAccount;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Store;
use crate::telemetry::Traces;

use super::parts::{
    Overrides, egress_proxy, monitor_runtime, passthrough, preflight_act, runtime, scanner,
    seal_material,
};
use super::schedules::{claim_scan, period_of, schedule_scans, startup_sweeps};

/// What the engine's parts share while they are started.
pub(super) struct Engine<'a> {
    pub(super) settings: &'a Arc<Settings>,
    pub(super) store: &'a Store,
    pub(super) clock: &'a SharedClock,
    pub(super) metrics: &'a Metrics,
    pub(super) shutdown: &'a CancellationToken,
    pub(super) consumer_wake: &'a Arc<Notify>,
    pub(super) settled: &'a Settled,
    pub(super) traces: &'a Traces,
}

/// What starting the runs left for the rest: what the executor performs runs with, the
/// watcher's wake-up, admission limits, the runtime's state for `/readyz`, and the
/// director's address on the runs' network.
pub(super) struct RunsStarted {
    pub(super) act: Option<RunAct>,
    pub(super) watcher_wake: Option<Arc<Notify>>,
    pub(super) limits: Option<Limits>,
    pub(super) state: crate::runtime::Health,
    pub(super) network: Option<std::net::IpAddr>,
    /// `runner.host_firewall`'s rule, while the director runs.
    pub(super) firewall: Option<crate::egress::firewall::HostFirewall>,
}

impl RunsStarted {
    pub(super) fn none() -> Self {
        Self {
            act: None,
            watcher_wake: None,
            limits: None,
            state: crate::runtime::Health::new("disabled"),
            network: None,
            firewall: None,
        }
    }
}

impl Engine<'_> {
    /// The consumer of events, which runs `decide` and commits its outcome (as one replica
    /// of several when the database is shared).
    pub(super) fn consumer(&self, deliveries_wake: Arc<Notify>, replica: &str) -> Consumer {
        let consumer = Consumer::new(
            self.store.clone(),
            Policy::from_settings(self.settings),
            self.clock.clone(),
            self.consumer_wake.clone(),
        )
        .gathering(deliveries_wake)
        .with_metrics(self.metrics.clone())
        .with_traces(self.traces.clone())
        .with_settled(self.settled.clone());
        if self.store.is_shared() {
            tracing::info!(%replica, "sharing the database with any other replicas");
            return consumer.as_replica(replica);
        }
        consumer
    }

    /// With a forge: the runs and the executor, each woken through `listeners` and by the
    /// consumer, which admits runs within the runner's limits. Without one, nothing is
    /// ever performed, so nothing is in hand.
    pub(super) async fn start_acting(
        &self,
        overrides: &Overrides,
        forge: Option<&Arc<dyn Forge>>,
        bot_login: &crate::forge::BotLogin,
        mut consumer: Consumer,
        listeners: &mut crate::store::Listeners,
    ) -> anyhow::Result<(Consumer, RunsStarted)> {
        let Some(forge) = forge else {
            self.settled.executor_round(true);
            return Ok((consumer, RunsStarted::none()));
        };
        let mut wakes = Wakes::default();
        let mut runs = self.start_runs(overrides, forge).await?;
        if let Some(watcher) = &runs.watcher_wake {
            wakes.watcher = Some(watcher.clone());
            listeners.runs = Some(watcher.clone());
        }
        if let Some(limits) = runs.limits.take() {
            consumer = consumer.with_admission(limits);
        }
        let executor_wake = self
            .start_executor(forge, bot_login, runs.act.take())
            .await?;
        wakes.executor = Some(executor_wake.clone());
        listeners.actions = Some(executor_wake);
        Ok((consumer.with_wakes(wakes), runs))
    }

    /// Connects the container runtime and, when it answers, starts the egress proxy, the
    /// runtime's health check and the run watcher.
    pub(super) async fn start_runs(
        &self,
        overrides: &Overrides,
        forge: &Arc<dyn Forge>,
    ) -> anyhow::Result<RunsStarted> {
        let settings = self.settings;
        let mut started = RunsStarted::none();
        let profile_values = settings
            .agents
            .values()
            .flat_map(|a| a.env.values().cloned());
        let secrets =
            Arc::new(Secrets::new(passthrough(settings)).with_profile_values(profile_values));
        let (runtime, mounts) = match runtime(settings, overrides).await? {
            Some(Ok(connected)) => connected,
            Some(Err(error)) => {
                tracing::error!(%error, "the container runtime is unavailable: no runs start");
                self.metrics.runtime_up.set(0);
                started.state.set(&format!("unavailable: {error}"));
                return Ok(started);
            }
            None => return Ok(started),
        };
        started.state.set("ok");
        let runner = RunnerAccount {
            login: settings.forge.runner_login.clone(),
            password: settings.forge.runner_password.clone(),
        };
        let seal = crate::engine::act::seal::Seal::new(seal_material(settings));
        let egress = if settings.egress_confined() {
            Some(self.egress(runtime.as_ref(), forge, &runner, &seal).await?)
        } else {
            None
        };
        let egress = match egress {
            Some(Ok((e, point))) => {
                let mut ports = vec![e.proxy.local_addr().port(), e.gateway_port];
                ports.extend(e.models.as_ref().map(|(_, port)| *port));
                started.firewall = super::host::guard_host(settings, &point, &ports)?;
                Some(Ok(e))
            }
            Some(Err(e)) => Some(Err(e)),
            None => None,
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
        let watcher_wake = self.start_watcher(&runtime, &secrets, egress.as_ref());
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
                settings.preflight.approval,
            )
            .with_setup_secrets(settings.setup_secret_globs())
            .with_checks(Some(&settings.checks).filter(|c| c.is_set())),
            agents: settings.agents.clone(),
            setup_secrets: settings.setup_secrets.clone(),
        });
        Ok(started)
    }

    /// The egress proxy allow-listed runs reach the outside through, with the git and model
    /// gateways behind it (`Err`: why it could not be had; then no run starts).
    async fn egress(
        &self,
        runtime: &dyn crate::runtime::Runtime,
        forge: &Arc<dyn Forge>,
        runner: &RunnerAccount,
        seal: &crate::engine::act::seal::Seal,
    ) -> anyhow::Result<
        Result<
            (
                crate::engine::act::run::RunEgress,
                crate::runtime::EgressPoint,
            ),
            String,
        >,
    > {
        let gateway_runs = crate::engine::act::git_gateway::GatewayRuns {
            store: self.store.clone(),
            forge: forge.clone(),
            runner: runner.clone(),
            seal: seal.clone(),
            clock: self.clock.clone(),
            director_id: self.store.director_id().await?,
        };
        Ok(egress_proxy(
            self.settings,
            runtime,
            self.store,
            self.metrics,
            self.shutdown,
            Arc::new(gateway_runs),
            Arc::new(crate::engine::act::models::ModelRuns {
                store: self.store.clone(),
                clock: self.clock.clone(),
                providers: crate::engine::act::models::agent_providers(self.settings),
            }),
        )
        .await)
    }

    /// Starts the run watcher (with the proxy's refusals, the metered usage and the
    /// transcripts when those are on); returns its wake-up.
    fn start_watcher(
        &self,
        runtime: &Arc<dyn crate::runtime::Runtime>,
        secrets: &Arc<Secrets>,
        egress: Option<&Result<crate::engine::act::run::RunEgress, String>>,
    ) -> Arc<Notify> {
        let settings = self.settings;
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
        .with_egress(match egress {
            Some(Ok(e)) => Some(e.proxy.clone()),
            _ => None,
        })
        .with_models(
            matches!(egress, Some(Ok(e)) if e.models.is_some()),
            settings.budget.any(),
        )
        .with_transcripts(
            settings
                .runner
                .transcript_max_mb
                .saturating_mul(1024 * 1024),
        );
        tokio::spawn(Arc::new(watcher).run(self.shutdown.clone()));
        watcher_wake
    }

    /// Starts the executor, which performs the outbox's actions (after the start-up sweeps);
    /// returns its wake-up.
    pub(super) async fn start_executor(
        &self,
        forge: &Arc<dyn Forge>,
        bot_login: &crate::forge::BotLogin,
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
pub(super) async fn start_scans(
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
pub(super) async fn start_checks_poll(
    settings: &Settings,
    forge: &Arc<dyn crate::forge::Forge>,
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
        reverts: Some(Arc::new(crate::engine::reverts::RevertCheck {
            store: store.clone(),
            forge: forge.clone(),
            clock: clock.clone(),
            wake: consumer_wake.clone(),
        })),
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
            if let Some(reverts) = &p.reverts
                && let Err(error) = reverts.check_once().await
            {
                tracing::warn!(error = %format!("{error:#}"), "the revert check failed");
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
