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

use super::{GATEWAY_PASSWORD_VAR, RunAct, TASK_PATH};
use crate::domain::RunRecord;
use crate::domain::setup::{SetupDecl, SetupMode, SetupOutcome, short};
use crate::engine::act::Acts;
use crate::prepared::scan::{Pattern, Scanned};
use crate::prepared::store::{Meta, SnapshotStore};
use crate::prepared::stream::{file_stream, git_stream, scan_stream};
use crate::runtime::{Exit, RunSpec, RuntimeError, SETUP_LABEL, WaitLimits};

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

/// Why a run with a `[setup]` does not start on a runtime that cannot keep the setup apart.
pub const NOT_ON_THIS_RUNTIME: &str = "the repository's `[setup]` needs runs on Docker (runner.kind = \"docker\") in this version: on Kubernetes the setup's own network and secrets, and the search of the workspace for those secrets before the agent starts, are not yet kept apart, so no setup runs there and nothing was started (docs/repo-settings.md)";

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
        // Whatever the agent prints is redacted of the setup's secrets too, warm or cold.
        for name in &setup.secrets {
            if let Some(secret) = self.setup_secrets.get(name) {
                self.secrets.remember(&run.id, secret.value.expose());
            }
        }
        let image_id = self
            .runtime
            .image_id(image)
            .await
            .unwrap_or_else(|_| image.to_owned());
        let key = self.snapshot_key(acts, run, setup, &image_id).await?;
        let store = self.snapshot_store();
        let mut note = None;
        if self.settings.snapshot_max_mb > 0
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
        let result = self.cold(acts, run, setup, image, &key, &image_id).await;
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

    fn snapshot_store(&self) -> SnapshotStore {
        SnapshotStore::new(
            self.settings.snapshot_root(),
            self.settings.snapshot_max_mb,
            self.settings.snapshot_ttl_hours,
        )
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
        let extra = key_extra(setup, &self.setup_secrets, &self.settings.user);
        snapshot_key(acts.forge.as_ref(), &run.repo, &at, setup, image_id, &extra).await
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
    async fn cold(
        &self,
        acts: &Acts,
        run: &RunRecord,
        setup: &SetupDecl,
        image: &str,
        key: &str,
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
            grace: Duration::from_secs(self.settings.stop_grace_secs.min(5)),
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
        // The workspace is copied as it is read; the agent starts from that copy, unpacked into
        // a new volume, never from the volume the setup wrote (what the read did not see, such
        // as extended attributes, stays behind).
        let copies = self.snapshot_store();
        let limit = self.settings.workspace_mb.saturating_mul(1024 * 1024);
        let within = Duration::from_secs(setup.timeout_secs);
        let copied = match copies.begin(&run.repo, key) {
            Ok(pending) => {
                let tar = self.runtime.export_workspace(&id).await?;
                let read = scan_stream(tar, patterns.clone(), Some(pending), limit);
                match tokio::time::timeout(within, read).await {
                    Err(_) => {
                        let _ = self.runtime.remove(&id).await;
                        outcome.snapshot =
                            Some("no snapshot is taken of a workspace not read in time".into());
                        let why = format!(
                            "the setup's workspace could not be read within setup.timeout_secs ({} s); the agent was not started",
                            setup.timeout_secs
                        );
                        return Ok((outcome, Some(why), volume));
                    }
                    Ok(Ok((scanned, Some(pending)))) => Ok((scanned, pending)),
                    Ok(Ok((_, None))) => Err("the copy was lost".to_owned()),
                    Ok(Err(e)) => Err(format!("{e:#}")),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        let (scanned, pending) = match copied {
            Ok(v) => v,
            Err(why) => {
                // No copy could be written (the disk holding snapshots full, say): the
                // workspace is read again where it is, and the agent starts in it.
                tracing::warn!(error = %why, "the setup's workspace could not be copied; reading it in place");
                let checked =
                    tokio::time::timeout(within, self.check_in_place(&id, &patterns, limit)).await;
                let _ = self.runtime.remove(&id).await;
                let refusal = match checked {
                    Ok(r) => r?,
                    Err(_) => Some(format!(
                        "the setup's workspace could not be read within setup.timeout_secs ({} s); the agent was not started",
                        setup.timeout_secs
                    )),
                };
                outcome.snapshot = Some(format!(
                    "the snapshot was not kept ({}), so the agent starts in the setup's own volume",
                    one_line(&why)
                ));
                return Ok((outcome, refusal, volume));
            }
        };
        let _ = self.runtime.remove(&id).await;
        // A refused workspace: its copy dropped, said in the outcome.
        let refuse = |mut outcome: SetupOutcome, pending, why: String| {
            SnapshotStore::abandon(pending);
            outcome.snapshot = Some("no snapshot is taken of a refused workspace".into());
            Ok((outcome, Some(why), volume.clone()))
        };
        let bytes = match scanned {
            Scanned::Hit { path, name } => {
                return refuse(outcome, pending, secret_left(&name, &path));
            }
            Scanned::Clean { kept: false, .. } => {
                return refuse(outcome, pending, self.over_workspace());
            }
            Scanned::Clean { bytes, .. } => bytes,
        };
        let (pending, in_git) = scan_git(pending, patterns).await?;
        if let Some((path, name)) = in_git {
            return refuse(outcome, pending, secret_left(&name, &path));
        }
        let keeping = self.settings.snapshot_max_mb > 0 && bytes <= copies.max_bytes();
        let (path, temporary) = if keeping {
            let meta = Meta {
                repo: run.repo.to_string(),
                key: key.to_owned(),
                bytes: 0,
                created_ms: acts.clock.now_ms(),
                used_ms: acts.clock.now_ms(),
                image: image_id.to_owned(),
                command: setup.command.clone(),
            };
            let final_path = pending.final_path().to_owned();
            let (said, kept) = keep_snapshot(&copies, pending, meta, acts.clock.now_ms());
            outcome.snapshot = Some(said);
            if !kept {
                anyhow::bail!("the setup's workspace could not be kept to start the agent from");
            }
            (final_path, false)
        } else {
            outcome.snapshot = Some(if self.settings.snapshot_max_mb == 0 {
                "no snapshot kept (runner.snapshot_max_mb = 0)".to_owned()
            } else {
                format!(
                    "the snapshot was not kept: the workspace ({} MB) is over runner.snapshot_max_mb",
                    bytes / (1024 * 1024)
                )
            });
            (pending.finish()?, true)
        };
        let restored = self.restore(run, image, &path).await;
        if temporary {
            let _ = std::fs::remove_file(&path);
        }
        let volume = restored?;
        Ok((outcome, None, volume))
    }

    /// Why the agent does not start in a workspace over its size.
    fn over_workspace(&self) -> String {
        format!(
            "the setup left more than runner.workspace_mb ({} MB) in the workspace; the agent was not started",
            self.settings.workspace_mb
        )
    }

    /// The setup's workspace read where it is, without a copy (none could be written): why
    /// the agent may not start in it, if it may not.
    async fn check_in_place(
        &self,
        id: &str,
        patterns: &[Pattern],
        limit: u64,
    ) -> anyhow::Result<Option<String>> {
        let tar = self.runtime.export_workspace(id).await?;
        let (scanned, _) = scan_stream(tar, patterns.to_vec(), None, limit).await?;
        match scanned {
            Scanned::Hit { path, name } => return Ok(Some(secret_left(&name, &path))),
            Scanned::Clean { kept: false, .. } => return Ok(Some(self.over_workspace())),
            Scanned::Clean { .. } => {}
        }
        let tar = self.runtime.export_workspace(id).await?;
        Ok(git_stream(tar, patterns.to_vec())
            .await?
            .map(|(path, name)| secret_left(&name, &path)))
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

/// The snapshot key of `setup` in `repo` at commit (or branch) `at`, for an image whose id is
/// `image_id`: the repository, the image, the command, and each cache-key file as it is there.
pub async fn snapshot_key(
    forge: &dyn crate::forge::Forge,
    repo: &crate::domain::RepoName,
    at: &str,
    setup: &SetupDecl,
    image_id: &str,
    extra: &str,
) -> anyhow::Result<String> {
    let mut files = Vec::new();
    for path in &setup.cache_key {
        let found = forge
            .file_at(repo, path, at, 16 * 1024 * 1024)
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
    let what = format!("{}\0{extra}", setup.command);
    Ok(crate::prepared::snapshot_key(
        &repo.to_string(),
        image_id,
        &what,
        &files,
    ))
}

/// What else a snapshot depends on beside the command and the files: the secrets it was made
/// with (their names, and a digest of each value: a withdrawn or rotated secret makes it
/// cold), the hosts it could reach, and the user its files belong to.
pub fn key_extra(
    setup: &SetupDecl,
    secrets: &std::collections::BTreeMap<String, crate::settings::setup::SetupSecret>,
    user: &str,
) -> String {
    use sha2::Digest as _;
    let mut names = setup.secrets.clone();
    names.sort();
    let secrets: Vec<String> = names
        .iter()
        .map(|n| {
            let value = secrets.get(n).map(|s| s.value.expose()).unwrap_or_default();
            let digest = sha2::Sha256::digest(format!("director-snapshot\0{value}"));
            format!("{n}={}", &hex::encode(digest)[..16])
        })
        .collect();
    let mut hosts = setup.egress_allow.clone();
    hosts.sort();
    format!(
        "secrets:{};egress:{};user:{user}",
        secrets.join(","),
        hosts.join(",")
    )
}

/// A secret's forms to look for, under its name: those the transcript's redaction knows, its
/// URL encoding in lower case (git's credential store writes it so), and its hex.
fn forms(name: &str, value: &str) -> Vec<Pattern> {
    let mut all = super::secrets::encodings(value);
    all.push(lower_percent(value));
    all.push(hex::encode(value));
    all.push(hex::encode_upper(value));
    all.into_iter()
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
) -> (String, bool) {
    meta.bytes = pending.file.metadata().map(|m| m.len()).unwrap_or(0);
    let mb = meta.bytes as f64 / (1024.0 * 1024.0);
    match store.keep(pending, &meta, now_ms) {
        Ok(()) => (
            format!("snapshot `{}` kept ({mb:.1} MB)", short(&meta.key)),
            true,
        ),
        Err(e) => (
            format!("the snapshot was not kept: {}", one_line(&e.to_string())),
            false,
        ),
    }
}

/// `value` percent-encoded as the transcript's redaction does, with lower-case hex digits.
fn lower_percent(value: &str) -> String {
    let upper = crate::forge::percent_encode(value);
    let mut out = String::with_capacity(upper.len());
    let mut rest = upper.as_str();
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i..i + 3).unwrap_or(&rest[i..]);
        out.push_str(&code.to_ascii_lowercase());
        rest = &rest[(i + code.len())..];
    }
    out.push_str(rest);
    out
}

/// Why the agent does not start: a secret's name and where, the path made inert.
fn secret_left(name: &str, path: &str) -> String {
    let path: String = path
        .chars()
        .map(|c| if c == '`' || c.is_control() { '?' } else { c })
        .take(200)
        .collect();
    format!(
        "the setup left the value of {} in `{path}` of the workspace; the agent was not started (a secret given to the setup must not reach the agent)",
        if name.starts_with("the setup's") {
            name.to_owned()
        } else {
            format!("the setup secret `{name}`")
        }
    )
}

/// The copy's git objects searched once inflated, on a blocking thread.
async fn scan_git(
    mut pending: crate::prepared::store::Pending,
    patterns: Vec<Pattern>,
) -> anyhow::Result<(crate::prepared::store::Pending, Option<(String, String)>)> {
    use std::io::{Seek as _, Write as _};
    let found = tokio::task::spawn_blocking(move || {
        pending.file.flush()?;
        let mut file = pending.file.try_clone()?;
        file.rewind()?;
        let found =
            crate::prepared::scan::scan_git_objects(std::io::BufReader::new(file), &patterns)?;
        Ok::<_, std::io::Error>((pending, found))
    })
    .await??;
    Ok(found)
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
