//! Coder runs: `[runner]` and `[kubernetes]`, and how their keys are checked together.

use super::*;

/// Where coder runs execute (`runner.kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// The local Docker engine, through its socket.
    #[default]
    Docker,
    /// Kubernetes Jobs (`[kubernetes]`).
    Kubernetes,
}

/// How far a run's network reaches (`runner.egress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// Only the forge, the model endpoint and `runner.egress_allow`, through the egress proxy.
    #[default]
    Allowlist,
    /// Whatever `runner.network` gives it.
    Open,
}

/// Where a run's branch lives (`runner.branch_home`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BranchHome {
    /// The runner account's fork of the repository (or `runner.fork_owner`'s): its pull
    /// request comes from a fork, so the forge holds the pull request's workflows for a
    /// maintainer's approval and gives them none of the repository's secrets. Forgejo only.
    #[default]
    Fork,
    /// The watched repository itself: the forge runs its workflows on the run's pushes with
    /// the repository's secrets (docs/security.md#agent-code-in-ci).
    Repository,
}

impl BranchHome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fork => "fork",
            Self::Repository => "repository",
        }
    }
}

/// Where runs go with `runner.kind = "kubernetes"`: one Job per run in `namespace`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesSettings {
    /// The namespace the runs' Jobs, Pods and Secrets live in.
    #[serde(deserialize_with = "lenient::string")]
    pub namespace: String,
    /// A kubeconfig file; empty: the in-cluster configuration (the director's own service
    /// account), else the file `KUBECONFIG` names.
    #[serde(deserialize_with = "lenient::string")]
    pub kubeconfig: String,
    /// The service account the runs' pods run as (its token is never mounted); empty: the
    /// namespace's default.
    #[serde(deserialize_with = "lenient::string")]
    pub service_account: String,
    /// A finished Job is deleted by Kubernetes this long after it ends, should the director
    /// not have removed it itself.
    pub ttl_secs_after_finished: u32,
    /// With `runner.egress = "allowlist"`: the name runs reach the director's egress proxy
    /// by (its Service, e.g. `director.forge.svc`).
    #[serde(deserialize_with = "lenient::string")]
    pub proxy_host: String,
    /// Where the director's pods are, and their labels (`key=value`), for the runs'
    /// NetworkPolicy: egress only to those pods' proxy port, and DNS.
    #[serde(deserialize_with = "lenient::string")]
    pub proxy_namespace: String,
    #[serde(deserialize_with = "lenient::list")]
    pub proxy_pod_labels: Vec<String>,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            kubeconfig: String::new(),
            service_account: String::new(),
            ttl_secs_after_finished: 86_400,
            proxy_host: String::new(),
            proxy_namespace: String::new(),
            proxy_pod_labels: Vec::new(),
        }
    }
}

