//! The Kubernetes implementation of [`Runtime`], over kube: one Job per run in
//! `kubernetes.namespace`, named `director-run-<run id>` (the API server refuses a second
//! object of that name, so one run id never gets two Jobs).
//!
//! - The Job is created suspended (Docker's "created, not started"), and started by lifting
//!   the suspension; `backoffLimit: 0`, so a failed pod is the run's end, never a retry.
//! - Nothing secret is a literal value in the Job: the run's environment (its token among it)
//!   and its task file are in a Secret of the same name, which the pod reads through
//!   `secretKeyRef`s and a volume, and which the Job owns (deleted with it).
//! - The pod is hardened as a Docker run is: a numeric non-root user, no privilege
//!   escalation, every capability dropped, a read-only root filesystem, seccomp
//!   `RuntimeDefault`, an `emptyDir` workspace, resource limits, no service account token,
//!   no service links.
//! - A run's end is watched (a watch on the Job and its pods, no polling); the result file is
//!   the container's termination message (`/dev/termination-log`: Kubernetes keeps up to
//!   4 KiB of it after the pod ends).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{AsyncBufReadExt as _, StreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use kube::{Client, Config};
use serde_json::json;

mod spec;
mod status;
use status::*;

use super::{
    EgressPoint, Exit, RUN_LABEL, RunContainer, RunSpec, Runtime, RuntimeError, WaitLimits,
    Watchdog,
};
use crate::domain::RunId;
use crate::settings::{KubernetesSettings, RunnerSettings};

/// Where a Kubernetes run leaves its result: its container's termination message file, which
/// the kubelet makes writable whatever the user and keeps (up to 4 KiB) after the pod ends.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// The run's container in its pod.
const CONTAINER: &str = "agent";
/// The Secret's key holding the task file.
const TASK_KEY: &str = "task.md";

/// The Job (and Secret) name of a run.
pub fn job_name(run_id: &RunId) -> String {
    format!("director-run-{run_id}")
}

/// `value` as a label value: at most 63 characters of `[A-Za-z0-9._-]`, beginning and ending
/// with a letter or digit (`owner/name` becomes `owner.name`).
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '.'
            }
        })
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_owned()
    };
    let mut out = trim(&mapped);
    if out.len() > 63 {
        out.truncate(63);
        out = trim(&out);
    }
    out
}

pub struct KubeRuntime {
    client: Client,
    namespace: String,
    runner: RunnerSettings,
    settings: KubernetesSettings,
    /// Log tails read just before a pod was deleted (a stop at a limit), since the pod's log
    /// goes with it.
    kept_logs: Mutex<HashMap<String, String>>,
}

fn api_error(e: kube::Error) -> RuntimeError {
    match e {
        kube::Error::Api(r) if r.code == 404 => RuntimeError::NotFound(r.message),
        kube::Error::Api(r) => RuntimeError::Engine(format!(
            "the Kubernetes API answered {}: {}",
            r.code, r.message
        )),
        e => RuntimeError::Unavailable(format!("the Kubernetes API: {e}")),
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == code)
}

/// Deletion that tolerates what is already gone.
fn gone_ok<T>(r: Result<T, kube::Error>) -> Result<(), RuntimeError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 404) => Ok(()),
        Err(e) => Err(api_error(e)),
    }
}

/// Creates `object`, replacing one of the same name an earlier attempt left (its Job is
/// gone, or this one is new): never reused.
async fn created_anew<K>(api: &Api<K>, name: &str, object: &K) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Err(e) if is_code(&e, 409) => {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_code(&e, 404) => {}
                Err(e) => return Err(e),
            }
            api.create(&PostParams::default(), object).await
        }
        other => other,
    }
}

/// How long following a run's log waits for its container to start.
const FOLLOW_START_WAIT: Duration = Duration::from_secs(300);

