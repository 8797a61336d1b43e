//! The director's checks of a run's pushed head (`[checks]`), after the agent exited and
//! before the pull request opens. Each side (the base commit, unless its results are kept,
//! then the head) gets a workspace volume of its own: the run's snapshot when it has one,
//! else empty. A short fetch step brings the code in through the git gateway with the checks'
//! own fetch-only credential (`checks-<run id>`, taken only while the run's checks are under
//! way), on the runs' internal network with no proxy. Then each command runs in a container
//! of the run's image, as the run's user with the run's limits, with NO network at all
//! (`network_mode: none`), no secret, no model key, no proxy variable, within the checks' time
//! limit. Their output is kept, redacted, as the checks' transcript.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::{GATEWAY_PASSWORD_VAR, RunAct, TASK_PATH};
use crate::domain::checks::{ChecksDecl, ChecksOutcome, CommandResult, SideResult};
use crate::domain::{RunId, RunRecord};
use crate::engine::act::Acts;
use crate::event::{Event, RunReport};
use crate::runtime::{Exit, RunSpec, SEALED_LABEL, WaitLimits};

/// The label the checks' containers carry: the run's id.
pub const CHECK_LABEL: &str = "director.check-of";

/// The fetch step: clone through the gateway (or reuse the snapshot's clone), fetch one ref
/// and check out one commit, saying which. No hook runs: this container holds the checks'
/// credential, and a snapshot's hooks are whatever the setup left.
const FETCH: &str = r#"set -eu
cd "$HOME"
if [ ! -d checkout/.git ]; then
  rm -rf checkout
  git -c core.hooksPath=/dev/null clone --quiet --no-checkout "$DIRECTOR_CLONE_URL" checkout
fi
cd checkout
git -c core.hooksPath=/dev/null fetch --quiet "$DIRECTOR_CLONE_URL" "$DIRECTOR_FETCH_REF"
git -c core.hooksPath=/dev/null checkout --quiet --force --detach "${DIRECTOR_CHECKOUT:-FETCH_HEAD}"
if [ -n "${DIRECTOR_DIFF_BASE:-}" ]; then
  git -c core.hooksPath=/dev/null diff --name-only "$DIRECTOR_DIFF_BASE" HEAD | head -n 1000 | sed 's/^/checks-changed: /'
fi
echo "checks-commit: $(git rev-parse HEAD)"
"#;

/// A check: the command, in the checkout, its output to the transcript.
const CHECK: &str = r#"cd "$HOME/checkout" || exit 125
exec sh -c "$DIRECTOR_CHECK_COMMAND"
"#;

/// The lines of a command's output kept (the transcript) and shown as its tail.
const OUTPUT_LINES: usize = 2000;
const TAIL_LINES: usize = 40;

/// Which commit a side checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Base,
    Head,
}

impl Side {
    fn as_str(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::Head => "head",
        }
    }
}

