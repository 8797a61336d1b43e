//! What a push would do, found with stock git before anything reaches the forge: the pack is
//! indexed into a quarantine (a fresh object directory beside a mirror of the forge's
//! branches), and the commits it would add are walked there. Nothing in the quarantine is
//! ever referenced from the mirror; it is deleted with the check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use tokio::io::AsyncWriteExt;

use super::disk::{Disk, Reservation};
use super::pkt::Command;
use crate::domain::protected::Protected;
use crate::domain::{CommitSha, RepoName};

/// The most commits one push may add: more is not an agent's work on one issue.
pub const MAX_NEW_COMMITS: usize = 2000;

/// Where a run's branch must come from, for the checks of its push.
pub struct Expect<'a> {
    /// The default branch.
    pub base: &'a str,
    /// A follow-up: the branch only fast-forwards.
    pub follow_up: bool,
    /// The base's head when a first run started.
    pub base_commit: Option<&'a crate::domain::CommitSha>,
}

/// Mirrors of the forge's repositories (their branches only), one per repository, each
/// used by one push at a time.
pub struct Mirrors {
    root: PathBuf,
    /// The longest one git command may take (a pack bomb, a huge walk): past it the child is
    /// killed and the mirror's lock released.
    timeout: Duration,
    /// What the mirrors and quarantines under `root` may take.
    disk: Arc<Disk>,
    /// Each mirror's lock, by its directory.
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
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
    /// Mirrors under `root`, taking at most `disk_mb` with the quarantines.
    pub fn new(root: PathBuf, timeout: Duration, disk_mb: u64) -> Self {
        Self {
            disk: Disk::new(root.clone(), disk_mb),
            root,
            timeout,
            locks: Mutex::default(),
        }
    }

    /// Room for checking a push of `bytes` beside `repo`'s mirror: when there is none, the
    /// mirrors no one uses now are removed (a cache) and it is asked again.
    pub async fn reserve(&self, repo: &RepoName, bytes: u64) -> Result<Reservation, String> {
        match self.disk.reserve(bytes).await {
            Err(_) if self.reclaim(repo) => self.disk.reserve(bytes).await,
            reserved => reserved,
        }
    }

    /// Removes every mirror but `keep`'s that no push or sync holds now; whether any was.
    fn reclaim(&self, keep: &RepoName) -> bool {
        let keep = self.dir_of(keep);
        let locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut removed = false;
        for (dir, lock) in locks.iter() {
            if *dir == keep || !dir.exists() {
                continue;
            }
            // Held while it is removed: a push that comes for it waits, then finds it gone
            // and makes it again.
            if let Ok(_idle) = lock.try_lock() {
                removed |= std::fs::remove_dir_all(dir).is_ok();
            }
        }
        removed
    }

    fn dir_of(&self, repo: &RepoName) -> PathBuf {
        self.root
            .join(format!("{}+{}.git", repo.owner(), repo.name()))
    }

    /// The longest one git command may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
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
        let dir = self.dir_of(repo);
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(dir).or_default().clone()
    }

    /// The repository's mirror as it is (made empty if missing), held for this caller until
    /// the guard drops.
    pub async fn held(
        &self,
        repo: &RepoName,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, PathBuf), String> {
        let guard = self.lock_of(repo).lock_owned().await;
        let dir = self.dir_of(repo);
        self.init(&dir).await?;
        Ok((guard, dir))
    }

    /// An empty mirror at `dir` unless there is one.
    async fn init(&self, dir: &Path) -> Result<(), String> {
        if !dir.join("HEAD").exists() {
            std::fs::create_dir_all(dir).map_err(|e| format!("the mirror's directory: {e}"))?;
            git(dir, &["init", "--quiet", "--bare"], &[], None, self.timeout).await?;
        }
        Ok(())
    }

    /// The repository's mirror, brought up to date with the forge's base branch and the
    /// run's branch, held for this caller until the guard drops.
    pub async fn synced(
        &self,
        repo: &RepoName,
        upstream: &Upstream<'_>,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, PathBuf), String> {
        let (guard, dir) = self.held(repo).await?;
        let Err(e) = self
            .disk
            .within(0, sync(&dir, upstream, self.timeout))
            .await
        else {
            return Ok((guard, dir));
        };
        if !self.disk.over(0).await {
            return Err(e);
        }
        // Over the cap: this mirror goes (a cache), and the others no one uses; one more
        // try when they freed room.
        let _ = std::fs::remove_dir_all(&dir);
        let too_large = |e: String| {
            let _ = std::fs::remove_dir_all(&dir);
            format!(
                "the repository does not fit in the git gateway's disk beside its other mirrors: {e}"
            )
        };
        if !self.reclaim(repo) {
            return Err(too_large(e));
        }
        self.init(&dir).await?;
        self.disk
            .within(0, sync(&dir, upstream, self.timeout))
            .await
            .map_err(too_large)?;
        Ok((guard, dir))
    }
}