/// Coder runs: the container each GO issue gets, its limits and its hardening.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerSettings {
    /// `docker` (the local engine, through its socket) or `kubernetes` (Jobs; see
    /// `[kubernetes]`).
    pub kind: RunnerKind,
    /// Start coder runs for queued issues.
    pub enabled: bool,
    /// The image each run starts from (must be present on the engine).
    #[serde(deserialize_with = "lenient::string")]
    pub image: String,
    /// The command to run; empty: the image's own entry point.
    #[serde(deserialize_with = "lenient::list")]
    pub command: Vec<String>,
    /// The agent of `[agents]` runs get unless a repository or a writer chooses another;
    /// empty: `image` and `command` above.
    #[serde(deserialize_with = "lenient::string")]
    pub agent: String,
    /// A Docker network mode or network name: `bridge`, `host`, `none`, ... (with
    /// `egress = "open"` only).
    #[serde(deserialize_with = "lenient::string")]
    pub network: String,
    /// `allowlist`: a run reaches only the forge, the model endpoint and `egress_allow`,
    /// through the director's egress proxy; `open`: whatever `network` gives it.
    pub egress: Egress,
    /// `host:port` entries (`*.example.org:443`, `[2001:db8::1]:443`, `10.0.0.5:22`) an
    /// allow-listed run may reach besides the forge and the model endpoint.
    #[serde(deserialize_with = "lenient::list")]
    pub egress_allow: Vec<String>,
    /// The egress proxy's port (on the runs' network; in a cluster, on the director's pod).
    pub egress_proxy_port: u16,
    /// The git gateway's port, beside the egress proxy: allow-listed runs clone and push
    /// through it and hold no forge credential.
    pub git_gateway_port: u16,
    /// The model gateway's port, beside the git gateway: allow-listed runs call the model
    /// providers of `[models]` through it with a per-run key, metered and within `[budget]`.
    pub model_gateway_port: u16,
    /// Runs' branch names: `{issue}`, `{run}` (required: it makes each run's branch its
    /// own) and `{slug}` (the title, made safe for a ref).
    #[serde(deserialize_with = "lenient::string")]
    pub branch_template: String,
    /// Paths no pushed commit may change (globs: `*` and `?` within a segment, `**` across
    /// segments). The default covers the CI definitions of Forgejo, Gitea, GitHub,
    /// Woodpecker and Drone, and `.director.toml`.
    #[serde(deserialize_with = "lenient::list")]
    pub protected_paths: Vec<String>,
    /// Paths protected besides `protected_paths` (the way to add to the defaults).
    #[serde(deserialize_with = "lenient::list")]
    pub protected_paths_extra: Vec<String>,
    /// Accept a `protected_paths` without every default (CI definitions, `.director.toml`):
    /// the agent's commits may then change what the forge runs with the repository's
    /// secrets. Said at start-up.
    pub unprotect_ci: bool,
    /// The memory the bodies of gateway requests (pushes, fetches, model calls) may take at
    /// once, in MB: a request waits for room before a byte is read, and is answered 503 when
    /// none comes within `gateway_body_timeout_secs`. Unset: a quarter of the container's
    /// memory limit (its cgroup), at most 512 ([`memory`]).
    pub gateway_memory_mb: Option<u64>,
    /// Where the git gateway keeps its mirrors of the forge's repositories and the
    /// quarantines of the pushes it checks (in a `director-git-<pid>` directory of its own);
    /// empty: the system's temporary directory.
    #[serde(deserialize_with = "lenient::string")]
    pub gateway_dir: String,
    /// The most the mirrors and quarantines may take on disk, in MB: a push that would
    /// exceed it is refused, a mirror that would is removed. Keep it below the volume's size.
    pub gateway_disk_mb: u64,
    /// Where snapshots of prepared workspaces (`[setup]`) are kept; empty: `director-snapshots`
    /// in the system's temporary directory. Put it on a volume to keep them across restarts.
    #[serde(deserialize_with = "lenient::string")]
    pub snapshot_dir: String,
    /// The most all snapshots may take on disk, in MB (also the largest one kept); 0: none
    /// are kept and every setup runs cold.
    pub snapshot_max_mb: u64,
    /// A snapshot older than this many hours is not used, and is pruned.
    pub snapshot_ttl_hours: u64,
    /// The most of the gateways' body memory one run's requests may hold at once, in MB;
    /// 0 (the default): a quarter of it, or one push of `max_push_mb` (or one model request
    /// of `models.max_request_mb`) when that is more.
    pub gateway_memory_per_run_mb: u64,
    /// Requests one run may have open at once through the gateways (git and model).
    pub gateway_requests_per_run: usize,
    /// How long a gateway request's whole body may take to arrive.
    pub gateway_body_timeout_secs: u64,
    /// How long one git command of the gateway (indexing a push's pack, walking its
    /// commits, syncing a mirror) may take, in seconds: past it the push is refused and the
    /// repository's mirror freed for the next.
    pub git_timeout_secs: u64,
    /// The largest push (its pack) the git gateway takes, in MB.
    pub max_push_mb: u64,
    /// Docker: the internal network (no route out) allow-listed runs are attached to; the
    /// director creates it.
    #[serde(deserialize_with = "lenient::string")]
    pub egress_network: String,
    /// `uid:gid` the run's process has; never root by default.
    #[serde(deserialize_with = "lenient::string")]
    pub user: String,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_limit: i64,
    /// Read-only root filesystem (the workspace is a writable tmpfs).
    pub read_only_rootfs: bool,
    /// The writable tmpfs workspace inside the container, and its size.
    #[serde(deserialize_with = "lenient::string")]
    pub workspace: String,
    pub workspace_mb: u64,
    /// The writable tmpfs at `/tmp` (`TMPDIR`), in MB, counted in `memory_mb`; programs run
    /// there (not `noexec`): agents build and run what they write. Unset: a quarter of
    /// `memory_mb`, at most 512.
    pub tmp_mb: Option<u64>,
    /// Wall-clock limit per run, in seconds: the run gets a stop signal, then
    /// `stop_grace_secs` to push what it has, then it is killed.
    pub timeout_secs: u64,
    /// Between the stop signal and the kill.
    pub stop_grace_secs: u64,
    /// A run that prints nothing for this long is wedged: stopped the same way (0: never).
    pub idle_timeout_secs: u64,
    /// Follow-up runs per pull request (review feedback, `/director fix`) before a writer's
    /// `/director retry` on it is needed.
    pub max_followups: u32,
    /// Follow-up runs per pull request answering its failing checks; past it the issue is
    /// told, and nothing more starts for them.
    pub max_ci_followups: u32,
    /// Follow-up runs per pull request answering a failing `director/checks` (the director's
    /// own checks, `[checks]`), apart from `max_ci_followups`.
    pub max_check_followups: u32,
    /// Confine runs on a Docker engine that leaks DNS from internal networks
    /// (CVE-2024-29018: before 23.0.11, 24, and 25 before 25.0.5), with a warning, instead of
    /// refusing them: a run could then carry any name out through the host's resolver.
    pub allow_dns_leaking_engine: bool,
    /// Docker, allow-listed runs: drop what runs send to the host itself (the runs'
    /// network's gateway is the host's address, and services listening on every address
    /// answer there) except to the egress proxy and the gateways, with a packet filter rule
    /// installed at start and removed at the stop. The director then needs to run on the
    /// engine's host with the right to change its rules (root, or `CAP_NET_ADMIN`), and
    /// refuses to start without it.
    pub host_firewall: bool,
    /// The program that installs it: `iptables` (the front end the Docker engine uses), or
    /// a path to one (`/usr/sbin/iptables-legacy` where the engine uses the legacy tables).
    #[serde(deserialize_with = "lenient::string")]
    pub host_firewall_command: String,
    /// Attempts at starting a run before the issue is told it could not start. Retries back
    /// off from half a second, doubling: the default of 10 spans about four minutes, to
    /// outlast a forge or engine restart.
    pub start_attempts: u32,
    /// No new run starts in a repository with this many open pull requests from the
    /// director (follow-ups on an open one are exempt).
    pub max_open_prs_per_repo: usize,
    /// Keep a failed run's container this long for inspection (0: remove at once).
    pub keep_failed_secs: u64,
    /// Environment variables of the director passed through to runs (e.g. the agent's key).
    #[serde(deserialize_with = "lenient::list")]
    pub env_passthrough: Vec<String>,
    /// Runs at once, overall and per repository.
    pub max_concurrent: usize,
    pub max_per_repo: usize,
    /// Allow runs even when the runner account can push to the default branch.
    pub allow_unprotected_default_branch: bool,
    /// Where runs push their branches: `fork` (the default on Forgejo) or `repository` (the
    /// only choice on GitHub, whose Apps cannot own forks).
    pub branch_home: BranchHome,
    /// With `branch_home = "fork"`: the organisation the forks are made in (the runner must
    /// be able to create repositories there); empty: the runner account itself.
    #[serde(deserialize_with = "lenient::string")]
    pub fork_owner: String,
    /// With `branch_home = "fork"`: start runs even where the runner account can write to
    /// the repository (Forgejo trusts a writer's pull request: its workflows then run
    /// without a maintainer's approval).
    pub allow_writer_runner: bool,
    /// Extra bind mounts, `source:target[:ro]`; sources are translated to host paths when the
    /// director itself runs in a container.
    #[serde(deserialize_with = "lenient::list")]
    pub mounts: Vec<String>,
    /// Lines of the log tail kept and posted on failure.
    pub log_tail_lines: usize,
    /// Each run's whole output (redacted) is kept up to this many MiB, the end kept when cut
    /// (0: no transcripts).
    pub transcript_max_mb: u64,
    /// The author and committer of a run's git commits; empty: the runner account's login,
    /// and its Forgejo no-reply address.
    #[serde(deserialize_with = "lenient::string")]
    pub git_author_name: String,
    #[serde(deserialize_with = "lenient::string")]
    pub git_author_email: String,
    /// Docker: the engine's runtime every run container gets (`HostConfig.Runtime`), e.g.
    /// `runsc` for gVisor or a Kata runtime; empty: the engine's default (runc). The engine
    /// must list it (`docker info`), or the director refuses to start.
    #[serde(deserialize_with = "lenient::string")]
    pub oci_runtime: String,
    /// Kubernetes: the RuntimeClass of every run's pod (`runtimeClassName`), e.g. `gvisor`
    /// or `kata`; empty: the cluster's default.
    #[serde(deserialize_with = "lenient::string")]
    pub runtime_class_name: String,
    /// `host:port` globs (`*` any run of characters in the host; `*` alone as the port: any)
    /// a writer may approve for one issue's runs in its thread (`/director allow host:port`);
    /// empty (the default): no approval is taken.
    #[serde(deserialize_with = "lenient::list")]
    pub egress_approvable: Vec<String>,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        Self {
            kind: RunnerKind::Docker,
            enabled: true,
            image: String::new(),
            command: Vec::new(),
            agent: String::new(),
            network: "bridge".into(),
            egress: Egress::Allowlist,
            egress_allow: Vec::new(),
            egress_proxy_port: 3128,
            git_gateway_port: 3129,
            model_gateway_port: 3130,
            branch_template: crate::domain::run::DEFAULT_BRANCH_TEMPLATE.to_owned(),
            protected_paths: crate::domain::protected::default_protected_paths(),
            protected_paths_extra: Vec::new(),
            unprotect_ci: false,
            git_timeout_secs: 120,
            gateway_memory_mb: None,
            gateway_dir: String::new(),
            gateway_disk_mb: 2048,
            snapshot_dir: String::new(),
            snapshot_max_mb: 4096,
            snapshot_ttl_hours: 168,
            gateway_memory_per_run_mb: 0,
            gateway_requests_per_run: 8,
            gateway_body_timeout_secs: 120,
            max_push_mb: 100,
            egress_network: "director-egress".into(),
            user: "1000:1000".into(),
            memory_mb: 4096,
            cpus: 2.0,
            pids_limit: 512,
            read_only_rootfs: true,
            workspace: "/workspace".into(),
            workspace_mb: 2048,
            tmp_mb: None,
            timeout_secs: 3600,
            stop_grace_secs: 30,
            idle_timeout_secs: 1800,
            max_followups: 3,
            max_ci_followups: 2,
            max_check_followups: 2,
            start_attempts: 10,
            allow_dns_leaking_engine: false,
            host_firewall: false,
            host_firewall_command: "iptables".into(),
            max_open_prs_per_repo: 6,
            keep_failed_secs: 0,
            env_passthrough: Vec::new(),
            max_concurrent: 2,
            max_per_repo: 1,
            allow_unprotected_default_branch: false,
            branch_home: BranchHome::Fork,
            fork_owner: String::new(),
            allow_writer_runner: false,
            mounts: Vec::new(),
            log_tail_lines: 40,
            transcript_max_mb: 16,
            git_author_name: String::new(),
            git_author_email: String::new(),
            oci_runtime: String::new(),
            runtime_class_name: String::new(),
            egress_approvable: Vec::new(),
        }
    }
}

