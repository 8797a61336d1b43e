//! Where coder runs execute. [`Runtime`] covers what the director does with a run's
//! container; [`docker::DockerRuntime`] implements it over the Docker Engine API (bollard),
//! and the test kit (`director-testkit`) has `FakeRuntime`, in memory, for tests.

pub mod docker;
pub mod docker_workspace;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod mounts;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::domain::RunId;

/// The label every run container carries.
pub const RUN_LABEL: &str = "director.run-id";

/// Where a run may leave its result file (`DIRECTOR_RESULT_FILE`) on Docker: beside the
/// task, in the container's own volume, so it outlives the container's end.
pub const RESULT_PATH: &str = "/task/result/result.json";

/// Every run's writable temporary directory (a tmpfs on Docker, a memory `emptyDir` on
/// Kubernetes), also its `TMPDIR`.
pub const TMP_DIR: &str = "/tmp";

/// Everything needed to create one run's container.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Also the container's name suffix: one run id, one container.
    pub run_id: RunId,
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub labels: HashMap<String, String>,
    /// Where the task file is copied before start, and its contents.
    pub task_path: String,
    pub task: Vec<u8>,
    /// Bind mounts already translated to host paths: (source, target, read_only).
    pub mounts: Vec<(String, String, bool)>,
    /// Where the run may leave its result file (a writable directory beside the task file,
    /// kept after the container ends so the director can read it).
    pub result_path: Option<String>,
    /// The run may reach only the egress proxy (`runner.egress = "allowlist"`): on Docker
    /// its container joins the internal `runner.egress_network`; on Kubernetes its pod gets
    /// a NetworkPolicy.
    pub confined: bool,
    /// The workspace is this volume, prepared by a setup phase ([`Runtime::make_workspace`]),
    /// instead of an empty tmpfs.
    pub workspace_volume: Option<String>,
    /// This is the run's setup phase, not its agent: its container is named and labelled
    /// apart (`<run container>-setup`, `director.setup-of`), so nothing takes it for the run.
    pub setup_phase: bool,
}

/// The container name of a run: the engine refuses a second container with the same name,
/// so one run id can never get two containers.
pub fn container_name(run_id: &RunId) -> String {
    format!("director-run-{run_id}")
}

/// Whether runs can start, as last seen: `ok`, `disabled`, or `unavailable: <why>`; for
/// `/readyz` and the metrics.
#[derive(Clone, Debug)]
pub struct Health(std::sync::Arc<std::sync::RwLock<String>>);

impl Health {
    pub fn new(said: &str) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(said.to_owned())))
    }

    pub fn set(&self, said: &str) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = said.to_owned();
    }

    pub fn get(&self) -> String {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The label a run's setup container carries (never [`RUN_LABEL`]).
pub const SETUP_LABEL: &str = "director.setup-of";

/// The label a container carries that must have no network at all (a check of a run's
/// head: `network_mode: none`, whatever `confined` says). Its value is the run's id.
pub const SEALED_LABEL: &str = "director.sealed";

/// A workspace as a tar stream, in chunks.
pub type TarStream = futures_util::stream::BoxStream<'static, Result<bytes::Bytes, RuntimeError>>;

/// How long a run may go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitLimits {
    /// From now: the rest of `runner.timeout_secs`.
    pub timeout: Duration,
    /// Without output for this long, the run is wedged.
    pub idle: Option<Duration>,
    /// Between the stop signal and the kill.
    pub grace: Duration,
}

/// The two limits of a run being waited for: the wall clock, and silence once its output is
/// followed. Both runtimes wait on [`Watchdog::wake`] beside the run's own events.
#[derive(Debug)]
pub struct Watchdog {
    deadline: tokio::time::Instant,
    idle: Option<Duration>,
    last_output: tokio::time::Instant,
}

impl Watchdog {
    pub fn new(limits: &WaitLimits) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            deadline: now + limits.timeout,
            idle: limits.idle,
            last_output: now,
        }
    }

    /// The run printed something.
    pub fn output(&mut self) {
        self.last_output = tokio::time::Instant::now();
    }

    /// When a limit passes: the deadline, or the idle limit when `following` output.
    pub fn wake(&self, following: bool) -> tokio::time::Instant {
        match self.idle.filter(|_| following) {
            Some(d) => (self.last_output + d).min(self.deadline),
            None => self.deadline,
        }
    }

    /// Which limit passed, once [`Watchdog::wake`] came.
    pub fn cause(&self) -> Exit {
        if tokio::time::Instant::now() >= self.deadline {
            Exit::TimedOut
        } else {
            Exit::Idle
        }
    }
}

