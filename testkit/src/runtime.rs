//! A stateful, in-memory [`Runtime`] for tests: containers are created, started, exit when the
//! test (or a behaviour it installs) says so, time out, and are killed and removed, with every
//! creation and start counted per run id. No Docker needed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use tokio::sync::Notify;

use director::domain::RunId;
use director::runtime::{
    Exit, Output, OutputStream, RUN_LABEL, RunContainer, RunSpec, Runtime, RuntimeError, WaitLimits,
};
use futures_util::StreamExt as _;

/// What a started container does: given its spec, it ends with (exit code, output).
pub type Behaviour = Arc<dyn Fn(RunSpec) -> BoxFuture<'static, (i64, String)> + Send + Sync>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Status {
    Created,
    Running,
    Exited(i64),
}

struct Container {
    run_id: RunId,
    spec: RunSpec,
    /// The task was put in place.
    has_task: bool,
    status: Status,
    log: String,
    /// Files the run left (its result file), by path.
    files: HashMap<String, Vec<u8>>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    containers: BTreeMap<String, Container>,
    creations: HashMap<RunId, u32>,
    starts: HashMap<RunId, u32>,
    /// Every run's spec, kept after its container is removed.
    specs: HashMap<RunId, RunSpec>,
    unavailable: bool,
    /// The next reads of a file fail as if the engine had dropped the connection.
    failing_reads: u32,
    /// The next creations leave a container without its task and fail (as Docker's copy of
    /// the task failing, with a clean-up that failed too).
    failing_task_copies: u32,
    /// The next creations panic (a bug in a runtime).
    panicking_creates: u32,
    behaviour: Option<Behaviour>,
}