impl RunnerSettings {
    /// The gateways' body memory: `gateway_memory_mb`, else sized from the container's
    /// memory limit; `Err` when it cannot hold one push of `max_push_mb`.
    pub fn gateway_memory(&self) -> Result<memory::GatewayMemory, String> {
        let limit = if self.gateway_memory_mb.is_some() {
            None
        } else {
            memory::container_limit()
        };
        memory::gateway_memory(self.gateway_memory_mb, limit, self.max_push_mb)
    }

    /// Where snapshots of prepared workspaces are kept.
    pub fn snapshot_root(&self) -> std::path::PathBuf {
        if self.snapshot_dir.trim().is_empty() {
            std::env::temp_dir().join("director-snapshots")
        } else {
            std::path::PathBuf::from(self.snapshot_dir.trim())
        }
    }

    /// Where the git gateway's mirrors and quarantines go: a directory of this process's
    /// own under `gateway_dir` (or the temporary directory).
    pub fn gateway_root(&self) -> std::path::PathBuf {
        let base = if self.gateway_dir.trim().is_empty() {
            std::env::temp_dir()
        } else {
            std::path::PathBuf::from(self.gateway_dir.trim())
        };
        base.join(format!("director-git-{}", std::process::id()))
    }

    /// The size of every run's `/tmp`, in MB.
    pub fn tmp_mb(&self) -> u64 {
        self.tmp_mb
            .unwrap_or_else(|| (self.memory_mb / 4).clamp(1, 512))
    }

