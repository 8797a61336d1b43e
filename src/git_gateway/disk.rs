//! The git gateway's disk (`runner.gateway_disk_mb`): what its mirrors and the quarantines
//! of the pushes being checked may take under its directory. A push reserves room for its
//! pack before git writes a byte (refused when there is none); git's writes (a mirror's
//! fetch, a pack's indexing) are watched while they run and stopped past the cap. The
//! volume the directory is on is larger than the cap, so it is never filled and the pod
//! never evicted for it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often git's writes are measured while it runs: a fetch or an index at disk speed
/// overshoots the cap by at most what it writes in this time, within the volume's margin.
const WATCH_EVERY: Duration = Duration::from_millis(200);

pub struct Disk {
    root: PathBuf,
    cap: u64,
    /// Bytes reserved by the pushes being checked.
    reserved: AtomicU64,
    /// Taken while a reservation is decided: two pushes never both take the last room.
    deciding: tokio::sync::Mutex<()>,
}

/// Room reserved for one push, given back when dropped.
pub struct Reservation {
    disk: Arc<Disk>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.disk.reserved.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl Reservation {
    /// Runs `work` (git writing under the root), stopped (dropped: its child is killed) when
    /// what the root holds and the others' reservations pass the cap.
    pub async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<T, String> {
        self.disk.within(self.bytes, work).await
    }
}

impl Disk {
    pub fn new(root: PathBuf, cap_mb: u64) -> Arc<Self> {
        Arc::new(Self {
            root,
            cap: cap_mb.saturating_mul(1024 * 1024),
            reserved: AtomicU64::new(0),
            deciding: tokio::sync::Mutex::new(()),
        })
    }

    pub fn cap_mb(&self) -> u64 {
        self.cap >> 20
    }

    /// What the files under the root take now, in bytes.
    pub async fn used(&self) -> u64 {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || size_of(&root))
            .await
            .unwrap_or(u64::MAX)
    }

    /// Room for `bytes` more, unless the root's files, the other reservations and these
    /// would pass the cap (`Err` says so in words for the run).
    pub async fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, String> {
        let _deciding = self.deciding.lock().await;
        let used = self.used().await;
        let reserved = self.reserved.load(Ordering::SeqCst);
        if used.saturating_add(reserved).saturating_add(bytes) > self.cap {
            return Err(format!(
                "the git gateway has no room for this push: checking it needs {} MB, and its mirrors and the pushes being checked take {} MB of runner.gateway_disk_mb ({} MB)",
                bytes.div_ceil(1 << 20),
                used.saturating_add(reserved).div_ceil(1 << 20),
                self.cap_mb()
            ));
        }
        self.reserved.fetch_add(bytes, Ordering::SeqCst);
        Ok(Reservation {
            disk: self.clone(),
            bytes,
        })
    }

    /// Whether the root's files and the reservations other than `own` pass the cap.
    pub async fn over(&self, own: u64) -> bool {
        let others = self.reserved.load(Ordering::SeqCst).saturating_sub(own);
        self.used().await.saturating_add(others) > self.cap
    }

    /// Runs `work`, stopped past the cap (`own`: what it reserved itself), and measured once
    /// more when it ends, so a write quicker than one look is caught as well.
    pub async fn within<T>(
        &self,
        own: u64,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<T, String> {
        let watch = async {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                if self.over(own).await {
                    return;
                }
            }
        };
        let out = tokio::select! {
            out = work => out,
            () = watch => Err(self.full()),
        };
        if out.is_ok() && self.over(own).await {
            return Err(self.full());
        }
        out
    }

    fn full(&self) -> String {
        format!(
            "git's writes would pass runner.gateway_disk_mb ({} MB), the git gateway's disk, and were stopped",
            self.cap_mb()
        )
    }
}

/// The bytes of the files under `dir` (links not followed); what cannot be read counts
/// nothing (git removes temporary files while it is measured).
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0u64;
    for entry in entries.flatten() {
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        total = total.saturating_add(if meta.is_dir() {
            size_of(&entry.path())
        } else {
            meta.len()
        });
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn room_is_what_the_files_and_other_reservations_leave() {
        let root = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("dirs");
        std::fs::write(root.path().join("a/b/pack"), vec![0u8; 1 << 20]).expect("write");
        let disk = Disk::new(root.path().to_owned(), 3);
        assert_eq!(disk.used().await, 1 << 20);
        let first = disk.reserve(1 << 20).await.expect("room for one");
        let why = disk.reserve(2 << 20).await.err().expect("no room for two");
        assert!(why.contains("runner.gateway_disk_mb (3 MB)"), "{why}");
        drop(first);
        let _again = disk.reserve(2 << 20).await.expect("given back");
        // Writes past the cap are stopped, however quick.
        let write = disk.within(0, async {
            std::fs::write(root.path().join("more"), vec![0u8; 1 << 20]).map_err(|e| e.to_string())
        });
        let why = write.await.expect_err("stopped");
        assert!(why.contains("runner.gateway_disk_mb"), "{why}");
    }
}
