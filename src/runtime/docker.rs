//! The Docker implementation of [`Runtime`], over bollard. Hardening lives in `HostConfig`:
//! a non-root user, every capability dropped, `no-new-privileges`, memory/CPU/pids limits, a
//! read-only root filesystem with a tmpfs workspace, and the configured network. The task
//! file goes into an anonymous volume at its directory, copied in before start (a read-only
//! root filesystem refuses archive uploads anywhere else).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, HostConfig, Mount, MountType,
    NetworkConnectRequest, NetworkCreateRequest,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, DownloadFromContainerOptions,
    InspectNetworkOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StopContainerOptions, UploadToContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;

use super::{
    EgressPoint, Exit, RunContainer, RunSpec, Runtime, RuntimeError, TMP_DIR, WaitLimits, Watchdog,
};
use crate::domain::RunId;
use crate::settings::RunnerSettings;

/// How a mark of the attached output stream begins: `bytes:N`, N bytes seen.
const BYTES_MARK: &str = "bytes:";

/// How much of a chunk of `len` bytes starting at byte `start` of the output a follower
/// that saw `skip` bytes before a restart has seen already: skipped, to the byte.
fn seen_part(skip: u64, start: u64, len: usize) -> usize {
    usize::try_from(skip.saturating_sub(start))
        .unwrap_or(usize::MAX)
        .min(len)
}

pub use super::RUN_LABEL;

pub use super::container_name;

pub struct DockerRuntime {
    docker: Docker,
    settings: RunnerSettings,
}

fn engine(e: DockerError) -> RuntimeError {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } => RuntimeError::NotFound(message),
        e => RuntimeError::Engine(e.to_string()),
    }
}

/// Whether the engine's refusal to start a container says its command cannot be run (the
/// OCI runtime's `exec: "...": ... no such file or directory`, `executable file not found`).
fn cannot_exec(message: &str) -> bool {
    message.contains("unable to start container process")
        && (message.contains("no such file or directory")
            || message.contains("executable file not found")
            || message.contains("permission denied"))
}

/// The part of the OCI runtime's refusal that names the command: `exec: "/bin/sh": stat
/// /bin/sh: no such file or directory`.
fn exec_error(message: &str) -> String {
    let part = message
        .find("exec:")
        .map_or(message, |at| &message[at..])
        .trim_end_matches(": unknown")
        .trim();
    part.chars().take(300).collect()
}

/// The director's own container, when it runs in one.
pub fn own_container() -> Option<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| super::mounts::own_container_id(&m))
}

