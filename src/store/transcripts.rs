//! Runs' transcripts: each run's whole output, redacted, appended as it arrives (so any
//! replica serves it, and a run adopted after a restart continues it), bounded by
//! `runner.transcript_max_mb` with the end kept.

use super::Store;
use crate::domain::RunId;

/// A run's transcript as kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    pub text: String,
    /// Bytes kept.
    pub bytes: u64,
    /// Bytes dropped from the start to keep within the cap.
    pub dropped_bytes: u64,
    /// The runtime's position of the last output kept.
    pub mark: Option<String>,
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn back(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The last `cap` bytes of `text`, cut at a character boundary.
fn tail(text: &str, cap: usize) -> &str {
    if text.len() <= cap {
        return text;
    }
    let mut start = text.len() - cap;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The largest piece of a transcript stored in one row.
const CHUNK: usize = 64 * 1024;

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max.max(4));
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

impl Store {
    /// Appends `text` (already redacted) to the run's transcript, noting `mark` as the
    /// runtime's position after it, and drops the oldest output beyond `cap_bytes`.
    pub async fn append_transcript(
        &self,
        run_id: &RunId,
        text: &str,
        mark: Option<&str>,
        at_ms: i64,
        cap_bytes: u64,
    ) -> anyhow::Result<()> {
        let cap = usize::try_from(cap_bytes).unwrap_or(usize::MAX).max(1);
        let kept = tail(text, cap);
        let mut tx = self.relaxed().await?;
        on_tx!(&mut tx, t => {
            let row: Option<(i64, i64, i64, Option<String>)> = sqlx::query_as(
                "SELECT bytes, dropped_bytes, next_seq, mark FROM run_transcripts WHERE run_id = $1",
            )
            .bind(run_id.as_str())
            .fetch_optional(&mut **t)
            .await?;
            let (mut bytes, mut dropped, seq, old_mark) = row.unwrap_or((0, 0, 0, None));
            dropped += int((text.len() - kept.len()) as u64);
            // In pieces, so that dropping the oldest never drops much more than needed.
            let mut next_seq = seq;
            for piece in pieces(kept, CHUNK) {
                sqlx::query(
                    "INSERT INTO transcript_chunks (run_id, seq, text, bytes, at_ms) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(run_id.as_str())
                .bind(next_seq)
                .bind(piece)
                .bind(int(piece.len() as u64))
                .bind(at_ms)
                .execute(&mut **t)
                .await?;
                bytes += int(piece.len() as u64);
                next_seq += 1;
            }
            // The oldest chunks go first; a chunk is at most the cap, so this ends.
            while back(bytes) > cap_bytes {
                let oldest: Option<(i64, i64)> = sqlx::query_as(
                    "SELECT seq, bytes FROM transcript_chunks WHERE run_id = $1 ORDER BY seq LIMIT 1",
                )
                .bind(run_id.as_str())
                .fetch_optional(&mut **t)
                .await?;
                let Some((old_seq, old_bytes)) = oldest else {
                    break;
                };
                sqlx::query("DELETE FROM transcript_chunks WHERE run_id = $1 AND seq = $2")
                    .bind(run_id.as_str())
                    .bind(old_seq)
                    .execute(&mut **t)
                    .await?;
                bytes -= old_bytes;
                dropped += old_bytes;
            }
            let mark = mark.map(str::to_owned).or(old_mark);
            sqlx::query(
                "INSERT INTO run_transcripts (run_id, bytes, dropped_bytes, next_seq, mark, at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id) DO UPDATE SET \
                 bytes = excluded.bytes, dropped_bytes = excluded.dropped_bytes, \
                 next_seq = excluded.next_seq, mark = excluded.mark, at_ms = excluded.at_ms",
            )
            .bind(run_id.as_str())
            .bind(bytes)
            .bind(dropped)
            .bind(next_seq)
            .bind(mark)
            .bind(at_ms)
            .execute(&mut **t)
            .await?;
        });
        tx.commit().await
    }

    /// The runtime's position after the run's transcript so far (where a follow continues).
    pub async fn transcript_mark(&self, run_id: &RunId) -> anyhow::Result<Option<String>> {
        let row: Option<(Option<String>,)> = on_pool!(&self.db, p => {
            sqlx::query_as("SELECT mark FROM run_transcripts WHERE run_id = $1")
                .bind(run_id.as_str())
                .fetch_optional(p)
                .await?
        });
        Ok(row.and_then(|r| r.0))
    }

    /// The run's transcript, if it has one.
    pub async fn transcript(&self, run_id: &RunId) -> anyhow::Result<Option<Transcript>> {
        let head: Option<(i64, i64, Option<String>)> = on_pool!(&self.db, p => {
            sqlx::query_as(
                "SELECT bytes, dropped_bytes, mark FROM run_transcripts WHERE run_id = $1",
            )
            .bind(run_id.as_str())
            .fetch_optional(p)
            .await?
        });
        let Some((bytes, dropped, mark)) = head else {
            return Ok(None);
        };
        let chunks: Vec<(String,)> = on_pool!(&self.db, p => {
            sqlx::query_as("SELECT text FROM transcript_chunks WHERE run_id = $1 ORDER BY seq")
                .bind(run_id.as_str())
                .fetch_all(p)
                .await?
        });
        Ok(Some(Transcript {
            text: chunks.into_iter().map(|c| c.0).collect(),
            bytes: back(bytes),
            dropped_bytes: back(dropped),
            mark,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_cut_at_a_character_boundary() {
        assert_eq!(tail("abc", 5), "abc");
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("aé", 1), "", "half of é is not kept");
        assert_eq!(tail("aéb", 2), "b");
        assert_eq!(tail("aéb", 3), "éb");
    }

    #[test]
    fn pieces_cover_the_text_at_character_boundaries() {
        assert!(pieces("", 4).is_empty());
        assert_eq!(pieces("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(pieces("abcé", 4), ["abc", "é"]);
        let text = "é".repeat(1000);
        assert_eq!(pieces(&text, 65).concat(), text);
    }
}