    /// Every path runs may not change: `protected_paths` and `protected_paths_extra`.
    pub fn protected(&self) -> Vec<String> {
        let mut all = self.protected_paths.clone();
        for p in &self.protected_paths_extra {
            if !all.contains(p) {
                all.push(p.clone());
            }
        }
        all
    }

    /// The default protected paths that `protected_paths` leaves out.
    pub fn unprotected_defaults(&self) -> Vec<String> {
        let given: Vec<&str> = self
            .protected_paths
            .iter()
            .map(|p| p.trim().trim_start_matches('/'))
            .collect();
        crate::domain::protected::default_protected_paths()
            .into_iter()
            .filter(|d| !given.contains(&d.as_str()))
            .collect()
    }
}

impl Settings {
    /// What a Kubernetes run needs that a Docker one does not: a numeric user (a pod's
    /// `runAsUser`), a namespace that can be a name, and no host bind mounts.
    fn validate_kubernetes(&self) -> Result<(), SettingsError> {
        let k = &self.kubernetes;
        if !is_dns_label(&k.namespace) {
            return Err(invalid(
                "kubernetes.namespace",
                format!(
                    "`{}` is not a namespace name (lower-case letters, digits and `-`, at most 63)",
                    k.namespace
                ),
            ));
        }
        if !k.service_account.is_empty() && !is_dns_subdomain(&k.service_account) {
            return Err(invalid(
                "kubernetes.service_account",
                format!("`{}` is not a service account name", k.service_account),
            ));
        }
        if !k.kubeconfig.is_empty() && !Path::new(&k.kubeconfig).is_file() {
            return Err(invalid(
                "kubernetes.kubeconfig",
                format!("{} does not exist", k.kubeconfig),
            ));
        }
        if numeric_user(&self.runner.user).is_none() {
            return Err(invalid(
                "runner.user",
                format!(
                    "`{}`: a Kubernetes run needs a numeric uid:gid (its pod's runAsUser and runAsGroup)",
                    self.runner.user
                ),
            ));
        }
        if !self.runner.mounts.is_empty() {
            return Err(invalid(
                "runner.mounts",
                "host bind mounts are Docker's; a Kubernetes run gets only its workspace and task (put tools in the image)",
            ));
        }
        Ok(())
    }
}