/// The id the checks' volume, containers and transcript go by: derived from the run's, so
/// nothing of the run's own (its container, its workspace) is touched, and every attempt
/// finds what an earlier one left.
pub fn checks_id(run_id: &RunId, what: &str) -> RunId {
    let digest = Sha256::digest(format!("checks\0{what}\0{run_id}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    RunId::parse(&hex[..RunId::LEN]).unwrap_or_else(|_| run_id.clone())
}

impl RunAct {
    /// Runs the checks of the run's pushed head, and of its base unless kept.
    pub async fn run_checks(
        &self,
        acts: &Acts,
        run_id: &RunId,
        checks: &ChecksDecl,
    ) -> anyhow::Result<Option<Event>> {
        let run = Self::run_record(acts, run_id).await?;
        if !run.checks_open() {
            return Ok(None);
        }
        let started = Instant::now();
        let transcript = checks_id(run_id, "transcript");
        let image = self.run_image(&run);
        let image_id = self
            .runtime
            .image_id(&image)
            .await
            .unwrap_or_else(|_| image.clone());
        let env_key = environment_key(&image_id, &run, checks);
        let base_commit = self.base_commit(acts, &run).await?;
        let mut commands_ms = 0;
        let mut reused = false;
        let base = match &base_commit {
            None => None,
            Some(commit) => match acts
                .store
                .check_baseline(&run.repo, commit, &env_key)
                .await?
            {
                Some(kept) => {
                    reused = true;
                    self.note(acts, &transcript, &format!(
                        "== base {commit}: the results kept for this base commit and environment are used ==\n"
                    ))
                    .await;
                    Some(kept)
                }
                None => {
                    let (side, _) = self
                        .side(acts, &run, checks, &image, Side::Base, commit, None)
                        .await;
                    commands_ms += side.commands.iter().map(|c| c.millis).sum::<u64>();
                    if side.error.is_none() {
                        acts.store
                            .put_check_baseline(
                                &run.repo,
                                commit,
                                &env_key,
                                &side,
                                acts.clock.now_ms(),
                            )
                            .await?;
                    }
                    Some(side)
                }
            },
        };
        let (head, head_sha) = self
            .side(
                acts,
                &run,
                checks,
                &image,
                Side::Head,
                &run.branch,
                base_commit.as_deref(),
            )
            .await;
        commands_ms += head.commands.iter().map(|c| c.millis).sum::<u64>();
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome = ChecksOutcome {
            head,
            base,
            baseline_reused: reused,
            overhead_ms: elapsed.saturating_sub(commands_ms),
        };
        tracing::info!(
            state = outcome.state().as_str(),
            overhead_ms = outcome.overhead_ms,
            commands_ms,
            baseline_reused = reused,
            "the run's checks ran"
        );
        Ok(Some(Event::Run {
            run_id: run_id.clone(),
            report: RunReport::Checked {
                head: head_sha.unwrap_or_default(),
                base: base_commit,
                outcome,
            },
        }))
    }

    /// The base commit the checks compare with: the run's own, or for a follow-up the one
    /// its pull request's first run started from (a follow-up starts from the branch).
    async fn base_commit(&self, acts: &Acts, run: &RunRecord) -> anyhow::Result<Option<String>> {
        if let Some(c) = &run.base_commit {
            return Ok(Some(c.as_str().to_owned()));
        }
        let Some(pr) = run.followup.as_ref().map(|f| f.pr) else {
            return Ok(None);
        };
        let runs = acts.store.runs_of(&run.issue_ref()).await?;
        Ok(runs
            .iter()
            .filter(|r| r.pr_number == Some(pr))
            .find_map(|r| r.base_commit.as_ref())
            .map(|c| c.as_str().to_owned()))
    }

    /// The image the run ran in.
    fn run_image(&self, run: &RunRecord) -> String {
        run.settings
            .as_ref()
            .and_then(|s| s.image.clone())
            .or_else(|| self.profile(run.agent.as_ref()).map(|p| p.image.clone()))
            .unwrap_or_else(|| self.settings.image.clone())
    }

    /// One side: its workspace, the fetch, each command sealed; the volume removed after.
    /// Never an `Err`: what went wrong is the side's `error` (the status is then `error`).
    #[allow(clippy::too_many_arguments)]
    async fn side(
        &self,
        acts: &Acts,
        run: &RunRecord,
        checks: &ChecksDecl,
        image: &str,
        side: Side,
        reference: &str,
        diff_base: Option<&str>,
    ) -> (SideResult, Option<String>) {
        let id = checks_id(&run.id, side.as_str());
        let transcript = checks_id(&run.id, "transcript");
        let result = self
            .side_in(
                acts,
                run,
                checks,
                image,
                (side, reference, diff_base),
                &id,
                &transcript,
            )
            .await;
        let _ = self.runtime.remove_workspace(&id).await;
        match result {
            Ok(done) => done,
            Err(e) => {
                let why = self.secrets.redact(&run.id, &format!("{e:#}"));
                self.note(
                    acts,
                    &transcript,
                    &format!("== {}: the checks could not run: {why} ==\n", side.as_str()),
                )
                .await;
                (
                    SideResult {
                        commands: Vec::new(),
                        error: Some(why),
                        junit: None,
                        changed_tests: Vec::new(),
                    },
                    None,
                )
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn side_in(
        &self,
        acts: &Acts,
        run: &RunRecord,
        checks: &ChecksDecl,
        image: &str,
        (side, reference, diff_base): (Side, &str, Option<&str>),
        id: &RunId,
        transcript: &RunId,
    ) -> anyhow::Result<(SideResult, Option<String>)> {
        let volume = self.workspace(acts, run, image, id).await?;
        let (commit, changed) = self
            .fetch(run, image, (side, reference, diff_base), id, &volume)
            .await?;
        self.note(
            acts,
            transcript,
            &format!("== {} {commit} ==\n", side.as_str()),
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(checks.timeout_secs);
        let mut commands = Vec::new();
        for command in &checks.commands {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                commands.push(CommandResult {
                    command: command.clone(),
                    exit: None,
                    timed_out: false,
                    millis: 0,
                    tail: "not run: the checks' time limit (checks.timeout_secs) was spent".into(),
                });
                continue;
            }
            let result = self
                .check(acts, run, image, id, &volume, command, left, transcript)
                .await?;
            commands.push(result);
        }
        let junit = if checks.junit.is_empty() {
            None
        } else {
            Some(self.reports(run, image, id, &volume, &checks.junit).await)
        };
        Ok((
            SideResult {
                commands,
                error: None,
                junit,
                changed_tests: changed.into_iter().filter(|p| test_like(p)).collect(),
            },
            Some(commit),
        ))
    }

    /// The `junit` reports the commands left in the side's checkout, read through a sealed
    /// container that never starts: the test cases that ran, or why they cannot be said.
    async fn reports(
        &self,
        run: &RunRecord,
        image: &str,
        id: &RunId,
        volume: &str,
        paths: &[String],
    ) -> crate::domain::checks::Junit {
        const MAX_REPORT: usize = 8 * 1024 * 1024;
        let spec = self.checks_spec(id, run, image, volume, Vec::new(), "exit 1", true);
        let container = match self.runtime.create(&spec).await {
            Ok(c) => c,
            Err(e) => {
                return crate::domain::checks::Junit {
                    ran: Vec::new(),
                    error: Some(format!("the reports could not be read: {e}")),
                };
            }
        };
        let mut ran = std::collections::BTreeSet::new();
        let mut error = None;
        for path in paths {
            let full = format!(
                "{}/checkout/{path}",
                self.settings.workspace.trim_end_matches('/')
            );
            match self.runtime.read_file(&container, &full, MAX_REPORT).await {
                Ok(Some(bytes)) => {
                    match crate::domain::junit::cases(&String::from_utf8_lossy(&bytes)) {
                        Ok(cases) => {
                            ran.extend(cases.into_iter().filter(|c| !c.skipped).map(|c| c.id))
                        }
                        Err(why) => error = Some(format!("`{path}` is not a JUnit report: {why}")),
                    }
                }
                Ok(None) => error = Some(format!("`{path}` was not written (or is over 8 MiB)")),
                Err(e) => error = Some(format!("`{path}` could not be read: {e}")),
            }
            if error.is_some() {
                break;
            }
        }
        let _ = self.runtime.remove(&container).await;
        crate::domain::checks::Junit {
            ran: ran.into_iter().collect(),
            error,
        }
    }

    /// A workspace volume for one side: the run's snapshot unpacked when it has one, else
    /// empty (the fetch step clones).
    async fn workspace(
        &self,
        acts: &Acts,
        run: &RunRecord,
        image: &str,
        id: &RunId,
    ) -> anyhow::Result<String> {
        let volume = self.runtime.make_workspace(id, image).await?;
        let snapshot = run.setup.as_ref().and_then(|s| {
            (self.settings.snapshot_max_mb > 0)
                .then(|| {
                    crate::prepared::store::SnapshotStore::new(
                        self.settings.snapshot_root(),
                        self.settings.snapshot_max_mb,
                        self.settings.snapshot_ttl_hours,
                    )
                })
                .and_then(|store| store.lookup(&run.repo, &s.key, acts.clock.now_ms()))
        });
        if let Some((path, _)) = snapshot {
            let spec = self.checks_spec(id, run, image, &volume, Vec::new(), "exit 1", true);
            let container = self.runtime.create(&spec).await?;
            let file = tokio::fs::File::open(&path).await?;
            let imported = self
                .runtime
                .import_workspace(&container, crate::prepared::stream::file_stream(file))
                .await;
            let _ = self.runtime.remove(&container).await;
            imported?;
        }
        Ok(volume)
    }

    /// The fetch step: the side's commit checked out in the volume, through the gateway with
    /// the checks' fetch-only credential; the commit it checked out.
    async fn fetch(
        &self,
        run: &RunRecord,
        image: &str,
        (side, reference, diff_base): (Side, &str, Option<&str>),
        id: &RunId,
        volume: &str,
    ) -> anyhow::Result<(String, Vec<String>)> {
        let Some(Ok(egress)) = &self.egress else {
            anyhow::bail!("the checks need confined runs (runner.egress = \"allowlist\")");
        };
        let origin = egress.gateway_origin();
        let password = egress.gateway.checks_password(&run.id);
        self.secrets.remember(&run.id, &password);
        let (fetch_ref, checkout) = match side {
            Side::Base => (run.base_branch.clone(), reference.to_owned()),
            Side::Head => (reference.to_owned(), String::new()),
        };
        let mut env = vec![
            ("HOME".to_owned(), self.settings.workspace.clone()),
            ("TMPDIR".to_owned(), crate::runtime::TMP_DIR.to_owned()),
            (
                "DIRECTOR_CLONE_URL".to_owned(),
                format!("{origin}/{}.git", run.repo),
            ),
            ("DIRECTOR_FETCH_REF".to_owned(), fetch_ref),
            ("DIRECTOR_CHECKOUT".to_owned(), checkout),
            (
                "DIRECTOR_DIFF_BASE".to_owned(),
                diff_base.unwrap_or_default().to_owned(),
            ),
            (GATEWAY_PASSWORD_VAR.to_owned(), password),
        ];
        env.extend(crate::domain::run::git_environment(
            &origin,
            &format!("checks-{}", run.id),
            GATEWAY_PASSWORD_VAR,
            "director checks",
            "checks@director.invalid",
        ));
        let spec = self.checks_spec(id, run, image, volume, env, FETCH, false);
        let container = self.runtime.create(&spec).await?;
        let ran = self.run_to_end(&container, Duration::from_secs(300)).await;
        let tail = self
            .runtime
            .logs_tail(&container, 1100)
            .await
            .unwrap_or_default();
        let _ = self.runtime.remove(&container).await;
        let tail = self.secrets.redact(&run.id, &tail);
        match ran? {
            Exit::Code(0) => {}
            other => anyhow::bail!(
                "fetching the {} ({}) failed ({other:?}): {}",
                side.as_str(),
                reference,
                tail.lines().last().unwrap_or_default()
            ),
        }
        let changed = tail
            .lines()
            .filter_map(|l| l.strip_prefix("checks-changed: "))
            .map(str::to_owned)
            .collect();
        let commit = tail
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("checks-commit: "))
            .map(|c| c.trim().to_owned())
            .filter(|c| c.len() >= 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                anyhow::anyhow!("the fetch step did not say which commit it checked out")
            })?;
        Ok((commit, changed))
    }

    /// One command, sealed, within `left`.
    #[allow(clippy::too_many_arguments)]
    async fn check(
        &self,
        acts: &Acts,
        run: &RunRecord,
        image: &str,
        id: &RunId,
        volume: &str,
        command: &str,
        left: Duration,
        transcript: &RunId,
    ) -> anyhow::Result<CommandResult> {
        let env = vec![
            ("HOME".to_owned(), self.settings.workspace.clone()),
            ("TMPDIR".to_owned(), crate::runtime::TMP_DIR.to_owned()),
            ("CI".to_owned(), "true".to_owned()),
            ("DIRECTOR_CHECK_COMMAND".to_owned(), command.to_owned()),
        ];
        let spec = self.checks_spec(id, run, image, volume, env, CHECK, true);
        let started = Instant::now();
        let container = self.runtime.create(&spec).await?;
        let exit = self.run_to_end(&container, left).await;
        let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let output = self
            .runtime
            .logs_tail(&container, OUTPUT_LINES)
            .await
            .unwrap_or_default();
        let _ = self.runtime.remove(&container).await;
        let output = self.secrets.redact(&run.id, &output);
        let exit = exit?;
        let (code, timed_out) = match exit {
            Exit::Code(c) => (Some(c), false),
            Exit::TimedOut | Exit::Idle => (None, true),
        };
        let mut text = format!("$ {command}\n{output}");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&match (code, timed_out) {
            (_, true) => format!(
                "== stopped: the checks' time limit (checks.timeout_secs) was reached after {:.1} s ==\n",
                millis as f64 / 1000.0
            ),
            (Some(c), _) => format!("== exit {c} in {:.1} s ==\n", millis as f64 / 1000.0),
            (None, _) => "== no exit ==\n".to_owned(),
        });
        self.note(acts, transcript, &text).await;
        let lines: Vec<&str> = output.lines().collect();
        let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        Ok(CommandResult {
            command: command.to_owned(),
            exit: code,
            timed_out,
            millis,
            tail: crate::domain::checks::cut(&tail, 4000),
        })
    }

    /// Starts the container and waits for it within `timeout` (stopped after).
    async fn run_to_end(
        &self,
        container: &str,
        timeout: Duration,
    ) -> Result<Exit, crate::runtime::RuntimeError> {
        self.runtime.start(container).await?;
        self.runtime
            .wait(
                container,
                WaitLimits {
                    timeout,
                    idle: None,
                    grace: Duration::from_secs(self.settings.stop_grace_secs.min(10)),
                },
            )
            .await
    }

    /// Appends to the checks' transcript (already redacted); a transcript that cannot be
    /// written loses text, never the checks' result.
    async fn note(&self, acts: &Acts, transcript: &RunId, text: &str) {
        let cap = self.settings.transcript_max_mb.saturating_mul(1024 * 1024);
        if cap == 0 {
            return;
        }
        if let Err(e) = acts
            .store
            .append_transcript(transcript, text, None, acts.clock.now_ms(), cap)
            .await
        {
            tracing::warn!(error = %format!("{e:#}"), "the checks' transcript could not be kept");
        }
    }

    /// A container of the checks: named and labelled apart from the run's (never its run
    /// label), on the side's volume; `sealed`: no network at all.
    #[allow(clippy::too_many_arguments)]
    fn checks_spec(
        &self,
        id: &RunId,
        run: &RunRecord,
        image: &str,
        volume: &str,
        env: Vec<(String, String)>,
        script: &str,
        sealed: bool,
    ) -> RunSpec {
        let mut labels = HashMap::from([
            (CHECK_LABEL.to_owned(), run.id.to_string()),
            ("director.repo".to_owned(), run.repo.to_string()),
            ("director.issue".to_owned(), run.number.to_string()),
        ]);
        if sealed {
            labels.insert(SEALED_LABEL.to_owned(), run.id.to_string());
        }
        RunSpec {
            run_id: id.clone(),
            image: image.to_owned(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            env,
            labels,
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

/// Whether a path the change touched looks like a test: a part of it names tests or specs.
fn test_like(path: &str) -> bool {
    path.split('/').any(|part| {
        let part = part.to_ascii_lowercase();
        part.contains("test") || part.contains("spec")
    })
}

/// The baseline's key: the image, the prepared workspace and the checks themselves.
fn environment_key(image_id: &str, run: &RunRecord, checks: &ChecksDecl) -> String {
    let mut h = Sha256::new();
    h.update(image_id.as_bytes());
    h.update([0]);
    h.update(run.setup.as_ref().map_or("", |s| s.key.as_str()).as_bytes());
    h.update([0]);
    for c in &checks.commands {
        h.update(c.as_bytes());
        h.update([0]);
    }
    h.update([1]);
    for j in &checks.junit {
        h.update(j.as_bytes());
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_ids_are_valid_apart_from_the_run_and_from_each_other() {
        let run = crate::domain::run::test_id("0123456789ab");
        let (base, head, t) = (
            checks_id(&run, "base"),
            checks_id(&run, "head"),
            checks_id(&run, "transcript"),
        );
        assert_ne!(base, run);
        assert_ne!(base, head);
        assert_ne!(head, t);
        assert_eq!(
            checks_id(&run, "base"),
            base,
            "every attempt finds the same"
        );
    }
}