/// A piece of a run's output, and the runtime's position after it (to continue from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub bytes: Vec<u8>,
    pub mark: Option<String>,
}

/// A run's output as it arrives.
pub type OutputStream = futures_util::stream::BoxStream<'static, Result<Output, RuntimeError>>;

/// A container the runtime found that belongs to a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunContainer {
    pub id: String,
    pub run_id: RunId,
    pub running: bool,
    /// Created and never started.
    pub never_started: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i64),
    /// Stopped at the wall-clock limit (a stop signal, the grace, then a kill).
    TimedOut,
    /// Stopped the same way after printing nothing for the idle limit.
    Idle,
}

/// Where the egress proxy must listen for confined runs to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressPoint {
    /// The address to bind.
    pub listen: std::net::IpAddr,
    /// The name or address runs reach it by.
    pub host: String,
    /// Docker, the director on the engine's host: the host's interface of the runs' network
    /// (its bridge), which `runner.host_firewall` filters. `None` in a container or a cluster.
    pub bridge: Option<String>,
    /// Whether the runs' network has IPv6 addresses (`runner.host_firewall` covers IPv4).
    pub ipv6: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the container engine is unavailable: {0}")]
    Unavailable(String),
    #[error("a container for run {0} already exists")]
    Exists(RunId),
    #[error("no container {0}")]
    NotFound(String),
    #[error("container engine: {0}")]
    Engine(String),
    /// The image cannot run the command at all (no such program, no shell for a script):
    /// no retry changes that.
    #[error("the image cannot start its command: {0}")]
    CannotExec(String),
}

/// What the run contract needs of an image, said when one cannot start its command.
pub const IMAGE_NEEDS: &str = "a run's image needs its command (or entry point) and, for the example entrypoint, a POSIX shell at /bin/sh and git (docs/run-contract.md)";