impl Settings {
    /// Whether runs are allow-listed (`runner.egress = "allowlist"`).
    pub fn egress_confined(&self) -> bool {
        self.runner.egress == Egress::Allowlist
    }

    fn validate_egress(&self) -> Result<(), SettingsError> {
        let r = &self.runner;
        for entry in &r.egress_allow {
            entry
                .parse::<crate::egress::Entry>()
                .map_err(|e| invalid("runner.egress_allow", e))?;
        }
        if r.host_firewall && (!self.egress_confined() || r.kind != RunnerKind::Docker) {
            return Err(invalid(
                "runner.host_firewall",
                "applies to allow-listed runs on Docker (runner.kind = \"docker\", runner.egress = \"allowlist\") only: on Kubernetes the runs' NetworkPolicy decides what they reach",
            ));
        }
        if r.host_firewall && r.host_firewall_command.trim().is_empty() {
            return Err(invalid(
                "runner.host_firewall_command",
                "must name the program that installs runner.host_firewall's rule (iptables)",
            ));
        }
        if !self.egress_confined() {
            return Ok(());
        }
        if r.egress_proxy_port == 0 {
            return Err(invalid(
                "runner.egress_proxy_port",
                "must be a port (1-65535)",
            ));
        }
        if r.git_gateway_port == 0 || r.git_gateway_port == r.egress_proxy_port {
            return Err(invalid(
                "runner.git_gateway_port",
                "must be a port (1-65535) other than runner.egress_proxy_port",
            ));
        }
        if r.model_gateway_port == 0
            || r.model_gateway_port == r.egress_proxy_port
            || r.model_gateway_port == r.git_gateway_port
        {
            return Err(invalid(
                "runner.model_gateway_port",
                "must be a port (1-65535) other than the egress proxy's and the git gateway's",
            ));
        }
        crate::domain::run::check_branch_template(&r.branch_template)
            .map_err(|e| invalid("runner.branch_template", e))?;
        crate::domain::protected::Protected::new(&r.protected_paths)
            .map_err(|e| invalid("runner.protected_paths", e))?;
        crate::domain::protected::Protected::new(&r.protected_paths_extra)
            .map_err(|e| invalid("runner.protected_paths_extra", e))?;
        let missing = r.unprotected_defaults();
        if !missing.is_empty() && !r.unprotect_ci {
            return Err(invalid(
                "runner.protected_paths",
                format!(
                    "leaves out {}, which the forge runs or the director reads with the repository's trust: add paths with runner.protected_paths_extra, or set runner.unprotect_ci = true to accept it",
                    missing.join(", ")
                ),
            ));
        }
        if r.tmp_mb.is_some_and(|t| t == 0 || t >= r.memory_mb) {
            return Err(invalid(
                "runner.tmp_mb",
                format!(
                    "must be at least 1 and under runner.memory_mb ({} MB): what the run writes to /tmp is held in its memory",
                    r.memory_mb
                ),
            ));
        }
        self.validate_gateway_limits()?;
        self.validate_egress_network()
    }