impl KubeRuntime {
    /// A client from `kubernetes.kubeconfig`, else the in-cluster configuration, else the
    /// file `KUBECONFIG` names. Nothing is asked of the API server here: see [`Runtime::check`].
    pub async fn connect(
        runner: RunnerSettings,
        settings: KubernetesSettings,
    ) -> Result<Self, RuntimeError> {
        let unavailable = |e: String| RuntimeError::Unavailable(e);
        let mut config = if !settings.kubeconfig.is_empty() {
            let file = kube::config::Kubeconfig::read_from(&settings.kubeconfig)
                .map_err(|e| unavailable(format!("kubernetes.kubeconfig: {e}")))?;
            Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| unavailable(format!("kubernetes.kubeconfig: {e}")))?
        } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            Config::incluster()
                .map_err(|e| unavailable(format!("in-cluster configuration: {e}")))?
        } else if std::env::var_os("KUBECONFIG").is_some() {
            Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| unavailable(format!("KUBECONFIG: {e}")))?
        } else {
            return Err(unavailable(
                "no Kubernetes configuration: not in a cluster, and neither kubernetes.kubeconfig nor KUBECONFIG is set".into(),
            ));
        };
        config.connect_timeout = Some(Duration::from_secs(10));
        config.default_namespace = settings.namespace.clone();
        let client = Client::try_from(config)
            .map_err(|e| unavailable(format!("the Kubernetes client: {e}")))?;
        Ok(Self {
            client,
            namespace: settings.namespace.clone(),
            runner,
            settings,
            kept_logs: Mutex::default(),
        })
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn confined(&self) -> bool {
        self.runner.egress == crate::settings::Egress::Allowlist
    }

    /// The run's pods, newest first.
    async fn pods_of(&self, job: &str) -> Result<Vec<Pod>, RuntimeError> {
        let Some(run_id) = job.strip_prefix("director-run-") else {
            return Ok(Vec::new());
        };
        let mut pods = self
            .pods()
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={run_id}")))
            .await
            .map_err(api_error)?
            .items;
        pods.sort_by(|a, b| {
            b.metadata
                .creation_timestamp
                .cmp(&a.metadata.creation_timestamp)
        });
        Ok(pods)
    }

    fn pod_name(pod: &Pod) -> String {
        pod.metadata.name.clone().unwrap_or_default()
    }

    /// Stops the run at a limit: its log tail is kept, then its pods are deleted with
    /// `grace` between the stop signal and the kill, and the Job is suspended so that nothing
    /// replaces them.
    async fn stop(&self, job: &str, grace: Duration) -> Result<(), RuntimeError> {
        if let Ok(tail) = self.logs_tail(job, self.runner.log_tail_lines).await
            && let Ok(mut kept) = self.kept_logs.lock()
        {
            kept.insert(job.to_owned(), tail);
        }
        let grace = u32::try_from(grace.as_secs()).unwrap_or(u32::MAX);
        for pod in self.pods_of(job).await? {
            gone_ok(
                self.pods()
                    .delete(
                        &Self::pod_name(&pod),
                        &DeleteParams {
                            grace_period_seconds: Some(grace),
                            ..DeleteParams::default()
                        },
                    )
                    .await,
            )?;
        }
        gone_ok(
            self.jobs()
                .patch(
                    job,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "suspend": true } })),
                )
                .await,
        )?;
        Ok(())
    }

    /// The exit code of the run's newest pod, once it has one.
    async fn final_code(&self, job: &str) -> Result<Option<i64>, RuntimeError> {
        Ok(self.pods_of(job).await?.iter().find_map(exit_code))
    }
}

