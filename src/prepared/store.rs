//! Snapshots of prepared workspaces on the director's disk: `<dir>/<owner>/<name>/<key>.tar`
//! beside `<key>.json` (what it is, its size, when made and last used). A snapshot is written
//! to a temporary file and renamed once whole, so a crash or a full disk never leaves one that
//! looks usable; one whose size differs from its record is treated as missing. Pruned by age
//! (`runner.snapshot_ttl_hours`) and then least recently used first until all fit in
//! `runner.snapshot_max_mb`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::domain::RepoName;

/// What is known of one snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub repo: String,
    pub key: String,
    pub bytes: u64,
    pub created_ms: i64,
    pub used_ms: i64,
    pub image: String,
    pub command: String,
}

#[derive(Clone, Debug)]
pub struct SnapshotStore {
    dir: PathBuf,
    max_bytes: u64,
    ttl_ms: i64,
}

/// A snapshot being written: renamed into place by [`SnapshotStore::keep`].
pub struct Pending {
    /// Written through; read back (from its start) before it is kept.
    pub file: std::fs::File,
    path: PathBuf,
    final_path: PathBuf,
    meta_path: PathBuf,
}

impl Pending {
    /// Where it goes once kept.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// Not to be kept: the file as written, whole on disk, for the caller to use and remove.
    pub fn finish(self) -> std::io::Result<PathBuf> {
        self.file.sync_all()?;
        Ok(self.path)
    }
}

fn valid_key(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())
}

impl SnapshotStore {
    pub fn new(dir: PathBuf, max_mb: u64, ttl_hours: u64) -> Self {
        Self {
            dir,
            max_bytes: max_mb.saturating_mul(1024 * 1024),
            ttl_ms: i64::try_from(ttl_hours.saturating_mul(3_600_000)).unwrap_or(i64::MAX),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The most one snapshot may take.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn repo_dir(&self, repo: &RepoName) -> PathBuf {
        self.dir.join(repo.owner()).join(repo.name())
    }

    /// The snapshot of `repo` under `key`, when one is whole and not expired at `now_ms`.
    pub fn lookup(&self, repo: &RepoName, key: &str, now_ms: i64) -> Option<(PathBuf, Meta)> {
        if !valid_key(key) {
            return None;
        }
        let dir = self.repo_dir(repo);
        let meta: Meta =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{key}.json"))).ok()?).ok()?;
        let path = dir.join(format!("{key}.tar"));
        let size = std::fs::metadata(&path).ok()?.len();
        let fresh = now_ms.saturating_sub(meta.created_ms) <= self.ttl_ms;
        (size == meta.bytes && meta.repo == repo.to_string() && fresh).then_some((path, meta))
    }

    /// Records that the snapshot was used at `now_ms` (for least-recently-used pruning).
    pub fn touch(&self, repo: &RepoName, meta: &Meta, now_ms: i64) {
        let mut meta = meta.clone();
        meta.used_ms = now_ms;
        let path = self.repo_dir(repo).join(format!("{}.json", meta.key));
        if let Ok(json) = serde_json::to_vec(&meta) {
            let _ = write_atomically(&path, &json);
        }
    }

    /// A file to write `repo`'s snapshot under `key` to.
    pub fn begin(&self, repo: &RepoName, key: &str) -> std::io::Result<Pending> {
        if !valid_key(key) {
            return Err(std::io::Error::other("not a snapshot key"));
        }
        let dir = self.repo_dir(repo);
        private_dirs(&self.dir, &dir)?;
        let path = dir.join(format!(".{key}.{}.partial", rand::random::<u64>()));
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?
        };
        Ok(Pending {
            file,
            final_path: dir.join(format!("{key}.tar")),
            meta_path: dir.join(format!("{key}.json")),
            path,
        })
    }

    /// Puts a written snapshot in place with its record, then prunes.
    pub fn keep(&self, pending: Pending, meta: &Meta, now_ms: i64) -> std::io::Result<()> {
        let Pending {
            file,
            path,
            final_path,
            meta_path,
        } = pending;
        let done = (|| {
            file.sync_all()?;
            drop(file);
            std::fs::rename(&path, &final_path)?;
            write_atomically(
                &meta_path,
                &serde_json::to_vec(meta).map_err(std::io::Error::other)?,
            )
        })();
        if done.is_err() {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&final_path);
        }
        done?;
        self.prune(now_ms);
        Ok(())
    }

    /// Drops a snapshot that will not be kept.
    pub fn abandon(pending: Pending) {
        drop(pending.file);
        let _ = std::fs::remove_file(&pending.path);
    }

    /// Every snapshot, newest use first.
    pub fn list(&self) -> Vec<Meta> {
        let mut out = Vec::new();
        for owner in read_dirs(&self.dir) {
            for repo in read_dirs(&owner) {
                let Ok(entries) = std::fs::read_dir(&repo) else {
                    continue;
                };
                for e in entries.flatten() {
                    let p = e.path();
                    if p.extension().is_some_and(|x| x == "json")
                        && let Ok(bytes) = std::fs::read(&p)
                        && let Ok(meta) = serde_json::from_slice::<Meta>(&bytes)
                    {
                        out.push(meta);
                    }
                }
            }
        }
        out.sort_by_key(|m| std::cmp::Reverse(m.used_ms));
        out
    }