    /// The git and model gateways' limits on what one run may ask of them.
    fn validate_gateway_limits(&self) -> Result<(), SettingsError> {
        let r = &self.runner;
        if r.git_timeout_secs == 0 {
            return Err(invalid("runner.git_timeout_secs", "must be at least 1"));
        }
        if r.gateway_body_timeout_secs == 0 {
            return Err(invalid(
                "runner.gateway_body_timeout_secs",
                "must be at least 1",
            ));
        }
        if r.gateway_requests_per_run == 0 {
            return Err(invalid(
                "runner.gateway_requests_per_run",
                "must be at least 1",
            ));
        }
        if r.max_push_mb == 0 {
            return Err(invalid("runner.max_push_mb", "must be at least 1"));
        }
        let memory = r
            .gateway_memory()
            .map_err(|e| invalid("runner.gateway_memory_mb", e))?;
        if !r.snapshot_dir.trim().is_empty() && !Path::new(r.snapshot_dir.trim()).is_absolute() {
            return Err(invalid("runner.snapshot_dir", "must be an absolute path"));
        }
        if r.snapshot_ttl_hours == 0 {
            return Err(invalid(
                "runner.snapshot_ttl_hours",
                "must be at least 1 (set runner.snapshot_max_mb = 0 to keep no snapshot)",
            ));
        }
        if !r.gateway_dir.trim().is_empty() && !Path::new(r.gateway_dir.trim()).is_absolute() {
            return Err(invalid("runner.gateway_dir", "must be an absolute path"));
        }
        // A push's pack is reserved twice on disk (the pack, then its index and the bases
        // a thin pack lacks): one push at the cap must fit.
        if r.gateway_disk_mb < r.max_push_mb.saturating_mul(2) {
            return Err(invalid(
                "runner.gateway_disk_mb",
                format!(
                    "{} MB cannot hold one push of runner.max_push_mb ({} MB) while it is checked (twice its size)",
                    r.gateway_disk_mb, r.max_push_mb
                ),
            ));
        }
        let share = r.gateway_memory_per_run_mb;
        if share != 0 && (share < r.max_push_mb || share > memory.mb) {
            return Err(invalid(
                "runner.gateway_memory_per_run_mb",
                format!(
                    "{share} MB must hold one push of runner.max_push_mb ({} MB) and fit in the gateways' memory ({} MB)",
                    r.max_push_mb, memory.mb
                ),
            ));
        }
        Ok(())
    }