#[async_trait]
impl Runtime for KubeRuntime {
    fn result_path(&self) -> &'static str {
        TERMINATION_LOG
    }

    /// A dry-run creation of a Job and a Secret in the namespace, and a listing of the runs:
    /// a missing namespace, RBAC that forbids any of them, or an unreachable API server is
    /// told here, before a run needs it.
    async fn check(&self) -> Result<(), RuntimeError> {
        let probe = RunSpec {
            // A dry run creates nothing: any well-formed id does.
            run_id: RunId::random(),
            image: if self.runner.image.is_empty() {
                "probe".into()
            } else {
                self.runner.image.clone()
            },
            command: Vec::new(),
            env: Vec::new(),
            labels: HashMap::new(),
            task_path: "/task/task.md".into(),
            task: Vec::new(),
            mounts: Vec::new(),
            result_path: None,
            confined: false,
            workspace_volume: None,
            setup_phase: false,
        };
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        self.jobs()
            .create(&dry, &self.job(&probe)?)
            .await
            .map_err(|e| described(e, "create Jobs"))?;
        let mut secret = self.secret(&probe, "00000000-0000-0000-0000-000000000000")?;
        secret.metadata.owner_references = None;
        self.secrets()
            .create(&dry, &secret)
            .await
            .map_err(|e| described(e, "create Secrets"))?;
        if self.confined() {
            let mut policy = self.network_policy(&probe, "00000000-0000-0000-0000-000000000000")?;
            policy.metadata.owner_references = None;
            self.policies()
                .create(&dry, &policy)
                .await
                .map_err(|e| described(e, "create NetworkPolicies"))?;
        }
        self.jobs()
            .list(&ListParams::default().labels(RUN_LABEL).limit(1))
            .await
            .map_err(|e| described(e, "list Jobs"))?;
        Ok(())
    }

    /// The proxy listens on every address of the director's pod; runs reach it by
    /// `kubernetes.proxy_host` (its Service), and only it (their NetworkPolicy).
    /// Runs have no DNS, so they are given the proxy's address: `kubernetes.proxy_host`
    /// (its Service) resolved here, by the director's own resolver.
    async fn prepare_egress(&self, port: u16) -> Result<EgressPoint, RuntimeError> {
        Ok(EgressPoint {
            listen: std::net::Ipv4Addr::UNSPECIFIED.into(),
            host: proxy_address(&self.settings.proxy_host, port).await?,
            bridge: None,
            ipv6: false,
        })
    }

    async fn create(&self, spec: &RunSpec) -> Result<String, RuntimeError> {
        let name = job_name(&spec.run_id);
        let job = match self
            .jobs()
            .create(&PostParams::default(), &self.job(spec)?)
            .await
        {
            Ok(job) => job,
            // The name is the run id: a Job of this run exists already (an earlier attempt's).
            Err(e) if is_code(&e, 409) => return Err(RuntimeError::Exists(spec.run_id.clone())),
            Err(e) => return Err(api_error(e)),
        };
        let uid = job.metadata.uid.clone().unwrap_or_default();
        // Whatever of the run cannot be made takes the Job down with it: nothing half-made
        // is ever started.
        let made = async {
            created_anew(&self.secrets(), &name, &self.secret(spec, &uid)?)
                .await
                .map_err(|e| described(e, "create Secrets"))?;
            // A confined run's pod never runs without its NetworkPolicy: made before the start.
            if spec.confined {
                created_anew(&self.policies(), &name, &self.network_policy(spec, &uid)?)
                    .await
                    .map_err(|e| described(e, "create NetworkPolicies"))?;
            }
            Ok::<(), RuntimeError>(())
        }
        .await;
        if let Err(e) = made {
            // If the clean-up fails too, the Job stays suspended: `start` refuses to lift the
            // suspension of a run whose Secret or NetworkPolicy is missing.
            if let Err(cleanup) = self.remove(&name).await {
                tracing::error!(
                    job = %name,
                    error = %cleanup,
                    "cannot remove a half-made run; it stays suspended and will not be started"
                );
                return Err(RuntimeError::Engine(format!(
                    "{e}; removing the half-made Job also failed: {cleanup}"
                )));
            }
            return Err(e);
        }
        Ok(name)
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        // An earlier attempt may have died between the Job and its Secret: the pod would wait
        // for the Secret for good.
        match self.secrets().get_opt(id).await.map_err(api_error)? {
            Some(_) => {}
            None => {
                return Err(RuntimeError::Engine(format!(
                    "the run's Secret {id} is missing (an earlier attempt stopped between creating the Job and its Secret)"
                )));
            }
        }
        // Nor may a confined run's pod ever run without its NetworkPolicy: an earlier attempt
        // may have died between the Secret and the policy, or failed to clean up after a
        // policy that could not be made. Checked here, where the suspension is lifted.
        if self.confined() {
            let run_id = id.strip_prefix("director-run-").unwrap_or(id);
            let policy = self.policies().get_opt(id).await.map_err(api_error)?;
            let selects_the_run = policy
                .as_ref()
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.pod_selector.as_ref())
                .and_then(|s| s.match_labels.as_ref())
                .and_then(|l| l.get(RUN_LABEL))
                .is_some_and(|v| *v == label_value(run_id));
            if !selects_the_run {
                return Err(RuntimeError::Engine(format!(
                    "the run's NetworkPolicy {id} is missing or does not select its pod: a confined run is never started without it"
                )));
            }
        }
        self.jobs()
            .patch(
                id,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "suspend": false } })),
            )
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn wait(&self, id: &str, limits: WaitLimits) -> Result<Exit, RuntimeError> {
        let run_id = id.strip_prefix("director-run-").unwrap_or(id).to_owned();
        let mut watchdog = Watchdog::new(&limits);
        // Reconnects back off: an API server that is down is not asked in a tight loop.
        let mut job_events =
            std::pin::pin!(kube::runtime::watcher::watch_object(self.jobs(), id).default_backoff());
        let mut pod_events = std::pin::pin!(
            watcher(
                self.pods(),
                watcher::Config::default().labels(&format!("{RUN_LABEL}={run_id}")),
            )
            .default_backoff()
            .applied_objects()
        );
        // Output since the pod started, to tell a run that works from one that is wedged.
        let mut output: Option<futures_util::stream::BoxStream<'static, ()>> = None;
        let mut following: Option<String> = None;
        let mut seen_job = false;
        let cause = loop {
            let wake = watchdog.wake(following.is_some());
            tokio::select! {
                event = job_events.next() => match event {
                    Some(Ok(Some(job))) => {
                        seen_job = true;
                        match job_end(&job) {
                            Some(JobEnd::DeadlineExceeded) => return Ok(Exit::TimedOut),
                            Some(JobEnd::Complete) => {
                                return Ok(Exit::Code(self.final_code(id).await?.unwrap_or(0)));
                            }
                            Some(JobEnd::Failed) => {
                                return Ok(Exit::Code(self.final_code(id).await?.unwrap_or(-1)));
                            }
                            None => {}
                        }
                    }
                    Some(Ok(None)) => {
                        return Err(RuntimeError::NotFound(format!("the Job {id} was deleted")));
                    }
                    Some(Err(e)) if !seen_job => {
                        return Err(RuntimeError::Unavailable(format!("watching the Job {id}: {e}")));
                    }
                    // The watch reconnects by itself; an error in between is not the run's end.
                    Some(Err(e)) => tracing::debug!(error = %e, "the Job watch was interrupted"),
                    None => return Err(RuntimeError::Engine("the Job watch ended".into())),
                },
                pod = pod_events.next() => {
                    if let Some(Ok(pod)) = pod {
                        if let Some(why) = stuck(&pod) {
                            tracing::warn!(job = %id, %why, "the run's pod cannot start");
                            if let Ok(mut kept) = self.kept_logs.lock() {
                                kept.insert(id.to_owned(), format!("the run's pod could not start: {why}"));
                            }
                            self.kill(id).await?;
                            return Ok(Exit::Code(-1));
                        }
                        let name = Self::pod_name(&pod);
                        if limits.idle.is_some() && running(&pod) && following.as_deref() != Some(&name) {
                            let params = LogParams {
                                container: Some(CONTAINER.into()),
                                follow: true,
                                tail_lines: Some(0),
                                ..LogParams::default()
                            };
                            if let Ok(stream) = self.pods().log_stream(&name, &params).await {
                                output = Some(stream.lines().map(|_| ()).boxed());
                                following = Some(name);
                                watchdog.output();
                            }
                        }
                    }
                }
                chunk = async { output.as_mut()?.next().await }, if output.is_some() => {
                    match chunk {
                        Some(()) => watchdog.output(),
                        // The log stream ended: only the wall clock counts now.
                        None => output = None,
                    }
                }
                _ = tokio::time::sleep_until(wake) => break watchdog.cause(),
            }
        };
        self.stop(id, limits.grace).await?;
        Ok(cause)
    }

    async fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, RuntimeError> {
        if path != TERMINATION_LOG {
            // An ended pod's files are gone; only its termination message is kept.
            return Ok(None);
        }
        let message = self.pods_of(id).await?.iter().find_map(|pod| {
            agent_status(pod)?
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .message
                .clone()
        });
        Ok(message
            .map(String::into_bytes)
            .filter(|m| !m.is_empty() && m.len() <= max_bytes))
    }

    /// The pod's log, followed with the kubelet's timestamps from the container's start (or,
    /// after a restart, from the mark: a timestamp, lines not after it skipped), once the
    /// container has started. `None` (the log is read at the end instead) when it never
    /// starts within [`FOLLOW_START_WAIT`] or the log cannot be followed.
    async fn follow_output(
        &self,
        id: &str,
        after: Option<&str>,
    ) -> Result<Option<super::OutputStream>, RuntimeError> {
        let deadline = tokio::time::Instant::now() + FOLLOW_START_WAIT;
        let name = loop {
            if let Some(pod) = self.pods_of(id).await?.into_iter().next() {
                if stuck(&pod).is_some() {
                    return Ok(None);
                }
                let started = agent_status(&pod)
                    .and_then(|s| s.state.as_ref())
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some());
                if started {
                    break Self::pod_name(&pod);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let after = after.and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok());
        let params = LogParams {
            container: Some(CONTAINER.into()),
            follow: true,
            timestamps: true,
            since_time: after.map(|a| a.with_timezone(&chrono::Utc)),
            ..LogParams::default()
        };
        let reader = match self.pods().log_stream(&name, &params).await {
            Ok(reader) => Box::pin(reader),
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow the run's log; it is read at its end");
                return Ok(None);
            }
        };
        let lines = futures_util::stream::unfold(Some(reader), |reader| async move {
            let mut reader = reader?;
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) => None,
                Ok(_) => Some((Ok(line), Some(reader))),
                // Said once, then the stream ends.
                Err(e) => Some((Err(RuntimeError::Engine(e.to_string())), None)),
            }
        });
        let stream = lines
            .filter_map(move |line| {
                let out = match line {
                    Err(e) => Some(Err(e)),
                    Ok(line) => super::timestamped(&line, after).map(Ok),
                };
                std::future::ready(out)
            })
            .boxed();
        Ok(Some(stream))
    }

    async fn logs_tail(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        let kept = self.kept_logs.lock().ok().and_then(|k| k.get(id).cloned());
        let Some(pod) = self.pods_of(id).await?.into_iter().next() else {
            return Ok(kept.unwrap_or_default());
        };
        let params = LogParams {
            container: Some(CONTAINER.into()),
            tail_lines: Some(i64::try_from(lines).unwrap_or(i64::MAX)),
            ..LogParams::default()
        };
        match self.pods().logs(&Self::pod_name(&pod), &params).await {
            Ok(log) => Ok(log),
            Err(e) => match kept {
                Some(k) => Ok(k),
                None => match stuck(&pod) {
                    Some(why) => Ok(format!("the run's pod could not start: {why}")),
                    None => Err(api_error(e)),
                },
            },
        }
    }

    /// Cancel: the run stops acting at once. Its pods are deleted first with no grace (the
    /// garbage collector would give a pod collected with its Job the pod's own grace period,
    /// and the agent would run on meanwhile); then the Job, in the foreground, and its Secret.
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for pod in self.pods_of(id).await? {
            gone_ok(self.pods().delete(&Self::pod_name(&pod), &now).await)?;
        }
        gone_ok(
            self.jobs()
                .delete(
                    id,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::foreground()
                    },
                )
                .await,
        )?;
        gone_ok(self.secrets().delete(id, &now).await)
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        gone_ok(self.jobs().delete(id, &DeleteParams::background()).await)?;
        gone_ok(self.secrets().delete(id, &DeleteParams::default()).await)?;
        if self.confined() {
            gone_ok(self.policies().delete(id, &DeleteParams::default()).await)?;
        }
        if let Ok(mut kept) = self.kept_logs.lock() {
            kept.remove(id);
        }
        Ok(())
    }

    async fn list_runs(&self) -> Result<Vec<RunContainer>, RuntimeError> {
        let jobs = self
            .jobs()
            .list(&ListParams::default().labels(RUN_LABEL))
            .await
            .map_err(api_error)?;
        Ok(jobs
            .items
            .into_iter()
            .filter_map(|job| {
                let run_id = RunId::parse(job.metadata.labels.as_ref()?.get(RUN_LABEL)?).ok()?;
                let name = job.metadata.name.clone()?;
                // Only the director's own naming: a Job someone labelled by hand is not a run.
                (name == job_name(&run_id)).then(|| RunContainer {
                    running: !job_suspended(&job) && job_end(&job).is_none(),
                    never_started: job_never_started(&job),
                    id: name,
                    run_id,
                })
            })
            .collect())
    }

    /// What the run was given: its Secret's variables (the task file left out).
    async fn env(&self, id: &str) -> Result<Vec<(String, String)>, RuntimeError> {
        let Some(secret) = self.secrets().get_opt(id).await.map_err(api_error)? else {
            return Ok(Vec::new());
        };
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != TASK_KEY)
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }
}

