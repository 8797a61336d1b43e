//! The run watcher: one task per running run waits for its container to end (or kills it at
//! `runner.timeout_secs`), reads the end of its log, redacts it, and reports the exit as an
//! event. At startup it picks up every run a previous process left running: adoption.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::run::{RESULT_MAX_BYTES, StopCause, parse_result};
use crate::domain::{RunId, RunRecord, RunState};
use crate::engine::act::run::Secrets;
use crate::event::{Event, RunReport};
use crate::runtime::{Exit, Runtime, RuntimeError, WaitLimits};
use crate::settings::RunnerSettings;
use crate::store::{NewDelivery, Store};

const IDLE_POLL: Duration = Duration::from_secs(30);

pub struct Watcher {
    store: Store,
    runtime: Arc<dyn Runtime>,
    clock: SharedClock,
    settings: RunnerSettings,
    secrets: Arc<Secrets>,
    wake: Arc<Notify>,
    consumer: Arc<Notify>,
    watched: Mutex<HashSet<RunId>>,
    /// With allow-listed runs: the egress proxy, whose refusals the report lists.
    egress: Option<Arc<crate::egress::proxy::Proxy>>,
    /// Runs call models through the metering gateway: the usage it metered is reported.
    metered: bool,
    /// ... and a budget is set: a run it refused for its budget is stopped (any replica's
    /// gateway may have refused it: the store says).
    budgets: bool,
    /// Keeps each run's transcript (`runner.transcript_max_mb` bytes; 0: none).
    transcript_bytes: u64,
}

/// How long a run's output may still arrive after it ended before its transcript is closed.
const TRANSCRIPT_DRAIN: Duration = Duration::from_secs(5);

/// How often a running run is checked for a budget stop.
const BUDGET_POLL: Duration = Duration::from_secs(2);

impl Watcher {
    pub fn new(
        store: Store,
        runtime: Arc<dyn Runtime>,
        clock: SharedClock,
        settings: RunnerSettings,
        secrets: Arc<Secrets>,
        wake: Arc<Notify>,
        consumer: Arc<Notify>,
    ) -> Self {
        Self {
            store,
            runtime,
            clock,
            settings,
            secrets,
            wake,
            consumer,
            watched: Mutex::default(),
            egress: None,
            metered: false,
            budgets: false,
            transcript_bytes: 0,
        }
    }

    /// Keeps every run's transcript, up to `max_bytes` each (the end kept).
    pub fn with_transcripts(mut self, max_bytes: u64) -> Self {
        self.transcript_bytes = max_bytes;
        self
    }

    fn recorder(&self) -> Option<crate::engine::transcript::Recorder> {
        (self.transcript_bytes > 0).then(|| crate::engine::transcript::Recorder {
            store: self.store.clone(),
            runtime: self.runtime.clone(),
            secrets: self.secrets.clone(),
            clock: self.clock.clone(),
            cap_bytes: self.transcript_bytes,
        })
    }

    /// Runs are allow-listed through `proxy`.
    pub fn with_egress(mut self, proxy: Option<Arc<crate::egress::proxy::Proxy>>) -> Self {
        self.egress = proxy;
        self
    }

    /// Runs call models through the metering gateway (`metered`), whose budget stops are
    /// followed when a budget is set (`budgets`).
    pub fn with_models(mut self, metered: bool, budgets: bool) -> Self {
        self.metered = metered;
        self.budgets = metered && budgets;
        self
    }

