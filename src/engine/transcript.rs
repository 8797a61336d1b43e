//! A run's transcript, recorded as its output arrives: followed through the runtime, redacted
//! line by line (a secret is never split across two writes, short of a line longer than
//! [`LINE_MAX`]), and appended to the store in batches, with the runtime's mark so that a run
//! adopted after a restart continues where the transcript stopped. A runtime that cannot
//! follow output has its run's log read once, at the end.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::RunId;
use crate::engine::act::run::Secrets;
use crate::runtime::Runtime;
use crate::store::Store;

/// A batch is written once it holds this much, or after [`FLUSH`].
const BATCH: usize = 1024 * 1024;
const FLUSH: Duration = Duration::from_millis(500);
/// A line longer than this is written in pieces.
pub const LINE_MAX: usize = 64 * 1024;
/// Lines read at the end from a runtime that cannot follow output.
const END_LINES: usize = 200_000;

/// What recording needs, shared with the watcher.
#[derive(Clone)]
pub struct Recorder {
    pub store: Store,
    pub runtime: Arc<dyn Runtime>,
    pub secrets: Arc<Secrets>,
    pub clock: SharedClock,
    /// `runner.transcript_max_mb`, in bytes.
    pub cap_bytes: u64,
}

/// Text made of the complete lines at the front of `pending` (taken out), or all of it when
/// it holds a line longer than [`LINE_MAX`] or `all`.
fn take_lines(pending: &mut Vec<u8>, all: bool) -> Option<String> {
    let end = if all || pending.len() > LINE_MAX {
        pending.len()
    } else {
        pending.iter().rposition(|b| *b == b'\n')? + 1
    };
    if end == 0 {
        return None;
    }
    let lines: Vec<u8> = pending.drain(..end).collect();
    Some(String::from_utf8_lossy(&lines).into_owned())
}

impl Recorder {
    /// Follows the run's output in `container` until it ends or `stop` fires, then writes
    /// what is left. Whether the runtime could follow it (if not, [`Recorder::at_end`]).
    pub async fn follow(&self, run_id: &RunId, container: &str, stop: CancellationToken) -> bool {
        let mark = match self.store.transcript_mark(run_id).await {
            Ok(mark) => mark,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot read the transcript's mark; not following the run's output");
                return true;
            }
        };
        let mut stream = match self.runtime.follow_output(container, mark.as_deref()).await {
            Ok(Some(stream)) => stream,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow the run's output");
                return true;
            }
        };
        let mut pending: Vec<u8> = Vec::new();
        let mut batch = String::new();
        // The runtime's position after the output now in `batch` (complete lines only).
        let mut batch_mark: Option<String> = None;
        let mut last_write = tokio::time::Instant::now();
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => break,
                next = tokio::time::timeout(FLUSH, stream.next()) => next,
            };
            match next {
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    tracing::warn!(error = %e, "the run's output stream failed");
                    break;
                }
                Ok(Some(Ok(out))) => {
                    pending.extend_from_slice(&out.bytes);
                    if let Some(text) = take_lines(&mut pending, false) {
                        batch.push_str(&self.secrets.redact(run_id, &text));
                    }
                    if pending.is_empty() {
                        batch_mark = out.mark.or(batch_mark);
                    }
                }
                Err(_) => {}
            }
            if !batch.is_empty() && (batch.len() >= BATCH || last_write.elapsed() >= FLUSH) {
                self.write(run_id, &batch, batch_mark.as_deref()).await;
                batch.clear();
                last_write = tokio::time::Instant::now();
            }
        }
        if let Some(text) = take_lines(&mut pending, true) {
            batch.push_str(&self.secrets.redact(run_id, &text));
        }
        if !batch.is_empty() {
            self.write(run_id, &batch, batch_mark.as_deref()).await;
        }
        true
    }

    /// The transcript of a run whose output could not be followed: its log, read once.
    pub async fn at_end(&self, run_id: &RunId, container: &str) {
        match self.runtime.logs_tail(container, END_LINES).await {
            Ok(log) if !log.is_empty() => {
                let text = self.secrets.redact(run_id, &log);
                self.write(run_id, &text, None).await;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the run's log for its transcript"),
        }
    }

    async fn write(&self, run_id: &RunId, text: &str, mark: Option<&str>) {
        if let Err(e) = self
            .store
            .append_transcript(run_id, text, mark, self.clock.now_ms(), self.cap_bytes)
            .await
        {
            tracing::warn!(error = %format!("{e:#}"), "cannot append to the run's transcript");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_lines_are_taken_unless_a_line_is_too_long() {
        let mut pending = b"one\ntwo\nthr".to_vec();
        assert_eq!(
            take_lines(&mut pending, false).as_deref(),
            Some("one\ntwo\n")
        );
        assert_eq!(pending, b"thr");
        assert_eq!(take_lines(&mut pending, false), None);
        assert_eq!(take_lines(&mut pending, true).as_deref(), Some("thr"));
        assert!(pending.is_empty());
        let mut long = vec![b'x'; LINE_MAX + 1];
        assert_eq!(
            take_lines(&mut long, false).map(|t| t.len()),
            Some(LINE_MAX + 1)
        );
        let mut garbage = vec![0xff, 0xfe, b'\n'];
        assert_eq!(
            take_lines(&mut garbage, false).as_deref(),
            Some("\u{FFFD}\u{FFFD}\n"),
            "valid UTF-8 whatever the run printed"
        );
    }
}
