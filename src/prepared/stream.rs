//! Workspaces as streams between the engine and the director: a tar stream from the engine
//! scanned (and copied into a snapshot) on a blocking thread, fed chunk by chunk, and a
//! snapshot file sent back as a stream. Memory stays a few chunks whatever the size.

use futures_util::StreamExt as _;

use super::scan::{Pattern, Scanned};
use crate::runtime::{RuntimeError, TarStream};

/// Scans the workspace's tar stream (entries under its directory) for `patterns`, copying it
/// into `pending` within `max` bytes.
pub async fn scan_stream(
    tar: TarStream,
    patterns: Vec<Pattern>,
    pending: Option<super::store::Pending>,
    max: u64,
) -> anyhow::Result<(Scanned, Option<super::store::Pending>)> {
    let (scanned, pending) = on_blocking_thread(tar, move |reader| {
        let mut pending = pending;
        let out = pending
            .as_mut()
            .map(|p| std::io::BufWriter::new(&mut p.file));
        let scanned = super::scan::scan_and_copy(reader, true, &patterns, out, max);
        // A copy that failed half way is removed, never left to look like one.
        if scanned.is_err()
            && let Some(p) = pending.take()
        {
            super::store::SnapshotStore::abandon(p);
        }
        (scanned, pending)
    })
    .await?;
    let scanned = scanned.map_err(|e| anyhow::anyhow!("reading the setup's workspace: {e}"))?;
    Ok((scanned, pending))
}

/// The git objects of a workspace's tar stream (entries under its directory), inflated and
/// searched: the file and the secret's name of the first found.
pub async fn git_stream(
    tar: TarStream,
    patterns: Vec<Pattern>,
) -> anyhow::Result<Option<(String, String)>> {
    Ok(on_blocking_thread(tar, move |reader| {
        super::scan::scan_git_objects(reader, &patterns)
    })
    .await??)
}

/// Runs `read` on a blocking thread (the tar reader is synchronous) over `tar`, fed by this
/// task chunk by chunk, so memory stays a few chunks whatever the size.
async fn on_blocking_thread<T: Send + 'static>(
    mut tar: TarStream,
    read: impl FnOnce(ChannelReader) -> T + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let reading = tokio::task::spawn_blocking(move || {
        read(ChannelReader {
            rx,
            current: bytes::Bytes::new(),
        })
    });
    while let Some(chunk) = tar.next().await {
        let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
        let failed = chunk.is_err();
        if tx.send(chunk).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    Ok(reading.await?)
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
pub fn file_stream(file: tokio::fs::File) -> TarStream {
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