#[async_trait]
pub trait Runtime: Send + Sync {
    /// Where a run of this runtime leaves its result file, for `DIRECTOR_RESULT_FILE` and
    /// [`Runtime::read_file`].
    fn result_path(&self) -> &'static str {
        RESULT_PATH
    }
    /// Whether runs can be started now; `Err` says why not (for `/readyz` and the metrics).
    async fn check(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Makes ready what confined runs need (Docker: the internal network) and says where
    /// the egress proxy must listen.
    async fn prepare_egress(&self, port: u16) -> Result<EgressPoint, RuntimeError> {
        let _ = port;
        Err(RuntimeError::Engine(
            "this runtime cannot confine runs to the egress proxy".into(),
        ))
    }
    /// Whether a setup phase can prepare a run's workspace apart from the run, with the
    /// workspace searched for the setup's secrets before the agent starts (Docker: yes).
    fn prepares_workspaces(&self) -> bool {
        false
    }
    /// Makes the volume a prepared run's workspace lives in, empty and owned by the run's
    /// user (`image`: the run's image, for a container that is never started and sets the
    /// owner); one left by an earlier attempt is removed first. Returns its name.
    async fn make_workspace(&self, run_id: &RunId, image: &str) -> Result<String, RuntimeError> {
        let _ = (run_id, image);
        Err(RuntimeError::Engine(
            "this runtime cannot prepare a workspace apart from the run".into(),
        ))
    }
    /// Removes a run's workspace volume, and a setup container left with it; gone is fine.
    async fn remove_workspace(&self, run_id: &RunId) -> Result<(), RuntimeError> {
        let _ = run_id;
        Ok(())
    }
    /// The runs that have a prepared workspace (or a setup container) left on the engine.
    async fn list_workspaces(&self) -> Result<Vec<RunId>, RuntimeError> {
        Ok(Vec::new())
    }
    /// The workspace of an (ended) container as a tar stream, each entry under the
    /// workspace's own directory name.
    async fn export_workspace(&self, id: &str) -> Result<TarStream, RuntimeError> {
        let _ = id;
        Err(RuntimeError::Engine(
            "this runtime cannot export a workspace".into(),
        ))
    }
    /// Unpacks `tar` (entries relative to the workspace) into a created container's
    /// workspace volume, owners as the archive says.
    async fn import_workspace(&self, id: &str, tar: TarStream) -> Result<(), RuntimeError> {
        let _ = (id, tar);
        Err(RuntimeError::Engine(
            "this runtime cannot import a workspace".into(),
        ))
    }
    /// What identifies the image's contents (Docker: its id, a digest); the name itself when
    /// the runtime cannot say.
    async fn image_id(&self, image: &str) -> Result<String, RuntimeError> {
        Ok(image.to_owned())
    }
    /// Creates the container (not started) and copies the task file in; returns its id.
    async fn create(&self, spec: &RunSpec) -> Result<String, RuntimeError>;
    async fn start(&self, id: &str) -> Result<(), RuntimeError>;
    /// Waits for the container to exit. When a limit passes first it gets a stop signal and
    /// `limits.grace` to end (to push what it has), then it is killed.
    async fn wait(&self, id: &str, limits: WaitLimits) -> Result<Exit, RuntimeError>;
    /// The file at `path` in the (possibly ended) container, when it exists and is at most
    /// `max_bytes` long; `Ok(None)` otherwise.
    /// Whether a created container holds its task at `path`. Docker copies the task in after
    /// creating the container, and a copy that failed (with a clean-up that failed too) leaves
    /// one without; a runtime that creates the task with the run has it.
    async fn has_task(&self, _id: &str, _path: &str) -> Result<bool, RuntimeError> {
        Ok(true)
    }
    async fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, RuntimeError>;
    /// The last `lines` lines of output (stdout and stderr).
    async fn logs_tail(&self, id: &str, lines: usize) -> Result<String, RuntimeError>;
    /// The run's output as it arrives, from after `after` (a mark an earlier [`Output`]
    /// carried; from its start when `None`), until the run ends. `None`: this runtime cannot
    /// follow output, and the transcript is read at the end instead.
    async fn follow_output(
        &self,
        _id: &str,
        _after: Option<&str>,
    ) -> Result<Option<OutputStream>, RuntimeError> {
        Ok(None)
    }
    /// Stops the container now.
    async fn kill(&self, id: &str) -> Result<(), RuntimeError>;
    /// Sends the container the stop signal and gives it `grace` to end before the kill, while
    /// [`Runtime::wait`] goes on waiting for it. A runtime that cannot signal kills.
    async fn stop_gracefully(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let _ = grace;
        self.kill(id).await
    }
    /// Removes the container and its anonymous volumes; gone already is fine.
    async fn remove(&self, id: &str) -> Result<(), RuntimeError>;
    /// Every container labelled as a director run.
    async fn list_runs(&self) -> Result<Vec<RunContainer>, RuntimeError>;
    /// The container's environment, so that values given to a run before a restart can still
    /// be redacted from its log.
    async fn env(&self, id: &str) -> Result<Vec<(String, String)>, RuntimeError>;
}

/// A line of a log stream with timestamps (Docker's, the kubelet's): the timestamp (RFC 3339, as
/// the engine wrote it), and the text after it.
pub(crate) fn split_timestamp(line: &[u8]) -> Option<(&str, &[u8])> {
    let space = line.iter().take(40).position(|b| *b == b' ')?;
    let at = std::str::from_utf8(&line[..space]).ok()?;
    at.starts_with(|c: char| c.is_ascii_digit())
        .then_some((at, &line[space + 1..]))
}

/// A line of a log stream with timestamps as [`Output`], its timestamp its mark; `None` for
/// a line without one, or one not after `after` (seen before a restart). Timestamps are
/// parsed only for that.
pub(crate) fn timestamped(
    line: &[u8],
    after: Option<chrono::DateTime<chrono::FixedOffset>>,
) -> Option<Output> {
    let (at, text) = split_timestamp(line)?;
    let seen =
        after.is_some_and(|a| chrono::DateTime::parse_from_rfc3339(at).is_ok_and(|at| at <= a));
    (!seen).then(|| Output {
        bytes: text.to_vec(),
        mark: Some(at.to_owned()),
    })
}