/// Fetches the base branch and the run's branch from the forge into the mirror at `dir`.
async fn sync(dir: &Path, upstream: &Upstream<'_>, timeout: Duration) -> Result<(), String> {
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
            git(dir, &args, &env, None, timeout).await
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
    timeout: Duration,
    /// Its room on the gateway's disk, given back with it.
    room: Reservation,
}

impl Quarantine {
    /// Indexes `pack` (thin packs completed from the mirror) into a fresh object directory,
    /// within `room` on the gateway's disk.
    pub async fn receive(
        mirror: &Path,
        pack: &[u8],
        timeout: Duration,
        room: Reservation,
    ) -> Result<Self, String> {
        let objects = tempfile::Builder::new()
            .prefix("quarantine-")
            .tempdir_in(mirror)
            .map_err(|e| format!("a quarantine could not be made: {e}"))?;
        let q = Self {
            mirror: mirror.to_owned(),
            objects,
            timeout,
            room,
        };
        if !pack.is_empty() {
            std::fs::create_dir_all(q.objects.path().join("pack"))
                .map_err(|e| format!("a quarantine could not be made: {e}"))?;
            // Watched: `--fix-thin` appends the bases the pack lacks, which may be larger
            // than the pack.
            q.room
                .within(q.git(
                    &["index-pack", "--stdin", "--fix-thin", "--strict"],
                    Some(pack),
                ))
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
        git(&self.mirror, args, &self.env(), stdin, self.timeout).await
    }

    async fn text(&self, args: &[&str]) -> Result<String, String> {
        let out = self.git(args, None).await?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Why the update `c` of the run's branch is refused, or `None`; `Err` when the mirror
    /// lacks what the check needs (then it is synced and the check made again).
    ///
    /// The branch's current tip is taken from the command's old value: the forge applies an
    /// update only when its ref still holds that value, so a push that lies about it is
    /// refused there, and what it would exclude from the check is never applied.
    ///
    /// Two properties of the result are checked besides the commits: the new tip descends
    /// from where the run started (the base's head at a first run's start, the branch's tip
    /// for a follow-up), and its tree equals the base's tip in every protected path. Walking
    /// the new commits alone misses a branch started from an old base commit (not new, so
    /// not walked, yet its tree holds the CI definitions as they were) and a merge that takes
    /// an ancestor's version of a protected path (`-c` lists only what differs from every
    /// parent).
    pub async fn check(
        &self,
        c: &Command,
        expect: &Expect<'_>,
        protected: &Protected,
    ) -> Result<Option<String>, String> {
        let kind = self.text(&["cat-file", "-t", &c.new]).await;
        if kind.as_deref().map(str::trim) != Ok("commit") {
            return Ok(Some(
                "the new value is not a commit the push carries".into(),
            ));
        }
        let base_ref = format!("refs/heads/{}", expect.base);
        let current = (!c.creates()).then_some(c.old.as_str());
        if let Some(why) = self.descent(c, expect, current, &base_ref).await? {
            return Ok(Some(why));
        }
        if let Some(why) = self.walk(c, current, &base_ref, protected).await? {
            return Ok(Some(why));
        }
        self.protected_tree(c, expect.base, &base_ref, protected)
            .await
    }

    /// Why the new tip does not descend from where the run started, or `None`. A follow-up
    /// only fast-forwards its branch; a first run's branch holds the base commit it was
    /// given (and the mirror's base must hold it too, or the tree check would compare with
    /// an older base: `Err`, so the mirror is synced first).
    async fn descent(
        &self,
        c: &Command,
        expect: &Expect<'_>,
        current: Option<&str>,
        base_ref: &str,
    ) -> Result<Option<String>, String> {
        if expect.follow_up {
            let Some(old) = current else {
                return Ok(None);
            };
            return match self
                .status(&["merge-base", "--is-ancestor", old, &c.new])
                .await?
            {
                0 => Ok(None),
                1 => Ok(Some(
                    "a follow-up only adds commits (no force-push): the pull request keeps its history"
                        .into(),
                )),
                _ => Err("the branch's tip is not in the mirror".into()),
            };
        }
        let Some(start) = expect.base_commit.map(CommitSha::as_str) else {
            return Ok(None);
        };
        match self
            .status(&["merge-base", "--is-ancestor", start, base_ref])
            .await
        {
            Ok(0) => {}
            _ => return Err("the mirror's base is older than the run's start".into()),
        }
        match self
            .status(&["merge-base", "--is-ancestor", start, &c.new])
            .await?
        {
            0 => Ok(None),
            1 => {
                let short = start.get(..10).unwrap_or(start);
                Ok(Some(format!(
                    "the branch does not start from {short}, the head of {} the run was given: start it from there",
                    expect.base
                )))
            }
            _ => Err("the run's start commit is not in the mirror".into()),
        }
    }

    /// Why a commit the branch would gain is refused (it changes a protected path, or there
    /// are too many), or `None`. One `git log`: plumbing options, renames off (a rename would
    /// hide its old path), and for a merge only what differs from every parent.
    async fn walk(
        &self,
        c: &Command,
        current: Option<&str>,
        base_ref: &str,
        protected: &Protected,
    ) -> Result<Option<String>, String> {
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
            base_ref,
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

    /// Why the new tip's tree differs from the base's tip in a protected path, or `None`:
    /// what the forge would run on the push is the base's CI definitions, whatever history
    /// led there.
    async fn protected_tree(
        &self,
        c: &Command,
        base: &str,
        base_ref: &str,
        protected: &Protected,
    ) -> Result<Option<String>, String> {
        let out = self
            .git(
                &[
                    "diff",
                    "--name-only",
                    "-z",
                    "--no-renames",
                    "--no-color",
                    base_ref,
                    &c.new,
                ],
                None,
            )
            .await?;
        for token in out.split(|b| *b == 0).filter(|t| !t.is_empty()) {
            let path = String::from_utf8_lossy(token);
            if let Some(glob) = protected.covering(&path) {
                return Ok(Some(format!(
                    "{path} differs from {base}'s, and a run's branch keeps the base's ({glob}) as they are"
                )));
            }
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

/// Runs git in `dir` with only the environment given (and `PATH`), its stdin from `stdin`,
/// killed when it takes longer than `timeout`.
async fn git(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
    stdin: Option<&[u8]>,
    timeout: Duration,
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
    let name = args.first().copied().unwrap_or_default();
    // Written from the caller's buffer while git's output is read (no second copy); the pipe
    // closes when it is all written.
    let pipe = child.stdin.take();
    let feed = async move {
        match (stdin, pipe) {
            // git may stop reading (a pack it refuses) and close its end: kept beside its own
            // answer.
            (Some(data), Some(mut pipe)) => pipe.write_all(data).await.err(),
            _ => None,
        }
    };
    let run = async move { tokio::join!(feed, child.wait_with_output()) };
    let (fed, out) = match tokio::time::timeout(timeout, run).await {
        Ok((fed, out)) => (fed, out.map_err(|e| format!("git failed: {e}"))?),
        // Dropping the child kills it (`kill_on_drop`).
        Err(_) => {
            return Err(format!(
                "git {name} took longer than {} s, and was stopped",
                timeout.as_secs_f64()
            ));
        }
    };
    if out.status.success() {
        Ok(out.stdout)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        let code = out.status.code().unwrap_or(-1);
        let fed = fed.map(|e| format!(" (it took only part of its input: {e})"));
        Err(format!(
            "git {name} failed (exit {code}): {first}{}",
            fed.unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    use super::*;

    /// A pack of a few hundred KB whose one blob inflates to 200 MB of zeros.
    fn pack_bomb(dir: &Path) -> Vec<u8> {
        let repo = dir.join("bomb.git");
        let git = |args: &[&str]| {
            let mut c = Command::new("git");
            c.arg("-C").arg(&repo).args(args);
            c
        };
        assert!(
            Command::new("git")
                .args(["init", "-q", "--bare"])
                .arg(&repo)
                .status()
                .expect("git")
                .success()
        );
        let mut hash = git(&["hash-object", "-w", "--stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("git");
        let mut input = hash.stdin.take().expect("stdin");
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..200 {
            input.write_all(&zeros).expect("written");
        }
        drop(input);
        let blob = hash.wait_with_output().expect("hashed").stdout;
        let mut pack = git(&["pack-objects", "--stdout", "-q"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("git");
        pack.stdin
            .take()
            .expect("stdin")
            .write_all(&blob)
            .expect("written");
        pack.wait_with_output().expect("packed").stdout
    }

    #[tokio::test]
    async fn a_pack_bomb_is_stopped_at_the_deadline_and_frees_the_repositorys_mirror() {
        let root = tempfile::tempdir().expect("dir");
        let pack = pack_bomb(root.path());
        assert!(pack.len() < 2 << 20, "a small pack: {} bytes", pack.len());
        // Indexing it takes most of a second here; the deadline is a tenth of that.
        let mirrors = Mirrors::new(root.path().join("mirrors"), Duration::from_millis(100), 100);
        let repo: RepoName = "acme/widgets".parse().expect("a name");
        let (held, dir) = mirrors.held(&repo).await.expect("a mirror");
        let room = mirrors.reserve(&repo, 4 << 20).await.expect("room");
        let started = Instant::now();
        let Err(why) = Quarantine::receive(&dir, &pack, mirrors.timeout(), room).await else {
            panic!("the bomb was indexed whole");
        };
        assert!(
            why.contains("git index-pack took longer than 0.1 s"),
            "{why}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "stopped at once"
        );
        drop(held);
        // The next push of the repository gets its mirror at once.
        tokio::time::timeout(Duration::from_secs(1), mirrors.held(&repo))
            .await
            .expect("the mirror is free")
            .expect("a mirror");
    }
}