/// An API error told as what the director could not do.
/// `host` as an address a run can use without DNS: an IP literal as it is, a name resolved
/// (an IPv4 address first, which every cluster network has).
async fn proxy_address(host: &str, port: u16) -> Result<String, RuntimeError> {
    let host = host.trim();
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        return Ok(bracketed(ip));
    }
    let found: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| {
            RuntimeError::Engine(format!(
                "kubernetes.proxy_host {host} does not resolve here ({e}): runs have no DNS and are given its address"
            ))
        })?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .map(|a| bracketed(a.ip()))
        .ok_or_else(|| RuntimeError::Engine(format!("kubernetes.proxy_host {host} has no address")))
}

fn bracketed(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn described(e: kube::Error, what: &str) -> RuntimeError {
    match &e {
        kube::Error::Api(r) if r.code == 403 => RuntimeError::Engine(format!(
            "the director may not {what} in its runs namespace (RBAC): {}",
            r.message
        )),
        kube::Error::Api(r) if r.code == 404 => RuntimeError::Engine(format!(
            "cannot {what}: {} (does the runs namespace exist?)",
            r.message
        )),
        _ => api_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_label_safe() {
        assert_eq!(label_value("owner/name"), "owner.name");
        assert_eq!(label_value("-a b-"), "a.b");
        assert_eq!(label_value("_x_"), "x");
        let long = "a/".repeat(60);
        let v = label_value(&long);
        assert!(v.len() <= 63, "{v}");
        assert!(v.ends_with('a'));
        assert_eq!(label_value("///"), "");
    }
}