    /// Where an allow-listed run is attached: Docker's egress network, or the Kubernetes
    /// Service and pod labels its NetworkPolicy names.
    fn validate_egress_network(&self) -> Result<(), SettingsError> {
        let r = &self.runner;
        if r.kind == RunnerKind::Docker && r.network != "bridge" {
            return Err(invalid(
                "runner.network",
                format!(
                    "`{}` applies with runner.egress = \"open\" only: an allow-listed run is attached to runner.egress_network (`{}`) and reaches the outside through the egress proxy",
                    r.network, r.egress_network
                ),
            ));
        }
        if r.kind == RunnerKind::Docker && r.egress_network.trim().is_empty() {
            return Err(invalid("runner.egress_network", "must name a network"));
        }
        if r.kind == RunnerKind::Kubernetes {
            let k = &self.kubernetes;
            if k.proxy_host.trim().is_empty() {
                return Err(invalid(
                    "kubernetes.proxy_host",
                    "required with runner.egress = \"allowlist\": the name runs reach the director's egress proxy by (its Service)",
                ));
            }
            if k.proxy_pod_labels.is_empty()
                || k.proxy_pod_labels.iter().any(|l| {
                    l.split_once('=')
                        .is_none_or(|(key, _)| key.trim().is_empty())
                })
            {
                return Err(invalid(
                    "kubernetes.proxy_pod_labels",
                    "required with runner.egress = \"allowlist\": the director's pod labels, as key=value, for the runs' NetworkPolicy",
                ));
            }
        }
        Ok(())
    }
}

/// `uid:gid` (or a lone `uid`, the group the same) as numbers, when both are.
pub fn numeric_user(user: &str) -> Option<(i64, i64)> {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    Some((uid.trim().parse().ok()?, gid.trim().parse().ok()?))
}

/// An RFC 1123 label: what a namespace name must be.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 in all.
pub(super) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// `runner.user` names root: uid 0 (any number of zeros) or `root`, as user or group.
fn is_root(user: &str) -> bool {
    user.split(':').any(|part| {
        let p = part.trim();
        p.eq_ignore_ascii_case("root") || (!p.is_empty() && p.bytes().all(|b| b == b'0'))
    })
}

/// A bind-mount source that is the Docker socket or a directory holding it.
fn binds_docker_socket(source: &str) -> bool {
    let s = source.trim_end_matches('/');
    let s = if s.is_empty() { "/" } else { s };
    s == "/"
        || s.ends_with("docker.sock")
        || ["/var/run/docker.sock", "/run/docker.sock"]
            .iter()
            .any(|sock| sock.starts_with(&format!("{s}/")))
}