    /// Removes what expired by `now_ms`, leftovers of unfinished writes, then the least
    /// recently used until the rest fit; says what it removed.
    pub fn prune(&self, now_ms: i64) -> Vec<Meta> {
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for meta in self.list() {
            if now_ms.saturating_sub(meta.created_ms) > self.ttl_ms {
                self.remove(&meta);
                removed.push(meta);
            } else {
                kept.push(meta);
            }
        }
        // Newest use first: drop from the end until the total fits.
        let mut total: u64 = kept.iter().map(|m| m.bytes).sum();
        while total > self.max_bytes {
            let Some(meta) = kept.pop() else { break };
            total = total.saturating_sub(meta.bytes);
            self.remove(&meta);
            removed.push(meta);
        }
        removed
    }

    fn remove(&self, meta: &Meta) {
        let Ok(repo) = meta.repo.parse::<RepoName>() else {
            return;
        };
        if !valid_key(&meta.key) {
            return;
        }
        let dir = self.repo_dir(&repo);
        let _ = std::fs::remove_file(dir.join(format!("{}.json", meta.key)));
        let _ = std::fs::remove_file(dir.join(format!("{}.tar", meta.key)));
    }
}

/// Makes `dir` (under `root`) and its parents up to `root`, readable by this user alone: a
/// snapshot holds a repository's code and what its setup fetched. A `root` that is a link, or
/// another user's, is refused (someone could plant a snapshot in it).
fn private_dirs(root: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(root)?;
    // Whose this process is: the owner of its own /proc entry.
    let me = std::fs::metadata("/proc/self")?.uid();
    if meta.file_type().is_symlink() || meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "{} is a link or belongs to another user: snapshots are not kept there",
            root.display()
        )));
    }
    Ok(())
}

fn read_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("json.{}.tmp", rand::random::<u64>()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn key(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn put(store: &SnapshotStore, repo: &RepoName, k: &str, bytes: usize, at: i64) -> Meta {
        let mut p = store.begin(repo, k).expect("begin");
        p.file.write_all(&vec![0u8; bytes]).expect("write");
        let meta = Meta {
            repo: repo.to_string(),
            key: k.to_owned(),
            bytes: bytes as u64,
            created_ms: at,
            used_ms: at,
            image: "img".into(),
            command: "make".into(),
        };
        store.keep(p, &meta, at).expect("keep");
        meta
    }

    #[test]
    fn a_snapshot_is_found_only_for_its_repository_and_key_and_while_fresh() {
        let dir = tempfile::tempdir().expect("dir");
        let store = SnapshotStore::new(dir.path().to_owned(), 10, 1);
        let web: RepoName = "acme/web".parse().expect("repo");
        let api: RepoName = "acme/api".parse().expect("repo");
        put(&store, &web, &key(1), 100, 0);
        assert!(store.lookup(&web, &key(1), 1_000).is_some());
        assert!(
            store.lookup(&api, &key(1), 1_000).is_none(),
            "never another repository's"
        );
        assert!(store.lookup(&web, &key(2), 1_000).is_none());
        assert!(store.lookup(&web, "../../etc", 1_000).is_none());
        assert!(store.lookup(&web, &key(1), 3_600_001).is_none(), "expired");
    }

    #[test]
    fn a_truncated_snapshot_is_missing_and_a_partial_write_leaves_nothing_usable() {
        let dir = tempfile::tempdir().expect("dir");
        let store = SnapshotStore::new(dir.path().to_owned(), 10, 24);
        let web: RepoName = "acme/web".parse().expect("repo");
        put(&store, &web, &key(1), 100, 0);
        let (path, _) = store.lookup(&web, &key(1), 0).expect("whole");
        std::fs::write(&path, b"short").expect("truncate");
        assert!(
            store.lookup(&web, &key(1), 0).is_none(),
            "size differs: missing"
        );
        let p = store.begin(&web, &key(2)).expect("begin");
        SnapshotStore::abandon(p);
        assert!(store.lookup(&web, &key(2), 0).is_none());
        assert_eq!(store.list().len(), 1);
    }

    #[test]
    fn pruning_drops_the_expired_then_the_least_recently_used_until_all_fit() {
        let dir = tempfile::tempdir().expect("dir");
        // 1 MB in all, an hour of life.
        let store = SnapshotStore::new(dir.path().to_owned(), 1, 1);
        let web: RepoName = "acme/web".parse().expect("repo");
        let a = put(&store, &web, &key(1), 400_000, 0);
        put(&store, &web, &key(2), 400_000, 10);
        store.touch(&web, &a, 20);
        // A third does not fit beside both: the least recently used (key 2) goes.
        put(&store, &web, &key(3), 400_000, 30);
        let left: Vec<String> = store.list().into_iter().map(|m| m.key).collect();
        assert_eq!(left, [key(3), key(1)]);
        let removed = store.prune(3_600_100);
        assert_eq!(removed.len(), 2, "both older than an hour");
        assert!(store.list().is_empty());
    }
}