#[derive(Clone, Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// What every container does once started (default: run until [`FakeRuntime::exit`]).
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        self.with(|s| s.behaviour = Some(behaviour));
    }

    /// Makes every call fail as if the engine were down (or brings it back).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.with(|s| s.unavailable = unavailable);
    }

    /// The next `count` creations panic, as a bug in a runtime would.
    pub fn panic_on_create(&self, count: u32) {
        self.with(|s| s.panicking_creates += count);
    }

    /// The next `count` creations leave their container without its task and fail.
    pub fn fail_task_copies(&self, count: u32) {
        self.with(|s| s.failing_task_copies += count);
    }

    /// The next `count` reads of a file from a container fail (the engine dropped them).
    pub fn fail_reads(&self, count: u32) {
        self.with(|s| s.failing_reads += count);
    }

    /// Ends the run's running container with `code`, `log` its last output.
    pub fn exit(&self, run_id: &RunId, code: i64, log: &str) {
        self.with(|s| {
            for c in s.containers.values_mut() {
                if &c.run_id == run_id && c.status == Status::Running {
                    c.status = Status::Exited(code);
                    c.log.push_str(log);
                }
            }
        });
        self.changed.notify_waiters();
    }

    /// The run's running container prints `text`.
    pub fn print(&self, run_id: &RunId, text: &str) {
        self.with(|s| {
            for c in s.containers.values_mut() {
                if &c.run_id == run_id && c.status == Status::Running {
                    c.log.push_str(text);
                }
            }
        });
        self.changed.notify_waiters();
    }

    /// Leaves a file in the run's container (as its agent would write its result file).
    pub fn put_file(&self, run_id: &RunId, path: &str, data: &[u8]) {
        self.with(|s| {
            for c in s.containers.values_mut() {
                if &c.run_id == run_id {
                    c.files.insert(path.to_owned(), data.to_vec());
                }
            }
        });
    }

    /// Containers created for `run_id`, ever.
    pub fn creations(&self, run_id: &RunId) -> u32 {
        self.with(|s| s.creations.get(run_id).copied().unwrap_or(0))
    }

    /// Containers started for `run_id`, ever.
    pub fn starts(&self, run_id: &RunId) -> u32 {
        self.with(|s| s.starts.get(run_id).copied().unwrap_or(0))
    }

    /// Run ids with a running container.
    pub fn running(&self) -> Vec<RunId> {
        self.with(|s| {
            s.containers
                .values()
                .filter(|c| c.status == Status::Running)
                .map(|c| c.run_id.clone())
                .collect()
        })
    }

    /// Run ids with a container in any state.
    pub fn present(&self) -> Vec<RunId> {
        self.with(|s| s.containers.values().map(|c| c.run_id.clone()).collect())
    }

    /// The spec a run's container was created with (also after it was removed).
    pub fn spec_of(&self, run_id: &RunId) -> Option<RunSpec> {
        self.with(|s| s.specs.get(run_id).cloned())
    }

    fn check(&self) -> Result<(), RuntimeError> {
        if self.with(|s| s.unavailable) {
            Err(RuntimeError::Unavailable("the fake engine is down".into()))
        } else {
            Ok(())
        }
    }

    fn status(&self, id: &str) -> Option<Status> {
        self.with(|s| s.containers.get(id).map(|c| c.status.clone()))
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    /// A fake run is a task of this process: the proxy listens on loopback.
    async fn prepare_egress(
        &self,
        _port: u16,
    ) -> Result<director::runtime::EgressPoint, RuntimeError> {
        Ok(director::runtime::EgressPoint {
            listen: std::net::Ipv4Addr::LOCALHOST.into(),
            host: "127.0.0.1".into(),
            bridge: None,
            ipv6: false,
        })
    }

    async fn create(&self, spec: &RunSpec) -> Result<String, RuntimeError> {
        self.check()?;
        let panics = self.with(|s| {
            let panics = s.panicking_creates > 0;
            s.panicking_creates = s.panicking_creates.saturating_sub(1);
            panics
        });
        assert!(!panics, "the fake runtime was told to panic on create");
        self.with(|s| {
            if s.containers.values().any(|c| c.run_id == spec.run_id) {
                return Err(RuntimeError::Exists(spec.run_id.clone()));
            }
            s.next_id += 1;
            let id = format!("fake-{:06}", s.next_id);
            *s.creations.entry(spec.run_id.clone()).or_default() += 1;
            s.specs.insert(spec.run_id.clone(), spec.clone());
            let mut spec = spec.clone();
            spec.labels
                .insert(RUN_LABEL.to_owned(), spec.run_id.to_string());
            let copy_fails = s.failing_task_copies > 0;
            s.failing_task_copies = s.failing_task_copies.saturating_sub(1);
            s.containers.insert(
                id.clone(),
                Container {
                    run_id: spec.run_id.clone(),
                    spec,
                    has_task: !copy_fails,
                    status: Status::Created,
                    log: String::new(),
                    files: HashMap::new(),
                },
            );
            if copy_fails {
                return Err(RuntimeError::Engine(
                    "copying the task in: connection reset; removing the container also failed"
                        .into(),
                ));
            }
            Ok(id)
        })
    }

    async fn has_task(&self, id: &str, _path: &str) -> Result<bool, RuntimeError> {
        self.check()?;
        self.with(|s| s.containers.get(id).map(|c| c.has_task))
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        let (spec, behaviour) = self.with(|s| {
            let behaviour = s.behaviour.clone();
            let c = s
                .containers
                .get_mut(id)
                .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
            if c.status != Status::Created {
                return Err(RuntimeError::Engine("container already started".into()));
            }
            c.status = Status::Running;
            let spec = c.spec.clone();
            *s.starts.entry(spec.run_id.clone()).or_default() += 1;
            Ok((spec, behaviour))
        })?;
        if let Some(behaviour) = behaviour {
            let this = self.clone();
            let id = id.to_owned();
            tokio::spawn(async move {
                let (code, log) = behaviour(spec).await;
                this.with(|s| {
                    if let Some(c) = s.containers.get_mut(&id)
                        && c.status == Status::Running
                    {
                        c.status = Status::Exited(code);
                        c.log.push_str(&log);
                    }
                });
                this.changed.notify_waiters();
            });
        }
        Ok(())
    }

    async fn wait(&self, id: &str, limits: WaitLimits) -> Result<Exit, RuntimeError> {
        // The fake's output arrives only at the end: a run that has not ended within the idle
        // limit printed nothing for that long.
        let timeout = limits.timeout;
        let (timeout, cause) = match limits.idle {
            Some(idle) if idle < timeout => (idle, Exit::Idle),
            _ => (timeout, Exit::TimedOut),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.check()?;
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the status is read, so an exit in between is not missed.
            changed.as_mut().enable();
            match self.status(id) {
                None => return Err(RuntimeError::NotFound(id.to_owned())),
                Some(Status::Exited(code)) => return Ok(Exit::Code(code)),
                Some(_) => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                self.kill(id).await?;
                return Ok(cause);
            }
        }
    }

    async fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, RuntimeError> {
        self.check()?;
        let fail = self.with(|s| {
            let fail = s.failing_reads > 0;
            s.failing_reads = s.failing_reads.saturating_sub(1);
            fail
        });
        if fail {
            return Err(RuntimeError::Engine(
                "reading the file: connection reset by the engine".into(),
            ));
        }
        Ok(self
            .with(|s| s.containers.get(id)?.files.get(path).cloned())
            .filter(|d| d.len() <= max_bytes))
    }

    async fn logs_tail(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        self.check()?;
        let log = self
            .with(|s| s.containers.get(id).map(|c| c.log.clone()))
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        let all: Vec<&str> = log.lines().collect();
        Ok(all[all.len().saturating_sub(lines)..].join("\n"))
    }

    /// The log as it grows; a mark is the byte offset after the output it came with.
    async fn follow_output(
        &self,
        id: &str,
        after: Option<&str>,
    ) -> Result<Option<OutputStream>, RuntimeError> {
        self.check()?;
        let offset: usize = after.and_then(|a| a.parse().ok()).unwrap_or(0);
        let this = self.clone();
        let id = id.to_owned();
        let stream = futures_util::stream::unfold(
            (this, id, offset, false),
            |(this, id, offset, done)| async move {
                if done {
                    return None;
                }
                let notify = this.changed.clone();
                loop {
                    let changed = notify.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    let (log, ended) = this.with(|s| match s.containers.get(&id) {
                        Some(c) => (
                            c.log.clone(),
                            !matches!(c.status, Status::Running | Status::Created),
                        ),
                        None => (String::new(), true),
                    });
                    if log.len() > offset {
                        let output = Output {
                            bytes: log.as_bytes()[offset..].to_vec(),
                            mark: Some(log.len().to_string()),
                        };
                        return Some((Ok(output), (this, id, log.len(), ended)));
                    }
                    if ended {
                        return None;
                    }
                    changed.await;
                }
            },
        )
        .boxed();
        Ok(Some(stream))
    }

    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        self.with(|s| {
            if let Some(c) = s.containers.get_mut(id)
                && c.status == Status::Running
            {
                c.status = Status::Exited(137);
            }
        });
        self.changed.notify_waiters();
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        self.with(|s| s.containers.remove(id));
        self.changed.notify_waiters();
        Ok(())
    }

    async fn list_runs(&self) -> Result<Vec<RunContainer>, RuntimeError> {
        self.check()?;
        Ok(self.with(|s| {
            s.containers
                .iter()
                .map(|(id, c)| RunContainer {
                    id: id.clone(),
                    run_id: c.run_id.clone(),
                    running: c.status == Status::Running,
                    never_started: c.status == Status::Created,
                })
                .collect()
        }))
    }

    async fn env(&self, id: &str) -> Result<Vec<(String, String)>, RuntimeError> {
        self.check()?;
        self.with(|s| s.containers.get(id).map(|c| c.spec.env.clone()))
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))
    }
}
