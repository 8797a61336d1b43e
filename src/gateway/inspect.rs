//! What a push would do, found with stock git before anything reaches the forge: the pack is
//! indexed into a quarantine (a fresh object directory beside a mirror of the forge's
//! branches), and the commits it would add are walked there. Nothing in the quarantine is
//! ever referenced from the mirror; it is deleted with the check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use tokio::io::AsyncWriteExt;

use super::pkt::Command;
use crate::domain::RepoName;
use crate::domain::protected::Protected;

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
    /// The base branch and the run's branch: the mirror holds what they hold.
    pub base: &'a str,
    pub branch: &'a str,
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

    /// Removes every mirror (at shutdown: they are a cache of this process).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }

    /// Brings the repository's mirror up to date unless a push or another sync holds it: a
    /// run that fetches will likely push, and a warm mirror makes its push's check quick.
    pub async fn warm(&self, repo: &RepoName, upstream: &Upstream<'_>) {
        let busy = self.lock_of(repo).try_lock_owned().is_err();
        if busy {
            return;
        }
        if let Err(e) = self.synced(repo, upstream).await {
            tracing::debug!(%repo, error = %e, "the mirror could not be warmed");
        }
    }

    fn lock_of(&self, repo: &RepoName) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(repo.to_string()).or_default().clone()
    }

    /// The repository's mirror as it is (made empty if missing), held for this caller until
    /// the guard drops.
    pub async fn held(
        &self,
        repo: &RepoName,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, PathBuf), String> {
        let guard = self.lock_of(repo).lock_owned().await;
        let dir = self
            .root
            .join(format!("{}+{}.git", repo.owner(), repo.name()));
        if !dir.join("HEAD").exists() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("the mirror's directory: {e}"))?;
            git(&dir, &["init", "--quiet", "--bare"], &[], None).await?;
        }
        Ok((guard, dir))
    }

    /// The repository's mirror, brought up to date with the forge's base branch and the
    /// run's branch, held for this caller until the guard drops.
    pub async fn synced(
        &self,
        repo: &RepoName,
        upstream: &Upstream<'_>,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, PathBuf), String> {
        let (guard, dir) = self.held(repo).await?;
        sync(&dir, upstream).await?;
        Ok((guard, dir))
    }
}

