//! A run's setup phase (`[setup]` of `.director.toml`), before its agent: the workspace volume
//! is prepared by the repository's own command, in the run's image, as the run's user, with
//! the repository cloned at the run's base commit. The setup has a network and secrets of its
//! own: the egress proxy with the setup's allow-list and a fetch-only git credential (both
//! `setup-<run id>`, taken only until the setup ends), and the `[setup_secrets]` it names as
//! environment variables. It gets no model key and cannot push. Its workspace is then read
//! once as a tar stream and searched for every secret it was given: a hit ends the run before
//! the agent starts, naming the file. A clean workspace is kept as a snapshot, keyed by the
//! image, the command and the cache-key files, and a later run with the same key starts from
//! it without running the setup (warm).

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use super::{GATEWAY_PASSWORD_VAR, RunAct, TASK_PATH};
use crate::domain::RunRecord;
use crate::domain::setup::{SetupDecl, SetupMode, SetupOutcome, short};
use crate::engine::act::Acts;
use crate::prepared::scan::{Pattern, Scanned};
use crate::prepared::store::{Meta, SnapshotStore};
use crate::runtime::{Exit, RunSpec, RuntimeError, SETUP_LABEL, TarStream, WaitLimits};

/// What the setup's container runs: clone through the gateway (or reuse a clone), bring it to
/// the base commit, run the repository's command in it, and keep whatever the command left
/// untracked out of the agent's commits. The command comes in `DIRECTOR_SETUP_COMMAND`.
const SCRIPT: &str = r#"set -eu
cd "$HOME"
if [ ! -d checkout/.git ]; then
  git clone --quiet --no-checkout "$DIRECTOR_CLONE_URL" checkout
fi
cd checkout
git fetch --quiet origin "$DIRECTOR_BASE_BRANCH"
git checkout --quiet --detach "${DIRECTOR_BASE_COMMIT:-FETCH_HEAD}"
echo "setup: running the repository's setup command"
sh -c "$DIRECTOR_SETUP_COMMAND"
mkdir -p .git/info
git ls-files --others --exclude-standard >> .git/info/exclude
echo "setup: done"
"#;

/// How a prepared workspace came to be, for the agent's container.
pub(super) struct Prepared {
    pub volume: String,
    pub outcome: SetupOutcome,
}

/// Why the agent does not start: said on the issue as the run's refusal.
pub(super) struct SetupFailed(pub String);

/// The variable the agent is told how its workspace was prepared in (`cold` or `warm`).
pub const PREPARED_VAR: &str = "DIRECTOR_PREPARED";