impl Settings {
    /// `[runner]`, with what it depends on elsewhere: `[kubernetes]` for its kind, the
    /// egress policy, the director's own secrets (never passed through) and the runner
    /// account of `[forge]`.
    pub(super) fn validate_runner(&self, env: &[(String, String)]) -> Result<(), SettingsError> {
        let r = &self.runner;
        match r.kind {
            RunnerKind::Docker => {}
            RunnerKind::Kubernetes if cfg!(feature = "kubernetes") => self.validate_kubernetes()?,
            RunnerKind::Kubernetes => {
                return Err(invalid(
                    "runner.kind",
                    "this build has no Kubernetes support (built without the `kubernetes` feature)",
                ));
            }
        }
        self.validate_egress()?;
        self.validate_sandbox()?;
        if r.branch_home == BranchHome::Fork && self.forge.kind == ForgeKind::Github {
            return Err(invalid(
                "runner.branch_home",
                "a GitHub App cannot own forks: set \"repository\" (its pull requests' workflows wait for approval only by the repository's own Actions setting; `director hooks check` reports it)",
            ));
        }
        if !r.fork_owner.is_empty() && crate::domain::RepoName::new(&r.fork_owner, "x").is_err() {
            return Err(invalid(
                "runner.fork_owner",
                format!("{:?} is not an organisation's name", r.fork_owner),
            ));
        }
        if r.start_attempts == 0 {
            return Err(invalid("runner.start_attempts", "must be at least 1"));
        }
        if r.timeout_secs == 0 {
            return Err(invalid("runner.timeout_secs", "must be greater than 0"));
        }
        if r.max_open_prs_per_repo == 0 {
            return Err(invalid(
                "runner.max_open_prs_per_repo",
                "must be at least 1 (no run could ever start)",
            ));
        }
        if r.max_concurrent == 0 || r.max_per_repo == 0 {
            return Err(invalid(
                "runner.max_concurrent",
                "limits must be at least 1",
            ));
        }
        if r.user.trim().is_empty() || is_root(&r.user) {
            return Err(invalid(
                "runner.user",
                format!(
                    "`{}` means root; runs never run as root: use a numeric uid:gid such as 1000:1000",
                    r.user
                ),
            ));
        }
        self.validate_passthrough(env)?;
        if r.git_author_email.contains(['<', '>', '\n'])
            || r.git_author_name.contains(['<', '>', '\n'])
        {
            return Err(invalid(
                "runner.git_author_name",
                "an author name or email may not hold `<`, `>` or a line break".to_owned(),
            ));
        }
        validate_mounts(&r.mounts)?;
        if !self.forge.url.is_empty()
            && self.forge.kind == ForgeKind::Forgejo
            && self.runs_configured()
            && (self.forge.runner_login.is_empty() || self.forge.runner_password.is_empty())
        {
            return Err(invalid(
                "forge.runner_login",
                "runs need the runner account and its password (forge.runner_password)",
            ));
        }
        Ok(())
    }

    /// `runner.env_passthrough`: never the director's own configuration, git's credentials
    /// or identity, or a variable that holds one of the director's secrets.
    fn validate_passthrough(&self, env: &[(String, String)]) -> Result<(), SettingsError> {
        for name in &self.runner.env_passthrough {
            if name.to_ascii_uppercase().starts_with("DIRECTOR_") {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` is the director's own configuration; it never goes into a run"
                    ),
                ));
            }
            if crate::domain::run::sets_git_credentials(name) {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` would change how git in the run gets its credentials or identity; the director sets it"
                    ),
                ));
            }
            if let Some((_, value)) = env.iter().find(|(k, _)| k == name)
                && !value.is_empty()
                && self.secrets().any(|s| s.expose() == value)
            {
                return Err(invalid(
                    "runner.env_passthrough",
                    format!(
                        "`{name}` holds one of the director's secrets; it never goes into a run"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `runner.mounts`: `source:/target[:ro|rw]`, never the Docker socket.
fn validate_mounts(mounts: &[String]) -> Result<(), SettingsError> {
    for m in mounts {
        let parts: Vec<&str> = m.split(':').collect();
        if !(2..=3).contains(&parts.len())
            || parts[0].is_empty()
            || !parts[1].starts_with('/')
            || (parts.len() == 3 && parts[2] != "ro" && parts[2] != "rw")
        {
            return Err(invalid(
                "runner.mounts",
                format!("`{m}` is not source:/target[:ro|rw]"),
            ));
        }
        if binds_docker_socket(parts[0]) || parts[1].trim_end_matches('/').ends_with("docker.sock")
        {
            return Err(invalid(
                "runner.mounts",
                format!("`{m}` would hand the run the Docker socket (root on the host)"),
            ));
        }
    }
    Ok(())
}