/// Fetches the base branch and the run's branch from the forge into the mirror at `dir`.
async fn sync(dir: &Path, upstream: &Upstream<'_>) -> Result<(), String> {
    // The token goes in a header git sends to the forge's origin only, given in git's
    // environment (never an argument); no credential helper, so no shell is needed (the
    // image has none).
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", upstream.user, upstream.token));
    let env: Vec<(String, String)> = vec![
        ("GIT_CONFIG_COUNT".into(), "2".into()),
        ("GIT_CONFIG_KEY_0".into(), "credential.helper".into()),
        ("GIT_CONFIG_VALUE_0".into(), String::new()),
        (
            "GIT_CONFIG_KEY_1".into(),
            format!(
                "http.{}/.extraHeader",
                upstream.origin.trim_end_matches('/')
            ),
        ),
        (
            "GIT_CONFIG_VALUE_1".into(),
            format!("Authorization: Basic {basic}"),
        ),
    ];
    let fetch = |refspecs: Vec<String>| {
        let env = env.clone();
        async move {
            let mut args = vec!["fetch", "--quiet", "--no-tags", upstream.url];
            args.extend(refspecs.iter().map(String::as_str));
            git(dir, &args, &env, None).await
        }
    };
    let base = format!("+refs/heads/{0}:refs/heads/{0}", upstream.base);
    let branch = format!("+refs/heads/{0}:refs/heads/{0}", upstream.branch);
    match fetch(vec![base.clone(), branch]).await {
        Ok(_) => Ok(()),
        // The run's branch does not exist (yet, or any more): the base alone.
        Err(e) if e.contains("couldn't find remote ref") => fetch(vec![base])
            .await
            .map(drop)
            .map_err(|e| format!("the forge could not be read: {e}")),
        Err(e) => Err(format!("the forge could not be read: {e}")),
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

    /// Moves the checked objects into the mirror, so the next sync need not fetch them back
    /// from the forge. Only a push that passed every check is kept.
    pub fn keep(self) -> Result<(), String> {
        let from = self.objects.path().join("pack");
        let to = self.mirror.join("objects").join("pack");
        let Ok(entries) = std::fs::read_dir(&from) else {
            return Ok(());
        };
        // The index last: a pack is used only once its index is there.
        let mut names: Vec<std::path::PathBuf> = entries.flatten().map(|e| e.path()).collect();
        names.sort_by_key(|p| p.extension().is_some_and(|e| e == "idx"));
        for path in names {
            if let Some(name) = path.file_name() {
                std::fs::rename(&path, to.join(name))
                    .map_err(|e| format!("keeping the checked objects: {e}"))?;
            }
        }
        Ok(())
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

    /// Why the update `c` of the run's branch is refused, or `None`; `Err` when the mirror
    /// lacks what the check needs (then it is synced and the check made again). `base` is
    /// the default branch; `fast_forward_only` for a follow-up.
    ///
    /// The branch's current tip is taken from the command's old value: the forge applies an
    /// update only when its ref still holds that value, so a push that lies about it is
    /// refused there, and what it would exclude from the check is never applied.
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
        let current = (!c.creates()).then_some(c.old.as_str());
        if fast_forward_only && let Some(old) = current {
            let out = self
                .status(&["merge-base", "--is-ancestor", old, &c.new])
                .await?;
            match out {
                0 => {}
                1 => {
                    return Ok(Some(
                        "a follow-up only adds commits (no force-push): the pull request keeps its history"
                            .into(),
                    ));
                }
                _ => return Err("the branch's tip is not in the mirror".into()),
            }
        }
        // Every commit the branch would gain over the base and its tip is checked, wherever
        // it came from (the run's git was shown only those two refs). One `git log`: plumbing
        // options, renames off (a rename would hide its old path), and for a merge only what
        // differs from every parent (what the merge itself brings).
        let base_ref = format!("refs/heads/{base}");
        let limit = (MAX_NEW_COMMITS + 1).to_string();
        let mut args = vec![
            "log",
            "--format=%x01%H",
            "-z",
            "-c",
            "--root",
            "--no-renames",
            "--name-only",
            "--no-color",
            "-n",
            &limit,
            c.new.as_str(),
            "--not",
            &base_ref,
        ];
        if let Some(old) = current {
            args.push(old);
        }
        let out = self.git(&args, None).await?;
        let mut commit = String::new();
        let mut commits = 0;
        for token in out
            .split(|b| *b == 0 || *b == b'\n')
            .filter(|t| !t.is_empty())
        {
            if let Some(id) = token.strip_prefix(b"\x01") {
                commit = String::from_utf8_lossy(id).into_owned();
                commits += 1;
                continue;
            }
            let path = String::from_utf8_lossy(token);
            if let Some(glob) = protected.covering(&path) {
                let short = commit.get(..10).unwrap_or(&commit);
                return Ok(Some(format!(
                    "commit {short} changes {path}, which runs may not change ({glob})"
                )));
            }
        }
        if commits > MAX_NEW_COMMITS {
            return Ok(Some(format!(
                "more than {MAX_NEW_COMMITS} new commits in one push"
            )));
        }
        Ok(None)
    }

    /// git's exit code (0 and 1 are answers; anything else an error).
    async fn status(&self, args: &[&str]) -> Result<i32, String> {
        match self.git(args, None).await {
            Ok(_) => Ok(0),
            Err(e) if e.contains("(exit 1)") => Ok(1),
            Err(e) => Err(e),
        }
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
        let code = out.status.code().unwrap_or(-1);
        Err(format!(
            "git {} failed (exit {code}): {first}",
            args.first().unwrap_or(&"")
        ))
    }
}