impl RunAct {
    /// Prepares the run's workspace: warm from a snapshot when one matches, else cold by
    /// running the setup. What became of it is recorded on the run before this returns (and so
    /// before the agent's container exists): from then on the setup's credentials are refused.
    pub(super) async fn prepare(
        &self,
        acts: &Acts,
        run: &RunRecord,
        setup: &SetupDecl,
        image: &str,
    ) -> anyhow::Result<Result<Prepared, SetupFailed>> {
        let started = Instant::now();
        let image_id = self
            .runtime
            .image_id(image)
            .await
            .unwrap_or_else(|_| image.to_owned());
        let key = self.snapshot_key(acts, run, setup, &image_id).await?;
        let store = self.snapshot_store();
        let mut note = None;
        if let Some(store) = &store
            && let Some((path, meta)) = store.lookup(&run.repo, &key, acts.clock.now_ms())
        {
            match self.restore(run, image, &path).await {
                Ok(volume) => {
                    store.touch(&run.repo, &meta, acts.clock.now_ms());
                    let outcome = SetupOutcome {
                        mode: SetupMode::Warm,
                        key,
                        millis: elapsed_ms(started),
                        exit: None,
                        snapshot: None,
                    };
                    acts.store.put_run_setup(&run.id, &outcome).await?;
                    tracing::info!(
                        key = short(&outcome.key),
                        "the run starts warm from a snapshot"
                    );
                    return Ok(Ok(Prepared { volume, outcome }));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a snapshot could not be restored; setting up cold");
                    note = Some(format!(
                        "the snapshot could not be restored ({}), so the setup ran cold",
                        one_line(&e.to_string())
                    ));
                }
            }
        }
        let result = self
            .cold(acts, run, setup, image, &key, store.as_ref(), &image_id)
            .await;
        let (mut outcome, failed, volume) = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = self.runtime.remove_workspace(&run.id).await;
                return Err(e);
            }
        };
        outcome.millis = elapsed_ms(started);
        if let Some(n) = note {
            outcome.snapshot = Some(match outcome.snapshot.take() {
                Some(s) => format!("{n}; {s}"),
                None => n,
            });
        }
        acts.store.put_run_setup(&run.id, &outcome).await?;
        if let Some(why) = failed {
            let _ = self.runtime.remove_workspace(&run.id).await;
            return Ok(Err(SetupFailed(why)));
        }
        Ok(Ok(Prepared { volume, outcome }))
    }

    fn snapshot_store(&self) -> Option<SnapshotStore> {
        (self.settings.snapshot_max_mb > 0).then(|| {
            SnapshotStore::new(
                self.settings.snapshot_root(),
                self.settings.snapshot_max_mb,
                self.settings.snapshot_ttl_hours,
            )
        })
    }

    /// The key: the repository, the image's id, the command, and each cache-key file as it
    /// is at the run's base commit.
    async fn snapshot_key(
        &self,
        acts: &Acts,
        run: &RunRecord,
        setup: &SetupDecl,
        image_id: &str,
    ) -> anyhow::Result<String> {
        let at = run
            .base_commit
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| run.base_branch.clone());
        let mut files = Vec::new();
        for path in &setup.cache_key {
            let found = acts
                .forge
                .file_at(&run.repo, path, &at, 16 * 1024 * 1024)
                .await
                .map_err(|e| anyhow::anyhow!("reading the cache-key file `{path}`: {e}"))?;
            files.push((
                path.clone(),
                match found {
                    crate::forge::FileAt::File(bytes) => Some(bytes),
                    _ => None,
                },
            ));
        }
        Ok(crate::prepared::snapshot_key(
            &run.repo.to_string(),
            image_id,
            &setup.command,
            &files,
        ))
    }

    /// A new workspace volume with the snapshot unpacked into it (through a container of the
    /// run's image that never starts).
    async fn restore(
        &self,
        run: &RunRecord,
        image: &str,
        path: &std::path::Path,
    ) -> Result<String, RuntimeError> {
        let volume = self.runtime.make_workspace(&run.id, image).await?;
        let spec = self.setup_spec(run, image, &volume, Vec::new());
        let id = self.runtime.create(&spec).await?;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| RuntimeError::Engine(format!("opening the snapshot: {e}")))?;
        let imported = self.runtime.import_workspace(&id, file_stream(file)).await;
        let removed = self.runtime.remove(&id).await;
        if let Err(e) = imported.and(removed) {
            let _ = self.runtime.remove_workspace(&run.id).await;
            return Err(e);
        }
        Ok(volume)
    }

    /// Runs the setup and checks what it left: the outcome, why the agent may not start
    /// (when it may not), and the volume.
    #[allow(clippy::too_many_arguments)]
    async fn cold(
        &self,
        acts: &Acts,
        run: &RunRecord,
        setup: &SetupDecl,
        image: &str,
        key: &str,
        store: Option<&SnapshotStore>,
        image_id: &str,
    ) -> anyhow::Result<(SetupOutcome, Option<String>, String)> {
        let Some(Ok(egress)) = &self.egress else {
            anyhow::bail!("a setup phase needs confined runs (runner.egress = \"allowlist\")");
        };
        let volume = self.runtime.make_workspace(&run.id, image).await?;
        let mut env = self.setup_environment(run, setup, egress);
        let mut patterns = Vec::new();
        for name in &setup.secrets {
            let Some(secret) = self.setup_secrets.get(name) else {
                anyhow::bail!("the setup secret `{name}` is no longer configured");
            };
            let value = secret.value.expose();
            self.secrets.remember(&run.id, value);
            patterns.extend(forms(name, value));
            env.push((name.clone(), value.to_owned()));
        }
        for (name, value) in [
            (
                "the setup's git credential",
                egress.gateway.setup_password(&run.id),
            ),
            (
                "the setup's proxy credential",
                egress.proxy.setup_password(&run.id),
            ),
        ] {
            self.secrets.remember(&run.id, &value);
            patterns.extend(forms(name, &value));
        }
        let spec = self.setup_spec(run, image, &volume, env);
        let id = self.runtime.create(&spec).await?;
        self.runtime.start(&id).await?;
        let limits = WaitLimits {
            timeout: Duration::from_secs(setup.timeout_secs),
            idle: None,
            grace: Duration::from_secs(self.settings.stop_grace_secs.min(30)),
        };
        let exit = self.runtime.wait(&id, limits).await?;
        let mut outcome = SetupOutcome {
            mode: SetupMode::Cold,
            key: key.to_owned(),
            millis: 0,
            exit: match exit {
                Exit::Code(c) => Some(c),
                _ => None,
            },
            snapshot: None,
        };
        let failure = match exit {
            Exit::Code(0) => None,
            Exit::Code(c) => Some(format!("the setup failed (exit {c})")),
            Exit::TimedOut | Exit::Idle => Some(format!(
                "the setup did not end within its setup.timeout_secs ({} s) and was stopped",
                setup.timeout_secs
            )),
        };
        if let Some(failure) = failure {
            let tail = self
                .runtime
                .logs_tail(&id, self.settings.log_tail_lines)
                .await
                .unwrap_or_default();
            let tail = self.secrets.redact(&run.id, &tail);
            let _ = self.runtime.remove(&id).await;
            outcome.snapshot = Some("no snapshot is taken of a failed setup".into());
            let why = format!(
                "{failure}; the agent was not started. The end of its output:\n\n```\n{}\n```",
                tail.trim_end().replace("```", "'''")
            );
            return Ok((outcome, Some(why), volume));
        }
        let pending = store.and_then(|s| s.begin(&run.repo, key).ok());
        let max = store.map_or(0, SnapshotStore::max_bytes);
        let tar = self.runtime.export_workspace(&id).await?;
        let (scanned, pending) = scan_stream(tar, patterns, pending, max).await?;
        let _ = self.runtime.remove(&id).await;
        match scanned {
            Scanned::Hit { path, name } => {
                if let Some(p) = pending {
                    SnapshotStore::abandon(p);
                }
                outcome.snapshot =
                    Some("no snapshot is taken of a workspace that held a secret".into());
                let why = format!(
                    "the setup left the value of {} in `{path}` of the workspace; the agent was not started (a secret given to the setup must not reach the agent)",
                    if name.starts_with("the setup's") {
                        name
                    } else {
                        format!("the setup secret `{name}`")
                    }
                );
                Ok((outcome, Some(why), volume))
            }
            Scanned::Clean { bytes, kept, .. } => {
                outcome.snapshot = Some(match (store, pending) {
                    (None, _) => "no snapshot kept (runner.snapshot_max_mb = 0)".to_owned(),
                    (Some(_), None) => {
                        "the snapshot was not kept: its file could not be made".to_owned()
                    }
                    (Some(store), Some(p)) if kept => {
                        let meta = Meta {
                            repo: run.repo.to_string(),
                            key: key.to_owned(),
                            bytes: 0,
                            created_ms: acts.clock.now_ms(),
                            used_ms: acts.clock.now_ms(),
                            image: image_id.to_owned(),
                            command: setup.command.clone(),
                        };
                        keep_snapshot(store, p, meta, acts.clock.now_ms())
                    }
                    (Some(_), Some(p)) => {
                        SnapshotStore::abandon(p);
                        format!(
                            "the snapshot was not kept: the workspace ({} MB) is over runner.snapshot_max_mb",
                            bytes / (1024 * 1024)
                        )
                    }
                });
                Ok((outcome, None, volume))
            }
        }
    }

    /// The setup phase's variables: no model key, no pass-through, its own credentials.
    fn setup_environment(
        &self,
        run: &RunRecord,
        setup: &SetupDecl,
        egress: &super::RunEgress,
    ) -> Vec<(String, String)> {
        let repo = run.repo.to_string();
        let origin = egress.gateway_origin();
        let mut env = vec![
            ("DIRECTOR_RUN_ID".to_owned(), run.id.to_string()),
            ("DIRECTOR_REPO".to_owned(), repo.clone()),
            ("DIRECTOR_BASE_BRANCH".to_owned(), run.base_branch.clone()),
            (
                "DIRECTOR_BASE_COMMIT".to_owned(),
                run.base_commit
                    .as_ref()
                    .map(|c| c.as_str().to_owned())
                    .unwrap_or_default(),
            ),
            (
                "DIRECTOR_CLONE_URL".to_owned(),
                format!("{origin}/{repo}.git"),
            ),
            (
                GATEWAY_PASSWORD_VAR.to_owned(),
                egress.gateway.setup_password(&run.id),
            ),
            ("DIRECTOR_SETUP_COMMAND".to_owned(), setup.command.clone()),
            ("HOME".to_owned(), self.settings.workspace.clone()),
            ("TMPDIR".to_owned(), crate::runtime::TMP_DIR.to_owned()),
        ];
        env.extend(crate::domain::run::git_environment(
            &origin,
            &format!("setup-{}", run.id),
            GATEWAY_PASSWORD_VAR,
            "director setup",
            "setup@director.invalid",
        ));
        let url = egress.proxy.setup_url_for(&run.id, &egress.host);
        for (name, value) in egress.environment(&run.id) {
            let setup_value = if name.eq_ignore_ascii_case("no_proxy") {
                value
            } else {
                url.clone()
            };
            env.push((name, setup_value));
        }
        env
    }

    fn setup_spec(
        &self,
        run: &RunRecord,
        image: &str,
        volume: &str,
        env: Vec<(String, String)>,
    ) -> RunSpec {
        RunSpec {
            run_id: run.id.clone(),
            image: image.to_owned(),
            command: vec!["sh".into(), "-c".into(), SCRIPT.into()],
            env,
            labels: std::collections::HashMap::from([
                (SETUP_LABEL.to_owned(), run.id.to_string()),
                ("director.repo".to_owned(), run.repo.to_string()),
                ("director.issue".to_owned(), run.number.to_string()),
            ]),
            task_path: TASK_PATH.to_owned(),
            task: Vec::new(),
            mounts: Vec::new(),
            result_path: None,
            confined: true,
            workspace_volume: Some(volume.to_owned()),
            setup_phase: true,
        }
    }
}