    /// Returns once the run is to be stopped for its budget (never, without budgets).
    async fn budget_stop(&self, run_id: &RunId) {
        if !self.budgets {
            return std::future::pending().await;
        }
        loop {
            match self.store.budget_stop(run_id).await {
                Ok(Some(_)) => return,
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), "cannot read the run's budget stop")
                }
            }
            tokio::time::sleep(BUDGET_POLL).await;
        }
    }

    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            match self.store.active_runs().await {
                Ok(runs) => {
                    for run in runs.into_iter().filter(|r| r.state == RunState::Running) {
                        self.clone().watch_once(run, shutdown.clone());
                    }
                }
                Err(e) => tracing::error!(error = %format!("{e:#}"), "cannot list running runs"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(IDLE_POLL) => {}
            }
        }
    }

    fn watch_once(self: Arc<Self>, run: RunRecord, shutdown: CancellationToken) {
        let fresh = self
            .watched
            .lock()
            .map(|mut w| w.insert(run.id.clone()))
            .unwrap_or(false);
        if !fresh {
            return;
        }
        tokio::spawn(async move {
            let span = tracing::info_span!("watch", run_id = %run.id, repo = %run.repo, issue = run.number);
            let id = run.id.clone();
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tracing::Instrument::instrument(self.watch(&run), span) => {}
            }
            if let Ok(mut w) = self.watched.lock() {
                w.remove(&id);
            }
        });
    }

    /// Waits for the run's end and reports it, retrying while the engine is unreachable.
    async fn watch(&self, run: &RunRecord) {
        loop {
            match self.wait_for_exit(run).await {
                Ok(report) => {
                    let event = NewDelivery::internal(
                        format!("exited:{}", run.id),
                        run.issue_ref(),
                        Event::Run {
                            run_id: run.id.clone(),
                            report,
                        },
                        self.clock.now_ms(),
                    );
                    match self.store.insert_deliveries(&[event]).await {
                        Ok(_) => {
                            self.consumer.notify_one();
                            return;
                        }
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "cannot record the run's exit")
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot watch the run's container; retrying"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn wait_for_exit(&self, run: &RunRecord) -> Result<RunReport, RuntimeError> {
        let container = match &run.container_id {
            Some(id) => Some(id.clone()),
            None => self
                .runtime
                .list_runs()
                .await?
                .into_iter()
                .find(|c| c.run_id == run.id)
                .map(|c| c.id),
        };
        let Some(container) = container else {
            // Gone while the director was down: judge it by its branch.
            return Ok(gone());
        };
        if !self.secrets.knows(&run.id) {
            self.learn_secrets(&run.id, &container).await?;
        }
        let limits = self.limits(run);
        // The transcript is recorded beside the wait, now that every secret of the run is
        // known to the redaction; the follower stops when this watch ends, however it ends.
        let recording = self.recorder().map(|recorder| {
            let stop = CancellationToken::new();
            let (id, container, until) = (run.id.clone(), container.clone(), stop.clone());
            let task = tokio::spawn(async move {
                if !recorder.follow(&id, &container, until).await {
                    return Some((recorder, id, container));
                }
                None
            });
            Recording {
                task,
                _guard: stop.clone().drop_guard(),
                stop,
            }
        });
        let waiting = self.runtime.wait(&container, limits);
        tokio::pin!(waiting);
        let mut over_budget = false;
        let waited = tokio::select! {
            waited = &mut waiting => waited,
            () = self.budget_stop(&run.id) => {
                over_budget = true;
                tracing::info!("the run spent its budget: stopping it with its grace");
                if let Err(e) = self.runtime.stop_gracefully(&container, limits.grace).await {
                    tracing::warn!(error = %e, "cannot stop the run; it is waited for");
                }
                waiting.await
            }
        };
        let exit = match waited {
            Ok(exit) => exit,
            Err(RuntimeError::NotFound(_)) => {
                return Ok(gone());
            }
            Err(e) => return Err(e),
        };
        // An agent that stops at the gateway's 429, as the contract asks, may exit before
        // the stop was seen: the gateway records the stop before it answers, so it is read
        // once more now, and the run ends over budget however it exited.
        if self.budgets && !over_budget {
            over_budget = self
                .store
                .budget_stop(&run.id)
                .await
                .ok()
                .flatten()
                .is_some();
        }
        if let Some(recording) = recording {
            recording.finish().await;
        }
        let (code, stopped) = match exit {
            _ if over_budget => (None, Some(StopCause::Budget)),
            Exit::Code(code) => (Some(code), None),
            Exit::TimedOut => (None, Some(StopCause::Timeout)),
            Exit::Idle => (None, Some(StopCause::Idle)),
        };
        let LeftBehind {
            log,
            result,
            egress_refused,
        } = self.left_behind(&run.id, &container).await?;
        Ok(RunReport::Exited {
            code,
            timed_out: stopped == Some(StopCause::Timeout),
            log,
            stopped,
            result,
            egress_refused,
        })
    }

    /// Adopted after a restart: what the run was given is in its environment. Until it can
    /// be read, nothing of the run's output can be redacted, so nothing is reported: the
    /// watch is tried again.
    async fn learn_secrets(&self, run_id: &RunId, container: &str) -> Result<(), RuntimeError> {
        let env = self.runtime.env(container).await?;
        for (k, v) in env {
            if k == "DIRECTOR_TOKEN" {
                self.secrets
                    .remember_token(run_id, &crate::settings::Secret::new(v));
            } else if k == crate::engine::act::run::GATEWAY_PASSWORD_VAR
                || crate::engine::act::run::MODEL_KEY_VARS.contains(&k.as_str())
            {
                self.secrets.remember(run_id, &v);
            }
        }
        if let Some(proxy) = &self.egress {
            self.secrets.remember(run_id, &proxy.password(run_id));
        }
        Ok(())
    }

    /// The rest of the run's time, its idle limit and its grace. A repository's own limit
    /// is only ever lower (checked when its file was read).
    fn limits(&self, run: &RunRecord) -> WaitLimits {
        let limit = Duration::from_secs(
            run.settings
                .as_ref()
                .and_then(|s| s.timeout_secs)
                .map_or(self.settings.timeout_secs, |t| {
                    t.min(self.settings.timeout_secs)
                }),
        );
        let elapsed_ms = run
            .started_at_ms
            .map_or(0, |s| (self.clock.now_ms() - s).max(0));
        let elapsed = Duration::from_millis(u64::try_from(elapsed_ms).unwrap_or(0));
        WaitLimits {
            timeout: limit.saturating_sub(elapsed).max(Duration::from_millis(1)),
            idle: (self.settings.idle_timeout_secs > 0)
                .then(|| Duration::from_secs(self.settings.idle_timeout_secs)),
            grace: Duration::from_secs(self.settings.stop_grace_secs),
        }
    }

    /// What an ended run left: the end of its log and its result file, both redacted, and
    /// what the egress proxy refused it.
    async fn left_behind(
        &self,
        run_id: &RunId,
        container: &str,
    ) -> Result<LeftBehind, RuntimeError> {
        let log = self
            .runtime
            .logs_tail(container, self.settings.log_tail_lines)
            .await
            .unwrap_or_default();
        let log = self.secrets.redact(run_id, &log);
        // The run's own account of itself; unreadable or absent is simply not reported.
        // An absent result file is no result; one that cannot be read is not taken for
        // absent (a run that said `blocked` would get a pull request): the watch is tried
        // again. Every text in it is redacted before it can be posted.
        let result = self
            .runtime
            .read_file(container, self.runtime.result_path(), RESULT_MAX_BYTES)
            .await?
            .and_then(|bytes| parse_result(&bytes, |text| self.secrets.redact(run_id, text)));
        let result = if self.metered {
            self.metered(run_id, result).await?
        } else {
            result
        };
        let egress_refused = match &self.egress {
            Some(proxy) => {
                proxy.flush().await;
                self.store.egress_refusals(run_id).await.unwrap_or_else(|e| {
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the run's egress refusals");
                    Vec::new()
                })
            }
            None => Vec::new(),
        };
        Ok(LeftBehind {
            log,
            result,
            egress_refused,
        })
    }
}

/// What an ended run left behind, ready to report.
struct LeftBehind {
    log: String,
    result: Option<crate::domain::run::RunResult>,
    egress_refused: Vec<(String, u64)>,
}

/// A run's transcript being recorded beside the wait for its end.
struct Recording {
    /// Gives the recorder back when the run's output ended before the follower was stopped.
    task: tokio::task::JoinHandle<Option<(crate::engine::transcript::Recorder, RunId, String)>>,
    /// Stops the follower however the watch ends.
    _guard: tokio_util::sync::DropGuard,
    stop: CancellationToken,
}

impl Recording {
    /// Waits for what the run printed last, which may still be on its way, and closes the
    /// transcript.
    async fn finish(mut self) {
        let ended = match tokio::time::timeout(TRANSCRIPT_DRAIN, &mut self.task).await {
            Ok(ended) => ended,
            Err(_) => {
                self.stop.cancel();
                (&mut self.task).await
            }
        };
        if let Ok(Some((recorder, id, container))) = ended {
            recorder.at_end(&id, &container).await;
        }
    }
}

impl Watcher {
    /// With the model gateway, the usage the director metered replaces what the run says
    /// of itself (none metered: none shown).
    async fn metered(
        &self,
        run_id: &RunId,
        result: Option<crate::domain::run::RunResult>,
    ) -> Result<Option<crate::domain::run::RunResult>, RuntimeError> {
        use crate::domain::run::{RunOutcome, RunResult, Usage};
        let metered = self
            .store
            .run_usage(run_id)
            .await
            .map_err(|e| RuntimeError::Engine(format!("the run's metered usage: {e:#}")))?
            .map(|u| Usage {
                input_tokens: Some(u.input_tokens + u.cache_read_tokens + u.cache_write_tokens),
                output_tokens: Some(u.output_tokens),
                cost_usd: u.cost_usd,
                requests: Some(u.requests),
                metered: true,
            });
        Ok(match (result, metered) {
            (Some(mut r), usage) => {
                r.usage = usage;
                Some(r)
            }
            (None, Some(usage)) => Some(RunResult {
                outcome: RunOutcome::Done,
                summary: None,
                usage: Some(usage),
            }),
            (None, None) => None,
        })
    }
}

/// The container is gone (removed while the director was down): judged by its branch.
fn gone() -> RunReport {
    RunReport::Exited {
        code: None,
        timed_out: false,
        log: String::new(),
        stopped: None,
        result: None,
        egress_refused: Vec::new(),
    }
}