impl DockerRuntime {
    /// The gateway of the runs' network (`runner.egress_network`) when it exists, read
    /// without changing anything: for `director hooks check`.
    pub async fn runs_gateway(&self) -> Result<Option<std::net::IpAddr>, RuntimeError> {
        let Some(network) = self.runs_network().await? else {
            return Ok(None);
        };
        Ok(network
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().find_map(|c| c.gateway))
            .and_then(|g| g.parse().ok()))
    }

    /// The runs' network (`runner.egress_network`) as the engine describes it, if it exists.
    async fn runs_network(&self) -> Result<Option<bollard::models::NetworkInspect>, RuntimeError> {
        match self
            .docker
            .inspect_network(&self.settings.egress_network, None::<InspectNetworkOptions>)
            .await
        {
            Ok(n) => Ok(Some(n)),
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(engine(e)),
        }
    }

    /// Docker's log stream with timestamps, from after the log timestamp `after`: for a run
    /// whose transcript an older version followed this way.
    fn follow_log(
        &self,
        id: &str,
        after: &str,
    ) -> Result<Option<super::OutputStream>, RuntimeError> {
        let after = chrono::DateTime::parse_from_rfc3339(after).ok();
        let options = LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: after.map_or(0, |a| i32::try_from(a.timestamp()).unwrap_or(0)),
            tail: "all".into(),
            ..Default::default()
        };
        let stream = self
            .docker
            .logs(id, Some(options))
            .filter_map(move |chunk| {
                let out = match chunk {
                    Err(e) => Some(Err(engine(e))),
                    Ok(chunk) => super::timestamped(&chunk.into_bytes(), after).map(Ok),
                };
                std::future::ready(out)
            })
            .boxed();
        Ok(Some(stream))
    }

    /// A stop signal, then a kill after `grace` (the engine's own stop).
    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let t = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        match self
            .docker
            .stop_container(
                id,
                Some(StopContainerOptions {
                    signal: None,
                    t: Some(t),
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            // Ended meanwhile (304), or gone (404).
            Err(DockerError::DockerResponseServerError {
                status_code: 304 | 404,
                ..
            }) => Ok(()),
            Err(e) => Err(engine(e)),
        }
    }

    /// Connects to `DOCKER_HOST`, else the local socket, and negotiates the API version.
    pub async fn connect(settings: RunnerSettings) -> Result<Self, RuntimeError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
        Ok(Self { docker, settings })
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Whether the engine lists `runner.oci_runtime` among its runtimes (`docker info`);
    /// `Err` says it does not, naming the key and what the engine has.
    pub async fn check_oci_runtime(&self) -> Result<(), String> {
        let name = &self.settings.oci_runtime;
        if name.is_empty() {
            return Ok(());
        }
        let info = self.docker.info().await.map_err(|e| {
            format!("runner.oci_runtime: cannot ask the engine for its runtimes: {e}")
        })?;
        let listed: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        if listed.iter().any(|r| r == name) {
            return Ok(());
        }
        Err(format!(
            "runner.oci_runtime: the Docker engine has no runtime `{name}` (it lists: {}); register it in the engine's daemon.json under \"runtimes\" and reload the engine (docs/operations.md)",
            listed.join(", ")
        ))
    }

    /// The create request for a run: command, environment, labels and hardening.
    pub fn container_config(&self, spec: &RunSpec) -> ContainerCreateBody {
        let s = &self.settings;
        let task_dir = std::path::Path::new(&spec.task_path)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "/task".into());
        let mut mounts = vec![Mount {
            target: Some(task_dir),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        }];
        for (source, target, read_only) in &spec.mounts {
            mounts.push(Mount {
                target: Some(target.clone()),
                source: Some(source.clone()),
                typ: Some(if source.starts_with('/') {
                    MountType::BIND
                } else {
                    MountType::VOLUME
                }),
                read_only: Some(*read_only),
                ..Default::default()
            });
        }
        let mut tmpfs = HashMap::new();
        let mut labels = spec.labels.clone();
        match &spec.workspace_volume {
            // Prepared by the setup phase: the volume it left.
            Some(volume) => {
                // No copy of the image's directory into it: the engine would give the
                // volume's root the owner of that directory (root) while it is empty.
                mounts.push(Mount {
                    target: Some(s.workspace.clone()),
                    source: Some(volume.clone()),
                    typ: Some(MountType::VOLUME),
                    volume_options: Some(bollard::models::MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                labels.insert(
                    super::docker_workspace::WORKSPACE_LABEL.to_owned(),
                    volume.clone(),
                );
            }
            None => {
                tmpfs.insert(
                    s.workspace.clone(),
                    format!(
                        "rw,nosuid,nodev,size={}m,uid={},gid={}",
                        s.workspace_mb,
                        uid(&s.user),
                        gid(&s.user)
                    ),
                );
            }
        }
        // `/tmp` for every run (Claude Code, compilers and test runners need one), in the
        // run's memory; `exec`: agents run what they build there.
        tmpfs.insert(
            TMP_DIR.to_owned(),
            format!("rw,nosuid,nodev,exec,size={}m,mode=1777", s.tmp_mb()),
        );
        ContainerCreateBody {
            network_disabled: spec
                .labels
                .contains_key(super::SEALED_LABEL)
                .then_some(true),
            image: Some(spec.image.clone()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            user: Some(s.user.clone()),
            working_dir: Some(s.workspace.clone()),
            host_config: Some(HostConfig {
                memory: Some(
                    i64::try_from(s.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX),
                ),
                nano_cpus: Some((s.cpus * 1e9) as i64),
                pids_limit: Some(s.pids_limit),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges:true".into()]),
                readonly_rootfs: Some(s.read_only_rootfs),
                tmpfs: Some(tmpfs),
                // A sealed container (a check) has no network at all: not even the proxy's
                // or the gateways' internal network.
                network_mode: Some(if spec.labels.contains_key(super::SEALED_LABEL) {
                    "none".to_owned()
                } else if spec.confined {
                    s.egress_network.clone()
                } else {
                    s.network.clone()
                }),
                mounts: Some(mounts),
                // Never the engine's default in its place: a runtime that cannot start the
                // run fails it, saying so.
                runtime: (!s.oci_runtime.is_empty()).then(|| s.oci_runtime.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// Whether an engine of this version forwards DNS from internal networks to the host's
/// resolver (CVE-2024-29018): before 23.0.11, all of 24, and 25 before 25.0.5. A version that
/// does not parse counts as leaking.
fn internal_networks_leak_dns(version: &str) -> bool {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor)), patch) = (parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    let patch = patch.flatten().unwrap_or(0);
    match major {
        ..=22 => true,
        23 => minor == 0 && patch < 11,
        24 => true,
        25 => minor == 0 && patch < 5,
        _ => false,
    }
}

fn uid(user: &str) -> &str {
    user.split(':').next().unwrap_or("1000")
}

fn gid(user: &str) -> &str {
    user.split(':').nth(1).unwrap_or_else(|| uid(user))
}

/// A tar archive holding the task file, readable by the run's user, and the directories
/// (`dirs`) the run may write into whatever its uid (the volume is the container's own).
fn tar_task(name: &str, data: &[u8], dirs: &[&str]) -> Result<Vec<u8>, RuntimeError> {
    let fail = |e: std::io::Error| RuntimeError::Engine(format!("building the task archive: {e}"));
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o444);
    header.set_mtime(0);
    header.set_cksum();
    builder.append_data(&mut header, name, data).map_err(fail)?;
    for dir in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_size(0);
        header.set_mode(0o1777);
        header.set_mtime(0);
        header.set_cksum();
        builder
            .append_data(&mut header, format!("{dir}/"), std::io::empty())
            .map_err(fail)?;
    }
    builder.into_inner().map_err(fail)
}

/// The first regular file of a tar archive, if at most `max_bytes` long.
fn first_file(archive: &[u8], max_bytes: usize) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut tar = tar::Archive::new(archive);
    let mut entry = tar
        .entries()
        .ok()?
        .flatten()
        .find(|e| e.header().entry_type().is_file())?;
    if usize::try_from(entry.size()).ok()? > max_bytes {
        return None;
    }
    let mut out = Vec::new();
    entry.read_to_end(&mut out).ok()?;
    Some(out)
}

#[async_trait]
impl Runtime for DockerRuntime {
    async fn check(&self) -> Result<(), RuntimeError> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| RuntimeError::Unavailable(e.to_string()))
    }

    /// The internal network confined runs join (created when missing; one that exists must
    /// be internal), and the director's address on it: the bridge's gateway on the host, or,
    /// when the director itself runs in a container, that container joined to the network.
    async fn prepare_egress(&self, _port: u16) -> Result<EgressPoint, RuntimeError> {
        let version = self.docker.version().await.map_err(engine)?;
        let version = version.version.unwrap_or_default();
        if internal_networks_leak_dns(&version) {
            let why = format!(
                "the Docker engine {version} resolves names for containers on internal networks through the host's resolver (CVE-2024-29018, fixed in 23.0.11, 25.0.5 and 26.0.0): a confined run could carry any name out"
            );
            if !self.settings.allow_dns_leaking_engine {
                return Err(RuntimeError::Engine(format!(
                    "{why}; upgrade the engine (or accept the risk with runner.allow_dns_leaking_engine)"
                )));
            }
            tracing::warn!("{why}; runs are confined anyway (runner.allow_dns_leaking_engine)");
        }
        let name = &self.settings.egress_network;
        let network = match self.runs_network().await? {
            Some(n) => n,
            None => {
                self.docker
                    .create_network(NetworkCreateRequest {
                        name: name.clone(),
                        driver: Some("bridge".into()),
                        internal: Some(true),
                        labels: Some(HashMap::from([(
                            "director.egress".to_owned(),
                            "internal".to_owned(),
                        )])),
                        ..Default::default()
                    })
                    .await
                    .map_err(engine)?;
                self.docker
                    .inspect_network(name, None::<InspectNetworkOptions>)
                    .await
                    .map_err(engine)?
            }
        };
        if network.internal != Some(true) {
            return Err(RuntimeError::Engine(format!(
                "the network `{name}` exists and is not internal: confined runs would have a route out (remove it, or name another in runner.egress_network)"
            )));
        }
        let own = own_container();
        let ipv6 = network.enable_ipv6 == Some(true);
        // The engine names a network's bridge `br-` and the first 12 characters of its id,
        // unless the network was made with a name of its own for it.
        let bridge = network
            .options
            .as_ref()
            .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
            .or_else(|| {
                network
                    .id
                    .as_ref()
                    .and_then(|id| id.get(..12))
                    .map(|id| format!("br-{id}"))
            })
            .filter(|_| own.is_none());
        let ip = match own {
            Some(id) => {
                // Joined already is fine.
                let _ = self
                    .docker
                    .connect_network(
                        name,
                        NetworkConnectRequest {
                            container: id.clone(),
                            ..Default::default()
                        },
                    )
                    .await;
                let me = self
                    .docker
                    .inspect_container(&id, None)
                    .await
                    .map_err(engine)?;
                me.network_settings
                    .and_then(|n| n.networks)
                    .and_then(|n| n.get(name).and_then(|e| e.ip_address.clone()))
                    .filter(|ip| !ip.is_empty())
            }
            None => network
                .ipam
                .and_then(|i| i.config)
                .and_then(|c| c.into_iter().find_map(|c| c.gateway))
                .filter(|g| !g.is_empty()),
        };
        let ip = ip.ok_or_else(|| {
            RuntimeError::Engine(format!(
                "the network `{name}` gives the director no address"
            ))
        })?;
        let listen = ip
            .parse()
            .map_err(|e| RuntimeError::Engine(format!("`{ip}` on `{name}`: {e}")))?;
        Ok(EgressPoint {
            listen,
            host: ip,
            bridge,
            ipv6,
        })
    }

    fn prepares_workspaces(&self) -> bool {
        true
    }

    async fn make_workspace(&self, run_id: &RunId, image: &str) -> Result<String, RuntimeError> {
        super::docker_workspace::make(
            &self.docker,
            run_id,
            image,
            &self.settings.user,
            &self.settings.workspace,
        )
        .await
    }

    async fn list_workspaces(&self) -> Result<Vec<RunId>, RuntimeError> {
        super::docker_workspace::list(&self.docker).await
    }

    async fn remove_workspace(&self, run_id: &RunId) -> Result<(), RuntimeError> {
        super::docker_workspace::remove(&self.docker, run_id).await
    }

    async fn export_workspace(&self, id: &str) -> Result<super::TarStream, RuntimeError> {
        Ok(super::docker_workspace::export(
            &self.docker,
            id,
            &self.settings.workspace,
        ))
    }

    async fn import_workspace(&self, id: &str, tar: super::TarStream) -> Result<(), RuntimeError> {
        super::docker_workspace::import(&self.docker, id, &self.settings.workspace, tar).await
    }

    async fn image_id(&self, image: &str) -> Result<String, RuntimeError> {
        let inspect = self.docker.inspect_image(image).await.map_err(engine)?;
        Ok(inspect.id.unwrap_or_else(|| image.to_owned()))
    }

    async fn create(&self, spec: &RunSpec) -> Result<String, RuntimeError> {
        let name = if spec.setup_phase {
            super::docker_workspace::setup_container_name(&spec.run_id)
        } else {
            container_name(&spec.run_id)
        };
        let options = CreateContainerOptions {
            name: Some(name),
            ..Default::default()
        };
        let created = match self
            .docker
            .create_container(Some(options), self.container_config(spec))
            .await
        {
            Ok(c) => c,
            Err(DockerError::DockerResponseServerError {
                status_code: 409, ..
            }) => {
                return Err(RuntimeError::Exists(spec.run_id.clone()));
            }
            Err(e) => return Err(engine(e)),
        };
        let path = std::path::Path::new(&spec.task_path);
        let dir = path
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "/".into());
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("task.md");
        // The result file's directory, when it sits beside the task file.
        let result_dir = spec.result_path.as_deref().and_then(|r| {
            let r = std::path::Path::new(r);
            let parent = r.parent()?;
            (parent.parent()? == path.parent()?)
                .then(|| parent.file_name()?.to_str().map(str::to_owned))
                .flatten()
        });
        let dirs: Vec<&str> = result_dir.iter().map(String::as_str).collect();
        let archive = tar_task(file, &spec.task, &dirs)?;
        let upload = UploadToContainerOptions {
            path: dir,
            ..Default::default()
        };
        if let Err(e) = self
            .docker
            .upload_to_container(
                &created.id,
                Some(upload),
                bollard::body_full(archive.into()),
            )
            .await
        {
            // A container left without its task is never started: a later attempt finds it
            // (`has_task`) and makes it again. A failed removal is said, not swallowed.
            if let Err(cleanup) = self.remove(&created.id).await {
                tracing::error!(container = %created.id, error = %cleanup, "cannot remove a container whose task could not be copied in");
                return Err(RuntimeError::Engine(format!(
                    "copying the task in: {e}; removing the container also failed: {cleanup}"
                )));
            }
            return Err(engine(e));
        }
        Ok(created.id)
    }

    async fn has_task(&self, id: &str, path: &str) -> Result<bool, RuntimeError> {
        // Any size counts: a task is only ever as large as the issue it came from.
        Ok(self.read_file(id, path, usize::MAX).await?.is_some())
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(|e| match e {
                DockerError::DockerResponseServerError { message, .. } if cannot_exec(&message) => {
                    RuntimeError::CannotExec(exec_error(&message))
                }
                e => engine(e),
            })
    }

    async fn wait(&self, id: &str, limits: WaitLimits) -> Result<Exit, RuntimeError> {
        let options = WaitContainerOptions {
            condition: "not-running".into(),
        };
        let mut stream = self.docker.wait_container(id, Some(options));
        let mut watchdog = Watchdog::new(&limits);
        // Output since now, to tell a run that works from one that is wedged.
        let mut output = limits.idle.map(|_| {
            self.docker.logs(
                id,
                Some(LogsOptions {
                    follow: true,
                    stdout: true,
                    stderr: true,
                    tail: "0".into(),
                    ..Default::default()
                }),
            )
        });
        let cause = loop {
            let wake = watchdog.wake(output.is_some());
            tokio::select! {
                waited = stream.next() => return match waited {
                    Some(Ok(r)) => Ok(Exit::Code(r.status_code)),
                    // bollard reports a non-zero exit as an error.
                    Some(Err(DockerError::DockerContainerWaitError { code, .. })) => {
                        Ok(Exit::Code(code))
                    }
                    Some(Err(e)) => Err(engine(e)),
                    None => Err(RuntimeError::Engine(
                        "the wait stream ended without a status".into(),
                    )),
                },
                chunk = async { output.as_mut()?.next().await }, if output.is_some() => {
                    match chunk {
                        Some(Ok(_)) => watchdog.output(),
                        // The log stream ended or failed: only the wall clock counts now.
                        _ => output = None,
                    }
                }
                _ = tokio::time::sleep_until(wake) => break watchdog.cause(),
            }
        };
        self.stop(id, limits.grace).await?;
        // Let the engine record the exit before the caller reads logs.
        let mut again = self.docker.wait_container(
            id,
            Some(WaitContainerOptions {
                condition: "not-running".into(),
            }),
        );
        let _ = tokio::time::timeout(limits.grace + Duration::from_secs(30), again.next()).await;
        Ok(cause)
    }

    async fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, RuntimeError> {
        let mut stream = self.docker.download_from_container(
            id,
            Some(DownloadFromContainerOptions {
                path: path.to_owned(),
            }),
        );
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    archive.extend_from_slice(&bytes);
                    // A tar holds the file plus headers and padding: stop reading well past it.
                    if archive.len() > max_bytes.saturating_add(64 * 1024) {
                        return Ok(None);
                    }
                }
                Err(DockerError::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(None),
                Err(e) => return Err(engine(e)),
            }
        }
        Ok(first_file(&archive, max_bytes))
    }

    async fn logs_tail(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        let options = LogsOptions {
            stdout: true,
            stderr: true,
            tail: lines.to_string(),
            ..Default::default()
        };
        let mut stream = self.docker.logs(id, Some(options));
        let mut out = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(engine)?;
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out)
    }

    /// The container's own output stream (attach), replayed from its start: the engine hands
    /// the output to this reader as the container writes it, without going through its log
    /// files, which it rotates (a follower lagging behind a fast run would lose what rotation
    /// deleted) and which cost it CPU to read back. The mark is the count of bytes seen
    /// (`bytes:N`): a run adopted after a restart is replayed and the first N bytes skipped.
    /// A mark of an older version (a log timestamp) continues through the log stream.
    async fn follow_output(
        &self,
        id: &str,
        after: Option<&str>,
    ) -> Result<Option<super::OutputStream>, RuntimeError> {
        let skip: u64 = match after {
            None => 0,
            Some(mark) => match mark.strip_prefix(BYTES_MARK).and_then(|n| n.parse().ok()) {
                Some(n) => n,
                None => return self.follow_log(id, mark),
            },
        };
        let options = AttachContainerOptions {
            stdout: true,
            stderr: true,
            stream: true,
            logs: true,
            ..Default::default()
        };
        let attached = match self.docker.attach_container(id, Some(options)).await {
            Ok(attached) => attached,
            // Gone already: nothing more to follow.
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(Some(futures_util::stream::empty().boxed())),
            Err(e) => return Err(engine(e)),
        };
        let mut seen: u64 = 0;
        let stream = attached
            .output
            .filter_map(move |chunk| {
                let out = match chunk {
                    Err(e) => Some(Err(engine(e))),
                    Ok(chunk) => {
                        let bytes = chunk.into_bytes();
                        let start = seen;
                        seen = seen.saturating_add(bytes.len() as u64);
                        let fresh = seen_part(skip, start, bytes.len());
                        (fresh < bytes.len()).then(|| {
                            Ok(super::Output {
                                bytes: bytes[fresh..].to_vec(),
                                mark: Some(format!("{BYTES_MARK}{seen}")),
                            })
                        })
                    }
                };
                std::future::ready(out)
            })
            .boxed();
        Ok(Some(stream))
    }

    async fn stop_gracefully(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        self.stop(id, grace).await
    }

    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        match self
            .docker
            .kill_container(
                id,
                Some(KillContainerOptions {
                    signal: "SIGKILL".into(),
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            // Not running (409) or gone (404): stopped already.
            Err(DockerError::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(e) => Err(engine(e)),
        }
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        // A prepared run's workspace volume goes with its agent's container.
        let workspace = match self.docker.inspect_container(id, None).await {
            Ok(c) => c.config.and_then(|c| c.labels).and_then(|l| {
                Some((
                    l.get(super::docker_workspace::WORKSPACE_LABEL)?.clone(),
                    l.get(RUN_LABEL)?.clone(),
                ))
            }),
            Err(_) => None,
        };
        let options = RemoveContainerOptions {
            v: true,
            force: true,
            ..Default::default()
        };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => {}
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(engine(e)),
        }
        if let Some((_, run_id)) = workspace
            && let Ok(run_id) = RunId::parse(&run_id)
        {
            super::docker_workspace::remove(&self.docker, &run_id).await?;
        }
        Ok(())
    }

    async fn list_runs(&self) -> Result<Vec<RunContainer>, RuntimeError> {
        let mut filters = HashMap::new();
        filters.insert("label".to_owned(), vec![RUN_LABEL.to_owned()]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        // The listing's own state, no inspect per container: another director sharing the
        // engine may remove its containers while this one reads, and that must not fail it.
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(engine)?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let run_id = RunId::parse(c.labels.as_ref()?.get(RUN_LABEL)?).ok()?;
                Some(RunContainer {
                    id: c.id?,
                    run_id,
                    running: c.state == Some(ContainerSummaryStateEnum::RUNNING),
                    never_started: c.state == Some(ContainerSummaryStateEnum::CREATED),
                })
            })
            .collect())
    }

    async fn env(&self, id: &str) -> Result<Vec<(String, String)>, RuntimeError> {
        let c = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(engine)?;
        Ok(c.config
            .and_then(|c| c.env)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::split_timestamp;
    use super::{internal_networks_leak_dns, seen_part};

    #[test]
    fn a_resumed_follow_skips_exactly_what_was_seen_before_the_restart() {
        // 10 bytes seen; chunks of 4 from the start of the output.
        assert_eq!(seen_part(10, 0, 4), 4);
        assert_eq!(seen_part(10, 8, 4), 2, "the chunk that straddles the mark");
        assert_eq!(seen_part(10, 12, 4), 0);
        assert_eq!(seen_part(0, 0, 4), 0, "a fresh follow skips nothing");
    }

    #[test]
    fn a_log_lines_timestamp_is_its_mark() {
        let (at, text) =
            split_timestamp(b"2026-12-03T18:00:00.123456789Z hello world\n").expect("a line");
        assert_eq!(at, "2026-12-03T18:00:00.123456789Z");
        assert_eq!(text, b"hello world\n");
        assert!(split_timestamp(b"no timestamp here").is_none());
        assert!(split_timestamp(b"").is_none());
    }

    #[test]
    fn engines_that_leak_dns_from_internal_networks_are_named() {
        for leaks in [
            "20.10.24", "23.0.10", "24.0.9", "25.0.4", "v25.0.0", "", "dev",
        ] {
            assert!(internal_networks_leak_dns(leaks), "{leaks}");
        }
        for fixed in [
            "23.0.11",
            "23.1.0",
            "25.0.5",
            "25.1.0",
            "26.0.0",
            "28.2.2",
            "29.0.0-rc.1",
        ] {
            assert!(!internal_networks_leak_dns(fixed), "{fixed}");
        }
    }
}