/// A secret's forms to look for, under its name.
fn forms(name: &str, value: &str) -> Vec<Pattern> {
    super::secrets::encodings(value)
        .into_iter()
        .filter(|f| f.len() >= 8)
        .map(|f| Pattern {
            name: name.to_owned(),
            bytes: f.into_bytes(),
        })
        .collect()
}

fn keep_snapshot(
    store: &SnapshotStore,
    pending: crate::prepared::store::Pending,
    mut meta: Meta,
    now_ms: i64,
) -> String {
    meta.bytes = pending.file.metadata().map(|m| m.len()).unwrap_or(0);
    let mb = meta.bytes as f64 / (1024.0 * 1024.0);
    match store.keep(pending, &meta, now_ms) {
        Ok(()) => format!("snapshot `{}` kept ({mb:.1} MB)", short(&meta.key)),
        Err(e) => format!("the snapshot was not kept: {}", one_line(&e.to_string())),
    }
}

/// Scans the workspace's tar stream on a blocking thread (the tar reader is synchronous),
/// fed by this task chunk by chunk: memory stays a few chunks whatever the size.
async fn scan_stream(
    mut tar: TarStream,
    patterns: Vec<Pattern>,
    pending: Option<crate::prepared::store::Pending>,
    max: u64,
) -> anyhow::Result<(Scanned, Option<crate::prepared::store::Pending>)> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let scan = tokio::task::spawn_blocking(move || {
        let reader = ChannelReader {
            rx,
            current: bytes::Bytes::new(),
        };
        let mut pending = pending;
        let out = pending
            .as_mut()
            .map(|p| std::io::BufWriter::new(&mut p.file));
        let scanned = crate::prepared::scan::scan_and_copy(reader, true, &patterns, out, max);
        (scanned, pending)
    });
    while let Some(chunk) = tar.next().await {
        let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
        let failed = chunk.is_err();
        if tx.send(chunk).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    let (scanned, pending) = scan.await?;
    let scanned = scanned.map_err(|e| anyhow::anyhow!("reading the setup's workspace: {e}"))?;
    Ok((scanned, pending))
}

struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
    current: bytes::Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// A file as a stream of chunks, read as they are sent.
pub(super) fn file_stream(file: tokio::fs::File) -> TarStream {
    futures_util::stream::unfold(Some(file), |file| async move {
        use tokio::io::AsyncReadExt as _;
        let mut file = file?;
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((
                Err(RuntimeError::Engine(format!("reading the snapshot: {e}"))),
                None,
            )),
        }
    })
    .boxed()
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
