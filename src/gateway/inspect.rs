//! What a push would do, found with stock git before anything reaches the forge: the pack is
//! indexed into a quarantine (a fresh object directory beside a mirror of the forge's
//! branches), and the commits it would add are walked there. Nothing in the quarantine is
//! ever referenced from the mirror; it is deleted with the check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use super::pkt::Command;
use super::rules::Protected;
use crate::domain::RepoName;

/// The most commits one push may add: more is not an agent's work on one issue.
pub const MAX_NEW_COMMITS: usize = 2000;

/// Mirrors of the forge's repositories (their branches only), one per repository, each
/// used by one push at a time.
pub struct Mirrors {
    root: PathBuf,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// How git reaches the forge for the mirror: the repository's URL and the credential git's
/// helper answers with (read from the child's environment, never an argument).
pub struct Upstream<'a> {
    pub url: &'a str,
    pub origin: &'a str,
    pub user: &'a str,
    pub token: &'a str,
}

impl Mirrors {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            locks: Mutex::default(),
        }
    }

    /// The repository's mirror, brought up to date with the forge's branches, held for this
    /// caller until the guard drops.
    pub async fn synced(
        &self,
        repo: &RepoName,
        upstream: &Upstream<'_>,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, PathBuf), String> {
        let lock = {
            let mut locks = self
                .locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            locks.entry(repo.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        let dir = self
            .root
            .join(format!("{}+{}.git", repo.owner(), repo.name()));
        if !dir.join("HEAD").exists() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("the mirror's directory: {e}"))?;
            git(&dir, &["init", "--quiet", "--bare"], &[], None).await?;
        }
        let mut env = crate::domain::run::git_environment(
            upstream.origin,
            upstream.user,
            "DIRECTOR_FORGE_TOKEN",
            "director",
            "director@localhost",
        );
        env.push(("DIRECTOR_FORGE_TOKEN".into(), upstream.token.into()));
        git(
            &dir,
            &[
                "fetch",
                "--quiet",
                "--prune",
                "--no-tags",
                upstream.url,
                "+refs/heads/*:refs/heads/*",
            ],
            &env,
            None,
        )
        .await
        .map_err(|e| format!("the forge could not be read: {e}"))?;
        Ok((guard, dir))
    }
}

/// The objects of one push, indexed beside a mirror and removed when dropped.
pub struct Quarantine {
    mirror: PathBuf,
    objects: tempfile::TempDir,
}

impl Quarantine {
    /// Indexes `pack` (thin packs completed from the mirror) into a fresh object directory.
    pub async fn receive(mirror: &Path, pack: &[u8]) -> Result<Self, String> {
        let objects = tempfile::Builder::new()
            .prefix("quarantine-")
            .tempdir_in(mirror)
            .map_err(|e| format!("a quarantine could not be made: {e}"))?;
        let q = Self {
            mirror: mirror.to_owned(),
            objects,
        };
        if !pack.is_empty() {
            std::fs::create_dir_all(q.objects.path().join("pack"))
                .map_err(|e| format!("a quarantine could not be made: {e}"))?;
            q.git(
                &["index-pack", "--stdin", "--fix-thin", "--strict"],
                Some(pack),
            )
            .await
            .map_err(|e| format!("the pack does not read: {e}"))?;
        }
        Ok(q)
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "GIT_OBJECT_DIRECTORY".into(),
                self.objects.path().display().to_string(),
            ),
            (
                "GIT_ALTERNATE_OBJECT_DIRECTORIES".into(),
                self.mirror.join("objects").display().to_string(),
            ),
        ]
    }

    async fn git(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, String> {
        git(&self.mirror, args, &self.env(), stdin).await
    }

    async fn text(&self, args: &[&str]) -> Result<String, String> {
        let out = self.git(args, None).await?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Why the update `c` of the run's branch is refused, or `None`. `base` is the default
    /// branch; `fast_forward_only` for a follow-up.
    pub async fn check(
        &self,
        c: &Command,
        base: &str,
        fast_forward_only: bool,
        protected: &Protected,
    ) -> Result<Option<String>, String> {
        let kind = self.text(&["cat-file", "-t", &c.new]).await;
        if kind.as_deref().map(str::trim) != Ok("commit") {
            return Ok(Some(
                "the new value is not a commit the push carries".into(),
            ));
        }
        let current = self
            .text(&["rev-parse", "--verify", "--quiet", &c.refname])
            .await;
        let current = current
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        if fast_forward_only {
            if current.as_deref() != Some(c.old.as_str()) {
                return Ok(Some(
                    "the branch moved on the forge: fetch and add to it".into(),
                ));
            }
            let ancestor = self
                .git(&["merge-base", "--is-ancestor", &c.old, &c.new], None)
                .await
                .is_ok();
            if !ancestor {
                return Ok(Some(
                    "a follow-up only adds commits (no force-push): the pull request keeps its history"
                        .into(),
                ));
            }
        }
        // The commits the branch would gain that the forge has nowhere, and those it would
        // gain over the base and what the branch holds: if they differ, the push builds on
        // another branch's commits, which were never checked as the run's.
        let base_ref = format!("refs/heads/{base}");
        let mut from_base = vec![
            "rev-list",
            "--max-count",
            "2001",
            c.new.as_str(),
            "--not",
            &base_ref,
        ];
        if let Some(cur) = &current {
            from_base.push(cur);
        }
        let gained = self.text(&from_base).await?;
        let fresh = self
            .text(&["rev-list", "--max-count", "2001", &c.new, "--not", "--all"])
            .await?;
        let gained: Vec<&str> = gained.split_whitespace().collect();
        let fresh: Vec<&str> = fresh.split_whitespace().collect();
        if gained.len() > MAX_NEW_COMMITS {
            return Ok(Some(format!(
                "more than {MAX_NEW_COMMITS} new commits in one push"
            )));
        }
        if gained.len() != fresh.len() {
            return Ok(Some(format!(
                "the branch must grow from {base}: it takes in commits of other branches"
            )));
        }
        for commit in fresh {
            // Plumbing, renames off (a rename would hide its old path), and for a merge only
            // what differs from every parent (what the merge itself brings).
            let out = self
                .git(
                    &[
                        "diff-tree",
                        "-r",
                        "-c",
                        "--root",
                        "--no-renames",
                        "--no-commit-id",
                        "--name-only",
                        "-z",
                        commit,
                    ],
                    None,
                )
                .await?;
            for path in out.split(|b| *b == 0).filter(|p| !p.is_empty()) {
                let path = String::from_utf8_lossy(path);
                if let Some(glob) = protected.covering(&path) {
                    let short = commit.get(..10).unwrap_or(commit);
                    return Ok(Some(format!(
                        "commit {short} changes {path}, which runs may not change ({glob})"
                    )));
                }
            }
        }
        Ok(None)
    }
}

/// Runs git in `dir` with only the environment given (and `PATH`), its stdin from `stdin`.
async fn git(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
    stdin: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("-C")
        .arg(dir)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("git could not start: {e}"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let data = data.to_vec();
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
        });
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("git failed: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        Err(format!(
            "git {} failed: {first}",
            args.first().unwrap_or(&"")
        ))
    }
}
